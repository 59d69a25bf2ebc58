"""`gpufinops agent`: DCGM-shaped /metrics from NVML or nvidia-smi, on real captures.

nvidia-smi is tests/fake_nvidia_smi.py (installed in tmp_path) replaying a real capture, or failing, or
hanging, as FAKE_NVIDIA_SMI_* say; NVML is tests/fake_nvml.py answering from the same captures. /metrics is
parsed with prometheus_client's own parser. The end-to-end test has a real Prometheus scrape two agents and
reads them back with the unchanged PrometheusMetrics collector.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufinops.agent.exporter import Agent, HostIdentity, gpu_samples, start
from gpufinops.cli.agent import build_agent, register
from gpufinops.collect.gpu_snapshot import (
    PROCESSES_METRIC,
    GpuSnapshot,
    HostSnapshot,
    MigInstance,
)
from gpufinops.collect.nvidia_smi import NvidiaSmiReader, measured
from gpufinops.collect.nvml import NvmlReader
from gpufinops.collect.prometheus import PrometheusMetrics
from gpufinops.config import PrometheusSettings
from gpufinops.decide.evaluate import evaluate
from gpufinops.model import GpuInstance, NoCounterPolicy, ReasonCode, Rule, Verdict
from tests.fake_nvidia_smi import install
from tests.fake_nvml import FakeNvml
from tests.promserver import start_scraping_prometheus

RAW = Path(__file__).parents[1] / "data" / "nvidia_smi" / "captures_raw"
H100 = RAW / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
MIG = RAW / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
SHARED = sorted((Path(__file__).parents[1] / ".." / ".." / "shared" / "data" / "nvidia_smi" / "captures_raw").glob("*.txt"))
DCGM = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP")
PARENT = {"gpu": "0", "UUID": "GPU-00000000-0000-0000-0000-000000000000", "pci_bus_id": "00000000:00:09.0",
          "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3", "DCGM_FI_DRIVER_VERSION": "590.48.01"}


class FakeSmi:
    """The fake nvidia-smi in a folder, driven through its environment variables."""

    def __init__(self, folder: Path, monkeypatch):
        self.path = install(folder)
        self.folder = folder
        self.monkeypatch = monkeypatch
        self.pids_file = folder / "pids"
        monkeypatch.setenv("FAKE_NVIDIA_SMI_PIDS", str(self.pids_file))
        self.answer(H100, "load")

    def answer(self, capture: Path, phase: str = "load") -> None:
        self.monkeypatch.setenv("FAKE_NVIDIA_SMI_CAPTURE", str(capture))
        self.monkeypatch.setenv("FAKE_NVIDIA_SMI_PHASE", phase)
        self.monkeypatch.delenv("FAKE_NVIDIA_SMI_SCRIPT", raising=False)

    def script(self, *lines: str, advance: str = "") -> None:
        script = self.folder / "script"
        script.write_text("\n".join(lines) + "\n")
        self.monkeypatch.setenv("FAKE_NVIDIA_SMI_SCRIPT", str(script))
        self.monkeypatch.setenv("FAKE_NVIDIA_SMI_COUNTER", str(self.folder / "script.count"))
        if advance:
            self.monkeypatch.setenv("FAKE_NVIDIA_SMI_ADVANCE", advance)


@pytest.fixture
def fake_smi(tmp_path, monkeypatch) -> FakeSmi:
    return FakeSmi(tmp_path, monkeypatch)


@pytest.fixture
def serve(fake_smi):
    """Start agents on 127.0.0.1 (no sampling thread unless asked); all closed at teardown."""
    running = []

    def _serve(host: HostIdentity, *, sample: bool = False, **kwargs):
        kwargs.setdefault("reader", NvidiaSmiReader(str(fake_smi.path), kwargs.get("timeout_s", 20)))
        r = start(Agent(host, **kwargs), "127.0.0.1", 0, sample=sample)
        running.append(r)
        return r

    yield _serve
    for r in running:
        r.close()


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Exposition text as {sample name: [(labels, value)]}, parsed by prometheus_client's own parser."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, text = get(port, "/metrics")
    assert status == 200
    return parse(text)


def errors(metrics, reason: str) -> float:
    return next(v for labels, v in metrics["gpufinops_agent_read_errors_total"] if labels["reason"] == reason)


def by_gi(series) -> dict[str | None, float]:
    return {labels.get("GPU_I_ID"): v for labels, v in series}


# --------------------------------------------------------------------------- /metrics content


def test_h100_capture_is_served_with_dcgm_names_and_both_hostname_labels(serve):
    running = serve(HostIdentity("ip-10-0-1-2.ec2.internal", "i-0abc"))
    m = scrape(running.port)
    expected = {**PARENT, "Hostname": "ip-10-0-1-2.ec2.internal", "hostname": "ip-10-0-1-2.ec2.internal",
                "instance_id": "i-0abc"}
    # Values as the capture prints them: "100 %", "19818 MiB", "631.95 W", temperature.gpu "59".
    assert m["DCGM_FI_DEV_GPU_UTIL"] == [(expected, 100.0)]
    assert m["DCGM_FI_DEV_FB_USED"] == [(expected, 19818.0)]
    assert m["DCGM_FI_DEV_POWER_USAGE"] == [(expected, 631.95)]
    assert m["DCGM_FI_DEV_GPU_TEMP"] == [(expected, 59.0)]
    assert m[PROCESSES_METRIC] == [(expected, 3.0)]  # memhog x2 + gpu_burn
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in m  # nvidia-smi has no such figure: absent, not 0
    assert m["gpufinops_agent_gpus"] == [({}, 1.0)]
    assert m["gpufinops_agent_reader"] == [({"reader": "nvidia-smi"}, 1.0)]
    assert all(v == 0 for _, v in m["gpufinops_agent_read_errors_total"])
    assert get(running.port, "/healthz")[0] == 200


@pytest.mark.parametrize("labels", [("Hostname",), ("hostname",)])
def test_one_hostname_label_when_asked_and_no_instance_id_without_one(serve, fake_smi, labels):
    fake_smi.answer(H100, "idle")
    m = scrape(serve(HostIdentity("gpu-box", hostname_labels=labels)).port)
    (got, util), = m["DCGM_FI_DEV_GPU_UTIL"]
    assert util == 0.0 and got == {**PARENT, labels[0]: "gpu-box"}  # a measured 0 is a sample
    assert m[PROCESSES_METRIC][0][1] == 0.0 and m["DCGM_FI_DEV_FB_USED"][0][1] == 0.0


def test_mig_gpu_has_one_series_set_per_gpu_instance(serve, fake_smi):
    fake_smi.answer(MIG, "load")
    m = scrape(serve(HostIdentity("mig-box")).port)
    host = {"Hostname": "mig-box", "hostname": "mig-box"}
    profiles = {"2": "3g.40gb", "3": "2g.20gb", "9": "1g.10gb", "10": "1g.10gb"}
    # Memory per GPU instance, labelled like dcgm-exporter (UUID = the parent GPU's); none on the parent.
    assert sorted(m["DCGM_FI_DEV_FB_USED"], key=lambda s: int(s[0]["GPU_I_ID"])) == [
        ({**PARENT, **host, "GPU_I_ID": gi, "GPU_I_PROFILE": profiles[gi]}, used)
        for gi, used in (("2", 11091.0), ("3", 17.0), ("9", 9.0), ("10", 9.0))]
    assert by_gi(m[PROCESSES_METRIC]) == {None: 3.0, "2": 3.0, "3": 0.0, "9": 0.0, "10": 0.0}
    # Board-wide figures on the parent only; utilization is [N/A] under MIG: no series, never 0.
    assert m["DCGM_FI_DEV_POWER_USAGE"] == [({**PARENT, **host}, 433.78)]
    assert m["DCGM_FI_DEV_GPU_TEMP"] == [({**PARENT, **host}, 53.0)]
    assert "DCGM_FI_DEV_GPU_UTIL" not in m and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in m


def test_nvml_and_nvidia_smi_agents_serve_the_same_metrics(serve, fake_smi):
    for capture in (MIG, H100):
        for phase in ("idle", "load"):
            fake_smi.answer(capture, phase)
            by_smi = scrape(serve(HostIdentity("h")).port)
            nvml = NvmlReader(FakeNvml(capture, phase)).open()
            by_nvml = scrape(serve(HostIdentity("h"), reader=nvml).port)
            assert by_nvml.pop("gpufinops_agent_reader") == [({"reader": "nvml"}, 1.0)]
            by_smi.pop("gpufinops_agent_reader")
            for name in (*DCGM, PROCESSES_METRIC):
                assert sorted(map(repr, by_smi.get(name, []))) == sorted(map(repr, by_nvml.get(name, []))), name
            for name in ("gpufinops_agent_gpus", "gpufinops_agent_read_errors_total"):
                assert by_smi[name] == by_nvml[name]


class StubReader:
    """A reader handing out given snapshots (or errors), for what no capture shows."""

    source = "stub"

    def __init__(self, *results):
        self.results = list(results)

    def read(self):
        result = self.results.pop(0) if len(self.results) > 1 else self.results[0]
        if isinstance(result, Exception):
            raise result
        return result

    def close(self):
        pass


def _snapshot(**gpu_fields) -> HostSnapshot:
    gpu = GpuSnapshot(index=0, uuid="GPU-1", name="NVIDIA A100-SXM4-40GB", pci_bus_id="00000000:07:00.0",
                      driver_version="550.54.15", **gpu_fields)
    return HostSnapshot(datetime(2026, 1, 1, tzinfo=timezone.utc), "stub", (gpu,))


def test_engine_activity_per_gi_as_a_ratio_only_where_a_figure_exists_and_no_processes_when_unread():
    snap = _snapshot(mig_enabled=True, power_w=9.2e18, memory_used_mib=500.0, processes=None, mig_instances=(
        MigInstance(1, "3g.20gb", gpm={"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 42.0}, memory_used_mib=-1.0, processes=None),
        MigInstance(2, "3g.20gb", gpm={}, memory_used_mib=0.0, processes=()),
    ))
    samples = gpu_samples(snap, HostIdentity("h", hostname_labels=("hostname",)))
    got = {(s.metric, s.labels.get("GPU_I_ID")): s.value for s in samples}
    assert got == {("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "1"): 0.42,  # dcgm-exporter's ratio, not %
                   ("DCGM_FI_DEV_FB_USED", "2"): 0.0, (PROCESSES_METRIC, "2"): 0.0}
    # A sentinel power, a negative memory, unread processes: no series. The parent has no FB_USED under MIG.
    one = next(s for s in samples if s.labels.get("GPU_I_ID") == "1")
    assert one.labels == {"gpu": "0", "UUID": "GPU-1", "pci_bus_id": "00000000:07:00.0", "device": "nvidia0",
                          "modelName": "NVIDIA A100-SXM4-40GB", "GPU_I_PROFILE": "3g.20gb", "GPU_I_ID": "1",
                          "hostname": "h", "DCGM_FI_DRIVER_VERSION": "550.54.15"}


def test_gpm_figures_are_dcgm_exporter_ratios_per_gpu_and_left_out_when_not_a_percentage():
    gpm = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 99.47, "DCGM_FI_PROF_SM_ACTIVE": 96.1,
           "DCGM_FI_PROF_SM_OCCUPANCY": 14.2, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 93.28,
           "DCGM_FI_PROF_DRAM_ACTIVE": 17.41, "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.0,
           "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 100.5, "DCGM_FI_PROF_PIPE_FP64_ACTIVE": float("nan")}
    samples = gpu_samples(_snapshot(utilization_pct=100.0, gpm=gpm), HostIdentity("h"))
    got = {s.metric: s.value for s in samples if s.metric.startswith("DCGM_FI_PROF_")}
    assert got == pytest.approx({"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.9947, "DCGM_FI_PROF_SM_ACTIVE": 0.961,
                                 "DCGM_FI_PROF_SM_OCCUPANCY": 0.142, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.9328,
                                 "DCGM_FI_PROF_DRAM_ACTIVE": 0.1741, "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.0})
    assert all("GPU_I_ID" not in s.labels for s in samples)


def test_nvml_agent_serves_gpm_series_from_the_second_sample_per_gi_and_none_without_gpm(serve):
    fake = FakeNvml(MIG, "load", gpm_phase={2: "busy"})
    agent = serve(HostIdentity("h"), reader=NvmlReader(fake).open())
    first = scrape(agent.port)
    assert not [name for name in first if name.startswith("DCGM_FI_PROF_")]  # one sample: no interval yet
    agent.agent.sample_once()
    metrics = scrape(agent.port)
    assert by_gi(metrics["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) == pytest.approx({"2": 0.9947, "3": 0.0, "9": 0.0,
                                                                             "10": 0.0})
    assert by_gi(metrics["DCGM_FI_PROF_SM_ACTIVE"])["2"] == pytest.approx(0.961)
    assert "DCGM_FI_PROF_PIPE_FP32_ACTIVE" not in metrics  # the GPU did not give it: no series, never 0
    no_gpm = serve(HostIdentity("h"), reader=NvmlReader(FakeNvml(MIG, "load"), gpm=False).open())
    no_gpm.agent.sample_once()
    assert not [name for name in scrape(no_gpm.port) if name.startswith("DCGM_FI_PROF_")]


@pytest.mark.skipif(not SHARED, reason="../shared/data/nvidia_smi not present")
@pytest.mark.parametrize("capture", SHARED, ids=lambda p: p.stem)
def test_every_real_capture_gives_the_dcgm_series(fake_smi, capture):
    """Linux and Windows, drivers 590-610, GeForce to H200: every field the agent asks for exists (else the
    fake, like nvidia-smi, exits 2); a MIG GPU has per-GI memory and no utilization."""
    for phase in ("idle", "load"):
        fake_smi.answer(capture, phase)
        agent = Agent(HostIdentity("h"), reader=NvidiaSmiReader(str(fake_smi.path), 20))
        assert agent.sample_once() is True
        got = {(s.metric, "GPU_I_ID" in s.labels) for s in agent.current_samples()}
        if "mig" in capture.name:
            assert got == {("DCGM_FI_DEV_FB_USED", True), (PROCESSES_METRIC, True), (PROCESSES_METRIC, False),
                           ("DCGM_FI_DEV_POWER_USAGE", False), ("DCGM_FI_DEV_GPU_TEMP", False)}
        else:
            assert got == {(name, False) for name in (*DCGM, PROCESSES_METRIC)}


@pytest.mark.parametrize("raw, expected", [
    (100.0, 100.0), ("59", 59.0), (None, None), ("Enabled", None), (-1.0, None), (9.2e18, None), (2.0**47, None),
    (3, 3.0), (True, None),
])
def test_only_measured_numbers_become_samples(raw, expected):
    assert measured(raw) == expected


# --------------------------------------------------------------------------- failures, on_sample, latest_snapshot


def test_idle_load_fail_hang_load_over_time_with_on_sample_and_latest_snapshot(serve, fake_smi):
    fake_smi.script("idle", "load", "fail", "hang", "garbage", "load")
    seen: list[tuple[HostSnapshot | None, str]] = []
    running = serve(HostIdentity("h"), timeout_s=2.0, on_sample=lambda snap, why: seen.append((snap, why)),
                    reader=NvidiaSmiReader(str(fake_smi.path), 2.0))
    agent = running.agent  # start() took the first sample: idle
    assert agent.latest_snapshot().gpus[0].utilization_pct == 0.0
    assert agent.sample_once() is True  # load
    assert agent.latest_snapshot().gpus[0].utilization_pct == 100.0
    assert [v for _, v in scrape(running.port)["DCGM_FI_DEV_GPU_UTIL"]] == [100.0]
    for reason in ("exit", "timeout", "unparseable"):  # fail, hang (killed), garbage
        assert agent.sample_once() is False
        m = scrape(running.port)
        assert not any(name in m for name in (*DCGM, PROCESSES_METRIC))  # gone, not stale and not zero
        assert errors(m, reason) == 1 and agent.latest_snapshot() is None
        assert get(running.port, "/healthz")[0] == 503
    assert agent.sample_once() is True  # load again: the series come back
    assert [v for _, v in scrape(running.port)["DCGM_FI_DEV_GPU_UTIL"]] == [100.0]
    assert [(s is not None, why.split(":")[0]) for s, why in seen] == [
        (True, ""), (True, ""), (False, "exit"), (False, "timeout"), (False, "unparseable"), (True, "")]
    assert "Unable to determine the device handle" in seen[2][1]
    assert seen[1][0].gpus[0].processes and seen[1][0].source == "nvidia-smi"


def test_processes_that_cannot_be_read_are_absent_and_counted_as_partial(serve, fake_smi):
    # One line per call: the --query-gpu call answers, the --query-compute-apps call fails.
    fake_smi.script("load", "fail", "load", advance="every")
    running = serve(HostIdentity("h"))
    m = scrape(running.port)
    assert PROCESSES_METRIC not in m and [v for _, v in m["DCGM_FI_DEV_GPU_UTIL"]] == [100.0]
    assert errors(m, "partial") == 1 and running.agent.latest_snapshot().problems
    assert running.agent.latest_snapshot().gpus[0].processes is None


def test_a_failing_on_sample_never_stops_sampling(fake_smi):
    def boom(snapshot, reason):
        raise RuntimeError("consumer bug")

    agent = Agent(HostIdentity("h"), reader=NvidiaSmiReader(str(fake_smi.path), 20), on_sample=boom)
    assert agent.sample_once() is True and agent.latest_snapshot() is not None


def test_missing_binary_and_unknown_field_are_errors(tmp_path, fake_smi):
    missing = Agent(HostIdentity("h"), reader=NvidiaSmiReader(str(tmp_path / "no-such-nvidia-smi"), 5))
    assert missing.sample_once() is False
    assert 'gpufinops_agent_read_errors_total{reason="not_found"} 1.0' in missing.metrics_text().decode()
    # An older driver without a field the reader asks for: nvidia-smi exits 2, as the real one does.
    old = tmp_path / "old.txt"
    old.write_text(H100.read_text().replace("temperature.gpu,", "").replace(", temperature.gpu", ""))
    fake_smi.answer(old, "load")
    agent = Agent(HostIdentity("h"), reader=NvidiaSmiReader(str(fake_smi.path), 20))
    assert agent.sample_once() is False and agent.current_samples() == []
    assert 'gpufinops_agent_read_errors_total{reason="exit"} 1.0' in agent.metrics_text().decode()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # killed, waiting for init to reap it


def test_hung_nvidia_smi_is_killed_with_its_children(fake_smi):
    fake_smi.answer(H100, "hang")
    agent = Agent(HostIdentity("h"), reader=NvidiaSmiReader(str(fake_smi.path), 1.0), timeout_s=1.0)
    assert agent.sample_once() is False
    assert 'gpufinops_agent_read_errors_total{reason="timeout"} 1.0' in agent.metrics_text().decode()
    pids = [int(p) for p in fake_smi.pids_file.read_text().split()]
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), pids


def test_a_snapshot_older_than_max_age_is_not_served(fake_smi):
    now = [1000.0]
    agent = Agent(HostIdentity("h"), reader=NvidiaSmiReader(str(fake_smi.path), 20), interval_s=10, timeout_s=5,
                  clock=lambda: now[0])
    assert agent.max_age_s == 25  # two missed intervals plus a timeout
    assert agent.sample_once() and len(agent.current_samples()) == 5
    now[0] += 25
    assert len(agent.current_samples()) == 5 and agent.latest_snapshot() is not None
    now[0] += 0.1  # the sampler is stuck: its last values are no longer current
    assert agent.current_samples() == [] and agent.healthy()[0] is False and agent.latest_snapshot() is None
    assert "DCGM_FI_DEV_GPU_UTIL" not in agent.metrics_text().decode()


def test_a_read_with_no_gpu_is_unparseable():
    agent = Agent(HostIdentity("h"), reader=StubReader(HostSnapshot(datetime.now(timezone.utc), "stub", ())))
    assert agent.sample_once() is False
    assert 'gpufinops_agent_read_errors_total{reason="unparseable"} 1.0' in agent.metrics_text().decode()


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser


def test_cli_flags_and_env_defaults(monkeypatch, fake_smi):
    monkeypatch.setenv("GPUFINOPS_AGENT_INSTANCE_ID", "i-0env")
    monkeypatch.setenv("GPUFINOPS_AGENT_INTERVAL", "3")
    monkeypatch.setenv("GPUFINOPS_AGENT_HOSTNAME_LABEL", "hostname")
    parser = _parser()
    args = parser.parse_args(["agent", "--port", "9500", "--hostname", "ip-10-0-1-2", "--nvidia-smi",
                              str(fake_smi.path), "--timeout", "2.5", "--reader", "nvidia-smi"])
    assert (args.port, args.interval, args.timeout, args.instance_id) == (9500, 3.0, 2.5, "i-0env")
    agent = build_agent(args)
    assert agent.host == HostIdentity("ip-10-0-1-2", "i-0env", ("hostname",))
    assert isinstance(agent.reader, NvidiaSmiReader) and agent.reader.binary == str(fake_smi.path)
    assert callable(args.func)
    args = parser.parse_args(["agent", "--hostname", "h", "--hostname-label", "both"])
    assert args.reader == "auto" and build_agent(args).host.hostname_labels == ("Hostname", "hostname")
    for bad in (["--interval", "0"], ["--interval", "soon"], ["--port", "70000"], ["--hostname-label", "host"],
                ["--reader", "dcgm"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["agent", *bad])
    with pytest.raises(ValueError, match="--hostname"):
        build_agent(parser.parse_args(["agent", "--hostname", " "]))
    monkeypatch.setenv("GPUFINOPS_AGENT_HOSTNAME_LABEL", "HOSTNAME")  # env values are not checked by argparse
    with pytest.raises(ValueError, match="GPUFINOPS_AGENT_HOSTNAME_LABEL"):
        build_agent(_parser().parse_args(["agent", "--hostname", "h"]))


def test_the_agent_listens_on_loopback_unless_told(monkeypatch, fake_smi):
    # /metrics names the host, its GPUs and processes: another machine reaches it only when the bind is said.
    from gpufinops.agent import exporter

    monkeypatch.delenv("GPUFINOPS_AGENT_ADDRESS", raising=False)
    args = _parser().parse_args(["agent", "--hostname", "h"])
    assert args.address == "127.0.0.1" == exporter.DEFAULT_ADDRESS
    running = start(Agent(HostIdentity("h"), reader=NvidiaSmiReader(str(fake_smi.path), 20)), port=0, sample=False)
    try:
        assert running.server.server_address[0] == "127.0.0.1"
        assert get(running.port, "/metrics")[0] == 200
    finally:
        running.close()
    monkeypatch.setenv("GPUFINOPS_AGENT_ADDRESS", "0.0.0.0")  # deploy/systemd/agent.env says it explicitly
    assert _parser().parse_args(["agent", "--hostname", "h"]).address == "0.0.0.0"
    assert _parser().parse_args(["agent", "--hostname", "h", "--address", "10.0.1.2"]).address == "10.0.1.2"


def test_cli_reader_auto_uses_nvidia_smi_without_nvml_and_nvml_fails_clearly(monkeypatch, fake_smi, capsys):
    import pynvml

    def no_library():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    args = _parser().parse_args(["agent", "--hostname", "h", "--nvidia-smi", str(fake_smi.path)])
    assert isinstance(build_agent(args).reader, NvidiaSmiReader)
    args = _parser().parse_args(["agent", "--hostname", "h", "--reader", "nvml", "--port", "0"])
    assert args.func(args) == 2
    assert "NVML did not initialise" in capsys.readouterr().err


# --------------------------------------------------------------------------- end to end


def _wait_for_samples(prom_url: str, query: str, n: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{prom_url}/api/v1/query?query={quote(query)}", timeout=5) as resp:
            result = json.load(resp)["data"]["result"]
        if result and all(float(r["value"][1]) >= n for r in result):
            return
        time.sleep(0.5)
    raise AssertionError(f"prometheus did not collect {n} samples for {query} in {timeout_s}s")


def test_prometheus_scrapes_agents_and_the_collector_reads_them_unchanged(tmp_path, serve):
    h100 = serve(HostIdentity("ip-10-0-1-2.ec2.internal"), sample=True, interval_s=0.5)
    # The MIG host reads through NVML (the fake module over the MIG capture).
    # Two MIG hosts without GPM (the process-count and memory evidence), one with GPM (GI 2 busy, the rest idle).
    mig = serve(HostIdentity("ip-10-0-1-3"), sample=True, interval_s=0.5,
                reader=NvmlReader(FakeNvml(MIG, "load"), gpm=False).open())
    idle_mig = serve(HostIdentity("ip-10-0-1-4"), sample=True, interval_s=0.5,
                     reader=NvmlReader(FakeNvml(MIG, "idle"), gpm=False).open())
    gpm_mig = serve(HostIdentity("ip-10-0-1-5"), sample=True, interval_s=0.5,
                    reader=NvmlReader(FakeNvml(MIG, "load", gpm_phase={2: "busy"})).open())
    prom = start_scraping_prometheus(tmp_path / "prom", [f"127.0.0.1:{h100.port}", f"127.0.0.1:{mig.port}",
                                                         f"127.0.0.1:{idle_mig.port}", f"127.0.0.1:{gpm_mig.port}"])
    try:
        _wait_for_samples(prom.url, "count_over_time(DCGM_FI_DEV_FB_USED[1m])", 8)
        instances = [
            GpuInstance("i-0h100", "p5.48xlarge", "us-east-1", "running", datetime(2026, 1, 1, tzinfo=timezone.utc),
                        private_dns="ip-10-0-1-2.ec2.internal"),
            # Matched by the short host name, as an EC2 host often names itself.
            GpuInstance("i-0mig", "p5.48xlarge", "us-east-1", "running", datetime(2026, 1, 1, tzinfo=timezone.utc),
                        private_dns="ip-10-0-1-3.ec2.internal"),
        ]
        idle_host = GpuInstance("i-0idlemig", "p5.48xlarge", "us-east-1", "running",
                                datetime(2026, 1, 1, tzinfo=timezone.utc), private_dns="ip-10-0-1-4.ec2.internal")
        source = PrometheusMetrics(PrometheusSettings(url=prom.url, scrape_interval_s=1, timeout_s=10))
        now = datetime.now(timezone.utc)
        usage = source.window_usage(instances, window_s=60, now=now)
        # The central judgement of the two MIG hosts, over the last 6 s (all scraped): a short window, so that
        # the idle host's process counts cover it and the opt-in rule can judge it.
        gpm_host = GpuInstance("i-0gpmmig", "p5.48xlarge", "us-east-1", "running",
                               datetime(2026, 1, 1, tzinfo=timezone.utc), private_dns="ip-10-0-1-5.ec2.internal")
        short = source.window_usage([instances[1], idle_host, gpm_host], window_s=6, now=now)
    finally:
        prom.stop()
    h, = usage["i-0h100"].gpus
    assert usage["i-0h100"].error is None and usage["i-0h100"].expected_samples == 60
    assert h.gpu == "0" and h.model_name == "NVIDIA H100 80GB HBM3"
    assert h.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert h.samples >= 4 and h.activity_signal == "DCGM_FI_DEV_GPU_UTIL"
    assert (h.activity_min, h.activity_mean, h.activity_max) == (100.0, 100.0, 100.0)
    assert h.fb_used_max_mib == 19818.0 and h.power_mean_w == pytest.approx(631.95)
    # The MIG GPU: one entry per GPU instance, with its memory, and no activity samples: no data, never 0 %.
    slices = {g.gpu: g for g in usage["i-0mig"].gpus if "/" in g.gpu}
    assert {k: g.fb_used_max_mib for k, g in slices.items()} == {"0/2": 11091.0, "0/3": 17.0, "0/9": 9.0,
                                                                 "0/10": 9.0}
    assert all(g.samples == 0 and g.activity_mean is None for g in usage["i-0mig"].gpus)
    rule = Rule(name="idle-6s", threshold_pct=10, window_s=6, min_coverage=0.5)
    opt_in = replace(rule, idle_without_activity_counter=NoCounterPolicy.NO_PROCESSES_AND_IDLE_MEMORY)
    busy = evaluate(instances[1], short["i-0mig"], rule, now)
    assert (busy.verdict, busy.code) == (Verdict.ACTIVE, ReasonCode.EVIDENCE_OF_WORK), busy.reason
    assert "GPU 0/2 (3g.40gb)" in busy.reason and "3 processes" in busy.reason
    assert evaluate(instances[1], short["i-0mig"], opt_in, now).verdict is Verdict.ACTIVE
    idle = evaluate(idle_host, short["i-0idlemig"], rule, now)
    assert (idle.verdict, idle.code) == (Verdict.UNKNOWN, ReasonCode.NO_ACTIVITY_COUNTER), idle.reason
    idle = evaluate(idle_host, short["i-0idlemig"], opt_in, now)
    assert (idle.verdict, idle.code) == (Verdict.IDLE, ReasonCode.IDLE_NO_PROCESSES), idle.reason
    assert "idle_without_activity_counter" in idle.reason
    # With GPM each GPU instance has a real activity figure (GR_ENGINE_ACTIVE, as %) and is judged by it.
    gis = {g.gpu: g for g in short["i-0gpmmig"].gpus if "/" in g.gpu}
    assert gis["0/2"].activity_max == pytest.approx(99.47) and gis["0/9"].activity_max == 0.0
    assert all(g.activity_signal == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" for g in gis.values())
    # Judged by the instances' own activity, not by the board's process count standing in for it: one of the
    # four slices worked, three did nothing.
    gpm_busy = evaluate(gpm_host, short["i-0gpmmig"], rule, now)
    assert gpm_busy.verdict is Verdict.UNDERUTILIZED and "1 of 4" in gpm_busy.reason, gpm_busy.reason
    assert "no activity counter" not in gpm_busy.reason
