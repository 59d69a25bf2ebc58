"""FOCUS per-instance GPU totals: the whole `gpufinops costs --source focus --by instance` command (cli) vs DuckDB, same
answer, same run (issue 17).

The input is the real FOCUS 1.0 sample (../shared/data/billing/focus_1.0_sample_1000.csv, FinOps Foundation,
CC BY 4.0) repeated to N rows, each copy k perturbed so the answer is not trivial: ResourceId + "-" + (k % 1000)
(about 2,250 GPU instances in the answer: a suffix fixes the copy's type and day shift), charge periods moved by (k % 40) - 5 days (some copies fall outside
September 2024), BilledCost scaled by 1 + (k % 13) / 10 and negated on every 101st copy (excluded rows), and
the sample's g5.4xlarge instance-hour text rewritten per copy to g5.4xlarge, p4d.24xlarge, g6e.xlarge or
m5.4xlarge (not a GPU: excluded). It is written as CSV with the sample's FOCUS 1.0 columns and as typed Parquet
(doubles, timestamps) with FOCUS 1.3 names (ServiceProviderName, HostProviderName).

Both engines compute, for September 2024, the cost and usage hours per ResourceId of the rows read_focus keeps:
ChargeCategory "usage" (any case), a time unit (hours; seconds / 3600; a compound "...-seconds" unit counts
cost only), ServiceCategory outside the non-compute FOCUS categories, a GPU instance named in x_UsageType,
ChargeDescription, SkuPriceDetails, x_SkuDetails or Google's machine_spec tag (an AWS type of a GPU family or
one of billing.gpu_patterns), the configured cost column (BilledCost) between 0 and max_line_cost, hours
between 0 and MAX_LINE_HOURS; seconds-unit rows clipped to their charge period and counted once per
instance and period. DuckDB gets that selection as SQL. The engines are bench_cur's, as processes started the
same way: "cli" the installed `gpufinops costs --source focus --path FILE --by instance -o json`, "duckdb" a
process that imports duckdb only and runs that SQL, "replay" one that replays the command's own DuckDB
statements; the interleaving, the medians of --repeat and the comparison to the cent are bench_cur's too.

    python bench/bench_focus.py                          # 1 M and 5 M rows, CSV and Parquet
    python bench/bench_focus.py --rows 5000000 --format parquet --repeat 5
    python bench/bench_focus.py --rows 1000000 --format csv --repeat 1 --table   # also read_focus (the table)
    python bench/bench_focus.py --rows 5000000 --format parquet --s3   # also the command on an s3:// copy

Files are generated once (by DuckDB, from the sample) into bench_cur's data folder ($GPUFINOPS_BENCH_DATA,
default <tmp>/gpufinops-bench, outside the checkout) and reused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from bench_cur import (CENT, HEADER, OUT, RATIO_HEADER, YARDSTICKS, cli_s3_args, costs_args, count_s3_bytes,
                       differences, explain, figures_line, over_goal, printed_totals, replay, run_script_child, s3_path,
                       s3_server, vm_hwm_mib, yardstick_command)
from process_timing import environment, gpufinops_command, medians_interleaved, run_process

SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "billing" / "focus_1.0_sample_1000.csv"
START, END = "2024-09-01", "2024-10-01"
# Per copy, the instance type the sample's GPU rows are rewritten to (m5.4xlarge is not a GPU).
TYPES = ("g5.4xlarge", "p4d.24xlarge", "g6e.xlarge", "m5.4xlarge")
OPTIONAL_TEXT = ("x_UsageType", "SkuPriceDetails", "x_SkuDetails")


def sql_list(values) -> str:
    return ", ".join("'" + str(v).replace("'", "''") + "'" for v in sorted(values))


def generate(n: int, fmt: str, path: Path) -> None:
    """N rows of the perturbed sample (see the module docstring) as FOCUS 1.0 CSV or FOCUS 1.3 Parquet."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    con.execute("SET enable_progress_bar=false")
    # The first n rows of the copies by a filter, not a sort (ORDER BY ... LIMIT held all 20 M wide rows in
    # memory: more than 20 GB), written in the order they come: the totals do not depend on it.
    con.execute("SET preserve_insertion_order=false")
    con.execute(f"CREATE VIEW sample AS SELECT row_number() OVER () - 1 AS i, * "
                f"FROM read_csv('{SAMPLE}', all_varchar=true, nullstr='NULL', header=true)")
    rows = con.execute("SELECT count(*) FROM sample").fetchone()[0]
    copies = -(-n // rows)
    types = "[" + sql_list(TYPES) + "]"
    shift = "INTERVAL ((k % 40) - 5) DAY"
    perturbed = f"""
      SELECT * REPLACE (
        ResourceId || '-' || CAST(k % 1000 AS VARCHAR) AS ResourceId,
        replace(ChargeDescription, 'g5.4xlarge', {types}[1 + k % {len(TYPES)}]) AS ChargeDescription,
        {{cost}} AS BilledCost,
        {{start}} AS ChargePeriodStart, {{end}} AS ChargePeriodEnd)
      FROM (SELECT s.*, r.range AS k FROM range({copies}) r, sample s) WHERE k * {rows} + i < {n}"""
    cost = "CAST(BilledCost AS DOUBLE) * (1 + (k % 13) / 10.0) * CASE WHEN k % 101 = 100 THEN -1 ELSE 1 END"
    if fmt in ("csv", "csv.gz"):
        q = perturbed.format(cost=f"CAST({cost} AS VARCHAR)",
                             start=f"strftime(CAST(ChargePeriodStart AS TIMESTAMP) + {shift}, '%Y-%m-%d %H:%M:%S')",
                             end=f"strftime(CAST(ChargePeriodEnd AS TIMESTAMP) + {shift}, '%Y-%m-%d %H:%M:%S')")
        con.execute(f"COPY ({q.replace('SELECT * REPLACE', 'SELECT * EXCLUDE (i, k) REPLACE', 1)}) TO '{path}' "
                    "(HEADER, DELIMITER ',', NULLSTR 'NULL'" + (", COMPRESSION gzip)" if fmt == "csv.gz" else ")"))
        return
    q = perturbed.format(cost=cost, start=f"CAST(ChargePeriodStart AS TIMESTAMP) + {shift}",
                         end=f"CAST(ChargePeriodEnd AS TIMESTAMP) + {shift}")
    typed = ", ".join(f"TRY_CAST({c} AS DOUBLE) AS {c}" for c in (
        "ConsumedQuantity", "ContractedCost", "EffectiveCost", "ListCost", "PricingQuantity"))
    con.execute(f"""COPY (SELECT * EXCLUDE (i, k, ProviderName, PublisherName, ConsumedQuantity, ContractedCost,
                                     EffectiveCost, ListCost, PricingQuantity),
                          {typed}, ProviderName AS ServiceProviderName, ProviderName,
                          CAST(NULL AS VARCHAR) AS HostProviderName, PublisherName
                   FROM ({q}))
                   TO '{path}' (FORMAT PARQUET, ROW_GROUP_SIZE 200000)""")


def parameters() -> dict:
    """The selection both engines use: read_focus's constants and the default billing settings."""
    from gpufinops.collect.billing import focus
    from gpufinops.collect.billing.settings import billing_settings
    from gpufinops.config import Settings

    bs = billing_settings(Settings())
    return {"families": list(bs.gpu_families), "patterns": list(bs.gpu_patterns), "cost_col": bs.focus_cost_column,
            "max_line_cost": bs.max_line_cost, "max_line_hours": focus.MAX_LINE_HOURS,
            "hour_units": sorted(focus.HOUR_UNITS), "second_units": sorted(focus.SECOND_UNITS),
            "compound_unit": focus.COMPOUND_TIME_UNIT, "non_compute": sorted(focus.NON_COMPUTE_CATEGORIES),
            "machine_label": focus.GCP_MACHINE_LABEL}


def duckdb_sql(source: str, columns: set[str], p: dict) -> str:
    """read_focus's per-instance answer as one DuckDB statement over `source` (a read_csv/read_parquet call)
    whose columns are `columns`. Numbers and dates are cast strictly, as read_focus rejects a bad one."""
    def text(c: str) -> str:
        return f"COALESCE(CAST({c} AS VARCHAR), '')" if c in columns else "''"

    fams = "|".join(sorted(set(p["families"]), key=lambda f: (-len(f), f)))
    # read_focus takes the first [a-z][a-z0-9-]*.[0-9]*[a-z][a-z0-9]* word whose prefix is a GPU family.
    aws = f"(^|[^A-Za-z0-9_-])({fams})\\.[0-9]*[a-z][a-z0-9]*\\b"
    gpu = " OR ".join([f"regexp_matches(txt, '{aws}')"] + [f"regexp_matches(txt, '{pat}')" for pat in p["patterns"]])
    label = (f"CASE WHEN json_valid(Tags) THEN COALESCE(json_extract_string(Tags, '$.\"{p['machine_label']}\"'), '') "
             "ELSE '' END" if "Tags" in columns else "''")
    unit = "lower(trim(COALESCE(ConsumedUnit, '')))"
    category = (f"AND lower(trim(COALESCE(ServiceCategory, ''))) NOT IN ({sql_list(p['non_compute'])})"
                if "ServiceCategory" in columns else "")
    period_h = ("epoch(CAST(ChargePeriodEnd AS TIMESTAMP) - CAST(ChargePeriodStart AS TIMESTAMP)) / 3600.0"
                if "ChargePeriodEnd" in columns else "NULL")
    return f"""
    WITH timed AS (
      SELECT ResourceId, ChargePeriodStart, ChargePeriodEnd_h, {p['cost_col']} AS cost_raw, ConsumedQuantity,
             {unit} AS unit,
             {text('x_UsageType')} || ' ' || COALESCE(ChargeDescription, '') || ' ' || {text('SkuPriceDetails')}
               || ' ' || {text('x_SkuDetails')} || ' ' || {label} AS txt
      FROM (SELECT *, {period_h} AS ChargePeriodEnd_h FROM {source})
      WHERE lower(trim(COALESCE(ChargeCategory, ''))) = 'usage' {category}
        AND ({unit} IN ({sql_list(p['hour_units'] + p['second_units'])})
             OR regexp_matches({unit}, '{p['compound_unit']}'))),
    gpu AS (
      SELECT COALESCE(CAST(ResourceId AS VARCHAR), '') AS rid, CAST(ChargePeriodStart AS TIMESTAMP) AS period,
             CAST(cost_raw AS DOUBLE) AS cost, unit IN ({sql_list(p['second_units'])}) AS secs, ChargePeriodEnd_h,
             CASE WHEN unit IN ({sql_list(p['hour_units'])}) THEN COALESCE(CAST(ConsumedQuantity AS DOUBLE), 0)
                  WHEN unit IN ({sql_list(p['second_units'])}) THEN COALESCE(CAST(ConsumedQuantity AS DOUBLE), 0) / 3600
                  ELSE 0 END AS hours
      FROM timed WHERE {gpu}),
    kept AS (
      SELECT rid, period, cost, secs,
             CASE WHEN secs AND ChargePeriodEnd_h IS NOT NULL THEN LEAST(hours, ChargePeriodEnd_h) ELSE hours END AS hours
      FROM gpu
      WHERE period >= TIMESTAMP '{START}' AND period < TIMESTAMP '{END}'
        AND cost IS NOT NULL AND cost >= 0 AND cost <= {p['max_line_cost']!r}
        AND hours >= 0 AND hours <= {p['max_line_hours']!r}),
    once AS (  -- a seconds-unit instance-period counts its longest row's hours once
      SELECT rid, cost, CASE WHEN secs AND row_number() OVER (PARTITION BY rid, period, secs ORDER BY hours DESC) > 1
                             THEN 0 ELSE hours END AS hours FROM kept)
    SELECT rid, SUM(cost), SUM(hours) FROM once GROUP BY rid
    """


def yardstick_source(path: Path, fmt: str) -> str:
    return (f"read_parquet('{path}')" if fmt == "parquet" else  # read_csv reads .gz by its name
            f"read_csv('{path}', all_varchar=true, header=true, nullstr=['NULL', ''])")


def yardstick_statements(path: Path, fmt: str, params: dict) -> list[str]:
    """The yardstick's statements: the file's columns (DESCRIBE, which the SQL depends on), then the totals."""
    import duckdb

    source = yardstick_source(path, fmt)
    describe = f"DESCRIBE SELECT * FROM {source}"
    columns = {r[0] for r in duckdb.connect().execute(describe).fetchall()}
    return [describe, duckdb_sql(source, columns, params)]


def run_engine(engine: str, fmt: str, path: Path, params: dict) -> dict:
    """One run of `engine` (duckdb, replay, cli, or in this script's child gpufinops / cli-s3)."""
    if engine == "duckdb":
        r = run_process(yardstick_command(params["yardstick"][str(path)]))
        return r | {"totals": {k: (c, h) for k, c, h in json.loads(r["stdout"])[-1]}}
    if engine == "replay":
        return replay("focus", path, "instance")
    if engine in ("cli", "before"):
        env = environment(root=Path(params["before"])) if engine == "before" else None
        r = run_process([*gpufinops_command(), *costs_args("focus", START[:7], str(path), "instance")], env)
        return r | {"totals": printed_totals(r["stdout"], "instance")}
    return run_child(engine, fmt, path, params)


def child(engine: str, fmt: str, path: str, params: dict) -> None:
    """gpufinops (read_focus, the cost table) or cli-s3 (the command on the S3 copy, counting what s3fetch
    fetches), in this script's child: its peak memory (VmHWM) is the engine's."""
    from datetime import datetime, timezone

    if engine == "gpufinops":
        from gpufinops.collect.billing.focus import read_focus
        from gpufinops.collect.billing.settings import billing_settings
        from gpufinops.config import Settings

        start, end = (datetime.fromisoformat(d).replace(tzinfo=timezone.utc) for d in (START, END))
        t = read_focus(path, start, end, billing_settings(Settings())).table
        sums = t.groupby("resource_id")[["cost", "usage_hours"]].sum()
        totals = {k: (c, h) for k, c, h in zip(sums.index, sums["cost"], sums["usage_hours"])}
        fetched: list[int] = []
    else:
        import contextlib
        import io

        from gpufinops.cli import main

        fetched = count_s3_bytes()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main([*cli_s3_args(engine, params), *costs_args("focus", START[:7], s3_path(engine, path), "instance")])
        assert rc == 0, rc
        totals = printed_totals(out.getvalue(), "instance")
    print(json.dumps({"engine": engine, "peak_mib": vm_hwm_mib(), "totals": totals,
                      "fetched_mib": sum(fetched) / 2**20, "gets": len(fetched)}))


def run_child(engine: str, fmt: str, path: Path, params: dict) -> dict:
    return run_script_child(__file__, engine, fmt, path, params)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, action="append", help="rows (repeatable; default 1 M and 5 M)")
    ap.add_argument("--format", action="append", choices=["csv", "csv.gz", "parquet"],
                    help="file format (default csv and parquet)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per engine, interleaved; medians are kept")
    ap.add_argument("--table", action="store_true", help="also time read_focus (the cost table, --save's path)")
    ap.add_argument("--s3", action="store_true", help="also the command on the file in a local moto S3 server")
    ap.add_argument("--before", metavar="CHECKOUT", help="also the command run from another checkout's code "
                    "(e.g. `git worktree add /tmp/before main`): engine 'before', in the same rounds")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        engine, fmt, path, params = args.child
        child(engine, fmt, path, json.loads(params))
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    params = parameters()
    engines = ([*YARDSTICKS, "cli"] + (["before"] if args.before else []) + (["gpufinops"] if args.table else [])
               + (["cli-s3"] if args.s3 else []))
    params["before"] = args.before
    files = {}
    for n in args.rows or [1_000_000, 5_000_000]:
        for fmt in args.format or ["csv", "parquet"]:
            path = files[n, fmt] = OUT / (f"focus1.0_{n}.{fmt}" if fmt.startswith("csv") else f"focus1.3_{n}.parquet")
            if not path.exists():
                t0 = time.perf_counter()
                generate(n, fmt, path)
                print(f"generated {path} in {time.perf_counter() - t0:.1f} s")
    params["yardstick"] = {str(path): yardstick_statements(path, fmt, params) for (n, fmt), path in files.items()}
    with contextlib.ExitStack() as stack:
        if args.s3:
            params["s3_config"] = stack.enter_context(s3_server(files.values()))
        return measure(args, engines, params, files)


def measure(args, engines: list[str], params: dict, files: dict) -> int:
    explain("focus")
    failed = False
    for (n, fmt), path in files.items():
        size = path.stat().st_size / 2**20
        print(f"\nFOCUS {n:,} rows ({size:.0f} MiB {fmt}), by instance, {args.repeat} runs each")
        print(RATIO_HEADER)
        print(HEADER)
        best = medians_interleaved(engines, args.repeat, lambda e: run_engine(e, fmt, path, params))
        base = best["duckdb"]
        ok = True
        for e in engines:
            r = best[e]
            print(f"{e:>10} " + figures_line(r, best)
                  + (f"  {r['fetched_mib']:.0f} MiB in {r['gets']} GETs" if e == "cli-s3" else ""))
            diff = differences(r["totals"], base["totals"]) if "totals" in r else (
                [] if r["same"] else ["the replay fetched other rows than the command"])
            if diff:
                ok, failed = False, True
                print(f"  {e} totals differ from duckdb's by {CENT:g} or more: {len(diff)} key(s), e.g. {diff[:3]}")
        total = sum(c for c, _ in base["totals"].values())
        hours = sum(h for _, h in base["totals"].values())
        print(f"totals equal to the cent across engines: {ok} (sum {total:,.2f}, {hours:,.2f} h)")
        print(over_goal(best) or "goal met: the command within 1.2x both yardsticks' wall and CPU")
    if failed:
        print("FAILED: the engines' per-instance totals differ (see above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
