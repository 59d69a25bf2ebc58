"""The I/O edge of the monthly report: everything it needs, read once from the store and the catalogs.

The numbers are computed from these values by gpufinops.report.audit, which does no I/O.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Callable

import pandas as pd
from sqlalchemy import func, select

from ..store.schema import costs as costs_table
from ..collect.billing.schema import empty_table, load_costs
from ..config import DEFAULT_RULES_DIR, ActSettings, Settings
from ..cost.costs import PriceLookup
from ..cost.slurm import SlurmUsage
from ..store.schema import ActionRow, aware_utc
from ..store.store import Store
from .period import ReportPeriod

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BillingImport:
    source: str
    rows: int
    first_day: date
    last_day: date
    imported_at: datetime


@dataclass
class AuditInputs:
    period: ReportPeriod
    verdicts: pd.DataFrame  # Store.verdict_hours_frame() of the month: hourly rollups and each instance's tail
    episodes: pd.DataFrame  # Store.episode_frame() overlapping the month: per (instance, rule) verdict runs
    runs: pd.DataFrame  # Store.service_run_frame() overlapping the month: when the service evaluated anything
    actions: list[ActionRow]
    notifications: list[dict]
    cost_table: pd.DataFrame  # the stored billing rows of the month (possibly empty)
    billing_imports: list[BillingImport]
    recommendations: list  # gpufinops.recommend.engine.Recommendation, newest run since the month start
    catalog: PriceLookup | None  # on-demand $/h by (instance_type, region): fallback rate
    gpu_count: Callable[[str], float | None]  # GPUs per instance type, None when unknown
    price_date: Callable[[str, str], date | None]  # (instance_type, region) -> the catalog price's date
    default_region: str = ""
    warnings: list[str] = field(default_factory=list)
    gpu_model: Callable[[str], str | None] = lambda itype: None  # GPU model per instance type (catalog)
    budgets: list = field(default_factory=list)  # gpufinops.budgets.Budget from billing.budgets_path
    budgets_path: str = ""  # where they were read ("" = no settings at hand, or no such file)
    running_fresh_s: float = 900.0  # billing.running_fresh_s: "running now" for the budget forecast
    # Store.instance_labels() of the month's instances: owner, account, region as the service last saw them.
    labels: dict[str, dict] = field(default_factory=dict)
    # The idle rules and act settings the advice is made from (report.advice); rules None: unreadable (a warning).
    rules: list | None = field(default_factory=list)
    act: ActSettings = field(default_factory=ActSettings)
    # Store.node_hours_frame() of the month: per hour and Kubernetes GPU node, its cost split (empty: no cluster).
    node_hours: pd.DataFrame = field(default_factory=pd.DataFrame)
    # The Slurm clusters' month from sacct with its idle join (cost.slurm.SlurmUsage; None: no `slurm:` section).
    slurm: SlurmUsage | None = None

    @property
    def evaluations(self) -> int:
        """Decision rows (one per instance, rule and tick) stored for the month."""
        return int(self.verdicts["evaluations"].sum()) if len(self.verdicts) else 0


def _on_demand_prices(settings: Settings | None, warnings: list[str]):
    from ..prices.prices import OnDemandPrices

    path = None
    if settings is not None and settings.billing:
        try:
            from ..collect.billing.settings import billing_settings

            path = billing_settings(settings).price_catalog
        except Exception as exc:  # noqa: BLE001 - a bad billing section only loses the custom catalog
            warnings.append(f"billing settings unusable, bundled prices used: {exc}")
    try:
        return OnDemandPrices.load(path) if path else OnDemandPrices.load_default()
    except Exception as exc:  # noqa: BLE001 - without a catalog, hours stay unpriced (never $0)
        warnings.append(f"price catalog unavailable ({exc}); instances without a stored price are unpriced")
        return None


def _price_dates(warnings: list[str]) -> Callable[[str, str], date | None]:
    try:
        from ..prices.catalog import load_catalog

        cat = load_catalog()
    except Exception as exc:  # noqa: BLE001 - only the price-age note is lost
        warnings.append(f"sizing catalog unavailable, price dates unknown: {exc}")
        return lambda itype, region: None

    def lookup(itype: str, region: str) -> date | None:
        offer = cat.offer("aws", itype, region) or cat.offer("aws", itype)
        return offer.prices_as_of if offer else None

    return lookup


def _budgets(settings: Settings | None, warnings: list[str]) -> tuple[list, str, float]:
    """The budgets of billing.budgets_path, read by gpufinops.budgets.load_budgets; none without settings."""
    if settings is None:
        return [], "", 900.0
    try:
        from ..cost.budgets import configured_budgets
        from ..collect.billing.settings import billing_settings

        bs = billing_settings(settings)
    except Exception as exc:  # noqa: BLE001 - a bad billing section only loses the budget section
        warnings.append(f"billing settings unusable, budgets not shown: {exc}")
        return [], "", 900.0
    path = Path(bs.budgets_path)
    try:
        budgets = configured_budgets(path)  # none at the default path unless someone wrote one (issue 26)
        return budgets, str(path) if budgets else "", float(bs.running_fresh_s)
    except Exception as exc:  # noqa: BLE001 - a broken budgets file is reported, the audit still runs
        warnings.append(f"budgets not shown: {exc}")
        return [], str(path), float(bs.running_fresh_s)


def _rules(settings: Settings | None, warnings: list[str]) -> list | None:
    """The idle rules of the config (the shipped ones without settings), as the act stage loads them."""
    from ..config import ConfigError
    from ..rules import load_rules

    try:
        return load_rules(settings.rules_paths if settings is not None else (str(DEFAULT_RULES_DIR),))
    except ConfigError as exc:
        warnings.append(f"rules unreadable, no stop advice given: {exc}")
        return None


def _billing_imports(store: Store, start: date, end: date) -> list[BillingImport]:
    q = (select(costs_table.c.source, func.count(), func.min(costs_table.c.date), func.max(costs_table.c.date),
                func.max(costs_table.c.imported_at))
         .where(costs_table.c.date >= start, costs_table.c.date < end).group_by(costs_table.c.source))
    with store.engine.connect() as conn:
        return [BillingImport(s, int(n), lo, hi, aware_utc(at)) for s, n, lo, hi, at in conn.execute(q)]


def _recommendations(store: Store, since: datetime, warnings: list[str]) -> list:
    try:
        from ..recommend.engine import latest_recommendations
    except ImportError as exc:
        warnings.append(f"recommendations unavailable: {exc}")
        return []
    return latest_recommendations(store, since)


SlurmReader = Callable[[datetime, datetime, datetime], SlurmUsage]  # (start, end, as_of): run.slurm_cost


def read_inputs(store: Store, period: ReportPeriod, settings: Settings | None = None,
                slurm: SlurmReader | None = None) -> AuditInputs:
    """`slurm`: reads the Slurm clusters' month (sacct is read where the places are: the caller hands the reader)."""
    warnings: list[str] = []
    costs_table.create(store.engine, checkfirst=True)  # a database that never saw billing has no table yet
    start_d = period.start.date()
    # A month still running: up to and including today's rows, if billing has any yet.
    end_d = period.as_of.date() + timedelta(days=1) if period.partial else period.end.date()
    cost_rows = load_costs(store, start_d, end_d)
    prices = _on_demand_prices(settings, warnings)

    def gpu_count(itype: str) -> float | None:
        spec = prices.gpu_spec(itype) if prices is not None and itype else None
        return spec.gpu_count if spec else None

    def gpu_model(itype: str) -> str | None:
        spec = prices.gpu_spec(itype) if prices is not None and itype else None
        return spec.gpu_model or None if spec else None

    budgets, budgets_path, fresh_s = _budgets(settings, warnings)

    notes = [n for n in store.notification_rows() if n["at"] is not None
             and period.start <= aware_utc(n["at"]) < period.as_of]
    region = settings.aws.regions[0] if settings is not None and settings.aws.regions else "us-east-1"
    verdicts = store.verdict_hours_frame(period.start, period.as_of)
    return AuditInputs(
        period=period,
        verdicts=verdicts,
        episodes=store.episode_frame(period.start, period.as_of),
        runs=store.service_run_frame(period.start, period.as_of),
        actions=store.action_rows(start=period.start, end=period.as_of),
        notifications=notes,
        cost_table=cost_rows if len(cost_rows) else empty_table(),
        billing_imports=_billing_imports(store, start_d, end_d),
        recommendations=_recommendations(store, period.start, warnings),
        catalog=(lambda itype, reg: prices.hourly(itype, reg)) if prices is not None else None,
        gpu_count=gpu_count,
        price_date=_price_dates(warnings),
        default_region=region,
        warnings=warnings,
        gpu_model=gpu_model,
        budgets=budgets,
        budgets_path=budgets_path,
        running_fresh_s=fresh_s,
        labels=store.instance_labels(verdicts["instance_id"].unique().tolist()) if len(verdicts) else {},
        rules=_rules(settings, warnings),
        act=settings.act if settings is not None else ActSettings(),
        node_hours=store.node_hours_frame(period.start, period.as_of),
        slurm=_slurm(slurm, period, warnings),
    )


def _slurm(read: SlurmReader | None, period: ReportPeriod, warnings: list[str]) -> SlurmUsage | None:
    if read is None:
        return None
    usage = read(period.start, period.end, period.as_of)
    # A cluster whose accounting could not be read: its GPU-hours are unknown, said in the data-quality notes.
    warnings.extend(usage.errors)
    warnings.extend(usage.warnings)
    return usage


__all__ = ["AuditInputs", "BillingImport", "read_inputs"]
