"""The monthly audit, computed from stored evaluations, actions, billing and recommendations. No I/O.

How time and money are counted (the same model as gpufinops.costs, which does the pricing):
- each evaluation of an instance covers the time until its next evaluation, at most two evaluation
  periods (a longer gap is time nobody watched, not time spent in the last verdict);
- a completed stop ends the running time at the stop, and nothing is counted after the last
  evaluation of the month plus one evaluation period;
- the hourly rate is billing's (cost / usage hours), else the price stored with the evaluation, else
  the on-demand catalog; an unpriced hour is reported as unpriced, never as $0;
- a stop saved the time from the stop until the instance was seen running again (its owner started
  it) or until the end of what the month observed; a dry-run stop "would have saved" the IDLE time
  that followed it under the rule that stopped it, up to that rule's first verdict that was not IDLE.

`build_audit` runs in named stages (observed_span, instances_seen, headline_figures, data_quality, add_sections,
add_underused_causes, add_kubernetes); the tables' builders and columns are report.tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd

from ..model import UNTAGGED
from ..collect.billing.schema import single_currency
from ..places.registry import KUBERNETES_ID_PREFIX
from ..cost.costs import billing_rates, hourly_rate, idle_share, resource_attrs, verdict_costs
from ..model import FALSE_STOP_COST_H, RESTART_COST_S
from . import sections
from .advice import NONE, Advice, advise
from .inputs import AuditInputs
from .observed import finance_caveats
from .options import ReportSettings
from .period import ReportPeriod
from .tables import (
    HINTS, INSTANCE_COLUMNS, MANAGED_COLUMNS, MISSING_DATA_CODES, SNOOZE_COLUMNS, STOP_COLUMNS, action_summary,
    daily_table, instance_table, managed_table, recommendation_table, snooze_table, team_table, underutilized_table,
    unknown_table,
)
from .words import words

STOP_KINDS = ("stop", "terminate")
DEMAND_VERDICTS = ("ACTIVE", "UNDERUTILIZED")  # some real activity: the workload wanted the GPU


@dataclass
class MonthlyAudit:
    period: ReportPeriod
    options: ReportSettings
    currency: str
    headline: dict
    data_quality: dict
    notes: list[str]
    teams: pd.DataFrame
    instances: pd.DataFrame
    underutilized: pd.DataFrame
    stops: pd.DataFrame
    unknown_time: pd.DataFrame
    recommendations: pd.DataFrame
    daily: pd.DataFrame
    actions: pd.DataFrame
    rules: list[str] = field(default_factory=list)
    snoozes: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({c: [] for c in SNOOZE_COLUMNS}))
    managed: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({c: [] for c in MANAGED_COLUMNS}))
    coverage: dict = field(default_factory=dict)  # sections.coverage: month, fleet and billing covered
    stops_by_instance: pd.DataFrame = field(default_factory=lambda: sections.stops_by_instance(
        pd.DataFrame({c: [] for c in STOP_COLUMNS}), {}))
    accounts: pd.DataFrame = field(default_factory=pd.DataFrame)
    regions: pd.DataFrame = field(default_factory=pd.DataFrame)
    gpu_models: pd.DataFrame = field(default_factory=pd.DataFrame)
    budgets: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({c: [] for c in sections.BUDGET_COLUMNS}))
    budgets_path: str = ""
    summary: dict = field(default_factory=dict)  # sections.executive_summary
    finance: dict = field(default_factory=dict)  # sections.finance_page: the first page
    names: dict = field(default_factory=dict)  # instance id -> its Name tag as the service last saw it
    previous_month: str = ""
    trend: pd.DataFrame = field(default_factory=lambda: sections.trend_table({}, None))
    k8s_namespaces: pd.DataFrame = field(default_factory=lambda: sections.kubernetes_tables(pd.DataFrame(), {})[0])
    k8s_workloads: pd.DataFrame = field(default_factory=lambda: sections.kubernetes_tables(pd.DataFrame(), {})[1])
    k8s_node_pools: pd.DataFrame = field(default_factory=lambda: sections.node_pool_table(pd.DataFrame(), [], None))
    underused_causes: pd.DataFrame = field(default_factory=lambda: sections.underused_causes(pd.DataFrame())[0])
    underused_by_team: pd.DataFrame = field(default_factory=lambda: sections.underused_causes(pd.DataFrame())[1])
    # The Slurm clusters' month (sections.slurm_tables): per account, user, partition and QOS; empty without Slurm.
    slurm: dict[str, pd.DataFrame] = field(default_factory=lambda: sections.slurm_tables(None))

    @property
    def has_workloads(self) -> bool:
        """The month has Kubernetes workload ids (`k8s:...`): the page shows their section, and their CSVs."""
        return len(self.k8s_workloads) > 0

    @property
    def has_node_pools(self) -> bool:
        """The month has Kubernetes GPU node hours (the service read a cluster): the page shows the node pools."""
        return len(self.k8s_node_pools) > 0

    @property
    def has_slurm(self) -> bool:
        """The month has Slurm GPU-hours from sacct, or a cluster whose accounting could not be read: the page shows
        the Slurm section (and says what was not read), the CSVs and JSON its tables."""
        return bool(self.headline.get("slurm_jobs") or self.headline.get("slurm_errors"))

    @property
    def has_data(self) -> bool:
        return bool(self.headline["evaluations"]) or self.headline["billed_cost"] is not None

    def tables(self) -> dict[str, pd.DataFrame]:
        """The tables as written to CSV and JSON, in report order; the Kubernetes ones only for a month with
        workloads, the node pools only for one with node hours (a fleet without a cluster gets no empty Kubernetes
        files)."""
        k8s = ({"k8s_namespaces": self.k8s_namespaces, "k8s_workloads": self.k8s_workloads} if self.has_workloads
               else {})
        if self.has_node_pools:
            k8s["k8s_node_pools"] = self.k8s_node_pools
        return {"teams": self.teams, "instances": self.instances, "underutilized": self.underutilized,
                "underused_causes": self.underused_causes, "underused_by_team": self.underused_by_team,
                "stops_by_instance": self.stops_by_instance, "stops": self.stops, "unknown_time": self.unknown_time,
                "recommendations": self.recommendations, "daily": self.daily, "actions": self.actions,
                "snoozes": self.snoozes, "managed": self.managed, "accounts": self.accounts,
                "regions": self.regions, "gpu_models": self.gpu_models, "trend": self.trend,
                "budgets": self.budgets, **k8s, **(self.slurm if self.has_slurm else {})}


# --------------------------------------------------------------------------- time model


def _ts(values) -> pd.DatetimeIndex:
    """Aware UTC timestamps (the store hands back aware datetimes; billing dates are naive UTC)."""
    return pd.DatetimeIndex(pd.to_datetime(list(values), utc=True))


def evaluation_period_s(runs: pd.DataFrame, fallback_s: float) -> float:
    """How often the service looked: the mean spacing of its ticks within its runs (service_runs)."""
    multi = runs[runs["ticks"] > 1] if len(runs) else runs
    if multi.empty:
        return float(fallback_s)
    span = (multi["last_seen_at"] - multi["started_at"]).dt.total_seconds().sum()
    return float(span / (multi["ticks"] - 1).sum())


def intervals(inp: AuditInputs, period_s: float, obs_end: datetime) -> pd.DataFrame:
    """Priced verdict time of the month (costs.verdict_costs over the hourly rollups), with reason code,
    activity and GPU-hours: one row per hour, instance and verdict key, plus each instance's latest tick.

    Running time is cut at completed stops (noted in the rollups as they are written; a latest tick is cut
    here) and at the end of what the month observed.
    """
    p = inp.period
    rates, attrs = billing_rates(inp.cost_table), resource_attrs(inp.cost_table)
    vc = verdict_costs(inp.verdicts, p.start, p.as_of, max_gap_s=2 * period_s, rates=rates, catalog=inp.catalog,
                       attrs=attrs, default_region=inp.default_region)
    if vc.empty:
        return vc.assign(code=[], activity_mean=[], activity_max=[], memory_max_mib=[], hourly_cost=[], gpus=[],
                         gpu_hours=[])
    iv = vc.assign(at=pd.to_datetime(vc["at"], utc=True)).sort_values("at", kind="stable").reset_index(drop=True)
    # The time-weighted mean activity of the row (its measured ticks); NaN where nothing was measured.
    iv["activity_mean"] = (iv["activity_hours"] / iv["hours"].where(iv["hours"] > 0)).where(iv["measured"].astype(bool))
    iv["hours"] = (iv["hours"] - iv["after_stop_hours"].fillna(0.0)).clip(lower=0.0)
    stops = [(a.instance_id, a.at) for a in inp.actions
             if a.kind.value in STOP_KINDS and not a.dry_run and a.status == "done"]
    limit = pd.Series(pd.Timestamp(obs_end), index=iv.index)
    if stops:
        s = pd.DataFrame(stops, columns=["instance_id", "stop_at"])
        s["stop_at"] = _ts(s["stop_at"])
        s = s.sort_values("stop_at")
        nxt = pd.merge_asof(iv[["at", "instance_id"]], s.assign(at=s["stop_at"]), on="at", by="instance_id",
                            direction="forward")
        # Only a latest tick's open time is cut here: an hour row's time after a stop is already taken out.
        cut = nxt["stop_at"].where(iv["open"].astype(bool))
        limit = pd.concat([limit, cut], axis=1).min(axis=1)
    room = ((limit - iv["at"]).dt.total_seconds() / 3600.0).clip(lower=0.0)
    iv["hours"] = iv["hours"].where(iv["hours"] <= room, room)
    workload = iv["instance_id"].str.startswith(KUBERNETES_ID_PREFIX)
    # A workload's rate is its pods' share of their nodes (stored with its verdicts); the catalog price of its
    # node's type would be the whole node, so without a stored share its time is unpriced, never the node's price.
    iv["rate"] = iv["rate"].astype("float64").where(~workload | iv["hourly_cost"].notna())
    iv["cost"] = iv["hours"] * iv["rate"].astype("float64")
    per_type = {t: inp.gpu_count(t) if t else None for t in iv["instance_type"].unique()}
    iv["gpus"] = pd.to_numeric(iv["instance_type"].map(per_type), errors="coerce")
    if workload.any():
        # A workload holds its pods' GPUs (as the service last listed them), not all of its node type's.
        held = {i: lab.get("gpu_count") or None for i, lab in inp.labels.items() if i.startswith(KUBERNETES_ID_PREFIX)}
        iv.loc[workload, "gpus"] = pd.to_numeric(iv.loc[workload, "instance_id"].map(held), errors="coerce")
    iv["gpu_hours"] = iv["hours"] * iv["gpus"]
    iv["team"] = iv["team"].fillna("").replace("", UNTAGGED)
    return iv.sort_values(["instance_id", "at"], kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- stops


def _instance_rates(iv: pd.DataFrame) -> dict[str, float]:
    priced = iv[iv["rate"].notna()]
    return {} if priced.empty else priced.groupby("instance_id")["rate"].last().astype(float).to_dict()


def _rule_timelines(episodes: pd.DataFrame, instances: set[str], period_s: float,
                    obs_end: pd.Timestamp) -> dict[tuple[str, str], pd.DataFrame]:
    """Per (instance, rule), for the given instances: its verdict episodes in time order, with `until`: when
    the time of the episode's last tick ends (the next episode's start, at most two periods; the end of what
    the month observed)."""
    d = episodes.loc[episodes["instance_id"].isin(instances),
                     ["instance_id", "rule", "verdict", "started_at", "last_seen_at"]]
    if d.empty:
        return {}
    d = d.sort_values(["instance_id", "rule", "started_at"], kind="stable")
    nxt = d.groupby(["instance_id", "rule"])["started_at"].shift(-1).fillna(obs_end)
    cap = d["last_seen_at"] + pd.Timedelta(seconds=2 * period_s)
    d["until"] = pd.concat([nxt, cap, pd.Series(obs_end, index=d.index)], axis=1).min(axis=1)
    d["until"] = d[["until", "last_seen_at"]].max(axis=1)
    return {k: g.reset_index(drop=True) for k, g in d.groupby(["instance_id", "rule"])}


def _subtract(span: tuple[pd.Timestamp, pd.Timestamp], taken: list[tuple[pd.Timestamp, pd.Timestamp]]) -> float:
    """Seconds of `span` not already in `taken` (disjoint spans), then merges it into `taken`."""
    lo, hi = span
    if hi <= lo:
        return 0.0
    free = (hi - lo).total_seconds() - sum(max(0.0, (min(hi, b) - max(lo, a)).total_seconds()) for a, b in taken)
    keep = [(a, b) for a, b in taken if b < lo or a > hi]
    merged = (min([lo] + [a for a, b in taken if not (b < lo or a > hi)]),
              max([hi] + [b for a, b in taken if not (b < lo or a > hi)]))
    taken[:] = sorted(keep + [merged])
    return max(0.0, free)


def _would_have(acts: list, timelines: dict, period_s: float) -> dict[int, tuple[float, pd.Timestamp | None]]:
    """Dry-run stops: the hours the instance would have stayed stopped, and when demand came back.

    A dry-run stop by rule R would have saved R's IDLE time that followed it, up to R's first verdict that
    is not IDLE. Each stretch of time is credited once per instance (to the earliest stop it follows), so a
    rule that "stops" the same idle instance every few minutes in dry-run does not count an hour twice.
    Demand came back at R's first ACTIVE/UNDERUTILIZED verdict after the stop.
    """
    out: dict[int, tuple[float, pd.Timestamp | None]] = {}
    credited: dict[str, list] = {}
    order = sorted((pd.Timestamp(a.at), n) for n, a in enumerate(acts) if a.dry_run and a.status == "done")
    for at, n in order:
        a = acts[n]
        tl = timelines.get((a.instance_id, a.rule))
        if tl is None:
            out[n] = (0.0, None)
            continue
        after = tl[tl["last_seen_at"] >= at]
        taken = credited.setdefault(a.instance_id, [])
        seconds = 0.0
        for row in after.itertuples(index=False):
            if row.verdict != "IDLE":
                break
            seconds += _subtract((max(at, row.started_at), row.until), taken)
        demand = tl[(tl["last_seen_at"] > at) & tl["verdict"].isin(DEMAND_VERDICTS)]
        back = None
        if len(demand):
            first = demand.iloc[0]
            # Demand already in the episode of the stop: it is seen at the next tick.
            back = first["started_at"] if first["started_at"] > at else at + pd.Timedelta(seconds=period_s)
        out[n] = (seconds / 3600.0, back)
    return out


def stop_audit(inp: AuditInputs, iv: pd.DataFrame, obs_end: datetime, opts: ReportSettings,
               period_s: float) -> pd.DataFrame:
    """Every stop/terminate of the month, real or dry-run: what it saved (or would have), and whether it was false."""
    acts = [a for a in inp.actions if a.kind.value in STOP_KINDS]
    if not acts:
        return pd.DataFrame({c: [] for c in STOP_COLUMNS})
    rates = _instance_rates(iv)
    meta = iv.groupby("instance_id")[["team", "instance_type", "gpus"]].last() if not iv.empty else None
    # When each instance was seen (evaluated) again: the first ticks of its episodes, any rule.
    ep = inp.episodes
    seen_at = ({k: g["started_at"].sort_values() for k, g in ep.groupby("instance_id")} if len(ep) else {})
    dry_instances = {a.instance_id for a in acts if a.dry_run}
    would = _would_have(acts, _rule_timelines(ep, dry_instances, period_s, pd.Timestamp(obs_end)), period_s)
    rows = []
    for n, a in enumerate(acts):
        at = pd.Timestamp(a.at)
        m = meta.loc[a.instance_id] if meta is not None and a.instance_id in meta.index else None
        team = m["team"] if m is not None else UNTAGGED
        itype = m["instance_type"] if m is not None else ""
        gpus = float(m["gpus"]) if m is not None and pd.notna(m["gpus"]) else float("nan")
        rate = rates.get(a.instance_id)
        if a.status != "done":
            hours, back_at, savings = 0.0, None, f"none ({a.status})"
        elif a.dry_run:
            (hours, back_at), savings = would[n], "would have saved"
        else:
            # Only running instances are evaluated: seen again after the stop = someone started it again.
            times = seen_at.get(a.instance_id)
            later = times[times > at] if times is not None else ()
            back_at = later.iloc[0] if len(later) else None
            hours = max(0.0, ((back_at if back_at is not None else pd.Timestamp(obs_end)) - at).total_seconds() / 3600)
            savings = "saved"
        back_min = (back_at - at).total_seconds() / 60.0 if back_at is not None else None
        false_stop = bool(back_min is not None and back_min * 60.0 <= opts.false_stop_s)
        rows.append({
            "at": at, "instance_id": a.instance_id, "team": team, "instance_type": itype, "kind": a.kind.value,
            "rule": a.rule, "dry_run": bool(a.dry_run), "status": a.status, "reason": a.reason, "error": a.error or "",
            "back_at": back_at, "back_after_min": back_min, "false_stop": false_stop,
            "saved_hours": hours, "saved_gpu_hours": hours * gpus if not math.isnan(gpus) else float("nan"),
            "saved_cost": hours * rate if rate is not None else float("nan"), "savings": savings,
            **net_of_stop(hours, back_at is not None and a.status == "done", false_stop, gpus, rate),
        })
    return pd.DataFrame(rows, columns=STOP_COLUMNS)


def net_of_stop(saved_hours: float, restarted: bool, false_stop: bool, gpus: float, rate: float | None) -> dict:
    """A stop's net saving, counted as the backtest counts it: the stopped time, less the restart's paid
    unproductive time (RESTART_COST_S) when the instance was started again, less FALSE_STOP_COST_H GPU-hours of
    lost work when that happened within the false-stop window. GPU-hours are priced at the instance's rate per GPU.
    """
    restart_h = RESTART_COST_S / 3600.0 if restarted else 0.0
    false_gpu_h = FALSE_STOP_COST_H if false_stop else 0.0
    known_gpus = not math.isnan(gpus) and gpus > 0
    per_gpu = rate / gpus if rate is not None and known_gpus else None
    net_gpu_h = (saved_hours - restart_h) * gpus - false_gpu_h if known_gpus else float("nan")
    restart_cost = restart_h * rate if rate is not None else float("nan")
    false_cost = false_gpu_h * per_gpu if per_gpu is not None else (0.0 if not false_stop else float("nan"))
    net_cost = (saved_hours * rate - restart_cost - false_cost) if rate is not None else float("nan")
    return {"restarted": bool(restarted), "restart_cost": restart_cost, "false_stop_cost": false_cost,
            "net_gpu_hours": net_gpu_h, "net_cost": net_cost}


# --------------------------------------------------------------------------- data quality


def service_coverage(period: ReportPeriod, runs: pd.DataFrame, period_s: float) -> dict:
    """How much of the period the service was evaluating anything, and its blind spots (from service_runs).

    An evaluation covers the time to the next one, at most two periods (the last one: one period); a
    longer stretch, or the start of the month before the first evaluation, is a blind spot.
    """
    start, end = pd.Timestamp(period.start), pd.Timestamp(period.as_of)
    hours = period.hours
    blind: list[tuple[float, pd.Timestamp]] = []
    covered = 0.0
    if runs.empty:
        blind = [((end - start).total_seconds(), start)] if hours > 0 else []
    else:
        r = runs.sort_values("started_at")
        first = r["started_at"].clip(lower=start)  # a run that began last month counts from the month start
        last = r["last_seen_at"].clip(upper=end)
        covered = float((last - first).dt.total_seconds().sum())
        nxt = first.shift(-1)
        for lo, nx in zip(last.iloc[:-1], nxt.iloc[:-1]):
            span = (nx - lo).total_seconds()
            covered += min(span, 2 * period_s)
            if span > 2 * period_s:
                blind.append((span - period_s, lo + pd.Timedelta(seconds=period_s)))
        tail = (end - last.iloc[-1]).total_seconds()
        covered += min(tail, period_s)
        if tail > period_s:
            blind.append((tail - period_s, last.iloc[-1] + pd.Timedelta(seconds=period_s)))
        first_gap = (first.iloc[0] - start).total_seconds()
        if first_gap > 2 * period_s:
            blind.append((first_gap, start))
    longest = max(blind, default=(0.0, None), key=lambda x: x[0])
    return {"covered_hours": covered / 3600.0, "coverage": covered / 3600.0 / hours if hours > 0 else None,
            "longest_gap_hours": longest[0] / 3600.0, "longest_gap_start": longest[1], "gaps": len(blind)}


def rate_sources(inp: AuditInputs, iv: pd.DataFrame) -> dict[str, float]:
    """Instance-hours priced from billing, from the price stored with the evaluation, from the catalog, or unpriced."""
    if iv.empty:
        return {}
    rates, attrs = billing_rates(inp.cost_table), resource_attrs(inp.cost_table)
    priced = iv[iv["hourly_cost"].notna()]
    stored = priced.groupby("instance_id")["hourly_cost"].last().to_dict() if len(priced) else {}
    out: dict[str, float] = {}
    for inst, grp in iv.groupby("instance_id"):
        a = attrs.get(inst, {})
        # A workload is never priced as its node.
        catalog = None if inst.startswith(KUBERNETES_ID_PREFIX) else inp.catalog
        src = hourly_rate(inst, grp["instance_type"].iloc[-1], a.get("region") or inp.default_region, rates,
                          catalog, stored.get(inst)).source
        out[src] = out.get(src, 0.0) + float(grp["hours"].sum())
    return out


def price_age(inp: AuditInputs, iv: pd.DataFrame, opts: ReportSettings) -> dict:
    types = sorted({t for t in iv["instance_type"] if t}) if not iv.empty else []
    dates = {t: inp.price_date(t, inp.default_region) for t in types}
    known = [d for d in dates.values() if d is not None]
    oldest = min(known) if known else None
    age = (inp.period.now.date() - oldest).days if oldest else None
    return {"catalog_prices_as_of": oldest, "catalog_price_age_days": age,
            "catalog_prices_stale": bool(age is not None and age > opts.price_max_age_days),
            "types_without_price_date": [t for t, d in dates.items() if d is None]}


# --------------------------------------------------------------------------- the whole audit


def unjudged_time(iv: pd.DataFrame) -> dict:
    """The one definition of the time the report could not judge, in hours and money from the same rows:
    every UNKNOWN verdict hour of the month, split into missing data (no series, a failed query, too few samples,
    out-of-range values: MISSING_DATA_CODES) and other reasons (too new to judge, ...). The headline card, the
    UNKNOWN spend and the unknown-time table all sum these rows."""
    unk = iv[iv["verdict"] == "UNKNOWN"] if not iv.empty else iv
    if unk.empty:
        return {k: 0.0 for k in ("unknown_hours", "unknown_cost", "missing_data_hours", "missing_data_cost",
                                 "other_unknown_hours", "other_unknown_cost")}
    missing = unk["code"].isin(MISSING_DATA_CODES)
    return {
        "unknown_hours": _sum(unk["hours"]), "unknown_cost": _sum(unk["cost"].dropna()),
        "missing_data_hours": _sum(unk.loc[missing, "hours"]),
        "missing_data_cost": _sum(unk.loc[missing, "cost"].dropna()),
        "other_unknown_hours": _sum(unk.loc[~missing, "hours"]),
        "other_unknown_cost": _sum(unk.loc[~missing, "cost"].dropna()),
    }


def used_gpu_hours(iv: pd.DataFrame) -> dict:
    """GPU-hours the workloads used: time with an ACTIVE or UNDERUTILIZED verdict (some real activity)."""
    if iv.empty:
        return {"used_gpu_hours": 0.0}
    return {"used_gpu_hours": _sum(iv.loc[iv["verdict"].isin(DEMAND_VERDICTS), "gpu_hours"].dropna())}


def _sum(series: pd.Series) -> float:
    return float(series.sum()) if len(series) else 0.0


def _f(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def seen_attrs(bill_owners: dict[str, str], bill_attrs: dict[str, dict[str, str]],
               labels: dict[str, dict]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Owner and account / region per instance from billing and from what the service saw (instance_labels).
    The owner is the tag the service last saw (the one its Slack messages named), else billing's; account and
    region are billing's where billing has them, else the inventory's."""
    owners = {**bill_owners, **{i: lab["owner"] for i, lab in labels.items() if lab.get("owner")}}
    attrs = {i: dict(a) for i, a in bill_attrs.items()}
    for inst, lab in labels.items():
        a = attrs.setdefault(inst, {})
        for key in ("account", "region", "instance_type"):
            if not a.get(key) and lab.get(key):
                a[key] = lab[key]
    return owners, attrs


@dataclass(frozen=True)
class ObservedSpan:
    """How often the service looked and what part of the month it observed (`observed_span`)."""

    period_s: float  # seconds between two evaluations
    has_evaluations: bool
    first_eval: pd.Timestamp | None  # the month's first evaluation, None when nothing was evaluated
    last_eval: pd.Timestamp | None  # and its last
    obs_end: pd.Timestamp  # what the month observed ends here


def observed_span(inp: AuditInputs, opts: ReportSettings, fallback_period_s: float) -> ObservedSpan:
    """Stage 1 of `build_audit`: the evaluation period (the settings', else measured from the service runs) and the
    span the month observed, from its first evaluation to one evaluation period after its last."""
    p = inp.period
    runs = inp.runs
    period_s = (float(opts.evaluate_every_s) if opts.evaluate_every_s
                else evaluation_period_s(runs, fallback_period_s))
    has_evaluations = inp.evaluations > 0
    # A run still going at the end of the period last evaluated (within a period of) its end.
    last_eval = min(runs["last_seen_at"].max(), pd.Timestamp(p.as_of)) if has_evaluations else None
    first_eval = max(runs["started_at"].min(), pd.Timestamp(p.start)) if has_evaluations else None
    # What the month observed ends one evaluation period after the last evaluation.
    obs_end = (min(pd.Timestamp(p.as_of), last_eval + timedelta(seconds=period_s)) if last_eval is not None
               else pd.Timestamp(p.start))
    return ObservedSpan(period_s, has_evaluations, first_eval, last_eval, obs_end)


def instances_seen(inp: AuditInputs, iv: pd.DataFrame, stops: pd.DataFrame
                   ) -> tuple[pd.DataFrame, dict[str, str], pd.DataFrame]:
    """Stage 2 of `build_audit`: the per-instance table (tables.instance_table) with what billing and the service
    saw of each instance added: owner, account, region, GPU model, Name tag, price source and the advice. Returns
    the table, the owner per instance and the attributes per instance (sections.instance_attrs) the later stages
    break the month down by."""
    p = inp.period
    instances = instance_table(iv, stops, inp.cost_table)
    owner_of, bill_attrs = seen_attrs(sections.owners(inp.cost_table),
                                      resource_attrs(inp.cost_table) if len(inp.cost_table) else {}, inp.labels)
    types = iv.groupby("instance_id")["instance_type"].last().to_dict() if not iv.empty else {}
    attrs = sections.instance_attrs(sorted(types), bill_attrs, owner_of, types, inp.gpu_model, inp.default_region)
    if len(instances):
        instances = (instances.drop(columns=["owner", "account", "region", "gpu_model"], errors="ignore")
                     .merge(attrs, on="instance_id", how="left"))
        # An estimated $/h (a rented host priced from the catalog) is marked as one wherever it is shown.
        instances["price_source"] = instances["instance_id"].map(
            lambda i: (inp.labels.get(i) or {}).get("price_source") or "")
        instances["name"] = instances["instance_id"].map(lambda i: (inp.labels.get(i) or {}).get("name") or "")
        rightsized = {r.instance_id for r in inp.recommendations if str(r.action).startswith("rightsize")}
        advice = {i: (advise(inp.labels.get(i), inp.rules, inp.act, p.as_of, i in rightsized)
                      if inp.rules is not None else Advice(NONE, "rules unreadable: no advice"))
                  for i in instances["instance_id"]}
        instances["advice"] = instances["instance_id"].map(lambda i: advice[i].advice)
        instances["advice_reason"] = instances["instance_id"].map(lambda i: advice[i].why)
        instances = instances[INSTANCE_COLUMNS]
    return instances, owner_of, attrs


def headline_figures(inp: AuditInputs, opts: ReportSettings, iv: pd.DataFrame, stops: pd.DataFrame,
                     teams: pd.DataFrame, under: pd.DataFrame, recs: pd.DataFrame, has_evaluations: bool) -> dict:
    """Stage 3 of `build_audit`: the headline card's figures: spend (billed, else evaluated), idle, under-used and
    unjudged time and money, real and dry-run stops with what they saved net of restarts and false stops, and the
    recommendations' savings. Not measured is None, never 0 (nothing evaluated: the cost of running time is
    unknown). The later stages add the forecast, the profiling causes and the Kubernetes figures."""
    billed_currency = single_currency(inp.cost_table, "stored billing") if len(inp.cost_table) else None
    currency = billed_currency or "USD"
    billed = _sum(inp.cost_table["cost"]) if len(inp.cost_table) else None
    evaluated = _sum(iv["cost"].dropna()) if not iv.empty else 0.0
    idle = iv[iv["verdict"] == "IDLE"] if not iv.empty else iv
    real = stops[(~stops["dry_run"]) & (stops["status"] == "done")] if len(stops) else stops
    dry = stops[stops["dry_run"] & (stops["status"] == "done")] if len(stops) else stops
    failed = stops[(~stops["dry_run"]) & (stops["status"] != "done")] if len(stops) else stops
    unjudged = unjudged_time(iv)
    if not has_evaluations:
        evaluated = None  # nothing evaluated: the cost of running time is unknown, not zero
        unjudged = {k: (v if k.endswith("hours") else None) for k, v in unjudged.items()}
    # Not measured is not zero: with nothing evaluated and no stop, what stops saved is unknown.
    measured_stops = has_evaluations or len(stops) > 0

    def stop_sum(frame: pd.DataFrame, column: str) -> float | None:
        if not measured_stops:
            return None
        return _sum(frame[column].dropna()) if len(frame) else 0.0
    headline = {
        "currency": currency,
        "gpu_spend": billed if billed is not None else evaluated,
        "gpu_spend_source": "billing" if billed is not None else "evaluations x hourly price",
        "billed_cost": billed,
        "evaluated_cost": evaluated,
        "idle_cost": None if evaluated is None else _sum(idle["cost"].dropna()) if len(idle) else 0.0,
        "idle_share": idle_share(iv) if not iv.empty else None,
        "idle_hours": _sum(idle["hours"]) if len(idle) else 0.0,
        "idle_gpu_hours": _sum(idle["gpu_hours"].dropna()) if len(idle) else 0.0,
        "underutilized_cost": (None if evaluated is None
                               else _sum(iv.loc[iv["verdict"] == "UNDERUTILIZED", "cost"].dropna())),
        **unjudged,
        "evaluations": inp.evaluations,
        "instances": int(iv["instance_id"].nunique()) if not iv.empty else 0,
        "teams": int(len(teams)),
        "instance_hours": _sum(iv["hours"]) if not iv.empty else 0.0,
        "gpu_hours": _sum(iv["gpu_hours"].dropna()) if not iv.empty else 0.0,
        "stops": int((real["kind"] == "stop").sum()) if len(real) else 0,
        "terminations": int((real["kind"] == "terminate").sum()) if len(real) else 0,
        "failed_stops": int(len(failed)),
        "false_stops": int(real["false_stop"].sum()) if len(real) else 0,
        "saved_hours": _sum(real["saved_hours"]) if len(real) else 0.0,
        "saved_gpu_hours": _sum(real["saved_gpu_hours"].dropna()) if len(real) else 0.0,
        "saved_cost": stop_sum(real, "saved_cost"),
        "restarts": int(real["restarted"].sum()) if len(real) else 0,
        "restart_cost": stop_sum(real, "restart_cost"),
        "false_stop_cost": stop_sum(real, "false_stop_cost"),
        "net_saved_cost": stop_sum(real, "net_cost"),
        "net_saved_gpu_hours": stop_sum(real, "net_gpu_hours"),
        "dry_run_stops": int(len(dry)),
        "would_have_saved_hours": _sum(dry["saved_hours"]) if len(dry) else 0.0,
        "would_have_saved_gpu_hours": _sum(dry["saved_gpu_hours"].dropna()) if len(dry) else 0.0,
        "would_have_saved_cost": stop_sum(dry, "saved_cost"),
        "would_have_net_cost": stop_sum(dry, "net_cost"),
        "would_be_false_stops": int(dry["false_stop"].sum()) if len(dry) else 0,
        "underutilized_instances": int(len(under)),
        "underutilized_below_pct": opts.underutilized_below_pct,
        "unpriced_hours": _sum(iv.loc[iv["cost"].isna(), "hours"]) if not iv.empty else 0.0,
        "recommendations": int(len(recs)),
        # No recommendation run this month: not measured, not $0.
        "recommended_monthly_savings": (None if not inp.recommendations
                                        else _sum(recs["monthly_savings"]) if len(recs) else 0.0),
        **used_gpu_hours(iv),
    }
    headline["cost_per_used_gpu_hour"] = (headline["evaluated_cost"] / headline["used_gpu_hours"]
                                          if headline["evaluated_cost"] is not None and headline["used_gpu_hours"]
                                          else None)
    return headline


def data_quality(inp: AuditInputs, opts: ReportSettings, iv: pd.DataFrame, headline: dict, span: ObservedSpan,
                 coverage: dict) -> dict:
    """Stage 4 of `build_audit`: what the figures rest on (the report's data-quality table and `quality_notes`):
    the period and how much of it the service watched (`coverage`: service_coverage), the share of time measured,
    where the hourly rates came from, billing's days and imports, notifications, the catalog prices' age, and the
    inputs' warnings."""
    p = inp.period
    period_s = span.period_s
    measured = _sum(iv.loc[iv["verdict"] != "UNKNOWN", "hours"]) if not iv.empty else 0.0
    quality = {
        "period_hours": p.hours,
        "partial_month": p.partial,
        "first_evaluation": span.first_eval,
        "last_evaluation": span.last_eval,
        "evaluation_period_s": period_s,
        "max_gap_s": 2 * period_s,
        **{f"service_{k}": v for k, v in coverage.items()},
        "measured_share": measured / headline["instance_hours"] if headline["instance_hours"] > 0 else None,
        "missing_data_hours": headline["missing_data_hours"],
        "unpriced_hours": headline["unpriced_hours"],
        "rate_source_hours": rate_sources(inp, iv),
        "gpu_count_unknown_types": sorted({t for t, g in zip(iv.get("instance_type", []), iv.get("gpus", []))
                                           if pd.isna(g)}),
        "billing_rows": int(len(inp.cost_table)),
        "billing_days": int(inp.cost_table["date"].dt.date.nunique()) if len(inp.cost_table) else 0,
        "billing_imports": [vars(b) for b in inp.billing_imports],
        "recommendations_run_at": max((r.created_at for r in inp.recommendations), default=None),
        "notifications": _count(n["status"] for n in inp.notifications),
        **price_age(inp, iv, opts),
        "warnings": list(inp.warnings),
    }
    return quality


def add_sections(audit: MonthlyAudit, inp: AuditInputs, iv: pd.DataFrame, stops: pd.DataFrame,
                 owner_of: dict[str, str], attrs: pd.DataFrame, span: ObservedSpan, coverage: dict) -> None:
    """Stage 5 of `build_audit`: the report's sections built on the tables: coverage of the month, fleet and
    billing, stops by instance, the breakdowns by account, region and GPU model, budgets and the fleet's forecast
    (the headline's `forecast`), the finance page with its caveats, the Name tags, the executive summary and the
    trend."""
    p, headline, quality, currency = audit.period, audit.headline, audit.data_quality, audit.currency
    period_s, obs_end = span.period_s, span.obs_end
    period_days = math.ceil(p.hours / 24) if p.hours > 0 else 0
    audit.coverage = sections.coverage(p.hours, coverage["covered_hours"], iv, inp.cost_table,
                                       {a.instance_id for a in inp.actions},
                                       sorted({b.source for b in inp.billing_imports}), quality["billing_days"],
                                       period_days)
    audit.stops_by_instance = sections.stops_by_instance(
        stops, owner_of, {i: lab.get("name") or "" for i, lab in inp.labels.items()})
    audit.accounts = sections.breakdown(iv, attrs, "account")
    audit.regions = sections.breakdown(iv, attrs, "region")
    audit.gpu_models = sections.breakdown(iv, attrs, "gpu_model")
    last_bill = inp.cost_table["date"].max() if len(inp.cost_table) else None
    billed_through = (min(pd.Timestamp(p.as_of), pd.Timestamp(last_bill).tz_localize("UTC") + pd.Timedelta(days=1))
                      if last_bill is not None else None)
    estimate = sections.estimate_table(iv, attrs)
    running = sections.running_at_end(iv, attrs, p.as_of, max(inp.running_fresh_s, 2 * period_s))
    audit.budgets = sections.budget_table(
        inp.budgets, inp.cost_table, estimate, p.start, p.end, billed_through,
        pd.Timestamp(obs_end), running, estimate, currency, slurm=inp.slurm, as_of=p.as_of)
    # The file's name only: the report goes to finance, and the server's folders are nobody's business there
    # (billing.budgets_path in the config says where it is).
    audit.budgets_path = Path(inp.budgets_path).name if inp.budgets_path else ""
    fleet = sections.fleet_forecast(inp.cost_table, estimate, p.start, p.end, billed_through,
                                    pd.Timestamp(obs_end), running, estimate)
    headline["forecast"] = fleet.forecast if fleet is not None else None
    audit.slurm = sections.slurm_tables(inp.slurm)
    headline.update(sections.slurm_headline(inp.slurm))
    audit.finance = sections.finance_page(headline, audit.teams, audit.budgets, audit.budgets_path, headline["forecast"],
                                          inp.rules, audit.slurm["slurm_accounts"])
    # Page 1 and every delivery say how much of the month was seen and what the forecast adds up.
    audit.finance.update(finance_caveats(p, coverage["covered_hours"], audit.finance["basis"] == "billed",
                                         quality["billing_days"], fleet, currency))
    audit.names = {i: lab.get("name") or "" for i, lab in inp.labels.items() if lab.get("name")}
    audit.summary = sections.executive_summary(audit.instances, audit.recommendations, bool(inp.recommendations),
                                               top=3)
    audit.trend = sections.trend_table(headline, None)


def add_underused_causes(audit: MonthlyAudit, iv: pd.DataFrame) -> None:
    """Stage 6 of `build_audit`: why use stayed low, by cause and by team and cause, and the headline's cost of the
    causes only the profiling counters show."""
    headline = audit.headline
    audit.underused_causes, audit.underused_by_team = sections.underused_causes(iv)
    # Only a profiling cause proves the counters were read: nothing in the store says they were not.
    causes = audit.underused_causes
    headline["profiling_causes_cost"] = (None if headline["evaluated_cost"] is None else _sum(causes.loc[
        causes["profiling"], "cost"].dropna()) if len(causes) else 0.0)


def add_kubernetes(audit: MonthlyAudit, inp: AuditInputs, iv: pd.DataFrame, stops: pd.DataFrame,
                   owner_of: dict[str, str], span: ObservedSpan) -> None:
    """Stage 7 of `build_audit`: the Kubernetes tables (namespaces and workloads, for a month with workload ids; node
    pools, for one with GPU node hours) and their headline figures, None for a month without them."""
    p, headline = audit.period, audit.headline
    period_s, obs_end = span.period_s, span.obs_end
    audit.k8s_namespaces, audit.k8s_workloads = sections.kubernetes_tables(
        iv, owner_of, stops, {i: lab.get("allocation") or "" for i, lab in inp.labels.items()})
    # A cluster judged by node rules only has no decision rows: what the month observed of it ends one evaluation
    # period after the latest tick that read it.
    cluster_end = (min(pd.Timestamp(p.as_of), inp.node_hours["last_seen"].max() + timedelta(seconds=period_s))
                   if len(inp.node_hours) else obs_end)
    audit.k8s_node_pools = sections.node_pool_table(inp.node_hours, inp.actions, max(obs_end, cluster_end))
    headline["k8s_workloads"] = int(len(audit.k8s_workloads))
    headline["k8s_cost"] = _f(audit.k8s_namespaces["cost"].sum(min_count=1)) if audit.has_workloads else None
    headline["k8s_idle_cost"] = (_f(audit.k8s_namespaces["idle_cost"].sum(min_count=1)) if audit.has_workloads
                                 else None)
    # What suspending Kueue jobs and scaling workloads to zero saved (real stops only; 0.0 when none was made).
    headline["k8s_saved_cost"] = (_f(audit.k8s_namespaces["saved_cost"].sum(min_count=0)) if audit.has_workloads
                                  else None)
    pools = audit.k8s_node_pools
    headline["k8s_node_pools"] = int(len(pools))
    headline["k8s_node_cost"] = _f(pools["node_cost"].sum()) if audit.has_node_pools else None
    headline["k8s_idle_capacity_cost"] = _f(pools["idle_capacity_cost"].sum()) if audit.has_node_pools else None
    headline["k8s_cordon_saved_cost"] = (_f(pools["saved_cost"].sum(min_count=0)) if audit.has_node_pools
                                         else None)


def build_audit(inp: AuditInputs, opts: ReportSettings | None = None, fallback_period_s: float = 60.0) -> MonthlyAudit:
    """The month's audit from its stored inputs, in stages: the observed span, the priced intervals and stops, the
    tables, the headline, the data quality, then the sections, causes and Kubernetes parts that read them."""
    opts = opts or ReportSettings()
    p = inp.period
    span = observed_span(inp, opts, fallback_period_s)
    iv = intervals(inp, span.period_s, span.obs_end)
    stops = stop_audit(inp, iv, span.obs_end, opts, span.period_s)
    instances, owner_of, attrs = instances_seen(inp, iv, stops)
    teams = team_table(iv, instances, inp.cost_table)
    under = underutilized_table(iv, instances, opts.underutilized_below_pct)
    unknown = unknown_table(iv)
    recs = recommendation_table(inp.recommendations)
    daily = daily_table(iv, inp.cost_table)
    actions = action_summary(inp)
    headline = headline_figures(inp, opts, iv, stops, teams, under, recs, span.has_evaluations)
    coverage = service_coverage(p, inp.runs, span.period_s)
    quality = data_quality(inp, opts, iv, headline, span, coverage)
    rules = sorted(inp.episodes["rule"].unique().tolist()) if len(inp.episodes) else []
    audit = MonthlyAudit(p, opts, headline["currency"], headline, quality, [], teams, instances, under, stops, unknown,
                         recs, daily, actions, rules, snooze_table(inp), managed_table(inp))
    add_sections(audit, inp, iv, stops, owner_of, attrs, span, coverage)
    add_underused_causes(audit, iv)
    add_kubernetes(audit, inp, iv, stops, owner_of, span)
    audit.notes = quality_notes(audit)
    return audit


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def quality_notes(a: MonthlyAudit) -> list[str]:
    """Plain sentences on what the numbers rest on, worst first."""
    q, h, p = a.data_quality, a.headline, a.period
    notes = []
    if not h["evaluations"]:
        notes.append(f"No evaluations were stored for {p.month}: the service was not running or wrote to another "
                     "database. Idle cost, stops and verdicts cannot be reported for this month.")
    if p.partial:
        notes.append(f"{p.month} is not over: this report covers {p.start:%Y-%m-%d} to {p.as_of:%Y-%m-%d %H:%M} UTC.")
    if h["evaluations"]:
        cov = q["service_coverage"] or 0.0
        notes.append(f"The service evaluated the fleet for {q['service_covered_hours']:,.1f} h of the "
                     f"{q['period_hours']:,.1f} h in the period ({cov:.1%}); first evaluation "
                     f"{q['first_evaluation']:%Y-%m-%d %H:%M}, last {q['last_evaluation']:%Y-%m-%d %H:%M} UTC, "
                     f"about every {q['evaluation_period_s']:.0f} s.")
        if q["service_longest_gap_hours"] > 0:
            notes.append(f"Longest time with no evaluation at all: {q['service_longest_gap_hours']:,.1f} h from "
                         f"{q['service_longest_gap_start']:%Y-%m-%d %H:%M} UTC ({q['service_gaps']} gap(s) in all). "
                         "Time nobody watched is not counted as idle or active.")
        if q["measured_share"] is not None:
            notes.append(f"{q['measured_share']:.1%} of evaluated instance-hours had a verdict from metrics; "
                         f"{h['missing_data_hours']:,.1f} h had missing data (no series, query error or low coverage), "
                         "reported as UNKNOWN, never as idle.")
    if h["unpriced_hours"] > 0:
        notes.append(f"{h['unpriced_hours']:,.1f} instance-hours have no known price and are left out of every cost "
                     "figure (not counted as $0).")
    src = q["rate_source_hours"]
    if src:
        parts = ", ".join(f"{name} {hours:,.1f} h" for name, hours in sorted(src.items(), key=lambda kv: -kv[1]))
        notes.append(f"Hourly rates by source (instance-hours): {parts}.")
    if q["catalog_prices_as_of"] is not None:
        stale = " - STALE: refresh the price catalog" if q["catalog_prices_stale"] else ""
        notes.append(f"Catalog prices for the instance types seen are as of {q['catalog_prices_as_of']} "
                     f"({q['catalog_price_age_days']} days before this report){stale}.")
    if q["billing_rows"]:
        imports = "; ".join(f"{b['source']}: {b['rows']} rows {b['first_day']}..{b['last_day']}, imported "
                            f"{b['imported_at']:%Y-%m-%d %H:%M}" for b in q["billing_imports"])
        days = math.ceil(p.hours / 24)
        notes.append(f"Billing covers {q['billing_days']} of {days} day(s) ({imports}).")
    else:
        notes.append("No billing rows are stored for this month (gpufinops costs --month ... --save): GPU spend is "
                     "estimated from evaluated hours x hourly price, and stopped or unwatched time is not in it.")
    if q["gpu_count_unknown_types"]:
        notes.append(f"GPU count unknown for {', '.join(q['gpu_count_unknown_types'])}: GPU-hours leave them out.")
    notif = q["notifications"]
    if notif:
        failed = notif.get("failed", 0)
        notes.append("Slack messages this month: " + ", ".join(f"{v} {words(k)}" for k, v in sorted(notif.items()))
                     + (f" - {failed} failed to send" if failed else "") + ".")
    if q["recommendations_run_at"] is None:
        notes.append("No recommendation run since the start of the month (gpufinops recommend).")
    notes.extend(f"Warning: {w}" for w in q["warnings"])
    return notes


__all__ = ["MonthlyAudit", "build_audit", "evaluation_period_s", "intervals", "stop_audit", "HINTS"]
