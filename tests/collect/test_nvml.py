"""The NVML reader and the nvidia-smi reader give the same HostSnapshot for every real capture.

nvidia-smi is tests/fake_nvidia_smi.py on PATH replaying a capture; NVML is tests/fake_nvml.py, a pynvml
stand-in that answers NVML calls from the same capture with its own parsers and raises the real pynvml errors.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pynvml
import pytest

from gpufinops.agent.exporter import open_reader
from gpufinops.collect import nvidia_smi, nvml
from gpufinops.collect.gpu_snapshot import GpuReadError, HostSnapshot, MigInstance
from gpufinops.collect.nvidia_smi import NvidiaSmiReader, snapshot_from_outputs
from gpufinops.collect.nvml import NvmlReader
from tests.fake_nvidia_smi import install, parse_capture
from tests.fake_nvml import FakeNvml, MigDevice

LOCAL = Path(__file__).parents[1] / "data" / "nvidia_smi" / "captures_raw"
SHARED = Path(__file__).parents[1] / ".." / ".." / "shared" / "data" / "nvidia_smi" / "captures_raw"
MIG = LOCAL / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
H100 = LOCAL / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
CAPTURES = sorted(SHARED.glob("*.txt")) or sorted(LOCAL.glob("*.txt"))
NOW = datetime(2026, 7, 14, 9, 0, tzinfo=timezone.utc)


@pytest.fixture
def smi_on_path(tmp_path, monkeypatch):
    """`nvidia-smi` on PATH is the fake; returns a function that points it at a capture and phase."""
    install(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}:{Path('/usr/bin')}:{Path('/bin')}")

    def use(capture: Path, phase: str) -> None:
        monkeypatch.setenv("FAKE_NVIDIA_SMI_CAPTURE", str(capture))
        monkeypatch.setenv("FAKE_NVIDIA_SMI_PHASE", phase)

    return use


def read_both(capture: Path, phase: str, use) -> tuple[HostSnapshot, HostSnapshot]:
    use(capture, phase)
    by_smi = NvidiaSmiReader("nvidia-smi", timeout_s=20).read(NOW)
    by_nvml = NvmlReader(FakeNvml(capture, phase), timeout_s=20).open().read(NOW)
    return by_smi, by_nvml


@pytest.mark.parametrize("phase", ["idle", "load"])
@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.stem)
def test_both_readers_give_the_same_snapshot(capture, phase, smi_on_path):
    by_smi, by_nvml = read_both(capture, phase, smi_on_path)
    assert (by_smi.source, by_nvml.source) == ("nvidia-smi", "nvml")
    assert by_smi.gpus == by_nvml.gpus and len(by_smi.gpus) == 1
    assert by_smi.problems == by_nvml.problems == ()
    gpu, = by_smi.gpus
    check_against_capture(gpu, capture, phase)


def _cell_number(cell: str) -> float | None:
    """What a CSV cell says as a number, None for [N/A]-like words (the test's own reading)."""
    cell = cell.strip()
    if cell.startswith("["):
        return None
    return float(cell.split()[0])


def check_against_capture(gpu, capture: Path, phase: str) -> None:
    """Every figure is what the capture printed; every [N/A] is None; every number is a plausible measurement."""
    sections = parse_capture(capture)
    body = next(b for (p, a), b in sections.items() if p == phase and a.startswith("--query-gpu="))
    header, row = [line.split(", ") for line in body.strip().splitlines()[:2]]
    cells = {h.split(" [")[0]: c for h, c in zip(header, row)}
    for column, value in (("utilization.gpu", gpu.utilization_pct), ("memory.total", gpu.memory_total_mib),
                          ("power.draw", gpu.power_w), ("temperature.gpu", gpu.temperature_c),
                          ("memory.used", gpu.memory_used_mib)):
        assert value == _cell_number(cells[column]), column
    assert gpu.mig_enabled == (cells["mig.mode.current"] == "Enabled")
    assert (gpu.uuid, gpu.name, gpu.pci_bus_id, gpu.driver_version) == (
        cells["uuid"], cells["name"], cells["pci.bus_id"], cells["driver_version"])
    apps = next(b for (p, a), b in sections.items() if p == phase and a.startswith("--query-compute-apps="))
    app_rows = [line.split(", ") for line in apps.strip().splitlines()[1:]]
    assert sorted(p.pid for p in gpu.processes) == sorted(int(r[5]) for r in app_rows)
    memory = {int(r[5]): _cell_number(r[-1]) for r in app_rows}
    assert all(p.used_memory_mib == memory[p.pid] for p in gpu.processes)
    for value in _numbers(gpu):
        assert math.isfinite(value) and 0 <= value < 1e9, value


def _numbers(obj) -> list[float]:
    """Every number anywhere in a snapshot (dataclasses, tuples), to scan for sentinels and negatives."""
    if dataclasses.is_dataclass(obj):
        return [n for f in dataclasses.fields(obj) for n in _numbers(getattr(obj, f.name))]
    if isinstance(obj, tuple):
        return [n for item in obj for n in _numbers(item)]
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return [float(obj)]
    return []


def test_windows_process_memory_is_none_not_zero(smi_on_path):
    capture = next((c for c in CAPTURES if c.name.startswith("windows")), None)
    if capture is None:
        pytest.skip("no Windows capture here")
    by_smi, by_nvml = read_both(capture, "load", smi_on_path)
    for snap in (by_smi, by_nvml):
        procs = snap.gpus[0].processes
        assert len(procs) >= 10 and all(p.used_memory_mib is None for p in procs)  # WDDM: [N/A]


@pytest.mark.parametrize("phase, used", [("idle", {2: 26.0, 3: 17.0, 9: 9.0, 10: 9.0}),
                                         ("load", {2: 11091.0, 3: 17.0, 9: 9.0, 10: 9.0})])
def test_h100_mig_instances(phase, used, smi_on_path):
    for snap in read_both(MIG, phase, smi_on_path):
        gpu, = snap.gpus
        assert gpu.mig_enabled and gpu.utilization_pct is None  # [N/A] on a MIG GPU: not measured, not 0
        assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000"
        assert {m.gpu_instance_id: m.memory_used_mib for m in gpu.mig_instances} == used
        assert [(m.gpu_instance_id, m.profile, m.uuid, m.compute_instance_ids, m.memory_total_mib)
                for m in gpu.mig_instances] == [
            (2, "3g.40gb", "MIG-00000000-0000-0000-0000-000000000000", (0,), 40448.0),
            (3, "2g.20gb", "MIG-00000001-0000-0000-0000-000000000001", (0,), 20096.0),
            (9, "1g.10gb", "MIG-00000002-0000-0000-0000-000000000002", (0,), 9984.0),
            (10, "1g.10gb", "MIG-00000003-0000-0000-0000-000000000003", (0,), 9984.0),
        ]
        assert all(m.activity_pct is None for m in gpu.mig_instances)
        counts = {m.gpu_instance_id: len(m.processes) for m in gpu.mig_instances}
        if phase == "load":
            assert counts == {2: 3, 3: 0, 9: 0, 10: 0}
            gi2 = gpu.mig_instances[0]
            assert [(p.pid, p.name, p.used_memory_mib, p.gpu_instance_id, p.compute_instance_id)
                    for p in gi2.processes] == [(21180, "/root/tools/memhog", 2296.0, 2, 0),
                                                (21181, "/root/tools/memhog", 1272.0, 2, 0),
                                                (21198, "./gpu_burn", 7484.0, 2, 0)]
            assert gpu.processes == gi2.processes and gpu.memory_used_mib == 11125.0
        else:
            assert counts == {2: 0, 3: 0, 9: 0, 10: 0} and gpu.processes == ()


def _two_compute_instances_in_gi2() -> tuple[str, str]:
    """The MIG load capture's -q and -L with GI 2 split into compute instances 0 and 1 (device 4 added)."""
    sections = parse_capture(MIG)
    q = sections[("load", "-q")]
    start = q.index("    MIG Device\n")
    end = q.index("    MIG Device\n", start + 1)
    block = q[start:end].replace("Index                                          : 0",
                                 "Index                                          : 4")
    block = block.replace("Compute Instance ID                            : 0",
                          "Compute Instance ID                            : 1")
    listing = sections[("capabilities", "-L")].replace(
        "  MIG 3g.40gb     Device  0:", "  MIG 1c.3g.40gb  Device  0:") + \
        "  MIG 1c.3g.40gb  Device  4: (UUID: MIG-00000004-0000-0000-0000-000000000004)\n"
    return q[:end] + block + q[end:], listing


def test_a_gi_with_two_compute_instances_counts_its_memory_once():
    q, listing = _two_compute_instances_in_gi2()
    sections = parse_capture(MIG)
    query = next(b for (p, a), b in sections.items() if p == "load" and a.startswith("--query-gpu="))
    apps = next(b for (p, a), b in sections.items() if p == "load" and a.startswith("--query-compute-apps="))
    by_smi = snapshot_from_outputs(query, apps, q, listing, NOW)
    fake = FakeNvml(MIG, "load")
    gpu = fake.gpus[0]
    gpu.mig.append(MigDevice(4, 2, 1, 11091, 40448, "1c.3g.40gb", "MIG-00000004-0000-0000-0000-000000000004"))
    gpu.mig[0].profile = "1c.3g.40gb"
    by_nvml = nvml.read_snapshot(_initialised(fake), NOW)
    assert by_smi.gpus == by_nvml.gpus
    gi2 = by_smi.gpus[0].mig_instances[0]
    assert gi2 == MigInstance(gpu_instance_id=2, profile="3g.40gb", uuid="MIG-00000000-0000-0000-0000-000000000000",
                              compute_instance_ids=(0, 1), memory_used_mib=11091.0, memory_total_mib=40448.0,
                              processes=gi2.processes)
    assert len(gi2.processes) == 3 and len(by_smi.gpus[0].mig_instances) == 4


def _initialised(fake: FakeNvml) -> FakeNvml:
    fake.nvmlInit()
    return fake


# --------------------------------------------------------------------------- NVML failures


def test_nvml_that_does_not_initialise_is_a_typed_error_and_auto_falls_back_to_nvidia_smi():
    fake = FakeNvml(H100, "load", fail={"nvmlInit": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND})
    with pytest.raises(GpuReadError) as err:
        NvmlReader(fake).open()
    assert err.value.reason == "nvml" and "NVML Shared Library Not Found" in str(err.value)
    reader = open_reader("auto", nvidia_smi="/opt/nvidia-smi", timeout_s=3, nvml=fake)
    assert isinstance(reader, NvidiaSmiReader) and reader.binary == "/opt/nvidia-smi"
    with pytest.raises(GpuReadError):
        open_reader("nvml", nvml=fake)
    assert isinstance(open_reader("nvml", nvml=FakeNvml(H100, "load")), NvmlReader)
    assert isinstance(open_reader("nvidia-smi", nvml=FakeNvml(H100, "load")), NvidiaSmiReader)
    with pytest.raises(ValueError, match="--reader"):
        open_reader("dcgm")


def test_real_pynvml_without_a_driver_is_a_typed_error():
    try:
        reader = NvmlReader().open()
    except GpuReadError as exc:
        assert exc.reason == "nvml"
        return
    try:  # a host with an NVIDIA driver: the real library must give a sane snapshot
        snap = reader.read()
        assert snap.gpus and all(g.uuid.startswith("GPU-") for g in snap.gpus)
        for value in _numbers(snap):
            assert 0 <= value < 1e9
    finally:
        reader.close()


def test_a_lost_gpu_fails_the_whole_read():
    fake = FakeNvml(H100, "load", fail={"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_GPU_IS_LOST})
    with pytest.raises(GpuReadError) as err:
        NvmlReader(fake).open().read(NOW)
    assert err.value.reason == "nvml" and "power" in str(err.value) and "GPU is lost" in str(err.value)


@pytest.mark.parametrize("capture", [H100, MIG], ids=["h100", "mig"])
def test_refused_processes_leave_processes_unknown_but_figures_kept(capture):
    fake = FakeNvml(capture, "load", fail={"nvmlDeviceGetComputeRunningProcesses": pynvml.NVML_ERROR_NO_PERMISSION})
    snap = NvmlReader(fake).open().read(NOW)
    gpu, = snap.gpus
    assert gpu.processes is None and all(m.processes is None for m in gpu.mig_instances)
    assert gpu.power_w is not None and snap.problems and "Insufficient Permissions" in snap.problems[0]


def test_a_driver_older_than_the_bindings_reads_processes_with_the_v2_call():
    mismatch = pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")
    fake = FakeNvml(MIG, "load", fail={"nvmlDeviceGetComputeRunningProcesses": mismatch})
    by_old_driver = NvmlReader(fake).open().read(NOW)
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in fake.calls
    assert by_old_driver == NvmlReader(FakeNvml(MIG, "load")).open().read(NOW)


def test_anything_else_the_bindings_raise_is_an_nvml_read_error():
    fake = FakeNvml(H100, "load", fail={"nvmlDeviceGetUUID": OSError("libnvidia-ml.so.1: cannot read")})
    with pytest.raises(GpuReadError, match="unexpected OSError: libnvidia-ml") as err:
        NvmlReader(fake).open().read(NOW)
    assert err.value.reason == "nvml"


def test_unsupported_figures_are_none():
    fake = FakeNvml(H100, "load", fail={"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_NOT_SUPPORTED,
                                        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED})
    gpu, = NvmlReader(fake).open().read(NOW).gpus
    assert gpu.temperature_c is None and gpu.power_w is None and gpu.utilization_pct == 100.0


def test_a_wedged_nvml_call_times_out_and_later_reads_fail_fast_until_it_returns():
    block = threading.Event()
    reader = NvmlReader(FakeNvml(H100, "load", block=block), timeout_s=0.3).open()
    with pytest.raises(GpuReadError) as first:
        reader.read(NOW)
    assert first.value.reason == "timeout"
    with pytest.raises(GpuReadError, match="has still not returned") as second:
        reader.read(NOW)
    assert second.value.reason == "timeout"
    block.set()  # the driver answers again: the stuck call returns and reads work again
    reader.nvml.block = None
    deadline = time.monotonic() + 10
    while True:
        try:
            snap = reader.read(NOW)
            break
        except GpuReadError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    assert snap.gpus[0].utilization_pct == 100.0


def test_nvidia_smi_module_sees_the_same_fields_as_the_fake_nvml():
    """The reader asks only for fields every capture has (else nvidia-smi exits 2 on that host)."""
    for capture in CAPTURES:
        sections = parse_capture(capture)
        header = next(b for (p, a), b in sections.items() if p == "load" and a.startswith("--query-gpu="))
        names = {h.split(" [")[0].strip() for h in header.splitlines()[0].split(",")}
        assert set(nvidia_smi.SNAPSHOT_QUERY_FIELDS) <= names, capture.name


# --------------------------------------------------------------------------- GPM (Hopper profiling counters)

GPM_BUSY = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 99.47, "DCGM_FI_PROF_SM_ACTIVE": 96.1,
            "DCGM_FI_PROF_SM_OCCUPANCY": 14.2, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 93.28,
            "DCGM_FI_PROF_DRAM_ACTIVE": 17.41, "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.0}  # the real H200, busy


def test_gpm_needs_two_samples_then_gives_the_real_h200_figures_per_phase():
    fake = FakeNvml(H100, "load")  # a Hopper GPU: answered from the H200's GPM figures
    reader = NvmlReader(fake).open()
    assert reader.read(NOW).gpus[0].gpm == {}  # one sample: no interval yet, no figures (never 0)
    assert reader.read(NOW).gpus[0].gpm == GPM_BUSY
    fake.gpm_phase = "duty50"
    duty = reader.read(NOW).gpus[0].gpm
    assert duty["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 48.54 and duty["DCGM_FI_PROF_SM_ACTIVE"] == 41.92
    # FP32/FP64/HMMA/IMMA were not recorded on the H200: the fake answers NotSupported for them, and a metric
    # NVML does not give is absent, not 0.
    assert "DCGM_FI_PROF_PIPE_FP32_ACTIVE" not in duty
    fake.gpm_phase = "hold"  # 20 GiB held, no kernels
    assert reader.read(NOW).gpus[0].gpm["DCGM_FI_PROF_SM_ACTIVE"] == 0.0


def test_gpm_reuses_two_buffers_per_gpu_and_frees_them_on_close():
    fake = FakeNvml(H100, "load")
    reader = NvmlReader(fake).open()
    for _ in range(5):
        reader.read(NOW)
    assert len(fake.gpm_samples) == 2 and fake.calls.count("nvmlGpmSampleAlloc") == 2
    assert fake.calls.count("nvmlGpmQueryDeviceSupport") == 1  # asked once per GPU
    reader.close()
    assert fake.gpm_samples == {} and fake.calls.count("nvmlGpmSampleFree") == 2


def test_a_gpu_without_gpm_has_no_gpm_figures_and_is_not_sampled():
    capture = next((c for c in CAPTURES if "l40s" in c.name or "rtx" in c.name), None)
    if capture is None:
        pytest.skip("no pre-Hopper capture here")
    fake = FakeNvml(capture, "load")
    reader = NvmlReader(fake).open()
    snaps = [reader.read(NOW) for _ in range(3)]
    assert all(s.gpus[0].gpm == {} for s in snaps)
    assert "nvmlGpmSampleGet" not in fake.calls and fake.gpm_samples == {}
    # Support said yes but the sample is refused (a real pre-Hopper GPU answers NotSupported): no figures, no
    # buffers kept, not asked again.
    fake = FakeNvml(capture, "load")
    fake.nvmlGpmQueryDeviceSupport = lambda h: type("S", (), {"isSupportedDevice": 1})()
    reader = NvmlReader(fake).open()
    assert all(reader.read(NOW).gpus[0].gpm == {} for _ in range(3))
    assert fake.calls.count("nvmlGpmSampleGet") == 1 and fake.gpm_samples == {}


def test_gpm_per_mig_gpu_instance_and_none_on_the_parent():
    fake = FakeNvml(MIG, "load", gpm_phase={2: "busy", 3: "duty50"})  # GIs 9 and 10 idle
    reader = NvmlReader(fake).open()
    reader.read(NOW)
    gpu = reader.read(NOW).gpus[0]
    assert gpu.gpm == {}  # under MIG the figures are per GI only
    by_gi = {m.gpu_instance_id: m for m in gpu.mig_instances}
    assert by_gi[2].gpm == GPM_BUSY and by_gi[2].activity_pct == 99.47
    assert by_gi[3].activity_pct == 48.54 and by_gi[9].activity_pct == 0.0 and by_gi[10].activity_pct == 0.0
    assert "nvmlGpmSampleGet" not in fake.calls and fake.calls.count("nvmlGpmMigSampleGet") == 8
    # GI 10 destroyed: its two buffers are freed with the next read.
    fake.gpus[0].mig = [d for d in fake.gpus[0].mig if d.gi != 10]
    reader.read(NOW)
    assert len(fake.gpm_samples) == 6
    reader.close()
    assert fake.gpm_samples == {}


def test_a_gpm_error_drops_only_the_gpm_figures_logs_once_and_recovers(caplog):
    caplog.set_level("WARNING", logger="gpufinops.agent")
    fake = FakeNvml(H100, "load")
    reader = NvmlReader(fake).open()
    reader.read(NOW)
    fake.fail["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_UNKNOWN
    snaps = [reader.read(NOW) for _ in range(3)]
    assert all(s.gpus[0].gpm == {} and s.gpus[0].utilization_pct == 100.0 for s in snaps)  # the rest is read
    said = [r.getMessage() for r in caplog.records if "GPM" in r.getMessage()]
    assert len(said) == 1 and "Unknown Error" in said[0], said
    del fake.fail["nvmlGpmSampleGet"]
    assert reader.read(NOW).gpus[0].gpm == {}  # a new interval starts after the error
    assert reader.read(NOW).gpus[0].gpm == GPM_BUSY
    # Something else the bindings raise in GPM (not an NVMLError) never fails the read either.
    fake.fail["nvmlGpmMetricsGet"] = TypeError("bindings and library disagree")
    snap = reader.read(NOW)
    assert snap.gpus[0].gpm == {} and snap.gpus[0].memory_used_mib is not None


def test_gpm_off_makes_no_gpm_call():
    fake = FakeNvml(H100, "load")
    reader = NvmlReader(fake, gpm=False).open()
    reader.read(NOW)
    assert reader.read(NOW).gpus[0].gpm == {} and not [c for c in fake.calls if "Gpm" in c]
