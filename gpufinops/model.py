"""Core types shared by every stage. No I/O here.

Data flows one way: collect -> evaluate -> act -> notify/store -> report.
Every stage talks in these types, so the live service, the demo and the
backtest can swap the peers (real EC2/Prometheus vs simulated) without
touching the decision code.
"""

from __future__ import annotations

import enum
import math
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, Mapping, Protocol, Sequence

from . import break_even as _break_even

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

# An Azure VM's subject id: `azure:<subscription>/<resource group>/<name>`, in lower case: ARM compares resource ids
# without case and Cost Management's exports write them in lower case, so the listing (places.azure) and the bill
# (collect.billing) name one VM alike.
AZURE_ID_PREFIX = "azure:"
_ARM_VM_ID = re.compile(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/"
                        r"virtualMachines/([^/]+)$", re.IGNORECASE)


def azure_vm_id(resource_id: str) -> str:
    """The subject id of an Azure VM's ARM resource id; "" for any other id."""
    m = _ARM_VM_ID.match(str(resource_id or "").strip())
    return f"{AZURE_ID_PREFIX}{m.group(1)}/{m.group(2)}/{m.group(3)}".lower() if m else ""


# A Uniform scale set's instance (never listed as a VM): `azure:<subscription>/<group>/<scale set>/<instance id>`,
# from its ARM id `.../virtualMachineScaleSets/<scale set>/virtualMachines/<instance id>` (what Cost Management's
# exports write as its ResourceId): listing and bill name it alike, as a VM.
_ARM_SCALE_SET_VM_ID = re.compile(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/"
                                  r"virtualMachineScaleSets/([^/]+)/virtualMachines/([^/]+)$", re.IGNORECASE)


def azure_scale_set_vm_id(resource_id: str) -> str:
    """The subject id of a scale set instance's ARM resource id; "" for any other id."""
    m = _ARM_SCALE_SET_VM_ID.match(str(resource_id or "").strip())
    return f"{AZURE_ID_PREFIX}{'/'.join(m.groups())}".lower() if m else ""


def is_azure_scale_set_vm_id(subject_id: str) -> bool:
    """Whether a subject id names an instance of an Azure VM scale set (four parts after `azure:`)."""
    return subject_id.startswith(AZURE_ID_PREFIX) and subject_id.count("/") == 3


def is_azure_vm_id(subject_id: str) -> bool:
    """Whether a text is an Azure VM's subject id exactly as azure_vm_id writes it (a chat click's value is
    untrusted: three parts, lower case, at most ARM's lengths)."""
    parts = subject_id[len(AZURE_ID_PREFIX):].split("/") if subject_id.startswith(AZURE_ID_PREFIX) else []
    return len(parts) == 3 and len(subject_id) <= 200 and azure_vm_id(
        f"/subscriptions/{parts[0]}/resourceGroups/{parts[1]}/providers/Microsoft.Compute/virtualMachines/{parts[2]}"
    ) == subject_id

# A GCE VM's subject id: `gce:<project>/<zone>/<name>` (places.gcp lists VMs by name). Google's bill names a VM by its
# full resource name with the VM's numeric id, `//compute.googleapis.com/projects/<project>/zones/<zone>/instances/<id>`
# (the FOCUS ResourceId, the detailed export's resource.global_name), and by its name in a second column (ResourceName,
# resource.name). A VM the bill names only by its numeric id, that no listing has seen (deleted before gpufinops
# listed it, or in a project gpufinops does not list), is `gce-unlisted:<project>/<zone>/<id>`: still costed per
# project and zone, and saying that it is not a VM gpufinops knows by name.
GCE_ID_PREFIX = "gce:"
GCE_UNLISTED_PREFIX = "gce-unlisted:"
_GCE_VM_ID = re.compile(r"^//compute\.googleapis\.com/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$")
# GCE's instance names (RFC 1035: a lowercase letter first, at most 63 characters); a numeric id is never one.
GCE_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")


def gce_vm_id(global_name: str, name: str = "", project: str = "", zone: str = "") -> str:
    """The subject id of a GCE VM a bill names by its full resource name (`global_name`), "" for any other id: with
    the VM's `name` (a valid GCE name) `gce:<project>/<zone>/<name>`, else, the full name carrying only the numeric
    id, `gce-unlisted:<project>/<zone>/<id>` (resolve_gce_ids() turns it into the listed VM's id). `project` and
    `zone`, where the bill has them as columns (the detailed export's project.id, location.zone), win over the
    full name's (which may carry the project's number)."""
    m = _GCE_VM_ID.match(str(global_name or "").strip())
    if not m:
        return ""
    project, zone = project or m.group(1), zone or m.group(2)
    tail = m.group(3)
    vm = name if GCE_NAME.match(name or "") else tail if GCE_NAME.match(tail) else ""
    return f"{GCE_ID_PREFIX}{project}/{zone}/{vm}" if vm else f"{GCE_UNLISTED_PREFIX}{project}/{zone}/{tail}"


def resolve_gce_ids(subject_ids, known: Mapping[str, str]) -> list[str]:
    """Each subject id, a `gce-unlisted:<project>/<zone>/<id>` whose numeric id a listing knows (`known`: numeric
    id -> subject id, from GpuInstance.cloud_id) turned into that VM's `gce:` id; every other id unchanged."""
    out = []
    for sid in subject_ids:
        text = str(sid)
        if text.startswith(GCE_UNLISTED_PREFIX):
            text = known.get(text.rsplit("/", 1)[-1], text)
        out.append(text)
    return out


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


class Action(str, enum.Enum):
    """What a rule asks for when an instance is IDLE."""

    NOTIFY = "notify"
    STOP = "stop"
    TERMINATE = "terminate"
    # Kueue-managed Kubernetes workloads only: deactivate their Kueue Workload (spec.active: false), never kill
    # them (places.kubernetes.cloud, docs/kubernetes.md "Kueue: suspend, don't kill").
    SUSPEND = "suspend"
    # Kubernetes GPU nodes whose GPU work is gone only: cordon the node (spec.unschedulable) so that Karpenter or
    # cluster-autoscaler removes it; never evict, never delete (places.kubernetes.nodes, docs/kubernetes.md).
    DRAIN = "drain"
    # Slurm jobs only (places.slurm, docs/slurm.md): `scontrol requeue` (requeueable batch jobs), `scontrol
    # requeuehold` (hold: a plain `scontrol hold` does not stop a running job), `scancel`.
    REQUEUE = "requeue"
    HOLD = "hold"
    CANCEL = "cancel"
    # Azure VMs only, and only where a rule asks for it (places.azure, docs/deploy.md "Azure"): ARM's powerOff keeps
    # the VM's hardware allocated (a deallocated GPU VM may find no capacity when started again), and its compute
    # is billed until it is deallocated (words.POWER_OFF_BILLING says so wherever a power-off is announced).
    POWER_OFF = "power_off"


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


@dataclass(frozen=True)
class Selector:
    """Which instances a rule applies to. Empty fields match everything."""

    tags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # key -> allowed values; ("*",) = any value
    exclude_tags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    instance_families: tuple[str, ...] = ()
    instance_types: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()

    def matches(self, inst: GpuInstance) -> bool:
        if self.instance_families and inst.family not in self.instance_families:
            return False
        if self.instance_types and inst.instance_type not in self.instance_types:
            return False
        if self.accounts and inst.account not in self.accounts:
            return False
        if self.regions and inst.region not in self.regions:
            return False
        for key, allowed in self.tags.items():
            if key not in inst.tags:
                return False
            if "*" not in allowed and inst.tags[key] not in allowed:
                return False
        for key, banned in self.exclude_tags.items():
            if key in inst.tags and ("*" in banned or inst.tags[key] in banned):
                return False
        return True


class NoCounterPolicy(str, enum.Enum):
    """How a rule judges a GPU that has no activity counter (a MIG instance read by nvidia-smi/NVML)."""

    NEVER = "never"  # never idle: UNKNOWN unless processes or memory show work (the default)
    # Idle when, for the whole window (process-count coverage >= min_coverage), no process ran and memory
    # stayed at or under the rule's idle_memory_floor_mib.
    NO_PROCESSES_AND_IDLE_MEMORY = "no_processes_and_idle_memory"


# Memory an idle GPU holds, at most: idle MIG instances hold 9-26 MiB, idle whole GPUs 0-600 MiB (driver,
# persistence); anything a workload loads is GiBs. A rule's idle_memory_floor_mib defaults to this.
IDLE_MEMORY_FLOOR_MIB = 1024.0


class Aggregation(str, enum.Enum):
    STAYS_BELOW = "stays_below"  # every sample below threshold (max < threshold)
    MEAN = "mean"  # window mean below threshold


@dataclass(frozen=True)
class Rule:
    name: str
    threshold_pct: float  # activity threshold, percent
    window_s: int
    aggregation: Aggregation = Aggregation.STAYS_BELOW
    min_coverage: float = 0.8  # fraction of expected samples needed to judge
    warning_lead_s: int = 900  # time between the warning (mark) and the stop
    action: Action = Action.NOTIFY
    selector: Selector = field(default_factory=Selector)
    # Where its notices go: destinations, each `transport:target` or an audience (config.destination validated
    # them at load); () = by the notice's audience (notify/routing.py).
    notify_to: tuple[str, ...] = ()
    description: str = ""
    # Below this mean activity a non-idle instance is reported UNDERUTILIZED.
    underutilized_below_pct: float = 60.0
    # Optional: an instance holding more than this much memory on any GPU is
    # not idle under this rule (None = memory does not veto idleness).
    max_memory_mib: float | None = None
    # A GPU without an activity counter (MIG under gpufinops agent) is never idle unless the rule opts in here.
    idle_without_activity_counter: NoCounterPolicy = NoCounterPolicy.NEVER
    # Memory at or under this is an idle GPU's (no activity counter): above it counts as work.
    idle_memory_floor_mib: float = IDLE_MEMORY_FLOOR_MIB
    source: str = ""  # "file:line" the rule was loaded from, for error messages and audit


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


class ActionKind(str, enum.Enum):
    MARK = "mark"  # tag + warning
    STOP = "stop"
    TERMINATE = "terminate"
    UNMARK = "unmark"  # became active or snoozed: mark cancelled
    SKIP = "skip"  # wanted to act, did not (protected, cap, snooze, dry-run reason...)
    NOTIFY = "notify"  # rule action is notify only
    SNOOZE = "snooze"  # a person clicked Snooze / Keep running on a warning: the snooze tag, set for them
    RESTORE = "restore"  # a person brought back what gpufinops scaled to zero (gpufinops k8s restore)
    TAG = "tag"  # bookkeeping tags after a stop (mark removed, stopped-by): a cloud change, so it has its row
    # An Azure VM powered off on a power_off rule: "Stopped (allocated)", still billed; never counted as a stop that
    # saves (the report's stops and savings count stop and terminate only).
    POWER_OFF = "power_off"


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


def format_duration(seconds: float | None) -> str:
    """The one spelling of a duration for people (messages, reasons, reports, the CLI): '45 s', '1 min 30 s', '14 min',
    '2 h', '3 h 05 min', '7 d', '2 d 4 h'; negative counts as 0, None/NaN as unknown. (The one parser, of what a config
    says ('10m', '1h30m'), is rules.parse_duration; rules.duration_spec spells a duration back that way.)"""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "unknown"
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{int(s)} s"
    if s < 600 and int(s) % 60:
        return f"{int(s) // 60} min {int(s) % 60:02d} s"  # short spans exactly: a 90 s window is not "2 min"
    minutes = int(round(s / 60))
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 24 * 60:
        h, m = divmod(minutes, 60)
        return f"{h} h" if m == 0 else f"{h} h {m:02d} min"
    d, h = divmod(int(round(s / 3600)), 24)
    return f"{d} d" if h == 0 else f"{d} d {h} h"


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
