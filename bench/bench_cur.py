"""CUR 2.0 aggregation benchmark: gpufinops (pyarrow) vs DuckDB on the same Parquet, same run.

Aggregates GPU instance usage to cost per instance per day (the read_cur()
selection: GPU BoxUsage/SpotUsage lines, RI/SP effective cost, tags) for a
generated CUR 2.0 file of N line items. Each engine runs in its own child
process so peak memory (ru_maxrss) is that engine's alone.

    python bench/bench_cur.py                 # 1M and 10M rows
    python bench/bench_cur.py --rows 1000000  # one size

Files are generated once into bench/out/ (git-ignored) and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)


def duckdb_sql(path: Path, families) -> str:
    """The same aggregation written the idiomatic DuckDB way (native map access, no JSON)."""
    fams = "|".join(sorted(families, key=lambda f: (-len(f), f)))
    return f"""
    SELECT CAST(line_item_usage_start_date AS DATE) AS date, line_item_usage_account_id, product_region_code,
           line_item_resource_id, regexp_extract(line_item_usage_type, ':([a-z0-9-]+\\.[A-Za-z0-9]+)$', 1) AS itype,
           CASE WHEN line_item_line_item_type = 'DiscountedUsage' THEN 'reserved'
                WHEN line_item_line_item_type = 'SavingsPlanCoveredUsage' THEN 'savings-plan'
                WHEN contains(line_item_usage_type, 'SpotUsage:') THEN 'spot' ELSE 'on-demand' END AS pricing,
           line_item_currency_code, resource_tags,
           SUM(CASE WHEN line_item_line_item_type = 'DiscountedUsage' THEN reservation_effective_cost
                    WHEN line_item_line_item_type = 'SavingsPlanCoveredUsage' THEN savings_plan_savings_plan_effective_cost
                    ELSE line_item_unblended_cost END) AS cost,
           SUM(line_item_usage_amount) AS hours
    FROM read_parquet('{path}')
    WHERE line_item_usage_start_date >= TIMESTAMP '2024-09-01' AND line_item_usage_start_date < TIMESTAMP '2024-10-01'
      AND line_item_line_item_type IN ('Usage', 'DiscountedUsage', 'SavingsPlanCoveredUsage')
      AND regexp_matches(line_item_usage_type, '(^|-)(BoxUsage|SpotUsage):({fams})\\.[A-Za-z0-9]+$')
    GROUP BY ALL
    """


def vm_hwm_mib() -> float:
    """Peak resident memory of this process. Not ru_maxrss: Linux carries that across
    fork+exec, so a child would report its parent's peak (the file generator)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(engine: str, path: str) -> None:
    from gpufinops.config import AwsSettings

    families = AwsSettings().gpu_families
    t0 = time.perf_counter()
    if engine == "gpufinops":
        from gpufinops.collect.billing.cur import read_cur

        rows = len(read_cur(path, SEP, OCT, families).table)
    else:
        import duckdb

        con = duckdb.connect()
        con.execute("SET TimeZone='UTC'")
        rows = len(con.execute(duckdb_sql(Path(path), families)).fetchall())
    wall = time.perf_counter() - t0
    peak_mib = vm_hwm_mib()
    print(json.dumps({"engine": engine, "wall_s": wall, "peak_mib": peak_mib, "rows_out": rows}))


def run(engine: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", engine, str(path)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, action="append")
    ap.add_argument("--repeat", type=int, default=2, help="runs per engine; the best wall time is kept")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0
    from gpufinops.collect.billing.synth import generate_cur

    OUT.mkdir(parents=True, exist_ok=True)
    print(f"cores: {os.cpu_count()}")
    print(f"{'line items':>11} {'file MiB':>9} {'engine':>10} {'wall s':>8} {'peak MiB':>9} {'rows out':>9}")
    for n in args.rows or [1_000_000, 10_000_000]:
        path = OUT / f"cur2_{n}.parquet"
        if not path.exists():
            t0 = time.perf_counter()
            generate_cur(path, n)
            print(f"generated {path} in {time.perf_counter() - t0:.1f} s")
        size = path.stat().st_size / 2**20
        results = {}
        for engine in ("duckdb", "gpufinops"):
            runs = [run(engine, path) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["wall_s"])
            best["peak_mib"] = max(r["peak_mib"] for r in runs)
            results[engine] = best
            print(f"{n:>11,} {size:>9.0f} {engine:>10} {best['wall_s']:>8.2f} {best['peak_mib']:>9.0f} {best['rows_out']:>9,}")
        ratio = results["gpufinops"]["wall_s"] / results["duckdb"]["wall_s"]
        print(f"{n:>11,} gpufinops / duckdb wall time: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
