"""Which month a report covers, and up to when (a month still running is reported up to `now`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from ..collect.billing.schema import BillingDataError, month_bounds


class ReportPeriodError(ValueError):
    """A --month that is malformed or lies in the future."""


@dataclass(frozen=True)
class ReportPeriod:
    month: str  # YYYY-MM
    start: datetime  # first instant of the month, UTC
    end: datetime  # first instant of the next month, UTC
    as_of: datetime  # min(end, now): what the report can know
    now: datetime

    @property
    def partial(self) -> bool:
        return self.as_of < self.end

    @property
    def hours(self) -> float:
        return (self.as_of - self.start).total_seconds() / 3600.0


def previous_month(now: datetime) -> str:
    """The last full month before `now` (UTC): on 2026-11-03 that is 2026-10."""
    now = now.astimezone(timezone.utc)
    year, month = (now.year - 1, 12) if now.month == 1 else (now.year, now.month - 1)
    return f"{year:04d}-{month:02d}"


def report_period(month: str | None, now: datetime) -> ReportPeriod:
    if now.tzinfo is None:
        raise ReportPeriodError("now must be timezone-aware")
    month = month or previous_month(now)
    try:
        start, end = month_bounds(month)
    except BillingDataError as exc:
        raise ReportPeriodError(str(exc)) from None
    month = f"{start:%Y-%m}"  # "2022-9" is read as 2022-09 and named so in file names and titles
    if start >= now:
        raise ReportPeriodError(f"month {month} has not started yet (now is {now:%Y-%m-%d %H:%M} UTC)")
    return ReportPeriod(month, start, end, min(end, now), now)
