"""GPU nodes whose GPU work is gone, cordoned through the act stage (issue 28 item 4), and the fault matrix's node
cases: the real Actuator and store against a real kube-apiserver (tests/kapi.py: the service's token bound to the
shipped ClusterRole), every request recorded by the fault proxy in front of it, which also loses answers on demand.

- an empty GPU node in a Karpenter NodePool: marked (annotation), warned with the rule's full lead, then cordoned
  in one PATCH preconditioned on the resourceVersion that showed the mark; no pod is ever evicted, nothing deleted;
- a GPU pod scheduled onto the node between the mark and the cordon: not cordoned, and the mark withdrawn;
- a cordon whose answer is lost: one PATCH, read back, one notice;
- karpenter.sh/do-not-disrupt, an EKS managed node group, or drain_nodes off: warned "notify only", never cordoned;
- uncordon (gpufinops k8s restore node/NAME) undoes only gpufinops' own cordon;
- a marked node an admin cordons before gpufinops does: the mark withdrawn (one preconditioned PATCH), one
  "Cordon cancelled" under the warning, their cordon left as it is."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufinops.act.actuator import Actuator
from gpufinops.act.restore import restore_workload
from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client
from gpufinops.places.kubernetes.cloud import WorkloadCloud
from gpufinops.places.kubernetes.nodes import node_id
from gpufinops.config import load_settings
from gpufinops.decide.workloads import empty_gpu_nodes, node_decision, watch_gpu_free
from gpufinops.demo.sim import ConsoleNotifier
from gpufinops.k8s.model import CORDONED_ANNOTATION, MARK_ANNOTATION, TAG_NODE
from gpufinops.model import Action, ActionKind, Rule, RunContext, Selector, Verdict
from gpufinops.store.store import Store
from tests.kapi import KapiCluster
from tests.kubestub import node_obj, pod_obj
from tests.run.test_k8s_nodes_e2e import start_after

NODE = "gpu-node-1"  # as written; each test's own is `kube.name(NODE)` (World.node_name, World.nid)
BUSY = "gpu-node-2"
KARPENTER = {"karpenter.sh/nodepool": "gpu-pool"}
RULE = Rule(name="empty-gpu-nodes", threshold_pct=0.0, window_s=3600, warning_lead_s=900, action=Action.DRAIN,
            selector=Selector(tags={TAG_NODE: ("*",)}))


def fill(kube: KapiCluster, labels=KARPENTER, annotations=None) -> None:
    obj = node_obj(kube.name(NODE), "i-0aaa0000000000001", labels=labels)
    obj["metadata"]["annotations"] = dict(annotations or {})
    kube.add("nodes", obj)
    kube.add("nodes", node_obj(kube.name(BUSY), "i-0aaa0000000000002", labels=KARPENTER))
    kube.add("pods", pod_obj(kube.ns("ml"), "train-0", kube.name(BUSY)))
    # a non-GPU pod keeps no node
    kube.add("pods", pod_obj(kube.ns("kube-system"), "node-exporter-x", kube.name(NODE), gpus=0))


class World:
    """The test's part of the real API server, WorkloadCloud over it, a real store and the Actuator on a simulated
    clock that starts after the server stamped the nodes' creationTimestamp (a node's GPU-free time cannot start
    before it); node verdicts from the pure watch, stepped once per tick as the service does."""

    def __init__(self, kube: KapiCluster, tmp_path, *, drain_nodes: bool = True, dry_run: bool = False):
        self.kube = kube
        self.node_name, self.busy_name = kube.name(NODE), kube.name(BUSY)
        self.nid = node_id(self.node_name)
        self.ml = kube.ns("ml")
        self.t0 = start_after(kube)
        self.now = self.t0
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        self.cloud = WorkloadCloud(KubernetesCluster(api_client(str(kubeconfig)), timeout_s=2.0), lambda *_: 32.77,
                                   drain_nodes=drain_nodes, clock=lambda: self.now)
        self.store = Store(f"sqlite:///{tmp_path / 'gpufinops.db'}")
        self.settings = load_settings(act={"dry_run": dry_run, "max_stops_per_run": 5, "max_stops_fraction": 1.0})
        self.lines: list[str] = []
        self.notifier = ConsoleNotifier(self.store, lambda: self.now, self.lines.append)
        self.actuator = Actuator(self.cloud, self.store, self.notifier, self.settings)
        self.dry_run = dry_run
        self.watch: dict = {}

    def tick(self, minutes: float, rule: Rule = RULE, before_act=None):
        self.now = self.t0 + timedelta(minutes=minutes)
        self.cloud.list_gpu_instances()
        snap = self.cloud.last_snapshot
        self.watch = watch_gpu_free(self.watch, snap, max_gap_s=3600)
        nodes = self.cloud.list_nodes()
        verdicts = {v.node: v for v in empty_gpu_nodes(snap, self.watch, rule.window_s, self.cloud.node_costs)}
        decisions = [node_decision(verdicts[i.private_dns], i.instance_id, rule, self.now) for i in nodes
                     if rule.selector.matches(i)]
        if before_act:
            before_act()
        results = self.actuator.apply(RunContext(now=self.now, dry_run=self.dry_run), nodes, decisions, [rule])
        return {r.instance_id: r for r in results}

    def node(self, name: str | None = None) -> dict:
        return self.kube.get("nodes", "", name or self.node_name)

    def annotations(self, name: str | None = None) -> dict:
        """The node's annotations; the real server drops an emptied map (the stand-in kept `{}`)."""
        return self.node(name)["metadata"].get("annotations") or {}

    def cordons(self) -> list:
        return [r for r in self.kube.calls(verb="patch", resource="nodes") if "spec" in (r.body or {})]

    def rows(self, kind: ActionKind | None = None):
        return [a for a in self.store.action_rows() if kind is None or a.kind == kind]

    def notices(self, prefix: str) -> list:
        return [m for m in self.notifier.sent if m.key.startswith(f"{prefix}:{self.nid}")]


@pytest.fixture
def world(kapi_cluster, tmp_path):
    fill(kapi_cluster)
    return World(kapi_cluster, tmp_path)


def idle_then_marked(world: World) -> None:
    """Ticks every 5 min until the node has been free for the rule's hour: then marked and warned."""
    for minute in range(0, 60, 5):
        assert world.nid not in world.tick(minute)  # not empty for the window yet: nothing done
    result = world.tick(60)[world.nid]
    assert result.kind == ActionKind.MARK and result.ok
    assert MARK_ANNOTATION in world.annotations()


def assert_cordoned_once(world: World) -> None:
    assert len(world.cordons()) == 1
    node = world.node()
    assert node["spec"]["unschedulable"] is True and CORDONED_ANNOTATION in node["metadata"]["annotations"]
    assert MARK_ANNOTATION not in world.annotations()
    [row] = world.rows(ActionKind.STOP)
    assert row.status == "done"
    assert not world.store.action_rows(status=("pending", "unconfirmed", "applied"))
    assert len(world.notices("warn")) == 1 and len(world.notices("stop")) == 1
    # Never an eviction, a deletion, or a change to anything but the node.
    assert not world.kube.calls(verb="create", resource="pods/eviction")
    assert not world.kube.calls(verb="delete")
    assert {r.resource for r in world.kube.calls(verb="patch")} == {"nodes"}


def test_an_empty_gpu_node_is_warned_then_cordoned_after_the_full_lead(world):
    idle_then_marked(world)
    [warning] = world.notices("warn")
    assert "Idle GPU node" in warning.text and "will be cordoned" in warning.text and "$32.77/h" in warning.text
    assert "Karpenter NodePool 'gpu-pool'" in warning.text
    assert world.busy_name not in " ".join(m.text for m in world.notifier.sent)  # the node with a GPU pod is left alone
    assert world.tick(70) == {} or world.nid not in world.tick(70)  # within the lead: nothing
    assert not world.cordons()
    result = world.tick(76)[world.nid]
    assert result.ok and result.kind == ActionKind.STOP
    [cordon] = world.cordons()
    # One PATCH, preconditioned on the resourceVersion of the read that showed the mark.
    assert cordon.body["spec"] == {"unschedulable": True}
    assert cordon.body["metadata"]["resourceVersion"]
    world.tick(80)
    assert_cordoned_once(world)
    [done] = world.notices("stop")
    assert done.text.startswith(f"Cordoned idle GPU node k8s:node/{world.node_name}")
    assert "Once its autoscaler removes it, that saves $32.77/h." in done.text  # a cordon alone saves nothing


def test_a_gpu_pod_scheduled_between_mark_and_cordon_prevents_it_and_withdraws_the_mark(world):
    idle_then_marked(world)
    # The pod lands after this tick's listing and plan, right before the cordon: the re-read just before it wins.
    result = world.tick(76, before_act=lambda: world.kube.add("pods", pod_obj(world.ml, "late-job", world.node_name))
                        )[world.nid]
    late = f"{world.ml}/late-job"
    assert not result.ok and f"a GPU pod was scheduled onto it since the warning ({late})" in (result.error or "")
    assert world.cordons() == []
    assert world.node()["spec"].get("unschedulable") is not True
    [row] = world.rows(ActionKind.STOP)
    assert row.status == "failed"
    # The next tick sees the pod: no longer empty, the mark removed and the warning's thread told why.
    result = world.tick(80)[world.nid]
    assert result.kind == ActionKind.UNMARK and late in result.reason
    assert MARK_ANNOTATION not in world.annotations()
    assert world.store.get_mark(world.nid) is None
    [cancelled] = [m for m in world.notifier.sent if m.text.startswith("Cordon cancelled")]
    assert late in cancelled.text
    assert world.cordons() == []


def admin_cordons(world: World) -> None:
    """`kubectl cordon`: spec.unschedulable, no gpufinops annotation (the server bumps the resourceVersion)."""
    world.kube.merge("nodes", "", world.node_name, {"spec": {"unschedulable": True}})


@pytest.mark.parametrize("when", [70, 80], ids=["within_the_lead", "after_the_announced_time"])
def test_a_marked_node_an_admin_cordons_has_its_mark_withdrawn_and_told_once(world, when):
    idle_then_marked(world)
    world.tick(when - 5, before_act=lambda: admin_cordons(world))
    result = world.tick(when)[world.nid]
    assert result.ok and result.kind == ActionKind.UNMARK and "cordoned by someone else" in result.reason
    node = world.node()
    assert MARK_ANNOTATION not in world.annotations()
    # Their cordon stays as they made it: never taken for gpufinops' own, never undone.
    assert node["spec"]["unschedulable"] is True and CORDONED_ANNOTATION not in world.annotations()
    assert world.store.get_mark(world.nid) is None
    # One PATCH: the mark's removal, preconditioned on the resourceVersion of the read that found it.
    [unmark] = [r for r in world.kube.calls(verb="patch", resource="nodes")
                if (r.body or {}).get("metadata", {}).get("annotations", {}).get(MARK_ANNOTATION, "") is None]
    assert unmark.body["metadata"]["resourceVersion"] and "spec" not in unmark.body
    assert world.cordons() == [] and not world.rows(ActionKind.STOP)
    [row] = world.rows(ActionKind.UNMARK)
    assert row.status == "done"
    for minute in range(when + 5, when + 60, 5):  # later ticks: nothing more, no second notice
        assert world.nid not in world.tick(minute)
    [cancelled] = world.notices("unmark")
    assert cancelled.text.startswith(f"Cordon cancelled for GPU node k8s:node/{world.node_name}")
    assert "the node was cordoned by someone else" in cancelled.text
    assert cancelled.thread_key == world.notices("warn")[0].key  # under its warning
    assert len(world.notices("warn")) == 1 and not world.notices("stop")
    assert len(world.kube.calls(verb="patch", resource="nodes")) == 2  # the mark, its withdrawal
    assert not world.kube.calls(verb="delete") and not world.kube.calls(verb="create", resource="pods/eviction")


@pytest.mark.parametrize("lost", [500, 0], ids=["cordon_lost_answer_500", "cordon_lost_answer_reset"])
def test_a_cordon_whose_answer_is_lost_is_read_back_done_and_never_repeated(world, lost):
    idle_then_marked(world)
    world.kube.lose_answer_next(lost, "patch", "nodes")
    result = world.tick(76)[world.nid]
    assert result.ok
    [row] = world.rows(ActionKind.STOP)
    assert row.status == "done" and "confirmed by read-back" in (row.error or "")
    # One PATCH: applied by the server (200), its answer lost by the proxy (a 500, or the connection reset).
    assert [(r.status, r.fault) for r in world.cordons()] == [(200, "lost")]
    world.tick(80)
    world.tick(90)
    assert_cordoned_once(world)


@pytest.mark.parametrize("labels,annotations,says", [
    (KARPENTER, {"karpenter.sh/do-not-disrupt": "true"}, "karpenter.sh/do-not-disrupt=true"),
    ({"eks.amazonaws.com/nodegroup": "ml-a100"}, {}, "set the node group's desired size"),
])
def test_a_node_that_must_not_be_cordoned_is_warned_notify_only_with_what_to_do(kapi_cluster, tmp_path, labels,
                                                                                  annotations, says):
    fill(kapi_cluster, labels, annotations)
    world = World(kapi_cluster, tmp_path)
    for minute in range(0, 65, 5):
        world.tick(minute)
    [notice] = [m for m in world.notifier.sent if world.nid in m.key]
    assert notice.key.startswith("idle:") or "not be cordoned" in notice.text
    assert says in notice.text
    world.tick(120)
    assert world.cordons() == [] and not world.rows(ActionKind.STOP)
    assert MARK_ANNOTATION not in world.annotations()


def test_drain_off_reports_the_empty_node_and_changes_nothing(kapi_cluster, tmp_path):
    fill(kapi_cluster)
    world = World(kapi_cluster, tmp_path, drain_nodes=False)
    for minute in range(0, 125, 5):
        world.tick(minute)
    [notice] = [m for m in world.notifier.sent if world.nid in m.key]
    assert notice.text.startswith(f"GPU node k8s:node/{world.node_name}")
    assert "drain is off" in notice.text and "kubernetes.drain_nodes: true" in notice.text
    assert "Karpenter NodePool 'gpu-pool' removes an empty node" in notice.text
    assert not world.kube.calls(verb="patch")


def test_uncordon_undoes_only_gpufinops_own_cordon(world):
    idle_then_marked(world)
    world.tick(76)
    outcome = restore_workload(world.cloud, world.store, f"node/{world.node_name}", world.now, dry_run=False,
                               who="alice")
    assert outcome.ok, outcome.message
    node = world.node()
    # The server omits `unschedulable: false` (the stand-in kept it): absent is schedulable. The uncordon PATCH
    # itself wrote false.
    assert node["spec"].get("unschedulable", False) is False and CORDONED_ANNOTATION not in world.annotations()
    assert world.cordons()[-1].body["spec"] == {"unschedulable": False}
    # Someone else's cordon is theirs.
    world.kube.merge("nodes", "", world.busy_name, {"spec": {"unschedulable": True}})
    outcome = restore_workload(world.cloud, world.store, f"node/{world.busy_name}", world.now, dry_run=False)
    assert not outcome.ok and "not cordoned by gpufinops" in outcome.message
    assert world.node(world.busy_name)["spec"]["unschedulable"] is True


def test_verdicts_for_a_cluster_that_cannot_be_read_are_unknown(world):
    world.tick(0)
    [v] = empty_gpu_nodes(None, {world.node_name: world.watch[world.node_name]}, 3600, {},
                          read_error="list pods: 503")
    assert v.verdict == Verdict.UNKNOWN
    d = node_decision(v, world.nid, RULE, world.now)
    assert d.code.is_missing_data and d.verdict == Verdict.UNKNOWN
