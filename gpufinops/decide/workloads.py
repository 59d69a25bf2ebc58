"""Verdicts per Kubernetes workload, and GPU nodes no pod used. Pure: no I/O, no clock of its own.

A workload (k8s.model.WorkloadRef) is judged by the very `evaluate()` instances are judged by, over the GPUs of
all its replicas: its subject is a GpuInstance named `namespace/Kind/name` whose GPU count is what its pods
request, and its usage is the pods' GPUs side by side (each named `pod:gpu`). So the same rules hold: IDLE
only when every GPU of every replica meets the rule for the whole window; a pod whose GPU series are missing
leaves GPUs unseen and makes the workload UNKNOWN (the reason names the pod); a replica started within the
window makes it too young to judge. Reasons begin with the workload's name.

Nodes are never stopped: a GPU node that ran no GPU pod for the window is reported with its node group or
NodePool, what to change there, and its cost (`empty_gpu_nodes`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Mapping, Sequence

from ..k8s.model import ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo, WorkloadRef
from ..model import Decision, GpuInstance, InstanceUsage, Rule, Verdict
from .evaluate import evaluate

PodKey = tuple[str, str]
_EPOCH = datetime.min.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class WorkloadDecision:
    ref: WorkloadRef
    decision: Decision  # instance_id is str(ref); the reason starts with it
    pods: tuple[str, ...]
    missing_pods: tuple[str, ...]  # pods with no DCGM series in the window
    gpus: int  # devices requested by its pods (whole GPUs + MIG slices)
    info: WorkloadInfo | None = None

    @property
    def verdict(self) -> Verdict:
        return self.decision.verdict


def workload_subject(ref: WorkloadRef, pods: Sequence[PodInfo], nodes: Mapping[str, NodeInfo],
                     hourly_cost: float | None, info: WorkloadInfo | None = None) -> GpuInstance:
    """The workload as the GpuInstance evaluate() judges: running when every pod runs, as old as its youngest
    replica, its GPUs those its pods request, its tags its own labels (rules select by them)."""
    phases = sorted({p.phase for p in pods})
    node = nodes.get(pods[0].node_name) if pods else None
    return GpuInstance(
        instance_id=str(ref), instance_type=node.instance_type if node else "", region=node.region if node else "",
        state="running" if phases == ["Running"] else "/".join(phases).lower() or "absent",
        launch_time=max((p.started or _EPOCH for p in pods), default=_EPOCH),
        tags=dict(info.labels) if info else {}, gpu_count=sum(p.gpu_devices for p in pods),
        hourly_cost=hourly_cost,
    )


def workload_usage(ref: WorkloadRef, pods: Sequence[PodInfo], by_pod: Mapping[PodKey, InstanceUsage],
                   window_s: int) -> tuple[InstanceUsage, tuple[str, ...]]:
    """The pods' GPUs side by side (`pod:gpu`, a MIG slice `pod:gpu.instance` so that each device counts once)
    and the pods that had none. A failed read of any pod is the workload's error."""
    gpus, missing, expected = [], [], 0
    for pod in pods:
        usage = by_pod.get(pod.key)
        if usage is None:
            return InstanceUsage(str(ref), window_s, expected, (), error="no usage collected"), ()
        if usage.error:
            return InstanceUsage(str(ref), window_s, usage.expected_samples, (), error=usage.error), ()
        expected = usage.expected_samples
        if not usage.gpus:
            missing.append(pod.name)
        gpus.extend(replace(g, gpu=f"{pod.name}:{g.gpu.replace('/', '.')}") for g in usage.gpus)
    return InstanceUsage(str(ref), window_s, expected, tuple(gpus)), tuple(missing)


def judge_workload(ref: WorkloadRef, pods: Sequence[PodInfo], by_pod: Mapping[PodKey, InstanceUsage], rule: Rule,
                   now: datetime, nodes: Mapping[str, NodeInfo], hourly_cost: float | None = None,
                   info: WorkloadInfo | None = None) -> WorkloadDecision:
    """One workload under one rule: evaluate() on its subject and usage, the reason naming the workload (and the
    pods without series)."""
    subject = workload_subject(ref, pods, nodes, hourly_cost, info)
    usage, missing = workload_usage(ref, pods, by_pod, rule.window_s)
    decision = evaluate(subject, usage, rule, now)
    reason = f"{ref}: {decision.reason}"
    if missing:
        reason += (f" (no DCGM series for pod {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}: "
                   "its exporter is down or lacks the Kubernetes mapping; not judged idle)")
    return WorkloadDecision(ref, replace(decision, reason=reason), tuple(p.name for p in pods), missing,
                            subject.gpu_count, info)


def judge_workloads(snapshot: ClusterSnapshot, by_pod: Mapping[PodKey, InstanceUsage], rules: Sequence[Rule],
                    now: datetime, pod_costs: Mapping[PodKey, float | None] | None = None) -> list[WorkloadDecision]:
    """Every (workload holding GPUs, matching rule) pair, workloads in name order, rules in rule order. A
    workload's $/h is its pods' (None when any pod's node has no known price)."""
    pod_costs = pod_costs or {}
    nodes = {n.name: n for n in snapshot.nodes}
    out = []
    for ref in snapshot.workload_refs():
        pods = snapshot.pods_of(ref)
        costs = [pod_costs.get(p.key) for p in pods]
        hourly = None if not costs or any(c is None for c in costs) else sum(costs)
        info = snapshot.workloads.get(ref)
        for rule in rules:
            if rule.selector.matches(workload_subject(ref, pods, nodes, hourly, info)):
                out.append(judge_workload(ref, pods, by_pod, rule, now, nodes, hourly, info))
    return out


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class NodeFinding:
    node: NodeInfo
    group: str  # "Karpenter NodePool 'gpu'", "EKS node group 'ml-a100'", or "" when no label says
    hourly_cost: float | None
    confirmed: bool  # the node's DCGM series cover the window and name no GPU pod; False: no GPU pod now only
    reason: str
    advice: str


def scale_down_advice(node: NodeInfo, group_kind: str, group_name: str) -> str:
    """What to change so that an empty GPU node goes away: gpufinops never stops a Kubernetes node."""
    if group_kind.startswith("Karpenter"):
        return (f"let Karpenter consolidate it: on {group_kind} '{group_name}' set spec.disruption."
                "consolidationPolicy: WhenEmptyOrUnderutilized (or WhenEmpty) with a short consolidateAfter "
                "(e.g. 5m), and check that no pod on it has karpenter.sh/do-not-disrupt")
    if group_kind:
        return (f"let the cluster autoscaler scale {group_kind} '{group_name}' down: allow a minimum size of 0, "
                "check --scale-down-unneeded-time (default 10m) and that no pod blocks eviction "
                "(cluster-autoscaler.kubernetes.io/safe-to-evict: \"false\", local storage, a PodDisruptionBudget)")
    return ("no node group or NodePool label: if an autoscaler manages it, let it scale the node down; "
            "otherwise cordon, drain and remove it from its group")


def empty_gpu_nodes(snapshot: ClusterSnapshot, nodes_with_pod_series: frozenset[str],
                    nodes_with_series: frozenset[str], window_s: int, now: datetime,
                    node_costs: Mapping[str, float | None], group_of) -> list[NodeFinding]:
    """GPU nodes older than the window with no GPU pod now and, where their series say so, none in the window.
    `group_of(labels) -> (kind, name)` names the node's group (collect.kubernetes.node_group_of)."""
    busy_now = {p.node_name for p in snapshot.gpu_pods if p.holds_gpus}
    out = []
    for node in snapshot.nodes:
        if node.name in busy_now or node.instance_id in nodes_with_pod_series:
            continue
        if (now - node.created).total_seconds() < window_s:
            continue
        kind, name = group_of(node.labels)
        group = f"{kind} '{name}'" if kind else ""
        cost = node_costs.get(node.name)
        confirmed = node.instance_id in nodes_with_series
        price = f"${cost:,.2f}/h" if cost is not None else "an unknown price"
        span = (f"ran no GPU pod for the last {window_s // 60} min" if confirmed else
                "has no GPU pod now (its DCGM series do not cover the window to say more)")
        reason = (f"GPU node {node.name} ({node.instance_type or 'unknown type'}, {node.gpu_devices} GPU devices"
                  f"{', ' + group if group else ''}) {span}: {price} for idle GPUs")
        out.append(NodeFinding(node, group, cost, confirmed, reason, scale_down_advice(node, kind, name)))
    return out
