"""Slurm's client commands, run against one cluster: its slurm.conf as SLURM_CONF, a timeout, no shell.

Every failure is one SlurmUnavailable naming the command (never the environment): a missing binary, a timeout, a
non-zero exit (slurmctld down: "Unable to contact slurm controller"), an answer that is not the JSON asked for. The
caller turns it into UNKNOWN for every job of the cluster, one alert, no action — never into "no jobs".
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...collect.errors import QueryFailed


class SlurmUnavailable(QueryFailed):
    """A Slurm command could not answer (controller down, timeout, refused, unreadable answer)."""


class SlurmRefused(SlurmUnavailable):
    """slurmctld answered and refused (a non-zero exit that is not a lost connection): the change was not made.
    `definite` tells act.Actuator.change so: failed, once the job agrees, rather than "unconfirmed"."""

    definite = True


# Words of a non-zero exit whose request may have reached slurmctld all the same: never taken as a refusal.
_NOT_AN_ANSWER = ("timed out", "unable to contact", "connection refused", "zero bytes were transmitted")


def _run_subprocess(argv: Sequence[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


# ESLURM_REST_EMPTY_RESULT: 22.05's `sacct --json` over a period with no job exits 0 with `"jobs": []` and this one
# entry in `errors` ("Nothing found", source slurmdb_jobs_get; seen on the test cluster's slurmdbd). It is an answer
# (no job in that window), not an outage: a month read in windows meets it for every quiet window.
_EMPTY_RESULT = 9003

# Slurm's messages can be long (a whole usage text); one line of them is enough to say why.
_MAX_ERROR_CHARS = 300


def _only_nothing_found(errors: Any) -> bool:
    """True when every entry of an answer's `errors` is sacct's empty result (_EMPTY_RESULT from slurmdb_jobs_get)."""
    return isinstance(errors, list) and all(
        isinstance(e, dict) and e.get("error_number") == _EMPTY_RESULT and e.get("source") == "slurmdb_jobs_get"
        for e in errors)


@dataclass
class SlurmCommands:
    """One cluster's client commands. `conf`: its slurm.conf (None: the commands' own default, /etc/slurm)."""

    cluster: str
    conf: str | None = None
    timeout_s: float = 30.0
    # The process runner (tests hand a recording one that still runs the real command).
    runner: Callable[[Sequence[str], dict[str, str], float], subprocess.CompletedProcess] = field(
        default=_run_subprocess, repr=False)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        # Slurm's clients read these too; a value left in the service's environment would change what they show.
        for key in ("SQUEUE_FORMAT", "SQUEUE_FORMAT2", "SQUEUE_SORT", "SLURM_TIME_FORMAT", "SACCT_FORMAT"):
            env.pop(key, None)
        return env

    def run(self, *argv: str) -> str:
        """The command's standard output; SlurmUnavailable when it did not succeed."""
        what = " ".join(argv[:2])
        try:
            res = self.runner(argv, self.env(), self.timeout_s)
        except FileNotFoundError:
            raise SlurmUnavailable(f"slurm {self.cluster}: {argv[0]} is not installed on this host") from None
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"slurm {self.cluster}: {what} gave no answer in {self.timeout_s:g} s") from None
        except OSError as exc:
            raise SlurmUnavailable(f"slurm {self.cluster}: {what} could not run: {exc.strerror}") from None
        if res.returncode != 0:
            why = " ".join((res.stderr or res.stdout or "").split())[:_MAX_ERROR_CHARS] or "no message"
            error = SlurmUnavailable if any(w in why.lower() for w in _NOT_AN_ANSWER) else SlurmRefused
            raise error(f"slurm {self.cluster}: {what} failed (exit {res.returncode}): {why}")
        return res.stdout

    def run_json(self, *argv: str) -> dict[str, Any]:
        out = self.run(*argv)
        try:
            doc = json.loads(out)
        except ValueError:
            raise SlurmUnavailable(f"slurm {self.cluster}: {' '.join(argv[:2])} did not answer JSON") from None
        if not isinstance(doc, dict):
            raise SlurmUnavailable(f"slurm {self.cluster}: {' '.join(argv[:2])} answered JSON that is not an object")
        # 22.05's `squeue --json` with slurmctld down exits 0 with `"jobs": []` and the failure only in `errors`
        # ("Failed while looking for jobs", source slurm_load_jobs): an empty list there is an outage, not "no jobs".
        errors = doc.get("errors")
        if errors and _only_nothing_found(errors) and doc.get("jobs") == []:
            return {**doc, "errors": []}
        if errors:
            first = errors[0] if isinstance(errors, list) and isinstance(errors[0], dict) else {}
            why = " ".join(str(first.get(k) or "") for k in ("source", "description", "error")).strip()
            raise SlurmUnavailable(f"slurm {self.cluster}: {' '.join(argv[:2])} reported an error: "
                                   f"{why[:_MAX_ERROR_CHARS] or errors!r}")
        return doc

    def squeue(self, job_ids: Sequence[str] = ()) -> dict[str, Any]:
        """`squeue --json` (every state Slurm still shows: a job that ended shows as such for MinJobAge)."""
        argv = ["squeue", "--json", "--states=all"]
        if job_ids:
            argv.append("--jobs=" + ",".join(job_ids))
        doc = self.run_json(*argv)
        if not isinstance(doc.get("jobs"), list):
            raise SlurmUnavailable(f"slurm {self.cluster}: squeue --json answered no job list")
        return doc

    # ------------------------------------------------------------------ the changes (the Actuator's alone)
    # Each is ONE command; its answer may be lost (a timeout after slurmctld took it): the caller reads the job back.

    def update_comment(self, job_id: str, field_name: str, text: str) -> None:
        """`scontrol update jobid=N Comment=...` (or AdminComment=...)."""
        key = {"comment": "Comment", "admin_comment": "AdminComment"}[field_name]
        self.run("scontrol", "update", f"jobid={job_id}", f"{key}={text}")

    def signal_batch(self, job_id: str, signal: str) -> None:
        """`scancel --signal=SIG --batch N`: the signal to the batch shell only (the job's own trap checkpoints)."""
        self.run("scancel", f"--signal={signal}", "--batch", job_id)

    def requeue(self, job_id: str) -> None:
        self.run("scontrol", "requeue", job_id)

    def requeue_hold(self, job_id: str) -> None:
        """`scontrol requeuehold N`: a running job back to PENDING, held (a plain `scontrol hold` leaves it running)."""
        self.run("scontrol", "requeuehold", job_id)

    def cancel(self, job_id: str) -> None:
        self.run("scancel", job_id)
