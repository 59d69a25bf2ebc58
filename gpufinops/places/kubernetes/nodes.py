"""Kubernetes GPU nodes as a place's subjects (action: drain).

A GPU node whose GPU work is gone (decide.workloads.empty_gpu_nodes) is a GpuInstance `k8s:node/<name>` tagged
`k8s:node` = its name, so that a rule selects nodes and the act stage marks, warns and, after the lead, "stops" it
like anything else: here a stop is a cordon (`spec.unschedulable: true` and CORDONED_ANNOTATION in one PATCH
preconditioned on the resourceVersion of the read that still found the mark, no GPU pod on it and nothing that
forbids it). Karpenter or cluster-autoscaler then removes the node, honouring PodDisruptionBudgets as they always
do: gpufinops never evicts a pod and never deletes a node.

`NodeCloudMixin` is WorkloadCloud's node half. It never imports `cloud`: the calls it makes through the cloud it is
mixed into (`_request`, `_read_build_patch`, `api`, `clock`, `protect_key`, `node_costs`, `last_snapshot`) are
that class's, so the nodes read on their own and the workloads build on them.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import timezone
from typing import Any, Callable, Iterable, Mapping

from gpufinops.decide.workloads import drain_refusal
from gpufinops.k8s.model import (
    CORDONED_ANNOTATION,
    DEFAULT_PROTECT_KEY,
    MARK_ANNOTATION,
    NODE_CORDONED_BY_OTHERS,
    NODE_ID_PREFIX,
    SNOOZE_ANNOTATION,
    TAG_NODE,
    ClusterSnapshot,
    NodeInfo,
    WorkloadRef,
)
from gpufinops.model import TAG_MARKED, TAG_PROTECT, GpuInstance
from gpufinops.places.kubernetes.names import (
    ANNOTATION_OF,
    EVENT_CORDONED,
    EVENT_MARKED,
    EVENT_UNCORDONED,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    MAX_ID_LEN,
    NODE_RESTORE_REMOVES,
    KubeChangeError,
    KubeReadFailed,
    Restored,
    annotation_patch,
    event_body,
    not_truthy,
)

# The same logger as the workloads' (places.kubernetes.cloud): one name for everything the cluster's client says.
log = logging.getLogger("gpufinops.kubernetes")

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


def node_gpu_fields(node: NodeInfo | None) -> tuple[str, float]:
    """(GPU model, GiB per GPU) from GPU feature discovery's node labels; ("", 0.0) when absent."""
    labels = node.labels if node else {}
    try:
        memory = float(labels.get(GPU_MEMORY_LABEL, "0")) / 1024
    except ValueError:
        memory = 0.0
    return labels.get(GPU_PRODUCT_LABEL, ""), memory


def node_id(name: str) -> str:
    """`k8s:node/<name>`; cut to 64 characters ending in `~<sha1 10>` when longer (resolved through a listing)."""
    full = f"{NODE_ID_PREFIX}{name}"
    if len(full) <= MAX_ID_LEN:
        return full
    return f"{full[:MAX_ID_LEN - 11]}~{hashlib.sha1(full.encode()).hexdigest()[:10]}"


def is_node_id(instance_id: str) -> bool:
    return instance_id.startswith(NODE_ID_PREFIX)


def cordoned_by_gpufinops(node: NodeInfo) -> bool:
    """Cordoned *and* gpufinops' annotation, written in the same patch: a cordon someone else made is theirs."""
    return node.unschedulable and CORDONED_ANNOTATION in node.annotations


def node_instance(node: NodeInfo, hourly_cost: float | None, *, drain_nodes: bool = False,
                  protect_key: str = DEFAULT_PROTECT_KEY) -> GpuInstance:
    """The node as a GpuInstance for the act stage. `managed_by` says why it may not be cordoned (drain off,
    karpenter.sh/do-not-disrupt, an EKS managed node group, no autoscaler), so stop_blocker keeps it notify-only
    with that advice. State: "stopped" once gpufinops cordoned it, "cordoned" when someone else did (not judged:
    not gpufinops' to act on), else "running"."""
    tags = {**node.labels, **node.annotations}
    for tag, annotation in ANNOTATION_OF.items():
        tags.pop(annotation, None)
        if annotation in node.annotations:
            tags[tag] = node.annotations[annotation]
    tags.pop(protect_key, None)
    protect = node.annotations.get(protect_key, node.labels.get(protect_key))
    if not not_truthy(protect):
        tags[TAG_PROTECT] = str(protect)
    tags[TAG_NODE] = node.name
    refusal = drain_refusal(node)
    # The advice on what to change is in the verdict's reason (decide.workloads.node_decision): said once.
    if refusal:
        managed_by, advice = "Kubernetes (a node gpufinops may not cordon)", refusal
    elif not drain_nodes:
        managed_by, advice = ("Kubernetes (gpufinops' node drain is off)",
                              "warned and reported only; set kubernetes.drain_nodes: true to let gpufinops cordon it")
    else:
        managed_by, advice = "", ""
    model, memory = node_gpu_fields(node)
    state = ("stopped" if cordoned_by_gpufinops(node) else NODE_CORDONED_BY_OTHERS if node.unschedulable
             else "running")
    return GpuInstance(
        instance_id=node_id(node.name), instance_type=node.instance_type, region=node.region, state=state,
        launch_time=node.created, lifecycle=node.lifecycle, tags=tags, private_dns=node.name,
        gpu_count=node.gpu_count, gpu_model=model, gpu_memory_gib=memory, hourly_cost=hourly_cost,
        provider="kubernetes", managed_by=managed_by, managed_advice=advice,
    )


def gpu_pods_on(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """namespace/name of the listed pods that hold GPUs (requested, or DRA claims used: any claim may hold a GPU,
    and a node is never cordoned under one; not finished)."""
    from gpufinops.places.kubernetes.cluster import may_hold_gpus

    out = []
    for obj in pods:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        if may_hold_gpus(obj) and status.get("phase") not in ("Succeeded", "Failed"):
            out.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return out


class NodeCloudMixin:
    """WorkloadCloud's GPU-node half: listing nodes as instances, and the mark / cordon / uncordon calls."""

    drain_nodes: bool = False

    def list_nodes(self) -> list[GpuInstance]:
        """The GPU nodes of the last listing (list_workloads) as instances, priced at their full node cost."""
        snap = self.last_snapshot
        if snap is None:
            return []
        out = [node_instance(n, self.node_costs.get(n.name), drain_nodes=self.drain_nodes,
                             protect_key=self.protect_key) for n in snap.nodes]
        self._node_names.update({node_id(n.name): n.name for n in snap.nodes})
        return out

    def node_name_of(self, instance_id: str) -> str | None:
        if not is_node_id(instance_id):
            return None
        name = instance_id[len(NODE_ID_PREFIX):]
        return self._node_names.get(instance_id) or (name if "~" not in name else None)

    def _node_get(self, name: str) -> dict | None:
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        return self._request("get", f"nodes/{name}", lambda **kw: core.read_node(name, **kw), read=True)

    def _pods_on_node(self, name: str) -> list[str]:
        """The GPU pods on a node now (one list, server-side field selector). KubeReadFailed when not answered."""
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        answer = self._request("list", f"pods on node {name}", lambda **kw: core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={name}", **kw), read=True)
        return gpu_pods_on((answer or {}).get("items") or [])

    def describe_node(self, instance_id: str) -> GpuInstance | None:
        """The node read fresh (None: gone). KubeReadFailed when it cannot be read (never taken for gone)."""
        from gpufinops.places.kubernetes.cluster import parse_node

        name = self.node_name_of(instance_id)
        if name is None:
            raise KubeReadFailed(f"kubernetes: {instance_id!r} names no node gpufinops can read")
        obj = self._node_get(name)
        if obj is None:
            return None
        node = parse_node(obj)
        return node_instance(node, self.node_costs.get(name), drain_nodes=self.drain_nodes,
                             protect_key=self.protect_key)

    def _patch_node(self, name: str, build: Callable[[dict], dict | None]) -> dict:
        """Read the node, PATCH what `build(obj)` returns (None: nothing to do), once more after a re-read on a
        409 Conflict (a resourceVersion precondition that failed)."""
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        return self._read_build_patch(f"nodes/{name}", lambda: self._node_get(name), build,
                                      lambda body, **kw: core.patch_node(name, body, **kw))

    def _node_event(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """An Event on the node (`kubectl describe node` shows it; node Events live in namespace default)."""
        from kubernetes import client

        body = event_body({**obj, "metadata": {**(obj.get("metadata") or {}), "namespace": "default"}}, reason,
                          message, self.clock(), "Node")
        body["involvedObject"]["namespace"] = ""
        try:
            self._request("create", "events in default", lambda **kw: client.CoreV1Api(
                self.api).create_namespaced_event("default", body, **kw))
        except KubeChangeError as exc:
            log.warning("node %s: the %s Event was not created: %s", (obj.get("metadata") or {}).get("name"),
                        reason, exc)

    def annotate_node(self, inst: GpuInstance, tags: Mapping[str, str | None]) -> None:
        name = self.node_name_of(inst.instance_id)
        if name is None:
            raise KubeChangeError(f"kubernetes: {inst.instance_id!r} names no node", definite=True)
        patch = annotation_patch(tags, self.protect_key)
        wrote: list[bool] = []

        def build(obj: dict) -> dict | None:
            # Preconditioned on the resourceVersion read, like every other node write: a node changed in between
            # (a person's cordon, another replica's write) is re-read once. Nothing to write (an annotation to
            # remove that is gone already: a retry after a lost answer) is no PATCH at all.
            meta = obj.get("metadata") or {}
            annotations = meta.get("annotations") or {}
            if all(annotations.get(k) == v for k, v in patch.items()):
                return None
            wrote.append(True)
            return {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": patch}}

        obj = self._patch_node(name, build)
        if wrote and tags.get(TAG_MARKED):
            self._node_event(obj, EVENT_MARKED,
                             f"gpufinops: no GPU pod has run on this GPU node for the rule's window; it will be "
                             f"cordoned at {tags[TAG_MARKED]} (Karpenter / cluster-autoscaler then remove it) unless "
                             f"a GPU pod lands on it. To keep it: annotate {SNOOZE_ANNOTATION}=<ISO time> or "
                             f"{self.protect_key}=true, or remove its {MARK_ANNOTATION}.")

    def cordon(self, inst: GpuInstance) -> None:
        """`spec.unschedulable: true` and CORDONED_ANNOTATION in one patch preconditioned on the resourceVersion of
        the read that found, right before it: gpufinops' mark still on the node, nothing forbidding a cordon
        (drain_refusal), no cordon by someone else, and no GPU pod on it (listed after that read). A person who
        removes the mark, or a GPU pod scheduled onto it, wins; a change to the node in between is a 409 and a
        re-read that checks all of it again."""
        from gpufinops.places.kubernetes.cluster import parse_node

        name = self.node_name_of(inst.instance_id)
        if name is None:
            raise KubeChangeError(f"kubernetes: {inst.instance_id!r} names no node", definite=True)
        if not self.drain_nodes:
            raise KubeChangeError(f"kubernetes: node {name}: kubernetes.drain_nodes is off: not cordoned",
                                  definite=True)
        done: list[bool] = []

        def build(obj: dict) -> dict | None:
            node = parse_node(obj)
            if cordoned_by_gpufinops(node):
                return None  # already done (a retry after a lost answer)
            if node.unschedulable:
                raise KubeChangeError(f"kubernetes: node {name} was cordoned by someone else: left alone",
                                      definite=True)
            if MARK_ANNOTATION not in node.annotations:
                raise KubeChangeError(f"kubernetes: node {name}: its {MARK_ANNOTATION} was removed since the "
                                      "warning: not cordoned", definite=True)
            refusal = drain_refusal(node)
            if refusal:
                raise KubeChangeError(f"kubernetes: node {name}: not cordoned: {refusal}", definite=True)
            try:
                pods = self._pods_on_node(name)
            except KubeReadFailed as exc:
                raise KubeChangeError(f"kubernetes: node {name}: its pods could not be read just before the cordon "
                                      f"({exc}): not cordoned", definite=True) from None
            if pods:
                raise KubeChangeError(f"kubernetes: node {name}: a GPU pod was scheduled onto it since the warning "
                                      f"({', '.join(pods[:3])}): not cordoned", definite=True)
            done.append(True)
            stamp = self.clock().astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            return {"metadata": {"resourceVersion": node.resource_version,
                                 "annotations": {CORDONED_ANNOTATION: stamp}},
                    "spec": {"unschedulable": True}}

        obj = self._patch_node(name, build)
        if done:
            log.info("node %s cordoned: no GPU pod for the rule's window", name)
            self._node_event(obj, EVENT_CORDONED,
                             "gpufinops cordoned it: no GPU pod ran on it for the rule's window. Karpenter / "
                             "cluster-autoscaler can remove it by their own rules, honouring PodDisruptionBudgets. "
                             "`gpufinops k8s restore "
                             f"node/{name}` uncordons it.")

    def uncordon(self, name: str, who: str = "") -> Restored:
        """Undo gpufinops' cordon: `spec.unschedulable: false` and its annotations removed, in one preconditioned
        patch; a node cordoned by someone else (no CORDONED_ANNOTATION) is left alone."""

        def build(obj: dict) -> dict | None:
            meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
            annotations = meta.get("annotations") or {}
            if spec.get("unschedulable") is not True or CORDONED_ANNOTATION not in annotations:
                raise KubeChangeError(f"kubernetes: node {name} is not cordoned by gpufinops (no "
                                      f"{CORDONED_ANNOTATION} on a cordoned node): left alone", definite=True)
            return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                 "annotations": {k: None for k in NODE_RESTORE_REMOVES if k in annotations}},
                    "spec": {"unschedulable": False}}

        obj = self._patch_node(name, build)
        by = f" for {who}" if who else ""
        self._node_event(obj, EVENT_UNCORDONED, f"gpufinops uncordoned it{by}.")
        return Restored(WorkloadRef("", "Node", name), 0, f"node {name} uncordoned{by}")

