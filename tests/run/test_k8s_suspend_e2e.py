"""Kueue suspend end to end (issue 28): the tick (pipeline.run_once) with a real rule file's `action: suspend`,
per-pod DCGM usage from a real Prometheus, the Slack stub, the API stand-in through the official client; then
`gpufinops k8s restore NS/Job/NAME` from the command line. The cluster and the Prometheus series are
test_k8s_scale_e2e's; its Job `research/batch-eval` (idle) is made Kueue-managed here."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufinops.collect.fleet import WorkloadMetrics
from gpufinops.collect.k8s_usage import PodMetrics
from gpufinops.collect.kubernetes import KubernetesCluster, api_client
from gpufinops.collect.kubernetes_cloud import EVENT_SUSPENDED, WorkloadCloud, workload_id
from gpufinops.k8s.model import MARK_ANNOTATION, PRE_SUSPEND_ANNOTATION, SUSPENDED_ANNOTATION
from gpufinops.model import ActionKind, RunContext, Verdict
from gpufinops.notify.delivery import build_notifier
from gpufinops.rules import load_rules
from gpufinops.run.pipeline import Peers, run_once
from tests.kubestub import kueue_workload, owned
from tests.run.test_k8s_scale_e2e import IDLE, JOB, LEAD, NOW, Cluster, prom_url  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration
WL = f"job-{JOB.name}-5b8c1"


@pytest.fixture
def kueue_cluster(tmp_path, prom_url, slack_stub, monkeypatch):  # noqa: F811
    c = Cluster(tmp_path, prom_url, slack_stub, monkeypatch)
    c.stub.add("jobs", owned(JOB.namespace, JOB.name, labels={"kueue.x-k8s.io/queue-name": "gpu-queue",
                                                             "kueue.x-k8s.io/priority-class": "batch-low"}))
    c.stub.add("workloads", kueue_workload(JOB.namespace, JOB.name, priority_class="batch-low"))
    c.cloud = WorkloadCloud(KubernetesCluster(api_client(str(c.kubeconfig))), lambda *_: 32.7726,
                            scale_to_zero=True, suspend_kueue=True, clock=lambda: c.now)
    c.peers = Peers(c.cloud, WorkloadMetrics(PodMetrics(c.settings.prometheus), c.cloud), c.store,
                    build_notifier(c.settings.slack, c.store, lambda: c.now))
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: idle-kueue\n    threshold_pct: 5\n    window: 30m\n    warning_lead: 15m\n"
                     "    action: suspend\n    select:\n      tags:\n        kueue.x-k8s.io/queue-name: '*'\n"
                     "        k8s:workload-priority-class: [batch-low]\n")
    c.rules = load_rules([rules])
    yield c
    c.close()


def tick(c, minutes: float):
    c.now = NOW + timedelta(minutes=minutes)
    return run_once(RunContext(now=c.now, dry_run=c.settings.act.dry_run), c.settings, c.rules, c.peers)


def test_an_idle_kueue_job_is_warned_suspended_through_kueue_and_resumed(kueue_cluster, slack_stub, tmp_path,
                                                                         capsys):
    from gpufinops.cli.app import main

    c = kueue_cluster
    job_id = workload_id(JOB)
    report = tick(c, 0)
    decision = {d.instance_id: d for d in report.decisions}[job_id]
    assert decision.verdict == Verdict.IDLE, decision.reason
    wl = c.stub.get("workloads", JOB.namespace, WL)
    stop_at = (NOW + timedelta(seconds=LEAD)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert wl["metadata"]["annotations"][MARK_ANNOTATION] == stop_at
    assert wl["metadata"]["annotations"][PRE_SUSPEND_ANNOTATION] == stop_at
    [warning] = [m for m in slack_stub.posted("#gpu-finops") if job_id in m.get("text", "")]
    assert "will be suspended" in warning["text"] and WL in warning["text"]
    # The idle Deployment is not under this rule: nothing of it is marked.
    assert MARK_ANNOTATION not in (c.deployment(IDLE)["metadata"].get("annotations") or {})

    tick(c, 16)
    wl = c.stub.get("workloads", JOB.namespace, WL)
    assert wl["spec"]["active"] is False and SUSPENDED_ANNOTATION in wl["metadata"]["annotations"]
    assert [s.status for s in c.store.action_rows(kinds=[ActionKind.STOP])] == ["done"]
    assert c.events(EVENT_SUSPENDED) and not c.patches("jobs") and not c.patches("deployments")
    posted = [m.get("text", "") for m in slack_stub.posted()]  # the notice is a reply in the warning's thread
    assert any("Suspended idle GPU workload" in t for t in posted), posted

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {c.kubeconfig}\n  suspend_kueue: true\nact:\n  dry_run: false\n"
                   f"database_url: {c.settings.database_url}\n")
    assert main(["--config", str(cfg), "k8s", "restore", "research/Job/batch-eval", "--by", "bob"]) == 0, \
        capsys.readouterr().err
    assert "spec.active: true" in capsys.readouterr().out
    assert c.stub.get("workloads", JOB.namespace, WL)["spec"]["active"] is True
    # Every call of the whole cycle is one the shipped ClusterRole grants.
    from tests.collect.test_k8s_deploy import granted
    from tests.kubestub import RESOURCES

    rights = granted()
    for call in c.stub.requests:
        prefix = RESOURCES[call.resource.split("/")[0]][0]
        group = "" if prefix == "/api/v1" else prefix.split("/")[2]
        assert call.verb in rights.get((group, call.resource), set()), (group, call.resource, call.verb)
