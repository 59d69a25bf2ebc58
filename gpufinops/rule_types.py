"""What a rule says: the action it asks for (`Action`) and what the act stage records of one (`ActionKind`), how it
judges (`Aggregation`, `NoCounterPolicy` and its memory floor), what it selects (`Selector`), and the `Rule` value
rules.py loads. A leaf, no imports of gpufinops: rules.py, places.registry and cli.core read them at the start of
`rules check` without model's records (their import was about a tenth of that command's start, BENCHMARKS.md).
model hands every name on under the same name; callers other than those three import them from model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping


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
class Selector:
    """Which instances a rule applies to. Empty fields match everything."""

    tags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # key -> allowed values; ("*",) = any value
    exclude_tags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    instance_families: tuple[str, ...] = ()
    instance_types: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()

    def matches(self, inst) -> bool:
        """Whether `inst`, a model.GpuInstance (not named here: model imports this leaf), is selected."""
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
