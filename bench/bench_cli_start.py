"""The fixed start of each `gpufinops` command against `python -c pass` and `python -c "import duckdb"`.

Each command is its own process, as a person runs it: the installed `gpufinops` script beside this interpreter
(this checkout's code first on PYTHONPATH, no config file: the built-in defaults), started by process_timing's
launcher, which reads its wall time, CPU time (user + system) and peak memory from wait4. Runs are interleaved
(round after round of every command, so the shared machine's noise falls on all alike) and the medians of
--repeat are kept. "over pass" is the median minus the bare interpreter's; "x duckdb" the ratio to a process
that only imports DuckDB (the yardstick of `costs`, bench_cur.py).

    python bench/bench_cli_start.py                  # 15 rounds
    python bench/bench_cli_start.py --repeat 31
    python bench/bench_cli_start.py --no-bytecode-cache   # gpufinops' modules compiled at every start
    python bench/bench_cli_start.py --before /tmp/before  # also each command on another checkout's code

Bytecode: by default the modules' compiled bytecode is kept between runs (outside the checkout), as pip leaves
an installed package; --no-bytecode-cache compiles this checkout's modules at every start, as a development
environment with PYTHONDONTWRITEBYTECODE=1 does (the libraries keep their bytecode either way).

"import config+cli" is the issue's measure of the fixed start of a command (`python -P -c "import gpufinops.cli.app;
from gpufinops.config import Settings"`: the settings and the command line, what every command that reads settings
loads before its own work; gpufinops.config hands each name on from its module when first asked, so a bare `import
gpufinops.config` loads almost nothing); its goal is 0.12 s of wall time over the bare interpreter. `rules check`
loads and checks the shipped rules on top (without a config file it loads no settings). -P: the code on PYTHONPATH,
never the current folder's copy (`python -c` puts the current folder first on sys.path).
Why a command costs what it costs: `python -X importtime -m gpufinops.cli rules check 2> imports.txt`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from process_timing import environment, gpufinops_command, medians_interleaved, run_process

GOAL_OVER_PASS_S = 0.12  # issue 41: the fixed start of a command, wall time over `python -c pass`


def commands() -> dict[str, list[str]]:
    py, gpufinops = sys.executable, gpufinops_command()
    return {
        "python -c pass": [py, "-c", "pass"],
        "import duckdb": [py, "-c", "import duckdb"],
        "import config+cli": [py, "-P", "-c", "import gpufinops.cli.app; from gpufinops.config import Settings"],
        "--version": [*gpufinops, "--version"],
        "rules check": [*gpufinops, "rules", "check"],
        "evaluate --help": [*gpufinops, "evaluate", "--help"],
        "costs --help": [*gpufinops, "costs", "--help"],
        "report --help": [*gpufinops, "report", "--help"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15, help="rounds of every command, interleaved; medians kept")
    ap.add_argument("--before", metavar="CHECKOUT", help="also each gpufinops command run from another "
                    "checkout's code (e.g. `git worktree add /tmp/before main`), in the same rounds")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="compile this checkout's modules at every start (PYTHONDONTWRITEBYTECODE=1), not as installed")
    args = ap.parse_args()
    cmds, env = commands(), environment(bytecode=not args.no_bytecode_cache)
    envs = {name: env for name in cmds}
    if args.before:  # the same commands on the other checkout's code, named "... (before)"
        before = environment(bytecode=not args.no_bytecode_cache, root=Path(args.before).resolve())
        for name in [n for n in cmds if n not in ("python -c pass", "import duckdb")]:
            cmds[f"{name} (before)"], envs[f"{name} (before)"] = cmds[name], before
    print(f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.1f}, "
          f"{args.repeat} runs each, medians; gpufinops = {' '.join(gpufinops_command())}; "
          + ("compiled from source at every start" if args.no_bytecode_cache else "bytecode cached, as installed"))
    best = medians_interleaved(list(cmds), args.repeat, lambda name: run_process(cmds[name], envs[name]))
    bare, duck = best["python -c pass"], best["import duckdb"]
    print(f"{'command':>29} {'wall ms':>8} {'cpu ms':>7} {'peak MiB':>9} {'wall over pass':>15} {'cpu over pass':>14} "
          f"{'wall x duckdb':>14} {'cpu x duckdb':>13}")
    for name, r in best.items():
        print(f"{name:>29} {r['wall_s'] * 1e3:>8.0f} {r['cpu_s'] * 1e3:>7.0f} {r['peak_mib']:>9.0f} "
              f"{(r['wall_s'] - bare['wall_s']) * 1e3:>12.0f} ms {(r['cpu_s'] - bare['cpu_s']) * 1e3:>11.0f} ms "
              f"{r['wall_s'] / duck['wall_s']:>13.2f}x {r['cpu_s'] / duck['cpu_s']:>12.2f}x")
    over = best["import config+cli"]["wall_s"] - bare["wall_s"]
    print(f"import config+cli: {over:.3f} s over the bare interpreter "
          f"({'within' if over <= GOAL_OVER_PASS_S else 'OVER'} the goal of {GOAL_OVER_PASS_S} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
