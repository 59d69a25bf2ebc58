"""The Slurm clusters' GPU-hours of a window, read from `sacct` and priced: what `costs --by slurm-*`, the budget
check and the monthly report read (places.slurm.accounting reads and charges; cost.slurm sums).

A cluster whose sacct fails is an error line and no rows: its GPU-hours are unknown, never $0 — the callers say it
(an error in `costs`, a budget in error, a warning in the report).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Callable

import pandas as pd

from ..config import Settings
from ..cost.slurm import SlurmUsage, usage_table
from ..places.slurm.accounting import SlurmPrices, read_charges
from ..places.slurm.commands import SlurmCommands, SlurmUnavailable
from ..prices.catalog import CatalogError, load_catalog


CommandsFor = Callable[[str, str | None, float], SlurmCommands]


def read_slurm_usage(settings: Settings, start: datetime, end: datetime, now: datetime, *,
                     commands_for: CommandsFor = SlurmCommands) -> SlurmUsage:
    """Every enabled cluster's runs charged for [start, min(end, now))."""
    clusters = settings.slurm.enabled if settings.slurm is not None else ()
    try:
        catalog, problem = load_catalog(settings.recommend.catalog_dir), ""
    except CatalogError as exc:
        catalog, problem = None, f"the GPU catalog could not be read: {exc}"
    origin = f"the slurm: section of {settings.source_path}" if settings.source_path else "the slurm: section"
    tables: list[pd.DataFrame] = []
    out = SlurmUsage(usage_table([]), tuple(c.cluster for c in clusters))
    until = min(end, now)
    for c in clusters:
        commands = commands_for(c.cluster, c.conf, c.timeout_s)
        prices = SlurmPrices.of(c, catalog, catalog_problem=problem, origin=origin)
        # One window's answer at a time (accounting.read_charges), each folded into a compact table before the next
        # is asked: a month of a large cluster is never held whole as sacct's JSON.
        cluster_tables: list[pd.DataFrame] = []
        unread: dict[str, None] = {}  # a record unreadable in several windows' answers is said once
        unpriced: set[str] = set()
        try:
            for charges, window_unread in read_charges(commands, start, until, now, prices,
                                                       window=timedelta(hours=c.sacct_window_hours)):
                unread.update(dict.fromkeys(window_unread))
                if charges:
                    cluster_tables.append(usage_table(ch.row() for ch in charges))
                unpriced.update(ch.price.source for ch in charges if ch.price.usd_per_gpu_hour is None)
        except SlurmUnavailable as exc:
            # what the windows before it gave is dropped: a part of the month is never shown as the month
            out.errors.append(f"{exc} (its GPU-hours are unknown, not zero)")
            continue
        tables.extend(cluster_tables)
        out.warnings.extend(unread)
        out.warnings.extend(f"slurm {c.cluster}: {why}: those GPU-hours are unpriced" for why in sorted(unpriced))
    if tables:
        # One order whatever the windows: the dollars are float sums, and a sum's last cent can depend on its order;
        # sorted, a month read in any windows gives the very table (and totals) one whole read gives.
        out.table = pd.concat(tables, ignore_index=True).sort_values(
            ["cluster", "start", "job_id", "gpu_seconds"], kind="stable").reset_index(drop=True)
    return out


def read_slurm_idle(settings: Settings, store, start: datetime, end: datetime, now: datetime,
                    usage: pd.DataFrame) -> tuple[pd.DataFrame | None, str]:
    """cost.slurm.idle_by_job() over the stored verdicts of [start, min(end, now)); (None, why) when the store
    cannot be read: idle is then unknown, never 0."""
    from sqlalchemy.exc import SQLAlchemyError

    from ..cost.costs import verdict_costs
    from ..cost.slurm import idle_by_job

    until = min(end, now)
    try:
        frame = store.verdict_hours_frame(start, until, grain="period")
    except SQLAlchemyError as exc:
        return None, f"the stored verdicts could not be read ({type(exc).__name__}): idle GPU-hours unknown"
    vc = verdict_costs(frame, start, until, max_gap_s=2 * settings.schedule.evaluate_every_s)
    return idle_by_job(vc, usage), ""


def read_slurm_month(settings: Settings, store, start: datetime, end: datetime, now: datetime) -> SlurmUsage:
    """read_slurm_usage() with the idle GPU-hours of the stored verdicts joined (usage.idle; None and a warning
    when the store cannot be read): what the budget check and the monthly report read."""
    usage = read_slurm_usage(settings, start, end, now)
    usage.idle, why = read_slurm_idle(settings, store, start, end, now, usage.table)
    if why:
        usage.warnings.append(why)
    return usage


def billing_or_none(now: datetime):
    """The billing a check of Slurm budgets alone reads: none (an empty cost table, complete up to now)."""
    from ..collect.billing.load import LoadedCosts
    from ..collect.billing.schema import empty_table

    return LoadedCosts(empty_table(), "none (Slurm accounts only)", now)


def slurm_reader(settings: Settings | None, store):
    """The monthly report's reader of the Slurm clusters' month (report.inputs.SlurmReader: (start, end, as_of) ->
    SlurmUsage); None without an enabled `slurm:` cluster."""
    if settings is None or settings.slurm is None or not settings.slurm.enabled:
        return None
    return lambda start, end, as_of: read_slurm_month(settings, store, start, end, as_of)
