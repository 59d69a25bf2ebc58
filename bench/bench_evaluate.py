"""Benchmark: one `window_usage` over 1,000 to 20,000 GPUs in a real Prometheus (and VictoriaMetrics).

For each fleet size a real engine is filled with dcgm-exporter-shaped series (the same helpers the tests
use: tests/promserver.py backfills Prometheus with promtool, tests/vmserver.py imports into
VictoriaMetrics): 8 GPUs per instance, GPU_UTIL + FB_USED + POWER_USAGE at 30 s over the window before
now, and DCGM sentinel samples on a fraction of the GPUs (`--sentinel-gpus`, default 1% of GPUs, each
with ~5% of its samples blank; `--sentinel-gpus 1` puts them on every GPU).

With `--profiling` every GPU also exports the DCGM profiling ratios a dcgm-exporter with profiling on writes
(GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE and DRAM_ACTIVE of its default CSV, plus SM_ACTIVE and SM_OCCUPANCY
switched on as docs/metrics.md shows), with figures shaped like the measured H200 phases. `--before PATH`
also measures the tick of another version of the collector against the same engine in the same run: a copy of
the gpufinops/collect/prometheus/ package (e.g. `mkdir /tmp/before && git archive HEAD
gpufinops/collect/prometheus | tar -x --strip-components=3 -C /tmp/before`), or the single file
collect/prometheus.py of versions before the split. The machine is shared, so only same-run figures compare.

Two tables:

1. Engine CPU per tick (always): CPU seconds the engine's own process spent (utime + stime from
   /proc/<pid>/stat, read just before and after) for

     1 pass    one plain `max by (<GPU identity>) (max_over_time(DCGM_FI_DEV_GPU_UTIL[w]))` over the
               same window: the least any collector must ask
     tick      one PrometheusMetrics.window_usage over the whole fleet (what the service sends per tick)

   each the median of `--repeat` runs, and the ratio to 1 pass.
2. Client time per tick (`--client`): the tick (one window_usage) against its raw PromQL, the same queries
   (the fixed set, then the detail reads the tick planned) sent the same way, concurrently, with each body read
   and nothing parsed: what any client must wait for. Interleaved (raw, tick, raw, tick...), medians of
   `--repeat`: wall seconds and this process's CPU seconds (time.process_time) for each, and wall tick / raw.
3. Wall time and memory (`--wall`): fixed query set vs the naive way (the same query set once per
   instance, selector instance_id="i-..."), each in a fresh child process: wall time, HTTP queries, peak
   Python heap (tracemalloc, a second traced call) and peak RSS of the child.

4. Sharded ticks (`--shards 1,4`, issue 29.3; instead of the tables above): each tick with `prometheus.shards`
   set, in a fresh child process, against its raw PromQL (the same per-shard query strings, `--shard-parallelism`
   shards at a time, bodies read and dropped), interleaved: wall, client CPU, peak RSS (VmHWM) and the peak over
   the child's RSS before the call, the engine's CPU per tick, and a hash of the result (the same for every
   shard count: the same usage).

    python bench/bench_evaluate.py [--sizes 1000,10000,20000] [--window 3600] [--engines prometheus,vm]
                                   [--wall [--naive]] [--shards 1,4 [--shard-parallelism 2]]

(A read from recorded 5-minute buckets was measured with this script and removed: 1.08 engine CPU-s per tick
at 1k GPUs against 0.52 from the raw samples; BENCHMARKS.md "Prometheus work per tick".)

Progress goes to stderr; the tables to stdout.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.promserver, when run from anywhere

from gpufinops.collect.prometheus import (  # noqa: E402
    DRAM_ACTIVE, FB_USED, GPU_UTIL, GR_ENGINE_ACTIVE, POWER_USAGE, SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE,
    PrometheusMetrics, PromReader, gpu_identity_labels,
)
from gpufinops.collect.gpu_snapshot import PROCESSES_METRIC  # noqa: E402
from gpufinops.config import PrometheusSettings  # noqa: E402
from gpufinops.model import GpuInstance  # noqa: E402
from tests.promserver import Series, dcgm_labels, start_prometheus  # noqa: E402

GPUS_PER_INSTANCE = 8
SCRAPE_S = 30
SENTINEL = 9.223372036854775e18
FP64_BLANK = 2.0 ** 47
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# Profiling ratios per profile, from the measured H200 phases (docs/metrics.md): (GR engine, SM active,
# SM occupancy, tensor, DRAM) while a kernel runs; 0 between kernels and when idle.
PROFILING_WHEN_RUNNING = {GR_ENGINE_ACTIVE: 0.995, SM_ACTIVE: 0.961, SM_OCCUPANCY: 0.142, TENSOR_ACTIVE: 0.933,
                          DRAM_ACTIVE: 0.174}


def make_fleet(n_gpus: int, now: datetime, window_s: int, sentinel_gpus: float, profiling: bool = False
               ) -> tuple[list[GpuInstance], list[Series]]:
    """The fleet and its series: samples every SCRAPE_S over the window (plus two before it)."""
    rng = random.Random(n_gpus)
    n_inst = n_gpus // GPUS_PER_INSTANCE
    end = now.timestamp()
    n_samples = window_s // SCRAPE_S + 2
    times = [end - SCRAPE_S * (n_samples - 1 - i) for i in range(n_samples)]
    instances, series = [], []
    for k in range(n_inst):
        iid = f"i-{k:017x}"
        ip = f"10.{k // 65536 % 256}.{k // 256 % 256}.{k % 256}"
        host = "ip-" + ip.replace(".", "-")
        instances.append(GpuInstance(iid, "p4d.24xlarge", "us-east-1", "running", now - timedelta(days=2),
                                     private_dns=f"{host}.ec2.internal", private_ip=ip,
                                     gpu_count=GPUS_PER_INSTANCE))
        profile = rng.choice(("idle", "busy", "bursty"))
        for g in range(GPUS_PER_INSTANCE):
            labels = dcgm_labels(host, g, instance_id=iid)
            blank_rate = 0.05 if rng.random() < sentinel_gpus else 0.0
            util = []
            for t in times:
                if rng.random() < blank_rate:
                    v = SENTINEL
                elif profile == "idle":
                    v = 0.0
                elif profile == "busy":
                    v = float(rng.randint(70, 100))
                else:
                    v = float(rng.choice((0, 0, 0, 95)))
                util.append((t, v))
            series.append(Series(GPU_UTIL, labels, util))
            if profiling:  # each ratio follows the utilisation sample: running (x its ratio), not, or blank
                for metric, ratio in PROFILING_WHEN_RUNNING.items():  # (DCGM's blank for a double field: 2^47)
                    series.append(Series(metric, labels, [(t, FP64_BLANK if v >= SENTINEL else round(ratio * v / 100, 4))
                                                          for t, v in util]))
            series.append(Series(FB_USED, labels, [(t, 70000.0 if profile != "idle" else 0.0) for t in times]))
            series.append(Series(POWER_USAGE, labels, [(t, 90.0 + rng.random() * 300) for t in times]))
    return instances, series


# --------------------------------------------------------------------------- engine CPU per tick


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def engine_cpu(pid: int, fn, repeat: int) -> tuple[float, float]:
    """Median engine CPU seconds and median wall seconds of `repeat` calls of fn()."""
    cpu, wall = [], []
    for _ in range(repeat):
        c0, t0 = process_cpu_s(pid), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(process_cpu_s(pid) - c0)
    return statistics.median(cpu), statistics.median(wall)


def one_pass_query(settings: PrometheusSettings, window_s: int) -> str:
    by = ", ".join(gpu_identity_labels(settings.instance_label, settings.hostname_labels))
    return f"max by ({by}) (max_over_time({GPU_UTIL}[{window_s * 1000 - 1}ms]))"


def load_before(path: str):
    """The PrometheusMetrics class of another version of the collector, for a same-run comparison: a copy of the
    collect/prometheus/ package (a folder) or the single collect/prometheus.py of versions before the split."""
    import importlib.util

    name = "gpufinops_collect_prometheus_before"
    if os.path.isdir(path):  # the package: its modules import each other relatively, under this name
        spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                      submodule_search_locations=[path])
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.PrometheusMetrics


def cpu_rows(engine: str, url: str, pid: int, instances, window_s: int, now: datetime, repeat: int,
             before=None) -> list[tuple]:
    settings = PrometheusSettings(url=url, scrape_interval_s=SCRAPE_S, timeout_s=300)
    at = now.timestamp()
    reader = PromReader(settings)
    baseline = one_pass_query(settings, window_s)
    reader.instant(baseline, at)  # warm: index and page cache, as in a running service
    pass_cpu, pass_wall = engine_cpu(pid, lambda: reader.instant(baseline, at), repeat)
    ratio = (lambda cpu: cpu / pass_cpu) if pass_cpu > 0 else (lambda cpu: float("nan"))
    rows = [(engine, "1 pass", pass_cpu, pass_wall, 1, 1.0)]
    versions = [("tick, before", before, settings)] if before is not None else []
    # The profiling reasons (occupancy, tensor and FP pipes) are read once per `profiling_reasons_every_s` and
    # kept between: the tick that reads them, and the ticks between (warmed, so each repeat is one of those).
    versions.append(("tick, reasons read", PrometheusMetrics, settings.model_copy(
        update={"profiling_reasons_every_s": 0})))
    versions.append(("tick, reasons kept", PrometheusMetrics, settings.model_copy(
        update={"profiling_reasons_every_s": 3600})))
    # The default: every tick reads them for a fifth of the instances (its turn, REASON_SLOTS), the rest kept.
    versions.append(("tick, a fifth read (default)", PrometheusMetrics, settings))
    sources = {}
    for what, metrics_class, version_settings in versions:
        source = sources[what] = metrics_class(version_settings)
        usage = source.window_usage(instances, window_s, now)  # warm
        errors = [u.error for u in usage.values() if u.error]
        if errors:
            log(f"{engine}: {what}: {len(errors)} instances answered with an error: {errors[0]}")
    sent = {what: source.queries_made for what, source in sources.items()}
    runs: dict[str, list[tuple[float, float]]] = {what: [] for what in sources}
    for _ in range(repeat):  # interleaved (before, now, before, now...): the machine's load hits both alike
        for what, source in sources.items():
            if what.startswith("tick, a fifth"):
                age_kept_reasons(source, 60.0)
            runs[what].append(engine_cpu(pid, lambda: source.window_usage(instances, window_s, now), 1))
    for what, source in sources.items():
        tick_cpu = statistics.median(c for c, _ in runs[what])
        tick_wall = statistics.median(w for _, w in runs[what])
        queries = (source.queries_made - sent[what]) // repeat
        rows.append((engine, what, tick_cpu, tick_wall, queries, ratio(tick_cpu)))
    return rows


def age_kept_reasons(source, seconds: float) -> None:
    """As if `seconds` had passed for the kept profiling reasons, the window staying the same (the bench's series
    end at `now`): the next tick reads the slot whose turn it is, as a service on a 60 s schedule does."""
    from dataclasses import replace

    for slots in source._reasons.values():
        for slot, kept in slots.items():
            slots[slot] = replace(kept, at=kept.at - seconds)


# --------------------------------------------------------------------------- client time against raw PromQL


def client_rows(engine: str, url: str, instances, window_s: int, now: datetime, repeat: int,
                before=None) -> list[tuple]:
    from concurrent.futures import ThreadPoolExecutor

    from gpufinops.collect.prometheus import InstanceMatcher, parse_body, plan_detail

    # Every tick reads every leg here, so that the raw PromQL is the tick's query strings.
    settings = PrometheusSettings(url=url, scrape_interval_s=SCRAPE_S, timeout_s=300, profiling_reasons_every_s=0)
    source = PrometheusMetrics(settings)
    at = now.timestamp()
    fixed = source.promql.queries(window_s)
    rows = {key[0]: parse_body(key, source.reader.instant_body(q, at)) for key, q in fixed.items()}
    matcher = InstanceMatcher.build(instances, settings.instance_label, tuple(settings.hostname_labels))
    detail = list(plan_detail(source.promql, rows, matcher, window_s, window_s // SCRAPE_S).queries.values())
    reader = PromReader(settings)

    def send(queries: list[str]) -> int:
        with ThreadPoolExecutor(max_workers=max(len(queries), 1)) as pool:
            return sum(pool.map(lambda q: len(reader.instant_body(q, at)), queries))

    def raw() -> int:  # the tick's two rounds: the fixed set, then the detail reads
        return send(list(fixed.values())) + (send(detail) if detail else 0)

    def ticker(metrics_class):
        tick_source = metrics_class(settings)

        def tick() -> int:
            tick_source.window_usage(instances, window_s, now)
            return 0
        return tick

    # `--before`: the tick of another version of collect/prometheus.py, interleaved in the same run.
    ticks = {"tick": ticker(PrometheusMetrics), **({"tick, before": ticker(before)} if before is not None else {})}
    answer_bytes = raw()
    for tick in ticks.values():
        tick()  # warm
    wall: dict[str, list[float]] = {"raw": [], **{what: [] for what in ticks}}
    cpu: dict[str, list[float]] = {what: [] for what in wall}
    for _ in range(repeat):
        for what, fn in (("raw", raw), *ticks.items()):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[what].append(time.perf_counter() - t0)
            cpu[what].append(time.process_time() - c0)
    med = {k: statistics.median(v) for k, v in wall.items()}
    return [(engine, what, len(fixed) + len(detail), answer_bytes / 2**20, med["raw"], statistics.median(cpu["raw"]),
             med[what], statistics.median(cpu[what]), med[what] / med["raw"]) for what in ticks]


# --------------------------------------------------------------------------- sharded ticks: memory and wall


def shard_plan(url: str, instances, window_s: int, now: datetime, shards: int) -> list[tuple[list[str], list[str]]]:
    """Per shard, the query strings a sharded tick sends: its fixed set, then the detail reads it plans."""
    from gpufinops.collect.prometheus import InstanceMatcher, parse_body, plan_detail, shard_of

    settings = PrometheusSettings(url=url, scrape_interval_s=SCRAPE_S, timeout_s=300, profiling_reasons_every_s=0)
    source = PrometheusMetrics(settings)
    at, plan = now.timestamp(), []
    for index in range(shards):
        members = [i for i in instances if shard_of(i.instance_id, shards) == index]
        promql = source.promql.shard(index, shards)
        fixed = promql.queries(window_s)
        rows = {key[0]: parse_body(key, source.reader.instant_body(q, at)) for key, q in fixed.items()}
        matcher = InstanceMatcher.build(members, settings.instance_label, tuple(settings.hostname_labels))
        detail = plan_detail(promql, rows, matcher, window_s, window_s // SCRAPE_S).queries
        plan.append((list(fixed.values()), list(detail.values())))
        del rows
    return plan


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _shard_child(what, url, instances, window_s, now, shards, parallelism, plan, out):
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    settings = PrometheusSettings(url=url, scrape_interval_s=SCRAPE_S, timeout_s=300, profiling_reasons_every_s=0,
                                  shards=shards, shard_parallelism=parallelism)
    reader = PromReader(settings)
    at = now.timestamp()

    def send(queries: list[str]) -> int:
        with ThreadPoolExecutor(max_workers=max(len(queries), 1)) as pool:
            return sum(pool.map(lambda q: len(reader.instant_body(q, at)), queries))

    def one_shard(queries) -> int:  # as the tick does: the fixed set, then the detail reads, bodies dropped
        fixed, detail = queries
        return send(fixed) + (send(detail) if detail else 0)

    base = _rss_kib("VmRSS")
    c0, t0 = time.process_time(), time.perf_counter()
    signature, answered = "", 0
    if what == "raw":
        with ThreadPoolExecutor(max_workers=parallelism) as pool:
            answered = sum(pool.map(one_shard, plan))
    else:
        usage = PrometheusMetrics(settings).window_usage(instances, window_s, now)
        signature = hashlib.sha256(repr(sorted(usage.items())).encode()).hexdigest()[:12]
        answered = sum(1 for u in usage.values() if u.error)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out.put({"wall": wall, "cpu": cpu, "peak_mib": _rss_kib("VmHWM") / 1024, "base_mib": base / 1024,
             "signature": signature, "answered": answered})


def shard_rows(engine: str, url: str, pid: int, instances, window_s: int, now: datetime, repeat: int,
               shard_counts: list[int], parallelism: int) -> list[tuple]:
    """Sharded ticks (each in a fresh child process) against their raw PromQL (the same query strings, shard by
    shard, `parallelism` shards at a time, bodies read and dropped, nothing parsed), interleaved raw, tick, raw,
    tick...: medians of wall, client CPU, peak RSS, and the engine's CPU over each child (idle while it starts)."""
    ctx = mp.get_context("spawn")
    rows = []
    for shards in shard_counts:
        plan = shard_plan(url, instances, window_s, now, shards)
        runs: dict[str, list[dict]] = {"raw": [], "tick": []}
        for _ in range(repeat):
            for what in ("raw", "tick"):
                out = ctx.Queue()
                proc = ctx.Process(target=_shard_child, args=(what, url, instances, window_s, now, shards,
                                                              parallelism, plan, out))
                c0 = process_cpu_s(pid)
                proc.start()
                runs[what].append(out.get())
                proc.join()
                runs[what][-1]["engine"] = process_cpu_s(pid) - c0
        med = {w: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu", "peak_mib", "base_mib", "engine")}
               for w, rs in runs.items()}
        signatures = {r["signature"] for r in runs["tick"]}
        errors = max(r["answered"] for r in runs["tick"])
        answers_mib = runs["raw"][0]["answered"] / 2**20
        log(f"{len(instances) * GPUS_PER_INSTANCE} GPUs: {engine} {shards} shards: tick {med['tick']['wall']:.2f} s"
            f" / raw {med['raw']['wall']:.2f} s, peak RSS {med['tick']['peak_mib']:.0f} MiB")
        rows.append((engine, shards, sum(len(f) + len(d) for f, d in plan), answers_mib, med["tick"]["engine"],
                     med["raw"]["wall"], med["raw"]["cpu"], med["raw"]["peak_mib"] - med["raw"]["base_mib"],
                     med["tick"]["wall"], med["tick"]["cpu"], med["tick"]["peak_mib"],
                     med["tick"]["peak_mib"] - med["tick"]["base_mib"], med["tick"]["wall"] / med["raw"]["wall"],
                     errors, ",".join(sorted(signatures))))
    return rows


# --------------------------------------------------------------------------- wall time and memory


def _fixed(settings, instances, window_s, now):
    source = PrometheusMetrics(settings)
    return source.window_usage(instances, window_s, now), source.queries_made


def _baseline(settings, instances, window_s, now):
    import requests

    session = requests.Session()  # keep-alive, as a careful naive client would
    result, queries = {}, 0
    for inst in instances:
        scoped = settings.model_copy(update={"selector": f'instance_id="{inst.instance_id}"'})
        source = PrometheusMetrics(scoped, session=session)
        result.update(source.window_usage([inst], window_s, now))
        queries += source.queries_made
    return result, queries


def _measure(method, url, instances, window_s, now, out):
    settings = PrometheusSettings(url=url, scrape_interval_s=SCRAPE_S, timeout_s=300)
    fn = _fixed if method == "fixed" else _baseline
    t0 = time.perf_counter()
    usage, queries = fn(settings, instances, window_s, now)
    wall = time.perf_counter() - t0
    tracemalloc.start()
    fn(settings, instances, window_s, now)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    errors = sum(1 for u in usage.values() if u.error)
    signature = {iid: tuple((g.gpu, g.samples, g.activity_max, round(g.activity_mean or -1, 6)) for g in u.gpus)
                 for iid, u in usage.items()}
    out.put({"wall_s": wall, "queries": queries, "py_peak_mib": peak / 2**20, "rss_mib": rss_kib / 1024,
             "errors": errors, "signature": signature})


def measure(method, url, instances, window_s, now) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(method, url, instances, window_s, now, out))
    proc.start()
    result = out.get()
    proc.join()
    return result


def wall_rows(url: str, instances, window_s: int, now: datetime, naive: bool) -> list[tuple]:
    results = {}
    for method in ("fixed", "baseline") if naive else ("fixed",):
        log(f"measuring {method} ({len(instances)} instances)")
        results[method] = measure(method, url, instances, window_s, now)
    agree = len(results) < 2 or results["fixed"]["signature"] == results["baseline"]["signature"]
    return [(method, r["wall_s"], r["queries"], r["py_peak_mib"], r["rss_mib"], r["errors"],
             "yes" if agree else "NO") for method, r in results.items()]


# --------------------------------------------------------------------------- engines


def start_engine(engine: str, workdir: Path, series: list[Series]):
    if engine == "vm":
        from tests.vmserver import start_victoria_metrics

        return start_victoria_metrics(workdir / "engine", series)
    return start_prometheus(workdir / "engine", series)


def table(header: tuple[str, ...], rows: list[tuple]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r) + " |")
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000", help="GPU counts, comma-separated")
    ap.add_argument("--window", type=int, default=3600, help="window seconds (default 3600)")
    ap.add_argument("--engines", default="prometheus", help="prometheus,vm")
    ap.add_argument("--sentinel-gpus", type=float, default=0.01, help="fraction of GPUs with sentinel samples")
    ap.add_argument("--repeat", type=int, default=3, help="runs per CPU figure (median)")
    ap.add_argument("--client", action="store_true", help="also client time per tick against its raw PromQL")
    ap.add_argument("--wall", action="store_true", help="also the wall/memory table (fixed vs naive)")
    ap.add_argument("--naive", action="store_true", help="with --wall: the per-instance baseline too (slow)")
    ap.add_argument("--agent-processes", action="store_true",
                    help="every GPU also exports gpufinops_gpu_processes, as hosts read by `gpufinops agent` do")
    ap.add_argument("--profiling", action="store_true",
                    help="every GPU also exports the DCGM profiling ratios (GR engine, SM, occupancy, tensor, DRAM)")
    ap.add_argument("--before", default="",
                    help="another collect/prometheus/ (a folder) or collect/prometheus.py to measure in the same run")
    ap.add_argument("--shards", default="",
                    help="e.g. 1,4: sharded ticks against their raw PromQL, each in a fresh process: wall, client "
                         "CPU, peak RSS (skips the engine CPU table)")
    ap.add_argument("--shard-parallelism", type=int, default=2, help="shards in flight at once (default 2)")
    ap.add_argument("--engine-cpus", default="", help="pin the engine to these cores (taskset list, e.g. 0) and "
                                                      "this process to --client-cpus: no core shared between them")
    ap.add_argument("--client-cpus", default="1", help="with --engine-cpus: this process's cores (default 1)")
    args = ap.parse_args()
    before = load_before(args.before) if args.before else None
    now = datetime.fromtimestamp(int(time.time()) // SCRAPE_S * SCRAPE_S, timezone.utc)
    cpu, client, wall, sharded = [], [], [], []
    for n_gpus in (int(s) for s in args.sizes.split(",")):
        log(f"{n_gpus} GPUs: generating series")
        instances, series = make_fleet(n_gpus, now, args.window, args.sentinel_gpus, args.profiling)
        if args.agent_processes:  # one process per GPU at every scrape, on the memory series' labels
            series += [Series(PROCESSES_METRIC, s.labels, [(t, 1.0) for t, _ in s.samples]) for s in series
                       if s.metric == FB_USED]
        n_samples = sum(len(s.samples) for s in series)
        for engine in args.engines.split(","):
            with tempfile.TemporaryDirectory(prefix=f"bench-{engine}-") as tmp:
                log(f"{n_gpus} GPUs: {engine}: loading {len(series)} series / {n_samples} raw samples")
                t0 = time.perf_counter()
                server = start_engine(engine, Path(tmp), series)
                log(f"{n_gpus} GPUs: {engine} ready in {time.perf_counter() - t0:.1f}s at {server.url}")
                if args.engine_cpus:  # the engine on cores of its own, as on a server of its own
                    subprocess.run(["taskset", "-a", "-p", "-c", args.engine_cpus, str(server.process.pid)],
                                   check=True, capture_output=True)
                    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
                try:
                    if args.shards:
                        counts = [int(c) for c in args.shards.split(",")]
                        sharded += [(n_gpus, *r) for r in shard_rows(
                            engine, server.url, server.process.pid, instances, args.window, now, args.repeat, counts,
                            args.shard_parallelism)]
                        continue
                    for row in cpu_rows(engine, server.url, server.process.pid, instances, args.window, now,
                                        args.repeat, before):
                        cpu.append((n_gpus, *row))
                        log(f"{n_gpus} GPUs: {row[0]} {row[1]}: {row[2]:.2f} CPU-s")
                    if args.client:
                        for row in client_rows(engine, server.url, instances, args.window, now, args.repeat,
                                               before):
                            client.append((n_gpus, *row))
                            log(f"{n_gpus} GPUs: {engine} client: {row[1]} {row[6]:.2f} s / raw {row[4]:.2f} s wall")
                    if args.wall:
                        wall += [(n_gpus, engine, *r) for r in wall_rows(server.url, instances, args.window, now,
                                                                          args.naive)]
                finally:
                    server.stop()
        del series
    print(f"Window {args.window} s, scrape {SCRAPE_S} s, {args.sentinel_gpus:g} of GPUs with sentinels"
          f"{', profiling ratios on every GPU' if args.profiling else ''}; median of {args.repeat}.\n")
    table(("GPUs", "engine", "what", "engine CPU-s", "wall s", "HTTP queries", "x 1 pass"), cpu)
    if sharded:
        table(("GPUs", "engine", "shards", "HTTP queries", "answers MiB", "engine CPU-s per tick", "raw wall s",
               "raw client CPU-s",
               "raw peak RSS over base MiB", "tick wall s", "tick client CPU-s", "tick peak RSS MiB",
               "tick peak RSS over base MiB", "tick / raw wall", "instances with errors", "result signature"),
              sharded)
    if client:
        table(("GPUs", "engine", "what", "HTTP queries", "answers MiB", "raw PromQL wall s", "raw client CPU-s",
               "tick wall s", "tick client CPU-s", "tick / raw wall"), client)
    if wall:
        table(("GPUs", "engine", "method", "wall s", "HTTP queries", "py peak MiB", "peak RSS MiB", "errors",
               "same result"), wall)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
