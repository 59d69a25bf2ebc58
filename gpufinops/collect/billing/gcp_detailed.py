"""Google Cloud's detailed usage cost export (the BigQuery table `gcp_billing_export_resource_v1_<account>`), exported
to files (Parquet, or CSV of a flattening query; one file, a folder, a glob or an s3:// prefix) -> GPU VM cost, on
DuckDB: the billing source `gcp-detailed`.

Columns read (Google's schema, cloud.google.com/billing/docs/how-to/export-data-bigquery-tables/detailed-usage):
service.description, sku.description, usage_start_time, usage_end_time, project.id, labels, system_labels,
location.zone, location.region, resource.name, resource.global_name, cost, currency, usage.amount, usage.unit,
credits. A Parquet export keeps the records nested (a STRUCT per record, a LIST of STRUCTs for labels, system_labels
and credits); BigQuery cannot write nested or repeated fields to CSV, so a CSV comes from a query that flattens them:
`service.description AS service_description` (a column named `service.description` is read too) and the repeated
ones as JSON text (`TO_JSON_STRING(labels) AS labels`). docs/billing.md has the EXPORT DATA statement.

A GPU VM's rows: a usage in time (usage.unit seconds or hours; a RAM row's byte-seconds carries cost, no hours) whose
SKU text or `compute.googleapis.com/machine_spec` system label names a GPU machine type (billing.gpu_patterns: A2,
A3, A4, G2, G4). Google bills one VM-hour as several rows (the GPUs, the vCPUs, the RAM, each in its own unit), so a
VM ran as long as its longest seconds row of that hour says (as the FOCUS path counts Google's rows).

Cost is net of credits: `cost` + the sum of `credits.amount` (Google writes credits negative: sustained and committed
use discounts, free tier, promotions), what the invoice charges for the row. The VM is `gce:<project>/<zone>/<name>`
(resource.name, project.id, location.zone: model.gce_vm_id), as places.gcp lists it, so its billed rate meets its
verdicts; team, project and owner from its labels by billing.tag_keys; `account` is the GCP project.

No pandas here: DuckDB groups each file and judges the groups of all files (only the distinct SKU texts, labels and VM
names go through Python), the lines come back and the totals (`costs --by`) are summed from them; load.py makes the
cost table (`costs --idle`, `--save`) from the same lines. A total per VM, type or account reads no labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Sequence

from .duck import TotalRows, _epoch_us, _error_text, _ident, _in, _q, connect, usage_hours_sql
from .errors import BillingDataError, mixed_currencies
# The FOCUS path's own facts (one of each): the time units, the machine_spec label, the largest line, a GPU SKU.
from .focus_rules import COMPOUND_TIME_UNIT, GCP_MACHINE_LABEL as MACHINE_LABEL, GPU_SKU, HOUR_UNITS, MAX_LINE_HOURS, \
    SECOND_UNITS
from .s3fetch import local_copies
from .sources import ParquetSource

SOURCE = "gcp-detailed"
FILE_SUFFIXES = (".parquet", ".csv", ".csv.gz")
KIND = "detailed usage cost export (.parquet, .csv, .csv.gz)"
# Logical field -> what it is read as. Records are nested in Parquet ("service" STRUCT), flattened in a CSV
# ("service_description", or "service.description").
REQUIRED = ("service.description", "sku.description", "usage_start_time", "project.id", "resource.name",
            "resource.global_name", "cost", "currency", "usage.amount", "usage.unit", "system_labels")
OPTIONAL = ("usage_end_time", "labels", "credits", "location.zone", "location.region")
REPEATED = ("labels", "system_labels", "credits")
TOP_LEVEL = ("service", "sku", "usage_start_time", "usage_end_time", "project", "labels", "system_labels",
             "location", "resource", "cost", "currency", "usage", "credits")


@dataclass
class DetailedLines:
    # (date 'YYYY-MM-DD', account, region, resource_id, instance_type, pricing_model, team, project, owner, the labels
    #  as sorted (key, value) pairs, currency) -> [cost, usage_hours]
    lines: dict[tuple, list[float]]
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


# The `costs --by` grains (totals.GRAINS) read from the labels; the others sum over them.
LABEL_GRAINS = ("team", "project")
LINE_FIELDS = ("date", "account", "region", "resource_id", "instance_type", "pricing_model", "team", "project",
               "owner", "tags", "currency")


def detailed_files(path: str, s3=None) -> list[ParquetSource]:
    """The export's files under a path: a file, a folder, a glob or an s3:// prefix (`s3`: an s3fetch.S3Client)."""
    from .duck import _files

    return _files(path, s3, FILE_SUFFIXES, KIND)


def _columns(con, src: ParquetSource) -> tuple[dict[str, str], str]:
    """(column -> DuckDB type, the table function reading the file). A CSV is read as text, "" missing."""
    f = _q(src.path)
    if src.name.lower().endswith(".parquet"):
        table = f"read_parquet({f})"
    else:
        table = (f"read_csv({f}, header=true, all_varchar=true, delim=',', quote='\"', escape='\"', "
                 "nullstr=[''])")
    try:
        types = {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM {table}").fetchall()}
    except Exception as exc:  # duckdb.Error: not Parquet, truncated, not UTF-8, empty
        text = _error_text(exc)
        if "utf" in text.lower() or "unicode" in text.lower():
            raise BillingDataError(f"{src.name}: not UTF-8 text") from None
        raise BillingDataError(f"{src.name}: cannot read the detailed usage cost export: {text}") from None
    return types, table


def _struct_types(duck_type: str) -> dict[str, str]:
    """Field name -> type of a DuckDB STRUCT type text (`STRUCT(id VARCHAR, "description" VARCHAR)`)."""
    if not duck_type.upper().startswith("STRUCT("):
        return {}
    inner, depth, fields, token = duck_type[7:-1], 0, {}, ""
    for ch in inner + ",":
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            name, _, kind = token.strip().partition(" ")
            fields[name.strip('"')] = kind.strip()
            token = ""
        else:
            token += ch
    return fields


def _struct_fields(duck_type: str) -> set[str]:
    """The field names of a DuckDB STRUCT type text."""
    return set(_struct_types(duck_type))


def field_type(types: dict[str, str], name: str) -> str:
    """The DuckDB type of a logical field in this file (as field_sql reads it; '' without it)."""
    if "." not in name:
        return types.get(name, "")
    record, sub = name.split(".", 1)
    nested = _struct_types(types.get(record, ""))
    if sub in nested:
        return nested[sub]
    return next((types[flat] for flat in (name, name.replace(".", "_")) if flat in types), "")


def field_sql(types: dict[str, str], name: str) -> str | None:
    """The SQL that reads a logical field of Google's schema in this file, or None when the file lacks it: a
    nested record's field (Parquet), or its flattened column `a_b` / `a.b` (CSV)."""
    if "." not in name:
        return _ident(name) if name in types else None
    record, sub = name.split(".", 1)
    if sub in _struct_fields(types.get(record, "")):
        return f"{_ident(record)}.{_ident(sub)}"
    for flat in (name, name.replace(".", "_")):
        if flat in types:
            return _ident(flat)
    return None


def _is_list(types: dict[str, str], name: str) -> bool:
    return types.get(name, "").endswith("[]")


def _check(types: dict[str, str], src: ParquetSource) -> dict[str, str]:
    """Logical field -> its SQL in this file; an error naming the file and the missing columns."""
    got = {n: field_sql(types, n) for n in (*REQUIRED, *OPTIONAL)}
    missing = [n for n in REQUIRED if got[n] is None]
    if missing:
        raise BillingDataError(
            f"{src.name}: missing column(s) {missing} of Google's detailed usage cost export (a CSV names a "
            f"record's field `service_description` or `service.description`; docs/billing.md has the export query)")
    return {n: s for n, s in got.items() if s is not None}


def _text(sql: str, types: dict[str, str], name: str) -> str:
    """A repeated field as JSON text (Parquet: its list; CSV: the JSON text the export query wrote)."""
    return f"to_json({sql})" if _is_list(types, name) else f"CAST({sql} AS VARCHAR)"


def _bad_credits(cols: dict[str, str], types: dict[str, str]) -> str:
    """True for a row whose credits a CSV wrote as text that is not JSON."""
    if "credits" not in cols or _is_list(types, "credits"):
        return "false"
    c = cols["credits"]
    return f"({c} IS NOT NULL AND NOT json_valid({c}))"


# Types whose TRY_CAST to DOUBLE cannot fail: a Parquet export's cost and usage.amount have no bad value to count.
NUMBER_TYPE = re.compile(r"U?(?:TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT)|FLOAT|DOUBLE|DECIMAL\(\d+,\s*\d+\)", re.I)


def _bad_counts(cols: dict[str, str], types: dict[str, str]) -> str:
    """The aggregates counting a group's values that are not a number, a date or JSON (bad_cost, bad_qty, bad_date,
    bad_credits); a constant 0 where the file's type rules them out (most of a Parquet file), which DuckDB then
    neither evaluates nor counts per row."""
    start = field_type(types, "usage_start_time").upper()
    never = {"bad_cost": NUMBER_TYPE.fullmatch(field_type(types, "cost")) is not None,
             "bad_qty": NUMBER_TYPE.fullmatch(field_type(types, "usage.amount")) is not None,
             "bad_date": start.startswith("TIMESTAMP") or start == "DATE",
             "bad_credits": _bad_credits(cols, types) == "false"}
    when = {"bad_cost": "cost_ IS NULL AND has_cost_", "bad_qty": "qty_ IS NULL AND has_qty_",
            "bad_date": "period_ IS NULL AND has_period_", "bad_credits": "bad_credits_"}
    return ", ".join(f"0::BIGINT AS {b}" if never[b] else f"COUNT(*) FILTER (WHERE {when[b]}) AS {b}" for b in when)


def _credits(cols: dict[str, str], types: dict[str, str]) -> str:
    """The row's credits summed (0 without any): a Parquet list of records, or a CSV's JSON text of them."""
    if "credits" not in cols:
        return "0.0"
    c = cols["credits"]
    if _is_list(types, "credits"):
        return f"COALESCE(list_sum(list_transform({c}, lambda x: TRY_CAST(x.amount AS DOUBLE))), 0.0)"
    return (f"COALESCE(list_sum(CAST(json_extract(CASE WHEN json_valid({c}) THEN {c} END, '$[*].amount') "
            f"AS DOUBLE[])), 0.0)")


# Google's own type of system_labels in a Parquet export: the machine_spec label is read from it in SQL, where the
# whole list as JSON text (another shape) is left to focus_tags in Python, once per distinct value.
KEY_VALUE_LIST = re.compile(r'STRUCT\("?key"? VARCHAR, "?value"? VARCHAR\)\[\]', re.I)


def _machine(cols: dict[str, str], types: dict[str, str]) -> tuple[str, str]:
    """(the machine_spec label's value, the system labels as JSON text) in SQL: the first where the file has
    Google's list of (key, value) text records (the last of that key, '' without one, as focus_tags reads it) and
    the second NULL; else the first NULL and the second the JSON text judged in Python."""
    sql = cols["system_labels"]
    if KEY_VALUE_LIST.fullmatch(types.get("system_labels", "")):
        return (f"COALESCE(list_filter({sql}, lambda x: x.key = {_q(MACHINE_LABEL)})[-1].value, '')",
                "NULL::VARCHAR")
    return "NULL::VARCHAR", _text(sql, types, "system_labels")


def _sql(table: str, cols: dict[str, str], types: dict[str, str], start: datetime, end: datetime,
         max_line_cost: float, labels: bool = True) -> str:
    """One file's usage-in-time rows summed per distinct (day, texts, labels, VM, currency); seconds rows keep
    their VM and hour so that a VM-hour's hours count once. Without `labels` the labels are not read (NULL): a
    total per VM, type or account sums over them, and reading the nested lists is much of a Parquet file's cost."""
    low = lambda s: f"lower(trim(COALESCE(CAST({s} AS VARCHAR), '')))"  # noqa: E731
    lo, hi = (int((d - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds()) * 1_000_000 for d in (start, end))
    start_type = types.get("usage_start_time", "VARCHAR")
    until = (_epoch_us("usage_end_time", types.get("usage_end_time", "VARCHAR")) if "usage_end_time" in cols
             else "NULL::BIGINT")
    opt = lambda n: f"CAST({cols[n]} AS VARCHAR)" if n in cols else "NULL::VARCHAR"  # noqa: E731
    labels_sql = _text(cols["labels"], types, "labels") if labels and "labels" in cols else "NULL::VARCHAR"
    machine, system_labels = _machine(cols, types)
    return f"""
    WITH used AS (
      SELECT CAST({cols['sku.description']} AS VARCHAR) AS sku_,
             {machine} AS machine_, {system_labels} AS sys_, {labels_sql} AS labels_,
             CAST({cols['project.id']} AS VARCHAR) AS project_, {opt('location.zone')} AS zone_,
             {opt('location.region')} AS region_, CAST({cols['resource.name']} AS VARCHAR) AS rname_,
             CAST({cols['resource.global_name']} AS VARCHAR) AS gname_, CAST({cols['currency']} AS VARCHAR) AS currency_,
             {low(cols['usage.unit'])} AS unit_,
             TRY_CAST({cols['cost']} AS DOUBLE) AS cost_, {cols['cost']} IS NOT NULL AS has_cost_,
             {_credits(cols, types)} AS credits_, {_bad_credits(cols, types)} AS bad_credits_,
             TRY_CAST({cols['usage.amount']} AS DOUBLE) AS qty_, {cols['usage.amount']} IS NOT NULL AS has_qty_,
             {_epoch_us('usage_start_time', start_type)} AS period_, usage_start_time IS NOT NULL AS has_period_,
             {until} AS until_
      FROM {table}
      WHERE {low(cols['service.description'])} = 'compute engine'
        AND ({low(cols['usage.unit'])} IN ({_in(sorted(HOUR_UNITS | SECOND_UNITS))})
             OR regexp_matches({low(cols['usage.unit'])}, {_q(COMPOUND_TIME_UNIT)}))),
    {usage_hours_sql(lo, hi)}
    SELECT strftime(make_timestamp(period_), '%Y-%m-%d') AS day_, sku_, machine_, sys_, labels_, project_, zone_,
           region_, rname_, gname_, currency_,
           CASE WHEN secs_ THEN period_ END AS secs_period_,
           {_bad_counts(cols, types)},
           SUM(cost_ + credits_) FILTER (WHERE inp_ AND ok_) AS cost, SUM(h_) FILTER (WHERE inp_ AND ok_) AS hours,
           MAX(h_) FILTER (WHERE inp_ AND ok_) AS max_hours, COUNT(*) FILTER (WHERE inp_ AND NOT ok_) AS excluded
    FROM (SELECT *, COALESCE(cost_ >= 0 AND cost_ <= {float(max_line_cost)!r} AND h_ >= 0
                             AND h_ <= {MAX_LINE_HOURS!r}, false) AS ok_ FROM kept)
    WHERE inp_ OR (cost_ IS NULL AND has_cost_) OR (qty_ IS NULL AND has_qty_) OR (period_ IS NULL AND has_period_)
          OR bad_credits_
    GROUP BY ALL
    """


def pricing_model(sku: str) -> str:
    """Google's SKU text says how the VM was bought: "Spot Preemptible ..." (spot), "Commitment v1: ..."
    (committed use, counted as a savings plan); anything else is on-demand (credits already netted)."""
    text = sku.lower()
    if "spot" in text or "preemptible" in text:
        return "spot"
    if "commitment" in text:
        return "savings-plan"
    return "on-demand"


class _Rules:
    """What each distinct value says, worked out once: the GPU machine type, the labels and their team/project."""

    def __init__(self, bs) -> None:
        from .focus_rules import _pick, focus_tags, gpu_instance_type

        families, patterns = set(bs.gpu_families or ()), [re.compile(p) for p in bs.gpu_patterns]
        self._gpu = lambda text: gpu_instance_type(text, families, patterns)
        self._tags, self._pick = focus_tags, _pick
        self._keys = bs.tag_keys
        self._labels: dict[str | None, tuple[str, str, str, tuple]] = {}

    def kind(self, sku: str, machine: str | None, system_labels: str) -> tuple[bool, str, str, str]:
        """(billed for a GPU SKU, the GPU machine type the SKU or machine_spec names or '', the machine type the
        machine_spec label names or '', the pricing model) of a SKU text and its machine_spec label (None: read
        from the system labels' JSON text)."""
        if machine is None:
            machine = str(self._tags(system_labels).get(MACHINE_LABEL) or "")
        return (GPU_SKU.search(sku) is not None, self._gpu(f"{machine} {sku}"), machine, pricing_model(sku))

    def labels(self, raw: str | None) -> tuple[str, str, str, tuple]:
        """(team, project, owner, the labels as sorted pairs) of a row's labels."""
        if raw not in self._labels:
            tags = {str(k): "" if v is None else str(v) for k, v in self._tags(raw or "").items()}
            self._labels[raw] = (self._pick(tags, self._keys.team), self._pick(tags, self._keys.project),
                                 self._pick(tags, self._keys.owner), tuple(sorted(tags.items())))
        return self._labels[raw]


# The groups of every file (_sql's columns, and the file's place in the list), held in DuckDB: judged there once all
# files are read, so that only the export's lines (a VM's day, type, pricing model, labels) come back to Python.
_GROUPS = """CREATE TEMP TABLE groups (file_no INTEGER, day_ VARCHAR, sku_ VARCHAR, machine_ VARCHAR, sys_ VARCHAR,
  labels_ VARCHAR,
  project_ VARCHAR, zone_ VARCHAR, region_ VARCHAR, rname_ VARCHAR, gname_ VARCHAR, currency_ VARCHAR,
  secs_period_ BIGINT, bad_cost BIGINT, bad_qty BIGINT, bad_date BIGINT, bad_credits BIGINT, cost DOUBLE,
  hours DOUBLE, max_hours DOUBLE, excluded BIGINT)"""
# Each distinct (SKU text, system labels) judged in Python (_Rules.kind), and each distinct VM naming its subject
# (model.gce_vm_id): tables the lines' statement joins. '' stands for a missing text, as the judges read it.
_KINDS = """CREATE TEMP TABLE kinds (sku VARCHAR, machine_ VARCHAR, sys VARCHAR, gpu_sku BOOLEAN, itype VARCHAR,
  machine VARCHAR, pricing VARCHAR)"""
_KIND_OF = """JOIN kinds ON kinds.sku = COALESCE(g.sku_, '') AND kinds.machine_ IS NOT DISTINCT FROM g.machine_
                              AND kinds.sys = COALESCE(g.sys_, '')"""
_JUDGED = f"""
  WITH k AS (SELECT g.*, kinds.gpu_sku, kinds.itype, kinds.machine, kinds.pricing
             FROM groups g {_KIND_OF})
  SELECT *, CASE WHEN itype <> '' THEN itype ELSE machine END AS type_ FROM k
  WHERE itype <> '' OR gname_ IN (SELECT gname_ FROM k WHERE gpu_sku AND gname_ <> '')"""
_LINES = f"""
  WITH kept AS ({_JUDGED}),
  named AS (
    SELECT kept.*, subjects.subject,
           -- the region column, else the zone's ("us-central1-a" -> "us-central1")
           COALESCE(NULLIF(region_, ''),
                    CASE WHEN length(COALESCE(zone_, '')) - length(replace(COALESCE(zone_, ''), '-', '')) >= 2
                         THEN regexp_replace(zone_, '-[^-]*$', '') ELSE COALESCE(zone_, '') END) AS region,
           -- One VM-hour's seconds rows (GPU, vCPU, RAM) count the hours of the longest once, on its own line.
           CASE WHEN secs_period_ IS NULL THEN hours
                WHEN row_number() OVER (PARTITION BY subjects.subject, secs_period_
                                        ORDER BY max_hours DESC, file_no, day_, type_, pricing, labels_, currency_,
                                                 COALESCE(project_, ''), region_, zone_) = 1 THEN max_hours
                ELSE 0.0 END AS counted_h
    FROM kept JOIN subjects ON subjects.g = COALESCE(gname_, '') AND subjects.r = COALESCE(rname_, '')
                           AND subjects.p = COALESCE(project_, '') AND subjects.z = COALESCE(zone_, '')
    WHERE cost IS NOT NULL)
  SELECT day_, COALESCE(project_, ''), region, subject, type_, pricing, labels_, COALESCE(currency_, ''),
         -- fsum (compensated): the same cents whatever order the groups come in (Parquet or CSV, threads)
         fsum(cost), fsum(counted_h)
  FROM named GROUP BY ALL"""


def detailed_lines(files: Sequence[ParquetSource], path: str, start: datetime, end: datetime, bs,
                   labels: bool = True) -> DetailedLines:
    """The GPU VM lines of the export's files in [start, end): cost (net of credits) and instance hours per day,
    VM, machine type, pricing model, labels and currency.

    A GPU VM is one whose machine type (the machine_spec label, or the SKU text) is a GPU machine type, or one
    billed for a GPU SKU ("Nvidia Tesla T4 GPU ...": an N1 VM with attached GPUs, whose machine type names none).
    Google may write a VM's GPU row and its vCPU rows in different files of an export, so every file's groups are
    read first (into DuckDB) and judged after; Python judges only the distinct SKU texts, labels and VM names.
    Without `labels` the lines carry none (team, project and owner ''): enough for a total per VM, type or account."""
    # Here, not at the top: every `costs` imports this module to ask whether its source is this one, and model's
    # types are a start-up cost the other sources do without (tests/cli/test_start.py).
    from ...model import gce_vm_id

    con = connect()
    rules = _Rules(bs)
    con.execute(_GROUPS)
    con.execute(_KINDS)
    judged: set[tuple[str, str | None, str]] = set()
    warnings: list[str] = []
    checks = (("bad_cost", "cost", "DOUBLE"), ("bad_qty", "usage.amount", "DOUBLE"),
              ("bad_date", "usage_start_time", "TIMESTAMPTZ"), ("bad_credits", "credits", "JSON"))
    names: list[str] = []
    for i, src in enumerate(local_copies(files, TOP_LEVEL)):
        names.append(src.name)
        types, table = _columns(con, src)
        cols = _check(types, src)
        try:
            con.execute(f"INSERT INTO groups SELECT {i}, * FROM "
                        f"({_sql(table, cols, types, start, end, bs.max_line_cost, labels)})")
        except Exception as exc:  # duckdb.Error: a row group unreadable, a value it cannot convert
            raise BillingDataError(f"{src.name}: cannot read the detailed usage cost export: "
                                   f"{_error_text(exc)}") from None
        new = [p for p in con.execute("SELECT DISTINCT COALESCE(sku_, ''), machine_, COALESCE(sys_, '') FROM groups "
                                      f"WHERE file_no = {i}").fetchall() if p not in judged]
        if new:
            judged.update(new)
            kinds = [(sku, machine, sys, *rules.kind(sku, machine, sys)) for sku, machine, sys in new]
            # Python lists in as parameters, zipped by unnest: no pandas or pyarrow to import.
            con.execute("INSERT INTO kinds SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
                         "unnest(?::BOOLEAN[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
                        [list(c) for c in zip(*kinds)])
        # A bad value of a GPU VM's row (by its own SKU or machine type): said here, naming its row.
        bad = con.execute(f"""SELECT {', '.join(f'COALESCE(SUM({b}), 0)' for b, _c, _k in checks)}
                              FROM groups g {_KIND_OF}
                              WHERE file_no = {i} AND (gpu_sku OR itype <> '')""").fetchone()
        for n, (_b, column, kind) in zip(bad, checks):
            if n:
                _raise_bad_value(con, table, cols, src, column, kind)
    per_file = con.execute(f"""
          SELECT file_no, SUM(excluded + {' + '.join(b for b, _c, _k in checks)}),
                 list(DISTINCT COALESCE(currency_, '')) FILTER (WHERE cost IS NOT NULL)
          FROM ({_JUDGED}) GROUP BY file_no ORDER BY file_no""").fetchall()
    for file_no, _n, found in per_file:
        mixed_currencies(found or [], names[file_no])
    for file_no, n, _found in per_file:
        if n:
            warnings.append(f"{names[file_no]}: {n} GPU VM row(s) excluded: column 'cost' missing, negative or above "
                            f"{bs.max_line_cost:g}, or usage.amount negative or above {MAX_LINE_HOURS:g} h")
    vms = con.execute(f"""SELECT DISTINCT COALESCE(gname_, ''), COALESCE(rname_, ''), COALESCE(project_, ''),
                                          COALESCE(zone_, '') FROM ({_JUDGED}) WHERE cost IS NOT NULL""").fetchall()
    subjects = [(*vm, gce_vm_id(*vm) or vm[0] or vm[1]) for vm in vms]
    con.execute("CREATE TEMP TABLE subjects (g VARCHAR, r VARCHAR, p VARCHAR, z VARCHAR, subject VARCHAR)")
    if subjects:
        con.execute("INSERT INTO subjects SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
                    "unnest(?::VARCHAR[]), unnest(?::VARCHAR[])", [list(c) for c in zip(*subjects)])
    lines: dict[tuple, list[float]] = {}
    for day, account, region, subject, itype, pricing, raw_labels, currency, cost, hours in con.execute(
            _LINES).fetchall():
        team, project, owner, tags = rules.labels(raw_labels)
        line = lines.setdefault((day, account, region, subject, itype, pricing, team, project, owner, tags, currency),
                                [0.0, 0.0])
        line[0] += cost
        line[1] += hours
    mixed_currencies([k[-1] for k in lines], path)
    if not lines:
        warnings.append(f"{path}: no GPU VM usage between {start:%Y-%m-%d} and {end:%Y-%m-%d}")
    return DetailedLines(lines, warnings, [s.name for s in files])


def _raise_bad_value(con, table: str, cols: dict[str, str], src: ParquetSource, column: str, kind: str) -> None:
    """The error naming the first Compute Engine row whose `column` is not a number, a date or JSON (`kind`), by
    its data row."""
    sql = cols[column]
    bad = "NOT json_valid(v)" if kind == "JSON" else f"TRY_CAST(v AS {kind}) IS NULL"
    con.execute("SET threads=1")  # row_number() in file order
    row = con.execute(f"""
      SELECT rn, v FROM (SELECT row_number() OVER () AS rn, {sql} AS v,
                                lower(trim(COALESCE(CAST({cols['service.description']} AS VARCHAR), ''))) AS svc
                         FROM {table})
      WHERE svc = 'compute engine' AND v IS NOT NULL AND {bad}
      ORDER BY rn LIMIT 1""").fetchone()
    what = {"DOUBLE": "a number", "TIMESTAMPTZ": "a date", "JSON": "JSON text (the export query's TO_JSON_STRING)"}[kind]
    # As the FOCUS reader names a row: a CSV's line (the header is line 1), a Parquet file's row from 1.
    at = (row[0] if table.startswith("read_parquet") else row[0] + 1) if row else 0
    where = f" on data row {at} (value {str(row[1])[:80]!r})" if row else ""
    raise BillingDataError(f"{src.name}: column '{column}' is not {what}{where}")


def totals(d: DetailedLines, by: str) -> list[tuple[str, str, float, float]]:
    """(key, currency, cost, usage_hours) per `by` key (totals.GRAINS), sorted."""
    at = {"instance": "resource_id", "instance_type": "instance_type", "account": "account", "team": "team",
          "project": "project"}[by]
    i = LINE_FIELDS.index(at)
    sums: dict[tuple[str, str], list[float]] = {}
    for key, (cost, hours) in d.lines.items():
        s = sums.setdefault((key[i], key[-1]), [0.0, 0.0])
        s[0] += cost
        s[1] += hours
    return [(k, c, v[0], v[1]) for (k, c), v in sorted(sums.items())]


def file_totals(settings, start: datetime, end: datetime, by: str, source: str | None = None,
                path: str | None = None) -> TotalRows | None:
    """duck.file_totals for this source: the export's totals per `by` key, or None when the source is another."""
    import logging

    from .s3fetch import s3_client_for
    from .settings import billing_settings

    bs = billing_settings(settings)
    source, path = source or bs.source, path or bs.path
    if source != SOURCE or not path:
        return None
    d = detailed_lines(detailed_files(path, s3_client_for(settings, path)), path, start, end, bs,
                       labels=by in LABEL_GRAINS)
    for w in d.warnings:
        logging.getLogger(__name__).warning("%s", w)
    return TotalRows(totals(d, by), d.warnings, d.files, None, SOURCE)
