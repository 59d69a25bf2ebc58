"""A month of Slurm accounting charged: `sacct --json` answers -> runs -> priced -> per account, user, partition, QOS.

    python bench/bench_slurm_cost.py [--records 100000 300000] [--window-hours 24]

Builds N records in the shape of the real 22.05 capture (tests/data/slurm/sacct-22.05.json: each record is one of
its records with a new id, user, account, partition, GPU count and times spread over November 2026; 1 in 10 crosses
the month's first second, 1 in 20 still running) and writes, before anything is measured, the answers sacct would
give: one for the whole month, and one per window of --window-hours (each asked one hour wider on both sides, as
places.slurm.accounting.read_charges asks; a record is in every answer whose period it overlaps, as sacct lists it).
Then, in the same run, through the same code (run.slurm_cost.read_slurm_usage, its sacct runner handing back the
prepared answer of the window it is asked for):
  whole     sacct_window_hours = the month: one answer, parsed whole (the read before windows)
  windowed  sacct_window_hours = --window-hours: one window's answer at a time, charged and let go
and checks that both charge the GPU-seconds computed here directly and give the same totals per account, user,
partition and QOS to the cent. Wall time from a plain run; peak Python memory (the answer's text included, as
sacct's stdout is held) from a second run under tracemalloc.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufinops.config import load_settings  # noqa: E402
from gpufinops.cost.slurm import slurm_totals  # noqa: E402
from gpufinops.places.slurm.accounting import SACCT_WINDOW_MARGIN, windows  # noqa: E402
from gpufinops.places.slurm.commands import SlurmCommands  # noqa: E402
from gpufinops.run.slurm_cost import read_slurm_usage  # noqa: E402

START = datetime(2026, 11, 1, tzinfo=timezone.utc)
END = datetime(2026, 12, 1, tzinfo=timezone.utc)
NOW = datetime(2026, 12, 7, tzinfo=timezone.utc)
CAPTURE = ROOT / "tests" / "data" / "slurm" / "sacct-22.05.json"


def records(n: int, seed: int = 7) -> tuple[dict, list[dict], int]:
    """(the capture's envelope, N records, the GPU-seconds inside November computed directly)."""
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
    return {k: v for k, v in template.items() if k != "jobs"}, jobs, expected


def write_answers(envelope: dict, jobs: list[dict], window: timedelta, folder: Path) -> dict[tuple[str, str], Path]:
    """The answer file of each window sacct is asked for (and of the whole month), keyed by its -S/-E argv."""
    out = {}
    for size in (END - START, window):
        for lo, hi in windows(START, END, size):
            ask_lo, ask_hi = lo - SACCT_WINDOW_MARGIN, min(hi + SACCT_WINDOW_MARGIN, END)
            a, b = int(ask_lo.timestamp()), int(ask_hi.timestamp())
            listed = [j for j in jobs if j["time"]["start"] < b and (j["time"]["end"] >= a or j["time"]["end"] == 0)]
            path = folder / f"{len(out)}.json"
            path.write_text(json.dumps({**envelope, "jobs": listed}))
            out[(_sacct_time(ask_lo), _sacct_time(ask_hi))] = path
    return out


def _sacct_time(dt: datetime) -> str:
    return dt.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def read(answers: dict[tuple[str, str], Path], window_hours: float):
    def runner(argv, env, timeout_s):
        opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        return subprocess.CompletedProcess(argv, 0, answers[(opts["starttime"], opts["endtime"])].read_text(), "")

    settings = load_settings(None, slurm={"cluster": "hpc", "usd_per_gpu_hour": {"*": 2.0},
                                          "gpu_model": {"a100": "A100-80GB"}, "sacct_window_hours": window_hours})
    usage = read_slurm_usage(settings, START, END, NOW,
                             commands_for=lambda name, conf, t: SlurmCommands(name, conf, t, runner=runner))
    assert usage.complete, usage.errors
    return usage.table, {by: slurm_totals(usage.table, by) for by in ("account", "user", "partition", "qos")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, nargs="+", default=[100_000])
    ap.add_argument("--window-hours", type=float, default=24.0)
    args = ap.parse_args()
    month_h = (END - START) / timedelta(hours=1)
    print(f"{'records':>8}  {'read':>8}  {'answers':>7}  {'largest MiB':>11}  {'s':>6}  {'peak MiB':>8}  check")
    for n in args.records:
        envelope, jobs, expected = records(n)
        with tempfile.TemporaryDirectory() as tmp:
            answers = write_answers(envelope, jobs, timedelta(hours=args.window_hours), Path(tmp))
            del jobs
            whole_totals = None
            for label, hours in (("whole", month_h), ("windowed", args.window_hours)):
                files = [p for p in answers.values()][:1] if label == "whole" else list(answers.values())[1:]
                t0 = time.perf_counter()
                usage, totals = read(answers, hours)
                seconds = time.perf_counter() - t0
                tracemalloc.start()
                read(answers, hours)
                peak = tracemalloc.get_traced_memory()[1] / 2**20
                tracemalloc.stop()
                got = int(usage["gpu_seconds"].sum())
                ok = "ok" if got == expected else f"MISMATCH {got} != {expected}"
                if whole_totals is None:
                    whole_totals = totals
                elif any(not totals[by].equals(whole_totals[by]) for by in totals):
                    ok += ", totals DIFFER from the whole read"
                else:
                    ok += ", totals = whole read"
                largest = max(p.stat().st_size for p in files) / 2**20
                print(f"{n:>8}  {label:>8}  {len(files):>7}  {largest:>11.0f}  {seconds:>6.2f}  {peak:>8.0f}  {ok}",
                      flush=True)


if __name__ == "__main__":
    main()
