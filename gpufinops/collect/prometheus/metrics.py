"""The tick: `PrometheusMetrics.window_usage`, the MetricsSource over Prometheus + dcgm-exporter (or
VictoriaMetrics). Sends the fixed query set (per shard, `shard_parallelism` at a time), folds each answer as it
lands, plans and sends the detail read, and keeps the REASON_SIGNALS rows between their reads (`_KeptReasons`)."""

from __future__ import annotations

import functools
import gc
import threading
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator, Mapping, Sequence

import requests

from gpufinops.collect.errors import QueryFailed
from gpufinops.config import PrometheusSettings
from gpufinops.model import GpuInstance, InstanceUsage

from .answers import Identity, Row, parse_body
from .detail import DetailWanted, detail_rows
from .fold import UsageFold
from .promql import PromQL, shard_count, shard_of, slots_matcher
from .reader import PromReader
from .signals import CLEAN, FOLDED, REASON_SIGNALS, REASON_SLOTS, SM_ACTIVE


def _as_utc(now: datetime) -> datetime:
    return now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now


class _GcPause:
    """Python's cyclic garbage collector held off while a tick builds its rows and figures (`gc_paused`).

    A tick at 10k GPUs makes some 200k short-lived containers (rows, per-signal figures, stats); each time the
    young ones pile up the collector walks every live object, so it ran again and again over the same answers:
    measured, it was a third of the client's CPU (BENCHMARKS.md, "Client time per tick"). Reference counting
    frees them as usual meanwhile; a cycle made during the tick waits for the next collection. Counted, so that
    two ticks at once (two rule windows) turn it back on only when both are done, and only if it was on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._was_enabled = False

    @contextmanager
    def held(self):
        with self._lock:
            if self._holders == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._was_enabled:
                    gc.enable()


gc_paused = _GcPause().held  # the one per process: the collector it holds off is the process's


class PrometheusMetrics:
    """MetricsSource over Prometheus + dcgm-exporter (or VictoriaMetrics: the same API)."""

    def __init__(self, settings: PrometheusSettings, session: requests.Session | None = None):
        self.settings = settings
        self.promql = PromQL(
            instance_label=settings.instance_label,
            hostname_labels=tuple(settings.hostname_labels),
            scrape_interval_s=settings.scrape_interval_s,
            selector=settings.selector,
        )
        self.reader = PromReader(settings, session)
        # (window_s, shard) -> slot -> the occupancy / tensor / FP-pipe rows of its last read (`_slots_due`).
        # Bounded: one entry per rule window and shard, a few rows per profiled GPU in all.
        self._reasons: dict[tuple[int, int], dict[int, _KeptReasons]] = {}

    @property
    def queries_made(self) -> int:
        """HTTP queries sent, for tests and the benchmark."""
        return self.reader.queries_made

    def _query(self, key: tuple[str, str], promql: str, at: float) -> list[Row]:
        return parse_body(key, self.reader.instant_body(promql, at))

    def _all(self, queries: Mapping[Any, str], kind_of, at: float) -> dict[Any, list[Row]]:
        return dict(self._landing(queries, kind_of, at))

    def _landing(self, queries: Mapping[Any, str], kind_of, at: float) -> Iterator[tuple[Any, list[Row]]]:
        """(key, rows) of each query as its answer lands. Concurrent: Prometheus evaluates queries in parallel,
        so the wall time is that of the slowest; the caller works on each answer while the others are computed.
        The first failed query raises (QueryFailed), after the others have ended."""
        with ThreadPoolExecutor(max_workers=max(len(queries), 1)) as pool:
            futures = {pool.submit(self._query, kind_of(key), q, at): key for key, q in queries.items()}
            for future in as_completed(futures):
                yield futures[future], future.result()

    def window_usage(
        self, instances: Sequence[GpuInstance], window_s: int, now: datetime
    ) -> dict[str, InstanceUsage]:
        at = _as_utc(now).timestamp()
        count = shard_count(self.settings.shards, instances)
        with gc_paused():
            if count == 1:
                return self._shard_usage(self.promql, instances, window_s, at, (window_s, 0), "")
            shards: dict[int, list[GpuInstance]] = {}
            for inst in instances:
                shards.setdefault(shard_of(inst.instance_id, count), []).append(inst)
            owned = set(self.settings.owned_shards) or set(range(count))
            usage: dict[str, InstanceUsage] = {}
            expected = window_s // self.settings.scrape_interval_s
            for index in sorted(set(shards) - owned):  # another replica's (docs/scale.md, "Two replicas")
                usage.update({inst.instance_id: InstanceUsage(
                    inst.instance_id, window_s, expected, (),
                    error=f"shard {index + 1} of {count} is another replica's (prometheus.owned_shards)")
                    for inst in shards[index]})
            # Each shard's answers become its instances' usage as soon as they land, and are dropped: at most
            # `shard_parallelism` shards' answers are held at once, whatever the fleet.
            with ThreadPoolExecutor(max_workers=self.settings.shard_parallelism) as pool:
                futures = [pool.submit(self._shard_usage, self.promql.shard(index, count), members, window_s, at,
                                       (window_s, index), f"shard {index + 1} of {count}: ")
                           for index, members in sorted(shards.items()) if index in owned]
                for future in as_completed(futures):
                    usage.update(future.result())
            return {inst.instance_id: usage[inst.instance_id] for inst in instances}

    def _slots_due(self, kept: Mapping[int, _KeptReasons], at: float) -> set[int]:
        """The slots whose REASON_SIGNALS legs this tick reads (REASON_SLOTS, by instance): all of them when
        nothing is kept (or a kept read is from a later time than this tick: a replay), else every slot whose
        read is `profiling_reasons_every_s` old, and the stalest once it is a fifth of that old: on a tick a
        minute with the default, one fifth of the fleet per tick, each GPU read again every 5 minutes."""
        every, slots = self.settings.profiling_reasons_every_s, range(REASON_SLOTS)
        if every == 0 or any(s not in kept or kept[s].at > at for s in slots):
            return set(slots)
        due = {s for s in slots if at - kept[s].at >= every}
        stalest = min(slots, key=lambda s: kept[s].at)
        if at - kept[stalest].at >= every / REASON_SLOTS:
            due.add(stalest)
        return due

    def _shard_usage(self, promql: PromQL, instances: Sequence[GpuInstance], window_s: int, at: float,
                     key: tuple[int, int], where: str) -> dict[str, InstanceUsage]:
        """The usage of `instances` from one query set (the whole fleet's, or one shard's). A failed or timed-out
        query makes every instance of this set UNKNOWN, with the reason (never idle, never dropped)."""
        expected = window_s // self.settings.scrape_interval_s
        label = self.settings.instance_label
        kept = self._reasons.setdefault(key, {})
        due = self._slots_due(kept, at)
        if due and not label:  # no instance label to take turns by: all at once
            due = set(range(REASON_SLOTS))
        reasons: bool | str = (True if len(due) == REASON_SLOTS else
                               slots_matcher(label, due, REASON_SLOTS, unlabelled=True) if due else False)
        # The other instances' profiling figures as last read (their slots are not due), with their ages.
        ages = [0.0 if slot in due else at - kept[slot].at for slot in range(REASON_SLOTS)]
        old = [kept[slot] for slot in range(REASON_SLOTS) if slot not in due]
        old_pairs = frozenset().union(*(k.pairs for k in old))
        fold = UsageFold(instances, window_s, expected, label, tuple(self.settings.hostname_labels),
                         profiling_age_of=(lambda labels: ages[shard_of(labels.get(label, ""), REASON_SLOTS)])
                         if old else None)  # none kept: every GPU's are read now, none is older
        matcher = fold.matcher
        by = promql.by_labels
        wanted = DetailWanted()
        try:
            # Each answer is folded as it lands, while the engine still computes the others: its invalid-sample
            # pairs are final on landing (a signal comes from one query), so its clean rows can be counted.
            clean: dict[tuple[str, str], list[Row]] = {}
            for key, rows in self._landing(promql.queries(window_s, reasons), lambda k: k, at):
                clean[key] = rows
                fold.add(key, rows, wanted.add(key[0], rows, matcher, by) | old_pairs)
            detail = wanted.plan(promql, window_s, expected)
            extra: dict[tuple[str, str, str], Sequence[Row]] = {}
            for key, found in self._landing(detail.queries, lambda k: k[:2], at):
                extra[key] = detail_rows(key[0], key[1], found, by, detail.pairs)
                fold.add(key[:2], extra[key])
        except QueryFailed as exc:
            return {
                inst.instance_id: InstanceUsage(inst.instance_id, window_s, expected, (), error=f"{where}{exc}")
                for inst in instances
            }
        for part in old:
            for key, rows in part.joined({}).items():
                fold.add(key, rows, part.pairs)
        if due:
            answers = dict(clean)
            for (metric, kind, _label), rows in extra.items():
                answers[(metric, kind)] = [*answers.get((metric, kind), ()), *rows]
            kept.update(_KeptReasons.of(answers, detail.pairs, at).parts(label, by, due))
        return fold.usage()


@dataclass(frozen=True)
class _KeptReasons:
    """The REASON_SIGNALS rows of the last tick that read them (clean, and the raw/dirty reads of GPUs with
    invalid samples), for one window, shard and slot, with the time of that tick. Rows keep their labels, so each
    GPU finds its own figures again; a GPU first seen since has none until its next read (None: not read, never 0)."""

    at: float
    clean: tuple[Row, ...]
    detail: dict[tuple[str, str], tuple[Row, ...]]
    pairs: frozenset[tuple[str, Identity]]

    @classmethod
    def of(cls, answers: Mapping[tuple[str, str], Sequence[Row]], pairs, at: float) -> _KeptReasons:
        hosted = tuple(FOLDED[m][1] + "_" for m in REASON_SIGNALS)
        clean = tuple(r for r in answers.get((SM_ACTIVE, CLEAN), ()) if r[1].startswith(hosted))
        detail = {k: tuple(v) for k, v in answers.items() if k[0] in REASON_SIGNALS and k[1] != CLEAN}
        return cls(at, clean, detail, frozenset(p for p in pairs if p[0] in REASON_SIGNALS))

    def parts(self, label: str, by: Sequence[str], slots: Iterable[int]) -> dict[int, _KeptReasons]:
        """Per slot of `slots`, the rows of the instances in it (their instance label's shard_of among
        REASON_SLOTS). One pass over the rows whatever the number of slots (all five on a first tick), and one
        shard_of per instance: every row of an instance has the same label value."""
        slot_of = functools.lru_cache(maxsize=None)(functools.partial(shard_of, count=REASON_SLOTS))
        clean: dict[int, list[Row]] = {slot: [] for slot in slots}
        detail: dict[int, dict[tuple[str, str], list[Row]]] = {slot: {k: [] for k in self.detail} for slot in clean}
        pairs: dict[int, set[tuple[str, Identity]]] = {slot: set() for slot in clean}
        for row in self.clean:
            if (slot := slot_of(row[0].get(label, ""))) in clean:
                clean[slot].append(row)
        for key, rows in self.detail.items():
            for row in rows:
                if (slot := slot_of(row[0].get(label, ""))) in detail:
                    detail[slot][key].append(row)
        at = by.index(label) if label in by else None  # where an identity holds the instance label
        for pair in self.pairs:
            if (slot := slot_of("" if at is None else pair[1][at])) in pairs:
                pairs[slot].add(pair)
        return {slot: _KeptReasons(self.at, tuple(clean[slot]), {k: tuple(v) for k, v in detail[slot].items()},
                                   frozenset(pairs[slot])) for slot in clean}

    def joined(self, answers: Mapping[tuple[str, str], Sequence[Row]]) -> dict[tuple[str, str], Sequence[Row]]:
        out = dict(answers)
        if self.clean:
            out[(SM_ACTIVE, CLEAN)] = [*out.get((SM_ACTIVE, CLEAN), ()), *self.clean]
        for k, rows in self.detail.items():
            if rows:
                out[k] = [*out.get(k, ()), *rows]
        return out
