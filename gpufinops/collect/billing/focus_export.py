"""GPU cost split by verdict as FOCUS rows (`gpufinops costs --idle --output focus`): one Usage row per instance
and verdict over the period, conformant to FOCUS 1.2 and 1.3 (both the deprecated ProviderName/PublisherName
and 1.3's ServiceProviderName/HostProviderName are written), with gpufinops' extension columns:

    x_gpufinops_verdict    ACTIVE | UNDERUTILIZED | UNKNOWN | IDLE
    x_gpufinops_gpu_hours  GPU-hours in that verdict: the instance-hours (ConsumedQuantity) x the type's GPU
                           count (bundled catalog); empty when the type's GPU count is not known
    x_gpufinops_rule       the rule(s) that judged it in the period, comma-separated

Unpriced time (no billing rate, no stored $/h, not in the catalog) has no cost FOCUS could carry (the cost
columns are not nullable): those rows are left out and counted by the caller.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pandas as pd

from . import focus_spec

EXTENSION_COLUMNS = ("x_gpufinops_verdict", "x_gpufinops_gpu_hours", "x_gpufinops_rule")
VERSION = "1.3"


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def focus_rows(vc: pd.DataFrame, start: datetime, end: datetime, *, rules: dict[tuple[str, str], str] | None = None,
               regions: dict[str, str] | None = None, gpu_counts: dict[str, float] | None = None,
               currency: str = "USD", provider: str = "AWS", default_region: str = "") -> pd.DataFrame:
    """FOCUS rows of verdict_costs() output (instance_id, team, project, account, instance_type, verdict, hours,
    rate, cost) for [start, end); `rules` maps (instance, verdict) to the rule names, `gpu_counts` an
    instance type to its GPUs."""
    columns = [*focus_spec.columns(VERSION), *EXTENSION_COLUMNS]
    required = set(focus_spec.mandatory(VERSION)) | set(EXTENSION_COLUMNS)
    priced = vc[vc["cost"].notna()] if len(vc) else vc
    if priced.empty:
        return pd.DataFrame({c: [] for c in columns if c in required})
    keys = ["instance_id", "verdict", "team", "project", "account", "instance_type"]
    g = (priced.fillna({k: "" for k in keys[2:]}).groupby(keys, sort=True)
         .agg(hours=("hours", "sum"), cost=("cost", "sum")).reset_index())
    rules, regions, gpu_counts = rules or {}, regions or {}, gpu_counts or {}
    period_start, period_end = _iso(start), _iso(end)
    month_start = start.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    month_end = (month_start + pd.offsets.MonthBegin(1)).to_pydatetime()
    rows = []
    for r in g.itertuples(index=False):
        rate = r.cost / r.hours if r.hours > 0 else 0.0
        tags = {k: v for k, v in (("team", r.team), ("project", r.project)) if v}
        rows.append({
            "BilledCost": r.cost, "ContractedCost": r.cost, "EffectiveCost": r.cost, "ListCost": r.cost,
            "ContractedUnitPrice": rate, "ListUnitPrice": rate,
            "BillingAccountId": r.account or "unknown", "BillingAccountName": None, "BillingCurrency": currency,
            "BillingPeriodStart": _iso(month_start), "BillingPeriodEnd": _iso(month_end),
            "ChargeCategory": "Usage", "ChargeClass": None, "ChargeFrequency": "Usage-Based",
            "ChargeDescription": f"{r.hours:.2f} h of {r.instance_type or 'GPU instance'} {r.instance_id} "
                                 f"judged {r.verdict} by gpufinops",
            "ChargePeriodStart": period_start, "ChargePeriodEnd": period_end,
            "ConsumedQuantity": r.hours, "ConsumedUnit": "Hours", "PricingQuantity": r.hours, "PricingUnit": "Hours",
            "PricingCategory": "Standard",
            "InvoiceIssuerName": provider, "ProviderName": provider, "PublisherName": provider,
            "ServiceProviderName": provider, "HostProviderName": provider,
            "RegionId": regions.get(r.instance_id) or default_region or None, "RegionName": None,
            "ResourceId": r.instance_id, "ResourceName": None, "ResourceType": "GPU instance",
            "ServiceCategory": "Compute", "ServiceName": "GPU instances", "ServiceSubcategory": "Virtual Machines",
            "SkuId": r.instance_type or None, "SubAccountId": r.account or None, "SubAccountName": None,
            "Tags": json.dumps(tags, sort_keys=True),
            "x_gpufinops_verdict": r.verdict,
            "x_gpufinops_gpu_hours": r.hours * gpu_counts[r.instance_type] if r.instance_type in gpu_counts else None,
            "x_gpufinops_rule": rules.get((r.instance_id, r.verdict), ""),
        })
    out = pd.DataFrame(rows).reindex(columns=columns)
    # A Conditional or Recommended column with nothing to say is left out, as FOCUS asks (some, such as
    # BillingAccountType, may not be null where present).
    return out[[c for c in out.columns if c in required or out[c].notna().any()]]


def catalog_gpu_counts(instance_types) -> dict[str, float]:
    """GPUs per instance type, from the bundled catalog (gpufinops.prices); unknown types are left out."""
    from ...prices.prices import OnDemandPrices

    catalog = OnDemandPrices.load_default()
    specs = {t: catalog.gpu_spec(t) for t in set(instance_types) if t}
    return {t: s.gpu_count for t, s in specs.items() if s is not None and s.gpu_count > 0}


def rules_by_verdict(episodes: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(instance, verdict) -> the rules of its verdict episodes, from Store.episode_frame()."""
    if episodes is None or episodes.empty:
        return {}
    return {(i, v): ",".join(sorted(set(g["rule"].astype(str))))
            for (i, v), g in episodes.groupby(["instance_id", "verdict"])}
