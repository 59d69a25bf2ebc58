"""`write_monthly_report`: the one call the CLI and a scheduler make."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Iterable

from ..config import Settings
from ..store.store import Store
from .audit import MonthlyAudit, build_audit
from .deliver import configured, deliver_report
from .inputs import SlurmReader, read_inputs
from .options import report_settings
from .period import previous_month, report_period
from .sections import trend_table
from .render import FORMATS, PdfError, write_report


def monthly_audit(store: Store, month: str | None, now: datetime, settings: Settings | None = None,
                  slurm: SlurmReader | None = None) -> MonthlyAudit:
    """The audit of `month` (YYYY-MM; None = the previous full month before `now`), with its trend against
    the month before, which is audited the same way (same code, same definitions). `slurm` reads the Slurm
    clusters' accounting of the month (run.slurm_cost.slurm_reader), for this month only."""
    period = report_period(month, now)
    opts = report_settings(settings)
    fallback = settings.schedule.evaluate_every_s if settings is not None else 60
    audit = build_audit(read_inputs(store, period, settings, slurm), opts, fallback_period_s=fallback)
    before = report_period(previous_month(period.start), now)
    previous = build_audit(read_inputs(store, before, settings), opts, fallback_period_s=fallback)
    audit.previous_month = before.month
    audit.trend = trend_table(audit.headline, previous.headline if previous.has_data else None)
    return audit


def write_monthly_report(store: Store, month: str | None, out_dir: str | Path, now: datetime,
                         settings: Settings | None = None, formats: Iterable[str] = FORMATS,
                         slurm: SlurmReader | None = None) -> list[Path]:
    """Write the HTML report, one CSV per table and the JSON document into out_dir; return the paths written.

    Meant to be scheduled on the first days of a month with month=None (the month just ended).
    """
    return write_report(monthly_audit(store, month, now, settings, slurm), Path(out_dir), formats)


def write_and_deliver(store: Store, month: str | None, out_dir: str | Path, now: datetime,
                      settings: Settings | None, formats: Iterable[str] = FORMATS, *, dry_run: bool = False,
                      notifier=None, s3_client=None, email=None, again: bool = False,
                      slurm: SlurmReader | None = None, audit: MonthlyAudit | None = None,
                      ) -> tuple[list[Path], list]:
    """Write the report (with its PDF rendition) and send it to the destinations of `report.delivery`; with
    dry_run nothing is sent and the Delivery rows say what would have been. Returns (paths, deliveries).
    Slack and email go once per report (a delivered one is said, not sent again); `again` sends another copy.
    A PDF that cannot be made (no Chromium) raises PdfError before anything is sent. `audit`: the month's audit
    when the caller built it already (monthly_audit), else built here."""
    d = report_settings(settings).delivery
    formats = list(dict.fromkeys([*formats, "pdf"])) if configured(d) else list(formats)
    audit = audit if audit is not None else monthly_audit(store, month, now, settings, slurm)
    paths = write_report(audit, Path(out_dir), formats)
    email_to = settings.email.finance if settings is not None else ()
    return paths, deliver_report(audit, paths, d, dry_run=dry_run, notifier=notifier, s3_client=s3_client,
                                 email=email, email_to=email_to, store=store, again=again)


__all__ = ["PdfError", "monthly_audit", "write_and_deliver", "write_monthly_report"]
