"""The database: verdicts (episodes, hourly rollups, recent raw decisions), marks, actions, notifications, state.

Each tick's decisions are recorded once (`Store.record_decisions`): the raw rows (those whose verdict or
code changed, and an hourly heartbeat: StoreSettings.raw_decisions_every_s), kept for
StoreSettings.raw_decisions_days, and in the same transaction the verdict episodes and hourly rollups that
reports, idle costs and budgets read (gpufinops/episodes.py). The actions audit trail is complete and
append-only. Each tick also upserts what the inventory listed of each instance (`Store.record_instances`:
owner, team, account, region, type; the report's owner / account / region columns) and, with a cluster, adds its
GPU nodes' hours and cost split to the hourly node rollup (`Store.record_node_hours`: the report's node pools).
The schema is migrated on
start (Alembic, gpufinops/store_migrations).

SQLite (file, WAL) by default; any SQLAlchemy URL (postgresql://...) works.
Capabilities (billing, recommend, ...) define their own tables on the shared
`metadata` and get them created by the same Store.
"""

from __future__ import annotations

import functools
import logging
import json
from datetime import datetime, timedelta
from typing import Callable, Iterable, Sequence

from sqlalchemy import bindparam, insert, text, select, update, delete, func
from sqlalchemy.exc import IntegrityError

from ..model import ActionKind, ActionResult, Decision, GpuInstance, Verdict
from .schema import (
    ActionRow,
    MarkRow,
    NotificationRow,
    StateRow,
    actions,
    aware_utc,
    decisions,
    instance_labels,
    instance_state,
    k8s_node_hours,
    kv,
    leases,
    marks,
    naive_utc,
    notifications,
    service_runs,
    verdict_episodes,
    verdict_hours,
    verdict_tails,
)
from .rollups import (
    DEFAULT_MAX_GAP_S,
    NODE_HOURS_TICK_KEY,
    covered_seconds,
    fold_into_store,
    insert_rows,
    label_row,
    prune_raw_decisions,
    upsert_labels,
    upsert_node_hours,
    upsert_statement,
)
from .migrate import create_schema, make_engine

# pandas is imported inside the *_frame readers, on purpose: the tick never builds a frame (only reports, costs,
# budgets and /metrics do), and importing pandas takes 0.4-2 s (measured on the build machine), which
# `evaluate --once` and the other commands that only tick or read rows would pay for nothing.
log = logging.getLogger("gpufinops.store")


# The point reads of every tick, built once: a statement built per call costs SQLAlchemy ~0.12 ms of CPU in
# construction and cache-key generation, four times the read itself on SQLite (the demo makes ~15 a tick).
_GET_STATE = select(instance_state).where(instance_state.c.instance_id == bindparam("iid"),
                                          instance_state.c.rule == bindparam("rule"))
_GET_MARK = select(marks).where(marks.c.instance_id == bindparam("iid"))
_GET_NOTIFICATION = select(notifications).where(notifications.c.key == bindparam("key"))
_GET_KV = select(kv.c.value).where(kv.c.key == bindparam("key"))
_KV_ITEMS = (select(kv.c.key, kv.c.value).where(kv.c.key.startswith(bindparam("prefix"), escape="/"))
             .order_by(kv.c.key))


class Store:
    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        create_schema(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------- decisions
    def record_decisions(
        self,
        run_id: str,
        items: Sequence[Decision],
        dry_run: bool,
        teams: dict[str, str] | None = None,
        types: dict[str, str] | None = None,
        *,
        max_gap_s: float = DEFAULT_MAX_GAP_S,
        raw_keep_s: float | None = None,
        raw_every_s: float | None = None,
    ) -> None:
        """Record a tick's decisions (or many ticks', in any order) in one transaction: the raw rows, the
        verdict episodes, the hourly rollups and the service run they extend (gpufinops/episodes.py).

        max_gap_s: a longer gap between two ticks of an instance is time nobody watched (2 x evaluate_every_s).
        raw_keep_s: raw rows older than this before the newest tick are deleted, at most once an hour (their
        episodes and rollups are already stored); None keeps them all.
        raw_every_s: None or 0 stores a raw row for every decision; else only for a decision whose (verdict,
        code) differs from its (instance, rule)'s previous tick (or after a gap), plus one per clock-aligned
        raw_every_s while it holds (store.raw_decisions_every_s; ~1-3 % of the rows of one tick a minute).
        The episodes and rollups get every decision either way; `latest_decisions` reads the episodes."""
        if not items:
            return
        teams = teams or {}
        types = types or {}
        rows = [
            {
                "run_id": run_id,
                "instance_id": d.instance_id,
                "rule": d.rule_name,
                "verdict": d.verdict.value,
                "code": d.code.value,
                "reason": d.reason,
                "evaluated_at": naive_utc(d.evaluated_at),
                "window_s": d.window_s,
                "activity_mean": d.activity_mean,
                "activity_max": d.activity_max,
                "memory_max_mib": d.memory_max_mib,
                "coverage": d.coverage,
                "hourly_cost": d.hourly_cost,
                "team": teams.get(d.instance_id),
                "instance_type": types.get(d.instance_id),
                "dry_run": dry_run,
            }
            for d in items
        ]
        with self.engine.begin() as conn:
            raw = fold_into_store(conn, rows, max_gap_s, raw_every_s or None)
            if raw:
                insert_rows(conn, decisions, raw)
            if raw_keep_s is not None:
                prune_raw_decisions(conn, max(r["evaluated_at"] for r in rows), raw_keep_s)

    def decision_rows(self, start: datetime | None = None, end: datetime | None = None,
                      instance_id: str | None = None) -> list[dict]:
        q = select(decisions).order_by(decisions.c.evaluated_at, decisions.c.id)
        if instance_id is not None:
            q = q.where(decisions.c.instance_id == instance_id)
        if start is not None:
            q = q.where(decisions.c.evaluated_at >= naive_utc(start))
        if end is not None:
            q = q.where(decisions.c.evaluated_at < naive_utc(end))
        with self.engine.connect() as conn:
            out = []
            for r in conn.execute(q).mappings():
                d = dict(r)
                d["evaluated_at"] = aware_utc(d["evaluated_at"])
                out.append(d)
            return out

    def decision_frame(self, start: datetime | None = None, end: datetime | None = None,
                       columns: Sequence[str] | None = None):
        """decision_rows() as one pandas DataFrame (evaluated_at aware UTC): one read, no per-row
        Python objects, for reports and cost joins over months of decisions. By default without the
        long `reason` text and the run id, which no aggregate needs."""
        import pandas as pd

        names = columns or [c.name for c in decisions.columns if c.name not in ("reason", "run_id")]
        q = select(*(decisions.c[n] for n in names)).order_by(decisions.c.evaluated_at, decisions.c.id)
        if start is not None:
            q = q.where(decisions.c.evaluated_at >= naive_utc(start))
        if end is not None:
            q = q.where(decisions.c.evaluated_at < naive_utc(end))
        with self.engine.connect() as conn:
            frame = pd.read_sql_query(q, conn)
        frame["evaluated_at"] = pd.to_datetime(frame["evaluated_at"], utc=True)
        return frame

    def latest_decisions(self, start: datetime, end: datetime) -> list[dict]:
        """Each (instance, rule)'s latest decision in [start, end], from the verdict episodes (no raw row
        needed: the raw window keeps only changes and heartbeats, record_decisions). One dict per (instance,
        rule) judged in the span, from its latest episode there, with the decision columns an episode holds: instance_id, rule, verdict, code,
        evaluated_at (aware UTC), hourly_cost, team, instance_type, dry_run, reason (all of its latest tick).

        evaluated_at is the episode's last_seen_at; an episode that goes on past `end` gives `end` (its tick
        before `end` was at most max_gap_s earlier, the exact second is not stored); its other columns are
        then those of its latest tick."""
        e = verdict_episodes.c
        lo, hi = naive_utc(start), naive_utc(end)
        q = (select(e.id, e.instance_id, e.rule, e.verdict, e.code, e.started_at, e.last_seen_at, e.hourly_cost,
                    e.team, e.instance_type, e.dry_run, e.reason)
             .where(e.last_seen_at >= lo, e.started_at <= hi).order_by(e.last_seen_at, e.id))
        with self.engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
        latest: dict[tuple[str, str], dict] = {}
        for r in rows:  # oldest last_seen_at first: the newest episode of a key wins
            d = {k: r[k] for k in ("instance_id", "rule", "verdict", "code", "hourly_cost", "team",
                                   "instance_type", "dry_run", "reason")}
            d["evaluated_at"] = aware_utc(min(r["last_seen_at"], hi))
            latest[(r["instance_id"], r["rule"])] = d
        return sorted(latest.values(), key=lambda d: d["evaluated_at"])

    # ------------------------------------------------------------- instance labels
    def record_instances(self, instances: Iterable[GpuInstance], now: datetime) -> int:
        """Upsert what this tick's inventory listed of each instance (owner, team, account, region, type, GPUs)
        into instance_labels, in one transaction and one statement batch. Returns the rows written."""
        rows = list({r["instance_id"]: r for r in (label_row(i, now) for i in instances)}.values())
        if not rows:
            return 0
        with self.engine.begin() as conn:
            upsert_labels(conn, rows)
        return len(rows)

    def instance_labels(self, instance_ids: Iterable[str] | None = None) -> dict[str, dict]:
        """The stored labels by instance id (first_seen / last_seen aware UTC); all of them without ids."""
        q = select(instance_labels)
        ids = None if instance_ids is None else sorted(set(instance_ids))
        chunks = [q] if ids is None else [q.where(instance_labels.c.instance_id.in_(ids[i:i + 500]))
                                            for i in range(0, len(ids), 500)]
        out: dict[str, dict] = {}
        with self.engine.connect() as conn:
            for chunk in chunks:
                for r in conn.execute(chunk).mappings():
                    out[r["instance_id"]] = {**r, "first_seen": aware_utc(r["first_seen"]),
                                             "last_seen": aware_utc(r["last_seen"])}
        return out

    def cloud_ids(self) -> dict[str, str]:
        """The provider's own id -> instance id of every instance seen with one (instance_labels.cloud_id: a GCE VM's
        numeric id), latest seen winning; what model.resolve_gce_ids needs to name a bill's `gce-unlisted:` VM."""
        q = (select(instance_labels.c.cloud_id, instance_labels.c.instance_id)
             .where(instance_labels.c.cloud_id.is_not(None)).order_by(instance_labels.c.last_seen))
        with self.engine.connect() as conn:
            return {cid: iid for cid, iid in conn.execute(q) if cid}

    # ------------------------------------------------------------- Kubernetes node hours
    def record_node_hours(self, now: datetime, rows_for: Callable[[datetime, float], Sequence[dict]],
                          interval_s: float, max_gap_s: float) -> int:
        """Add a tick's Kubernetes node-hour rows (k8s_node_hours), in one transaction and one statement batch.
        The tick covers the time since the previous tick recorded here (rollups.covered_seconds: at most
        max_gap_s; the first one interval_s); `rows_for(start, seconds)` gives the rows of the span that starts
        at `start` (naive UTC) and lasts `seconds` (run/node_hours.node_hour_rows: pure). Returns the rows
        written (0 for a tick not after the previous one)."""
        at = naive_utc(now)
        with self.engine.begin() as conn:
            last = conn.execute(_GET_KV, {"key": NODE_HOURS_TICK_KEY}).scalar()
            last_at = datetime.fromisoformat(last) if last else None
            seconds = covered_seconds(last_at, at, interval_s, max_gap_s)
            rows = list(rows_for(at - timedelta(seconds=seconds), seconds)) if seconds > 0 else []
            upsert_node_hours(conn, rows)
            if last_at is None or at > last_at:
                conn.execute(delete(kv).where(kv.c.key == NODE_HOURS_TICK_KEY))
                conn.execute(insert(kv).values(key=NODE_HOURS_TICK_KEY, value=at.isoformat()))
        return len(rows)

    def node_hours_frame(self, start: datetime, end: datetime):
        """The k8s_node_hours rows of the hours from the one `start` falls in up to the one before `end`, as a
        pandas DataFrame (`hour`, `last_seen` aware UTC)."""
        import pandas as pd

        h = k8s_node_hours.c
        q = (select(k8s_node_hours)
             .where(h.hour >= naive_utc(start).replace(minute=0, second=0, microsecond=0), h.hour < naive_utc(end))
             .order_by(h.hour, h.node))
        with self.engine.connect() as conn:
            frame = read_frame(conn, q)
        for c in ("hour", "last_seen"):
            frame[c] = pd.to_datetime(frame[c], utc=True)
        return frame

    # ------------------------------------------------------------- episodes and rollups
    def verdict_hours_frame(self, start: datetime, end: datetime, grain: str = "hour"):
        """Time in each verdict in [start, end), from the hourly rollups plus each instance's tail (its latest
        tick, whose `hours` is NaN: the reader counts it up to its own end, at most max_gap_s).

        grain="hour": one row per hour and key, `at` = the hour; grain="period": summed over the period in SQL
        (`at` = the first hour). Columns: instance_id, team, instance_type, verdict, code, measured,
        hourly_cost, at, hours, ticks, evaluations, activity_hours, activity_max, memory_max_mib,
        after_stop_hours, open (a tail). Hours are counted from the hour `start` falls in, up to the hour
        before `end` (exact for an `end` on the hour or after the latest tick, e.g. now)."""
        import pandas as pd

        h = verdict_hours.c
        keys = [h.instance_id, h.team, h.instance_type, h.verdict, h.code, h.measured, h.hourly_cost]
        where = (h.hour >= naive_utc(start).replace(minute=0, second=0, microsecond=0), h.hour < naive_utc(end))
        if grain == "hour":
            q = select(*keys, h.hour.label("at"), h.hours, h.ticks, h.evaluations, h.activity_hours, h.activity_max,
                       h.memory_max_mib, h.after_stop_hours).where(*where)
        elif grain == "period":
            q = (select(*keys, func.min(h.hour).label("at"), func.sum(h.hours).label("hours"),
                        func.sum(h.ticks).label("ticks"), func.sum(h.evaluations).label("evaluations"),
                        func.sum(h.activity_hours).label("activity_hours"),
                        func.max(h.activity_max).label("activity_max"),
                        func.max(h.memory_max_mib).label("memory_max_mib"),
                        func.sum(h.after_stop_hours).label("after_stop_hours")).where(*where).group_by(*keys))
        else:
            raise ValueError(f"grain must be hour or period, not {grain!r}")
        t = verdict_tails.c
        tq = (select(t.instance_id, t.team, t.instance_type, t.verdict, t.code, t.activity_mean, t.hourly_cost,
                     t.at, t.evaluations, t.activity_max, t.memory_max_mib)
              .where(t.at >= naive_utc(start), t.at < naive_utc(end)))
        with self.engine.connect() as conn:
            rolled = read_frame(conn, q)
            tails = pd.read_sql_query(tq, conn)
        tails = tails.assign(measured=tails["activity_mean"].notna(), hours=float("nan"), ticks=1,
                             activity_hours=tails["activity_mean"],  # x hours once they are known
                             after_stop_hours=0.0)  # a tail's stop is applied by the report itself
        frame = pd.concat([rolled, tails[rolled.columns.tolist() + ["activity_mean"]]], ignore_index=True) \
            if len(tails) else rolled.assign(activity_mean=float("nan"))
        frame["at"] = pd.to_datetime(frame["at"], utc=True)
        frame["measured"] = frame["measured"].astype(bool)
        for c in ("hours", "activity_hours", "activity_max", "memory_max_mib", "hourly_cost", "activity_mean",
                  "after_stop_hours"):
            frame[c] = pd.to_numeric(frame[c], errors="coerce").astype("float64")
        frame["open"] = frame["hours"].isna()
        return frame

    def episode_frame(self, start: datetime | None = None, end: datetime | None = None,
                      instance_ids: Iterable[str] | None = None, with_reason: bool = False):
        """Verdict episodes that overlap [start, end), oldest first (aware UTC times)."""
        import pandas as pd

        e = verdict_episodes.c
        cols = [e.id, e.instance_id, e.rule, e.verdict, e.code, e.started_at, e.last_seen_at, e.ticks, e.hourly_cost,
                e.team, e.instance_type, e.dry_run] + ([e.reason, e.stats] if with_reason else [])
        q = select(*cols).order_by(e.started_at, e.id)
        if start is not None:
            q = q.where(e.last_seen_at >= naive_utc(start))
        if end is not None:
            q = q.where(e.started_at < naive_utc(end))
        if instance_ids is not None:
            q = q.where(e.instance_id.in_(sorted(set(instance_ids))))
        with self.engine.connect() as conn:
            frame = read_frame(conn, q)
        for c in ("started_at", "last_seen_at"):
            frame[c] = pd.to_datetime(frame[c], utc=True)
        return frame

    def verdict_history(self, start: datetime | None = None, end: datetime | None = None,
                        instance_id: str | None = None) -> list[dict]:
        """The verdict episodes as audit rows, oldest first: evaluated_at (when the verdict began), rule,
        verdict, code, dry_run, and the latest reason with how long it held. Complete for every month stored,
        unlike the raw decision rows (kept for StoreSettings.raw_decisions_days)."""
        e = verdict_episodes.c
        q = select(verdict_episodes).order_by(e.started_at, e.id)
        if instance_id is not None:
            q = q.where(e.instance_id == instance_id)
        if start is not None:
            q = q.where(e.last_seen_at >= naive_utc(start))
        if end is not None:
            q = q.where(e.started_at < naive_utc(end))
        with self.engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
        return [{"evaluated_at": aware_utc(r["started_at"]), "last_seen_at": aware_utc(r["last_seen_at"]),
                 "instance_id": r["instance_id"], "rule": r["rule"], "verdict": r["verdict"], "code": r["code"],
                 "dry_run": r["dry_run"], "ticks": r["ticks"],
                 "reason": f"{r['reason']} [{r['ticks']} evaluation(s) until {r['last_seen_at']:%Y-%m-%d %H:%M} UTC]"}
                for r in rows]

    def service_run_frame(self, start: datetime | None = None, end: datetime | None = None):
        """Stretches in which the service evaluated anything, that overlap [start, end) (aware UTC)."""
        import pandas as pd

        r = service_runs.c
        q = select(r.started_at, r.last_seen_at, r.ticks).order_by(r.started_at)
        if start is not None:
            q = q.where(r.last_seen_at >= naive_utc(start))
        if end is not None:
            q = q.where(r.started_at < naive_utc(end))
        with self.engine.connect() as conn:
            frame = pd.read_sql_query(q, conn)
        for c in ("started_at", "last_seen_at"):
            frame[c] = pd.to_datetime(frame[c], utc=True)
        return frame

    # ------------------------------------------------------------- state
    def get_state(self, instance_id: str, rule: str) -> StateRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(_GET_STATE, {"iid": instance_id, "rule": rule}).mappings().first()
        return None if r is None else _state_row(r)

    def put_state(
        self, instance_id: str, rule: str, verdict: Verdict, since: datetime, now: datetime,
        stopped_at: datetime | None, stop_dry_run: bool | None = None,
    ) -> None:
        values = {
            "verdict": verdict.value,
            "since": naive_utc(since),
            "updated_at": naive_utc(now),
            "stopped_at": naive_utc(stopped_at),
            "stop_dry_run": stop_dry_run if stopped_at is not None else None,
        }
        with self.engine.begin() as conn:
            res = conn.execute(
                update(instance_state)
                .where(instance_state.c.instance_id == instance_id, instance_state.c.rule == rule)
                .values(**values)
            )
            if res.rowcount == 0:
                conn.execute(insert(instance_state).values(instance_id=instance_id, rule=rule, **values))

    def update_states(
        self, keys: Sequence[tuple[str, str]],
        step: Callable[[tuple[str, str], StateRow | None], StateRow],
    ) -> dict[tuple[str, str], StateRow]:
        """Advance many (instance, rule) states in one transaction: one read of the stored rows of all `keys`
        (chunked IN on the instance ids), `step(key, previous row or None)` for each key in order (a key seen
        twice gets its own first result as the previous row), and one batched upsert of the results (INSERT ...
        ON CONFLICT on SQLite and PostgreSQL). Returns the new rows by key. The per-tick state tracking of the
        act stage: a round trip per decision cost 4.5 s a tick at 10k GPUs (issue 29)."""
        if not keys:
            return {}
        s = instance_state.c
        ids = sorted({k[0] for k in keys})
        wanted = set(keys)
        current: dict[tuple[str, str], StateRow | None] = {}
        with self.engine.begin() as conn:
            for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
                for r in conn.execute(select(instance_state).where(s.instance_id.in_(chunk))).mappings():
                    if (r["instance_id"], r["rule"]) in wanted:
                        current[(r["instance_id"], r["rule"])] = _state_row(r)
            stored = set(current)
            out: dict[tuple[str, str], StateRow] = {}
            for key in keys:
                out[key] = current[key] = step(key, current.get(key))
            rows = [_state_values(row) for row in out.values()]
            _upsert_states(conn, rows, stored)
        return out

    # ------------------------------------------------------------- marks
    def get_mark(self, instance_id: str) -> MarkRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(_GET_MARK, {"iid": instance_id}).mappings().first()
        if r is None:
            return None
        return _mark_row(r)

    def all_marks(self) -> list[MarkRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(marks)).mappings().all()
        return [_mark_row(r) for r in rows]

    def put_mark(self, m: MarkRow) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(marks).where(marks.c.instance_id == m.instance_id))
            conn.execute(
                insert(marks).values(
                    instance_id=m.instance_id, rule=m.rule, marked_at=naive_utc(m.marked_at),
                    stop_at=naive_utc(m.stop_at), reason=m.reason, dry_run=m.dry_run,
                    warned_at=naive_utc(m.warned_at),
                )
            )

    def clear_mark(self, instance_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(marks).where(marks.c.instance_id == instance_id))

    # ------------------------------------------------------------- actions
    def begin_action(
        self, run_id: str, instance_id: str, kind: ActionKind, rule: str, dry_run: bool, reason: str, at: datetime
    ) -> int:
        """Write the intent before touching the cloud, so a crash leaves a trace to reconcile."""
        with self.engine.begin() as conn:
            res = conn.execute(
                insert(actions).values(
                    run_id=run_id, instance_id=instance_id, kind=kind.value, rule=rule, dry_run=dry_run,
                    status="pending", reason=reason, at=naive_utc(at),
                )
            )
            return int(res.inserted_primary_key[0])

    def finish_action(self, action_id: int, ok: bool, at: datetime, error: str | None = None, status: str | None = None) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(actions)
                .where(actions.c.id == action_id)
                # error None keeps what an earlier step noted (an "applied" row finished after its bookkeeping).
                .values(status=status or ("done" if ok else "failed"), finished_at=naive_utc(at),
                        **({} if error is None else {"error": error}))
            )

    def record_action(self, run_id: str, result: ActionResult) -> None:
        """An action that needs no two-step intent (skip, notify, dry-run)."""
        with self.engine.begin() as conn:
            conn.execute(
                insert(actions).values(
                    run_id=run_id, instance_id=result.instance_id, kind=result.kind.value, rule=result.rule_name,
                    dry_run=result.dry_run, status="done" if result.ok else "failed", reason=result.reason,
                    error=result.error, at=naive_utc(result.at), finished_at=naive_utc(result.at),
                )
            )

    def action_rows(self, status: str | Sequence[str] | None = None, kinds: Iterable[ActionKind] | None = None,
                    start: datetime | None = None, end: datetime | None = None,
                    instance_id: str | None = None) -> list[ActionRow]:
        statuses = ((status,) if isinstance(status, str) else tuple(status)) if status else ()
        kind_values = tuple(k.value for k in kinds) if kinds else ()
        q = _action_query(instance_id is not None, bool(statuses), bool(kind_values), start is not None,
                          end is not None)
        params = {"iid": instance_id, "statuses": list(statuses), "kinds": list(kind_values),
                  "start": naive_utc(start), "end": naive_utc(end)}
        with self.engine.connect() as conn:
            rows = conn.execute(q, params).mappings().all()
        return [
            ActionRow(r["id"], r["run_id"], r["instance_id"], ActionKind(r["kind"]), r["rule"] or "", r["dry_run"],
                      r["status"], r["reason"], r["error"], aware_utc(r["at"]))
            for r in rows
        ]

    # ------------------------------------------------------------- notifications
    def notification_sent(self, key: str) -> bool:
        """Delivered (Slack ok, found by lookup, or in the outbox). A pending key is not: its fate is looked
        up before any second post (notify.py)."""
        row = self.get_notification(key)
        return row is not None and row.delivered

    def get_notification(self, key: str) -> NotificationRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(_GET_NOTIFICATION, {"key": key}).mappings().first()
        return None if r is None else _notification_row(r)

    def delivered_at(self, key: str) -> datetime | None:
        """When the message with this key was delivered; None while it is not."""
        row = self.get_notification(key)
        return row.at if row is not None and row.delivered else None

    def notifications_due(self, now: datetime, limit: int = 100, skip_prefix: str = "warn:") -> list[NotificationRow]:
        """Failed messages whose backoff is over, oldest first. Stop warnings are left out: the act stage
        sends them again itself, with the stop time counted from that try."""
        q = (select(notifications)
             .where(notifications.c.status == "failed", ~notifications.c.key.startswith(skip_prefix, autoescape=True),
                    (notifications.c.next_attempt_at.is_(None)) | (notifications.c.next_attempt_at <= naive_utc(now)))
             .order_by(notifications.c.at).limit(limit))
        with self.engine.connect() as conn:
            return [_notification_row(r) for r in conn.execute(q).mappings()]

    def undelivered_count(self) -> int:
        """Messages that failed and wait for another try (for health and /metrics)."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(notifications)
                                    .where(notifications.c.status == "failed")).scalar_one())

    def abandon_notification(self, key: str, at: datetime, why: str) -> None:
        """Never send this message any more (unless already delivered)."""
        with self.engine.begin() as conn:
            conn.execute(update(notifications)
                         .where(notifications.c.key == key, notifications.c.status.in_(("pending", "failed")))
                         .values(status="abandoned", at=naive_utc(at), detail=why[:500]))

    def record_notification(self, key: str, channel: str, text: str, status: str, at: datetime,
                            detail: str | None = None, *, blocks: Sequence[dict] | None = None,
                            attempts: int | None = None, next_attempt_at: datetime | None = None) -> None:
        values = dict(key=key, channel=channel, text=text, status=status, at=naive_utc(at), detail=detail,
                      attempts=attempts, next_attempt_at=naive_utc(next_attempt_at),
                      blocks=json.dumps(list(blocks), default=str) if blocks else None)
        with self.engine.begin() as conn:
            conn.execute(delete(notifications).where(notifications.c.key == key))
            conn.execute(insert(notifications).values(**values))

    def notification_rows(self) -> list[dict]:
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(select(notifications).order_by(notifications.c.at)).mappings()]


    # ------------------------------------------------------------- kv
    def get_kv(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            r = conn.execute(_GET_KV, {"key": key}).first()
        return None if r is None else r[0]

    def kv_items(self, prefix: str) -> list[tuple[str, str]]:
        with self.engine.connect() as conn:
            # '%' and '_' in a prefix are literals, not wildcards (what autoescape=True does for a literal).
            escaped = prefix.replace("/", "//").replace("%", "/%").replace("_", "/_")
            rows = conn.execute(_KV_ITEMS, {"prefix": escaped}).all()
        return [(r[0], r[1]) for r in rows]

    def set_kv(self, key: str, value: str | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(kv).where(kv.c.key == key))
            if value is not None:
                conn.execute(insert(kv).values(key=key, value=value))

    def claim_kv(self, key: str, value: str) -> bool:
        """Write key only if nobody holds it yet: True for the one caller whose INSERT wins, False when the key
        exists (the primary key refuses the second row, so two concurrent claims cannot both win, on SQLite as
        on PostgreSQL; a get-then-set could)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(kv).values(key=key, value=value))
        except IntegrityError:
            return False
        return True


READ_CHUNK_ROWS = 100_000


def read_frame(conn, q, chunk_rows: int | None = None):
    """pd.read_sql_query(q, conn) read `chunk_rows` rows at a time and concatenated: the same frame, without
    every row as Python objects at once (a month of 10k GPUs is 1.2 M hourly rows: read whole, 1.7 GB peak for
    a 180 MiB frame; issue 29). A column that a chunk inferred otherwise (all NULL there: object) gets the type
    the other chunks inferred, as one read would have."""
    import pandas as pd

    parts = list(pd.read_sql_query(q, conn, chunksize=chunk_rows or READ_CHUNK_ROWS))
    if not parts:
        return pd.read_sql_query(q, conn)
    if len(parts) == 1:
        return parts[0]
    frame = pd.concat(parts, ignore_index=True)
    for c in frame.columns:
        kinds = {p[c].dtype for p in parts if len(p) and p[c].dtype != object}
        if frame[c].dtype != object or len(kinds) != 1:
            continue
        kind = kinds.pop()
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype(kind) if kind.kind in "fiub" \
            else frame[c].astype(kind)
    return frame


@functools.lru_cache(maxsize=None)
def _action_query(by_instance: bool, by_status: bool, by_kind: bool, from_start: bool, to_end: bool):
    """The actions query of that shape, built once (action_rows runs twice a tick)."""
    a = actions.c
    q = select(actions).order_by(a.at, a.id)
    if by_instance:
        q = q.where(a.instance_id == bindparam("iid"))
    if by_status:
        q = q.where(a.status.in_(bindparam("statuses", expanding=True)))
    if by_kind:
        q = q.where(a.kind.in_(bindparam("kinds", expanding=True)))
    if from_start:
        q = q.where(a.at >= bindparam("start", type_=a.at.type))
    if to_end:
        q = q.where(a.at < bindparam("end", type_=a.at.type))
    return q


def _state_row(r) -> StateRow:
    return StateRow(r["instance_id"], r["rule"], Verdict(r["verdict"]), aware_utc(r["since"]),
                    aware_utc(r["updated_at"]), aware_utc(r["stopped_at"]), r["stop_dry_run"])


def _state_values(row: StateRow) -> dict:
    return {"instance_id": row.instance_id, "rule": row.rule, "verdict": row.verdict.value,
            "since": naive_utc(row.since), "updated_at": naive_utc(row.updated_at),
            "stopped_at": naive_utc(row.stopped_at),
            "stop_dry_run": row.stop_dry_run if row.stopped_at is not None else None}


_STATE_VALUES = ("verdict", "since", "updated_at", "stopped_at", "stop_dry_run")


def _upsert_states(conn, rows: Sequence[dict], stored: set[tuple[str, str]]) -> None:
    """One INSERT ... ON CONFLICT DO UPDATE (executemany) on SQLite and PostgreSQL; elsewhere batched updates
    of the keys read as stored and inserts of the others (the caller read them in this transaction)."""
    if conn.dialect.name in ("sqlite", "postgresql"):
        conn.execute(upsert_statement(conn.dialect.name, instance_state, _STATE_VALUES), list(rows))
        return
    updates = [{"k_id": r["instance_id"], "k_rule": r["rule"], **{f"v_{f}": r[f] for f in _STATE_VALUES}}
               for r in rows if (r["instance_id"], r["rule"]) in stored]
    if updates:
        conn.execute(update(instance_state)
                     .where(instance_state.c.instance_id == bindparam("k_id"), instance_state.c.rule == bindparam("k_rule"))
                     .values(**{f: bindparam(f"v_{f}") for f in _STATE_VALUES}), updates)
    inserts = [r for r in rows if (r["instance_id"], r["rule"]) not in stored]
    if inserts:
        conn.execute(insert(instance_state), inserts)


def _mark_row(r) -> MarkRow:
    return MarkRow(r["instance_id"], r["rule"], aware_utc(r["marked_at"]), aware_utc(r["stop_at"]), r["reason"],
                   r["dry_run"], aware_utc(r["warned_at"]))


def _notification_row(r) -> NotificationRow:
    try:
        blocks = tuple(json.loads(r["blocks"])) if r["blocks"] else ()
    except ValueError:
        blocks = ()
    return NotificationRow(r["key"], r["channel"], r["text"], r["status"], aware_utc(r["at"]), r["detail"],
                           int(r["attempts"] or 0), aware_utc(r["next_attempt_at"]), blocks)


__all__ = ["Store"]
