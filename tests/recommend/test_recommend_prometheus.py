"""Right-sizing and commitments from a REAL Prometheus holding 14-30 days of backfilled DCGM usage."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.prices.catalog import load_catalog
from gpufinops.config import PrometheusSettings
from gpufinops.model import GpuInstance
from gpufinops.recommend.engine import recommend_fleet
from gpufinops.recommend.policy import RecommendPolicy
from gpufinops.recommend.usage import PrometheusUsage
from tests.promserver import Series, dcgm_labels

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)
STEP = 600  # 10-minute samples: coarse, but 14+ days of them
POLICY = RecommendPolicy(scrape_interval_s=STEP)
GIB = 1024.0


def _series(labels, days, util, mem_mib, metric_util="DCGM_FI_DEV_GPU_UTIL"):
    end = NOW.timestamp()
    ts = [end - k * STEP for k in range(int(days * 86400 / STEP))][::-1]
    return [
        Series(metric_util, labels, [(t, util(i)) for i, t in enumerate(ts)]),
        Series("DCGM_FI_DEV_FB_USED", labels, [(t, mem_mib(i)) for i, t in enumerate(ts)]),
    ]


def _wave(lo, hi, period=37):
    return lambda i: lo + (hi - lo) * (0.5 + 0.5 * math.sin(i / period * 2 * math.pi))


INSTANCES = [
    GpuInstance("i-over", "a2-ultragpu-1g", "us-central1", "running", NOW - timedelta(days=60), provider="gcp",
                tags={"team": "search", "workload": "inference"}),
    GpuInstance("i-unused", "p4d.24xlarge", "us-east-1", "running", NOW - timedelta(days=60),
                private_dns="ip-10-0-0-5.ec2.internal", private_ip="10.0.0.5", tags={"team": "research"}),
    GpuInstance("i-busy", "p5.48xlarge", "us-east-1", "running", NOW - timedelta(days=60),
                tags={"team": "llm", "workload": "inference"}),
    GpuInstance("i-young", "g5.xlarge", "us-east-1", "running", NOW - timedelta(days=2), tags={"team": "search"}),
]


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    from tests.promserver import binaries_missing, start_prometheus

    if binaries_missing():
        pytest.skip(binaries_missing())
    series = []
    # Over-provisioned memory: an A100 80GB that peaks at 14 GiB and ~15% activity.
    series += _series(dcgm_labels("gke-a", 0, instance_id="i-over"), 15, _wave(5, 20), _wave(9 * GIB, 14 * GIB))
    # Unused GPUs: 8x A100 where GPUs 0-1 work hard and 2-7 never do; matched by the new `hostname` label.
    for g in range(8):
        labels = dcgm_labels("ip-10-0-0-5.ec2.internal", g, model="NVIDIA A100-SXM4-40GB", hostname_label="hostname")
        if g < 2:
            series += _series(labels, 15, _wave(70, 92), _wave(25 * GIB, 30 * GIB))
        else:
            series += _series(labels, 15, lambda i: 0.0, lambda i: 3.0)
    # Genuinely busy for 30 days: kept, and its steady presence is a commitment baseline.
    for g in range(8):
        labels = dcgm_labels("ip-10-0-9-9", g, instance_id="i-busy", model="NVIDIA H100 80GB HBM3")
        series += _series(labels, 30, _wave(88, 99), _wave(60 * GIB, 72 * GIB))
    # Too young: two days of data is not enough to judge.
    series += _series(dcgm_labels("ip-10-0-3-3", 0, instance_id="i-young", model="NVIDIA A10G"), 2,
                      _wave(0, 5), _wave(1 * GIB, 2 * GIB))
    server = start_prometheus(tmp_path_factory.mktemp("prom-recommend"), series)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fleet(prom):
    source = PrometheusUsage(PrometheusSettings(url=prom.url))
    usage = source.fleet_usage(INSTANCES, POLICY.window_days * 86400, NOW, STEP, 30 * 86400)
    return usage


def test_fixed_number_of_queries_and_long_window_stats(fleet):
    assert fleet.queries_made == 4
    over = fleet.instances["i-over"]
    assert len(over.gpus) == 1 and over.error is None
    g = over.gpus[0]
    assert 13.5 * GIB <= g.mem_max_mib <= 14 * GIB
    assert g.mem_p99_mib <= g.mem_max_mib
    assert 15 <= g.activity_p95 <= 20 and g.samples >= POLICY.min_coverage * over.expected_samples
    unused = fleet.instances["i-unused"]
    assert len(unused.gpus) == 8
    assert sum(1 for x in unused.gpus if x.activity_max >= POLICY.worked_activity_pct) == 2
    assert len(fleet.hourly_gpus["i-busy"]) == 30 * 24
    assert min(fleet.hourly_gpus["i-busy"]) == 8
    assert sum(1 for h in fleet.hourly_gpus["i-unused"] if h) < 16 * 24


def test_recommendations_for_each_shape(fleet):
    catalog = load_catalog()
    recs = {(r.instance_id, r.action): r for r in recommend_fleet(INSTANCES, fleet, catalog, POLICY, NOW)}
    actions = {iid: action for iid, action in recs}

    over = recs[("i-over", "rightsize")]
    assert "L4" in over.recommended and over.monthly_savings > 0
    assert over.risk == "medium" and "peak 14.0 GiB" in over.reason

    unused = recs[("i-unused", "rightsize")]
    p4d = catalog.offer("aws", "p4d.24xlarge", "us-east-1")
    assert "2 of 8 GPUs did work" in unused.reason
    assert unused.recommended_monthly < p4d.on_demand_usd_h * POLICY.hours_per_month
    assert unused.monthly_savings > 0

    assert actions["i-busy"] == "keep" and recs[("i-busy", "keep")].monthly_savings == 0
    # Two days at under 5%: too short to right-size, long enough to say it does no work (issue 26): stop it when
    # idle (it is not opted in), never a smaller GPU, with the history's length and a confidence.
    young = recs[("i-young", "stop_when_idle")]
    assert young.recommended == "stop when idle: opt it in with gpufinops:allow-stop=true"
    assert young.confidence == "medium" and 40 <= young.history_h <= 48 and "2 d of history" in young.reason
    assert young.monthly_savings == young.current_monthly > 0 and "smaller GPU" in young.reason

    commit = recs[("", "commit")]
    assert commit.instance_type == "p5.48xlarge" and commit.recommended.startswith("commit 1x")
    assert commit.monthly_savings > 0


def test_prometheus_down_gives_insufficient_data_for_everyone():
    source = PrometheusUsage(PrometheusSettings(url="http://127.0.0.1:9", timeout_s=1))
    fleet = source.fleet_usage(INSTANCES, 14 * 86400, NOW, STEP)
    recs = recommend_fleet(INSTANCES, fleet, load_catalog(), POLICY, NOW)
    per_instance = [r for r in recs if r.instance_id]
    assert len(per_instance) == len(INSTANCES)
    assert all(r.action == "insufficient_data" and "prometheus" in r.reason for r in per_instance)
    assert not [r for r in recs if r.action == "commit"]


def test_recommend_cli_end_to_end_with_moto_and_prometheus(aws, prometheus_factory, tmp_path, capsys):
    """`gpufinops recommend --format json`: EC2 inventory from moto, usage from a real Prometheus, stored."""
    import json
    from datetime import datetime as real_datetime

    from gpufinops.cli import main
    from gpufinops.recommend.engine import latest_recommendations
    from gpufinops.store.store import Store

    iid = aws.launch("p4d.24xlarge", tags={"team": "research"}, private_ip="10.0.7.7")[0]
    dns = aws.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["PrivateDnsName"]
    end = real_datetime.now(timezone.utc).timestamp()  # the CLI uses the wall clock at its edge
    ts = [end - k * STEP for k in range(15 * 86400 // STEP)][::-1]
    series = []
    for g in range(8):
        labels = dcgm_labels(dns, g, model="NVIDIA A100-SXM4-40GB")
        util, mem = (_wave(70, 92), _wave(20 * GIB, 25 * GIB)) if g == 0 else ((lambda i: 0.0), (lambda i: 3.0))
        series.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, util(i)) for i, t in enumerate(ts)]))
        series.append(Series("DCGM_FI_DEV_FB_USED", labels, [(t, mem(i)) for i, t in enumerate(ts)]))
    prom = prometheus_factory(series)
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(
        f"database_url: sqlite:///{tmp_path}/g.db\n"
        f"aws: {{regions: [us-east-1], endpoint_url: '{aws.endpoint_url}'}}\n"
        f"prometheus: {{url: '{prom.url}', scrape_interval_s: {STEP}}}\n"
        # Prices younger than this limit: no automatic refresh (moto has no Pricing API). test_idle_advice checks it.
        f"recommend: {{price_cache_path: '{tmp_path}/prices.json', price_max_age_days: 3660}}\n"
    )
    assert main(["--config", str(cfg), "recommend", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    mine = [r for r in rows if r["instance_id"] == iid]
    assert len(mine) == 1 and mine[0]["action"] == "rightsize"
    assert "1 of 8 GPUs did work" in mine[0]["reason"] and mine[0]["monthly_savings"] > 0
    store = Store(f"sqlite:///{tmp_path}/g.db")
    try:
        assert [r.instance_id for r in latest_recommendations(store) if r.instance_id] == [iid]
    finally:
        store.close()

    # Prices older than the limit: no call to the AWS Pricing API nobody asked for (the old code refreshed by
    # itself when credentials were found, as here), one line on how old they are and how to refresh them.
    cfg.write_text(cfg.read_text().replace("price_max_age_days: 3660", "price_max_age_days: 1"))
    assert main(["--config", str(cfg), "--log-level", "ERROR", "recommend", "--no-store", "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)
    lines = [line for line in captured.err.splitlines() if "price" in line]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("warning: 1 recommendation(s) rest on prices older than 1 days (oldest ")
    assert "refresh AWS prices with --refresh-prices" in lines[0]
    assert "refreshing" not in captured.err and "price refresh" not in captured.err
    assert not (tmp_path / "prices.json").exists()  # nothing was fetched, so nothing was cached


# --------------------------------------------------------------------------- profiling counters (issue 25)
#
# Right-sizing with SM activity and memory together, read from a real Prometheus holding DCGM profiling series
# (ratios 0..1) beside DCGM_FI_DEV_GPU_UTIL: the same four queries, whatever the fleet exports.

PROFILED = [
    # One H100 whose kernels run nearly all the time (GPU_UTIL ~95%) on ~12% of its SMs with 10 GB: a smaller GPU.
    GpuInstance("i-few-sms", "p5.4xlarge", "us-east-1", "running", NOW - timedelta(days=60), tags={"team": "cv"}),
    # 8 H200s, one working on a quarter of its SMs with 50 GB: half an H200 (MIG 3g.71gb), priced in dollars.
    GpuInstance("i-h200", "p5en.48xlarge", "us-east-1", "running", NOW - timedelta(days=60), tags={"team": "llm"}),
    # The same H100 shape without SM activity exported: sized as before, said so.
    GpuInstance("i-no-prof", "p5.4xlarge", "us-east-1", "running", NOW - timedelta(days=60), tags={"team": "cv"}),
]


def _ratio_series(metric, labels, days, value):
    end = NOW.timestamp()
    ts = [end - k * STEP for k in range(int(days * 86400 / STEP))][::-1]
    return [Series(metric, labels, [(t, value(i)) for i, t in enumerate(ts)])]


@pytest.fixture(scope="module")
def profiled_fleet(tmp_path_factory):
    from tests.promserver import binaries_missing, start_prometheus

    if binaries_missing():
        pytest.skip(binaries_missing())
    series = []
    few = dcgm_labels("ip-10-1-0-1", 0, instance_id="i-few-sms", model="NVIDIA H100 80GB HBM3")
    series += _series(few, 15, _wave(90, 99), _wave(8 * GIB, 10 * GIB))
    series += _ratio_series("DCGM_FI_PROF_SM_ACTIVE", few, 15, _wave(0.06, 0.12))
    series += _ratio_series("DCGM_FI_PROF_SM_OCCUPANCY", few, 15, lambda i: 0.03)
    for g in range(8):
        labels = dcgm_labels("ip-10-1-0-2", g, instance_id="i-h200", model="NVIDIA H200")
        if g == 0:
            series += _series(labels, 15, _wave(80, 97), _wave(40 * GIB, 50 * GIB))
            series += _ratio_series("DCGM_FI_PROF_SM_ACTIVE", labels, 15, _wave(0.15, 0.25))
            series += _ratio_series("DCGM_FI_PROF_DRAM_ACTIVE", labels, 15, _wave(0.05, 0.2))
        else:
            series += _series(labels, 15, lambda i: 0.0, lambda i: 0.5 * GIB)
            series += _ratio_series("DCGM_FI_PROF_SM_ACTIVE", labels, 15, lambda i: 0.0)
    series += _series(dcgm_labels("ip-10-1-0-3", 0, instance_id="i-no-prof", model="NVIDIA H100 80GB HBM3"), 15,
                      _wave(90, 99), _wave(8 * GIB, 10 * GIB))
    server = start_prometheus(tmp_path_factory.mktemp("prom-profiled"), series)
    try:
        yield PrometheusUsage(PrometheusSettings(url=server.url)).fleet_usage(
            PROFILED, POLICY.window_days * 86400, NOW, STEP, 30 * 86400)
    finally:
        server.stop()


@pytest.mark.integration
def test_sm_activity_and_memory_from_prometheus_size_to_a_smaller_gpu_or_a_mig_slice(profiled_fleet):
    assert profiled_fleet.queries_made == 4  # the profiling legs ride in the GR engine query
    few = profiled_fleet.instances["i-few-sms"].gpus[0]
    assert few.signal == "DCGM_FI_DEV_GPU_UTIL" and few.activity_p95 > 90
    assert 0.11 <= few.sm_p95 <= 0.12 and few.sm_occupancy_mean == pytest.approx(0.03)
    assert few.sm_samples == profiled_fleet.instances["i-few-sms"].gpus[0].samples and few.dram_p95 is None
    h200 = profiled_fleet.instances["i-h200"].gpus
    assert 0.17 <= h200[0].dram_p95 <= 0.2 and all(g.sm_p95 == 0.0 for g in h200[1:])
    assert profiled_fleet.instances["i-no-prof"].gpus[0].sm_p95 is None

    recs = {r.instance_id: r for r in recommend_fleet(PROFILED, profiled_fleet, load_catalog(), POLICY, NOW)
            if r.instance_id}
    few_rec = recs["i-few-sms"]
    assert few_rec.action == "rightsize" and few_rec.recommended == "g6e.xlarge (1x L40S)"
    assert "compute from SM activity" in few_rec.reason and few_rec.monthly_savings > 0
    mig = recs["i-h200"]
    assert mig.action == "rightsize" and mig.recommended == "H200 MIG 3g.71gb (0.50 of a GPU, shared)"
    assert mig.monthly_savings == pytest.approx(mig.current_monthly * (1 - 0.5 / 8))
    plain = recs["i-no-prof"]
    assert plain.action == "keep" and plain.monthly_savings == 0
    assert "sized on activity alone (no DCGM_FI_PROF_SM_ACTIVE series" in plain.reason
