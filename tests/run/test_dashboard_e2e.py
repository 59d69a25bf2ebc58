"""End to end (issue 27): a real `gpufinops serve` (moto EC2, a CUR file and a budget) judged from a real
Prometheus that scrapes a DCGM-shaped exporter (dcgm-exporter's metric names and labels) and the service's
/metrics. Then:

- every panel query of deploy/grafana/gpufinops-dashboard.json, with its template variables replaced by values
  Prometheus itself lists (as Grafana resolves them), parses and returns data through the HTTP API;
- GET /v1/verdicts, with a bearer token, gives per rule what `gpufinops evaluate -o json` gives.

Two replicas run, as docs/deploy.md's high-availability recipe has it, and Prometheus scrapes both: the fleet
panels add up to the fleet once (the standby exports no fleet series), never twice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpufinops.model import ActionKind
from gpufinops.store.store import Store
from tests.promserver import dcgm_labels, start_scraping_prometheus
from tests.run.test_service import free_port, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "gpufinops-dashboard.json"
STEP = 1  # Prometheus' scrape interval (prometheus.scrape_interval_s)
TOKEN = "e2e-api-token-7f3a"
RULE = """rules:
  - name: idle-20s
    description: Every GPU under 10% for 20 seconds (a test window).
    threshold_pct: 10
    window: 20s
    aggregation: stays_below
    min_coverage: 0.5
    warning_lead: 1m
    action: stop
"""


def dcgm_text(labels, util):
    """One GPU as dcgm-exporter writes it (Prometheus adds job and instance at scrape time)."""
    text = ",".join(f'{k}="{v}"' for k, v in labels.items() if k not in ("job", "instance"))
    return "".join(f"{name}{{{text}}} {value}\n" for name, value in
                   (("DCGM_FI_DEV_GPU_UTIL", util), ("DCGM_FI_DEV_FB_USED", 500), ("DCGM_FI_DEV_POWER_USAGE", 20.0)))


def dcgm_exporter(body: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    out = []
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    return out


def prom(url, path, **params):
    q = urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(f"{url}{path}?{q}", timeout=10) as r:
        return json.loads(r.read())


def api(base, query, token=TOKEN):
    req = urllib.request.Request(f"{base}/v1/verdicts?{query}",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _answers(base):
    try:
        urllib.request.urlopen(f"{base}/metrics", timeout=2).read()
        return True
    except OSError:
        return False


def test_every_dashboard_panel_returns_data_and_the_api_matches_evaluate(tmp_path, aws):
    from gpufinops.collect.billing.synth import line, write_cur_rows

    now = datetime.now(timezone.utc)
    idle = aws.launch("g5.xlarge", tags={"team": "ml", "gpufinops:allow-stop": "true"})[0]
    busy = aws.launch("g5.xlarge", tags={"team": "research"})[0]
    nodata = aws.launch("g5.xlarge", tags={"team": "ml"})[0]
    stopped = aws.launch("g5.xlarge", tags={"team": "ml", "gpufinops:stopped-by": "gpufinops"})[0]
    ec2 = aws.client("ec2")
    ec2.stop_instances(InstanceIds=[stopped])
    info = {i["InstanceId"]: i for r in ec2.describe_instances(InstanceIds=[idle, busy])["Reservations"]
            for i in r["Instances"]}
    exporter = dcgm_exporter(
        dcgm_text(dcgm_labels(info[idle]["PrivateDnsName"], 0, instance_id=idle, model="NVIDIA A10G"), 0)
        + dcgm_text(dcgm_labels(info[busy]["PrivateDnsName"], 0, instance_id=busy, model="NVIDIA A10G"), 90))

    # This month's bill and a budget for team ml; a stop earlier this month in the audit log.
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    cur = write_cur_rows(tmp_path / "cur.parquet", [
        line(month.replace(tzinfo=None) + timedelta(hours=k), "g5.xlarge", resource=idle, cost=1.006,
             tags={"user_team": "ml"}) for k in range(3)])
    (tmp_path / "budgets.yaml").write_text(
        "budgets:\n  - name: ml-gpu\n    scope: {kind: team, value: ml}\n    amount: 100\n")
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    store = Store(db_url)
    aid = store.begin_action("earlier", stopped, ActionKind.STOP, "idle-20s", False, "idle", now - timedelta(minutes=5))
    store.finish_action(aid, True, now - timedelta(minutes=5))
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "idle.yaml").write_text(RULE)

    port, standby_port = free_port(), free_port()
    server = start_scraping_prometheus(tmp_path / "prom", [f"127.0.0.1:{port}", f"127.0.0.1:{standby_port}",
                                                           f"127.0.0.1:{exporter.server_address[1]}"], STEP)
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(json.dumps({
        "database_url": db_url,
        "rules_paths": [str(tmp_path / "rules")],
        "prometheus": {"url": server.url, "timeout_s": 5, "scrape_interval_s": STEP},
        "aws": {"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url},
        "slack": {"outbox_path": str(tmp_path / "outbox.jsonl")},
        "schedule": {"evaluate_every_s": 2, "budget_check_every_s": 2},
        "service": {"host": "127.0.0.1", "port": port},
        "billing": {"source": "cur", "path": str(cur), "budgets_path": str(tmp_path / "budgets.yaml")},
    }))
    env = {k: v for k, v in os.environ.items() if k != "SLACK_BOT_TOKEN"}
    env["GPUFINOPS_API_TOKEN"] = TOKEN
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "gpufinops.cli", "--config", str(cfg), "serve"],
                                stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    replica = None
    try:
        # The second replica, started once the first leads: the same config but for its port.
        assert wait_for(lambda: b"gpufinops_leader 1.0" in urllib.request.urlopen(f"{base}/metrics").read()
                        if _answers(base) else False, 90), log_path.read_text()[-3000:]
        cfg2 = tmp_path / "gpufinops-2.yaml"
        cfg2.write_text(cfg.read_text().replace(f'"port": {port}', f'"port": {standby_port}'))
        with (tmp_path / "serve-2.log").open("w") as log_file:
            replica = subprocess.Popen([sys.executable, "-m", "gpufinops.cli", "--config", str(cfg2), "serve"],
                                       stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO)

        def judged_idle():
            try:
                status, body = api(base, f"instance={idle}")
            except OSError:
                return False
            return status == 200 and body["instances"][0]["verdict"] == "IDLE"
        assert wait_for(judged_idle, 90), log_path.read_text()[-3000:]

        # The token: refused without it or with a wrong one.
        assert api(base, f"instance={idle}", token=None)[0] == 401
        assert api(base, f"instance={idle}", token="nope")[0] == 401

        # The API against `evaluate -o json` (same config, same data): the same verdict and code per rule.
        out = subprocess.run([sys.executable, "-m", "gpufinops.cli", "--config", str(cfg), "evaluate", "-o", "json"],
                             capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
        evaluated = {(d["instance_id"], d["rule"]): d for d in json.loads(out.stdout)["decisions"]}
        status, body = api(base, "&".join(f"instance={i}" for i in (idle, busy, nodata)))
        assert status == 200
        got = {e["instance_id"]: e for e in body["instances"]}
        for iid in (idle, busy, nodata):
            assert got[iid]["rules"], got[iid]
            for r in got[iid]["rules"]:
                d = evaluated[(iid, r["rule"])]
                assert (r["verdict"], r["code"]) == (d["verdict"], d["code"]), (iid, r, d)
        assert [got[i]["verdict"] for i in (idle, busy, nodata)] == ["IDLE", "ACTIVE", "UNKNOWN"]
        assert TOKEN not in log_path.read_text()

        # Prometheus scraped the fleet figures, the budget and the month's figures.
        missing = []

        def scraped():
            names = ("gpufinops_instance_verdict", "gpufinops_budget_spent_percent", "gpufinops_idle_cost_month_to_date",
                     "gpufinops_stops_month_to_date", "gpufinops_stopped_hourly_cost")
            missing[:] = [n for n in names
                          if not prom(server.url, "/api/v1/query", query=n)["data"]["result"]]
            return not missing
        assert wait_for(scraped, 60), (missing, urllib.request.urlopen(f"{base}/metrics").read().decode()[-4000:])

        # Grafana's variables, resolved as Grafana does (label values of the series they name).
        dashboard = json.loads(DASHBOARD.read_text())
        teams = prom(server.url, "/api/v1/label/team/values", **{"match[]": "gpufinops_instance_verdict"})["data"]
        ids = prom(server.url, "/api/v1/label/instance_id/values",
                   **{"match[]": 'gpufinops_instance_verdict{team=~".*"}'})["data"]
        assert "ml" in teams and idle in ids
        variables = {v["name"] for v in dashboard["templating"]["list"]}
        assert variables == {"datasource", "team", "instance_id"}
        values = {"team": "|".join(teams), "instance_id": idle}
        queries = panel_queries(dashboard)
        assert len(queries) >= 15
        for title, expr in queries:
            used = set(re.findall(r"\$\{?(\w+)", expr))
            assert used <= set(values), (title, used)
            q = re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)
            answer = prom(server.url, "/api/v1/query", query=q)
            assert answer["status"] == "success", (title, q, answer)
            assert answer["data"]["result"], f"panel {title!r} has no data: {q}"
            ranged = prom(server.url, "/api/v1/query_range", query=q, start=time.time() - 60, end=time.time(),
                          step=5)
            assert ranged["status"] == "success" and ranged["data"]["result"], (title, q)
        # The idle figures are the idle instance's (priced from the catalog), and it has one verdict.
        verdict = prom(server.url, "/api/v1/query", query=f'gpufinops_instance_verdict{{instance_id="{idle}"}}')
        assert [r["metric"]["verdict"] for r in verdict["data"]["result"]] == ["IDLE"]

        # Both replicas scraped, the standby judging read-only: the fleet figures are the leader's alone, so the
        # panels read one idle g5.xlarge (1 GPU, its catalog price), not two.
        def both_scraped():
            up = prom(server.url, "/api/v1/query", query="gpufinops_leader")["data"]["result"]
            return sorted(r["value"][1] for r in up) == ["0", "1"]
        assert wait_for(both_scraped, 60), (tmp_path / "serve-2.log").read_text()[-3000:]
        standby_metrics = urllib.request.urlopen(f"http://127.0.0.1:{standby_port}/metrics").read().decode()
        assert "gpufinops_hourly_cost_by_verdict{" not in standby_metrics
        assert "gpufinops_instance_verdict{" not in standby_metrics
        time.sleep(3 * STEP)  # a few scrapes of both replicas
        idle_price = float(got[idle]["hourly_cost"])
        panels = dict(queries)
        idle_cost_q = next(q for t, q in queries if q.startswith("sum(gpufinops_hourly_cost_by_verdict"))
        idle_gpus_q = next(q for t, q in queries if q.startswith("sum(gpufinops_gpus_by_verdict"))
        for q, expected in ((idle_cost_q, idle_price), (idle_gpus_q, 1.0)):
            q = q.replace("$team", values["team"])
            (result,) = prom(server.url, "/api/v1/query", query=q)["data"]["result"]
            assert abs(float(result["value"][1]) - expected) < 1e-6, (q, result, panels)
        ids_seen = prom(server.url, "/api/v1/query", query=f'gpufinops_instance_verdict{{instance_id="{idle}"}}')
        assert len(ids_seen["data"]["result"]) == 1  # one series, the leader's
    finally:
        if replica is not None:
            replica.send_signal(signal.SIGTERM)
            try:
                replica.wait(timeout=30)
            except subprocess.TimeoutExpired:
                replica.kill()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        server.stop()
        exporter.shutdown()
