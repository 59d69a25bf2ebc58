"""End to end with real peers: Prometheus (backfilled DCGM series), moto EC2 server, Slack stub.

The fleet is launched in moto at real time T (EC2 sets launch_time then), the DCGM
history is backfilled around T, and the service is evaluated at T+20 min, T+36 min...
on an injected clock, so a 15-minute warning lead passes without waiting.
"""

from __future__ import annotations

import socket
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.places.ec2.cloud import Ec2Cloud
from gpufinops.collect.prometheus import PrometheusMetrics
from gpufinops.config import load_settings
from gpufinops.model import TAG_MARKED, TAG_PROTECT, TAG_SNOOZE, TAG_STOPPED_BY, ActionKind, RunContext, Verdict
from gpufinops.notify.delivery import build_notifier
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.rules import load_rules
from gpufinops.store.store import Store
from tests.promserver import Series, dcgm_labels

pytestmark = pytest.mark.integration

STEP = 30  # dcgm-exporter scrape interval


def pattern_series(labels, start, end, values):
    """GPU_UTIL / FB_USED series sampled every STEP seconds, cycling through `values`."""
    ts = list(range(int(start), int(end), STEP))
    return [(t, float(values[k % len(values)])) for k, t in enumerate(ts)]


def dcgm(labels, start, end, util, mem_mib):
    return [
        Series("DCGM_FI_DEV_GPU_UTIL", labels, pattern_series(labels, start, end, util)),
        Series("DCGM_FI_DEV_FB_USED", labels, pattern_series(labels, start, end, [mem_mib])),
        # An A10G (TDP 150 W) draws ~20 W at idle: low enough for the power witness to agree with a zero.
        Series("DCGM_FI_DEV_POWER_USAGE", labels, pattern_series(labels, start, end, [20.0])),
    ]


def describe(aws, ids):
    res = aws.client("ec2").describe_instances(InstanceIds=ids)
    return {i["InstanceId"]: i for r in res["Reservations"] for i in r["Instances"]}


class Fleet:
    def __init__(self, aws, prometheus_factory, slack_stub, tmp_path, monkeypatch, *, dry_run=False,
                 max_stops=5, prom_url=None, idle_count=1, prom_timeout=10.0):
        self.aws = aws
        self.t0 = datetime.now(timezone.utc).replace(microsecond=0)
        ids = {}
        # Opted in (act.opt_in_tag, the tag the IAM policy names): the only ones gpufinops may stop.
        ids["idle"] = aws.launch("g5.xlarge", tags={"team": "ml", "owner": "ana", "gpufinops:allow-stop": "true"},
                                 count=idle_count)
        ids["train"] = aws.launch("g6e.xlarge", tags={"team": "research", "workload": "training"})
        ids["nodata"] = aws.launch("g5.xlarge", tags={"team": "ml"})
        ids["protected"] = aws.launch("g5.xlarge", tags={"team": "ml", TAG_PROTECT: "true"})
        ids["snoozed"] = aws.launch("g5.xlarge", tags={
            "team": "ml", TAG_SNOOZE: (self.t0 + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")})
        ids["p4d"] = aws.launch("p4d.24xlarge", tags={"team": "llm", "gpufinops:allow-stop": "true"})
        self.ids = ids
        info = describe(aws, [i for v in ids.values() for i in v])
        start, end = self.t0.timestamp() - 3600, self.t0.timestamp() + 3 * 3600
        series = []
        for iid in ids["idle"] + ids["protected"] + ids["snoozed"]:
            # matched by the instance_id label (ec2_sd relabelling)
            series += dcgm(dcgm_labels(info[iid]["PrivateDnsName"], 0, instance_id=iid, model="NVIDIA A10G"),
                           start, end, [0, 2, 1, 0], 20_000)
        # input-bound trainer: 100% bursts between 30-second gaps, mean ~35%; matched by new-style `hostname`
        train = ids["train"][0]
        series += dcgm(dcgm_labels(info[train]["PrivateDnsName"], 0, hostname_label="hostname", model="NVIDIA L40S"),
                       start, end, [100, 5, 0], 30_000)
        # 8-GPU p4d, every GPU idle while holding 38 GB of its 40 GB (A100 40GB); matched by the old-style `Hostname`
        p4d = ids["p4d"][0]
        for g in range(8):
            series += dcgm(dcgm_labels(info[p4d]["PrivateDnsName"], g), start, end, [0], 38 * 1024)
        self.prom = prometheus_factory(series)
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
        self.settings = load_settings(
            prometheus={"url": prom_url or self.prom.url, "scrape_interval_s": STEP, "timeout_s": prom_timeout},
            aws={"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url},
            slack={"base_url": slack_stub.base_url, "default_channel": "#gpu-finops", "max_retries": 2},
            act={"dry_run": dry_run, "max_stops_per_run": max_stops, "max_stops_fraction": 1.0},
            database_url=f"sqlite:///{tmp_path / 'gpufinops.db'}",
            # The common 40%/10 min rule: its short window fits these 4-hour series (the shipped one is 2 h).
            rules_paths=[str(COMMON_RULES / "examples" / "common-40pct-10min.yaml"),
                         str(COMMON_RULES / "zero-activity.yaml")],
        )
        self.rules = load_rules(self.settings.rules_paths)
        self.restart()

    def restart(self):
        """New process: new peers and store objects over the same database file."""
        self.store = Store(self.settings.database_url)
        self.now = self.t0
        self.peers = Peers(
            Ec2Cloud(self.settings.aws, spot_prices=False),
            PrometheusMetrics(self.settings.prometheus),
            self.store,
            build_notifier(self.settings.slack, self.store, lambda: self.now),
        )

    def tick(self, minutes_after_t0: float):
        self.now = self.t0 + timedelta(minutes=minutes_after_t0)
        ctx = RunContext(now=self.now, dry_run=self.settings.act.dry_run)
        return run_once(ctx, self.settings, self.rules, self.peers)

    def state(self, key):
        return self.aws.state(self.ids[key][0])


COMMON_RULES = Path(__file__).resolve().parents[2] / "rules"


def verdicts(report, rule="gpu-util-below-40pct-10m"):
    return {d.instance_id: d for d in report.decisions if d.rule_name == rule}


def test_idle_is_warned_then_stopped_and_nothing_else_is(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch):
    f = Fleet(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch)
    idle, train, nodata, p4d = f.ids["idle"][0], f.ids["train"][0], f.ids["nodata"][0], f.ids["p4d"][0]

    r1 = f.tick(20)
    v = verdicts(r1)
    assert v[idle].verdict == Verdict.IDLE
    assert v[p4d].verdict == Verdict.IDLE and "holds 38 GB" in v[p4d].reason
    assert v[train].verdict == Verdict.UNDERUTILIZED and "bursts to 100%" in v[train].reason
    assert v[nodata].verdict == Verdict.UNKNOWN
    marked = {a.instance_id for a in r1.actions if a.kind == ActionKind.MARK}
    assert marked == {idle, p4d}
    assert TAG_MARKED in aws.tags(idle) and TAG_MARKED not in aws.tags(train)
    warnings = [b for b in slack_stub.posted() if "will be stopped" in b["text"]]
    assert {w["text"].split()[3] for w in warnings} == {idle, p4d}
    assert all(w["channel"] == "#gpu-finops" and w.get("blocks") for w in warnings)

    f.tick(21)  # same state a minute later: no new message
    n_posts = len(slack_stub.posted())

    f.restart()  # the service restarts mid-way
    r3 = f.tick(36)  # past the 15-minute lead
    stopped = {a.instance_id for a in r3.actions if a.kind == ActionKind.STOP and a.ok}
    assert stopped == {idle, p4d}
    assert aws.state(idle) in ("stopping", "stopped") and aws.state(p4d) in ("stopping", "stopped")
    assert aws.tags(idle)[TAG_STOPPED_BY] == "gpufinops" and TAG_MARKED not in aws.tags(idle)
    for key in ("train", "nodata", "protected", "snoozed"):
        assert f.state(key) == "running", key

    f.restart()
    f.tick(37)
    f.tick(38)
    posts = slack_stub.posted()
    stop_msgs = [b for b in posts if b["text"].startswith("Stopped")]
    assert len(stop_msgs) == 2
    # exactly one "metrics unavailable" alert (for the instance with no series), across restarts
    assert sum("No usable GPU metrics" in b["text"] for b in posts) == 1
    assert len(posts) == n_posts + 2
    assert len(f.store.action_rows(kinds=[ActionKind.STOP])) == 2


def test_dry_run_stops_nothing_and_says_what_it_would_do(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch):
    f = Fleet(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch, dry_run=True)
    f.tick(20)
    r = f.tick(36)
    would = [a for a in r.actions if a.kind == ActionKind.STOP]
    assert {a.instance_id for a in would} == {f.ids["idle"][0], f.ids["p4d"][0]}
    assert all(a.dry_run and a.reason.startswith("dry-run: would stop") for a in would)
    for key in f.ids:
        assert f.state(key) == "running"
        assert TAG_MARKED not in aws.tags(f.ids[key][0])
    assert any("NOT stopped" in b["text"] for b in slack_stub.posted())


def test_stop_cap_holds(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch):
    f = Fleet(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch, max_stops=2, idle_count=4)
    f.tick(20)
    r = f.tick(36)
    assert sum(a.kind == ActionKind.STOP and a.ok for a in r.actions) == 2
    assert sum(a.kind == ActionKind.SKIP and "cap" in a.reason for a in r.actions) == 3
    states = [aws.state(i) for i in f.ids["idle"] + f.ids["p4d"]]
    assert sum(s in ("stopping", "stopped") for s in states) == 2


def test_prometheus_down_means_unknown_no_stop_one_alert(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    f = Fleet(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch, prom_url=closed)
    for minute in (20, 36, 50):
        r = f.tick(minute)
        assert all(d.verdict == Verdict.UNKNOWN for d in r.decisions)
        assert not [a for a in r.actions if a.kind in (ActionKind.MARK, ActionKind.STOP)]
    f.restart()
    f.tick(60)
    assert all(f.state(k) == "running" for k in f.ids)
    alerts = [b for b in slack_stub.posted() if "No usable GPU metrics" in b["text"]]
    assert len(alerts) == 1


def test_query_timeout_means_unknown(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch):
    # A server that accepts connections and never answers.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        f = Fleet(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch,
                  prom_url=f"http://127.0.0.1:{srv.getsockname()[1]}", prom_timeout=0.5)
        r = f.tick(20)
        assert r.decisions and all(d.verdict == Verdict.UNKNOWN for d in r.decisions)
        assert any("tim" in d.reason.lower() for d in r.decisions)
        assert not [a for a in r.actions if a.kind in (ActionKind.MARK, ActionKind.STOP)]
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


def test_cli_evaluate_once_json_and_table(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch, capsys):
    import json

    import yaml

    from gpufinops.cli import main

    f = Fleet(aws, prometheus_factory, slack_stub, tmp_path, monkeypatch)
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(yaml.safe_dump({
        "prometheus": {"url": f.prom.url, "scrape_interval_s": STEP},
        "aws": {"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url},
        "slack": {"base_url": slack_stub.base_url},
        "database_url": f"sqlite:///{tmp_path / 'cli.db'}",
        "act": {"dry_run": False},
    }))
    # Real time is ~T0 here: the fleet was launched seconds ago, so nothing is old enough to judge.
    assert main(["--config", str(cfg), "evaluate", "--once", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by_id = {(d["instance_id"], d["rule"]): d for d in out["decisions"]}
    idle = f.ids["idle"][0]
    assert by_id[(idle, "gpu-util-below-10pct-2h")]["code"] == "too_young"  # the shipped default
    assert len({d["instance_id"] for d in out["decisions"]}) == sum(len(v) for v in f.ids.values())
    assert main(["--config", str(cfg), "evaluate", "--once"]) == 0
    table = capsys.readouterr().out
    assert "verdict" in table.splitlines()[0] and idle in table
    # evaluate changes nothing: no tags, no Slack
    assert TAG_MARKED not in aws.tags(idle) and slack_stub.posted() == []
