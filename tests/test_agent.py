"""`gpufinops agent`: DCGM-shaped /metrics from nvidia-smi, on real captures.

nvidia-smi is a fake executable in tmp_path that answers the agent's real
`--query-gpu=...` arguments from a real capture (and fails like nvidia-smi on
an unknown field), or fails, or hangs, as its `mode` file says. The end-to-end
test has a real Prometheus scrape the agent and reads it back with the
unchanged PrometheusMetrics collector.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufinops.agent import Agent, HostIdentity, _measured, gpu_samples, start
from gpufinops.cli.agent import build_agent, register
from gpufinops.collect.nvidia_smi import parse_readings
from gpufinops.collect.prometheus import PrometheusMetrics
from gpufinops.config import PrometheusSettings
from gpufinops.model import GpuInstance
from tests.promserver import start_scraping_prometheus

DATA = Path(__file__).parent / "data" / "nvidia_smi"
H100_LOAD = DATA / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load.csv"
H100_IDLE = DATA / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__idle.csv"
MIG_LOAD = DATA / "linux-x86_64__nvidia-h100-mig__590.48.01__load.csv"
DCGM = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP")

FAKE_NVIDIA_SMI = r'''#!{python} -S
"""Fake nvidia-smi: answers --query-gpu from a real capture, or fails, or hangs (see ./mode)."""
import csv, os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
mode = open(os.path.join(here, "mode")).read().strip()
if mode == "fail":
    print("Unable to determine the device handle for GPU0000:00:09.0: Unknown Error", file=sys.stderr)
    sys.exit(15)
if mode == "garbage":
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    print("a, b")
    sys.exit(0)
if mode == "hang":
    # A grandchild that must die too; it does not hold our stdout, so only a group kill ends it.
    child = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open(os.path.join(here, "pids"), "w").write(f"{os.getpid()} {child.pid}")
    child.wait()
    sys.exit(0)
query = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--query-gpu=")][0].split(",")
with open(mode, newline="") as f:
    rows = list(csv.reader(f, skipinitialspace=True))
names = [h.split(" [")[0] for h in rows[0]]
for q in query:
    if q not in names:
        print(f'Field "{q}" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
cols = [names.index(q) for q in query]
for row in rows:
    print(", ".join(row[c] for c in cols))
'''


class FakeNvidiaSmi:
    def __init__(self, folder: Path):
        self.path = folder / "nvidia-smi"
        self.path.write_text(FAKE_NVIDIA_SMI.replace("{python}", sys.executable))
        self.path.chmod(0o755)
        self.mode_file = folder / "mode"
        self.pids_file = folder / "pids"

    def answer(self, capture: Path | str) -> None:
        self.mode_file.write_text(str(capture))


@pytest.fixture
def fake_smi(tmp_path) -> FakeNvidiaSmi:
    fake = FakeNvidiaSmi(tmp_path)
    fake.answer(H100_LOAD)
    return fake


@pytest.fixture
def serve(fake_smi):
    """Start agents on 127.0.0.1 (no sampling thread unless asked); all closed at teardown."""
    running = []

    def _serve(host: HostIdentity, *, sample: bool = False, **kwargs):
        agent = Agent(host, nvidia_smi=str(fake_smi.path), **kwargs)
        r = start(agent, "127.0.0.1", 0, sample=sample)
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


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """/metrics as {sample name: [(labels, value)]}, parsed by prometheus_client's own parser."""
    status, text = get(port, "/metrics")
    assert status == 200
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def errors(metrics, reason: str) -> float:
    return next(v for labels, v in metrics["gpufinops_agent_nvidia_smi_errors_total"] if labels["reason"] == reason)


# --------------------------------------------------------------------------- /metrics content


def test_h100_capture_is_served_with_dcgm_names_and_labels(serve):
    running = serve(HostIdentity("ip-10-0-1-2.ec2.internal", "i-0abc"))
    m = scrape(running.port)
    expected_labels = {
        "gpu": "0", "UUID": "GPU-00000000-0000-0000-0000-000000000000", "pci_bus_id": "00000000:00:09.0",
        "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "ip-10-0-1-2.ec2.internal",
        "DCGM_FI_DRIVER_VERSION": "590.48.01", "instance_id": "i-0abc",
    }
    # Values as the capture prints them: "100 %", "19818 MiB", "631.95 W", temperature.gpu "59".
    assert m["DCGM_FI_DEV_GPU_UTIL"] == [(expected_labels, 100.0)]
    assert m["DCGM_FI_DEV_FB_USED"] == [(expected_labels, 19818.0)]
    assert m["DCGM_FI_DEV_POWER_USAGE"] == [(expected_labels, 631.95)]
    assert m["DCGM_FI_DEV_GPU_TEMP"] == [(expected_labels, 59.0)]
    assert m["gpufinops_agent_gpus"] == [({}, 1.0)]
    assert all(v == 0 for _, v in m["gpufinops_agent_nvidia_smi_errors_total"])
    assert get(running.port, "/healthz")[0] == 200


def test_measured_zero_is_a_sample_and_no_instance_id_label_without_one(serve, fake_smi):
    fake_smi.answer(H100_IDLE)
    m = scrape(serve(HostIdentity("gpu-box")).port)
    (labels, util), = m["DCGM_FI_DEV_GPU_UTIL"]
    assert util == 0.0 and labels["Hostname"] == "gpu-box" and "instance_id" not in labels
    assert m["DCGM_FI_DEV_FB_USED"][0][1] == 0.0


def test_mig_gpu_has_no_util_series_but_keeps_memory_and_power(serve, fake_smi):
    fake_smi.answer(MIG_LOAD)  # utilization.gpu is "[N/A]" on a MIG-enabled H100
    m = scrape(serve(HostIdentity("mig-box")).port)
    assert "DCGM_FI_DEV_GPU_UTIL" not in m  # absent, not 0
    assert [v for _, v in m["DCGM_FI_DEV_FB_USED"]] == [11125.0]
    assert [v for _, v in m["DCGM_FI_DEV_POWER_USAGE"]] == [433.78]


SHARED_CAPTURES = sorted((Path(__file__).parent / ".." / ".." / "shared" / "data" / "nvidia_smi" / "query_gpu_csv")
                         .glob("*.csv"))


@pytest.mark.skipif(not SHARED_CAPTURES, reason="../shared/data/nvidia_smi not present")
@pytest.mark.parametrize("capture", SHARED_CAPTURES, ids=lambda p: p.stem)
def test_every_real_capture_answers_the_agents_query(fake_smi, capture):
    """Linux and Windows, drivers 590-610, GeForce to H200: every field the agent asks for exists
    (else the fake, like nvidia-smi, exits 2), and only a MIG-enabled GPU lacks utilization."""
    fake_smi.answer(capture)
    agent = Agent(HostIdentity("h"), nvidia_smi=str(fake_smi.path))
    assert agent.sample_once() is True
    reading, = parse_readings(capture.read_text())
    got = {s.metric for s in agent.current_samples()}
    expected = set(DCGM) - ({"DCGM_FI_DEV_GPU_UTIL"} if reading.mig_enabled else set())
    assert got == expected


@pytest.mark.parametrize("raw, expected", [
    (100.0, 100.0), ("59", 59.0), (None, None), ("Enabled", None), (-1.0, None), (9.2e18, None), (2.0**47, None),
])
def test_only_measured_numbers_become_samples(raw, expected):
    assert _measured(raw) == expected


def test_rows_that_name_no_gpu_are_not_exported():
    reading, = parse_readings(H100_LOAD.read_text())
    nameless = type(reading)(**{**reading.__dict__, "uuid": ""})
    assert gpu_samples([nameless], HostIdentity("h")) == []
    assert len(gpu_samples([reading], HostIdentity("h"))) == 4


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("mode, reason", [("fail", "exit"), ("garbage", "unparseable")])
def test_nvidia_smi_failure_removes_series_and_counts_then_recovers(serve, fake_smi, mode, reason):
    running = serve(HostIdentity("h"))
    assert "DCGM_FI_DEV_GPU_UTIL" in scrape(running.port)
    fake_smi.answer(mode)
    assert running.agent.sample_once() is False
    m = scrape(running.port)
    assert not any(name in m for name in DCGM)  # gone, not stale and not zero
    assert errors(m, reason) == 1 and m["gpufinops_agent_gpus"] == [({}, 1.0)]
    assert get(running.port, "/healthz")[0] == 503
    assert running.agent.sample_once() is False
    assert errors(scrape(running.port), reason) == 2
    fake_smi.answer(H100_LOAD)
    assert running.agent.sample_once() is True
    m = scrape(running.port)
    assert [v for _, v in m["DCGM_FI_DEV_GPU_UTIL"]] == [100.0] and errors(m, reason) == 2


def test_unknown_field_and_missing_binary_are_errors(tmp_path, fake_smi):
    # An older capture without a field the agent queries: nvidia-smi exits 2, as the real one does.
    old = tmp_path / "old.csv"
    lines = H100_LOAD.read_text().splitlines()
    header = [h.strip() for h in lines[0].split(",")]
    drop = header.index("temperature.gpu")
    old.write_text("\n".join(", ".join(c for i, c in enumerate(line.split(", ")) if i != drop) for line in lines))
    fake_smi.answer(old)
    agent = Agent(HostIdentity("h"), nvidia_smi=str(fake_smi.path))
    assert agent.sample_once() is False and agent.current_samples() == []
    missing = Agent(HostIdentity("h"), nvidia_smi=str(tmp_path / "no-such-nvidia-smi"))
    assert missing.sample_once() is False
    text = missing.metrics_text().decode()
    assert 'gpufinops_agent_nvidia_smi_errors_total{reason="not_found"} 1.0' in text
    assert 'gpufinops_agent_nvidia_smi_errors_total{reason="exit"} 1.0' in agent.metrics_text().decode()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # killed, waiting for init to reap it


def test_hung_nvidia_smi_is_killed_with_its_children(serve, fake_smi):
    running = serve(HostIdentity("h"), timeout_s=1.0)
    fake_smi.answer("hang")
    assert running.agent.sample_once() is False
    m = scrape(running.port)
    assert "DCGM_FI_DEV_FB_USED" not in m and errors(m, "timeout") == 1
    pids = [int(p) for p in fake_smi.pids_file.read_text().split()]
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), pids


def test_a_snapshot_older_than_max_age_is_not_served(fake_smi):
    now = [1000.0]
    agent = Agent(HostIdentity("h"), nvidia_smi=str(fake_smi.path), interval_s=10, timeout_s=5,
                  clock=lambda: now[0])
    assert agent.max_age_s == 25  # two missed intervals plus a timeout
    assert agent.sample_once() and len(agent.current_samples()) == 4
    now[0] += 25
    assert len(agent.current_samples()) == 4
    now[0] += 0.1  # the sampler is stuck: its last values are no longer current
    assert agent.current_samples() == [] and agent.healthy()[0] is False
    assert "DCGM_FI_DEV_GPU_UTIL" not in agent.metrics_text().decode()


# --------------------------------------------------------------------------- command line


def test_cli_flags_and_env_defaults(monkeypatch, fake_smi):
    monkeypatch.setenv("GPUFINOPS_AGENT_INSTANCE_ID", "i-0env")
    monkeypatch.setenv("GPUFINOPS_AGENT_INTERVAL", "3")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["agent", "--port", "9500", "--hostname", "ip-10-0-1-2", "--nvidia-smi",
                              str(fake_smi.path), "--timeout", "2.5"])
    assert (args.port, args.interval, args.timeout, args.instance_id) == (9500, 3.0, 2.5, "i-0env")
    agent = build_agent(args)
    assert agent.host == HostIdentity("ip-10-0-1-2", "i-0env") and agent.nvidia_smi == str(fake_smi.path)
    assert callable(args.func)
    for bad in (["--interval", "0"], ["--interval", "soon"], ["--port", "70000"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["agent", *bad])
    with pytest.raises(ValueError, match="--hostname"):
        build_agent(parser.parse_args(["agent", "--hostname", " "]))


# --------------------------------------------------------------------------- end to end


def _wait_for_samples(prom_url: str, query: str, n: int, timeout_s: float = 30) -> None:
    import json
    from urllib.parse import quote
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{prom_url}/api/v1/query?query={quote(query)}", timeout=5) as resp:
            result = json.load(resp)["data"]["result"]
        if result and all(float(r["value"][1]) >= n for r in result):
            return
        time.sleep(0.5)
    raise AssertionError(f"prometheus did not collect {n} samples for {query} in {timeout_s}s")


def test_prometheus_scrapes_agents_and_the_collector_reads_them_unchanged(tmp_path, serve, fake_smi):
    (tmp_path / "mig").mkdir()
    mig_smi = FakeNvidiaSmi(tmp_path / "mig")
    mig_smi.answer(MIG_LOAD)
    h100 = serve(HostIdentity("ip-10-0-1-2.ec2.internal"), sample=True, interval_s=0.5)
    mig = start(Agent(HostIdentity("ip-10-0-1-3"), nvidia_smi=str(mig_smi.path), interval_s=0.5),
                "127.0.0.1", 0)
    prom = None
    try:
        prom = start_scraping_prometheus(tmp_path / "prom", [f"127.0.0.1:{h100.port}", f"127.0.0.1:{mig.port}"])
        _wait_for_samples(prom.url, "count_over_time(DCGM_FI_DEV_FB_USED[1m])", 4)
        instances = [
            GpuInstance("i-0h100", "p5.48xlarge", "us-east-1", "running", datetime(2026, 1, 1, tzinfo=timezone.utc),
                        private_dns="ip-10-0-1-2.ec2.internal"),
            # Matched by the short host name, as an EC2 host often names itself.
            GpuInstance("i-0mig", "p5.48xlarge", "us-east-1", "running", datetime(2026, 1, 1, tzinfo=timezone.utc),
                        private_dns="ip-10-0-1-3.ec2.internal"),
        ]
        source = PrometheusMetrics(PrometheusSettings(url=prom.url, scrape_interval_s=1, timeout_s=10))
        usage = source.window_usage(instances, window_s=60, now=datetime.now(timezone.utc))
    finally:
        if prom is not None:
            prom.stop()
        mig.close()
    h, = usage["i-0h100"].gpus
    assert usage["i-0h100"].error is None and usage["i-0h100"].expected_samples == 60
    assert h.gpu == "0" and h.model_name == "NVIDIA H100 80GB HBM3"
    assert h.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert h.samples >= 4 and h.activity_signal == "DCGM_FI_DEV_GPU_UTIL"
    assert (h.activity_min, h.activity_mean, h.activity_max) == (100.0, 100.0, 100.0)
    assert h.fb_used_max_mib == 19818.0 and h.power_mean_w == pytest.approx(631.95)
    # The MIG-enabled GPU: memory and power measured, activity not: no data, never 0 %.
    m, = usage["i-0mig"].gpus
    assert m.samples == 0 and m.activity_mean is None and m.activity_max is None
    assert m.fb_used_max_mib == 11125.0 and m.power_mean_w == pytest.approx(433.78)
