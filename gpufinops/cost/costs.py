"""Cost x usage: what an instance costs per hour, and what its idle hours cost.

Hourly rate of an instance, first that is known:
  1. billing: its cost / usage hours on the latest billed day (what it really
     costs, spot and discounts included);
  2. the rate the evaluation stored with the decision (inventory price);
  3. the on-demand price catalog (gpufinops.prices) for its type and region.
Unknown stays None: an unpriced idle hour is reported as unpriced hours, never $0.

Idle cost comes from the stored verdicts: each decision of an instance covers
the time until that instance's next decision, capped at `max_gap_s` (a gap
longer than that is time nobody watched, not time spent in the last verdict).
When several rules judged the same instance at the same moment, the least
idle verdict wins (ACTIVE > UNDERUTILIZED > UNKNOWN > IDLE) so idle cost is
never overstated.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable, Mapping

import pandas as pd

from ..model import UNTAGGED
from ..collect.billing.totals import GRAINS, table_totals

PriceLookup = Callable[[str, str], "float | None"]  # (instance_type, region) -> USD/h

BY_COLUMNS = GRAINS  # grain -> cost-table column (one definition, in collect/billing/totals.py)
VERDICTS = ("ACTIVE", "UNDERUTILIZED", "UNKNOWN", "IDLE")
_RANK = {v: i for i, v in enumerate(VERDICTS)}  # lower = less idle, wins a tie


def summarize(table: pd.DataFrame, by: str) -> pd.DataFrame:
    """Cost and instance-hours per key of a cost table; empty keys (untagged, no resource id) are their own row."""
    return summarize_totals(table_totals(table, by), by)


def summarize_totals(totals: pd.DataFrame, by: str) -> pd.DataFrame:
    """A totals table (key, currency, cost, usage_hours; from cur_totals or table_totals) as `costs --by` prints
    it: empty keys labelled, $/h, most expensive first (ties by key, so every source prints the same order)."""
    empty = UNTAGGED if by in ("team", "project") else "(none)"
    keys = totals["key"].where(totals["key"] != "", empty)
    out = (totals.assign(key=keys).groupby(["key", "currency"], sort=True)[["cost", "usage_hours"]].sum()
           .reset_index().rename(columns={"key": by}))
    out["cost_per_hour"] = out["cost"] / out["usage_hours"].where(out["usage_hours"] > 0)
    return out.sort_values("cost", ascending=False, kind="stable").reset_index(drop=True)


def billing_rates(table: pd.DataFrame) -> dict[str, float]:
    """Per resource: cost / usage hours on its latest billed day with usage."""
    t = table[(table["resource_id"] != "") & (table["usage_hours"] > 0)]
    if t.empty:
        return {}
    day = t.groupby(["resource_id", "date"])[["cost", "usage_hours"]].sum().reset_index()
    last = day.sort_values("date").groupby("resource_id").tail(1)
    return {r: c / h for r, c, h in zip(last["resource_id"], last["cost"], last["usage_hours"])}


def resource_attrs(table: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Latest team/project/account/region/instance_type per resource id, from billing."""
    t = table[table["resource_id"] != ""].sort_values("date")
    cols = ["team", "project", "account", "region", "instance_type"]
    return {r: dict(zip(cols, vals)) for r, *vals in
            t.groupby("resource_id").tail(1)[["resource_id", *cols]].itertuples(index=False)}


@dataclass(frozen=True)
class HourlyRate:
    rate: float | None
    source: str  # billing | decision | catalog | unknown


def hourly_rate(instance_id: str, instance_type: str, region: str, rates: Mapping[str, float],
                catalog: PriceLookup | None, stored: float | None = None) -> HourlyRate:
    if instance_id in rates:
        return HourlyRate(rates[instance_id], "billing")
    if stored is not None and stored == stored:  # not None, not NaN
        return HourlyRate(float(stored), "decision")
    price = catalog(instance_type, region) if catalog and instance_type else None
    if price is not None:
        return HourlyRate(price, "catalog")
    return HourlyRate(None, "unknown")


ROLLUP_EXTRA = ["code", "measured", "hourly_cost", "ticks", "evaluations", "activity_hours", "activity_max",
                "memory_max_mib", "after_stop_hours", "open"]


def verdict_costs(decision_rows: "pd.DataFrame | Iterable[dict]", start: datetime, end: datetime, *,
                  max_gap_s: float, rates: Mapping[str, float] | None = None, catalog: PriceLookup | None = None,
                  attrs: Mapping[str, Mapping[str, str]] | None = None, default_region: str = "") -> pd.DataFrame:
    """Priced time in each verdict in [start, end): instance, team, verdict, at, hours, rate, cost (NaN if unpriced).

    Takes Store.verdict_hours_frame() (the hourly rollups: one row per hour or period and key, rules already
    resolved per tick; the extra rollup columns are kept) or, the per-minute way, Store.decision_frame() /
    Store.decision_rows() (one row per decision interval). Both count the same time: each tick covers the
    time to the instance's next tick, at most max_gap_s; the latest tick up to `end`. The rate is looked up
    once per distinct (instance, type, stored rate).
    """
    rates, attrs = rates or {}, attrs or {}
    cols = ["instance_id", "team", "project", "account", "instance_type", "verdict", "at", "hours", "rate", "cost"]
    d = decision_rows.copy() if isinstance(decision_rows, pd.DataFrame) else pd.DataFrame(list(decision_rows))
    if d.empty:
        return pd.DataFrame({c: [] for c in cols})
    d = rollup_hours(d, start, end, max_gap_s) if "hours" in d.columns else decision_hours(d, start, end, max_gap_s)
    if d.empty:
        return pd.DataFrame({c: [] for c in cols})

    def attr(iid: str, key: str) -> str:
        return attrs.get(iid, {}).get(key, "")

    d["instance_type"] = d["instance_type"].fillna("")
    missing_type = d["instance_type"] == ""
    if missing_type.any():
        d.loc[missing_type, "instance_type"] = [attr(i, "instance_type") for i in d.loc[missing_type, "instance_id"]]
    d["team"] = d["team"].fillna("")
    missing_team = d["team"] == ""
    if missing_team.any():
        d.loc[missing_team, "team"] = [attr(i, "team") for i in d.loc[missing_team, "instance_id"]]
    stored = pd.to_numeric(d["hourly_cost"], errors="coerce").astype("float64")
    # One price per distinct (instance, type, stored rate); joined back by key, not row by row.
    keys = pd.DataFrame({"instance_id": d["instance_id"].to_numpy(), "instance_type": d["instance_type"].to_numpy(),
                         "stored": stored.fillna(-1.0).to_numpy()})  # -1: none stored (a rate is never < 0)
    combos = keys.drop_duplicates().reset_index(drop=True)
    combos["rate"] = [
        float("nan") if (hr := hourly_rate(iid, itype, attr(iid, "region") or default_region, rates, catalog,
                                           None if st < 0 else st)).rate is None
        else hr.rate
        for iid, itype, st in combos.itertuples(index=False)]
    d["rate"] = keys.merge(combos, on=["instance_id", "instance_type", "stored"], how="left")["rate"].to_numpy()
    d["cost"] = d["hours"] * d["rate"]
    if attrs:
        per = pd.DataFrame({"instance_id": d["instance_id"].unique()})
        per["project"] = [attr(i, "project") for i in per["instance_id"]]
        per["account"] = [attr(i, "account") for i in per["instance_id"]]
        d = d.merge(per, on="instance_id", how="left")
    else:
        d["project"], d["account"] = "", ""
    out = d[cols + [c for c in ROLLUP_EXTRA if c in d.columns]].reset_index(drop=True)
    # Unknown rates stay None in `rate` (NaN in `cost`), as before.
    out["rate"] = out["rate"].astype(object).where(out["rate"].notna(), None)
    return out


def decision_hours(d: pd.DataFrame, start: datetime, end: datetime, max_gap_s: float) -> pd.DataFrame:
    """Per-minute decisions to intervals: the least idle verdict per (instance, time) covers the time to the
    instance's next decision, at most max_gap_s; the last one up to `end`."""
    d["at"] = pd.to_datetime(d["evaluated_at"], utc=True)
    d = d[(d["at"] >= pd.Timestamp(start)) & (d["at"] < pd.Timestamp(end))]
    if d.empty:
        return d
    for c in ("team", "instance_type", "hourly_cost"):
        if c not in d:
            d[c] = None
    d = d.assign(rank=d["verdict"].map(_RANK).fillna(_RANK["UNKNOWN"]))
    d = d.sort_values(["instance_id", "at", "rank"]).drop_duplicates(["instance_id", "at"], keep="first")
    nxt = d.groupby("instance_id")["at"].shift(-1)
    span = (nxt.fillna(pd.Timestamp(end)) - d["at"]).dt.total_seconds().clip(lower=0, upper=max_gap_s)
    return d.assign(hours=span / 3600.0)


def rollup_hours(d: pd.DataFrame, start: datetime, end: datetime, max_gap_s: float) -> pd.DataFrame:
    """Rollup rows (Store.verdict_hours_frame): hours are known, except each instance's tail (its latest
    tick, `hours` NaN), which lasts up to `end`, at most max_gap_s."""
    d = d[d["at"] < pd.Timestamp(end)].copy()
    open_ = d["hours"].isna()
    if open_.any():
        span = (pd.Timestamp(end) - d.loc[open_, "at"]).dt.total_seconds().clip(lower=0, upper=max_gap_s)
        d.loc[open_, "hours"] = span / 3600.0
        if "activity_hours" in d:  # the tail carries its activity mean; weight it by its hours now
            d.loc[open_, "activity_hours"] = d.loc[open_, "activity_hours"] * d.loc[open_, "hours"]
    return d


def idle_cost_report(vc: pd.DataFrame, by: str = "instance") -> pd.DataFrame:
    """Cost per verdict per instance or team; untagged teams are one '(untagged)' row."""
    key = {"instance": "instance_id", "team": "team", "project": "project", "instance_type": "instance_type",
           "account": "account"}[by]
    cols = [by, *(f"{v.lower()}_cost" for v in VERDICTS), "total_cost", "idle_share", "unpriced_hours"]
    if vc.empty:
        return pd.DataFrame({c: [] for c in cols})
    v = vc.assign(k=vc[key].fillna("").replace("", UNTAGGED))
    priced = v[v["cost"].notna()]
    pivot = priced.pivot_table(index="k", columns="verdict", values="cost", aggfunc="sum", fill_value=0.0)
    out = pd.DataFrame(index=sorted(set(v["k"])))
    for verdict in VERDICTS:
        out[f"{verdict.lower()}_cost"] = pivot[verdict] if verdict in pivot.columns else 0.0
    out = out.fillna(0.0)
    out["total_cost"] = out[[f"{x.lower()}_cost" for x in VERDICTS]].sum(axis=1)
    out["idle_share"] = out["idle_cost"] / out["total_cost"].where(out["total_cost"] > 0)
    out["unpriced_hours"] = v[v["cost"].isna()].groupby("k")["hours"].sum().reindex(out.index).fillna(0.0)
    out = out.reset_index().rename(columns={"index": by})
    return out.sort_values("idle_cost", ascending=False, kind="stable").reset_index(drop=True)[cols]


def idle_share(vc: pd.DataFrame) -> float | None:
    """IDLE-verdict cost / all priced verdict cost; None when nothing priced was evaluated."""
    priced = vc[vc["cost"].notna()] if not vc.empty else vc
    total = float(priced["cost"].sum()) if not priced.empty else 0.0
    if total <= 0:
        return None
    return float(priced.loc[priced["verdict"] == "IDLE", "cost"].sum()) / total


def _utc(dt) -> datetime:
    if isinstance(dt, pd.Timestamp):
        dt = dt.to_pydatetime()
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
