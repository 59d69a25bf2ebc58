"""Kubernetes GPU cost by pod, namespace, workload and node pool, with each node's idle capacity shown as such.

A pod's share of its node's cost is the part of the node's *physical* GPUs its request holds, by the way the
node shares them (k8s.model.node_sharing, from GFD labels and advertised devices):

- whole GPUs: `nvidia.com/gpu: n` is n GPUs;
- MIG: a `nvidia.com/mig-3g.40gb` device is its compute slices over the GPU's (3/7), from the one MIG profile table
  (prices.mig); the physical GPUs are GFD's nvidia.com/gpu.count, so slices a layout leaves unusable (two
  3g.40gb leave a seventh) are idle capacity, not hidden in the pods' shares;
- time-slicing and MPS: one advertised replica is 1/replicas of a GPU (nvidia.com/gpu.replicas, else advertised
  devices / physical GPUs);
- HAMi: per vGPU, max(nvidia.com/gpumem / the GPU's memory, nvidia.com/gpucores / 100). The larger of the two,
  because either one exhausted closes the GPU to other pods (HAMi's scheduler places a vGPU only where both its
  memory and its cores fit): a pod holding 80% of the memory and 10% of the cores takes 80% of the GPU from
  everyone else. No gpumem means the whole memory (HAMi's default), so such a pod holds a whole GPU.

- DRA (resource.k8s.io/v1 ResourceClaims, places.kubernetes.dra): a whole GPU device is 1 GPU, a MIG device its
  profile's compute slices over the GPU's (the same table), times the pod's part of the claim (1/n for a claim
  reserved for n pods). The node's physical GPUs are then its device-plugin GPUs plus the GPUs its ResourceSlices
  publish (a GPU's MIG devices count it once); a device of another driver is never a GPU and never priced as one,
  and a GPU device no slice of the node publishes is weighed 0 (which GPU it is cannot be told: its cost stays the
  node's idle capacity, its workload UNKNOWN). `allocation` says how each share's GPUs were allocated.

What no pod holds is the node's **idle capacity**: a row of its own, never spread over the pods. Shares are exact
fractions; amounts are whole cents, apportioned per node by largest remainder, so a node's pods plus its idle
capacity equal its cost to the cent for any number of hours, and every grouping adds up to the cluster
(`cluster_cents`). Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Callable, Iterable, Mapping, Sequence

from gpufinops.k8s.model import (
    ALLOCATED_BY_DEVICE_PLUGIN, ALLOCATED_BY_DRA, GPU_RESOURCE, GPU_SHARED_RESOURCE, HAMI_CORES, HAMI_MEMORY,
    MIG_RESOURCE_PREFIX, ClusterSnapshot, DraHold, NodeInfo, NodeSharing, PodInfo, allocations, node_sharing,
)
from ...prices.mig import compute_share, gpu_key_of_product

# Node labels naming a node's pool, first found (the same as places.kubernetes.cluster.NODE_GROUP_LABELS' first ones).
NODE_POOL_LABELS = ("karpenter.sh/nodepool", "eks.amazonaws.com/nodegroup", "cloud.google.com/gke-nodepool",
                    "kubernetes.azure.com/agentpool")
NO_NODE_POOL = "(no node pool)"
IDLE_CAPACITY = "(idle capacity)"
# The part of a node's GPUs no pod holds, beside "device-plugin" and "dra" (allocation_split).
UNALLOCATED = "unallocated"
GROUPINGS = ("namespace", "workload", "node", "pod", "nodepool")


@dataclass(frozen=True)
class CostShare:
    """One pod's part of one node's cost over `hours`, or the node's idle capacity (pod == "")."""

    node: str
    instance_id: str
    namespace: str  # IDLE_CAPACITY for idle capacity
    workload: str  # "ns/Kind/name"; for idle capacity "node <name>"
    pod: str
    gpus: Fraction  # physical GPUs held (exact: 3/7 for a 3g slice, 1/4 for one of 4 time-sliced replicas)
    node_gpus: int  # the node's physical GPUs
    cents: int | None  # None: the node's price is unknown
    hours: float
    sharing: str = "whole"  # k8s.model.SHARING_MODES
    node_pool: str = NO_NODE_POOL
    # How the GPUs were allocated: "device-plugin", "dra" or both comma-joined; for idle capacity, how the node's
    # GPUs are handed out.
    allocation: str = ALLOCATED_BY_DEVICE_PLUGIN
    dra_gpus: Fraction = Fraction(0)  # of `gpus`, those held through DRA claims (the rest: device-plugin requests)

    @property
    def is_idle_capacity(self) -> bool:
        return not self.pod

    def by_allocation(self) -> list[tuple[str, Fraction, int | None]]:
        """(allocation, GPUs, cents) of this share: idle capacity is UNALLOCATED; a pod holding GPUs both ways has
        its cents split by GPUs (largest remainder, so the parts add up to its cents)."""
        if self.is_idle_capacity:
            return [(UNALLOCATED, self.gpus, self.cents)]
        if not self.dra_gpus:  # the common cases first: one way only (no Fraction arithmetic, no apportioning)
            return [(ALLOCATED_BY_DEVICE_PLUGIN if self.gpus else self.allocation.split(",")[0], self.gpus, self.cents)]
        if self.dra_gpus == self.gpus:
            return [(ALLOCATED_BY_DRA, self.gpus, self.cents)]
        plugin = self.gpus - self.dra_gpus
        parts = [(w, g) for w, g in ((ALLOCATED_BY_DEVICE_PLUGIN, plugin), (ALLOCATED_BY_DRA, self.dra_gpus)) if g]
        if not parts:  # holds no weighed GPU (a DRA device no slice publishes): named as the pod's GPUs were
            return [(self.allocation.split(",")[0], Fraction(0), self.cents)]
        cents = [None] * len(parts) if self.cents is None else apportion(self.cents, [g for _, g in parts])
        return [(w, g, c) for (w, g), c in zip(parts, cents)]


def cents_of(usd: float) -> int:
    """Dollars to whole cents, half up (no binary-float surprises: 0.125 -> 13)."""
    return int(Decimal(repr(usd)).scaleb(2).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def apportion(total: int, weights: Sequence[int | Fraction]) -> list[int]:
    """`total` split in proportion to `weights` (integers or exact fractions), in whole units that add up to
    `total` exactly (largest remainder; ties go to the earlier weight)."""
    denominator = sum(weights)
    if denominator <= 0:
        return [0] * len(weights)
    parts = [int(total * w // denominator) for w in weights]
    remainders = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % denominator), i))
    for i in remainders[: total - sum(parts)]:
        parts[i] += 1
    return parts


def node_hourly_costs(nodes: Iterable[NodeInfo], price: Callable[[str, str, str], float | None],
                      overrides: Mapping[str, float] | None = None) -> dict[str, float | None]:
    """USD/h per node name: a known rate of its instance (billing) first, else `price(type, region, lifecycle)`
    (the on-demand catalog: None for spot, which the catalog does not price)."""
    overrides = overrides or {}
    return {n.name: overrides.get(n.instance_id, price(n.instance_type, n.region, n.lifecycle)) for n in nodes}


def node_pool_of(node: NodeInfo) -> str:
    return next((node.labels[k] for k in NODE_POOL_LABELS if node.labels.get(k)), NO_NODE_POOL)


def request_share(requests: Mapping[str, int], sharing: NodeSharing) -> Fraction:
    """The physical GPUs a pod's requests hold on a node shared as `sharing` (exact)."""
    share = Fraction(0)
    devices_ = requests.get(GPU_RESOURCE, 0) + requests.get(GPU_SHARED_RESOURCE, 0)
    gpu_key = gpu_key_of_product(sharing.product)
    for name, n in requests.items():
        if name.startswith(MIG_RESOURCE_PREFIX):
            slices, of = compute_share(gpu_key, name[len(MIG_RESOURCE_PREFIX):])
            share += Fraction(n * slices, of)
    if sharing.mode == "mig" and sharing.single_mig_profile:
        slices, of = compute_share(gpu_key, sharing.single_mig_profile)
        share += Fraction(devices_ * slices, of)
    elif sharing.mode in ("time-slicing", "mps"):
        share += Fraction(devices_, sharing.replicas)
    elif sharing.mode == "hami" and (HAMI_MEMORY in requests or HAMI_CORES in requests):
        vgpus = devices_ or 1
        memory = (Fraction(requests[HAMI_MEMORY]) / Fraction(sharing.memory_mib)
                  if HAMI_MEMORY in requests and sharing.memory_mib > 0 else Fraction(1))
        cores = Fraction(requests.get(HAMI_CORES, 0), 100)
        share += vgpus * min(max(memory, cores), Fraction(1))
    else:
        share += devices_
    return share


def dra_share(holds: Sequence[DraHold]) -> Fraction:
    """The physical GPUs a pod's DRA devices hold (exact): whole GPU 1, MIG its compute slices over the GPU's,
    each times the pod's part of its claim. Other drivers' devices and unpublished ones weigh nothing."""
    share = Fraction(0)
    for h in holds:
        if h.found is None or not h.found.is_gpu:
            continue
        if h.found.kind == "mig":
            slices, of = compute_share(gpu_key_of_product(h.found.product), h.found.profile)
            share += h.share * Fraction(slices, of)
        else:
            share += h.share
    return share


def node_allocation(node: NodeInfo) -> str:
    """How the node hands out its GPUs: "device-plugin", "dra", or both comma-joined."""
    return allocations(w for w, n in ((ALLOCATED_BY_DEVICE_PLUGIN, node.gpu_devices), (ALLOCATED_BY_DRA, node.dra_gpus))
                       if n)


def node_dra_mode(node: NodeInfo) -> str:
    return "mig" if any(d.kind == "mig" for d in node.dra_devices) else "whole"


@dataclass(frozen=True)
class NodeGpus:
    """A node's physical GPUs as its cost is split over them: device-plugin ones (as node_sharing counts them)
    plus the GPUs its ResourceSlices publish, and the sharing mode to name them by."""

    sharing: NodeSharing  # of the device-plugin GPUs
    physical: int
    mode: str


def node_gpus(node: NodeInfo, pods: tuple[PodInfo, ...]) -> NodeGpus:
    sharing = node_sharing(node, pods)
    # A DRA-only node may still carry GFD's labels (gpu.count): its device-plugin GPUs are what it advertises.
    plugin_gpus = sharing.physical_gpus if node.gpu_devices else 0
    return NodeGpus(sharing, plugin_gpus + node.dra_gpus, sharing.mode if node.gpu_devices else node_dra_mode(node))


def attribute(snapshot: ClusterSnapshot, node_costs: Mapping[str, float | None], hours: float = 1.0) -> list[CostShare]:
    """Pure: every GPU node's cost over `hours`, split over the pods holding its GPUs, plus its idle capacity.
    Requests above the physical GPUs (a node shrinking under its pods, labels that undercount) share the whole
    node and leave no idle row."""
    out: list[CostShare] = []
    for node in snapshot.nodes:
        pods = snapshot.pods_on(node.name)
        gpus = node_gpus(node, pods)
        sharing, physical, mode = gpus.sharing, gpus.physical, gpus.mode
        pool = node_pool_of(node)
        dra = [dra_share(p.dra) for p in pods]
        weights = [request_share(p.gpu_requests, sharing) + d for p, d in zip(pods, dra)]
        idle = max(Fraction(physical) - sum(weights, Fraction(0)), Fraction(0))
        cost = node_costs.get(node.name)
        total = None if cost is None else cents_of(cost * hours)
        parts = apportion(total, [*weights, idle]) if total is not None else [None] * (len(pods) + 1)
        for pod, w, d, cents in zip(pods, weights, dra, parts):
            out.append(CostShare(node.name, node.instance_id, pod.namespace, str(pod.workload), pod.name, w,
                                 physical, cents, hours, mode, pool, pod.allocation or ALLOCATED_BY_DEVICE_PLUGIN, d))
        if idle:
            out.append(CostShare(node.name, node.instance_id, IDLE_CAPACITY, f"node {node.name}", "", idle,
                                 physical, parts[-1], hours, mode, pool, node_allocation(node)))
    return out


def allocation_split(shares: Iterable[CostShare]) -> dict[str, dict[str, tuple[Fraction, int | None]]]:
    """Per node, per allocation ("device-plugin", "dra", UNALLOCATED): the physical GPUs and the cents of the node's
    cost they carry (None: the node is unpriced). The parts of a node add up to its GPUs and its cents exactly."""
    out: dict[str, dict[str, tuple[Fraction, int | None]]] = {}
    for s in shares:
        node = out.setdefault(s.node, {})
        for way, gpus, cents in s.by_allocation():
            if way not in node:
                node[way] = (gpus, cents)
            else:
                had_gpus, had_cents = node[way]
                node[way] = (had_gpus + gpus, None if cents is None or had_cents is None else had_cents + cents)
    return out


def cluster_cents(shares: Iterable[CostShare]) -> int:
    return sum(s.cents or 0 for s in shares)


def cost_by(shares: Iterable[CostShare], by: str) -> list[dict]:
    """Rows per namespace / workload / node / pod / nodepool: cents, dollars, physical GPUs held, pods, `unpriced`
    pods whose node has no known price, `sharing` (the modes of the GPUs, comma-joined), `allocation` (device-plugin,
    dra: how they were allocated, comma-joined) and the row's idle
    capacity (`idle_cents`, `idle_gpus`: all of an idle capacity row, a node pool's idle part). Idle capacity
    stays its own row(s) except per node and node pool; largest cost first."""
    if by not in GROUPINGS:
        raise ValueError(f"cost by {by!r}: expected one of {', '.join(GROUPINGS)}")
    groups: dict[str, dict] = {}
    for s in shares:
        key = {"namespace": s.namespace, "workload": s.workload, "node": s.node, "nodepool": s.node_pool,
               "pod": f"{s.namespace}/{s.pod}" if s.pod else s.workload}[by]
        row = groups.setdefault(key, {by: key, "cents": 0, "gpus": Fraction(0), "pods": 0, "unpriced": 0,
                                      "idle_capacity": s.is_idle_capacity and by not in ("node", "nodepool"),
                                      "sharing": set(), "allocation": set(), "idle_cents": 0,
                                      "idle_gpus": Fraction(0)})
        row["cents"] += s.cents or 0
        row["gpus"] += s.gpus
        row["pods"] += 0 if s.is_idle_capacity else 1
        row["unpriced"] += s.cents is None
        row["sharing"].add(s.sharing)
        row["allocation"].update(s.allocation.split(","))
        if s.is_idle_capacity:
            row["idle_cents"] += s.cents or 0
            row["idle_gpus"] += s.gpus
    rows = sorted(groups.values(), key=lambda r: (r["idle_capacity"], -r["cents"], r[by]))
    for r in rows:
        r["usd"] = r["cents"] / 100
        r["gpus"] = round(float(r["gpus"]), 3)
        r["idle_gpus"] = round(float(r["idle_gpus"]), 3)
        r["sharing"] = ",".join(sorted(r["sharing"]))
        r["allocation"] = allocations(r["allocation"])
    return rows


def pod_hourly_costs(shares: Iterable[CostShare]) -> dict[tuple[str, str], float | None]:
    """USD/h per (namespace, pod), for verdicts' $/h (shares computed over any number of hours)."""
    return {(s.namespace, s.pod): None if s.cents is None else s.cents / 100 / s.hours
            for s in shares if not s.is_idle_capacity}
