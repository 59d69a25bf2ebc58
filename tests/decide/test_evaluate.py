"""Table tests of the pure decision function."""

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from gpufinops.decide.evaluate import evaluate, evaluate_all, window_is_idle
from gpufinops.model import (
    Aggregation,
    GpuInstance,
    GpuWindowStats,
    InstanceUsage,
    ReasonCode,
    Rule,
    Selector,
    Verdict,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
RULE = Rule(name="r40", threshold_pct=40, window_s=600, aggregation=Aggregation.STAYS_BELOW, min_coverage=0.8)
MEAN_RULE = Rule(name="m40", threshold_pct=40, window_s=600, aggregation=Aggregation.MEAN, min_coverage=0.8)


def inst(gpus=1, age=timedelta(days=1), state="running", tags=None, itype="p4d.24xlarge"):
    return GpuInstance(instance_id="i-1", instance_type=itype, region="us-east-1", state=state,
                       launch_time=NOW - age, gpu_count=gpus, tags=tags or {}, hourly_cost=21.96)


def gpu(i=0, samples=20, mx=0.0, mean=0.0, mem=None):
    return GpuWindowStats(gpu=str(i), samples=samples, activity_max=mx, activity_mean=mean,
                          activity_min=0.0, fb_used_max_mib=mem)


def usage(*gpus, error=None, expected=20):
    return InstanceUsage("i-1", 600, expected, tuple(gpus), error)


@pytest.mark.parametrize(
    "instance,use,rule,verdict,code",
    [
        (inst(), usage(gpu(mx=5, mean=1)), RULE, Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW),
        (inst(), usage(gpu(mx=0, mean=0, mem=70 * 1024)), RULE, Verdict.IDLE, ReasonCode.MEMORY_HELD_IDLE),
        # input-bound trainer: bursts to 100% between gaps, mean 35% -> working, not idle
        (inst(), usage(gpu(mx=100, mean=35)), RULE, Verdict.UNDERUTILIZED, ReasonCode.BURSTY_LOW),
        # ...but a mean rule would call the same pattern idle: that is why the default is stays_below
        (inst(), usage(gpu(mx=100, mean=35)), MEAN_RULE, Verdict.IDLE, ReasonCode.IDLE_MEAN_BELOW),
        (inst(), usage(gpu(mx=95, mean=80)), RULE, Verdict.ACTIVE, ReasonCode.BUSY),
        (inst(gpus=2), usage(gpu(0, mx=90, mean=85), gpu(1, mx=80, mean=70)), RULE, Verdict.ACTIVE, ReasonCode.BUSY),
        (inst(gpus=2), usage(gpu(0, mx=90, mean=85), gpu(1, mx=0, mean=0)), RULE,
         Verdict.UNDERUTILIZED, ReasonCode.SOME_GPUS_BUSY),
        (inst(gpus=4), usage(gpu(0, mx=90, mean=50), gpu(1), gpu(2), gpu(3)), RULE,
         Verdict.UNDERUTILIZED, ReasonCode.SOME_GPUS_BUSY),
        # missing data is never idle
        (inst(), usage(), RULE, Verdict.UNKNOWN, ReasonCode.NO_SERIES),
        (inst(), usage(error="connection refused"), RULE, Verdict.UNKNOWN, ReasonCode.QUERY_ERROR),
        (inst(), None, RULE, Verdict.UNKNOWN, ReasonCode.QUERY_ERROR),
        (inst(), usage(gpu(samples=10)), RULE, Verdict.UNKNOWN, ReasonCode.LOW_COVERAGE),
        (inst(gpus=8), usage(*[gpu(i) for i in range(7)]), RULE, Verdict.UNKNOWN, ReasonCode.NO_SERIES),
        (inst(), usage(GpuWindowStats(gpu="0", samples=0)), RULE, Verdict.UNKNOWN, ReasonCode.NO_SERIES),
        # out-of-range figures from any source are no data (issue 11): sentinel/sentinel is not "1% mean"
        (inst(), usage(gpu(samples=9223372036854775807, mx=95, mean=1)), MEAN_RULE,
         Verdict.UNKNOWN, ReasonCode.INVALID_DATA),
        (inst(), usage(gpu(mx=9.223372036854775808e18, mean=1)), RULE, Verdict.UNKNOWN, ReasonCode.INVALID_DATA),
        (inst(), usage(GpuWindowStats(gpu="0", samples=0, invalid="the activity sum read from Prometheus is out of "
                                      "range (a DCGM sentinel, i.e. no data)")), MEAN_RULE,
         Verdict.UNKNOWN, ReasonCode.INVALID_DATA),
        # too young to judge, and stopped instances are not judged
        (inst(age=timedelta(minutes=4)), usage(gpu()), RULE, Verdict.UNKNOWN, ReasonCode.TOO_YOUNG),
        (inst(state="stopped"), usage(gpu()), RULE, Verdict.UNKNOWN, ReasonCode.NOT_RUNNING),
    ],
)
def test_verdicts(instance, use, rule, verdict, code):
    d = evaluate(instance, use, rule, NOW)
    assert (d.verdict, d.code) == (verdict, code), d.reason
    assert d.reason and d.evaluated_at == NOW and d.rule_name == rule.name


def test_mig_slices_count_as_their_physical_gpu():
    # One physical GPU split into 3 MIG slices: all three idle -> idle, and no "missing GPU".
    slices = [GpuWindowStats(gpu=f"0/{k}", samples=20, activity_max=0.0, activity_mean=0.0,
                             activity_signal="DCGM_FI_PROF_GR_ENGINE_ACTIVE") for k in (1, 2, 3)]
    d = evaluate(inst(gpus=1), usage(*slices), RULE, NOW)
    assert d.verdict == Verdict.IDLE


def test_reason_explains_memory_held():
    d = evaluate(inst(), usage(gpu(mx=0, mean=0, mem=70 * 1024)), RULE, NOW)
    assert "holds 70 GB" in d.reason and "0% active" in d.reason


def test_memory_veto_rule():
    rule = Rule(name="mem", threshold_pct=40, window_s=600, max_memory_mib=1000)
    d = evaluate(inst(), usage(gpu(mx=5, mean=1, mem=5000)), rule, NOW)
    assert d.verdict == Verdict.UNDERUTILIZED


def test_window_is_idle_vectorised_matches_scalar():
    mx = np.array([10.0, 50.0, np.nan, 39.9])
    mean = np.array([5.0, 20.0, 1.0, 39.0])
    vec = window_is_idle(mx, mean, 40, Aggregation.STAYS_BELOW)
    scalar = [window_is_idle(a, b, 40, Aggregation.STAYS_BELOW) for a, b in zip(mx, mean)]
    assert list(vec) == scalar == [True, False, False, True]
    assert list(window_is_idle(mx, mean, 40, Aggregation.MEAN)) == [True, True, True, True]


def test_evaluate_all_applies_selectors():
    rules = [RULE, Rule(name="only-g5", threshold_pct=40, window_s=600, selector=Selector(instance_families=("g5",)))]
    ds = evaluate_all([inst()], {600: {"i-1": usage(gpu())}}, rules, NOW)
    assert [d.rule_name for d in ds] == ["r40"]


def test_reasons_never_print_an_unvalidated_number():
    d = evaluate(inst(), usage(gpu(mx=9.223372036854775808e18, mean=1)), RULE, NOW)
    assert "9223372036854775808" not in d.reason and "%" not in d.reason
    assert d.reason.startswith("GPU 0: the activity maximum read from the metrics source is out of range")
