"""Synthetic CUR 2.0 Parquet files for tests, the demo and bench/bench_cur.py.

No real CUR 2.0 data rows are public (only the column model in
shared/data/billing/aws_cur2_columns_tailpipe.csv), so fixtures are generated
with the real column names and Parquet types: GPU and non-GPU usage, spot,
on-demand, reserved and savings-plan lines, tagged and untagged resources,
region-prefixed usage types (USE2-BoxUsage:...), other line item types (Tax,
RIFee, Credit) that must be ignored.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TAGS_TYPE = pa.map_(pa.string(), pa.string())

# The columns written, with CUR 2.0 Parquet types (a realistic subset plus all we read).
SCHEMA = pa.schema([
    ("bill_billing_period_start_date", pa.timestamp("ms")),
    ("bill_payer_account_id", pa.string()),
    ("identity_line_item_id", pa.string()),
    ("identity_time_interval", pa.string()),
    ("line_item_line_item_type", pa.string()),
    ("line_item_usage_account_id", pa.string()),
    ("line_item_usage_start_date", pa.timestamp("ms")),
    ("line_item_usage_end_date", pa.timestamp("ms")),
    ("line_item_product_code", pa.string()),
    ("line_item_usage_type", pa.string()),
    ("line_item_operation", pa.string()),
    ("line_item_resource_id", pa.string()),
    ("line_item_usage_amount", pa.float64()),
    ("line_item_currency_code", pa.string()),
    ("line_item_unblended_rate", pa.string()),
    ("line_item_unblended_cost", pa.float64()),
    ("line_item_line_item_description", pa.string()),
    ("product_instance_type", pa.string()),
    ("product_region_code", pa.string()),
    ("pricing_term", pa.string()),
    ("reservation_effective_cost", pa.float64()),
    ("savings_plan_savings_plan_effective_cost", pa.float64()),
    ("resource_tags", TAGS_TYPE),
])

_REGION_PREFIX = {"us-east-1": "", "us-east-2": "USE2-", "us-west-2": "USW2-", "eu-west-1": "EU-"}


def usage_type(kind: str, instance_type: str, region: str) -> str:
    return f"{_REGION_PREFIX.get(region, '')}{kind}:{instance_type}"


def write_cur_rows(path: str | Path, rows: Iterable[Mapping], row_group_size: int | None = None,
                   **write_options) -> Path:
    """Write explicit line items; missing fields are null, `resource_tags` a dict or None. `write_options` go to
    pyarrow's write_table (compression, use_dictionary, ...)."""
    rows = list(rows)
    data = {}
    for f in SCHEMA:
        values = [r.get(f.name) for r in rows]
        if f.name == "resource_tags":
            values = [list(v.items()) if v is not None else None for v in values]
        data[f.name] = pa.array(values, f.type)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data, schema=SCHEMA), p, row_group_size=row_group_size, **write_options)
    return p


def line(start: datetime, itype: str, *, kind: str = "BoxUsage", region: str = "us-east-1",
         resource: str = "i-0", cost: float = 1.0, hours: float = 1.0, tags: Mapping | None = None,
         line_type: str = "Usage", account: str = "111122223333", currency: str = "USD",
         line_id: str | None = None, ri_cost: float | None = None, sp_cost: float | None = None) -> dict:
    """One CUR 2.0 line item as a dict for write_cur_rows()."""
    start = start.astimezone(timezone.utc).replace(tzinfo=None) if start.tzinfo else start
    return {
        "bill_billing_period_start_date": start.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
        "bill_payer_account_id": account,
        "identity_line_item_id": line_id or f"{resource}-{start:%Y%m%d%H}-{kind}-{line_type}",
        "identity_time_interval": f"{start:%Y-%m-%dT%H:%M:%SZ}/{start + timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}",
        "line_item_line_item_type": line_type,
        "line_item_usage_account_id": account,
        "line_item_usage_start_date": start,
        "line_item_usage_end_date": start + timedelta(hours=1),
        "line_item_product_code": "AmazonEC2",
        "line_item_usage_type": usage_type(kind, itype, region) if itype else kind,
        "line_item_operation": "RunInstances",
        "line_item_resource_id": resource,
        "line_item_usage_amount": hours,
        "line_item_currency_code": currency,
        "line_item_unblended_rate": f"{cost / hours:.6f}" if hours else "0",
        "line_item_unblended_cost": cost,
        "line_item_line_item_description": f"{kind} {itype}",
        "product_instance_type": itype,
        "product_region_code": region,
        "pricing_term": "Spot" if kind == "SpotUsage" else "OnDemand",
        "reservation_effective_cost": ri_cost,
        "savings_plan_savings_plan_effective_cost": sp_cost,
        "resource_tags": tags,
    }


# --------------------------------------------------------------------------- bulk generator

# (usage kind, instance type, $/h): GPU and non-GPU compute plus other services' usage.
_CATALOG = [
    ("BoxUsage", "p4d.24xlarge", 32.7726), ("BoxUsage", "p5.48xlarge", 98.32), ("BoxUsage", "g5.xlarge", 1.006),
    ("BoxUsage", "g5.12xlarge", 5.672), ("BoxUsage", "g6e.2xlarge", 2.24208), ("SpotUsage", "g5.2xlarge", 0.48),
    ("SpotUsage", "p4d.24xlarge", 12.5), ("BoxUsage", "g4dn.xlarge", 0.526),
    ("BoxUsage", "m5.xlarge", 0.192), ("BoxUsage", "c5.2xlarge", 0.34), ("SpotUsage", "m5.large", 0.035),
    ("BoxUsage", "r6i.4xlarge", 1.008), ("EBS:VolumeUsage.gp3", "", 0.08 / 720),
    ("DataTransfer-Out-Bytes", "", 0.09), ("TimedStorage-ByteHrs", "", 0.023 / 720),
]
_TEAMS = ["ml", "research", "platform", "vision", None]


def generate_cur(path: str | Path, n_rows: int, month: str = "2024-09", *, seed: int = 7,
                 n_resources: int = 4000, row_group_size: int = 1_000_000) -> Path:
    """n_rows line items spread over the month, written one row group at a time."""
    rng = np.random.default_rng(seed)
    start = datetime.strptime(month, "%Y-%m")
    hours_in_month = 30 * 24
    regions = list(_REGION_PREFIX)
    # Each resource has one catalog entry, one region, one account and fixed tags.
    res_cat = rng.integers(0, len(_CATALOG), n_resources)
    res_region = rng.integers(0, len(regions), n_resources)
    res_account = rng.integers(0, 3, n_resources)
    res_team = rng.integers(0, len(_TEAMS), n_resources)
    res_ids = np.array([f"i-{i:017x}" for i in range(n_resources)], dtype=object)
    usage_types = np.array([usage_type(_CATALOG[c][0], _CATALOG[c][1], regions[r]) if _CATALOG[c][1]
                            else f"{_REGION_PREFIX[regions[r]]}{_CATALOG[c][0]}" for c, r in zip(res_cat, res_region)],
                           dtype=object)
    tags = []
    for i in range(n_resources):
        team = _TEAMS[res_team[i]]
        tags.append(None if team is None else [("user_team", team), ("user_project", f"p{i % 7}"),
                                               ("user_owner", f"u{i % 13}@example.com")])
    tags_arr = pa.array(tags, TAGS_TYPE)
    rate = np.array([_CATALOG[c][2] for c in res_cat])
    accounts = np.array(["111122223333", "444455556666", "777788889999"], dtype=object)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    writer = pq.ParquetWriter(p, SCHEMA, compression="snappy")
    try:
        done = 0
        while done < n_rows:
            n = min(row_group_size, n_rows - done)
            res = rng.integers(0, n_resources, n)
            hour = rng.integers(0, hours_in_month, n)
            ts = np.datetime64(start, "ms") + hour.astype("timedelta64[h]")
            amount = np.where(rng.random(n) < 0.9, 1.0, np.round(rng.random(n), 4))
            cost = amount * rate[res]
            lt_draw = rng.random(n)
            line_type = np.where(lt_draw < 0.90, "Usage", np.where(lt_draw < 0.94, "DiscountedUsage",
                                 np.where(lt_draw < 0.98, "SavingsPlanCoveredUsage", "Tax")))
            ri_cost = np.where(line_type == "DiscountedUsage", cost * 0.6, np.nan)
            sp_cost = np.where(line_type == "SavingsPlanCoveredUsage", cost * 0.7, np.nan)
            ids = np.char.add("li-", np.arange(done, done + n).astype(str)).astype(object)
            table = pa.table({
                "bill_billing_period_start_date": pa.array(np.full(n, np.datetime64(start, "ms"))),
                "bill_payer_account_id": pa.array(np.full(n, "111122223333", dtype=object), pa.string()),
                "identity_line_item_id": pa.array(ids, pa.string()),
                "identity_time_interval": pa.array(np.full(n, month, dtype=object), pa.string()),
                "line_item_line_item_type": pa.array(line_type.astype(object), pa.string()),
                "line_item_usage_account_id": pa.array(accounts[res_account[res]], pa.string()),
                "line_item_usage_start_date": pa.array(ts),
                "line_item_usage_end_date": pa.array(ts + np.timedelta64(1, "h")),
                "line_item_product_code": pa.array(np.full(n, "AmazonEC2", dtype=object), pa.string()),
                "line_item_usage_type": pa.array(usage_types[res], pa.string()),
                "line_item_operation": pa.array(np.full(n, "RunInstances", dtype=object), pa.string()),
                "line_item_resource_id": pa.array(res_ids[res], pa.string()),
                "line_item_usage_amount": pa.array(amount),
                "line_item_currency_code": pa.array(np.full(n, "USD", dtype=object), pa.string()),
                "line_item_unblended_rate": pa.array(rate[res].astype(str).astype(object), pa.string()),
                "line_item_unblended_cost": pa.array(np.where(line_type == "DiscountedUsage", 0.0, cost)),
                "line_item_line_item_description": pa.array(usage_types[res], pa.string()),
                "product_instance_type": pa.array(np.array([_CATALOG[c][1] for c in res_cat], dtype=object)[res], pa.string()),
                "product_region_code": pa.array(np.array(regions, dtype=object)[res_region[res]], pa.string()),
                "pricing_term": pa.array(np.full(n, "OnDemand", dtype=object), pa.string()),
                "reservation_effective_cost": pa.array(ri_cost, from_pandas=True),
                "savings_plan_savings_plan_effective_cost": pa.array(sp_cost, from_pandas=True),
                "resource_tags": tags_arr.take(pa.array(res)),
            }, schema=SCHEMA)
            writer.write_table(table)
            done += n
    finally:
        writer.close()
    return p
