"""GPU readings from `nvidia-smi --query-gpu=... --format=csv`, for hosts
without dcgm-exporter/Prometheus (an agent samples locally).

nvidia-smi prints units in the header (`memory.used [MiB]`) and in each value
(`81559 MiB`, `100 %`), and bracketed words when a field has no value:
`[N/A]`, `[Not Supported]`, `[Requested functionality has been deprecated]`.
Those are "not measured" (None), never zero: a MIG-enabled GPU reports
utilization.gpu as `[N/A]` and so has no activity samples here.

`read_snapshot()` reads the whole host into a HostSnapshot (the agent's nvidia-smi reader): the per-GPU
figures from one `--query-gpu` CSV, compute processes from `--query-compute-apps`, and, only when a GPU has
MIG enabled, the MIG layout from `-q` (GPU/compute instance ids, per-GI memory, which GI each process runs
in) and `-L` (profile names and MIG UUIDs).
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from gpufinops.collect.gpu_snapshot import (
    GpuProcess,
    GpuReadError,
    GpuSnapshot,
    HostSnapshot,
    MigInstance,
)
from gpufinops.model import SENTINEL_THRESHOLD, GpuWindowStats
from gpufinops.procs import run_bounded

# The fields the sampler needs; any `--query-gpu` CSV with at least these parses.
QUERY_FIELDS = (
    "timestamp", "index", "uuid", "name", "utilization.gpu", "memory.used", "memory.total",
    "power.draw", "mig.mode.current",
)
SIGNAL = "nvidia-smi utilization.gpu"


class NvidiaSmiError(ValueError):
    """Unparseable nvidia-smi output; the message names the line."""


def _is_missing(value: str) -> bool:
    v = value.strip()
    return v == "" or v == "N/A" or (v.startswith("[") and v.endswith("]"))


def _split_header(name: str) -> tuple[str, str | None]:
    """'memory.used [MiB]' -> ('memory.used', 'MiB')."""
    name = name.strip()
    if name.endswith("]") and " [" in name:
        base, unit = name[:-1].split(" [", 1)
        return base, unit
    return name, None


def parse_value(raw: str, unit: str | None) -> str | float | None:
    """One CSV cell: None when not available, float for a field with a unit."""
    if _is_missing(raw):
        return None
    value = raw.strip()
    if unit is None:
        return value
    if value.endswith(" " + unit):
        value = value[: -len(unit) - 1]
    try:
        return float(value)
    except ValueError:
        return value  # a unit field with an unexpected word: keep it visible, untyped


def parse_query_gpu_csv(text: str, source: str = "<nvidia-smi>") -> list[dict[str, str | float | None]]:
    """Rows of `--format=csv` output as {field: value}, field names without units."""
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    try:
        header = next(reader)
    except StopIteration:
        raise NvidiaSmiError(f"{source}: empty output") from None
    columns = [_split_header(h) for h in header]
    rows = []
    for lineno, cells in enumerate(reader, start=2):
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) != len(columns):
            raise NvidiaSmiError(f"{source}:{lineno}: {len(cells)} values for {len(columns)} columns")
        rows.append({name: parse_value(cell, unit) for (name, unit), cell in zip(columns, cells)})
    return rows


def _float(row: Mapping[str, object], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, float) and 0 <= value < SENTINEL_THRESHOLD:
        return value
    return None


def _timestamp(value: object, tz: timezone) -> datetime | None:
    if not isinstance(value, str):
        return None
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=tz)
        except ValueError:
            continue
    return None


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant. None = not measured."""

    index: int
    uuid: str
    name: str
    timestamp: datetime | None
    utilization_gpu_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    power_draw_w: float | None
    mig_enabled: bool
    fields: Mapping[str, str | float | None] = field(default_factory=dict, repr=False)

    @classmethod
    def from_row(cls, row: Mapping[str, str | float | None], tz: timezone = timezone.utc) -> GpuReading:
        index = row.get("index")
        return cls(
            index=int(index) if isinstance(index, str) and index.isdigit() else -1,
            uuid=str(row.get("uuid") or ""),
            name=str(row.get("name") or ""),
            # nvidia-smi prints the host's local time without a zone: say which.
            timestamp=_timestamp(row.get("timestamp"), tz),
            utilization_gpu_pct=_float(row, "utilization.gpu"),
            memory_used_mib=_float(row, "memory.used"),
            memory_total_mib=_float(row, "memory.total"),
            power_draw_w=_float(row, "power.draw"),
            mig_enabled=str(row.get("mig.mode.current") or "").lower() == "enabled",
            fields=dict(row),
        )


def parse_readings(text: str, source: str = "<nvidia-smi>", tz: timezone = timezone.utc) -> list[GpuReading]:
    return [GpuReading.from_row(row, tz) for row in parse_query_gpu_csv(text, source)]


def query_gpus(runner: Callable[..., subprocess.CompletedProcess] = subprocess.run,
               timeout_s: float = 10.0) -> list[GpuReading]:
    """Run nvidia-smi once on this host (the runner is injectable for tests)."""
    proc = runner(
        ["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv"],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )
    if proc.returncode != 0:
        raise NvidiaSmiError(f"nvidia-smi exited {proc.returncode}: {proc.stderr.strip()[:200]}")
    return parse_readings(proc.stdout)


@dataclass
class Sampler:
    """Keeps readings and turns those of a window into GpuWindowStats per GPU.

    The window is (now - window_s, now], like the Prometheus collector's.
    """

    readings: dict[str, list[GpuReading]] = field(default_factory=lambda: defaultdict(list))

    def add(self, readings: Iterable[GpuReading]) -> None:
        for r in readings:
            if r.timestamp is not None:
                self.readings[r.uuid or str(r.index)].append(r)

    def prune(self, before: datetime) -> None:
        for key in list(self.readings):
            self.readings[key] = [r for r in self.readings[key] if r.timestamp >= before]

    def window_stats(self, window_s: int, now: datetime) -> list[GpuWindowStats]:
        start = now - timedelta(seconds=window_s)
        out = []
        for readings in self.readings.values():
            inside = [r for r in readings if start < r.timestamp <= now]
            if inside:
                out.append(window_stats(inside))
        return sorted(out, key=lambda s: (len(s.gpu), s.gpu))


def window_stats(readings: Sequence[GpuReading]) -> GpuWindowStats:
    """Aggregate one GPU's readings; only measured utilization counts as a sample."""
    first = readings[0]
    util = [r.utilization_gpu_pct for r in readings if r.utilization_gpu_pct is not None]
    mem = [r.memory_used_mib for r in readings if r.memory_used_mib is not None]
    power = [r.power_draw_w for r in readings if r.power_draw_w is not None]
    return GpuWindowStats(
        gpu=str(first.index),
        samples=len(util),
        activity_max=max(util) if util else None,
        activity_mean=sum(util) / len(util) if util else None,
        activity_min=min(util) if util else None,
        activity_signal=SIGNAL,
        fb_used_max_mib=max(mem) if mem else None,
        power_mean_w=sum(power) / len(power) if power else None,
        uuid=first.uuid,
        model_name=first.name,
    )


# --------------------------------------------------------------------------- HostSnapshot reader

# Per-GPU figures for a HostSnapshot; every one exists in every capture from driver 590 to 610.
SNAPSHOT_QUERY_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "driver_version", "mig.mode.current",
    "utilization.gpu", "memory.used", "memory.total", "power.draw", "temperature.gpu",
)
COMPUTE_APPS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")
SOURCE = "nvidia-smi"

Runner = Callable[[str, Sequence[str], float], str]


def run_nvidia_smi(binary: str, args: Sequence[str], timeout_s: float) -> str:
    """stdout of one `binary args...` run; GpuReadError(exit | timeout | not_found) otherwise.

    A hung nvidia-smi is killed with everything it started (gpufinops.procs.run_bounded).
    """
    try:
        returncode, stdout, stderr = run_bounded([binary, *args], timeout_s)
    except OSError as exc:  # not installed, not executable
        raise GpuReadError("not_found", f"cannot run {binary}: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise GpuReadError("timeout", f"{binary} {args[0] if args else ''} did not answer within "
                                      f"{timeout_s:g}s; killed") from None
    if returncode != 0:
        detail = (stderr.strip() or stdout.strip())[:200]
        raise GpuReadError("exit", f"{binary} exited {returncode}: {detail}")
    return stdout


def measured(value: object) -> float | None:
    """A number the driver measured, else None (missing, a word, a DCGM-style sentinel, negative)."""
    if isinstance(value, str):  # a column without a unit in its header, e.g. temperature.gpu
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < SENTINEL_THRESHOLD:
        return float(value)
    return None


def _whole(value: object) -> int | None:
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isdigit() else None


def parse_compute_apps(text: str, source: str = "<nvidia-smi --query-compute-apps>") -> dict[str, list[GpuProcess]]:
    """{GPU UUID: compute processes} from `--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory`."""
    out: dict[str, list[GpuProcess]] = {}
    for lineno, row in enumerate(parse_query_gpu_csv(text, source), start=2):
        pid = _whole(row.get("pid"))
        uuid = str(row.get("gpu_uuid") or "")
        if pid is None or not uuid:
            raise NvidiaSmiError(f"{source}:{lineno}: no pid or GPU UUID")
        out.setdefault(uuid, []).append(GpuProcess(pid=pid, name=str(row.get("process_name") or ""),
                                                   used_memory_mib=measured(row.get("used_gpu_memory"))))
    return out


@dataclass(frozen=True)
class QNode:
    """One `Key : value` line of `nvidia-smi -q` and the lines indented under it."""

    key: str
    value: str
    children: tuple[QNode, ...] = ()

    def child(self, key: str) -> QNode | None:
        return next((c for c in self.children if c.key == key), None)

    def get(self, *path: str) -> str | None:
        node: QNode | None = self
        for key in path:
            node = node.child(key) if node is not None else None
        return node.value if node is not None else None


_Q_LINE = re.compile(r"^(?P<indent> *)(?P<key>.*?)(?:\s+:\s?(?P<value>.*))?$")


def parse_q_tree(text: str) -> list[QNode]:
    """`nvidia-smi -q` text as a tree by indentation (top level: Timestamp, Driver Version, `GPU <bus id>`...)."""
    root: list = []
    stack: list[tuple[int, list]] = [(-1, root)]  # (indent, children list of the node at that indent)
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith("====="):
            continue
        m = _Q_LINE.match(line.rstrip())
        indent, key, value = len(m["indent"]), m["key"].strip(), (m["value"] or "").strip()
        while stack[-1][0] >= indent:
            stack.pop()
        children: list = []
        stack[-1][1].append((key, value, children))
        stack.append((indent, children))

    def build(items) -> tuple[QNode, ...]:
        return tuple(QNode(k, v, build(c)) for k, v, c in items)

    return list(build(root))


@dataclass(frozen=True)
class QMigDevice:
    index: int  # the "MIG Dev" index, as `-L` lists it
    gpu_instance_id: int
    compute_instance_id: int
    memory_used_mib: float | None
    memory_total_mib: float | None


@dataclass(frozen=True)
class QGpu:
    """What the agent takes from one `GPU <bus id>` block of `nvidia-smi -q`."""

    uuid: str
    mig_enabled: bool
    mig_devices: tuple[QMigDevice, ...]
    # pid -> (GPU instance id, compute instance id, process type) of every process listed (C, G, C+G)
    process_slots: dict[int, tuple[int | None, int | None, str]]


def _mib(text: str | None) -> float | None:
    if text is None:
        return None
    value = text.strip()
    return measured(value[:-4]) if value.endswith(" MiB") else None


def q_gpus(text: str, source: str = "<nvidia-smi -q>") -> list[QGpu]:
    out = []
    for node in parse_q_tree(text):
        if not (node.key.startswith("GPU ") and node.children):
            continue
        uuid = node.get("GPU UUID") or ""
        if not uuid:
            raise NvidiaSmiError(f"{source}: block {node.key!r} has no GPU UUID")
        devices = []
        for dev in (c for c in node.children if c.key == "MIG Device"):
            index, gi, ci = (_whole(dev.get(k)) for k in ("Index", "GPU Instance ID", "Compute Instance ID"))
            if index is None or gi is None or ci is None:
                raise NvidiaSmiError(f"{source}: a MIG Device of {uuid} lacks Index / GPU or Compute Instance ID")
            devices.append(QMigDevice(index, gi, ci, _mib(dev.get("Shared FB Memory Usage", "Used")),
                                      _mib(dev.get("Shared FB Memory Usage", "Total"))))
        slots: dict[int, tuple[int | None, int | None, str]] = {}
        gi = ci = None
        for item in (node.child("Processes") or QNode("", "")).children:
            if item.key == "GPU instance ID":
                gi = _whole(item.value)
            elif item.key == "Compute instance ID":
                ci = _whole(item.value)
            elif item.key == "Process ID" and _whole(item.value) is not None:
                slots[int(item.value)] = (gi, ci, item.get("Type") or "")
        out.append(QGpu(uuid, (node.get("MIG Mode", "Current") or "").lower() == "enabled", tuple(devices), slots))
    return out


_L_GPU = re.compile(r"^GPU (?P<index>\d+): .* \(UUID: (?P<uuid>GPU-[^)]+)\)\s*$")
_L_MIG = re.compile(r"^\s+MIG (?P<profile>\S+)\s+Device\s+(?P<index>\d+): \(UUID: (?P<uuid>MIG-[^)]+)\)\s*$")
# A MIG device of a GI split into several compute instances is named "<n>c.<GI profile>" (e.g. 1c.3g.40gb);
# dcgm-exporter's GPU_I_PROFILE is the GI's profile.
_CI_PREFIX = re.compile(r"^\d+c\.(?=\d+g\.)")


def gi_profile(mig_profile: str) -> str:
    """'1c.3g.40gb' -> '3g.40gb'; '3g.40gb' unchanged."""
    return _CI_PREFIX.sub("", mig_profile.strip())


def parse_list(text: str) -> dict[str, dict[int, tuple[str, str]]]:
    """`nvidia-smi -L` as {GPU UUID: {MIG device index: (GI profile, MIG UUID)}}."""
    out: dict[str, dict[int, tuple[str, str]]] = {}
    current: dict[int, tuple[str, str]] | None = None
    for line in text.splitlines():
        if m := _L_GPU.match(line):
            current = out.setdefault(m["uuid"], {})
        elif (m := _L_MIG.match(line)) and current is not None:
            current[int(m["index"])] = (gi_profile(m["profile"]), m["uuid"])
    return out


def mig_instances(q: QGpu, listing: dict[int, tuple[str, str]],
                  processes: tuple[GpuProcess, ...] | None) -> tuple[MigInstance, ...]:
    """One MigInstance per GPU instance: its compute instances share one memory pool, counted once."""
    by_gi: dict[int, list[QMigDevice]] = {}
    for dev in q.mig_devices:
        by_gi.setdefault(dev.gpu_instance_id, []).append(dev)
    out = []
    for gi, devices in sorted(by_gi.items()):
        first = min(devices, key=lambda d: (d.compute_instance_id, d.index))
        profile, uuid = listing.get(first.index, ("", ""))
        out.append(MigInstance(
            gpu_instance_id=gi, profile=profile, uuid=uuid,
            compute_instance_ids=tuple(sorted({d.compute_instance_id for d in devices})),
            memory_used_mib=first.memory_used_mib, memory_total_mib=first.memory_total_mib,
            processes=None if processes is None else tuple(p for p in processes if p.gpu_instance_id == gi),
        ))
    return tuple(out)


def _gpu_processes(apps: dict[str, list[GpuProcess]] | None, uuid: str,
                   q: QGpu | None) -> tuple[GpuProcess, ...] | None:
    """The GPU's compute processes sorted by pid, with their GI/CI from `-q` under MIG; None = not read."""
    if apps is None:
        return None
    procs = []
    for p in apps.get(uuid, []):
        gi, ci, _type = q.process_slots.get(p.pid, (None, None, "")) if q is not None else (None, None, "")
        procs.append(GpuProcess(p.pid, p.name, p.used_memory_mib, gi, ci))
    return tuple(sorted(procs, key=lambda p: p.pid))


def snapshot_from_outputs(query_csv: str, compute_apps: str | None, q_text: str | None, list_text: str | None,
                          now: datetime, source: str = "nvidia-smi",
                          problems: Sequence[str] = ()) -> HostSnapshot:
    """Pure: one HostSnapshot from the texts of one sample (compute_apps None = processes not read;
    q_text/list_text are needed only when a GPU has MIG enabled). NvidiaSmiError when a text is not what was asked."""
    problems = list(problems)
    rows = parse_query_gpu_csv(query_csv, source)
    if not rows:
        raise NvidiaSmiError(f"{source}: no GPU rows")
    missing = [f for f in SNAPSHOT_QUERY_FIELDS if f not in rows[0]]
    if missing:
        raise NvidiaSmiError(f"{source}: the CSV has no column {', '.join(missing)}")
    apps = parse_compute_apps(compute_apps, source) if compute_apps is not None else None
    qs = {g.uuid: g for g in q_gpus(q_text, source)} if q_text is not None else {}
    listing = parse_list(list_text) if list_text is not None else {}
    gpus = []
    for row in rows:
        index, uuid = _whole(row.get("index")), str(row.get("uuid") or "")
        if index is None or not uuid.startswith("GPU-"):
            problems.append(f"a row without a GPU index or UUID was left out: index={row.get('index')!r}")
            continue
        mig = str(row.get("mig.mode.current") or "").lower() == "enabled"
        q = qs.get(uuid)
        if mig and q is None:
            raise NvidiaSmiError(f"{source}: MIG GPU {uuid} is not in the `-q` output")
        processes = _gpu_processes(apps, uuid, q if mig else None)
        gpus.append(GpuSnapshot(
            index=index, uuid=uuid, name=str(row.get("name") or ""), pci_bus_id=str(row.get("pci.bus_id") or ""),
            driver_version=str(row.get("driver_version") or ""), mig_enabled=mig,
            utilization_pct=measured(row.get("utilization.gpu")),
            memory_used_mib=measured(row.get("memory.used")), memory_total_mib=measured(row.get("memory.total")),
            power_w=measured(row.get("power.draw")), temperature_c=measured(row.get("temperature.gpu")),
            processes=processes,
            mig_instances=mig_instances(q, listing.get(uuid, {}), processes) if mig else (),
        ))
    return HostSnapshot(taken_at=now, source=SOURCE, gpus=tuple(sorted(gpus, key=lambda g: g.index)),
                        problems=tuple(problems))


def read_snapshot(binary: str = "nvidia-smi", timeout_s: float = 5.0, *, runner: Runner = run_nvidia_smi,
                  now: datetime | None = None) -> HostSnapshot:
    """Read this host's GPUs with nvidia-smi: 2 runs, 4 when a GPU has MIG enabled.

    GpuReadError when the GPUs cannot be read (exit, timeout, not_found, unparseable); processes that cannot
    be read leave `processes` None and say so in `problems` (the figures are still good).
    """
    taken_at = now or datetime.now(timezone.utc)
    query_csv = runner(binary, [f"--query-gpu={','.join(SNAPSHOT_QUERY_FIELDS)}", "--format=csv"], timeout_s)
    problems = []
    try:
        apps: str | None = runner(binary, [f"--query-compute-apps={','.join(COMPUTE_APPS_FIELDS)}",
                                           "--format=csv"], timeout_s)
    except GpuReadError as exc:
        apps = None
        problems.append(f"processes not read: {exc}")
    q_text = list_text = None
    try:
        if any(str(r.get("mig.mode.current")).lower() == "enabled" for r in parse_query_gpu_csv(query_csv, binary)):
            q_text = runner(binary, ["-q"], timeout_s)
            list_text = runner(binary, ["-L"], timeout_s)
        return snapshot_from_outputs(query_csv, apps, q_text, list_text, taken_at, binary, problems)
    except NvidiaSmiError as exc:
        raise GpuReadError("unparseable", str(exc)) from None


class NvidiaSmiReader:
    """The agent's reader when NVML is not used: `read()` = read_snapshot with this binary and timeout."""

    source = SOURCE

    def __init__(self, binary: str = "nvidia-smi", timeout_s: float = 5.0, runner: Runner = run_nvidia_smi):
        self.binary = binary
        self.timeout_s = timeout_s
        self.runner = runner

    def read(self, now: datetime | None = None) -> HostSnapshot:
        return read_snapshot(self.binary, self.timeout_s, runner=self.runner, now=now)

    def close(self) -> None:
        pass
