"""Running a helper program with a deadline: nvidia-smi (collect.nvidia_smi), and on a host the autostop's wall,
pre-stop hook and stop command (autostop.hook). Never a shell: argv is a list.

The program runs in its own process group, so that one that hangs is killed with everything it started (a wrapper
script's children would otherwise keep running and keep the output pipe open).
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Sequence


def run_bounded(argv: Sequence[str], timeout_s: float, *, merge_stderr: bool = False) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one run; stderr is "" with merge_stderr (it is in stdout).
    Raises OSError when it cannot start, subprocess.TimeoutExpired once the whole group has been killed."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return proc.returncode, out or "", err or ""
