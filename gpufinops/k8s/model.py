"""Kubernetes types shared by collect, decide and costs. No I/O here.

A *workload* is what a person scales: the top controller of a pod (Deployment through its ReplicaSet,
StatefulSet, Job or the CronJob above it, a custom resource such as a Kubeflow Notebook) or the pod itself
when nothing owns it. Its GPUs are those its pods request (all replicas).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Mapping

# The annotations gpufinops writes on a workload it marks and scales (collect.kubernetes_cloud), and the ones a
# person sets to keep it (named in the Slack warning, notify.messages).
MARK_ANNOTATION = "gpufinops.io/marked-for-scale-down"
SNOOZE_ANNOTATION = "gpufinops.io/snooze-until"
REPLICAS_BEFORE_ANNOTATION = "gpufinops.io/replicas-before-scale-down"
DEFAULT_PROTECT_KEY = "gpufinops.io/protect"  # kubernetes.protect_key's default

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# A full GPU counts as 7 compute slices (A100/H100 MIG geometry): a `mig-3g.40gb` request is 3/7 of a GPU
# when a node offers both, and a node offering only one kind divides by that kind alone.
FULL_GPU_SLICES = 7
_MIG_SLICES = re.compile(r"^nvidia\.com/mig-(\d+)g\.")
# Kinds that are reported, never scaled: they finish on their own (the scale-to-zero step reads this).
RUN_TO_COMPLETION_KINDS = ("Job", "CronJob", "Pod")


def is_gpu_resource(name: str) -> bool:
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def gpu_slices(resource: str, count: int) -> int:
    """How much of the node's GPU capacity `count` devices of `resource` are, in compute slices."""
    if resource == GPU_RESOURCE:
        return count * FULL_GPU_SLICES
    match = _MIG_SLICES.match(resource)
    return count * (int(match.group(1)) if match else 1)


def devices(resources: Mapping[str, int]) -> int:
    """GPU devices (whole GPUs plus MIG slices) in a resource map."""
    return sum(n for name, n in resources.items() if is_gpu_resource(name))


def slices(resources: Mapping[str, int]) -> int:
    return sum(gpu_slices(name, n) for name, n in resources.items() if is_gpu_resource(name))


@dataclass(frozen=True, order=True)
class WorkloadRef:
    namespace: str
    kind: str  # Deployment | StatefulSet | Job | CronJob | Pod | a custom resource kind (e.g. Notebook)
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"

    @property
    def scalable(self) -> bool:
        """A Deployment or StatefulSet: the only kinds the scale subresource is used on."""
        return self.kind in ("Deployment", "StatefulSet")


@dataclass(frozen=True)
class NodeInfo:
    name: str
    instance_id: str  # from spec.providerID (aws:///zone/i-...), else the hostname
    provider_id: str
    instance_type: str  # node.kubernetes.io/instance-type
    region: str
    zone: str
    created: datetime
    capacity: Mapping[str, int]  # GPU resources only: nvidia.com/gpu, nvidia.com/mig-*
    labels: Mapping[str, str] = field(default_factory=dict)
    hostname: str = ""  # kubernetes.io/hostname, else status.addresses Hostname
    internal_ip: str = ""
    lifecycle: str = "on-demand"  # on-demand | spot (Karpenter / EKS capacity type labels)

    @property
    def gpu_devices(self) -> int:
        return devices(self.capacity)

    @property
    def is_gpu_node(self) -> bool:
        return self.gpu_devices > 0


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    node_name: str  # "" while Pending
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    started: datetime | None  # status.startTime
    gpu_requests: Mapping[str, int]  # effective per pod: sum of containers, or the largest init container
    workload: WorkloadRef
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    priority_class: str = ""  # spec.priorityClassName ("" = none: the cluster's default priority)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def gpu_devices(self) -> int:
        return devices(self.gpu_requests)

    @property
    def holds_gpus(self) -> bool:
        """Requests GPUs and holds them now: scheduled and neither finished nor failed."""
        return self.gpu_devices > 0 and bool(self.node_name) and self.phase not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class WorkloadInfo:
    """The top owner object as listed (labels/annotations carry owner, team, protect and snooze)."""

    ref: WorkloadRef
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    replicas: int | None = None  # spec.replicas of a Deployment/StatefulSet; None for others
    resource_version: str = ""


@dataclass(frozen=True)
class ClusterSnapshot:
    """What the API server said at `read_at`: GPU nodes, every pod that requests GPUs, their workloads."""

    read_at: datetime
    nodes: tuple[NodeInfo, ...]
    gpu_pods: tuple[PodInfo, ...]
    workloads: Mapping[WorkloadRef, WorkloadInfo]
    namespace_labels: Mapping[str, Mapping[str, str]]
    # (namespace, name) of every listed pod that requests no GPU (the dcgm-exporter among them): a DCGM series
    # naming one of these is not a GPU workload's (Prometheus' honor_labels: false gives the exporter's own pod).
    other_pods: frozenset[tuple[str, str]] = frozenset()
    server: str = ""  # host:port, for reasons
    # Namespaces the settings leave out (kubernetes.namespaces / exclude / selector): their pods' GPUs still
    # count in their nodes' cost shares (they are not idle capacity), but their workloads are not judged.
    out_of_scope: frozenset[str] = frozenset()

    @cached_property
    def _nodes_by_name(self) -> dict[str, NodeInfo]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def _holding_by_workload(self) -> dict[WorkloadRef, tuple[PodInfo, ...]]:
        out: dict[WorkloadRef, list[PodInfo]] = {}
        for p in self.gpu_pods:
            if p.holds_gpus:
                out.setdefault(p.workload, []).append(p)
        return {ref: tuple(pods) for ref, pods in out.items()}

    @cached_property
    def _holding_by_node(self) -> dict[str, tuple[PodInfo, ...]]:
        out: dict[str, list[PodInfo]] = {}
        for p in self.gpu_pods:
            if p.holds_gpus:
                out.setdefault(p.node_name, []).append(p)
        return {name: tuple(pods) for name, pods in out.items()}

    def node(self, name: str) -> NodeInfo | None:
        return self._nodes_by_name.get(name)

    def pods_of(self, ref: WorkloadRef) -> tuple[PodInfo, ...]:
        """The workload's pods that hold GPUs now (all replicas)."""
        return self._holding_by_workload.get(ref, ())

    def pods_on(self, node_name: str) -> tuple[PodInfo, ...]:
        """The pods holding GPUs of a node now, whatever their namespace."""
        return self._holding_by_node.get(node_name, ())

    def workload_refs(self) -> tuple[WorkloadRef, ...]:
        """The workloads to judge: holding GPUs now, in a namespace the settings keep."""
        return tuple(sorted(r for r in self._holding_by_workload if r.namespace not in self.out_of_scope))
