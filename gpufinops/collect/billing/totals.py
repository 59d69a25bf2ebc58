"""Cost and usage hours per key at one grain: what a plain `gpufinops costs --by ...` answers.

A totals table has exactly TOTAL_COLUMNS: `key` (the resource id, team, project,
instance type or account; '' when the line has none), `currency`, `cost` and
`usage_hours`, one row per (key, currency). CUR computes it in one pass at the
grain (cur.cur_totals); every other source sums its cost table (table_totals).
"""

from __future__ import annotations

import pandas as pd

# Grain -> the cost-table column it groups on.
GRAINS = {"team": "team", "instance": "resource_id", "instance_type": "instance_type",
          "account": "account", "project": "project"}
TOTAL_COLUMNS = ("key", "currency", "cost", "usage_hours")


def empty_totals() -> pd.DataFrame:
    return pd.DataFrame({"key": pd.Series([], dtype="str"), "currency": pd.Series([], dtype="str"),
                         "cost": pd.Series([], dtype="float64"), "usage_hours": pd.Series([], dtype="float64")})


def table_totals(table: pd.DataFrame, by: str) -> pd.DataFrame:
    """The cost table summed per `by` key and currency."""
    if by not in GRAINS:
        raise ValueError(f"unknown grain {by!r}; expected one of {sorted(GRAINS)}")
    if table.empty:
        return empty_totals()
    out = (table.groupby([GRAINS[by], "currency"], sort=True)[["cost", "usage_hours"]].sum()
           .reset_index().rename(columns={GRAINS[by]: "key"}))
    return out[list(TOTAL_COLUMNS)]
