"""One Cloud over every place: EC2 instances, rented hosts and Kubernetes workloads side by side for the tick
(docs/kubernetes.md, "Scale to zero"), the routing of a change to the place that listed the subject, and the merge
of their listings.

`RoutedCloud`: a Cloud made of several, each mutating call going to the one cloud that listed the instance. Every
composite inventory is one (ec2.accounts.MultiAccountCloud: one EC2 per account; WithRentedHosts: a cloud beside
the rented hosts; FleetCloud: instances beside Kubernetes workloads), so that the routing of a change, the one thing
that must never guess, is written once. A subclass says which cloud owns an instance.

`merge_listings`: how each of them lists its parts, written once: each part in order, one that cannot be listed
makes the listing partial (its error in `last_errors`, the others still judged), never empty; every part failing
raises, where the composite says so (a fleet with no answer at all is a failed listing, not an empty one).

`FleetCloud` and `FleetMetrics` are one Cloud and one MetricsSource over both: an id starting with `k8s:` is a
workload (places.kubernetes.cloud.WorkloadCloud, usage per pod from places.kubernetes.usage combined per workload by
decide.workloads.workload_usage), anything else an EC2 instance. The act stage, its dry-run, cap, audit rows,
read-back and reconcile then hold for workloads unchanged. Built by run/compose.py (`live_fleet`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .kubernetes.cloud import WorkloadCloud
from .kubernetes.names import is_workload_id
from .registry import HOST_ID_PREFIX, SLURM_ID_PREFIX
from ..model import Cloud, GpuInstance, InstanceUsage, MetricsSource

if TYPE_CHECKING:
    from .hosts import StaticHostsCloud

log = logging.getLogger("gpufinops.kubernetes")
log_hosts = logging.getLogger("gpufinops.places.hosts")  # WithRentedHosts' lines, under the name they always had
log_places = logging.getLogger("gpufinops.places")
log_slurm = logging.getLogger("gpufinops.slurm")


class WorkloadMetrics:
    """Usage per workload over a window: its pods' GPUs side by side, read in PodMetrics' fixed queries over the
    snapshot the workloads were last listed from."""

    def __init__(self, pod_metrics, cloud: WorkloadCloud):
        self.pod_metrics = pod_metrics  # places.kubernetes.usage.PodMetrics
        self.cloud = cloud

    def window_usage(self, instances: Sequence[GpuInstance], window_s: int, now: datetime) -> dict[str, InstanceUsage]:
        from ..decide.workloads import workload_usage

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


@dataclass(frozen=True)
class Listing:
    """One part of a merged listing. `list` is called with what the parts before it listed (the cluster prices its
    nodes at EC2's own rates); `partial`, once it answered, gives its own partial errors (a region, an account) as
    entries of `last_errors`; `failed(exc)`, when it did not answer, gives its entry (and logs it). A part without
    `failed` cannot fail partially: its error is the listing's (the configured hosts are read from the config)."""

    list: Callable[[list[GpuInstance]], list[GpuInstance]]
    failed: Callable[[Exception], Any] | None = None
    partial: Callable[[], Sequence[Any]] = tuple


def merge_listings(parts: Sequence[Listing], *,
                   every_failed: Callable[[list[Any], Exception], Exception] | None = None,
                   ) -> tuple[list[GpuInstance], list[Any]]:
    """(every instance listed, in the parts' order; the errors: each part's partial errors and failures, in order).
    A part that cannot be listed never hides the others. When every part failed, `every_failed(errors, the last
    failure)` is raised; without it the listing is just empty, with the errors."""
    listed: list[GpuInstance] = []
    errors: list[Any] = []
    failures = 0
    last: Exception | None = None
    for part in parts:
        try:
            found = part.list(list(listed))
        except Exception as exc:  # noqa: BLE001 - the other parts are still listed; the tick reports the gap
            if part.failed is None:
                raise
            errors.append(part.failed(exc))
            failures, last = failures + 1, exc
            continue
        errors.extend(part.partial())
        listed.extend(found)
    if parts and failures == len(parts) and every_failed is not None and last is not None:
        raise every_failed(errors, last)
    return listed, errors


def errors_of(cloud: object) -> list[str]:
    """A cloud's own partial errors of its last listing (its regions that failed), as text."""
    return [str(e) for e in getattr(cloud, "last_errors", []) or []]


class RoutedCloud:
    def member_clouds(self) -> Sequence[object]:
        """The clouds this one routes to (for what holds for all of them)."""
        return [c for c in vars(self).values() if hasattr(c, "describe") and c is not self]

    @property
    def max_request_s(self) -> float:
        """The longest a mutating request may be in flight on any member (act's reconcile waits that long)."""
        return max((float(getattr(c, "max_request_s", 0.0)) for c in self.member_clouds()), default=0.0) or 120.0

    def cloud_of(self, inst: GpuInstance) -> Cloud:
        """The cloud that owns `inst`; raise rather than guess (a change must never go to the wrong place)."""
        raise NotImplementedError

    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        self.cloud_of(inst).set_tags(inst, tags)

    def set_tags_fenced(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        # Only a place whose registry entry says `fenced_at_cloud` is asked (its cloud has the method).
        self.cloud_of(inst).set_tags_fenced(inst, tags)

    def remove_tags(self, inst: GpuInstance, keys: Sequence[str]) -> None:
        self.cloud_of(inst).remove_tags(inst, keys)

    def stop(self, inst: GpuInstance) -> None:
        self.cloud_of(inst).stop(inst)

    def suspend(self, inst: GpuInstance) -> None:
        # Only a place whose registry entry lists suspend in `own_calls` is asked (a GCE VM).
        self.cloud_of(inst).suspend(inst)

    def terminate(self, inst: GpuInstance) -> None:
        self.cloud_of(inst).terminate(inst)

    def power_off(self, inst: GpuInstance) -> None:
        """An Azure VM's power-off (places.azure.cloud): the one place that takes it, as the registry says."""
        self.cloud_of(inst).power_off(inst)


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
        ec2: list[GpuInstance] = []
        workloads: list[GpuInstance] = []
        ec2_failed: list[Exception] = []

        def list_ec2(_before: list[GpuInstance]) -> list[GpuInstance]:
            ec2.extend(self.ec2.list_gpu_instances())
            return ec2

        def list_workloads(before: list[GpuInstance]) -> list[GpuInstance]:
            # The node's own EC2 rate (spot included) prices its pods' shares where the inventory has it.
            workloads.extend(self.workloads.list_workloads({i.instance_id: i.hourly_cost for i in before}))
            return workloads

        def ec2_not_listed(exc: Exception) -> str:
            ec2_failed.append(exc)
            return f"EC2: {exc}"

        def workloads_not_listed(exc: Exception) -> str:
            if not ec2_failed:  # both failing raises the cluster's error: said there, not logged as well
                log.error("kubernetes workloads not listed: %s", exc)
            return f"kubernetes: {exc}"

        _, self.last_errors = merge_listings(
            [Listing(list_ec2, failed=ec2_not_listed, partial=lambda: errors_of(self.ec2)),
             Listing(list_workloads, failed=workloads_not_listed)],
            every_failed=lambda _errors, last: last)
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


class WithRentedHosts(RoutedCloud):
    """One Cloud over a cloud's inventory (EC2; None when no cloud is configured) and the rented hosts: ids starting
    with "host:" are the hosts'. A cloud that cannot be listed makes the listing partial (`last_errors`), never
    empty: the hosts are still judged."""

    def __init__(self, cloud, hosts: StaticHostsCloud):
        self.cloud = cloud
        self.hosts = hosts
        self.last_errors: list[str] = []

    def cloud_of(self, inst: GpuInstance):
        if inst.instance_id.startswith(HOST_ID_PREFIX) or self.cloud is None:
            return self.hosts
        return self.cloud

    def list_gpu_instances(self) -> list[GpuInstance]:
        def cloud_failed(exc: Exception) -> str:
            log_hosts.error("cloud inventory not listed: %s", exc)
            return f"cloud inventory: {exc}"

        parts = [Listing(lambda _: self.cloud.list_gpu_instances(), failed=cloud_failed,
                         partial=lambda: errors_of(self.cloud))] if self.cloud is not None else []
        listed, self.last_errors = merge_listings([*parts, Listing(lambda _: self.hosts.list_gpu_instances())])
        return listed

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        ours = [i for i in instance_ids if i.startswith(HOST_ID_PREFIX)]
        theirs = [i for i in instance_ids if not i.startswith(HOST_ID_PREFIX)]
        found = {i.instance_id: i for i in self.hosts.describe(ours)}
        if theirs and self.cloud is not None:
            found.update({i.instance_id: i for i in self.cloud.describe(theirs)})
        return [found[i] for i in instance_ids if i in found]


class WithPlace(RoutedCloud):
    """One Cloud over another inventory (what run/compose built before: EC2, the rented hosts; None where nothing
    else is configured) and one more place's cloud, whose subjects' ids begin with `prefix` (a GCE VM's "gce:", an
    Azure VM's "azure:"): a change goes to the one cloud that listed the subject, never a guess. A side that cannot
    be listed makes the listing partial (`last_errors`), never empty; both failing raises."""

    def __init__(self, other: Cloud | None, place: Cloud, *, prefix: str, name: str,
                 brief: Callable[[BaseException], str] = str):
        self.other = other
        self.place = place
        self.prefix = prefix
        self.name = name
        self.brief = brief  # the error in one line for the log (a cloud SDK's can run to many)
        self.last_errors: list[str] = []

    def cloud_of(self, inst: GpuInstance) -> Cloud:
        if inst.instance_id.startswith(self.prefix):
            return self.place
        if self.other is None:
            raise ValueError(f"{inst.instance_id} is no {self.name} subject and no other place is configured")
        return self.other

    def list_gpu_instances(self) -> list[GpuInstance]:
        def failed(name: str) -> Callable[[Exception], str]:
            def said(exc: Exception) -> str:
                log_places.error("%s inventory not listed: %s", name, self.brief(exc))
                return f"{name}: {exc}"
            return said

        parts = [Listing(lambda _: self.other.list_gpu_instances(), failed=failed("cloud"),
                         partial=lambda: errors_of(self.other))] if self.other is not None else []
        parts.append(Listing(lambda _: self.place.list_gpu_instances(), failed=failed(self.name),
                             partial=lambda: errors_of(self.place)))
        listed, self.last_errors = merge_listings(parts, every_failed=lambda _errors, last: last)
        return listed

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        ours = [i for i in instance_ids if i.startswith(self.prefix)]
        theirs = [i for i in instance_ids if not i.startswith(self.prefix)]
        found = {i.instance_id: i for i in (self.place.describe(ours) if ours else [])}
        if theirs and self.other is not None:
            found.update({i.instance_id: i for i in self.other.describe(theirs)})
        return [found[i] for i in instance_ids if i in found]


class WithSlurm(RoutedCloud):
    """One Cloud over another (EC2, hosts, the Kubernetes fleet; None when only Slurm is configured) and the Slurm
    clusters (places.slurm.cloud.SlurmCloud, one per cluster): ids `slurm:<cluster>/...` are the cluster's. A part
    that cannot be listed makes the listing partial (`last_errors`), never empty; a cluster in an outage lists its
    jobs as last seen, unread, and its jobs are UNKNOWN (their usage says why)."""

    def __init__(self, cloud, clusters: Sequence[Any]):
        self.cloud = cloud
        self.clusters = {c.cluster: c for c in clusters}
        self.last_errors: list[str] = []

    def member_clouds(self) -> Sequence[object]:
        return [c for c in (self.cloud, *self.clusters.values()) if c is not None]

    def _cluster_of(self, instance_id: str):
        from .slurm.jobs import parse_subject_id

        cluster, _job = parse_subject_id(instance_id)
        if cluster not in self.clusters:
            raise KeyError(f"{instance_id}: Slurm cluster {cluster!r} is not configured")
        return self.clusters[cluster]

    def cloud_of(self, inst: GpuInstance):
        if inst.instance_id.startswith(SLURM_ID_PREFIX):
            return self._cluster_of(inst.instance_id)
        if self.cloud is None:
            raise KeyError(f"{inst.instance_id}: no cloud is configured for it")
        return self.cloud

    @property
    def workloads(self) -> WorkloadCloud | None:
        """The Kubernetes side beside Slurm, if any (run.nodes' GPU-node pass reads it)."""
        if isinstance(self.cloud, WorkloadCloud):
            return self.cloud
        workloads = getattr(self.cloud, "workloads", None)
        return workloads if isinstance(workloads, WorkloadCloud) else None

    def end_job(self, inst: GpuInstance, action, recheck=None) -> None:
        """A Slurm job requeued, held or cancelled (act.Actuator alone calls it)."""
        self._cluster_of(inst.instance_id).end_job(inst, action, recheck)

    def list_gpu_instances(self) -> list[GpuInstance]:
        parts = []
        if self.cloud is not None:
            def cloud_failed(exc: Exception) -> str:
                log_slurm.error("inventory beside Slurm not listed: %s", exc)
                return f"inventory: {exc}"
            parts.append(Listing(lambda _: self.cloud.list_gpu_instances(), failed=cloud_failed,
                                 partial=lambda: errors_of(self.cloud)))
        for cluster in self.clusters.values():
            def slurm_failed(exc: Exception, name=cluster.cluster) -> str:
                return f"slurm {name}: {exc}"
            parts.append(Listing(lambda _, c=cluster: c.list_gpu_instances(), failed=slurm_failed,
                                 partial=lambda c=cluster: [f"slurm {c.cluster}: {e}" for e in errors_of(c)]))
        listed, self.last_errors = merge_listings(parts, every_failed=lambda _errors, last: last)
        return listed

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        ours: dict[str, list[str]] = {}
        theirs = []
        for iid in instance_ids:
            if iid.startswith(SLURM_ID_PREFIX):
                ours.setdefault(self._cluster_of(iid).cluster, []).append(iid)
            else:
                theirs.append(iid)
        found = {}
        for name, ids in ours.items():
            found.update({i.instance_id: i for i in self.clusters[name].describe(ids)})
        if theirs and self.cloud is not None:
            found.update({i.instance_id: i for i in self.cloud.describe(theirs)})
        return [found[i] for i in instance_ids if i in found]


class WithSlurmMetrics:
    """One MetricsSource over the other subjects (None: only Slurm) and the Slurm jobs (SlurmJobMetrics)."""

    def __init__(self, other: MetricsSource | None, slurm: MetricsSource):
        self.other = other
        self.slurm = slurm

    def window_usage(self, instances: Sequence[GpuInstance], window_s: int, now: datetime) -> dict[str, InstanceUsage]:
        jobs = [i for i in instances if i.instance_id.startswith(SLURM_ID_PREFIX)]
        rest = [i for i in instances if not i.instance_id.startswith(SLURM_ID_PREFIX)]
        out = dict(self.other.window_usage(rest, window_s, now)) if rest and self.other is not None else {}
        if jobs:
            try:
                out.update(self.slurm.window_usage(jobs, window_s, now))
            except Exception as exc:  # noqa: BLE001 - a job read failing leaves them UNKNOWN, never idle
                log_slurm.exception("Slurm job usage failed for window %ss", window_s)
                out.update({i.instance_id: InstanceUsage(i.instance_id, window_s, 0, error=f"Slurm job usage: {exc}")
                            for i in jobs})
        return out
