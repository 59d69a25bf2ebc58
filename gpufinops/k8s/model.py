"""Kubernetes types shared by collect, decide and costs. No I/O here.

A *workload* is what a person scales: the top controller of a pod (Deployment through its ReplicaSet,
StatefulSet, Job or the CronJob or JobSet above it, a RayJob through its RayCluster, a custom resource such as a
Kubeflow Notebook or PyTorchJob) or the pod itself when nothing owns it. Its GPUs are those its pods request
(all replicas).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from functools import cached_property
from typing import Iterable, Mapping

from . import tags as _tags

# The annotations gpufinops writes on a workload it marks and scales (places.kubernetes.cloud), and the ones a
# person sets to keep it (named in the Slack warning, notify.messages).
MARK_ANNOTATION = "gpufinops.io/marked-for-scale-down"
SNOOZE_ANNOTATION = "gpufinops.io/snooze-until"
REPLICAS_BEFORE_ANNOTATION = "gpufinops.io/replicas-before-scale-down"
DEFAULT_PROTECT_KEY = "gpufinops.io/protect"  # kubernetes.protect_key's default

# Kueue (docs/kubernetes.md, "Kueue: suspend, don't kill"). Kueue owns a Job's spec.suspend while its Workload is
# admitted (it would unsuspend a Job suspended behind its back); its documented stop is the Workload's
# `spec.active: false` ("evicted and not requeued" until set back to true: kueue.sigs.k8s.io/docs/concepts/workload).
KUEUE_QUEUE_LABEL = _tags.KUEUE_QUEUE_LABEL  # the names rules select by live in k8s.tags (a leaf the registry reads)
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # the Job's WorkloadPriorityClass
# Tags of a Kueue-managed Job gpufinops may suspend: its Workload (namespace/name), and the Workload's
# WorkloadPriorityClass, for rules (`tags: {"k8s:workload-priority-class": [batch-low]}`).
TAG_KUEUE_WORKLOAD = _tags.TAG_KUEUE_WORKLOAD
TAG_WORKLOAD_PRIORITY_CLASS = "k8s:workload-priority-class"
# Written on the Kueue Workload with the mark (same time): the pre-suspend hook a job may honour to checkpoint.
PRE_SUSPEND_ANNOTATION = "gpufinops.io/pre-suspend-at"
# Written on the Kueue Workload in the same patch as spec.active: false: gpufinops suspended it (restore's proof).
SUSPENDED_ANNOTATION = "gpufinops.io/suspended-at"


@dataclass(frozen=True)
class ApiKind:
    """Where the API server serves a custom resource kind: `/apis/<group>/<version>/namespaces/NS/<plural>`."""

    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def resource(self) -> str:
        """As RBAC and errors name it: `jobsets.jobset.x-k8s.io`."""
        return f"{self.plural}.{self.group}"


# The Kueue-integrated kinds people run GPU training as, besides batch Jobs: the top object of its pods, the one
# Kueue makes the Workload for (the Workload's controller ownerReference names it), so the object judged, marked,
# suspended (its Workload's spec.active: false) and restored. Pods are owned by the object itself (Kubeflow's
# training jobs, MPIJob v2beta1 of the MPI operator), by its Jobs (a JobSet), or by its RayCluster (a RayJob).
KUEUE_JOB_KINDS = {k.kind: k for k in (
    ApiKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets"),
    ApiKind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs"),
    ApiKind("TFJob", "kubeflow.org", "v1", "tfjobs"),
    ApiKind("XGBoostJob", "kubeflow.org", "v1", "xgboostjobs"),
    ApiKind("PaddleJob", "kubeflow.org", "v1", "paddlejobs"),
    ApiKind("MPIJob", "kubeflow.org", "v2beta1", "mpijobs"),
    ApiKind("RayJob", "ray.io", "v1", "rayjobs"),
)}
# Followed upwards from a pod (places.kubernetes.cluster.resolve_workload), never judged for itself when its owner is
# listed: a RayJob's pods are owned by the RayCluster KubeRay made for it (its controller ownerReference the RayJob).
RAY_CLUSTER = ApiKind("RayCluster", "ray.io", "v1", "rayclusters")
# Every kind gpufinops may suspend through its Kueue Workload (kubernetes.suspend_kueue, a rule's action: suspend).
KUEUE_SUSPEND_KINDS = ("Job", *KUEUE_JOB_KINDS)

# GPU nodes whose GPU work is gone (decide.workloads.empty_gpu_nodes; docs/kubernetes.md, "GPU nodes without GPU
# work"). Karpenter never voluntarily disrupts a node (or a pod) carrying this annotation = "true"
# (karpenter.sh/docs/concepts/disruption): gpufinops neither cordons it nor tells anyone to expect Karpenter to.
DO_NOT_DISRUPT_ANNOTATION = "karpenter.sh/do-not-disrupt"
# An EKS managed node group's own label: its Auto Scaling group and cluster-autoscaler own the node's fate.
EKS_NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
# Written on the node in the same patch as spec.unschedulable: true: gpufinops cordoned it (uncordon's proof).
CORDONED_ANNOTATION = "gpufinops.io/cordoned-at"
# A GPU node's subject id `k8s:node/<name>` and the tag rules select nodes by (k8s.tags).
NODE_ID_PREFIX = _tags.NODE_ID_PREFIX
TAG_NODE = _tags.TAG_NODE
# The state of a GPU node someone else cordoned (spec.unschedulable without CORDONED_ANNOTATION): theirs, never
# judged; a mark of gpufinops' on it is withdrawn (act.plan), since the cordon it announced is done by them.
NODE_CORDONED_BY_OTHERS = "cordoned"

GPU_RESOURCE = "nvidia.com/gpu"
# Time-slicing / MPS with the device plugin's `renameByDefault: true` advertises the replicas under this name.
GPU_SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# A full GPU counts as 7 compute slices (A100/H100/H200/B200 MIG geometry): a `mig-3g.40gb` request is 3/7 of a
# GPU. Cost shares weigh MIG profiles by prices.mig's table over the node's physical GPUs (node_sharing).
FULL_GPU_SLICES = 7
_MIG_SLICES = re.compile(r"^nvidia\.com/mig-(\d+)g\.")
# Kinds that are reported, never scaled: they finish on their own (the scale-to-zero step reads this).
RUN_TO_COMPLETION_KINDS = ("Job", "CronJob", "Pod")


def is_gpu_resource(name: str) -> bool:
    return name in (GPU_RESOURCE, GPU_SHARED_RESOURCE) or name.startswith(MIG_RESOURCE_PREFIX)


def is_share_resource(name: str) -> bool:
    """HAMi's fractional requests (MiB, %): read with a pod's GPU requests, never counted as devices."""
    return name in HAMI_RESOURCES


def gpu_slices(resource: str, count: int) -> int:
    """How much of the node's GPU capacity `count` devices of `resource` are, in compute slices."""
    if resource in (GPU_RESOURCE, GPU_SHARED_RESOURCE):
        return count * FULL_GPU_SLICES
    match = _MIG_SLICES.match(resource)
    return count * (int(match.group(1)) if match else 1)


def devices(resources: Mapping[str, int]) -> int:
    """GPU devices (whole GPUs plus MIG slices) in a resource map."""
    return sum(n for name, n in resources.items() if is_gpu_resource(name))


def slices(resources: Mapping[str, int]) -> int:
    return sum(gpu_slices(name, n) for name, n in resources.items() if is_gpu_resource(name))


# --------------------------------------------------------------------------- DRA (resource.k8s.io/v1)
#
# Dynamic Resource Allocation: a driver publishes each node's devices in ResourceSlices, a ResourceClaim's
# status.allocation names the devices it got (driver, pool, device), a pod uses its claims (spec.resourceClaims).
# NVIDIA's DRA driver is `gpu.nvidia.com`; its devices carry the attribute `type` (gpu | mig), `uuid`, `index`,
# `productName`, and for MIG `profile`, `parentUUID`, `parentIndex` (github.com/NVIDIA/k8s-dra-driver-gpu).
# A device of any other driver (or of another type) is "other devices": never a GPU, never priced as one.
DRA_GPU_DRIVERS = ("gpu.nvidia.com",)
DRA_GPU_TYPES = ("gpu", "mig")
ALLOCATED_BY_DEVICE_PLUGIN = "device-plugin"
ALLOCATED_BY_DRA = "dra"


def allocations(ways: Iterable[str]) -> str:
    """Allocation words (each may itself be comma-joined) as one sorted, comma-joined text: "device-plugin,dra"."""
    return ",".join(sorted({w for way in ways for w in way.split(",") if w}))


@dataclass(frozen=True)
class DraDevice:
    """One device a ResourceSlice publishes for a node."""

    driver: str
    pool: str
    name: str
    node: str
    kind: str  # "gpu" | "mig" | "other" (DRA_GPU_TYPES of a DRA_GPU_DRIVERS driver, else other)
    uuid: str = ""
    index: str = ""  # the GPU's index (nvidia-smi's), as a string; a MIG device's own index
    product: str = ""  # productName ("NVIDIA A100-SXM4-80GB")
    profile: str = ""  # MIG profile ("3g.40gb")
    parent_uuid: str = ""  # MIG: the GPU it is a slice of
    parent_index: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)

    @property
    def is_gpu(self) -> bool:
        return self.kind in DRA_GPU_TYPES

    @property
    def physical_gpu(self) -> str:
        """Names the physical GPU it is (or is a slice of): MIG devices of one GPU name the same one."""
        if self.kind == "mig":
            if self.parent_uuid:
                return self.parent_uuid
            return f"index:{self.parent_index}" if self.parent_index else f"device:{self.name}"
        return self.uuid or (f"index:{self.index}" if self.index else f"device:{self.name}")


@dataclass(frozen=True)
class DraHold:
    """A pod's part of one device a ResourceClaim of it was allocated."""

    claim: str  # namespace/name of the ResourceClaim
    driver: str
    pool: str
    device: str
    share: Fraction  # 1 / the pods the claim is reserved for (split among them)
    found: DraDevice | None  # the device as the pod's node's ResourceSlices publish it; None: none does
    node: str = ""
    template: str = ""  # namespace/name of the ResourceClaimTemplate the claim was generated from ("" none)
    device_class: str = ""  # the DeviceClass its request asked for ("" when neither the claim nor template says)
    containers: tuple[str, ...] = ()  # the pod's containers whose resources.claims name it (none: held all the same)

    @property
    def is_gpu(self) -> bool:
        """A GPU driver's device: a device nobody's slice publishes counts as a GPU when its driver is one (its
        workload is then UNKNOWN: which GPU it is cannot be told)."""
        if self.found is not None:
            return self.found.is_gpu
        return self.driver in DRA_GPU_DRIVERS


# Node labels that name the group a node belongs to, in the order tried: (label, how reasons name it).
NODE_GROUP_LABELS = (
    ("karpenter.sh/nodepool", "Karpenter NodePool"),
    ("karpenter.sh/provisioner-name", "Karpenter Provisioner"),
    ("eks.amazonaws.com/nodegroup", "EKS node group"),
    ("alpha.eksctl.io/nodegroup-name", "eksctl node group"),
    ("cloud.google.com/gke-nodepool", "GKE node pool"),
    ("kubernetes.azure.com/agentpool", "AKS agent pool"),
)

def node_group_of(labels: Mapping[str, str]) -> tuple[str, str]:
    """(kind in words, name) of the group that manages a node, ("", "") when no known label says."""
    for label, words in NODE_GROUP_LABELS:
        if labels.get(label):
            return words, labels[label]
    return "", ""


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
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False  # spec.unschedulable (cordoned, by anyone)
    resource_version: str = ""
    dra_devices: tuple[DraDevice, ...] = ()  # what the ResourceSlices of this node publish (every driver)

    @property
    def gpu_devices(self) -> int:
        """Device-plugin GPU devices (whole GPUs plus MIG slices) the node advertises."""
        return devices(self.capacity)

    @property
    def dra_gpus(self) -> int:
        """Physical GPUs the node's ResourceSlices publish (a GPU's MIG devices count it once)."""
        return len({d.physical_gpu for d in self.dra_devices if d.is_gpu})

    @property
    def gpu_count(self) -> int:
        """GPUs as the inventory and node verdicts name them: device-plugin devices plus DRA's physical GPUs."""
        return self.gpu_devices + self.dra_gpus

    @property
    def is_gpu_node(self) -> bool:
        return self.gpu_count > 0

    def dra_device(self, driver: str, pool: str, name: str) -> DraDevice | None:
        return next((d for d in self.dra_devices if d.key == (driver, pool, name)), None)


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
    dra: tuple[DraHold, ...] = ()  # the devices its ResourceClaims were allocated (every driver)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def dra_gpus(self) -> tuple[DraHold, ...]:
        return tuple(h for h in self.dra if h.is_gpu)

    @property
    def gpu_devices(self) -> int:
        """GPU devices held: device-plugin requests plus GPU devices allocated through DRA claims."""
        return devices(self.gpu_requests) + len(self.dra_gpus)

    @property
    def allocation(self) -> str:
        """How its GPUs were allocated: "device-plugin", "dra", or both comma-joined."""
        return allocations(w for w, held in ((ALLOCATED_BY_DEVICE_PLUGIN, devices(self.gpu_requests)),
                                             (ALLOCATED_BY_DRA, self.dra_gpus)) if held)

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
    listed: bool = True  # False: the owner was not in its listing; labels and annotations are its first pod's


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
    # Owner kinds whose list failed (a 403, a 5xx; a 404 is "none of that kind"), and why: their workloads are
    # reported with that reason and never changed this tick (places.kubernetes.cluster.KubernetesCluster.snapshot).
    unread: Mapping[str, str] = field(default_factory=dict)
    # DRA DeviceClasses listed: name -> the drivers their selectors name (places.kubernetes.dra.device_classes).
    device_classes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

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


# --------------------------------------------------------------------------- how a node's GPUs are shared
#
# Read from the labels NVIDIA GPU feature discovery (GFD, part of the GPU Operator) puts on a node and the devices
# the device plugin advertises. Sources: NVIDIA GPU Operator, "Time-Slicing GPUs in Kubernetes"
# (docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html: a T4 node with 4 replicas is
# labelled nvidia.com/gpu.count=4, nvidia.com/gpu.replicas=4, nvidia.com/gpu.product=Tesla-T4-SHARED and advertises
# nvidia.com/gpu: 16); NVIDIA k8s-device-plugin README, "Shared Access to GPUs" (v0.15+: the label
# nvidia.com/gpu.sharing-strategy = none | time-slicing | mps); GPU Operator "GPUs with MIG" (mixed strategy:
# nvidia.com/mig-3g.40gb: 2 advertised, nvidia.com/gpu.count = physical GPUs; single strategy: every MIG device is
# an nvidia.com/gpu, nvidia.com/mig.strategy=single, nvidia.com/gpu.product=<GPU>-MIG-<profile>, gpu.count = MIG
# devices); HAMi README (github.com/Project-HAMi/HAMi: nvidia.com/gpu = vGPUs, nvidia.com/gpumem in MiB and
# nvidia.com/gpucores in percent, per vGPU; no gpumem = the GPU's whole memory).

GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU (per MIG device under the single strategy)
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
HAMI_MEMORY = "nvidia.com/gpumem"  # MiB of the GPU's memory per vGPU
HAMI_CORES = "nvidia.com/gpucores"  # percent of the GPU's SMs per vGPU
HAMI_RESOURCES = (HAMI_MEMORY, HAMI_CORES)
HAMI_NODE_LABEL = ("gpu", "on")  # HAMi's README: GPU nodes it schedules are labelled gpu=on
SHARING_MODES = ("whole", "mig", "time-slicing", "mps", "hami")
# Modes where several pods run on one GPU with no per-pod counter: DCGM's figure is the GPU's, shared.
SHARED_FIGURE_MODES = ("time-slicing", "mps")


@dataclass(frozen=True)
class NodeSharing:
    """How a node's physical GPUs are handed to pods."""

    mode: str  # one of SHARING_MODES
    physical_gpus: int
    replicas: int = 1  # time-slicing / MPS: devices advertised per physical GPU
    product: str = ""  # nvidia.com/gpu.product without the -SHARED / -MIG-<profile> suffix
    single_mig_profile: str = ""  # MIG single strategy: the profile every nvidia.com/gpu is ("3g.40gb")
    memory_mib: float = 0.0  # per physical GPU (HAMi's gpumem is a share of it); 0 unknown


def _label_int(labels: Mapping[str, str], key: str) -> int:
    try:
        return max(int(str(labels.get(key, "")).strip()), 0)
    except ValueError:
        return 0


def node_sharing(node: NodeInfo, pods: tuple[PodInfo, ...] = ()) -> NodeSharing:
    """The node's sharing mode and physical GPUs, from GFD labels and advertised devices. HAMi is told by its node
    label gpu=on or a pod on the node (`pods`) requesting nvidia.com/gpumem or nvidia.com/gpucores. Without GFD's
    gpu.count the physical GPUs are inferred: advertised / replicas, MIG slices / 7 rounded up."""
    labels, cap = node.labels, node.capacity
    product = labels.get(GPU_PRODUCT_LABEL, "")
    count = _label_int(labels, GPU_COUNT_LABEL)
    advertised = cap.get(GPU_RESOURCE, 0) + cap.get(GPU_SHARED_RESOURCE, 0)
    try:
        memory = float(labels.get(GPU_MEMORY_LABEL, "0") or 0)
    except ValueError:
        memory = 0.0
    if "-MIG-" in product and labels.get(MIG_STRATEGY_LABEL, "single") == "single":
        base, profile = product.split("-MIG-", 1)
        devices_ = count or advertised
        physical = -(-devices_ * gpu_slices(f"{MIG_RESOURCE_PREFIX}{profile}", 1) // FULL_GPU_SLICES)
        return NodeSharing("mig", physical, product=base, single_mig_profile=profile)
    if any(name.startswith(MIG_RESOURCE_PREFIX) for name in cap):
        mig = sum(gpu_slices(name, n) for name, n in cap.items() if name.startswith(MIG_RESOURCE_PREFIX))
        physical = count or (advertised + -(-mig // FULL_GPU_SLICES))
        return NodeSharing("mig", physical, product=product)
    base = product[: -len("-SHARED")] if product.endswith("-SHARED") else product
    if (labels.get(HAMI_NODE_LABEL[0]) == HAMI_NODE_LABEL[1]
            or any(is_share_resource(r) for p in pods for r in p.gpu_requests)):
        return NodeSharing("hami", count or advertised, product=base, memory_mib=memory)
    strategy = labels.get(SHARING_STRATEGY_LABEL, "")
    replicas = _label_int(labels, GPU_REPLICAS_LABEL)
    if not replicas and count and advertised > count:
        replicas = advertised // count  # the advertised count vs physical GPUs
    if strategy == "mps" or (replicas > 1 and strategy in ("", "time-slicing")):
        replicas = max(replicas, 1)
        return NodeSharing("mps" if strategy == "mps" else "time-slicing", count or advertised // replicas,
                           replicas, base, memory_mib=memory)
    return NodeSharing("whole", count or advertised, product=base, memory_mib=memory)
