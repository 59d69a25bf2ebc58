"""nvidia-smi --query-gpu CSV parsing and windowing, on real captures."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.collect.nvidia_smi import (
    NvidiaSmiError, Sampler, parse_query_gpu_csv, parse_readings, parse_value, query_gpus, window_stats,
)

DATA = Path(__file__).parent / "data" / "nvidia_smi"
H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01"
MIG = "linux-x86_64__nvidia-h100-mig__590.48.01"


def readings(name: str):
    path = DATA / f"{name}.csv"
    return parse_readings(path.read_text(), str(path))


@pytest.mark.parametrize("raw, unit, expected", [
    ("100 %", "%", 100.0),
    ("81559 MiB", "MiB", 81559.0),
    ("631.95 W", "W", 631.95),
    ("[N/A]", "%", None),
    ("[Not Supported]", "W", None),
    ("[Requested functionality has been deprecated]", None, None),
    ("N/A", None, None),
    ("", "MiB", None),
    ("Enabled", None, "Enabled"),
])
def test_cells(raw, unit, expected):
    assert parse_value(raw, unit) == expected


def test_h100_idle_and_load_rows():
    idle, = readings(f"{H100}__idle")
    load, = readings(f"{H100}__load")
    assert idle.name == "NVIDIA H100 80GB HBM3" and idle.index == 0 and not idle.mig_enabled
    assert (idle.utilization_gpu_pct, idle.memory_used_mib, idle.power_draw_w) == (0.0, 0.0, 69.85)
    assert (load.utilization_gpu_pct, load.memory_used_mib, load.power_draw_w) == (100.0, 19818.0, 631.95)
    assert load.memory_total_mib == 81559.0
    assert load.timestamp == datetime(2026, 7, 14, 8, 12, 53, 353000, tzinfo=timezone.utc)


def test_every_capture_column_keeps_its_name_without_unit():
    row, = parse_query_gpu_csv((DATA / f"{H100}__load.csv").read_text())
    assert len(row) == 212 and "utilization.gpu" in row and "utilization.gpu [%]" not in row
    # Columns without a unit stay text; "[N/A]" columns are None.
    assert row["ecc.errors.corrected.volatile.total"] == "0" and row["pstate"].startswith("P")
    assert row["fan.speed"] is None and row["clocks.current.sm"] > 0


def test_mig_capture_has_no_utilization_so_no_samples():
    idle, = readings(f"{MIG}__idle")
    load, = readings(f"{MIG}__load")
    assert idle.mig_enabled and load.mig_enabled
    assert idle.utilization_gpu_pct is None and load.utilization_gpu_pct is None
    stats = window_stats([idle, load])
    # Memory and power are measured; activity is not: no data, never 0 %.
    assert stats.samples == 0 and stats.activity_mean is None and stats.activity_max is None
    assert stats.fb_used_max_mib == 11125.0
    assert stats.power_mean_w == pytest.approx((71.15 + 433.78) / 2)


def test_sampler_window_over_idle_then_load():
    sampler = Sampler()
    sampler.add(readings(f"{H100}__idle"))
    sampler.add(readings(f"{H100}__load"))
    load_time = datetime(2026, 7, 14, 8, 12, 53, 353000, tzinfo=timezone.utc)
    both, = sampler.window_stats(60, load_time)
    assert (both.samples, both.activity_min, both.activity_max, both.activity_mean) == (2, 0.0, 100.0, 50.0)
    assert both.model_name == "NVIDIA H100 80GB HBM3" and both.fb_used_max_mib == 19818.0
    only_load, = sampler.window_stats(10, load_time)  # the idle row is 14.7 s older
    assert only_load.samples == 1 and only_load.activity_mean == 100.0
    assert sampler.window_stats(10, load_time + timedelta(minutes=5)) == []


def test_sampler_prune_drops_old_readings():
    sampler = Sampler()
    sampler.add(readings(f"{H100}__idle") + readings(f"{H100}__load"))
    sampler.prune(datetime(2026, 7, 14, 8, 12, 50, tzinfo=timezone.utc))
    assert sum(len(v) for v in sampler.readings.values()) == 1


def test_ragged_row_names_the_line():
    text = (DATA / f"{H100}__idle.csv").read_text() + "1, 2, 3\n"
    with pytest.raises(NvidiaSmiError, match=r"x\.csv:3: 3 values for 212 columns"):
        parse_query_gpu_csv(text, "x.csv")


def test_query_gpus_runs_nvidia_smi_with_the_fields():
    seen = {}

    def runner(cmd, **kwargs):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 0, stdout=(DATA / f"{MIG}__load.csv").read_text(), stderr="")

    gpu, = query_gpus(runner)
    assert seen["cmd"][0] == "nvidia-smi" and seen["cmd"][-1] == "--format=csv"
    assert "utilization.gpu" in seen["cmd"][1] and gpu.mig_enabled


def test_query_gpus_failure_is_an_error():
    def runner(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 9, stdout="", stderr="NVIDIA-SMI has failed")

    with pytest.raises(NvidiaSmiError, match="exited 9"):
        query_gpus(runner)
