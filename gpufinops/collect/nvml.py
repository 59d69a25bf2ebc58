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

GPM (GPU Performance Monitoring, Hopper and later; `GpmSampler`): per GPU, and under MIG per GPU instance
(nvmlGpmMigSampleGet), one GPM sample per read; the figures (graphics-engine, SM, tensor, DRAM activity, ...,
gpu_snapshot.GPM_METRICS) are computed by nvmlGpmMetricsGet over the interval since the previous read's sample, so
the first read after start (or after an error) has none. A GPU without GPM (nvmlGpmQueryDeviceSupport says so, or
NotSupported) has no GPM figures, never 0, and is not asked again. A GPM error never fails the read: that GPU or GI
has no GPM figures for this read and the error is logged once until GPM answers again. Each GPU or GI holds two
NVML sample buffers, reused read after read and freed by `close()` (or when a GI disappears).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from types import ModuleType
from typing import Any

from gpufinops.collect.gpu_snapshot import (
    GPM_METRICS,
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


GpmKey = tuple[str, int | None]  # (GPU UUID, GPU instance id or None for the whole GPU)


class _SamplePair:
    """Two NVML GPM sample buffers of one GPU or GI: `previous` (valid once a sample is in it) and `spare`."""

    def __init__(self, previous: Any, spare: Any):
        self.previous, self.spare = previous, spare
        self.previous_valid = False


class GpmSampler:
    """NVML GPM between reads: the previous sample of each GPU / GPU instance, and the figures since it.

    Not thread-safe: one read at a time (NvmlReader never overlaps reads).
    """

    def __init__(self, nvml: Any):
        self.nvml = nvml
        # (dcgm-exporter name, NVML metric id) for the metrics these bindings know (older ones lack some).
        self.metric_ids = tuple((name, getattr(nvml, const)) for name, const, _help in GPM_METRICS
                                if hasattr(nvml, const))
        self._supported: dict[str, bool] = {}  # GPU UUID -> has GPM (asked once per GPU)
        self._pairs: dict[GpmKey, _SamplePair] = {}
        self._unsupported_keys: set[GpmKey] = set()  # a GI whose GPM answered NotSupported: not asked again
        self._failing: set[GpmKey] = set()  # keys whose error was logged, until GPM answers again
        self._request: Any = None  # one nvmlGpmMetricsGet request struct, reused

    def supported(self, handle: Any, uuid: str) -> bool:
        if uuid not in self._supported:
            self._supported[uuid] = self._query_support(handle, uuid)
        return self._supported[uuid]

    def _query_support(self, handle: Any, uuid: str) -> bool:
        nvml = self.nvml
        if not self.metric_ids or not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            return False  # bindings without GPM
        try:
            return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except (nvml.NVMLError, AttributeError) as exc:  # NotSupported, FunctionNotFound (an older driver), ...
            if not isinstance(exc, nvml.NVMLError_NotSupported):
                log.info("GPU %s: NVML GPM not used: %s", uuid, exc)
            return False

    def read(self, key: GpmKey, handle: Any) -> dict[str, float]:
        """Take this read's sample of `key` (a GPU, or a GI of the GPU `handle`) and return the figures since
        the previous one, in percent by dcgm-exporter name; {} when there are none (first sample, error)."""
        nvml = self.nvml
        if key in self._unsupported_keys:
            return {}
        pair = self._pairs.get(key)
        try:
            if pair is None:
                pair = self._pairs[key] = _SamplePair(nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc())
            if key[1] is None:
                nvml.nvmlGpmSampleGet(handle, pair.spare)
            else:
                nvml.nvmlGpmMigSampleGet(handle, key[1], pair.spare)
        except nvml.NVMLError_NotSupported:
            self._unsupported_keys.add(key)
            self._free(key)
            return {}
        except Exception as exc:  # GPM is extra: no error of it (NVML's or the bindings') may fail the read
            if pair is not None:
                pair.previous_valid = False  # the next good sample starts a new interval
            self._log_failure(key, f"sample: {exc or type(exc).__name__}")
            return {}
        figures: dict[str, float] = {}
        if pair.previous_valid:
            try:
                figures = self._metrics(pair.previous, pair.spare)
            except Exception as exc:  # as above: this GPU or GI has no GPM figures this time, the read goes on
                self._log_failure(key, f"metrics: {exc or type(exc).__name__}")
        pair.previous, pair.spare = pair.spare, pair.previous
        pair.previous_valid = True
        if figures:
            self._failing.discard(key)
        return figures

    def _metrics(self, older: Any, newer: Any) -> dict[str, float]:
        nvml = self.nvml
        if self._request is None:
            self._request = nvml.c_nvmlGpmMetricsGet_t()
        request = self._request
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self.metric_ids)
        request.sample1, request.sample2 = older, newer
        for i, (_name, metric_id) in enumerate(self.metric_ids):
            request.metrics[i].metricId = metric_id
        nvml.nvmlGpmMetricsGet(request)
        out = {}
        for i, (name, _metric_id) in enumerate(self.metric_ids):
            metric = request.metrics[i]
            value = float(metric.value)
            # Each metric has its own return code (one the GPU does not count is NotSupported): only a success
            # with a percentage is a figure; anything else is left out, not guessed.
            if metric.nvmlReturn == nvml.NVML_SUCCESS and math.isfinite(value) and 0.0 <= value <= 100.0:
                out[name] = round(value, 3)
        return out

    def _log_failure(self, key: GpmKey, message: str) -> None:
        if key not in self._failing:
            self._failing.add(key)
            where = f"GPU {key[0]}" + (f" GPU instance {key[1]}" if key[1] is not None else "")
            log.warning("NVML GPM %s: %s (no GPM figures until it answers again)", where, message)

    def keep_only(self, seen: set[GpmKey]) -> None:
        """Free the buffers of GPUs / GIs not in this read (a GI destroyed, MIG switched)."""
        for key in [k for k in self._pairs if k not in seen]:
            self._free(key)

    def _free(self, key: GpmKey) -> None:
        pair = self._pairs.pop(key, None)
        if pair is None:
            return
        for sample in (pair.previous, pair.spare):
            try:
                self.nvml.nvmlGpmSampleFree(sample)
            except Exception:  # freeing: nothing a caller can do about it
                pass

    def close(self) -> None:
        for key in list(self._pairs):
            self._free(key)


def _mig_enabled(calls: _Calls, handle: Any) -> bool:
    mode = calls.optional("MIG mode", calls.nvml.nvmlDeviceGetMigMode, handle)
    return bool(mode) and mode[0] == getattr(calls.nvml, "NVML_DEVICE_MIG_ENABLE", 1)


def _mig_instances(calls: _Calls, handle: Any, problems: list[str], gpm: Callable[[int], dict[str, float]]
                   ) -> tuple[tuple[MigInstance, ...], tuple[GpuProcess, ...] | None]:
    """(one MigInstance per GPU instance, the GPU's processes = those of its MIG devices, or None).

    `gpm(gi)` gives the GI's GPM figures ({} where there are none)."""
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
                                     memory_used_mib=first[4], memory_total_mib=first[5], processes=procs,
                                     gpm=gpm(gi)))
    gpu_procs = None if any(m.processes is None for m in instances) else tuple(
        sorted((p for m in instances for p in m.processes), key=lambda p: p.pid))
    return tuple(instances), gpu_procs


def read_snapshot(nvml: Any, now: datetime | None = None, gpm: GpmSampler | None = None) -> HostSnapshot:
    """One HostSnapshot through an initialised NVML module. GpuReadError("nvml") when NVML fails.

    With `gpm` (kept from read to read), GPUs that support GPM get their GPM figures, per GI under MIG."""
    taken_at = now or datetime.now(timezone.utc)
    seen: set[GpmKey] = set()
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
        uuid = _text(calls.required("UUID", nvml.nvmlDeviceGetUUID, handle))
        with_gpm = gpm is not None and gpm.supported(handle, uuid)

        def gpm_of(gi: int | None, handle=handle, uuid=uuid, with_gpm=with_gpm) -> dict[str, float]:
            if not with_gpm:
                return {}
            seen.add((uuid, gi))
            return gpm.read((uuid, gi), handle)

        if mig:
            instances, procs = _mig_instances(calls, handle, problems, gpm_of)
        else:
            instances = ()
            procs, why = calls.processes(handle, None, None)
            if why:
                problems.append(f"GPU {i}: {why}")
        gpus.append(GpuSnapshot(
            index=i, uuid=uuid,
            name=_text(calls.optional("name", nvml.nvmlDeviceGetName, handle) or ""),
            pci_bus_id=_text(getattr(pci, "busId", "") if pci is not None else ""),
            driver_version=driver, mig_enabled=mig,
            # Under MIG NVML answers NotSupported for the whole GPU: None, never 0.
            utilization_pct=measured(util.gpu) if util is not None else None,
            memory_used_mib=used, memory_total_mib=total,
            power_w=round(power_mw / 1000.0, 3) if measured(power_mw) is not None else None,
            temperature_c=measured(temp), processes=procs, mig_instances=instances,
            gpm={} if mig else gpm_of(None),  # under MIG per GI only, as dcgm-exporter gives them
        ))
    if gpm is not None:
        gpm.keep_only(seen)
    return HostSnapshot(taken_at=taken_at, source=SOURCE, gpus=tuple(gpus), problems=tuple(problems))


class NvmlReader:
    """`open()` once (nvmlInit), `read()` each sample, `close()` at the end (nvmlShutdown).

    An NVML call runs in the caller's process and cannot be killed: `read()` runs it in a worker thread and
    gives up after `timeout_s` (GpuReadError "timeout"); while that call has still not returned, every later
    read fails at once with "timeout" instead of piling up threads on a wedged driver.
    """

    source = SOURCE

    def __init__(self, nvml: Any | None = None, timeout_s: float = 5.0, *, gpm: bool = True):
        self.nvml = nvml
        self.timeout_s = timeout_s
        self.use_gpm = gpm
        self._gpm: GpmSampler | None = None
        self._stuck: threading.Thread | None = None

    def open(self) -> NvmlReader:
        if self.nvml is None:
            self.nvml = load_nvml()
        try:
            self.nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded, or an OSError from ctypes
            raise GpuReadError("nvml", f"NVML did not initialise: {exc}") from None
        if self.use_gpm:
            self._gpm = GpmSampler(self.nvml)
        return self

    def read(self, now: datetime | None = None) -> HostSnapshot:
        if self._stuck is not None and self._stuck.is_alive():
            raise GpuReadError("timeout", "a previous NVML call has still not returned")
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                result["snapshot"] = read_snapshot(self.nvml, now, self._gpm)
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
        stuck = self._stuck is not None and self._stuck.is_alive()
        if self._gpm is not None and not stuck:  # a wedged call may still hold a buffer: shutdown releases it
            self._gpm.close()
        self._gpm = None
        try:
            if self.nvml is not None:
                self.nvml.nvmlShutdown()
        except Exception:  # shutting down: nothing left to report to
            pass
