"""GPU nodes whose GPU work is gone, end to end through the tick (pipeline.run_once): the cluster read through the
official client from a real kube-apiserver (tests/kapi.py: the service's token bound to the shipped ClusterRole,
faults through the fault proxy in front of it), the watch of GPU-pod-free time kept in the store, node verdicts
under the rules that select `k8s:node`, notices and the cordon through the act chokepoint."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client
from gpufinops.places.kubernetes.cloud import WorkloadCloud
from gpufinops.places.kubernetes.nodes import node_id
from gpufinops.config import load_settings
from gpufinops.demo.sim import ConsoleNotifier
from gpufinops.k8s.model import CORDONED_ANNOTATION, MARK_ANNOTATION, TAG_NODE
from gpufinops.model import Action, ActionKind, Rule, RunContext, Selector
from gpufinops.run.nodes import WATCH_KEY
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.store.store import Store
from tests.kubestub import iso, node_obj, pod_obj

EMPTY, BUSY = "gpu-empty", "gpu-busy"  # each test's own: `kube.name(EMPTY)`
KARPENTER = {"karpenter.sh/nodepool": "gpu-pool"}
DRAIN = Rule(name="empty-gpu-nodes", threshold_pct=5.0, window_s=3600, warning_lead_s=900, action=Action.DRAIN,
             selector=Selector(tags={TAG_NODE: ("*",)}))
NOTIFY = Rule(name="empty-gpu-nodes-notify", threshold_pct=5.0, window_s=3600, action=Action.NOTIFY,
              selector=Selector(tags={TAG_NODE: ("*",)}))


class NoUsage:
    """No GPU workload runs on the empty node; the busy node's pod is a bare Pod judged without metrics here."""

    def window_usage(self, instances, window_s, now):
        return {}


def start_after(kube) -> datetime:
    """The test clock's start: the next whole minute after the nodes were made. The API server stamps a node's
    creationTimestamp itself (a builder's is ignored) and a node's GPU-pod-free time cannot start before it."""
    created = max(datetime.fromisoformat(n["metadata"]["creationTimestamp"]) for n in kube.list("nodes")
                  if n["metadata"]["name"].endswith(kube.suffix))
    return (created + timedelta(minutes=1)).replace(second=0, microsecond=0)


class Tick:
    def __init__(self, kube, tmp_path, *, drain_nodes=True):
        self.kube = kube
        self.empty, self.busy = kube.name(EMPTY), kube.name(BUSY)
        self.t0 = start_after(kube)
        self.now = self.t0
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        self.settings = load_settings(act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 1.0},
                                      schedule={"evaluate_every_s": 300},
                                      kubernetes={"kubeconfig": str(kubeconfig), "drain_nodes": drain_nodes},
                                      database_url=f"sqlite:///{tmp_path / 'gpufinops.db'}")
        self.store = Store(self.settings.database_url)
        self.cloud = WorkloadCloud(KubernetesCluster(api_client(str(kubeconfig)), timeout_s=2.0), lambda *_: 32.77,
                                   drain_nodes=drain_nodes, clock=lambda: self.now)
        self.notifier = ConsoleNotifier(self.store, lambda: self.now, lambda _line: None)
        self.peers = Peers(self.cloud, NoUsage(), self.store, self.notifier)

    def run(self, minutes: float, rules):
        self.now = self.t0 + timedelta(minutes=minutes)
        return run_once(RunContext(now=self.now, dry_run=False), self.settings, rules, self.peers)

    def node(self, name=None) -> dict:
        return self.kube.get("nodes", "", name or self.empty)

    def sent(self, name=None) -> list:
        return [m for m in self.notifier.sent if node_id(name or self.empty) in m.key]


@pytest.fixture
def tick(kapi_cluster, tmp_path):
    kube = kapi_cluster
    kube.add("nodes", node_obj(kube.name(EMPTY), "i-0aaa0000000000001", labels=KARPENTER))
    kube.add("nodes", node_obj(kube.name(BUSY), "i-0aaa0000000000002", labels=KARPENTER))
    kube.add("pods", pod_obj(kube.ns("ml"), "train-0", kube.name(BUSY)))
    return Tick(kube, tmp_path)


def test_the_tick_warns_then_cordons_an_empty_gpu_node_and_never_records_it_as_a_decision(tick):
    for minute in range(0, 60, 5):
        report = tick.run(minute, [DRAIN])
        assert not [a for a in report.actions if a.instance_id == node_id(tick.empty)]
    assert tick.store.get_kv(WATCH_KEY)  # kept between ticks, in the store
    report = tick.run(60, [DRAIN])
    [mark] = [a for a in report.actions if a.instance_id == node_id(tick.empty)]
    assert mark.kind == ActionKind.MARK and MARK_ANNOTATION in tick.node()["metadata"]["annotations"]
    assert not [d for d in report.decisions if d.instance_id.startswith("k8s:node/")]  # no cost counted twice
    tick.run(65, [DRAIN])
    tick.run(70, [DRAIN])
    report = tick.run(76, [DRAIN])
    [cordon] = [a for a in report.actions if a.instance_id == node_id(tick.empty)]
    assert cordon.kind == ActionKind.STOP and cordon.ok
    node = tick.node()
    assert node["spec"]["unschedulable"] is True and CORDONED_ANNOTATION in node["metadata"]["annotations"]
    assert tick.node(tick.busy)["spec"].get("unschedulable") is not True and not tick.sent(tick.busy)
    assert [m.key.split(":")[0] for m in tick.sent()] == ["warn", "stop"]


def test_a_node_an_admin_cordons_while_marked_loses_the_mark_and_its_warning_is_withdrawn_once(tick):
    """Through the tick as the service runs it: a node someone else cordoned is not judged, but a mark of
    gpufinops' on it is not left behind to outlive its announced time: withdrawn (one PATCH) and told once."""
    for minute in range(0, 65, 5):
        tick.run(minute, [DRAIN])
    assert MARK_ANNOTATION in tick.node()["metadata"]["annotations"]
    tick.kube.merge("nodes", "", tick.empty, {"spec": {"unschedulable": True}})  # kubectl cordon
    report = tick.run(70, [DRAIN])
    [withdrawn] = [a for a in report.actions if a.instance_id == node_id(tick.empty)]
    assert withdrawn.kind == ActionKind.UNMARK and withdrawn.ok
    node = tick.node()
    # the mark was its only annotation: the real server drops the emptied map (the stand-in kept {})
    assert MARK_ANNOTATION not in (node["metadata"].get("annotations") or {}) and node["spec"]["unschedulable"] is True
    assert tick.store.get_mark(node_id(tick.empty)) is None
    for minute in range(75, 125, 5):  # past the announced time: nothing more
        report = tick.run(minute, [DRAIN])
        assert not [a for a in report.actions if a.instance_id == node_id(tick.empty)]
    assert [m.key.split(":")[0] for m in tick.sent()] == ["warn", "unmark"]
    assert "cordoned by someone else" in tick.sent()[1].text
    assert CORDONED_ANNOTATION not in (tick.node()["metadata"].get("annotations") or {})


def test_a_notify_rule_tells_once_per_episode_and_changes_nothing(kapi_cluster, tmp_path):
    kapi_cluster.add("nodes", node_obj(kapi_cluster.name(EMPTY), "i-0aaa0000000000001", labels=KARPENTER))
    tick = Tick(kapi_cluster, tmp_path, drain_nodes=False)
    for minute in range(0, 125, 5):
        tick.run(minute, [NOTIFY])
    [notice] = tick.sent()
    assert notice.text.startswith("GPU node k8s:node/gpu-empty") and "$32.77/h" in notice.text
    assert not kapi_cluster.calls(verb="patch")


def test_a_failed_listing_judges_no_node_and_steps_no_watch(tick):
    for minute in range(0, 55, 5):
        tick.run(minute, [DRAIN])
    before = tick.store.get_kv(WATCH_KEY)
    tick.kube.fail_next(503, "list", "pods")  # from the fault proxy in front of the server
    report = tick.run(60, [DRAIN])
    assert report.errors and not [a for a in report.actions if a.instance_id.startswith("k8s:node/")]
    assert tick.store.get_kv(WATCH_KEY) == before
    assert MARK_ANNOTATION not in (tick.node()["metadata"].get("annotations") or {})
    # The next read comes 15 min after the last good one, more than two ticks (5 min) and a minute: what happened
    # in between was not seen (a GPU pod may have come and gone), so the free time starts again from this read.
    report = tick.run(65, [DRAIN])
    assert not [a for a in report.actions if a.instance_id == node_id(tick.empty)]
    from gpufinops.decide.workloads import watch_from_json

    assert watch_from_json(tick.store.get_kv(WATCH_KEY))[tick.empty].free_since == tick.now


def test_a_job_that_ran_between_two_ticks_is_seen_and_the_node_is_not_called_empty(tick):
    """A GPU pod that starts after one tick and finishes before the next never appears in the snapshot (finished
    pods are left out of it): the tick asks for the finished pods of the nodes it still sees free, and the free
    time starts at that pod's end, so the node is not cordoned for an hour it was working in."""
    from gpufinops.decide.workloads import watch_from_json

    for minute in range(0, 35, 5):
        tick.run(minute, [DRAIN])
    done = pod_obj(tick.kube.ns("ml"), "short-job-abc12", tick.empty, owner=("Job", "short-job"), phase="Succeeded")
    done["status"]["containerStatuses"] = [{"name": "main", "state": {"terminated": {
        "startedAt": iso(tick.t0 + timedelta(minutes=31)),
        "finishedAt": iso(tick.t0 + timedelta(minutes=33, seconds=30)),
        "exitCode": 0}}, "image": "img", "imageID": "", "ready": False, "restartCount": 0}]
    tick.kube.add("pods", done)
    tick.run(35, [DRAIN])
    # Asked with a field selector the real server evaluates (spec.nodeName, status.phase are pods' selectable fields)
    asked = [c for c in tick.kube.calls("list", "pods") if "spec.nodeName" in str(c.query)]
    assert asked and all(tick.empty in str(c.query) and tick.busy not in str(c.query) for c in asked)
    assert all(c.status == 200 for c in asked)
    assert watch_from_json(tick.store.get_kv(WATCH_KEY))[tick.empty].free_since == \
        tick.t0 + timedelta(minutes=33, seconds=30)
    for minute in range(40, 95, 5):  # an hour from 12:00 would have marked it at 13:00
        report = tick.run(minute, [DRAIN])
        assert not [a for a in report.actions if a.instance_id == node_id(tick.empty)], minute
    assert MARK_ANNOTATION not in (tick.node()["metadata"].get("annotations") or {})
    report = tick.run(95, [DRAIN])  # an hour after the short job ended
    assert [a.kind for a in report.actions if a.instance_id == node_id(tick.empty)] == [ActionKind.MARK]


def test_finished_pods_not_read_step_no_watch_and_judge_no_node(tick, monkeypatch):
    """The free time is believed only with the finished pods read: when that read fails, the watch is not
    stepped and no node is judged (never empty on data not read)."""
    from gpufinops.decide.workloads import watch_from_json

    for minute in range(0, 60, 5):
        tick.run(minute, [DRAIN])
    before = tick.store.get_kv(WATCH_KEY)
    listed = tick.cloud.cluster.snapshot

    def listed_then_failing(now):  # the snapshot's own reads succeed; the next pods list is answered 503
        snapshot = listed(now)
        tick.kube.fail_next(503, "list", "pods")
        return snapshot

    monkeypatch.setattr(tick.cloud.cluster, "snapshot", listed_then_failing)
    report = tick.run(60, [DRAIN])
    assert not [a for a in report.actions if a.instance_id.startswith("k8s:node/")]
    assert tick.store.get_kv(WATCH_KEY) == before
    assert MARK_ANNOTATION not in (tick.node()["metadata"].get("annotations") or {})
    monkeypatch.setattr(tick.cloud.cluster, "snapshot", listed)
    tick.run(70, [DRAIN])  # 15 min after the last stepped read (12:55): the time between was not seen
    assert watch_from_json(tick.store.get_kv(WATCH_KEY))[tick.empty].free_since == tick.now
