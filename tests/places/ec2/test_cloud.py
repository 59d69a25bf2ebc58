"""Ec2Cloud against a real moto server over HTTP, and the bundled price catalog."""

from __future__ import annotations

import socket
from collections import Counter
from datetime import timezone
from pathlib import Path

import boto3
import pytest

from gpufinops.places.ec2.cloud import CloudError, Ec2Cloud, InventoryError, TypeInfoCache
from gpufinops.config import AwsSettings
from gpufinops.model import TAG_MARKED, TAG_PROTECT
from gpufinops.prices.prices import (
    DEFAULT_CSV,
    KARPENTER_FILE,
    VANTAGE_FILE,
    OnDemandPrices,
    PriceCatalogError,
    build_rows,
    render_csv,
)

pytestmark = pytest.mark.integration

SHARED_PRICES = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "gpu_prices"


@pytest.fixture(scope="module")
def catalog() -> OnDemandPrices:
    return OnDemandPrices.load_default()


class CallLog:
    """Counts EC2 operations (and keeps their parameters) through botocore's event hooks."""

    def __init__(self, session: boto3.session.Session) -> None:
        self.calls: Counter = Counter()
        self.params: list[tuple[str, str, dict]] = []
        session.events.register("provide-client-params.ec2.*", self._record)

    def _record(self, params, model, context, **_):
        region = context.get("client_region") if context else None
        self.calls[(model.name, region)] += 1
        self.params.append((model.name, region, dict(params)))

    def count(self, operation: str, region: str | None = None) -> int:
        return sum(n for (op, reg), n in self.calls.items() if op == operation and (region is None or reg == region))


@pytest.fixture
def session(aws) -> boto3.session.Session:
    return boto3.session.Session(region_name="us-east-1")


def make_cloud(aws, session, regions=("us-east-1",), **kwargs) -> Ec2Cloud:
    kwargs.setdefault("type_cache", TypeInfoCache())
    kwargs.setdefault("max_attempts", 2)
    settings = AwsSettings(regions=tuple(regions), endpoint_url=aws.endpoint_url, **kwargs.pop("aws_kwargs", {}))
    return Ec2Cloud(settings, session=session, **kwargs)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------- listing


def test_lists_gpu_instances_in_every_region_across_pages(aws, session, catalog):
    east = [aws.launch("g5.xlarge", tags={"n": str(i)})[0] for i in range(7)]
    west = [aws.launch("p4d.24xlarge", region="eu-west-1")[0] for _ in range(6)]
    aws.launch("m5.large")
    aws.launch("t3.micro", region="eu-west-1")
    calls = CallLog(session)

    cloud = make_cloud(aws, session, regions=("us-east-1", "eu-west-1"), page_size=5, prices=catalog)
    listed = cloud.list_gpu_instances()

    assert sorted(i.instance_id for i in listed) == sorted(east + west)
    assert {i.instance_id: i.region for i in listed} == {**{i: "us-east-1" for i in east}, **{i: "eu-west-1" for i in west}}
    # 7 and 6 reservations at 5 a page: two pages in each region.
    assert calls.count("DescribeInstances", "us-east-1") == 2
    assert calls.count("DescribeInstances", "eu-west-1") == 2
    assert all(p["MaxResults"] == 5 for op, _, p in calls.params if op == "DescribeInstances")
    assert cloud.complete and cloud.last_errors == []


def test_only_listed_states_are_asked_for(aws, session):
    gone = aws.launch("g5.xlarge")[0]
    kept = aws.launch("g5.xlarge")[0]
    aws.client("ec2").terminate_instances(InstanceIds=[gone])
    aws.client("ec2").stop_instances(InstanceIds=[kept])

    listed = make_cloud(aws, session).list_gpu_instances()

    assert [(i.instance_id, i.state) for i in listed] == [(kept, "stopped")]


def test_gpu_info_from_describe_instance_types_counts_beyond_families(aws, session):
    g5 = aws.launch("g5.xlarge")[0]
    p5 = aws.launch("p5.48xlarge")[0]
    aws.launch("m5.large")
    aws.launch("inf2.xlarge")  # Inferentia: an accelerator, not a GPU

    # Only p5 is a configured family; g5 counts because EC2 reports GpuInfo for it.
    listed = make_cloud(aws, session, aws_kwargs={"gpu_families": ("p5",)}).list_gpu_instances()

    assert sorted(i.instance_id for i in listed) == sorted([g5, p5])


@pytest.mark.parametrize(
    "instance_type, count, model, memory_gib",
    [
        ("p4d.24xlarge", 8, "A100", 40.0),
        ("p5.48xlarge", 8, "H100", 80.0),
        ("g5.xlarge", 1, "A10G", 22.35),  # 22888 MiB as EC2 reports it
        ("g6e.xlarge", 1, "L40S", 44.7),  # 45776 MiB
    ],
)
def test_gpu_details_per_type(aws, session, instance_type, count, model, memory_gib):
    iid = aws.launch(instance_type)[0]

    (inst,) = make_cloud(aws, session).list_gpu_instances()

    assert (inst.instance_id, inst.gpu_count, inst.gpu_model, inst.gpu_memory_gib) == (iid, count, model, memory_gib)


def test_type_unknown_to_ec2_falls_back_to_the_bundled_catalog(aws, session, catalog):
    # moto's DescribeInstanceTypes does not know g4ad.xlarge: the whole call fails
    # with InvalidInstanceType, the known types are asked again, g4ad comes from the CSV.
    g4ad = aws.launch("g4ad.xlarge")[0]
    p5 = aws.launch("p5.48xlarge")[0]
    calls = CallLog(session)

    by_id = {i.instance_id: i for i in make_cloud(aws, session, prices=catalog).list_gpu_instances()}

    assert (by_id[g4ad].gpu_count, by_id[g4ad].gpu_model, by_id[g4ad].gpu_memory_gib) == (1, "Radeon Pro V520", 8.0)
    assert (by_id[p5].gpu_count, by_id[p5].gpu_model) == (8, "H100")
    assert calls.count("DescribeInstanceTypes") == 2


def test_type_info_is_cached_across_listings(aws, session):
    aws.launch("g5.xlarge")
    aws.launch("m5.large")
    calls = CallLog(session)
    cloud = make_cloud(aws, session)

    cloud.list_gpu_instances()
    cloud.list_gpu_instances()

    assert calls.count("DescribeInstanceTypes") == 1
    assert calls.count("DescribeInstances") == 2


def test_instance_fields_tags_spot_and_prices(aws, session, catalog):
    spot = aws.launch("g5.xlarge", spot=True, tags={"team": "vision", TAG_PROTECT: "yes"}, private_ip="10.0.3.7")[0]
    ondemand = aws.launch("p5.48xlarge")[0]
    history = aws.client("ec2").describe_spot_price_history(InstanceTypes=["g5.xlarge"])["SpotPriceHistory"]

    by_id = {i.instance_id: i for i in make_cloud(aws, session, prices=catalog).list_gpu_instances()}

    s, o = by_id[spot], by_id[ondemand]
    assert s.lifecycle == "spot" and o.lifecycle == "on-demand"
    assert s.tags == {"team": "vision", TAG_PROTECT: "yes"} and s.is_protected and s.team() == "vision"
    assert s.private_ip == "10.0.3.7" and s.private_dns.startswith("ip-10-0-3-7")
    assert s.state == "running" and s.account == aws.client("sts").get_caller_identity()["Account"]
    assert s.launch_time.tzinfo is not None and s.launch_time.utcoffset() == timezone.utc.utcoffset(None)
    # On-demand from the bundled catalog; spot from EC2's spot price history.
    assert o.hourly_cost == catalog.hourly("p5.48xlarge", "us-east-1") == 55.04
    assert s.hourly_cost in {float(h["SpotPrice"]) for h in history}


def test_unknown_price_is_none_never_zero(aws, session, catalog):
    aws.launch("g5.xlarge", spot=True)
    aws.launch("p5.48xlarge", region="ap-south-2")  # not in the bundled catalog for that region
    assert catalog.hourly("p5.48xlarge", "ap-south-2") is None

    cloud = make_cloud(aws, session, regions=("us-east-1", "ap-south-2"), prices=catalog, spot_prices=False)
    costs = {i.region: i.hourly_cost for i in cloud.list_gpu_instances()}

    assert costs == {"us-east-1": None, "ap-south-2": None}


def test_failing_region_is_reported_and_others_still_listed(aws, session):
    east = aws.launch("g5.xlarge")[0]
    aws.launch("g5.xlarge", region="eu-west-1")
    dead = f"http://127.0.0.1:{_closed_port()}"

    cloud = make_cloud(aws, session, regions=("eu-west-1", "us-east-1"), region_endpoints={"eu-west-1": dead})
    listed = cloud.list_gpu_instances()

    assert [i.instance_id for i in listed] == [east]
    assert not cloud.complete
    assert [(e.region, e.operation) for e in cloud.last_errors] == [("eu-west-1", "DescribeInstances")]
    assert "127.0.0.1" in cloud.last_errors[0].message
    # Reconciliation must not take an unreachable instance for a vanished one.
    with pytest.raises(InventoryError, match="eu-west-1"):
        cloud.describe([east, "i-0123456789abcdef0"])


def test_every_region_failing_is_an_error_not_an_empty_fleet(aws, session):
    dead = f"http://127.0.0.1:{_closed_port()}"
    cloud = make_cloud(
        aws, session, regions=("us-east-1", "eu-west-1"), region_endpoints={"us-east-1": dead, "eu-west-1": dead}
    )

    with pytest.raises(InventoryError, match="every region"):
        cloud.list_gpu_instances()
    assert [e.region for e in cloud.last_errors] == ["us-east-1", "eu-west-1"]


# ---------------------------------------------------------------------- mutating calls and describe


def test_tags_stop_and_terminate_are_visible_through_describe(aws, session):
    a, b = aws.launch("g5.xlarge", tags={"team": "nlp"}, count=2)
    calls = CallLog(session)
    cloud = make_cloud(aws, session)
    inst_a, inst_b = sorted(cloud.list_gpu_instances(), key=lambda i: i.instance_id != a)

    cloud.set_tags(inst_a, {TAG_MARKED: "2026-01-01T00:15:00Z", "gpufinops:rule": "idle-30m"})
    assert make_cloud(aws, session).describe([a])[0].tags == {
        "team": "nlp",
        TAG_MARKED: "2026-01-01T00:15:00Z",
        "gpufinops:rule": "idle-30m",
    }

    cloud.remove_tags(inst_a, [TAG_MARKED, "gpufinops:rule"])
    cloud.stop(inst_a)
    cloud.terminate(inst_b)

    fresh = {i.instance_id: i for i in cloud.describe([a, b])}
    assert fresh[a].tags == {"team": "nlp"}
    assert fresh[a].state in ("stopping", "stopped") and fresh[b].state in ("shutting-down", "terminated")
    assert aws.state(a) == "stopped"
    # A plain stop: never forced, never hibernated.
    (stop_params,) = [p for op, _, p in calls.params if op == "StopInstances"]
    assert stop_params == {"InstanceIds": [a], "Force": False, "Hibernate": False}


def test_describe_finds_ids_in_any_configured_region_and_skips_missing(aws, session):
    west = aws.launch("p4d.24xlarge", region="eu-west-1", tags={"k": "v"})[0]
    east = aws.launch("g5.xlarge")[0]
    missing = "i-0123456789abcdef0"

    # A fresh cloud has never listed: it does not know the regions of these ids.
    got = make_cloud(aws, session, regions=("us-east-1", "eu-west-1")).describe([missing, west, east])

    assert [(i.instance_id, i.region, i.gpu_model) for i in got] == [(west, "eu-west-1", "A100"), (east, "us-east-1", "A10G")]
    assert got[0].tags == {"k": "v"}


def test_errors_name_the_instance(aws, session):
    real = aws.launch("g5.xlarge")[0]
    cloud = make_cloud(aws, session)
    (inst,) = cloud.list_gpu_instances()
    ghost = type(inst)(**{**inst.__dict__, "instance_id": "i-0123456789abcdef0"})

    with pytest.raises(CloudError, match="i-0123456789abcdef0") as err:
        cloud.stop(ghost)
    assert err.value.code == "InvalidInstanceID.NotFound" and err.value.operation == "StopInstances"
    with pytest.raises(CloudError, match="TerminateInstances i-0123456789abcdef0 \\(us-east-1\\)"):
        cloud.terminate(ghost)
    assert aws.state(real) == "running"


# ---------------------------------------------------------------------- bundled price catalog


def test_bundled_catalog_is_the_regeneration_of_the_shared_data():
    if not (SHARED_PRICES / KARPENTER_FILE).exists():
        pytest.skip(f"{SHARED_PRICES} not present")
    rows = build_rows(SHARED_PRICES / KARPENTER_FILE, SHARED_PRICES / VANTAGE_FILE)
    assert DEFAULT_CSV.read_text() == render_csv(rows)


def test_catalog_lookups(catalog):
    assert catalog.hourly("p4d.24xlarge", "us-east-1") == 21.957642
    assert catalog("g5.xlarge", "us-east-1", "on-demand") == 1.006
    assert catalog.hourly("g5.xlarge", "us-east-1", "spot") is None  # no spot prices bundled
    assert catalog.hourly("m5.large", "us-east-1") is None  # not a GPU type
    assert catalog.hourly("trn1.2xlarge", "us-east-1") is None  # accelerator, not GPU
    # Vantage's instance totals are turned into per-GPU memory.
    spec = catalog.gpu_spec("p5en.48xlarge")
    assert (spec.gpu_count, spec.gpu_model, spec.gpu_memory_gib) == (8, "H200", 141)
    assert catalog.gpu_spec("g5.12xlarge").gpu_memory_gib == 24
    assert all(catalog.hourly(t, "us-east-1") is None or catalog.hourly(t, "us-east-1") > 0 for t in catalog.instance_types())


def test_malformed_catalog_names_file_and_line(tmp_path):
    bad = tmp_path / "prices.csv"
    bad.write_text(DEFAULT_CSV.read_text().splitlines()[5] + "\n# comment\ng5.xlarge,us-east-1,abc,NVIDIA,A10G,1,24,x\n")
    with pytest.raises(PriceCatalogError, match=rf"{bad}:3: could not convert"):
        OnDemandPrices.load(bad)
    bad.write_text("instance_type,region\n")
    with pytest.raises(PriceCatalogError, match=rf"{bad}:1: missing columns"):
        OnDemandPrices.load(bad)
