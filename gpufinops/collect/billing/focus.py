"""FOCUS 1.x exports (CSV or Parquet; AWS, Azure, GCP, OCI, others) -> the cost table.

FOCUS 1.0 has no instance-type column, so a GPU instance row is a Usage
charge in the Compute service category, measured in hours, whose charge text
names a GPU instance: an AWS type of a GPU family ("$1.624 per On Demand Linux
g5.4xlarge Instance Hour", or `x_UsageType` "BoxUsage:g5.4xlarge" in AWS's own
FOCUS export) or a name matching one of `billing.gpu_patterns` (Azure
Standard_NC..., GCP a2-highgpu-..., OCI VM.GPU...).

Pricing model: CommitmentDiscountType "Reservation" -> reserved, a savings
plan or committed-use discount -> savings-plan, PricingCategory "Dynamic" or a
"Spot" charge -> spot, else on-demand.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Sequence

import pandas as pd

from ...config import not_utf8_error
from .schema import BillingDataError, canonical_tags, conform, empty_table, single_currency
from .settings import BillingSettings

log = logging.getLogger(__name__)

REQUIRED = ("ChargePeriodStart", "BillingCurrency", "ChargeCategory", "ResourceId", "ConsumedQuantity",
            "ConsumedUnit", "ProviderName", "ChargeDescription")
OPTIONAL = ("SubAccountId", "RegionId", "Tags", "PricingCategory", "CommitmentDiscountType",
            "CommitmentDiscountCategory", "ServiceCategory", "x_UsageType", "SkuPriceDetails")
HOUR_UNITS = {"hours", "hour", "hrs", "hr", "h"}
# One line's usage hours above this are not a measurement (a month of 10,000 instances is 7.4e6).
MAX_LINE_HOURS = 1e9
_PROVIDERS = {"aws": "aws", "amazon web services": "aws", "microsoft": "azure", "azure": "azure",
              "google cloud": "gcp", "google": "gcp", "oracle": "oci", "oci": "oci"}
_AWS_TYPE = re.compile(r"\b([a-z][a-z0-9-]*)\.([0-9]*[a-z][a-z0-9]*)\b")


@dataclass
class FocusResult:
    table: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    rows_read: int = 0


def _read(path: str, columns: Sequence[str]) -> pd.DataFrame:
    p = Path(path)
    if not p.exists():
        raise BillingDataError(f"{path}: no such file")
    try:
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            names = pq.ParquetFile(p).schema_arrow.names
            df = pd.read_parquet(p, columns=[c for c in columns if c in names])
        else:
            header = pd.read_csv(p, nrows=0).columns
            df = pd.read_csv(p, usecols=[c for c in columns if c in header], dtype=str,
                             keep_default_na=False, na_values=["NULL", ""])
    except UnicodeDecodeError:  # names the first bad byte's line and offset, not pandas' read block
        raise BillingDataError(str(not_utf8_error(path))) from None
    except (OSError, ValueError, TypeError, NotImplementedError) as exc:  # Arrow and CSV parser errors among them
        raise BillingDataError(f"{path}: cannot read FOCUS file: {exc}") from None
    return df


def gpu_instance_type(text: str, families: set[str], patterns: Sequence[re.Pattern]) -> str:
    """The GPU instance name a charge text mentions, or ''."""
    if not text:
        return ""
    for m in _AWS_TYPE.finditer(text):
        if m.group(1) in families:
            return m.group(0)
    for pat in patterns:
        m = pat.search(text)
        if m:
            return m.group(0)
    return ""


def _tags(value) -> dict:
    if value is None or (isinstance(value, float) and value != value):
        return {}
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _pick(tags: dict, keys: Sequence[str]) -> str:
    for k in keys:
        if tags.get(k):
            return str(tags[k])
    return ""


def read_focus(path: str, start: datetime, end: datetime, bs: BillingSettings) -> FocusResult:
    cost_col = bs.focus_cost_column
    df = _read(path, (*REQUIRED, *OPTIONAL, cost_col))
    missing = [c for c in (*REQUIRED, cost_col) if c not in df.columns]
    if missing:
        raise BillingDataError(f"{path}: missing FOCUS column(s) {missing}")
    warnings: list[str] = []
    n_read = len(df)
    families = set(bs.gpu_families or ())
    patterns = [re.compile(p) for p in bs.gpu_patterns]
    text = df["ChargeDescription"].fillna("").astype(str)
    if "x_UsageType" in df.columns:
        text = df["x_UsageType"].fillna("").astype(str) + " " + text
    itype = text.map(lambda t: gpu_instance_type(t, families, patterns))
    unit = df["ConsumedUnit"].fillna("").astype(str).str.strip().str.lower()
    keep = (df["ChargeCategory"].fillna("") == "Usage") & (itype != "") & unit.isin(HOUR_UNITS)
    if "ServiceCategory" in df.columns:
        keep &= df["ServiceCategory"].fillna("Compute").isin(["Compute", "AI and Machine Learning"])
    df, itype = df[keep].copy(), itype[keep]
    # Types: a value that is not a number or a date is an error naming the column and row.
    for col in (cost_col, "ConsumedQuantity"):
        num = pd.to_numeric(df[col], errors="coerce")
        bad = num.isna() & df[col].notna()
        if bad.any():
            raise BillingDataError(f"{path}: column '{col}' is not a number on data row {int(bad.idxmax()) + 2} "
                                   f"(value {df.loc[bad.idxmax(), col]!r})")
        df[col] = num
    try:
        when = pd.to_datetime(df["ChargePeriodStart"], errors="coerce", utc=True)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BillingDataError(f"{path}: column 'ChargePeriodStart' cannot be read as dates: {exc}") from None
    bad = when.isna() & df["ChargePeriodStart"].notna()
    if bad.any():
        raise BillingDataError(f"{path}: column 'ChargePeriodStart' is not a date on data row {int(bad.idxmax()) + 2}")
    in_period = (when >= start) & (when < end)
    df, itype, when = df[in_period], itype[in_period], when[in_period]
    cost = df[cost_col]
    quantity = df["ConsumedQuantity"].fillna(0)
    # Hours of one line: a day at most per resource in practice; inf or 9.2e18 is not a measurement.
    ok = cost.notna() & (cost >= 0) & (cost <= bs.max_line_cost) & (quantity >= 0) & (quantity <= MAX_LINE_HOURS)
    if (~ok).any():
        warnings.append(f"{path}: {int((~ok).sum())} GPU row(s) excluded: column '{cost_col}' missing, negative "
                        f"or above {bs.max_line_cost:g}, or ConsumedQuantity negative or above {MAX_LINE_HOURS:g} h")
        df, itype, when = df[ok], itype[ok], when[ok]
    if df.empty:
        warnings.append(f"{path}: no GPU instance usage between {start:%Y-%m-%d} and {end:%Y-%m-%d}")
        return FocusResult(empty_table(), warnings, n_read)
    single_currency(df, path, "BillingCurrency")
    tags = df["Tags"].map(_tags) if "Tags" in df.columns else pd.Series([{}] * len(df), index=df.index)
    out = pd.DataFrame({
        "date": when.dt.tz_localize(None).dt.floor("D"),
        "provider": df["ProviderName"].fillna("").str.strip().str.lower().map(lambda p: _PROVIDERS.get(p, p)),
        "account": df.get("SubAccountId", pd.Series("", index=df.index)).fillna(""),
        "region": df.get("RegionId", pd.Series("", index=df.index)).fillna(""),
        "resource_id": df["ResourceId"].fillna(""),
        "instance_type": itype,
        "pricing_model": [_pricing(r) for r in df.to_dict("records")],
        "team": tags.map(lambda t: _pick(t, bs.tag_keys.team)),
        "project": tags.map(lambda t: _pick(t, bs.tag_keys.project)),
        "owner": tags.map(lambda t: _pick(t, bs.tag_keys.owner)),
        "tags": tags.map(canonical_tags),
        "cost": df[cost_col],
        "currency": df["BillingCurrency"],
        "usage_hours": df["ConsumedQuantity"].fillna(0.0),
        "source": "focus",
    })
    keys = [c for c in out.columns if c not in ("cost", "usage_hours")]
    out = out.groupby(keys, sort=True)[["cost", "usage_hours"]].sum().reset_index()
    for w in warnings:
        log.warning("%s", w)
    return FocusResult(conform(out), warnings, n_read)


def _pricing(row: dict) -> str:
    kind = str(row.get("CommitmentDiscountType") or "").lower()
    if "reserv" in kind:
        return "reserved"
    if "saving" in kind or "commit" in kind:
        return "savings-plan"
    if str(row.get("PricingCategory") or "") == "Dynamic" or "spot" in str(row.get("ChargeDescription") or "").lower():
        return "spot"
    return "on-demand"
