"""A Kubernetes place's names, pure: workload ids (`k8s:<namespace>/<Kind>/<name>`, cut to the store's 64
characters), gpufinops' tag keys as annotations, the Events it writes, the annotation patch of a mark, what a
restore removes and checks, and the errors of a change or a read. Shared by `cloud` (workloads) and `nodes` (GPU
nodes); read by act.restore, report/ and notify.interact without the clients.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

from gpufinops.collect.errors import QueryFailed
from gpufinops.k8s.model import (
    CORDONED_ANNOTATION,
    DEFAULT_PROTECT_KEY,
    KUEUE_SUSPEND_KINDS,
    MARK_ANNOTATION,
    PRE_SUSPEND_ANNOTATION,
    REPLICAS_BEFORE_ANNOTATION,
    SNOOZE_ANNOTATION,
    SUSPENDED_ANNOTATION,
    WorkloadRef,
)
from gpufinops.model import (
    TAG_MARKED, TAG_PROTECT, TAG_SNOOZE, TAG_STOP_REQUESTED, TAG_STOPPED_BY, TAG_STOPPED_REASON,
)
from gpufinops.places.registry import KUBERNETES_ID_PREFIX

ID_PREFIX = KUBERNETES_ID_PREFIX  # a workload id begins so (the registry says which place an id is)
MAX_ID_LEN = 64  # the store's instance_id columns
ANNOTATION_PREFIX = "gpufinops.io/"
# gpufinops' tag keys (model.TAG_*) -> the annotation each is kept in; the protect key is the setting's.
ANNOTATION_OF = {
    TAG_MARKED: MARK_ANNOTATION,
    TAG_SNOOZE: SNOOZE_ANNOTATION,
    TAG_STOPPED_BY: "gpufinops.io/scaled-down-by",
    TAG_STOPPED_REASON: "gpufinops.io/scaled-down-reason",
    TAG_STOP_REQUESTED: "gpufinops.io/scale-down-requested",
}
# Tags that say where a workload is, for rules' `tags:` selectors (a label key cannot hold ':', so none collides).
TAG_NAMESPACE = "k8s:namespace"
TAG_KIND = "k8s:kind"
# Its pods' PriorityClass (comma-separated when replicas differ), so that a rule selects by it:
# `tags: {"k8s:priority-class": [batch-low]}`.
TAG_PRIORITY_CLASS = "k8s:priority-class"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
EVENT_MARKED = "GpuIdleMarked"
EVENT_SCALED_DOWN = "GpuIdleScaledDown"
EVENT_RESTORED = "GpuScaleRestored"
EVENT_SUSPENDED = "GpuIdleSuspended"
EVENT_RESUMED = "GpuSuspendRestored"
EVENT_CORDONED = "GpuNodeCordoned"
EVENT_UNCORDONED = "GpuNodeUncordoned"
# Kueue's Workload custom resource (kueue.x-k8s.io/v1beta1, served by Kueue 0.6 and later; its list answers 404 in
# a cluster without Kueue).
KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOADS = "kueue.x-k8s.io", "v1beta1", "workloads"
KUEUE_WORKLOAD_PRIORITY_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
_EPOCH = datetime.min.replace(tzinfo=timezone.utc)
_RESOURCE = {"Deployment": "deployments", "StatefulSet": "statefulsets"}
ANY_WORKLOAD = WorkloadRef("*", "*", "*")  # a key of WorkloadCloud._autoscaled: the autoscalers were not read


class KubeChangeError(RuntimeError):
    """A change to a workload failed. `definite`: the API server certainly did not make it (a 4xx refusal, or
    gpufinops refused to ask); False: its fate is unknown (5xx, timeout): read the object back."""

    def __init__(self, message: str, *, definite: bool, status: int | None = None):
        super().__init__(message + (" [not done]" if definite else " [outcome unknown]"))
        self.definite = definite
        self.status = status


class KubeReadFailed(QueryFailed):
    """The API server did not answer a read of a workload (never taken for "gone")."""


# --------------------------------------------------------------------------- ids (pure)


def workload_id(ref: WorkloadRef) -> str:
    """`k8s:<namespace>/<Kind>/<name>`; cut to 64 characters ending in `~<sha1 10>` when longer."""
    full = f"{ID_PREFIX}{ref.namespace}/{ref.kind}/{ref.name}"
    if len(full) <= MAX_ID_LEN:
        return full
    digest = hashlib.sha1(full.encode()).hexdigest()[:10]
    return f"{full[:MAX_ID_LEN - 11]}~{digest}"


def is_workload_id(instance_id: str) -> bool:
    return instance_id.startswith(ID_PREFIX)


def parse_workload_id(instance_id: str) -> WorkloadRef | None:
    """The ref of a full (uncut) workload id; None for a cut one or anything else."""
    if not is_workload_id(instance_id):
        return None
    parts = instance_id[len(ID_PREFIX):].split("/")
    if len(parts) != 3 or not all(parts):
        return None
    ref = WorkloadRef(*parts)
    return ref if workload_id(ref) == instance_id else None


def parse_target(text: str) -> tuple[str, str | None, str]:
    """`NS/NAME`, `NS/Kind/NAME` or a workload id -> (namespace, kind or None, name); ValueError when neither."""
    raw = text[len(ID_PREFIX):] if is_workload_id(text) else text
    parts = raw.strip().split("/")
    if len(parts) == 2 and all(parts):
        return parts[0], None, parts[1]
    if len(parts) == 3 and all(parts):
        kind = {k.lower(): k for k in (*_RESOURCE, *KUEUE_SUSPEND_KINDS)}.get(parts[1].lower(), parts[1])
        return parts[0], kind, parts[2]
    raise ValueError(f"{text!r}: expected NAMESPACE/NAME or NAMESPACE/KIND/NAME (Deployment, StatefulSet, or a Kueue "
                     f"job: {', '.join(KUEUE_SUSPEND_KINDS)})")


def not_truthy(value: str | None) -> bool:
    return value is None or value.strip().lower() == "false"


def scaled_down(replicas: Any, annotations: Mapping[str, str]) -> bool:
    """Scaled to zero by gpufinops: no replicas *and* the count it replaced kept in the annotation."""
    return replicas == 0 and REPLICAS_BEFORE_ANNOTATION in annotations


def annotation_patch(tags: Mapping[str, str | None], protect_key: str = DEFAULT_PROTECT_KEY) -> dict[str, str | None]:
    """gpufinops' tag keys -> annotation keys (None removes one); other keys are kept as written."""
    keys = {**ANNOTATION_OF, TAG_PROTECT: protect_key}
    return {keys.get(k, k): (None if v is None else str(v)) for k, v in tags.items()}


def event_body(obj: Mapping[str, Any], reason: str, message: str, now: datetime, kind: str) -> dict:
    """A core/v1 Event on the object, as `kubectl describe` shows it."""
    meta = obj.get("metadata") or {}
    stamp = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name', 'workload')}.gpufinops-", "namespace": meta.get("namespace")},
        "involvedObject": {"apiVersion": obj.get("apiVersion", "apps/v1"), "kind": kind, "name": meta.get("name"),
                           "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                           "resourceVersion": meta.get("resourceVersion")},
        "reason": reason, "message": message[:1024], "type": "Warning" if reason == EVENT_MARKED else "Normal",
        "source": {"component": "gpufinops"}, "reportingComponent": "gpufinops", "reportingInstance": "gpufinops",
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


def saved_replicas(annotations: Mapping[str, str]) -> int | None:
    """The replica count gpufinops replaced, None when absent or unreadable."""
    try:
        value = int(str(annotations.get(REPLICAS_BEFORE_ANNOTATION, "")).strip())
    except ValueError:
        return None
    return value if value > 0 else None


# What a restore removes: the scale-down's own annotations (never a person's snooze or protect).
RESTORE_REMOVES = (REPLICAS_BEFORE_ANNOTATION, MARK_ANNOTATION, ANNOTATION_OF[TAG_STOPPED_BY],
                   ANNOTATION_OF[TAG_STOPPED_REASON])


# What an uncordon removes: the cordon's own annotations (never a person's snooze or protect).
NODE_RESTORE_REMOVES = (CORDONED_ANNOTATION, MARK_ANNOTATION, ANNOTATION_OF[TAG_STOPPED_BY],
                        ANNOTATION_OF[TAG_STOPPED_REASON])


# What a Kueue resume removes: the suspension's own annotations (never a person's snooze or protect).
KUEUE_RESTORE_REMOVES = (SUSPENDED_ANNOTATION, MARK_ANNOTATION, PRE_SUSPEND_ANNOTATION, ANNOTATION_OF[TAG_STOPPED_BY],
                         ANNOTATION_OF[TAG_STOPPED_REASON])


def restore_check(obj: Mapping[str, Any], target: str) -> tuple[int | None, str]:
    """(the count to scale back to, "") when gpufinops scaled this object to zero, else (None, why not)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    annotations = meta.get("annotations") or {}
    replicas = spec.get("replicas", 1)
    if REPLICAS_BEFORE_ANNOTATION not in annotations:
        return None, (f"kubernetes: {target} was not scaled down by gpufinops (no {REPLICAS_BEFORE_ANNOTATION} "
                      "annotation): left alone")
    if replicas != 0:
        return None, f"kubernetes: {target} runs {replicas} replica(s) already: nothing to restore"
    count = saved_replicas(annotations)
    if count is None:
        return None, (f"kubernetes: {target}: annotation {REPLICAS_BEFORE_ANNOTATION}="
                      f"{annotations[REPLICAS_BEFORE_ANNOTATION]!r} is not a positive count: scale it by hand")
    return count, ""


@dataclass(frozen=True)
class Restored:
    ref: WorkloadRef
    replicas: int
    reason: str

