"""The live Kubernetes peers: EC2 instances and Kubernetes workloads side by side for the tick (docs/kubernetes.md,
"Scale to zero"), and the cluster's costs and workload verdicts for `gpufinops costs --by namespace|workload`.
Composition, above collect and decide: gpufinops.k8s holds only the types every stage shares.

`FleetCloud` and `FleetMetrics` are one Cloud and one MetricsSource over both: an id starting with `k8s:` is a
workload (collect.kubernetes_cloud.WorkloadCloud, usage per pod from collect.k8s_usage combined per workload by
decide.workloads.workload_usage), anything else an EC2 instance. The act stage, its dry-run, cap, audit rows,
read-back and reconcile then hold for workloads unchanged. `restore_workload` is `gpufinops k8s restore`: the
same dry-run flag and an audit row written the way the act stage writes one.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Mapping, Sequence

from .collect.kubernetes_cloud import (
    KubeChangeError, KubeReadFailed, WorkloadCloud, is_workload_id, parse_target, workload_id,
)
from .collect.routed import RoutedCloud
from .costs_k8s import CostShare, attribute, node_hourly_costs, pod_hourly_costs
from .k8s.model import ClusterSnapshot, WorkloadRef
from .model import ActionKind, ActionResult, Cloud, GpuInstance, InstanceUsage, MetricsSource, Rule

log = logging.getLogger("gpufinops.kubernetes")


class WorkloadMetrics:
    """Usage per workload over a window: its pods' GPUs side by side, read in PodMetrics' fixed queries over the
    snapshot the workloads were last listed from."""

    def __init__(self, pod_metrics, cloud: WorkloadCloud):
        self.pod_metrics = pod_metrics  # collect.k8s_usage.PodMetrics
        self.cloud = cloud

    def window_usage(self, instances: Sequence[GpuInstance], window_s: int, now: datetime) -> dict[str, InstanceUsage]:
        from .decide.workloads import workload_usage

        snapshot = self.cloud.last_snapshot
        if snapshot is None:
            return {i.instance_id: InstanceUsage(i.instance_id, window_s, 0, error="no cluster listing to read pods "
                                                 "from") for i in instances}
        by_pod = self.pod_metrics.window_usage(snapshot, window_s, now).by_pod
        out = {}
        for inst in instances:
            ref = self.cloud.ref_of(inst.instance_id)
            if ref is None:
                out[inst.instance_id] = InstanceUsage(inst.instance_id, window_s, 0, error="workload not listed")
                continue
            usage, _missing = workload_usage(ref, snapshot.pods_of(ref), by_pod, window_s)
            out[inst.instance_id] = replace(usage, instance_id=inst.instance_id)
        return out


def split(ids_or_instances) -> tuple[list, list]:
    """(EC2 ones, workload ones), by the `k8s:` id prefix."""
    ec2, k8s = [], []
    for item in ids_or_instances:
        iid = item if isinstance(item, str) else item.instance_id
        (k8s if is_workload_id(iid) else ec2).append(item)
    return ec2, k8s


def as_node_remainder(inst: GpuInstance, remainders: Mapping[str, float | None]) -> GpuInstance:
    """A cluster node's inventory row priced at what its listed workloads do not carry (idle capacity, pods of
    namespaces left out), so that node and workloads add up to the node's cost: the spend is never counted twice.
    Any other instance is unchanged."""
    if inst.instance_id not in remainders:
        return inst
    return replace(inst, hourly_cost=remainders[inst.instance_id],
                   price_source="node remainder: its cost less its workloads' shares (they are priced on the "
                                "workloads); mostly idle capacity")


class FleetCloud(RoutedCloud):
    """One Cloud over EC2 and the cluster. A side that cannot be listed makes the listing partial (`last_errors`,
    as a region that failed), never empty: the other side is still judged; both failing raises."""

    def __init__(self, ec2: Cloud, workloads: WorkloadCloud):
        self.ec2 = ec2
        self.workloads = workloads
        self.last_errors: list[str] = []

    def cloud_of(self, inst: GpuInstance) -> Cloud:
        return self.workloads if is_workload_id(inst.instance_id) else self.ec2

    def list_gpu_instances(self) -> list[GpuInstance]:
        errors: list[str] = []
        ec2: list[GpuInstance] = []
        ec2_failed: Exception | None = None
        try:
            ec2 = self.ec2.list_gpu_instances()
            errors.extend(str(e) for e in getattr(self.ec2, "last_errors", []) or [])
        except Exception as exc:  # noqa: BLE001 - the cluster is still listed; the tick reports the gap
            ec2_failed = exc
            errors.append(f"EC2: {exc}")
        try:
            # The node's own EC2 rate (spot included) prices its pods' shares where the inventory has it.
            workloads = self.workloads.list_workloads({i.instance_id: i.hourly_cost for i in ec2})
        except Exception as exc:  # noqa: BLE001
            if ec2_failed is not None:
                raise
            log.error("kubernetes workloads not listed: %s", exc)
            errors.append(f"kubernetes: {exc}")
            workloads = []
        self.last_errors = errors
        if workloads:
            ec2 = [as_node_remainder(i, self.workloads.node_remainders) for i in ec2]
        return ec2 + workloads

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        ec2_ids, k8s_ids = split(instance_ids)
        found = {i.instance_id: i for i in (self.ec2.describe(ec2_ids) if ec2_ids else [])}
        found.update({i.instance_id: i for i in (self.workloads.describe(k8s_ids) if k8s_ids else [])})
        return [found[i] for i in instance_ids if i in found]


class FleetMetrics:
    """One MetricsSource over EC2 instances (the collector) and workloads (WorkloadMetrics)."""

    def __init__(self, ec2: MetricsSource, workloads: WorkloadMetrics):
        self.ec2 = ec2
        self.workloads = workloads

    def window_usage(self, instances: Sequence[GpuInstance], window_s: int, now: datetime) -> dict[str, InstanceUsage]:
        ec2, k8s = split(instances)
        out = dict(self.ec2.window_usage(ec2, window_s, now)) if ec2 else {}
        if k8s:
            try:
                out.update(self.workloads.window_usage(k8s, window_s, now))
            except Exception as exc:  # noqa: BLE001 - a workload read failing leaves them UNKNOWN, never idle
                log.exception("workload usage failed for window %ss", window_s)
                out.update({i.instance_id: InstanceUsage(i.instance_id, window_s, 0, error=f"workload usage: {exc}")
                            for i in k8s})
        return out


def live_workload_cloud(settings, clock=None) -> WorkloadCloud:
    """The cluster named by `settings.kubernetes` as a Cloud (nothing is read until it is listed)."""
    from .collect.kubernetes import KubernetesCluster
    from .model import utcnow
    cluster = KubernetesCluster.from_settings(settings.kubernetes, settings.source_path)
    return WorkloadCloud(cluster, price_lookup(settings), protect_key=settings.kubernetes.protect_key,
                         scale_to_zero=settings.kubernetes.scale_to_zero, clock=clock or utcnow)


def live_fleet(settings, ec2: Cloud, ec2_metrics: MetricsSource, clock=None) -> tuple[FleetCloud, FleetMetrics]:
    """EC2 and the cluster side by side (compose.live_peers, when the config has a `kubernetes:` section)."""
    from .collect.k8s_usage import PodMetrics

    workloads = live_workload_cloud(settings, clock)
    return FleetCloud(ec2, workloads), FleetMetrics(ec2_metrics, WorkloadMetrics(PodMetrics(settings.prometheus),
                                                                                 workloads))


# --------------------------------------------------------------------------- gpufinops k8s restore


@dataclass(frozen=True)
class RestoreOutcome:
    ok: bool
    instance_id: str
    message: str
    dry_run: bool


def find_target(cloud: WorkloadCloud, text: str) -> WorkloadRef:
    """The Deployment or StatefulSet `NS/NAME` (or `NS/Kind/NAME`, or its id) names; ValueError when none or both."""
    namespace, kind, name = parse_target(text)
    if kind is not None:
        ref = WorkloadRef(namespace, kind, name)
        if not ref.scalable:
            raise ValueError(f"{text!r}: only a Deployment or StatefulSet is restored, not a {kind}")
        return ref
    found = []
    for candidate in ("Deployment", "StatefulSet"):
        ref = WorkloadRef(namespace, candidate, name)
        if cloud.describe([workload_id(ref)]):
            found.append(ref)
    if not found:
        raise ValueError(f"{text!r}: no Deployment or StatefulSet {name} in namespace {namespace}")
    if len(found) > 1:
        raise ValueError(f"{text!r}: both a Deployment and a StatefulSet are named {name}: say "
                         f"{namespace}/Deployment/{name} or {namespace}/StatefulSet/{name}")
    return found[0]


def restore_workload(cloud: WorkloadCloud, store, text: str, now: datetime, *, dry_run: bool,
                     who: str = "") -> RestoreOutcome:
    """Scale a workload gpufinops scaled to zero back to its kept count. Dry-run (act.dry_run, or --dry-run) reads
    and records "would restore" and changes nothing. Live: one preconditioned patch; on an error the object is
    read back and the audit row says what it found. The row is kind `snooze` ("a person asked gpufinops to
    change it for them"), its reason naming the restore, so the daily summary lists it with the person."""
    try:
        ref = find_target(cloud, text)
    except (ValueError, KubeReadFailed) as exc:
        return RestoreOutcome(False, text, str(exc), dry_run)
    iid = workload_id(ref)
    run_id = uuid.uuid4().hex[:12]
    by = f" for {who}" if who else ""
    count, problem = cloud.restorable(ref)
    if count is None:  # nothing of gpufinops' to undo: nothing is asked of the API server, nothing recorded
        return RestoreOutcome(False, iid, problem, dry_run)
    if dry_run:
        reason = f"dry-run: would restore {ref} to {count} replicas{by} (gpufinops k8s restore); it was NOT changed"
        store.record_action(run_id, ActionResult(iid, ActionKind.RESTORE, True, True, reason, "", now))
        return RestoreOutcome(True, iid, reason, True)
    try:
        restored = cloud.restore(ref, who)
    except KubeChangeError as exc:
        seen = read_back_restored(cloud, iid)
        ok = seen is True
        state = {True: "found restored by the read-back", False: "read back: not restored",
                 None: "read-back failed: outcome unknown"}[seen]
        reason = f"restore {ref}{by} (gpufinops k8s restore): {state}"
        log.error("%s: %s", reason, exc)
        store.record_action(run_id, ActionResult(iid, ActionKind.RESTORE, False, ok, reason, "", now,
                                                 error=None if ok else str(exc)[:500]))
        return RestoreOutcome(ok, iid, reason if ok else f"{reason}: {exc}", False)
    reason = f"{ref} {restored.reason} (gpufinops k8s restore)"
    store.record_action(run_id, ActionResult(iid, ActionKind.RESTORE, False, True, reason, "", now))
    log.info("%s", reason)
    return RestoreOutcome(True, iid, reason, False)


def read_back_restored(cloud: WorkloadCloud, instance_id: str) -> bool | None:
    """Is the workload running again (not scaled down by gpufinops)? None when it cannot be read."""
    try:
        found = cloud.describe([instance_id])
    except KubeReadFailed:
        return None
    return bool(found) and found[0].state != "stopped"

@dataclass(frozen=True)
class ClusterCosts:
    snapshot: ClusterSnapshot
    node_costs: dict[str, float | None]  # USD/h per node name
    shares: list[CostShare]


def price_lookup(settings):
    """`price(instance_type, region, lifecycle) -> USD/h | None`: billing.price_catalog, else the bundled one."""
    from .prices import OnDemandPrices

    path = settings.billing.price_catalog if settings.billing is not None else None
    return OnDemandPrices.load(path) if path else OnDemandPrices.load_default()


def live_cluster_costs(settings, now: datetime, hours: float = 1.0) -> ClusterCosts:
    """Read the cluster named by `settings.kubernetes` now and split its GPU nodes' cost over `hours`
    (collect.kubernetes.ClusterReadFailed when the API does not answer: never an empty cluster)."""
    from .collect.kubernetes import KubernetesCluster

    snapshot = KubernetesCluster.from_settings(settings.kubernetes, settings.source_path).snapshot(now)
    costs = node_hourly_costs(snapshot.nodes, price_lookup(settings))
    return ClusterCosts(snapshot, costs, attribute(snapshot, costs, hours))


@dataclass(frozen=True)
class ClusterReview:
    """One look at the cluster: costs, per-pod usage per rule window, verdicts per workload, empty GPU nodes."""

    costs: ClusterCosts
    usage_by_window: dict  # window_s -> collect.k8s_usage.PodWindowUsage
    decisions: list  # decide.workloads.WorkloadDecision, per (workload, rule)
    empty_nodes: list  # decide.workloads.NodeFinding, judged over the longest rule window


def live_workload_review(settings, rules: Sequence[Rule], now: datetime) -> ClusterReview:
    """Read the cluster and Prometheus (4 queries per distinct rule window) and judge every GPU workload by every
    matching rule. A failed Prometheus read leaves every workload UNKNOWN with the error in its reason; a failed
    cluster read raises collect.kubernetes.ClusterReadFailed."""
    from .collect.k8s_usage import PodMetrics
    from .collect.kubernetes import node_group_of
    from .decide.workloads import empty_gpu_nodes, judge_workloads

    costs = live_cluster_costs(settings, now)
    metrics = PodMetrics(settings.prometheus)
    pod_costs = pod_hourly_costs(costs.shares)
    windows = sorted({r.window_s for r in rules})
    usage = {w: metrics.window_usage(costs.snapshot, w, now) for w in windows}
    decisions = [d for w in windows for d in judge_workloads(
        costs.snapshot, usage[w].by_pod, [r for r in rules if r.window_s == w], now, pod_costs)]
    empty = []
    if windows:
        longest = usage[windows[-1]]
        empty = empty_gpu_nodes(costs.snapshot, longest.nodes_with_pod_series, longest.nodes_with_series,
                                windows[-1], now, costs.node_costs, node_group_of)
    return ClusterReview(costs, usage, decisions, empty)
