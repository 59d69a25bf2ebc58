"""The fault matrix's Kubernetes cases (issue 28): the act stage (the real Actuator, a real store) against a real
kube-apiserver (tests/kapi.py) through the official client and the fault proxy in front of the server, which records
every request and produces what the server cannot on demand (a lost answer, a 5xx); 403s and 409s are the server's.

- a Kueue suspension whose answer is lost (the server applies it, the proxy answers 500 or closes the connection):
  exactly one mutating call, the record settled to the real state by reading back (at once, or by the next
  tick's reconcile when the read-back fails too), one "suspended" notice;
- the suspension refused by the API server (403, 422): nothing changed, the row failed, the real state read;
- an HPA appearing after the mark: the scale-down refused, the owner named, the mark withdrawn;
- a JobSet's suspension (through its Kueue Workload) whose answer is lost: one PATCH, read back done; the JobSet
  unreadable (403) just before its suspension: nothing changed that tick (missing data never acts), suspended at the
  next one.
"A node drained while a GPU pod is scheduled onto it" and a cordon whose answer is lost:
tests/faults/test_k8s_drain.py."""

from __future__ import annotations

import pytest

from gpufinops.places.kubernetes.names import workload_id
from gpufinops.k8s.model import MARK_ANNOTATION, REPLICAS_BEFORE_ANNOTATION, SUSPENDED_ANNOTATION
from gpufinops.model import Action, ActionKind, Rule, Selector
from tests.kapi import _k8s_status, parse_call
from tests.places.kubernetes.test_kueue import World, fill, own


@pytest.fixture
def world(kapi_cluster, tmp_path):
    fill(kapi_cluster)
    return World(kapi_cluster, tmp_path)


def notices(world: World, prefix: str) -> list:
    return [m for m in world.notifier.sent if m.key.startswith(f"{prefix}:{workload_id(world.job)}")]


def is_suspension(call) -> bool:
    return call.verb == "patch" and call.resource == "workloads" and \
        ((call.body or {}).get("spec") or {}).get("active") is False


def assert_suspended_once(world: World) -> None:
    """Records equal the cluster: one suspension patch, the Workload deactivated by gpufinops, one done stop row,
    nothing left unsettled, one warning and one "suspended" notice."""
    assert len(world.suspensions()) == 1
    wl = world.workload()
    assert wl["spec"]["active"] is False and SUSPENDED_ANNOTATION in wl["metadata"]["annotations"]
    assert MARK_ANNOTATION not in wl["metadata"]["annotations"]
    [row] = world.rows(ActionKind.STOP)
    assert row.status == "done"
    assert not world.store.action_rows(status=("pending", "unconfirmed", "applied"))
    assert world.store.get_mark(workload_id(world.job)) is None
    assert len(notices(world, "warn")) == 1 and len(notices(world, "stop")) == 1


@pytest.mark.parametrize("lost", [500, 0], ids=["suspend_lost_answer_500", "suspend_lost_answer_reset"])
def test_a_suspension_whose_answer_is_lost_is_read_back_done_and_never_repeated(world, lost, caplog):
    world.tick(0)
    world.kube.lose_answer_next(lost, "patch", "workloads")
    result = world.tick(16)[workload_id(world.job)]
    assert result.ok
    [row] = world.rows(ActionKind.STOP)
    assert row.status == "done" and "confirmed by read-back" in (row.error or "")
    # One PATCH: the server applied it (200), its answer lost on the way back (the proxy's 500 or reset).
    assert [(r.status, r.fault) for r in world.suspensions()] == [(200, "lost")]
    assert any("failed" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")  # the signal
    world.tick(17)
    world.tick(30)
    assert_suspended_once(world)


def test_a_lost_answer_and_a_failed_read_back_stay_unconfirmed_until_reconciled(world):
    world.tick(0)
    world.kube.lose_answer_next(500, "patch", "workloads")
    proxy = world.kube.proxy

    def read_back_after_the_lost_patch(req):
        # Evaluated by the proxy under its own lock: it reads what it has seen directly.
        call = parse_call(req, None)
        return (call.verb, call.resource) == ("get", "jobs") and any(
            is_suspension(parse_call(seen, None)) for seen in proxy.seen if seen.seq < req.seq)

    # The read-back right after the lost answer fails too (a 403), once; the reads before the patch do not. The
    # proxy answers it (the Status body the server would send): a real 403 cannot be timed between two requests
    # of one call without racing the authorizer's cache.
    proxy.arm("status", read_back_after_the_lost_patch, times=1, status=403, headers={
        "Content-Type": "application/json"}, body=_k8s_status(403, "Forbidden", 'jobs.batch is forbidden'))
    world.tick(16)
    [row] = world.rows(ActionKind.STOP)
    assert row.status == "unconfirmed" and "read-back failed" in (row.error or "")
    assert notices(world, "stop") == []  # nothing announced before the state is known
    world.tick(16.1)  # the next tick's reconcile reads the Workload: done, announced once, never patched again
    assert [r.status for r in world.rows(ActionKind.STOP)] == ["done"] and len(notices(world, "stop")) == 1
    world.tick(20)
    assert_suspended_once(world)


@pytest.mark.parametrize("status", [403, 422])
def test_a_refused_suspension_changes_nothing_and_is_recorded_failed(world, status):
    world.tick(0)
    if status == 403:
        world.kube.forbid("patch", "workloads")  # the server's own 403: the right taken away
    else:
        world.kube.fail_next(status, "patch", "workloads")  # the proxy's 422 (a Status body, as the server's)
    result = world.tick(16)[workload_id(world.job)]
    assert not result.ok and str(status) in (result.error or "")
    [row] = world.rows(ActionKind.STOP)
    assert row.status == "failed"
    assert world.workload()["spec"]["active"] is True
    assert notices(world, "stop") == []


def test_an_hpa_appearing_after_the_mark_refuses_the_scale_down_and_names_it(world):
    rule = Rule(name="web-idle", threshold_pct=5.0, window_s=600, warning_lead_s=900, action=Action.STOP,
                selector=Selector(tags={"k8s:kind": ("Deployment",)}))
    world.tick(0, rule)
    web = world.kube.get("deployments", world.web.namespace, world.web.name)
    assert MARK_ANNOTATION in web["metadata"]["annotations"]
    world.kube.add("horizontalpodautoscalers", {
        "metadata": {"name": "infer", "namespace": world.web.namespace},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": world.web.name},
                 "minReplicas": 1, "maxReplicas": 4}})
    result = world.tick(16, rule)[workload_id(world.web)]
    hpa = f"HorizontalPodAutoscaler '{world.web.namespace}/infer'"
    assert result.kind == ActionKind.UNMARK and hpa in result.reason
    dep = world.kube.get("deployments", world.web.namespace, world.web.name)
    annotations = dep["metadata"].get("annotations") or {}  # the real server drops an emptied map
    assert dep["spec"]["replicas"] == 1 and MARK_ANNOTATION not in annotations
    assert REPLICAS_BEFORE_ANNOTATION not in annotations
    assert not [r for r in world.kube.calls(verb="patch", resource="deployments") if "spec" in (r.body or {})]
    assert not world.rows(ActionKind.STOP)
    [cancelled] = [m for m in world.notifier.sent if m.text.startswith("Stop cancelled")]
    assert "HorizontalPodAutoscaler" in cancelled.text


def test_an_hpa_appearing_between_the_plan_and_the_patch_refuses_it(world, monkeypatch):
    """The HPA lands after this tick's listing and plan, before the PATCH: the read just before it refuses."""
    rule = Rule(name="web-idle", threshold_pct=5.0, window_s=600, warning_lead_s=900, action=Action.STOP,
                selector=Selector(tags={"k8s:kind": ("Deployment",)}))
    world.tick(0, rule)
    listing = world.cloud.list_gpu_instances

    def listed_then_hpa():
        found = listing()
        world.kube.add("horizontalpodautoscalers", {
            "metadata": {"name": "infer", "namespace": world.web.namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": world.web.name},
                     "maxReplicas": 4}})  # required by the real server (422 without); the stand-in took none
        return found

    monkeypatch.setattr(world.cloud, "list_gpu_instances", listed_then_hpa)
    result = world.tick(16, rule)[workload_id(world.web)]
    hpa = f"HorizontalPodAutoscaler '{world.web.namespace}/infer'"
    assert not result.ok and f"managed by {hpa} now" in (result.error or "")
    [row] = world.rows(ActionKind.STOP)
    assert row.status == "failed"
    assert world.kube.get("deployments", world.web.namespace, world.web.name)["spec"]["replicas"] == 1
    assert not [r for r in world.kube.calls(verb="patch", resource="deployments") if "spec" in (r.body or {})]


# --------------------------------------------------------------------------- Kueue's other kinds (a JobSet)


@pytest.fixture
def kinds_world(kapi_cluster, tmp_path):
    from tests.places.kubernetes.test_kueue_kinds import fill_kinds

    fill_kinds(kapi_cluster)
    return World(kapi_cluster, tmp_path)


@pytest.mark.parametrize("lost", [500, 0], ids=["jobset_suspend_lost_answer_500", "jobset_suspend_lost_answer_reset"])
def test_a_jobset_suspension_whose_answer_is_lost_is_one_patch_read_back_done(kinds_world, lost):
    from tests.places.kubernetes.test_kueue_kinds import JS, suspensions, workload

    world = kinds_world
    iid = workload_id(own(world.kube, JS))
    world.tick(0)
    world.kube.lose_answer_next(lost, "patch", "workloads")
    result = world.tick(16)[iid]
    assert result.ok
    rows = [r for r in world.rows(ActionKind.STOP) if r.instance_id == iid]
    assert [r.status for r in rows] == ["done"] and "confirmed by read-back" in (rows[0].error or "")
    world.tick(17)
    world.tick(30)
    # One mutating call, never repeated: applied by the server (200), its answer lost by the proxy.
    assert [(r.status, r.fault) for r in suspensions(world, JS)] == [(200, "lost")]
    wl = workload(world, JS)
    assert wl["spec"]["active"] is False and SUSPENDED_ANNOTATION in wl["metadata"]["annotations"]
    assert not world.store.action_rows(status=("pending", "unconfirmed", "applied"))
    assert len([m for m in world.notifier.sent if m.key.startswith(f"stop:{iid}")]) == 1


def test_a_jobset_unreadable_just_before_its_suspension_is_not_suspended_that_tick(kinds_world):
    from tests.places.kubernetes.test_kueue_kinds import JS, suspensions, workload

    world = kinds_world
    iid = workload_id(own(world.kube, JS))
    world.tick(0)
    world.kube.forbid("get", "jobsets", once=True)  # the fresh read before the suspension: the server's 403
    result = world.tick(16)[iid]
    assert result.kind == ActionKind.SKIP and "could not be read again" in result.reason and "403" in result.reason
    assert suspensions(world, JS) == [] and workload(world, JS)["spec"]["active"] is True
    world.tick(17)  # readable again: suspended, once
    assert len(suspensions(world, JS)) == 1 and workload(world, JS)["spec"]["active"] is False
