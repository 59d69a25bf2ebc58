"""The learned policy: waits where an instance's lulls are short, stops early where they are long, never peeks."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from gpufinops.backtest.adaptive import (
    AdaptiveParams, adaptive_verdicts, backtest_adaptive, decide, learned_masks, stop_reason, survival,
)
from gpufinops.backtest.engine import BacktestSettings, Prepared, backtest_rule, rule_verdicts
from gpufinops.backtest.traces import from_arrays
from gpufinops.evaluate import evaluate
from gpufinops.model import GpuInstance, GpuWindowStats, InstanceUsage, ReasonCode, Verdict
from gpufinops.rules import load_rules

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0


@pytest.fixture(scope="module")
def rules():
    return load_rules([ROOT / "rules"])


def cycles(busy_min: int, idle_min: int, n: int, lull_every: int = 0) -> np.ndarray:
    """n cycles of busy (80%, with 3-minute lulls every `lull_every` minutes) then idle (0%)."""
    busy = np.full(busy_min, 80.0)
    if lull_every:
        for k in range(lull_every, busy_min - 3, lull_every):
            busy[k:k + 3] = 0.0
    return np.tile(np.concatenate([busy, np.zeros(idle_min)]), n)


def test_learns_that_lulls_are_short_and_waits(rules):
    # Serving with 35-minute lulls: the fixed 10-minute rule stops at minute 25 of every lull and demand
    # returns 10 minutes later (false stop). The learned policy sees no lull ever outlasting 35 min + the
    # break-even, and only its first `min_history` lulls fall back to the fixed rule.
    trace = from_arrays(cycles(5, 35, 120), step_s=60, t0=T0)
    prep = Prepared(trace, BacktestSettings())
    fixed = backtest_rule(prep, rules[0])[0]
    learned = backtest_adaptive(prep, rules[0], AdaptiveParams(min_history=10))[0]
    assert fixed.false_stops >= 100 and fixed.false_stop_rate > 0.95
    assert learned.false_stops <= 10 and learned.restarts < fixed.restarts / 5


def test_learns_that_lulls_are_long_and_stops_sooner_than_a_long_window(rules):
    # Nightly: 4 h of work (with short lulls), then 8 h idle. A 1-hour fixed window waits 75 min a night;
    # the learned policy, once it has seen enough nights, stops 5 + 15 min into the lull.
    fallback = replace(rules[0], name="below-5-1h", threshold_pct=5.0, window_s=3600)
    trace = from_arrays(cycles(240, 480, 20, lull_every=20), step_s=60, t0=T0)
    prep = Prepared(trace, BacktestSettings())
    fixed = backtest_rule(prep, fallback)[0]
    learned, rep, run = backtest_adaptive(prep, fallback, AdaptiveParams(min_history=10, min_support=5))
    assert fixed.false_stops == 0 and learned.false_stops == 0
    assert learned.net_gpu_hours > fixed.net_gpu_hours
    assert learned.time_to_stop_min["p10"] == pytest.approx(20, abs=1)
    assert fixed.time_to_stop_min["p50"] == pytest.approx(75, abs=1)
    last = rep.stops[-1]
    reason = stop_reason(prep, run, last.instance, last.stop_at)
    m = re.fullmatch(r"idle 5 min; 100% of this instance's (\d+) past idle stretches longer than 20 min "
                     r"lasted over 50 min", reason)
    assert m and int(m.group(1)) >= 15, reason


def test_no_peeking_future_data_does_not_change_past_verdicts(rules):
    rng = np.random.default_rng(4)
    u = cycles(30, 90, 40, lull_every=7) * rng.uniform(0.5, 1.0, 40 * 120)
    cut = 2500
    other = u.copy()
    other[cut:] = rng.choice([0.0, 90.0], size=len(u) - cut)
    params = AdaptiveParams(min_history=5, min_support=3)
    a = adaptive_verdicts(Prepared(from_arrays(u, step_s=60, t0=T0), BacktestSettings()), rules[0], params).verdicts
    b = adaptive_verdicts(Prepared(from_arrays(other, step_s=60, t0=T0), BacktestSettings()), rules[0], params).verdicts
    ticks_before = cut  # tick j sees samples 0..j at a 60 s tick and step
    np.testing.assert_array_equal(a[:, :ticks_before], b[:, :ticks_before])
    assert (a[:, ticks_before:] != b[:, ticks_before:]).any()


def test_decide_explains_itself(rules):
    rule = rules[0]
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    inst = GpuInstance("i-1", "g5.xlarge", "us-east-1", "running", datetime(2025, 12, 31, tzinfo=timezone.utc),
                       gpu_count=1)
    usage = InstanceUsage("i-1", 600, 10, (GpuWindowStats("0", 10, activity_max=0.0, activity_mean=0.0),))
    base = evaluate(inst, usage, rule, now)
    assert base.verdict == Verdict.IDLE
    params = AdaptiveParams(min_history=10, min_support=5, p_min=0.8)
    nights = [8 * 3600.0] * 9 + [120.0] * 30  # 9 long idle nights, many short lulls
    d = decide(base, nights, 14 * 60, rule, params, 1800, now)
    assert d.verdict == Verdict.IDLE
    assert d.reason == "idle 14 min; 100% of this instance's 9 past idle stretches longer than 29 min lasted over 59 min"
    short = [20 * 60.0] * 30  # lulls never last
    d = decide(base, short, 14 * 60, rule, params, 1800, now)
    assert d.verdict == Verdict.UNDERUTILIZED and d.code == ReasonCode.LEARNED_WAIT
    d = decide(base, nights[:3], 14 * 60, rule, params, 1800, now)  # too little history: the fixed rule decides
    assert d.verdict == Verdict.IDLE and "fixed rule gpu-util-below-40pct-10m decides" in d.reason
    no_data = evaluate(inst, InstanceUsage("i-1", 600, 10, ()), rule, now)
    assert decide(no_data, nights, 14 * 60, rule, params, 1800, now).verdict == Verdict.UNKNOWN


def test_vectorised_policy_matches_decide_on_every_tick(rules):
    """The array path and the scalar decision agree tick by tick (before any stop)."""
    rule = rules[0]
    u = cycles(20, 70, 15, lull_every=6)
    settings = BacktestSettings()
    prep = Prepared(from_arrays(u, step_s=60, t0=T0), settings)
    params = AdaptiveParams(min_history=5, min_support=3, unusual_wait_s=1200)
    run = adaptive_verdicts(prep, rule, params)
    base = rule_verdicts(prep, rule)
    demand = u > settings.demand_pct
    history, start, latched = [], None, False
    for j, now in enumerate(prep.grid.times):
        k = int(prep.grid.hi[j]) - 1
        if demand[k]:
            start, latched = None, False
        elif start is None:
            start = k
        if k > 0 and demand[k] and not demand[k - 1]:  # a stretch just completed
            s0 = k - 1
            while s0 > 0 and not demand[s0 - 1]:
                s0 -= 1
            history.append((k - s0) * 60.0)
        if base[0, j] == 0:
            continue
        if start is None:
            assert run.verdicts[0, j] != 1
            continue
        age = now - (T0 + start * 60)
        sup, p = survival(np.sort(history), age, rule.warning_lead_s, settings.break_even_s)
        learned, fallback = learned_masks(sup, p, age, len(history), base[0, j] == 1, params, settings.break_even_s)
        latched = latched or bool(learned) or bool(fallback)
        assert (run.verdicts[0, j] == 1) == latched, (j, age)
