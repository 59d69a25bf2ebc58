"""One tick's Slurm listing and verdicts on a REAL Slurm 22.05 controller, against `squeue --json` alone (issue 38).

    python bench/bench_slurm.py                 # quick: 500 jobs
    python bench/bench_slurm.py --jobs 5000     # the issue's size (MaxJobCount is 20000 in tests/slurm.py)

Starts a throw-away cluster (tests/slurm.py's SlurmCluster: slurmctld + slurmd, no accounting, as root) and submits
`--jobs` batch jobs with `--hold` (parallel sbatch; one node has 4 GPUs, so held jobs are what 5,000 can be), each
asking one GPU. Then, interleaved, `--repeat` times each (medians):

  squeue     `squeue --json` alone: the process, slurmctld's answer, the JSON on stdout (the yardstick);
  listing    SlurmCloud.list_gpu_instances() on that same controller: squeue --json, parsed (places.slurm.jobs),
             filtered to RUNNING GPU jobs; the held jobs are PENDING, so it keeps none;
  tick       what a tick does when every one of those jobs RUNS: the real `squeue --json` answer with each job
             rewritten RUNNING on one GPU of 1,250 nodes (4 GPUs each: gres_detail `gpu:a100:1(IDX:n)`, a start
             time 30 min ago), listed, its usage read from a real Prometheus (tests/promserver.py, DCGM series for
             every GPU, 10 min window) and judged under one rule: jobs listed, verdicts, wall time.

Peak Python memory (tracemalloc) of one listing and one tick. The figures go to BENCHMARKS.md (the lead).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPUS_PER_NODE = 4
STEP = 30


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="leave the cluster's folder (its logs) behind")
    return p.parse_args()


def submit(cluster, n: int) -> float:
    t0 = time.monotonic()
    argv = ["sbatch", "--parsable", "--hold", "--gres=gpu:1", "-J", "bench", "-o", "/dev/null",
            f"--chdir={cluster.root / 'jobs'}", "--wrap", "sleep 3600"]
    done = 0

    def one(_i: int) -> None:
        subprocess.run(argv, env=cluster.env(), capture_output=True, check=True, timeout=120)

    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in pool.map(one, range(n)):
            done += 1
            if done % 500 == 0:
                print(f"  submitted {done}/{n}", file=sys.stderr)
    return time.monotonic() - t0


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def peak_mib(fn) -> float:
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def as_running(stdout: str, now: datetime) -> str:
    """The real answer with every job RUNNING on one GPU of its node (what a busy cluster of that size shows)."""
    doc = json.loads(stdout)
    start = int((now - timedelta(minutes=30)).timestamp())
    for i, j in enumerate(doc["jobs"]):
        j.update(job_state="RUNNING", nodes=f"gpu{i // GPUS_PER_NODE:04d}", start_time=start,
                 gres_detail=[f"gpu:a100:1(IDX:{i % GPUS_PER_NODE})"], batch_flag=True, requeue=True)
    return json.dumps(doc)


def main() -> int:
    args = parse_args()
    from tests.promserver import Series, dcgm_labels, start_prometheus
    from tests.slurm import SlurmCluster

    from gpufinops.config import load_settings
    from gpufinops.decide.evaluate import evaluate
    from gpufinops.model import Verdict
    from gpufinops.places.slurm.cloud import SlurmCloud
    from gpufinops.places.slurm.commands import SlurmCommands, _run_subprocess
    from gpufinops.places.slurm.usage import SlurmJobMetrics
    from gpufinops.rules import load_rule_file

    root = Path(tempfile.mkdtemp(prefix="gpufinops-bench-slurm-"))
    root.chmod(0o755)
    cluster = SlurmCluster(root / "c", name="bench").start()
    prom = None
    try:
        print(f"submitting {args.jobs} held jobs...", file=sys.stderr)
        took = submit(cluster, args.jobs)
        settings = load_settings(slurm={"cluster": "bench", "conf": str(cluster.conf), "timeout_s": 120},
                                 prometheus={"scrape_interval_s": STEP})
        conf = settings.slurm.clusters[0]
        cloud = SlurmCloud(conf, SlurmCommands("bench", str(cluster.conf), 120))
        now = datetime.now(timezone.utc).replace(microsecond=0)

        real = subprocess.run(["squeue", "--json"], env=cluster.env(), capture_output=True, text=True,
                              check=True).stdout
        shown = len(json.loads(real)["jobs"])

        def answering_running(argv, env, timeout_s):
            res = _run_subprocess(argv, env, timeout_s)  # the real command, the real controller
            return subprocess.CompletedProcess(argv, res.returncode, as_running(res.stdout, now), res.stderr)

        busy = SlurmCloud(conf, SlurmCommands("bench", str(cluster.conf), 120, runner=answering_running))
        # One DCGM GPU per job: 10 minutes of samples, half the GPUs idle.
        series = []
        t_end, t_start = now.timestamp(), now.timestamp() - 900
        for i in range(shown):
            labels = dcgm_labels(f"gpu{i // GPUS_PER_NODE:04d}", i % GPUS_PER_NODE)
            ts = range(int(t_start), int(t_end), STEP)
            util = 0.0 if i % 2 else 60.0
            series += [Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, util) for t in ts]),
                       Series("DCGM_FI_DEV_FB_USED", labels, [(t, 1000.0) for t in ts])]
        print(f"backfilling {len(series)} series into Prometheus...", file=sys.stderr)
        prom = start_prometheus(root / "prom", series)
        metrics = SlurmJobMetrics(load_settings(prometheus={"url": prom.url, "scrape_interval_s": STEP,
                                                            "timeout_s": 120}).prometheus,
                                  busy.usage_basis, lambda _sid: conf.gpu_index_map)
        rule_path = root / "rule.yaml"
        rule_path.write_text("rules:\n  - name: r\n    threshold_pct: 5\n    window: 10m\n")
        rule = load_rule_file(rule_path)[0]

        def tick():
            jobs = busy.list_gpu_instances()
            usage = metrics.window_usage(jobs, rule.window_s, now)
            return [evaluate(j, usage.get(j.instance_id), rule, now) for j in jobs]

        squeue_s, listing_s, tick_s = [], [], []
        for _ in range(args.repeat):
            squeue_s.append(timed(lambda: subprocess.run(["squeue", "--json"], env=cluster.env(),
                                                         capture_output=True, check=True))[0])
            dt, listed = timed(cloud.list_gpu_instances)
            listing_s.append(dt)
            dt, decisions = timed(tick)
            tick_s.append(dt)
        verdicts = {v.value: sum(1 for d in decisions if d.verdict is v) for v in Verdict}
        listing_mib = peak_mib(cloud.list_gpu_instances)
        tick_mib = peak_mib(tick)
        med = statistics.median
        print(f"jobs submitted: {args.jobs} (held) in {took:.1f} s; squeue --json shows {shown}, "
              f"{len(real) / 2**20:.1f} MiB of JSON")
        print(f"squeue --json alone:        {med(squeue_s):.2f} s (median of {args.repeat})")
        print(f"SlurmCloud listing (held):  {med(listing_s):.2f} s, peak {listing_mib:.0f} MiB, "
              f"{len(listed)} subjects (held jobs are PENDING)")
        print(f"tick, every job RUNNING:    {med(tick_s):.2f} s, peak {tick_mib:.0f} MiB, "
              f"{len(decisions)} jobs judged, verdicts {verdicts}")
        return 0
    finally:
        if prom is not None:
            prom.stop()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
