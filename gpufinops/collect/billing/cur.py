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

import logging
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .schema import COLUMNS, BillingDataError, canonical_tags, conform, empty_table, single_currency
from .settings import TagKeys

log = logging.getLogger(__name__)

USAGE_TYPE = "line_item_usage_type"
LINE_TYPE = "line_item_line_item_type"
START = "line_item_usage_start_date"
REQUIRED = (
    USAGE_TYPE, LINE_TYPE, START, "line_item_resource_id", "line_item_usage_account_id",
    "line_item_unblended_cost", "line_item_usage_amount", "line_item_currency_code",
)
# Absent columns read as null; the cost of RI/SP lines falls back to unblended with a warning.
OPTIONAL = ("identity_line_item_id", "product_region_code", "resource_tags", "reservation_effective_cost", "savings_plan_savings_plan_effective_cost")
COST_COLUMNS = ("line_item_unblended_cost", "reservation_effective_cost", "savings_plan_savings_plan_effective_cost", "line_item_usage_amount")
STRING_COLUMNS = (USAGE_TYPE, LINE_TYPE, "line_item_resource_id", "line_item_usage_account_id",
                  "line_item_currency_code", "identity_line_item_id", "product_region_code")
USAGE_LINE_TYPES = ("Usage", "DiscountedUsage", "SavingsPlanCoveredUsage")
# One line item's usage hours above this are not a measurement (inf, a 9.2e18 sentinel).
MAX_LINE_HOURS = 1e9
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
        if c not in schema.names and c not in ("product_region_code", "identity_line_item_id"):
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


_PRICING = pa.array(["on-demand", "spot", "reserved", "savings-plan"], pa.string())
_SEP_KV, _SEP_ITEM = "\x1f", "\x1e"
# Strings read straight as Parquet dictionaries: grouping then hashes small integers.
_DICT_COLUMNS = [USAGE_TYPE, LINE_TYPE, "line_item_resource_id", "line_item_usage_account_id",
                 "line_item_currency_code", "product_region_code"]


def _as_dictionary(col: pa.ChunkedArray) -> pa.DictionaryArray:
    col = col.unify_dictionaries() if pa.types.is_dictionary(col.type) else col
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    return arr


def _gpu_rows(head: pa.Table, gpu_re: re.Pattern) -> tuple[pa.Array, pa.Array, pa.Array] | None:
    """Mask of the GPU usage rows; instance type and pricing model of the kept rows.

    All string work happens on the dictionaries (a few hundred distinct usage
    types); rows only see integer lookups.
    """
    ut = _as_dictionary(head.column(USAGE_TYPE))
    lt = _as_dictionary(head.column(LINE_TYPE))
    ut_values = ut.dictionary.to_pylist()
    lt_values = lt.dictionary.to_pylist()
    is_gpu = np.array([v is not None and bool(gpu_re.search(v)) for v in ut_values] + [False])
    if not is_gpu.any():
        return None
    # Line type -> pricing code (0 = decided by the usage type), -1 = not usage.
    lt_code = np.array([{"Usage": 0, "DiscountedUsage": 2, "SavingsPlanCoveredUsage": 3}.get(v, -1)
                        for v in lt_values] + [-1], dtype=np.int8)
    ut_idx = ut.indices.fill_null(len(ut_values)).to_numpy(zero_copy_only=False)
    lt_idx = lt.indices.fill_null(len(lt_values)).to_numpy(zero_copy_only=False)
    mask = is_gpu[ut_idx] & (lt_code[lt_idx] >= 0)
    if not mask.any():
        return None
    ut_kept, lt_kept = ut_idx[mask], lt_idx[mask]
    itypes = [m.group(1) if v and (m := re.search(INSTANCE_TYPE_PATTERN, v)) else "" for v in ut_values]
    instance_type = pa.DictionaryArray.from_arrays(pa.array(ut_kept.astype(np.int32)), pa.array(itypes + [""], pa.string()))
    spot = np.array([v is not None and "SpotUsage:" in v for v in ut_values] + [False], dtype=np.int8)
    code = lt_code[lt_kept]
    code = np.where(code > 0, code, spot[ut_kept])
    pricing = pa.DictionaryArray.from_arrays(pa.array(code.astype(np.int8)), _PRICING)
    return pa.array(mask), instance_type, pricing


def _read_file(name: str, source, gpu_re: re.Pattern) -> Iterator[tuple[pa.Table, int, list[str]]]:
    """The GPU usage rows of one file, one row group at a time (with its row count)."""
    try:
        handle = source.open() if isinstance(source, _S3Object) else source
        pf = pq.ParquetFile(handle, read_dictionary=_DICT_COLUMNS)
    except (pa.ArrowException, OSError) as exc:
        raise BillingDataError(f"{name}: not a readable Parquet file (truncated or not Parquet?): {exc}") from None
    schema = pf.schema_arrow
    warnings = _check_schema(name, schema)
    other = [c for c in (*REQUIRED, *OPTIONAL) if c in schema.names and c not in (USAGE_TYPE, LINE_TYPE)]
    for i in range(pf.num_row_groups):
        try:
            head = pf.read_row_group(i, columns=[USAGE_TYPE, LINE_TYPE])
            found = _gpu_rows(head, gpu_re)
            if found is None:
                yield pa.table({}), head.num_rows, warnings
                continue
            mask, itype, pricing = found
            rest = pf.read_row_group(i, columns=other).filter(mask)
        except (pa.ArrowException, OSError) as exc:
            raise BillingDataError(f"{name}: row group {i} unreadable (truncated file?): {exc}") from None
        rest = rest.append_column("instance_type", itype).append_column("pricing_model", pricing)
        yield rest, head.num_rows, warnings
        warnings = []


def _num(t: pa.Table, col: str) -> pa.Array:
    if col not in t.column_names or pa.types.is_null(t.schema.field(col).type):
        return pa.nulls(t.num_rows, pa.float64())
    return pc.cast(t.column(col), pa.float64())


def _key(t: pa.Table, col: str) -> pa.Array:
    """A string key column as a dictionary with '' for null (CUR leaves many blank)."""
    if col not in t.column_names or pa.types.is_null(t.schema.field(col).type):
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(t.num_rows, np.int32)), pa.array([""]))
    arr = _as_dictionary(t.column(col))
    if arr.null_count:
        values = pa.concat_arrays([arr.dictionary.cast(pa.string()), pa.array([""])])
        arr = pa.DictionaryArray.from_arrays(arr.indices.fill_null(len(values) - 1), values)
    return arr


def _tag_keys(t: pa.Table) -> pa.DictionaryArray:
    """Each row's tags flattened to one string (k\\x1fv\\x1e...), dictionary-encoded.

    Rows share a handful of tag sets, so JSON and the team/project/owner lookup
    are done once per distinct set, after aggregation.
    """
    n = t.num_rows
    if "resource_tags" not in t.column_names or not pa.types.is_map(t.schema.field("resource_tags").type):
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([""]))
    maps = t.column("resource_tags").combine_chunks()
    if maps.offset or (len(maps.offsets) and maps.offsets[0].as_py() != 0):
        maps = pc.take(maps, pa.array(np.arange(n)))  # fresh offsets starting at 0
    kv = pc.binary_join_element_wise(maps.keys, pc.fill_null(maps.items, ""), _SEP_KV)
    lists = pa.ListArray.from_arrays(maps.offsets, kv, mask=maps.is_null())
    return pc.dictionary_encode(pc.fill_null(pc.binary_join(lists, _SEP_ITEM), ""))


def _normalise(name: str, t: pa.Table, start: datetime, end: datetime, max_line_cost: float,
               counts: dict[str, int]) -> pa.Table:
    """One row group's GPU rows -> the flat key and value columns the aggregation groups on."""
    ts = t.column(START)
    tz = getattr(ts.type, "tz", None)
    lo = pa.scalar(start if tz else start.replace(tzinfo=None), ts.type)
    hi = pa.scalar(end if tz else end.replace(tzinfo=None), ts.type)
    t = t.filter(pc.fill_null(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)), False))
    if not t.num_rows:
        return t
    code = t.column("pricing_model").combine_chunks().indices
    cost = pc.if_else(pc.equal(code, 2), _num(t, "reservation_effective_cost"),
                      pc.if_else(pc.equal(code, 3), _num(t, "savings_plan_savings_plan_effective_cost"),
                                 _num(t, "line_item_unblended_cost")))
    usage = _num(t, "line_item_usage_amount")
    # nan compares false and inf is above any bound, so neither survives as a cost or a usage.
    ok = pc.fill_null(pc.and_(pc.and_(pc.greater_equal(cost, 0.0), pc.less_equal(cost, max_line_cost)),
                              pc.and_(pc.greater_equal(usage, 0.0), pc.less_equal(usage, MAX_LINE_HOURS))), False)
    bad = t.num_rows - pc.sum(pc.cast(ok, pa.int64())).as_py()
    if bad:
        counts["bad"] = counts.get("bad", 0) + bad
        if "identity_line_item_id" in t.column_names:
            counts.setdefault("first", pc.filter(t.column("identity_line_item_id"), pc.invert(ok))[0].as_py())
        t, cost, usage = t.filter(ok), pc.filter(cost, ok), pc.filter(usage, ok)
    return pa.table({
        "date": pc.cast(t.column(START), pa.date32()),
        "account": _key(t, "line_item_usage_account_id"),
        "region": _key(t, "product_region_code"),
        "resource_id": _key(t, "line_item_resource_id"),
        "instance_type": t.column("instance_type"),
        "pricing_model": t.column("pricing_model"),
        "currency": _key(t, "line_item_currency_code"),
        "tags_key": _tag_keys(t),
        "cost": cost,
        "usage_hours": usage,
    })


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
    partials: list[pa.Table] = []
    files = list_parquet(path, s3_client)
    rows_read = 0
    for name, source in files:
        counts: dict[str, int] = {}
        for piece, n, file_warnings in _read_file(name, source, gpu_re):
            warnings.extend(file_warnings)
            rows_read += n
            if piece.num_rows:
                try:
                    rows = _normalise(name, piece, start, end, max_line_cost, counts)
                except pa.ArrowException as exc:  # a value the schema check let through (e.g. an odd date type)
                    raise BillingDataError(f"{name}: cannot read the GPU line items: {exc}") from None
                if rows.num_rows:
                    # Aggregate each row group at once: memory stays at one group + the sums.
                    partials.append(_sum(rows))
        if counts.get("bad"):
            warnings.append(
                f"{name}: {counts['bad']} GPU line item(s) excluded: cost (line_item_unblended_cost, or "
                f"reservation_effective_cost / savings_plan_savings_plan_effective_cost for RI / SP lines) "
                f"missing, negative or above {max_line_cost:g}, or line_item_usage_amount negative or above "
                f"{MAX_LINE_HOURS:g}"
                + (f" (first: identity_line_item_id={counts['first']})" if "first" in counts else ""))
    for w in warnings:
        log.warning("%s", w)
    if not partials:
        warnings.append(f"{path}: no GPU instance usage between {start:%Y-%m-%d} and {end:%Y-%m-%d}")
        return CurResult(empty_table(), warnings, [n for n, _ in files], rows_read)
    table = _finish(_sum(pa.concat_tables(partials).unify_dictionaries()), tag_keys, "cur")
    single_currency(table, path)
    return CurResult(table, warnings, [n for n, _ in files], rows_read)


_KEYS = ["date", "account", "region", "resource_id", "instance_type", "pricing_model", "currency", "tags_key"]


def _sum(rows: pa.Table) -> pa.Table:
    rows = rows.unify_dictionaries()
    out = rows.group_by(_KEYS, use_threads=True).aggregate([("cost", "sum"), ("usage_hours", "sum")])
    return out.rename_columns([{"cost_sum": "cost", "usage_hours_sum": "usage_hours"}.get(c, c) for c in out.column_names])


def _tag_lookup(tags: dict[str, str], keys: Sequence[str]) -> str:
    for k in keys:
        if tags.get(k):
            return tags[k]
    return ""


def _finish(agg: pa.Table, tag_keys: TagKeys, source: str, provider: str = "aws") -> pd.DataFrame:
    """Aggregated rows with raw tag keys -> the cost table (tags as JSON, team/project/owner)."""
    # Dictionaries may repeat a value (two usage types, one instance type): decode first.
    agg = pa.table({c: pc.cast(agg.column(c), agg.schema.field(c).type.value_type)
                    if pa.types.is_dictionary(agg.schema.field(c).type) else agg.column(c) for c in agg.column_names})
    df = agg.to_pandas()
    parsed: dict[str, tuple[str, str, str, str]] = {}
    for flat in pd.unique(df["tags_key"]):
        pairs = dict(p.split(_SEP_KV, 1) for p in flat.split(_SEP_ITEM)) if flat else {}
        parsed[flat] = (canonical_tags(pairs), _tag_lookup(pairs, tag_keys.team),
                        _tag_lookup(pairs, tag_keys.project), _tag_lookup(pairs, tag_keys.owner))
    cols = list(zip(*[parsed[f] for f in df["tags_key"]])) if len(df) else [[], [], [], []]
    df["tags"], df["team"], df["project"], df["owner"] = (list(c) for c in cols)
    df = df.drop(columns=["tags_key"])
    df["provider"] = provider
    df["source"] = source
    df["date"] = pd.to_datetime(df["date"])
    return collapse(conform(df))


def collapse(df: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct key (the same tags written in another key order merge here)."""
    keys = [c for c in COLUMNS if c not in ("cost", "usage_hours")]
    out = df.groupby(keys, sort=False, dropna=False, observed=True)[["cost", "usage_hours"]].sum().reset_index()
    return sort_table(conform(out[list(COLUMNS)]))


def sort_table(df: pd.DataFrame) -> pd.DataFrame:
    keys = ["date", "account", "region", "resource_id", "instance_type", "pricing_model", "team", "project", "owner", "tags"]
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
    json_format, json_extract_scalar. DuckDB runs it with three macros
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
  WHERE cost >= 0 AND cost <= {float(max_line_cost)!r} AND usage_hours >= 0 AND usage_hours <= {MAX_LINE_HOURS!r}
)
SELECT
  CAST(usage_date AS VARCHAR) AS date, account, region, resource_id, instance_type, pricing_model,
  team, project, owner, currency,
  tags_json AS tags, SUM(cost) AS cost, SUM(usage_hours) AS usage_hours
FROM valid
GROUP BY usage_date, account, region, resource_id, instance_type, pricing_model, team, project, owner, currency, tags_json
ORDER BY usage_date, account, region, resource_id, instance_type, pricing_model, team, project, owner
"""


def table_from_sql_rows(records: Iterable[dict], source: str, where: str = "query result") -> pd.DataFrame:
    """Rows of cur_sql() (dicts of strings, as Athena returns them, or values) -> the cost table."""
    rows = list(records)
    if not rows:
        return empty_table()
    df = pd.DataFrame(rows)
    missing = [c for c in (*GROUP_KEYS, "cost", "usage_hours", "tags") if c not in df.columns]
    if missing:
        raise BillingDataError(f"{where}: lacks columns {missing}")
    df["tags"] = [canonical_tags(t) for t in df["tags"]]
    df["provider"] = "aws"
    df["source"] = source
    for c in ("cost", "usage_hours"):
        num = pd.to_numeric(df[c], errors="coerce")
        bad = num.isna()
        if bad.any():
            raise BillingDataError(f"{where}: column '{c}' is not a number in row {int(bad.idxmax()) + 1} "
                                   f"({df.loc[bad.idxmax(), c]!r})")
        df[c] = num
    return collapse(conform(df))
