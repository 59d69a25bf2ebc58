"""AWS CUR 2.0 (Data Exports) Parquet -> the cost table, with pyarrow; and the same as SQL.

GPU instance-hours are the line items whose `line_item_usage_type` is
`[REGION-]BoxUsage:<type>` or `[REGION-]SpotUsage:<type>` with <type> in a GPU
family, and whose `line_item_line_item_type` is Usage, DiscountedUsage (a
reservation covered it) or SavingsPlanCoveredUsage. The cost of a line is its
effective cost: `reservation_effective_cost` for DiscountedUsage,
`savings_plan_savings_plan_effective_cost` for SavingsPlanCoveredUsage,
`line_item_unblended_cost` otherwise.

Reading is done one row group at a time: the two filter columns first (read as
Parquet dictionaries, so the regex runs over the few distinct usage types,
not over millions of rows), then the remaining columns of the matching rows
only. Memory stays near one row group plus the GPU rows kept.

`cur_sql()` is the same selection and aggregation as one SQL statement
(Presto/Trino dialect, run by Athena); tests run that exact text on DuckDB over
the same Parquet and compare the two tables.
"""

from __future__ import annotations

import io
import json
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .schema import BillingDataError, canonical_tags, conform, empty_table, single_currency
from .settings import TagKeys

log = logging.getLogger(__name__)

USAGE_TYPE = "line_item_usage_type"
LINE_TYPE = "line_item_line_item_type"
START = "line_item_usage_start_date"
REQUIRED = (
    USAGE_TYPE, LINE_TYPE, START, "line_item_resource_id", "line_item_usage_account_id",
    "line_item_unblended_cost", "line_item_usage_amount", "line_item_currency_code", "identity_line_item_id",
)
# Absent columns read as null; the cost of RI/SP lines falls back to unblended with a warning.
OPTIONAL = ("product_region_code", "resource_tags", "reservation_effective_cost", "savings_plan_savings_plan_effective_cost")
COST_COLUMNS = ("line_item_unblended_cost", "reservation_effective_cost", "savings_plan_savings_plan_effective_cost", "line_item_usage_amount")
STRING_COLUMNS = (USAGE_TYPE, LINE_TYPE, "line_item_resource_id", "line_item_usage_account_id",
                  "line_item_currency_code", "identity_line_item_id", "product_region_code")
USAGE_LINE_TYPES = ("Usage", "DiscountedUsage", "SavingsPlanCoveredUsage")
GROUP_KEYS = ("date", "account", "region", "resource_id", "instance_type", "pricing_model",
              "team", "project", "owner", "currency")


def gpu_usage_pattern(families: Sequence[str]) -> str:
    """The usage-type regex, shared verbatim by the pyarrow path and the SQL."""
    fams = "|".join(sorted(set(families), key=lambda f: (-len(f), f)))
    return rf"(^|-)(BoxUsage|SpotUsage):({fams})\.[A-Za-z0-9]+$"


INSTANCE_TYPE_PATTERN = r":([a-z0-9-]+\.[A-Za-z0-9]+)$"


@dataclass
class CurResult:
    table: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    rows_read: int = 0


# --------------------------------------------------------------------------- sources


def list_parquet(path: str, s3_client=None) -> list[tuple[str, object]]:
    """(display name, pyarrow-readable source) for a file, a folder or an s3:// prefix."""
    if path.startswith("s3://"):
        if s3_client is None:
            raise BillingDataError(f"{path}: an S3 client is needed to read s3:// paths")
        bucket, _, prefix = path[5:].partition("/")
        keys: list[str] = []
        for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(".parquet"))
        if not keys:
            raise BillingDataError(f"{path}: no .parquet objects under this prefix")
        return [(f"s3://{bucket}/{k}", _S3Object(s3_client, bucket, k)) for k in sorted(keys)]
    p = Path(path)
    if p.is_dir():
        files = sorted(p.rglob("*.parquet"))
        if not files:
            raise BillingDataError(f"{path}: no .parquet files in this folder")
        return [(str(f), str(f)) for f in files]
    if not p.exists():
        raise BillingDataError(f"{path}: no such file")
    return [(str(p), str(p))]


@dataclass(frozen=True)
class _S3Object:
    client: object
    bucket: str
    key: str

    def open(self) -> pa.BufferReader:
        body = self.client.get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
        return pa.BufferReader(body)


# --------------------------------------------------------------------------- schema checks


def _check_schema(name: str, schema: pa.Schema) -> list[str]:
    """Raise on a missing required column or a wrong type; return warnings."""
    warnings = []
    missing = [c for c in REQUIRED if c not in schema.names]
    if missing:
        raise BillingDataError(f"{name}: missing CUR 2.0 column(s) {missing}")
    for c in OPTIONAL:
        if c not in schema.names and c != "product_region_code":
            warnings.append(f"{name}: column '{c}' absent; read as empty")

    def typ(c):
        t = schema.field(c).type
        return t.value_type if pa.types.is_dictionary(t) else t

    if not (pa.types.is_timestamp(typ(START)) or pa.types.is_date(typ(START))):
        raise BillingDataError(f"{name}: column '{START}' has type {typ(START)}, expected a timestamp")
    for c in COST_COLUMNS:
        if c in schema.names:
            t = typ(c)
            if not (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_null(t)):
                raise BillingDataError(f"{name}: column '{c}' has type {t}, expected a number")
    for c in STRING_COLUMNS:
        if c in schema.names:
            t = typ(c)
            if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)):
                raise BillingDataError(f"{name}: column '{c}' has type {t}, expected a string")
    if "resource_tags" in schema.names:
        t = schema.field("resource_tags").type
        if not (pa.types.is_map(t) or pa.types.is_null(t)):
            raise BillingDataError(f"{name}: column 'resource_tags' has type {t}, expected map<string,string>")
    return warnings


# --------------------------------------------------------------------------- reading


def _dict_flags(values: list, fn) -> pa.Array:
    return pa.array([fn(v) if v is not None else None for v in values])


def _as_dictionary(col: pa.ChunkedArray) -> pa.DictionaryArray:
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    return arr


def _gpu_rows(
    head: pa.Table, gpu_re: re.Pattern
) -> tuple[pa.Array, pa.Array, pa.Array] | None:
    """Mask of GPU usage rows, plus their instance type and pricing model (full length)."""
    head = head.unify_dictionaries()
    ut = _as_dictionary(head.column(USAGE_TYPE))
    lt = _as_dictionary(head.column(LINE_TYPE))
    ut_values = ut.dictionary.to_pylist()
    lt_values = lt.dictionary.to_pylist()
    is_gpu = _dict_flags(ut_values, lambda v: bool(gpu_re.search(v)))
    if not any(x for x in is_gpu.to_pylist() if x):
        return None
    is_usage = _dict_flags(lt_values, lambda v: v in USAGE_LINE_TYPES)
    mask = pc.and_kleene(pc.take(is_gpu, ut.indices), pc.take(is_usage, lt.indices))
    mask = pc.fill_null(mask, False)
    if not pc.any(mask).as_py():
        return None
    ut_idx = pc.filter(ut.indices, mask)
    lt_idx = pc.filter(lt.indices, mask)
    itype = pc.take(_dict_flags(ut_values, lambda v: m.group(1) if (m := re.search(INSTANCE_TYPE_PATTERN, v)) else ""), ut_idx)
    spot = pc.take(_dict_flags(ut_values, lambda v: "SpotUsage:" in v), ut_idx)
    kind = pc.take(pa.array(lt_values, pa.string()), lt_idx)
    pricing = pc.if_else(
        pc.equal(kind, "DiscountedUsage"), "reserved",
        pc.if_else(pc.equal(kind, "SavingsPlanCoveredUsage"), "savings-plan",
                   pc.if_else(spot, "spot", "on-demand")),
    )
    return mask, itype, pricing


def _read_file(name: str, source, gpu_re: re.Pattern, warnings: list[str]) -> Iterator[tuple[pa.Table, int]]:
    """The GPU usage rows of one file, a row group at a time (with that group's row count)."""
    try:
        handle = source.open() if isinstance(source, _S3Object) else source
        pf = pq.ParquetFile(handle, read_dictionary=[USAGE_TYPE, LINE_TYPE])
    except (pa.ArrowInvalid, OSError) as exc:
        raise BillingDataError(f"{name}: not a readable Parquet file (truncated or not Parquet?): {exc}") from None
    schema = pf.schema_arrow
    warnings.extend(_check_schema(name, schema))
    other = [c for c in (*REQUIRED, *OPTIONAL) if c in schema.names and c not in (USAGE_TYPE, LINE_TYPE)]
    for i in range(pf.num_row_groups):
        try:
            head = pf.read_row_group(i, columns=[USAGE_TYPE, LINE_TYPE])
            found = _gpu_rows(head, gpu_re)
            if found is None:
                yield pa.table({}), head.num_rows
                continue
            mask, itype, pricing = found
            rest = pf.read_row_group(i, columns=other).filter(mask)
        except (pa.ArrowInvalid, OSError) as exc:
            raise BillingDataError(f"{name}: row group {i} unreadable (truncated file?): {exc}") from None
        rest = rest.append_column("instance_type", itype).append_column("pricing_model", pricing)
        yield rest, head.num_rows


def _num(t: pa.Table, col: str) -> pa.Array:
    if col not in t.column_names:
        return pa.nulls(t.num_rows, pa.float64())
    return pc.cast(t.column(col), pa.float64())


def _str(t: pa.Table, col: str) -> pa.ChunkedArray | pa.Array:
    if col not in t.column_names:
        return pa.array([""] * t.num_rows, pa.string())
    return pc.fill_null(pc.cast(t.column(col), pa.string()), "")


def _tag(tags: pa.ChunkedArray | None, keys: Sequence[str], n: int) -> pa.Array:
    if tags is None:
        return pa.array([""] * n, pa.string())
    found = None
    for k in keys:
        v = pc.map_lookup(tags, pa.scalar(k), "first")
        v = pc.if_else(pc.equal(v, ""), pa.scalar(None, pa.string()), v)
        found = v if found is None else pc.coalesce(found, v)
    return pc.fill_null(found, "")


def read_cur(
    path: str,
    start: datetime,
    end: datetime,
    families: Sequence[str],
    tag_keys: TagKeys = TagKeys(),
    max_line_cost: float = 100_000.0,
    s3_client=None,
) -> CurResult:
    """GPU instance cost per resource per day for usage starting in [start, end)."""
    gpu_re = re.compile(gpu_usage_pattern(families))
    warnings: list[str] = []
    pieces: list[pa.Table] = []
    files = list_parquet(path, s3_client)
    rows_read = 0
    for name, source in files:
        file_pieces = []
        for piece, n in _read_file(name, source, gpu_re, warnings):
            rows_read += n
            if piece.num_rows:
                file_pieces.append(piece)
        if file_pieces:
            t = pa.concat_tables(file_pieces, promote_options="permissive")
            pieces.append(_normalise(name, t, start, end, tag_keys, max_line_cost, warnings))
    pieces = [p for p in pieces if p.num_rows]
    if not pieces:
        warnings.append(f"{path}: no GPU instance usage between {start:%Y-%m-%d} and {end:%Y-%m-%d}")
        return CurResult(empty_table(), warnings, [n for n, _ in files], rows_read)
    rows = pa.concat_tables(pieces)
    table = aggregate(rows)
    single_currency(table, path)
    for w in warnings:
        log.warning("%s", w)
    return CurResult(table, warnings, [n for n, _ in files], rows_read)


def _normalise(name: str, t: pa.Table, start: datetime, end: datetime, tag_keys: TagKeys,
               max_line_cost: float, warnings: list[str]) -> pa.Table:
    """One file's GPU rows -> the flat columns the aggregation groups on."""
    ts = t.column(START)
    if pa.types.is_timestamp(ts.type) and ts.type.tz is None:
        lo, hi = pa.scalar(start.replace(tzinfo=None), ts.type), pa.scalar(end.replace(tzinfo=None), ts.type)
    else:
        lo, hi = pa.scalar(start, ts.type), pa.scalar(end, ts.type)
    in_month = pc.fill_null(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)), False)
    t = t.filter(in_month)
    if not t.num_rows:
        return t
    kind_reserved = pc.equal(t.column("pricing_model"), "reserved")
    kind_sp = pc.equal(t.column("pricing_model"), "savings-plan")
    cost = pc.if_else(kind_reserved, _num(t, "reservation_effective_cost"),
                      pc.if_else(kind_sp, _num(t, "savings_plan_savings_plan_effective_cost"),
                                 _num(t, "line_item_unblended_cost")))
    usage = _num(t, "line_item_usage_amount")
    ok = pc.fill_null(pc.and_(pc.and_(pc.greater_equal(cost, 0.0), pc.less_equal(cost, max_line_cost)),
                              pc.greater_equal(usage, 0.0)), False)
    bad = t.num_rows - pc.sum(pc.cast(ok, pa.int64())).as_py()
    if bad:
        sample = t.filter(pc.invert(ok)).column("identity_line_item_id")[0].as_py()
        warnings.append(
            f"{name}: {bad} GPU line item(s) excluded: cost (line_item_unblended_cost or the RI/SP effective cost) "
            f"missing, negative or above {max_line_cost:g}, or negative line_item_usage_amount "
            f"(first: identity_line_item_id={sample})")
    t, cost, usage = t.filter(ok), pc.filter(cost, ok), pc.filter(usage, ok)
    tags = t.column("resource_tags") if "resource_tags" in t.column_names else None
    if tags is not None and pa.types.is_null(tags.type):
        tags = None
    n = t.num_rows
    cols = {
        "date": pc.cast(t.column(START), pa.date32()),
        "account": _str(t, "line_item_usage_account_id"),
        "region": _str(t, "product_region_code"),
        "resource_id": _str(t, "line_item_resource_id"),
        "instance_type": t.column("instance_type"),
        "pricing_model": t.column("pricing_model"),
        "team": _tag(tags, tag_keys.team, n),
        "project": _tag(tags, tag_keys.project, n),
        "owner": _tag(tags, tag_keys.owner, n),
        "currency": _str(t, "line_item_currency_code"),
        "cost": cost,
        "usage_hours": usage,
        "line_item_id": _str(t, "identity_line_item_id"),
        "resource_tags": tags if tags is not None else pa.nulls(n, pa.map_(pa.string(), pa.string())),
    }
    return pa.table(cols)


def aggregate(rows: pa.Table) -> pd.DataFrame:
    """Sum cost and hours per GROUP_KEYS; tags are those of the group's smallest line item id."""
    agg = rows.group_by(list(GROUP_KEYS), use_threads=True).aggregate(
        [("cost", "sum"), ("usage_hours", "sum"), ("line_item_id", "min")])
    # Deterministic tags per group (the SQL's min_by(tags, line_item_id)).
    idx = pc.index_in(agg.column("line_item_id_min"), value_set=rows.column("line_item_id"))
    tags = pc.take(rows.column("resource_tags"), idx).to_pylist()
    df = agg.drop_columns(["line_item_id_min"]).to_pandas()
    df = df.rename(columns={"cost_sum": "cost", "usage_hours_sum": "usage_hours"})
    df["tags"] = [canonical_tags(t) for t in tags]
    df["provider"] = "aws"
    df["source"] = "cur"
    df["date"] = pd.to_datetime(df["date"])
    return sort_table(conform(df))


def sort_table(df: pd.DataFrame) -> pd.DataFrame:
    keys = ["date", "account", "region", "resource_id", "instance_type", "pricing_model", "team", "project", "owner"]
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- SQL


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _sql_tag(keys: Sequence[str]) -> str:
    parts = [f"NULLIF(json_extract_scalar(tags_json, '$.{k}'), '')" for k in keys]
    return f"COALESCE({', '.join(parts)}, '')"


def cur_sql(
    table_ref: str,
    start: datetime,
    end: datetime,
    families: Sequence[str],
    tag_keys: TagKeys = TagKeys(),
    max_line_cost: float = 100_000.0,
) -> str:
    """The read_cur() selection and aggregation as one Presto/Trino (Athena) statement.

    Only standard SQL plus Trino functions: regexp_like, regexp_extract,
    json_format, json_extract_scalar, min_by. DuckDB runs it with three macros
    (tests/test_billing_athena.py) for the local parity test.
    """
    pattern = gpu_usage_pattern(families)
    lo = start.strftime("%Y-%m-%d %H:%M:%S")
    hi = end.strftime("%Y-%m-%d %H:%M:%S")
    types = ", ".join(_sql_str(t) for t in USAGE_LINE_TYPES)
    return f"""WITH gpu AS (
  SELECT
    CAST(line_item_usage_start_date AS DATE) AS usage_date,
    COALESCE(line_item_usage_account_id, '') AS account,
    COALESCE(product_region_code, '') AS region,
    COALESCE(line_item_resource_id, '') AS resource_id,
    regexp_extract(line_item_usage_type, {_sql_str(INSTANCE_TYPE_PATTERN)}, 1) AS instance_type,
    CASE
      WHEN line_item_line_item_type = 'DiscountedUsage' THEN 'reserved'
      WHEN line_item_line_item_type = 'SavingsPlanCoveredUsage' THEN 'savings-plan'
      WHEN strpos(line_item_usage_type, 'SpotUsage:') > 0 THEN 'spot'
      ELSE 'on-demand'
    END AS pricing_model,
    CAST(CASE
      WHEN line_item_line_item_type = 'DiscountedUsage' THEN reservation_effective_cost
      WHEN line_item_line_item_type = 'SavingsPlanCoveredUsage' THEN savings_plan_savings_plan_effective_cost
      ELSE line_item_unblended_cost
    END AS DOUBLE) AS cost,
    CAST(line_item_usage_amount AS DOUBLE) AS usage_hours,
    COALESCE(line_item_currency_code, '') AS currency,
    COALESCE(identity_line_item_id, '') AS line_item_id,
    json_format(CAST(resource_tags AS JSON)) AS tags_json
  FROM {table_ref}
  WHERE line_item_usage_start_date >= TIMESTAMP '{lo}'
    AND line_item_usage_start_date < TIMESTAMP '{hi}'
    AND line_item_line_item_type IN ({types})
    AND regexp_like(line_item_usage_type, {_sql_str(pattern)})
),
valid AS (
  SELECT *,
    {_sql_tag(tag_keys.team)} AS team,
    {_sql_tag(tag_keys.project)} AS project,
    {_sql_tag(tag_keys.owner)} AS owner
  FROM gpu
  WHERE cost >= 0 AND cost <= {float(max_line_cost)!r} AND usage_hours >= 0
)
SELECT
  CAST(usage_date AS VARCHAR) AS date, account, region, resource_id, instance_type, pricing_model,
  team, project, owner, currency,
  SUM(cost) AS cost, SUM(usage_hours) AS usage_hours, min_by(tags_json, line_item_id) AS tags
FROM valid
GROUP BY usage_date, account, region, resource_id, instance_type, pricing_model, team, project, owner, currency
ORDER BY usage_date, account, region, resource_id, instance_type, pricing_model, team, project, owner
"""


def table_from_sql_rows(records: Iterable[dict], source: str) -> pd.DataFrame:
    """Rows of cur_sql() (as dicts of strings or values) -> the cost table."""
    rows = list(records)
    if not rows:
        return empty_table()
    df = pd.DataFrame(rows)
    missing = [c for c in (*GROUP_KEYS, "cost", "usage_hours", "tags") if c not in df.columns]
    if missing:
        raise BillingDataError(f"{source}: query result lacks columns {missing}")
    df["tags"] = [canonical_tags(t) for t in df["tags"]]
    df["provider"] = "aws"
    df["source"] = source
    for c in ("cost", "usage_hours"):
        df[c] = pd.to_numeric(df[c], errors="raise")
    return sort_table(conform(df))
