"""A fake `pynvml` module that answers NVML calls from a real nvidia-smi capture (one phase of it).

`FakeNvml(capture, phase)` reads the capture's `--query-gpu` CSV (per-GPU figures), `--query-compute-apps`
(compute processes), `-q` (MIG devices: index, GPU/compute instance id, shared FB memory; which GI each process
runs in) and `-L` (MIG profile and UUID per MIG device), with its own small parsers, not gpufinops' (so the two
readers are checked against each other, not against one parser). Errors and constants are the real pynvml
ones: a field nvidia-smi printed as `[N/A]` raises the real `NVMLError_NotSupported`, as NVML does.

Knobs for failure tests: `fail` = {function name: NVML error code, or an exception} raises it from the call;
`block` = a threading.Event that nvmlDeviceGetCount waits on (a wedged driver).
"""

from __future__ import annotations

import csv
import io
import re
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

from tests.fake_nvidia_smi import parse_capture

MIB = 1024 * 1024


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
                 block: threading.Event | None = None):
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
        # The real module's errors and constants.
        for name in dir(pynvml):
            if name.startswith(("NVMLError", "NVML_", "NVMLLibraryMismatchError")) or name == "nvmlMemory_v2":
                setattr(self, name, getattr(pynvml, name))

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
