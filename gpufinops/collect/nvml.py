"""This host's GPUs through NVML (`nvidia-ml-py`, `import pynvml`): the agent's reader when the library loads.

NVML is what nvidia-smi itself calls, without a process per sample. The module object is injectable
(`NvmlReader(nvml=...)`) so tests answer NVML calls from real nvidia-smi captures.

What is read, per GPU: utilization (nvmlDeviceGetUtilizationRates), memory (v2 where the driver has it, so
`used` excludes the reserved part as nvidia-smi's memory.used does), power, temperature, compute processes
(nvmlDeviceGetComputeRunningProcesses), MIG mode and, under MIG, each MIG device (nvmlDeviceGetMaxMigDeviceCount /
nvmlDeviceGetMigDeviceHandleByIndex): GPU and compute instance id, the GI's memory (one pool for its compute
instances, counted once), profile from the device name ("NVIDIA H100 80GB HBM3 MIG 3g.40gb"), its processes.
A value NVML does not support (NVMLError_NotSupported, NVML_VALUE_NOT_AVAILABLE) is None, never 0. Any other
NVML error fails the whole read (GpuReadError reason "nvml"), except processes, which a driver may refuse
(NoPermission / NotSupported) while every figure is good: those are None and said in `problems`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from types import ModuleType
from typing import Any

from gpufinops.collect.gpu_snapshot import (
    GpuProcess,
    GpuReadError,
    GpuSnapshot,
    HostSnapshot,
    MigInstance,
)
from gpufinops.collect.nvidia_smi import gi_profile, measured

log = logging.getLogger("gpufinops.agent")
SOURCE = "nvml"
MIB = 1024 * 1024


def load_nvml() -> ModuleType:
    """The pynvml module, or GpuReadError("not_found") when the bindings are not installed."""
    try:
        import pynvml
    except ImportError as exc:
        raise GpuReadError("not_found", f"nvidia-ml-py is not installed: {exc}") from None
    return pynvml


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value) if value is not None else ""


def _mib(value_bytes: Any) -> float | None:
    """Bytes to whole MiB as nvidia-smi prints them; None for NVML's "not available" (all bits set) and the like."""
    if value_bytes is None or not isinstance(value_bytes, int) or value_bytes < 0 or value_bytes >= 2**63:
        return None
    return measured(value_bytes // MIB)


class _Calls:
    """NVML calls with the error policy of this module: NotSupported -> None, anything else -> GpuReadError."""

    def __init__(self, nvml: Any):
        self.nvml = nvml

    def optional(self, what: str, fn: Callable, *args) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError_NotSupported:
            return None
        except self.nvml.NVMLError as exc:
            raise GpuReadError("nvml", f"{what}: {exc}") from None

    def required(self, what: str, fn: Callable, *args) -> Any:
        value = self.optional(what, fn, *args)
        if value is None:
            raise GpuReadError("nvml", f"{what}: not supported")
        return value

    def errors(self, *names: str) -> tuple[type[BaseException], ...]:
        """The module's NVMLError_<name> classes that exist (older bindings lack some)."""
        return tuple(getattr(self.nvml, f"NVMLError_{n}") for n in names if hasattr(self.nvml, f"NVMLError_{n}"))

    def memory(self, handle: Any) -> tuple[float | None, float | None]:
        """(used MiB, total MiB); v2 (used without the reserved part) where the driver and bindings have it."""
        nvml = self.nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
                return _mib(info.used), _mib(info.total)
            except (*self.errors("NotSupported", "FunctionNotFound", "ArgumentVersionMismatch"), TypeError):
                pass  # an older driver or binding: v1 below
            except nvml.NVMLError as exc:
                raise GpuReadError("nvml", f"memory: {exc}") from None
        info = self.optional("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        return (None, None) if info is None else (_mib(info.used), _mib(info.total))

    def processes(self, handle: Any, gi: int | None, ci: int | None) -> tuple[tuple[GpuProcess, ...] | None, str]:
        """(compute processes sorted by pid, "" or why they could not be read)."""
        nvml = self.nvml
        # A driver older than the bindings lacks the _v3 call behind the unversioned one: pynvml then raises
        # NVMLLibraryMismatchError (not an NVMLError); the _v2 call answers the same question there.
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", ())
        try:
            try:
                raw = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except mismatch:
                raw = nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)
        except (*self.errors("NotSupported", "NoPermission", "FunctionNotFound"), AttributeError) as exc:
            return None, f"processes not read: {exc or type(exc).__name__}"
        except nvml.NVMLError as exc:
            raise GpuReadError("nvml", f"processes: {exc}") from None
        out = []
        for p in raw:
            try:
                name = _text(nvml.nvmlSystemGetProcessName(p.pid))
            except nvml.NVMLError:  # the process has just exited, or is another user's: its count still holds
                name = ""
            out.append(GpuProcess(pid=int(p.pid), name=name, used_memory_mib=_mib(p.usedGpuMemory),
                                  gpu_instance_id=gi, compute_instance_id=ci))
        return tuple(sorted(out, key=lambda p: p.pid)), ""


def _mig_enabled(calls: _Calls, handle: Any) -> bool:
    mode = calls.optional("MIG mode", calls.nvml.nvmlDeviceGetMigMode, handle)
    return bool(mode) and mode[0] == getattr(calls.nvml, "NVML_DEVICE_MIG_ENABLE", 1)


def _mig_instances(calls: _Calls, handle: Any, problems: list[str]
                   ) -> tuple[tuple[MigInstance, ...], tuple[GpuProcess, ...] | None]:
    """(one MigInstance per GPU instance, the GPU's processes = those of its MIG devices, or None)."""
    nvml = calls.nvml
    count = calls.optional("MIG device count", nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    devices = []  # (gi, ci, uuid, profile, used, total, processes)
    for i in range(count):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvml.NVMLError_NotFound:
            continue  # an empty slot
        except nvml.NVMLError as exc:
            raise GpuReadError("nvml", f"MIG device {i}: {exc}") from None
        gi = int(calls.required("GPU instance id", nvml.nvmlDeviceGetGpuInstanceId, mig))
        ci = int(calls.required("compute instance id", nvml.nvmlDeviceGetComputeInstanceId, mig))
        name = _text(calls.required("MIG device name", nvml.nvmlDeviceGetName, mig))
        profile = gi_profile(name.rsplit(" MIG ", 1)[1]) if " MIG " in name else ""
        used, total = calls.memory(mig)
        procs, why = calls.processes(mig, gi, ci)
        if why:
            problems.append(f"GPU instance {gi}: {why}")
        devices.append((gi, ci, _text(calls.required("MIG UUID", nvml.nvmlDeviceGetUUID, mig)), profile, used,
                        total, procs))
    by_gi: dict[int, list] = {}
    for d in devices:
        by_gi.setdefault(d[0], []).append(d)
    instances = []
    for gi, devs in sorted(by_gi.items()):
        first = min(devs, key=lambda d: d[1])
        # Every compute instance of a GI sees the GI's one memory pool: take it once.
        procs = None if any(d[6] is None for d in devs) else tuple(
            sorted({p.pid: p for d in devs for p in d[6]}.values(), key=lambda p: p.pid))
        instances.append(MigInstance(gpu_instance_id=gi, profile=first[3], uuid=first[2],
                                     compute_instance_ids=tuple(sorted({d[1] for d in devs})),
                                     memory_used_mib=first[4], memory_total_mib=first[5], processes=procs))
    gpu_procs = None if any(m.processes is None for m in instances) else tuple(
        sorted((p for m in instances for p in m.processes), key=lambda p: p.pid))
    return tuple(instances), gpu_procs


def read_snapshot(nvml: Any, now: datetime | None = None) -> HostSnapshot:
    """One HostSnapshot through an initialised NVML module. GpuReadError("nvml") when NVML fails."""
    taken_at = now or datetime.now(timezone.utc)
    calls = _Calls(nvml)
    driver = _text(calls.optional("driver version", nvml.nvmlSystemGetDriverVersion) or "")
    problems: list[str] = []
    gpus = []
    for i in range(int(calls.required("device count", nvml.nvmlDeviceGetCount))):
        handle = calls.required(f"GPU {i} handle", nvml.nvmlDeviceGetHandleByIndex, i)
        mig = _mig_enabled(calls, handle)
        util = calls.optional("utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = calls.optional("power", nvml.nvmlDeviceGetPowerUsage, handle)
        temp = calls.optional("temperature", nvml.nvmlDeviceGetTemperature, handle,
                              getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        pci = calls.optional("PCI info", nvml.nvmlDeviceGetPciInfo, handle)
        used, total = calls.memory(handle)
        if mig:
            instances, procs = _mig_instances(calls, handle, problems)
        else:
            instances = ()
            procs, why = calls.processes(handle, None, None)
            if why:
                problems.append(f"GPU {i}: {why}")
        gpus.append(GpuSnapshot(
            index=i, uuid=_text(calls.required("UUID", nvml.nvmlDeviceGetUUID, handle)),
            name=_text(calls.optional("name", nvml.nvmlDeviceGetName, handle) or ""),
            pci_bus_id=_text(getattr(pci, "busId", "") if pci is not None else ""),
            driver_version=driver, mig_enabled=mig,
            # Under MIG NVML answers NotSupported for the whole GPU: None, never 0.
            utilization_pct=measured(util.gpu) if util is not None else None,
            memory_used_mib=used, memory_total_mib=total,
            power_w=round(power_mw / 1000.0, 3) if measured(power_mw) is not None else None,
            temperature_c=measured(temp), processes=procs, mig_instances=instances,
        ))
    return HostSnapshot(taken_at=taken_at, source=SOURCE, gpus=tuple(gpus), problems=tuple(problems))


class NvmlReader:
    """`open()` once (nvmlInit), `read()` each sample, `close()` at the end (nvmlShutdown).

    An NVML call runs in the caller's process and cannot be killed: `read()` runs it in a worker thread and
    gives up after `timeout_s` (GpuReadError "timeout"); while that call has still not returned, every later
    read fails at once with "timeout" instead of piling up threads on a wedged driver.
    """

    source = SOURCE

    def __init__(self, nvml: Any | None = None, timeout_s: float = 5.0):
        self.nvml = nvml
        self.timeout_s = timeout_s
        self._stuck: threading.Thread | None = None

    def open(self) -> NvmlReader:
        if self.nvml is None:
            self.nvml = load_nvml()
        try:
            self.nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded, or an OSError from ctypes
            raise GpuReadError("nvml", f"NVML did not initialise: {exc}") from None
        return self

    def read(self, now: datetime | None = None) -> HostSnapshot:
        if self._stuck is not None and self._stuck.is_alive():
            raise GpuReadError("timeout", "a previous NVML call has still not returned")
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                result["snapshot"] = read_snapshot(self.nvml, now)
            except GpuReadError as exc:  # handed to the caller's thread
                result["error"] = exc
            except Exception as exc:  # the bindings raising something else (e.g. a library mismatch)
                log.exception("NVML read failed")
                result["error"] = GpuReadError("nvml", f"unexpected {type(exc).__name__}: {exc}")

        worker = threading.Thread(target=work, name="nvml-read", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            self._stuck = worker
            raise GpuReadError("timeout", f"NVML did not answer within {self.timeout_s:g}s")
        if "error" in result:
            raise result["error"]
        return result["snapshot"]

    def close(self) -> None:
        try:
            if self.nvml is not None:
                self.nvml.nvmlShutdown()
        except Exception:  # shutting down: nothing left to report to
            pass
