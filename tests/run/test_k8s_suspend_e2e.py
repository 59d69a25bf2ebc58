"""Kueue suspend end to end (issue 28): the tick (pipeline.run_once) with a real rule file's `action: suspend`,
per-pod DCGM usage from a real Prometheus, the Slack stub, a real kube-apiserver with Kueue's, JobSet's and KubeRay's
published CRDs (tests/kapi.py: the service's token bound to the shipped ClusterRole) through the official client; then
`gpufinops k8s restore NS/Job/NAME` from the command line. The cluster and the Prometheus series are
test_k8s_scale_e2e's; its Job `research-<suffix>/batch-eval` (idle) is made Kueue-managed here. The same idle pod, owned
instead by a JobSet's Job or by a RayJob's RayCluster, makes a JobSet or a RayJob that is suspended and resumed the
same way (`gpufinops k8s restore research/JobSet/NAME`)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufinops.places.fleet import WorkloadMetrics
from gpufinops.places.kubernetes.usage import PodMetrics
from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client
from gpufinops.places.kubernetes.cloud import WorkloadCloud
from gpufinops.places.kubernetes.names import EVENT_SUSPENDED, workload_id
from gpufinops.k8s.model import MARK_ANNOTATION, PRE_SUSPEND_ANNOTATION, SUSPENDED_ANNOTATION, WorkloadRef
from gpufinops.model import ActionKind, RunContext, Verdict
from gpufinops.notify.delivery import build_notifier
from gpufinops.rules import load_rules
from gpufinops.run.pipeline import Peers, run_once
from tests.kubestub import jobset, kueue_workload, rayjob
from tests.run.test_k8s_scale_e2e import (  # noqa: F401 - prom_url: the fixture
    JOB, LEAD, LONG_AGO, NOW, PODS, Cluster, prom_url,
)

pytestmark = pytest.mark.integration
WL = f"job-{JOB[2]}-5b8c1"


@pytest.fixture
def kueue_cluster(kapi, tmp_path, prom_url, slack_stub, monkeypatch):  # noqa: F811
    c = Cluster(kapi, tmp_path, prom_url, slack_stub, monkeypatch)
    try:
        # The test's Job becomes Kueue-managed (labelled), and Kueue made its Workload.
        c.kube.merge("jobs", c.job.namespace, c.job.name, {"metadata": {"labels": {
            "kueue.x-k8s.io/queue-name": "gpu-queue", "kueue.x-k8s.io/priority-class": "batch-low"}}})
        c.kube.add("workloads", kueue_workload(c.job.namespace, c.job.name, priority_class="batch-low"))
        yield with_kueue(c, tmp_path)
        c.kube.check_rbac()  # every call of the whole cycle is one the shipped ClusterRole grants
    finally:
        c.close()


def with_kueue(c: Cluster, tmp_path) -> Cluster:
    """The cluster read with kubernetes.suspend_kueue on, through the tick's own peers, under the suspend rule."""
    c.cloud = WorkloadCloud(KubernetesCluster(api_client(str(c.kubeconfig))), lambda *_: 32.7726,
                            scale_to_zero=True, suspend_kueue=True, clock=lambda: c.now)
    c.peers = Peers(c.cloud, WorkloadMetrics(PodMetrics(c.settings.prometheus), c.cloud), c.store,
                    build_notifier(c.settings.slack, c.store, lambda: c.now))
    c.rules = kueue_rules(tmp_path)
    return c


def kueue_rules(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: idle-kueue\n    threshold_pct: 5\n    window: 30m\n    warning_lead: 15m\n"
                     "    action: suspend\n    select:\n      tags:\n        kueue.x-k8s.io/queue-name: '*'\n"
                     "        k8s:workload-priority-class: [batch-low]\n")
    return load_rules([rules])


def tick(c, minutes: float):
    c.now = NOW + timedelta(minutes=minutes)
    return run_once(RunContext(now=c.now, dry_run=c.settings.act.dry_run), c.settings, c.rules, c.peers)


def test_an_idle_kueue_job_is_warned_suspended_through_kueue_and_resumed(kueue_cluster, slack_stub, tmp_path,
                                                                         capsys):
    from gpufinops.cli.app import main

    c = kueue_cluster
    job_id = workload_id(c.job)
    report = tick(c, 0)
    decision = {d.instance_id: d for d in report.decisions}[job_id]
    assert decision.verdict == Verdict.IDLE, decision.reason
    wl = c.kube.get("workloads", c.job.namespace, WL)
    stop_at = (NOW + timedelta(seconds=LEAD)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert wl["metadata"]["annotations"][MARK_ANNOTATION] == stop_at
    assert wl["metadata"]["annotations"][PRE_SUSPEND_ANNOTATION] == stop_at
    [warning] = [m for m in slack_stub.posted("#gpu-finops") if job_id in m.get("text", "")]
    assert "will be suspended" in warning["text"] and WL in warning["text"]
    # The idle Deployment is not under this rule: nothing of it is marked.
    assert MARK_ANNOTATION not in (c.deployment(c.idle)["metadata"].get("annotations") or {})

    tick(c, 16)
    wl = c.kube.get("workloads", c.job.namespace, WL)
    assert wl["spec"]["active"] is False and SUSPENDED_ANNOTATION in wl["metadata"]["annotations"]
    assert [s.status for s in c.store.action_rows(kinds=[ActionKind.STOP])] == ["done"]
    assert c.events(EVENT_SUSPENDED) and not c.patches("jobs") and not c.patches("deployments")
    posted = [m.get("text", "") for m in slack_stub.posted()]  # the notice is a reply in the warning's thread
    assert any("Suspended idle GPU workload" in t for t in posted), posted

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {c.kubeconfig}\n  suspend_kueue: true\nact:\n  dry_run: false\n"
                   f"database_url: {c.settings.database_url}\n")
    assert main(["--config", str(cfg), "k8s", "restore", f"{c.job.namespace}/Job/batch-eval", "--by", "bob"]) == 0, \
        capsys.readouterr().err
    assert "spec.active: true" in capsys.readouterr().out
    assert c.kube.get("workloads", c.job.namespace, WL)["spec"]["active"] is True


# --------------------------------------------------------------------------- a JobSet and a RayJob

# The idle pod of the Prometheus series (PODS: GPU 3, 0 %), owned by a JobSet's Job or a RayJob's RayCluster.
IDLE_POD = next(pod for pod, (ref, _gpu, _util) in PODS.items() if ref == JOB)
KINDS = {
    "JobSet": (lambda ns, node: jobset(ns, "pretrain", node, replicas=1, gpus=1, started=LONG_AGO,
                                       labels={"kueue.x-k8s.io/priority-class": "batch-low"}, pod_names=[IDLE_POD]),
               "jobset.x-k8s.io/v1alpha2"),
    "RayJob": (lambda ns, node: rayjob(ns, "rl-sweep", node, workers=0, gpus=1, started=LONG_AGO,
                                       labels={"kueue.x-k8s.io/priority-class": "batch-low"}, pod_names=[IDLE_POD]),
               "ray.io/v1"),
}


@pytest.fixture(params=sorted(KINDS))
def kind_cluster(request, kapi, tmp_path, prom_url, slack_stub, monkeypatch):  # noqa: F811
    c = Cluster(kapi, tmp_path, prom_url, slack_stub, monkeypatch)
    try:
        build, api = KINDS[request.param]
        objects = build(c.job.namespace, c.node)
        # The idle pod gets its new owner: made anew (the stand-in replaced it in place; the real server answers a
        # second create 409 AlreadyExists).
        c.kube.delete("pods", c.job.namespace, IDLE_POD)
        c.kube.add_all(objects)
        top = next(iter(objects.values()))[0]["metadata"]["name"]
        c.ref = WorkloadRef(c.job.namespace, request.param, top)
        c.wl = f"{request.param.lower()}-{top}-5b8c1"
        c.kube.add("workloads", kueue_workload(c.job.namespace, top, priority_class="batch-low", kind=request.param,
                                               api_version=api))
        yield with_kueue(c, tmp_path)
        c.kube.check_rbac()  # every call of the whole cycle is one the shipped ClusterRole grants
    finally:
        c.close()


def test_an_idle_jobset_or_rayjob_is_warned_suspended_through_kueue_and_resumed(kind_cluster, slack_stub, tmp_path,
                                                                                capsys):
    from gpufinops.cli.app import main

    c = kind_cluster
    iid = workload_id(c.ref)
    decision = {d.instance_id: d for d in tick(c, 0).decisions}[iid]
    assert decision.verdict == Verdict.IDLE, decision.reason
    assert workload_id(c.job) not in {d.instance_id for d in tick(c, 0.5).decisions}  # its pod is the job's now
    wl = c.kube.get("workloads", c.job.namespace, c.wl)
    stop_at = (NOW + timedelta(seconds=LEAD)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert wl["metadata"]["annotations"][MARK_ANNOTATION] == stop_at
    [warning] = [m for m in slack_stub.posted("#gpu-finops") if iid in m.get("text", "")]
    assert "will be suspended" in warning["text"] and c.wl in warning["text"]

    tick(c, 10)
    assert c.kube.get("workloads", c.job.namespace, c.wl)["spec"]["active"] is True  # not before the lead ends
    tick(c, 16)
    wl = c.kube.get("workloads", c.job.namespace, c.wl)
    assert wl["spec"]["active"] is False and SUSPENDED_ANNOTATION in wl["metadata"]["annotations"]
    suspensions = [r for r in c.patches("workloads") if (r.body or {}).get("spec", {}).get("active") is False]
    assert len(suspensions) == 1 and suspensions[0].body["metadata"]["resourceVersion"]
    assert [s.status for s in c.store.action_rows(kinds=[ActionKind.STOP])] == ["done"]
    [event] = c.events(EVENT_SUSPENDED)
    assert event["involvedObject"]["kind"] == c.ref.kind and event["involvedObject"]["name"] == c.ref.name
    assert {r.resource for r in c.kube.calls(verb="patch")} == {"workloads"}

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {c.kubeconfig}\n  suspend_kueue: true\nact:\n  dry_run: false\n"
                   f"database_url: {c.settings.database_url}\n")
    assert main(["--config", str(cfg), "k8s", "restore", f"{c.ref.namespace}/{c.ref.kind}/{c.ref.name}", "--by",
                 "bob"]) == 0, \
        capsys.readouterr().err
    assert "spec.active: true" in capsys.readouterr().out
    assert c.kube.get("workloads", c.job.namespace, c.wl)["spec"]["active"] is True
    assert not c.kube.forbidden()
