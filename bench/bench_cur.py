"""CUR 2.0 per-key totals: the whole `gpufinops costs --by` process vs a DuckDB process, same answer, same run.

Both compute, over the same generated CUR 2.0 Parquet file, the cost and usage
hours per instance (and per team) of the GPU instance-hours of September 2024:
GPU BoxUsage/SpotUsage lines, RI / savings-plan effective cost, lines with a bad
cost or usage excluded, the team from the first configured tag key that has a
value. The totals of the two are compared key by key, to the cent.

"cli" is the command as a person runs it: the installed `gpufinops` script,
`gpufinops costs --month 2024-09 --source cur --path FILE --by instance -o json`,
its own process from interpreter start to exit (this checkout's code first on
PYTHONPATH; no config file, the built-in defaults). "duckdb", the yardstick, is a
process too: `python -c` that imports duckdb only, runs the idiomatic SQL
(`duckdb_sql`, native map access) and prints the rows as JSON. Each process is
started by a small launcher (fork + exec, as a shell does) that reads its wall
time, its CPU time (user + system, all threads) and its peak memory (ru_maxrss)
from wait4: the process's own, nothing of this script's. Runs are interleaved and
the medians of --repeat are kept (the machine is shared).

    python bench/bench_cur.py                       # 5 M and 20 M line items, by instance and by team
    python bench/bench_cur.py --rows 5000000 --by instance --repeat 5 --s3

--s3 adds "cli-s3", the same command on the file put in a moto S3 server on
127.0.0.1 (run in this process, so its CPU is not the child's), run inside a
child of this script that counts what s3fetch's ranged GETs fetch (bytes
fetched are shown). The yardstick still reads the local file (DuckDB reads S3
only through its httpfs extension, a download at run time). Files are generated
once into $GPUFINOPS_BENCH_DATA (default: <tmp>/gpufinops-bench, outside the
checkout: 20 M lines are 340 MiB) and reused.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from process_timing import environment, gpufinops_command, medians_interleaved, run_process

OUT = Path(os.environ.get("GPUFINOPS_BENCH_DATA") or Path(tempfile.gettempdir()) / "gpufinops-bench")
SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)
CENT = 0.005
GOAL = 1.2  # the whole command's wall and CPU, each at most this times the DuckDB process's (issue 41)


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


# The yardstick process: imports duckdb only, runs the statements, prints each one's rows (JSON).
YARDSTICK = """import json, sys
import duckdb
con = duckdb.connect()
con.execute("SET TimeZone='UTC'")
con.execute("SET enable_progress_bar=false")  # as the command: a long query's bar would print on stdout
print(json.dumps([con.execute(sql).fetchall() for sql in sys.argv[1:]], default=str))
"""


def yardstick_command(statements: list[str]) -> list[str]:
    return [sys.executable, "-c", YARDSTICK, *statements]


@functools.lru_cache(maxsize=None)
def replayed_statements(source: str, path: Path, by: str, start: datetime = SEP,
                        end: datetime = OCT) -> tuple[tuple[str, ...], tuple]:
    """Every statement the command's DuckDB connection runs for these totals, and what the command fetched of
    each (None: nothing), recorded by running the command's own reader once here with the default settings.
    The second yardstick replays them in a process that imports duckdb only, so the command's ratio to it is
    exactly what gpufinops adds around DuckDB's own work (interpreter start, imports, settings, the Python
    rules, printing); its answers are checked equal to the recorded ones."""
    from gpufinops.collect.billing import duck
    from gpufinops.config import Settings

    statements: list[str] = []
    fetched: list = []

    class Result:
        def __init__(self, con, i):
            self.con, self.i = con, i

        def __getattr__(self, name):  # description, ...: the connection's
            return getattr(self.con, name)

        def fetchall(self):
            fetched[self.i] = self.con.fetchall()
            return fetched[self.i]

        def fetchone(self):
            fetched[self.i] = [self.con.fetchone()]
            return fetched[self.i][0]

    class Recording:
        def __init__(self, con):
            self.con = con

        def __getattr__(self, name):
            return getattr(self.con, name)

        def execute(self, sql, *args):
            assert not args, "the command's statements carry their values in the text"
            statements.append(sql)
            fetched.append(None)
            return Result(self.con.execute(sql), len(statements) - 1)

    import logging

    connect = duck.connect
    duck.connect = lambda: Recording(connect())
    logging.disable(logging.WARNING)  # the file's warnings are the command's to print, not this table's
    try:
        duck.file_totals(Settings(), start, end, by, source, str(path))
    finally:
        duck.connect = connect
        logging.disable(logging.NOTSET)
    return tuple(statements), tuple(json.loads(json.dumps(f, default=str)) for f in fetched)


def replay(source: str, path: Path, by: str) -> dict:
    """One run of the replaying yardstick; `same` says whether it fetched what the command did."""
    statements, fetched = replayed_statements(source, path, by)
    r = run_process(yardstick_command(list(statements)))
    got = json.loads(r["stdout"])
    same = len(got) == len(fetched) and all(f is None or same_rows(f, g[:len(f)]) for f, g in zip(fetched, got))
    return r | {"same": same, "statements": len(statements)}


def same_rows(a: list, b: list) -> bool:
    """The same rows in any order (a GROUP BY's order is the threads', as a list(DISTINCT ...)'s items are),
    sums equal to a millionth of a cent (a parallel sum's last bits depend on the order its threads add in)."""
    def canon(v):
        return sorted((canon(x) for x in v), key=repr) if isinstance(v, list) else v

    def order(rows):
        rows = [[canon(v) for v in row] for row in rows]
        return sorted(rows, key=lambda row: [v for v in row if not isinstance(v, float)].__repr__())

    def close(x, y) -> bool:
        if isinstance(x, float) or isinstance(y, float):
            return x is not None and y is not None and abs(x - y) <= 1e-8 * max(1.0, abs(x), abs(y))
        return x == y

    return len(a) == len(b) and all(len(x) == len(y) and all(map(close, x, y)) for x, y in zip(order(a), order(b)))


def costs_args(source: str, month: str, path: str, by: str) -> list[str]:
    """`gpufinops costs` as a person runs it for a file's totals (JSON, to compare them key by key)."""
    return ["costs", "--month", month, "--source", source, "--path", path, "--by", by, "-o", "json"]


def printed_totals(stdout: str, by: str) -> dict:
    """{key: (cost, hours)} of `costs -o json`'s output, the empty key's label read back as ''."""
    label = "(untagged)" if by in ("team", "project") else "(none)"
    return {("" if r[by] == label else r[by]): (r["cost"], r["usage_hours"]) for r in json.loads(stdout)}


def run_engine(engine: str, by: str, path: Path, params: dict) -> dict:
    """One run of `engine` (duckdb, cli or cli-s3): its wall_s, cpu_s, peak_mib and totals."""
    if engine == "duckdb":
        r = run_process(yardstick_command([duckdb_sql(path, by, params["families"], params["team_keys"],
                                                      params["max_line_cost"], params["max_line_hours"])]))
        return r | {"totals": {k: (c, h) for k, _, c, h in json.loads(r["stdout"])[-1]}}
    if engine == "replay":
        return replay("cur", path, by)
    if engine in ("cli", "before"):
        env = environment(root=Path(params["before"])) if engine == "before" else None
        r = run_process([*gpufinops_command(), *costs_args("cur", "2024-09", str(path), by)], env)
        return r | {"totals": printed_totals(r["stdout"], by)}
    return run_child(engine, by, path, params)


def child(engine: str, by: str, path: str, params: dict) -> None:
    """The cli-s3 engine: the command in this script's child, which counts the bytes s3fetch's ranged GETs
    fetch (a patch in the process, so not the installed script's process)."""
    from gpufinops.cli import main

    fetched = count_s3_bytes()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([*cli_s3_args(engine, params), *costs_args("cur", "2024-09", s3_path(engine, path), by)])
    assert rc == 0, rc
    print(json.dumps({"engine": engine, "peak_mib": vm_hwm_mib(), "totals": printed_totals(out.getvalue(), by),
                      "fetched_mib": sum(fetched) / 2**20, "gets": len(fetched)}))


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
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"wall_s": wall, "cpu_s": cpu}


def run_child(engine: str, by: str, path: Path, params: dict) -> dict:
    return run_script_child(__file__, engine, by, path, params)


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
    ap.add_argument("--before", metavar="CHECKOUT", help="also the command run from another checkout's code "
                    "(e.g. `git worktree add /tmp/before main`): engine 'before', in the same rounds")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        engine, by, path, params = args.child
        child(engine, by, path, json.loads(params))
        return 0
    from gpufinops.collect.billing.synth import generate_cur

    OUT.mkdir(parents=True, exist_ok=True)
    engines = [*YARDSTICKS, "cli"] + (["before"] if args.before else []) + (["cli-s3"] if args.s3 else [])
    params = parameters() | {"before": args.before}
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


YARDSTICKS = ("duckdb", "replay")


def figures_line(r: dict, best: dict) -> str:
    """wall s, cpu s, peak MiB, keys, and the ratios to each yardstick (x duckdb: wall cpu mem; x replay:
    wall cpu)."""
    d, p = best["duckdb"], best["replay"]
    keys = len(r["totals"]) if "totals" in r else ("same" if r["same"] else "DIFF")  # replay: as the command's
    return (f"{r['wall_s']:>8.2f} {r['cpu_s']:>7.2f} {r['peak_mib']:>9.0f} {keys:>6} "
            f"{r['wall_s'] / d['wall_s']:>6.2f}x {r['cpu_s'] / d['cpu_s']:>5.2f}x {r['peak_mib'] / d['peak_mib']:>5.2f}x "
            f"{r['wall_s'] / p['wall_s']:>6.2f}x {r['cpu_s'] / p['cpu_s']:>5.2f}x")


HEADER = (f"{'engine':>10} {'wall s':>8} {'cpu s':>7} {'peak MiB':>9} {'keys':>6} "
          f"{'wall':>7} {'cpu':>6} {'mem':>6}   {'wall':>6} {'cpu':>6}")
RATIO_HEADER = f"{'':>10} {'':>8} {'':>7} {'':>9} {'':>6} {'--- x duckdb ---':>21}   {'- x replay -':>13}"


def explain(source: str) -> None:
    print(f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.1f}")
    print(f"cli:    {' '.join(gpufinops_command())} {' '.join(costs_args(source, '2024-09', 'FILE', 'BY'))}")
    print("duckdb: a process that imports duckdb only and runs the idiomatic SQL of the same totals")
    print("replay: a process that imports duckdb only and replays the command's own DuckDB statements")
    print("wall / cpu / peak: the whole process (interpreter, imports, answer, exit); medians of --repeat")


def over_goal(best: dict) -> str | None:
    g = best["cli"]
    ratios = {f"{k} x {y}": g[f"{k}_s"] / best[y][f"{k}_s"] for y in YARDSTICKS for k in ("wall", "cpu")}
    over = {k: v for k, v in ratios.items() if v > GOAL}
    return (f"costs is over the goal ({GOAL}x both yardsticks' wall and CPU): "
            + ", ".join(f"{k} {v:.2f}" for k, v in over.items())) if over else None


def measure(args, engines: list[str], params: dict) -> int:
    explain("cur")
    failed = False
    for n in args.rows or [5_000_000, 20_000_000]:
        path = OUT / f"cur2_{n}.parquet"
        size = path.stat().st_size / 2**20
        for by in args.by or ["instance", "team"]:
            print(f"\nCUR 2.0 {n:,} line items ({size:.0f} MiB Parquet), by {by}, {args.repeat} runs each")
            print(RATIO_HEADER)
            print(HEADER)
            best = medians_interleaved(engines, args.repeat, lambda e: run_engine(e, by, path, params))
            base = best["duckdb"]
            for e in engines:
                r = best[e]
                print(f"{e:>10} " + figures_line(r, best)
                      + (f"  {r['fetched_mib']:.0f} MiB in {r['gets']} GETs" if e == "cli-s3" else ""))
                diff = differences(r["totals"], base["totals"]) if "totals" in r else (
                    [] if r["same"] else ["the replay fetched other rows than the command"])
                if diff:
                    failed = True
                    print(f"  {e} totals differ from duckdb's: {len(diff)} key(s), e.g. {diff[:3]}")
            total = sum(c for c, _ in base["totals"].values())
            print(f"totals equal to the cent across engines: {not failed} (sum {total:,.2f})")
            print(over_goal(best) or f"goal met: the command within {GOAL}x both yardsticks' wall and CPU")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
