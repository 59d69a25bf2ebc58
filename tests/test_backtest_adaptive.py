"""The learned policy: waits where lulls are short, stops early where they are long, borrows the fleet's
history where its own is short, and never peeks."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from gpufinops.backtest.adaptive import (
    EMPTY_PRIOR,
    AdaptiveParams,
    Trust,
    adaptive_verdicts,
    backtest_adaptive,
    decide,
    fleet_prior,
    floor_s,
    near_in_time_of_day,
    prior_hour,
    stop_reason,
    trust_of,
)
from gpufinops.backtest.engine import (
    BacktestSettings,
    Prepared,
    backtest_rule,
    rule_verdicts,
)
from gpufinops.backtest.traces import from_arrays
from gpufinops.evaluate import evaluate
from gpufinops.model import (
    Aggregation,
    GpuInstance,
    GpuWindowStats,
    InstanceUsage,
    ReasonCode,
    Verdict,
)
from gpufinops.rules import load_rules

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0


@pytest.fixture(scope="module")
def rules():
    return load_rules([ROOT / "rules" / "examples" / "common-40pct-10min.yaml", ROOT / "rules" / "zero-activity.yaml"])


def cycles(busy_min: int, idle_min: int, n: int, lull_every: int = 0) -> np.ndarray:
    """n cycles of busy (80%, with 3-minute lulls every `lull_every` minutes) then idle (0%)."""
    busy = np.full(busy_min, 80.0)
    if lull_every:
        for k in range(lull_every, busy_min - 3, lull_every):
            busy[k:k + 3] = 0.0
    return np.tile(np.concatenate([busy, np.zeros(idle_min)]), n)


@pytest.mark.parametrize("params", [AdaptiveParams(prior_weight=0.0, min_history=10), AdaptiveParams(),
                                    AdaptiveParams(criterion="p", p_min=0.8)])
def test_learns_that_lulls_are_short_and_waits(rules, params):
    # Serving with 35-minute lulls: the fixed 10-minute rule stops at minute 25 of every lull and demand
    # returns 10 minutes later (false stop). The learned policy sees no lull ever outlasting 35 min + the
    # break-even, so stopping never pays.
    trace = from_arrays(cycles(5, 35, 120), step_s=60, t0=T0)
    prep = Prepared(trace, BacktestSettings())
    fixed = backtest_rule(prep, rules[0])[0]
    learned = backtest_adaptive(prep, rules[0], params)[0]
    assert fixed.false_stops >= 100 and fixed.false_stop_rate > 0.95
    assert learned.false_stops <= 10 and learned.restarts < fixed.restarts / 5


def test_learns_that_lulls_are_long_and_stops_sooner_than_a_long_window(rules):
    # Nightly: 4 h of work (with short lulls), then 8 h idle. A 1-hour fixed window waits 75 min a night;
    # the learned policy stops 5 + 15 min into the lull: stopping then is worth more than any later stop.
    fallback = replace(rules[0], name="below-5-1h", threshold_pct=5.0, window_s=3600)
    trace = from_arrays(cycles(240, 480, 20, lull_every=20), step_s=60, t0=T0)
    prep = Prepared(trace, BacktestSettings())
    fixed = backtest_rule(prep, fallback)[0]
    learned, rep, run = backtest_adaptive(prep, fallback, AdaptiveParams())
    assert fixed.false_stops == 0 and learned.false_stops == 0
    assert learned.net_gpu_hours > fixed.net_gpu_hours
    assert learned.time_to_stop_min["p50"] == pytest.approx(20, abs=1)
    assert fixed.time_to_stop_min["p50"] == pytest.approx(75, abs=1)
    last = rep.stops[-1]
    reason = stop_reason(prep, run, last.instance, last.stop_at)
    # Every 12 h: nights begin at two times of day, 12 h apart; those begun within 3 h of this one weigh fully.
    m = re.fullmatch(r"idle 5 min; 100% of this instance's (\d+) past idle stretches longer than 20 min "
                     r"\(begun (\d\d:\d\d)-(\d\d:\d\d) UTC\) lasted over 50 min \(fleet: 100% of (\d+)\); "
                     r"stopping now is worth more than waiting", reason)
    assert m and int(m.group(1)) >= 8, reason
    began = datetime.fromtimestamp(last.stop_at - 20 * 60, UTC)
    assert m.group(2) == (began - timedelta(hours=3)).strftime("%H:%M"), reason


def test_a_new_instance_borrows_the_fleets_history(rules):
    # Five old notebooks idle every night; a sixth appears on day 8 with the same habit. With the fleet prior
    # its first nights are stopped 20 min in, with the fleet's evidence in the reason; without it, the
    # fixed rule decides (after the break-even) until it has 10 nights of its own.
    fallback = replace(rules[0], name="below-5-1h", threshold_pct=5.0, window_s=3600)
    u = np.vstack([cycles(240, 480, 20, lull_every=20)] * 6)
    u[5, : 7 * 720] = np.nan
    prep = Prepared(from_arrays(u, step_s=60, t0=T0), BacktestSettings())
    _, rep, run = backtest_adaptive(prep, fallback, AdaptiveParams(prior_weight=5.0))
    new = [s for s in rep.stops if s.instance == prep.trace.instance_ids[5]]
    assert new[0].time_to_stop_s == pytest.approx(20 * 60)
    reason = stop_reason(prep, run, new[0].instance, new[0].stop_at)
    assert re.fullmatch(r"idle 5 min; no past idle stretch of this instance \(begun \S+ UTC\) lasted 20 min "
                        r"\(fleet: 100% of \d+\); stopping now is worth more than waiting", reason), reason
    _, rep0, run0 = backtest_adaptive(prep, fallback, AdaptiveParams(prior_weight=0.0, min_history=10))
    new0 = [s for s in rep0.stops if s.instance == prep.trace.instance_ids[5]]
    assert new0[0].time_to_stop_s > 60 * 60
    assert "fixed rule below-5-1h decides" in stop_reason(prep, run0, new0[0].instance, new0[0].stop_at)


def test_fleet_prior_counts_ongoing_stretches_as_at_least_that_long():
    # Five lulls of 30 min ended; five are still idle after 10 h. Dropping the ongoing ones would say
    # "no lull lasts an hour"; Kaplan-Meier says half of them do.
    prior = fleet_prior([1800.0] * 5, floor_s=1200.0, ongoing_s=[36000.0] * 5)
    assert prior.mass.sum() == pytest.approx(1.0)
    n, share = prior.share_outlasting(1500.0, 1800.0)
    assert n == 10 and share == pytest.approx(0.5)
    assert fleet_prior([1800.0] * 5, floor_s=1200.0).share_outlasting(1500.0, 1800.0)[1] == 0.0
    assert len(fleet_prior([1800.0] * 4, floor_s=1200.0).points) == 0  # too few stretches: no prior


def test_no_peeking_future_data_does_not_change_past_verdicts(rules):
    # Neither this instance's future nor any other instance's future changes a verdict already given.
    rng = np.random.default_rng(4)
    u = np.vstack([cycles(30, 90, 40, lull_every=7) * rng.uniform(0.5, 1.0, 40 * 120) for _ in range(3)])
    cut = 2500
    other = u.copy()
    other[:, cut:] = rng.choice([0.0, 90.0], size=(3, u.shape[1] - cut))
    other[2, cut:] = 0.0  # one instance idle for good from the cut: a long ongoing stretch for the prior
    for params in (AdaptiveParams(prior_weight=0.0, min_history=5, min_support=3),
                   AdaptiveParams(prior_weight=5.0, fleet_refresh_s=600.0)):
        a = adaptive_verdicts(Prepared(from_arrays(u, step_s=60, t0=T0), BacktestSettings()), rules[0], params)
        b = adaptive_verdicts(Prepared(from_arrays(other, step_s=60, t0=T0), BacktestSettings()), rules[0], params)
        ticks_before = cut  # tick j sees samples 0..j at a 60 s tick and step
        np.testing.assert_array_equal(a.verdicts[:, :ticks_before], b.verdicts[:, :ticks_before])
        assert (a.verdicts[:, ticks_before:] != b.verdicts[:, ticks_before:]).any()


def _base(rule):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    inst = GpuInstance("i-1", "g5.xlarge", "us-east-1", "running", datetime(2025, 12, 31, tzinfo=UTC),
                       gpu_count=1)
    usage = InstanceUsage("i-1", 600, 10, (GpuWindowStats("0", 10, activity_max=0.0, activity_mean=0.0),))
    return inst, evaluate(inst, usage, rule, now), now


def test_decide_explains_itself(rules):
    rule = rules[0]
    inst, base, now = _base(rule)
    assert base.verdict == Verdict.IDLE
    params = AdaptiveParams(prior_weight=0.0, min_history=10, min_support=5)
    nights = [8 * 3600.0] * 9 + [120.0] * 30  # 9 long idle nights, many short lulls
    d = decide(base, nights, 14 * 60, rule, params, 1800, now)
    assert d.verdict == Verdict.IDLE and d.code == ReasonCode.LEARNED_IDLE
    assert d.reason == ("idle 14 min; 100% of this instance's 9 past idle stretches longer than 29 min lasted over "
                        "59 min; stopping now is worth more than waiting")
    short = [40 * 60.0] * 30  # lulls never outlast a stop by the break-even
    d = decide(base, short, 14 * 60, rule, params, 1800, now)
    assert d.verdict == Verdict.UNDERUTILIZED and d.code == ReasonCode.LEARNED_WAIT
    assert d.reason.startswith("idle 14 min; 0% of this instance's 30 past idle stretches longer than 29 min")
    assert d.reason.endswith("waiting: a later stop is worth more (a false stop counts 2 GPU-h)")
    # Too little history: the fixed rule decides, but never before the break-even (unusual_wait), however short
    # its own window.
    d = decide(base, nights[:3], 14 * 60, rule, params, 1800, now)
    assert d.verdict == Verdict.UNDERUTILIZED and d.code == ReasonCode.LEARNED_WAIT
    assert d.reason == ("idle 14 min; only 3 past idle stretches and no fleet prior: fixed rule "
                        f"{rule.name} decides, but only after 30 min idle")
    d = decide(base, nights[:3], 30 * 60, rule, params, 1800, now)
    assert d.verdict == Verdict.IDLE and "only 3 past idle stretches and no fleet prior: fixed rule" in d.reason
    # ... unless the fleet's history speaks for it.
    prior = fleet_prior([8 * 3600.0] * 45 + [45 * 60.0] * 5, floor_s(params, rule.warning_lead_s))
    d = decide(base, nights[:3], 14 * 60, rule, replace(params, prior_weight=5.0), 1800, now, prior)
    assert d.code == ReasonCode.LEARNED_IDLE
    assert "(fleet: 90% of 50)" in d.reason
    no_data = evaluate(inst, InstanceUsage("i-1", 600, 10, ()), rule, now)
    assert decide(no_data, nights, 14 * 60, rule, params, 1800, now).verdict == Verdict.UNKNOWN


@pytest.mark.parametrize("params", [AdaptiveParams(prior_weight=0.0, min_history=5, min_support=3, unusual_wait_s=1200),
                                    AdaptiveParams(prior_weight=5.0, fleet_refresh_s=1800.0, unusual_wait_s=1200),
                                    AdaptiveParams(criterion="p", p_min=0.7, prior_weight=2.0),
                                    AdaptiveParams(prior_weight=5.0, time_of_day_s=0.0, unusual_wait_s=1200),
                                    AdaptiveParams(prior_weight=5.0, time_of_day_s=2 * 3600.0, other_times_weight=0.0),
                                    AdaptiveParams(prior_weight=5.0, trust_wait_s=3600.0, unusual_wait_s=1200),
                                    AdaptiveParams(prior_weight=0.0, min_history=5, trust_wait_s=1800.0,
                                                   trust_margin_h=0.5)])
def test_vectorised_policy_matches_decide_on_every_tick(rules, params):
    """The array path and the live `decide()` agree tick by tick (before any stop), fleet prior included."""
    rule = rules[0]
    rng = np.random.default_rng(1)
    u = np.concatenate([cycles(20, int(x), 1, lull_every=6) for x in rng.choice([15, 40, 70, 150], 30)])
    settings = BacktestSettings()
    prep = Prepared(from_arrays(u, step_s=60, t0=T0), settings)
    run = adaptive_verdicts(prep, rule, params)
    base = rule_verdicts(prep, rule)
    _, template, _ = _base(rule)
    demand = u > settings.demand_pct
    done: list[tuple[float, float]] = []  # (start, end) epoch s of completed stretches
    start, latched = None, False
    for j, now in enumerate(prep.grid.times):
        k = int(prep.grid.hi[j]) - 1
        if k > 0 and demand[k] and not demand[k - 1]:  # a stretch just completed
            done.append((T0 + start * 60, T0 + k * 60))
        if demand[k]:
            start, latched = None, False
        elif start is None:
            start = k
        if base[0, j] == 0:
            continue
        verdict = Verdict.IDLE if base[0, j] == 1 else Verdict.UNDERUTILIZED
        if start is None:
            assert run.verdicts[0, j] != 1
            continue
        t_start = T0 + start * 60

        spans = done + [(t_start, np.inf)]  # every stretch so far, the current one still going on

        def prior_for(begun):
            """The fleet prior of a stretch begun then: the stretches known at the start of its refresh block."""
            block = T0 + np.floor((begun - T0) / params.fleet_refresh_s + 1e-9) * params.fleet_refresh_s
            hour = prior_hour(begun, params)  # with time of day: the fleet's stretches begun near this hour only

            def near(s):
                return hour is None or bool(near_in_time_of_day([s], hour, params)[0])

            known = [e - s for s, e in spans if e <= block and near(s)]
            ongoing = [block - s for s, e in spans if s < block < e and near(s)]
            return fleet_prior(known, floor_s(params, rule.warning_lead_s), params.prior_points, ongoing_s=ongoing)

        own, own_start = [e - s for s, e in done], [s for s, _ in done]
        d = decide(replace(template, verdict=verdict), own, now - t_start, rule, params, settings.break_even_s,
                   datetime.fromtimestamp(now, UTC), prior_for(t_start), settings.restart_cost_s, own_start,
                   running_s=now - T0, prior_at=prior_for)
        latched = latched or d.verdict == Verdict.IDLE
        assert (run.verdicts[0, j] == 1) == latched, (j, now - t_start, d.reason)


def office_days(days: int) -> np.ndarray:
    """Per minute from midnight UTC: work 08:00-12:00, a 45-minute lunch lull, work 12:45-18:00, idle all night."""
    minute = np.arange(days * 1440) % 1440
    work = ((minute >= 8 * 60) & (minute < 12 * 60)) | ((minute >= 12 * 60 + 45) & (minute < 18 * 60))
    return np.where(work, 60.0, 0.0)


def test_time_of_day_stops_the_night_early_and_still_waits_out_lunch(rules):
    # Lunch lulls (45 min) and nights (14 h) in one history. Without the time of day, every lull over 35 min
    # might be a lunch, so the night waits until lunch would have ended. With it, a lull begun at 18:00 is judged
    # by the nights (lunches weigh 0.2), and one begun at noon still by the lunches: no false stop either way.
    # (Its first nights wait longer: the fleet prior counts only lulls begun near this hour, and needs five.)
    fallback = replace(rules[0], name="below-5-2h", threshold_pct=5.0, window_s=7200)
    t0 = datetime(2026, 11, 2, tzinfo=UTC).timestamp()
    prep = Prepared(from_arrays(office_days(21), step_s=60, t0=t0), BacktestSettings())
    flat, rep_flat, _ = backtest_adaptive(prep, fallback, AdaptiveParams(time_of_day_s=0.0))
    tod, rep_tod, run = backtest_adaptive(prep, fallback, AdaptiveParams())
    assert flat.false_stops == 0 and tod.false_stops == 0
    for rep in (rep_flat, rep_tod):  # never at lunch: every stop is in a lull begun at 18:00 (or the first night)
        assert all(not 8 <= datetime.fromtimestamp(s.stop_at, UTC).hour < 18 for s in rep.stops)
    # The last two weeks: stopped 20 min into the night (5 idle + 15 warning) with the time of day, 45 without.
    assert [s.time_to_stop_s for s in rep_tod.stops[-14:]] == [20 * 60.0] * 14
    assert [s.time_to_stop_s for s in rep_flat.stops[-14:]] == [45 * 60.0] * 14
    later = rep_tod.stops[-14:]
    assert tod.net_gpu_hours > flat.net_gpu_hours
    reason = stop_reason(prep, run, later[-1].instance, later[-1].stop_at)
    assert re.fullmatch(r"idle 5 min; 100% of this instance's \d+ past idle stretches longer than 20 min "
                        r"\(begun 15:00-21:00 UTC\) lasted over 50 min \(fleet: 100% of \d+\); "
                        r"stopping now is worth more than waiting", reason), reason


def test_no_stop_within_the_restart_grace(rules):
    # Restarted by demand, busy 60 min, then idle 8 h, every cycle. Paired with a short demand-level rule
    # (the live pairing), the policy stops 20 min into every lull once it has 10 lulls of history. The 2-hour
    # restart grace holds the verdict back until 2 h after the restart (60 min into the lull); the warning
    # follows, so the stop comes 75 min in.
    short = replace(rules[0], name="demand-5m", threshold_pct=5.0, window_s=300)
    prep = Prepared(from_arrays(cycles(60, 480, 20), step_s=60, t0=T0), BacktestSettings())
    _, rep, _ = backtest_adaptive(prep, short, AdaptiveParams())
    _, rep0, _ = backtest_adaptive(prep, short, AdaptiveParams(restart_grace_s=0.0))
    assert len(rep.stops) == len(rep0.stops) == 20
    assert [s.time_to_stop_s for s in rep0.stops[10:]] == [20 * 60.0] * 10
    assert [s.time_to_stop_s for s in rep.stops] == [75 * 60.0] * 20


def test_a_rule_with_a_learned_block_is_backtested_as_the_service_runs_it(tmp_path, capsys):
    import json

    import pandas as pd

    from gpufinops.cli import main

    # Serving with 35-minute lulls for 4 days: the 5-minute rule alone stops 20 min into every lull, and demand
    # comes back 15 min later (a false stop). With its learned block, the rule learns that and waits.
    u = cycles(20, 35, 100)
    pd.DataFrame({"value": u, "timestamp_anon": T0 + 60.0 * np.arange(len(u)), "container_ip": "pod-a"}).to_csv(
        tmp_path / "trace.csv", index=False)
    (tmp_path / "rules.yaml").write_text(
        "rules:\n  - name: learned-5m\n    threshold_pct: 5\n    window: 5m\n    warning_lead: 15m\n"
        "    action: stop\n    learned:\n      fleet_prior: 0\n")
    assert main(["backtest", "--trace", str(tmp_path / "trace.csv"), "--rules", str(tmp_path / "rules.yaml"),
                 "-o", "json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out[out.index("{\n"):])
    by = {r["policy"]: r for r in data["results"]}
    live, alone = by["learned-5m (learned, as live)"], by["learned-5m without its learned block"]
    assert alone["stops"] >= 90 and alone["false_stop_rate"] > 0.95
    assert live["stops"] <= 10 and live["false_stops"] <= 1  # a false stop counts 2 GPU-h: none pays
    # As live, it only ever holds the rule's IDLE back.
    rule = load_rules([tmp_path / "rules.yaml"])[0]
    prep = Prepared(from_arrays(u, step_s=60, t0=T0), BacktestSettings())
    run = adaptive_verdicts(prep, rule, rule.learned.adaptive(), hold_back_only=True)
    base = rule_verdicts(prep, rule)
    assert not ((run.verdicts == 1) & (base != 1)).any()


def test_earned_trust_replays_each_past_lull_against_a_fixed_wait(rules):
    """Worked by hand: 3 past nights of 10 h; with too little history the policy waits the break-even (30 min) and
    stops 15 min later (its lead), so each night it saved 10 h - 45 min - the 10-min restart. A fixed 2 h wait
    would have saved 90 min less a night (ahead 4.5 h); a fixed 10 min wait 20 min more (behind 1 h)."""
    rule = rules[0]  # 10-min window, 15-min lead
    _, base, now = _base(rule)
    nights = [10 * 3600.0] * 3
    params = AdaptiveParams(prior_weight=0.0, min_history=3, trust_wait_s=7200.0)
    trust = trust_of(nights, None, lambda _t: EMPTY_PRIOR, rule, params, 1800, 600, 0.0)
    assert trust == Trust(edge_s=3 * 90 * 60.0, stretches=3) and trust.trusted(params)
    d = decide(base, nights, 14 * 60, rule, params, 1800, now)
    assert d.code == ReasonCode.LEARNED_IDLE  # the learned wait decides: 3 nights say stop now
    assert d.reason.endswith("; the learned wait is 4.5 GPU-h per GPU ahead of a fixed 2.0 h wait over this "
                             "instance's 3 past idle stretches")

    short = replace(params, trust_wait_s=600.0)
    assert trust_of(nights, None, lambda _t: EMPTY_PRIOR, rule, short, 1800, 600, 0.0).edge_s == -3 * 20 * 60.0
    d = decide(base, nights, 14 * 60, rule, short, 1800, now)
    assert d.verdict == Verdict.IDLE and d.reason == (
        "idle 14 min; the learned wait is 1.0 GPU-h per GPU behind a fixed 10 min wait over this instance's 3 past "
        "idle stretches: the fixed wait decides")
    d = decide(base, nights, 8 * 60, rule, short, 1800, now)
    assert d.verdict == Verdict.UNDERUTILIZED and d.code == ReasonCode.LEARNED_WAIT
    assert d.reason.endswith(": waiting until 10 min idle")
    # Within the margin the learned wait keeps deciding.
    d = decide(base, nights, 14 * 60, rule, replace(short, trust_margin_h=1.0), 1800, now)
    assert d.code == ReasonCode.LEARNED_IDLE and "behind a fixed 10 min wait" in d.reason
    assert d.reason.endswith("within the 1 GPU-h margin")
    # A missing window stays unknown whoever decides.
    inst, _, _ = _base(rule)
    no_data = evaluate(inst, InstanceUsage("i-1", 600, 10, ()), rule, now)
    assert decide(no_data, nights, 14 * 60, rule, short, 1800, now).verdict == Verdict.UNKNOWN


def test_a_fixed_wait_takes_over_where_the_learned_wait_has_done_worse(rules):
    """Long nights, and a learned block that waits 2 h while its history is thin. With no past lull yet, the learned
    wait decides the first night; replayed, it did worse than a fixed 10-minute wait, so from the second night on
    the fixed wait stops the nights 10 min + the lead in."""
    five = replace(rules[0], name="below-5-5m", threshold_pct=5.0, window_s=300, aggregation=Aggregation.STAYS_BELOW)
    trace = from_arrays(np.tile(cycles(10 * 60, 14 * 60, 10), (3, 1)), step_s=60, t0=T0)
    prep = Prepared(trace, BacktestSettings())
    params = AdaptiveParams(prior_weight=0.0, min_history=5, unusual_wait_s=7200.0, restart_grace_s=0.0)
    plain, rep_plain, _ = backtest_adaptive(prep, five, params, hold_back_only=True)
    trusted, rep, run = backtest_adaptive(prep, five, replace(params, trust_wait_s=600.0), hold_back_only=True)
    stop_min = [round(e.time_to_stop_s / 60) for e in rep.stops]  # by instance, then time
    assert stop_min == [135] + [25] * 9 + [135] + [25] * 9 + [135] + [25] * 9 and trusted.false_stops == 0
    # Without the trust: 135 min the first 5 nights (thin history), then 20 min (5 min + the lead). So the trust
    # saves 110 min on nights 2-5 and gives up 5 min on nights 6-10, on each of the 3 instances.
    assert [round(e.time_to_stop_s / 60) for e in rep_plain.stops][:10] == [135] * 5 + [20] * 5
    assert trusted.net_gpu_hours - plain.net_gpu_hours == pytest.approx(3 * (4 * 110 - 5 * 5) / 60)
    reasons = set(run.reasons.values())
    assert any("behind a fixed 10 min wait" in r and r.endswith("the fixed wait decides") for r in reasons)


def test_the_shipped_learned_example_is_opt_in_and_holds_serving_lulls_back(tmp_path, capsys):
    import json

    import pandas as pd

    from gpufinops.cli import main

    example = ROOT / "rules" / "examples" / "learned-idle.yaml"
    (rule,) = load_rules([example])
    assert rule.learned is not None and rule.learned.trust_wait_s == 3600 and rule.window_s == 300
    assert rule.name not in {r.name for r in load_rules([ROOT / "rules"])}  # not among the defaults
    # Serving with 35-minute lulls for 4 days: the 5-minute rule alone stops every lull falsely; the example,
    # replayed as the service runs it, learns the lulls are short, and a 1-hour wait would not stop them either.
    u = cycles(20, 35, 100)
    pd.DataFrame({"value": u, "timestamp_anon": T0 + 60.0 * np.arange(len(u)), "container_ip": "pod-a"}).to_csv(
        tmp_path / "trace.csv", index=False)
    assert main(["backtest", "--trace", str(tmp_path / "trace.csv"), "--rules", str(example), "-o", "json"]) == 0
    out = capsys.readouterr().out
    by = {r["policy"]: r for r in json.loads(out[out.index("{\n"):])["results"]}
    live, alone = by[f"{rule.name} (learned, as live)"], by[f"{rule.name} without its learned block"]
    assert alone["stops"] >= 90 and alone["false_stop_rate"] > 0.95
    assert live["false_stops"] <= 1 and live["stops"] <= 2
