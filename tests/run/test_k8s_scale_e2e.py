"""Scale to zero end to end: the tick (pipeline.run_once) over Kubernetes workloads read through the official client
from the API stand-in (tests/kubestub.py), per-pod DCGM usage from a real Prometheus, warnings through the Slack
stub, every change through the act chokepoint; then `gpufinops k8s restore`."""

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
from tests.kubestub import RESOURCES, node_obj, owned, pod_obj, start_kube_stub
from tests.places.kubernetes.test_rbac import granted
from tests.promserver import Series, binaries_missing, dcgm_labels, start_prometheus

pytestmark = pytest.mark.integration

SCRAPE = 30
WINDOW = 1800
LEAD = 900
NOW = datetime.fromtimestamp(int(time.time()) // SCRAPE * SCRAPE, timezone.utc)
LONG_AGO = NOW - timedelta(days=2)
NODE = "ip-10-0-1-1.ec2.internal"
RULE = Rule(name="k8s-idle", threshold_pct=5.0, window_s=WINDOW, warning_lead_s=LEAD, action=Action.STOP)

IDLE = WorkloadRef("ml", "Deployment", "idle-infer")
BUSY = WorkloadRef("ml", "Deployment", "busy-train")
JOB = WorkloadRef("research", "Job", "batch-eval")
LOCKED = WorkloadRef("locked", "Deployment", "idle-locked")
QUEUED = WorkloadRef("research", "Deployment", "kueue-infer")
# pod -> (gpu index, util %) on NODE
PODS = {
    "idle-infer-7d9f-aaaaa": (IDLE, 0, 0.0), "idle-infer-7d9f-bbbbb": (IDLE, 1, 0.0),
    "busy-train-7d9f-ccccc": (BUSY, 2, 80.0), "batch-eval-x1x1x": (JOB, 3, 0.0),
    "idle-locked-55c-ddddd": (LOCKED, 4, 0.0), "kueue-infer-66d-eeeee": (QUEUED, 5, 0.0),
}


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
    for pod, (ref, gpu, util) in PODS.items():
        labels = dcgm_labels(NODE.split(".")[0], gpu, pod=pod, namespace=ref.namespace, container="main")
        series += [Series(GPU_UTIL, labels, [(t, util) for t in grid()]),
                   Series(FB_USED, labels, [(t, 512.0) for t in grid()])]
    server = start_prometheus(tmp_path_factory.mktemp("k8s-scale-prom"), series)
    yield server.url
    server.stop()


def fill_cluster(stub) -> None:
    stub.add("nodes", node_obj(NODE, "i-0aaa0000000000001", gpus=8, created=LONG_AGO,
                               labels={"eks.amazonaws.com/nodegroup": "ml-a100",
                                       "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}))
    for ns, labels in (("ml", {"team": "ml"}), ("research", {}), ("locked", {"gpufinops.io/protect": "true"})):
        stub.add("namespaces", {"metadata": {"name": ns, "labels": labels}})
    for ref, replicas, labels in ((IDLE, 2, {"team": "ml"}), (BUSY, 1, {"team": "ml"}), (LOCKED, 1, {}),
                                  (QUEUED, 1, {"kueue.x-k8s.io/queue-name": "gpu-queue"})):
        stub.add("deployments", owned(ref.namespace, ref.name, replicas=replicas, labels=labels,
                                      annotations={"owner": "alice@example.com"}))
    stub.add("jobs", owned("research", JOB.name))
    for pod, (ref, _gpu, _util) in PODS.items():
        rs = pod.rsplit("-", 1)[0]
        if ref.kind == "Deployment":
            stub.add("replicasets", owned(ref.namespace, rs, owner=("Deployment", ref.name)))
            owner = ("ReplicaSet", rs)
        else:
            owner = ("Job", ref.name)
        stub.add("pods", pod_obj(ref.namespace, pod, NODE, owner=owner, started=LONG_AGO))


class Cluster:
    """A kube stand-in, the cloud over it and a tick on an injected clock."""

    def __init__(self, tmp_path, prom_url, slack_stub, monkeypatch, *, dry_run=False):
        self.stub, self.server = start_kube_stub()
        fill_cluster(self.stub)
        self.now = NOW
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
        kubeconfig = self.stub.write_kubeconfig(tmp_path / "kubeconfig")
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
        return self.stub.get("deployments", ref.namespace, ref.name)

    def patches(self, resource: str | None = None, name: str | None = None):
        return [r for r in self.stub.calls(verb="patch", resource=resource)
                if name is None or r.path.rstrip("/").split("/")[-1] == name]

    def events(self, reason: str):
        return [e for e in self.stub.objects["events"].values() if e.get("reason") == reason]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def cluster(tmp_path, prom_url, slack_stub, monkeypatch):
    c = Cluster(tmp_path, prom_url, slack_stub, monkeypatch)
    yield c
    c.close()


def by_id(report):
    return {d.instance_id: d for d in report.decisions}


def test_an_idle_deployment_is_marked_warned_scaled_to_zero_and_restored(cluster, slack_stub, tmp_path, capsys):
    from gpufinops.cli.app import main

    idle_id = workload_id(IDLE)
    first = cluster.tick(0)
    decisions = by_id(first)
    assert decisions[idle_id].verdict == Verdict.IDLE, decisions[idle_id].reason
    assert decisions[workload_id(BUSY)].verdict == Verdict.ACTIVE
    # Marked: the annotation with the announced time, an Event on the object, a Slack warning naming it.
    dep = cluster.deployment(IDLE)
    stop_at = dep["metadata"]["annotations"][MARK_ANNOTATION]
    assert stop_at == (NOW + timedelta(seconds=LEAD)).strftime("%Y-%m-%dT%H:%M:%SZ")
    [event] = cluster.events(EVENT_MARKED)
    assert event["involvedObject"]["name"] == IDLE.name and stop_at in event["message"]
    warnings = [m for m in slack_stub.posted("#gpu-finops") if idle_id in m.get("text", "")]
    assert warnings and "Idle GPU workload" in warnings[0]["text"] and "will be scaled to zero" in warnings[0]["text"]
    assert "gpufinops.io/snooze-until" in warnings[0]["text"]  # how to keep it, in the workload's own terms
    # The busy one is not marked; nothing was asked of the scale subresource or of any other object.
    assert MARK_ANNOTATION not in (cluster.deployment(BUSY)["metadata"].get("annotations") or {})
    assert {r.path.rsplit("/", 1)[-1] for r in cluster.patches()} == {IDLE.name}

    cluster.tick(10)  # before the announced time: nothing more
    assert cluster.deployment(IDLE)["spec"]["replicas"] == 2

    cluster.tick(16)  # at the time, still idle: scaled to 0, the count kept in the same patch
    dep = cluster.deployment(IDLE)
    annotations = dep["metadata"]["annotations"]
    assert dep["spec"]["replicas"] == 0 and annotations[REPLICAS_BEFORE_ANNOTATION] == "2"
    assert MARK_ANNOTATION not in annotations and annotations["gpufinops.io/scaled-down-by"] == "gpufinops"
    [scale] = [r for r in cluster.patches("deployments", IDLE.name) if "spec" in (r.body or {})]
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
    with cluster.stub.lock:
        for key in [k for k in cluster.stub.objects["pods"] if k[1].startswith("idle-infer")]:
            del cluster.stub.objects["pods"][key]
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {cluster.kubeconfig}\nact:\n  dry_run: false\n"
                   f"database_url: {cluster.settings.database_url}\n")
    assert main(["--config", str(cfg), "k8s", "restore", "ml/idle-infer", "--by", "alice"]) == 0, \
        capsys.readouterr().err
    assert "restored to 2 replicas for alice" in capsys.readouterr().out
    dep = cluster.deployment(IDLE)
    assert dep["spec"]["replicas"] == 2
    assert not {REPLICAS_BEFORE_ANNOTATION, MARK_ANNOTATION, "gpufinops.io/scaled-down-by"} & set(
        dep["metadata"]["annotations"])
    assert dep["metadata"]["annotations"]["owner"] == "alice@example.com"
    assert cluster.events(EVENT_RESTORED)
    [row] = [a for a in cluster.store.action_rows() if "restore" in a.reason]
    assert row.instance_id == idle_id and row.status == "done" and not row.dry_run
    # A second restore finds nothing of gpufinops' to undo and asks nothing of the API server.
    before = len(cluster.patches())
    assert main(["--config", str(cfg), "k8s", "restore", "ml/idle-infer"]) == 1
    assert "not scaled down by gpufinops" in capsys.readouterr().err and len(cluster.patches()) == before
    # Every call of the whole cycle is one the shipped ClusterRole grants.
    rights = granted()
    for call in cluster.stub.requests:
        prefix = RESOURCES[call.resource.split("/")[0]][0]
        group = "" if prefix == "/api/v1" else prefix.split("/")[2]
        assert call.verb in rights.get((group, call.resource), set()), (group, call.resource, call.verb)


def test_jobs_kueue_and_protected_namespaces_are_reported_never_touched(cluster):
    report = cluster.tick(0)
    decisions = by_id(report)
    actions = {a.instance_id: a for a in report.actions}
    assert decisions[workload_id(JOB)].verdict == Verdict.IDLE
    assert "managed by Kubernetes Job 'batch-eval'" in actions[workload_id(JOB)].reason
    assert "lower its parallelism or delete it" in actions[workload_id(JOB)].reason
    assert "Kueue (queue 'gpu-queue')" in actions[workload_id(QUEUED)].reason
    assert "action: suspend" in actions[workload_id(QUEUED)].reason
    assert actions[workload_id(LOCKED)].kind == ActionKind.SKIP
    assert "namespace locked" in actions[workload_id(LOCKED)].reason
    cluster.tick(16)
    cluster.tick(20)
    patched = {r.path.rsplit("/", 1)[-1] for r in cluster.patches()}
    assert patched == {IDLE.name}  # only the idle, unmanaged, unprotected Deployment
    assert not cluster.patches("jobs") and not cluster.stub.calls(verb="create", resource="jobs")
    assert cluster.deployment(LOCKED)["spec"]["replicas"] == 1 and cluster.deployment(QUEUED)["spec"]["replicas"] == 1
    # The cloud itself refuses to change what it reports only, whatever asks.
    job = next(i for i in cluster.cloud.list_gpu_instances() if i.instance_id == workload_id(JOB))
    with pytest.raises(Exception, match="never changes") as err:
        cluster.cloud.set_tags(job, {TAG_MARKED: "now"})
    assert err.value.definite
    assert job.is_protected is False and TAG_PROTECT in next(
        i for i in cluster.cloud.list_gpu_instances() if i.instance_id == workload_id(LOCKED)).tags


def test_with_scale_to_zero_off_an_idle_deployment_is_reported_never_patched(cluster):
    """kubernetes.scale_to_zero is off by default: adding a cluster must not let stop rules written for EC2
    instances start scaling Deployments."""
    cluster.cloud.scale_to_zero = False
    report = cluster.tick(0)
    idle_id = workload_id(IDLE)
    assert by_id(report)[idle_id].verdict == Verdict.IDLE
    [action] = [a for a in report.actions if a.instance_id == idle_id]
    assert "scale-to-zero is off" in action.reason and "kubernetes.scale_to_zero: true" in action.reason
    cluster.tick(16)
    assert not cluster.patches() and cluster.deployment(IDLE)["spec"]["replicas"] == 2
    assert load_settings(kubernetes={"kubeconfig": "k"}).kubernetes.scale_to_zero is False


def test_a_409_on_the_scale_patch_is_retried_once_and_logged(cluster, caplog):
    cluster.tick(0)
    cluster.stub.conflict_next("patch", "deployments")
    with caplog.at_level(logging.WARNING, logger="gpufinops.kubernetes"):
        cluster.tick(16)
    assert cluster.deployment(IDLE)["spec"]["replicas"] == 0
    assert cluster.deployment(IDLE)["metadata"]["annotations"][REPLICAS_BEFORE_ANNOTATION] == "2"
    conflicted = [r for r in cluster.patches("deployments", IDLE.name) if r.status == 409]
    assert len(conflicted) == 1
    assert cluster.cloud.conflicts_retried == [f"patch deployments {IDLE.namespace}/{IDLE.name}"]
    assert any("409 Conflict" in r.getMessage() for r in caplog.records)
    assert [s.status for s in cluster.store.action_rows(kinds=[ActionKind.STOP])] == ["done"]


def test_two_409s_fail_the_stop_definitely_and_the_row_says_so(cluster):
    cluster.tick(0)
    cluster.stub.conflict_next("patch", "deployments")
    cluster.stub.conflict_next("patch", "deployments")
    cluster.tick(16)
    [row] = cluster.store.action_rows(kinds=[ActionKind.STOP])
    assert row.status == "failed" and "409 Conflict again after one re-read and retry" in row.error
    assert cluster.deployment(IDLE)["spec"]["replicas"] == 2


def test_a_403_is_recorded_failed_with_the_state_read_back(cluster):
    cluster.tick(0)
    cluster.stub.forbid("patch", "deployments")
    cluster.tick(16)
    [row] = cluster.store.action_rows(kinds=[ActionKind.STOP])
    assert row.status == "failed"
    assert "403 Forbidden" in row.error and "rbac-clusterrole.yaml" in row.error and "[not done]" in row.error
    assert cluster.deployment(IDLE)["spec"]["replicas"] == 2  # read back: still running, so failed (not unconfirmed)
    assert cluster.stub.calls(verb="get", resource="deployments")  # the read-back


def test_dry_run_makes_no_patch_and_no_event(tmp_path, prom_url, slack_stub, monkeypatch):
    c = Cluster(tmp_path, prom_url, slack_stub, monkeypatch, dry_run=True)
    try:
        c.tick(0)
        c.tick(16)
        assert not c.stub.calls(verb="patch") and not c.stub.calls(verb="create")
        stops = c.store.action_rows(kinds=[ActionKind.STOP])
        assert stops and all(s.dry_run and "would stop" in s.reason for s in stops)
        assert c.deployment(IDLE)["spec"]["replicas"] == 2
        # k8s restore in dry-run changes nothing either.
        outcome = restore_workload(c.cloud, c.store, "ml/idle-infer", c.now, dry_run=True)
        assert not outcome.ok and "not scaled down by gpufinops" in outcome.message
        assert not c.stub.calls(verb="patch")
    finally:
        c.close()


def test_workload_ids_are_stable_parseable_and_fit_the_store():
    assert workload_id(IDLE) == "k8s:ml/Deployment/idle-infer"
    assert parse_workload_id("k8s:ml/Deployment/idle-infer") == IDLE
    long = WorkloadRef("a-very-long-namespace-name-for-a-team", "StatefulSet", "a-very-long-statefulset-name-x")
    cut = workload_id(long)
    assert len(cut) == 64 and "~" in cut and workload_id(long) == cut and parse_workload_id(cut) is None


def test_a_crash_after_the_scale_is_reconciled_done_and_never_repeated(cluster):
    """The stop's intent was written and the patch went through, then the process died: the next tick reads the
    object back (0 replicas + the kept count = stopped), settles the row done and patches nothing again."""
    cluster.tick(0)
    [inst] = [i for i in cluster.cloud.list_gpu_instances() if i.instance_id == workload_id(IDLE)]
    row = cluster.store.begin_action("crashed", inst.instance_id, ActionKind.STOP, RULE.name, False,
                                     "still idle at the announced time: idle", NOW + timedelta(minutes=16))
    cluster.cloud.stop(inst)
    scale_patches = len(cluster.patches("deployments", IDLE.name))
    cluster.tick(17)
    [settled] = [a for a in cluster.store.action_rows(kinds=[ActionKind.STOP]) if a.id == row]
    assert settled.status == "done" and "reconciled: instance found stopped" in settled.error
    bodies = [r.body for r in cluster.patches("deployments", IDLE.name)[scale_patches:]]
    assert all("spec" not in b for b in bodies)  # bookkeeping annotations only, no second scale


def test_a_crash_before_the_scale_is_reconciled_failed(cluster):
    cluster.tick(0)
    row = cluster.store.begin_action("crashed", workload_id(IDLE), ActionKind.STOP, RULE.name, False,
                                     "still idle at the announced time: idle", NOW + timedelta(minutes=16))
    cluster.tick(16.5)
    [settled] = [a for a in cluster.store.action_rows(kinds=[ActionKind.STOP]) if a.id == row]
    assert settled.status == "failed" and "still running" in settled.error


def test_compose_puts_ec2_instances_and_workloads_side_by_side(tmp_path, prom_url, slack_stub, aws, monkeypatch):
    """compose.live_peers with a `kubernetes:` section: one inventory, one metrics source, ids dispatched by the
    `k8s:` prefix, EC2 listed as before."""
    from gpufinops.run.compose import live_peers
    from gpufinops.places.fleet import FleetCloud, FleetMetrics

    c = Cluster(tmp_path, prom_url, slack_stub, monkeypatch)
    try:
        [iid] = aws.launch("g5.xlarge", tags={"team": "ml"})
        settings = c.settings.model_copy(update={"aws": c.settings.aws.model_copy(
            update={"regions": ("us-east-1",), "endpoint_url": aws.endpoint_url})})
        peers = live_peers(settings)
        assert isinstance(peers.cloud, FleetCloud) and isinstance(peers.metrics, FleetMetrics)
        listed = {i.instance_id: i for i in peers.cloud.list_gpu_instances()}
        assert iid in listed and workload_id(IDLE) in listed and not peers.cloud.last_errors
        assert listed[workload_id(IDLE)].gpu_count == 2 and listed[workload_id(IDLE)].gpu_model.startswith("NVIDIA")
        usage = peers.metrics.window_usage(list(listed.values()), WINDOW, NOW)
        assert len(usage[workload_id(IDLE)].gpus) == 2 and usage[workload_id(IDLE)].error is None
        found = peers.cloud.describe([workload_id(IDLE), iid])
        assert [i.instance_id for i in found] == [workload_id(IDLE), iid]
    finally:
        c.close()


def test_a_5xx_on_the_scale_leaves_it_unconfirmed_until_read_back(cluster):
    cluster.tick(0)
    cluster.stub.fail_next(500, "patch", "deployments")
    cluster.tick(16)
    [row] = cluster.store.action_rows(kinds=[ActionKind.STOP])
    assert row.status == "unconfirmed" and "[outcome unknown]" in row.error
    cluster.tick(17)  # reconciled from the object (still 2 replicas: not done), then stopped for real
    rows = cluster.store.action_rows(kinds=[ActionKind.STOP])
    assert [r.status for r in rows] == ["failed", "done"] and cluster.deployment(IDLE)["spec"]["replicas"] == 0


def test_annotations_and_namespace_labels_map_to_gpufinops_tags():
    from gpufinops.places.kubernetes.cloud import workload_tags
    from gpufinops.model import TAG_SNOOZE

    tags = workload_tags({"team": "ml", "gpufinops.io/protect": "false"},
                         {"owner": "alice", MARK_ANNOTATION: "2026-12-01T10:00:00Z"}, IDLE,
                         {"gpufinops.io/snooze-until": "20261224T1800Z"})
    assert tags[TAG_MARKED] == "2026-12-01T10:00:00Z" and MARK_ANNOTATION not in tags
    assert tags[TAG_PROTECT] == "false" and tags[TAG_SNOOZE] == "20261224T1800Z"
    assert tags["owner"] == "alice" and tags["team"] == "ml" and tags["k8s:namespace"] == "ml"
    protected = workload_tags({}, {"gpufinops.io/protect": "false"}, IDLE, {"gpufinops.io/protect": "yes"})
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
    assert MARK_ANNOTATION in cluster.deployment(IDLE)["metadata"]["annotations"]
    cluster.stub.add("horizontalpodautoscalers", {
        "metadata": {"name": "idle-infer", "namespace": "ml"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": IDLE.name},
                 "minReplicas": 1, "maxReplicas": 4}})
    report = cluster.tick(16)
    [unmark] = [a for a in report.actions if a.instance_id == workload_id(IDLE)]
    assert unmark.kind == ActionKind.UNMARK and "managed by HorizontalPodAutoscaler 'ml/idle-infer'" in unmark.reason
    assert "lower its minReplicas" in unmark.reason
    dep = cluster.deployment(IDLE)
    assert dep["spec"]["replicas"] == 2 and MARK_ANNOTATION not in dep["metadata"]["annotations"]
    assert not [r for r in cluster.patches("deployments", IDLE.name) if "spec" in (r.body or {})]
    assert not cluster.store.action_rows(kinds=[ActionKind.STOP])
