"""Cost and usage hours per key at one grain: what a plain `gpufinops costs --by ...` answers.

A totals table has exactly TOTAL_COLUMNS: `key` (the resource id, team, project,
instance type or account; '' when the line has none), `currency`, `cost` and
`usage_hours`, one row per (key, currency). CUR computes it in one pass at the
grain (cur.cur_totals); every other source sums its cost table (table_totals).
"""

from __future__ import annotations

import math
import sys
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    import pandas as pd

# Grain -> the cost-table column it groups on.
GRAINS = {"team": "team", "instance": "resource_id", "instance_type": "instance_type",
          "account": "account", "project": "project"}
TOTAL_COLUMNS = ("key", "currency", "cost", "usage_hours")


def empty_totals() -> "pd.DataFrame":
    import pandas as pd

    return pd.DataFrame({"key": pd.Series([], dtype="str"), "currency": pd.Series([], dtype="str"),
                         "cost": pd.Series([], dtype="float64"), "usage_hours": pd.Series([], dtype="float64")})


def table_totals(table: "pd.DataFrame", by: str) -> "pd.DataFrame":
    """The cost table summed per `by` key and currency."""
    if by not in GRAINS:
        raise ValueError(f"unknown grain {by!r}; expected one of {sorted(GRAINS)}")
    if table.empty:
        return empty_totals()
    out = (table.groupby([GRAINS[by], "currency"], sort=True)[["cost", "usage_hours"]].sum()
           .reset_index().rename(columns={GRAINS[by]: "key"}))
    return out[list(TOTAL_COLUMNS)]


# --------------------------------------------------------------------------- printed without pandas

PRINTED = ("currency", "cost", "usage_hours", "cost_per_hour")  # after the grain's own column


def summarize_rows(rows: Iterable[tuple[str, str, float, float]], by: str) -> list[tuple]:
    """costs.summarize_totals() on plain rows (key, currency, cost, usage_hours): empty keys labelled, $/h
    (None without hours), most expensive first, ties by key then currency. No pandas."""
    empty = "(untagged)" if by in ("team", "project") else "(none)"
    sums: dict[tuple[str, str], list[float]] = {}
    for key, currency, cost, hours in rows:
        s = sums.setdefault((key or empty, currency), [0.0, 0.0])
        s[0] += cost
        s[1] += hours
    out = [(k, c, cost, hours, cost / hours if hours > 0 else None) for (k, c), (cost, hours) in sorted(sums.items())]
    return sorted(out, key=lambda r: -r[2])  # stable: ties keep the key order


def print_rows(rows: list[tuple], by: str, fmt: str, out=None, render=None) -> None:
    """What cli._print writes for summarize_totals' frame, the same bytes, from summarize_rows' rows. `render`:
    the command line's one table renderer (cli.common.render_table), which print_frame uses too."""
    out = out or sys.stdout
    names = (by, *PRINTED)
    if fmt == "json":
        print(json_records(names, [(*r[:4], math.nan if r[4] is None else r[4]) for r in rows]), file=out)
    elif fmt == "csv":
        out.write(",".join(names) + "\n")
        for r in rows:
            out.write(",".join(_csv_cell(v) for v in r) + "\n")
    elif not rows:
        print("(no rows)", file=out)
    elif render is None:
        raise ValueError("a table needs the command line's renderer (cli.common.render_table)")
    else:
        cells = [dict(zip(names, (str(r[0]), str(r[1]), *("" if v is None else f"{v:,.2f}" for v in r[2:]))))
                 for r in rows]
        print(render(cells, list(names), right=list(PRINTED[1:])), file=out)


def json_records(names: Sequence[str], rows: Iterable[Sequence]) -> str:
    """`json.dumps([dict(zip(names, row)) for row in rows], default=str, indent=2)`, the same text, for rows of
    scalars. Written here because json.dumps takes its C encoder only without indent: its Python encoder spent
    8-9 ms CPU on a 2,124-key answer (this: 4 ms), a tenth of all the command adds to DuckDB's own work
    (bench/bench_cur.py's replay)."""
    keys = [f"    {encode_basestring_ascii(str(n))}: " for n in names]
    records = [",\n".join(k + _json_scalar(v) for k, v in zip(keys, row)) for row in rows]
    return "[\n  {\n" + "\n  },\n  {\n".join(records) + "\n  }\n]" if records else "[]"


def _json_scalar(v) -> str:
    """One value as json.dumps(v, default=str) writes it (NaN and the infinities as Python's json does)."""
    if type(v) is float and v - v == 0:  # finite: the common case first
        return float.__repr__(v)
    if isinstance(v, str):
        return encode_basestring_ascii(v)
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, int):
        return int.__repr__(v)
    if isinstance(v, float):
        if v - v == 0:
            return float.__repr__(v)
        return "NaN" if v != v else "Infinity" if v > 0 else "-Infinity"
    return encode_basestring_ascii(str(v))


def _csv_cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    v = str(v)
    return '"' + v.replace('"', '""') + '"' if any(ch in v for ch in ',"\n\r') else v


def print_file_totals(settings, month: str, by: str, source: str | None, path: str | None, fmt: str,
                       render=None) -> int | None:
    """`costs --by` of a CUR or FOCUS path (local or s3://) on DuckDB, printed without pandas: the exit code, or
    None when the source or path is not one (bad month included: the caller's path says so)."""
    from .duck import file_totals
    from .errors import BillingDataError, month_bounds
    from .gcp_detailed import file_totals as detailed_totals

    try:
        start, end = month_bounds(month)
    except BillingDataError:
        return None
    try:
        r = detailed_totals(settings, start, end, by, source, path) or file_totals(settings, start, end, by, source,
                                                                                    path)
    except BillingDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if r is None:
        return None
    for w in r.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not r.rows:
        print(f"warning: no GPU instance cost in {r.source} for {month}", file=sys.stderr)
    print_rows(summarize_rows(r.rows, by), by, fmt, render=render)
    return 0
