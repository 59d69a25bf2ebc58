"""Every table of the database, in one MetaData: the tick's decisions, verdict episodes and rollups, instance
labels and state, marks, actions (the append-only audit log), notifications, kv, leases, the billing costs and
the recommendations; and the row types the store hands out. Nothing registers a table by being imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import Boolean, Column, DateTime, Float, Index, Integer, MetaData, String, Table, Text, text

from ..model import ActionKind, Verdict
from datetime import date

from sqlalchemy import Date


metadata = MetaData()


# SQLite drops tzinfo: we store naive UTC and hand back aware datetimes.
def aware_utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def naive_utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return dt


decisions = Table(
    "decisions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False, index=True),
    Column("instance_id", String(64), nullable=False, index=True),
    Column("rule", String(128), nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("code", String(32), nullable=False),
    Column("reason", Text, nullable=False),
    Column("evaluated_at", DateTime, nullable=False, index=True),
    Column("window_s", Integer),
    Column("activity_mean", Float),
    Column("activity_max", Float),
    Column("memory_max_mib", Float),
    Column("coverage", Float),
    Column("hourly_cost", Float),
    Column("team", String(128)),
    Column("instance_type", String(64)),
    Column("dry_run", Boolean, nullable=False),
)


# Verdicts as run-length episodes and hourly rollups (gpufinops/episodes.py folds each tick into them). The
# raw `decisions` rows are stored only when a verdict or code changes and as an hourly heartbeat
# (StoreSettings.raw_decisions_every_s) and kept only for a recent window (raw_decisions_days); reports, idle
# costs, budgets and the audit read these.
verdict_episodes = Table(
    "verdict_episodes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("instance_id", String(64), nullable=False),
    Column("rule", String(128), nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("code", String(32), nullable=False),
    Column("started_at", DateTime, nullable=False),
    Column("last_seen_at", DateTime, nullable=False, index=True),
    Column("ticks", Integer, nullable=False),
    Column("reason", Text, nullable=False),  # the latest tick's reason text
    Column("stats", Text),  # JSON: the latest tick's window stats (window_s, activity, memory, coverage)
    Column("hourly_cost", Float),
    Column("team", String(128)),
    Column("instance_type", String(64)),
    Column("dry_run", Boolean, nullable=False),
    Index("ix_verdict_episodes_head", "instance_id", "rule", "id"),
)


# Per hour and instance, rules resolved per tick (least idle wins): hours in each verdict, by reason code,
# price, team and type. `measured` = the ticks had an activity figure (activity_hours / hours is their mean).
verdict_hours = Table(
    "verdict_hours",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("hour", DateTime, nullable=False),
    Column("instance_id", String(64), nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("code", String(32), nullable=False),
    Column("measured", Boolean, nullable=False),
    Column("hourly_cost", Float),
    Column("team", String(128)),
    Column("instance_type", String(64)),
    Column("hours", Float, nullable=False),
    Column("ticks", Integer, nullable=False),
    Column("evaluations", Integer, nullable=False),
    Column("activity_hours", Float, nullable=False),
    Column("activity_max", Float),
    Column("memory_max_mib", Float),
    Column("after_stop_hours", Float, nullable=False),  # of `hours`, after a completed stop (report: not running)
    Index("ix_verdict_hours_hour_instance", "hour", "instance_id"),
)


# The latest resolved tick of each instance: its time is counted by readers up to their end (max_gap_s).
verdict_tails = Table(
    "verdict_tails",
    metadata,
    Column("instance_id", String(64), primary_key=True),
    Column("at", DateTime, nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("code", String(32), nullable=False),
    Column("hourly_cost", Float),
    Column("team", String(128)),
    Column("instance_type", String(64)),
    Column("activity_mean", Float),
    Column("activity_max", Float),
    Column("memory_max_mib", Float),
    Column("evaluations", Integer, nullable=False),
)


# Stretches in which the service evaluated anything at most max_gap_s apart (coverage, blind spots).
service_runs = Table(
    "service_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("started_at", DateTime, nullable=False),
    Column("last_seen_at", DateTime, nullable=False, index=True),
    Column("ticks", Integer, nullable=False),
)


# Per hour and Kubernetes GPU node, what the ticks that read the cluster saw of it (store.record_node_hours, fed
# by run/node_hours.py): its cost split as places.kubernetes.costs.attribute splits it, in whole cents, so that
# pods_cents + idle_cents == node_cents in every row (idle capacity: the GPUs no pod held). Each tick covers the
# time since the previous tick that read the cluster, at most max_gap_s (the verdict rollups' cap); `hours` is
# that time. The monthly report's node pool table is read from here (report.sections.node_pool_table).
k8s_node_hours = Table(
    "k8s_node_hours",
    metadata,
    Column("hour", DateTime, primary_key=True),
    Column("node", String(253), primary_key=True),  # a Kubernetes node name (a DNS subdomain: 253 at most)
    Column("instance_id", String(64), nullable=False),  # the machine's own id (spec.providerID), else the name
    Column("node_pool", String(128), nullable=False),  # places.kubernetes.costs.node_pool_of, at the latest tick
    Column("sharing", String(16), nullable=False),  # k8s.model.SHARING_MODES, at the latest tick
    # How the node hands out its GPUs at the latest tick: "device-plugin", "dra" or both comma-joined
    # (places.kubernetes.costs.node_allocation). Rows from before migration 0005 read "device-plugin": every GPU
    # gpufinops counted then was a device plugin's.
    Column("allocation", String(32), nullable=False, server_default="device-plugin"),
    Column("gpus", Integer, nullable=False),  # physical GPUs, at the latest tick
    Column("hours", Float, nullable=False),
    Column("gpu_hours", Float, nullable=False),
    Column("node_cents", Integer, nullable=False),
    Column("pods_cents", Integer, nullable=False),
    Column("idle_cents", Integer, nullable=False),
    # Of pods_cents, what the pods' DRA-allocated GPUs carried (the rest: device-plugin GPUs); 0 before 0005.
    Column("dra_cents", Integer, nullable=False, server_default="0"),
    Column("unpriced_hours", Float, nullable=False),  # of `hours`, with no known price (in no cents column)
    Column("ticks", Integer, nullable=False),
    Column("empty_ticks", Integer, nullable=False),  # ticks that saw no pod holding any of its GPUs
    Column("empty_hours", Float, nullable=False),  # the time those ticks covered
    Column("last_seen", DateTime, nullable=False),  # the latest tick that covered time of this hour
)


# Summed into by each tick (INSERT ... ON CONFLICT DO UPDATE SET column = column + excluded.column); the rest are
# the latest tick's.
NODE_HOUR_SUMS = ("hours", "gpu_hours", "node_cents", "pods_cents", "idle_cents", "dra_cents", "unpriced_hours",
                  "ticks", "empty_ticks", "empty_hours")
NODE_HOUR_LATEST = ("instance_id", "node_pool", "sharing", "allocation", "gpus", "last_seen")


ROLLUP_TABLES = ("verdict_episodes", "verdict_hours", "verdict_tails", "service_runs")


# What the service saw of each instance in its inventory, latest tick wins (Store.record_instances): the owner,
# account and region the report shows, which no decision, episode or rollup row carries. Tag values are
# untrusted text, clipped to the column sizes (LABEL_SIZES).
instance_labels = Table(
    "instance_labels",
    metadata,
    Column("instance_id", String(64), primary_key=True),
    Column("owner", String(128)),
    Column("team", String(128)),
    Column("account", String(64)),
    Column("region", String(64)),
    Column("instance_type", String(64)),
    Column("gpu_model", String(64)),
    Column("gpu_count", Integer),
    Column("provider", String(32)),
    # How hourly_cost was found when it is not a price list or the bill ("estimate: ..." for a rented host
    # priced from the catalog, "node remainder: ..." for a Kubernetes node beside its workloads); "" otherwise.
    Column("price_source", String(160)),
    # The `Name` tag (shown beside the id in the report) and, as JSON, what the act stage's policy reads of the
    # instance (its tags, lifecycle, spot request type, who manages it): the report's advice is made from it by
    # the same functions (act.plan) and rule selectors the act stage uses. Nullable: added in place to older
    # databases (store.migrate.add_missing_columns); rows from before stay NULL ("tags not recorded").
    Column("name", String(128)),
    Column("policy", Text),
    # A Kubernetes workload's: how its GPUs were allocated ("device-plugin", "dra", or both comma-joined), for the
    # report's workloads table; "" for an instance of another place. NULL in rows from before migration 0005
    # (read as "device-plugin" for a Kubernetes workload).
    Column("allocation", String(32)),
    # The provider's own id where the instance id does not carry it (GpuInstance.cloud_id: a GCE VM's numeric id, by
    # which Google's bill may name it), so that `costs --idle` turns a bill's `gce-unlisted:` id into the VM (0006).
    Column("cloud_id", String(64)),
    Column("first_seen", DateTime, nullable=False),
    Column("last_seen", DateTime, nullable=False, index=True),
)


LABEL_SIZES = {c.name: c.type.length for c in instance_labels.columns if isinstance(c.type, String)}


LABEL_UPDATED = ("owner", "team", "account", "region", "instance_type", "gpu_model", "gpu_count", "provider",
                 "price_source", "name", "policy", "allocation", "cloud_id", "last_seen")  # first_seen is kept
LABEL_KEPT_WHEN_NULL = ("allocation",)  # a tick that saw none keeps the stored value (a workload scaled to zero)


# Last verdict per (instance, rule): what makes "act only on transitions" possible.
instance_state = Table(
    "instance_state",
    metadata,
    Column("instance_id", String(64), primary_key=True),
    Column("rule", String(128), primary_key=True),
    Column("verdict", String(16), nullable=False),
    Column("since", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
    # Set when we stopped it (or, in dry-run, would have); cleared on the next verdict change.
    Column("stopped_at", DateTime),
    Column("stop_dry_run", Boolean),
)


marks = Table(
    "marks",
    metadata,
    Column("instance_id", String(64), primary_key=True),
    Column("rule", String(128), nullable=False),
    Column("marked_at", DateTime, nullable=False),
    Column("stop_at", DateTime, nullable=False),
    Column("reason", Text, nullable=False),
    Column("dry_run", Boolean, nullable=False),
    # When the warning was delivered; NULL while it is not (no stop before it is, and then not before
    # warned_at + the rule's lead: stop_at is moved accordingly).
    Column("warned_at", DateTime),
)


actions = Table(
    "actions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False),
    Column("instance_id", String(64), nullable=False, index=True),
    Column("kind", String(16), nullable=False),
    Column("rule", String(128)),
    Column("dry_run", Boolean, nullable=False),
    # pending = intent written before the cloud call; done / failed after (unconfirmed: fate unknown, read back
    # later; applied: done, bookkeeping open; abandoned: called off by the place, nothing more sent: act.CALLED_OFF).
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("error", Text),
    Column("at", DateTime, nullable=False, index=True),
    Column("finished_at", DateTime),
)


# The channel column of an email's notification row: "mailto:" and the addresses (notify/email.py writes it).
# Every other row is chat's (Slack or the outbox): what tells the two transports apart as sources in /readyz.
MAILTO = "mailto:"

notifications = Table(
    "notifications",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("channel", String(128), nullable=False),
    Column("text", Text, nullable=False),
    # pending (being sent, or fate unknown) | sent | outbox | failed (retried at next_attempt_at)
    # | abandoned (no longer to be sent: e.g. the warning of a stop that was cancelled before delivery)
    Column("status", String(16), nullable=False),
    Column("at", DateTime, nullable=False),
    Column("detail", Text),
    Column("attempts", Integer),
    Column("next_attempt_at", DateTime),
    Column("blocks", Text),  # the Block Kit JSON, so a failed message can be sent again as it was
)


# Statuses that mean a person can read the message.
DELIVERED_STATUSES = ("sent", "outbox")


# Small durable facts the service must remember across restarts
# (e.g. when the current "metrics unavailable" episode started).
kv = Table(
    "kv",
    metadata,
    Column("key", String(128), primary_key=True),
    Column("value", Text, nullable=False),
)


# The scheduler lease (gpufinops/lease.py): one row per lease name. Only the holder of the unexpired
# lease acts; `token` grows by one at every takeover, so a leader that lost it can prove it is stale.
leases = Table(
    "leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(255), nullable=False),
    Column("token", Integer, nullable=False),
    Column("acquired_at", DateTime, nullable=False),
    Column("renewed_at", DateTime, nullable=False),
    Column("expires_at", DateTime, nullable=False),
)


@dataclass(frozen=True)
class StateRow:
    instance_id: str
    rule: str
    verdict: Verdict
    since: datetime
    updated_at: datetime
    stopped_at: datetime | None
    stop_dry_run: bool | None = None  # whether that stop was a dry-run one


@dataclass(frozen=True)
class MarkRow:
    instance_id: str
    rule: str
    marked_at: datetime
    stop_at: datetime
    reason: str
    dry_run: bool
    warned_at: datetime | None = None


@dataclass(frozen=True)
class NotificationRow:
    key: str
    channel: str
    text: str
    status: str
    at: datetime  # when the status was last written; for sent/outbox rows, when it was delivered
    detail: str | None
    attempts: int
    next_attempt_at: datetime | None
    blocks: tuple[dict, ...]

    @property
    def delivered(self) -> bool:
        return self.status in DELIVERED_STATUSES


@dataclass(frozen=True)
class ActionRow:
    id: int
    run_id: str
    instance_id: str
    kind: ActionKind
    rule: str
    dry_run: bool
    status: str
    reason: str
    error: str | None
    at: datetime


costs = Table(
    "costs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("date", Date, nullable=False),
    Column("provider", String(32), nullable=False),
    Column("account", String(64), nullable=False),
    Column("region", String(64), nullable=False),
    Column("resource_id", String(255), nullable=False),
    Column("instance_type", String(64), nullable=False),
    Column("pricing_model", String(16), nullable=False),
    Column("team", String(128), nullable=False),
    Column("project", String(128), nullable=False),
    Column("owner", String(128), nullable=False),
    Column("tags", Text, nullable=False),
    Column("cost", Float, nullable=False),
    Column("currency", String(8), nullable=False),
    Column("usage_hours", Float, nullable=False),
    Column("source", String(16), nullable=False),
    Column("imported_at", DateTime, nullable=False),
    Index("ix_costs_source_date", "source", "date"),
)


recommendations = Table(
    "recommendations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False, index=True),
    Column("created_at", DateTime, nullable=False, index=True),
    Column("instance_id", String(64), nullable=False, index=True),
    Column("team", String(128)),
    Column("instance_type", String(64), nullable=False),
    Column("region", String(64)),
    Column("action", String(32), nullable=False),
    Column("current_monthly", Float),
    Column("recommended", Text, nullable=False),
    Column("recommended_monthly", Float),
    Column("monthly_savings", Float, nullable=False),
    Column("risk", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("prices_as_of", Date),
)
