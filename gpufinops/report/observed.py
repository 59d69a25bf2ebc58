"""How much of the month the figures saw, and what the spend and the forecast stand for, in words: page 1 (HTML
and PDF), the finance email and the Slack line all say it with these sentences (issue 35: a month observed
2.9 % of the time was called "the whole month", and a forecast stood beside a few dollars of spend unlabelled).

Pure: numbers in, plain text out (no markup; the page autoescapes it, Slack escapes it).
"""

from __future__ import annotations

from datetime import datetime

from .formats import money, share
from .period import ReportPeriod
from .sections import COMPLETE_SHARE

# The forecast's label wherever it is shown: never a figure that reads as spend.
FORECAST_LABEL = "Forecast for the month (a projection, not spend)"


def observed_period(period: ReportPeriod, observed_hours: float) -> dict:
    """How much of the calendar month the service observed (its evaluating time, `service_runs`)."""
    month_hours = (period.end - period.start).total_seconds() / 3600.0
    elapsed = period.hours
    so_far = observed_hours / elapsed if elapsed > 0 else 0.0
    return {
        "month": period.month, "month_name": f"{period.start:%B %Y}", "month_hours": month_hours,
        "elapsed_hours": elapsed, "observed_hours": observed_hours,
        "share": observed_hours / month_hours if month_hours > 0 else 0.0,
        # Everything up to as_of was watched (a tick's rounding is not a gap): the figures are the whole month's
        # when the month is over too.
        "all_so_far": so_far >= COMPLETE_SHARE, "in_progress": period.partial,
        "whole_month": not period.partial and so_far >= COMPLETE_SHARE, "as_of": period.as_of,
    }


def hours(h: float) -> str:
    """21 h, 3.0 h, 40 min: whole hours where a tenth says nothing, minutes under an hour."""
    if h < 1:
        return f"{h * 60:.0f} min"
    return f"{h:.1f} h" if h < 10 else f"{h:,.0f} h"


def _at(t: datetime) -> str:
    return f"{t:%Y-%m-%d %H:%M} UTC"


def observed_words(o: dict) -> str:
    """"21 h of 744 h (2.9%) of December 2026" (after "Observed:"): the one caveat every delivery carries."""
    if o["whole_month"]:
        return f"the whole of {o['month_name']} ({hours(o['month_hours'])})"
    text = (f"{hours(o['observed_hours'])} of {hours(o['month_hours'])} ({share(o['share'])}) "
            f"of {o['month_name']}")
    if o["in_progress"]:
        text += f"; the month is in progress ({hours(o['elapsed_hours'])} so far, to {_at(o['as_of'])})"
    return text


def spend_words(o: dict, billed: bool, billing_days: int) -> str:
    """What the spend figure counts: the whole month, the month so far, or only the hours (days) seen."""
    month_days = round(o["month_hours"] / 24)
    if billed:
        if billing_days >= month_days:
            return "the whole month, billed"
        if o["in_progress"]:
            return f"the month so far: {billing_days} of {month_days} day(s) billed"
        return f"only {billing_days} of {month_days} day(s) billed: days without cost rows are not counted"
    if o["whole_month"]:
        return "the whole month"
    if o["all_so_far"]:
        return f"the month so far (to {_at(o['as_of'])})"
    return (f"only the {hours(o['observed_hours'])} observed{' so far' if o['in_progress'] else ''}: "
            "time the service did not see is not counted")


def forecast_words(forecast: float | None, parts: dict | None, currency: str) -> str:
    """What the forecast adds up (its label says it is a projection, not spend): spend so far + the $/h of what
    was running when observation ended x the hours left, so a few dollars beside a large forecast explain
    themselves."""
    if forecast is None or not parts:
        return "nothing observed to project from"
    spent = money(parts["spent"], currency)
    if parts["hours_left"] <= 0:
        return f"the month's spend ({spent}), seen to its end: nothing left to project"
    left = hours(parts["hours_left"])
    if parts["running_rate"] <= 0:
        return (f"{spent} so far; nothing was seen running at {_at(parts['through'])}, so nothing is added "
                f"for the {left} to the month's end")
    return (f"{spent} so far + {money(parts['running_rate'], currency)}/h (what was running at "
            f"{_at(parts['through'])}) x {left} to the month's end")


def finance_caveats(period: ReportPeriod, observed_hours: float, billed: bool, billing_days: int, fleet,
                    currency: str) -> dict:
    """The finance page's caveats (merged into `MonthlyAudit.finance`, so the JSON has them too): how much of the
    month was observed, what the spend counts and what the forecast adds up, as numbers and as words. `fleet`:
    sections.fleet_forecast's BudgetStatus, or None."""
    o = observed_period(period, observed_hours)
    parts = None if fleet is None else {"spent": fleet.spent, "running_rate": fleet.running_rate,
                                        "hours_left": fleet.hours_left, "through": fleet.data_through}
    return {"observed": o, "forecast_parts": parts, "observed_words": observed_words(o),
            "spend_words": spend_words(o, billed, billing_days),
            "forecast_words": forecast_words(None if fleet is None else fleet.forecast, parts, currency)}


__all__ = ["FORECAST_LABEL", "finance_caveats", "forecast_words", "hours", "observed_period", "observed_words",
           "spend_words"]
