"""GPU nodes whose GPU work is gone (issue 28 item 4): the watch of GPU-pod-free time, and the pure verdicts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gpufinops.decide.workloads import (
    NodeWatch, drain_refusal, empty_gpu_nodes, node_advice, watch_from_json, watch_gpu_free, watch_to_json,
)
from gpufinops.k8s.model import ClusterSnapshot, NodeInfo, PodInfo, WorkloadRef
from gpufinops.model import Verdict

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=timezone.utc)
TICK = timedelta(minutes=5)
WINDOW = 3600


def node(name: str, labels=None, annotations=None, created=T0 - timedelta(days=1)) -> NodeInfo:
    return NodeInfo(name=name, instance_id=f"i-{name}", provider_id=f"aws:///us-east-1a/i-{name}",
                    instance_type="p4d.24xlarge", region="us-east-1", zone="us-east-1a", created=created,
                    capacity={"nvidia.com/gpu": 8}, labels=labels or {}, annotations=annotations or {})


def pod(name: str, on: str, phase: str = "Running") -> PodInfo:
    return PodInfo("ml", name, on, phase, T0 - timedelta(hours=2), {"nvidia.com/gpu": 1},
                   WorkloadRef("ml", "Deployment", name))


def snap(at: datetime, nodes, pods=()) -> ClusterSnapshot:
    return ClusterSnapshot(at, tuple(nodes), tuple(pods), {}, {})


KARPENTER = {"karpenter.sh/nodepool": "gpu-pool"}


def run_ticks(nodes_and_pods, start=T0, watch=None):
    """Step the watch through reads `TICK` apart; returns (watch, last snapshot)."""
    watch = dict(watch or {})
    at, s = start, None
    for nodes, pods in nodes_and_pods:
        s = snap(at, nodes, pods)
        watch = watch_gpu_free(watch, s, max_gap_s=2 * TICK.total_seconds())
        at += TICK
    return watch, s


def test_a_node_free_for_the_whole_window_is_reported_with_cost_group_and_advice():
    n = node("gpu-a", KARPENTER)
    watch, s = run_ticks([([n], [])] * 13)  # 12 ticks of 5 min apart = 60 min free
    (v,) = empty_gpu_nodes(s, watch, WINDOW, {"gpu-a": 32.77})
    assert v.verdict == Verdict.IDLE and v.usd_per_hour == 32.77 and v.free_since == T0
    assert v.reason == ("node gpu-a (8 GPUs, Karpenter NodePool 'gpu-pool', $32.77/h) has run no GPU pod for "
                        "1 h (since 08:00 UTC)")
    assert (v.group_kind, v.group) == ("Karpenter NodePool", "gpu-pool")
    assert "Karpenter NodePool 'gpu-pool' removes an empty node" in v.advice
    assert v.drain_refusal == ""


def test_a_node_free_for_less_than_the_window_is_not_called_empty():
    n = node("gpu-a", KARPENTER)
    watch, s = run_ticks([([n], [])] * 12)  # 55 min
    (v,) = empty_gpu_nodes(s, watch, WINDOW, {"gpu-a": 32.77})
    assert v.verdict == Verdict.UNKNOWN and "no GPU pod for 55 min" in v.reason and "under the rule's 1 h" in v.reason


def test_the_first_read_never_calls_a_node_empty_however_old_it_is():
    n = node("gpu-a", created=T0 - timedelta(days=30))
    watch, s = run_ticks([([n], [])])
    (v,) = empty_gpu_nodes(s, watch, WINDOW, {})
    assert v.verdict == Verdict.UNKNOWN and v.usd_per_hour is None
    (v,) = empty_gpu_nodes(s, {}, WINDOW, {})  # no watch at all
    assert v.verdict == Verdict.UNKNOWN and "none watched before" in v.reason


def test_a_gpu_pod_resets_the_free_time_and_a_finished_one_does_not_hold_it():
    n = node("gpu-a", KARPENTER)
    ticks = [([n], [])] * 6 + [([n], [pod("p", "gpu-a")])] + [([n], [pod("p", "gpu-a", "Succeeded")])] * 13
    watch, s = run_ticks(ticks)
    (v,) = empty_gpu_nodes(s, watch, WINDOW, {"gpu-a": 1.0})
    assert v.verdict == Verdict.IDLE and v.free_since == T0 + 7 * TICK  # from the first read without it
    watch, s = run_ticks(ticks[:7])
    (v,) = empty_gpu_nodes(s, watch, WINDOW, {"gpu-a": 1.0})
    assert v.verdict == Verdict.ACTIVE and "ml/p" in v.reason


def test_a_gap_between_reads_or_a_recreated_node_starts_the_free_time_again():
    n = node("gpu-a")
    watch, _ = run_ticks([([n], [])] * 13)
    later = T0 + 13 * TICK + timedelta(minutes=30)  # a read missed: a pod may have come and gone
    s = snap(later, [n])
    watch2 = watch_gpu_free(watch, s, max_gap_s=600)
    assert watch2["gpu-a"].free_since == later
    reborn = node("gpu-a", created=T0 + 13 * TICK)  # same name, new node since the last read
    watch3 = watch_gpu_free(watch, snap(T0 + 13 * TICK + TICK, [reborn]), max_gap_s=600)
    assert watch3["gpu-a"].free_since == T0 + 14 * TICK


def test_a_failed_read_is_unknown_never_empty():
    watch, _ = run_ticks([([node("gpu-a")], [])] * 20)
    (v,) = empty_gpu_nodes(None, watch, WINDOW, {}, read_error="kubernetes API at k:443: list pods: 503")
    assert v.verdict == Verdict.UNKNOWN
    assert v.reason == "node gpu-a: not judged: kubernetes API at k:443: list pods: 503"


def test_advice_and_drain_refusals_follow_the_node_group():
    dnd = node("a", KARPENTER, {"karpenter.sh/do-not-disrupt": "true"})
    assert "karpenter.sh/do-not-disrupt=true" in drain_refusal(dnd)
    assert node_advice(dnd).startswith("Karpenter will not remove it while it carries karpenter.sh/do-not-disrupt")
    eks = node("b", {"eks.amazonaws.com/nodegroup": "ml-a100"})
    assert "set the node group's desired size" in drain_refusal(eks)
    assert node_advice(eks).startswith("set EKS managed node group 'ml-a100''s desired size lower")
    gke = node("c", {"cloud.google.com/gke-nodepool": "a100"})
    assert drain_refusal(gke) == "" and node_advice(gke).startswith("set GKE node pool 'a100''s minimum/desired")
    bare = node("d")
    assert "nothing would remove the node" in drain_refusal(bare) and "no node group label" in node_advice(bare)


def test_the_watch_survives_the_store_and_an_unreadable_one_counts_as_none():
    watch = {"a": NodeWatch(T0, T0 + TICK), "b": NodeWatch(None, T0)}
    assert watch_from_json(watch_to_json(watch)) == watch
    assert watch_from_json("not json") == {} and watch_from_json(None) == {}


# --------------------------------------------------------------------------- rules and settings


def test_a_drain_rule_must_select_nodes_and_the_error_names_file_line_and_key(tmp_path):
    import pytest

    from gpufinops.config import ConfigError
    from gpufinops.rules import load_rule_file

    path = tmp_path / "nodes.yaml"
    path.write_text("rules:\n  - name: ok\n    threshold_pct: 5\n    window: 1h\n    action: drain\n"
                    "    select:\n      tags: {\"k8s:node\": \"*\"}\n"
                    "  - name: bad\n    threshold_pct: 5\n    window: 1h\n    action: drain\n")
    with pytest.raises(ConfigError) as err:
        load_rule_file(path)
    text = str(err.value)
    assert f"{path}:8" in text and "rules.1" in text and "action 'drain' applies to Kubernetes GPU nodes only" in text
    path.write_text("rules:\n  - name: ok\n    threshold_pct: 5\n    window: 1h\n    action: drain\n"
                    "    select:\n      tags: {\"k8s:node\": \"*\"}\n")
    [rule] = load_rule_file(path)
    assert rule.action.value == "drain"


def test_drain_is_off_by_default():
    from gpufinops.config import load_settings

    assert load_settings(kubernetes={}).kubernetes.drain_nodes is False
    assert load_settings(kubernetes={"drain_nodes": True}).kubernetes.drain_nodes is True


def test_only_nodes_are_drained_and_nodes_only_drained():
    from gpufinops.act.plan import stop_blocker
    from gpufinops.places.kubernetes.nodes import node_instance
    from gpufinops.model import Action, GpuInstance

    n = node_instance(node("gpu-a", KARPENTER), 32.77, drain_nodes=True)
    assert n.instance_id == "k8s:node/gpu-a" and n.tags["k8s:node"] == "gpu-a" and n.state == "running"
    assert stop_blocker(n, Action.DRAIN) == ""
    assert "give the rule action: drain" in stop_blocker(n, Action.STOP)
    assert "give the rule action: drain" in stop_blocker(n, Action.TERMINATE)
    ec2 = GpuInstance("i-1", "p4d.24xlarge", "us-east-1", "running", T0, tags={})
    assert "Kubernetes GPU nodes only" in stop_blocker(ec2, Action.DRAIN)
    off = node_instance(node("gpu-a", KARPENTER), 32.77)
    assert "drain is off" in stop_blocker(off, Action.DRAIN)
    dnd = node_instance(node("gpu-a", KARPENTER, {"karpenter.sh/do-not-disrupt": "true"}), 1.0, drain_nodes=True)
    assert "karpenter.sh/do-not-disrupt=true" in stop_blocker(dnd, Action.DRAIN)
    theirs = node_instance(NodeInfo(**{**node("gpu-a").__dict__, "unschedulable": True}), 1.0, drain_nodes=True)
    assert theirs.state == "cordoned" and not theirs.is_running  # someone else's cordon: not judged, not touched


# --------------------------------------------------------------------------- surfaced: costs --by nodepool


def test_costs_by_nodepool_lists_gpu_nodes_without_gpu_pods_with_cost_and_what_to_do(kapi_cluster, tmp_path,
                                                                                       capsys):
    """Against a real kube-apiserver (tests/kapi.py): the finished pod is left out by the server's field selector."""
    import json

    from gpufinops.cli.app import main
    from tests.kubestub import node_obj, pod_obj

    kube = kapi_cluster
    gpu_a, gpu_b = kube.name("gpu-a"), kube.name("gpu-b")
    kube.add("nodes", node_obj(gpu_a, "i-0aaa0000000000001", labels=KARPENTER))
    kube.add("nodes", node_obj(gpu_b, "i-0aaa0000000000002", labels={"eks.amazonaws.com/nodegroup": "ml"}))
    kube.add("pods", pod_obj(kube.ns("ml"), "train-0", gpu_b))
    kube.add("pods", pod_obj(kube.ns("ml"), "done-0", gpu_b, phase="Succeeded"))
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {kubeconfig}\ndatabase_url: sqlite:///{tmp_path}/db.sqlite\n")
    month = f"{datetime.now(timezone.utc):%Y-%m}"
    assert main(["--config", str(cfg), "costs", "--month", month, "--by", "nodepool", "--output", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    [empty] = answer["gpu_nodes_without_gpu_pods"]
    assert empty["node"] == gpu_a and empty["node_group"] == "Karpenter NodePool 'gpu-pool'"
    assert empty["usd_per_hour"] and empty["usd_per_hour"] > 0  # the catalog's p4d.24xlarge rate
    assert empty["what_to_do"].startswith("Karpenter NodePool 'gpu-pool' removes an empty node")
    assert main(["--config", str(cfg), "costs", "--month", month, "--by", "nodepool"]) == 0
    out = capsys.readouterr().out
    assert "GPU nodes with no GPU pod at this read (1; one read cannot say for how long" in out
    assert gpu_a in out.split("GPU nodes with no GPU pod")[1] and gpu_b not in out.split("at this read")[1]
    # Any other grouping is unchanged.
    assert main(["--config", str(cfg), "costs", "--month", month, "--by", "namespace", "--output", "json"]) == 0
    assert "gpu_nodes_without_gpu_pods" not in json.loads(capsys.readouterr().out)


def test_a_gpu_pod_that_ran_between_two_reads_moves_the_free_time_to_its_end():
    """The snapshot lists no finished pod: a job that started after one read and ended before the next is seen
    only in the finished pods `still_free` asks for, and the free time then starts at its end."""
    from gpufinops.decide.workloads import still_free

    n, other = node("gpu-a", KARPENTER), node("gpu-b")
    watch, _ = run_ticks([([n, other], [])] * 7)  # free since T0, last read T0 + 30 min
    at = T0 + 7 * TICK
    s = snap(at, [n, other], [pod("p", "gpu-b")])
    assert still_free(watch, s, 2 * TICK.total_seconds()) == ["gpu-a"]  # gpu-b holds a pod: nothing to ask
    ended = T0 + 33 * timedelta(minutes=1)
    after = watch_gpu_free(watch, s, 2 * TICK.total_seconds(), {"gpu-a": ended})
    assert after["gpu-a"] == NodeWatch(ended, at) and after["gpu-b"] == NodeWatch(None, at)
    # A finished GPU pod with no end time in its status: the free time can only start at this read.
    unknown_end = watch_gpu_free(watch, s, 2 * TICK.total_seconds(), {"gpu-a": None})
    assert unknown_end["gpu-a"] == NodeWatch(at, at)
    # One that ended before the free time began changes nothing.
    old = watch_gpu_free(watch, s, 2 * TICK.total_seconds(), {"gpu-a": T0 - timedelta(hours=3)})
    assert old["gpu-a"] == NodeWatch(T0, at)
    # The first read of a node asks nothing (its free time starts at that read anyway).
    assert still_free({}, s, 2 * TICK.total_seconds()) == []


def test_the_end_of_a_finished_pods_gpu_work_is_its_last_container_to_finish():
    from gpufinops.places.kubernetes.cluster import gpu_work_ended
    from tests.kubestub import pod_obj

    finished = pod_obj("ml", "job-x", "gpu-a", phase="Succeeded")
    finished["status"]["initContainerStatuses"] = [
        {"name": "init", "state": {"terminated": {"finishedAt": "2026-03-02T08:10:00Z"}}}]
    finished["status"]["containerStatuses"] = [
        {"name": "main", "state": {"terminated": {"finishedAt": "2026-03-02T08:31:00Z"}}},
        {"name": "side", "state": {"terminated": {"finishedAt": "2026-03-02T08:29:00Z"}}}]
    assert gpu_work_ended(finished) == (True, T0 + timedelta(minutes=31))
    assert gpu_work_ended(pod_obj("ml", "no-status", "gpu-a", phase="Failed")) == (True, None)
    assert gpu_work_ended(pod_obj("ml", "cpu", "gpu-a", gpus=0, phase="Succeeded")) == (False, None)
