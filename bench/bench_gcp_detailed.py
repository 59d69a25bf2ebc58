"""Google Cloud's detailed usage cost export: the whole `gpufinops costs --source gcp-detailed --by instance` command
on a large export, its wall time and peak RSS, and its answer checked to the cent against one plain DuckDB statement.

The input is tests/data/gcp_detailed/detailed_export.parquet (made-up rows in Google's nested schema) repeated to N
rows: copy k renames each VM `<name>-<k % 2000>` (about 6,000 GPU VMs in the answer), moves its hours by k % 700
hours (some copies fall in October: excluded) and scales its cost by 1 + (k % 13) / 10. Written once as Parquet
(nested records, as BigQuery's EXPORT DATA writes them) into $GPUFINOPS_BENCH_DATA (default <tmp>/gpufinops-bench).

    python bench/bench_gcp_detailed.py                       # 1 M rows
    python bench/bench_gcp_detailed.py --rows 5000000 --repeat 3
    python bench/bench_gcp_detailed.py --baseline /tmp/before   # also an older checkout's command, same rounds
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


def reference_sql(path: Path) -> str:
    """Net cost per VM of September 2024, one DuckDB statement (the reader's selection written out by hand). Its CTE
    NOT MATERIALIZED: read twice, as DuckDB does by default it would be written out first, and the yardstick ran 2.5
    to 3 times slower (0.55 against 0.22 CPU-s at 1 M rows, 2.7 against 0.95 at 5 M)."""
    return f"""
      WITH t AS NOT MATERIALIZED (SELECT *, list_filter(system_labels, lambda x: x.key = 'compute.googleapis.com/machine_spec')[1].value
                             AS machine FROM read_parquet('{path}'))
      SELECT 'gce:' || project.id || '/' || location.zone || '/' || resource.name AS vm,
             SUM(cost + COALESCE(list_sum(list_transform(credits, lambda c: c.amount)), 0))
      FROM t
      WHERE service.description = 'Compute Engine' AND usage.unit IN ('seconds', 'byte-seconds')
        AND (machine SIMILAR TO '(a2|g2)-.*' OR (machine IS NOT NULL AND resource.global_name IN
             (SELECT resource.global_name FROM t WHERE sku.description LIKE '% GPU %')))
        AND usage_start_time >= TIMESTAMPTZ '2024-09-01 00:00:00+00' AND usage_start_time < TIMESTAMPTZ '2024-10-01'
      GROUP BY ALL"""


def _in_process(code: str, env: dict | None = None, cwd: Path | None = None) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MiB, stdout) of `code` run by this Python in a process of its own."""
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over exec from the parent (this process, which ran
    # DuckDB to make the file), VmHWM is the child's own. CPU from the child's own /proc/self/stat at its end.
    tail = ("\nimport os, sys\nhwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
            "t = os.times()\nprint(hwm, t.user + t.system, file=sys.stderr)\n")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code + tail], capture_output=True, text=True, check=True,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    wall = time.perf_counter() - t
    hwm, cpu = proc.stderr.strip().splitlines()[-1].split()
    return wall, float(cpu), int(hwm) / 1024.0, proc.stdout


def run_reference(path: Path) -> tuple[float, float, float, dict[str, float]]:
    """The yardstick: a process that imports only DuckDB and runs the same totals."""
    # No progress bar: DuckDB draws one on stdout for a statement over 2 s (5 M rows on a loaded machine).
    code = ("import duckdb, json\ncon = duckdb.connect()\ncon.execute('SET enable_progress_bar=false')\n"
            f"print(json.dumps(dict(con.execute({reference_sql(path)!r}).fetchall())))")
    wall, cpu, rss, out = _in_process(code)
    return wall, cpu, rss, json.loads(out)


def run_command(path: Path, root: Path = ROOT) -> tuple[float, float, float, dict[str, float]]:
    """(wall s, CPU s, peak RSS MiB, cost per VM) of the command of the checkout at `root` in a process of its own
    (run in `root`: `python -c` puts the working folder before PYTHONPATH)."""
    code = ("import sys\nfrom gpufinops.cli import main\n"
            f"rc = main(['costs', '--source', 'gcp-detailed', '--path', {str(path)!r}, '--month', '2024-09', "
            "'--by', 'instance', '-o', 'json'])\n"
            "if rc: sys.exit(rc)")
    wall, cpu, rss, out = _in_process(code, {"PYTHONPATH": str(root)}, cwd=root)
    return wall, cpu, rss, {r["instance"]: r["cost"] for r in json.loads(out)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another checkout (git worktree) whose command is timed too")
    args = ap.parse_args()
    path = generate(args.rows)
    runs, refs, base = [], [], []
    load = os.getloadavg()[0]
    for _ in range(args.repeat):  # interleaved, so that a neighbour's load falls on all
        refs.append(run_reference(path))
        runs.append(run_command(path))
        if args.baseline:
            base.append(run_command(path, args.baseline.resolve()))
    want = refs[-1][3]

    def same_cents(got: dict[str, float]) -> bool:
        # To the cent: within half a cent of each other (rounding both flips a sum on x.xx5 by float error).
        return got.keys() == want.keys() and all(abs(got[k] - want[k]) < 0.005 for k in want)

    got, same = runs[-1][3], same_cents(runs[-1][3])

    def med(rows, i):
        return statistics.median(r[i] for r in rows)

    print(f"{args.rows:,} rows ({path.stat().st_size / 2**20:.1f} MiB Parquet), {len(got):,} GPU VMs, medians of "
          f"{args.repeat}:\n"
          f"  costs --source gcp-detailed: {med(runs, 0):.2f} s wall, {med(runs, 1):.2f} CPU-s, peak RSS "
          f"{max(r[2] for r in runs):.0f} MiB\n"
          f"  DuckDB alone, same totals:   {med(refs, 0):.2f} s wall, {med(refs, 1):.2f} CPU-s, peak RSS "
          f"{max(r[2] for r in refs):.0f} MiB\n"
          f"  ratio: {med(runs, 0) / med(refs, 0):.2f}x wall, {med(runs, 1) / med(refs, 1):.2f}x CPU; "
          f"same per-VM cost to the cent: {same}")
    if base:
        print(f"  baseline {args.baseline}: {med(base, 0):.2f} s wall, {med(base, 1):.2f} CPU-s, peak RSS "
              f"{max(r[2] for r in base):.0f} MiB; ratio {med(base, 0) / med(refs, 0):.2f}x wall, "
              f"{med(base, 1) / med(refs, 1):.2f}x CPU; same to the cent: {same_cents(base[-1][3])}")
    print(f"  load average (1 min) {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
