"""The clairvoyant-with-lead ceiling and the net score (issue 12): known answers on hand-made traces."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpufinops.backtest.engine import (
    BacktestSettings,
    Prepared,
    backtest_rule,
    ceiling_stops,
    net_score,
    oracle_net_seconds,
    pct_of_ceiling,
)
from gpufinops.backtest.traces import from_arrays
from gpufinops.cli import main
from gpufinops.model import Aggregation
from gpufinops.rules import load_rules

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000.0
RULE_FILES = [ROOT / "rules" / "examples" / "common-40pct-10min.yaml", ROOT / "rules" / "zero-activity.yaml"]
SETTINGS = BacktestSettings(tick_s=60, restart_cost_s=600, break_even_s=1800, demand_pct=5.0)


@pytest.fixture(scope="module")
def base_rule():
    return load_rules(RULE_FILES)[0]  # stays_below 40% for 10 min, 15 min lead


def three_stretches() -> np.ndarray:
    """Per minute: 60 min busy, idle 10 min, 30 busy, idle 40 min, 30 busy, idle 3 h, 60 busy."""
    busy = lambda n: np.full(n, 60.0)
    return np.concatenate([busy(60), np.zeros(10), busy(30), np.zeros(40), busy(30), np.zeros(180), busy(60)])


def test_ceiling_stops_exactly_the_three_hour_stretch_one_lead_in():
    prep = Prepared(from_arrays(three_stretches(), step_s=60, t0=T0), SETTINGS)
    c = ceiling_stops(prep, warning_lead_s=900)
    # Lead 15 min, restart 10 min, break-even 30 min, c = 2 GPU-h:
    # - 10-min stretch (minutes 60-70): the stop would come at 60 + 15 = 75, after the demand at 70: no stop.
    # - 40-min stretch (100-140): stop at 115, demand at 140 -> stopped 25 min < 30: a false stop netting
    #   25 - 10 = 15 GPU-min, far less than 2 GPU-h: no stop.
    # - 3-h stretch (170-350): warning at 170, stop at 185, demand at 350 -> stopped 165 min, minus 10 = 155.
    assert list(c.mark_at) == [T0 + 170 * 60] and list(c.stop_at) == [T0 + 185 * 60]
    assert list(c.restart_at) == [T0 + 350 * 60]
    assert c.false_stops == 0 and c.net_gpu_hours == pytest.approx(155 / 60) and c.score == pytest.approx(155 / 60)
    # The old oracle stops the 40-min and 3-h stretches at their first second: (40 - 10) + (180 - 10) = 200 min.
    assert oracle_net_seconds(prep).sum() / 3600 == pytest.approx(200 / 60)


def test_with_no_false_stop_cost_the_ceiling_takes_the_false_stop_that_nets():
    prep = Prepared(from_arrays(three_stretches(), step_s=60, t0=T0), SETTINGS)
    c = ceiling_stops(prep, 900, false_stop_cost_h=0.0)
    # c = 0: the 40-min stretch's false stop nets 15 GPU-min > 0, so it is taken: 155 + 15 = 170 min.
    assert list(c.stop_at) == [T0 + 115 * 60, T0 + 185 * 60]
    assert c.false_stops == 1 and c.score == pytest.approx(170 / 60)


@pytest.mark.parametrize("cost_h", [0.0, 2.0])
def test_score_is_net_minus_cost_per_false_stop(base_rule, cost_h):
    rule = replace(base_rule, name="below-5pct-5m", threshold_pct=5.0, window_s=300, warning_lead_s=900)
    prep = Prepared(from_arrays(three_stretches(), step_s=60, t0=T0), replace(SETTINGS, false_stop_cost_h=cost_h))
    s, _ = backtest_rule(prep, rule)
    # Idle windows of 5 samples: marks at minutes 64, 104, 174; stops 15 min later.
    # - 64: the demand at 70 cancels the mark.
    # - 104 -> stop 119, demand at 140: stopped 21 min < 30, a false stop; net 21 - 10 = 11 min.
    # - 174 -> stop 189, demand at 350: stopped 161 min, net 151 min.
    assert (s.stops, s.false_stops) == (2, 1)
    assert s.net_gpu_hours == pytest.approx(162 / 60)
    assert s.score == pytest.approx(162 / 60 - cost_h * 1) == pytest.approx(net_score(162 / 60, 1, cost_h))
    ceiling = {0.0: 170 / 60, 2.0: 155 / 60}[cost_h]  # the two tests above
    assert s.ceiling_score == pytest.approx(ceiling)
    assert s.pct_of_ceiling == pytest.approx(100 * s.score / ceiling)  # c=0: 95.3%; c=2: 27.1%
    # 2 restarts over one instance-day of 410 minutes.
    assert s.restarts_per_instance_day == pytest.approx(2 / (410 / 1440))


def test_pct_of_ceiling_is_zero_where_the_ceiling_saves_nothing():
    assert pct_of_ceiling(-1.0, 0.0) == 0.0 and pct_of_ceiling(1.0, 4.0) == 25.0


def random_fleet(seed: int):
    """Instances of 1 or 8 GPUs: busy bursts and idle stretches of 1 min to 5 h, some missing samples."""
    rng = np.random.default_rng(seed)
    rows, gi = [], []
    for inst in range(4):
        parts = []
        while sum(len(p) for p in parts) < 2 * 1440:
            parts.append(rng.uniform(20, 90, int(rng.integers(1, 90))))
            parts.append(rng.uniform(0, 4, int(rng.choice([rng.integers(1, 40), rng.integers(40, 300)]))))
        u = np.concatenate(parts)[:2 * 1440]
        u[rng.random(len(u)) < 0.01] = np.nan
        n_gpus = 8 if inst == 0 else 1
        for _ in range(n_gpus):
            rows.append(u)
            gi.append(inst)
    return from_arrays(np.vstack(rows), step_s=60, t0=T0, gpu_instance=gi)


@pytest.mark.parametrize("seed", range(6))
def test_no_fixed_rule_scores_above_the_ceiling(base_rule, seed):
    trace = random_fleet(seed)
    for cost_h in (0.0, 2.0):
        prep = Prepared(trace, replace(SETTINGS, false_stop_cost_h=cost_h))
        for thr in (1.0, 5.0):  # warnings only while no demand shows (at or under the demand level)
            for window_s in (60, 300, 1800):
                for lead_s in (0, 300, 900):
                    rule = replace(base_rule, threshold_pct=thr, window_s=window_s, warning_lead_s=lead_s,
                                   aggregation=Aggregation.STAYS_BELOW)
                    s, _ = backtest_rule(prep, rule)
                    assert s.score <= s.ceiling_score + 1e-9, (seed, cost_h, thr, window_s, lead_s)


def test_cli_prints_ceiling_score_and_json_keys(tmp_path, capsys):
    u = three_stretches()
    df = pd.DataFrame({"value": u, "timestamp_anon": T0 + 60.0 * np.arange(len(u)), "container_ip": "pod-a"})
    csv = tmp_path / "trace.csv"
    df.to_csv(csv, index=False)
    args = ["backtest", "--trace", str(csv), "--rules", *map(str, RULE_FILES), "--restart-cost", "10m",
            "--break-even", "30m", "--false-stop-cost", "2"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "ceiling (clairvoyant with a 15-min lead" in text and "score 2.6" in text
    assert "pct_of_ceiling" in text and "restarts_per_instance_day" in text and "pct_of_oracle" not in text
    assert main([*args, "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["false_stop_cost_h"] == 2.0
    assert data["ceiling"][0]["warning_lead_s"] == 900 and data["ceiling"][0]["score"] == pytest.approx(155 / 60)
    row = data["results"][0]
    for key in ("score", "pct_of_ceiling", "ceiling_score", "restarts_per_instance_day", "false_stop_cost_h"):
        assert key in row
    assert row["score"] == pytest.approx(row["net_gpu_hours"] - 2 * row["false_stops"])
