"""End to end on Compute Engine: the real tick (run_once) with a real Prometheus (backfilled DCGM series keyed by the
VM's hostname, as dcgm-exporter on a GCE VM labels them), the GCE stand-in (tests/gcestub.py) behind the official
client, built by run/compose.live_inventory from a `gcp:` section, and the Slack stub.

An idle opted-in VM is warned (its mark a label), a person snoozes it with a label, it is not stopped while the
snooze holds, is warned again once it ends and stopped after the lead (instances.stop, its operation polled to
DONE); a busy VM is untouched; a managed instance group's member is judged and advised, never stopped. Every request
the stand-in saw is one the shipped custom role grants.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from gpufinops.config import load_settings
from gpufinops.collect.prometheus import PrometheusMetrics
from gpufinops.model import ActionKind, RunContext, Verdict
from gpufinops.notify.delivery import build_notifier
from gpufinops.rules import load_rules
from gpufinops.run.compose import live_inventory
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.store.store import Store
from tests.promserver import Series, dcgm_labels

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "deploy" / "gcp" / "gpufinops-role.yaml"
STEP = 30
TOKEN = "ya29.e2e"
OPT_IN = {"gpufinops_allow-stop": "true"}


def series(host: str, start: float, end: float, util: list[float]) -> list[Series]:
    ts = list(range(int(start), int(end), STEP))
    labels = dcgm_labels(host, 0, model="NVIDIA L4", hostname_label="hostname")
    return [Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, float(util[k % len(util)])) for k, t in enumerate(ts)]),
            Series("DCGM_FI_DEV_FB_USED", labels, [(t, 2000.0) for t in ts]),
            Series("DCGM_FI_DEV_POWER_USAGE", labels, [(t, 16.0) for t in ts])]


class GceFleet:
    def __init__(self, gce, prometheus_factory, slack_stub, tmp_path, monkeypatch):
        self.gce = gce
        self.t0 = datetime.now(timezone.utc).replace(microsecond=0)
        old = self.t0 - timedelta(hours=3)
        gce.add("idle", "us-central1-a", "g2-standard-8", labels={"team": "ml", "owner": "ana", **OPT_IN},
                started=old)
        gce.add("busy", "us-central1-b", "g2-standard-8", labels={"team": "ml", **OPT_IN}, started=old)
        gce.add("mig-7x2k", "us-east4-b", "g2-standard-8", labels={"team": "serving", **OPT_IN}, started=old,
                created_by="projects/123456789/zones/us-east4-b/instanceGroupManagers/serving-l4")
        start, end = self.t0.timestamp() - 3600, self.t0.timestamp() + 3 * 3600
        self.prom = prometheus_factory(series("idle", start, end, [0, 1, 0, 0]) +
                                       series("busy", start, end, [96, 99, 97]) +
                                       series("mig-7x2k", start, end, [0]))
        gce.token = TOKEN
        monkeypatch.setenv("GPUFINOPS_GCP_ACCESS_TOKEN", TOKEN)
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
        self.settings = load_settings(
            prometheus={"url": self.prom.url, "scrape_interval_s": STEP},
            gcp={"projects": ["ml-prod"], "api_endpoint": gce.url, "operation_timeout_s": 10},
            slack={"base_url": slack_stub.base_url, "default_channel": "#gpu-finops", "max_retries": 2},
            act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 1.0},
            database_url=f"sqlite:///{tmp_path / 'gpufinops.db'}",
            rules_paths=[str(ROOT / "rules" / "examples" / "common-40pct-10min.yaml")],
        )
        self.rules = load_rules(self.settings.rules_paths)
        self.restart()

    def restart(self):
        self.store = Store(self.settings.database_url)
        self.now = self.t0
        cloud = live_inventory(self.settings)
        cloud.gce._poll_s = 0.01  # the stand-in's operations move on each poll; no need to wait 2 s
        self.peers = Peers(cloud, PrometheusMetrics(self.settings.prometheus), self.store,
                           build_notifier(self.settings.slack, self.store, lambda: self.now))

    def tick(self, minutes: float):
        self.now = self.t0 + timedelta(minutes=minutes)
        return run_once(RunContext(now=self.now, dry_run=False), self.settings, self.rules, self.peers)


def ids(actions, kind):
    return {a.instance_id for a in actions if a.kind == kind and a.ok}


def test_idle_vm_is_warned_snoozed_by_a_label_then_stopped_busy_and_mig_untouched(gce, prometheus_factory, slack_stub,
                                                                                  tmp_path, monkeypatch):
    f = GceFleet(gce, prometheus_factory, slack_stub, tmp_path, monkeypatch)
    idle, busy, mig = ("gce:ml-prod/us-central1-a/idle", "gce:ml-prod/us-central1-b/busy",
                       "gce:ml-prod/us-east4-b/mig-7x2k")

    r1 = f.tick(20)
    verdicts = {d.instance_id: d for d in r1.decisions}
    assert verdicts[idle].verdict == Verdict.IDLE and verdicts[mig].verdict == Verdict.IDLE
    assert verdicts[busy].verdict not in (Verdict.IDLE, Verdict.UNKNOWN)
    assert ids(r1.actions, ActionKind.MARK) == {idle}
    stop_at = f.now + timedelta(minutes=15)
    assert gce.labels("idle")["gpufinops_marked-for-stop"] == stop_at.strftime("%Y%m%dt%H%M%Sz")
    warnings = [p["text"] for p in slack_stub.posted() if "will be stopped at" in p["text"]]
    assert len(warnings) == 1 and idle in warnings[0]
    mig_notes = [p["text"] for p in slack_stub.posted() if mig in p["text"]]
    assert mig_notes and "managed instance group 'serving-l4'" in mig_notes[0]
    assert "resize the managed instance group" in mig_notes[0]

    # A person snoozes it with a label, by hand, until 40 minutes after t0 (no seconds: the form people type).
    until = f.t0 + timedelta(minutes=40)
    gce.person_sets_labels("idle", **{"gpufinops_snooze-until": until.strftime("%Y%m%dt%H%Mz")})
    r2 = f.tick(36)  # past the first lead: not stopped, the mark withdrawn
    assert not ids(r2.actions, ActionKind.STOP) and gce.status("idle") == "RUNNING"
    assert ids(r2.actions, ActionKind.UNMARK) == {idle}
    assert "gpufinops_marked-for-stop" not in gce.labels("idle")
    cancelled = [p["text"] for p in slack_stub.posted() if p["text"].startswith("Stop cancelled")]
    assert len(cancelled) == 1 and "by label gpufinops_snooze-until" in cancelled[0]  # what is on the VM

    f.restart()  # a new process over the same database
    r3 = f.tick(41)  # the snooze has ended: warned again, a full lead
    assert ids(r3.actions, ActionKind.MARK) == {idle}
    r4 = f.tick(50)  # within the new lead: nothing yet
    assert not ids(r4.actions, ActionKind.STOP) and gce.status("idle") == "RUNNING"
    r5 = f.tick(57)
    assert ids(r5.actions, ActionKind.STOP) == {idle}
    assert gce.status("idle") == "TERMINATED"
    labels = gce.labels("idle")
    assert labels["gpufinops_stopped-by"] == "gpufinops" and "gpufinops_marked-for-stop" not in labels
    assert labels["gpufinops_snooze-until"] == until.strftime("%Y%m%dt%H%Mz")  # a person's label is left alone
    assert gce.status("busy") == "RUNNING" and gce.status("mig-7x2k") == "RUNNING"
    assert len(gce.calls("instances.stop")) == 1
    assert [p for p in slack_stub.posted() if p["text"].startswith("Stopped")]

    f.tick(58)
    assert len(gce.calls("instances.stop")) == 1  # never a second stop of the same intent
    role = set(yaml.safe_load(ROLE.read_text())["includedPermissions"])
    # Every request within the role, and every permission of the role used: nothing more is granted than needed
    # (instances.suspend is used by a rule with action suspend: tests/faults/test_gce_faults.py).
    assert {r.permission for r in gce.requests} == role - {"compute.instances.suspend"}
    assert all(r.authorization == f"Bearer {TOKEN}" for r in gce.requests)
