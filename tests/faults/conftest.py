"""Fixtures of the fault matrix: one Prometheus for the folder, a world per case (tests/faults/harness.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.faults.harness import LEAD_S, WINDOW_S, World, profile_series, write_rules
from tests.promserver import binaries_missing, start_prometheus


@pytest.fixture(scope="session")
def fault_prometheus(tmp_path_factory):
    """One real Prometheus holding every DCGM profile from 2 hours ago to 2 hours ahead."""
    missing = binaries_missing()
    if missing:
        pytest.skip(missing)
    now = time.time()
    server = start_prometheus(tmp_path_factory.mktemp("faults-prometheus"), profile_series(now - 7200, now + 7200))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fault_rules(tmp_path_factory):
    return write_rules(tmp_path_factory.mktemp("faults-rules"), window_s=WINDOW_S, lead_s=LEAD_S)


@pytest.fixture
def world(aws, fault_prometheus, fault_rules, slack_stub, tmp_path, monkeypatch, caplog):
    """make(fleet=..., token=...) -> World; proxies stopped and faults healed at teardown."""
    made: list[World] = []

    def make(**kwargs) -> World:
        kwargs.setdefault("rules_dir", fault_rules)
        w = World(aws=aws, prom_url=fault_prometheus.url, slack_stub=slack_stub, tmp_path=tmp_path,
                  monkeypatch=monkeypatch, caplog=caplog, **kwargs)
        made.append(w)
        return w

    yield make
    for w in made:
        w.heal()
        w.stop_proxies()


def start_moto_process(log_path: Path) -> tuple[subprocess.Popen, str]:
    """`moto_server` on a free 127.0.0.1 port, in a process of its own; waits until it answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"moto_server did not start: {log_path.read_text(errors='replace')[-2000:]}")


@pytest.fixture(scope="session", autouse=True)
def serve_scenarios(request, tmp_path_factory):
    """The process scenarios, started once in the background when the session starts, only when a
    test of test_process.py was collected: each waits at least a 60 s warning lead, so they overlap
    with each other and with the in-process matrix. {name: (ServeWorld, thread)}."""
    wanted = [item for item in request.session.items if item.fspath.basename == "test_process.py"]
    if not wanted or binaries_missing():
        yield {}
        return
    from tests.faults.serveworld import (
        SERVE_LEAD_S,
        SERVE_WINDOW_S,
        ServeWorld,
        start_scenario,
    )
    from tests.faults.test_process import SCENARIOS
    from tests.motoserver import AwsTestEnv
    from tests.slackstub import SlackStub

    prom = request.getfixturevalue("fault_prometheus")
    rules = write_rules(tmp_path_factory.mktemp("serve-rules"), window_s=SERVE_WINDOW_S, lead_s=SERVE_LEAD_S)
    # A moto of its own, in its own process: ThreadedMotoServers in one process share their state, and
    # the in-process cases reset theirs between cases.
    moto, url = start_moto_process(tmp_path_factory.mktemp("serve-moto") / "moto.log")
    aws = AwsTestEnv(url)
    started: dict = {}
    stubs = []
    regions = ["us-west-2", "eu-west-1", "eu-central-1", "ap-southeast-2", "ca-central-1", "sa-east-1"]
    try:
        for (name, (body, _signals)), region in zip(SCENARIOS.items(), regions):
            stub = SlackStub()
            stub.start()
            stubs.append(stub)
            world = ServeWorld(name=name, aws=aws, region=region, prom_url=prom.url, stub=stub,
                               folder=tmp_path_factory.mktemp(f"serve-{name}"), rules_dir=rules)
            started[name] = (world, start_scenario(world, body))
        yield started
    finally:
        for world, thread in started.values():
            world.close()
        for stub in stubs:
            stub.stop()
        moto.terminate()
        moto.wait(timeout=10)
