"""One host's GPUs at one instant, as read on the host itself (NVML or nvidia-smi).

Both readers (gpufinops.collect.nvml and gpufinops.collect.nvidia_smi) produce
this same typed snapshot, and everything downstream (the agent's /metrics, the
local autostop's ring buffer) reads only this. A value the driver does not give
(`[N/A]`, `[Not Supported]`, an NVML "not supported" error) is None, never 0.

Under MIG a GPU is split into GPU instances (GI), each with its own memory
pool; a GI may hold several compute instances (CI) that share that pool, so
memory is counted once per GI, never per CI. NVML and nvidia-smi give no
utilization figure for a MIG instance (`utilization.gpu` is `[N/A]`). On GPUs
with NVML GPM (Hopper and later: H100, H200, GH200, B200) the NVML reader gives
profiling figures per GPU and per GI (`gpm`, dcgm-exporter's DCGM_FI_PROF_*
names): a GI is then judged by its graphics-engine activity. Without GPM what
shows work in a GI is processes running in it and memory it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

# Exported by `gpufinops agent` with dcgm-exporter's GPU labels: compute processes per GPU (or per MIG GPU
# instance). dcgm-exporter has no such series; the central collector reads it where present as evidence of
# work for a GPU without an activity figure, and a rule may opt in to read "0 for the whole window" as idle.
PROCESSES_METRIC = "gpufinops_gpu_processes"

# NVML GPM metrics read per GPU and per MIG GPU instance: (dcgm-exporter metric, pynvml constant, HELP).
# GPM gives percent over the interval between two samples; dcgm-exporter's DCGM_FI_PROF_* are ratios 0..1.
# GRAPHICS_UTIL ("time any compute/graphics app was active") is DCGM's GRACT, i.e. GR_ENGINE_ACTIVE.
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPM_METRICS = (
    (GR_ENGINE_ACTIVE, "NVML_GPM_METRIC_GRAPHICS_UTIL", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "NVML_GPM_METRIC_SM_UTIL",
     "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "NVML_GPM_METRIC_SM_OCCUPANCY",
     "The ratio of number of warps resident on an SM."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
     "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "NVML_GPM_METRIC_DRAM_BW_UTIL",
     "Ratio of cycles the device memory interface is active sending or receiving data."),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "NVML_GPM_METRIC_FP64_UTIL", "Ratio of cycles the fp64 pipes are active."),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "NVML_GPM_METRIC_FP32_UTIL", "Ratio of cycles the fp32 pipes are active."),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "NVML_GPM_METRIC_FP16_UTIL", "Ratio of cycles the fp16 pipes are active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "NVML_GPM_METRIC_HMMA_TENSOR_UTIL",
     "Ratio of cycles the tensor (HMMA) pipe is active (off the peak sustained elapsed cycles)."),
    ("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "NVML_GPM_METRIC_IMMA_TENSOR_UTIL",
     "Ratio of cycles the integer tensor (IMMA) pipe is active."),
)


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
    processes: tuple[GpuProcess, ...] | None = None  # None = not read, () = read and none running
    # GPM figures in percent by dcgm-exporter metric name (GPM_METRICS); empty where GPM is not supported, on the
    # first read (GPM needs two samples) or after an error. A metric the driver did not give is absent, never 0.
    gpm: Mapping[str, float] = field(default_factory=dict)

    @property
    def activity_pct(self) -> float | None:
        """The GI's activity figure (GPM graphics-engine activity), None where the driver gives none."""
        return self.gpm.get(GR_ENGINE_ACTIVE)


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
    # Whole-GPU GPM figures (see MigInstance.gpm); under MIG they are per GI only, as dcgm-exporter gives them.
    gpm: Mapping[str, float] = field(default_factory=dict)


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
