"""One host's GPUs at one instant, as read on the host itself (NVML or nvidia-smi).

Both readers (gpufinops.collect.nvml and gpufinops.collect.nvidia_smi) produce
this same typed snapshot, and everything downstream (the agent's /metrics, the
local autostop's ring buffer) reads only this. A value the driver does not give
(`[N/A]`, `[Not Supported]`, an NVML "not supported" error) is None, never 0.

Under MIG a GPU is split into GPU instances (GI), each with its own memory
pool; a GI may hold several compute instances (CI) that share that pool, so
memory is counted once per GI, never per CI. NVML and nvidia-smi give no
utilization figure for a MIG instance (`utilization.gpu` is `[N/A]`): what
shows work there is processes running in the GI and memory it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

# Exported by `gpufinops agent` with dcgm-exporter's GPU labels: compute processes per GPU (or per MIG GPU
# instance). dcgm-exporter has no such series; the central collector reads it where present as evidence of
# work for a GPU without an activity figure, and a rule may opt in to read "0 for the whole window" as idle.
PROCESSES_METRIC = "gpufinops_gpu_processes"


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str  # untrusted text from the driver: escape before showing, never put in argv
    used_memory_mib: float | None = None
    gpu_instance_id: int | None = None  # MIG only
    compute_instance_id: int | None = None  # MIG only


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance (GI): the unit that owns memory and gets one series, like dcgm-exporter's."""

    gpu_instance_id: int  # dcgm-exporter label GPU_I_ID
    profile: str  # e.g. "3g.40gb", dcgm-exporter label GPU_I_PROFILE
    uuid: str = ""  # MIG-... device UUID (of its first compute instance), "" when unknown
    compute_instance_ids: tuple[int, ...] = ()
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    activity_pct: float | None = None  # only where the driver gives one (e.g. NVML GPM SM activity)
    processes: tuple[GpuProcess, ...] | None = None  # None = not read, () = read and none running


@dataclass(frozen=True)
class GpuSnapshot:
    index: int
    uuid: str
    name: str
    pci_bus_id: str = ""
    driver_version: str = ""
    mig_enabled: bool = False
    utilization_pct: float | None = None  # None under MIG and wherever not measured
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None  # whole board, also under MIG (not split per GI)
    temperature_c: float | None = None
    processes: tuple[GpuProcess, ...] | None = None  # None = not read
    mig_instances: tuple[MigInstance, ...] = ()


@dataclass(frozen=True)
class HostSnapshot:
    taken_at: datetime  # aware UTC
    source: str  # "nvml" | "nvidia-smi"
    gpus: tuple[GpuSnapshot, ...] = field(default_factory=tuple)
    # What could not be read while the rest could (e.g. "processes: nvidia-smi exited 9: ..."): the figures
    # concerned are None, never guessed. Empty when everything was read.
    problems: tuple[str, ...] = ()


# Why a whole read failed: the command exited non-zero, was killed after its timeout, printed something that is
# not what was asked, could not be started, or NVML returned an error.
READ_ERROR_REASONS = ("exit", "timeout", "unparseable", "not_found", "nvml")


class GpuReadError(Exception):
    """A host's GPUs could not be read at all: no snapshot, say why (`reason` is one of READ_ERROR_REASONS)."""

    def __init__(self, reason: str, message: str):
        if reason not in READ_ERROR_REASONS:
            raise ValueError(f"unknown GPU read error reason {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message
