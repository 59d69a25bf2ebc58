"""The scheduled service: jobs keep running after a failure, /metrics, liveness and readiness with the
source that failed, one leader among several `serve` processes, clean SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.config import load_settings
from gpufinops.model import GpuInstance, GpuWindowStats, InstanceUsage
from gpufinops.run.pipeline import SOURCES, Peers
from gpufinops.run.service import Service, make_http_server
from gpufinops.demo.sim import ConsoleNotifier, SimCloud
from gpufinops.store.store import Store

REPO = Path(__file__).resolve().parents[2]


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


def serve_http(service, settings):
    http = make_http_server(settings, service.metrics, service.live, service.ready)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    return http, f"http://127.0.0.1:{http.server_address[1]}"


def get(url):
    """(status, body) of a GET, 503 included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(base):
    """/metrics as {(name, labels as a sorted tuple): value}, read by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    _, text = get(f"{base}/metrics")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_liveness_and_readiness_endpoints(tmp_path):
    service, settings = make_service(tmp_path, [str(REPO / "rules")])
    report = service.evaluate_job()
    assert report.decisions
    http, base = serve_http(service, settings)
    try:
        body = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert "gpufinops_evaluations_total 1.0" in body
        assert 'gpufinops_instances_by_verdict{verdict="IDLE"}' in body
        assert "gpufinops_last_success_timestamp_seconds" in body
        m = samples(base)
        assert m[("gpufinops_leader", ())] == 1 and m[("gpufinops_lease_token", ())] == 1
        assert all(m[("gpufinops_source_up", (("source", s),))] == 1 for s in SOURCES)
        for path in ("/livez", "/healthz", "/readyz"):
            status, text = get(base + path)
            assert status == 200, (path, text)
        assert get(f"{base}/healthz")[1].startswith("ok")
        assert get(f"{base}/readyz")[1].startswith("ready; leader (lease token 1)")
        service._last_tick_end = datetime.now(timezone.utc) - timedelta(hours=1)  # wedged: not live
        assert get(f"{base}/healthz")[0] == 503
        assert get(f"{base}/livez")[0] == 503
        assert get(f"{base}/readyz")[0] == 503
    finally:
        http.shutdown()


def test_prometheus_down_is_visible_within_one_tick_and_clears_when_it_answers(tmp_path, prometheus_factory):
    from gpufinops.collect.prometheus import PrometheusMetrics

    service, settings = make_service(tmp_path, [str(REPO / "rules")])
    down = f"http://127.0.0.1:{free_port()}"  # nobody listens there: connection refused
    service.peers.metrics = PrometheusMetrics(settings.prometheus.model_copy(update={"url": down, "timeout_s": 1}))
    http, base = serve_http(service, settings)
    try:
        report = service.evaluate_job()
        assert report.errors == []  # Prometheus errors are UNKNOWN decisions, not run errors...
        assert report.degraded().keys() == {"prometheus"}  # ...but the tick says which source failed
        status, text = get(f"{base}/readyz")
        assert status == 503, text
        assert "prometheus: degraded since" in text and "cannot connect" in text
        assert get(f"{base}/livez")[0] == 200  # a restart would not bring Prometheus back
        m = samples(base)
        assert m[("gpufinops_source_up", (("source", "prometheus"),))] == 0
        assert m[("gpufinops_source_up", (("source", "inventory"),))] == 1
        assert m[("gpufinops_source_errors_total", (("source", "prometheus"),))] == 1
        assert m[("gpufinops_source_errors_total", (("source", "slack"),))] == 0
        assert m[("gpufinops_evaluation_errors_total", ())] == 1
        since = text.split("degraded since ")[1].split(":")[0]
        service.evaluate_job()  # still down: same outage, same start
        assert f"degraded since {since}" in get(f"{base}/readyz")[1]
        assert samples(base)[("gpufinops_source_errors_total", (("source", "prometheus"),))] == 2

        prom = prometheus_factory([])  # Prometheus answers again (no series: NO_SERIES, not a failure)
        service.peers.metrics = PrometheusMetrics(settings.prometheus.model_copy(update={"url": prom.url}))
        service.evaluate_job()
        status, text = get(f"{base}/readyz")
        assert status == 200, text
        m = samples(base)
        assert m[("gpufinops_source_up", (("source", "prometheus"),))] == 1
        assert m[("gpufinops_evaluation_errors_total", ())] == 2
    finally:
        http.shutdown()


def test_failed_slack_delivery_makes_the_service_not_ready(tmp_path):
    service, settings = make_service(tmp_path, [str(REPO / "rules")])
    at = datetime.now(timezone.utc)
    service.peers.store.record_notification("k1", "#c", "warning", "failed", at, detail="HTTP 500")
    report = service.evaluate_job()
    assert report.degraded().keys() == {"slack"}
    ok, text = service.ready()
    assert not ok and "slack: degraded since" in text and "1 notification(s) not delivered" in text


def test_the_tick_log_counts_only_what_changed_something(tmp_path, caplog):
    """A protected idle instance is skipped every tick: the log line must not say "1 actions" each minute."""
    import logging

    from gpufinops.model import TAG_PROTECT

    service, _settings = make_service(tmp_path, [str(REPO / "rules")])
    service.peers.cloud.get("i-1").tags[TAG_PROTECT] = "true"
    caplog.set_level(logging.INFO, logger="gpufinops.service")
    reports = [service.evaluate_job() for _ in range(2)]
    assert all(a.kind.value == "skip" for r in reports for a in r.actions) and reports[1].actions
    ticks = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run ")]
    assert len(ticks) == 2 and all(", 0 change(s)" in t and "actions" not in t for t in ticks), ticks


def test_a_standby_judges_read_only_and_skips_the_scheduled_jobs(tmp_path):
    leader, settings = make_service(tmp_path, [str(REPO / "rules")])
    standby = Service(settings, Peers(leader.peers.cloud, IdleMetrics(), Store(leader.peers.store.url),
                                      leader.peers.notifier))
    assert leader.evaluate_job().decisions
    def recorded():  # raw rows (a verdict change or heartbeat only) and the ticks the episodes counted
        store = leader.peers.store
        return len(store.decision_rows()), int(store.episode_frame()["ticks"].sum())

    before = recorded()
    report = standby.evaluate_job()
    assert report.decisions and report.actions == []  # judged, changed nothing
    assert recorded() == before  # the audit log holds each tick once
    assert standby.metrics.leader._value.get() == 0 and leader.metrics.leader._value.get() == 1
    # Fleet series from the leader only: Prometheus scrapes both, and a standby's copy would double every sum.
    assert b"gpufinops_instance_verdict{" in leader.metrics.body()
    assert b"gpufinops_instance_verdict{" not in standby.metrics.body()
    assert b"gpufinops_hourly_cost_by_verdict{" not in standby.metrics.body()
    ran = []
    assert standby.leader_only("budgets", lambda: ran.append("standby"))() is None
    leader.leader_only("budgets", lambda: ran.append("leader"))()
    assert ran == ["leader"]
    assert standby.ready()[0]  # a standby that can read every source is ready
    assert "standby (read-only)" in standby.ready()[1]


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
    # An old run's intent: long enough ago that no request of it can still be in flight (act.reconcile waits).
    store.begin_action("old-run", "i-1", ActionKind.STOP, "r", False, "idle",
                       datetime.now(timezone.utc) - timedelta(minutes=10))
    real_describe = cloud.describe
    cloud.describe = lambda ids: (_ for _ in ()).throw(RuntimeError("region down"))
    assert service.evaluate_job() is None  # nothing judged or acted on with an unsettled stop intent
    assert store.decision_rows() == []
    cloud.describe = real_describe
    assert service.evaluate_job() is not None
    assert store.action_rows(status="pending") == []


def start_serve(tmp_path, name, db_url, aws):
    """A real `gpufinops serve` process: moto with no instances, a Prometheus nobody listens on, 1 s ticks,
    a 3 s lease. Returns (process, its /metrics base URL)."""
    port = free_port()
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(json.dumps({
        "database_url": db_url,
        "rules_paths": [str(REPO / "rules")],
        "prometheus": {"url": f"http://127.0.0.1:{free_port()}", "timeout_s": 1},
        "aws": {"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url},
        "slack": {"outbox_path": str(tmp_path / f"{name}-outbox.jsonl")},
        "schedule": {"evaluate_every_s": 1},
        "lease": {"ttl_s": 3},
        "service": {"host": "127.0.0.1", "port": port},
    }))
    env = dict(os.environ)
    env.pop("SLACK_BOT_TOKEN", None)
    log_file = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "gpufinops.cli", "--config", str(cfg), "serve"],
                            stdout=log_file, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    return proc, f"http://127.0.0.1:{port}"


def leader_gauge(base):
    try:
        return samples(base).get(("gpufinops_leader", ()))
    except OSError:
        return None


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_two_serve_processes_one_leader_and_the_standby_takes_over_after_kill_9(tmp_path, aws, request, backend):
    from gpufinops.act.lease import read_lease

    db_url = f"sqlite:///{tmp_path / 'shared.db'}" if backend == "sqlite" else request.getfixturevalue("fresh_postgres_db")
    procs = dict(a=start_serve(tmp_path, "a", db_url, aws), b=start_serve(tmp_path, "b", db_url, aws))
    try:
        # Both ticked at least once (the gauge is set by the first tick), exactly one leads.
        assert wait_for(lambda: all(leader_gauge(base) is not None for _, base in procs.values()), 30), \
            "\n".join((tmp_path / f"{n}.log").read_text() for n in procs)
        time.sleep(1.5)  # a second tick each: still one leader
        gauges = {n: leader_gauge(base) for n, (_, base) in procs.items()}
        assert sorted(gauges.values()) == [0, 1], gauges
        leader = next(n for n, g in gauges.items() if g == 1)
        standby = "b" if leader == "a" else "a"
        lease = read_lease(Store(db_url))
        assert lease.holder.split(":")[1] == str(procs[leader][0].pid)
        procs[leader][0].kill()  # kill -9: no release, the lease must expire
        procs[leader][0].wait(timeout=10)
        assert wait_for(lambda: leader_gauge(procs[standby][1]) == 1, 15), \
            (tmp_path / f"{standby}.log").read_text()
        after = read_lease(Store(db_url))
        assert after.token == lease.token + 1
        assert after.holder.split(":")[1] == str(procs[standby][0].pid)
        assert samples(procs[standby][1])[("gpufinops_lease_token", ())] == lease.token + 1
        log = (tmp_path / f"{standby}.log").read_text()
        assert f"became leader, token {lease.token + 1}" in log
        assert log.count("standby: the lease is held by") == 1  # said once, not every tick
        # The leader's first tick (the inventory) may outlast the 3 s TTL: the background renewal kept
        # the lease, so the standby led only after the kill.
        assert log.count("became leader") == 1
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
