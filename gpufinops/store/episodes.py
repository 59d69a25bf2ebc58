"""Verdicts as run-length episodes and hourly rollups: the pure fold the store runs on every recorded tick.

No I/O. The store loads the current heads (the latest episode per instance and rule, the latest resolved tick
per instance, the latest service run), folds a batch of decision rows into them with `fold_ticks`, and writes
back what changed, in the transaction that records the decisions.

- An **episode** is one (instance, rule) verdict from its first tick to the last one that saw it: extended
  while the verdict and reason code stay the same and ticks come at most `max_gap_s` apart; a change or a
  longer gap opens a new one (time nobody watched is not time in the last verdict).
- An **hourly rollup** row holds, per hour and instance, the hours spent in a verdict (with its code, price,
  team and type). Rules are resolved per tick first, as gpufinops.costs documents: when several rules judged
  an instance at the same moment the least idle verdict wins (ACTIVE > UNDERUTILIZED > UNKNOWN > IDLE). Each
  resolved tick covers the time to the instance's next tick, at most `max_gap_s`, spread over the hours it
  falls in. The latest tick of an instance is its **tail**: its time is not known yet, so readers count it
  up to the end of what they report (at most `max_gap_s`), exactly as the per-minute computation does.
- A **service run** is a stretch in which the service evaluated anything at most `max_gap_s` apart (the
  report's coverage and blind spots).
- The **raw rows kept**: with `raw_every_s`, the fold also says which decision rows the store keeps as raw
  rows: the first tick of each episode (a verdict or reason code changed, or a gap) and, while an episode
  lasts, its first tick in each clock-aligned `raw_every_s` bucket (a heartbeat). The other ticks are in the
  episode (count, last_seen_at, latest reason and stats) and the rollups already; storing each of them again
  cost ~6 MiB per instance-week at one tick a minute (issue 29).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterable, Mapping

VERDICT_ORDER = ("ACTIVE", "UNDERUTILIZED", "UNKNOWN", "IDLE")  # least idle first: wins a tie between rules
RANK = {v: i for i, v in enumerate(VERDICT_ORDER)}
HOUR = timedelta(hours=1)
STAT_KEYS = ("window_s", "activity_mean", "activity_max", "memory_max_mib", "coverage")


@dataclass
class Episode:
    instance_id: str
    rule: str
    verdict: str
    code: str
    started_at: datetime
    last_seen_at: datetime
    ticks: int
    reason: str
    stats: str  # JSON of the window stats of the latest tick (what justified the verdict)
    hourly_cost: float | None
    team: str | None
    instance_type: str | None
    dry_run: bool
    id: int | None = None  # None until stored
    changed: bool = False
    latest: Mapping | None = None  # the latest tick's decision row, turned into the fields above by settle()

    def settle(self) -> "Episode":
        """Take the latest tick's reason, stats, price, team and type (once per write, not once per tick)."""
        row = self.latest
        if row is not None:
            self.reason, self.stats = row["reason"], stats_json(row)
            self.hourly_cost, self.team = _num(row.get("hourly_cost")), row.get("team")
            self.instance_type = row.get("instance_type")
            self.latest = None
        return self


@dataclass
class Tail:
    """The latest resolved tick of an instance, whose time is not rolled up yet."""
    instance_id: str
    at: datetime
    verdict: str
    code: str
    hourly_cost: float | None
    team: str | None
    instance_type: str | None
    activity_mean: float | None
    activity_max: float | None
    memory_max_mib: float | None
    evaluations: int  # decision rows (one per rule) of that tick


@dataclass
class Run:
    started_at: datetime
    last_seen_at: datetime
    ticks: int
    id: int | None = None
    changed: bool = False


# (hour, instance_id, verdict, code, measured, hourly_cost, team, instance_type)
HourKey = tuple


@dataclass
class HourAgg:
    hours: float = 0.0
    ticks: int = 0
    evaluations: int = 0
    activity_hours: float = 0.0  # sum of activity_mean x hours (measured rows only)
    activity_max: float | None = None
    memory_max_mib: float | None = None
    # Of `hours`, the part after a completed stop of the instance (the report does not count it as running;
    # idle costs, like the per-minute computation, do).
    after_stop_hours: float = 0.0

    def add(self, other: "HourAgg") -> None:
        self.hours += other.hours
        self.after_stop_hours += other.after_stop_hours
        self.ticks += other.ticks
        self.evaluations += other.evaluations
        self.activity_hours += other.activity_hours
        self.activity_max = _max(self.activity_max, other.activity_max)
        self.memory_max_mib = _max(self.memory_max_mib, other.memory_max_mib)


@dataclass
class Heads:
    """What a fold starts from and leaves behind."""
    episodes: dict[tuple[str, str], Episode] = field(default_factory=dict)
    tails: dict[str, Tail] = field(default_factory=dict)
    run: Run | None = None
    new_episodes: list[Episode] = field(default_factory=list)
    new_runs: list[Run] = field(default_factory=list)
    changed_tails: set[str] = field(default_factory=set)
    raw: list[Mapping] = field(default_factory=list)  # the rows to keep as raw decision rows, in fold order
    # Stored episodes extended and then closed within the same fold (a batch of several ticks: the migration's
    # backfill, a replay): no longer a head, their extension is still to be written.
    superseded: list[Episode] = field(default_factory=list)
    superseded_runs: list[Run] = field(default_factory=list)  # the same for the stored service run


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def stats_json(row: Mapping) -> str:
    return json.dumps({k: _num(row.get(k)) for k in STAT_KEYS}, separators=(",", ":"))


def hour_key(t: Tail, hour: datetime) -> HourKey:
    return (hour, t.instance_id, t.verdict, t.code, t.activity_mean is not None, t.hourly_cost, t.team,
            t.instance_type)


def credit(tail: Tail, seconds: float, out: dict[HourKey, HourAgg], stopped_at: datetime | None = None) -> None:
    """Roll the tail's tick up: `seconds` from its time on, split at hour boundaries; the tick itself (and its
    decision rows) is counted in the hour it happened. `stopped_at`: the instance's first completed stop at or
    after the tick; the time after it is noted as such."""
    start, left, first = tail.at, seconds, True
    while first or left > 0:
        hour = floor_hour(start)
        chunk = min(left, (hour + HOUR - start).total_seconds())
        h = chunk / 3600.0
        after = 0.0
        if stopped_at is not None:
            after = max(0.0, min(chunk, (start + timedelta(seconds=chunk) - max(start, stopped_at)).total_seconds()))
        agg = out.setdefault(hour_key(tail, hour), HourAgg())
        agg.add(HourAgg(h, int(first), tail.evaluations if first else 0,
                        tail.activity_mean * h if tail.activity_mean is not None else 0.0,
                        tail.activity_max, tail.memory_max_mib, after / 3600.0))
        start, left, first = hour + HOUR, left - chunk, False


def resolve(rows: list[Mapping]) -> Mapping:
    """One instance's decision rows of one tick: the least idle verdict wins (the first such row on a tie)."""
    return min(rows, key=lambda r: RANK.get(r["verdict"], RANK["UNKNOWN"]))


def tail_of(row: Mapping, evaluations: int) -> Tail:
    return Tail(row["instance_id"], row["evaluated_at"], row["verdict"], row["code"], _num(row.get("hourly_cost")),
                row.get("team"), row.get("instance_type"), _num(row.get("activity_mean")),
                _num(row.get("activity_max")), _num(row.get("memory_max_mib")), evaluations)


def merge_tail(old: Tail, new: Tail) -> Tail:
    """A second batch of the same tick: the least idle verdict still wins, every row is counted."""
    win = old if RANK.get(old.verdict, 2) <= RANK.get(new.verdict, 2) else new
    win.evaluations = old.evaluations + new.evaluations
    return win


EPOCH = datetime(1970, 1, 1)


def raw_bucket(at: datetime, every_s: float) -> int:
    """The clock-aligned heartbeat bucket of a naive UTC time (every_s = 3600: its hour)."""
    return int((at.replace(tzinfo=None) - EPOCH).total_seconds() // every_s)


def fold_episode(heads: Heads, row: Mapping, max_gap_s: float, raw_every_s: float | None = None) -> None:
    """Extend the (instance, rule)'s episode or open a new one. raw_every_s: None keeps every row raw; else a
    row is kept when it opens an episode or is the episode's first tick in a new heartbeat bucket."""
    key = (row["instance_id"], row["rule"])
    at = row["evaluated_at"]
    ep = heads.episodes.get(key)
    if (ep is not None and ep.verdict == row["verdict"] and ep.code == row["code"]
            and 0 <= (at - ep.last_seen_at).total_seconds() <= max_gap_s):
        if raw_every_s is None or raw_bucket(at, raw_every_s) != raw_bucket(ep.last_seen_at, raw_every_s):
            heads.raw.append(row)
        if at > ep.last_seen_at:
            ep.ticks += 1
        ep.last_seen_at = at
        ep.latest = row
        ep.changed = True
        return
    if ep is not None and ep.changed and ep.id is not None:
        heads.superseded.append(ep)
    ep = Episode(row["instance_id"], row["rule"], row["verdict"], row["code"], at, at, 1, "", "", None, None, None,
                 bool(row.get("dry_run")), latest=row)
    heads.episodes[key] = ep
    heads.new_episodes.append(ep)
    heads.raw.append(row)


def fold_run(heads: Heads, at: datetime, max_gap_s: float) -> None:
    run = heads.run
    if run is not None and 0 <= (at - run.last_seen_at).total_seconds() <= max_gap_s:
        if at > run.last_seen_at:
            run.ticks += 1
            run.last_seen_at = at
            run.changed = True
        return
    if run is not None and at < run.last_seen_at:
        return  # an old tick replayed: its run is already counted
    if run is not None and run.changed and run.id is not None:
        heads.superseded_runs.append(run)
    heads.run = Run(at, at, 1)
    heads.new_runs.append(heads.run)


def first_stop(stops: Mapping[str, list[datetime]], instance_id: str, at: datetime) -> datetime | None:
    return next((s for s in stops.get(instance_id, ()) if s >= at), None)


def fold_ticks(rows: Iterable[Mapping], heads: Heads, max_gap_s: float,
               stops: Mapping[str, list[datetime]] | None = None,
               raw_every_s: float | None = None) -> dict[HourKey, HourAgg]:
    """Fold decision rows (dicts with the `decisions` table's columns, naive UTC `evaluated_at`) into `heads`;
    returns the hour aggregates to add to the stored rollups. Rows may hold many ticks, in any order.
    `stops`: per instance, the times of its completed real stops (sorted), to note time after them.
    `raw_every_s`: which rows to keep raw (heads.raw; fold_episode)."""
    stops = stops or {}
    out: dict[HourKey, HourAgg] = {}
    by_tick: dict[datetime, dict[str, list[Mapping]]] = {}
    for r in rows:
        by_tick.setdefault(r["evaluated_at"], {}).setdefault(r["instance_id"], []).append(r)
    for at in sorted(by_tick):
        fold_run(heads, at, max_gap_s)
        for inst, inst_rows in by_tick[at].items():
            for r in inst_rows:
                fold_episode(heads, r, max_gap_s, raw_every_s)
            new = tail_of(resolve(inst_rows), len(inst_rows))
            old = heads.tails.get(inst)
            if old is not None and at < old.at:
                continue  # older than what is rolled up already: its episodes are kept, its time is not
            if old is not None and at == old.at:
                heads.tails[inst] = merge_tail(old, new)
            else:
                if old is not None:
                    credit(old, min((at - old.at).total_seconds(), max_gap_s), out, first_stop(stops, inst, old.at))
                heads.tails[inst] = new
            heads.changed_tails.add(inst)
    return out


__all__ = ["Episode", "Tail", "Run", "HourAgg", "Heads", "fold_ticks", "credit", "floor_hour", "RANK",
           "VERDICT_ORDER"]
