"""A whole process's wall time, CPU time and peak memory, as a person running it waits for it.

`run_process(cmd)` starts a small launcher (`python -c LAUNCHER`) that forks and execs `cmd`, as a shell does,
and reads from wait4 the process's own figures: wall time from fork to exit, CPU time (user + system, all
threads) and peak resident memory (ru_maxrss). The launcher, not this script, forks: Linux carries the
forking process's peak across exec into the child's ru_maxrss, and a bench script that generated a file or
imported pyarrow is far larger than the launcher (~10 MiB, the floor of every peak shown).

Used by bench_cli_start (each command's start) and bench_cur / bench_focus (the `gpufinops costs` process
against a DuckDB process); the commands run this checkout's code (its root first on PYTHONPATH) with no
config file, and the yardsticks run in the same environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
# The benches' own use of gpufinops (generating files, recording the command's statements) is this checkout's
# too, as the processes they time, not whichever copy is installed.
sys.path.insert(0, str(ROOT))

LAUNCHER = r"""
import json, os, sys, time
out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(out, 1)
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_mib": ru.ru_maxrss / 1024,
                  "rc": os.waitstatus_to_exitcode(status)}))
"""


BYTECODE = Path(tempfile.gettempdir()) / "gpufinops-bench" / "pycache"


def environment(bytecode: bool = True, root: Path = ROOT) -> dict[str, str]:
    """This environment with the checkout (`root`: another one, e.g. a copy of the code before a change) first
    on PYTHONPATH and no config file (the built-in defaults).

    bytecode: modules' compiled bytecode kept between runs (in BYTECODE, outside the checkout), as in an
    installed package (pip compiles it at install): what a person's command pays. False: this checkout's
    modules compiled from source at every start (PYTHONDONTWRITEBYTECODE=1, as some development and CI
    environments set it; the installed libraries keep their own bytecode either way)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFINOPS_CONFIG", "PYTHONDONTWRITEBYTECODE",
                                                             "PYTHONPYCACHEPREFIX")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    if bytecode:
        env["PYTHONPYCACHEPREFIX"] = str(BYTECODE)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def gpufinops_command() -> list[str]:
    """The installed `gpufinops` script beside this interpreter (what a person types), else `python -m`."""
    script = Path(sys.executable).parent / "gpufinops"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gpufinops.cli"]


def run_process(cmd: Sequence[str], env: dict[str, str] | None = None, check: bool = True) -> dict:
    """`cmd`'s wall_s, cpu_s, peak_mib, rc and stdout (its stderr is kept as `stderr`)."""
    with tempfile.NamedTemporaryFile(prefix="bench-stdout-", delete=False) as f:
        out_path = f.name
    try:
        launched = subprocess.run([sys.executable, "-c", LAUNCHER, out_path, *cmd], env=env or environment(),
                                  capture_output=True, text=True)
        stdout = Path(out_path).read_text()
    finally:
        os.unlink(out_path)
    lines = launched.stdout.strip().splitlines()
    if launched.returncode != 0 or not lines:
        raise RuntimeError(f"launcher failed for {cmd}: {launched.stderr.strip()[-2000:]}")
    figures = json.loads(lines[-1])
    if check and figures["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {figures['rc']}: {launched.stderr.strip()[-2000:]}")
    return figures | {"stdout": stdout, "stderr": launched.stderr}


def medians_interleaved(names: Sequence[str], repeat: int, run: Callable[[str], dict],
                        keys: Sequence[str] = ("wall_s", "cpu_s", "peak_mib"), warm_up: bool = True) -> dict[str, dict]:
    """`run(name)` for each name in turn, `repeat` rounds (the shared machine's noise spread over all): per
    name its first run's dict with `keys` replaced by their medians over the rounds, and `runs` the count.
    warm_up: one round first, not counted (bytecode written, files in the page cache)."""
    for n in names if warm_up else ():
        run(n)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(repeat):
        for n in names:
            runs[n].append(run(n))
    return {n: r[0] | {k: median(x[k] for x in r) for k in keys if r[0].get(k) is not None} | {"runs": len(r)}
            for n, r in runs.items()}
