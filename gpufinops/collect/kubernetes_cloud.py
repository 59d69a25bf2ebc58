"""Kubernetes workloads behind the `Cloud` protocol, so the act stage scales idle ones to zero (docs/kubernetes.md,
"Scale to zero").

Each workload holding GPUs (collect.kubernetes' snapshot) is one GpuInstance:
- `instance_id` = `k8s:<namespace>/<Kind>/<name>` (`workload_id`); a longer one than the store's 64 characters is
  cut and ends in `~` + 10 hex digits of its full name's SHA-1, resolved back through a listing;
- instance type, region, GPU model and count from its pods and their nodes; `hourly_cost` = its pods' cost shares
  (costs_k8s, node prices from billing or the catalog, EC2's own rate of the node when the fleet gives it);
- `tags` = the object's labels and annotations, its gpufinops annotations (`gpufinops.io/...`) under gpufinops'
  tag keys (`ANNOTATION_OF`), the namespace's protect / snooze labels, and `k8s:namespace` / `k8s:kind` for rules;
- Jobs, CronJobs, bare pods, custom resources (a Kubeflow Notebook) and anything labelled for Kueue carry
  `managed_by` + `managed_advice`: judged and reported, never changed (act.stop_blocker; the mutating calls below
  refuse them too). So do Deployments/StatefulSets whose spec.replicas someone else owns: an HPA or a KEDA
  ScaledObject targeting them (listed each tick; an unreadable list counts as one), Argo CD or Flux syncing them
  (their labels / tracking annotation); the advice names the owner's way (KEDA's paused-replicas annotation, the
  exact change in Git). `stop` checks again just before its PATCH and refuses when an owner appeared since.

Mutations, each one PATCH of the object (strategic merge, maps merged like a merge patch):
- set_tags / remove_tags: the annotations; setting the mark also creates a Kubernetes Event (GpuIdleMarked);
- stop: `spec.replicas: 0` *and* `gpufinops.io/replicas-before-scale-down: <n>` in one patch carrying the
  resourceVersion read just before (a precondition), so the count kept is the one replaced and no crash can
  leave one without the other; describe() reports "stopped" only when both hold;
- restore: `spec.replicas: <n>` and those annotations removed, in one patch, likewise;
- terminate: refused, always (gpufinops never deletes a workload).
A 409 Conflict is retried once after a re-read (logged, and named in the error when the retry fails too); any
other 4xx is a definite failure (`KubeChangeError.definite`: nothing was changed); a 5xx, timeout or refused
connection leaves the outcome unknown, for the act stage's read-back.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence

from gpufinops.collect.errors import QueryFailed
from gpufinops.collect.kubernetes import KubernetesCluster, parse_time, server_of
from gpufinops.prices.costs_k8s import attribute, node_hourly_costs, pod_hourly_costs
from gpufinops.k8s.model import (  # noqa: F401 - the annotation keys are this module's API too
    DEFAULT_PROTECT_KEY,
    MARK_ANNOTATION,
    REPLICAS_BEFORE_ANNOTATION,
    SNOOZE_ANNOTATION,
    ClusterSnapshot,
    NodeInfo,
    PodInfo,
    WorkloadInfo,
    WorkloadRef,
)
from gpufinops.model import (
    TAG_MARKED, TAG_PROTECT, TAG_SNOOZE, TAG_STOP_REQUESTED, TAG_STOPPED_BY, TAG_STOPPED_REASON, GpuInstance,
    utcnow,
)

log = logging.getLogger("gpufinops.kubernetes")

ID_PREFIX = "k8s:"
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
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
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
        kind = {k.lower(): k for k in _RESOURCE}.get(parts[1].lower(), parts[1])
        return parts[0], kind, parts[2]
    raise ValueError(f"{text!r}: expected NAMESPACE/NAME or NAMESPACE/Deployment|StatefulSet/NAME")


# --------------------------------------------------------------------------- what a workload is (pure)


def not_truthy(value: str | None) -> bool:
    return value is None or value.strip().lower() == "false"


def workload_tags(labels: Mapping[str, str], annotations: Mapping[str, str], ref: WorkloadRef,
                  namespace_labels: Mapping[str, str], protect_key: str = DEFAULT_PROTECT_KEY) -> dict[str, str]:
    """Labels and annotations (annotations win) with gpufinops' annotations under its tag keys. The namespace's
    protect label protects every workload in it; its snooze label (a date such as 2026-12-24, or 20261224T1800Z:
    label values hold no ':') snoozes those that have no snooze annotation."""
    tags = {**labels, **annotations}
    for tag, annotation in ANNOTATION_OF.items():
        tags.pop(annotation, None)
        if annotation in annotations:
            tags[tag] = annotations[annotation]
    tags.pop(protect_key, None)
    ns_protect = namespace_labels.get(protect_key)
    if not not_truthy(ns_protect):
        tags[TAG_PROTECT] = f"{ns_protect} (label {protect_key} of namespace {ref.namespace})"
    elif protect_key in annotations:
        tags[TAG_PROTECT] = annotations[protect_key]
    elif protect_key in labels:
        tags[TAG_PROTECT] = labels[protect_key]
    if TAG_SNOOZE not in tags and namespace_labels.get(SNOOZE_ANNOTATION):
        tags[TAG_SNOOZE] = namespace_labels[SNOOZE_ANNOTATION]
    tags[TAG_NAMESPACE] = ref.namespace
    tags[TAG_KIND] = ref.kind
    return tags


def node_remainders(snapshot: ClusterSnapshot, node_costs: Mapping[str, float | None],
                    pod_costs: Mapping[tuple[str, str], float | None]) -> dict[str, float | None]:
    """USD/h of each GPU node not carried by a listed workload's pods (None when the node or a share is unpriced):
    a node's inventory row at this rate and its workloads at theirs add up to the node's cost, never twice it."""
    listed = {p.key for ref in snapshot.workload_refs() for p in snapshot.pods_of(ref)}
    out: dict[str, float | None] = {}
    for node in snapshot.nodes:
        cost = node_costs.get(node.name)
        carried = [pod_costs.get(p.key) for p in snapshot.pods_on(node.name) if p.key in listed]
        if cost is None or any(c is None for c in carried):
            out[node.instance_id] = None
        else:
            out[node.instance_id] = round(max(cost - sum(carried), 0.0), 4)
    return out


def priority_tag(pods: Sequence[PodInfo]) -> dict[str, str]:
    """{TAG_PRIORITY_CLASS: its pods' PriorityClass names}, or {} when none sets one."""
    names = sorted({p.priority_class for p in pods if p.priority_class})
    return {TAG_PRIORITY_CLASS: ",".join(names)} if names else {}


ARGOCD_TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
ARGOCD_INSTANCE_LABELS = ("argocd.argoproj.io/instance", "app.kubernetes.io/instance")
FLUX_OWNER_LABELS = (("kustomize.toolkit.fluxcd.io", "Kustomization"), ("helm.toolkit.fluxcd.io", "HelmRelease"))
KEDA_PAUSED_REPLICAS = "autoscaling.keda.sh/paused-replicas"


def gitops_owner(ref: WorkloadRef, labels: Mapping[str, str], annotations: Mapping[str, str]) -> tuple[str, str]:
    """(managed_by, managed_advice) when a GitOps controller syncs this object from Git (it would put spec.replicas
    back at its next sync), ("", "") otherwise. Argo CD: its tracking annotation (`<app>:<group>/<kind>:<ns>/<name>`;
    the `app.kubernetes.io/instance` label alone is Helm's too, so it only names the app); Flux: the
    `kustomize.toolkit.fluxcd.io/name` / `helm.toolkit.fluxcd.io/name` labels."""
    what = f"{ref.kind} {ref.namespace}/{ref.name}"
    tracking = annotations.get(ARGOCD_TRACKING_ANNOTATION, "")
    argo_label = labels.get(ARGOCD_INSTANCE_LABELS[0], "")
    if tracking or argo_label:
        app = tracking.split(":", 1)[0] if tracking else argo_label
        app = app or labels.get(ARGOCD_INSTANCE_LABELS[1], "") or "?"
        return (f"Argo CD (application '{app}')",
                f"notify only: Argo CD would undo a scale-down at its next sync; set `spec.replicas: 0` on {what} in "
                f"the Git source of Argo CD application '{app}' (or remove it there)")
    for group, kind in FLUX_OWNER_LABELS:
        name = labels.get(f"{group}/name")
        if name:
            owner = f"{labels.get(f'{group}/namespace', ref.namespace)}/{name}"
            return (f"Flux ({kind} '{owner}')",
                    f"notify only: Flux would undo a scale-down at its next reconcile; set `spec.replicas: 0` on "
                    f"{what} in the source of Flux {kind} '{owner}' (or remove it there)")
    return "", ""


def autoscaler_owner(ref: WorkloadRef, autoscaler: tuple[str, str] | None) -> tuple[str, str]:
    """(managed_by, managed_advice) for a workload an HPA or a KEDA ScaledObject scales; ("", "") for none."""
    if autoscaler is None:
        return "", ""
    kind, name = autoscaler
    if kind == "unreadable":
        return (f"an autoscaler gpufinops could not check ({name})",
                "reported only until the HPAs and KEDA ScaledObjects can be listed (deploy/kubernetes/workloads/"
                "rbac-clusterrole.yaml)")
    ns, _, short = name.partition("/")
    if kind == "ScaledObject":
        return (f"KEDA ScaledObject '{name}'",
                f"notify only: KEDA owns spec.replicas and would undo a scale-down; pause it at zero through KEDA: "
                f"`kubectl annotate scaledobject -n {ns} {short} {KEDA_PAUSED_REPLICAS}=0` (remove the annotation "
                f"to resume)")
    return (f"HorizontalPodAutoscaler '{name}'",
            f"reported only: the HPA owns spec.replicas (a scale to zero would switch autoscaling off, or be "
            f"undone); lower its minReplicas, or delete HPA {name} if {ref.kind} {ref.name} is not needed")


def manager_of(ref: WorkloadRef, labels: Mapping[str, str], scale_to_zero: bool = True,
               annotations: Mapping[str, str] | None = None,
               autoscaler: tuple[str, str] | None = None) -> tuple[str, str]:
    """(managed_by, managed_advice): what else owns this workload's fate, ("", "") for a Deployment/StatefulSet
    gpufinops may scale. With `kubernetes.scale_to_zero` off (the default) no workload may be scaled: adding a
    `kubernetes:` section must not let rules written for EC2 instances start scaling Deployments. An HPA or KEDA
    ScaledObject targeting it (`autoscaler`, from KubernetesCluster.autoscalers) or a GitOps controller syncing it
    owns spec.replicas: never patched, the owner's way is named instead."""
    queue = labels.get(KUEUE_QUEUE_LABEL)
    if queue:
        return (f"Kueue (queue '{queue}')",
                ("notify only: gpufinops does not suspend Kueue workloads (a rule's `action: suspend`, setting "
                 "spec.suspend, is not built); suspend or delete it in its queue"))
    if ref.kind == "Job":
        return (f"Kubernetes Job '{ref.name}'",
                "reported only: gpufinops never stops Jobs; lower its parallelism or delete it")
    if ref.kind == "CronJob":
        return (f"Kubernetes CronJob '{ref.name}'",
                "reported only: gpufinops never stops CronJobs; suspend it (spec.suspend: true) or fix its schedule")
    if ref.kind == "Pod":
        return ("no controller (a bare Kubernetes Pod)",
                "reported only: gpufinops never deletes pods; delete it if nobody needs it")
    if not ref.scalable:
        return (f"its {ref.kind} '{ref.name}' (a custom resource's controller)",
                f"reported only: stop or scale the {ref.kind} itself (scaling what it owns would be undone)")
    owner = autoscaler_owner(ref, autoscaler)
    if not owner[0]:
        owner = gitops_owner(ref, labels, annotations or {})
    if owner[0]:
        return owner
    if not scale_to_zero:
        return ("Kubernetes (gpufinops' scale-to-zero is off)",
                "warned and reported only; set kubernetes.scale_to_zero: true to let gpufinops scale idle "
                "Deployments and StatefulSets to zero")
    return "", ""


def scaled_down(replicas: Any, annotations: Mapping[str, str]) -> bool:
    """Scaled to zero by gpufinops: no replicas *and* the count it replaced kept in the annotation."""
    return replicas == 0 and REPLICAS_BEFORE_ANNOTATION in annotations


def workload_state(ref: WorkloadRef, replicas: Any, annotations: Mapping[str, str], pods: Sequence[PodInfo]) -> str:
    """"stopped" when gpufinops scaled it to zero (scaled_down), "running" when every pod runs (or, read without
    its pods, it has replicas), else its pods' phases."""
    if ref.scalable and scaled_down(replicas, annotations):
        return "stopped"
    phases = sorted({p.phase for p in pods})
    if not pods:
        return "running"
    return "running" if phases == ["Running"] else "/".join(phases).lower()


def node_gpu_fields(node: NodeInfo | None) -> tuple[str, float]:
    """(GPU model, GiB per GPU) from GPU feature discovery's node labels; ("", 0.0) when absent."""
    labels = node.labels if node else {}
    try:
        memory = float(labels.get(GPU_MEMORY_LABEL, "0")) / 1024
    except ValueError:
        memory = 0.0
    return labels.get(GPU_PRODUCT_LABEL, ""), memory


def workload_instance(ref: WorkloadRef, info: WorkloadInfo | None, pods: Sequence[PodInfo],
                      nodes: Mapping[str, NodeInfo], namespace_labels: Mapping[str, str],
                      hourly_cost: float | None, protect_key: str = DEFAULT_PROTECT_KEY,
                      created: datetime | None = None, scale_to_zero: bool = True,
                      autoscaler: tuple[str, str] | None = None) -> GpuInstance:
    """The workload as a GpuInstance: as old as its youngest replica (a restart makes it too young to judge)."""
    labels = dict(info.labels) if info else {}
    annotations = dict(info.annotations) if info else {}
    pod_labels = {k: v for p in pods for k, v in p.labels.items() if k == KUEUE_QUEUE_LABEL}
    node = nodes.get(pods[0].node_name) if pods else None
    model, memory = node_gpu_fields(node)
    managed_by, advice = manager_of(ref, {**pod_labels, **labels}, scale_to_zero, annotations, autoscaler)
    return GpuInstance(
        instance_id=workload_id(ref), instance_type=node.instance_type if node else "",
        region=node.region if node else "",
        state=workload_state(ref, info.replicas if info else None, annotations, pods),
        launch_time=max((p.started or _EPOCH for p in pods), default=created or _EPOCH),
        lifecycle=node.lifecycle if node else "on-demand",
        tags={**workload_tags(labels, annotations, ref, namespace_labels, protect_key),
              **priority_tag(pods)},
        private_dns=node.name if node else "", gpu_count=sum(p.gpu_devices for p in pods), gpu_model=model,
        gpu_memory_gib=memory, hourly_cost=hourly_cost, provider="kubernetes", managed_by=managed_by,
        managed_advice=advice,
    )


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


# --------------------------------------------------------------------------- the cloud


@dataclass(frozen=True)
class Restored:
    ref: WorkloadRef
    replicas: int
    reason: str


class WorkloadCloud:
    """Deployments and StatefulSets (and, reported only, every other GPU workload) as the act stage's Cloud.

    `price(instance_type, region, lifecycle) -> USD/h | None` prices nodes (fleet.price_lookup); a fleet that
    lists EC2 too passes EC2's own rate per node instance id (`list_workloads(node_rates)`)."""

    def __init__(self, cluster: KubernetesCluster, price: Callable[[str, str, str], float | None] | None = None, *,
                 protect_key: str = DEFAULT_PROTECT_KEY, scale_to_zero: bool = True,
                 clock: Callable[[], datetime] = utcnow):
        self.cluster = cluster
        # A PATCH may be in flight for one connect + read timeout; act's reconcile waits that long (and a margin).
        self.max_request_s = 2 * cluster.reader.timeout_s + 10.0
        self.scale_to_zero = scale_to_zero
        self.price = price or (lambda *_: None)
        self.protect_key = protect_key
        self.clock = clock
        self.last_snapshot: ClusterSnapshot | None = None
        # Per node instance id, the USD/h of the node that no listed workload carries (its idle capacity and the
        # shares of pods in namespaces left out): what its own inventory row may still count (fleet.FleetCloud).
        self.node_remainders: dict[str, float | None] = {}
        self.last_errors: list[str] = []
        self._listed: dict[str, GpuInstance] = {}
        self._refs: dict[str, WorkloadRef] = {}
        self.conflicts_retried: list[str] = []  # "verb target" of every 409 retried (also logged)
        # The last listing's HPAs / ScaledObjects by target (ANY_WORKLOAD: they could not be read).
        self._autoscaled: dict[WorkloadRef, tuple[str, str]] = {}

    @property
    def api(self):
        return self.cluster.reader.api

    @property
    def server(self) -> str:
        return server_of(self.api)

    # ------------------------------------------------------------------ reading
    def list_gpu_instances(self) -> list[GpuInstance]:
        return self.list_workloads()

    def list_workloads(self, node_rates: Mapping[str, float | None] | None = None) -> list[GpuInstance]:
        """Every workload holding GPUs now in the namespaces the settings keep (ClusterReadFailed when the API
        does not answer: never an empty cluster)."""
        snapshot = self.cluster.snapshot(self.clock())
        rates = {k: v for k, v in (node_rates or {}).items() if v is not None}
        costs = node_hourly_costs(snapshot.nodes, self.price, rates)
        pod_costs = pod_hourly_costs(attribute(snapshot, costs, 1.0))
        nodes = {n.name: n for n in snapshot.nodes}
        self._autoscaled = self._autoscalers_listed() if self.scale_to_zero else {}
        out = []
        for ref in snapshot.workload_refs():
            pods = snapshot.pods_of(ref)
            shares = [pod_costs.get(p.key) for p in pods]
            hourly = None if not shares or any(c is None for c in shares) else round(sum(shares), 4)
            out.append(workload_instance(ref, snapshot.workloads.get(ref), pods, nodes,
                                         snapshot.namespace_labels.get(ref.namespace, {}), hourly, self.protect_key,
                                         scale_to_zero=self.scale_to_zero,
                                         autoscaler=self._autoscaled.get(ref, self._autoscaled.get(ANY_WORKLOAD))))
        self.last_snapshot = snapshot
        self.node_remainders = node_remainders(snapshot, costs, pod_costs)
        self._listed = {i.instance_id: i for i in out}
        self._refs.update({workload_id(r): r for r in snapshot.workload_refs()})
        return out

    def _autoscalers_listed(self) -> dict[WorkloadRef, tuple[str, str]]:
        """The cluster's HPAs and ScaledObjects by target. When they cannot be read, every workload counts as
        possibly autoscaled (judged and reported, never scaled): not knowing the owner is no licence to patch."""
        try:
            return self.cluster.autoscalers()
        except QueryFailed as exc:
            log.warning("kubernetes: autoscalers not read, no workload is scaled this tick: %s", exc)
            return {ANY_WORKLOAD: ("unreadable", str(exc)[:200])}

    def _owner_now(self, ref: WorkloadRef, obj: Mapping[str, Any]) -> tuple[str, str]:
        """Who owns spec.replicas right now, read just before a scale-down: an HPA or ScaledObject made after the
        mark, or GitOps labels added since, refuse it. An unreadable answer refuses it too."""
        meta = obj.get("metadata") or {}
        try:
            autoscaler = self.cluster.autoscalers(ref.namespace).get(ref)
        except QueryFailed as exc:
            autoscaler = ("unreadable", str(exc)[:200])
        return autoscaler_owner(ref, autoscaler) if autoscaler else gitops_owner(
            ref, dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}))

    def ref_of(self, instance_id: str) -> WorkloadRef | None:
        """The workload an id names: parsed, or (a cut id) from a listing."""
        return parse_workload_id(instance_id) or self._refs.get(instance_id)

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        """Fresh state and annotations of these workloads, read from the API (a 404 is "gone": absent). Raises
        KubeReadFailed when any cannot be read, so a reconcile never takes an unreadable workload for a gone one."""
        out = []
        for iid in dict.fromkeys(instance_ids):
            ref = self.ref_of(iid) or self._resolve_cut_id(iid)
            if ref is None:
                raise KubeReadFailed(f"kubernetes: {iid!r} names no workload gpufinops can read")
            if not ref.scalable:  # never changed, so only a listing's view is needed (and RBAC reads no CronJob)
                if iid not in self._listed:
                    raise KubeReadFailed(f"kubernetes: {iid} ({ref.kind}) is read only by listing the cluster")
                out.append(self._listed[iid])
                continue
            obj = self._get(ref)
            if obj is not None:
                out.append(self._instance_from_object(ref, obj))
        return out

    def _resolve_cut_id(self, instance_id: str) -> WorkloadRef | None:
        """A cut id not seen in this process: list Deployments and StatefulSets once to find it."""
        if not is_workload_id(instance_id) or "~" not in instance_id:
            return None
        from kubernetes import client

        apps = client.AppsV1Api(self.api)
        for kind, fn in (("Deployment", apps.list_deployment_for_all_namespaces),
                         ("StatefulSet", apps.list_stateful_set_for_all_namespaces)):
            try:
                listing = self.cluster.reader.list(_RESOURCE[kind], fn)
            except QueryFailed as exc:
                raise KubeReadFailed(str(exc)) from None
            for obj in listing.items:
                meta = obj.get("metadata") or {}
                ref = WorkloadRef(str(meta.get("namespace", "")), kind, str(meta.get("name", "")))
                self._refs[workload_id(ref)] = ref
        return self._refs.get(instance_id)

    def _instance_from_object(self, ref: WorkloadRef, obj: Mapping[str, Any]) -> GpuInstance:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        replicas = spec.get("replicas")
        info = WorkloadInfo(ref, dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}),
                            replicas if isinstance(replicas, int) else None, str(meta.get("resourceVersion", "")))
        snap = self.last_snapshot
        pods = snap.pods_of(ref) if snap else ()
        nodes = {n.name: n for n in snap.nodes} if snap else {}
        ns_labels = snap.namespace_labels.get(ref.namespace) if snap else None
        if ns_labels is None:
            ns_labels = self._namespace_labels(ref.namespace)
        listed = self._listed.get(workload_id(ref))
        inst = workload_instance(ref, info, pods, nodes, ns_labels, listed.hourly_cost if listed else None,
                                 self.protect_key, parse_time(meta.get("creationTimestamp")),
                                 scale_to_zero=self.scale_to_zero,
                                 autoscaler=self._autoscaled.get(ref, self._autoscaled.get(ANY_WORKLOAD)))
        # Read alone, the object says whether it is scaled down; pods listed earlier may be gone since.
        return replace(inst, state=workload_state(ref, info.replicas, info.annotations, () if
                                                  scaled_down(info.replicas, info.annotations) else pods))

    def _namespace_labels(self, namespace: str) -> dict[str, str]:
        from kubernetes import client

        obj = self._request("get", f"namespaces/{namespace}",
                            lambda **kw: client.CoreV1Api(self.api).read_namespace(namespace, **kw), read=True)
        return dict(((obj or {}).get("metadata") or {}).get("labels") or {})

    def _get(self, ref: WorkloadRef) -> dict | None:
        """The object, None when it does not exist (404)."""
        from kubernetes import client

        apps = client.AppsV1Api(self.api)
        fn = apps.read_namespaced_deployment if ref.kind == "Deployment" else apps.read_namespaced_stateful_set
        return self._request("get", self._target(ref), lambda **kw: fn(ref.name, ref.namespace, **kw), read=True)

    # ------------------------------------------------------------------ the calls
    def _target(self, ref: WorkloadRef) -> str:
        return f"{_RESOURCE.get(ref.kind, ref.kind.lower())} {ref.namespace}/{ref.name}"

    def _request(self, verb: str, target: str, fn: Callable[..., Any], *, read: bool = False) -> dict | None:
        """One API call, its answer as JSON. A read's 404 is None; any read failure is KubeReadFailed; a write's
        failure is KubeChangeError (definite on a 4xx)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        timeout = self.cluster.reader.timeout_s
        try:
            answer = fn(_preload_content=False, _request_timeout=(timeout, timeout))
            return json.loads(answer.data) if answer.data else {}
        except ApiException as exc:
            message = ""
            try:
                message = str(json.loads(exc.body or "{}").get("message", ""))[:300]
            except (ValueError, AttributeError):
                pass
            if read and exc.status == 404:
                return None
            text = f"kubernetes API at {self.server}: {verb} {target}: {exc.status} {exc.reason}"
            if exc.status == 403:
                text += (f" (the service account may not {verb} it: deploy/kubernetes/workloads/"
                         "rbac-clusterrole.yaml)")
            text += f": {message}" if message else ""
            if read:
                raise KubeReadFailed(text) from None
            # A 4xx is the server refusing: nothing changed. A 5xx may have been applied.
            raise KubeChangeError(text, definite=400 <= (exc.status or 0) < 500, status=exc.status) from None
        except HTTPError as exc:
            cause = getattr(exc, "reason", None) or exc
            text = f"kubernetes API at {self.server}: {verb} {target}: {type(cause).__name__} (no answer or refused)"
            if read:
                raise KubeReadFailed(text) from None
            raise KubeChangeError(text, definite=False) from None
        except (ValueError, TypeError):
            text = f"kubernetes API at {self.server}: {verb} {target}: malformed answer"
            if read:
                raise KubeReadFailed(text) from None
            raise KubeChangeError(text, definite=False) from None

    def _patch_object(self, ref: WorkloadRef, build: Callable[[dict], dict | None]) -> dict:
        """Read the object, PATCH what `build(obj)` returns (None: nothing to do), once more after a re-read on a
        409 Conflict. Returns the object as the server answered (or as read when nothing was to do)."""
        from kubernetes import client

        apps = client.AppsV1Api(self.api)
        fn = apps.patch_namespaced_deployment if ref.kind == "Deployment" else apps.patch_namespaced_stateful_set
        target = self._target(ref)
        for attempt in (1, 2):
            try:
                obj = self._get(ref)
            except KubeReadFailed as exc:
                raise KubeChangeError(f"{exc} (read before the change)", definite=True) from None
            if obj is None:
                raise KubeChangeError(f"kubernetes: {target} not found", definite=True, status=404)
            body = build(obj)
            if body is None:
                return obj
            try:
                answer = self._request("patch", target,
                                       lambda body=body, **kw: fn(ref.name, ref.namespace, body, **kw))
                return answer or {}
            except KubeChangeError as exc:
                if exc.status != 409:
                    raise
                if attempt == 2:
                    raise KubeChangeError(f"{str(exc).removesuffix(' [not done]')} (409 Conflict again after one "
                                          "re-read and retry)", definite=True, status=409) from None
                self.conflicts_retried = [*self.conflicts_retried[-99:], f"patch {target}"]  # the last 100
                log.warning("%s: 409 Conflict (the object changed since it was read): re-read and applied once "
                            "more", target)
        raise AssertionError("unreachable")

    def _event(self, obj: Mapping[str, Any], ref: WorkloadRef, reason: str, message: str) -> None:
        """A Kubernetes Event on the object; best effort (the change is made, the Event only tells it)."""
        from kubernetes import client

        body = event_body(obj, reason, message, self.clock(), ref.kind)
        try:
            self._request("create", f"events in {ref.namespace}", lambda **kw: client.CoreV1Api(
                self.api).create_namespaced_event(ref.namespace, body, **kw))
        except KubeChangeError as exc:
            log.warning("%s: the %s Event was not created: %s", self._target(ref), reason, exc)

    def _scalable_ref(self, inst: GpuInstance, doing: str, *, owned_too: bool = False) -> WorkloadRef:
        """The Deployment/StatefulSet to change; `owned_too`: also one someone else scales now (removing
        gpufinops' own mark from a workload an HPA took over since touches no replicas)."""
        ref = self.ref_of(inst.instance_id)
        if ref is None:
            raise KubeChangeError(f"kubernetes: {inst.instance_id!r} names no workload", definite=True)
        if not ref.scalable or (inst.managed_by and not owned_too):
            why = inst.managed_by or f"a {ref.kind}"
            raise KubeChangeError(f"kubernetes: gpufinops never changes {ref} ({why}); refused to {doing} it",
                                  definite=True)
        return ref

    # ------------------------------------------------------------------ mutating calls (act stage only)
    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        if not tags:
            return
        ref = self._scalable_ref(inst, "annotate")
        patch = annotation_patch(tags, self.protect_key)
        obj = self._patch_object(ref, lambda _obj: {"metadata": {"annotations": patch}})
        if TAG_MARKED in tags:
            self._event(obj, ref, EVENT_MARKED,
                        f"gpufinops: its GPUs are idle; it will be scaled to 0 replicas at {tags[TAG_MARKED]} unless "
                        f"it becomes active. To keep it: annotate {SNOOZE_ANNOTATION}=<ISO time> or "
                        f"{self.protect_key}=true.")

    def remove_tags(self, inst: GpuInstance, keys: Sequence[str]) -> None:
        if not keys:
            return
        ref = self._scalable_ref(inst, "annotate", owned_too=True)
        patch = annotation_patch(dict.fromkeys(keys), self.protect_key)
        self._patch_object(ref, lambda _obj: {"metadata": {"annotations": patch}})

    def stop(self, inst: GpuInstance) -> None:
        """Scale to 0, keeping the count replaced, in one patch preconditioned on the resourceVersion read."""
        ref = self._scalable_ref(inst, "scale")
        before: dict[str, int] = {}

        def build(obj: dict) -> dict | None:
            meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
            replicas = spec.get("replicas", 1)  # the API server's default when unset
            annotations = meta.get("annotations") or {}
            if replicas != 0 or not scaled_down(replicas, annotations):
                owner, advice = self._owner_now(ref, obj)
                if owner:
                    raise KubeChangeError(f"kubernetes: {self._target(ref)} is managed by {owner} now (found just "
                                          f"before the scale-down): not scaled; instead: {advice}", definite=True)
            if replicas == 0:
                if scaled_down(replicas, annotations):
                    return None  # already done (a retry after a lost answer)
                raise KubeChangeError(f"kubernetes: {self._target(ref)} is already at 0 replicas, scaled down by "
                                      "someone else: left alone", definite=True)
            before["replicas"] = int(replicas)
            return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                 "annotations": {REPLICAS_BEFORE_ANNOTATION: str(int(replicas))}},
                    "spec": {"replicas": 0}}

        obj = self._patch_object(ref, build)
        if before:
            log.info("%s scaled from %d to 0 replicas", self._target(ref), before["replicas"])
            self._event(obj, ref, EVENT_SCALED_DOWN,
                        f"gpufinops scaled it from {before['replicas']} to 0 replicas: its GPUs were idle. "
                        f"`gpufinops k8s restore {ref.namespace}/{ref.name}` scales it back.")

    def terminate(self, inst: GpuInstance) -> None:
        raise KubeChangeError(f"kubernetes: gpufinops never deletes a workload ({inst.instance_id}); a rule with "
                              "action: stop scales it to zero instead", definite=True)

    def restorable(self, ref: WorkloadRef) -> tuple[int | None, str]:
        """(replicas a restore would give, "") or (None, why not), read without changing anything (dry-run)."""
        if not ref.scalable:
            return None, f"kubernetes: only a Deployment or StatefulSet is restored, not {ref}"
        try:
            obj = self._get(ref)
        except KubeReadFailed as exc:
            return None, str(exc)
        if obj is None:
            return None, f"kubernetes: {self._target(ref)} not found"
        return restore_check(obj, self._target(ref))

    def restore(self, ref: WorkloadRef, who: str = "") -> Restored:
        """Scale back to the kept count and remove gpufinops' scale-down annotations (a person's snooze or protect
        stays), in one preconditioned patch. Raises KubeChangeError (definite) when there is nothing to restore."""
        if not ref.scalable:
            raise KubeChangeError(f"kubernetes: only a Deployment or StatefulSet is restored, not {ref}",
                                  definite=True)
        done: dict[str, int] = {}

        def build(obj: dict) -> dict | None:
            count, problem = restore_check(obj, self._target(ref))
            if count is None:
                raise KubeChangeError(problem, definite=True)
            done["replicas"] = count
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            return {"metadata": {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion"),
                                 "annotations": {k: None for k in RESTORE_REMOVES if k in annotations}},
                    "spec": {"replicas": count}}

        obj = self._patch_object(ref, build)
        by = f" for {who}" if who else ""
        self._event(obj, ref, EVENT_RESTORED, f"gpufinops scaled it back to {done['replicas']} replicas{by}.")
        return Restored(ref, done["replicas"], f"restored to {done['replicas']} replicas{by}")
