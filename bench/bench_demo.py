"""CPU of `gpufinops demo` (issue 29, item 5), each run a whole child process, interleaved.

    python bench/bench_demo.py [--modes full,no-compare,quick] [--repeat 3] [--before DIR]
    python bench/bench_demo.py --state-writes 1250,12500 [--db-url URL]

Each mode runs `python -m gpufinops.cli demo [--no-compare | --quick] --quiet` as a child and takes its user +
system CPU seconds, wall time and peak RSS from os.wait4. With --before DIR (an earlier tree, e.g.
`mkdir /tmp/before && git archive HEAD | tar -x -C /tmp/before`), the same modes run with DIR first on
PYTHONPATH, interleaved with the current tree run by run, so that the load of a shared machine falls on both
alike. CPU seconds are the figure to compare: wall time on a shared machine says more about the neighbours.

--state-writes N,...: one tick's state tracking for N instances x 2 rules (the act stage's track_states), on
a store already holding those rows, two ways: a read and a write (own transaction) per decision, as before
issue 29, and Store.update_states (one read, one batched upsert, one transaction). CPU and wall per tick.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLAGS = {"full": [], "no-compare": ["--no-compare"], "quick": ["--quick"]}


def run_once(tree: Path, flags: list[str]) -> tuple[float, float, float]:
    """(CPU s, wall s, peak RSS MiB) of one demo in a child process importing gpufinops from `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "gpufinops.cli", "demo", "--quiet", *flags], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tree)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"demo {' '.join(flags)} from {tree} failed: {proc.stderr.read().decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def state_writes(sizes: list[int], url: str | None) -> None:
    import tempfile
    from datetime import datetime, timedelta, timezone

    sys.path.insert(0, str(ROOT))
    from gpufinops.model import Verdict
    from gpufinops.store.schema import StateRow
    from gpufinops.store.store import Store

    now = datetime(2026, 11, 1, tzinfo=timezone.utc)
    print(f"{'instances':>9} {'decisions':>9} {'per decision: CPU s':>20} {'wall s':>7} "
          f"{'update_states: CPU s':>21} {'wall s':>7}")
    for n in sizes:
        store = Store(url or f"sqlite:///{tempfile.mkdtemp(prefix='bench-states-')}/s.db")
        keys = [(f"i-{i:08d}", rule) for i in range(n) for rule in ("gpu-util-below-10pct-2h", "zero-activity-1h")]

        def step(key, prev, at):
            verdict = Verdict.IDLE if hash(key) % 3 else Verdict.ACTIVE
            if prev is not None and prev.verdict == verdict:
                return StateRow(key[0], key[1], verdict, prev.since, at, prev.stopped_at, prev.stop_dry_run)
            return StateRow(key[0], key[1], verdict, at, at, None, None)

        store.update_states(keys, lambda k, p: step(k, p, now))  # the rows exist, as on any tick but the first
        timings = []
        for way in ("per decision", "batched"):
            at = now + timedelta(minutes=len(timings) + 1)
            c0, t0 = time.process_time(), time.perf_counter()
            if way == "per decision":
                for key in keys:
                    row = step(key, store.get_state(*key), at)
                    store.put_state(key[0], key[1], row.verdict, row.since, at, row.stopped_at, row.stop_dry_run)
            else:
                store.update_states(keys, lambda k, p: step(k, p, at))
            timings.append((time.process_time() - c0, time.perf_counter() - t0))
        store.close()
        (c1, w1), (c2, w2) = timings
        print(f"{n:>9,} {len(keys):>9,} {c1:>20.2f} {w1:>7.2f} {c2:>21.2f} {w2:>7.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="full,no-compare,quick")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", type=Path, default=None, help="an earlier tree to interleave with this one")
    ap.add_argument("--state-writes", default=None, help="instances per tick, comma-separated (see above)")
    ap.add_argument("--db-url", default=None, help="--state-writes on this database (default: a fresh SQLite file)")
    args = ap.parse_args()
    if args.state_writes:
        state_writes([int(x) for x in args.state_writes.split(",")], args.db_url)
        return 0
    trees = ([("before", args.before.resolve())] if args.before else []) + [("now", ROOT)]
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for _ in range(args.repeat):
        for mode in args.modes.split(","):
            for name, tree in trees:
                results.setdefault((name, mode), []).append(run_once(tree, FLAGS[mode]))
    print(f"{'tree':<8} {'mode':<12} {'CPU s (median)':>15} {'CPU s (min)':>12} {'wall s (median)':>16} "
          f"{'peak RSS MiB':>13}  runs={args.repeat}, load average {os.getloadavg()[0]:.1f}")
    for (name, mode), runs in results.items():
        cpu = [r[0] for r in runs]
        print(f"{name:<8} {mode:<12} {statistics.median(cpu):>15.1f} {min(cpu):>12.1f} "
              f"{statistics.median(r[1] for r in runs):>16.1f} {max(r[2] for r in runs):>13.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
