"""Benchmark: one `window_usage` over 1,000 and 10,000 GPUs in a real Prometheus.

For each fleet size a real Prometheus is filled by promtool backfill (the same
helper the tests use: tests/promserver.py) with dcgm-exporter-shaped series:
8 GPUs per instance, GPU_UTIL + FB_USED + POWER_USAGE, 40 samples at 30 s
(the 20 minutes before now), ~1% DCGM sentinel samples. Then, side by side:

  fixed     PrometheusMetrics.window_usage over the whole fleet (4 queries)
  baseline  the naive way: the same query set once per instance
            (selector instance_id="i-...")

Each measurement runs in a fresh child process so its peak RSS is its own:
wall time (one call, no tracing), HTTP queries, peak Python heap
(tracemalloc, a second traced call) and peak RSS of the child.

    python bench/bench_evaluate.py [--sizes 1000,10000] [--window 600]

Progress goes to stderr; the table to stdout.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.promserver, when run from anywhere

from gpufinops.collect.prometheus import FB_USED, GPU_UTIL, POWER_USAGE, PrometheusMetrics  # noqa: E402
from gpufinops.config import PrometheusSettings  # noqa: E402
from gpufinops.model import GpuInstance  # noqa: E402
from tests.promserver import Series, dcgm_labels, start_prometheus  # noqa: E402

GPUS_PER_INSTANCE = 8
SCRAPE_S = 30
SAMPLES = 40
SENTINEL = 9.223372036854775e18


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_fleet(n_gpus: int, now: datetime) -> tuple[list[GpuInstance], list[Series]]:
    rng = random.Random(n_gpus)
    n_inst = n_gpus // GPUS_PER_INSTANCE
    end = now.timestamp()
    times = [end - SCRAPE_S * (SAMPLES - 1 - i) for i in range(SAMPLES)]
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
            util = []
            for t in times:
                if rng.random() < 0.01:
                    v = SENTINEL
                elif profile == "idle":
                    v = 0.0
                elif profile == "busy":
                    v = float(rng.randint(70, 100))
                else:
                    v = float(rng.choice((0, 0, 0, 95)))
                util.append((t, v))
            series.append(Series(GPU_UTIL, labels, util))
            series.append(Series(FB_USED, labels, [(t, 70000.0 if profile != "idle" else 0.0) for t in times]))
            series.append(Series(POWER_USAGE, labels, [(t, 90.0 + rng.random() * 300) for t in times]))
    return instances, series


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000", help="GPU counts, comma-separated")
    ap.add_argument("--window", type=int, default=600, help="window seconds (default 600)")
    args = ap.parse_args()
    now = datetime.fromtimestamp(int(time.time()) // SCRAPE_S * SCRAPE_S, timezone.utc)
    rows = []
    for n_gpus in (int(s) for s in args.sizes.split(",")):
        log(f"{n_gpus} GPUs: generating series")
        instances, series = make_fleet(n_gpus, now)
        n_samples = sum(len(s.samples) for s in series)
        with tempfile.TemporaryDirectory(prefix="bench-prom-") as tmp:
            log(f"{n_gpus} GPUs: backfilling {len(series)} series / {n_samples} samples and starting Prometheus")
            t0 = time.perf_counter()
            server = start_prometheus(Path(tmp), series)
            log(f"{n_gpus} GPUs: Prometheus ready in {time.perf_counter() - t0:.1f}s at {server.url}")
            del series
            try:
                results = {}
                for method in ("fixed", "baseline"):
                    log(f"{n_gpus} GPUs: measuring {method} ({len(instances)} instances)")
                    results[method] = measure(method, server.url, instances, args.window, now)
                    log(f"{n_gpus} GPUs: {method} took {results[method]['wall_s']:.2f}s")
            finally:
                server.stop()
        agree = results["fixed"]["signature"] == results["baseline"]["signature"]
        for method, r in results.items():
            rows.append((n_gpus, len(instances), method, r["wall_s"], r["queries"], r["py_peak_mib"],
                         r["rss_mib"], r["errors"], "yes" if agree else "NO"))
    header = ("GPUs", "instances", "method", "wall s", "HTTP queries", "py peak MiB", "peak RSS MiB",
              "errors", "same result")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} | {r[4]} | {r[5]:.1f} | {r[6]:.0f} | {r[7]} | {r[8]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
