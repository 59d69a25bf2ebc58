"""The sweep chart as a picture at its default size (issue 40, item 8): the title wraps instead of running off
both sides, no two Pareto labels overlap (rules on one point share a label), every label stays in the plot."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from gpufinops.backtest.chart import front_png
from gpufinops.backtest.engine import Summary
from gpufinops.cli import main

ROOT = Path(__file__).resolve().parents[2]
GENTD26 = ROOT.parent / "shared" / "data" / "gpu_util_traces" / "alibaba_gentd26_pod_gpu_duty_cycle.csv"


def summary(policy: str, false_stop_rate: float, net: float) -> Summary:
    return Summary(policy=policy, instances=25, stops=10, restarts=2, false_stops=1, false_stop_rate=false_stop_rate,
                   marks=10, marks_cancelled=0, gpu_hours_stopped=net + 5, restart_cost_gpu_hours=5.0,
                   net_gpu_hours=net, net_dollars=None, oracle_net_gpu_hours=400.0, pct_of_oracle=net / 4,
                   time_to_stop_min=30.0)


def ink_on_the_frame(png: Path, margin: int = 2) -> int:
    """Dark pixels on the outer `margin` pixels of the picture: text cut off at an edge leaves some there."""
    with Image.open(png) as img:
        grey = img.convert("L")
        w, h = grey.size
        frame = [(x, y) for x in range(w) for y in (*range(margin), *range(h - margin, h))]
        frame += [(x, y) for y in range(h) for x in (*range(margin), *range(w - margin, w))]
        return sum(1 for p in frame if grey.getpixel(p) < 128)


def test_a_crowded_front_and_a_long_title_read_at_the_default_size(tmp_path):
    # Twelve rules, two pairs on the same figures and several a hair apart, as a real sweep makes them.
    front = [summary(f"below-{t}pct-{w}", fs, net) for t, w, fs, net in (
        (1, "2h", 0.117, 101.0), (10, "2h", 0.118, 101.2), (20, "2h", 0.205, 122.0), (5, "1h", 0.272, 165.0),
        (10, "1h", 0.272, 165.0), (1, "1h", 0.284, 166.0), (5, "30m", 0.497, 224.0), (10, "30m", 0.499, 224.5),
        (1, "10m", 0.696, 284.0), (5, "10m", 0.697, 284.5), (10, "10m", 0.70, 285.0), (20, "10m", 0.81, 295.0))]
    title = ("Backtest sweep: prometheus http://prometheus.monitoring.svc.cluster.local:9090 "
             "DCGM_FI_DEV_GPU_UTIL{job=\"dcgm\",cluster=\"eu-west-1-training\"} 2026-11-01..2026-11-30")
    png, placed = tmp_path / "sweep.png", []
    front_png(png, front, front, front[0], title=title, placed=placed)
    with Image.open(png) as img:
        assert img.size == (800, 500)
    assert ink_on_the_frame(png) == 0  # the title wraps: nothing runs off either side
    labels = [text for text, _ in placed]
    assert "below-5pct-1h = below-10pct-1h" in labels  # one label for one point
    assert len(labels) >= 8, labels
    boxes = [box for _, box in placed]
    for i, a in enumerate(boxes):
        assert 0 <= a.x0 and a.x1 <= 800 and 0 <= a.y0 and a.y1 <= 500
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (placed[i][0], a, b)


@pytest.mark.skipif(not GENTD26.exists(), reason="needs ../shared/data")
def test_backtest_sweep_chart_on_the_shared_trace_has_nothing_cut_off(tmp_path, capsys):
    png = tmp_path / "sweep.png"
    assert main(["--log-level", "ERROR", "backtest", "--trace", str(GENTD26), "--sweep", "--chart", str(png)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"chart: {png}"
    with Image.open(png) as img:
        assert img.size == (800, 500)
    assert ink_on_the_frame(png) == 0
