"""Kueue's other job kinds (issue 28, item 2): a JobSet (pods owned by its Jobs), a Kubeflow PyTorchJob (pods owned by
it) and a KubeRay RayJob (pods owned by the RayCluster it made) are each ONE workload under the top object's id, its
pods' GPUs and cost together; with kubernetes.suspend_kueue and a rule's `action: suspend` each is marked, warned and
suspended through its Kueue Workload exactly as a batch Job is, and resumed by `gpufinops k8s restore NS/Kind/NAME`.
The official client against a real kube-apiserver (tests/kapi.py: the published JobSet, Kubeflow, KubeRay and Kueue
CRDs, the service's token bound to the shipped ClusterRole, every request recorded by the fault proxy in front of it),
the real Actuator over a real store. One case stays on the API stand-in (tests/kubestub.py): a cluster WITHOUT some
of the CRDs, which the session's shared server cannot be without."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufinops.act.plan import stop_blocker
from gpufinops.act.restore import restore_workload
from gpufinops.places.kubernetes.cluster import pointed_kinds
from gpufinops.places.kubernetes.names import (
    EVENT_MARKED, EVENT_RESUMED, EVENT_SUSPENDED, TAG_KIND, parse_target, workload_id,
)
from gpufinops.k8s.model import (
    MARK_ANNOTATION, PRE_SUSPEND_ANNOTATION, SNOOZE_ANNOTATION, SUSPENDED_ANNOTATION, TAG_KUEUE_WORKLOAD, WorkloadRef,
)
from gpufinops.model import Action, ActionKind
from tests.places.kubernetes.test_rbac import granted
from tests.places.kubernetes.test_kueue import RULE, T0, World, listed, node_name, own
from tests.kapi import KapiCluster, call_matches
from tests.kubestub import add_all, jobset, kueue_workload, node_obj, pytorchjob, rayjob

NS = "research"  # as written; each test's own namespace is `world.ns` (kube.ns(NS)), its refs `own(world.kube, JS)`
JS = WorkloadRef(NS, "JobSet", "llm-pretrain")
PT = WorkloadRef(NS, "PyTorchJob", "bert-finetune")
RJ = WorkloadRef(NS, "RayJob", "rl-sweep")
# The top object's resource and apiVersion, as the real API serves them (written out here, not read from
# gpufinops' own table, so a wrong group or version there fails these tests).
TOP = {JS: ("jobsets", "jobset.x-k8s.io/v1alpha2"), PT: ("pytorchjobs", "kubeflow.org/v1"),
       RJ: ("rayjobs", "ray.io/v1")}
CUSTOM = ("jobsets", "pytorchjobs", "tfjobs", "xgboostjobs", "paddlejobs", "mpijobs", "rayjobs", "rayclusters")


def wl_name(ref: WorkloadRef) -> str:
    return f"{ref.kind.lower()}-{ref.name}-5b8c1"


def fill_kinds(kube, *, workloads: bool = True) -> None:
    """The three kinds with what their controllers make, in `kube`: the test's part of the real server, or (for
    the one case it cannot be) the stand-in, where names are as written."""
    ns, node = own(kube, JS).namespace, node_name(kube)
    kube.add("nodes", node_obj(node, "i-0bbb0000000000001", gpus=16, labels={
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
    kube.add("namespaces", {"metadata": {"name": ns, "labels": {}}})
    for objects in (jobset(ns, JS.name, node, replicas=2, gpus=2, labels={"team": "llm"},
                           annotations={"owner": "carol@example.com"}),
                    pytorchjob(ns, PT.name, node, workers=2, gpus=1), rayjob(ns, RJ.name, node, workers=2, gpus=1)):
        if isinstance(kube, KapiCluster):
            kube.add_all(objects)  # owners first: ownerReferences name the server's uids
        else:
            add_all(kube, objects)
    if workloads:
        for ref, (_, api) in TOP.items():
            kube.add("workloads", kueue_workload(ns, ref.name, kind=ref.kind, api_version=api))


@pytest.fixture
def world(kapi_cluster, tmp_path):
    fill_kinds(kapi_cluster)
    return World(kapi_cluster, tmp_path)


def workload(world: World, ref: WorkloadRef) -> dict:
    return world.kube.get("workloads", world.ns, wl_name(ref))


def suspensions(world: World, ref: WorkloadRef) -> list:
    return [r for r in world.kube.calls(verb="patch", resource="workloads")
            if r.path.endswith(f"/{wl_name(ref)}") and (r.body or {}).get("spec", {}).get("active") is False]


def annotations(obj: dict) -> dict:
    """An object's annotations; the real server drops an emptied map (the stand-in kept `{}`)."""
    return obj["metadata"].get("annotations") or {}


def assert_every_call_granted(kube: KapiCluster) -> None:
    """Granted by the server's own RBAC (the shipped ClusterRole bound to the service's token) and by the role's
    rules as written (a rule granting more than the service needs would hide a wrong group here)."""
    assert not kube.forbidden()
    rights = granted()
    for call in kube.calls():
        assert call.verb in rights.get((call.group, call.resource), set()), (call.group, call.resource, call.verb)


# --------------------------------------------------------------------------- one workload each


def test_each_kind_is_one_workload_under_its_top_object_with_all_its_pods(world):
    found = listed(world)
    assert {i for i in found if "/Job/" in i or "/RayCluster/" in i or "/Pod/" in i} == set()
    js, pt, rj = (found[workload_id(own(world.kube, ref))] for ref in (JS, PT, RJ))
    # Every GPU pod counted: 2 Jobs x 2 GPUs; master + 2 workers; head + 2 workers (the submitter holds none).
    assert (js.gpu_count, pt.gpu_count, rj.gpu_count) == (4, 3, 3)
    # Their cost shares together: the node's cost split by GPU, so a JobSet of 4 GPUs costs 4/3 of a RayJob's 3.
    assert rj.hourly_cost and pt.hourly_cost == pytest.approx(rj.hourly_cost)
    assert js.hourly_cost == pytest.approx(rj.hourly_cost * 4 / 3)
    # The top object's labels and annotations (not its pods'): rules select them, the report names the owner.
    assert js.tags["team"] == "llm" and js.tags["owner"] == "carol@example.com" and js.tags[TAG_KIND] == "JobSet"
    for ref, inst in ((JS, js), (PT, pt), (RJ, rj)):
        assert inst.managed_by == "" and inst.tags[TAG_KUEUE_WORKLOAD] == f"{world.ns}/{wl_name(ref)}"
        assert inst.tags["kueue.x-k8s.io/queue-name"] == "gpu-queue"
        assert stop_blocker(inst, Action.SUSPEND) == ""
        assert "give the rule action: suspend" in stop_blocker(inst, Action.STOP)
    # One cluster-wide list per kind a GPU pod points to; none of a kind no pod points to.
    lists = {r.resource: r.path for r in world.kube.calls(verb="list") if r.resource in CUSTOM}
    assert lists == {"jobsets": "/apis/jobset.x-k8s.io/v1alpha2/jobsets",
                     "pytorchjobs": "/apis/kubeflow.org/v1/pytorchjobs",
                     "rayclusters": "/apis/ray.io/v1/rayclusters", "rayjobs": "/apis/ray.io/v1/rayjobs"}
    assert len([r for r in world.kube.calls(verb="list") if r.resource in CUSTOM]) == 4


def test_a_cluster_without_such_pods_lists_none_of_those_kinds(kapi_cluster, tmp_path):
    from tests.places.kubernetes.test_kueue import fill

    fill(kapi_cluster)
    world = World(kapi_cluster, tmp_path)
    assert listed(world)
    assert [r for r in kapi_cluster.calls() if r.resource in CUSTOM] == []


def test_pointed_kinds_follows_a_rayjobs_pods_through_its_raycluster():
    objs = rayjob(NS, RJ.name, "ip-10-0-2-1.ec2.internal")  # builders only: no server
    owners = {"ReplicaSet": [], "Deployment": [], "StatefulSet": [], "Job": objs["jobs"]}
    assert [k.kind for k in pointed_kinds(objs["pods"], owners)] == ["RayCluster"]
    owners["RayCluster"] = objs["rayclusters"]
    assert [(k.kind, k.api_version, k.plural) for k in pointed_kinds(objs["pods"], owners)] == [
        ("RayJob", "ray.io/v1", "rayjobs")]
    owners["RayJob"] = objs["rayjobs"]
    assert pointed_kinds(objs["pods"], owners) == []


def test_a_kind_whose_crd_is_absent_is_none_of_that_kind_never_an_error(kube_stub, tmp_path):
    # The stand-in, kept here on purpose: the session's real server has every CRD installed for all tests, and
    # deleting two of them mid-session would delete every object of those kinds and cost a re-install.
    fill_kinds(kube_stub)
    kube_stub.remove_crd("rayclusters")
    kube_stub.remove_crd("jobsets")
    world = World(kube_stub, tmp_path)
    found = listed(world)
    assert world.cloud.listed_ok and world.cloud.last_snapshot.unread == {}
    # Without RayClusters the RayJob's pods stop at their RayCluster: a custom resource, reported only.
    [ray] = [i for i in found.values() if "/RayCluster/" in i.instance_id]
    assert ray.gpu_count == 3 and ray.managed_by and stop_blocker(ray, Action.SUSPEND)
    # A JobSet not listed: its labels and a person's annotations are unknown, so it is never suspended.
    js = found[workload_id(own(world.kube, JS))]
    assert "not read this tick" in js.managed_by and "was not in the listing" in js.managed_advice
    assert TAG_KUEUE_WORKLOAD not in js.tags and "notify only" in stop_blocker(js, Action.SUSPEND)
    assert stop_blocker(found[workload_id(own(world.kube, PT))], Action.SUSPEND) == ""  # the others as usual


def test_a_forbidden_list_is_a_clear_reason_and_notify_only_for_that_kind_this_tick(world):
    world.kube.forbid("list", "jobsets", once=True)  # a real 403, then the right back
    found = listed(world)
    js = found[workload_id(own(world.kube, JS))]
    assert "403" in js.managed_advice and "rbac-clusterrole.yaml" in js.managed_advice
    assert js.gpu_count == 4  # still judged, as one workload, on its pods
    assert "notify only" in stop_blocker(js, Action.SUSPEND)
    assert stop_blocker(found[workload_id(own(world.kube, PT))], Action.SUSPEND) == ""
    assert stop_blocker(listed(world)[workload_id(own(world.kube, JS))], Action.SUSPEND) == ""  # read again next tick


def test_restore_names_each_kind(world):
    assert parse_target("research/jobset/llm-pretrain") == (NS, "JobSet", "llm-pretrain")
    assert parse_target("research/RayJob/rl-sweep") == (NS, "RayJob", "rl-sweep")
    assert parse_target("research/pytorchjob/bert-finetune") == (NS, "PyTorchJob", "bert-finetune")


# --------------------------------------------------------------------------- mark, warn, suspend, restore


@pytest.mark.parametrize("ref", [JS, PT, RJ], ids=lambda r: r.kind)
def test_an_idle_job_of_each_kind_is_warned_suspended_through_its_workload_and_resumed(world, ref):
    resource, api = TOP[ref]
    iid = workload_id(own(world.kube, ref))
    world.tick(0)
    wl = workload(world, ref)
    stop_at = "2026-12-01T12:15:00Z"
    assert wl["metadata"]["annotations"][MARK_ANNOTATION] == stop_at
    assert wl["metadata"]["annotations"][PRE_SUSPEND_ANNOTATION] == stop_at
    marked = [e for e in world.events(EVENT_MARKED) if e["involvedObject"]["name"] == ref.name]
    assert [(e["involvedObject"]["kind"], e["involvedObject"]["apiVersion"], e["involvedObject"]["uid"])
            for e in marked] == [(ref.kind, api, world.kube.uids[(world.ns, ref.kind, ref.name)])]
    [warning] = [m for m in world.notifier.sent if m.key.startswith(f"warn:{iid}")]
    assert "will be suspended" in warning.text and wl_name(ref) in warning.text

    world.tick(10)  # within the lead: nothing
    assert suspensions(world, ref) == []
    version = workload(world, ref)["metadata"]["resourceVersion"]
    gets_before = len(world.kube.calls(verb="get", resource=resource))

    results = world.tick(16)
    assert results[iid].ok and results[iid].kind == ActionKind.STOP
    # The top object was read again just before (a person's snooze or protect on it counts up to then) ...
    assert len(world.kube.calls(verb="get", resource=resource)) > gets_before
    # ... and the one suspension PATCH is preconditioned on the Workload as that read found it.
    [patch] = suspensions(world, ref)
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body["metadata"]["resourceVersion"] == version
    wl = workload(world, ref)
    assert wl["spec"]["active"] is False and SUSPENDED_ANNOTATION in wl["metadata"]["annotations"]
    assert MARK_ANNOTATION not in wl["metadata"]["annotations"]
    [event] = [e for e in world.events(EVENT_SUSPENDED) if e["involvedObject"]["name"] == ref.name]
    assert event["involvedObject"]["kind"] == ref.kind
    assert f"restore {world.ns}/{ref.kind}/{ref.name}" in event["message"]
    assert world.cloud.describe([iid])[0].state == "stopped"
    # The notice names the command that brings this very job back (its kind, not "Job").
    [stopped] = [m for m in world.notifier.sent if m.key.startswith(f"stop:{iid}")]
    assert any(f"gpufinops k8s restore {world.ns}/{ref.kind}/{ref.name}`" in note for note in stopped.notes)
    # Nothing but Kueue Workloads is changed: never the job, its Jobs, its RayCluster.
    assert {r.resource for r in world.kube.calls(verb="patch")} == {"workloads"}

    out = restore_workload(world.cloud, world.store, f"{world.ns}/{ref.kind}/{ref.name}", world.now, dry_run=False,
                           who="carol")
    assert out.ok, out.message
    wl = workload(world, ref)
    assert wl["spec"]["active"] is True and SUSPENDED_ANNOTATION not in annotations(wl)
    assert [e["involvedObject"]["kind"] for e in world.events(EVENT_RESUMED)] == [ref.kind]
    assert [r.status for r in world.rows(ActionKind.RESTORE)] == ["done"]
    assert_every_call_granted(world.kube)


def test_a_mark_removed_between_the_plan_and_the_patch_is_a_409_and_no_suspension(world):
    world.tick(0)

    def remove_mark(_request):  # a new resourceVersion: the PATCH's precondition fails, for real
        world.kube.merge("workloads", world.ns, wl_name(JS), {"metadata": {"annotations": {MARK_ANNOTATION: None}}})

    # The person's removal lands after the read that still showed the mark, before the PATCH reaches the server.
    world.kube.proxy.arm("hook", call_matches("patch", "workloads"), times=1, hook=remove_mark, forward=True)
    results = world.tick(16, rule=RULE)
    iid = workload_id(own(world.kube, JS))
    assert not results[iid].ok and "was removed since the warning" in results[iid].error
    assert [r.status for r in suspensions(world, JS)] == [409]  # one PATCH, refused by its precondition
    assert workload(world, JS)["spec"]["active"] is True
    assert [r.status for r in world.rows(ActionKind.STOP) if r.instance_id == iid] == ["failed"]


def test_a_snooze_on_the_top_object_cancels_the_suspension(world):
    world.tick(0)
    world.kube.merge("rayjobs", world.ns, RJ.name, {"metadata": {"annotations": {
        SNOOZE_ANNOTATION: (T0 + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}}})
    results = world.tick(16)
    assert results[workload_id(own(world.kube, RJ))].kind == ActionKind.UNMARK
    assert suspensions(world, RJ) == []
    assert MARK_ANNOTATION not in annotations(workload(world, RJ))


def test_a_top_object_gone_before_the_suspension_is_never_suspended(world):
    world.tick(0)
    world.kube.delete("pytorchjobs", world.ns, PT.name)
    world.tick(16)
    assert suspensions(world, PT) == [] and workload(world, PT)["spec"]["active"] is True


def test_without_suspend_kueue_each_kind_is_notify_only(kapi_cluster, tmp_path):
    fill_kinds(kapi_cluster)
    world = World(kapi_cluster, tmp_path, suspend_kueue=False)
    found = listed(world)
    for ref in TOP:
        inst = found[workload_id(own(world.kube, ref))]
        assert inst.managed_by == "Kueue (queue 'gpu-queue')" and "kubernetes.suspend_kueue: true" in \
            inst.managed_advice
    world.tick(0)
    world.tick(16)
    assert kapi_cluster.calls(verb="patch") == [] and kapi_cluster.calls(resource="workloads") == []


def test_a_job_unreadable_at_its_due_time_keeps_its_mark_and_is_suspended_once_readable(world):
    """Its object (snooze, protect) or its Workload (the mark) not read at the due time: nothing is suspended and
    the mark is kept as it is; no "removed by someone: stop cancelled" is sent for a tag that was not read. Once
    readable with the mark still on, the warning it announced holds and the suspension goes ahead."""
    world.tick(0)
    announced = workload(world, JS)["metadata"]["annotations"][MARK_ANNOTATION]
    world.kube.forbid("list", "jobsets", once=True)  # at the due time its object cannot be read (a real 403)
    world.tick(16)
    assert suspensions(world, JS) == []
    assert [m.key.split(":")[0] for m in world.notifier.sent if workload_id(own(world.kube, JS)) in m.key] == ["warn"]
    assert workload(world, JS)["metadata"]["annotations"][MARK_ANNOTATION] == announced
    world.tick(17)
    warnings = [m for m in world.notifier.sent if m.key.startswith(f"warn:{workload_id(own(world.kube, JS))}")]
    assert len(warnings) == 1 and len(suspensions(world, JS)) == 1


def test_a_workload_list_failing_at_the_due_time_is_no_cancel_either(world):
    world.tick(0)
    announced = workload(world, JS)["metadata"]["annotations"][MARK_ANNOTATION]
    world.kube.forbid("list", "workloads", once=True)  # the Kueue Workloads (where the mark lives) unread
    world.tick(16)
    assert suspensions(world, JS) == []
    assert [m.key.split(":")[0] for m in world.notifier.sent if workload_id(own(world.kube, JS)) in m.key] == ["warn"]
    assert workload(world, JS)["metadata"]["annotations"][MARK_ANNOTATION] == announced
    world.tick(17)
    assert len(suspensions(world, JS)) == 1
