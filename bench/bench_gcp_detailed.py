"""Google Cloud's detailed usage cost export: the whole `gpufinops costs --source gcp-detailed --by instance` command
on a large export, its wall time and peak RSS, and its answer checked to the cent against one plain DuckDB statement.

The input is tests/data/gcp_detailed/detailed_export.parquet (made-up rows in Google's nested schema) repeated to N
rows: copy k renames each VM `<name>-<k % 2000>` (about 6,000 GPU VMs in the answer), moves its hours by k % 700
hours (some copies fall in October: excluded) and scales its cost by 1 + (k % 13) / 10. Written once as Parquet
(nested records, as BigQuery's EXPORT DATA writes them) into $GPUFINOPS_BENCH_DATA (default <tmp>/gpufinops-bench).

    python bench/bench_gcp_detailed.py                       # 1 M rows
    python bench/bench_gcp_detailed.py --rows 5000000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "gcp_detailed" / "detailed_export.parquet"


def generate(rows: int) -> Path:
    import duckdb

    folder = Path(os.environ.get("GPUFINOPS_BENCH_DATA", Path(tempfile.gettempdir()) / "gpufinops-bench"))
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"gcp_detailed_{rows}.parquet"
    if out.exists():
        return out
    con = duckdb.connect()
    n = con.execute(f"SELECT count(*) FROM read_parquet('{FIXTURE}')").fetchone()[0]
    copies = -(-rows // n)
    con.execute(f"""
      COPY (
        SELECT * REPLACE (
                 struct_pack(name := resource.name || '-' || (k % 2000),
                             global_name := resource.global_name || (k % 2000)) AS resource,
                 usage_start_time + to_hours(k % 700) AS usage_start_time,
                 usage_end_time + to_hours(k % 700) AS usage_end_time,
                 cost * (1 + (k % 13) / 10.0) AS cost)
        FROM read_parquet('{FIXTURE}'), range({copies}) AS t(k)
        LIMIT {rows}
      ) TO '{out}' (FORMAT PARQUET)""")
    return out


def reference(path: Path) -> dict[str, float]:
    """Net cost per VM of September 2024, one DuckDB statement (the reader's selection written out by hand)."""
    import duckdb

    q = f"""
      WITH t AS (SELECT *, list_filter(system_labels, lambda x: x.key = 'compute.googleapis.com/machine_spec')[1].value
                             AS machine FROM read_parquet('{path}'))
      SELECT 'gce:' || project.id || '/' || location.zone || '/' || resource.name AS vm,
             SUM(cost + COALESCE(list_sum(list_transform(credits, lambda c: c.amount)), 0))
      FROM t
      WHERE service.description = 'Compute Engine' AND usage.unit IN ('seconds', 'byte-seconds')
        AND (machine SIMILAR TO '(a2|g2)-.*' OR (machine IS NOT NULL AND resource.global_name IN
             (SELECT resource.global_name FROM t WHERE sku.description LIKE '% GPU %')))
        AND usage_start_time >= TIMESTAMPTZ '2024-09-01 00:00:00+00' AND usage_start_time < TIMESTAMPTZ '2024-10-01'
      GROUP BY ALL"""
    return dict(duckdb.connect().execute(q).fetchall())


def run_command(path: Path) -> tuple[float, float, dict[str, float]]:
    """(wall s, peak RSS MiB, cost per VM) of the command in a process of its own."""
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over exec from the parent (this process, which ran
    # DuckDB to make the file and the reference), VmHWM is the command's own.
    code = ("import sys\nfrom gpufinops.cli import main\n"
            f"rc = main(['costs', '--source', 'gcp-detailed', '--path', {str(path)!r}, '--month', '2024-09', "
            "'--by', 'instance', '-o', 'json'])\n"
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
            "print(hwm, file=sys.stderr)\nsys.exit(rc)")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t
    rss = int(proc.stderr.strip().splitlines()[-1]) / 1024.0
    return wall, rss, {r["instance"]: r["cost"] for r in json.loads(proc.stdout)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = generate(args.rows)
    want = reference(path)
    runs = [run_command(path) for _ in range(args.repeat)]
    got = runs[-1][2]
    # To the cent: within half a cent of each other (rounding both flips a sum that lands on x.xx5 by float error).
    same = got.keys() == want.keys() and all(abs(got[k] - want[k]) < 0.005 for k in want)
    print(f"{args.rows:,} rows ({path.stat().st_size / 2**20:.1f} MiB Parquet), {len(got):,} GPU VMs: "
          f"median {statistics.median(r[0] for r in runs):.2f} s wall, peak RSS "
          f"{max(r[1] for r in runs):.0f} MiB; same per-VM cost to the cent as plain DuckDB SQL: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
