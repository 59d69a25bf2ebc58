"""AWS CUR 2.0 (Data Exports) Parquet -> the cost table or per-key totals, with pyarrow; and the same as SQL.

GPU instance-hours are the line items whose `line_item_usage_type` is
`[REGION-]BoxUsage:<type>` or `[REGION-]SpotUsage:<type>` with <type> in a GPU
family, and whose `line_item_line_item_type` is Usage, DiscountedUsage (a
reservation covered it) or SavingsPlanCoveredUsage. The cost of a line is its
effective cost: `reservation_effective_cost` for DiscountedUsage,
`savings_plan_savings_plan_effective_cost` for SavingsPlanCoveredUsage,
`line_item_unblended_cost` otherwise.

Two answers with the same selection, cost rule and exclusions:
- `read_cur()`: the cost table (per resource, day, pricing model and tag set), for
  `--save`, budgets and the report;
- `cur_totals()`: cost and hours per instance, team, project, instance type or
  account, in one pass at that grain, for a plain `costs --by`: no dates, no tag
  JSON. Summed by DuckDB (duck.py, the same selection as SQL; tests hold it equal
  to read_cur()'s table summed), S3 objects through s3fetch's partial copies.

Files are streamed one batch of rows at a time (local files through a small read
buffer; S3 objects through pyarrow's S3 filesystem with ranged GETs, never a
whole-object read). Strings are read as Parquet dictionaries, so the usage-type
regex and the tag-key lookups run over the few distinct values, and rows only see
integer lookups. A row group whose start-date statistics lie inside the period is
not filtered row by row; one wholly outside it is not read. `identity_line_item_id`
is read only to name the first excluded line of a file.

`cur_sql()` is the same selection and aggregation as one SQL statement
(Presto/Trino dialect, run by Athena); tests run that exact text on DuckDB over
the same Parquet and compare the two tables.
"""

from __future__ import annotations

import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Iterable, Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .sources import GLOB_CHARS, ParquetSource, list_files, list_parquet  # noqa: F401  (re-exported)
from .schema import COLUMNS, BillingDataError, canonical_tags, conform, empty_table, single_currency
from .settings import TagKeys
from .totals import GRAINS, TOTAL_COLUMNS, empty_totals

log = logging.getLogger(__name__)

USAGE_TYPE = "line_item_usage_type"
LINE_TYPE = "line_item_line_item_type"
START = "line_item_usage_start_date"
RESOURCE = "line_item_resource_id"
ACCOUNT = "line_item_usage_account_id"
CURRENCY = "line_item_currency_code"
REGION = "product_region_code"
TAGS = "resource_tags"
LINE_ID = "identity_line_item_id"
UNBLENDED = "line_item_unblended_cost"
RI_COST = "reservation_effective_cost"
SP_COST = "savings_plan_savings_plan_effective_cost"
USAGE = "line_item_usage_amount"
REQUIRED = (USAGE_TYPE, LINE_TYPE, START, RESOURCE, ACCOUNT, UNBLENDED, USAGE, CURRENCY)
# Absent columns read as null (an RI/SP line without its effective cost is then excluded, with a warning).
OPTIONAL = (LINE_ID, REGION, TAGS, RI_COST, SP_COST)
COST_COLUMNS = (UNBLENDED, RI_COST, SP_COST, USAGE)
STRING_COLUMNS = (USAGE_TYPE, LINE_TYPE, RESOURCE, ACCOUNT, CURRENCY, LINE_ID, REGION)
USAGE_LINE_TYPES = ("Usage", "DiscountedUsage", "SavingsPlanCoveredUsage")
# One line item's usage hours above this are not a measurement (inf, a 9.2e18 sentinel).
MAX_LINE_HOURS = 1e9
GROUP_KEYS = ("date", "account", "region", "resource_id", "instance_type", "pricing_model",
              "team", "project", "owner", "currency")
# Rows per batch: every needed column of a batch is a few MiB, whatever the row group size.
BATCH_ROWS = 65_536
# Local files are read through a buffer of this size instead of whole column chunks at once.
READ_BUFFER = 1 << 20
# The cost table is summed again whenever the partial sums of the batches pass this many rows.
COMPACT_ROWS = 1_000_000


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


# --------------------------------------------------------------------------- schema checks


def _check_schema(name: str, schema: pa.Schema) -> list[str]:
    """Raise on a missing required column or a wrong type; return warnings."""
    warnings = []
    missing = [c for c in REQUIRED if c not in schema.names]
    if missing:
        raise BillingDataError(f"{name}: missing CUR 2.0 column(s) {missing}")
    for c in OPTIONAL:
        if c not in schema.names and c not in (REGION, LINE_ID):
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
    if TAGS in schema.names:
        t = schema.field(TAGS).type
        if not (pa.types.is_map(t) or pa.types.is_null(t)):
            raise BillingDataError(f"{name}: column 'resource_tags' has type {t}, expected map<string,string>")
    return warnings


# --------------------------------------------------------------------------- the scanner


_PRICING = pa.array(["on-demand", "spot", "reserved", "savings-plan"], pa.string())
_LINE_CODE = {"Usage": 0, "DiscountedUsage": 2, "SavingsPlanCoveredUsage": 3}  # pricing code; -1: not usage
_SEP_KV, _SEP_ITEM = "\x1f", "\x1e"
# Strings read straight as Parquet dictionaries: lookups and grouping then touch small integers.
_DICT_COLUMNS = (USAGE_TYPE, LINE_TYPE, RESOURCE, ACCOUNT, CURRENCY, REGION)
_EMPTY = pa.array([""], pa.string())


def _open(src: ParquetSource) -> pq.ParquetFile:
    """The file, its strings read as dictionaries."""
    try:
        handle = src.path if src.filesystem is None else src.filesystem.open_input_file(src.path)
    except (pa.ArrowException, OSError) as exc:
        raise BillingDataError(f"{src.name}: cannot open: {exc}") from None
    remote = src.filesystem is not None
    try:
        meta = pq.read_metadata(handle)
        names = set(meta.schema.to_arrow_schema().names)
        wanted = [c for c in _DICT_COLUMNS if c in names]
        # Remote: fetch each row group's needed column chunks in a few coalesced ranged GETs.
        return pq.ParquetFile(handle, metadata=meta, read_dictionary=wanted, pre_buffer=remote,
                              buffer_size=0 if remote else READ_BUFFER)
    except (pa.ArrowException, OSError) as exc:
        raise BillingDataError(f"{src.name}: not a readable Parquet file (truncated or not Parquet?): {exc}") from None


def _dict_array(arr: pa.Array) -> pa.DictionaryArray:
    if pa.types.is_dictionary(arr.type):
        return arr
    if pa.types.is_null(arr.type):
        return pa.DictionaryArray.from_arrays(pa.nulls(len(arr), pa.int32()), pa.array([], pa.string()))
    return pc.dictionary_encode(arr)


def _indices(d: pa.DictionaryArray) -> np.ndarray:
    """Dictionary indices as numpy, null -> len(dictionary) (callers append one entry for it)."""
    idx = d.indices
    if idx.null_count:
        idx = idx.fill_null(len(d.dictionary))
    return idx.to_numpy(zero_copy_only=False)


def _strings(d: pa.DictionaryArray) -> pa.Array:
    """The dictionary's values plus '' for null (CUR leaves many keys blank)."""
    return pa.concat_arrays([d.dictionary.cast(pa.string()), _EMPTY])


def _floats(b: pa.RecordBatch, col: str) -> np.ndarray:
    """A number column as float64, NaN for null or absent (NaN fails every bound, so it is excluded)."""
    if col not in b.schema.names or pa.types.is_null(b.schema.field(col).type):
        return np.full(b.num_rows, np.nan)
    arr = b.column(col)
    if arr.type != pa.float64():
        arr = pc.cast(arr, pa.float64())
    if arr.null_count:
        arr = arr.fill_null(np.nan)
    return arr.to_numpy(zero_copy_only=False)


class _UsageTypes:
    """What each distinct usage type means: GPU or not, spot or not, the instance type.

    Worked out once per Parquet dictionary (a row group's batches share one)."""

    def __init__(self, gpu_re: re.Pattern) -> None:
        self.gpu_re = gpu_re
        self._dictionary: pa.Array | None = None
        self._classes: tuple[np.ndarray, np.ndarray, pa.Array] | None = None

    def classes(self, dictionary: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """(is_gpu, is_spot, instance type) per dictionary entry, plus one entry for null."""
        if self._dictionary is None or not self._dictionary.equals(dictionary):
            values = dictionary.to_pylist()
            is_gpu = np.array([v is not None and bool(self.gpu_re.search(v)) for v in values] + [False])
            spot = np.array([v is not None and "SpotUsage:" in v for v in values] + [False], dtype=np.int8)
            itypes = [m.group(1) if v and (m := re.search(INSTANCE_TYPE_PATTERN, v)) else "" for v in values]
            self._dictionary, self._classes = dictionary, (is_gpu, spot, pa.array(itypes + [""], pa.string()))
        return self._classes


@dataclass
class _Kept:
    """The GPU usage lines of one batch that count: in the period, cost and hours valid."""
    batch: pa.RecordBatch
    rows: np.ndarray  # their positions in the batch
    pricing: np.ndarray  # index into _PRICING
    cost: np.ndarray
    usage: np.ndarray
    usage_type: np.ndarray  # index into instance_types
    instance_types: pa.Array


def _in_period(ts: pa.Array, start: datetime, end: datetime) -> np.ndarray:
    tz = getattr(ts.type, "tz", None)
    lo = pa.scalar(start if tz else start.replace(tzinfo=None), ts.type)
    hi = pa.scalar(end if tz else end.replace(tzinfo=None), ts.type)
    return pc.fill_null(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)), False).to_numpy(zero_copy_only=False)


def _select(b: pa.RecordBatch, usage_types: _UsageTypes, period: tuple[datetime, datetime] | None,
            max_line_cost: float) -> tuple[_Kept | None, np.ndarray]:
    """The batch's kept lines, and the positions of its GPU usage lines excluded for a bad cost or usage."""
    none = np.zeros(0, np.int64)
    ut = _dict_array(b.column(USAGE_TYPE))
    is_gpu, spot, itypes = usage_types.classes(ut.dictionary)
    if not is_gpu.any():
        return None, none
    lt = _dict_array(b.column(LINE_TYPE))
    lt_code = np.array([_LINE_CODE.get(v, -1) for v in lt.dictionary.to_pylist()] + [-1], dtype=np.int8)
    ut_idx, code = _indices(ut), lt_code[_indices(lt)]
    mask = is_gpu[ut_idx] & (code >= 0)
    if period is not None and mask.any():
        mask &= _in_period(b.column(START), *period)
    rows = np.flatnonzero(mask)
    if not len(rows):
        return None, none
    ut_idx, code = ut_idx[rows], code[rows]
    code = np.where(code > 0, code, spot[ut_idx])
    cost = _floats(b, UNBLENDED)[rows]
    for pricing_code, col in ((2, RI_COST), (3, SP_COST)):
        covered = code == pricing_code
        if covered.any():
            cost[covered] = _floats(b, col)[rows[covered]]
    usage = _floats(b, USAGE)[rows]
    # nan compares false and inf is above any bound, so neither survives as a cost or a usage.
    with np.errstate(invalid="ignore"):
        ok = (cost >= 0.0) & (cost <= max_line_cost) & (usage >= 0.0) & (usage <= MAX_LINE_HOURS)
    bad = rows[~ok]
    if not ok.any():
        return None, bad
    return _Kept(b, rows[ok], code[ok], cost[ok], usage[ok], ut_idx[ok], itypes), bad


def _period_coverage(rg: pq.RowGroupMetaData, leaf: int, start: datetime, end: datetime) -> str:
    """'all', 'none' or 'some' of a row group's start dates in [start, end), from its statistics."""
    try:
        stats = rg.column(leaf).statistics if leaf >= 0 else None
        if stats is None or not stats.has_min_max or not stats.has_null_count:
            return "some"
        lo, hi = _as_utc(stats.min), _as_utc(stats.max)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):  # statistics pyarrow cannot convert
        return "some"
    if lo is None or hi is None:
        return "some"
    if hi < start or lo >= end:
        return "none"
    return "all" if lo >= start and hi < end and stats.null_count == 0 else "some"


def _as_utc(v) -> datetime | None:
    if isinstance(v, datetime):
        return v if v.tzinfo else v.replace(tzinfo=timezone.utc)
    if isinstance(v, date):
        return datetime(v.year, v.month, v.day, tzinfo=timezone.utc)
    return None


@dataclass
class _Found:
    """What reading found besides the lines: warnings and how many line items were read."""
    warnings: list[str] = field(default_factory=list)
    rows_read: int = 0


@contextmanager
def _returning_pool() -> Iterator[None]:
    """Read with a memory pool that hands freed batches back to the system.

    pyarrow's default pool (mimalloc) keeps what a streamed read frees: about 80 MiB
    more peak memory for the same 20 MiB of live batches. jemalloc (or the system
    allocator where a build lacks it) returns it. Buffers remember their pool, so
    restoring the default afterwards is safe; a pool the user chose
    (ARROW_DEFAULT_MEMORY_POOL) is kept."""
    previous = pa.default_memory_pool()
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") or previous.backend_name != "mimalloc":
        yield
        return
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def _scan_file(src: ParquetSource, usage_types: _UsageTypes, start: datetime, end: datetime, max_line_cost: float,
               columns: Sequence[str], found: _Found) -> Iterator[_Kept]:
    """The kept GPU usage lines of one file, batch by batch, reading the cost columns plus `columns`."""
    pf = _open(src)
    schema = pf.schema_arrow
    found.warnings.extend(_check_schema(src.name, schema))
    base = [c for c in (USAGE_TYPE, LINE_TYPE, UNBLENDED, RI_COST, SP_COST, USAGE, CURRENCY) if c in schema.names]
    base += [c for c in columns if c in schema.names and c not in base]
    leaves = [pf.metadata.schema.column(i).path for i in range(pf.metadata.num_columns)]
    start_leaf = leaves.index(START) if START in leaves else -1
    bad, first_bad = 0, None
    for i in range(pf.num_row_groups):
        found.rows_read += pf.metadata.row_group(i).num_rows
        coverage = _period_coverage(pf.metadata.row_group(i), start_leaf, start, end)
        if coverage == "none":
            continue
        period = (start, end) if coverage == "some" else None
        cols = base + [START] if period and START not in base else base
        # One thread: a batch is a few columns of 64 Ki rows, and reading them on the pool's threads
        # costs more memory (each thread's allocator cache) than it saves time.
        batches = pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[i], columns=cols, use_threads=False)
        offset = 0
        while True:
            try:
                b = next(batches, None)
            except (pa.ArrowException, OSError) as exc:
                raise BillingDataError(f"{src.name}: row group {i} unreadable (truncated file?): {exc}") from None
            if b is None:
                break
            try:
                kept, excluded = _select(b, usage_types, period, max_line_cost)
            except pa.ArrowException as exc:  # a value the schema check let through (e.g. an odd date type)
                raise BillingDataError(f"{src.name}: cannot read the GPU line items: {exc}") from None
            if len(excluded):
                bad += len(excluded)
                if first_bad is None and LINE_ID in schema.names:
                    first_bad = _line_id(pf, i, offset + int(excluded[0]))
            if kept is not None:
                yield kept
            offset += b.num_rows
        # The pool keeps freed batches for reuse; hand them back so memory stays near one batch.
        pa.default_memory_pool().release_unused()
    if bad:
        found.warnings.append(
            f"{src.name}: {bad} GPU line item(s) excluded: cost (line_item_unblended_cost, or "
            f"reservation_effective_cost / savings_plan_savings_plan_effective_cost for RI / SP lines) "
            f"missing, negative or above {max_line_cost:g}, or line_item_usage_amount negative or above "
            f"{MAX_LINE_HOURS:g}" + (f" (first: identity_line_item_id={first_bad})" if first_bad is not None else ""))


def _line_id(pf: pq.ParquetFile, row_group: int, row: int) -> str | None:
    """identity_line_item_id of one line, read only when a line is excluded (to name it)."""
    try:
        return pf.read_row_group(row_group, columns=[LINE_ID]).column(0)[row].as_py()
    except (pa.ArrowException, OSError):
        return None


def _key_codes(kept: _Kept, col: str) -> tuple[np.ndarray, pa.Array]:
    """A string column of the kept lines as (codes, values); null or absent is ''."""
    if col not in kept.batch.schema.names:
        return np.zeros(len(kept.rows), np.int64), _EMPTY
    d = _dict_array(kept.batch.column(col))
    return _indices(d)[kept.rows], _strings(d)


# --------------------------------------------------------------------------- per-key totals


@dataclass
class CurTotals:
    table: pd.DataFrame  # totals.TOTAL_COLUMNS
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    rows_read: int = 0


def cur_totals(
    path: str,
    start: datetime,
    end: datetime,
    families: Sequence[str],
    by: str,
    tag_keys: TagKeys = TagKeys(),
    max_line_cost: float = 100_000.0,
    s3=None,
) -> CurTotals:
    """Cost and usage hours per `by` key (instance, team, project, instance_type, account) and currency,
    for usage starting in [start, end): read_cur()'s table summed at that grain, in one pass, on DuckDB
    (duck.py; BENCHMARKS.md says why). `s3`: an s3fetch.S3Client, for an s3:// path."""
    from .duck import cur_files, cur_total_rows

    if by not in GRAINS:
        raise ValueError(f"unknown grain {by!r}; expected one of {sorted(GRAINS)}")
    r = cur_total_rows(cur_files(path, s3), path, start, end, families, by, tag_keys, max_line_cost)
    for w in r.warnings:
        log.warning("%s", w)
    df = pd.DataFrame(r.rows, columns=list(TOTAL_COLUMNS)) if r.rows else empty_totals()
    return CurTotals(df, r.warnings, r.files, r.rows_read)


# --------------------------------------------------------------------------- the cost table


def read_cur(
    path: str,
    start: datetime,
    end: datetime,
    families: Sequence[str],
    tag_keys: TagKeys = TagKeys(),
    max_line_cost: float = 100_000.0,
    filesystem: pafs.FileSystem | None = None,
) -> CurResult:
    """GPU instance cost per resource per day for usage starting in [start, end)."""
    usage_types = _UsageTypes(re.compile(gpu_usage_pattern(families)))
    found = _Found()
    partials: list[pa.Table] = []
    pending: list[pa.Table] = []
    files = list_parquet(path, filesystem)
    with _returning_pool():
        for src in files:
            for kept in _scan_file(src, usage_types, start, end, max_line_cost,
                                   (START, ACCOUNT, REGION, RESOURCE, TAGS), found):
                try:
                    rows = _cost_rows(kept)
                except pa.ArrowException as exc:  # a value the schema check let through (e.g. an odd date type)
                    raise BillingDataError(f"{src.name}: cannot read the GPU line items: {exc}") from None
                # Sum every COMPACT_ROWS lines (one group_by per million lines, not per batch), and the sums
                # again when they grow: memory stays near that many lines plus the sums.
                pending.append(rows)
                if sum(p.num_rows for p in pending) >= COMPACT_ROWS:
                    partials, pending = _add_sums(partials, pending), []
        if pending:
            partials = _add_sums(partials, pending)
    for w in found.warnings:
        log.warning("%s", w)
    names = [s.name for s in files]
    if not partials:
        found.warnings.append(f"{path}: no GPU instance usage between {start:%Y-%m-%d} and {end:%Y-%m-%d}")
        return CurResult(empty_table(), found.warnings, names, found.rows_read)
    table = _finish(_sum(pa.concat_tables(partials).unify_dictionaries()), tag_keys, "cur")
    single_currency(table, path)
    return CurResult(table, found.warnings, names, found.rows_read)


def _add_sums(partials: list[pa.Table], pending: list[pa.Table]) -> list[pa.Table]:
    partials = [*partials, _sum(pa.concat_tables(pending).unify_dictionaries())]
    if sum(p.num_rows for p in partials) > 2 * COMPACT_ROWS:
        partials = [_sum(pa.concat_tables(partials).unify_dictionaries())]
    return partials


def _cost_rows(kept: _Kept) -> pa.Table:
    """The kept lines as the key and value columns the cost table groups on."""
    b, rows = kept.batch, pa.array(kept.rows)

    def coded(codes: np.ndarray, values: pa.Array) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), values)

    return pa.table({
        "date": pc.cast(b.column(START).take(rows), pa.date32()),
        "account": coded(*_key_codes(kept, ACCOUNT)),
        "region": coded(*_key_codes(kept, REGION)),
        "resource_id": coded(*_key_codes(kept, RESOURCE)),
        "instance_type": coded(kept.usage_type, kept.instance_types),
        "pricing_model": coded(kept.pricing, _PRICING),
        "currency": coded(*_key_codes(kept, CURRENCY)),
        "tags_key": _tag_keys(b.column(TAGS).take(rows) if TAGS in b.schema.names else None, len(kept.rows)),
        "cost": kept.cost,
        "usage_hours": kept.usage,
    })


def _tag_keys(maps: pa.Array | None, n: int) -> pa.DictionaryArray:
    """Each row's tags flattened to one string (k\\x1fv\\x1e...), dictionary-encoded.

    Rows share a handful of tag sets, so JSON and the team/project/owner lookup
    are done once per distinct set, after aggregation.
    """
    if maps is None or not pa.types.is_map(maps.type):
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), _EMPTY)
    if maps.offset or (len(maps.offsets) and maps.offsets[0].as_py() != 0):
        maps = pc.take(maps, pa.array(np.arange(n)))  # fresh offsets starting at 0
    kv = pc.binary_join_element_wise(maps.keys, pc.fill_null(maps.items, ""), _SEP_KV)
    lists = pa.ListArray.from_arrays(maps.offsets, kv, mask=maps.is_null())
    return pc.dictionary_encode(pc.fill_null(pc.binary_join(lists, _SEP_ITEM), ""))


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
