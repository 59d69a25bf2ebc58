"""The service's fleet figures on /metrics and the idleness API (GET /v1/verdicts), through the service's real
HTTP server and a real HTTP client. The end-to-end version (a real `gpufinops serve`, a real Prometheus, the
Grafana panels, `evaluate -o json`) is tests/run/test_dashboard_e2e.py."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.cli.core import decision_row
from gpufinops.config import ConfigError, load_settings
from gpufinops.demo.sim import ConsoleNotifier, SimCloud
from gpufinops.model import GpuInstance, GpuWindowStats, InstanceUsage, RunContext
from gpufinops.rules import load_rules
from gpufinops.httpd import authorize
from gpufinops.run.api import MAX_INSTANCES_PER_QUERY
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.run.service import Service, make_http_server
from gpufinops.store.schema import MarkRow
from gpufinops.store.store import Store
from tests.run.test_service import free_port, samples

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 3, 10, 12, 0, tzinfo=timezone.utc)
TOKEN = "s3cret-api-token-0123"


class FleetMetrics:
    """Idle GPUs for i-idle*, a busy one for i-busy, nothing at all for i-nodata."""

    def window_usage(self, instances, window_s, now):
        n = window_s // 30
        out = {}
        for i in instances:
            if i.instance_id.startswith("i-idle"):
                gpus = tuple(GpuWindowStats(str(g), n, 0.0, 0.0) for g in range(i.gpu_count))
            elif i.instance_id == "i-busy":
                gpus = tuple(GpuWindowStats(str(g), n, 100.0, 90.0) for g in range(i.gpu_count))
            else:
                gpus = ()
            out[i.instance_id] = InstanceUsage(i.instance_id, window_s, n, gpus)
        return out


def fleet():
    old = T0 - timedelta(days=1)
    return [
        GpuInstance("i-idle1", "p4d.24xlarge", "us-east-1", "running", old, tags={"team": "ml"}, gpu_count=8,
                    gpu_model="A100", hourly_cost=32.77, private_dns="ip-10-0-0-1.ec2.internal", private_ip="10.0.0.1"),
        GpuInstance("i-idle2", "g5.xlarge", "us-east-1", "running", old, tags={"team": "ml"}, gpu_count=1,
                    gpu_model="A10G", hourly_cost=1.006),
        GpuInstance("i-busy", "g5.xlarge", "us-east-1", "running", old, tags={"team": "research"}, gpu_count=1,
                    gpu_model="A10G", hourly_cost=1.006),
        GpuInstance("i-nodata", "g5.xlarge", "us-east-1", "running", old, gpu_count=1, gpu_model="A10G"),
        GpuInstance("i-stopped", "g5.xlarge", "us-east-1", "stopped", old, tags={"team": "ml",
                    "gpufinops:stopped-by": "gpufinops"}, gpu_count=1, gpu_model="A10G", hourly_cost=1.006),
        GpuInstance("k8s:ml/Deployment/chat", "g5.xlarge", "us-east-1", "running", old,
                    tags={"team": "ml", "k8s:namespace": "ml"}, gpu_count=1, gpu_model="A10G", provider="kubernetes"),
    ]


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def make(tmp_path, **api):
    clock = Clock(T0)
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    settings = load_settings(rules_paths=[str(REPO / "rules")], schedule={"evaluate_every_s": 60},
                             service={"host": "127.0.0.1", "port": free_port()}, api=api or {})
    peers = Peers(SimCloud(fleet(), clock), FleetMetrics(), store, ConsoleNotifier(store, clock, lambda s: None))
    service = Service(settings, peers, clock=clock)
    http = make_http_server(settings, service.metrics, service.live, service.ready,
                            verdicts=service.verdict_api.handle)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    return service, clock, http, f"http://127.0.0.1:{http.server_address[1]}"


def get_json(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_fleet_metrics_count_each_instance_once_and_keep_labels_bounded(tmp_path):
    service, _clock, http, base = make(tmp_path)
    try:
        report = service.evaluate_job()
        m = samples(base)
    finally:
        http.shutdown()
    per_rule = report.verdict_counts()
    assert per_rule["IDLE"] == 4  # two idle instances x two rules: the old gauge said 4...
    assert m[("gpufinops_instances_by_verdict", (("verdict", "IDLE"),))] == 2  # ...two instances are idle
    assert m[("gpufinops_instances_by_verdict", (("verdict", "UNKNOWN"),))] == 2  # i-nodata and the workload
    assert m[("gpufinops_gpus_by_verdict", (("team", "ml"), ("verdict", "IDLE")))] == 9
    assert abs(m[("gpufinops_hourly_cost_by_verdict", (("team", "ml"), ("verdict", "IDLE")))] - 33.776) < 1e-9
    assert m[("gpufinops_unknown_instances", (("code", "no_series"),))] == 2
    key = (("gpu_model", "A100"), ("instance_id", "i-idle1"), ("instance_type", "p4d.24xlarge"), ("team", "ml"))
    assert m[("gpufinops_node_total_hourly_cost", key)] == 32.77 and m[("gpufinops_node_gpu_count", key)] == 8
    # Unpriced: a GPU count, no cost series (absent, not 0); no team tag: team "none".
    assert ("gpufinops_node_total_hourly_cost", (("gpu_model", "A10G"), ("instance_id", "i-nodata"),
                                                 ("instance_type", "g5.xlarge"), ("team", "none"))) not in m
    verdicts = {dict(k[1])["instance_id"]: dict(k[1]) for k in m if k[0] == "gpufinops_instance_verdict"}
    assert verdicts["i-idle1"]["verdict"] == "IDLE" and verdicts["i-busy"]["verdict"] == "ACTIVE"
    assert "i-stopped" not in verdicts  # not judged: no verdict series
    assert m[("gpufinops_stopped_hourly_cost", (("team", "ml"),))] == 1.006
    # Only these label names on the fleet series: no free-form tag value becomes a label.
    allowed = {"instance_id", "team", "gpu_model", "instance_type", "verdict", "rule", "code", "budget", "dry_run",
               "source"}
    fleet_names = {k[0] for k in m if k[0].startswith("gpufinops_") and k[1]}
    assert {name for k in m if k[0] in fleet_names for name, _ in k[1]} <= allowed
    assert m[("gpufinops_fleet_figures_timestamp_seconds", ())] == T0.timestamp()


def test_idle_cost_this_month_and_budgets_come_from_the_store_and_the_budget_job(tmp_path):
    from types import SimpleNamespace

    service, clock, http, base = make(tmp_path)
    try:
        service.evaluate_job()
        clock.now = T0 + timedelta(minutes=30)
        service.evaluate_job()  # 30 min of IDLE recorded for i-idle1 and i-idle2 (max gap 2 x 60 s: 1 min)
        statuses = [SimpleNamespace(budget="all-gpu", pct_actual=42.0, pct_forecast=97.5, error=None),
                    SimpleNamespace(budget="broken", pct_actual=0.0, pct_forecast=0.0, error="no data")]
        service.leader_only("budgets", lambda: statuses)()
        m = samples(base)
    finally:
        http.shutdown()
    # The rollups' idle time this month: a tick counts up to the next one, at most max_gap_s (2 x 60 s), so the
    # first tick counts 120 s; the latest tick (the tail) counts nothing yet at its own time.
    expected = (32.77 + 1.006) * 120 / 3600
    assert abs(m[("gpufinops_idle_cost_month_to_date", (("team", "ml"),))] - expected) < 1e-6
    assert m[("gpufinops_budget_spent_percent", (("budget", "all-gpu"),))] == 42.0
    assert m[("gpufinops_budget_forecast_percent", (("budget", "all-gpu"),))] == 97.5
    assert ("gpufinops_budget_spent_percent", (("budget", "broken"),)) not in m


def test_verdicts_api_answers_what_evaluate_says_at_the_same_tick(tmp_path):
    service, _clock, http, base = make(tmp_path)
    try:
        status, body = get_json(f"{base}/v1/verdicts?instance=i-idle1")
        assert status == 200 and body["instances"][0]["verdict"] == "UNKNOWN"  # no tick yet: never idle
        assert body["instances"][0]["code"] == "no_evaluation_yet"
        report = service.evaluate_job()
        service.peers.store.put_mark(MarkRow("i-idle1", "idle-2h", T0, T0 + timedelta(minutes=30), "idle", True, T0))
        status, body = get_json(f"{base}/v1/verdicts?instance=i-idle1&instance=i-nodata&host=10.0.0.1")
    finally:
        http.shutdown()
    assert status == 200
    got = {e["instance_id"]: e for e in body["instances"]}
    assert set(got) == {"i-idle1", "i-nodata"}  # host=10.0.0.1 is i-idle1: listed once
    # What `evaluate -o json` prints for the same instances at the same tick (its rows: cli.core.decision_row).
    settings, rules = service.settings, load_rules(service.settings.rules_paths)
    evaluated = run_once(RunContext(now=report.now, dry_run=True), settings, rules, service.peers, act=False,
                         record=False)
    rows = {(d.instance_id, d.rule_name): decision_row(d, None, None, report.now, True) for d in evaluated.decisions}
    for iid, entry in got.items():
        assert entry["rules"], entry
        for r in entry["rules"]:
            row = rows[(iid, r["rule"])]
            assert (r["verdict"], r["code"], r["reason"]) == (row["verdict"], row["code"], row["reason"])
            assert r["figures"]["activity_mean"] == row["activity_mean"]
    idle = got["i-idle1"]
    assert idle["verdict"] == "IDLE" and idle["rule"] in {r["rule"] for r in idle["rules"]}
    assert idle["stop"] == {"pending": True, "at": (T0 + timedelta(minutes=30)).isoformat(),
                            "warned_at": T0.isoformat(), "dry_run": True, "rule": "idle-2h",
                            "not_stopped": {"code": "not_opted_in", "reason": "not opted in: gpufinops stops only "
                                            "instances tagged gpufinops:allow-stop=true"}}
    assert idle["team"] == "ml" and idle["gpu_count"] == 8
    nodata = got["i-nodata"]
    assert nodata["verdict"] == "UNKNOWN" and nodata["code"] == "no_series" and nodata["stop"]["pending"] is False


def test_an_idle_instance_nothing_will_stop_says_why_not_just_pending_false(tmp_path):
    service, _clock, http, base = make(tmp_path)
    try:
        service.evaluate_job()
        _status, body = get_json(f"{base}/v1/verdicts?instance=i-idle2&instance=i-busy&instance=i-nodata")
    finally:
        http.shutdown()
    got = {e["instance_id"]: e for e in body["instances"]}
    assert got["i-idle2"]["verdict"] == "IDLE" and got["i-idle2"]["stop"]["pending"] is False
    assert got["i-idle2"]["stop"]["not_stopped"] == {
        "code": "not_opted_in", "reason": "not opted in: gpufinops stops only instances tagged gpufinops:allow-stop=true"}
    # Not idle, or not known: nothing to explain.
    assert got["i-busy"]["stop"]["not_stopped"] is None and got["i-nodata"]["stop"]["not_stopped"] is None


def test_without_a_parameter_the_fleet_is_listed_page_by_page(tmp_path, monkeypatch):
    import gpufinops.run.api as api

    monkeypatch.setattr(api, "MAX_INSTANCES_PER_QUERY", 4)
    service, _clock, http, base = make(tmp_path)
    try:
        service.evaluate_job()
        status, first = get_json(f"{base}/v1/verdicts")
        _status, second = get_json(f"{base}/v1/verdicts?page=2")
        beyond = get_json(f"{base}/v1/verdicts?page=3")
        mixed = get_json(f"{base}/v1/verdicts?page=2&instance=i-idle1")
        bad = get_json(f"{base}/v1/verdicts?page=0")
    finally:
        http.shutdown()
    assert status == 200 and (first["page"], first["pages"], first["total"]) == (1, 2, 6)
    listed = [e["instance_id"] for e in first["instances"] + second["instances"]]
    assert listed == sorted(i.instance_id for i in fleet()) and len(first["instances"]) == 4
    verdicts = {e["instance_id"]: e["verdict"] for e in first["instances"] + second["instances"]}
    assert verdicts["i-idle1"] == "IDLE" and verdicts["i-busy"] == "ACTIVE" and verdicts["i-stopped"] == "UNKNOWN"
    assert beyond == (400, {"error": "page 3 of 2: the fleet has 6 instance(s)"})
    assert mixed[0] == 400 and bad == (400, {"error": "page= is a page number from 1, got '0'"})


def test_unknown_instances_namespaces_and_a_stale_tick_are_never_idle(tmp_path):
    service, clock, http, base = make(tmp_path)
    try:
        service.evaluate_job()
        status, body = get_json(f"{base}/v1/verdicts?instance=i-gone&host=no-such-host")
        assert status == 200
        assert [(e["verdict"], e["code"]) for e in body["instances"]] == [("UNKNOWN", "not_evaluated")] * 2
        assert body["instances"][1]["host"] == "no-such-host"
        status, body = get_json(f"{base}/v1/verdicts?namespace=ml")
        assert [e["instance_id"] for e in body["instances"]] == ["k8s:ml/Deployment/chat"]
        assert body["instances"][0]["verdict"] == "UNKNOWN"  # the workload has no series
        status, body = get_json(f"{base}/v1/verdicts?instance=i-stopped")
        assert (body["instances"][0]["verdict"], body["instances"][0]["code"]) == ("UNKNOWN", "not_evaluated")
        assert get_json(f"{base}/v1/verdicts?instanc=i-idle1")[0] == 400
        clock.now = T0 + timedelta(minutes=10)  # no tick finished for 10 min (liveness limit 5 min)
        status, body = get_json(f"{base}/v1/verdicts?instance=i-idle1")
        assert (body["instances"][0]["verdict"], body["instances"][0]["code"]) == ("UNKNOWN", "stale")
    finally:
        http.shutdown()


def test_a_configured_token_is_required_and_never_logged(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("GPUFINOPS_API_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)
    service, _clock, http, base = make(tmp_path)
    try:
        service.evaluate_job()
        url = f"{base}/v1/verdicts?instance=i-idle1"
        assert get_json(url)[0] == 401
        assert get_json(url, token="wrong")[0] == 401
        assert get_json(url, token=TOKEN[:-1])[0] == 401
        req = urllib.request.Request(url, headers={"Authorization": f"Basic {TOKEN}"})
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("basic auth answered")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        status, body = get_json(url, token=TOKEN)
        assert status == 200 and body["instances"][0]["verdict"] == "IDLE"
    finally:
        http.shutdown()
    assert TOKEN not in caplog.text


def test_token_from_a_file_and_loopback_only_without_one(tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    service, _clock, http, base = make(tmp_path, bearer_token={"file": str(tmp_path / "token")})
    try:
        service.evaluate_job()
        assert get_json(f"{base}/v1/verdicts?instance=i-idle1")[0] == 401
        assert get_json(f"{base}/v1/verdicts?instance=i-idle1", token=TOKEN)[0] == 200
    finally:
        http.shutdown()
    # Without a token, the peer address decides (the socket's, never a forwarded header).
    assert authorize({}, "127.0.0.1", None) is None and authorize({}, "::1", None) is None
    assert authorize({"X-Forwarded-For": "127.0.0.1"}, "10.0.0.5", None).status == 403
    assert authorize({"Authorization": f"Bearer {TOKEN}"}, "10.0.0.5", TOKEN) is None


def get_with_header(url, authorization):
    req = urllib.request.Request(url, headers={"Authorization": authorization})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_blank_token_is_a_load_error_naming_the_key_never_an_open_api(tmp_path, monkeypatch):
    # An empty Kubernetes Secret key mounts as a file holding only a newline; an env var can be set to blanks.
    (tmp_path / "token").write_text("\n")
    config = tmp_path / "gpufinops.yaml"
    config.write_text(f"api:\n  bearer_token: {{file: {tmp_path / 'token'}}}\n")
    msg = str(pytest.raises(ConfigError, load_settings, config).value)
    assert f"{config}:2: key 'api.bearer_token': the file {tmp_path / 'token'} is blank" in msg
    monkeypatch.setenv("GPUFINOPS_API_TOKEN", " ")
    msg = str(pytest.raises(ConfigError, make, tmp_path).value)
    assert "key 'api.bearer_token': the environment variable GPUFINOPS_API_TOKEN is set but blank" in msg


def test_an_empty_bearer_never_authorises_even_when_the_token_turns_blank(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    service, _clock, http, base = make(tmp_path, bearer_token={"file": str(token_file)})
    try:
        service.evaluate_job()
        url = f"{base}/v1/verdicts?instance=i-idle1"
        for sent in ("Bearer ", "Bearer", "Bearer  \t", "bearer"):
            assert get_with_header(url, sent)[0] == 401, sent
        assert get_json(url, token=TOKEN)[0] == 200
        token_file.write_text("\n")  # the mounted Secret rotated to an empty key while the service runs
        for sent in ("Bearer ", "Bearer", f"Bearer {TOKEN}"):
            status, body = get_with_header(url, sent)
            assert status == 503 and "blank" in body["error"], sent
    finally:
        http.shutdown()
    assert authorize({"Authorization": "Bearer "}, "10.0.0.5", "").status == 503
    assert authorize({"Authorization": "Bearer "}, "127.0.0.1", " ").status == 503  # loopback too: it is broken


def test_ids_per_query_are_capped_unknown_ones_included(tmp_path):
    service, _clock, http, base = make(tmp_path)
    try:
        service.evaluate_job()
        ids = "&".join(f"instance=i-unknown{n:05d}" for n in range(MAX_INSTANCES_PER_QUERY + 1))
        status, body = get_json(f"{base}/v1/verdicts?{ids}")
        assert status == 400 and f"at most {MAX_INSTANCES_PER_QUERY}" in body["error"]
        mixed = "&".join([*(f"instance=i-unknown{n:05d}" for n in range(MAX_INSTANCES_PER_QUERY - 2)),
                          "host=no-such-host", "namespace=ml"])
        status, body = get_json(f"{base}/v1/verdicts?{mixed}")
        assert status == 200 and len(body["instances"]) == MAX_INSTANCES_PER_QUERY  # 498 ids, a host, a namespace
        status, body = get_json(f"{base}/v1/verdicts?{mixed}&host=another")
        assert status == 400
    finally:
        http.shutdown()
