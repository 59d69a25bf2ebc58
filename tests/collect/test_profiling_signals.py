"""DCGM profiling counters (issue 25): read beside GPU_UTIL in the same fixed queries, range-checked, preferred as
the activity figure; power as a witness against counters that read 0 under load; the causes of low use.

The fleet is shaped like the measured H200 phases (../shared/data/nvidia_smi/captures_device/): a bf16 matmul
(engine 99.5 %, SM 96 %, occupancy 14 %, tensor 93 %, DRAM 17 %, 690 W), 50 % duty, 20 GiB held with no kernel
(all 0, 120 W), and the dcgm-exporter issue #662 case: every counter 0 while the GPU draws 340 W of its 400 W.
Served by a real Prometheus (promtool backfill) and a real VictoriaMetrics, judged by the real `evaluate`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufinops.collect.prometheus import (
    DRAM_ACTIVE, FB_USED, GPU_UTIL, GR_ENGINE_ACTIVE, PIPE_ACTIVE, POWER_USAGE, SM_ACTIVE, SM_OCCUPANCY,
    TENSOR_ACTIVE, PrometheusMetrics,
)
from gpufinops.config import PrometheusSettings
from gpufinops.decide.evaluate import POWER_WITNESS_TDP_FRACTION, evaluate
from gpufinops.model import (
    Aggregation, GpuInstance, GpuWindowStats, InstanceUsage, ReasonCode, Rule, Verdict,
)
from tests.promserver import Series, dcgm_labels
from tests.collect.test_collect_prometheus import ENGINES, NOW, SCRAPE, WINDOW, grid, start_engine
from tests.test_metric_ranges import Service

pytestmark = pytest.mark.integration

H200, A100 = "NVIDIA H200", "NVIDIA A100-SXM4-80GB"
RULE = Rule(name="default", threshold_pct=10, window_s=WINDOW, aggregation=Aggregation.STAYS_BELOW)
GIB = 1024.0
FP64_BLANK = 2.0 ** 47  # DCGM_FP64_BLANK: what DCGM writes for a double field it cannot read


def host(n: int, model: str) -> GpuInstance:
    return GpuInstance(f"i-0bbb0000000000{n:03d}", "p5e.48xlarge" if model == H200 else "p4de.24xlarge",
                       "us-east-1", "running", NOW - timedelta(days=2), private_dns=f"ip-10-5-0-{n}.ec2.internal",
                       private_ip=f"10.5.0.{n}", gpu_count=1, hourly_cost=5.0)


BUSY, SMALL, FP32, DUTY, HOLD, ZERO_662, DISAGREE, SM_SENTINEL, UTIL_ONLY = (
    host(1, H200), host(2, H200), host(3, H200), host(4, H200), host(5, H200), host(6, A100), host(7, H200),
    host(8, H200), host(9, A100))
FLEET = [BUSY, SMALL, FP32, DUTY, HOLD, ZERO_662, DISAGREE, SM_SENTINEL, UTIL_ONLY]


def gpu_series(inst: GpuInstance, model: str, figures: dict[str, float | list[float]]) -> list[Series]:
    """One GPU's series: each figure a constant or one value per scrape of the window."""
    labels = dcgm_labels(inst.private_dns.split(".")[0], 0, instance_id=inst.instance_id, model=model)
    times = grid()
    out = []
    for metric, value in figures.items():
        values = value if isinstance(value, list) else [value] * len(times)
        out.append(Series(metric, labels, list(zip(times, values))))
    return out


def profiled(gr, sm, occ, tensor, dram, util, power, fb=0.0, **pipes) -> dict:
    return {GR_ENGINE_ACTIVE: gr, SM_ACTIVE: sm, SM_OCCUPANCY: occ, TENSOR_ACTIVE: tensor, DRAM_ACTIVE: dram,
            GPU_UTIL: util, POWER_USAGE: power, FB_USED: fb, **{PIPE_ACTIVE[p]: v for p, v in pipes.items()}}


def alternating(on: float, n: int = WINDOW // SCRAPE) -> list[float]:
    return [on if i % 2 == 0 else 0.0 for i in range(n)]


def fleet_series() -> list[Series]:
    s = []
    s += gpu_series(BUSY, H200, profiled(0.995, 0.961, 0.142, 0.933, 0.174, 100.0, 690.0, 60 * GIB))
    # Kernels all the time on 12 % of the SMs with 10 GB: small batches, or a MIG slice's worth of work.
    s += gpu_series(SMALL, H200, profiled(1.0, 0.12, 0.03, 0.10, 0.05, 100.0, 250.0, 10 * GIB))
    # SMs half busy, tensor pipes idle, FP32 pipes busy: FP32 math on a tensor-core GPU.
    s += gpu_series(FP32, H200, profiled(0.55, 0.50, 0.25, 0.01, 0.20, 55.0, 380.0, 30 * GIB, fp32=0.45))
    # 50 % duty: bursts between gaps (the existing bursty reason, now with SM figures).
    s += gpu_series(DUTY, H200, profiled(alternating(0.995), alternating(0.84), alternating(0.12),
                                         alternating(0.80), alternating(0.20), alternating(100.0), 470.0, 40 * GIB))
    # 20 GiB held, no kernel: every counter 0 at 120 W (17 % of 700 W) -> still IDLE.
    s += gpu_series(HOLD, H200, profiled(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 120.0, 20 * GIB))
    # dcgm-exporter #662: every activity counter reads 0 while the GPU draws 340 W of its 400 W.
    s += gpu_series(ZERO_662, A100, profiled(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 340.0, 70 * GIB))
    # GR engine reads 0, GPU_UTIL 95 %: the counters disagree.
    s += gpu_series(DISAGREE, H200, profiled(0.0, 0.0, 0.0, 0.0, 0.0, 95.0, 150.0, 8 * GIB))
    # SM_ACTIVE blank on one scrape: left out, the others give the mean exactly. Profiling fields are doubles, so
    # DCGM's blank is the fp64 one, 2^47. (VictoriaMetrics stores a block's values as integers x one power of ten:
    # beside the int64 blank, 9.2e18, a 0.5 would read back 0 there; beside 2^47 it keeps its digits.)
    sm = [FP64_BLANK if i == 3 else 0.5 for i in range(WINDOW // SCRAPE)]
    s += gpu_series(SM_SENTINEL, H200, profiled(0.6, sm, 0.2, 0.4, 0.1, 60.0, 400.0, 30 * GIB))
    # No profiling at all (default-CSV-less exporter): GPU_UTIL is the activity figure.
    s += gpu_series(UTIL_ONLY, A100, {GPU_UTIL: 30.0, FB_USED: 4 * GIB, POWER_USAGE: 150.0})
    return s


@pytest.fixture(scope="module", params=ENGINES)
def judged(request, tmp_path_factory):
    server = start_engine(request.param, tmp_path_factory.mktemp(f"prof-{request.param}"), fleet_series())
    try:
        source = PrometheusMetrics(PrometheusSettings(url=server.url, scrape_interval_s=SCRAPE))
        usage = source.window_usage(FLEET, WINDOW, NOW)
        # Five queries whatever the fleet, plus the raw read of the one GPU whose SM activity held a sentinel.
        assert source.queries_made == 5 + 1
        yield {i.instance_id: (usage[i.instance_id], evaluate(i, usage[i.instance_id], RULE, NOW)) for i in FLEET}
    finally:
        server.stop()


def test_profiling_ratios_are_read_beside_activity(judged):
    use, d = judged[BUSY.instance_id]
    (g,) = use.gpus
    assert not g.invalid and g.samples == 20
    assert (g.activity_signal, g.second_activity_signal) == (GR_ENGINE_ACTIVE, GPU_UTIL)
    assert g.activity_mean == pytest.approx(99.5) and g.second_activity_mean == 100.0
    assert (g.sm_active, g.sm_occupancy, g.tensor_active) == pytest.approx((0.961, 0.142, 0.933))
    assert g.dram_active is None  # exported, but in no verdict or cause: not read by the tick (right-sizing reads it)
    assert g.tdp_w == 700.0 and g.pipes == ()  # per-precision pipes not exported here: not read, never zero
    assert (d.verdict, d.code, d.activity_signal) == (Verdict.ACTIVE, ReasonCode.BUSY, GR_ENGINE_ACTIVE)


def test_gpu_util_is_the_figure_where_there_is_nothing_better(judged):
    use, d = judged[UTIL_ONLY.instance_id]
    (g,) = use.gpus
    assert g.activity_signal == GPU_UTIL and g.second_activity_signal == ""
    assert g.sm_active is None and g.tensor_active is None
    assert d.activity_signal == GPU_UTIL


def test_a_sentinel_in_a_profiling_ratio_is_not_a_measurement(judged):
    use, _d = judged[SM_SENTINEL.instance_id]
    (g,) = use.gpus
    assert not g.invalid and g.sm_active == pytest.approx(0.5)  # 19 valid samples of 0.5, the blank left out


def test_memory_held_at_idle_power_is_still_idle(judged):
    _use, d = judged[HOLD.instance_id]
    assert (d.verdict, d.code) == (Verdict.IDLE, ReasonCode.MEMORY_HELD_IDLE)
    assert f"activity from {GR_ENGINE_ACTIVE}" in d.reason  # which counter the verdict used, in the reason


def test_counters_at_zero_under_power_are_unknown_not_idle(judged):
    _use, d = judged[ZERO_662.instance_id]
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.POWER_WITHOUT_ACTIVITY)
    assert "activity reads 0% but the GPU draws 340 W on average, 85% of its 400 W TDP" in d.reason
    assert "the counters may be wrong" in d.reason


def test_counters_that_disagree_are_unknown_not_idle(judged):
    _use, d = judged[DISAGREE.instance_id]
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.COUNTERS_DISAGREE)
    assert f"{GR_ENGINE_ACTIVE} stays under 10% but {GPU_UTIL} reaches 95%" in d.reason


def test_few_sms_busy_is_low_use_with_its_figures(judged):
    _use, d = judged[SMALL.instance_id]
    assert (d.verdict, d.code) == (Verdict.UNDERUTILIZED, ReasonCode.FEW_SMS_BUSY)
    assert "kernels run 100% of the time but only 12% of SM cycles are busy, occupancy 3%" in d.reason


def test_idle_tensor_pipes_while_sms_work_say_fp32_math(judged):
    _use, d = judged[FP32.instance_id]
    assert (d.verdict, d.code) == (Verdict.UNDERUTILIZED, ReasonCode.TENSOR_IDLE)
    assert "SMs busy 50% of cycles but tensor pipes only 1%, FP32 pipes 45%" in d.reason
    assert "bf16, TF32 or mixed precision" in d.reason


def test_bursts_keep_the_bursty_reason_with_sm_figures(judged):
    _use, d = judged[DUTY.instance_id]
    assert (d.verdict, d.code) == (Verdict.UNDERUTILIZED, ReasonCode.BURSTY_LOW)
    assert "mean 50%, SM activity 42%, occupancy 6% but bursts to 100%" in d.reason


# --------------------------------------------------------------------------- pure: the witness and its edges


def h200(**kw) -> GpuWindowStats:
    figures = dict(gpu="0", samples=20, activity_max=0.0, activity_mean=0.0, activity_min=0.0,
                   activity_signal=GR_ENGINE_ACTIVE, fb_used_max_mib=20 * GIB, power_mean_w=120.0, tdp_w=700.0,
                   second_activity_signal=GPU_UTIL, second_activity_max=0.0, second_activity_mean=0.0,
                   sm_active=0.0)
    return GpuWindowStats(**{**figures, **kw})


def judge(g: GpuWindowStats):
    return evaluate(BUSY, InstanceUsage(BUSY.instance_id, WINDOW, 20, (g,)), RULE, NOW)


@pytest.mark.parametrize("power, verdict", [
    (120.0, Verdict.IDLE),  # holding memory, no kernel: 17 % of TDP
    (700.0 * POWER_WITNESS_TDP_FRACTION - 1, Verdict.IDLE),
    (700.0 * POWER_WITNESS_TDP_FRACTION, Verdict.UNKNOWN),
    (470.0, Verdict.UNKNOWN),  # what 50 % duty draws
])
def test_power_witness_threshold(power, verdict):
    assert judge(h200(power_mean_w=power)).verdict is verdict


def test_the_power_witness_at_the_boundary_reads_without_contradiction():
    d = judge(h200(power_mean_w=700.0 * POWER_WITNESS_TDP_FRACTION, tdp_w=700.0))
    assert d.verdict is Verdict.UNKNOWN
    assert (f"draws 280 W on average, 40% of its 700 W TDP, at or above the 40% an idle GPU stays under (the "
            f"catalog's TDP): the counters may be wrong") in d.reason
    assert "draws under" not in d.reason  # "40 %, ... an idle GPU draws under 40 %" read as a contradiction


def test_without_a_tdp_or_a_power_figure_the_witness_cannot_speak():
    assert judge(h200(power_mean_w=500.0, tdp_w=None)).verdict is Verdict.IDLE
    assert judge(h200(power_mean_w=None)).verdict is Verdict.IDLE


def test_sm_activity_must_agree_too():
    d = judge(h200(sm_active=0.2))
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.COUNTERS_DISAGREE)
    assert "SM activity averages 20%" in d.reason


@pytest.mark.parametrize("field", ["sm_active", "sm_occupancy", "tensor_active", "dram_active"])
def test_a_ratio_above_one_is_invalid_data(field):
    d = judge(h200(**{field: 1.5}))
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.INVALID_DATA)
    assert "above 1, the most a ratio can be" in d.reason and "1.5" not in d.reason


def test_power_without_activity_is_alerted_once_per_episode(tmp_path):
    service = Service(tmp_path)
    d = judge(h200(power_mean_w=600.0))
    by_id = {BUSY.instance_id: BUSY}

    def tick():
        from gpufinops.model import RunContext
        from gpufinops.run.pipeline import alert_missing_data
        from gpufinops.notify.delivery import read_outbox

        before = len(read_outbox(service.outbox))
        alert_missing_data(RunContext(now=service.now), service.settings, [d], by_id, service.store, service.notifier)
        service.now += timedelta(minutes=1)
        return read_outbox(service.outbox)[before:]

    first, second = tick(), tick()
    assert len(first) == 1 and second == []
    assert "draws 600 W" in first[0]["text"]
