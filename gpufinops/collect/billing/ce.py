"""AWS Cost Explorer -> the cost table (daily cost per GPU instance type and team tag).

One GetCostAndUsage query per CE purchase type (so every row knows its pricing
model), DAILY, grouped by INSTANCE_TYPE and the team tag, filtered to the EC2
compute service; pages followed through NextPageToken. Cost Explorer has no
resource ids at this level (resource_id is ''), and its figures for the
current and previous day are incomplete (it lags up to 24 h): `data_through`
is set to the start of yesterday, and the budget forecast covers the rest
with the hourly rate of what is running (see gpufinops/budgets.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Sequence

import pandas as pd

from .schema import BillingDataError, canonical_tags, conform, empty_table, single_currency
from .settings import CeSettings

log = logging.getLogger(__name__)

CE_LAG = timedelta(days=1)


@dataclass
class CeResult:
    table: pd.DataFrame
    data_through: datetime
    warnings: list[str] = field(default_factory=list)
    requests: int = 0


def _family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def _query(client, start: str, end: str, ce: CeSettings, purchase_type: str) -> tuple[list[dict], int]:
    kwargs = {
        "TimePeriod": {"Start": start, "End": end},
        "Granularity": "DAILY",
        "Metrics": [ce.metric, "UsageQuantity"],
        "GroupBy": [{"Type": "DIMENSION", "Key": "INSTANCE_TYPE"}, {"Type": "TAG", "Key": ce.group_tag}],
        "Filter": {"And": [
            {"Dimensions": {"Key": "SERVICE", "Values": [ce.service]}},
            {"Dimensions": {"Key": "PURCHASE_TYPE", "Values": [purchase_type]}},
        ]},
    }
    results: list[dict] = []
    requests = 0
    token = None
    while True:
        if token:
            kwargs["NextPageToken"] = token
        resp = client.get_cost_and_usage(**kwargs)
        requests += 1
        results.extend(resp.get("ResultsByTime", []))
        token = resp.get("NextPageToken")
        if not token:
            return results, requests


def fetch_ce(client, start: datetime, end: datetime, now: datetime, families: Sequence[str], ce: CeSettings) -> CeResult:
    """GPU instance cost per day, instance type, team and pricing model for [start, end).

    The end is capped at tomorrow (UTC) since CE has nothing later; rows for
    non-GPU instance types and 'NoInstanceType' are dropped.
    """
    today = now.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    q_end = min(end, today + timedelta(days=1))
    if q_end <= start:
        return CeResult(empty_table(), start)
    fams = set(families)
    rows: list[dict] = []
    warnings: list[str] = []
    requests = 0
    where = f"Cost Explorer GetCostAndUsage {start:%Y-%m-%d}..{q_end:%Y-%m-%d}"
    for purchase_type, pricing_model in ce.purchase_types.items():
        results, n = _query(client, f"{start:%Y-%m-%d}", f"{q_end:%Y-%m-%d}", ce, purchase_type)
        requests += n
        for by_time in results:
            day = by_time.get("TimePeriod", {}).get("Start")
            for group in by_time.get("Groups", []):
                keys = group.get("Keys", [])
                if len(keys) != 2:
                    raise BillingDataError(f"{where}: group keys {keys!r}: expected [instance type, tag]")
                itype, tag = keys
                if _family(itype) not in fams:
                    continue
                metrics = group.get("Metrics", {})
                if ce.metric not in metrics:
                    raise BillingDataError(f"{where}: metric '{ce.metric}' missing for {itype} on {day}")
                try:
                    cost = float(metrics[ce.metric]["Amount"])
                    hours = float(metrics.get("UsageQuantity", {}).get("Amount", "nan"))
                except (KeyError, TypeError, ValueError) as exc:
                    raise BillingDataError(f"{where}: metric '{ce.metric}' amount for {itype} on {day}: {exc}") from None
                if cost < 0:
                    warnings.append(f"{where}: negative {ce.metric} {cost} for {itype} on {day} excluded")
                    continue
                # TAG keys come back as "team$ml"; "team$" is the untagged bucket.
                team = tag.split("$", 1)[1] if "$" in tag else ""
                rows.append({
                    "date": day, "provider": "aws", "account": ce.account, "region": "",
                    "resource_id": "", "instance_type": itype, "pricing_model": pricing_model,
                    "team": team, "project": "", "owner": "",
                    "tags": canonical_tags({ce.group_tag: team} if team else None),
                    "cost": cost, "currency": metrics[ce.metric].get("Unit", ""),
                    "usage_hours": hours, "source": "ce",
                })
    for w in warnings:
        log.warning("%s", w)
    data_through = min(q_end, today - CE_LAG)
    if not rows:
        return CeResult(empty_table(), max(start, data_through), warnings, requests)
    df = conform(pd.DataFrame(rows))
    df = df[(df["date"] >= pd.Timestamp(start.replace(tzinfo=None))) & (df["date"] < pd.Timestamp(end.replace(tzinfo=None)))]
    single_currency(df, where)
    keys = [c for c in df.columns if c not in ("cost", "usage_hours")]
    df = df.groupby(keys, sort=True)[["cost", "usage_hours"]].sum().reset_index()
    return CeResult(conform(df), max(start, data_through), warnings, requests)


def fetch_ce_forecast(client, now: datetime, end: datetime, ce: CeSettings) -> tuple[float, str] | None:
    """AWS's own forecast (MEAN) of the rest of the period's cost of `ce.service` (all of it, not
    only GPU instances), shown by `budgets check` next to ours for comparison.

    GetCostForecast needs a start of today or later; None when nothing is left
    to forecast.
    """
    start = now.astimezone(timezone.utc).date()
    if start >= end.date():
        return None
    resp = client.get_cost_forecast(
        TimePeriod={"Start": f"{start:%Y-%m-%d}", "End": f"{end:%Y-%m-%d}"},
        Metric={"UnblendedCost": "UNBLENDED_COST", "AmortizedCost": "AMORTIZED_COST",
                "NetUnblendedCost": "NET_UNBLENDED_COST", "BlendedCost": "BLENDED_COST"}[ce.metric],
        Granularity="MONTHLY",
        Filter={"Dimensions": {"Key": "SERVICE", "Values": [ce.service]}},
    )
    total = resp.get("Total", {})
    return float(total["Amount"]), total.get("Unit", "")
