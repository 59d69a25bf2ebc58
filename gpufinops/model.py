"""Core types shared by every stage. No I/O here.

Data flows one way: collect -> evaluate -> act -> notify/store -> report.
Every stage talks in these types, so the live service, the demo and the
backtest can swap the peers (real EC2/Prometheus vs simulated) without
touching the decision code.

Every name callers use is here. Some are defined in leaves that import nothing of gpufinops and handed on
under the same names, so that a caller needing only them loads none of the records below: break_even (the
break-even figures the settings read), rule_types (what a rule says: Action, ActionKind, Aggregation,
NoCounterPolicy, Selector, Rule), subject_ids (Azure's and GCE's subject ids) and words (format_duration). Only
the start of `rules check` (rules.py, places.registry, cli.core) and the settings import a leaf directly.
"""

from __future__ import annotations

import enum
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, Mapping, Protocol, Sequence

from . import break_even as _break_even
from . import rule_types as _rule_types
from . import subject_ids as _subject_ids
from . import words as _words

# Tag names the service reads and writes on instances.
TAG_PROTECT = "gpufinops:protect"
TAG_MARKED = "gpufinops:marked-for-stop"
TAG_SNOOZE = "gpufinops:snooze-until"
TAG_STOPPED_BY = "gpufinops:stopped-by"
TAG_STOPPED_REASON = "gpufinops:stopped-reason"
TAG_STOP_REQUESTED = "gpufinops:stop-requested"
# An Azure VM powered off but still allocated ("Stopped (allocated)"): its compute is billed until it is deallocated.
# Judged (decide.evaluate) as idle and billed, never as stopped; its stop is a deallocate (places.azure).
STATE_STOPPED_ALLOCATED = "stopped-allocated"

# The subject ids a listing and a bill share (Azure's, GCE's) live in subject_ids, a leaf places.registry reads.
AZURE_ID_PREFIX = _subject_ids.AZURE_ID_PREFIX
azure_vm_id = _subject_ids.azure_vm_id
azure_scale_set_vm_id = _subject_ids.azure_scale_set_vm_id
is_azure_scale_set_vm_id = _subject_ids.is_azure_scale_set_vm_id
is_azure_vm_id = _subject_ids.is_azure_vm_id
GCE_ID_PREFIX = _subject_ids.GCE_ID_PREFIX
GCE_UNLISTED_PREFIX = _subject_ids.GCE_UNLISTED_PREFIX
GCE_NAME = _subject_ids.GCE_NAME
gce_vm_id = _subject_ids.gce_vm_id
resolve_gce_ids = _subject_ids.resolve_gce_ids


# DCGM reports huge sentinel values (~9.2e18 and friends) when a field is not
# available; anything at or above this, or negative, is not a measurement.
SENTINEL_THRESHOLD = 1e9
# More compute processes than this on one GPU (or MIG instance) in a count read is not a measurement.
MAX_PROCESSES_PER_GPU = 10_000

# When a stop pays (break_even, a leaf the settings read without these types): a stop undone within
# FALSE_STOP_WITHIN_S is a false stop, which costs FALSE_STOP_COST_H GPU-hours on top of a restart's RESTART_COST_S.
FALSE_STOP_WITHIN_S = _break_even.FALSE_STOP_WITHIN_S
FALSE_STOP_COST_H = _break_even.FALSE_STOP_COST_H
RESTART_COST_S = _break_even.RESTART_COST_S


class Verdict(str, enum.Enum):
    ACTIVE = "ACTIVE"
    IDLE = "IDLE"
    UNDERUTILIZED = "UNDERUTILIZED"
    UNKNOWN = "UNKNOWN"

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value


# What a rule asks for, and the rest of what a rule says, live in rule_types (a leaf the start of `rules check` reads).
Action = _rule_types.Action


class ReasonCode(str, enum.Enum):
    """Machine-readable reason next to the human sentence in every Decision."""

    IDLE_STAYS_BELOW = "idle_stays_below"
    IDLE_MEAN_BELOW = "idle_mean_below"
    MEMORY_HELD_IDLE = "memory_held_idle"
    BURSTY_LOW = "bursty_low"  # low mean but real bursts: input/host/latency bound
    LOW_STEADY = "low_steady"  # low but not idle under the rule (e.g. mean rule met, not stays-below)
    BUSY = "busy"
    SOME_GPUS_BUSY = "some_gpus_busy"
    NO_SERIES = "no_series"
    QUERY_ERROR = "query_error"
    LOW_COVERAGE = "low_coverage"
    INVALID_DATA = "invalid_data"  # a value read from the metrics source is out of range (sentinel, > 100%, ...)
    TOO_YOUNG = "too_young"
    NOT_RUNNING = "not_running"
    # An Azure VM powered off but still allocated: no GPU work, compute billed until it is deallocated (IDLE).
    BILLED_WHILE_STOPPED = "billed_while_stopped"
    # GPUs without an activity counter (MIG instances read by `gpufinops agent`): judged by their processes and memory.
    EVIDENCE_OF_WORK = "evidence_of_work"  # ACTIVE: processes ran or memory was held where no counter says more
    NO_ACTIVITY_COUNTER = "no_activity_counter"  # UNKNOWN: no counter, no evidence, and the rule does not opt in
    IDLE_NO_PROCESSES = "idle_no_processes"  # IDLE by the rule's idle_without_activity_counter option
    # DCGM profiling counters (docs/metrics.md, "Profiling counters").
    POWER_WITHOUT_ACTIVITY = "power_without_activity"  # UNKNOWN: activity ~0 but power far above idle draw
    COUNTERS_DISAGREE = "counters_disagree"  # UNKNOWN: one activity counter says idle, another says work
    FEW_SMS_BUSY = "few_sms_busy"  # UNDERUTILIZED: kernels run most of the time on few SMs (small batches/kernels)
    TENSOR_IDLE = "tensor_idle"  # UNDERUTILIZED: SMs busy, tensor pipes idle on a tensor-core GPU (FP32 math)
    # Kubernetes GPU nodes (decide.workloads.empty_gpu_nodes): no GPU pod on the node for the whole window (IDLE),
    # GPU pods on it now (ACTIVE), watched free for less than the window (UNKNOWN, not missing data).
    NODE_WITHOUT_GPU_PODS = "node_without_gpu_pods"
    NODE_HAS_GPU_PODS = "node_has_gpu_pods"
    NODE_NOT_WATCHED_LONG_ENOUGH = "node_not_watched_long_enough"
    # Retired with the learned idle policy; decisions stored by earlier versions still carry them.
    LEARNED_WAIT = "learned_wait"
    LEARNED_IDLE = "learned_idle"

    @property
    def is_missing_data(self) -> bool:
        # A power draw the activity counters cannot explain is data that cannot be trusted: alerted once per
        # episode with the outages (pipeline.alert_missing_data), never a stop.
        return self in (ReasonCode.NO_SERIES, ReasonCode.QUERY_ERROR, ReasonCode.LOW_COVERAGE,
                        ReasonCode.INVALID_DATA, ReasonCode.POWER_WITHOUT_ACTIVITY)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# --------------------------------------------------------------------------- inventory


@dataclass(frozen=True)
class GpuInstance:
    instance_id: str
    instance_type: str
    region: str
    state: str  # EC2 state name: pending|running|stopping|stopped|...
    launch_time: datetime
    account: str = ""
    lifecycle: str = "on-demand"  # on-demand | spot
    tags: Mapping[str, str] = field(default_factory=dict)
    private_dns: str = ""
    private_ip: str = ""
    gpu_count: int = 0
    gpu_model: str = ""
    gpu_memory_gib: float = 0.0  # per GPU
    hourly_cost: float | None = None  # USD/h for the whole instance, None = unknown
    provider: str = "aws"
    # Who else manages this instance (an Auto Scaling group, an EKS node group, Karpenter, Batch...),
    # in words, e.g. "Auto Scaling group 'ml-asg'"; "" when nothing does. Such instances are judged,
    # never stopped: stopping an ASG member makes the group replace it, a node takes its pods with it.
    managed_by: str = ""
    # What to do instead of stopping it, for the reason and the report ("scale the group down").
    managed_advice: str = ""
    # For spot instances: "one-time" (cannot be stopped, only terminated) or "persistent"; "" otherwise/unknown.
    spot_request_type: str = ""
    # Where hourly_cost comes from: "" = the bill or a price list (EC2 prices, the catalog's price of this type);
    # "estimate: ..." = a guess (a rented host priced from the catalog's GPU model, gpufinops.host_prices), shown
    # as "(estimate)" wherever the price is; other words name a price a person configured.
    price_source: str = ""
    # Why this listing could not read all of gpufinops' own tags of the instance ("" when it did): a Kueue job's
    # mark lives on its Kueue Workload, whose list can fail while the job is listed. The act stage then keeps an
    # earlier mark as it is, never taking a tag it did not read for one a person removed.
    tags_unread: str = ""
    # A Kubernetes workload's: how its GPUs were allocated, "device-plugin", "dra" (ResourceClaims) or both
    # comma-joined (k8s.model.PodInfo.allocation); "" for every other place.
    gpu_allocation: str = ""
    # The provider's own id of the instance where the subject id does not carry it: a GCE VM's numeric id, by which
    # Google's bill names it (gce_vm_id); "" for every other place.
    cloud_id: str = ""
    # The resource's optimistic-concurrency token as this read saw it (a GCE VM's labelFingerprint): a label write
    # conditioned on it is refused once anyone changed its labels after the read; "" where the place has none.
    version: str = ""

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    @property
    def is_running(self) -> bool:
        return self.state == "running"

    @property
    def is_judged(self) -> bool:
        """Running, or stopped but still billed (an Azure VM "Stopped (allocated)"): what a tick judges."""
        return self.state in ("running", STATE_STOPPED_ALLOCATED)

    @property
    def is_protected(self) -> bool:
        # Any value except "false" protects: to be on the safe side (kube-downscaler).
        value = self.tags.get(TAG_PROTECT)
        return value is not None and value.strip().lower() != "false"

    @property
    def snooze_tag_is_a_persons(self) -> bool:
        """An EC2 instance that already carries `gpufinops:snooze-until` (any value, even expired or unreadable):
        the shipped IAM policy lets gpufinops create that tag only where there is none (`SnoozeOnlyWhereNoneIsSet`,
        `NeverRewriteASnooze`) and never delete it, so that the service can never end or shorten a snooze: the
        value on the instance is a person's to change. A later Snooze click is held from gpufinops's own record
        instead of rewriting the tag (docs/deploy.md, "A second Snooze click"). Kubernetes annotations have no
        such fence. An Azure VM keeps the same rule (no Azure role can fence a tag's value: the code keeps it), so the
        two clouds mean the same by a snooze tag."""
        return self.provider in ("aws", "azure") and TAG_SNOOZE in self.tags

    def owner(self) -> str:
        """The owner tag only: a team is not an owner (messages say "no owner tag" rather than guess)."""
        for key in ("owner", "Owner", "created-by"):
            if self.tags.get(key):
                return self.tags[key]
        return ""

    def team(self) -> str:
        return self.tags.get("team") or self.tags.get("Team") or ""


# --------------------------------------------------------------------------- usage


@dataclass(frozen=True)
class GpuWindowStats:
    """Server-side aggregates of one GPU over one window.

    Activity is a percentage 0-100: DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio 0-1,
    scaled to %) where the GPU has it (all a MIG slice has), else
    DCGM_FI_DEV_GPU_UTIL. None means "not measured", never zero.
    `invalid` (gpufinops.metric_ranges) says in words which figure read was
    out of range; such stats carry no figures and their instance is UNKNOWN.
    """

    gpu: str  # gpu index label, or MIG "gpu/GPU_I_ID"
    samples: int  # valid activity samples in the window
    activity_max: float | None = None
    activity_mean: float | None = None
    activity_min: float | None = None
    activity_signal: str = "DCGM_FI_DEV_GPU_UTIL"
    fb_used_max_mib: float | None = None
    power_mean_w: float | None = None
    uuid: str = ""
    model_name: str = ""
    invalid: str = ""  # "" = every figure is plausible; else why not (never the number read)
    # Some raw activity samples of the window were out of range (DCGM sentinels, negatives) and left out:
    # the figures come from the valid ones, enough to see work, never enough to call the GPU idle.
    dropped_invalid: bool = False
    # Compute processes on this GPU / MIG instance (gpufinops agent's gpufinops_gpu_processes), where exported:
    # evidence of work when no activity figure exists; None = not exported or not read.
    processes_max: int | None = None
    process_samples: int = 0  # valid process-count samples in the window, for coverage
    mig_profile: str = ""  # dcgm-exporter's GPU_I_PROFILE (e.g. "3g.40gb") for a MIG instance, for reasons
    # The GPU's other activity counter where it has both (DCGM_FI_DEV_GPU_UTIL beside the preferred GR engine
    # activity), in percent: IDLE needs it to agree. "" / None: the GPU has one counter only.
    second_activity_signal: str = ""
    second_activity_max: float | None = None
    second_activity_mean: float | None = None
    # DCGM profiling ratios 0..1, window means (docs/metrics.md, "Profiling counters"); None = not exported.
    sm_active: float | None = None  # DCGM_FI_PROF_SM_ACTIVE: cycles an SM has a warp, over all SMs
    sm_occupancy: float | None = None  # DCGM_FI_PROF_SM_OCCUPANCY: resident warps / the most an SM holds
    tensor_active: float | None = None  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    dram_active: float | None = None  # DCGM_FI_PROF_DRAM_ACTIVE
    # Per-precision pipes where exported, e.g. (("fp32", 0.41), ("fp16", 0.0)): DCGM_FI_PROF_PIPE_<P>_ACTIVE.
    pipes: tuple[tuple[str, float], ...] = ()
    # Seconds between the end of this window and that of the read the occupancy, tensor and FP-pipe figures come
    # from: they only say why use is low, so each GPU's are read again every prometheus.profiling_reasons_every_s
    # (a fifth of the instances per tick) and kept between. 0 = read with this window (SM activity and every
    # verdict figure always are).
    profiling_age_s: float = 0.0
    tdp_w: float | None = None  # the GPU model's TDP (bundled catalog), for the power witness; None = unknown

    def pipe(self, precision: str) -> float | None:
        """The window mean of one per-precision pipe ("fp32", "fp16", "fp64"), None when not exported."""
        return dict(self.pipes).get(precision)


@dataclass(frozen=True)
class InstanceUsage:
    """Everything the collector knows about one instance over one window."""

    instance_id: str
    window_s: int
    expected_samples: int  # window / scrape interval: the denominator for coverage
    gpus: tuple[GpuWindowStats, ...] = ()
    error: str | None = None  # query failed (Prometheus down, timeout, bad answer)


# --------------------------------------------------------------------------- rules


Selector = _rule_types.Selector
NoCounterPolicy = _rule_types.NoCounterPolicy
IDLE_MEMORY_FLOOR_MIB = _rule_types.IDLE_MEMORY_FLOOR_MIB
Aggregation = _rule_types.Aggregation
Rule = _rule_types.Rule


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Decision:
    instance_id: str
    rule_name: str
    verdict: Verdict
    code: ReasonCode
    reason: str
    evaluated_at: datetime
    action: Action = Action.NOTIFY
    window_s: int = 0
    activity_mean: float | None = None
    activity_max: float | None = None
    memory_max_mib: float | None = None
    coverage: float | None = None
    hourly_cost: float | None = None
    activity_signal: str = ""  # the counter the verdict's activity figures come from ("" = none was used)

    def to_dict(self) -> dict:
        return {
            "instance_id": self.instance_id,
            "rule": self.rule_name,
            "verdict": self.verdict.value,
            "code": self.code.value,
            "reason": self.reason,
            "evaluated_at": self.evaluated_at.isoformat(),
            "action": self.action.value,
            "window_s": self.window_s,
            "activity_mean": self.activity_mean,
            "activity_max": self.activity_max,
            "memory_max_mib": self.memory_max_mib,
            "coverage": self.coverage,
            "hourly_cost": self.hourly_cost,
            "activity_signal": self.activity_signal,
        }


ActionKind = _rule_types.ActionKind  # what the act stage records of an action (rule_types)


@dataclass(frozen=True)
class ActionResult:
    instance_id: str
    kind: ActionKind
    dry_run: bool
    ok: bool
    reason: str
    rule_name: str = ""
    at: datetime | None = None
    error: str | None = None


# --------------------------------------------------------------------------- run context


class LeaseCheck(Protocol):
    """The scheduler lease this process holds (gpufinops.lease). `check()` raises LeaseLost when this
    process is no longer the leader (lease expired or taken over, fencing token superseded); the act
    chokepoint calls it before every cloud change."""

    def check(self) -> None: ...


@dataclass(frozen=True)
class RunContext:
    """One evaluation run: the clock, its id and whether it may change anything."""

    now: datetime
    dry_run: bool = True
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # None: no lease is checked (one-shot CLI commands, the demo, tests); the service always sets it.
    lease: LeaseCheck | None = None


Clock = Callable[[], datetime]


# --------------------------------------------------------------------------- peer interfaces


class Cloud(Protocol):
    """Inventory and the few mutating calls the act stage needs.

    Implemented by places.ec2.cloud.Ec2Cloud (real boto3) and sim.SimCloud
    (demo/backtest). Only act.py may call the mutating methods.
    """

    def list_gpu_instances(self) -> list[GpuInstance]: ...

    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None: ...

    def remove_tags(self, inst: GpuInstance, keys: Sequence[str]) -> None: ...

    def stop(self, inst: GpuInstance) -> None: ...

    def terminate(self, inst: GpuInstance) -> None: ...

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]: ...


class MetricsSource(Protocol):
    """Per-instance GPU usage over a window, in a fixed number of queries."""

    def window_usage(
        self, instances: Sequence[GpuInstance], window_s: int, now: datetime
    ) -> dict[str, InstanceUsage]: ...


@dataclass(frozen=True)
class Notice:
    """What gpufinops tells whom, not how: built by the decide/act/cost stages, rendered and sent by a delivery
    (notify/: chat, email, the outbox), routed by notify/routing.py from its audience.

    Text parts (`text`, `lead`, fact values, `lines`, `notes`) are a small markup every delivery renders:
    user-controlled values are entity-escaped (`&amp;`, `&lt;`, `&gt;`, so no value can carry markup of its
    own), `*bold*`, `` `code` `` and `<t:EPOCH>` (a time: chat shows it in the reader's zone, email in UTC).
    `text` is the whole message in one paragraph (notifications, the outbox, the email text part)."""

    key: str  # the idempotency key: one event, delivered once per destination however many runs see it
    # The chat channel (or person) a chat delivery sends it to: notify/routing.py fills it from `to` and
    # `audience`; a caller that sends through a bare chat delivery (the agent) names it.
    channel: str = ""
    # Destinations the configuration names for this subject (a rule's notify_to, a budget's or the report's
    # channel), each `transport:target` or an audience (config.destination); () = routed by `audience`
    # (notify/routing.py).
    to: tuple[str, ...] = ()
    text: str = ""
    kind: str = ""  # warning, stopped, cancelled, idle, metrics_unavailable, summary, snooze, budget, digest
    subject: str = ""  # the instance or workload id, budget or period it is about
    audience: tuple[str, ...] = ()  # of AUDIENCES
    owner: str = ""  # the subject's owner tag (a chat user id or an email address reach the owner)
    team: str = ""
    title: str = ""
    lead: str = ""
    facts: tuple[tuple[str, str], ...] = ()
    lines: tuple[str, ...] = ()  # a list (instances of an outage)
    notes: tuple[str, ...] = ()  # small print after the facts
    actions: tuple[str, ...] = ()  # ids of notify.messages.SNOOZE_ACTIONS offered on the subject
    dry_run: bool = False
    # The key of the notice this one follows up (a cancellation or a stop under its warning): a chat reply
    # in that thread when the chat holds the parent, an email In-Reply-To its Message-ID.
    thread_key: str = ""
    # The chat's blocks: filled by the chat delivery when it renders the notice (what is stored and sent); a builder
    # leaves it empty and gives title, lead, facts and lines instead.
    blocks: tuple[dict, ...] = ()


# Who a notice is for; notify/routing.py turns each into destinations.
AUDIENCES = ("owner", "team", "default", "finance", "person")

# The name the builders used before Notice; the same type.
Message = Notice


class Notifier(Protocol):
    """What every stage sends through (notify/routing.Deliveries in the service). What a chat transport does beyond
    this (an in-place edit, a user lookup) is notify/chat.ChatDelivery's, inside notify/."""

    def send(self, msg: Notice) -> bool:
        """True when the notice is delivered (now or earlier); False when it is not (yet)."""
        ...

    def retry_due(self, now: datetime) -> int:
        """Send again the failed notices whose backoff is over; how many were delivered."""
        ...


# The one spelling of a duration for people lives in words (the CLI prints it without loading this module).
format_duration = _words.format_duration


def format_money(amount: float | None, *, digits: int = 2, per: str = "", currency: str = "USD",
                 estimate: bool = False, unknown: str | None = None) -> str:
    """The one spelling of an amount of money for people (messages, reports, the CLI): '$1,234.50', '-$6.17' (the
    sign before the $, never '-$0.00'), '$1,234' with digits=0, '1,234.00 EUR' in another currency, a rate with
    per="h": '$32.77/h', and '$31.92/h (estimate)' for a guessed price (a rented host priced from the catalog).
    None and NaN stay unknown, never $0: 'unknown $/h' for a rate, else 'unknown', or what `unknown` says ('–' in
    a report's table)."""
    amount = None if amount is None else float(amount)  # numpy figures too
    if amount is None or math.isnan(amount):
        return unknown if unknown is not None else f"unknown $/{per}" if per else "unknown"
    if currency != "USD":
        text = f"{amount:,.{digits}f} {currency}"
    else:
        sign = "-" if round(amount, digits) < 0 else ""  # -$6.17, not $-6.17
        text = f"{sign}${abs(amount):,.{digits}f}"
    return (f"{text}/{per}" if per else text) + (" (estimate)" if estimate else "")


def hours(delta: timedelta) -> float:
    return delta.total_seconds() / 3600.0


UNTAGGED = "(untagged)"
