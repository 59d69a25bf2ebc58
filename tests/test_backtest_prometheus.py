"""Backtest history from a real Prometheus (range queries, server-side step)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpufinops.backtest.engine import backtest
from gpufinops.backtest.prometheus import load_prometheus
from gpufinops.backtest.traces import from_arrays
from gpufinops.cli import main
from gpufinops.config import ConfigError
from gpufinops.rules import load_rules
from tests.promserver import Series, dcgm_labels

ROOT = Path(__file__).resolve().parents[1]
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def night(minutes: int) -> np.ndarray:
    return np.concatenate([np.full(60, 80.0), np.zeros(minutes - 120), np.full(60, 80.0)])


@pytest.mark.integration
def test_prometheus_history_backtests_like_the_same_trace_from_a_file(prometheus_factory, tmp_path, capsys):
    n = 300
    a, b = night(n), np.full(n, 70.0)
    b[100:110] = 9.2e18  # DCGM sentinel: not a measurement
    series = [
        Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels("host-a", 0, instance_id="i-a"),
               [(START + 60 * k, float(v)) for k, v in enumerate(a)]),
        Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels("host-b", 0, instance_id="i-b", hostname_label="hostname"),
               [(START + 60 * k, float(v)) for k, v in enumerate(b)]),
    ]
    server = prometheus_factory(series)
    trace = load_prometheus(server.url, START, START + 60 * (n - 1), 60)
    assert trace.instance_ids == ("i-a", "i-b") and trace.n_steps == n
    np.testing.assert_array_equal(trace.util[0], a)
    assert np.isnan(trace.util[1, 100:110]).all()

    rules = load_rules([ROOT / "rules" / "examples" / "common-40pct-10min.yaml", ROOT / "rules" / "zero-activity.yaml"])
    from_prom = backtest(trace, rules)
    from_file = backtest(from_arrays(np.vstack([a, np.where(b > 1e9, np.nan, b)]), step_s=60, t0=START), rules)
    assert [s.to_dict() for s in from_prom] == [s.to_dict() for s in from_file]
    assert from_prom[0].stops == 1

    rc = main(["backtest", "--prometheus", server.url, "--start", str(START), "--end", str(START + 60 * (n - 1)),
               "--step", "60s", "--rules", *map(str, [ROOT / "rules" / "examples" / "common-40pct-10min.yaml", ROOT / "rules" / "zero-activity.yaml"])])
    assert rc == 0
    assert "gpu-util-below-40pct-10m" in capsys.readouterr().out

    with pytest.raises(ConfigError, match="no DCGM_FI_DEV_GPU_UTIL"):
        load_prometheus(server.url, START - 86400 * 30, START - 86400 * 29, 60)
