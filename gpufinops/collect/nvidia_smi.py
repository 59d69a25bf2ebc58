"""GPU readings from `nvidia-smi --query-gpu=... --format=csv`, for hosts
without dcgm-exporter/Prometheus (an agent samples locally).

nvidia-smi prints units in the header (`memory.used [MiB]`) and in each value
(`81559 MiB`, `100 %`), and bracketed words when a field has no value:
`[N/A]`, `[Not Supported]`, `[Requested functionality has been deprecated]`.
Those are "not measured" (None), never zero: a MIG-enabled GPU reports
utilization.gpu as `[N/A]` and so has no activity samples here.
"""

from __future__ import annotations

import csv
import io
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable, Mapping, Sequence

from gpufinops.model import SENTINEL_THRESHOLD, GpuWindowStats

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
    def from_row(cls, row: Mapping[str, str | float | None], tz: timezone = timezone.utc) -> "GpuReading":
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
