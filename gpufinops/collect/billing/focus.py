"""FOCUS 1.0-1.4 exports (CSV, CSV.gz or Parquet; one file, a folder, a glob or an s3:// prefix; AWS, Azure,
Google Cloud, OCI, others) -> the cost table.

FOCUS has no instance-type column, so a GPU instance row is a Usage charge
(any case: Google's view writes "usage") measured in time (hours, or seconds as
Google's export does), outside any non-compute FOCUS service category, whose
text names a GPU instance: an AWS type of a GPU family ("$1.624 per On Demand
Linux g5.4xlarge Instance Hour", `x_UsageType` "BoxUsage:g5.4xlarge", or
SkuPriceDetails), or a name matching one of `billing.gpu_patterns` (Azure
Standard_NC..., GCP a2-highgpu-... as Google's machine_spec system label, OCI
VM.GPU...). A GCE VM billed a GPU SKU anywhere in the export (an N1 VM with
attached GPUs: "Nvidia Tesla T4 GPU running in Americas") is a GPU VM too, all
its rows its cost (focus_rules.PendingGceRows).

Columns by version (focus_spec.py): the provider is ServiceProviderName from
1.3 on (ProviderName is deprecated in 1.3 and gone in 1.4), ProviderName
before; every other column read here keeps its 1.0 name through 1.4.

Pricing model: CommitmentDiscountType "Reservation" -> reserved, a savings
plan or committed-use discount (or PricingCategory "Committed") ->
savings-plan, PricingCategory "Dynamic" or a "Spot" charge -> spot, else
on-demand.
"""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow.fs as pafs

from ...config import not_utf8_error
from .focus_rules import (COMPOUND_TIME_UNIT, FILE_SUFFIXES, GCE_RESOURCE_PREFIX, GCP_MACHINE_LABEL,  # noqa: F401
                          GPU_SKU, HOUR_UNITS, MAX_LINE_HOURS, NON_COMPUTE_CATEGORIES, OPTIONAL, PROVIDER_COLUMNS,
                          REQUIRED, SECOND_UNITS, PendingGceRows, _as_text, _pick, bad_value_message, check_columns,
                          focus_tags, gpu_instance_type, is_gce_vm, provider_name, subject_of)
from .sources import ParquetSource, list_files
from .errors import mixed_currencies
from .schema import BillingDataError, canonical_tags, conform, empty_table, single_currency
from .settings import BillingSettings

log = logging.getLogger(__name__)

CHUNK_ROWS = 200_000  # rows parsed at a time: about 100 MiB of a FOCUS CSV's read columns
PERIOD, SECONDS = "charge_period_start", "in_seconds"
PENDING = "pending_gce_vm"  # the ResourceId of a GCE VM's row that names no GPU (None on every other row)


@dataclass
class FocusResult:
    table: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    rows_read: int = 0
    files: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)  # file -> FOCUS version detected


def _chunks(src: ParquetSource, columns: Sequence[str]) -> Iterator[pd.DataFrame]:
    """The wanted columns of one file (the others are never parsed), CHUNK_ROWS rows at a time so a large
    export never sits in memory whole: first an empty frame with the file's columns (to check them), then
    the rows, indexed by their data row in the file (0 = the first after the header). CSV values as strings."""
    wanted = set(columns)
    try:
        if src.name.lower().endswith(".parquet"):
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(src.path, filesystem=src.filesystem) if src.filesystem else pq.ParquetFile(src.path)
            names = [c for c in pf.schema_arrow.names if c in wanted]
            yield pf.schema_arrow.empty_table().select(names).to_pandas()
            offset = 0
            for batch in pf.iter_batches(batch_size=CHUNK_ROWS, columns=names):
                df = batch.to_pandas()
                df.index += offset
                offset += len(df)
                yield df
            return
        kw = dict(usecols=lambda c: c in wanted, dtype=str, keep_default_na=False, na_values=["NULL", ""])
        if src.filesystem is None:
            yield pd.read_csv(src.path, compression="infer", nrows=0, **kw)
            with pd.read_csv(src.path, compression="infer", chunksize=CHUNK_ROWS, **kw) as reader:
                yield from reader
            return
        with src.filesystem.open_input_stream(src.path, compression="detect") as stream:
            yield pd.read_csv(stream, nrows=0, **kw)
        with src.filesystem.open_input_stream(src.path, compression="detect") as stream:
            with pd.read_csv(stream, chunksize=CHUNK_ROWS, **kw) as reader:
                yield from reader
    except UnicodeDecodeError:  # names the first bad byte's line and offset, not pandas' read block
        if src.filesystem is None and not src.name.lower().endswith(".gz"):
            raise BillingDataError(str(not_utf8_error(src.path))) from None
        raise BillingDataError(f"{src.name}: not UTF-8 text") from None
    except pd.errors.EmptyDataError:
        raise BillingDataError(f"{src.name}: empty file, no FOCUS header") from None
    except (OSError, ValueError, TypeError, NotImplementedError) as exc:  # Arrow and CSV parser errors among them
        raise BillingDataError(f"{src.name}: cannot read FOCUS file: {exc}") from None


def each_distinct(values: pd.Series, fn) -> pd.Series:
    """fn of each value, computed once per distinct value (charge texts and tags repeat over millions of
    rows); values that cannot be hashed (a Parquet map read as a list of pairs) one by one."""
    try:
        codes, uniques = pd.factorize(values)
    except TypeError:
        return values.map(fn)
    # One slot per distinct value, and a last one for a missing value (factorize's code -1).
    results = np.empty(len(uniques) + 1, dtype=object)
    for i, v in enumerate(uniques):
        results[i] = fn(v)
    missing = codes == -1
    if missing.any():
        results[-1] = fn(values[missing].iloc[0])
    return pd.Series(results[codes], index=values.index, dtype=object)


def _column_text(df: pd.DataFrame, col: str) -> pd.Series:
    if col not in df.columns:
        return pd.Series("", index=df.index)
    return each_distinct(df[col], _as_text)


def _subjects(df: pd.DataFrame) -> pd.Series:
    """subject_of each row's ResourceId and, where the file has it, ResourceName (a GCE VM's name)."""
    rid = df["ResourceId"].fillna("").astype(str)
    if "ResourceName" not in df.columns:
        return each_distinct(rid, subject_of)
    pairs = pd.Series(list(zip(rid, df["ResourceName"].fillna("").astype(str))), index=df.index, dtype=object)
    return each_distinct(pairs, lambda p: subject_of(*p))


def _check_columns(df: pd.DataFrame, name: str, cost_col: str) -> tuple[str, str]:
    """(FOCUS version, provider column) of one file, or an error naming the file and the missing columns."""
    return check_columns(df.columns, name, cost_col)


def _gpu_rows(df: pd.DataFrame, name: str, start: datetime, end: datetime, bs: BillingSettings,
              provider_col: str, excluded: list[int], pending: PendingGceRows, file_index: int) -> pd.DataFrame | None:
    """One file's GPU instance rows in [start, end), not yet grouped; None when it has none. A GCE VM's rows that
    name no GPU come too, their ResourceId in PENDING: read_focus keeps them if `pending` finds the VM billed a GPU
    SKU; their bad values and excluded lines are noted there, said only for such a VM."""
    cost_col = bs.focus_cost_column
    families = set(bs.gpu_families or ())
    patterns = [re.compile(p) for p in bs.gpu_patterns]
    # Vectorised tests first, so the text and tag parsing below runs on usage-in-time rows only.
    unit = df["ConsumedUnit"].fillna("").astype(str).str.strip().str.lower()
    category = df["ChargeCategory"].fillna("").astype(str).str.strip().str.lower()
    # Time units carry instance hours; a compound one (Google's RAM "byte-seconds") carries cost only.
    compound = each_distinct(unit, lambda u: re.search(COMPOUND_TIME_UNIT, u) is not None).astype(bool)
    usage = (category == "usage") & (unit.isin(HOUR_UNITS) | unit.isin(SECOND_UNITS) | compound)
    if "ServiceCategory" in df.columns:
        usage &= ~df["ServiceCategory"].fillna("").astype(str).str.strip().str.lower().isin(NON_COMPUTE_CATEGORIES)
    df, unit, compound = df[usage], unit[usage], compound[usage]
    raw_tags = df["Tags"].fillna("") if "Tags" in df.columns else pd.Series("", index=df.index)
    tags = each_distinct(raw_tags, focus_tags)
    text = (_column_text(df, "x_UsageType") + " " + df["ChargeDescription"].fillna("").astype(str) + " "
            + _column_text(df, "SkuPriceDetails") + " " + _column_text(df, "x_SkuDetails") + " "
            + tags.map(lambda t: str(t.get(GCP_MACHINE_LABEL) or "")))
    itype = each_distinct(text, lambda t: gpu_instance_type(t, families, patterns))
    named = itype != ""
    # A GCE VM's row naming no GPU machine type: an attached GPU's own SKU row ("Nvidia Tesla T4 GPU ...") makes its VM
    # a GPU VM; its vCPU and RAM rows wait on that (pending), for the GPU row may come in another chunk or file.
    rid = df["ResourceId"].fillna("").astype(str)
    gce = ~named & rid.str.startswith(GCE_RESOURCE_PREFIX)  # vectorised first: most rows of most exports are not
    if gce.any():
        gce[gce] = each_distinct(rid[gce], is_gce_vm).astype(bool)
    gpu_sku = gce & each_distinct(df["ChargeDescription"].fillna("").astype(str),
                                  lambda t: GPU_SKU.search(t) is not None).astype(bool)
    # Such a VM's type is its machine type (n1-standard-8), as the machine_spec label names it.
    itype = itype.where(named, tags.map(lambda t: str(t.get(GCP_MACHINE_LABEL) or "")))
    keep = named | gce
    df, itype, unit, tags, compound = df[keep].copy(), itype[keep], unit[keep], tags[keep], compound[keep]
    raw_tags, rid, gpu_sku = raw_tags[keep], rid[keep], gpu_sku[keep]
    waiting = (gce[keep] & ~gpu_sku).to_numpy()
    # Types: a value that is not a number or a date is an error naming the file, column and row (a pending row's
    # once its VM is known to be a GPU VM).
    bad_rows = pd.Series(False, index=df.index)
    for order, col in enumerate((cost_col, "ConsumedQuantity")):
        num = pd.to_numeric(df[col], errors="coerce")
        bad = num.isna() & df[col].notna()
        if (bad & ~waiting).any():
            at = (bad & ~waiting).idxmax()
            raise BillingDataError(bad_value_message(name, col, int(at) + 2, df.loc[at, col], False))
        for at in bad[bad].index:
            pending.note_bad(file_index, order, int(at) + 2, rid[at], bad_value_message(name, col, int(at) + 2,
                                                                                      df.loc[at, col], False))
        bad_rows |= bad
        df[col] = num.astype("float64")
    try:
        when = pd.to_datetime(df["ChargePeriodStart"], errors="coerce", utc=True, format="mixed")
    except (ValueError, TypeError, OverflowError) as exc:
        raise BillingDataError(f"{name}: column 'ChargePeriodStart' cannot be read as dates: {exc}") from None
    bad = when.isna() & df["ChargePeriodStart"].notna()
    if (bad & ~waiting).any():
        raise BillingDataError(bad_value_message(name, "ChargePeriodStart", int((bad & ~waiting).idxmax()) + 2,
                                                 None, True))
    for at in bad[bad].index:
        pending.note_bad(file_index, 2, int(at) + 2, rid[at], bad_value_message(name, "ChargePeriodStart",
                                                                              int(at) + 2, None, True))
    bad_rows |= bad
    # A pending row with a bad value is said above if its VM is a GPU VM; it adds nothing either way.
    in_period = (when >= start) & (when < end) & ~bad_rows
    df, itype, when, unit, tags = df[in_period], itype[in_period], when[in_period], unit[in_period], tags[in_period]
    raw_tags, rid, waiting = raw_tags[in_period], rid[in_period], waiting[in_period.to_numpy()]
    pending.billed_gpu.update(rid[gpu_sku[in_period]])
    cost = df[cost_col]
    quantity = df["ConsumedQuantity"].fillna(0)
    hours = quantity.where(unit.isin(HOUR_UNITS), quantity / 3600.0).where(~compound, 0.0)
    # Hours of one line: a day at most per resource in practice; inf or 9.2e18 is not a measurement.
    ok = cost.notna() & (cost >= 0) & (cost <= bs.max_line_cost) & (hours >= 0) & (hours <= MAX_LINE_HOURS)
    if (~ok).any():
        excluded.append(int((~ok & ~waiting).sum()))
        for r, n in rid[~ok & waiting].value_counts().items():
            pending.note_excluded(file_index, r, int(n))
        df, itype, when, unit, tags, hours = df[ok], itype[ok], when[ok], unit[ok], tags[ok], hours[ok]
        raw_tags, rid, waiting = raw_tags[ok], rid[ok], waiting[ok.to_numpy()]
    if df.empty:
        return None
    single_currency(df[~waiting], name, "BillingCurrency")
    if "ChargePeriodEnd" in df.columns:  # 12 vCPU-seconds a second are 1 instance-second, not 12
        until = pd.to_datetime(df["ChargePeriodEnd"], errors="coerce", utc=True, format="mixed")
        period_h = (until - when).dt.total_seconds() / 3600.0
        hours = hours.where(~unit.isin(SECOND_UNITS) | period_h.isna(), hours.clip(upper=period_h))
    # Per distinct Tags value, not per row, and parsed once: the same few tag sets repeat over millions of lines.
    tag_fields = each_distinct(raw_tags, lambda t: tag_columns(focus_tags(t), bs))
    return pd.DataFrame({
        "date": when.dt.tz_localize(None).dt.floor("D"),
        "provider": df[provider_col].fillna("").astype(str).map(provider_name),
        "account": _column_text(df, "SubAccountId"),
        "region": _column_text(df, "RegionId"),
        "resource_id": _subjects(df),
        "instance_type": itype,
        "pricing_model": pricing_models(df),
        "team": tag_fields.str[0], "project": tag_fields.str[1], "owner": tag_fields.str[2],
        "tags": tag_fields.str[3],
        "cost": df[cost_col],
        "currency": df["BillingCurrency"].astype(str),
        "usage_hours": hours,
        "source": "focus",
        # For instance_hours() once every file is read (a charge period may span chunks); then dropped.
        PERIOD: when, SECONDS: unit.isin(SECOND_UNITS),
        PENDING: rid.where(waiting, None), "file_": name,
    })


def instance_hours(rows: pd.DataFrame) -> pd.Series:
    """Instance hours, once per instance and charge period. A seconds-unit export (Google) bills one
    instance-hour as several rows (GPU-seconds, vCPU-seconds): the instance ran as long as its longest
    row says, so the others count 0 h (their cost is kept). Hour-unit rows are one per instance-hour."""
    hours = rows["usage_hours"]
    secs = rows[SECONDS]
    if not secs.any():
        return hours
    frame = rows.loc[secs, ["resource_id", PERIOD, "usage_hours"]].sort_values("usage_hours", ascending=False,
                                                                             kind="stable")
    dup = frame.duplicated(["resource_id", PERIOD], keep="first")
    return hours.where(~hours.index.isin(dup[dup].index), 0.0)


def read_focus(path: str, start: datetime, end: datetime, bs: BillingSettings,
               filesystem: pafs.FileSystem | None = None) -> FocusResult:
    """GPU instance cost from every FOCUS file of `path` (a file, a folder, a glob or an s3:// prefix)."""
    cost_col = bs.focus_cost_column
    sources = list_files(path, filesystem, FILE_SUFFIXES, "FOCUS (.csv, .csv.gz, .parquet)")
    warnings: list[str] = []
    parts: list[pd.DataFrame] = []
    versions: dict[str, str] = {}
    n_read = 0
    pending = PendingGceRows()
    dropped: dict[int, int] = {}
    for index, src in enumerate(sources):
        chunks = _chunks(src, (*REQUIRED, *PROVIDER_COLUMNS, *OPTIONAL, cost_col))
        header = next(chunks)
        first = next(chunks, None)  # a file unreadable from its first rows (not UTF-8) says so before its columns
        versions[src.name], provider_col = _check_columns(header, src.name, cost_col)
        dropped[index] = 0
        for df in itertools.chain([first] if first is not None else [], chunks):
            n_read += len(df)
            rows = _gpu_rows(df, src.name, start, end, bs, provider_col, excluded := [], pending, index)
            if rows is not None:
                parts.append(rows)
            dropped[index] += sum(excluded)
    # A GCE VM's rows that named no GPU: its own when the VM was billed a GPU SKU anywhere in the export.
    pending.raise_first_bad()
    parts = [p[p[PENDING].isna() | p[PENDING].isin(pending.billed_gpu)] for p in parts]
    parts = [p for p in parts if not p.empty]
    for index, src in enumerate(sources):
        n = dropped[index] + pending.excluded_of(index)
        if n:  # one line per file, however many chunks it was read in
            warnings.append(f"{src.name}: {n} GPU row(s) excluded: column '{cost_col}' missing, negative or "
                            f"above {bs.max_line_cost:g}, or ConsumedQuantity negative or above {MAX_LINE_HOURS:g} h")
    if not parts:
        warnings.append(f"{path}: no GPU instance usage between {start:%Y-%m-%d} and {end:%Y-%m-%d}")
        for w in warnings:
            log.warning("%s", w)
        return FocusResult(empty_table(), warnings, n_read, [s.name for s in sources], versions)
    out = pd.concat(parts, ignore_index=True)
    if pending.billed_gpu:  # a file's kept pending rows in a currency its GPU rows are not
        for name, currencies in out.groupby("file_", sort=False)["currency"]:
            mixed_currencies(currencies.unique(), name, "BillingCurrency")
    single_currency(out, path)
    out = out.assign(usage_hours=instance_hours(out)).drop(columns=[PERIOD, SECONDS, PENDING, "file_"])
    keys = [c for c in out.columns if c not in ("cost", "usage_hours")]
    out = out.groupby(keys, sort=True)[["cost", "usage_hours"]].sum().reset_index()
    for w in warnings:
        log.warning("%s", w)
    return FocusResult(conform(out), warnings, n_read, [s.name for s in sources], versions)


def tag_columns(tags: dict, bs: BillingSettings) -> tuple[str, str, str, str]:
    """(team, project, owner, canonical tags) of one line's tags."""
    return (_pick(tags, bs.tag_keys.team), _pick(tags, bs.tag_keys.project), _pick(tags, bs.tag_keys.owner),
            canonical_tags(tags))


PRICING_COLUMNS = ("CommitmentDiscountType", "PricingCategory", "ChargeDescription")


def pricing_models(df: pd.DataFrame) -> pd.Series:
    """The pricing model of each row, computed once per distinct (discount type, pricing category, text)."""
    cols = {c: (_column_text(df, c) if c in df.columns else pd.Series("", index=df.index)) for c in PRICING_COLUMNS}
    keys = pd.Series(list(zip(*(cols[c] for c in PRICING_COLUMNS))), index=df.index, dtype=object)
    return each_distinct(keys, lambda k: _pricing(dict(zip(PRICING_COLUMNS, k))))


def _pricing(row: dict) -> str:
    kind = str(row.get("CommitmentDiscountType") or "").lower()
    category = str(row.get("PricingCategory") or "").strip().lower()
    if "reserv" in kind:
        return "reserved"
    if "saving" in kind or "commit" in kind or (not kind and category == "committed"):
        return "savings-plan"
    if category == "dynamic" or "spot" in str(row.get("ChargeDescription") or "").lower():
        return "spot"
    return "on-demand"
