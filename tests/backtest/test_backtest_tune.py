"""`backtest --tune`: the sweep's best rule for a false-stop cost, picked on half the instances and scored on the
other half (held out), then picked on the whole history as the suggestion."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpufinops.backtest.engine import BacktestSettings, Prepared, backtest_rule
from gpufinops.backtest.sweep import candidates
from gpufinops.backtest.traces import from_arrays
from gpufinops.backtest.tune import best_fixed, cost_score, holdout, progress_line, split_halves
from gpufinops.cli import main
from gpufinops.rules import LEARNED_REMOVED, load_rules
from gpufinops.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_pick_outwaits_lunch_and_is_scored_on_the_other_half(base):
    # Lunches last 45 min, nights 14 h. A window that stops lunch (false stops, charged 4 GPU-h each) loses to
    # one that outwaits it; held out, the other half's score is the pick's replay there, against its ceiling.
    trace = fleet([office_days(6, shift_min=k * 30) for k in range(6)])  # six teams, starting 30 min apart
    a, b = (Prepared(h, BacktestSettings()) for h in split_halves(trace))
    cands = candidates(base)
    h = holdout(a, b, cands, 4.0, label="B")
    assert h.picked.rule.window_s > 45 * 60 and h.test.false_stops == 0
    every = [backtest_rule(a, r)[0] for r in cands]
    assert cost_score(h.picked, 4.0) == pytest.approx(max(cost_score(s, 4.0) for s in every))
    assert h.score == pytest.approx(cost_score(backtest_rule(b, h.picked.rule)[0], 4.0))
    assert 0 < h.score < h.ceiling_score
    assert h.pct_of_ceiling == pytest.approx(100 * h.score / h.ceiling_score)


def test_equal_scores_keep_the_first_candidate_in_sweep_order(base):
    # 25-minute lulls under the 30-minute break-even: a stop never pays, so the best rules never stop (score 0,
    # several of them); of equals the first in the sweep's order is kept.
    lulls = np.tile(np.concatenate([np.full(20, 80.0), np.zeros(25)]), 100)
    prep = Prepared(fleet([lulls] * 2), BacktestSettings())
    cands = candidates(base)
    scores = [cost_score(backtest_rule(prep, r)[0], 2.0) for r in cands]
    assert max(scores) == 0.0 and scores.count(0.0) > 1
    assert best_fixed(prep, cands, 2.0).rule.name == cands[scores.index(0.0)].name


def test_progress_line_shows_the_bar_and_the_time_left():
    assert progress_line(0, 40, 100.0, 100.0, "rules") == "[....................] 0/40 rules"
    assert progress_line(10, 40, 100.0, 105.0, "rules") == "[#####...............] 10/40 rules, 15 s left"
    assert progress_line(40, 40, 100.0, 120.0, "rules").startswith("[####################] 40/40 rules, <1 s")


def _write(trace_rows: list[np.ndarray], path: Path) -> None:
    frames = [pd.DataFrame({"value": u, "timestamp_anon": MONDAY + 60.0 * np.arange(len(u)),
                            "container_ip": f"pod-{k}"}) for k, u in enumerate(trace_rows)]
    pd.concat(frames).to_csv(path, index=False)


def test_cli_tune_reports_held_out_and_suggests_a_rule_file(tmp_path, capsys):
    _write([office_days(4, shift_min=k * 30) for k in range(6)], tmp_path / "office.csv")
    out_rule = tmp_path / "suggested.yaml"
    assert main(["backtest", "--trace", str(tmp_path / "office.csv"), "--tune", "--false-stop-cost", "4",
                 "--suggest-out", str(out_rule), "--json", "-"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    tuned = json.loads(out[out.index("{\n"):])["tune"]
    assert [h["held_out"] for h in tuned["holdout"]] == ["B", "A"]
    for h in tuned["holdout"]:
        assert h["ceiling_score"] > 0 and h["test"]["false_stops"] == 0
        assert h["pct_of_ceiling"] == pytest.approx(100 * h["score"] / h["ceiling_score"])
        assert h["test"]["score"] == pytest.approx(h["score"])  # one score, one --false-stop-cost
    assert "pct_of_ceiling" in out and "restarts_per_instance_day" in out and "held out, the pick scores" in out
    assert "rules (whole history)" in captured.err and " s left" in captured.err  # progress with an ETA
    rule = load_rules([out_rule])[0]  # the suggestion is a rule file the service loads
    assert rule.name == tuned["pick"]["policy"] and rule.window_s > 45 * 60
    assert out_rule.read_text() == tuned["suggested_yaml"]


def test_cli_tune_needs_two_instances_per_half(tmp_path, capsys):
    _write([office_days(2)] * 3, tmp_path / "small.csv")
    assert main(["backtest", "--trace", str(tmp_path / "small.csv"), "--tune"]) == 2
    captured = capsys.readouterr()
    assert "--tune holds half the instances out: it needs at least 4 instances, the history has 3" in captured.err
    assert "ceiling" not in captured.out  # failed before replaying anything


def test_a_rule_file_with_the_removed_learned_block_says_what_to_do(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("rules:\n  - name: night\n    threshold_pct: 5\n    window: 10m\n    action: stop\n"
                    "    learned:\n      min_support: 3\n")
    with pytest.raises(ConfigError) as err:
        load_rules([path])
    text = str(err.value)
    assert str(path) in text and "learned" in text and LEARNED_REMOVED in text and ":6" in text


def test_cli_tune_on_5_hours_suggests_no_rule(tmp_path, capsys):
    _write([office_days(1)[540:840]] * 4, tmp_path / "short.csv")  # 09:00-14:00: 5 h of four instances
    out_rule = tmp_path / "suggested.yaml"
    assert main(["backtest", "--trace", str(tmp_path / "short.csv"), "--tune", "--suggest-out", str(out_rule)]) == 1
    captured = capsys.readouterr()
    assert "--tune: history too short to choose a rule" in captured.err and "minimum is 24 h" in captured.err
    assert not out_rule.exists() and "rules:" not in captured.out
