"""Slurm's jobs as 22.05's `squeue --json` (openapi/v0.0.38) shows them: pure, the one place its fields are read.

A job's GPUs are read per node from `gres_detail` (one entry per allocated node, in the order of `nodes` expanded:
`gpu:fake:2(IDX:0-1)`), where IDX is Slurm's GPU index on that node: the device's minor number in gres.conf order,
which is NOT always NVML's index (the DCGM exporter's `gpu` label) — docs/slurm.md says how to map them. A job
whose GPUs cannot be read (no IDX, `IDX:N/A`, a count that disagrees) keeps `gpus_unread` with the reason: it is
judged UNKNOWN, never idle. Field names change in 23.02+ (data_parser): read them here and nowhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

ID_PREFIX = "slurm:"

# One GPU gres of a node's gres_detail entry: name:type:count(IDX:list) or name:count(IDX:list).
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:(),]+)?:(\d+)\(IDX:([^)]*)\)")
_INDEX_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_HOST_RANGE = re.compile(r"^([^\[\],]*)\[([^\]]+)\](.*)$")


@dataclass(frozen=True)
class GpuSlot:
    """One GPU a job holds: the node's host name and Slurm's index of it there."""

    node: str
    index: int


@dataclass(frozen=True)
class SlurmJob:
    cluster: str
    job_id: str  # Slurm's own id of this job (an array task's or het component's own number): what commands take
    display_id: str  # as a person knows it: "1234", "1234_7" (array task), "1240+1" (het component)
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str  # RUNNING, PENDING, COMPLETED, CANCELLED, ...
    batch: bool  # sbatch; False: salloc / srun --pty / an interactive app's allocation
    requeueable: bool
    restarts: int
    start_time: datetime | None  # None: not started
    time_limit_min: int | None  # None: unlimited
    nodes: tuple[str, ...]
    gpus: tuple[GpuSlot, ...]
    gpu_count: int  # what Slurm allocated (from gres_detail, else tres_per_node x nodes)
    comment: str
    admin_comment: str
    gpus_unread: str = ""  # why the GPUs' indexes could not be read ("" when they were)

    @property
    def subject_id(self) -> str:
        return f"{ID_PREFIX}{self.cluster}/{self.display_id}"

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"


def subject_id(cluster: str, display_id: str) -> str:
    return f"{ID_PREFIX}{cluster}/{display_id}"


def parse_subject_id(sid: str) -> tuple[str, str]:
    """(cluster, display id) of `slurm:<cluster>/<display id>`; ValueError for anything else."""
    if not sid.startswith(ID_PREFIX) or "/" not in sid:
        raise ValueError(f"{sid!r} is not a Slurm job id (slurm:<cluster>/<jobid>)")
    cluster, _, job = sid[len(ID_PREFIX):].partition("/")
    if not cluster or not job:
        raise ValueError(f"{sid!r} is not a Slurm job id (slurm:<cluster>/<jobid>)")
    return cluster, job


def expand_hostlist(spec: str) -> tuple[str, ...]:
    """Slurm's host list notation: "gpu[01-03,07],login1" -> gpu01, gpu02, gpu03, gpu07, login1."""
    out: list[str] = []
    for part in _split_top_level(spec):
        m = _HOST_RANGE.match(part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, rest = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"host list {spec!r}: {r!r} is not a number or range")
            width = len(lo)
            for n in range(int(lo), int(hi or lo) + 1):
                out.extend(prefix + str(n).zfill(width) + tail for tail in (expand_hostlist(rest) or ("",)))
    return tuple(out)


def _split_top_level(spec: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in spec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _indexes(text: str) -> list[int] | None:
    if not _INDEX_LIST.match(text):
        return None
    out: list[int] = []
    for r in text.split(","):
        lo, _, hi = r.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _gpus_per_node(tres_per_node: str) -> int:
    # "gres:gpu:2", "gres:gpu:a100:2", "gres/gpu:2"; anything else: 0 (no GPU asked per node)
    m = re.search(r"gres[:/]gpu(?::[^:,]+)?:(\d+)", tres_per_node or "")
    return int(m.group(1)) if m else 0


def _flag(value: Any) -> bool:
    """A yes/no field of squeue's JSON: true only when Slurm says so as JSON true (or 1). Anything else (missing, a
    string "false", garbled) is false, the safe side for both flags read with it: not requeueable (notify only
    under a requeue rule) and not batch (interactive: notify only)."""
    return value is True or (type(value) is int and value == 1)


def _when(epoch: Any) -> datetime | None:
    if isinstance(epoch, (int, float)) and epoch > 0:
        return datetime.fromtimestamp(int(epoch), tz=timezone.utc)
    return None


def _display_id(j: Mapping[str, Any], job_id: str) -> str:
    array_job, task = j.get("array_job_id") or 0, j.get("array_task_id")
    if array_job and isinstance(task, int):
        return f"{array_job}_{task}"
    het_job, offset = j.get("het_job_id") or 0, j.get("het_job_offset") or 0
    if het_job:
        return f"{het_job}+{offset}"
    return job_id


def parse_job(cluster: str, j: Mapping[str, Any]) -> SlurmJob:
    """One job of `squeue --json`'s "jobs"; ValueError naming the field when it cannot be read."""
    job_id = j.get("job_id")
    if not isinstance(job_id, int) or job_id <= 0:
        raise ValueError(f"job_id {job_id!r} is not a job number")
    try:
        nodes = expand_hostlist(str(j.get("nodes") or ""))
    except ValueError as exc:
        raise ValueError(f"job {job_id}: nodes: {exc}") from None
    details = [str(d) for d in (j.get("gres_detail") or [])]
    slots: list[GpuSlot] = []
    unread = ""
    counted = 0
    for i, detail in enumerate(details):
        for count, idx in _GPU_GRES.findall(detail):
            counted += int(count)
            indexes = _indexes(idx)
            node = nodes[i] if i < len(nodes) else ""
            if indexes is None or len(indexes) != int(count) or not node:
                unread = unread or f"Slurm gives no usable GPU index for it ({detail!r})"
                continue
            slots.extend(GpuSlot(node, n) for n in indexes)
    if slots and len(details) < len(nodes):
        # 22.05 gives one gres_detail entry per allocated node: fewer is a partial answer, and judging the GPUs it
        # names would call a job idle on the GPUs of one node while those of another work.
        unread = unread or (f"Slurm names the GPUs of {len(details)} of its {len(nodes)} nodes "
                            "(gres_detail is partial)")
        slots = []
    per_node = _gpus_per_node(str(j.get("tres_per_node") or ""))
    gpu_count = counted or per_node * max(len(nodes), 1 if per_node else 0)
    if gpu_count and not slots and not unread:
        unread = "Slurm shows GPUs allocated but no GPU index (no gres_detail)"
    limit = j.get("time_limit")
    state = str(j.get("job_state") or "UNKNOWN").upper()
    start_time = _when(j.get("start_time"))
    if gpu_count and state == "RUNNING" and start_time is None and not unread:
        # Without its start the job's own life is not known: a window could reach back into the GPU's previous job.
        unread = "Slurm shows no start time for the running job: its own life cannot be told apart"
    return SlurmJob(
        cluster=cluster, job_id=str(job_id), display_id=_display_id(j, str(job_id)),
        name=str(j.get("name") or ""), user=str(j.get("user_name") or ""), account=str(j.get("account") or ""),
        partition=str(j.get("partition") or ""), qos=str(j.get("qos") or ""),
        state=state, batch=_flag(j.get("batch_flag")),
        requeueable=_flag(j.get("requeue")), restarts=int(j.get("restart_cnt") or 0),
        start_time=start_time,
        time_limit_min=limit if isinstance(limit, int) and 0 < limit < 0xFFFFFFFE else None,
        nodes=nodes, gpus=tuple(slots), gpu_count=gpu_count,
        comment=str(j.get("comment") or ""), admin_comment=str(j.get("admin_comment") or ""),
        gpus_unread=unread)


def parse_squeue(cluster: str, doc: Mapping[str, Any]) -> tuple[list[SlurmJob], list[str]]:
    """Every job of one `squeue --json` answer, and a line per job that could not be read (never dropped silently:
    the caller makes the listing partial)."""
    jobs: list[SlurmJob] = []
    problems: list[str] = []
    for j in doc.get("jobs") or []:
        try:
            jobs.append(parse_job(cluster, j))
        except (ValueError, TypeError, AttributeError) as exc:
            problems.append(f"slurm {cluster}: a job squeue shows could not be read: {exc}")
    return jobs, problems


def gpu_jobs(jobs: Iterable[SlurmJob]) -> list[SlurmJob]:
    """The RUNNING jobs that hold GPUs: the place's subjects."""
    return [j for j in jobs if j.running and j.gpu_count > 0]
