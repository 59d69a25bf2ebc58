"""What each tick writes beside its raw decisions, in the same transaction: the verdict episodes and hourly
rollups reports, idle costs and budgets read (folded by store/episodes.py), instance labels, and the pruning
of raw decision rows after store.raw_decisions_days.
"""

from __future__ import annotations

import json
import functools
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Sequence

from sqlalchemy import Table, bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Connection

from .episodes import Episode, Heads, HourAgg, Run, Tail, fold_ticks
from ..model import GpuInstance
from .schema import (
    LABEL_KEPT_WHEN_NULL,
    LABEL_SIZES,
    LABEL_UPDATED,
    NODE_HOUR_LATEST,
    NODE_HOUR_SUMS,
    actions,
    decisions,
    instance_labels,
    k8s_node_hours,
    kv,
    naive_utc,
    service_runs,
    verdict_episodes,
    verdict_hours,
    verdict_tails,
)


DEFAULT_MAX_GAP_S = 120.0  # 2 x the default evaluate_every_s (60 s)


PRUNE_EVERY_S = 3600  # raw decision rows are pruned at most once an hour


PRUNED_AT_KEY = "store:raw_decisions_pruned_at"


def insert_rows(conn: Connection, table: Table, rows: Sequence[dict]) -> None:
    """INSERT many rows. On SQLite straight through the driver's executemany, with each value converted by
    its column type's own bind processor (the text SQLAlchemy would store): a tick of a large fleet, or an
    hour of them, is tens of thousands of rows and the generic path spends most of its time per row."""
    if conn.dialect.name != "sqlite" or not rows:
        conn.execute(insert(table), list(rows))
        return
    names = list(rows[0])
    convert = [(i, p) for i, p in enumerate(table.c[n].type.bind_processor(conn.dialect) for n in names)
               if p is not None]
    values = itemgetter(*names)
    quote = conn.dialect.identifier_preparer.quote
    sql = (f"INSERT INTO {conn.dialect.identifier_preparer.format_table(table)} "
           f"({', '.join(quote(n) for n in names)}) VALUES ({', '.join('?' * len(names))})")
    params = []
    for r in rows:
        v = list(values(r))
        for i, p in convert:
            if v[i] is not None:
                v[i] = p(v[i])
        params.append(tuple(v))
    conn.exec_driver_sql(sql, params)


def load_heads(conn: Connection, instance_ids: Sequence[str], since: datetime) -> Heads:
    """The latest episode per (instance, rule) seen since `since` (an older one cannot be extended: the gap is
    too long), the tails of these instances and the latest service run."""
    heads = Heads()
    ids = sorted(set(instance_ids))
    for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
        for r in conn.execute(_HEAD_EPISODES, {"ids": chunk, "since": since}).mappings():
            heads.episodes[(r["instance_id"], r["rule"])] = Episode(
                r["instance_id"], r["rule"], r["verdict"], r["code"], r["started_at"], r["last_seen_at"], r["ticks"],
                r["reason"], r["stats"], r["hourly_cost"], r["team"], r["instance_type"], r["dry_run"], id=r["id"])
        for r in conn.execute(_TAILS, {"ids": chunk}).mappings():
            heads.tails[r["instance_id"]] = Tail(**{k: r[k] for k in TAIL_FIELDS})
    r = conn.execute(_LATEST_RUN).mappings().first()
    if r is not None:
        heads.run = Run(r["started_at"], r["last_seen_at"], r["ticks"], id=r["id"])
    return heads


TAIL_FIELDS = ("instance_id", "at", "verdict", "code", "hourly_cost", "team", "instance_type", "activity_mean",
               "activity_max", "memory_max_mib", "evaluations")


EPISODE_FIELDS = ("instance_id", "rule", "verdict", "code", "started_at", "last_seen_at", "ticks", "reason", "stats",
                  "hourly_cost", "team", "instance_type", "dry_run")


HOUR_KEY_FIELDS = ("hour", "instance_id", "verdict", "code", "measured", "hourly_cost", "team", "instance_type")


HOUR_AGG_FIELDS = ("hours", "ticks", "evaluations", "activity_hours", "activity_max", "memory_max_mib",
                   "after_stop_hours")


STOP_KINDS = ("stop", "terminate")


# The statements of every tick, built once (the reads take a chunk of instance ids; the updates run as
# executemany by id): on a small fleet, building them cost more CPU than running them.
_IDS = bindparam("ids", expanding=True)
_HEAD_EPISODES = select(verdict_episodes).where(verdict_episodes.c.id.in_(
    select(func.max(verdict_episodes.c.id))
    .where(verdict_episodes.c.instance_id.in_(_IDS),
           verdict_episodes.c.last_seen_at >= bindparam("since", type_=verdict_episodes.c.last_seen_at.type))
    .group_by(verdict_episodes.c.instance_id, verdict_episodes.c.rule)))
_TAILS = select(verdict_tails).where(verdict_tails.c.instance_id.in_(_IDS))
_LATEST_RUN = select(service_runs).order_by(service_runs.c.id.desc()).limit(1)
_COMPLETED_STOPS = (select(actions.c.instance_id, actions.c.at)
                    .where(actions.c.instance_id.in_(_IDS), actions.c.kind.in_(STOP_KINDS),
                           actions.c.dry_run.is_(False), actions.c.status == "done",
                           actions.c.at >= bindparam("since", type_=actions.c.at.type))
                    .order_by(actions.c.at))
_STORED_HOURS = select(verdict_hours).where(
    verdict_hours.c.hour >= bindparam("first_hour", type_=verdict_hours.c.hour.type),
    verdict_hours.c.instance_id.in_(_IDS))
EPISODE_UPDATED = ("last_seen_at", "ticks", "reason", "stats", "hourly_cost", "team", "instance_type")
_UPDATE_EPISODE = (update(verdict_episodes).where(verdict_episodes.c.id == bindparam("ep_id"))
                   .values(**{f: bindparam(f"v_{f}") for f in EPISODE_UPDATED}))
_UPDATE_RUN = (update(service_runs).where(service_runs.c.id == bindparam("run_id"))
               .values(last_seen_at=bindparam("v_last_seen_at"), ticks=bindparam("v_ticks")))
_UPDATE_HOUR = (update(verdict_hours).where(verdict_hours.c.id == bindparam("row_id"))
                .values(**{f: bindparam(f"v_{f}") for f in HOUR_AGG_FIELDS}))


def completed_stops(conn: Connection, heads: Heads) -> dict[str, list[datetime]]:
    """Completed real stops of the instances whose tails are about to be rolled up, since their tails' ticks."""
    if not heads.tails:
        return {}
    since = min(t.at for t in heads.tails.values())
    ids = sorted(heads.tails)
    out: dict[str, list[datetime]] = {}
    for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
        for inst, at in conn.execute(_COMPLETED_STOPS, {"ids": chunk, "since": since}):
            out.setdefault(inst, []).append(at)
    return out


def fold_into_store(conn: Connection, rows: Sequence[dict], max_gap_s: float,
                    raw_every_s: float | None = None) -> list[dict]:
    """Fold decision rows into the stored episodes, tails, service runs and hourly rollups (one connection,
    the caller's transaction). Returns the rows to keep as raw decision rows, in their given order: all of
    them with raw_every_s None, else those that open an episode or are its heartbeat (episodes.fold_episode)."""
    since = min(r["evaluated_at"] for r in rows) - timedelta(seconds=max_gap_s)
    heads = load_heads(conn, [r["instance_id"] for r in rows], since)
    hours = fold_ticks(rows, heads, max_gap_s, completed_stops(conn, heads), raw_every_s)
    write_folded(conn, heads, hours)
    if raw_every_s is None:
        return list(rows)
    kept = {id(r) for r in heads.raw}
    return [r for r in rows if id(r) in kept]


def write_folded(conn: Connection, heads: Heads, hours: dict) -> None:
    """Write what a fold changed or opened: episodes, service runs, tails and hour aggregates (the caller's
    transaction; bench/bench_report_scale.py writes a month it folded per stretch through it)."""
    changed = [e.settle() for e in (*heads.superseded, *heads.episodes.values()) if e.changed and e.id is not None]
    if changed:
        conn.execute(_UPDATE_EPISODE, [{"ep_id": e.id, **{f"v_{f}": getattr(e, f) for f in EPISODE_UPDATED}}
                                       for e in changed])
    if heads.new_episodes:
        conn.execute(insert(verdict_episodes), [{f: getattr(e.settle(), f) for f in EPISODE_FIELDS}
                                                for e in heads.new_episodes])
    runs = [r for r in (*heads.superseded_runs, *([heads.run] if heads.run is not None else []))
            if r.changed and r.id is not None]
    if runs:
        conn.execute(_UPDATE_RUN, [{"run_id": r.id, "v_last_seen_at": r.last_seen_at, "v_ticks": r.ticks}
                                   for r in runs])
    if heads.new_runs:
        conn.execute(insert(service_runs), [{"started_at": r.started_at, "last_seen_at": r.last_seen_at,
                                             "ticks": r.ticks} for r in heads.new_runs])
    if heads.changed_tails:
        ids = sorted(heads.changed_tails)
        for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
            conn.execute(delete(verdict_tails).where(verdict_tails.c.instance_id.in_(chunk)))
        conn.execute(insert(verdict_tails), [{f: getattr(heads.tails[i], f) for f in TAIL_FIELDS} for i in ids])
    if hours:
        upsert_hours(conn, hours)


def upsert_hours(conn: Connection, hours: dict) -> None:
    """Add hour aggregates to the stored rollups: the rows of the hours and instances touched are read once,
    summed in, and written back (updates by id, inserts for new keys)."""
    first_hour = min(k[0] for k in hours)
    instances = sorted({k[1] for k in hours})
    stored: dict[tuple, tuple[int, HourAgg]] = {}
    for chunk in (instances[i:i + 500] for i in range(0, len(instances), 500)):
        for r in conn.execute(_STORED_HOURS, {"ids": chunk, "first_hour": first_hour}).mappings():
            stored[tuple(r[f] for f in HOUR_KEY_FIELDS)] = (r["id"], HourAgg(*(r[f] for f in HOUR_AGG_FIELDS)))
    updates, inserts = [], []
    for key, agg in hours.items():
        if key in stored:
            row_id, have = stored[key]
            have.add(agg)
            updates.append({"row_id": row_id, **{f"v_{f}": getattr(have, f) for f in HOUR_AGG_FIELDS}})
        else:
            inserts.append({**dict(zip(HOUR_KEY_FIELDS, key)), **{f: getattr(agg, f) for f in HOUR_AGG_FIELDS}})
    if updates:
        conn.execute(_UPDATE_HOUR, updates)
    if inserts:
        conn.execute(insert(verdict_hours), inserts)


def label_row(inst: GpuInstance, now: datetime) -> dict:
    """One instance_labels row: owner and team as the messages read them (GpuInstance.owner(), .team()), every
    text clipped to its column (tag values are whatever a person typed)."""
    def clip(name: str, value) -> str:
        return str(value or "")[:LABEL_SIZES[name]]

    seen = naive_utc(now)
    return {"instance_id": clip("instance_id", inst.instance_id), "owner": clip("owner", inst.owner()),
            "team": clip("team", inst.team()), "account": clip("account", inst.account),
            "region": clip("region", inst.region), "instance_type": clip("instance_type", inst.instance_type),
            "gpu_model": clip("gpu_model", inst.gpu_model), "gpu_count": int(inst.gpu_count or 0),
            "provider": clip("provider", inst.provider), "price_source": clip("price_source", inst.price_source),
            "name": clip("name", inst.tags.get("Name")), "policy": policy_json(inst),
            # None (not "") when the listing saw no GPU of it (a workload scaled to zero): the stored one is kept.
            "allocation": clip("allocation", inst.gpu_allocation) or None,
            "cloud_id": clip("cloud_id", inst.cloud_id) or None, "first_seen": seen, "last_seen": seen}


POLICY_TAGS_MAX = 64  # EC2 allows 50 tags; a Kubernetes workload's labels and annotations are kept to this many
POLICY_TAG_CHARS = 256  # EC2's longest tag value


def policy_json(inst: GpuInstance) -> str:
    """What the act stage's policy reads of an instance, as JSON: its tags (gpufinops:* tags first, each value
    clipped to 256 characters, at most 64), lifecycle, spot request type and who manages it."""
    keys = sorted(inst.tags, key=lambda k: (not str(k).startswith("gpufinops:"), str(k)))[:POLICY_TAGS_MAX]
    return json.dumps({"tags": {str(k)[:128]: str(inst.tags[k])[:POLICY_TAG_CHARS] for k in keys},
                       "lifecycle": inst.lifecycle, "spot_request_type": inst.spot_request_type,
                       "managed_by": inst.managed_by, "managed_advice": inst.managed_advice}, sort_keys=True)


def instance_from_label(label: dict) -> GpuInstance | None:
    """The instance as the service last saw it, rebuilt from its instance_labels row for the policy functions
    (act.plan, rule selectors); None when the row has no recorded policy (written before the column existed)."""
    raw = label.get("policy")
    if not raw:
        return None
    try:
        pol = json.loads(raw)
    except ValueError:
        return None
    seen = label.get("last_seen")
    return GpuInstance(
        instance_id=label["instance_id"], instance_type=label.get("instance_type") or "",
        region=label.get("region") or "", state="running", launch_time=seen, account=label.get("account") or "",
        lifecycle=pol.get("lifecycle") or "on-demand", tags=dict(pol.get("tags") or {}),
        gpu_count=int(label.get("gpu_count") or 0), gpu_model=label.get("gpu_model") or "",
        provider=label.get("provider") or "aws", managed_by=pol.get("managed_by") or "",
        managed_advice=pol.get("managed_advice") or "", spot_request_type=pol.get("spot_request_type") or "")


@functools.lru_cache(maxsize=None)
def upsert_statement(dialect: str, table: Table, updated: tuple[str, ...]):
    """INSERT INTO table ... ON CONFLICT (its primary key) DO UPDATE SET the `updated` columns, on "sqlite" or
    "postgresql"; built once per table (a statement built per tick costs more CPU than the write of a small
    fleet)."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    else:
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    stmt = dialect_insert(table)
    return stmt.on_conflict_do_update(index_elements=list(table.primary_key.columns),
                                      set_={f: _kept_when_null(table, f, stmt.excluded[f]) for f in updated})


def _kept_when_null(table: Table, column: str, new):
    """The new value of `column`, or for LABEL_KEPT_WHEN_NULL the stored one when the new one is NULL."""
    return func.coalesce(new, table.c[column]) if table is instance_labels and column in LABEL_KEPT_WHEN_NULL else new


def upsert_labels(conn: Connection, rows: Sequence[dict]) -> None:
    """Insert new instances, update the labels and last_seen of known ones, first_seen kept: one INSERT ... ON
    CONFLICT statement on SQLite and PostgreSQL; elsewhere one read of the known ids, then batched updates and
    inserts."""
    if conn.dialect.name in ("sqlite", "postgresql"):
        conn.execute(upsert_statement(conn.dialect.name, instance_labels, LABEL_UPDATED), list(rows))
        return
    ids = sorted(r["instance_id"] for r in rows)
    known: set[str] = set()
    for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
        known.update(conn.execute(select(instance_labels.c.instance_id)
                                  .where(instance_labels.c.instance_id.in_(chunk))).scalars())
    updates = [{"label_id": r["instance_id"], **{f"v_{f}": r[f] for f in LABEL_UPDATED}}
               for r in rows if r["instance_id"] in known]
    if updates:
        conn.execute(update(instance_labels).where(instance_labels.c.instance_id == bindparam("label_id"))
                     .values(**{f: _kept_when_null(instance_labels, f, bindparam(f"v_{f}")) for f in LABEL_UPDATED}),
                     updates)
    inserts = [r for r in rows if r["instance_id"] not in known]
    if inserts:
        conn.execute(insert(instance_labels), inserts)


def prune_raw_decisions(conn: Connection, now: datetime, keep_s: float) -> int:
    """Delete raw decision rows older than keep_s before `now`, at most once an hour (noted in kv). Their
    time is already in the episodes and rollups, written in the transaction that stored them."""
    from .migrations import BACKFILL_KEY

    if conn.execute(select(kv.c.value).where(kv.c.key == BACKFILL_KEY)).scalar() is not None:
        return 0  # stored rows not yet folded into rollups: keep them all
    last = conn.execute(select(kv.c.value).where(kv.c.key == PRUNED_AT_KEY)).scalar()
    if last is not None and (now - datetime.fromisoformat(last)).total_seconds() < PRUNE_EVERY_S:
        return 0
    res = conn.execute(delete(decisions).where(decisions.c.evaluated_at < now - timedelta(seconds=keep_s)))
    conn.execute(delete(kv).where(kv.c.key == PRUNED_AT_KEY))
    conn.execute(insert(kv).values(key=PRUNED_AT_KEY, value=now.isoformat()))
    return int(res.rowcount or 0)


# When the latest tick that recorded Kubernetes node hours read the cluster (ISO, naive UTC): the next one covers
# the time since (covered_seconds).
NODE_HOURS_TICK_KEY = "k8s:node-hours:last-tick"


def covered_seconds(last: datetime | None, now: datetime, interval_s: float, max_gap_s: float) -> float:
    """The time a tick that read the cluster stands for: since the previous such tick, at most max_gap_s (the cap
    the verdict rollups put on a tick: a longer gap is time nobody watched); the very first tick, one interval_s.
    0 for a tick not after the previous one (the same tick recorded again, or an older one replayed)."""
    if last is None:
        return float(min(interval_s, max_gap_s))
    return max(0.0, min((now - last).total_seconds(), max_gap_s))


@functools.lru_cache(maxsize=None)
def node_hours_upsert(dialect: str):
    """INSERT INTO k8s_node_hours ... ON CONFLICT (hour, node) DO UPDATE: the sums added to, the latest fields
    replaced; built once per dialect ("sqlite" or "postgresql")."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    else:
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    stmt = dialect_insert(k8s_node_hours)
    return stmt.on_conflict_do_update(
        index_elements=list(k8s_node_hours.primary_key.columns),
        set_={**{f: k8s_node_hours.c[f] + stmt.excluded[f] for f in NODE_HOUR_SUMS},
              **{f: stmt.excluded[f] for f in NODE_HOUR_LATEST}})


def upsert_node_hours(conn: Connection, rows: Sequence[dict]) -> None:
    """Add a tick's node-hour rows to the stored ones: one INSERT ... ON CONFLICT statement (executemany) on SQLite
    and PostgreSQL; elsewhere one read of the rows of the hours touched, then batched updates and inserts. `rows`
    hold each (hour, node) once (one tick)."""
    if not rows:
        return
    if conn.dialect.name in ("sqlite", "postgresql"):
        conn.execute(node_hours_upsert(conn.dialect.name), list(rows))
        return
    h = k8s_node_hours.c
    stored = {(r["hour"], r["node"]): r for r in conn.execute(
        select(k8s_node_hours).where(h.hour.in_(sorted({r["hour"] for r in rows})))).mappings()}
    updates, inserts = [], []
    for r in rows:
        have = stored.get((r["hour"], r["node"]))
        if have is None:
            inserts.append(r)
        else:
            updates.append({"k_hour": r["hour"], "k_node": r["node"],
                            **{f"v_{f}": have[f] + r[f] for f in NODE_HOUR_SUMS},
                            **{f"v_{f}": r[f] for f in NODE_HOUR_LATEST}})
    if updates:
        conn.execute(update(k8s_node_hours).where(h.hour == bindparam("k_hour"), h.node == bindparam("k_node"))
                     .values(**{f: bindparam(f"v_{f}") for f in (*NODE_HOUR_SUMS, *NODE_HOUR_LATEST)}), updates)
    if inserts:
        conn.execute(insert(k8s_node_hours), inserts)
