"""nvidia-smi parsing (--query-gpu CSV and windowing, -q, -L, --query-compute-apps) and the HostSnapshot
reader, on real captures replayed by tests/fake_nvidia_smi.py."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.collect.gpu_snapshot import GpuReadError
from gpufinops.collect.nvidia_smi import (
    NvidiaSmiError,
    Sampler,
    gi_profile,
    parse_compute_apps,
    parse_list,
    parse_query_gpu_csv,
    parse_readings,
    parse_value,
    q_gpus,
    query_gpus,
    read_snapshot,
    run_nvidia_smi,
    snapshot_from_outputs,
    window_stats,
)
from tests.fake_nvidia_smi import install, parse_capture

DATA = Path(__file__).parents[1] / "data" / "nvidia_smi"
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


# --------------------------------------------------------------------------- HostSnapshot reader: -q, -L, processes
RAW = DATA / "captures_raw"
MIG_RAW = RAW / f"{MIG}.txt"
H100_RAW = RAW / f"{H100}.txt"


def section(capture: Path, phase: str, args: str) -> str:
    sections = parse_capture(capture)
    return next(body for (p, a), body in sections.items() if p == phase and (a == args or a.startswith(args + "=")))


def test_q_text_gives_the_mig_layout_and_which_gi_each_process_runs_in():
    gpu, = q_gpus(section(MIG_RAW, "load", "-q"))
    assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000" and gpu.mig_enabled
    assert [(d.index, d.gpu_instance_id, d.compute_instance_id, d.memory_used_mib, d.memory_total_mib)
            for d in gpu.mig_devices] == [(0, 2, 0, 11091.0, 40448.0), (1, 3, 0, 17.0, 20096.0),
                                          (2, 9, 0, 9.0, 9984.0), (3, 10, 0, 9.0, 9984.0)]
    assert gpu.process_slots == {21180: (2, 0, "C"), 21181: (2, 0, "C"), 21198: (2, 0, "C")}
    plain, = q_gpus(section(H100_RAW, "idle", "-q"))  # "Processes : None"
    assert not plain.mig_enabled and plain.mig_devices == () and plain.process_slots == {}
    loaded, = q_gpus(section(H100_RAW, "load", "-q"))  # not MIG: "GPU instance ID : N/A"
    assert {pid: slot[:2] for pid, slot in loaded.process_slots.items()} == {
        11327: (None, None), 11328: (None, None), 11345: (None, None)}


def test_list_gives_profiles_and_mig_uuids_per_device():
    listing = parse_list(section(MIG_RAW, "capabilities", "-L"))
    assert listing == {"GPU-00000000-0000-0000-0000-000000000000": {
        0: ("3g.40gb", "MIG-00000000-0000-0000-0000-000000000000"),
        1: ("2g.20gb", "MIG-00000001-0000-0000-0000-000000000001"),
        2: ("1g.10gb", "MIG-00000002-0000-0000-0000-000000000002"),
        3: ("1g.10gb", "MIG-00000003-0000-0000-0000-000000000003")}}
    assert (gi_profile("1c.3g.40gb"), gi_profile("3g.40gb"), gi_profile("1g.10gb+me")) == (
        "3g.40gb", "3g.40gb", "1g.10gb+me")


def test_compute_apps_with_unmeasured_memory():
    apps = parse_compute_apps("gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
                              "GPU-1, 12, C:\\Windows\\explorer.exe, [N/A]\nGPU-1, 13, ./train, 2296 MiB\n")
    assert [(p.pid, p.name, p.used_memory_mib) for p in apps["GPU-1"]] == [
        (12, "C:\\Windows\\explorer.exe", None), (13, "./train", 2296.0)]
    with pytest.raises(NvidiaSmiError, match=":2: no pid"):
        parse_compute_apps("gpu_uuid, pid, process_name, used_gpu_memory [MiB]\nGPU-1, x, a, 1 MiB\n", "apps")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CAPTURE", str(MIG_RAW))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_PHASE", "load")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_LOG", str(tmp_path / "log"))
    return install(tmp_path)


def test_fake_projects_the_asked_columns_with_nvidia_smis_units(fake):
    out = run_nvidia_smi(str(fake), ["--query-gpu=memory.used,utilization.gpu,temperature.gpu,name",
                                     "--format=csv"], 20)
    assert out == ("memory.used [MiB], utilization.gpu [%], temperature.gpu, name\n"
                   "11125 MiB, [N/A], 53, NVIDIA H100 80GB HBM3\n")
    out = run_nvidia_smi(str(fake), ["--query-gpu=memory.used,power.draw", "--format=csv,noheader,nounits"], 20)
    assert out == "11125, 433.78\n"
    with pytest.raises(GpuReadError, match='exited 2: Field "gpu_util" is not a valid field to query') as err:
        run_nvidia_smi(str(fake), ["--query-gpu=gpu_util", "--format=csv"], 20)
    assert err.value.reason == "exit"
    assert run_nvidia_smi(str(fake), ["-L"], 20).startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0000")
    with pytest.raises(GpuReadError, match="no section .* for: -q -x"):
        run_nvidia_smi(str(fake), ["-q", "-x"], 20)


def test_mig_host_read_takes_four_nvidia_smi_runs_and_a_plain_host_two(fake, tmp_path, monkeypatch):
    snap = read_snapshot(str(fake), 20)
    assert snap.source == "nvidia-smi" and snap.taken_at.tzinfo is not None
    assert [m.gpu_instance_id for m in snap.gpus[0].mig_instances] == [2, 3, 9, 10]
    calls = [line.split("\t")[1].split("=")[0] for line in (tmp_path / "log").read_text().splitlines()]
    assert calls == ["--query-gpu", "--query-compute-apps", "-q", "-L"]
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CAPTURE", str(H100_RAW))
    (tmp_path / "log").unlink()
    assert read_snapshot(str(fake), 20).gpus[0].mig_instances == ()
    assert len((tmp_path / "log").read_text().splitlines()) == 2


@pytest.mark.parametrize("script, reason", [
    (["fail"], "exit"), (["garbage"], "unparseable"),
    (["load", "load", "fail"], "exit"),  # -q fails: the MIG layout is unknown, so the whole read fails
    (["load", "load", "garbage"], "unparseable"),  # -q printed something else: MIG GPU not in it
])
def test_read_failures_are_typed(fake, tmp_path, monkeypatch, script, reason):
    (tmp_path / "script").write_text("\n".join(script) + "\n")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_SCRIPT", str(tmp_path / "script"))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_ADVANCE", "every")
    with pytest.raises(GpuReadError) as err:
        read_snapshot(str(fake), 20)
    assert err.value.reason == reason


def test_fake_script_advances_once_per_sample(fake, tmp_path, monkeypatch):
    """One script line = one sample of the reader (it advances on --query-gpu), `*N` repeats, the last line sticks."""
    (tmp_path / "script").write_text("# idle, then load twice\nidle\nload*2\n")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_SCRIPT", str(tmp_path / "script"))
    got = [len(read_snapshot(str(fake), 20).gpus[0].processes) for _ in range(4)]
    assert got == [0, 3, 3, 3]
    assert (tmp_path / "script.count").read_text() == "4"


def test_missing_binary_is_not_found_and_hang_is_timeout(tmp_path, fake, monkeypatch):
    with pytest.raises(GpuReadError) as err:
        read_snapshot(str(tmp_path / "nope"), 5)
    assert err.value.reason == "not_found"
    monkeypatch.setenv("FAKE_NVIDIA_SMI_PHASE", "hang")
    with pytest.raises(GpuReadError, match="did not answer within 1s") as err:
        read_snapshot(str(fake), 1)
    assert err.value.reason == "timeout"


def test_fake_runs_under_the_test_python(tmp_path):
    wrapper = install(tmp_path).read_text()
    assert wrapper.startswith("#!/bin/sh\nexec ") and sys.executable in wrapper


def test_a_host_with_a_mig_gpu_and_a_plain_gpu():
    """Two captured GPUs made one host (the plain H100 renumbered to GPU 1): each keeps its own processes,
    only the MIG one has GPU instances."""
    def body(capture, prefix):
        return section(capture, "load", prefix)

    other = "GPU-11111111-1111-1111-1111-111111111111"
    mig_csv = body(MIG_RAW, "--query-gpu").splitlines()
    plain_csv = body(H100_RAW, "--query-gpu").splitlines()
    cols = [c.strip() for c in mig_csv[0].split(",")]
    plain_row = [c.strip() for c in plain_csv[1].split(", ")]
    plain_row[cols.index("index")] = "1"
    plain_row[cols.index("uuid")] = other
    query = "\n".join([mig_csv[0], mig_csv[1], ", ".join(plain_row)]) + "\n"
    apps = body(MIG_RAW, "--query-compute-apps") + "".join(
        line.replace("GPU-00000000-0000-0000-0000-000000000000", other) + "\n"
        for line in body(H100_RAW, "--query-compute-apps").splitlines()[1:])
    snap = snapshot_from_outputs(query, apps, section(MIG_RAW, "load", "-q"),
                                 section(MIG_RAW, "capabilities", "-L"), datetime.now(timezone.utc))
    mig, plain = snap.gpus
    assert (mig.index, mig.mig_enabled, len(mig.mig_instances)) == (0, True, 4)
    assert (plain.index, plain.uuid, plain.mig_enabled, plain.mig_instances) == (1, other, False, ())
    assert [p.pid for p in mig.processes] == [21180, 21181, 21198]
    assert [(p.pid, p.gpu_instance_id) for p in plain.processes] == [(11327, None), (11328, None), (11345, None)]
    assert plain.utilization_pct == 100.0 and mig.utilization_pct is None
