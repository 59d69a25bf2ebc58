"""The service's /metrics at fleet scale (issue 27): size, series count and time of one scrape.

    python bench/bench_metrics.py [--gpus 10000] [--gpus-per-instance 8] [--teams 20] [--repeat 20]

Builds a synthetic RunReport (instances of N GPUs each, two rules per instance, a mix of verdicts, teams and
GPU models), then times, through the service's own code:
  tick    FleetFigures.from_report + ServiceMetrics.observe (once per tick: primary decision per instance,
          rendered to text; no store read)
  scrape  ServiceMetrics.body() (every scrape: the service's own series + the text rendered at the tick)
  client  prometheus_client's generate_latest over the same fleet families (what rendering at each scrape with a
          registered collector would cost), for comparison
and prints the exposition size and its series count next to the formula in run/fleet_metrics.py:
  3 per judged instance + 2 per (verdict, team) with instances + 1 per UNKNOWN code + idle $/stops/saved per team
  + 2 per budget + the service's own health series.
The month figures (store reads once per tick) are not in it: their series count is per team, not per GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from gpufinops.model import Action, Decision, GpuInstance, ReasonCode, Verdict  # noqa: E402
from gpufinops.run.fleet_metrics import FleetFigures  # noqa: E402
from gpufinops.run.pipeline import RunReport  # noqa: E402
from gpufinops.run.service import ServiceMetrics  # noqa: E402

NOW = datetime(2026, 3, 10, 12, tzinfo=timezone.utc)
MIX = ((Verdict.ACTIVE, ReasonCode.BUSY), (Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW),
       (Verdict.UNDERUTILIZED, ReasonCode.BURSTY_LOW), (Verdict.UNKNOWN, ReasonCode.NO_SERIES))
MODELS = ("H100", "H200", "A100", "L40S", "A10G")


def synthetic_report(gpus: int, per_instance: int, teams: int) -> RunReport:
    report = RunReport("bench", NOW, True)
    for k in range(gpus // per_instance):
        iid = f"i-{k:017x}"
        report.instances.append(GpuInstance(
            iid, "p5.48xlarge", "us-east-1", "running", NOW - timedelta(days=3), tags={"team": f"team-{k % teams}"},
            gpu_count=per_instance, gpu_model=MODELS[k % len(MODELS)], hourly_cost=98.32 if k % 10 else None))
        verdict, code = MIX[k % len(MIX)]
        for rule in ("gpu-util-below-10pct-2h", "zero-activity-1h"):
            report.decisions.append(Decision(iid, rule, verdict, code, "synthetic", NOW, Action.STOP, 7200,
                                             0.5, 1.0, 1024.0, 1.0, 98.32))
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, nargs="+", default=[10_000])
    ap.add_argument("--gpus-per-instance", type=int, default=8)
    ap.add_argument("--teams", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    print("| GPUs | instances | series | bytes | tick ms | scrape ms | prometheus_client ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for gpus in args.gpus:
        report = synthetic_report(gpus, args.gpus_per_instance, args.teams)
        metrics = ServiceMetrics()
        builds, scrapes, client = [], [], []

        class Fleet:
            def collect(self):
                return figures.families()

        registry = CollectorRegistry()
        registry.register(Fleet())
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            figures = FleetFigures.from_report(report)
            metrics.observe(report, 0.0, figures)
            builds.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            body = metrics.body()
            scrapes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            generate_latest(registry)
            client.append(time.perf_counter() - t0)
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        print(f"| {gpus:,} | {len(report.instances):,} | {series:,} | {len(body):,} | "
              f"{1000 * statistics.median(builds):.0f} | {1000 * statistics.median(scrapes):.1f} | "
              f"{1000 * statistics.median(client):.0f} |")


if __name__ == "__main__":
    main()
