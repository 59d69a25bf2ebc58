"""PNG chart of a sweep: every rule, the Pareto front, the suggestion (and any extra policies).

Drawn to be read at its default size (800 x 500 px): the title wraps instead of running off both sides, rules that
land on the same point share one label, each label is put where it covers no other label, no point of the front and
stays inside the plot (a label that fits nowhere is left off: the table printed beside the chart lists every rule),
and the legend sits under the plot, never on the labels."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from .engine import Summary  # noqa: E402

TITLE_CHARS = 70  # a title line at 12 pt across the 8-inch figure
# Where a label may go around its point, in points (dx, dy, horizontal and vertical alignment), nearest first.
LABEL_SPOTS = tuple((sx * dx, sy * dy, "left" if sx > 0 else "right", "bottom" if sy > 0 else "top")
                    for dx, dy in ((5, 3), (5, 12), (14, 22), (24, 34))
                    for sx, sy in ((1, 1), (1, -1), (-1, 1), (-1, -1)))


def _groups(front: Sequence[Summary]) -> list[tuple[float, float, str]]:
    """(x, y, label) per distinct point of the front: rules with the same figures share one label."""
    names: dict[tuple[float, float], list[str]] = {}
    for s in front:
        names.setdefault((round(100 * s.false_stop_rate, 6), round(s.net_gpu_hours, 6)), []).append(s.policy)
    return [(x, y, " = ".join(n)) for (x, y), n in sorted(names.items())]


def front_png(path: str | Path, results: Sequence[Summary], front: Sequence[Summary],
              suggested: Summary | None = None, extra: Sequence[Summary] = (), title: str = "",
              placed: list | None = None) -> Path:
    """Write the chart; `placed`, when given, receives (label, box in pixels) of every label drawn."""
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    ax.scatter([100 * s.false_stop_rate for s in results], [s.net_gpu_hours for s in results],
               s=14, color="#999999", label="swept rules")
    fx = [100 * s.false_stop_rate for s in front]
    fy = [s.net_gpu_hours for s in front]
    ax.plot(fx, fy, "-o", color="#1f77b4", label="Pareto front")
    if suggested is not None:
        ax.scatter([100 * suggested.false_stop_rate], [suggested.net_gpu_hours], s=120, facecolors="none",
                   edgecolors="#d62728", linewidths=2, label=f"suggested: {suggested.policy}")
    for s in extra:
        ax.scatter([100 * s.false_stop_rate], [s.net_gpu_hours], marker="*", s=140, label=s.policy[:60])
    ax.set_xlabel("false-stop rate (%)")
    ax.set_ylabel("net GPU-hours saved")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.margins(x=0.08, y=0.12)  # room for the labels of the points at the plot's edges
    ax.set_title(textwrap.fill(title or "Backtest sweep: net saving vs false stops", TITLE_CHARS,
                               break_long_words=True), fontsize=12)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(4, len(labels)), frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # the legend's row under the plot
    _label_front(fig, ax, _groups(front), placed)
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def _label_front(fig, ax, groups: list[tuple[float, float, str]], placed: list | None) -> None:
    """Each label at the first spot around its point that overlaps no label drawn before it and no point of the
    front, inside the plot; none fits: left off."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    taken = []
    for x, y in ((x, y) for x, y, _ in groups):  # the front's own markers, 8 px across
        px, py = ax.transData.transform((x, y))
        taken.append(Bbox.from_extents(px - 4, py - 4, px + 4, py + 4))
    for x, y, text in groups:
        for dx, dy, ha, va in LABEL_SPOTS:
            label = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=7, ha=ha, va=va,
                                arrowprops=({"arrowstyle": "-", "color": "#999999", "lw": 0.5}
                                            if abs(dy) > 12 else None))
            box = label.get_window_extent(renderer)
            fits = (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1)
            if fits and not any(box.overlaps(other) for other in taken):
                taken.append(box)
                if placed is not None:
                    placed.append((text, box))
                break
            label.remove()
