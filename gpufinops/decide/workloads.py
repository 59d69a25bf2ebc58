"""Verdicts per Kubernetes workload, and GPU nodes no pod used. Pure: no I/O, no clock of its own.

A workload (k8s.model.WorkloadRef) is judged by the very `evaluate()` instances are judged by, over the GPUs of
all its replicas: its subject is a GpuInstance named `namespace/Kind/name` whose GPU count is what its pods
request, and its usage is the pods' GPUs side by side (each named `pod:gpu`). So the same rules hold: IDLE
only when every GPU of every replica meets the rule for the whole window; a pod whose GPU series are missing
leaves GPUs unseen and makes the workload UNKNOWN (the reason names the pod); a replica started within the
window makes it too young to judge. Reasons begin with the workload's name.

GPU nodes whose GPU work is gone (`empty_gpu_nodes`): a GPU node on which no read found a GPU pod for the whole
window (`watch_gpu_free` keeps since when, tick by tick) is reported with its cost, its node group or NodePool and
what to change there; a node seen for less than the window, or not read, is UNKNOWN, never empty. A rule with
`action: drain` (kubernetes.drain_nodes) cordons one through the act stage, unless `drain_refusal` says why not;
gpufinops never evicts a pod or deletes a node (docs/kubernetes.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Mapping, Sequence

from ..k8s.model import (
    DO_NOT_DISRUPT_ANNOTATION, EKS_NODEGROUP_LABEL, ClusterSnapshot, NodeInfo, PodInfo, WorkloadRef, node_group_of,
)
from ..model import Decision, InstanceUsage, ReasonCode, Rule, Verdict, format_duration, format_money

PodKey = tuple[str, str]
_EPOCH = datetime.min.replace(tzinfo=timezone.utc)


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


# --------------------------------------------------------------------------- nodes
#
# "No GPU pod for the rule's window" needs history a single listing does not have: a GPU pod may have run and
# finished between two reads. So the service keeps, per GPU node, since when its reads found no GPU pod on it
# (`NodeWatch`, stepped once per tick by `watch_gpu_free`); a node is judged empty only when that time covers the
# whole window. What was not seen (the first read, a gap between reads, a failed read) is never taken for empty.


@dataclass(frozen=True)
class NodeWatch:
    """What the reads so far saw of one GPU node: since when none found a GPU pod on it (None: the last one did),
    and the last read that listed it."""

    free_since: datetime | None
    last_seen: datetime


def still_free(prev: Mapping[str, NodeWatch], snapshot: ClusterSnapshot, max_gap_s: float) -> list[str]:
    """Pure: the nodes this read finds without a GPU pod whose free time would carry on from the last read: the
    ones whose finished pods must be read (`watch_gpu_free`'s `work_ended`) before that time can be believed."""
    at = snapshot.read_at
    return [node.name for node in snapshot.nodes
            if not snapshot.pods_on(node.name) and _continues(prev.get(node.name), node, at, max_gap_s)]


def _continues(before: NodeWatch | None, node: NodeInfo, at: datetime, max_gap_s: float) -> bool:
    return (before is not None and before.free_since is not None and node.created <= before.last_seen
            and 0 <= (at - before.last_seen).total_seconds() <= max_gap_s)


def watch_gpu_free(prev: Mapping[str, NodeWatch], snapshot: ClusterSnapshot, max_gap_s: float,
                   work_ended: Mapping[str, datetime | None] | None = None) -> dict[str, NodeWatch]:
    """Pure: the watch after one more read. A node seen free for the first time, again after reads more than
    `max_gap_s` apart, or recreated under the same name since the last read, counts as free from this read only
    (the time before was not seen). `work_ended`: for the nodes `still_free` named, when the last finished GPU pod
    on each ended (None: a finished GPU pod without an end time): a pod that started and finished between two
    reads moves the free time to its end, or to this read when its end is unknown. A node gone from the listing
    is dropped; a failed read steps nothing (the caller keeps `prev`)."""
    at = snapshot.read_at
    ended = work_ended or {}
    out: dict[str, NodeWatch] = {}
    for node in snapshot.nodes:
        before = prev.get(node.name)
        if snapshot.pods_on(node.name):
            out[node.name] = NodeWatch(None, at)
        elif _continues(before, node, at, max_gap_s):
            free_since = before.free_since
            if node.name in ended:
                last_work = ended[node.name] or at
                free_since = max(free_since, min(last_work, at))
            out[node.name] = NodeWatch(free_since, at)
        else:
            out[node.name] = NodeWatch(at, at)
    return out


def watch_to_json(watch: Mapping[str, NodeWatch]) -> str:
    return json.dumps({name: [w.free_since.isoformat() if w.free_since else None, w.last_seen.isoformat()]
                       for name, w in sorted(watch.items())})


def watch_from_json(text: str | None) -> dict[str, NodeWatch]:
    """The stored watch; {} when absent or unreadable (every node then counts as free from the next read only)."""
    try:
        raw = json.loads(text or "{}")
        return {str(name): NodeWatch(datetime.fromisoformat(free) if free else None, datetime.fromisoformat(seen))
                for name, (free, seen) in raw.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


@dataclass(frozen=True)
class NodeVerdict:
    """One GPU node judged for GPU work. IDLE: no GPU pod on it for the whole window (the node is empty of GPU
    work); ACTIVE: GPU pods on it now; UNKNOWN: not seen free long enough, or not read (`reason` says which)."""

    node: str
    verdict: Verdict
    reason: str
    advice: str = ""
    instance_id: str = ""
    instance_type: str = ""
    gpus: int = 0
    group_kind: str = ""  # "Karpenter NodePool", "EKS node group", ... ("" when no known label names one)
    group: str = ""
    usd_per_hour: float | None = None
    free_since: datetime | None = None
    drain_refusal: str = ""  # why gpufinops would not cordon it ("" when `action: drain` may)


def node_group(node: NodeInfo) -> tuple[str, str]:
    """(kind in words, name) of the group that manages a node, ("", "") when no known label says."""
    return node_group_of(node.labels)


def drain_refusal(node: NodeInfo) -> str:
    """Why gpufinops must not cordon this node; "" when `action: drain` may. Cordoning only helps where something
    removes the node once nothing new lands on it: Karpenter, or cluster-autoscaler in a self-managed group."""
    if str(node.annotations.get(DO_NOT_DISRUPT_ANNOTATION, "")).strip().lower() == "true":
        return (f"it carries {DO_NOT_DISRUPT_ANNOTATION}=true (someone asked that it not be disrupted): notify only; "
                f"remove that annotation if the node is not needed")
    if node.labels.get(EKS_NODEGROUP_LABEL):
        return (f"EKS managed node group '{node.labels[EKS_NODEGROUP_LABEL]}' owns its nodes' scale-down: notify "
                f"only; set the node group's desired size (and its minimum, if it is at it) lower instead")
    kind, _name = node_group(node)
    if not kind:
        return ("no Karpenter NodePool or autoscaled node group label: nothing would remove the node after a cordon; "
                "notify only")
    return ""


def node_advice(node: NodeInfo) -> str:
    """What to change so that the node goes, in words (true of what its labels and annotations say)."""
    refusal = drain_refusal(node)
    if DO_NOT_DISRUPT_ANNOTATION in refusal:
        return (f"Karpenter will not remove it while it carries {DO_NOT_DISRUPT_ANNOTATION}=true: remove the "
                f"annotation (or delete the node) if nobody needs it")
    kind, name = node_group(node)
    if node.labels.get(EKS_NODEGROUP_LABEL):
        return (f"set EKS managed node group '{name}''s desired size lower (and its minimum, if it is at it); "
                f"cluster-autoscaler scales a group down only above its minimum")
    if kind.startswith("Karpenter"):
        return (f"Karpenter {kind.split()[-1]} '{name}' removes an empty node as its disruption settings allow; if "
                f"it stays, pods still on it or those settings (consolidateAfter, budgets) hold it")
    if kind:
        return (f"set {kind} '{name}''s minimum/desired size lower; cluster-autoscaler removes an unneeded node only "
                f"above the group's minimum")
    return "no node group label: drain it and delete the node and its instance if nobody needs it"


def empty_gpu_nodes(snapshot: ClusterSnapshot | None, watch: Mapping[str, NodeWatch], window_s: int,
                    node_costs: Mapping[str, float | None], read_error: str = "") -> tuple[NodeVerdict, ...]:
    """Pure: every GPU node judged for GPU work over `window_s`, by name. `snapshot` None (the cluster could not
    be read, `read_error` says why): every node the watch knows is UNKNOWN, never empty. Reasons begin with the
    node's name."""
    if snapshot is None:
        why = read_error or "the cluster was not read"
        return tuple(NodeVerdict(name, Verdict.UNKNOWN, f"node {name}: not judged: {why}")
                     for name in sorted(watch))
    out = []
    for node in snapshot.nodes:
        kind, group = node_group(node)
        cost = node_costs.get(node.name)
        base = dict(instance_id=node.instance_id, instance_type=node.instance_type, gpus=node.gpu_count,
                    group_kind=kind, group=group, usd_per_hour=cost, drain_refusal=drain_refusal(node))
        pods = snapshot.pods_on(node.name)
        if pods:
            names = ", ".join(f"{p.namespace}/{p.name}" for p in pods[:3]) + (" ..." if len(pods) > 3 else "")
            out.append(NodeVerdict(node.name, Verdict.ACTIVE, f"node {node.name}: {len(pods)} GPU pod(s) on it "
                                                              f"({names})", **base))
            continue
        seen = watch.get(node.name)
        free_since = seen.free_since if seen else None
        if free_since is None:
            out.append(NodeVerdict(node.name, Verdict.UNKNOWN, f"node {node.name}: no GPU pod at this read, none "
                                   "watched before: not judged yet", **base))
            continue
        free_s = (snapshot.read_at - free_since).total_seconds()
        price = format_money(cost, per="h")
        where = f"{kind} '{group}'" if kind else "no node group"
        if free_s < window_s:
            out.append(NodeVerdict(node.name, Verdict.UNKNOWN,
                                   f"node {node.name}: no GPU pod for {format_duration(free_s)} (seen since "
                                   f"{free_since:%Y-%m-%d %H:%M} UTC), under the rule's {format_duration(window_s)}",
                                   free_since=free_since, **base))
            continue
        # Short: notices clip a reason at 300 characters, and the advice follows it (node_decision).
        out.append(NodeVerdict(node.name, Verdict.IDLE,
                               f"node {node.name} ({node.gpu_count} GPUs, {where}, {price}) has run no GPU pod for "
                               f"{format_duration(free_s)} (since {free_since:%H:%M} UTC)",
                               node_advice(node), free_since=free_since, **base))
    return tuple(out)


def node_decision(verdict: NodeVerdict, instance_id: str, rule: Rule, now: datetime) -> Decision:
    """A node's verdict as the rule's Decision, for the act stage (instance id: the node's, `k8s:node/<name>`).
    A failed read is QUERY_ERROR (missing data: alerted, never acted on); a node not watched free for the whole
    window is UNKNOWN but no outage; the advice rides in the reason, so every notice says what to change."""
    if verdict.verdict == Verdict.IDLE:
        code = ReasonCode.NODE_WITHOUT_GPU_PODS
    elif verdict.verdict == Verdict.ACTIVE:
        code = ReasonCode.NODE_HAS_GPU_PODS
    elif verdict.instance_id:  # listed: seen, just not free for long enough
        code = ReasonCode.NODE_NOT_WATCHED_LONG_ENOUGH
    else:
        code = ReasonCode.QUERY_ERROR
    reason = f"{verdict.reason}; {verdict.advice}" if verdict.advice else verdict.reason
    return Decision(instance_id, rule.name, verdict.verdict, code, reason, now, action=rule.action,
                    window_s=rule.window_s, hourly_cost=verdict.usd_per_hour)
