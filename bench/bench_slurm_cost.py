"""A month of Slurm accounting charged: `sacct --json` text -> runs -> priced -> per account, user, partition.

    python bench/bench_slurm_cost.py [--records 100000 500000]

Builds a `sacct --json -D -X` answer of N records in the shape of the real 22.05 capture
(tests/data/slurm/sacct-22.05.json: each record is one of its records with a new id, user, account, partition,
GPU count and times spread over November 2026; 1 in 10 crosses the month's first second, 1 in 20 still running),
then times, in the same run:
  baseline   json.loads of the answer alone (the floor: every reader must parse it)
  gpufinops  json.loads + places.slurm.accounting.parse_sacct + charge (clipped, priced) + cost.slurm.usage_table
             + slurm_totals by account, user and partition
and checks that the GPU-seconds charged equal the sum computed here directly. Wall time from a plain run, peak
Python memory from a second run under tracemalloc.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufinops.config import load_settings  # noqa: E402
from gpufinops.cost.slurm import slurm_totals, usage_table  # noqa: E402
from gpufinops.places.slurm.accounting import SlurmPrices, charge, parse_sacct  # noqa: E402

START = datetime(2026, 11, 1, tzinfo=timezone.utc)
END = datetime(2026, 12, 1, tzinfo=timezone.utc)
NOW = datetime(2026, 12, 7, tzinfo=timezone.utc)
CAPTURE = ROOT / "tests" / "data" / "slurm" / "sacct-22.05.json"


def answer(n: int, seed: int = 7) -> tuple[str, int]:
    """(the JSON text, the GPU-seconds inside November computed directly)."""
    rnd = random.Random(seed)
    template = json.loads(CAPTURE.read_text())
    jobs, expected = [], 0
    lo, hi = int(START.timestamp()), int(END.timestamp())
    for i in range(n):
        j = copy.deepcopy(template["jobs"][i % len(template["jobs"])])
        j["job_id"] = 1000 + i
        j["user"], j["account"] = f"user{i % 400}", f"acct{i % 60}"
        j["partition"] = ("gpu", "interactive", "a100", "debug")[i % 4]
        gpus = rnd.choice((1, 1, 2, 4, 8))
        j["tres"]["allocated"][-1]["count"] = gpus
        start = lo - 3600 * 12 if i % 10 == 0 else rnd.randrange(lo, hi - 60)
        running = i % 20 == 1
        end = 0 if running else min(start + rnd.randrange(60, 3600 * 48), hi + 3600 * 24)
        j["time"].update(start=start, end=end, elapsed=(int(NOW.timestamp()) if running else end) - start)
        jobs.append(j)
        inside = min(hi, end if end else int(NOW.timestamp())) - max(lo, start)
        expected += gpus * max(0, inside)
    return json.dumps({**template, "jobs": jobs}), expected


def gpufinops(text: str, prices: SlurmPrices):
    runs, _ = parse_sacct(json.loads(text), "hpc")
    usage = usage_table(c.row() for c in charge(runs, START, END, NOW, prices))
    return usage, [slurm_totals(usage, by) for by in ("account", "user", "partition")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, nargs="+", default=[100_000])
    args = ap.parse_args()
    cluster = load_settings(None, slurm={"cluster": "hpc", "usd_per_gpu_hour": {"*": 2.0},
                                         "gpu_model": {"a100": "A100-80GB"}}).slurm.clusters[0]
    prices = SlurmPrices.of(cluster, None)
    print(f"{'records':>8}  {'MiB':>6}  {'json.loads s':>12}  {'gpufinops s':>11}  {'peak MiB':>8}  check")
    for n in args.records:
        text, expected = answer(n)
        t0 = time.perf_counter()
        json.loads(text)
        base = time.perf_counter() - t0
        t0 = time.perf_counter()
        usage, _ = gpufinops(text, prices)
        ours = time.perf_counter() - t0
        tracemalloc.start()
        gpufinops(text, prices)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        ok = "ok" if int(usage["gpu_seconds"].sum()) == expected else f"MISMATCH {usage['gpu_seconds'].sum()} != {expected}"
        print(f"{n:>8}  {len(text) / 2**20:>6.0f}  {base:>12.2f}  {ours:>11.2f}  {peak:>8.0f}  {ok}")


if __name__ == "__main__":
    main()
