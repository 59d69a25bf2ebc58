"""Per-key totals of CUR 2.0 and FOCUS files on DuckDB: what a plain `gpufinops costs --by ...` prints.

The engine was chosen by measurement (BENCHMARKS.md, "Billing totals at DuckDB's speed"): the answer is the
same as the Arrow/pandas readers' (cur.read_cur, focus.read_focus, summed at the grain; tests assert it to the
cent), but reading, filtering and summing run in DuckDB's multithreaded scan, and nothing here imports pandas
or pyarrow (their imports alone are ~160 MiB resident, more than DuckDB's whole answer at 5 M rows).

CUR: the file's distinct usage types are judged by cur.py's regex in Python (a dictionary scan), then one
statement per file applies cur.py's selection (those usage types by equality, pushed into the scan; line
types, effective cost, the period, the line guards), summed per (key, currency), excluded lines counted in
the same pass.

FOCUS: one statement per file sums the file's usage-in-time rows per distinct (charge texts, Tags, key,
currency); the Python rules of focus.py (the GPU instance a text names, the tag shapes, the team/project
lookup) then run once per distinct group, so the selection stays exactly focus.py's. Seconds-unit rows
(Google) keep their instance and charge period, so an instance-period's hours count once, as read_focus does. A
GCE VM's groups keep its ResourceId: those naming no GPU (an N1 VM's vCPU, RAM) count once its GPU SKU row is seen.
Parquet: the usage-in-time test is first judged in Python over the distinct ChargeCategory / ConsumedUnit /
ServiceCategory values and given to DuckDB as equality, so the other columns of the other rows are never
decoded. Times are compared as epoch microseconds or in the column's own type: a TIMESTAMP compared with a
TIMESTAMPTZ is converted row by row through ICU, on one thread (0.86 -> 0.63 CPU-s of the statement
at 5 M Parquet rows when avoided).

An s3:// path is read from local partial copies (s3fetch.py: a Parquet object's footer and the columns
below only, a CSV whole), one object at a time: DuckDB's own S3 reader, the httpfs extension, is a download at
run time.
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Sequence

from .errors import BillingDataError, mixed_currencies
from .s3fetch import local_copies
from .sources import ParquetSource

# cur.py's column names and guards, repeated here so this module does not import pyarrow (cur.py does);
# tests/test_billing_duck.py asserts they are the same.
CUR_USAGE_TYPE = "line_item_usage_type"
CUR_LINE_TYPE = "line_item_line_item_type"
CUR_START = "line_item_usage_start_date"
CUR_RESOURCE = "line_item_resource_id"
CUR_ACCOUNT = "line_item_usage_account_id"
CUR_CURRENCY = "line_item_currency_code"
CUR_TAGS = "resource_tags"
CUR_LINE_ID = "identity_line_item_id"
CUR_UNBLENDED = "line_item_unblended_cost"
CUR_RI = "reservation_effective_cost"
CUR_SP = "savings_plan_savings_plan_effective_cost"
CUR_USAGE = "line_item_usage_amount"
CUR_REQUIRED = (CUR_USAGE_TYPE, CUR_LINE_TYPE, CUR_START, CUR_RESOURCE, CUR_ACCOUNT, CUR_UNBLENDED, CUR_USAGE,
                CUR_CURRENCY)
CUR_WARN_ABSENT = (CUR_TAGS, CUR_RI, CUR_SP)  # absent: read as empty, with a warning (cur._check_schema)
# What cur_sql reads besides the grain's key column (an S3 object's copy holds these only; s3fetch).
CUR_READ = (CUR_USAGE_TYPE, CUR_LINE_TYPE, CUR_START, CUR_CURRENCY, CUR_UNBLENDED, CUR_RI, CUR_SP, CUR_USAGE)
CUR_KEY = {"instance": CUR_RESOURCE, "account": CUR_ACCOUNT, "instance_type": CUR_USAGE_TYPE, "team": CUR_TAGS,
           "project": CUR_TAGS}
MAX_LINE_HOURS = 1e9
INSTANCE_TYPE_PATTERN = r":([a-z0-9-]+\.[A-Za-z0-9]+)$"


@dataclass
class TotalRows:
    rows: list[tuple[str, str, float, float]]  # (key, currency, cost, usage_hours), sorted by key, currency
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    rows_read: int | None = 0  # None: not counted (FOCUS: only the usage rows are read past the scan)
    source: str = ""  # cur or focus


def gpu_usage_pattern(families: Sequence[str]) -> str:
    """cur.gpu_usage_pattern (the same text; a test holds them equal)."""
    fams = "|".join(sorted(set(families), key=lambda f: (-len(f), f)))
    return rf"(^|-)(BoxUsage|SpotUsage):({fams})\.[A-Za-z0-9]+$"


def _q(s: str) -> str:
    return "'" + str(s).replace("'", "''") + "'"


def _ident(c: str) -> str:
    return '"' + c.replace('"', '""') + '"'


def _period_bounds(column_type: str, start: datetime, end: datetime) -> tuple[str, str]:
    """[start, end) as literals of the column's own type, so no row is converted (a TIMESTAMP compared with a
    TIMESTAMPTZ goes through ICU, row by row and on one thread). A naive timestamp is UTC."""
    if column_type.upper().startswith("TIMESTAMP WITH TIME ZONE"):
        return f"TIMESTAMPTZ '{start.isoformat()}'", f"TIMESTAMPTZ '{end.isoformat()}'"
    naive = lambda d: d.astimezone(timezone.utc).replace(tzinfo=None).isoformat(sep=" ")  # noqa: E731
    return f"TIMESTAMP '{naive(start)}'", f"TIMESTAMP '{naive(end)}'"


def _epoch_us(column: str, column_type: str) -> str:
    """Microseconds since 1970 UTC of a time column (NULL for text that is not a date). Text with an offset
    is converted to UTC (pd.to_datetime(utc=True) does the same); naive text and timestamps are UTC."""
    t = column_type.upper()
    if t.startswith("TIMESTAMP") or t == "DATE":
        return f"epoch_us(CAST({_ident(column)} AS TIMESTAMP))" if t == "DATE" else f"epoch_us({_ident(column)})"
    return f"epoch_us(TRY_CAST({_ident(column)} AS TIMESTAMPTZ))"


def connect():
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    con.execute("SET enable_progress_bar=false")
    return con


def _error_text(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _finish(sums: dict[tuple[str, str], list[float]], warnings: list[str], files: list[str], rows_read: int,
            path: str, start: datetime, end: datetime) -> TotalRows:
    mixed_currencies([c for _, c in sums], path)
    if not sums:
        warnings.append(f"{path}: no GPU instance usage between {start:%Y-%m-%d} and {end:%Y-%m-%d}")
    rows = [(k, c, v[0], v[1]) for (k, c), v in sorted(sums.items())]
    return TotalRows(rows, warnings, files, rows_read)


# --------------------------------------------------------------------------- CUR 2.0


def _cur_key(by: str, tag_keys, names: set[str]) -> str:
    if by in ("instance", "account"):
        return f"COALESCE({CUR_KEY[by]}, '')"
    if by == "instance_type":  # the usage type; its instance type is read in Python (cur.py's regex)
        return CUR_USAGE_TYPE
    keys = getattr(tag_keys, by)
    if CUR_TAGS not in names or not keys:
        return "''"
    tried = ", ".join(f"NULLIF({CUR_TAGS}[{_q(k)}], '')" for k in keys)
    return f"COALESCE({tried}, '')"


def _cur_schema(con, src: ParquetSource) -> tuple[dict[str, str], int, list[str]]:
    """The file's column types and row count; errors name the file as cur._check_schema does."""
    f = _q(src.path)
    try:
        types = {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet({f})").fetchall()}
        n = con.execute(f"SELECT COALESCE(SUM(num_rows), 0) FROM parquet_file_metadata({f})").fetchone()[0]
    except Exception as exc:  # duckdb.Error: not Parquet, truncated, unreadable
        raise BillingDataError(f"{src.name}: not a readable Parquet file (truncated or not Parquet?): "
                               f"{_error_text(exc)}") from None
    missing = [c for c in CUR_REQUIRED if c not in types]
    if missing:
        raise BillingDataError(f"{src.name}: missing CUR 2.0 column(s) {missing}")
    warnings = [f"{src.name}: column '{c}' absent; read as empty" for c in CUR_WARN_ABSENT if c not in types]

    def kind(t: str) -> str:
        t = t.upper()
        if t.startswith(("TIMESTAMP", "DATE")):
            return "time"
        if t.startswith(("DOUBLE", "FLOAT", "REAL", "DECIMAL", "INTEGER", "BIGINT", "SMALLINT", "TINYINT",
                         "HUGEINT", "UBIGINT", "UINTEGER", "USMALLINT", "UTINYINT", "NULL", '"NULL"')):
            return "number"
        if t.startswith(("VARCHAR", "NULL", '"NULL"')):
            return "string"
        if t.startswith("MAP("):
            return "map"
        return t
    if kind(types[CUR_START]) != "time":
        raise BillingDataError(f"{src.name}: column '{CUR_START}' has type {types[CUR_START]}, expected a timestamp")
    for c in (CUR_UNBLENDED, CUR_RI, CUR_SP, CUR_USAGE):
        if c in types and kind(types[c]) != "number":
            raise BillingDataError(f"{src.name}: column '{c}' has type {types[c]}, expected a number")
    for c in (CUR_USAGE_TYPE, CUR_LINE_TYPE, CUR_RESOURCE, CUR_ACCOUNT, CUR_CURRENCY, CUR_LINE_ID,
              "product_region_code"):
        if c in types and kind(types[c]) not in ("string",) and types[c].upper() not in ("NULL", '"NULL"'):
            raise BillingDataError(f"{src.name}: column '{c}' has type {types[c]}, expected a string")
    if CUR_TAGS in types and not (types[CUR_TAGS].upper().startswith("MAP(") or types[CUR_TAGS].upper() == '"NULL"'):
        raise BillingDataError(f"{src.name}: column 'resource_tags' has type {types[CUR_TAGS]}, "
                               "expected map<string,string>")
    return types, int(n), warnings


def gpu_usage_types(con, table: str, families: Sequence[str]) -> list[str]:
    """The file's distinct usage types that are GPU instance-hours, by cur.py's regex in Python: a Parquet
    dictionary scan (a few hundred values), so the statement below filters by equality, which DuckDB pushes
    into the scan, instead of a regex per line."""
    gpu = re.compile(gpu_usage_pattern(families))
    values = con.execute(f"SELECT DISTINCT {CUR_USAGE_TYPE} FROM {table}").fetchall()
    return sorted(v for (v,) in values if v is not None and gpu.search(v))


def _in(values: Sequence[str]) -> str:
    return ", ".join(_q(v) for v in values)


def usage_hours_sql(lo: int, hi: int) -> str:
    """The CTEs `timed` and `kept` after a CTE `used` (unit_, qty_, period_, until_ in epoch µs): each line's hours
    from its time unit (hours; seconds / 3600, clipped to its charge period) as h_, and inp_ whether it starts in
    [lo, hi). One piece for the FOCUS totals and Google's detailed export, so both count an hour alike."""
    from .focus_rules import HOUR_UNITS, SECOND_UNITS

    secs, hours = _in(sorted(SECOND_UNITS)), _in(sorted(HOUR_UNITS))
    return f"""timed AS (
      SELECT *, unit_ IN ({secs}) AS secs_,
             CASE WHEN unit_ IN ({hours}) THEN COALESCE(qty_, 0)
                  WHEN unit_ IN ({secs}) THEN COALESCE(qty_, 0) / 3600.0 ELSE 0 END AS raw_h_
      FROM used),
    kept AS (
      SELECT *,
             CASE WHEN secs_ AND until_ IS NOT NULL THEN LEAST(raw_h_, (until_ - period_) / 3.6e9)
                  ELSE raw_h_ END AS h_,
             COALESCE(period_ >= {lo} AND period_ < {hi}, false) AS inp_
      FROM timed)"""


def cur_sql(table: str, names: dict[str, str], start: datetime, end: datetime, usage_types: Sequence[str], by: str,
            tag_keys, max_line_cost: float) -> str:
    """cur_totals()'s answer for one file (`names`: its column types): (key, currency, cost, usage_hours,
    excluded lines)."""
    lo, hi = _period_bounds(names.get(CUR_START, ""), start, end)
    col = lambda c: c if c in names else "NULL"  # noqa: E731
    return f"""
    WITH gpu AS (
      SELECT {_cur_key(by, tag_keys, names)} AS key, COALESCE({CUR_CURRENCY}, '') AS currency,
             CAST(CASE WHEN {CUR_LINE_TYPE} = 'DiscountedUsage' THEN {col(CUR_RI)}
                       WHEN {CUR_LINE_TYPE} = 'SavingsPlanCoveredUsage' THEN {col(CUR_SP)}
                       ELSE {CUR_UNBLENDED} END AS DOUBLE) AS cost,
             CAST({CUR_USAGE} AS DOUBLE) AS hours
      FROM {table}
      WHERE {CUR_START} >= {lo} AND {CUR_START} < {hi}
        AND {CUR_LINE_TYPE} IN ('Usage', 'DiscountedUsage', 'SavingsPlanCoveredUsage')
        AND {CUR_USAGE_TYPE} IN ({_in(usage_types)})),
    judged AS (
      SELECT key, currency, cost, hours,
             COALESCE(cost >= 0 AND cost <= {float(max_line_cost)!r} AND hours >= 0
                      AND hours <= {MAX_LINE_HOURS!r}, false) AS ok
      FROM gpu)
    SELECT key, currency, SUM(cost) FILTER (WHERE ok), SUM(hours) FILTER (WHERE ok), COUNT(*) FILTER (WHERE NOT ok)
    FROM judged GROUP BY key, currency
    """


def cur_total_rows(files: Sequence[ParquetSource], path: str, start: datetime, end: datetime,
                   families: Sequence[str], by: str, tag_keys, max_line_cost: float = 100_000.0) -> TotalRows:
    """Cost and usage hours per `by` key and currency of local CUR 2.0 Parquet files (cur.cur_totals' answer)."""
    con = connect()
    sums: dict[tuple[str, str], list[float]] = {}
    warnings: list[str] = []
    rows_read = 0
    for src in local_copies(files, (*CUR_READ, CUR_KEY[by])):
        types, n, warns = _cur_schema(con, src)
        warnings += warns
        rows_read += n
        table = f"read_parquet({_q(src.path)})"
        try:
            usage_types = gpu_usage_types(con, table, families)
            got = con.execute(cur_sql(table, types, start, end, usage_types, by, tag_keys,
                                      max_line_cost)).fetchall() if usage_types else []
        except Exception as exc:  # duckdb.Error: a row group unreadable, a value it cannot convert
            raise BillingDataError(f"{src.name}: cannot read the GPU line items: {_error_text(exc)}") from None
        bad = 0
        file_currencies = []
        for key, currency, cost, hours, excluded in got:
            bad += excluded
            if cost is None:  # every line of the group excluded
                continue
            file_currencies.append(currency)
            if by == "instance_type":
                key = instance_type(key)
            s = sums.setdefault((key, currency), [0.0, 0.0])
            s[0] += cost
            s[1] += hours
        mixed_currencies(file_currencies, src.name)
        if bad:
            if src.fetch_columns:  # the line id, only to name the first excluded line
                src.fetch_columns((CUR_LINE_ID,))
            warnings.append(
                f"{src.name}: {bad} GPU line item(s) excluded: cost (line_item_unblended_cost, or "
                f"reservation_effective_cost / savings_plan_savings_plan_effective_cost for RI / SP lines) "
                f"missing, negative or above {max_line_cost:g}, or line_item_usage_amount negative or above "
                f"{MAX_LINE_HOURS:g}" + _first_bad_cur(con, table, types, start, end, usage_types, max_line_cost))
    return _finish(sums, warnings, [s.name for s in files], rows_read, path, start, end)


@functools.lru_cache(maxsize=4096)
def instance_type(usage_type: str | None) -> str:
    """`g5.xlarge` of `USE1-BoxUsage:g5.xlarge` (cur.py's INSTANCE_TYPE_PATTERN), '' when none."""
    m = re.search(INSTANCE_TYPE_PATTERN, usage_type) if usage_type else None
    return m.group(1) if m else ""


def _first_bad_cur(con, table: str, names: dict[str, str], start, end, usage_types, max_line_cost) -> str:
    """' (first: identity_line_item_id=...)' for the file's first excluded line, read only when there is one."""
    lo, hi = _period_bounds(names.get(CUR_START, ""), start, end)
    if CUR_LINE_ID not in names:
        return ""
    col = lambda c: c if c in names else "NULL"  # noqa: E731
    q = f"""
    SELECT {CUR_LINE_ID} FROM (
      SELECT {CUR_LINE_ID}, file_row_number,
             CAST(CASE WHEN {CUR_LINE_TYPE} = 'DiscountedUsage' THEN {col(CUR_RI)}
                       WHEN {CUR_LINE_TYPE} = 'SavingsPlanCoveredUsage' THEN {col(CUR_SP)}
                       ELSE {CUR_UNBLENDED} END AS DOUBLE) AS cost,
             CAST({CUR_USAGE} AS DOUBLE) AS hours
      FROM {table.replace(')', ', file_row_number=true)', 1)}
      WHERE {CUR_START} >= {lo} AND {CUR_START} < {hi}
        AND {CUR_LINE_TYPE} IN ('Usage', 'DiscountedUsage', 'SavingsPlanCoveredUsage')
        AND {CUR_USAGE_TYPE} IN ({_in(usage_types)}))
    WHERE NOT COALESCE(cost >= 0 AND cost <= {float(max_line_cost)!r} AND hours >= 0
                       AND hours <= {MAX_LINE_HOURS!r}, false)
    ORDER BY file_row_number LIMIT 1"""
    try:
        row = con.execute(q).fetchone()
    except Exception:  # naming the line is a courtesy; the count stands without it
        return ""
    return f" (first: identity_line_item_id={row[0]})" if row and row[0] is not None else ""


# --------------------------------------------------------------------------- FOCUS


FOCUS_TEXT = ("x_UsageType", "ChargeDescription", "SkuPriceDetails", "x_SkuDetails")
# Every column the statements below read (the cost column besides, as configured).
FOCUS_READ = (*FOCUS_TEXT, "Tags", "ResourceId", "ResourceName", "BillingCurrency", "ChargeCategory", "ConsumedUnit",
              "ConsumedQuantity", "ServiceCategory", "ChargePeriodStart", "ChargePeriodEnd")
FOCUS_KEY = {"instance": "ResourceId", "account": "SubAccountId"}  # the others come from the texts and Tags


def _focus_columns(con, src: ParquetSource) -> tuple[dict[str, str], str]:
    """(column name -> DuckDB type, in file order; the DuckDB table function reading the file)."""
    from ...config import not_utf8_error

    f = _q(src.path)
    if src.name.lower().endswith(".parquet"):
        table = f"read_parquet({f})"
        try:
            names = {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM {table}").fetchall()}
        except Exception as exc:
            raise BillingDataError(f"{src.name}: cannot read FOCUS file: {_error_text(exc)}") from None
        return names, table
    import gzip  # here: only a FOCUS CSV's header is read through it

    opener = gzip.open if src.name.lower().endswith(".gz") else open
    try:
        with opener(src.path, "rt", encoding="utf-8", newline="") as fh:
            header = next(csv.reader(fh), None)
    except UnicodeDecodeError:
        if not src.name.lower().endswith(".gz"):
            raise BillingDataError(str(not_utf8_error(src.path))) from None
        raise BillingDataError(f"{src.name}: not UTF-8 text") from None
    except (OSError, EOFError, csv.Error) as exc:
        raise BillingDataError(f"{src.name}: cannot read FOCUS file: {exc}") from None
    if not header:
        raise BillingDataError(f"{src.name}: empty file, no FOCUS header")
    # As focus._chunks reads it with pandas: every value a string, "NULL" and "" missing.
    return dict.fromkeys(header, "VARCHAR"), (f"read_csv({f}, header=true, all_varchar=true, delim=',', quote='\"', escape='\"', "
                    "nullstr=['NULL', ''])")


def _usage_values(con, table: str, names: set[str]) -> str | None:
    """For a Parquet file: the filter of usage-in-time rows as equality on the raw values of ChargeCategory,
    ConsumedUnit and ServiceCategory, each value judged once in Python by focus.py's rules (a dictionary scan
    of three columns). DuckDB pushes it into the scan, so the other columns of the other rows are never
    decoded. None: no row can be one."""
    from .focus_rules import COMPOUND_TIME_UNIT, HOUR_UNITS, NON_COMPUTE_CATEGORIES, SECOND_UNITS

    cols = ["ChargeCategory", "ConsumedUnit"] + (["ServiceCategory"] if "ServiceCategory" in names else [])
    got = con.execute("SELECT " + ", ".join(f"list(DISTINCT CAST({_ident(c)} AS VARCHAR))" for c in cols)
                      + f" FROM {table}").fetchone()
    norm = lambda v: str(v).strip().lower()  # noqa: E731  (focus.py: .astype(str).str.strip().str.lower())
    usage = [v for v in got[0] if norm(v) == "usage"]
    units = [v for v in got[1] if norm(v) in HOUR_UNITS | SECOND_UNITS or re.search(COMPOUND_TIME_UNIT, norm(v))]
    if not usage or not units:
        return None
    where = (f"CAST(ChargeCategory AS VARCHAR) IN ({_in(usage)}) "
             f"AND CAST(ConsumedUnit AS VARCHAR) IN ({_in(units)})")
    if "ServiceCategory" in names:
        kept = [v for v in got[2] if norm(v) not in NON_COMPUTE_CATEGORIES]
        where += (f" AND (ServiceCategory IS NULL OR CAST(ServiceCategory AS VARCHAR) IN ({_in(kept)}))" if kept
                  else " AND ServiceCategory IS NULL")
    return where


def _low(c: str) -> str:
    return f"lower(trim(COALESCE(CAST({_ident(c)} AS VARCHAR), '')))"


def _usage_sql(names) -> str:
    """focus.py's usage-in-time rows as a SQL condition: a Usage charge in a time unit, not of a non-compute
    service category."""
    from .focus_rules import COMPOUND_TIME_UNIT, HOUR_UNITS, NON_COMPUTE_CATEGORIES, SECOND_UNITS

    category = (f" AND {_low('ServiceCategory')} NOT IN ({_in(sorted(NON_COMPUTE_CATEGORIES))})"
                if "ServiceCategory" in names else "")
    return (f"{_low('ChargeCategory')} = 'usage'{category} AND ({_low('ConsumedUnit')} IN "
            f"({_in(sorted(HOUR_UNITS | SECOND_UNITS))}) OR regexp_matches({_low('ConsumedUnit')}, "
            f"{_q(COMPOUND_TIME_UNIT)}))")


def _focus_sql(table: str, names: dict[str, str], start: datetime, end: datetime, bs, by: str,
               where: str | None = None) -> tuple[str, list[str]]:
    """One file's usage-in-time rows summed per distinct group (the group columns are returned too). `where`:
    _usage_values' filter, else the same rules as SQL expressions (CSV: a second pass would cost a parse)."""
    low = _low
    cost_col = bs.focus_cost_column
    until = _epoch_us("ChargePeriodEnd", names["ChargePeriodEnd"]) if "ChargePeriodEnd" in names else "NULL::BIGINT"
    lo, hi = (int((d - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds()) * 1_000_000 for d in (start, end))
    key = FOCUS_KEY.get(by)
    group = [c for c in (*FOCUS_TEXT, "Tags") if c in names] + ([key] if key and key in names else [])
    if by == "instance" and "ResourceName" in names:  # a GCE VM's name (subject_of)
        group.append("ResourceName")
    where = where or _usage_sql(names)
    sql = f"""
    WITH used AS (
      SELECT {', '.join(_ident(c) for c in [*group, *(c for c in ("BillingCurrency", "ResourceId") if c not in group)])},
             {low('ConsumedUnit')} AS unit_,
             TRY_CAST({_ident(cost_col)} AS DOUBLE) AS cost_, {_ident(cost_col)} IS NOT NULL AS has_cost_,
             TRY_CAST(ConsumedQuantity AS DOUBLE) AS qty_, ConsumedQuantity IS NOT NULL AS has_qty_,
             {_epoch_us("ChargePeriodStart", names["ChargePeriodStart"])} AS period_,
             ChargePeriodStart IS NOT NULL AS has_period_,
             {until} AS until_
      FROM {table}
      WHERE {where}),
    {usage_hours_sql(lo, hi)}
    SELECT {', '.join(_ident(c) for c in group)}{',' if group else ''} BillingCurrency AS currency_,
           CASE WHEN secs_ THEN ResourceId END AS secs_rid_, CASE WHEN secs_ THEN period_ END AS secs_period_,
           {_gce_rid()} AS gce_rid_, COUNT(*) FILTER (WHERE inp_) AS n_in_,
           COUNT(*) FILTER (WHERE cost_ IS NULL AND has_cost_) AS bad_cost,
           COUNT(*) FILTER (WHERE qty_ IS NULL AND has_qty_) AS bad_qty,
           COUNT(*) FILTER (WHERE period_ IS NULL AND has_period_) AS bad_date,
           SUM(cost_) FILTER (WHERE inp_ AND ok_) AS cost, SUM(h_) FILTER (WHERE inp_ AND ok_) AS hours,
           MAX(h_) FILTER (WHERE inp_ AND ok_) AS max_hours, COUNT(*) FILTER (WHERE inp_ AND NOT ok_) AS excluded
    FROM (SELECT *, COALESCE(cost_ >= 0 AND cost_ <= {float(bs.max_line_cost)!r} AND h_ >= 0
                             AND h_ <= {MAX_LINE_HOURS!r}, false) AS ok_ FROM kept)
    GROUP BY ALL
    """
    return sql, group


def _gce_rid() -> str:
    """A Compute Engine resource's ResourceId, NULL for any other: the groups of a GCE VM's rows keep their VM, so
    that an N1 VM's vCPU and RAM rows can follow its GPU SKU row (focus_rules.PendingGceRows)."""
    from .focus_rules import GCE_RESOURCE_PREFIX

    return (f"CASE WHEN starts_with(CAST(ResourceId AS VARCHAR), {_q(GCE_RESOURCE_PREFIX)}) "
            "THEN CAST(ResourceId AS VARCHAR) END")


class _FocusRules:
    """focus.py's per-value rules, each worked out once per distinct value."""

    def __init__(self, bs, by: str) -> None:
        from .focus_rules import GCP_MACHINE_LABEL, _as_text, _pick, focus_tags, gpu_instance_type, subject_of

        self.bs, self.by = bs, by
        families, patterns = set(bs.gpu_families or ()), [re.compile(p) for p in bs.gpu_patterns]
        self._tags: dict = {}
        self._types: dict[str, str] = {}
        self._as_text, self._pick, self._focus_tags = _as_text, _pick, focus_tags
        self._gpu = lambda text: gpu_instance_type(text, families, patterns)
        self._label = GCP_MACHINE_LABEL
        self._subject = subject_of

    def tags(self, raw) -> dict:
        try:
            k = raw if isinstance(raw, (str, type(None))) else repr(raw)
            if k not in self._tags:
                self._tags[k] = self._focus_tags(raw if raw is not None else "")
            return self._tags[k]
        except TypeError:
            return self._focus_tags(raw)

    def instance_type(self, g: dict) -> str:
        tags = self.tags(g.get("Tags"))
        text = (self._as_text(g.get("x_UsageType")) + " " + ("" if g.get("ChargeDescription") is None
                                                           else str(g["ChargeDescription"])) + " "
                + self._as_text(g.get("SkuPriceDetails")) + " " + self._as_text(g.get("x_SkuDetails")) + " "
                + str(tags.get(self._label) or ""))
        if text not in self._types:
            self._types[text] = self._gpu(text)
        return self._types[text]

    def machine_type(self, g: dict) -> str:
        """The machine type Google's machine_spec label names ('' without one): a GCE VM's type where no text
        names a GPU machine type (an N1 VM with attached GPUs)."""
        return str(self.tags(g.get("Tags")).get(self._label) or "")

    def key(self, g: dict, itype: str) -> str:
        if self.by == "instance":
            return self._subject(g.get("ResourceId"), g.get("ResourceName"))
        if self.by == "account":
            return self._as_text(g.get("SubAccountId"))
        if self.by == "instance_type":
            return itype
        return self._pick(self.tags(g.get("Tags")), getattr(self.bs.tag_keys, self.by))


def focus_total_rows(files: Sequence[ParquetSource], path: str, start: datetime, end: datetime, bs,
                     by: str) -> TotalRows:
    """Cost and usage hours per `by` key and currency of local FOCUS files (read_focus's table summed). A GCE VM's
    groups that name no GPU (an N1 VM's vCPU and RAM) wait until every file is read: they count if the VM was billed
    a GPU SKU anywhere (focus_rules.PendingGceRows, as read_focus settles them)."""
    from .focus_rules import GPU_SKU, PendingGceRows, check_columns, is_gce_vm
    from .focus_rules import MAX_LINE_HOURS as FOCUS_MAX_HOURS

    con = connect()
    rules = _FocusRules(bs, by)
    sums: dict[tuple[str, str], list[float]] = {}
    secs: dict[tuple, list] = {}  # (resource, period) -> [max hours, (key, currency)] of seconds-unit rows
    warnings: list[str] = []
    cost_col = bs.focus_cost_column
    pending = PendingGceRows()
    waiting: list[tuple[int, str, tuple, float, float, float, object, object]] = []  # a pending group's sums
    excluded_in: dict[int, int] = {}
    currencies_in: dict[int, list[str]] = {}

    def add(k: tuple[str, str], cost: float, hours: float, max_hours: float, rid, period) -> None:
        s = sums.setdefault(k, [0.0, 0.0])
        s[0] += cost
        if rid is None and period is None:
            s[1] += hours
        else:  # counted once per instance and charge period: the longest row's hours (focus.instance_hours)
            best = secs.setdefault((rid, period), [-1.0, k])
            if max_hours > best[0]:
                best[0], best[1] = max_hours, k

    sources = local_copies(files, (*FOCUS_READ, cost_col, *([FOCUS_KEY[by]] if by in FOCUS_KEY else [])))
    for index, src in enumerate(sources):
        names, table = _focus_columns(con, src)
        check_columns(list(names), src.name, cost_col)
        try:
            where = _usage_values(con, table, set(names)) if table.startswith("read_parquet") else ""
            if where is None:
                continue
            sql, group = _focus_sql(table, names, start, end, bs, by, where)
            cur = con.execute(sql)
            cols = [d[0] for d in cur.description]
            got = cur.fetchall()
        except Exception as exc:  # duckdb.Error
            text = _error_text(exc)
            if "unicode" in text.lower() or "utf-8" in text.lower() or "utf8" in text.lower():
                from ...config import not_utf8_error

                if not src.name.lower().endswith(".gz"):
                    raise BillingDataError(str(not_utf8_error(src.path))) from None
                raise BillingDataError(f"{src.name}: not UTF-8 text") from None
            raise BillingDataError(f"{src.name}: cannot read FOCUS file: {text}") from None
        bad = {"bad_cost": 0, "bad_qty": 0, "bad_date": 0}
        excluded, currencies = 0, []
        at = {c: i for i, c in enumerate(cols)}
        # The group's values instance_type() reads (the texts and Tags, not the key: a GPU type is named by many
        # instances' rows alike), and what each distinct set of them named, worked out once: at 5 M rows the
        # groups are ~45,000 and their texts a few hundred (bench/bench_focus.py).
        judged = [at[c] for c in group if c in FOCUS_TEXT or c == "Tags"]
        named: dict[tuple, str] = {}
        i_cost, i_currency, i_hours, i_max = at["cost"], at["currency_"], at["hours"], at["max_hours"]
        i_excluded, i_rid, i_period = at["excluded"], at["secs_rid_"], at["secs_period_"]
        i_gce, i_in = at["gce_rid_"], at["n_in_"]
        pending_bad = False
        for row in got:
            try:
                seen: tuple | None = tuple(row[i] for i in judged)
                itype = named.get(seen)
            except TypeError:  # a value DuckDB hands as a dict or a list (a MAP, a STRUCT): judged row by row
                seen, itype = None, None
            g = None
            if itype is None:
                g = {c: row[at[c]] for c in group}
                itype = rules.instance_type(g)
                if seen is not None:
                    named[seen] = itype
            gce_rid = row[i_gce]
            if not itype:
                if gce_rid is None or not is_gce_vm(gce_rid):
                    continue
                g = g if g is not None else {c: row[at[c]] for c in group}
                itype = rules.machine_type(g)
                if GPU_SKU.search(str(g.get("ChargeDescription") or "")) is None:  # an N1 VM's vCPU, RAM: pending
                    pending_bad = pending_bad or any(row[at[b]] for b in bad)
                    pending.note_excluded(index, gce_rid, row[i_excluded])
                    if row[i_cost] is not None:
                        currency = "" if row[i_currency] is None else str(row[i_currency])
                        waiting.append((index, gce_rid, (rules.key(g, itype), currency), row[i_cost], row[i_hours],
                                        row[i_max], row[i_rid], row[i_period]))
                    continue
                if row[i_in]:  # a GPU's own SKU: the VM is a GPU VM
                    pending.billed_gpu.add(gce_rid)
            for b in bad:
                bad[b] += row[at[b]]
            excluded += row[i_excluded]
            if row[i_cost] is None:
                continue
            currency = "" if row[i_currency] is None else str(row[i_currency])
            currencies.append(currency)
            k = (rules.key(g if g is not None else {c: row[at[c]] for c in group}, itype), currency)
            add(k, row[i_cost], row[i_hours], row[i_max], row[i_rid], row[i_period])
        for order, (b, col) in enumerate((("bad_cost", cost_col), ("bad_qty", "ConsumedQuantity"),
                                          ("bad_date", "ChargePeriodStart"))):
            if bad[b]:
                _raise_bad_value(con, src, table, set(names), col, rules, b == "bad_date")
            if pending_bad:
                _note_pending_bad(con, src, table, set(names), col, rules, b == "bad_date", pending, index, order)
        mixed_currencies(currencies, src.name, "BillingCurrency")
        excluded_in[index], currencies_in[index] = excluded, currencies
    # The pending groups of VMs billed a GPU SKU anywhere in the export are theirs.
    pending.raise_first_bad()
    for index, rid, k, cost, hours, max_hours, secs_rid, period in waiting:
        if pending.counts(rid):
            currencies_in[index].append(k[1])
            add(k, cost, hours, max_hours, secs_rid, period)
    for index, src in enumerate(files):
        if index not in excluded_in:
            continue
        if pending.billed_gpu:
            mixed_currencies(currencies_in[index], src.name, "BillingCurrency")
        n = excluded_in[index] + pending.excluded_of(index)
        if n:
            warnings.append(f"{src.name}: {n} GPU row(s) excluded: column '{cost_col}' missing, negative or "
                            f"above {bs.max_line_cost:g}, or ConsumedQuantity negative or above {FOCUS_MAX_HOURS:g} h")
    for hours, k in secs.values():
        sums[k][1] += hours
    return _finish(sums, warnings, [s.name for s in files], None, path, start, end)


def _bad_rows(con, table: str, names: dict[str, str], col: str, date: bool) -> list[tuple[int, object, dict]]:
    """(data row from 0, value, the row's texts, Tags and ResourceId) of each usage row whose `col` is not a number
    (or a date), in file order: read only on that path."""
    cast = "TIMESTAMPTZ" if date else "DOUBLE"
    group = [c for c in (*FOCUS_TEXT, "Tags", "ResourceId") if c in names]
    con.execute("SET threads=1")  # row_number() in file order
    try:
        rows = con.execute(f"""
          SELECT rn, {_ident(col)}, {', '.join(_ident(c) for c in group)} FROM (
            SELECT row_number() OVER () - 1 AS rn, * FROM {table})
          WHERE {_usage_sql(names)}
            AND TRY_CAST({_ident(col)} AS {cast}) IS NULL AND {_ident(col)} IS NOT NULL
          ORDER BY rn""").fetchall()
    finally:
        con.execute("RESET threads")
    return [(rn, value, dict(zip(group, text))) for rn, value, *text in rows]


def _raise_bad_value(con, src: ParquetSource, table: str, names: dict[str, str], col: str, rules: _FocusRules,
                     date: bool) -> None:
    """The error naming the first GPU row (a GPU machine type's, or a GCE VM's GPU SKU row) whose `col` is not a
    number (or a date)."""
    from .focus_rules import bad_value_message, bills_a_gpu

    for rn, value, g in _bad_rows(con, table, names, col, date):
        if rules.instance_type(g) or bills_a_gpu(g.get("ResourceId"), g.get("ChargeDescription")):
            raise BillingDataError(bad_value_message(src.name, col, rn + 2, value, date))


def _note_pending_bad(con, src: ParquetSource, table: str, names: dict[str, str], col: str, rules: _FocusRules,
                      date: bool, pending, index: int, order: int) -> None:
    """Each bad `col` value of a GCE VM's row that names no GPU, noted in `pending`: an error once its VM is known
    to be billed a GPU SKU."""
    from .focus_rules import bad_value_message, bills_a_gpu, is_gce_vm

    for rn, value, g in _bad_rows(con, table, names, col, date):
        rid = g.get("ResourceId")
        if is_gce_vm(rid) and not rules.instance_type(g) and not bills_a_gpu(rid, g.get("ChargeDescription")):
            pending.note_bad(index, order, rn + 2, str(rid), bad_value_message(src.name, col, rn + 2, value, date))


# --------------------------------------------------------------------------- the entry point


def file_totals(settings, start: datetime, end: datetime, by: str, source: str | None = None,
                path: str | None = None) -> TotalRows | None:
    """The totals of CUR or FOCUS files (local, or on S3 through s3fetch) on DuckDB; None when the source is
    another (Cost Explorer, Athena): the caller then takes the table path (load.load_cost_totals)."""
    import logging

    from .s3fetch import s3_client_for
    from .settings import billing_settings

    bs = billing_settings(settings)
    source, path = source or bs.source, path or bs.path
    if source not in ("cur", "focus") or not path:
        return None
    s3 = s3_client_for(settings, path)
    if source == "focus":
        r = focus_total_rows(focus_files(path, s3), path, start, end, bs, by)
    else:
        families = tuple(bs.gpu_families or settings.aws.gpu_families)
        r = cur_total_rows(cur_files(path, s3), path, start, end, families, by, bs.tag_keys, bs.max_line_cost)
    r.source = source
    for w in r.warnings:
        logging.getLogger(__name__).warning("%s", w)
    return r


def cur_files(path: str, s3=None) -> list[ParquetSource]:
    """The Parquet files of a CUR path: a file, a folder, a glob or an s3:// prefix (`s3`: an
    s3fetch.S3Client)."""
    return _files(path, s3, (".parquet",), ".parquet")


def focus_files(path: str, s3=None) -> list[ParquetSource]:
    """The FOCUS files of a path: a file, a folder, a glob or an s3:// prefix (`s3`: an s3fetch.S3Client)."""
    from .focus_rules import FILE_SUFFIXES

    return _files(path, s3, FILE_SUFFIXES, "FOCUS (.csv, .csv.gz, .parquet)")


def _files(path: str, s3, suffixes: Sequence[str], kind: str) -> list[ParquetSource]:
    if path.startswith("s3://"):
        from .s3fetch import list_objects

        if s3 is None:
            raise BillingDataError(f"{path}: an S3 client is needed to read s3:// paths")
        return list_objects(path, s3, suffixes, kind)
    from .sources import list_files

    return list_files(path, None, suffixes, kind)
