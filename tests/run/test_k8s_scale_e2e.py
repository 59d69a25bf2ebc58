"""Scale to zero end to end: the tick (pipeline.run_once) over Kubernetes workloads read through the official client
from a real kube-apiserver (tests/kapi.py: the service's token bound to the shipped ClusterRole, so any request it
does not grant fails the test), per-pod DCGM usage from a real Prometheus, warnings through the Slack stub, every
change through the act chokepoint; then `gpufinops k8s restore`. Faults: a real 409 (the object changed just before
the patch), a real 403 (the right taken away), a 500 from the fault proxy in front of the server."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.places.kubernetes.usage import PodMetrics
from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client
from gpufinops.places.kubernetes.cloud import WorkloadCloud
from gpufinops.places.kubernetes.names import (
    EVENT_MARKED, EVENT_RESTORED, EVENT_SCALED_DOWN, parse_workload_id, workload_id,
)
from gpufinops.collect.prometheus import FB_USED, GPU_UTIL
from gpufinops.config import load_settings
from gpufinops.places.fleet import WorkloadMetrics
from gpufinops.act.restore import restore_workload
from gpufinops.k8s.model import MARK_ANNOTATION, REPLICAS_BEFORE_ANNOTATION, WorkloadRef
from gpufinops.model import TAG_MARKED, TAG_PROTECT, Action, ActionKind, GpuInstance, Rule, RunContext, Verdict
from gpufinops.notify.delivery import build_notifier
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.store.store import Store
from tests.kapi import KapiCluster
from tests.kubestub import node_obj, owned, pod_obj
from tests.promserver import Series, binaries_missing, dcgm_labels, start_prometheus

pytestmark = pytest.mark.integration

SCRAPE = 30
WINDOW = 1800
LEAD = 900
NOW = datetime.fromtimestamp(int(time.time()) // SCRAPE * SCRAPE, timezone.utc)
LONG_AGO = NOW - timedelta(days=2)
RULE = Rule(name="k8s-idle", threshold_pct=5.0, window_s=WINDOW, warning_lead_s=LEAD, action=Action.STOP)

# Namespaces (and the node) are the test's own on the session's server: a namespace never finishes terminating there,
# so each test takes one suffix of this module's (`ml` -> `ml-sc3`), and the module's Prometheus holds the DCGM
# series of every suffix. The refs below are per suffix: `refs(suffix)`.
SUFFIXES = [f"sc{i}" for i in range(32)]  # also used by test_k8s_suspend_e2e.py, which imports this module
IDLE, BUSY, JOB, LOCKED, QUEUED = (("ml", "Deployment", "idle-infer"), ("ml", "Deployment", "busy-train"),
                                   ("research", "Job", "batch-eval"), ("locked", "Deployment", "idle-locked"),
                                   ("research", "Deployment", "kueue-infer"))
# pod -> (workload, gpu index, util %) on the test's node
PODS = {
    "idle-infer-7d9f-aaaaa": (IDLE, 0, 0.0), "idle-infer-7d9f-bbbbb": (IDLE, 1, 0.0),
    "busy-train-7d9f-ccccc": (BUSY, 2, 80.0), "batch-eval-x1x1x": (JOB, 3, 0.0),
    "idle-locked-55c-ddddd": (LOCKED, 4, 0.0), "kueue-infer-66d-eeeee": (QUEUED, 5, 0.0),
}


def ref(spec: tuple[str, str, str], suffix: str) -> WorkloadRef:
    namespace, kind, name = spec
    return WorkloadRef(f"{namespace}-{suffix}", kind, name)


def node_name(suffix: str) -> str:
    return f"ip-10-0-1-1-{suffix}.ec2.internal"


def grid() -> list[float]:
    """Samples from a window before NOW to 30 minutes after it: every tick of a test sees a full window."""
    start, end = NOW.timestamp() - WINDOW, NOW.timestamp() + 1800
    return [start + SCRAPE * i for i in range(int((end - start) // SCRAPE) + 1)]


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory):
    missing = binaries_missing()
    if missing:
        pytest.skip(missing)
    series = []
    for suffix in SUFFIXES:
        for pod, (spec, gpu, util) in PODS.items():
            labels = dcgm_labels(node_name(suffix).split(".")[0], gpu, pod=pod, namespace=ref(spec, suffix).namespace,
                                 container="main")
            series += [Series(GPU_UTIL, labels, [(t, util) for t in grid()]),
                       Series(FB_USED, labels, [(t, 512.0) for t in grid()])]
    server = start_prometheus(tmp_path_factory.mktemp("k8s-scale-prom"), series)
    yield server.url
    server.stop()


def fill_cluster(kube: KapiCluster, suffix: str) -> None:
    kube.add("nodes", node_obj(node_name(suffix), "i-0aaa0000000000001", gpus=8, created=LONG_AGO,
                               labels={"eks.amazonaws.com/nodegroup": "ml-a100",
                                       "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}))
    for ns, labels in (("ml", {"team": "ml"}), ("research", {}), ("locked", {"gpufinops.io/protect": "true"})):
        kube.add("namespaces", {"metadata": {"name": kube.ns(ns), "labels": labels}})
    for spec, replicas, labels in ((IDLE, 2, {"team": "ml"}), (BUSY, 1, {"team": "ml"}), (LOCKED, 1, {}),
                                   (QUEUED, 1, {"kueue.x-k8s.io/queue-name": "gpu-queue"})):
        r = ref(spec, suffix)
        kube.add("deployments", owned(r.namespace, r.name, replicas=replicas, labels=labels,
                                      annotations={"owner": "alice@example.com"}))
    kube.add("jobs", owned(ref(JOB, suffix).namespace, ref(JOB, suffix).name))
    replica_sets = set()  # two pods of one ReplicaSet: created once (a second create is 409 AlreadyExists)
    for pod, (spec, _gpu, _util) in PODS.items():
        r = ref(spec, suffix)
        rs = pod.rsplit("-", 1)[0]
        if r.kind == "Deployment":
            if rs not in replica_sets:
                kube.add("replicasets", owned(r.namespace, rs, owner=("Deployment", r.name)))
                replica_sets.add(rs)
            owner = ("ReplicaSet", rs)
        else:
            owner = ("Job", r.name)
        kube.add("pods", pod_obj(r.namespace, pod, node_name(suffix), owner=owner, started=LONG_AGO))


_SUFFIXES = iter(SUFFIXES)


class Cluster:
    """The test's part of the real API server, the cloud over it and a tick on an injected clock."""

    def __init__(self, kapi, tmp_path, prom_url, slack_stub, monkeypatch, *, dry_run=False):
        suffix = next(_SUFFIXES)  # StopIteration: add suffixes to SUFFIXES
        self.kube = KapiCluster(kapi, suffix)
        self.node = node_name(suffix)
        self.idle, self.busy, self.job, self.locked, self.queued = (ref(s, suffix)
                                                                    for s in (IDLE, BUSY, JOB, LOCKED, QUEUED))
        try:
            fill_cluster(self.kube, suffix)
        except Exception:
            self.kube.close()
            raise
        self.now = NOW
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
        kubeconfig = self.kube.write_kubeconfig(tmp_path / "kubeconfig")
        self.settings = load_settings(
            prometheus={"url": prom_url, "scrape_interval_s": SCRAPE},
            slack={"base_url": slack_stub.base_url, "default_channel": "#gpu-finops", "max_retries": 1},
            act={"dry_run": dry_run, "max_stops_per_run": 5, "max_stops_fraction": 1.0},
            kubernetes={"kubeconfig": str(kubeconfig)},
            database_url=f"sqlite:///{tmp_path / 'gpufinops.db'}",
        )
        self.store = Store(self.settings.database_url)
        self.cloud = WorkloadCloud(KubernetesCluster(api_client(str(kubeconfig))), lambda *_: 32.7726,
                                   clock=lambda: self.now)
        self.peers = Peers(self.cloud, WorkloadMetrics(PodMetrics(self.settings.prometheus), self.cloud), self.store,
                           build_notifier(self.settings.slack, self.store, lambda: self.now))
        self.kubeconfig = kubeconfig

    def tick(self, minutes: float):
        self.now = NOW + timedelta(minutes=minutes)
        return run_once(RunContext(now=self.now, dry_run=self.settings.act.dry_run), self.settings, [RULE],
                        self.peers)

    def deployment(self, ref: WorkloadRef) -> dict:
        return self.kube.get("deployments", ref.namespace, ref.name)

    def patches(self, resource: str | None = None, name: str | None = None):
        return [r for r in self.kube.calls(verb="patch", resource=resource) if name is None or r.name == name]

    def events(self, reason: str):
        return self.kube.events(reason)

    def close(self):
        self.kube.close()


@pytest.fixture
def cluster(kapi, tmp_path, prom_url, slack_stub, monkeypatch):
    c = Cluster(kapi, tmp_path, prom_url, slack_stub, monkeypatch)
    try:
        yield c
        c.kube.check_rbac()  # any request the shipped ClusterRole does not grant fails the test
    finally:
        c.close()


def by_id(report):
    return {d.instance_id: d for d in report.decisions}


def test_an_idle_deployment_is_marked_warned_scaled_to_zero_and_restored(cluster, slack_stub, tmp_path, capsys):
    from gpufinops.cli.app import main

    idle_id = workload_id(cluster.idle)
    first = cluster.tick(0)
    decisions = by_id(first)
    assert decisions[idle_id].verdict == Verdict.IDLE, decisions[idle_id].reason
    assert decisions[workload_id(cluster.busy)].verdict == Verdict.ACTIVE
    # Marked: the annotation with the announced time, an Event on the object, a Slack warning naming it.
    dep = cluster.deployment(cluster.idle)
    stop_at = dep["metadata"]["annotations"][MARK_ANNOTATION]
    assert stop_at == (NOW + timedelta(seconds=LEAD)).strftime("%Y-%m-%dT%H:%M:%SZ")
    [event] = cluster.events(EVENT_MARKED)
    assert event["involvedObject"]["name"] == cluster.idle.name and stop_at in event["message"]
    warnings = [m for m in slack_stub.posted("#gpu-finops") if idle_id in m.get("text", "")]
    assert warnings and "Idle GPU workload" in warnings[0]["text"] and "will be scaled to zero" in warnings[0]["text"]
    assert "gpufinops.io/snooze-until" in warnings[0]["text"]  # how to keep it, in the workload's own terms
    # The busy one is not marked; nothing was asked of the scale subresource or of any other object.
    assert MARK_ANNOTATION not in (cluster.deployment(cluster.busy)["metadata"].get("annotations") or {})
    assert {r.name for r in cluster.patches()} == {cluster.idle.name}

    cluster.tick(10)  # before the announced time: nothing more
    assert cluster.deployment(cluster.idle)["spec"]["replicas"] == 2

    cluster.tick(16)  # at the time, still idle: scaled to 0, the count kept in the same patch
    dep = cluster.deployment(cluster.idle)
    annotations = dep["metadata"]["annotations"]
    assert dep["spec"]["replicas"] == 0 and annotations[REPLICAS_BEFORE_ANNOTATION] == "2"
    assert MARK_ANNOTATION not in annotations and annotations["gpufinops.io/scaled-down-by"] == "gpufinops"
    [scale] = [r for r in cluster.patches("deployments", cluster.idle.name) if "spec" in (r.body or {})]
    assert scale.body["spec"] == {"replicas": 0}
    assert scale.body["metadata"]["annotations"] == {REPLICAS_BEFORE_ANNOTATION: "2"}
    assert scale.body["metadata"]["resourceVersion"]  # a precondition: the count kept is the one replaced
    assert cluster.events(EVENT_SCALED_DOWN)
    stops = cluster.store.action_rows(kinds=[ActionKind.STOP])
    assert [(s.instance_id, s.status) for s in stops] == [(idle_id, "done")]
    [found] = cluster.cloud.describe([idle_id])
    assert found.state == "stopped"
    # The Job was judged idle, reported, never patched; no pod, job or scale subresource was ever patched.
    assert not cluster.patches("jobs") and {r.resource for r in cluster.patches()} == {"deployments"}

    # The controller takes the pods away; `gpufinops k8s restore` scales it back and removes the annotations.
    for pod in cluster.kube.list("pods", cluster.idle.namespace):
        if pod["metadata"]["name"].startswith("idle-infer"):
            cluster.kube.delete("pods", cluster.idle.namespace, pod["metadata"]["name"])
    idle_path = f"{cluster.idle.namespace}/{cluster.idle.name}"
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {cluster.kubeconfig}\nact:\n  dry_run: false\n"
                   f"database_url: {cluster.settings.database_url}\n")
    assert main(["--config", str(cfg), "k8s", "restore", idle_path, "--by", "alice"]) == 0, \
        capsys.readouterr().err
    assert "restored to 2 replicas for alice" in capsys.readouterr().out
    dep = cluster.deployment(cluster.idle)
    assert dep["spec"]["replicas"] == 2
    assert not {REPLICAS_BEFORE_ANNOTATION, MARK_ANNOTATION, "gpufinops.io/scaled-down-by"} & set(
        dep["metadata"]["annotations"])
    assert dep["metadata"]["annotations"]["owner"] == "alice@example.com"
    assert cluster.events(EVENT_RESTORED)
    [row] = [a for a in cluster.store.action_rows() if "restore" in a.reason]
    assert row.instance_id == idle_id and row.status == "done" and not row.dry_run
    # A second restore finds nothing of gpufinops' to undo and asks nothing of the API server.
    before = len(cluster.patches())
    assert main(["--config", str(cfg), "k8s", "restore", idle_path]) == 1
    assert "not scaled down by gpufinops" in capsys.readouterr().err and len(cluster.patches()) == before
    # Every call of the whole cycle is one the shipped ClusterRole grants: the real server's RBAC said so.
    assert cluster.kube.calls() and not cluster.kube.forbidden()


def test_jobs_kueue_and_protected_namespaces_are_reported_never_touched(cluster):
    report = cluster.tick(0)
    decisions = by_id(report)
    actions = {a.instance_id: a for a in report.actions}
    assert decisions[workload_id(cluster.job)].verdict == Verdict.IDLE
    assert "managed by Kubernetes Job 'batch-eval'" in actions[workload_id(cluster.job)].reason
    assert "lower its parallelism or delete it" in actions[workload_id(cluster.job)].reason
    assert "Kueue (queue 'gpu-queue')" in actions[workload_id(cluster.queued)].reason
    assert "action: suspend" in actions[workload_id(cluster.queued)].reason
    assert actions[workload_id(cluster.locked)].kind == ActionKind.SKIP
    assert "namespace locked" in actions[workload_id(cluster.locked)].reason
    cluster.tick(16)
    cluster.tick(20)
    patched = {r.name for r in cluster.patches()}
    assert patched == {cluster.idle.name}  # only the idle, unmanaged, unprotected Deployment
    assert not cluster.patches("jobs") and not cluster.kube.calls(verb="create", resource="jobs")
    assert cluster.deployment(cluster.locked)["spec"]["replicas"] == 1
    assert cluster.deployment(cluster.queued)["spec"]["replicas"] == 1
    # The cloud itself refuses to change what it reports only, whatever asks.
    job = next(i for i in cluster.cloud.list_gpu_instances() if i.instance_id == workload_id(cluster.job))
    with pytest.raises(Exception, match="never changes") as err:
        cluster.cloud.set_tags(job, {TAG_MARKED: "now"})
    assert err.value.definite
    assert job.is_protected is False and TAG_PROTECT in next(
        i for i in cluster.cloud.list_gpu_instances() if i.instance_id == workload_id(cluster.locked)).tags


def test_with_scale_to_zero_off_an_idle_deployment_is_reported_never_patched(cluster):
    """kubernetes.scale_to_zero is off by default: adding a cluster must not let stop rules written for EC2
    instances start scaling Deployments."""
    cluster.cloud.scale_to_zero = False
    report = cluster.tick(0)
    idle_id = workload_id(cluster.idle)
    assert by_id(report)[idle_id].verdict == Verdict.IDLE
    [action] = [a for a in report.actions if a.instance_id == idle_id]
    assert "scale-to-zero is off" in action.reason and "kubernetes.scale_to_zero: true" in action.reason
    cluster.tick(16)
    assert not cluster.patches() and cluster.deployment(cluster.idle)["spec"]["replicas"] == 2
    assert load_settings(kubernetes={"kubeconfig": "k"}).kubernetes.scale_to_zero is False


def test_a_409_on_the_scale_patch_is_retried_once_and_logged(cluster, caplog):
    cluster.tick(0)
    cluster.kube.conflict_next("patch", "deployments")
    with caplog.at_level(logging.WARNING, logger="gpufinops.kubernetes"):
        cluster.tick(16)
    assert cluster.deployment(cluster.idle)["spec"]["replicas"] == 0
    assert cluster.deployment(cluster.idle)["metadata"]["annotations"][REPLICAS_BEFORE_ANNOTATION] == "2"
    conflicted = [r for r in cluster.patches("deployments", cluster.idle.name) if r.status == 409]
    assert len(conflicted) == 1
    assert cluster.cloud.conflicts_retried == [f"patch deployments {cluster.idle.namespace}/{cluster.idle.name}"]
    assert any("409 Conflict" in r.getMessage() for r in caplog.records)
    assert [s.status for s in cluster.store.action_rows(kinds=[ActionKind.STOP])] == ["done"]


def test_two_409s_fail_the_stop_definitely_and_the_row_says_so(cluster):
    cluster.tick(0)
    cluster.kube.conflict_next("patch", "deployments", times=2)
    cluster.tick(16)
    [row] = cluster.store.action_rows(kinds=[ActionKind.STOP])
    assert row.status == "failed" and "409 Conflict again after one re-read and retry" in row.error
    assert cluster.deployment(cluster.idle)["spec"]["replicas"] == 2


def test_a_403_is_recorded_failed_with_the_state_read_back(cluster):
    cluster.tick(0)
    cluster.kube.forbid("patch", "deployments")
    cluster.tick(16)
    [row] = cluster.store.action_rows(kinds=[ActionKind.STOP])
    assert row.status == "failed"
    assert "403 Forbidden" in row.error and "rbac-clusterrole.yaml" in row.error and "[not done]" in row.error
    # read back: still running, so failed (not unconfirmed)
    assert cluster.deployment(cluster.idle)["spec"]["replicas"] == 2
    assert cluster.kube.calls(verb="get", resource="deployments")  # the read-back
    [refused] = cluster.kube.forbidden()  # the server's own 403, naming the service's account
    assert refused.verb == "patch" and refused.resource == "deployments" and refused.name == cluster.idle.name


def test_dry_run_makes_no_patch_and_no_event(kapi, tmp_path, prom_url, slack_stub, monkeypatch):
    c = Cluster(kapi, tmp_path, prom_url, slack_stub, monkeypatch, dry_run=True)
    try:
        c.tick(0)
        c.tick(16)
        assert not c.kube.calls(verb="patch") and not c.kube.calls(verb="create")
        stops = c.store.action_rows(kinds=[ActionKind.STOP])
        assert stops and all(s.dry_run and "would stop" in s.reason for s in stops)
        assert c.deployment(c.idle)["spec"]["replicas"] == 2
        # k8s restore in dry-run changes nothing either.
        outcome = restore_workload(c.cloud, c.store, f"{c.idle.namespace}/{c.idle.name}", c.now, dry_run=True)
        assert not outcome.ok and "not scaled down by gpufinops" in outcome.message
        assert not c.kube.calls(verb="patch")
        c.kube.check_rbac()
    finally:
        c.close()


def test_workload_ids_are_stable_parseable_and_fit_the_store():
    assert workload_id(WorkloadRef(*IDLE)) == "k8s:ml/Deployment/idle-infer"
    assert parse_workload_id("k8s:ml/Deployment/idle-infer") == WorkloadRef(*IDLE)
    long = WorkloadRef("a-very-long-namespace-name-for-a-team", "StatefulSet", "a-very-long-statefulset-name-x")
    cut = workload_id(long)
    assert len(cut) == 64 and "~" in cut and workload_id(long) == cut and parse_workload_id(cut) is None


def test_a_crash_after_the_scale_is_reconciled_done_and_never_repeated(cluster):
    """The stop's intent was written and the patch went through, then the process died: the next tick reads the
    object back (0 replicas + the kept count = stopped), settles the row done and patches nothing again."""
    cluster.tick(0)
    [inst] = [i for i in cluster.cloud.list_gpu_instances() if i.instance_id == workload_id(cluster.idle)]
    row = cluster.store.begin_action("crashed", inst.instance_id, ActionKind.STOP, RULE.name, False,
                                     "still idle at the announced time: idle", NOW + timedelta(minutes=16))
    cluster.cloud.stop(inst)
    scale_patches = len(cluster.patches("deployments", cluster.idle.name))
    cluster.tick(17)
    [settled] = [a for a in cluster.store.action_rows(kinds=[ActionKind.STOP]) if a.id == row]
    assert settled.status == "done" and "reconciled: instance found stopped" in settled.error
    bodies = [r.body for r in cluster.patches("deployments", cluster.idle.name)[scale_patches:]]
    assert all("spec" not in b for b in bodies)  # bookkeeping annotations only, no second scale


def test_a_crash_before_the_scale_is_reconciled_failed(cluster):
    cluster.tick(0)
    row = cluster.store.begin_action("crashed", workload_id(cluster.idle), ActionKind.STOP, RULE.name, False,
                                     "still idle at the announced time: idle", NOW + timedelta(minutes=16))
    cluster.tick(16.5)
    [settled] = [a for a in cluster.store.action_rows(kinds=[ActionKind.STOP]) if a.id == row]
    assert settled.status == "failed" and "still running" in settled.error


def test_compose_puts_ec2_instances_and_workloads_side_by_side(kapi, tmp_path, prom_url, slack_stub, aws,
                                                              monkeypatch):
    """compose.live_peers with a `kubernetes:` section: one inventory, one metrics source, ids dispatched by the
    `k8s:` prefix, EC2 listed as before."""
    from gpufinops.run.compose import live_peers
    from gpufinops.places.fleet import FleetCloud, FleetMetrics

    c = Cluster(kapi, tmp_path, prom_url, slack_stub, monkeypatch)
    try:
        [iid] = aws.launch("g5.xlarge", tags={"team": "ml"})
        settings = c.settings.model_copy(update={"aws": c.settings.aws.model_copy(
            update={"regions": ("us-east-1",), "endpoint_url": aws.endpoint_url})})
        peers = live_peers(settings)
        assert isinstance(peers.cloud, FleetCloud) and isinstance(peers.metrics, FleetMetrics)
        listed = {i.instance_id: i for i in peers.cloud.list_gpu_instances()}
        assert iid in listed and workload_id(c.idle) in listed and not peers.cloud.last_errors
        assert listed[workload_id(c.idle)].gpu_count == 2 and listed[workload_id(c.idle)].gpu_model.startswith("NVIDIA")
        usage = peers.metrics.window_usage(list(listed.values()), WINDOW, NOW)
        assert len(usage[workload_id(c.idle)].gpus) == 2 and usage[workload_id(c.idle)].error is None
        found = peers.cloud.describe([workload_id(c.idle), iid])
        assert [i.instance_id for i in found] == [workload_id(c.idle), iid]
        c.kube.check_rbac()
    finally:
        c.close()


def test_a_5xx_on_the_scale_leaves_it_unconfirmed_until_read_back(cluster):
    cluster.tick(0)
    cluster.kube.fail_next(500, "patch", "deployments")  # the fault proxy answers; the server never sees it
    cluster.tick(16)
    [row] = cluster.store.action_rows(kinds=[ActionKind.STOP])
    assert row.status == "unconfirmed" and "[outcome unknown]" in row.error
    cluster.tick(17)  # reconciled from the object (still 2 replicas: not done), then stopped for real
    rows = cluster.store.action_rows(kinds=[ActionKind.STOP])
    assert [r.status for r in rows] == ["failed", "done"] and cluster.deployment(cluster.idle)["spec"]["replicas"] == 0


def test_annotations_and_namespace_labels_map_to_gpufinops_tags():
    from gpufinops.places.kubernetes.cloud import workload_tags
    from gpufinops.model import TAG_SNOOZE

    tags = workload_tags({"team": "ml", "gpufinops.io/protect": "false"},
                         {"owner": "alice", MARK_ANNOTATION: "2026-12-01T10:00:00Z"}, WorkloadRef(*IDLE),
                         {"gpufinops.io/snooze-until": "20261224T1800Z"})
    assert tags[TAG_MARKED] == "2026-12-01T10:00:00Z" and MARK_ANNOTATION not in tags
    assert tags[TAG_PROTECT] == "false" and tags[TAG_SNOOZE] == "20261224T1800Z"
    assert tags["owner"] == "alice" and tags["team"] == "ml" and tags["k8s:namespace"] == "ml"
    protected = workload_tags({}, {"gpufinops.io/protect": "false"}, WorkloadRef(*IDLE),
                              {"gpufinops.io/protect": "yes"})
    assert protected[TAG_PROTECT].startswith("yes (label gpufinops.io/protect of namespace ml")


def test_rules_select_workloads_by_priority_class(tmp_path):
    """A rule selects by PriorityClass through the workload's `k8s:priority-class` tag, read from its pods."""
    from gpufinops.places.kubernetes.cluster import parse_pod
    from gpufinops.places.kubernetes.cloud import workload_instance
    from gpufinops.rules import load_rule_file

    low = parse_pod(pod_obj("ml", "train-0", "n1", owner=("StatefulSet", "train"), priority_class="batch-low"), {})
    plain = parse_pod(pod_obj("ml", "infer-0", "n1", owner=("StatefulSet", "infer")), {})
    low_inst = workload_instance(low.workload, None, [low], {}, {}, 1.0)
    plain_inst = workload_instance(plain.workload, None, [plain], {}, {}, 1.0)
    assert low_inst.tags["k8s:priority-class"] == "batch-low" and "k8s:priority-class" not in plain_inst.tags
    path = tmp_path / "rules.yaml"
    path.write_text('rules:\n  - name: low-priority-idle\n    threshold_pct: 10\n    window: 1h\n    action: stop\n'
                    '    select:\n      tags: {"k8s:priority-class": [batch-low]}\n')
    [rule] = load_rule_file(path)
    assert rule.selector.matches(low_inst) and not rule.selector.matches(plain_inst)


def test_a_node_and_its_workloads_add_up_to_the_node_cost_never_twice(cluster):
    """With a cluster configured, an EKS node is both an EC2 instance and the home of workloads: its inventory row
    carries only what its workloads do not (idle capacity), so the evaluated spend counts the node once."""
    from gpufinops.places.fleet import FleetCloud

    node_rate = 32.7726

    class OneNode:  # the EC2 side: the cluster's only node, at its EC2 rate
        last_errors: list = []

        def list_gpu_instances(self):
            return [GpuInstance("i-0aaa0000000000001", "p4d.24xlarge", "us-east-1", "running", NOW - timedelta(days=9),
                                gpu_count=8, hourly_cost=node_rate, managed_by="EKS node group 'ml-a100'")]

    listed = FleetCloud(OneNode(), cluster.cloud).list_gpu_instances()
    node = next(i for i in listed if i.instance_id == "i-0aaa0000000000001")
    workloads = [i for i in listed if i.instance_id.startswith("k8s:")]
    assert workloads and node.hourly_cost < node_rate and "node remainder" in node.price_source
    assert round(node.hourly_cost + sum(w.hourly_cost for w in workloads), 2) == round(node_rate, 2)


def test_an_hpa_appearing_after_the_mark_cancels_the_scale_down_and_says_what_to_do(cluster):
    """Issue 28: the workload was marked while nobody else scaled it; an HPA targeting it appears before the
    announced time. The next tick finds it owned: the mark is withdrawn with the HPA named, never scaled."""
    cluster.tick(0)
    assert MARK_ANNOTATION in cluster.deployment(cluster.idle)["metadata"]["annotations"]
    cluster.kube.add("horizontalpodautoscalers", {
        "metadata": {"name": "idle-infer", "namespace": cluster.idle.namespace},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": cluster.idle.name},
                 "minReplicas": 1, "maxReplicas": 4}})
    report = cluster.tick(16)
    [unmark] = [a for a in report.actions if a.instance_id == workload_id(cluster.idle)]
    assert unmark.kind == ActionKind.UNMARK
    assert f"managed by HorizontalPodAutoscaler '{cluster.idle.namespace}/idle-infer'" in unmark.reason
    assert "lower its minReplicas" in unmark.reason
    dep = cluster.deployment(cluster.idle)
    assert dep["spec"]["replicas"] == 2 and MARK_ANNOTATION not in dep["metadata"]["annotations"]
    assert not [r for r in cluster.patches("deployments", cluster.idle.name) if "spec" in (r.body or {})]
    assert not cluster.store.action_rows(kinds=[ActionKind.STOP])
