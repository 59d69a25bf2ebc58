"""CUR 2.0 per-key totals: the whole `gpufinops costs --by` command vs DuckDB, same answer, same run.

Both compute, over the same generated CUR 2.0 Parquet file, the cost and usage
hours per instance (and per team) of the GPU instance-hours of September 2024:
GPU BoxUsage/SpotUsage lines, RI / savings-plan effective cost, lines with a bad
cost or usage excluded, the team from the first configured tag key that has a
value. DuckDB gets the idiomatic SQL (native map access). Each engine runs in
its own child process, so its peak memory (VmHWM: imports included) is its own;
runs are interleaved and the medians of --repeat are kept (the machine is
shared). The totals of the two engines are compared key by key, to the cent.

    python bench/bench_cur.py                       # 5 M and 20 M line items, by instance and by team
    python bench/bench_cur.py --rows 5000000 --by instance --repeat 5 --s3

"cli" is the whole `gpufinops costs --by ... --source cur -o json` command (settings,
printing) in its child; --s3 adds "cli-s3", the same command on the file put in a
moto S3 server on 127.0.0.1 (run in this process, so its CPU is not the child's):
what it adds is s3fetch's ranged GETs and partial copy (bytes fetched are shown).
The yardstick still reads the local file (DuckDB reads S3 only through its httpfs
extension, a download at run time). Files are generated once into bench/out/
(git-ignored) and reused.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

OUT = Path(__file__).resolve().parent / "out"
SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)
CENT = 0.005


def duckdb_sql(path: Path, by: str, families, team_keys, max_line_cost: float, max_line_hours: float) -> str:
    """The cur_totals() answer as one DuckDB statement."""
    fams = "|".join(sorted(set(families), key=lambda f: (-len(f), f)))
    if by == "instance":
        key = "COALESCE(line_item_resource_id, '')"
    else:
        tried = ", ".join(f"NULLIF(resource_tags['{k}'], '')" for k in team_keys)
        key = f"COALESCE({tried}, '')"
    return f"""
    WITH gpu AS (
      SELECT {key} AS key, COALESCE(line_item_currency_code, '') AS currency,
             CAST(CASE WHEN line_item_line_item_type = 'DiscountedUsage' THEN reservation_effective_cost
                       WHEN line_item_line_item_type = 'SavingsPlanCoveredUsage'
                            THEN savings_plan_savings_plan_effective_cost
                       ELSE line_item_unblended_cost END AS DOUBLE) AS cost,
             CAST(line_item_usage_amount AS DOUBLE) AS hours
      FROM read_parquet('{path}')
      WHERE line_item_usage_start_date >= TIMESTAMP '2024-09-01' AND line_item_usage_start_date < TIMESTAMP '2024-10-01'
        AND line_item_line_item_type IN ('Usage', 'DiscountedUsage', 'SavingsPlanCoveredUsage')
        AND regexp_matches(line_item_usage_type, '(^|-)(BoxUsage|SpotUsage):({fams})\\.[A-Za-z0-9]+$'))
    SELECT key, currency, SUM(cost) AS cost, SUM(hours) AS usage_hours FROM gpu
    WHERE cost >= 0 AND cost <= {max_line_cost!r} AND hours >= 0 AND hours <= {max_line_hours!r}
    GROUP BY key, currency
    """


def vm_hwm_mib() -> float:
    """Peak resident memory of this process. Not ru_maxrss: Linux carries that across
    fork+exec, so a child would report its parent's peak (the file generator)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def parameters() -> dict:
    """The selection both engines use: the default GPU families and team tag keys, the line guards."""
    from gpufinops.collect.billing.cur import MAX_LINE_HOURS
    from gpufinops.config import AwsSettings, TagKeys

    return {"families": list(AwsSettings().gpu_families), "team_keys": list(TagKeys().team),
            "max_line_cost": 100_000.0, "max_line_hours": MAX_LINE_HOURS}


def child(engine: str, by: str, path: str, params: dict) -> None:
    """One engine's answer, its wall and CPU time (all threads; on a shared machine CPU time moves less
    than wall time) and its peak memory. Imports are timed apart (import_s) and not in wall_s, except for
    the cli engine, which is the whole command (its imports happen inside it). The DuckDB child imports
    duckdb only (not gpufinops, pandas or pyarrow), so its peak is DuckDB's own."""
    t0 = time.perf_counter()
    if engine.startswith("cli"):
        from gpufinops.cli import main
    else:
        import duckdb
    import_s = time.perf_counter() - t0
    fetched = count_s3_bytes() if engine == "cli-s3" else []
    t0, c0 = time.perf_counter(), cpu_s()
    if engine.startswith("cli"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main([*cli_s3_args(engine, params), "costs", "--month", "2024-09", "--source", "cur", "--path",
                       s3_path(engine, path), "--by", by, "-o", "json"])
        assert rc == 0, rc
        label = "(untagged)" if by == "team" else "(none)"
        totals = {("" if r[by] == label else r[by]): (r["cost"], r["usage_hours"]) for r in json.loads(out.getvalue())}
    else:
        con = duckdb.connect()
        con.execute("SET TimeZone='UTC'")
        rows = con.execute(duckdb_sql(Path(path), by, params["families"], params["team_keys"],
                                      params["max_line_cost"], params["max_line_hours"])).fetchall()
        totals = {k: (c, h) for k, _, c, h in rows}
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    print(json.dumps({"engine": engine, "wall_s": wall, "cpu_s": cpu, "import_s": import_s,
                      "peak_mib": vm_hwm_mib(), "totals": totals, "fetched_mib": sum(fetched) / 2**20,
                      "gets": len(fetched)}))


# --------------------------------------------------------------------------- the s3:// engine (--s3)


def count_s3_bytes() -> list[int]:
    """The size of every range s3fetch asks for, appended as it asks (list.append is atomic: GETs run in
    threads)."""
    from gpufinops.collect.billing import s3fetch

    sizes: list[int] = []
    get = s3fetch._Object._get

    def counted(self, start: int, end: int, fd=None):
        sizes.append(end - start)
        return get(self, start, end, fd)

    s3fetch._Object._get = counted
    return sizes


def cli_s3_args(engine: str, params: dict) -> list[str]:
    return ["--config", params["s3_config"]] if engine == "cli-s3" else []


def s3_path(engine: str, path: str) -> str:
    return f"s3://{S3_BUCKET}/{Path(path).name}" if engine == "cli-s3" else path


S3_BUCKET = "bench-billing"


@contextlib.contextmanager
def s3_server(files) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 in this process holding `files` in S3_BUCKET under their names, and the
    gpufinops config file that points at it (fake credentials in this process' environment, for the
    children)."""
    import logging
    import tempfile

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        s3.create_bucket(Bucket=S3_BUCKET)
        for f in files:
            s3.upload_file(str(f), S3_BUCKET, Path(f).name)
        with tempfile.TemporaryDirectory() as d:
            config = Path(d) / "gpufinops.yaml"
            config.write_text(f"aws:\n  endpoint_url: {url}\n")
            yield str(config)
    finally:
        server.stop()


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_script_child(script: str, engine: str, grain: str, path: Path, params: dict) -> dict:
    """One engine's run in a child process of `script --child ...` (its own peak memory): its last JSON line."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run([sys.executable, script, "--child", engine, grain, str(path), json.dumps(params)],
                         check=True, capture_output=True, text=True)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # The whole process (interpreter start, imports, answer, exit): what a person running the command waits.
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"proc_wall_s": wall, "proc_cpu_s": cpu}


def run_child(engine: str, by: str, path: Path, params: dict) -> dict:
    return run_script_child(__file__, engine, by, path, params)


def best_interleaved(engines, repeat: int, run) -> dict[str, dict]:
    """`run(engine)` for each engine in turn, `repeat` rounds (the shared machine's noise spread over all):
    per engine the median wall time, CPU time and peak memory."""
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for _ in range(repeat):
        for e in engines:
            runs[e].append(run(e))
    from statistics import median

    return {e: r[0] | {k: median(x[k] for x in r) for k in ("wall_s", "cpu_s", "import_s", "peak_mib",
                                                                    "proc_wall_s", "proc_cpu_s")}
            for e, r in runs.items()}


def differences(a: dict, b: dict) -> list[str]:
    """Keys whose cost or hours differ by a cent (or an hour's hundredth) or more, or that one side lacks."""
    out = [f"{k!r} only in one" for k in sorted(set(a) ^ set(b))]
    for k in sorted(set(a) & set(b)):
        (ca, ha), (cb, hb) = a[k], b[k]
        if abs(ca - cb) >= CENT or abs(ha - hb) >= CENT:
            out.append(f"{k!r}: cost {ca:.4f} vs {cb:.4f}, hours {ha:.4f} vs {hb:.4f}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, action="append", help="line items (repeatable; default 5 M and 20 M)")
    ap.add_argument("--by", action="append", choices=["instance", "team"], help="grain (default both)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per engine, interleaved; medians are kept")
    ap.add_argument("--cli", action="store_true", help=argparse.SUPPRESS)  # always on now; kept for old commands
    ap.add_argument("--s3", action="store_true", help="also the command on the file in a local moto S3 server")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        engine, by, path, params = args.child
        child(engine, by, path, json.loads(params))
        return 0
    from gpufinops.collect.billing.synth import generate_cur

    OUT.mkdir(parents=True, exist_ok=True)
    engines = ["duckdb", "cli"] + (["cli-s3"] if args.s3 else [])
    params = parameters()
    for n in args.rows or [5_000_000, 20_000_000]:
        path = OUT / f"cur2_{n}.parquet"
        if not path.exists():
            t0 = time.perf_counter()
            generate_cur(path, n)
            print(f"generated {path} in {time.perf_counter() - t0:.1f} s")
    with contextlib.ExitStack() as stack:
        if args.s3:
            params["s3_config"] = stack.enter_context(s3_server(OUT / f"cur2_{n}.parquet"
                                                                for n in args.rows or [5_000_000, 20_000_000]))
        return measure(args, engines, params)


def measure(args, engines: list[str], params: dict) -> int:
    print(f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.1f}")
    print("wall / cpu: the whole child process (interpreter, imports, answer, exit); medians of --repeat")
    print(f"{'line items':>11} {'file MiB':>9} {'by':>9} {'engine':>10} {'wall s':>8} {'cpu s':>7} {'import s':>9} "
          f"{'peak MiB':>9} {'keys':>6} {'wall x':>7} {'cpu x':>6} {'mem x':>6}")
    failed = False
    for n in args.rows or [5_000_000, 20_000_000]:
        path = OUT / f"cur2_{n}.parquet"
        size = path.stat().st_size / 2**20
        for by in args.by or ["instance", "team"]:
            best = best_interleaved(engines, args.repeat, lambda e: run_child(e, by, path, params))
            base = best["duckdb"]
            for e in engines:
                r = best[e]
                print(f"{n:>11,} {size:>9.0f} {by:>9} {e:>10} {r['proc_wall_s']:>8.2f} {r['proc_cpu_s']:>7.2f} {r['import_s']:>9.2f} "
                      f"{r['peak_mib']:>9.0f} "
                      f"{len(r['totals']):>6} {r['proc_wall_s'] / base['proc_wall_s']:>6.2f}x {r['proc_cpu_s'] / base['proc_cpu_s']:>5.2f}x "
                      f"{r['peak_mib'] / base['peak_mib']:>5.2f}x"
                      + (f"  {r['fetched_mib']:.0f} MiB in {r['gets']} GETs" if e == "cli-s3" else ""))
                diff = differences(r["totals"], base["totals"])
                if diff:
                    failed = True
                    print(f"  {e} totals differ from duckdb's: {len(diff)} key(s), e.g. {diff[:3]}")
            total = sum(c for c, _ in base["totals"].values())
            print(f"{'':>11} totals equal to the cent across engines: {not failed} (sum {total:,.2f})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
