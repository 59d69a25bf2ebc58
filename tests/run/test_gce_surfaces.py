"""GCE VMs on every surface an EC2 instance is on: `gpufinops evaluate -o json` (from a config with a `gcp:`
section, through run/compose), the service's /v1/verdicts and /metrics, and `audit -o json`, with the real
Prometheus and the GCE stand-in (tests/gcestub.py)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
import yaml

from gpufinops.cli import main
from gpufinops.run.service import Service, make_http_server
from tests.run.test_fleet_api import get_json
from tests.run.test_gce_e2e import TOKEN, GceFleet
from tests.run.test_service import free_port, samples

pytestmark = pytest.mark.integration

IDLE = "gce:ml-prod/us-central1-a/idle"
MIG = "gce:ml-prod/us-east4-b/mig-7x2k"


def test_evaluate_json_and_audit_show_gce_vms(gce, prometheus_factory, slack_stub, tmp_path, monkeypatch, capsys):
    f = GceFleet(gce, prometheus_factory, slack_stub, tmp_path, monkeypatch)
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(yaml.safe_dump({
        "prometheus": {"url": f.prom.url, "scrape_interval_s": 30},
        "gcp": {"projects": ["ml-prod"], "api_endpoint": gce.url},
        "rules_paths": list(f.settings.rules_paths), "database_url": "sqlite:///cli.db"}))
    assert main(["--config", str(cfg), "evaluate", "--once", "--dry-run", "-o", "json"]) in (0, None)
    data = json.loads(capsys.readouterr().out)
    rows = {r["instance_id"]: r for r in data["decisions"]}
    assert set(rows) == {IDLE, MIG, "gce:ml-prod/us-central1-b/busy"}
    assert rows[IDLE]["verdict"] == "IDLE" and rows[IDLE]["instance_type"] == "g2-standard-8"
    assert all(r.authorization == f"Bearer {TOKEN}" for r in gce.requests)
    f.tick(20)  # the service's tick marks the idle VM: its audit row names it by its gce: id
    assert main(["audit", "--db", str(tmp_path / "gpufinops.db"), "-o", "json"]) in (0, None)
    audit = json.loads(capsys.readouterr().out)
    assert any(row.get("instance_id") == IDLE and row.get("what") == "mark" for row in audit), audit


def test_verdicts_api_and_metrics_show_gce_vms(gce, prometheus_factory, slack_stub, tmp_path, monkeypatch):
    f = GceFleet(gce, prometheus_factory, slack_stub, tmp_path, monkeypatch)
    settings = f.settings.model_copy(update={"service": f.settings.service.model_copy(
        update={"host": "127.0.0.1", "port": free_port()})})
    service = Service(settings, f.peers, clock=lambda: f.t0 + timedelta(minutes=20))
    http = make_http_server(settings, service.metrics, service.live, service.ready, verdicts=service.verdict_api.handle)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{http.server_address[1]}"
    try:
        service.evaluate_job()
        status, body = get_json(f"{base}/v1/verdicts?instance={IDLE}&host=mig-7x2k.us-east4-b.c.ml-prod.internal")
        m = samples(base)
    finally:
        http.shutdown()
    assert status == 200
    got = {e["instance_id"]: e for e in body["instances"]}
    assert got[IDLE]["verdict"] == "IDLE" and got[IDLE]["team"] == "ml" and got[IDLE]["gpu_count"] == 1
    assert got[IDLE]["stop"]["pending"] is True
    assert got[MIG]["verdict"] == "IDLE" and got[MIG]["stop"]["pending"] is False
    verdicts = {dict(k[1])["instance_id"]: dict(k[1]) for k in m if k[0] == "gpufinops_instance_verdict"}
    assert verdicts[IDLE]["verdict"] == "IDLE" and verdicts[IDLE]["gpu_model"] == "L4"
