"""places.registry: which place a subject lives in (by the ids the places themselves build), what each place takes,
and the refusals, strengths, rule selectors and verbs the stages read from it: the very ones act/plan.py, rules.py
and notify/messages.py held in tables of their own before (issue 36)."""

from __future__ import annotations

from datetime import datetime, timezone
from itertools import product

import pytest

from gpufinops.act.plan import primary_decision, stop_blocker
from gpufinops.config import ConfigError
from gpufinops.k8s.model import TAG_KUEUE_WORKLOAD, TAG_NODE, WorkloadRef
from gpufinops.model import Action, Decision, GpuInstance, ReasonCode, Verdict
from gpufinops.notify import messages
from gpufinops.places import hosts
from gpufinops.places.kubernetes.names import workload_id
from gpufinops.places.kubernetes.nodes import node_id
from gpufinops.places.registry import (
    EC2,
    KUBERNETES_NODE,
    KUBERNETES_WORKLOAD,
    KUEUE_JOB,
    PLACES,
    RENTED_HOST,
    SLURM_ACTIONS,
    SLURM_JOB,
    TAG_SLURM_BATCH,
    TAG_SLURM_INTERACTIVE_ACTS,
    TAG_SLURM_REQUEUEABLE,
    place_of,
    place_of_instance,
    refusal,
    rule_subjects,
    strength,
)
from gpufinops.rules import load_rule_file

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
WORKLOAD = workload_id(WorkloadRef("ml", "Deployment", "infer"))
JOB = workload_id(WorkloadRef("research", "Job", "batch"))
NODE = node_id("gpu-node-1")
HOST = hosts.instance_id("rig-01")


def subject(instance_id: str, provider: str = "aws", **kw) -> GpuInstance:
    return GpuInstance(instance_id=instance_id, instance_type="g5.xlarge", region="us-east-1", state="running",
                       launch_time=T0, gpu_count=1, provider=provider, **kw)


SUBJECTS = {
    "ec2": subject("i-0abc"),
    "ec2 one-time spot": subject("i-0spot", lifecycle="spot", spot_request_type="one-time"),
    "ec2 persistent spot": subject("i-0pers", lifecycle="spot", spot_request_type="persistent"),
    "rented host": subject(HOST, provider="rented", managed_by=hosts.MANAGED_BY, managed_advice=hosts.MANAGED_ADVICE),
    "workload": subject(WORKLOAD, provider="kubernetes"),
    "kueue job": subject(JOB, provider="kubernetes", tags={TAG_KUEUE_WORKLOAD: "research/job-batch-1a2b"}),
    "node": subject(NODE, provider="kubernetes", tags={TAG_NODE: "gpu-node-1"}),
}


def test_a_subject_id_names_its_place_by_the_prefix_its_place_builds():
    assert place_of(WORKLOAD) is KUBERNETES_WORKLOAD
    assert place_of(JOB) is KUBERNETES_WORKLOAD  # a Kueue job is told apart by its tags only
    assert place_of(NODE) is KUBERNETES_NODE
    assert place_of(HOST) is RENTED_HOST
    assert place_of("i-0abc") is EC2


def test_a_listed_subject_is_placed_by_its_provider_id_and_tags():
    placed = {name: place_of_instance(inst) for name, inst in SUBJECTS.items()}
    assert placed == {"ec2": EC2, "ec2 one-time spot": EC2, "ec2 persistent spot": EC2, "rented host": RENTED_HOST,
                      "workload": KUBERNETES_WORKLOAD, "kueue job": KUEUE_JOB, "node": KUBERNETES_NODE}


def _stop_blocker_before_the_registry(inst: GpuInstance, action: Action) -> str:
    """act.plan.stop_blocker as it was at cf636f6, its per-subject checks written inline."""
    if inst.managed_by:
        advice = f"; instead: {inst.managed_advice}" if inst.managed_advice else ""
        return f"managed by {inst.managed_by}: never stopped by gpufinops{advice}"
    node = inst.provider == "kubernetes" and inst.instance_id.startswith("k8s:node/")
    if action == Action.DRAIN and not node:
        return ("action drain applies to Kubernetes GPU nodes only (selected by tag k8s:node, with "
                "kubernetes.drain_nodes: true): notify only")
    if node and action != Action.DRAIN:
        return ("a Kubernetes node is cordoned for Karpenter / cluster-autoscaler to remove, never stopped or "
                "deleted by gpufinops: notify only; give the rule action: drain")
    kueue = inst.provider == "kubernetes" and bool(inst.tags.get(TAG_KUEUE_WORKLOAD))
    # Since GCE VMs take suspend too (issue 39), its refusal names both places; a GCE VM is not among SUBJECTS.
    if action == Action.SUSPEND and not kueue:
        return ("action suspend applies to Kueue-managed Kubernetes jobs (a Job, JobSet, Kubeflow training "
                "job or RayJob labelled kueue.x-k8s.io/queue-name whose Kueue Workload gpufinops reads, with "
                "kubernetes.suspend_kueue: true) and to GCE VMs (selected by tag gce:zone) only: notify only")
    if kueue and action != Action.SUSPEND:
        return ("a Kueue-managed job is suspended through Kueue, never scaled or deleted: notify only; give the "
                "rule action: suspend")
    if inst.provider == "kubernetes" and action == Action.TERMINATE:
        return ("a Kubernetes workload is scaled to zero, never deleted: notify only; give the rule "
                "action: stop to scale it to zero")
    if inst.lifecycle == "spot" and action == Action.STOP:
        if inst.spot_request_type == "persistent":
            return ""
        kind = f"a {inst.spot_request_type} spot instance" if inst.spot_request_type else \
            "a spot instance whose request type is unknown"
        return (f"{kind} cannot be stopped (EC2 only terminates it): notify only; a rule with "
                f"action: terminate and confirm_terminate: true would terminate it")
    return ""


# Actions that came after the registry (Slurm's, an Azure VM's power-off) have no "before": tested on their own.
@pytest.mark.parametrize("name,action", list(product(SUBJECTS, [a for a in Action if a not in SLURM_ACTIONS
                                                                  and a is not Action.POWER_OFF])))
def test_stop_blocker_refuses_every_subject_and_action_as_before(name, action):
    inst = SUBJECTS[name]
    assert stop_blocker(inst, action) == _stop_blocker_before_the_registry(inst, action)


def test_each_place_takes_its_own_actions_and_refuses_the_rest():
    takes = {name: {a for a in Action if not refusal(inst, a)} for name, inst in SUBJECTS.items()
             if not inst.managed_by}
    assert takes["ec2"] == {Action.NOTIFY, Action.STOP, Action.TERMINATE}
    assert takes["workload"] == {Action.NOTIFY, Action.STOP}
    assert takes["kueue job"] == {Action.SUSPEND}
    assert takes["node"] == {Action.DRAIN}


def test_terminate_is_the_strongest_action_and_a_message_the_weakest():
    assert [strength(a) for a in (Action.NOTIFY, Action.STOP, Action.SUSPEND, Action.DRAIN, Action.TERMINATE)] == \
        [0, 1, 1, 1, 2]

    def idle(action: Action) -> Decision:
        return Decision("i-0abc", f"rule-{action.value}", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", T0, action)

    assert primary_decision([idle(Action.NOTIFY), idle(Action.TERMINATE), idle(Action.STOP)]).action is \
        Action.TERMINATE
    assert primary_decision([idle(Action.NOTIFY), idle(Action.STOP)]).action is Action.STOP


def test_an_action_one_place_takes_needs_a_rule_selecting_that_place(tmp_path):
    def load(text: str):
        path = tmp_path / "rules.yaml"
        path.write_text(text)
        return load_rule_file(path)

    assert rule_subjects(Action.STOP) is None and rule_subjects(Action.NOTIFY) is None
    selectors, needs = rule_subjects(Action.DRAIN)
    assert selectors == (TAG_NODE,) and "drain_nodes" in needs
    with pytest.raises(ConfigError) as refused:
        load("rules:\n- name: cordon-all\n  window: 30m\n  threshold_pct: 5\n  action: drain\n")
    assert needs in str(refused.value)
    selectors, needs = rule_subjects(Action.SUSPEND)
    assert TAG_KUEUE_WORKLOAD in selectors
    rules = load("rules:\n- name: park-jobs\n  window: 30m\n  threshold_pct: 5\n  action: suspend\n"
                            "  select: {tags: {kueue.x-k8s.io/queue-name: '*'}}\n")
    assert rules[0].action is Action.SUSPEND


@pytest.mark.parametrize("name,action,words", [
    ("ec2", Action.STOP, ("stop", "stopped")),
    ("ec2", Action.TERMINATE, ("terminate", "terminated")),
    ("workload", Action.STOP, ("scale to zero", "scaled to zero")),
    ("kueue job", Action.STOP, ("suspend", "suspended")),
    ("kueue job", Action.SUSPEND, ("suspend", "suspended")),
    ("node", Action.DRAIN, ("cordon", "cordoned")),
    ("node", Action.STOP, ("cordon", "cordoned")),
])
def test_a_message_says_the_change_in_its_places_words(name, action, words):
    inst = SUBJECTS[name]
    assert place_of_instance(inst).verbs_for(action) == words
    decision = Decision(inst.instance_id, "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", T0, action)
    warning = messages.idle_warning(inst, decision, marked_at=T0, stop_at=T0, channel="", dry_run=False, action=action)
    assert f"will be {words[1]}:" in warning.title


def test_every_place_has_a_noun_and_every_change_has_words():
    assert {p.noun for p in PLACES} == {"GPU instance", "GPU workload", "GPU node", "GPU VM", "GPU host", "GPU job"}
    for p, action in product(PLACES, (Action.STOP, Action.TERMINATE, Action.SUSPEND, Action.DRAIN)):
        verb, done = p.verbs_for(action)
        assert verb and done


def slurm_job(batch: bool = True, requeueable: bool = True, act_on_interactive: bool = False) -> GpuInstance:
    return subject("slurm:ci/1234_7", provider="slurm", tags={
        TAG_SLURM_BATCH: str(batch).lower(), TAG_SLURM_REQUEUEABLE: str(requeueable).lower(),
        TAG_SLURM_INTERACTIVE_ACTS: str(act_on_interactive).lower()})


def test_a_slurm_job_takes_requeue_hold_and_cancel_and_nothing_else_does():
    assert place_of("slurm:ci/1234_7") is SLURM_JOB and place_of_instance(slurm_job()) is SLURM_JOB
    assert {a for a in Action if not refusal(slurm_job(), a)} == {Action.NOTIFY, *SLURM_ACTIONS}
    for name, inst in SUBJECTS.items():
        for action in SLURM_ACTIONS:
            assert stop_blocker(inst, action), (name, action)
    assert "apply to Slurm jobs only" in refusal(SUBJECTS["ec2"], Action.CANCEL)
    assert "never stopped or terminated" in refusal(slurm_job(), Action.STOP)
    assert strength(Action.CANCEL) == 2 and strength(Action.REQUEUE) == strength(Action.HOLD) == 1


@pytest.mark.parametrize("job, action, refused", [
    (slurm_job(requeueable=False), Action.REQUEUE, "not requeueable"),
    (slurm_job(requeueable=False), Action.CANCEL, ""),
    (slurm_job(batch=False), Action.CANCEL, "interactive job"),
    (slurm_job(batch=False), Action.NOTIFY, ""),
    (slurm_job(batch=False, act_on_interactive=True), Action.HOLD, ""),
    (slurm_job(batch=False, act_on_interactive=True), Action.REQUEUE, "cannot be requeued"),
])
def test_what_one_slurm_job_refuses(job, action, refused):
    got = refusal(job, action)
    assert (refused in got and got) if refused else got == ""


def test_a_rule_ending_slurm_jobs_must_select_them(tmp_path):
    assert rule_subjects(Action.REQUEUE)[0] == SLURM_JOB.selected_by
    bad = tmp_path / "r.yaml"
    bad.write_text("rules:\n  - name: r\n    threshold_pct: 5\n    window: 10m\n    action: cancel\n")
    with pytest.raises(ConfigError, match="apply to Slurm jobs only"):
        load_rule_file(bad)
    ok = tmp_path / "ok.yaml"
    ok.write_text("rules:\n  - name: r\n    select: {tags: {'slurm:partition': [gpu]}}\n    threshold_pct: 5\n"
                  "    window: 10m\n    action: cancel\n")
    assert load_rule_file(ok)[0].action is Action.CANCEL


AZURE = subject("azure:11111111-2222-3333-4444-555555555555/ml/idle-a100", provider="azure")


def test_power_off_is_an_azure_vms_alone_and_every_other_subject_is_told_whose_it_is():
    assert {a for a in Action if not refusal(AZURE, a)} == {Action.NOTIFY, Action.STOP, Action.POWER_OFF}
    assert place_of_instance(AZURE).verbs_for(Action.POWER_OFF) == ("power off", "powered off")
    for name, inst in SUBJECTS.items():
        if inst.managed_by:
            continue
        refused = refusal(inst, Action.POWER_OFF)
        # A node and a Kueue job are asked first (PLACES' order): each says its own one change instead.
        own = {"node": "give the rule action: drain", "kueue job": "give the rule action: suspend"}.get(name)
        assert refused.endswith(own) if own else refused.startswith("action power_off applies to Azure VMs only"), name
    # No tag selects an Azure VM: a power_off rule loads without one (its other subjects are notify only).
    assert rule_subjects(Action.POWER_OFF) is None
    assert strength(Action.POWER_OFF) == strength(Action.STOP) == 1


def test_a_spent_power_off_ranks_under_any_other_idle_rule(tmp_path):
    def idle(action: Action, code: ReasonCode = ReasonCode.BILLED_WHILE_STOPPED) -> Decision:
        return Decision(AZURE.instance_id, f"rule-{action.value}", Verdict.IDLE, code, "idle", T0, action)

    # Powered off already: the power_off rule has nothing left to do, a notify or stop rule beside it still acts.
    assert primary_decision([idle(Action.POWER_OFF), idle(Action.NOTIFY)]).action is Action.NOTIFY
    assert primary_decision([idle(Action.POWER_OFF), idle(Action.STOP)]).action is Action.STOP
    # Running and idle: the two changes are equal, rule-file order breaks the tie.
    running = ReasonCode.IDLE_STAYS_BELOW
    assert primary_decision([idle(Action.POWER_OFF, running), idle(Action.STOP, running)]).action is Action.POWER_OFF
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n- name: keep-hardware\n  window: 2h\n  threshold_pct: 5\n  action: power_off\n")
    assert load_rule_file(path)[0].action is Action.POWER_OFF


AZURE_SCALE_SET_NODE = subject("azure:11111111-2222-3333-4444-555555555555/mc_ml_aks1_eastus/aks-gpu-1234-vmss/0",
                               provider="azure")


def test_an_instance_of_an_azure_scale_set_takes_no_change_at_all_whatever_its_manager_says():
    from gpufinops.places.registry import AZURE_SCALE_SET_INSTANCE, AZURE_VM

    assert place_of(AZURE_SCALE_SET_NODE.instance_id) is AZURE_SCALE_SET_INSTANCE
    assert place_of_instance(AZURE_SCALE_SET_NODE) is AZURE_SCALE_SET_INSTANCE
    assert place_of(AZURE.instance_id) is AZURE_VM and place_of_instance(AZURE) is AZURE_VM
    # Even listed without a manager (the place sets one): every action but a message is refused, power_off with it.
    assert {a for a in Action if not refusal(AZURE_SCALE_SET_NODE, a)} == {Action.NOTIFY}
    for action in (Action.STOP, Action.POWER_OFF, Action.TERMINATE):
        assert stop_blocker(AZURE_SCALE_SET_NODE, action).startswith("an instance of an Azure VM scale set"), action
    assert AZURE_SCALE_SET_INSTANCE.noun == "GPU VM"  # what its notices call it
