"""The scheduled service: jobs keep running after a failure, /metrics and /healthz, clean SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.config import load_settings
from gpufinops.model import GpuInstance, GpuWindowStats, InstanceUsage
from gpufinops.pipeline import Peers
from gpufinops.service import Service, make_http_server
from gpufinops.sim import ConsoleNotifier, SimCloud
from gpufinops.store import Store

REPO = Path(__file__).resolve().parent.parent


class IdleMetrics:
    def window_usage(self, instances, window_s, now):
        return {i.instance_id: InstanceUsage(i.instance_id, window_s, 20, (GpuWindowStats("0", 20, 1.0, 0.5),))
                for i in instances}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def make_service(tmp_path, rules_paths):
    now = lambda: datetime.now(timezone.utc)  # noqa: E731
    inst = GpuInstance("i-1", "g5.xlarge", "us-east-1", "running", now() - timedelta(days=1), gpu_count=1)
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    settings = load_settings(schedule={"evaluate_every_s": 1}, rules_paths=rules_paths,
                             service={"host": "127.0.0.1", "port": free_port()})
    peers = Peers(SimCloud([inst], now), IdleMetrics(), store, ConsoleNotifier(store, now, lambda s: None))
    return Service(settings, peers), settings


def test_a_failing_job_is_logged_and_the_scheduler_keeps_running(tmp_path):
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    good = (REPO / "rules" / "idle-shutdown.yaml").read_text()
    (rules_dir / "r.yaml").write_text("rules: [this is: not valid")  # broken edit while running
    service, settings = make_service(tmp_path, [str(rules_dir)])
    service.start()
    try:
        assert wait_for(lambda: service.metrics.errors._value.get() >= 2)
        assert service.metrics.evaluations._value.get() == 0
        assert service.scheduler.running
        (rules_dir / "r.yaml").write_text(good)  # fixed: the next run succeeds without a restart
        assert wait_for(lambda: service.metrics.evaluations._value.get() >= 1)
        assert service.healthy()[0]
    finally:
        service.stop()
    assert not service.scheduler.running


def test_metrics_and_healthz_endpoints(tmp_path):
    service, settings = make_service(tmp_path, [str(REPO / "rules")])
    report = service.evaluate_job()
    assert report.decisions
    http = make_http_server(settings, service.metrics, service.healthy)
    import threading
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{http.server_address[1]}"
        body = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert "gpufinops_evaluations_total 1.0" in body
        assert 'gpufinops_instances_by_verdict{verdict="IDLE"}' in body
        assert "gpufinops_last_success_timestamp_seconds" in body
        health = urllib.request.urlopen(f"{base}/healthz", timeout=5)
        assert health.status == 200 and health.read().startswith(b"ok")
        service._last_ok = datetime.now(timezone.utc) - timedelta(hours=1)  # stale: unhealthy
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/healthz", timeout=5)
        assert e.value.code == 503
    finally:
        http.shutdown()


def test_serve_stops_cleanly_on_sigterm(tmp_path, aws):
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(json.dumps({
        "database_url": f"sqlite:///{tmp_path / 'db.sqlite'}",
        "rules_paths": [str(REPO / "rules")],
        "prometheus": {"url": f"http://127.0.0.1:{closed}", "timeout_s": 1},
        "aws": {"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url},
        "slack": {"outbox_path": str(tmp_path / "outbox.jsonl")},
        "schedule": {"evaluate_every_s": 2},
        "service": {"host": "127.0.0.1", "port": port},
    }))
    env = dict(os.environ)
    env.pop("SLACK_BOT_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "gpufinops.cli", "--config", str(cfg), "serve"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        def up():
            try:
                return b"gpufinops_evaluations_total 1.0" in urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=1).read()
            except OSError:
                return False
        assert wait_for(up, 30), "service did not finish a first evaluation"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "stopped cleanly" in out
    assert "xoxb" not in out


def test_reconcile_failure_at_start_blocks_acting_until_it_succeeds(tmp_path):
    from gpufinops.model import ActionKind

    service, _ = make_service(tmp_path, [str(REPO / "rules")])
    store, cloud = service.peers.store, service.peers.cloud
    store.begin_action("old-run", "i-1", ActionKind.STOP, "r", False, "idle", datetime.now(timezone.utc))
    real_describe = cloud.describe
    cloud.describe = lambda ids: (_ for _ in ()).throw(RuntimeError("region down"))
    assert service.evaluate_job() is None  # nothing judged or acted on with an unsettled stop intent
    assert store.decision_rows() == []
    cloud.describe = real_describe
    assert service.evaluate_job() is not None
    assert store.action_rows(status="pending") == []
