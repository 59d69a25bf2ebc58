"""Right-sizing decisions from long-window usage against the real catalog. Pure: no peers needed."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpufinops.prices.catalog import load_catalog
from gpufinops.model import GpuInstance
from gpufinops.recommend.policy import RecommendPolicy
from gpufinops.recommend.rightsize import rightsize
from gpufinops.recommend.usage import GpuLongStats, LongUsage

NOW = datetime(2026, 11, 29, tzinfo=timezone.utc)
POLICY = RecommendPolicy()
WINDOW = 14 * 86400
EXPECTED = WINDOW // 300


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def inst(itype, provider="aws", region="us-east-1", **kw):
    return GpuInstance(f"i-{itype}", itype, region, "running", NOW, provider=provider, **kw)


def gpu(i, mem_gib, p95, mx=None, samples=EXPECTED):
    mx = p95 if mx is None else mx
    return GpuLongStats(str(i), "", mem_gib * 1024, mem_gib * 1024 * 0.95, p95, mx, samples)


def usage(iid, gpus):
    return LongUsage(iid, WINDOW, EXPECTED, tuple(gpus))


def test_a100_80gb_peaking_14gb_at_15pct_moves_to_l4_or_a10g(catalog):
    i = inst("a2-ultragpu-1g", provider="gcp", region="us-central1")
    res = rightsize(i, usage(i.instance_id, [gpu(0, 14, 15, 40)]), catalog, POLICY)
    assert res.status == "ok" and res.candidate is not None
    assert res.candidate.gpu in ("L4", "A10G") and res.candidate.gpu_count == 1
    assert res.candidate.on_demand_usd_h < res.current.on_demand_usd_h
    assert res.risk == "medium" and "different GPU" in res.reason


def test_aws_8gpu_a100_with_one_working_gpu_goes_to_a_one_gpu_type(catalog):
    i = inst("p4de.24xlarge")
    gpus = [gpu(0, 14, 15, 40)] + [gpu(k, 0.5, 0) for k in range(1, 8)]
    res = rightsize(i, usage(i.instance_id, gpus), catalog, POLICY)
    assert res.candidate.gpu_count == 1 and res.candidate.gpu in ("L4", "A10G")
    assert res.candidate.instance_type in ("g6.xlarge", "g5.xlarge")


def test_only_two_of_eight_gpus_work_gives_a_two_gpu_type(catalog):
    i = inst("a2-highgpu-8g", provider="gcp", region="us-central1")
    gpus = [gpu(0, 30, 90), gpu(1, 30, 88)] + [gpu(k, 0.3, 0) for k in range(2, 8)]
    res = rightsize(i, usage(i.instance_id, gpus), catalog, POLICY)
    assert res.candidate.gpu_count == 2
    assert res.candidate.gpu.startswith("A100")  # only A100-class GPUs carry 2 x 90% of an A100 on GCP
    assert res.observed.gpus_worked == 2
    assert res.candidate.on_demand_usd_h < res.current.on_demand_usd_h / 3


def test_never_less_memory_than_the_observed_peak(catalog):
    # 15.5 GiB at low activity: a 16 GB T4 would be cheaper but cannot hold peak + headroom.
    i = inst("g5.xlarge")
    res = rightsize(i, usage(i.instance_id, [gpu(0, 15.5, 10)]), catalog, POLICY)
    target = res.candidate or res.current
    assert target.gpu != "T4"
    assert target.gpu_memory_gb * 1024 * POLICY.usable_memory_fraction >= 15.5 * 1024 * (1 + POLICY.memory_headroom)


def test_a_genuinely_busy_instance_is_kept(catalog):
    i = inst("p5.48xlarge")
    res = rightsize(i, usage(i.instance_id, [gpu(k, 70, 95, 100) for k in range(8)]), catalog, POLICY)
    assert res.status == "ok" and res.candidate is None and res.reason.startswith("keep")


def test_same_gpu_fewer_of_them_is_low_risk(catalog):
    i = inst("g6e.12xlarge")  # 4x L40S, one GPU at 50% with 30 GB: a 1x L40S type
    gpus = [gpu(0, 30, 50)] + [gpu(k, 0.3, 0) for k in range(1, 4)]
    res = rightsize(i, usage(i.instance_id, gpus), catalog, POLICY)
    assert res.candidate.gpu == "L40S" and res.candidate.gpu_count == 1
    assert res.risk == "low" and "same GPU model" in res.reason


def test_thin_compute_margin_is_high_risk(catalog):
    i = inst("g6e.12xlarge")  # one L40S at 85%: a 1x L40S fits, but with little compute to spare
    gpus = [gpu(0, 30, 85)] + [gpu(k, 0.3, 0) for k in range(1, 4)]
    res = rightsize(i, usage(i.instance_id, gpus), catalog, POLICY)
    assert res.candidate.gpu_count == 1 and res.risk == "high" and "little margin" in res.reason


def test_peak_near_gpu_memory_moves_to_a_bigger_gpu_not_a_smaller_one(catalog):
    i = inst("g6e.12xlarge")  # 40 GB peak + 20% headroom does not fit a 48 GB L40S
    gpus = [gpu(0, 40, 50)] + [gpu(k, 0.3, 0) for k in range(1, 4)]
    res = rightsize(i, usage(i.instance_id, gpus), catalog, POLICY)
    assert res.candidate.gpu_memory_gb > 48


@pytest.mark.parametrize("make_usage,expected", [
    (lambda iid: None, "no DCGM series"),
    (lambda iid: LongUsage(iid, WINDOW, EXPECTED, (), error="prometheus: ConnectionError"), "ConnectionError"),
    (lambda iid: usage(iid, [gpu(k, 10, 10) for k in range(2)]), "2 of 8 GPUs"),
    (lambda iid: usage(iid, [gpu(k, 10, 10, samples=EXPECTED // 7) for k in range(8)]), "of the samples"),
    (lambda iid: usage(iid, [GpuLongStats(str(k), "", None, None, 10, 10, EXPECTED) for k in range(8)]),
     "not measured"),
])
def test_not_enough_data_is_insufficient_not_a_guess(catalog, make_usage, expected):
    i = inst("p4d.24xlarge")
    res = rightsize(i, make_usage(i.instance_id), catalog, POLICY)
    assert res.status == "insufficient_data" and res.candidate is None
    assert expected in res.reason


def test_unknown_instance_type(catalog):
    i = inst("z9.mega")
    res = rightsize(i, usage(i.instance_id, [gpu(0, 1, 1)]), catalog, POLICY)
    assert res.status == "unknown_type" and "z9.mega" in res.reason


def test_region_without_catalog_prices_compares_bundled_regions(catalog):
    i = inst("p4de.24xlarge", region="eu-west-1")
    gpus = [gpu(0, 14, 15, 40)] + [gpu(k, 0.5, 0) for k in range(1, 8)]
    res = rightsize(i, usage(i.instance_id, gpus), catalog, POLICY)
    assert res.candidate is not None and "no catalog prices for eu-west-1" in res.reason


# --------------------------------------------------------------------------- SM activity and memory together (issue 25)
#
# DCGM_FI_PROF_SM_ACTIVE (ratio of SM cycles with work, over all SMs) beside the activity counter (share of time any
# kernel runs): a job on 12% of an H100's SMs reads ~95% on the counter. Where SM activity is measured on every
# working GPU, the compute to offer is its p95, and a GPU model MIG can split is also fitted to MIG slices.

from gpufinops.recommend.engine import recommend_instance  # noqa: E402
from gpufinops.prices.mig import MIG_PROFILES, GpuNeed, smallest_fit  # noqa: E402
from gpufinops.recommend.usage import FleetUsage  # noqa: E402


def prof(i, mem_gib, sm, p95=95.0, mx=100.0, occ=0.03, dram=None, sm_samples=EXPECTED):
    """A GPU whose activity counter reads p95 while SM activity reads `sm` (None: not exported)."""
    return GpuLongStats(str(i), "", mem_gib * 1024, mem_gib * 1024 * 0.95, p95, mx, EXPECTED, sm_p95=sm,
                        sm_samples=sm_samples if sm is not None else 0,
                        sm_occupancy_mean=occ if sm is not None else None, dram_p95=dram)


def idle_gpus(first, last, sm=0.0):
    return [prof(k, 0.5, sm, p95=0.0, mx=0.0, occ=None) for k in range(first, last)]


@pytest.mark.parametrize("itype,gpus,want_type,want_mig,needle", [
    # The issue's example: 12% of an H100's SMs and 10 GB is a smaller GPU (here an L40S, cheaper than 2/7 of the
    # H100), not "keep"; the MIG alternative is named.
    ("p5.4xlarge", [prof(0, 10, 0.12)], "g6e.xlarge", None, "or MIG 2g.20gb (0.29 of a GPU)"),
    # 50 GB at 25% of an H200's SMs: half an H200 (3g.71gb) is cheaper than the cheapest whole GPU holding 60 GiB
    # (one H100, p5.4xlarge).
    ("p5en.48xlarge", [prof(0, 50, 0.25)] + idle_gpus(1, 8), None, "3g.71gb",
     "fits MIG 3g.71gb of a H200: 0.50 of a GPU, saved once the GPU's other slices carry other work"),
    # Two H100s of eight, each 8 GB on 10% of the SMs: two 1g.20gb slices (half a GPU) beat four L4s.
    ("p5.48xlarge", [prof(0, 8, 0.10), prof(1, 8, 0.10)] + idle_gpus(2, 8), None, "1g.20gb",
     "fits MIG 1g.20gb + 1g.20gb"),
    # Memory bandwidth is sliced too: DRAM activity at 60% needs 6 of 8 memory slices, no slice but the whole GPU:
    # the one-H100 type it is then.
    ("p5en.48xlarge", [prof(0, 50, 0.25, dram=0.6)] + idle_gpus(1, 8), "p5.4xlarge", None, "1x H100 fits"),
])
def test_sm_activity_and_memory_pick_a_mig_slice_or_a_smaller_gpu(catalog, itype, gpus, want_type, want_mig,
                                                                    needle):
    i = inst(itype)
    res = rightsize(i, usage(i.instance_id, gpus), catalog, POLICY)
    assert res.status == "ok" and needle in res.reason, res.reason
    assert "compute from SM activity" in res.reason and "p95 SM activity" in res.reason
    if want_mig:
        assert res.candidate is None and res.mig is not None
        assert {p.name for p in res.mig.profiles} == {want_mig} and res.risk in ("medium", "high")
        assert res.mig.usd_h < res.current.on_demand_usd_h
    else:
        assert res.candidate.instance_type == want_type and res.mig is None


def test_a_mig_recommendation_is_priced_in_dollars_as_a_share_of_what_the_gpu_costs_now(catalog):
    i = inst("p5en.48xlarge")
    u = usage(i.instance_id, [prof(0, 50, 0.25)] + idle_gpus(1, 8))
    rec = recommend_instance(i, FleetUsage({i.instance_id: u}, {}), catalog, POLICY, NOW)
    per_gpu = catalog.offer("aws", "p5en.48xlarge", "us-east-1").on_demand_usd_h / 8
    assert rec.action == "rightsize" and rec.recommended == "H200 MIG 3g.71gb (0.50 of a GPU, shared)"
    assert rec.recommended_monthly == pytest.approx(0.5 * per_gpu * POLICY.hours_per_month)
    assert rec.monthly_savings == pytest.approx(rec.current_monthly - rec.recommended_monthly)
    assert f"${0.5 * per_gpu:,.2f}/h of the ${per_gpu:,.2f}/h one of its GPUs costs now" in rec.reason
    # On spot it is the share of the spot price it pays now.
    spot = GpuInstance("i-spot", "p5en.48xlarge", "us-east-1", "running", NOW, lifecycle="spot", hourly_cost=24.0)
    rec = recommend_instance(spot, FleetUsage({"i-spot": u}, {}), catalog, POLICY, NOW)
    assert rec.recommended_monthly == pytest.approx(0.5 * 3.0 * POLICY.hours_per_month)


@pytest.mark.parametrize("gpus,why", [
    ([prof(0, 10, None)], "no DCGM_FI_PROF_SM_ACTIVE series"),
    ([prof(0, 10, 0.12, sm_samples=EXPECTED // 2)], "DCGM_FI_PROF_SM_ACTIVE has 50% of the samples expected on GPU 0"),
    ([prof(0, 10, 0.12)] + [prof(k, 10, None) for k in range(1, 8)],
     "no valid DCGM_FI_PROF_SM_ACTIVE figure for GPU 1, 2, 3, 4"),
])
def test_without_sm_activity_the_sizing_is_the_activity_one_and_says_so(catalog, gpus, why):
    """Absent, too few or partial SM figures: exactly the activity-only result, and the reason says why."""
    itype = "p5.4xlarge" if len(gpus) == 1 else "p5.48xlarge"
    i = inst(itype)
    res = rightsize(i, usage(i.instance_id, gpus), catalog, POLICY)
    plain = [GpuLongStats(g.gpu, g.model_name, g.mem_max_mib, g.mem_p99_mib, g.activity_p95, g.activity_max,
                          g.samples) for g in gpus]
    before = rightsize(i, usage(i.instance_id, plain), catalog, POLICY)
    assert (res.candidate, res.risk, res.mig) == (before.candidate, before.risk, None)
    assert f"sized on activity alone ({why}" in res.reason and "no MIG slice considered" in res.reason
    assert res.observed.sm_p95_max is None and res.observed.demand_tflops == before.observed.demand_tflops


def test_smallest_mig_profile_holds_sm_activity_memory_and_bandwidth_with_headroom():
    def fit(gpu, mem_gib, sm, dram=None):
        p = smallest_fit(gpu, GpuNeed("0", mem_gib * 1024, sm, dram), 0.2, 0.1, 0.93)
        return p.name if p else None

    assert fit("H100", 7, 0.10) == "1g.10gb"  # 8.4 GiB <= 10 GB x 0.93; 11% <= 16/132 SMs
    assert fit("H100", 10, 0.10) == "1g.20gb"  # 12 GiB: a 1g slice with two memory slices
    assert fit("H100", 10, 0.12) == "2g.20gb"  # 13.2% > 16/132 SMs
    assert fit("H100", 30, 0.40) == "3g.40gb"
    assert fit("H100", 30, 0.42) == "4g.40gb"  # 46.2% > 60/132 SMs, <= 64/132
    assert fit("H100", 70, 0.10) is None  # only the whole GPU holds 84 GiB
    assert fit("A100-40GB", 3, 0.10, dram=0.2) == "1g.10gb"  # 22% of the bandwidth needs 2 of 8 memory slices
    assert fit("L4", 1, 0.01) is None  # no MIG on an L4
    assert [p.name for p in MIG_PROFILES["H200"]] == ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb",
                                                      "7g.141gb"]
