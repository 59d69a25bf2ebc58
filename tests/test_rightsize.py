"""Right-sizing decisions from long-window usage against the real catalog. Pure: no peers needed."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpufinops.catalog import load_catalog
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
