"""Kueue: suspend, don't kill. A Kueue-managed Job idle under a rule with `action: suspend` is marked (the mark and
the pre-suspend hook on its Kueue Workload, an Event on the Job), warned, and at the end of the lead suspended
through Kueue (its Workload's spec.active: false, one preconditioned patch through the act chokepoint); `gpufinops
k8s restore` resumes it. The official client against a real kube-apiserver (tests/kapi.py: the published Kueue
Workload CRD, the service's token bound to the shipped ClusterRole, every request recorded by the fault proxy in front
of it); the act stage is the real Actuator over a real store."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.act.actuator import Actuator
from gpufinops.act.plan import stop_blocker
from gpufinops.act.restore import restore_workload
from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client
from gpufinops.places.kubernetes.cloud import WorkloadCloud
from gpufinops.places.kubernetes.names import (
    EVENT_MARKED, EVENT_RESUMED, EVENT_SUSPENDED, KubeChangeError, workload_id,
)
from gpufinops.config import load_settings
from gpufinops.demo.sim import ConsoleNotifier
from gpufinops.k8s.model import (
    MARK_ANNOTATION, PRE_SUSPEND_ANNOTATION, SNOOZE_ANNOTATION, SUSPENDED_ANNOTATION, TAG_KUEUE_WORKLOAD,
    TAG_WORKLOAD_PRIORITY_CLASS, WorkloadRef,
)
from gpufinops.model import (
    TAG_MARKED, Action, ActionKind, Decision, GpuInstance, ReasonCode, Rule, RunContext, Selector, Verdict,
)
from gpufinops.store.store import Store
from tests.kapi import KapiCluster, call_matches
from tests.kubestub import kueue_workload, node_obj, owned, pod_obj

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
# The refs name the namespace as written; each test's own is `kube.ns("research")` (World.job / .plain_job / .web):
# a namespace never finishes terminating on the session's server, so none is reused.
JOB = WorkloadRef("research", "Job", "train-llm")
PLAIN_JOB = WorkloadRef("research", "Job", "eval-nightly")
WEB = WorkloadRef("research", "Deployment", "infer")
WL_NAME = f"job-{JOB.name}-5b8c1"
QUEUED = {"kueue.x-k8s.io/queue-name": ("*",)}
RULE = Rule(name="kueue-idle", threshold_pct=5.0, window_s=600, warning_lead_s=900, action=Action.SUSPEND,
            selector=Selector(tags=QUEUED))


def node_name(kube: KapiCluster) -> str:
    """The test's own node (the stand-in's, for the one case in test_kueue_kinds.py left on it: as written)."""
    return (kube.name("ip-10-0-2-1") if isinstance(kube, KapiCluster) else "ip-10-0-2-1") + ".ec2.internal"


def own(kube: KapiCluster, ref: WorkloadRef) -> WorkloadRef:
    """`ref` in the test's own namespace (the stand-in's: as written)."""
    return WorkloadRef(kube.ns(ref.namespace), ref.kind, ref.name) if isinstance(kube, KapiCluster) else ref


def fill(kube: KapiCluster, *, workload: bool = True) -> None:
    node = node_name(kube)
    job_ref, plain, web = own(kube, JOB), own(kube, PLAIN_JOB), own(kube, WEB)
    kube.add("nodes", node_obj(node, "i-0bbb0000000000001", gpus=8, labels={
        "karpenter.sh/nodepool": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
    kube.add("namespaces", {"metadata": {"name": job_ref.namespace, "labels": {}}})
    job = owned(job_ref.namespace, job_ref.name, labels={"kueue.x-k8s.io/queue-name": "gpu-queue",
                                                         "kueue.x-k8s.io/priority-class": "batch-low",
                                                         "team": "research"},
                annotations={"owner": "bob@example.com"})
    job["spec"]["suspend"] = False
    kube.add("jobs", job)
    kube.add("jobs", owned(plain.namespace, plain.name))
    kube.add("deployments", owned(web.namespace, web.name, replicas=1))
    kube.add("replicasets", owned(web.namespace, "infer-6c", owner=("Deployment", web.name)))
    if workload:
        kube.add("workloads", kueue_workload(job_ref.namespace, job_ref.name, priority_class="batch-low"))
    kube.add("pods", pod_obj(job_ref.namespace, "train-llm-0-abcde", node, gpus=2, owner=("Job", job_ref.name),
                             labels={"kueue.x-k8s.io/queue-name": "gpu-queue"}))
    kube.add("pods", pod_obj(plain.namespace, "eval-nightly-xyz12", node, owner=("Job", plain.name)))
    kube.add("pods", pod_obj(web.namespace, "infer-6c-qqqqq", node, owner=("ReplicaSet", "infer-6c")))


class World:
    """The test's part of the real API server, the cloud over it, a real store and the Actuator, on a simulated
    clock. Every GPU workload is judged IDLE under RULE (the verdict is not what is tested here)."""

    def __init__(self, kube: KapiCluster, tmp_path, *, suspend_kueue: bool = True, dry_run: bool = False):
        self.kube = kube
        self.job, self.plain_job, self.web = own(kube, JOB), own(kube, PLAIN_JOB), own(kube, WEB)
        self.ns = self.job.namespace
        self.now = T0
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        self.cloud = WorkloadCloud(KubernetesCluster(api_client(str(kubeconfig)), timeout_s=2.0),
                                   lambda *_: 40.0, scale_to_zero=True, suspend_kueue=suspend_kueue,
                                   clock=lambda: self.now)
        self.store = Store(f"sqlite:///{tmp_path / 'gpufinops.db'}")
        self.settings = load_settings(act={"dry_run": dry_run, "max_stops_per_run": 5, "max_stops_fraction": 1.0})
        self.lines: list[str] = []
        self.notifier = ConsoleNotifier(self.store, lambda: self.now, self.lines.append)
        self.actuator = Actuator(self.cloud, self.store, self.notifier, self.settings)
        self.dry_run = dry_run

    def tick(self, minutes: float, rule: Rule = RULE):
        self.now = T0 + timedelta(minutes=minutes)
        instances = self.cloud.list_gpu_instances()
        decisions = [Decision(i.instance_id, rule.name, Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW,
                              "GPU activity stayed below 5% for 10 min", self.now, action=rule.action,
                              window_s=rule.window_s, hourly_cost=i.hourly_cost)
                     for i in instances if rule.selector.matches(i)]
        results = self.actuator.apply(RunContext(now=self.now, dry_run=self.dry_run), instances, decisions, [rule])
        return {r.instance_id: r for r in results}

    def workload(self) -> dict:
        return self.kube.get("workloads", self.ns, WL_NAME)

    def workload_patches(self) -> list:
        return self.kube.calls(verb="patch", resource="workloads")

    def suspensions(self) -> list:
        return [r for r in self.workload_patches() if (r.body or {}).get("spec", {}).get("active") is False]

    def events(self, reason: str) -> list[dict]:
        return self.kube.events(reason)

    def rows(self, kind: ActionKind | None = None):
        return [a for a in self.store.action_rows() if kind is None or a.kind == kind]


@pytest.fixture
def world(kapi_cluster, tmp_path):
    fill(kapi_cluster)
    return World(kapi_cluster, tmp_path)


def listed(world: World) -> dict[str, GpuInstance]:
    return {i.instance_id: i for i in world.cloud.list_gpu_instances()}


# --------------------------------------------------------------------------- what is suspendable


def test_a_kueue_job_with_its_workload_is_suspendable_and_selectable_by_its_priority_classes(world):
    found = listed(world)
    job = found[workload_id(world.job)]
    assert job.managed_by == "" and job.tags[TAG_KUEUE_WORKLOAD] == f"{world.ns}/{WL_NAME}"
    assert job.tags[TAG_WORKLOAD_PRIORITY_CLASS] == "batch-low"
    assert Selector(tags={TAG_WORKLOAD_PRIORITY_CLASS: ("batch-low",)}).matches(job)
    assert not Selector(tags={TAG_WORKLOAD_PRIORITY_CLASS: ("prod-high",)}).matches(job)
    assert stop_blocker(job, Action.SUSPEND) == ""
    # Never scaled or deleted: only suspended.
    assert "give the rule action: suspend" in stop_blocker(job, Action.STOP)
    assert "give the rule action: suspend" in stop_blocker(job, Action.TERMINATE)
    # A Job Kueue does not manage stays reported only; a Deployment is never "suspended".
    assert "never stops Jobs" in stop_blocker(found[workload_id(world.plain_job)], Action.SUSPEND)
    assert "applies to Kueue-managed Kubernetes jobs" in stop_blocker(found[workload_id(world.web)], Action.SUSPEND)
    ec2 = GpuInstance("i-0abc", "p5.48xlarge", "us-east-1", "running", T0, provider="aws")
    assert "applies to Kueue-managed Kubernetes jobs" in stop_blocker(ec2, Action.SUSPEND)
    # One cluster-wide list of Kueue Workloads per listing.
    assert [r.path for r in world.kube.calls(verb="list", resource="workloads")] == [
        "/apis/kueue.x-k8s.io/v1beta1/workloads"]


def test_with_suspend_kueue_off_a_kueue_job_is_notify_only_and_no_workload_is_listed(kapi_cluster, tmp_path):
    fill(kapi_cluster)
    world = World(kapi_cluster, tmp_path, suspend_kueue=False)
    job = listed(world)[workload_id(world.job)]
    assert job.managed_by == "Kueue (queue 'gpu-queue')" and "kubernetes.suspend_kueue: true" in job.managed_advice
    assert TAG_KUEUE_WORKLOAD not in job.tags
    assert job.tags[TAG_WORKLOAD_PRIORITY_CLASS] == "batch-low"  # selectable all the same (the Job's label)
    assert kapi_cluster.calls(resource="workloads") == []
    world.tick(0)
    world.tick(20)
    assert world.workload_patches() == [] and kapi_cluster.calls(verb="patch") == []


def test_an_unreadable_workload_list_leaves_kueue_jobs_reported_only_this_tick(world):
    world.kube.forbid("list", "workloads", once=True)  # a real 403, then the right back
    job = listed(world)[workload_id(world.job)]
    assert job.managed_by.startswith("Kueue") and "could not be read" in job.managed_advice
    assert "403" in job.managed_advice
    assert listed(world)[workload_id(world.job)].managed_by == ""  # read again next tick


def test_a_kueue_job_without_its_workload_is_not_suspendable(kapi_cluster, tmp_path):
    fill(kapi_cluster, workload=False)
    world = World(kapi_cluster, tmp_path)
    job = listed(world)[workload_id(world.job)]
    assert job.managed_by.startswith("Kueue") and TAG_KUEUE_WORKLOAD not in job.tags


# --------------------------------------------------------------------------- mark, warn, suspend, restore


def test_an_idle_kueue_job_is_marked_warned_suspended_at_the_end_of_the_lead_and_resumed(world, tmp_path):
    world.tick(0)
    wl = world.workload()
    stop_at = "2026-12-01T12:15:00Z"
    assert wl["metadata"]["annotations"][MARK_ANNOTATION] == stop_at
    assert wl["metadata"]["annotations"][PRE_SUSPEND_ANNOTATION] == stop_at  # the hook, with the mark
    assert wl["spec"]["active"] is True
    # The Job itself is not touched: Kueue owns its spec.suspend.
    assert world.kube.calls(verb="patch", resource="jobs") == []
    assert world.kube.get("jobs", world.ns, JOB.name)["spec"]["suspend"] is False
    [event] = world.events(EVENT_MARKED)
    assert event["involvedObject"]["kind"] == "Job"
    assert event["involvedObject"]["uid"] == world.kube.uids[(world.ns, "Job", JOB.name)]  # the server's uid
    assert PRE_SUSPEND_ANNOTATION in event["message"]
    [warning] = [m for m in world.notifier.sent if m.key.startswith(f"warn:{workload_id(world.job)}")]
    assert "will be suspended" in warning.text and WL_NAME in warning.text

    world.tick(10)  # within the lead: nothing
    assert world.suspensions() == []

    results = world.tick(16)
    assert results[workload_id(world.job)].ok and results[workload_id(world.job)].kind == ActionKind.STOP
    [patch] = world.suspensions()
    assert patch.content_type == "application/merge-patch+json"
    # Preconditioned on the resourceVersion of the read that found the mark.
    assert patch.body["metadata"]["resourceVersion"]
    wl = world.workload()
    assert wl["spec"]["active"] is False and SUSPENDED_ANNOTATION in wl["metadata"]["annotations"]
    # Bookkeeping: the mark and its hook removed, stopped-by set, on the Workload.
    assert MARK_ANNOTATION not in wl["metadata"]["annotations"]
    assert PRE_SUSPEND_ANNOTATION not in wl["metadata"]["annotations"]
    assert wl["metadata"]["annotations"]["gpufinops.io/scaled-down-by"]
    assert len(world.events(EVENT_SUSPENDED)) == 1
    [stop_row] = world.rows(ActionKind.STOP)
    assert stop_row.status == "done"
    [notice] = [m for m in world.notifier.sent if m.key.startswith(f"stop:{workload_id(world.job)}")]
    assert "Suspended idle GPU workload" in notice.text
    assert world.cloud.describe([workload_id(world.job)])[0].state == "stopped"
    # Only the Kueue job was changed: the Job Kueue does not manage and the Deployment (not selected) were not.
    assert world.kube.calls(verb="patch", resource="deployments") == []

    out = restore_workload(world.cloud, world.store, f"{world.ns}/Job/train-llm", world.now, dry_run=False,
                           who="bob")
    assert out.ok, out.message
    assert "spec.active: true" in out.message
    wl = world.workload()
    assert wl["spec"]["active"] is True
    # Every annotation removed: the real server drops the empty map (the stand-in kept `{}`).
    annotations = wl["metadata"].get("annotations") or {}
    assert SUSPENDED_ANNOTATION not in annotations and "gpufinops.io/scaled-down-by" not in annotations
    assert len(world.events(EVENT_RESUMED)) == 1
    [restore_row] = world.rows(ActionKind.RESTORE)
    assert restore_row.status == "done"
    again = restore_workload(world.cloud, world.store, f"{world.ns}/train-llm", world.now, dry_run=False)
    assert not again.ok and "not suspended by gpufinops" in again.message


def test_dry_run_writes_nothing_and_a_dry_run_restore_changes_nothing(kapi_cluster, tmp_path):
    fill(kapi_cluster)
    world = World(kapi_cluster, tmp_path, dry_run=True)
    world.tick(0)
    world.tick(16)
    assert kapi_cluster.calls(verb="patch") == [] and kapi_cluster.calls(verb="create") == []
    assert any("Would suspend" in m.text or "would be suspended" in m.text for m in world.notifier.sent)


def test_a_person_removing_the_mark_in_the_last_second_wins(world):
    world.tick(0)
    inst = listed(world)[workload_id(world.job)]
    assert inst.tags[TAG_MARKED]
    # The mark is removed between the last read and the patch: the read inside the suspension sees it gone.
    world.kube.merge("workloads", world.ns, WL_NAME, {"metadata": {"annotations": {MARK_ANNOTATION: None}}})
    with pytest.raises(KubeChangeError) as refused:
        world.cloud.stop(inst)
    assert refused.value.definite and "was removed since the warning" in str(refused.value)
    assert world.suspensions() == [] and world.workload()["spec"]["active"] is True


def test_a_mark_removed_while_the_patch_is_built_is_a_409_then_a_refusal(world):
    world.tick(0)
    inst = listed(world)[workload_id(world.job)]

    def remove_mark(_request):  # a new resourceVersion: the patch's precondition fails, for real
        world.kube.merge("workloads", world.ns, WL_NAME, {"metadata": {"annotations": {MARK_ANNOTATION: None}}})

    # Just before the first suspension patch reaches the server (the proxy holds it), a person removes the mark.
    world.kube.proxy.arm("hook", call_matches("patch", "workloads"), times=1, hook=remove_mark, forward=True)
    with pytest.raises(KubeChangeError) as refused:
        world.cloud.stop(inst)
    assert "was removed since the warning" in str(refused.value)
    statuses = [r.status for r in world.workload_patches()]
    assert statuses[-1] == 409  # the one suspension patch sent was refused by its precondition
    assert world.workload()["spec"]["active"] is True


def test_a_snooze_on_the_job_or_the_workload_cancels_the_suspension(world):
    world.tick(0)
    world.kube.merge("jobs", world.ns, JOB.name,
                     {"metadata": {"annotations": {SNOOZE_ANNOTATION: "2026-12-02T09:00:00Z"}}})
    results = world.tick(16)
    assert results[workload_id(world.job)].kind == ActionKind.UNMARK
    assert world.suspensions() == []
    assert MARK_ANNOTATION not in (world.workload()["metadata"].get("annotations") or {})  # an empty map: dropped


def test_someone_else_deactivating_the_workload_is_left_alone(world):
    world.tick(0)
    world.kube.merge("workloads", world.ns, WL_NAME, {"spec": {"active": False}})
    inst = listed(world)[workload_id(world.job)]
    with pytest.raises(KubeChangeError) as refused:
        world.cloud.stop(inst)
    assert "deactivated by someone else" in str(refused.value)
    assert world.suspensions() == []


def test_the_rbac_role_grants_the_suspension_calls(world):
    from tests.places.kubernetes.test_rbac import granted

    world.tick(0)
    world.tick(16)
    restore_workload(world.cloud, world.store, f"{world.ns}/Job/train-llm", world.now, dry_run=False)
    rights = granted()
    made = {(call.resource, call.verb) for call in world.kube.calls() if call.resource == "workloads"}
    assert not world.kube.forbidden()  # and the server's own RBAC, the shipped ClusterRole bound, allowed each
    assert made == {("workloads", "list"), ("workloads", "get"), ("workloads", "patch")}
    assert all(verb in rights[("kueue.x-k8s.io", "workloads")] for _, verb in made)
    assert "get" in rights[("batch", "jobs")]


# --------------------------------------------------------------------------- rules


def test_a_suspend_rule_must_select_kueue_jobs_and_the_error_names_file_line_and_key(tmp_path):
    from gpufinops.config import ConfigError
    from gpufinops.rules import load_rules

    path = tmp_path / "idle.yaml"
    path.write_text("rules:\n  - name: ok\n    threshold_pct: 5\n    window: 30m\n    action: notify\n"
                    "  - name: everything\n    threshold_pct: 5\n    window: 30m\n    action: suspend\n")
    message = str(pytest.raises(ConfigError, load_rules, [path]).value)
    assert f"{path}:6" in message and "rules.1" in message
    assert "kueue.x-k8s.io/queue-name" in message and "kubernetes.suspend_kueue" in message
    path.write_text("rules:\n  - name: kueue\n    threshold_pct: 5\n    window: 30m\n    action: suspend\n"
                    "    select:\n      tags: {kueue.x-k8s.io/queue-name: '*', k8s:workload-priority-class: "
                    "[batch-low]}\n")
    [rule] = load_rules([path])
    assert rule.action == Action.SUSPEND and rule.selector.tags["k8s:workload-priority-class"] == ("batch-low",)
