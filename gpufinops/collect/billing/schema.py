"""The one normalised cost table every billing source produces, and its DB table.

A cost table is a pandas DataFrame with exactly COLUMNS, in that order, with
the dtypes in DTYPES. One row is the cost of one resource (or, for Cost
Explorer, one instance type x team) on one UTC day under one pricing model.
`tags` is the resource's tags as canonical JSON (sorted keys); team, project
and owner are lifted out of them so grouping never has to parse JSON.

Stored in the `costs` table: re-importing the same source and period replaces
exactly those rows in one transaction, and everything is validated before the
transaction starts, so a bad file never costs a row already stored.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from typing import Iterable, Mapping

import pandas as pd
from sqlalchemy import delete, insert, select

from ...store.schema import costs
from ...store.store import Store
from .errors import BillingDataError, mixed_currencies, month_bounds  # noqa: F401  (BillingDataError, month_bounds re-exported)

COLUMNS = (
    "date", "provider", "account", "region", "resource_id", "instance_type", "pricing_model",
    "team", "project", "owner", "tags", "cost", "currency", "usage_hours", "source",
)
STRING_COLUMNS = tuple(c for c in COLUMNS if c not in ("date", "cost", "usage_hours"))
DTYPES: dict[str, str] = {c: "str" for c in STRING_COLUMNS}
DTYPES.update({"date": "datetime64[s]", "cost": "float64", "usage_hours": "float64"})

PRICING_MODELS = ("on-demand", "spot", "reserved", "savings-plan")
SOURCES = ("ce", "cur", "focus", "athena", "gcp-detailed")


def empty_table() -> pd.DataFrame:
    return conform(pd.DataFrame({c: [] for c in COLUMNS}))


def canonical_tags(tags: Mapping[str, object] | Iterable[tuple[str, object]] | str | None) -> str:
    """Tags as JSON with sorted keys; None/empty -> '{}'. Values become strings."""
    if tags is None or (isinstance(tags, float) and tags != tags):  # None or NaN
        return "{}"
    if isinstance(tags, str):
        if not tags.strip() or tags.strip().upper() == "NULL":
            return "{}"
        tags = json.loads(tags)
    items = tags.items() if isinstance(tags, Mapping) else tags
    return json.dumps({str(k): "" if v is None else str(v) for k, v in items}, sort_keys=True)


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """Same columns, order and dtypes for every source; missing strings become ''."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise BillingDataError(f"cost table lacks columns {missing}")
    out = pd.DataFrame(index=range(len(df)))
    for c in COLUMNS:
        col = df[c].reset_index(drop=True)
        if c == "date":
            # Naive values are UTC already; aware ones are converted, then the zone dropped.
            col = pd.to_datetime(col, utc=True).dt.tz_localize(None)
            out[c] = col.dt.floor("D").astype("datetime64[s]")
        elif c in ("cost", "usage_hours"):
            out[c] = pd.to_numeric(col).astype("float64")
        else:
            out[c] = col.fillna("").astype("str")
    bad = sorted(set(out["pricing_model"]) - set(PRICING_MODELS))
    if bad:
        raise BillingDataError(f"cost table: column 'pricing_model' has unknown values {bad}")
    return out


def single_currency(df: pd.DataFrame, where: str, column: str = "currency") -> str | None:
    """The one currency of a table; mixed currencies are an error (no FX here)."""
    return mixed_currencies(df[column].dropna().unique(), where, column)


# --------------------------------------------------------------------------- storage


def save_costs(store: Store, df: pd.DataFrame, source: str, start: date, end: date, now: datetime) -> int:
    """Replace the stored rows of `source` with dates in [start, end) by `df`, atomically.

    Rows of df outside the period are refused: they would survive the next
    re-import of their own period twice.
    """
    table = conform(df)
    if source not in SOURCES:
        raise BillingDataError(f"unknown source {source!r}; expected one of {SOURCES}")
    if len(table):
        days = table["date"].dt.date
        outside = int(((days < start) | (days >= end)).sum())
        if outside:
            raise BillingDataError(f"{outside} rows fall outside the period {start}..{end} being imported")
        if (table["source"] != source).any():
            raise BillingDataError(f"rows with a source other than {source!r} in an import of {source!r}")
    stamp = now.astimezone(timezone.utc).replace(tzinfo=None)
    rows = [
        {**{c: r[c] for c in COLUMNS if c != "date"}, "date": r["date"].date(), "imported_at": stamp}
        for r in table.to_dict("records")
    ]
    with store.engine.begin() as conn:
        conn.execute(delete(costs).where(costs.c.source == source, costs.c.date >= start, costs.c.date < end))
        if rows:
            conn.execute(insert(costs), rows)
    return len(rows)


def load_costs(store: Store, start: date, end: date, source: str | None = None) -> pd.DataFrame:
    q = select(*[costs.c[c] for c in COLUMNS]).where(costs.c.date >= start, costs.c.date < end)
    if source:
        q = q.where(costs.c.source == source)
    with store.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(q.order_by(costs.c.date, costs.c.id)).mappings()]
    if not rows:
        return empty_table()
    return conform(pd.DataFrame(rows))
