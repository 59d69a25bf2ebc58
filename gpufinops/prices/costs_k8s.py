"""Kubernetes GPU cost by pod, namespace and workload, with each node's idle capacity shown as such.

A pod's share of its node's cost is its GPU request over the node's GPU capacity (MIG requests weighted by
their compute slices: k8s.model.gpu_slices). The GPUs no pod requested are the node's **idle capacity**: a
row of their own, never spread over the pods. Pure functions; amounts in whole cents, apportioned per node
by largest remainder, so the rows of a node add up to its cost to the cent and every grouping adds up to the
cluster (`cluster_cents`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Callable, Iterable, Mapping, Sequence

from gpufinops.k8s.model import ClusterSnapshot, NodeInfo, slices

IDLE_CAPACITY = "(idle capacity)"
GROUPINGS = ("namespace", "workload", "node", "pod")


@dataclass(frozen=True)
class CostShare:
    """One pod's part of one node's cost over `hours`, or the node's idle capacity (pod == "")."""

    node: str
    instance_id: str
    namespace: str  # IDLE_CAPACITY for idle capacity
    workload: str  # "ns/Kind/name"; for idle capacity "node <name>"
    pod: str
    gpu_slices: int  # in compute slices (a whole GPU = 7)
    node_slices: int
    cents: int | None  # None: the node's price is unknown
    hours: float

    @property
    def is_idle_capacity(self) -> bool:
        return not self.pod


def cents_of(usd: float) -> int:
    """Dollars to whole cents, half up (no binary-float surprises: 0.125 -> 13)."""
    return int(Decimal(repr(usd)).scaleb(2).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """`total` split in proportion to `weights`, in whole units that add up to `total` exactly (largest
    remainder; ties go to the earlier weight)."""
    denominator = sum(weights)
    if denominator <= 0:
        return [0] * len(weights)
    parts = [total * w // denominator for w in weights]
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


def attribute(snapshot: ClusterSnapshot, node_costs: Mapping[str, float | None], hours: float = 1.0) -> list[CostShare]:
    """Pure: every GPU node's cost over `hours`, split over the pods holding its GPUs, plus its idle capacity.
    Requests above the capacity (a node shrinking under its pods) share the whole node and leave no idle row."""
    out: list[CostShare] = []
    for node in snapshot.nodes:
        pods = snapshot.pods_on(node.name)
        capacity = slices(node.capacity)
        weights = [slices(p.gpu_requests) for p in pods]
        idle = max(capacity - sum(weights), 0)
        cost = node_costs.get(node.name)
        total = None if cost is None else cents_of(cost * hours)
        parts = apportion(total, [*weights, idle]) if total is not None else [None] * (len(pods) + 1)
        for pod, w, cents in zip(pods, weights, parts):
            out.append(CostShare(node.name, node.instance_id, pod.namespace, str(pod.workload), pod.name, w,
                                 capacity, cents, hours))
        if idle:
            out.append(CostShare(node.name, node.instance_id, IDLE_CAPACITY, f"node {node.name}", "", idle,
                                 capacity, parts[-1], hours))
    return out


def cluster_cents(shares: Iterable[CostShare]) -> int:
    return sum(s.cents or 0 for s in shares)


def cost_by(shares: Iterable[CostShare], by: str) -> list[dict]:
    """Rows per namespace / workload / node / pod: cents, dollars, GPUs (whole GPUs, MIG as sevenths), pods, and
    `unpriced` pods whose node has no known price. Idle capacity stays its own row(s); largest cost first."""
    if by not in GROUPINGS:
        raise ValueError(f"cost by {by!r}: expected one of {', '.join(GROUPINGS)}")
    groups: dict[str, dict] = {}
    for s in shares:
        key = {"namespace": s.namespace, "workload": s.workload, "node": s.node,
               "pod": f"{s.namespace}/{s.pod}" if s.pod else s.workload}[by]
        row = groups.setdefault(key, {by: key, "cents": 0, "gpus": 0.0, "pods": 0, "unpriced": 0,
                                      "idle_capacity": s.is_idle_capacity})
        row["cents"] += s.cents or 0
        row["gpus"] += s.gpu_slices / 7
        row["pods"] += 0 if s.is_idle_capacity else 1
        row["unpriced"] += s.cents is None
    rows = sorted(groups.values(), key=lambda r: (r["idle_capacity"], -r["cents"], r[by]))
    for r in rows:
        r["usd"] = r["cents"] / 100
        r["gpus"] = round(r["gpus"], 3)
    return rows


def pod_hourly_costs(shares: Iterable[CostShare]) -> dict[tuple[str, str], float | None]:
    """USD/h per (namespace, pod), for verdicts' $/h (shares computed over any number of hours)."""
    return {(s.namespace, s.pod): None if s.cents is None else s.cents / 100 / s.hours
            for s in shares if not s.is_idle_capacity}
