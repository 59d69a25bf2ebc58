"""GPU nodes whose GPU work is gone, end to end through the tick (pipeline.run_once): the cluster read through the
official client from the API stand-in, the watch of GPU-pod-free time kept in the store, node verdicts under the
rules that select `k8s:node`, notices and the cordon through the act chokepoint."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

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
from tests.kubestub import node_obj, pod_obj

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
EMPTY, BUSY = "gpu-empty", "gpu-busy"
KARPENTER = {"karpenter.sh/nodepool": "gpu-pool"}
DRAIN = Rule(name="empty-gpu-nodes", threshold_pct=5.0, window_s=3600, warning_lead_s=900, action=Action.DRAIN,
             selector=Selector(tags={TAG_NODE: ("*",)}))
NOTIFY = Rule(name="empty-gpu-nodes-notify", threshold_pct=5.0, window_s=3600, action=Action.NOTIFY,
              selector=Selector(tags={TAG_NODE: ("*",)}))


class NoUsage:
    """No GPU workload runs on the empty node; the busy node's pod is a bare Pod judged without metrics here."""

    def window_usage(self, instances, window_s, now):
        return {}


class Tick:
    def __init__(self, stub, tmp_path, *, drain_nodes=True):
        self.stub = stub
        self.now = T0
        kubeconfig = stub.write_kubeconfig(tmp_path / "kubeconfig")
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
        self.now = T0 + timedelta(minutes=minutes)
        return run_once(RunContext(now=self.now, dry_run=False), self.settings, rules, self.peers)

    def node(self, name=EMPTY) -> dict:
        return self.stub.get("nodes", "", name)

    def sent(self, name=EMPTY) -> list:
        return [m for m in self.notifier.sent if node_id(name) in m.key]


@pytest.fixture
def tick(kube_stub, tmp_path):
    kube_stub.add("nodes", node_obj(EMPTY, "i-0aaa0000000000001", labels=KARPENTER))
    kube_stub.add("nodes", node_obj(BUSY, "i-0aaa0000000000002", labels=KARPENTER))
    kube_stub.add("pods", pod_obj("ml", "train-0", BUSY))
    return Tick(kube_stub, tmp_path)


def test_the_tick_warns_then_cordons_an_empty_gpu_node_and_never_records_it_as_a_decision(tick):
    for minute in range(0, 60, 5):
        report = tick.run(minute, [DRAIN])
        assert not [a for a in report.actions if a.instance_id == node_id(EMPTY)]
    assert tick.store.get_kv(WATCH_KEY)  # kept between ticks, in the store
    report = tick.run(60, [DRAIN])
    [mark] = [a for a in report.actions if a.instance_id == node_id(EMPTY)]
    assert mark.kind == ActionKind.MARK and MARK_ANNOTATION in tick.node()["metadata"]["annotations"]
    assert not [d for d in report.decisions if d.instance_id.startswith("k8s:node/")]  # no cost counted twice
    tick.run(65, [DRAIN])
    tick.run(70, [DRAIN])
    report = tick.run(76, [DRAIN])
    [cordon] = [a for a in report.actions if a.instance_id == node_id(EMPTY)]
    assert cordon.kind == ActionKind.STOP and cordon.ok
    node = tick.node()
    assert node["spec"]["unschedulable"] is True and CORDONED_ANNOTATION in node["metadata"]["annotations"]
    assert tick.node(BUSY)["spec"].get("unschedulable") is not True and not tick.sent(BUSY)
    assert [m.key.split(":")[0] for m in tick.sent()] == ["warn", "stop"]


def test_a_node_an_admin_cordons_while_marked_loses_the_mark_and_its_warning_is_withdrawn_once(tick):
    """Through the tick as the service runs it: a node someone else cordoned is not judged, but a mark of
    gpufinops' on it is not left behind to outlive its announced time: withdrawn (one PATCH) and told once."""
    for minute in range(0, 65, 5):
        tick.run(minute, [DRAIN])
    assert MARK_ANNOTATION in tick.node()["metadata"]["annotations"]
    node = tick.node()
    node["spec"]["unschedulable"] = True  # kubectl cordon
    tick.stub.add("nodes", node)
    report = tick.run(70, [DRAIN])
    [withdrawn] = [a for a in report.actions if a.instance_id == node_id(EMPTY)]
    assert withdrawn.kind == ActionKind.UNMARK and withdrawn.ok
    node = tick.node()
    assert MARK_ANNOTATION not in node["metadata"]["annotations"] and node["spec"]["unschedulable"] is True
    assert tick.store.get_mark(node_id(EMPTY)) is None
    for minute in range(75, 125, 5):  # past the announced time: nothing more
        report = tick.run(minute, [DRAIN])
        assert not [a for a in report.actions if a.instance_id == node_id(EMPTY)]
    assert [m.key.split(":")[0] for m in tick.sent()] == ["warn", "unmark"]
    assert "cordoned by someone else" in tick.sent()[1].text
    assert CORDONED_ANNOTATION not in tick.node()["metadata"]["annotations"]


def test_a_notify_rule_tells_once_per_episode_and_changes_nothing(kube_stub, tmp_path):
    kube_stub.add("nodes", node_obj(EMPTY, "i-0aaa0000000000001", labels=KARPENTER))
    tick = Tick(kube_stub, tmp_path, drain_nodes=False)
    for minute in range(0, 125, 5):
        tick.run(minute, [NOTIFY])
    [notice] = tick.sent()
    assert notice.text.startswith("GPU node k8s:node/gpu-empty") and "$32.77/h" in notice.text
    assert not kube_stub.calls(verb="patch")


def test_a_failed_listing_judges_no_node_and_steps_no_watch(tick):
    for minute in range(0, 55, 5):
        tick.run(minute, [DRAIN])
    before = tick.store.get_kv(WATCH_KEY)
    tick.stub.fail_next(503, "list", "pods")
    report = tick.run(60, [DRAIN])
    assert report.errors and not [a for a in report.actions if a.instance_id.startswith("k8s:node/")]
    assert tick.store.get_kv(WATCH_KEY) == before
    assert MARK_ANNOTATION not in (tick.node()["metadata"].get("annotations") or {})
    # The next read comes 15 min after the last good one, more than two ticks (5 min) and a minute: what happened
    # in between was not seen (a GPU pod may have come and gone), so the free time starts again from this read.
    report = tick.run(65, [DRAIN])
    assert not [a for a in report.actions if a.instance_id == node_id(EMPTY)]
    from gpufinops.decide.workloads import watch_from_json

    assert watch_from_json(tick.store.get_kv(WATCH_KEY))[EMPTY].free_since == tick.now


def test_a_job_that_ran_between_two_ticks_is_seen_and_the_node_is_not_called_empty(tick):
    """A GPU pod that starts after one tick and finishes before the next never appears in the snapshot (finished
    pods are left out of it): the tick asks for the finished pods of the nodes it still sees free, and the free
    time starts at that pod's end, so the node is not cordoned for an hour it was working in."""
    from gpufinops.decide.workloads import watch_from_json

    for minute in range(0, 35, 5):
        tick.run(minute, [DRAIN])
    done = pod_obj("ml", "short-job-abc12", EMPTY, owner=("Job", "short-job"), phase="Succeeded")
    done["status"]["containerStatuses"] = [{"name": "main", "state": {"terminated": {
        "startedAt": "2026-12-01T12:31:00Z", "finishedAt": "2026-12-01T12:33:30Z"}}}]
    tick.stub.add("pods", done)
    tick.run(35, [DRAIN])
    asked = [c for c in tick.stub.calls("list", "pods") if "spec.nodeName" in str(c.query)]
    assert asked and all(EMPTY in str(c.query) and BUSY not in str(c.query) for c in asked)
    assert watch_from_json(tick.store.get_kv(WATCH_KEY))[EMPTY].free_since == T0 + timedelta(minutes=33, seconds=30)
    for minute in range(40, 95, 5):  # an hour from 12:00 would have marked it at 13:00
        report = tick.run(minute, [DRAIN])
        assert not [a for a in report.actions if a.instance_id == node_id(EMPTY)], minute
    assert MARK_ANNOTATION not in (tick.node()["metadata"].get("annotations") or {})
    report = tick.run(95, [DRAIN])  # an hour after the short job ended
    assert [a.kind for a in report.actions if a.instance_id == node_id(EMPTY)] == [ActionKind.MARK]


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
        tick.stub.fail_next(503, "list", "pods")
        return snapshot

    monkeypatch.setattr(tick.cloud.cluster, "snapshot", listed_then_failing)
    report = tick.run(60, [DRAIN])
    assert not [a for a in report.actions if a.instance_id.startswith("k8s:node/")]
    assert tick.store.get_kv(WATCH_KEY) == before
    assert MARK_ANNOTATION not in (tick.node()["metadata"].get("annotations") or {})
    monkeypatch.setattr(tick.cloud.cluster, "snapshot", listed)
    tick.run(70, [DRAIN])  # 15 min after the last stepped read (12:55): the time between was not seen
    assert watch_from_json(tick.store.get_kv(WATCH_KEY))[EMPTY].free_since == tick.now
