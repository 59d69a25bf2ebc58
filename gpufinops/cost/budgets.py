"""Monthly GPU budgets: evaluation (pure) and threshold alerts (through any Notifier).

Month-end forecast (both "actual" and "forecast" are checked against the thresholds):

    forecast = spent + running_rate x hours(period_end - data_through)

  spent         month-to-date cost of the scope in the cost table
  data_through  where billing is complete (Cost Explorer lags up to a day; for
                files, the end of the last day with cost, never after now)
  running_rate  sum of the hourly rates of the scope's instances running now
                (evaluated within billing.running_fresh_s), priced as in
                gpufinops.costs.hourly_rate

So the hours between data_through and now — billed later — are covered by the
same running rate as the rest of the month.

Alerts: per budget and kind (actual / forecast) only the highest crossed
threshold is sent, once per period: the Message key is
`budget:<name>:<scope>:<YYYY-MM>:<kind>:<pct>` and the notifier drops a key the
store has already seen, so a restart never repeats an alert. A jump from 50%
to 95% sends the 90% alert only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Literal, Sequence

import pandas as pd
from pydantic import Field, ValidationError, field_validator, model_validator

from ..collect.billing.load import LoadedCosts
from ..model import UNTAGGED
from ..collect.billing.schema import month_bounds, single_currency
from ..collect.billing.settings import BillingSettings, billing_settings
from ..decide import escalation
from ..config import DEFAULT_RULES_DIR, ConfigError, Settings, StrictModel, format_validation_error, load_yaml
from .costs import PriceLookup, billing_rates, hourly_rate, idle_share, resource_attrs, verdict_costs
from ..model import Message, Notifier, format_money, hours
from ..notify.markup import escape
from ..notify.routing import deliveries
from ..store.store import Store
from . import escalations
from . import slurm as slurm_cost
from .slurm import SlurmUsage

log = logging.getLogger("gpufinops.budgets")

Level = Literal["warning", "critical", "emergency"]
Kind = Literal["actual", "forecast"]


# A budget above this is a typo (or 9.2e18, a sentinel pasted in): no GPU fleet spends a trillion a month.
MAX_AMOUNT = 1e12


class Threshold(StrictModel):
    pct: float = Field(gt=0, le=1000)
    level: Level


DEFAULT_THRESHOLDS = (Threshold(pct=75, level="warning"), Threshold(pct=90, level="critical"),
                      Threshold(pct=100, level="emergency"))


class Scope(StrictModel):
    # slurm_account: a Slurm account's GPU-hours from sacct (value `account`, or `cluster/account` for one cluster),
    # priced as `costs --by slurm-account` prices them (docs/slurm.md "Cost"); not the billing table.
    kind: Literal["all", "team", "project", "account", "instance_family", "slurm_account"] = "all"
    value: str | None = None

    @model_validator(mode="after")
    def _value(self) -> "Scope":
        if self.kind == "all" and self.value:
            raise ValueError("scope 'all' takes no value")
        if self.kind != "all" and not self.value:
            raise ValueError(f"scope '{self.kind}' needs a value (the {self.kind} to watch; "
                             f"'{UNTAGGED}' for untagged cost)")
        return self

    def label(self) -> str:
        return "all" if self.kind == "all" else f"{self.kind}={self.value}"

    @property
    def slurm(self) -> bool:
        return self.kind == "slurm_account"


class Budget(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    scope: Scope = Scope()
    amount: float = Field(gt=0, le=MAX_AMOUNT)
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")
    thresholds: tuple[Threshold, ...] = DEFAULT_THRESHOLDS
    kinds: tuple[Kind, ...] = ("actual", "forecast")
    channel: str = ""
    # Off by default. At this % of actual spend, IDLE instances of the scope whose rule only
    # notifies are marked for stop through the normal safe act path (gpufinops/decide/escalation.py).
    escalate_idle_to_stop_at: float | None = Field(None, gt=0, le=1000)

    @model_validator(mode="after")
    def _slurm_scope(self) -> "Budget":
        # Idle escalation marks instances of a billing scope for stop; a Slurm job is acted on by its own rules.
        if self.scope.slurm and self.escalate_idle_to_stop_at is not None:
            raise ValueError("escalate_idle_to_stop_at does not apply to a slurm_account budget (Slurm jobs are "
                             "requeued, held or cancelled by their rules, docs/slurm.md)")
        if self.scope.slurm and self.currency != "USD":
            raise ValueError("a slurm_account budget is in USD: Slurm GPU-hours are priced in USD, no conversion "
                             "is done")
        return self

    @field_validator("thresholds", mode="before")
    @classmethod
    def _plain_numbers(cls, v):
        # `thresholds: [75, 90, 100]` -> warning / critical / emergency by position from the top.
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            levels = ["emergency", "critical", "warning"]
            ordered = sorted(v, reverse=True)
            return [{"pct": p, "level": levels[min(i, 2)]} for i, p in enumerate(ordered)][::-1]
        return v

    @field_validator("thresholds")
    @classmethod
    def _sorted(cls, v: tuple[Threshold, ...]) -> tuple[Threshold, ...]:
        if not v:
            raise ValueError("at least one threshold")
        pcts = [t.pct for t in v]
        if len(set(pcts)) != len(pcts):
            raise ValueError(f"duplicate threshold percentages {pcts}")
        return tuple(sorted(v, key=lambda t: t.pct))


class BudgetFile(StrictModel):
    budgets: tuple[Budget, ...]

    @field_validator("budgets")
    @classmethod
    def _unique(cls, v: tuple[Budget, ...]) -> tuple[Budget, ...]:
        names = [b.name for b in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"budget names must be unique, repeated: {dup}")
        return v


# The default billing.budgets_path. No budgets file is shipped there (rules/examples/budgets.yaml is an example):
# a fresh install has no budget until someone writes one.
DEFAULT_BUDGETS_PATH = Path(DEFAULT_RULES_DIR) / "budgets.yaml"
EXAMPLE_BUDGETS = "rules/examples/budgets.yaml"


def configured_budgets(path: str | Path) -> list[Budget]:
    """The budgets of billing.budgets_path: none when it is the default path and no file is there (nothing was
    configured); a path someone set that does not exist is an error naming the key."""
    p = Path(path)
    if not p.exists():
        if p.resolve() == DEFAULT_BUDGETS_PATH.resolve():
            return []
        raise ConfigError(f"billing.budgets_path: {p} does not exist (an example: {EXAMPLE_BUDGETS})")
    return load_budgets(p)


def no_budgets_line(path: str | Path) -> str:
    return (f"no budgets configured: billing.budgets_path ({path}) has none; copy {EXAMPLE_BUDGETS} and point "
            "billing.budgets_path at it")


def load_budgets(path: str | Path) -> list[Budget]:
    raw, text = load_yaml(path)
    try:
        return list(BudgetFile.model_validate(raw if raw is not None else {}).budgets)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), text, exc)) from None


# --------------------------------------------------------------------------- evaluation (pure)


@dataclass
class BudgetStatus:
    budget: str
    scope: str
    period: str  # YYYY-MM
    amount: float
    currency: str
    spent: float
    forecast: float
    data_through: datetime
    running_rate: float  # currency / hour of what runs now in the scope
    hours_left: float
    top_instances: list[tuple[str, float]] = field(default_factory=list)
    top_teams: list[tuple[str, float]] = field(default_factory=list)
    idle_share: float | None = None
    unpriced_running: int = 0  # running instances with no known rate (forecast is low by them)
    # What the drivers and the running things are, in the alert's words: instances and teams, or Slurm jobs and users.
    things: tuple[str, str] = ("instances", "teams")
    crossed: dict[str, Threshold | None] = field(default_factory=dict)  # kind -> highest crossed
    alerts_sent: list[str] = field(default_factory=list)
    # Alerts due but not sent: the check only printed (no --notify) or was a dry-run; each as its first line.
    alerts_due: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def pct_actual(self) -> float:
        return 100.0 * self.spent / self.amount

    @property
    def pct_forecast(self) -> float:
        return 100.0 * self.forecast / self.amount


def scope_mask(df: pd.DataFrame, scope: Scope, family_col: str = "instance_type") -> pd.Series:
    if scope.kind == "all":
        return pd.Series(True, index=df.index)
    if scope.kind == "instance_family":
        return df[family_col].fillna("").str.split(".", n=1).str[0] == scope.value
    col = {"team": "team", "project": "project", "account": "account"}[scope.kind]
    value = "" if scope.value == UNTAGGED else scope.value
    return df[col].fillna("") == value


def highest_crossed(pct: float, thresholds: Sequence[Threshold]) -> Threshold | None:
    crossed = [t for t in thresholds if pct >= t.pct]
    return crossed[-1] if crossed else None


def evaluate_budget(budget: Budget, table: pd.DataFrame, period_start: datetime, period_end: datetime,
                    data_through: datetime, running: pd.DataFrame, verdicts: pd.DataFrame,
                    top_n: int = 3) -> BudgetStatus:
    """Spent, forecast and crossed thresholds of one budget. `running`: instance_id, team, project,
    account, instance_type, rate (NaN = unknown) of what runs now; `verdicts`: costs.verdict_costs()."""
    t = table[scope_mask(table, budget.scope)]
    spent = float(t["cost"].sum())
    r = running[scope_mask(running, budget.scope)] if not running.empty else running
    rate = float(r["rate"].sum(skipna=True)) if not r.empty else 0.0
    through = min(max(data_through, period_start), period_end)
    left = max(0.0, hours(period_end - through))
    forecast = spent + rate * left
    by_inst = t[t["resource_id"] != ""].groupby("resource_id")["cost"].sum().nlargest(top_n)
    teams = t.assign(team=t["team"].replace("", UNTAGGED)).groupby("team")["cost"].sum().nlargest(top_n)
    v = verdicts[scope_mask(verdicts, budget.scope)] if not verdicts.empty else verdicts
    status = BudgetStatus(
        budget=budget.name, scope=budget.scope.label(), period=f"{period_start:%Y-%m}", amount=budget.amount,
        currency=budget.currency, spent=spent, forecast=forecast, data_through=through, running_rate=rate,
        hours_left=left, top_instances=list(by_inst.items()), top_teams=list(teams.items()),
        idle_share=_known(idle_share(v)) if not v.empty else None,
        unpriced_running=int(r["rate"].isna().sum()) if not r.empty else 0,
    )
    values = {"actual": status.pct_actual, "forecast": status.pct_forecast}
    status.crossed = {k: highest_crossed(values[k], budget.thresholds) for k in budget.kinds}
    return status


def evaluate_slurm_budget(budget: Budget, usage: SlurmUsage, period_start: datetime, period_end: datetime,
                          now: datetime, top_n: int = 3) -> BudgetStatus:
    """A slurm_account budget: spent = the account's priced GPU-hours this month so far (sacct is complete up to
    now), forecast = spent + the $/h of its jobs running now x the hours left; drivers: its jobs and users. A
    cluster whose accounting could not be read makes it an error, never $0 spent."""
    period = f"{period_start:%Y-%m}"
    cluster = budget.scope.value.rpartition("/")[0] if budget.scope.value else ""
    errors = usage.cluster_errors(cluster) if cluster else usage.errors
    if cluster and cluster not in usage.clusters:
        errors = [f"no enabled Slurm cluster {cluster!r} in the slurm: section"]
    if errors or not usage.clusters:
        why = "; ".join(errors) or "no Slurm cluster is configured (the slurm: section)"
        return BudgetStatus(budget.name, budget.scope.label(), period, budget.amount, budget.currency, 0.0, 0.0,
                            now, 0.0, 0.0, error=f"budget '{budget.name}': {why}", things=("jobs", "users"))
    t = usage.table[slurm_cost.account_mask(usage.table, budget.scope.value)] if len(usage.table) else usage.table
    spent = float(t["cost"].sum()) if len(t) else 0.0
    rate, unpriced = slurm_cost.running_rate(t)
    through = min(max(now, period_start), period_end)
    left = max(0.0, hours(period_end - through))
    by_job = t.groupby("subject_id")["cost"].sum().nlargest(top_n) if len(t) else pd.Series(dtype=float)
    by_user = t.groupby("user")["cost"].sum().nlargest(top_n) if len(t) else pd.Series(dtype=float)
    idle = usage.idle
    share = None
    if idle is not None and spent > 0:
        mine = idle[slurm_cost.account_mask(idle, budget.scope.value)] if len(idle) else idle
        share = float(mine["idle_usd"].sum()) / spent if len(mine) else 0.0
    status = BudgetStatus(
        budget=budget.name, scope=budget.scope.label(), period=period, amount=budget.amount,
        currency=budget.currency, spent=spent, forecast=spent + rate * left, data_through=through,
        running_rate=rate, hours_left=left, top_instances=list(by_job.items()), top_teams=list(by_user.items()),
        idle_share=share, unpriced_running=unpriced, things=("jobs", "users"))
    values = {"actual": status.pct_actual, "forecast": status.pct_forecast}
    status.crossed = {k: highest_crossed(values[k], budget.thresholds) for k in budget.kinds}
    return status


def _known(x) -> float | None:
    """None for NaN (no priced evaluation): said "unknown", never printed as NaN."""
    return None if x is None or x != x else float(x)


def _money(x: float, cur: str) -> str:
    """An amount as every notice spells it (model.format_money): '$15,000.00', '1,234.00 EUR'."""
    return format_money(x, currency=cur)


def alert_messages(status: BudgetStatus, budget: Budget) -> list[Message]:
    """The notice of the highest crossed threshold, per kind (pure). Rendered by each delivery like every other
    notice (title, lead, facts): Slack blocks, an email, the outbox. Team and instance names come from tags:
    escaped, never markup. To the budget's channel, else the default channel, a team's budget too (notify/routing.py
    picks the channel)."""
    out = []
    cur = status.currency
    for kind, th in status.crossed.items():
        if th is None:
            continue
        pct = status.pct_actual if kind == "actual" else status.pct_forecast
        what = "has spent" if kind == "actual" else "is forecast to spend"
        text = (f"[{th.level.upper()}] GPU budget '{escape(status.budget)}' ({escape(status.scope)}) {what} "
                f"{pct:.0f}% of {_money(status.amount, cur)} for {status.period} (threshold {th.pct:g}%): "
                f"spent {_money(status.spent, cur)}, month-end forecast {_money(status.forecast, cur)}")
        drivers_i = ", ".join(f"{escape(i)} {_money(c, cur)}" for i, c in status.top_instances) or "none"
        drivers_t = ", ".join(f"{escape(t)} {_money(c, cur)}" for t, c in status.top_teams) or "none"
        what_i, what_t = status.things
        idle = "unknown (no evaluations)" if status.idle_share is None else f"{100 * status.idle_share:.0f}%"
        forecast = (f"{_money(status.forecast, cur)} = spent + {_money(status.running_rate, cur)}/h running x "
                    f"{status.hours_left:.0f} h left"
                    + (f" ({status.unpriced_running} running {what_i[:-1]}(s) unpriced)" if status.unpriced_running
                       else ""))
        facts = (("Spent", f"{_money(status.spent, cur)} (billing complete to "
                           f"{status.data_through:%Y-%m-%d %H:%M} UTC)"),
                 ("Forecast", forecast), ("Budget", _money(status.amount, cur)), ("Idle share", idle),
                 (f"Top {what_i}", drivers_i), (f"Top {what_t}", drivers_t))
        key = f"budget:{status.budget}:{status.scope}:{status.period}:{kind}:{th.pct:g}"
        team = budget.scope.value if budget.scope.kind == "team" and budget.scope.value != UNTAGGED else ""
        out.append(Message(
            key=key, to=(f"slack:{budget.channel}",) if budget.channel else ("default",),
            text=text + "\n" + "\n".join(f"*{k}* {v}" for k, v in facts), kind="budget",
            subject=f"{status.budget} {status.period}", audience=("team",) if team else ("default",), team=team,
            title=f"GPU budget {th.level}: {escape(status.budget)} {pct:.0f}% ({kind})"[:150], lead=text,
            facts=facts))
    return out


# --------------------------------------------------------------------------- the scheduled check


def running_now(decision_rows: Sequence[dict], now: datetime, fresh_s: int, rates, catalog: PriceLookup | None,
                attrs, default_region: str) -> pd.DataFrame:
    """Instances whose latest decision is at most fresh_s old, with their hourly rate (NaN = unknown)."""
    cols = ["instance_id", "team", "project", "account", "instance_type", "rate"]
    latest: dict[str, dict] = {}
    for r in decision_rows:
        at = r["evaluated_at"] if r["evaluated_at"].tzinfo else r["evaluated_at"].replace(tzinfo=timezone.utc)
        if now - timedelta(seconds=fresh_s) <= at <= now:
            if r["instance_id"] not in latest or at >= latest[r["instance_id"]]["_at"]:
                latest[r["instance_id"]] = {**r, "_at": at}
    rows = []
    for iid, r in latest.items():
        if r.get("verdict") == "UNKNOWN" and r.get("code") == "not_running":
            continue
        a = attrs.get(iid, {})
        itype = r.get("instance_type") or a.get("instance_type", "")
        hr = hourly_rate(iid, itype, a.get("region") or default_region, rates, catalog, r.get("hourly_cost"))
        rows.append({"instance_id": iid, "team": r.get("team") or a.get("team", ""),
                     "project": a.get("project", ""), "account": a.get("account", ""),
                     "instance_type": itype, "rate": hr.rate if hr.rate is not None else float("nan")})
    return pd.DataFrame(rows, columns=cols)


def default_catalog() -> PriceLookup | None:
    try:
        from ..prices.prices import OnDemandPrices

        return OnDemandPrices.load_default()
    except Exception as exc:  # noqa: BLE001 - a missing catalog only loses a fallback price
        log.warning("price catalog unavailable: %s", exc)
        return None


def run_budget_check(settings: Settings, store: Store, notifier: Notifier, now: datetime,
                     cost_table: pd.DataFrame | LoadedCosts, *, budgets: Sequence[Budget] | None = None,
                     catalog: PriceLookup | None = None, bs: BillingSettings | None = None,
                     send: bool = True, dry_run: bool = False,
                     slurm: Callable[[datetime, datetime], SlurmUsage] | None = None) -> list[BudgetStatus]:
    """Evaluate every budget for the month of `now` and send the alerts that are due.

    send=False (`budgets check` without --notify) or dry_run: nothing is sent and no idle escalation recorded;
    the alerts that would be sent are in each status's `alerts_due`. The service's schedule sends.

    `cost_table` is the month's cost table (or a LoadedCosts, which also carries
    data_through); get it with collect.billing.load.load_cost_table(). `slurm(start, end)` reads the month's Slurm
    usage (run.slurm_cost.read_slurm_month), called once and only when a budget has a slurm_account scope.
    """
    bs = bs or billing_settings(settings)
    if budgets is None:
        budgets = configured_budgets(bs.budgets_path)
    if isinstance(cost_table, LoadedCosts):
        table, data_through = cost_table.table, cost_table.data_through
    else:
        table = cost_table
        last = table["date"].max().to_pydatetime().replace(tzinfo=timezone.utc) if len(table) else None
        data_through = min(now, last + timedelta(days=1)) if last is not None else now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    start, end = month_bounds(f"{now:%Y-%m}")
    day = table["date"]
    table = table[(day >= pd.Timestamp(start.replace(tzinfo=None))) & (day < pd.Timestamp(end.replace(tzinfo=None)))]
    catalog = catalog if catalog is not None else default_catalog()
    rates, attrs = billing_rates(table), resource_attrs(table)
    region = settings.aws.regions[0] if settings.aws.regions else ""
    gap = 2 * settings.schedule.evaluate_every_s
    # Each instance's latest decision from the verdict episodes (last_seen_at): the raw rows keep only changes
    # and an hourly heartbeat (store.raw_decisions_every_s), so their latest row can be an hour old.
    recent = store.latest_decisions(max(start, now - timedelta(seconds=bs.running_fresh_s)), min(now, end))
    running = running_now(recent, now, bs.running_fresh_s, rates, catalog, attrs, region)
    verdicts = verdict_costs(store.verdict_hours_frame(start, min(end, now), grain="period"), start, min(end, now),
                             max_gap_s=gap, rates=rates, catalog=catalog,
                             attrs=attrs, default_region=region)
    table_currency = single_currency(table, "cost table") if len(table) else None
    out = []
    slurm_usage: SlurmUsage | None = None
    for b in budgets:
        if b.scope.slurm:
            if slurm_usage is None:
                slurm_usage = slurm(start, end) if slurm is not None else SlurmUsage(pd.DataFrame())
            status = evaluate_slurm_budget(b, slurm_usage, start, end, now)
            if status.error:
                log.error("%s", status.error)
        elif table_currency and table_currency != b.currency:
            msg = (f"budget '{b.name}' ({bs.budgets_path}) is in {b.currency} but the cost table is in "
                   f"{table_currency}; no conversion is done, budget skipped")
            log.error("%s", msg)
            out.append(BudgetStatus(b.name, b.scope.label(), f"{start:%Y-%m}", b.amount, b.currency, 0.0, 0.0,
                                    data_through, 0.0, 0.0, error=msg))
            continue
        else:
            status = evaluate_budget(b, table, start, end, data_through, running, verdicts)
        acting = send and not dry_run
        if acting and b.escalate_idle_to_stop_at is not None and status.pct_actual >= b.escalate_idle_to_stop_at:
            esc = escalation.Escalation(b.name, f"{start:%Y-%m}", b.scope.kind, b.scope.value, status.pct_actual)
            if escalations.record(store, esc):
                log.warning("budget %s at %.0f%%: idle instances in %s escalated to stop", b.name,
                            status.pct_actual, b.scope.label())
        for msg in alert_messages(status, b):
            if store.notification_sent(msg.key):
                continue
            if not acting:
                status.alerts_due.append(msg.text.splitlines()[0])
                continue
            if deliveries(notifier, settings).send(msg):  # routed: `to` (the budget's channel, else "default")
                status.alerts_sent.append(msg.key)
        out.append(status)
    return out
