"""A fake `pynvml` module that answers NVML calls from a real nvidia-smi capture (one phase of it).

`FakeNvml(capture, phase)` reads the capture's `--query-gpu` CSV (per-GPU figures), `--query-compute-apps`
(compute processes), `-q` (MIG devices: index, GPU/compute instance id, shared FB memory; which GI each process
runs in) and `-L` (MIG profile and UUID per MIG device), with its own small parsers, not gpufinops' (so the two
readers are checked against each other, not against one parser). Errors and constants are the real pynvml
ones: a field nvidia-smi printed as `[N/A]` raises the real `NVMLError_NotSupported`, as NVML does.

GPM (Hopper profiling counters) answers from the real H200 figures in captures_device/gpm_h200_580.json (tests/data copy;
one 1 s window per phase: idle, busy, hold, duty50) on a Hopper GPU (H100, H200), and as a real pre-Hopper GPU does
elsewhere: nvmlGpmQueryDeviceSupport says isSupportedDevice 0 and nvmlGpmSampleGet raises NotSupported. `gpm_phase`
(settable between reads) picks the figures, one phase for the whole GPU or {GPU instance id: phase} under MIG; a
metric the capture did not record answers its own NotSupported in nvmlGpmMetricsGet, as a real one does. Samples
are real `c_nvmlGpmSample_t` pointers into the real request struct; `gpm_samples` holds those not yet freed.

Knobs for failure tests: `fail` = {function name: NVML error code, or an exception} raises it from the call;
`block` = a threading.Event that nvmlDeviceGetCount waits on (a wedged driver).
"""

from __future__ import annotations

import ctypes
import csv
import io
import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml

from tests.fake_nvidia_smi import parse_capture

MIB = 1024 * 1024
# A copy of ../shared/data/nvidia_smi/captures_device/gpm_h200_580.json (the real H200, driver 580).
GPM_CAPTURE = Path(__file__).parent / "data" / "nvidia_smi" / "captures_device" / "gpm_h200_580.json"
GPM_HOPPER = ("H100", "H200", "H800", "H20", "GH200")  # GPUs with GPM in these captures


def gpm_figures() -> dict[str, dict[str, float]]:
    """{phase: {pynvml metric constant name: percent}} as measured on the real H200."""
    data = json.loads(GPM_CAPTURE.read_text())
    return {s["tag"]: s["metrics"] for s in data["samples"]}


def _csv(body: str) -> list[dict[str, str]]:
    rows = [r for r in csv.reader(io.StringIO(body), skipinitialspace=True) if r]
    names = [h.split(" [")[0].strip() for h in rows[0]]
    return [dict(zip(names, (c.strip() for c in r))) for r in rows[1:]]


def _number(cell: str) -> float | None:
    m = re.fullmatch(r"(-?[0-9.]+)(?: \S+)?", cell.strip())
    return float(m.group(1)) if m else None


@dataclass
class MigDevice:
    index: int
    gi: int
    ci: int
    used_mib: int
    total_mib: int
    profile: str = ""
    uuid: str = ""


@dataclass
class _Gpu:
    row: dict[str, str]
    mig: list[MigDevice] = field(default_factory=list)
    slots: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (gi, ci) under MIG
    apps: list[tuple[int, str, float | None]] = field(default_factory=list)  # (pid, name, MiB)


def _parse_q(body: str) -> dict[str, tuple[list[MigDevice], dict[int, tuple[int, int]]]]:
    """{GPU UUID: (MIG devices, pid -> (gi, ci))}, read line by line."""
    out = {}
    devices: list[MigDevice] = []
    slots: dict[int, tuple[int, int]] = {}
    cur: dict[str, int] = {}
    in_shared_fb = in_processes = False
    gi = ci = None
    for line in body.splitlines():
        key, _, value = (part.strip() for part in line.partition(" : ")) if " : " in line else (line.strip(), "", "")
        indent = len(line) - len(line.lstrip())
        if key.startswith("GPU ") and indent == 0 and not value:
            devices, slots, cur = [], {}, {}
        if key == "MIG Device":
            cur = {}
        elif key in ("Index", "GPU Instance ID", "Compute Instance ID") and indent == 8:
            cur[key] = int(value)
        elif key == "Shared FB Memory Usage":
            in_shared_fb = True
        elif in_shared_fb and key in ("Total", "Used"):
            cur[key] = int(value.split()[0])
            if key == "Used":
                devices.append(MigDevice(cur["Index"], cur["GPU Instance ID"], cur["Compute Instance ID"],
                                          cur["Used"], cur["Total"]))
                in_shared_fb = False
        elif key == "Processes":
            in_processes = True
        elif in_processes and key == "GPU instance ID":
            gi = int(value) if value.isdigit() else None
        elif in_processes and key == "Compute instance ID":
            ci = int(value) if value.isdigit() else None
        elif in_processes and key == "Process ID" and gi is not None:
            slots[int(value)] = (gi, ci)
        elif key == "GPU UUID":
            out[value] = (devices, slots)
        if indent == 4 and key not in ("Processes",):
            in_processes = False
    return out


class FakeNvml(SimpleNamespace):
    def __init__(self, capture, phase: str, *, fail: dict[str, int | Exception] | None = None,
                 block: threading.Event | None = None, gpm_phase: str | dict[int, str] | None = None):
        super().__init__()
        sections = parse_capture(capture)
        body = {args.split("=")[0]: text for (p, args), text in sections.items() if p == phase}
        self.gpus = [_Gpu(row) for row in _csv(body["--query-gpu"])]
        q = _parse_q(body["-q"])
        listing = re.findall(r"MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)", sections[("capabilities", "-L")])
        for gpu in self.gpus:
            gpu.mig, gpu.slots = q.get(gpu.row["uuid"], ([], {}))
            for dev in gpu.mig:
                for profile, index, uuid in listing:
                    if int(index) == dev.index:
                        dev.profile, dev.uuid = profile, uuid
        for app in _csv(body["--query-compute-apps"]):
            gpu = next(g for g in self.gpus if g.row["uuid"] == app["gpu_uuid"])
            gpu.apps.append((int(app["pid"]), app["process_name"], _number(app["used_gpu_memory"])))
        self.fail = dict(fail or {})
        self.block = block
        self.initialised = False
        self.calls: list[str] = []
        # The real module's errors, constants and the GPM request struct.
        for name in dir(pynvml):
            if name.startswith(("NVMLError", "NVML_", "NVMLLibraryMismatchError")) or name in (
                    "nvmlMemory_v2", "c_nvmlGpmMetricsGet_t"):
                setattr(self, name, getattr(pynvml, name))
        self.gpm_phase = gpm_phase if gpm_phase is not None else {"idle": "idle", "load": "busy"}.get(phase, phase)
        self.gpm_samples: dict[int, tuple | None] = {}  # address -> (gpu, gi, sequence, phase) once taken
        self._gpm_addresses = itertools.count(0x1000, 0x10)  # never dereferenced: an id in pointer form
        self._gpm_sequence = itertools.count(1)

    # ------------------------------------------------------------------ helpers

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            error = self.fail[name]
            raise error if isinstance(error, Exception) else pynvml.NVMLError(error)
        if name != "nvmlInit" and not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    @staticmethod
    def _not_supported():
        return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _field(self, handle, key: str) -> float:
        value = _number(self.gpus[handle[1]].row[key])
        if value is None:  # "[N/A]", "[Not Supported]"
            raise self._not_supported()
        return value

    # ------------------------------------------------------------------ NVML

    def nvmlInit(self):
        self._call("nvmlInit")
        self.initialised = True

    def nvmlShutdown(self):
        self._call("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self):
        self._call("nvmlSystemGetDriverVersion")
        return self.gpus[0].row["driver_version"]

    def nvmlDeviceGetCount(self):
        self._call("nvmlDeviceGetCount")
        if self.block is not None:
            self.block.wait()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._call("nvmlDeviceGetHandleByIndex")
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, h):
        self._call("nvmlDeviceGetUUID")
        return self.gpus[h[1]].row["uuid"] if h[0] == "gpu" else self._mig(h).uuid

    def nvmlDeviceGetName(self, h):
        self._call("nvmlDeviceGetName")
        name = self.gpus[h[1]].row["name"]
        return name if h[0] == "gpu" else f"{name} MIG {self._mig(h).profile}"

    def nvmlDeviceGetPciInfo(self, h):
        self._call("nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=self.gpus[h[1]].row["pci.bus_id"].encode())  # a c_char array: bytes

    def nvmlDeviceGetMigMode(self, h):
        self._call("nvmlDeviceGetMigMode")
        mode = self.gpus[h[1]].row["mig.mode.current"]
        if mode not in ("Enabled", "Disabled"):
            raise self._not_supported()
        return [int(mode == "Enabled"), int(mode == "Enabled")]

    def nvmlDeviceGetUtilizationRates(self, h):
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=int(self._field(h, "utilization.gpu")), memory=0)

    def nvmlDeviceGetPowerUsage(self, h):
        self._call("nvmlDeviceGetPowerUsage")
        return int(round(self._field(h, "power.draw") * 1000))  # milliwatts

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._call("nvmlDeviceGetTemperature")
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return int(self._field(h, "temperature.gpu"))

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        self._call("nvmlDeviceGetMemoryInfo")
        if h[0] == "mig":
            dev = self._mig(h)
            used, total = dev.used_mib, dev.total_mib
        else:
            used, total = self._field(h, "memory.used"), self._field(h, "memory.total")
        return SimpleNamespace(used=int(used) * MIB, total=int(total) * MIB, free=int(total - used) * MIB)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        self._call("nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        self._call("nvmlDeviceGetMigDeviceHandleByIndex")
        if not any(d.index == i for d in self.gpus[h[1]].mig):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], i)

    def _mig(self, h) -> MigDevice:
        return next(d for d in self.gpus[h[1]].mig if d.index == h[2])

    def nvmlDeviceGetGpuInstanceId(self, h):
        self._call("nvmlDeviceGetGpuInstanceId")
        return self._mig(h).gi

    def nvmlDeviceGetComputeInstanceId(self, h):
        self._call("nvmlDeviceGetComputeInstanceId")
        return self._mig(h).ci

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._call("nvmlDeviceGetComputeRunningProcesses")
        gpu = self.gpus[h[1]]
        if h[0] == "mig":
            dev = self._mig(h)
            apps = [a for a in gpu.apps if gpu.slots.get(a[0]) == (dev.gi, dev.ci)]
        else:
            apps = gpu.apps
        # pynvml turns NVML_VALUE_NOT_AVAILABLE (WDDM on Windows) into None.
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else int(mib) * MIB,
                                gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, _name, mib in apps]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h):  # the call for drivers older than the bindings
        self.calls.append("nvmlDeviceGetComputeRunningProcesses_v2")
        saved, self.fail = self.fail, {k: v for k, v in self.fail.items() if k != "nvmlDeviceGetComputeRunningProcesses"}
        try:
            return self.nvmlDeviceGetComputeRunningProcesses(h)
        finally:
            self.fail = saved

    def nvmlSystemGetProcessName(self, pid):
        self._call("nvmlSystemGetProcessName")
        for gpu in self.gpus:
            for p, name, _mib in gpu.apps:
                if p == pid:
                    return name
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    # ------------------------------------------------------------------ GPM

    def _has_gpm(self, h) -> bool:
        return any(f"NVIDIA {model} " in self.gpus[h[1]].row["name"] + " " for model in GPM_HOPPER)

    def nvmlGpmQueryDeviceSupport(self, h):
        self._call("nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(self._has_gpm(h)))

    def nvmlGpmSampleAlloc(self):
        self._call("nvmlGpmSampleAlloc")
        address = next(self._gpm_addresses)
        self.gpm_samples[address] = None
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlGpmSample_t)

    @staticmethod
    def _address(sample) -> int:
        return ctypes.cast(sample, ctypes.c_void_p).value or 0

    def nvmlGpmSampleFree(self, sample):
        self._call("nvmlGpmSampleFree")
        if self.gpm_samples.pop(self._address(sample), "freed") == "freed":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # a double free

    def _take(self, h, gi, sample):
        if not self._has_gpm(h):
            raise self._not_supported()
        address = self._address(sample)
        if address not in self.gpm_samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # freed or never allocated
        phase = self.gpm_phase.get(gi, "idle") if isinstance(self.gpm_phase, dict) else self.gpm_phase
        self.gpm_samples[address] = (h[1], gi, next(self._gpm_sequence), phase)
        return sample

    def nvmlGpmSampleGet(self, h, sample):
        self._call("nvmlGpmSampleGet")
        return self._take(h, None, sample)

    def nvmlGpmMigSampleGet(self, h, gpu_instance_id, sample):
        self._call("nvmlGpmMigSampleGet")
        if not any(d.gi == gpu_instance_id for d in self.gpus[h[1]].mig):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return self._take(h, gpu_instance_id, sample)

    def nvmlGpmMetricsGet(self, request):
        self._call("nvmlGpmMetricsGet")
        older = self.gpm_samples.get(self._address(request.sample1))
        newer = self.gpm_samples.get(self._address(request.sample2))
        if (request.version != pynvml.NVML_GPM_METRICS_GET_VERSION or older is None or newer is None
                or older[:2] != newer[:2] or older[2] >= newer[2]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not two samples of one GPU, in order
        figures = gpm_figures()[newer[3]]
        names = {getattr(pynvml, name): name for name in dir(pynvml) if name.startswith("NVML_GPM_METRIC_")}
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            name = names.get(metric.metricId)
            if name in figures:
                metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, figures[name]
            else:
                metric.nvmlReturn, metric.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
        return request
