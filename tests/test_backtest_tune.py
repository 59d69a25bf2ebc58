"""`backtest --tune`: a fixed rule and a learned block tuned for the same false-stop cost, compared held out."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpufinops.backtest.engine import BacktestSettings, Prepared, backtest_rule
from gpufinops.backtest.sweep import candidates
from gpufinops.backtest.traces import from_arrays
from gpufinops.backtest.tune import cost_score, holdout, recommend_learned, split_halves
from gpufinops.cli import main
from gpufinops.rules import load_rules

ROOT = Path(__file__).resolve().parents[1]
MONDAY = datetime(2026, 11, 2, tzinfo=UTC).timestamp()


def office_days(days: int, shift_min: int = 0) -> np.ndarray:
    """Per minute from midnight UTC: work 08:00-12:00, a 45-minute lunch lull, work 12:45-18:00, idle all night."""
    minute = (np.arange(days * 1440) - shift_min) % 1440
    work = ((minute >= 8 * 60) & (minute < 12 * 60)) | ((minute >= 12 * 60 + 45) & (minute < 18 * 60))
    return np.where(work, 60.0, 0.0)


def fleet(rows: list[np.ndarray]):
    return from_arrays(np.vstack(rows), step_s=60, t0=MONDAY, instance_ids=tuple(f"i-{k}" for k in range(len(rows))))


@pytest.fixture(scope="module")
def base():
    return load_rules([ROOT / "rules" / "examples" / "common-40pct-10min.yaml", ROOT / "rules" / "zero-activity.yaml"])[0]


def test_split_halves_alternates_instances():
    a, b = split_halves(fleet([office_days(1)] * 5))
    assert a.instance_ids == ("i-0", "i-2", "i-4") and b.instance_ids == ("i-1", "i-3")


def test_office_fleet_learned_block_wins_held_out(base):
    # Nights begin at 18:00 and last 14 h; lunches last 45 min. A fixed window must outwait lunch (stopping it
    # would be false), so it stops each night 45 min or more in; the learned block learns that lulls begun at
    # 18:00 are nights and stops them 20 min in (5 min idle + 15 min warning) while it still waits out lunch.
    trace = fleet([office_days(10, shift_min=k * 30) for k in range(6)])  # six teams, starting 30 min apart
    a, b = (Prepared(h, BacktestSettings()) for h in split_halves(trace))
    cands = candidates(base)
    results = [holdout(a, b, base, cands, 4.0, label="B"), holdout(b, a, base, cands, 4.0, label="A")]
    for h in results:
        assert h.learned_test.false_stops == 0 and h.fixed_test.false_stops == 0
        assert h.learned_test.net_gpu_hours > h.fixed_test.net_gpu_hours
        assert h.learned_score == pytest.approx(cost_score(h.learned_test, 4.0))
        assert h.learned_ahead
        assert h.learned_test.time_to_stop_min["p50"] == 20.0 and h.fixed_test.time_to_stop_min["p50"] >= 45.0
    assert recommend_learned(results)


def test_a_tie_keeps_the_fixed_rule(base):
    # Serving with 25-minute lulls only, under the 30-minute break-even: no stop ever pays, so both candidates
    # tune to never stopping. Equal scores are not a win: the simpler fixed rule is kept.
    lulls = np.tile(np.concatenate([np.full(20, 80.0), np.zeros(25)]), 100)
    a, b = (Prepared(h, BacktestSettings()) for h in split_halves(fleet([lulls] * 4)))
    cands = candidates(base)
    results = [holdout(a, b, base, cands, 4.0), holdout(b, a, base, cands, 4.0)]
    for h in results:
        assert h.fixed_score == h.learned_score == 0.0
        assert not h.learned_ahead
    assert not recommend_learned(results)
    assert not recommend_learned([])


def test_the_call_weighs_both_held_out_halves_together(base):
    """Ahead on one half by more than it is behind on the other: the learned block (earned trust hands an instance
    where it does worse back to the fixed wait). Behind overall, or level: the fixed rule."""
    from dataclasses import replace

    from gpufinops.backtest.adaptive import AdaptiveParams
    from gpufinops.backtest.tune import Holdout, Tuned, held_out_gain

    lulls = np.tile(np.concatenate([np.full(20, 80.0), np.zeros(25)]), 20)
    s = backtest_rule(Prepared(fleet([lulls]), BacktestSettings()), base)[0]
    tuned = Tuned(cost_h=2.0, fixed=s, learned=s, params=AdaptiveParams(), pairing=base, settings=BacktestSettings())

    def half(fixed_net: float, learned_net: float, learned_false: int = 0) -> Holdout:
        return Holdout("", tuned, replace(s, net_gpu_hours=fixed_net, false_stops=0),
                       replace(s, net_gpu_hours=learned_net, false_stops=learned_false))

    ahead_then_behind = [half(100.0, 130.0), half(100.0, 110.0, learned_false=10)]  # +30, then 110 - 20 - 100
    assert held_out_gain(ahead_then_behind) == pytest.approx(20.0) and recommend_learned(ahead_then_behind)
    assert not recommend_learned([half(100.0, 130.0), half(100.0, 100.0, learned_false=20)])  # +30 - 40
    assert not recommend_learned([half(100.0, 110.0), half(100.0, 90.0)])  # level
    assert recommend_learned([half(100.0, 101.0), half(100.0, 101.0)])


def _write(trace_rows: list[np.ndarray], path: Path) -> None:
    frames = [pd.DataFrame({"value": u, "timestamp_anon": MONDAY + 60.0 * np.arange(len(u)),
                            "container_ip": f"pod-{k}"}) for k, u in enumerate(trace_rows)]
    pd.concat(frames).to_csv(path, index=False)


def test_cli_tune_suggests_the_learned_block_as_a_rule_file(tmp_path, capsys):
    _write([office_days(10, shift_min=k * 30) for k in range(6)], tmp_path / "office.csv")
    out_rule = tmp_path / "suggested.yaml"
    assert main(["backtest", "--trace", str(tmp_path / "office.csv"), "--tune", "--false-stop-cost", "4",
                 "--suggest-out", str(out_rule), "--json", "-"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out[out.index("{\n"):])
    tuned = data["tune"]
    assert tuned["learned_suggested"] is True
    assert [h["held_out"] for h in tuned["holdout"]] == ["B", "A"]
    assert all(h["learned_score"] > h["fixed_score"] for h in tuned["holdout"])
    assert re.search(r"the learned block scores \+\d+\.\d GPU-h against the fixed rule over the held-out halves "
                     r"together; tuned on the whole history", out)
    assert tuned["held_out_gain"] == pytest.approx(sum(h["learned_score"] - h["fixed_score"]
                                                       for h in tuned["holdout"]))
    # Held-out scores as a % of the clairvoyant-with-lead ceiling on the same half, for the same cost.
    assert "% ceiling" in out and "restarts/inst-day" in out
    for h in tuned["holdout"]:
        assert h["ceiling_score"] > 0
        assert h["learned_pct_of_ceiling"] == pytest.approx(100 * h["learned_score"] / h["ceiling_score"])
        assert h["fixed"]["score"] == pytest.approx(h["fixed_score"])  # one score, one --false-stop-cost
    rule = load_rules([out_rule])[0]  # the suggestion is a rule file the service loads
    assert rule.learned is not None and rule.window_s == 300 and rule.threshold_pct == 5.0
    assert rule.learned.break_even_s == 1800 and rule.learned.restart_cost_s == 600
    # Where its learned wait has done worse on an instance's past, the fixed pick's window decides.
    assert rule.learned.trust_wait_s == tuned["fixed_pick"]["rule"]["window_s"]
    assert out_rule.read_text() == tuned["suggested_yaml"]


def test_cli_tune_needs_two_instances_per_half(tmp_path, capsys):
    _write([office_days(2)] * 3, tmp_path / "small.csv")
    assert main(["backtest", "--trace", str(tmp_path / "small.csv"), "--tune"]) == 2
    captured = capsys.readouterr()
    assert "--tune holds half the instances out: it needs at least 4 instances, the history has 3" in captured.err
    assert "oracle" not in captured.out  # failed before replaying anything


def test_a_block_on_the_fixed_pick_is_written_as_a_rule_file_that_loads_as_tuned(base, tmp_path):
    from dataclasses import replace

    from gpufinops.backtest.tune import learned_grid, learned_rule_yaml, tune

    prep = Prepared(fleet([office_days(3, shift_min=k * 30) for k in range(4)]), BacktestSettings())
    t = tune(prep, base, candidates(base), 4.0, grid=learned_grid(4.0, trust_wait_s=3600.0)[:2])
    fixed_rule = t.fixed.rule
    on_fixed = replace(t, pairing=replace(fixed_rule, name=f"{fixed_rule.name}-learned"))
    (tmp_path / "r.yaml").write_text(learned_rule_yaml(on_fixed))
    rule = load_rules([tmp_path / "r.yaml"])[0]
    assert rule.name == f"{fixed_rule.name}-learned"
    assert (rule.threshold_pct, rule.window_s, rule.aggregation) == (
        fixed_rule.threshold_pct, fixed_rule.window_s, fixed_rule.aggregation)
    assert rule.learned.adaptive() == t.params  # live runs exactly the setting that was tuned
    assert rule.learned.trust_wait_s == 3600
