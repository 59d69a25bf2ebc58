"""The one listing merge (places.fleet.merge_listings) as each composite inventory uses it: a part that cannot be
listed makes the listing partial (its error in `last_errors`), never empty; every part failing raises where the
composite says so. FleetCloud (EC2 beside the cluster) and WithRentedHosts (a cloud beside the rented hosts); the
accounts' merge is tested against moto in tests/places/ec2/test_accounts.py."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest

from gpufinops.config import load_settings
from gpufinops.model import GpuInstance
from gpufinops.places.fleet import FleetCloud, Listing, WithRentedHosts, merge_listings
from gpufinops.places.hosts import static_hosts_cloud

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
NODE = GpuInstance("i-0aaa0000000000001", "p4d.24xlarge", "us-east-1", "running", T0, gpu_count=8, hourly_cost=32.0)
WORKLOAD = GpuInstance("k8s:ml/Deployment/web", "p4d.24xlarge", "us-east-1", "running", T0, gpu_count=1,
                       hourly_cost=4.0, provider="kubernetes")


class Ec2Side:
    """An EC2 inventory that answers (with its regions' partial errors) or fails."""

    def __init__(self, fails: str = "", region_errors: tuple[str, ...] = ()):
        self.fails = fails
        self.last_errors = list(region_errors)

    def list_gpu_instances(self) -> list[GpuInstance]:
        if self.fails:
            raise RuntimeError(self.fails)
        return [NODE]


class ClusterSide:
    """A cluster's workloads that answer (pricing the node at the EC2 rate handed over) or fail."""

    def __init__(self, fails: str = ""):
        self.fails = fails
        self.rates_seen: dict | None = None
        self.node_remainders: dict[str, float | None] = {}

    def list_workloads(self, node_rates=None) -> list[GpuInstance]:
        self.rates_seen = dict(node_rates or {})
        if self.fails:
            raise RuntimeError(self.fails)
        self.node_remainders = {NODE.instance_id: 28.0}
        return [WORKLOAD]


def test_the_parts_are_listed_in_order_and_a_failure_never_hides_the_others():
    seen = []

    def part(name: str, fails: bool = False) -> Listing:
        def listed(before):
            seen.append((name, [i.instance_id for i in before]))
            if fails:
                raise RuntimeError(f"{name} down")
            return [GpuInstance(f"i-{name}", "g5.xlarge", "us-east-1", "running", T0)]
        return Listing(listed, failed=lambda exc: f"failed: {exc}", partial=lambda: [f"{name}: one region"])

    listed, errors = merge_listings([part("a"), part("b", fails=True), part("c")])
    assert [i.instance_id for i in listed] == ["i-a", "i-c"]
    assert errors == ["a: one region", "failed: b down", "c: one region"]
    assert seen == [("a", []), ("b", ["i-a"]), ("c", ["i-a"])]  # each part sees what the parts before it listed
    # Every part failing: raised where the composite says so, else an empty listing with every error.
    with pytest.raises(LookupError, match="2 errors"):
        merge_listings([part("x", fails=True), part("y", fails=True)],
                       every_failed=lambda errs, last: LookupError(f"{len(errs)} errors, last {last}"))
    assert merge_listings([part("x", fails=True)]) == ([], ["failed: x down"])
    # A part without `failed` cannot fail partially: its error is the listing's.
    with pytest.raises(RuntimeError, match="z down"):
        merge_listings([Listing(lambda _: (_ for _ in ()).throw(RuntimeError("z down")))])


def test_fleet_cloud_ec2_down_still_lists_the_cluster():
    fleet = FleetCloud(Ec2Side(fails="EC2 answered 503"), ClusterSide())
    assert fleet.list_gpu_instances() == [WORKLOAD]
    assert fleet.last_errors == ["EC2: EC2 answered 503"]


def test_fleet_cloud_cluster_down_still_lists_ec2_at_its_full_rate(caplog):
    cluster = ClusterSide(fails="API server timed out")
    fleet = FleetCloud(Ec2Side(region_errors=("us-west-2: DescribeInstances throttled",)), cluster)
    with caplog.at_level(logging.ERROR, logger="gpufinops.kubernetes"):
        assert fleet.list_gpu_instances() == [NODE]  # no workloads listed: the node keeps its whole cost
    assert cluster.rates_seen == {NODE.instance_id: 32.0}  # the node's own EC2 rate was handed to the cluster
    assert fleet.last_errors == ["us-west-2: DescribeInstances throttled", "kubernetes: API server timed out"]
    assert "kubernetes workloads not listed: API server timed out" in caplog.text


def test_fleet_cloud_prices_the_node_at_its_remainder_when_both_answer():
    listed = FleetCloud(Ec2Side(), ClusterSide()).list_gpu_instances()
    assert [i.instance_id for i in listed] == [NODE.instance_id, WORKLOAD.instance_id]
    assert listed[0].hourly_cost == 28.0 and "node remainder" in listed[0].price_source


def test_fleet_cloud_both_down_raises_the_clusters_error_and_keeps_the_last_errors():
    fleet = FleetCloud(Ec2Side(), ClusterSide())
    fleet.list_gpu_instances()
    fleet.ec2.fails, fleet.workloads.fails = "EC2 down", "cluster down"
    with pytest.raises(RuntimeError, match="cluster down"):
        fleet.list_gpu_instances()
    assert fleet.last_errors == []  # the failed listing left the last good one's errors as they were


def test_with_rented_hosts_a_cloud_down_still_lists_the_hosts(caplog):
    hosts = static_hosts_cloud(load_settings(hosts={"inventory": [{"hostname": "gpu-box-1", "gpu_model": "H100",
                                                                   "gpu_count": 8, "usd_per_hour": 20.0}]}))
    assert hosts is not None
    both = WithRentedHosts(Ec2Side(region_errors=("eu-west-1: throttled",)), hosts)
    assert [i.instance_id for i in both.list_gpu_instances()] == [NODE.instance_id, "host:gpu-box-1"]
    assert both.last_errors == ["eu-west-1: throttled"]
    down = WithRentedHosts(Ec2Side(fails="no credentials"), hosts)
    with caplog.at_level(logging.ERROR, logger="gpufinops.places.hosts"):
        assert [i.instance_id for i in down.list_gpu_instances()] == ["host:gpu-box-1"]
    assert down.last_errors == ["cloud inventory: no credentials"]
    assert "cloud inventory not listed: no credentials" in caplog.text
    alone = WithRentedHosts(None, hosts)
    assert [i.instance_id for i in alone.list_gpu_instances()] == ["host:gpu-box-1"] and alone.last_errors == []
    assert alone.cloud_of(alone.hosts.instances[0]) is hosts and down.cloud_of(NODE) is down.cloud
