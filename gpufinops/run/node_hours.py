"""Each tick's Kubernetes GPU nodes into the hourly node rollup (store k8s_node_hours) that the monthly report's node
pool table reads (report.sections.node_pool_table; docs/report.md, "GPU node pools").

The tick has already listed the cluster (places.kubernetes.cloud.WorkloadCloud: its snapshot and the USD/h of
each node); the cost split is places.kubernetes.costs.attribute's, recomputed here for the hours the tick covers (the
listing computes it for one hour and keeps only the pods' rates). A tick whose listing failed records nothing: the
time until the next good read is covered by that read, at most two tick intervals (Store.record_node_hours).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Mapping

from ..k8s.model import ALLOCATED_BY_DRA, ClusterSnapshot
from ..places.kubernetes.costs import allocation_split, attribute, node_allocation, node_gpus, node_pool_of
from ..store.episodes import HOUR, floor_hour
from .nodes import workload_cloud_of


def hour_chunks(start: datetime, seconds: float) -> list[tuple[datetime, float]]:
    """(hour, hours) of the span from `start` lasting `seconds`, cut at the hours it crosses, oldest first."""
    out, at, left = [], start, seconds
    while left > 0:
        hour = floor_hour(at)
        chunk = min(left, (hour + HOUR - at).total_seconds())
        out.append((hour, chunk / 3600.0))
        at, left = hour + HOUR, left - chunk
    return out


def node_hour_rows(snapshot: ClusterSnapshot, node_costs: Mapping[str, float | None], start: datetime,
                   seconds: float) -> list[dict]:
    """Pure: the k8s_node_hours rows of the span [start, start + seconds) seen as `snapshot` shows the cluster, one
    per GPU node and hour. Cents are attribute()'s for that part of the hour (whole cents apportioned per node), so
    pods_cents + idle_cents == node_cents in each row, and dra_cents is the part of pods_cents its pods' DRA GPUs
    carried; an unpriced node has 0 cents and its time in unpriced_hours. `gpus` counts device-plugin and DRA GPUs
    alike (costs.node_gpus), as the split does.
    The tick itself (ticks, empty_ticks) counts in the span's last hour, the one it was made in."""
    chunks = hour_chunks(start, seconds)
    end = start + timedelta(seconds=seconds)  # the tick's own time
    out = []
    for n, (hour, hours) in enumerate(chunks):
        by_node: dict[str, list] = {}
        shares = attribute(snapshot, node_costs, hours)
        for share in shares:
            by_node.setdefault(share.node, []).append(share)
        split = allocation_split(shares)
        tick = int(n == len(chunks) - 1)
        for node in snapshot.nodes:
            pods = snapshot.pods_on(node.name)
            gpus = node_gpus(node, pods)
            mine = by_node.get(node.name, [])
            node_cents = sum(s.cents or 0 for s in mine)
            idle_cents = sum(s.cents or 0 for s in mine if s.is_idle_capacity)
            dra_cents = split.get(node.name, {}).get(ALLOCATED_BY_DRA, (0, 0))[1] or 0
            empty = not pods
            out.append({"hour": hour, "node": node.name, "instance_id": node.instance_id[:64],
                        "node_pool": node_pool_of(node)[:128], "sharing": gpus.mode,
                        "allocation": node_allocation(node)[:32], "gpus": gpus.physical,
                        "hours": hours, "gpu_hours": hours * gpus.physical, "node_cents": node_cents,
                        "pods_cents": node_cents - idle_cents, "idle_cents": idle_cents, "dra_cents": dra_cents,
                        "unpriced_hours": hours if node_costs.get(node.name) is None else 0.0, "ticks": tick,
                        "empty_ticks": tick if empty else 0, "empty_hours": hours if empty else 0.0,
                        "last_seen": end})
    return out


def record_node_hours(now: datetime, settings, peers) -> int:
    """Add this tick's GPU nodes to the store's hourly node rollup, in one transaction; nothing without a cluster or
    when this tick's listing failed. Returns the rows written."""
    cloud = workload_cloud_of(peers.cloud)
    if cloud is None or not cloud.listed_ok or cloud.last_snapshot is None:
        return 0
    snapshot, costs = cloud.last_snapshot, dict(cloud.node_costs)
    interval_s = float(settings.schedule.evaluate_every_s)
    return peers.store.record_node_hours(
        now, lambda start, seconds: node_hour_rows(snapshot, costs, start, seconds),
        interval_s=interval_s, max_gap_s=2 * interval_s)  # the cap the verdict rollups use (pipeline.run_once)


__all__ = ["hour_chunks", "node_hour_rows", "record_node_hours"]
