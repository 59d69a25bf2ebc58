"""PNG chart of a sweep: every rule, the Pareto front, the suggestion (and any extra policies)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402

from .engine import Summary  # noqa: E402


def front_png(path: str | Path, results: Sequence[Summary], front: Sequence[Summary],
              suggested: Summary | None = None, extra: Sequence[Summary] = (), title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    ax.scatter([100 * s.false_stop_rate for s in results], [s.net_gpu_hours for s in results],
               s=14, color="#999999", label="swept rules")
    fx = [100 * s.false_stop_rate for s in front]
    fy = [s.net_gpu_hours for s in front]
    ax.plot(fx, fy, "-o", color="#1f77b4", label="Pareto front")
    for s in front:
        ax.annotate(s.policy, (100 * s.false_stop_rate, s.net_gpu_hours), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    if suggested is not None:
        ax.scatter([100 * suggested.false_stop_rate], [suggested.net_gpu_hours], s=120, facecolors="none",
                   edgecolors="#d62728", linewidths=2, label=f"suggested: {suggested.policy}")
    for s in extra:
        ax.scatter([100 * s.false_stop_rate], [s.net_gpu_hours], marker="*", s=140, label=s.policy[:60])
    ax.set_xlabel("false-stop rate (%)")
    ax.set_ylabel("net GPU-hours saved")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_title(title or "Backtest sweep: net saving vs false stops")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
