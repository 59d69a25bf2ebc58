"""Kubernetes workloads behind the `Cloud` protocol, so the act stage scales idle ones to zero (docs/kubernetes.md,
"Scale to zero"). Its names (ids, annotations, Events, patches, errors) are `names`, who else owns a workload
`owners`, the GPU nodes (cordon / uncordon) `nodes`: this module is the WorkloadCloud, its listing and its calls.

Each workload holding GPUs (places.kubernetes.cluster' snapshot) is one GpuInstance:
- `instance_id` = `k8s:<namespace>/<Kind>/<name>` (`workload_id`); a longer one than the store's 64 characters is
  cut and ends in `~` + 10 hex digits of its full name's SHA-1, resolved back through a listing;
- instance type, region, GPU model and count from its pods and their nodes; `hourly_cost` = its pods' cost shares
  (kubernetes.costs, node prices from billing or the catalog, EC2's own rate of the node when the fleet gives it);
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
A Kueue-managed job (kubernetes.suspend_kueue on, its Kueue Workload listed) is the exception to "Jobs and custom
resources are never changed": a batch Job, or the top object of a JobSet, a Kubeflow training job (PyTorchJob,
TFJob, XGBoostJob, PaddleJob, MPIJob) or a RayJob (k8s.model.KUEUE_SUSPEND_KINDS; its pods are judged as one
workload under its id). It is suspended, never scaled or deleted, and every change is a PATCH of its **Kueue
Workload** (the object whose annotations carry the mark, so the suspension is fenced on it): set_tags / remove_tags
its annotations (the mark with `gpufinops.io/pre-suspend-at`, the pre-suspend hook); stop = `suspend`:
`spec.active: false` and `gpufinops.io/suspended-at` in one patch preconditioned on the resourceVersion of the read
that found the mark; restore = `resume`: `spec.active: true`. Events go on the job's top object, named by the
Workload's controller ownerReference, else on the Workload (docs/kubernetes.md, "Kueue: suspend, don't kill").
A 409 Conflict is retried once after a re-read (logged, and named in the error when the retry fails too); any
other 4xx is a definite failure (`KubeChangeError.definite`: nothing was changed); a 5xx, timeout or refused
connection leaves the outcome unknown, for the act stage's read-back.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence

from gpufinops.collect.errors import QueryFailed
from gpufinops.k8s.model import (
    DEFAULT_PROTECT_KEY, KUEUE_JOB_KINDS, KUEUE_QUEUE_LABEL, KUEUE_SUSPEND_KINDS, MARK_ANNOTATION,
    PRE_SUSPEND_ANNOTATION, REPLICAS_BEFORE_ANNOTATION, SNOOZE_ANNOTATION, SUSPENDED_ANNOTATION, TAG_KUEUE_WORKLOAD,
    ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo, WorkloadRef, allocations,
)
from gpufinops.model import TAG_MARKED, TAG_PROTECT, TAG_SNOOZE, GpuInstance, utcnow
from gpufinops.places.kubernetes.cluster import KubernetesCluster, controller_of, parse_time, server_of
from gpufinops.places.kubernetes.costs import attribute, node_hourly_costs, pod_hourly_costs
from gpufinops.places.kubernetes.names import (
    _EPOCH, _RESOURCE, ANNOTATION_OF, ANY_WORKLOAD, EVENT_MARKED, EVENT_RESTORED, EVENT_RESUMED, EVENT_SCALED_DOWN,
    EVENT_SUSPENDED, KUEUE_GROUP, KUEUE_RESTORE_REMOVES, KUEUE_VERSION, KUEUE_WORKLOADS, RESTORE_REMOVES, TAG_KIND,
    TAG_NAMESPACE, TAG_PRIORITY_CLASS, KubeChangeError, KubeReadFailed, Restored, annotation_patch, event_body,
    is_workload_id, not_truthy, parse_workload_id, restore_check, scaled_down, workload_id,
)
from gpufinops.places.kubernetes.nodes import NodeCloudMixin, is_node_id, node_gpu_fields, node_remainders
from gpufinops.places.kubernetes.owners import (
    autoscaler_owner, gitops_owner, kueue_annotations, kueue_name, kueue_suspended, kueue_workloads_by_owner,
    manager_of, workload_priority_class,
)

log = logging.getLogger("gpufinops.kubernetes")


# --------------------------------------------------------------------------- what a workload is (pure)


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


def priority_tag(pods: Sequence[PodInfo]) -> dict[str, str]:
    """{TAG_PRIORITY_CLASS: its pods' PriorityClass names}, or {} when none sets one."""
    names = sorted({p.priority_class for p in pods if p.priority_class})
    return {TAG_PRIORITY_CLASS: ",".join(names)} if names else {}


def workload_state(ref: WorkloadRef, replicas: Any, annotations: Mapping[str, str], pods: Sequence[PodInfo]) -> str:
    """"stopped" when gpufinops scaled it to zero (scaled_down), "running" when every pod runs (or, read without
    its pods, it has replicas), else its pods' phases."""
    if ref.scalable and scaled_down(replicas, annotations):
        return "stopped"
    phases = sorted({p.phase for p in pods})
    if not pods:
        return "running"
    return "running" if phases == ["Running"] else "/".join(phases).lower()


def unread_reason(ref: WorkloadRef, info: WorkloadInfo | None, unread: Mapping[str, str]) -> str:
    """Pure: why the workload's own object was not read this tick, "" when it was (or need not be). Its kind's
    list failed (ClusterSnapshot.unread: a RayCluster's failure leaves a RayJob's pods resolved to it), or a
    Kueue job kind's object was not in its listing (its labels and a person's annotations are unknown): judged on
    its pods' labels, never suspended (missing data never causes an action)."""
    if ref.kind in unread:
        return f"its {ref.kind} list failed: {unread[ref.kind]}"
    if ref.kind in KUEUE_JOB_KINDS and (info is None or not info.listed):
        return (f"{ref} was not in the listing of {KUEUE_JOB_KINDS[ref.kind].resource} (its labels and "
                "annotations are unknown)")
    return ""


def workload_instance(ref: WorkloadRef, info: WorkloadInfo | None, pods: Sequence[PodInfo],
                      nodes: Mapping[str, NodeInfo], namespace_labels: Mapping[str, str],
                      hourly_cost: float | None, protect_key: str = DEFAULT_PROTECT_KEY,
                      created: datetime | None = None, scale_to_zero: bool = True,
                      autoscaler: tuple[str, str] | None = None, kueue_workload: Mapping[str, Any] | None = None,
                      kueue_note: str = "", unread: str = "", kueue_unread: str = "") -> GpuInstance:
    """The workload as a GpuInstance: as old as its youngest replica (a restart makes it too young to judge).
    `kueue_workload`: the Kueue Workload of a Kueue-managed job gpufinops may suspend (kubernetes.suspend_kueue on;
    None otherwise): its gpufinops annotations, name and state join the job's. `unread`: unread_reason.
    `kueue_unread`: why the cluster's Kueue Workloads could not be listed this tick ("" when they were)."""
    labels = dict(info.labels) if info else {}
    annotations = dict(info.annotations) if info else {}
    pod_labels = {k: v for p in pods for k, v in p.labels.items() if k == KUEUE_QUEUE_LABEL}
    if kueue_workload is not None and (ref.kind not in KUEUE_SUSPEND_KINDS or unread):
        # Only these kinds are read fresh before a suspension (describe), and only when their object was read.
        kueue_workload = None
    if kueue_workload is not None:
        annotations = kueue_annotations(annotations, kueue_workload, protect_key)
    node = nodes.get(pods[0].node_name) if pods else None
    model, memory = node_gpu_fields(node)
    managed_by, advice = manager_of(ref, {**pod_labels, **labels}, scale_to_zero, annotations, autoscaler,
                                    kueue_name(kueue_workload) if kueue_workload is not None else "", kueue_note,
                                    unread)
    kueue_tags = {} if kueue_workload is None or managed_by else {TAG_KUEUE_WORKLOAD: kueue_name(kueue_workload)}
    state = ("stopped" if kueue_suspended(kueue_workload) else
             workload_state(ref, info.replicas if info else None, annotations, pods))
    # A Kueue job's mark is on its Workload, its snooze or protect maybe on its object: either unread this tick,
    # an earlier mark is kept as it is (act.plan), not taken for a person's cancel.
    tags_unread = unread or (kueue_unread if kueue_workload is None and ref.kind in KUEUE_SUSPEND_KINDS else "")
    return GpuInstance(
        instance_id=workload_id(ref), instance_type=node.instance_type if node else "",
        region=node.region if node else "",
        state=state,
        launch_time=max((p.started or _EPOCH for p in pods), default=created or _EPOCH),
        lifecycle=node.lifecycle if node else "on-demand",
        tags={**workload_tags(labels, annotations, ref, namespace_labels, protect_key),
              **priority_tag(pods), **workload_priority_class(labels, kueue_workload), **kueue_tags},
        private_dns=node.name if node else "", gpu_count=sum(p.gpu_devices for p in pods), gpu_model=model,
        gpu_memory_gib=memory, hourly_cost=hourly_cost, provider="kubernetes", managed_by=managed_by,
        managed_advice=advice, tags_unread=tags_unread,
        gpu_allocation=allocations(p.allocation for p in pods),
    )


# --------------------------------------------------------------------------- the cloud


class WorkloadCloud(NodeCloudMixin):
    """Deployments and StatefulSets (and, reported only, every other GPU workload) as the act stage's Cloud.

    `price(instance_type, region, lifecycle) -> USD/h | None` prices nodes (fleet.price_lookup); a fleet that
    lists EC2 too passes EC2's own rate per node instance id (`list_workloads(node_rates)`)."""

    def __init__(self, cluster: KubernetesCluster, price: Callable[[str, str, str], float | None] | None = None, *,
                 protect_key: str = DEFAULT_PROTECT_KEY, scale_to_zero: bool = True,
                 suspend_kueue: bool = False, drain_nodes: bool = False, clock: Callable[[], datetime] = utcnow):
        self.cluster = cluster
        # kubernetes.drain_nodes: GPU nodes without GPU work may be cordoned (rules with action: drain).
        self.drain_nodes = drain_nodes
        self.node_costs: dict[str, float | None] = {}  # USD/h per node name, from the last listing
        self.hourly_shares: tuple = ()  # the last listing's costs.attribute for one hour (pods and idle capacity)
        self._node_names: dict[str, str] = {}  # node instance id -> node name (cut ids included)
        # kubernetes.suspend_kueue: Kueue-managed Jobs may be suspended (their Kueue Workload deactivated).
        self.suspend_kueue = suspend_kueue
        # The last listing's Kueue Workloads by owner, and why none may be suspended this tick ("" when read).
        self._kueue: dict[WorkloadRef, dict] = {}
        self._kueue_note = ""
        # A PATCH may be in flight for one connect + read timeout; act's reconcile waits that long (and a margin).
        self.max_request_s = 2 * cluster.reader.timeout_s + 10.0
        self.scale_to_zero = scale_to_zero
        self.price = price or (lambda *_: None)
        self.protect_key = protect_key
        self.clock = clock
        self.last_snapshot: ClusterSnapshot | None = None
        self.listed_ok = False  # the last list_workloads read the cluster (last_snapshot is this listing's)
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
        self.listed_ok = False  # until this listing succeeds: a failed one leaves an old snapshot behind
        snapshot = self.cluster.snapshot(self.clock())
        rates = {k: v for k, v in (node_rates or {}).items() if v is not None}
        costs = node_hourly_costs(snapshot.nodes, self.price, rates)
        hourly_shares = attribute(snapshot, costs, 1.0)
        pod_costs = pod_hourly_costs(hourly_shares)
        nodes = {n.name: n for n in snapshot.nodes}
        self._autoscaled = self._autoscalers_listed() if self.scale_to_zero else {}
        self._kueue, self._kueue_note = self._kueue_listed() if self.suspend_kueue else ({}, "")
        out = []
        for ref in snapshot.workload_refs():
            pods = snapshot.pods_of(ref)
            shares = [pod_costs.get(p.key) for p in pods]
            hourly = None if not shares or any(c is None for c in shares) else round(sum(shares), 4)
            info = snapshot.workloads.get(ref)
            out.append(workload_instance(ref, info, pods, nodes,
                                         snapshot.namespace_labels.get(ref.namespace, {}), hourly, self.protect_key,
                                         scale_to_zero=self.scale_to_zero,
                                         autoscaler=self._autoscaled.get(ref, self._autoscaled.get(ANY_WORKLOAD)),
                                         kueue_workload=self._kueue.get(ref), kueue_note=self._kueue_note,
                                         unread=unread_reason(ref, info, snapshot.unread),
                                         kueue_unread=self._kueue_note))
        self.last_snapshot = snapshot
        self.node_costs = dict(costs)
        self.hourly_shares = tuple(hourly_shares)
        self.node_remainders = node_remainders(snapshot, costs, pod_costs)
        self._listed = {i.instance_id: i for i in out}
        self._refs.update({workload_id(r): r for r in snapshot.workload_refs()})
        self.listed_ok = True
        return out

    def _autoscalers_listed(self) -> dict[WorkloadRef, tuple[str, str]]:
        """The cluster's HPAs and ScaledObjects by target. When they cannot be read, every workload counts as
        possibly autoscaled (judged and reported, never scaled): not knowing the owner is no licence to patch."""
        try:
            return self.cluster.autoscalers()
        except QueryFailed as exc:
            log.warning("kubernetes: autoscalers not read, no workload is scaled this tick: %s", exc)
            return {ANY_WORKLOAD: ("unreadable", str(exc)[:200])}

    def _kueue_list(self, namespace: str = "") -> dict[WorkloadRef, dict]:
        """Kueue Workloads by owner, cluster-wide or in one namespace (a paged list; 404: Kueue is not installed,
        none). Raises KubeReadFailed when the API does not answer."""
        from kubernetes import client

        custom = client.CustomObjectsApi(self.api)
        if namespace:
            fn = lambda **kw: custom.list_namespaced_custom_object(  # noqa: E731
                KUEUE_GROUP, KUEUE_VERSION, namespace, KUEUE_WORKLOADS, **kw)
        else:
            fn = lambda **kw: custom.list_cluster_custom_object(  # noqa: E731
                KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOADS, **kw)
        try:
            return kueue_workloads_by_owner(self.cluster.reader.list(KUEUE_WORKLOADS, fn).items)
        except QueryFailed as exc:
            if getattr(exc, "status", None) == 404:
                return {}
            raise KubeReadFailed(str(exc)) from None

    def _kueue_listed(self) -> tuple[dict[WorkloadRef, dict], str]:
        """The cluster's Kueue Workloads by owner, and "" ; when they cannot be read, none and why: no Kueue job is
        suspended this tick (not knowing its Workload is no licence to act), each is judged and reported."""
        try:
            return self._kueue_list(), ""
        except KubeReadFailed as exc:
            log.warning("kubernetes: Kueue Workloads not read, no Kueue job is suspended this tick: %s", exc)
            return {}, (f"notify only this tick: its Kueue Workload could not be read ({str(exc)[:200]}); "
                        "deploy/kubernetes/workloads/rbac-clusterrole.yaml grants list on workloads.kueue.x-k8s.io")

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
            if is_node_id(iid):
                node = self.describe_node(iid)
                if node is not None:
                    out.append(node)
                continue
            ref = self.ref_of(iid) or self._resolve_cut_id(iid)
            if ref is None:
                raise KubeReadFailed(f"kubernetes: {iid!r} names no workload gpufinops can read")
            if ref.kind in KUEUE_SUSPEND_KINDS and self.suspend_kueue:
                job = self._job_instance(ref)  # read fresh: a Kueue job is suspended on what it says now
                if job is not None:
                    out.append(job)
                continue
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
        pods, nodes, ns_labels = self._seen_with(ref)
        listed = self._listed.get(workload_id(ref))
        inst = workload_instance(ref, info, pods, nodes, ns_labels, listed.hourly_cost if listed else None,
                                 self.protect_key, parse_time(meta.get("creationTimestamp")),
                                 scale_to_zero=self.scale_to_zero,
                                 autoscaler=self._autoscaled.get(ref, self._autoscaled.get(ANY_WORKLOAD)))
        # Read alone, the object says whether it is scaled down; pods listed earlier may be gone since.
        return replace(inst, state=workload_state(ref, info.replicas, info.annotations, () if
                                                  scaled_down(info.replicas, info.annotations) else pods))

    def _seen_with(self, ref: WorkloadRef) -> tuple[tuple, dict, dict]:
        """What this tick's listing saw around a workload read alone: its pods, the GPU nodes by name, and its
        namespace's labels (read now when the listing did not hold them)."""
        snap = self.last_snapshot
        pods = snap.pods_of(ref) if snap else ()
        nodes = {n.name: n for n in snap.nodes} if snap else {}
        ns_labels = snap.namespace_labels.get(ref.namespace) if snap else None
        if ns_labels is None:
            ns_labels = self._namespace_labels(ref.namespace)
        return pods, nodes, ns_labels

    def _read_job(self, ref: WorkloadRef) -> dict | None:
        """A Kueue job's top object (a batch Job, a JobSet, a PyTorchJob, a RayJob, ...), None when it does not
        exist (a 404; for a custom kind also when its CRD is not installed). KubeReadFailed when not answered."""
        from kubernetes import client

        if ref.kind == "Job":
            batch = client.BatchV1Api(self.api)
            return self._request("get", f"jobs {ref.namespace}/{ref.name}",
                                 lambda **kw: batch.read_namespaced_job(ref.name, ref.namespace, **kw), read=True)
        kind = KUEUE_JOB_KINDS[ref.kind]
        custom = client.CustomObjectsApi(self.api)
        return self._request("get", f"{kind.resource} {ref.namespace}/{ref.name}",
                             lambda **kw: custom.get_namespaced_custom_object(
                                 kind.group, kind.version, ref.namespace, kind.plural, ref.name, **kw), read=True)

    def _job_instance(self, ref: WorkloadRef) -> GpuInstance | None:
        """A Kueue job kind's top object read fresh with, when Kueue manages it, its Kueue Workload (None: the
        object is gone). A Kueue Workload list that does not answer raises KubeReadFailed: its state is unknown,
        never "not suspended"."""
        obj = self._read_job(ref)
        if obj is None:
            return None
        meta = obj.get("metadata") or {}
        info = WorkloadInfo(ref, dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}), None,
                            str(meta.get("resourceVersion", "")))
        pods, nodes, ns_labels = self._seen_with(ref)
        queued = KUEUE_QUEUE_LABEL in info.labels or any(KUEUE_QUEUE_LABEL in p.labels for p in pods)
        kueue = self._kueue_list(ref.namespace).get(ref) if queued else None
        listed = self._listed.get(workload_id(ref))
        return workload_instance(ref, info, pods, nodes, ns_labels, listed.hourly_cost if listed else None,
                                 self.protect_key, parse_time(meta.get("creationTimestamp")),
                                 scale_to_zero=self.scale_to_zero, kueue_workload=kueue,
                                 kueue_note="" if kueue is not None else
                                 f"notify only: no Kueue Workload owned by this {ref.kind} was found")

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

    def _patch_object(self, ref: WorkloadRef, build: Callable[[dict], dict | None], *, kueue: str = "") -> dict:
        """Read the object, PATCH what `build(obj)` returns (None: nothing to do), once more after a re-read on a
        409 Conflict. Returns the object as the server answered (or as read when nothing was to do). `kueue`:
        the Kueue Workload (namespace/name) of the Kueue-managed Job `ref` is the object read and patched."""
        from kubernetes import client

        if kueue:
            custom = client.CustomObjectsApi(self.api)
            ns, _, name = kueue.partition("/")
            target = f"{KUEUE_WORKLOADS}.{KUEUE_GROUP} {kueue}"
            get = lambda: self._request("get", target, lambda **kw: custom.get_namespaced_custom_object(  # noqa: E731
                KUEUE_GROUP, KUEUE_VERSION, ns, KUEUE_WORKLOADS, name, **kw), read=True)
            fn = lambda _name, _ns, body, **kw: custom.patch_namespaced_custom_object(  # noqa: E731
                KUEUE_GROUP, KUEUE_VERSION, ns, KUEUE_WORKLOADS, name, body, **kw)
        else:
            apps = client.AppsV1Api(self.api)
            fn = apps.patch_namespaced_deployment if ref.kind == "Deployment" else apps.patch_namespaced_stateful_set
            target = self._target(ref)
            get = lambda: self._get(ref)  # noqa: E731
        return self._read_build_patch(target, get, build,
                                      lambda body, **kw: fn(ref.name, ref.namespace, body, **kw))

    def _read_build_patch(self, target: str, get: Callable[[], dict | None], build: Callable[[dict], dict | None],
                          patch: Callable[..., Any]) -> dict:
        """The one write loop of every object (workload, Kueue Workload, node): read it, PATCH what `build(obj)`
        returns (None: nothing to do, the object as read comes back), and once more after a re-read on a 409
        Conflict (the resourceVersion precondition failed: someone changed it since); a second 409 is final."""
        for attempt in (1, 2):
            try:
                obj = get()
            except KubeReadFailed as exc:
                raise KubeChangeError(f"{exc} (read before the change)", definite=True) from None
            if obj is None:
                raise KubeChangeError(f"kubernetes: {target} not found", definite=True, status=404)
            body = build(obj)
            if body is None:
                return obj
            try:
                return self._request("patch", target, lambda body=body, **kw: patch(body, **kw)) or {}
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

    def _event(self, obj: Mapping[str, Any], ref: WorkloadRef, reason: str, message: str, kind: str = "") -> None:
        """A Kubernetes Event on the object (of `kind`, else ref's); best effort (the change is made, the Event
        only tells it)."""
        from kubernetes import client

        body = event_body(obj, reason, message, self.clock(), kind or ref.kind)
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

    def _kueue_target(self, inst: GpuInstance) -> tuple[WorkloadRef, str] | None:
        """(the job's top object, its Kueue Workload namespace/name) when `inst` is a Kueue-managed job gpufinops
        may suspend; None for anything else (changed, if at all, as a Deployment/StatefulSet)."""
        ref = self.ref_of(inst.instance_id)
        kueue = inst.tags.get(TAG_KUEUE_WORKLOAD, "")
        if ref is None or ref.kind not in KUEUE_SUSPEND_KINDS or not kueue or not self.suspend_kueue \
                or inst.managed_by:
            return None
        return ref, kueue

    def _job_event(self, kueue_obj: Mapping[str, Any], ref: WorkloadRef, reason: str, message: str) -> None:
        """An Event on the job's top object (what people `kubectl describe`: the Job, JobSet, PyTorchJob, RayJob),
        its apiVersion and uid from the Workload's ownerReference; on the Workload itself when no ownerReference
        names the object (so the Event is never lost, nor put on an object gpufinops did not identify)."""
        owner = next((o for o in (kueue_obj.get("metadata") or {}).get("ownerReferences") or []
                      if isinstance(o, dict) and o.get("kind") == ref.kind and o.get("name") == ref.name
                      and o.get("uid")), None)
        if owner is None:
            self._event(kueue_obj, ref, reason, message, kind="Workload")
            return
        top = {"apiVersion": owner.get("apiVersion", ""), "metadata": {"name": ref.name, "namespace": ref.namespace,
                                                                       "uid": owner["uid"]}}
        self._event(top, ref, reason, message)

    # ------------------------------------------------------------------ mutating calls (act stage only)
    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        if not tags:
            return
        if is_node_id(inst.instance_id):
            self.annotate_node(inst, tags)
            return
        kueue = self._kueue_target(inst)
        if kueue is not None:
            ref, name = kueue
            patch = annotation_patch(tags, self.protect_key)
            if TAG_MARKED in tags:
                # The pre-suspend hook, in the same patch as the mark: the time a job should have checkpointed by.
                patch[PRE_SUSPEND_ANNOTATION] = tags[TAG_MARKED]
            obj = self._patch_object(ref, lambda _obj: {"metadata": {"annotations": patch}}, kueue=name)
            if TAG_MARKED in tags:
                self._job_event(obj, ref, EVENT_MARKED,
                                f"gpufinops: its GPUs are idle; it will be suspended through Kueue (Workload {name} "
                                f"spec.active: false) at {tags[TAG_MARKED]} unless it becomes active: checkpoint "
                                f"before then ({PRE_SUSPEND_ANNOTATION} on the Workload). To keep it: annotate the "
                                f"Workload {SNOOZE_ANNOTATION}=<ISO time> or {self.protect_key}=true, or remove "
                                f"its {MARK_ANNOTATION}.")
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
        if is_node_id(inst.instance_id):
            self.annotate_node(inst, dict.fromkeys(keys))
            return
        kueue = self._kueue_target(inst)
        if kueue is not None:
            patch = annotation_patch(dict.fromkeys(keys), self.protect_key)
            if TAG_MARKED in keys:
                patch[PRE_SUSPEND_ANNOTATION] = None
            self._patch_object(kueue[0], lambda _obj: {"metadata": {"annotations": patch}}, kueue=kueue[1])
            return
        ref = self._scalable_ref(inst, "annotate", owned_too=True)
        patch = annotation_patch(dict.fromkeys(keys), self.protect_key)
        self._patch_object(ref, lambda _obj: {"metadata": {"annotations": patch}})

    def stop(self, inst: GpuInstance) -> None:
        """Scale to 0, keeping the count replaced, in one patch preconditioned on the resourceVersion read. A
        Kueue-managed Job is suspended instead (`suspend`), a GPU node cordoned (`cordon`)."""
        if is_node_id(inst.instance_id):
            self.cordon(inst)
            return
        kueue = self._kueue_target(inst)
        if kueue is not None:
            self.suspend(*kueue)
            return
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

    def suspend(self, ref: WorkloadRef, kueue: str) -> None:
        """Suspend a Kueue-managed job through Kueue: its Workload `spec.active: false` (Kueue evicts it, its pods
        end, and it is not requeued until set back to true) and gpufinops' SUSPENDED_ANNOTATION, in one patch
        preconditioned on the resourceVersion of the read that found gpufinops' mark still on it: a person who
        removed the mark (or deactivated it) since wins, by a refusal or a 409 and a re-read that no longer finds
        it. Setting the job's own spec.suspend would be undone by Kueue while the Workload is admitted."""
        target = f"{KUEUE_WORKLOADS}.{KUEUE_GROUP} {kueue}"
        done: list[bool] = []

        def build(obj: dict) -> dict | None:
            meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
            annotations = meta.get("annotations") or {}
            if kueue_suspended(obj):
                return None  # already done (a retry after a lost answer)
            if spec.get("active") is False:
                raise KubeChangeError(f"kubernetes: {target} was deactivated by someone else: left alone",
                                      definite=True)
            if MARK_ANNOTATION not in annotations:
                raise KubeChangeError(f"kubernetes: {target}: its {MARK_ANNOTATION} was removed since the warning: "
                                      "not suspended", definite=True)
            owner = controller_of(meta)
            if owner != (ref.kind, ref.name):
                raise KubeChangeError(f"kubernetes: {target} no longer belongs to {ref}: not suspended", definite=True)
            done.append(True)
            stamp = self.clock().astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                 "annotations": {SUSPENDED_ANNOTATION: stamp}},
                    "spec": {"active": False}}

        obj = self._patch_object(ref, build, kueue=kueue)
        if done:
            log.info("%s suspended through Kueue (Workload %s spec.active: false)", ref, kueue)
            self._job_event(obj, ref, EVENT_SUSPENDED,
                            f"gpufinops suspended it through Kueue (Workload {kueue} spec.active: false): its GPUs "
                            f"were idle. `gpufinops k8s restore {ref.namespace}/{ref.kind}/{ref.name}` resumes it.")

    def resumable(self, ref: WorkloadRef) -> tuple[str | None, str]:
        """(its Kueue Workload namespace/name, "") when gpufinops suspended this Kueue job, else (None, why not);
        read without changing anything (dry-run)."""
        if ref.kind not in KUEUE_SUSPEND_KINDS or not self.suspend_kueue:
            return None, (f"kubernetes: only a Kueue-managed job ({', '.join(KUEUE_SUSPEND_KINDS)}) is resumed "
                          f"(kubernetes.suspend_kueue), not {ref}")
        try:
            obj = self._kueue_list(ref.namespace).get(ref)
        except KubeReadFailed as exc:
            return None, str(exc)
        if obj is None:
            return None, f"kubernetes: no Kueue Workload owned by {ref} was found"
        if not kueue_suspended(obj):
            return None, (f"kubernetes: Kueue Workload {kueue_name(obj)} was not suspended by gpufinops (spec.active "
                          f"is not false, or no {SUSPENDED_ANNOTATION}): left alone")
        return kueue_name(obj), ""

    def resume(self, ref: WorkloadRef, who: str = "") -> Restored:
        """Set its Kueue Workload back to `spec.active: true` (Kueue queues it again) and remove gpufinops'
        suspension annotations (a person's snooze or protect stays), in one preconditioned patch."""
        kueue, problem = self.resumable(ref)
        if kueue is None:
            raise KubeChangeError(problem, definite=True)

        def build(obj: dict) -> dict | None:
            meta = obj.get("metadata") or {}
            if not kueue_suspended(obj):
                raise KubeChangeError(f"kubernetes: Kueue Workload {kueue} is not suspended by gpufinops any more: "
                                      "left alone", definite=True)
            annotations = meta.get("annotations") or {}
            return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                 "annotations": {k: None for k in KUEUE_RESTORE_REMOVES if k in annotations}},
                    "spec": {"active": True}}

        obj = self._patch_object(ref, build, kueue=kueue)
        by = f" for {who}" if who else ""
        self._job_event(obj, ref, EVENT_RESUMED, f"gpufinops resumed it{by}: Kueue Workload {kueue} spec.active: "
                                                 "true (Kueue queues it again).")
        return Restored(ref, 0, f"resumed{by}: Kueue Workload {kueue} spec.active: true (Kueue queues it again)")

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
        if ref.kind in KUEUE_SUSPEND_KINDS:
            return self.resume(ref, who)
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

