"""Backtest: hand-made traces with known answers, the real GenTD26 trace, sweep, CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpufinops.backtest.engine import BacktestSettings, Prepared, backtest, backtest_rule
from gpufinops.backtest.sweep import candidates, pareto_front, rule_yaml, run_sweep, suggest
from gpufinops.backtest.traces import from_arrays, load_trace, pool_ranks_trace
from gpufinops.cli import main
from gpufinops.config import ConfigError
from gpufinops.model import Aggregation
from gpufinops.rules import load_rules

ROOT = Path(__file__).resolve().parents[2]
GENTD26 = ROOT.parent / "shared" / "data" / "gpu_util_traces" / "alibaba_gentd26_pod_gpu_duty_cycle.csv"
T0 = 1_700_000_000.0


@pytest.fixture(scope="module")
def rules():
    return load_rules([ROOT / "rules" / "examples" / "common-40pct-10min.yaml", ROOT / "rules" / "zero-activity.yaml"])  # the common 40%/10 min rule


@pytest.fixture(scope="module")
def default_rule(rules):
    return rules[0]  # gpu-util-below-40pct-10m: stays_below 40% for 10 min, 15 min lead, stop


def seed_rule(default_rule):
    """The field's rule as usually written: MEAN utilisation under 40% for 10 minutes -> stop."""
    return replace(default_rule, name="seed-mean-40-10m", aggregation=Aggregation.MEAN)


def long_idle_night() -> np.ndarray:
    """8 h at 80%, 10 h at 0% (the night), 6 h at 80%; one sample a minute."""
    return np.concatenate([np.full(480, 80.0), np.zeros(600), np.full(360, 80.0)])


def test_long_idle_night_is_stopped_once_with_the_right_gpu_hours(default_rule):
    trace = from_arrays(long_idle_night(), step_s=60, t0=T0)
    (s,) = backtest(trace, [default_rule])
    # Idle from minute 480; the 10-min window is idle at minute 489 (samples 480..489) -> mark;
    # stop at 489 + 15 = minute 504; demand again at minute 1080 -> restart.
    assert (s.stops, s.restarts, s.false_stops) == (1, 1, 0)
    assert s.gpu_hours_stopped == pytest.approx((1080 - 504) / 60)
    assert s.restart_cost_gpu_hours == pytest.approx(10 / 60)
    assert s.net_gpu_hours == pytest.approx((1080 - 504 - 10) / 60)
    assert s.net_dollars == pytest.approx(s.net_gpu_hours * 2.745)
    assert s.time_to_stop_min["p50"] == pytest.approx(24)
    assert s.oracle_net_gpu_hours == pytest.approx((600 - 10) / 60)  # stopped at minute 480, restarted at 1080
    assert s.pct_of_oracle == pytest.approx(100 * (566 / 590))
    # The ceiling warns at minute 480 and stops at 495 (the lead): (1080 - 495 - 10) = 575 min, no false stop.
    assert s.ceiling_score == pytest.approx(575 / 60) and s.score == pytest.approx(566 / 60)
    assert s.pct_of_ceiling == pytest.approx(100 * 566 / 575)


def test_restart_cost_and_price_are_configurable(default_rule):
    trace = from_arrays(long_idle_night(), step_s=60, t0=T0)
    (s,) = backtest(trace, [default_rule], BacktestSettings(restart_cost_s=1800, price_per_gpu_hour=10.0))
    assert s.net_gpu_hours == pytest.approx((1080 - 504 - 30) / 60)
    assert s.net_dollars == pytest.approx(10 * s.net_gpu_hours)


def bursty_serving(minutes: int = 24 * 60, seed: int = 3) -> np.ndarray:
    """Latency-first inference: a request burst (60-95%) at least every 7 minutes, 0-10% in between."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(0, 10, minutes)
    t = 0
    while t < minutes:
        u[t] = rng.uniform(60, 95)
        t += int(rng.integers(2, 8))
    return u


def test_bursty_serving_is_not_stopped_under_stays_below_but_is_under_a_mean_rule(default_rule):
    trace = from_arrays(bursty_serving(), step_s=60, t0=T0)
    fixed, seed = backtest(trace, [default_rule, seed_rule(default_rule)])
    assert fixed.stops == 0
    assert seed.stops > 20 and seed.false_stop_rate > 0.9  # every lull "idle" by the mean; demand within minutes


def input_bound_trainer(hours: int = 6, seed: int = 5) -> np.ndarray:
    """Bursts to ~100% for 15 s between 30-second input-pipeline gaps (15 s samples): mean ~35%."""
    rng = np.random.default_rng(seed)
    n = hours * 240
    u = np.zeros(n)
    u[0::3] = rng.uniform(95, 100, len(u[0::3]))
    u[1::3] = rng.uniform(0, 10, len(u[1::3]))
    return u


def test_input_bound_trainer_is_never_stopped(default_rule):
    u = input_bound_trainer()
    assert 30 < u.mean() < 40
    trace = from_arrays(u, step_s=15, t0=T0)
    fixed, seed = backtest(trace, [default_rule, seed_rule(default_rule)])
    assert fixed.stops == 0 and fixed.marks == 0
    assert seed.stops > 0  # the mean rule would have killed a working trainer


def test_missing_data_is_never_idle(default_rule):
    u = long_idle_night()
    u[480:1080] = np.nan  # the exporter was down all night: nothing to judge, nothing stopped
    (s,) = backtest(from_arrays(u, step_s=60, t0=T0), [default_rule])
    assert s.stops == 0 and s.marks == 0


def test_unknown_keeps_the_mark_but_never_stops(default_rule):
    u = long_idle_night()[:1000]
    u[492:] = np.nan  # marked at minute 489, then no data: stop_at passes, no stop, mark kept
    (s,) = backtest(from_arrays(u, step_s=60, t0=T0), [default_rule])
    assert (s.marks, s.marks_cancelled, s.stops) == (1, 0, 0)
    u = long_idle_night()
    u[492:1080] = np.nan  # same, but work resumes in the morning: only then is the mark cancelled
    (s,) = backtest(from_arrays(u, step_s=60, t0=T0), [default_rule])
    assert (s.marks, s.marks_cancelled, s.stops) == (1, 1, 0)


def test_snooze_cancels_the_mark_and_delays_the_stop(default_rule):
    trace = from_arrays(long_idle_night(), step_s=60, t0=T0)
    snooze = {"gpu-0": [(T0 + 495 * 60, T0 + 700 * 60)]}
    (s,) = backtest(trace, [default_rule], BacktestSettings(snoozes=snooze))
    # Marked at 489, cancelled by the snooze at 495; marked again at 700 (window still idle), stopped at 715.
    assert (s.marks, s.marks_cancelled, s.stops) == (2, 1, 1)
    assert s.gpu_hours_stopped == pytest.approx((1080 - 715) / 60)


def test_false_stop_is_demand_within_break_even(default_rule):
    # Idle 40 min between busy hours: marked at +9, stopped at +24, demand at +40 -> 16 min later: false stop.
    u = np.concatenate([np.full(60, 90.0), np.zeros(40), np.full(60, 90.0)])
    (s,) = backtest(from_arrays(u, step_s=60, t0=T0), [default_rule])
    assert (s.stops, s.false_stops) == (1, 1)
    (s,) = backtest(from_arrays(u, step_s=60, t0=T0), [default_rule], BacktestSettings(break_even_s=600))
    assert s.false_stops == 0


def test_restarted_instance_is_not_judged_for_a_full_window(default_rule):
    # Two idle nights; after the first restart at minute 1080 the instance is too young until 1090.
    u = np.concatenate([long_idle_night(), np.zeros(300), np.full(10, 90.0)])
    trace = from_arrays(u, step_s=60, t0=T0)
    prep = Prepared(trace, BacktestSettings())
    _, rep = backtest_rule(prep, default_rule)
    stops = rep.stops
    assert [(e.stop_at - T0) / 60 for e in stops] == [504, 1440 + 9 + 15]
    assert stops[0].restart_at == T0 + 1080 * 60 and stops[1].restart_at == T0 + 1740 * 60


@pytest.mark.skipif(not GENTD26.exists(), reason="shared GenTD26 trace not present")
def test_gentd26_loads_as_is_and_the_seed_rule_mostly_stops_wrongly(default_rule):
    trace = load_trace(GENTD26)
    assert trace.n_instances == 95 and trace.step_s == 57.0 and trace.n_steps == 1441
    assert np.nanmax(trace.util) <= 100 and np.isnan(trace.util).any()  # pods come and go
    seed, shipped = backtest(trace, [seed_rule(default_rule), default_rule])
    assert seed.stops > 1000
    assert seed.false_stop_rate > 0.8
    assert seed.restart_cost_gpu_hours > 0.5 * seed.gpu_hours_stopped  # restarts eat most of the savings
    assert 0 < seed.pct_of_oracle < 50
    assert shipped.false_stop_rate > 0.5


def test_load_trace_detects_columns_and_iso_times(tmp_path):
    df = pd.DataFrame({
        "timestamp": pd.date_range("2026-01-01", periods=6, freq="60s").astype(str).tolist() * 2,
        "instance_id": ["i-a"] * 6 + ["i-b"] * 6,
        "gpu": ["0"] * 6 + ["1"] * 6,
        "utilization": [0, 1, 2, 3, 4, 9.3e18] * 2,
        "memory_used_bytes": [2**30] * 12,
    })
    p = tmp_path / "t.parquet"
    df.to_parquet(p)
    tr = load_trace(p)
    assert tr.instance_ids == ("i-a", "i-b") and tr.step_s == 60 and tr.n_steps == 6
    assert np.isnan(tr.util[0, 5])  # DCGM sentinel is not a measurement
    assert tr.mem_mib[0, 0] == 1024


def test_load_trace_errors_name_file_row_and_column(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("value,timestamp_anon,container_ip\n1,100,a\nhigh,157,a\n")
    with pytest.raises(ConfigError, match=r"bad.csv: row 3: column 'value': not a number"):
        load_trace(p)
    p.write_text("util,when,who\n1,100,a\n")
    with pytest.raises(ConfigError, match=r"bad.csv: no time column found.*columns are util, when, who"):
        load_trace(p)
    p.write_text("util,time,id\n1,yesterday-ish,a\n")
    with pytest.raises(ConfigError, match=r"bad.csv: row 2: column 'time': cannot read timestamp"):
        load_trace(p)


def test_multi_gpu_instance_is_idle_only_when_every_gpu_is(default_rule):
    night = long_idle_night()
    busy = np.full_like(night, 80.0)
    trace = from_arrays(np.vstack([night, busy, night, night]), step_s=60, t0=T0, gpu_instance=[0, 0, 1, 1],
                        instance_ids=["half-busy", "both-idle"])
    prep = Prepared(trace, BacktestSettings())
    s, rep = backtest_rule(prep, default_rule)
    assert {e.instance for e in rep.stops} == {"both-idle"}
    assert s.gpu_hours_stopped == pytest.approx(2 * (1080 - 504) / 60)  # two GPUs stopped


def test_pool_ranks_trace_makes_per_gpu_series():
    running = np.array([0, 2, 4, 3, 1])
    tr = pool_ranks_trace(running, np.full(5, 4), ranks=(0.0, 0.5, 0.75), step_s=60)
    np.testing.assert_array_equal(tr.util, [[0, 100, 100, 100, 100], [0, 0, 100, 100, 0], [0, 0, 100, 0, 0]])


def test_sweep_front_and_suggestion_round_trip_through_load_rules(default_rule, tmp_path):
    u = np.concatenate([long_idle_night(), bursty_serving(600)])
    trace = from_arrays(np.vstack([u, bursty_serving(len(u), seed=9)]), step_s=60, t0=T0)
    prep = Prepared(trace, BacktestSettings())
    results = run_sweep(prep, candidates(default_rule))
    assert len(results) == 40
    front = pareto_front(results)
    for a in front:  # nothing on the front is beaten on both axes
        assert not any(b.net_gpu_hours > a.net_gpu_hours and b.false_stop_rate < a.false_stop_rate for b in results)
    for r in results:  # everything off the front is beaten or tied by a front member
        assert any(f.net_gpu_hours >= r.net_gpu_hours and f.false_stop_rate <= r.false_stop_rate for f in front)
    best = suggest(front, max_false_stop_rate=0.1)
    assert best is not None and best.false_stop_rate <= 0.1 and best.net_gpu_hours > 0
    path = tmp_path / "suggested.yaml"
    path.write_text(rule_yaml(best, comment="test"))
    (loaded,) = load_rules([path])
    assert (loaded.threshold_pct, loaded.window_s, loaded.aggregation) == (
        best.rule.threshold_pct, best.rule.window_s, best.rule.aggregation)
    # The loaded rule reproduces the suggestion's backtest exactly.
    assert backtest_rule(prep, loaded)[0].net_gpu_hours == pytest.approx(best.net_gpu_hours)


def test_cli_backtest_writes_table_json_chart_and_rule(tmp_path, capsys):
    u = np.concatenate([long_idle_night(), bursty_serving(600)])
    df = pd.DataFrame({"value": u, "timestamp_anon": T0 + 60.0 * np.arange(len(u)), "container_ip": "pod-a"})
    csv = tmp_path / "trace.csv"
    df.to_csv(csv, index=False)
    out, png, rule = tmp_path / "bt.json", tmp_path / "front.png", tmp_path / "rule.yaml"
    rc = main(["backtest", "--trace", str(csv), "--rules", *map(str, [ROOT / "rules" / "examples" / "common-40pct-10min.yaml", ROOT / "rules" / "zero-activity.yaml"]), "--sweep",
               "--windows", "10m,1h", "--thresholds", "5,40", "--json", str(out), "--chart", str(png),
               "--suggest-out", str(rule), "--price", "3"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "gpu-util-below-40pct-10m" in text and "Pareto front" in text and "suggested rule" in text
    data = json.loads(out.read_text())
    first = data["results"][0]
    assert first["policy"] == "gpu-util-below-40pct-10m" and first["stops"] == 1
    assert first["net_dollars"] == pytest.approx(3 * first["net_gpu_hours"])
    assert len(data["sweep"]["results"]) == 8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert load_rules([rule])[0].name == data["sweep"]["suggested"]


def test_cli_backtest_bad_column_is_a_clear_error(tmp_path, capsys):
    csv = tmp_path / "trace.csv"
    csv.write_text("value,timestamp_anon,container_ip\n1,100,a\n")
    rc = main(["backtest", "--trace", str(csv), "--util-column", "gpu_util"])
    assert rc == 2
    assert "trace.csv: column 'gpu_util' (util column) not found" in capsys.readouterr().err


def test_sweep_on_5_hours_warns_that_the_history_is_too_short_and_suggests_no_rule(tmp_path, capsys):
    u = np.concatenate([np.full(120, 80.0), np.zeros(120), np.full(60, 80.0)])  # 5 h, one sample a minute
    df = pd.DataFrame({"value": u, "timestamp_anon": T0 + 60.0 * np.arange(len(u)), "container_ip": "pod-a"})
    csv = tmp_path / "trace.csv"
    df.to_csv(csv, index=False)
    rule, out = tmp_path / "rule.yaml", tmp_path / "bt.json"
    argv = ["backtest", "--trace", str(csv), "--rules", str(ROOT / "rules" / "zero-activity.yaml"), "--sweep",
            "--windows", "10m,1h", "--thresholds", "5,40", "--json", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "history too short to choose a rule: 5.0 h, the minimum is 24 h" in captured.err
    assert "a whole day" in captured.err and "suggested rule" not in captured.out and "rules:" not in captured.out
    data = json.loads(out.read_text())
    assert data["sweep"]["suggested"] is None and "suggested_yaml" not in data["sweep"] and data["sweep"]["too_short"]
    assert main([*argv, "--suggest-out", str(rule)]) == 1  # asked for a rule file: not written, and said so
    assert not rule.exists() and "not written" in capsys.readouterr().err
