"""The report's charts as PNG bytes (matplotlib, Agg): embedded base64 so the HTML is one self-contained file.

PNG rather than inline SVG: an SVG would carry tag values and instance names into the page as markup;
a PNG carries only pixels. Labels are made literal for matplotlib (a "$" would start mathtext).
"""

from __future__ import annotations

import base64
import io
from datetime import date

import matplotlib

matplotlib.use("Agg")  # no display, no GUI toolkit: safe in a service and in CI

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ..cost.costs import VERDICTS  # noqa: E402

COLORS = {"ACTIVE": "#2e7d32", "UNDERUTILIZED": "#f9a825", "UNKNOWN": "#9e9e9e", "IDLE": "#c62828"}
LABELS = {"ACTIVE": "active", "UNDERUTILIZED": "underutilized", "UNKNOWN": "unknown (no data / not judged)",
          "IDLE": "idle"}
DPI = 110
DESKTOP_WIDTH_IN = 9.0
PHONE_WIDTH_IN = 3.8  # drawn again this narrow for phones: the same fonts then read at ~10 px, not ~4 px


def plain(text: object, limit: int = 40) -> str:
    """A label matplotlib prints literally: '$' escaped (no mathtext), long names shortened."""
    s = str(text)
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return s.replace("$", r"\$")


def _money_axis(ax, currency: str) -> None:
    sym = "$" if currency == "USD" else ""
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: plain(f"{sym}{v:,.0f}")))


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _title_pad(width_in: float, entries: int) -> float:
    """Room above the plot for the legend's rows under the title (one row on a desktop, more on a phone)."""
    rows = 1 if width_in >= 6 else -(-entries // 2)
    return 12 + 12 * rows


def _legend_on_top(ax, ncols: int = 4) -> None:
    # Above the plot, under the title: the same place whatever the chart's height.
    ax.legend(fontsize=8, ncols=ncols, loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False,
              borderaxespad=0.2, handlelength=1.2)


def daily_cost_chart(daily: pd.DataFrame, currency: str, month_start: date, days_in_period: int,
                     width_in: float = DESKTOP_WIDTH_IN) -> bytes | None:
    """Stacked bars per day of the month: cost by verdict (idle on top, in red); billed cost as a line when known.

    The x axis is the whole month, so a day without evaluations shows as a gap, not as a cheap day.
    """
    if daily.empty or (daily["evaluated_cost"].fillna(0).sum() <= 0 and daily["billed_cost"].fillna(0).sum() <= 0):
        return None
    x = [(d - month_start).days + 1 for d in daily["date"]]
    fig, ax = plt.subplots(figsize=(width_in, 3.8))
    bottom = pd.Series(0.0, index=daily.index)
    for v in VERDICTS:  # ACTIVE at the bottom, IDLE on top where it is easy to read
        values = daily[f"{v.lower()}_cost"].fillna(0.0)
        ax.bar(x, values, bottom=bottom, width=0.75, color=COLORS[v], label=LABELS[v])
        bottom = bottom + values
    if daily["billed_cost"].notna().any():
        ax.plot(x, daily["billed_cost"], color="#1a237e", marker="o", linewidth=1.5, markersize=3,
                label="billed (all GPU instances)")
    ax.set_xlim(0.4, days_in_period + 0.6)
    # Every day on a desktop; every 5th on a phone, where 31 labels would touch.
    ax.set_xticks(range(1, days_in_period + 1, 1 if width_in >= 6 else 5))
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel(plain(f"day of {month_start:%B %Y} (UTC)"), fontsize=9)
    ax.set_title("Daily GPU cost, by verdict", loc="left", fontsize=11, pad=_title_pad(width_in, 5))
    _money_axis(ax, currency)
    ax.set_ylabel(plain(currency))
    ax.grid(axis="y", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    _legend_on_top(ax, ncols=5 if width_in >= 6 else 2)
    return _png(fig)


def team_verdict_chart(teams: pd.DataFrame, width_in: float = DESKTOP_WIDTH_IN) -> bytes | None:
    """Share of each team's evaluated hours by verdict (100% bars)."""
    t = teams[teams["hours"].fillna(0) > 0] if len(teams) else teams
    if t.empty:
        return None
    t = t.sort_values("idle_pct", ascending=True, kind="stable")
    fig, ax = plt.subplots(figsize=(width_in, 0.45 * len(t) + 1.4))
    left = pd.Series(0.0, index=t.index)
    names = [plain(x) for x in t["team"]]
    for v in VERDICTS:
        values = t[f"{v.lower()}_pct"].fillna(0.0)
        ax.barh(names, values, left=left, color=COLORS[v], label=LABELS[v], height=0.6)
        left = left + values
    ax.set_xlim(0, 100)
    ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter())
    ax.set_title("Share of evaluated hours by verdict, per team", loc="left", fontsize=11, pad=_title_pad(width_in, 4))
    ax.spines[["top", "right"]].set_visible(False)
    _legend_on_top(ax, ncols=4 if width_in >= 6 else 2)
    return _png(fig)


def top_idle_chart(instances: pd.DataFrame, currency: str, top: int = 10,
                   width_in: float = DESKTOP_WIDTH_IN) -> bytes | None:
    """The instances whose IDLE hours cost the most."""
    t = instances[instances["idle_cost"].fillna(0) > 0] if len(instances) else instances
    if t.empty:
        return None
    t = t.nlargest(top, "idle_cost").iloc[::-1]
    names = [plain(f"{i} ({team})", 48) for i, team in zip(t["instance_id"], t["team"])]
    fig, ax = plt.subplots(figsize=(width_in, 0.4 * len(t) + 1.2))
    bars = ax.barh(names, t["idle_cost"], color=COLORS["IDLE"], height=0.6)
    sym = "$" if currency == "USD" else ""
    ax.bar_label(bars, labels=[plain(f"{sym}{v:,.2f}") for v in t["idle_cost"]], padding=3, fontsize=8)
    ax.set_title(f"Top {len(t)} instances by idle cost", loc="left", fontsize=11)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: plain(f"{sym}{v:,.0f}")))
    ax.margins(x=0.15)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def data_uri(png: bytes | None) -> str | None:
    return None if png is None else "data:image/png;base64," + base64.b64encode(png).decode("ascii")
