"""What each place where GPUs live can do: the one table the stages ask instead of knowing the places by name.

A place is where a subject lives: an EC2 instance, a rented host, a Kubernetes workload, a Kueue-managed job, a
Kubernetes GPU node. Its entry says how its subjects' ids begin, the actions its client carries out, the words a
message uses for that change, what a rule must select to reach it, why any other action is refused (notify
only), whether the operator's opt-in tag gates its stops. act/plan.py (`stop_blocker`, the strongest of two idle
rules), rules.py (what a rule with an action must select), notify/messages.py (nouns and verbs) and report/ (the
Kubernetes sections) read it. A new place (GCP, Azure, Slurm) is a folder beside ec2/, hosts.py and kubernetes/,
and one entry here (GCE: places/gcp/).

Pure, no I/O; imports model and k8s.tags only (not k8s.model's types: rules.py reads this table at every start):
act.plan reads it, and the host agent imports act.plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..k8s.tags import KUEUE_QUEUE_LABEL, NODE_ID_PREFIX, TAG_KUEUE_WORKLOAD, TAG_NODE
from ..model import AZURE_ID_PREFIX as MODEL_AZURE_ID_PREFIX, Action, GpuInstance

# Every Kubernetes subject's id begins so (a workload's `k8s:<namespace>/<Kind>/<name>`, a node's `k8s:node/<name>`).
KUBERNETES_ID_PREFIX = "k8s:"
HOST_ID_PREFIX = "host:"
GCE_ID_PREFIX = "gce:"  # a Compute Engine VM: `gce:<project>/<zone>/<name>` (places/gcp/cloud.py)
# An Azure VM's id: `azure:<subscription>/<resource group>/<name>` (model.azure_vm_id).
AZURE_ID_PREFIX = MODEL_AZURE_ID_PREFIX
# A Slurm job's id: `slurm:<cluster>/<jobid>` (places.slurm.jobs.subject_id).
SLURM_ID_PREFIX = "slurm:"
# The tags a Slurm job is listed with (places.slurm.cloud), read here for what it refuses.
TAG_SLURM_BATCH = "slurm:batch"  # "true": sbatch; "false": salloc / srun --pty / an interactive app
TAG_SLURM_REQUEUEABLE = "slurm:requeueable"  # "true" when Slurm may requeue it (Requeue=1)
TAG_SLURM_INTERACTIVE_ACTS = "slurm:act-on-interactive"  # "true": its cluster's act_on_interactive
TAG_SLURM_JOB_ID = "slurm:job-id"  # Slurm's own number of the job (what scontrol takes), for messages
TAG_SLURM_SNOOZE_KEYWORD = "slurm:snooze-keyword"  # the word its user writes into the Comment to snooze it
# Why the subject carries no mark though gpufinops wrote one, where its place knows (act.plan says it).
TAG_MARK_GONE_WHY = "gpufinops:mark-gone-why"

# The words of a change in a message, (verb, past participle), where a place has none of its own.
ACTION_VERBS: Mapping[Action, tuple[str, str]] = {
    Action.STOP: ("stop", "stopped"),
    Action.TERMINATE: ("terminate", "terminated"),
    Action.SUSPEND: ("suspend", "suspended"),
    Action.DRAIN: ("cordon", "cordoned"),
    Action.REQUEUE: ("requeue", "requeued"),
    Action.HOLD: ("requeue and hold", "requeued and held"),
    Action.CANCEL: ("cancel", "cancelled"),
}


@dataclass(frozen=True)
class Place:
    name: str
    noun: str  # what a message calls one of its subjects
    provider: str  # GpuInstance.provider of its subjects
    id_prefix: str  # how its subjects' ids begin ("": any id no other place claims)
    # The actions it may be given without refusal; any other is refused with `refusal` (notify only).
    takes: frozenset[Action]
    refusal: str = ""
    # The actions a person's restore cannot undo (they are the strongest: a rule asking one wins over a stop).
    irreversible: frozenset[Action] = frozenset()
    # Its own words for a change, where they differ from ACTION_VERBS.
    verbs: Mapping[Action, tuple[str, str]] = field(default_factory=dict)
    # An action this place alone takes: any other subject refuses it with `own_action_refusal`, and a rule giving it
    # must select this place's subjects by one of the `selected_by` tag keys (else `rule_needs` at load).
    own_action: Action | None = None
    own_action_refusal: str = ""
    selected_by: tuple[str, ...] = ()
    rule_needs: str = ""
    # Stopped only while it carries the operator's opt-in tag (act.opt_in_tag): the places whose IAM or the
    # operator's word names it (act.plan.opt_in_gap).
    opt_in_by_tag: bool = False
    # Its spot subjects are stopped like any other (a GCE Spot VM); else only under a persistent spot request
    # (EC2 stops no one-time spot instance: act.plan.stop_blocker).
    stops_any_spot: bool = False
    # Further actions this place alone takes, like `own_action` (a Slurm job: requeue, hold, cancel).
    also_owns: frozenset[Action] = frozenset()

    def owns(self, action: Action) -> bool:
        return action is self.own_action or action in self.also_owns

    def verbs_for(self, action: Action) -> tuple[str, str]:
        """(verb, past participle) of `action` done to one of its subjects."""
        return self.verbs.get(action) or ACTION_VERBS[action]


_CHANGES = (Action.STOP, Action.TERMINATE, Action.SUSPEND, Action.DRAIN)
SUSPEND_SELECTORS = (KUEUE_QUEUE_LABEL, TAG_KUEUE_WORKLOAD)

KUBERNETES_NODE = Place(
    name="Kubernetes GPU node", noun="GPU node", provider="kubernetes", id_prefix=NODE_ID_PREFIX,
    # A notify-only rule gets the same advice as a stop: the one change gpufinops makes to a node is a cordon.
    takes=frozenset({Action.DRAIN}),
    refusal=("a Kubernetes node is cordoned for Karpenter / cluster-autoscaler to remove, never stopped or "
             "deleted by gpufinops: notify only; give the rule action: drain"),
    verbs={a: ("cordon", "cordoned") for a in _CHANGES},
    own_action=Action.DRAIN,
    own_action_refusal=("action drain applies to Kubernetes GPU nodes only (selected by tag k8s:node, with "
                        "kubernetes.drain_nodes: true): notify only"),
    selected_by=(TAG_NODE,),
    rule_needs=(f"action 'drain' applies to Kubernetes GPU nodes only: select them with select.tags naming "
                f"{TAG_NODE} (e.g. `tags: {{\"{TAG_NODE}\": '*'}}`), and set kubernetes.drain_nodes: true"),
)

# A workload whose Kueue Workload gpufinops reads (tag TAG_KUEUE_WORKLOAD): its id is a workload's.
KUEUE_JOB = Place(
    name="Kueue-managed Kubernetes job", noun="GPU workload", provider="kubernetes", id_prefix=KUBERNETES_ID_PREFIX,
    takes=frozenset({Action.SUSPEND}),
    refusal=("a Kueue-managed job is suspended through Kueue, never scaled or deleted: notify only; give the "
             "rule action: suspend"),
    # The one change gpufinops makes to a Kueue-managed job, whatever the rule's verb: its Workload deactivated.
    verbs={a: ("suspend", "suspended") for a in _CHANGES},
    own_action=Action.SUSPEND,
    own_action_refusal=("action suspend applies to Kueue-managed Kubernetes jobs only (a Job, JobSet, Kubeflow "
                        "training job or RayJob labelled kueue.x-k8s.io/queue-name whose Kueue Workload gpufinops "
                        "reads, with kubernetes.suspend_kueue: true): notify only"),
    selected_by=SUSPEND_SELECTORS,
    rule_needs=(f"action 'suspend' applies to Kueue-managed Kubernetes jobs only: select them with select.tags "
                f"naming {' or '.join(SUSPEND_SELECTORS)} (e.g. `tags: {{{KUEUE_QUEUE_LABEL}: '*'}}`), and set "
                f"kubernetes.suspend_kueue: true"),
)

KUBERNETES_WORKLOAD = Place(
    name="Kubernetes workload", noun="GPU workload", provider="kubernetes", id_prefix=KUBERNETES_ID_PREFIX,
    takes=frozenset({Action.NOTIFY, Action.STOP}),
    refusal=("a Kubernetes workload is scaled to zero, never deleted: notify only; give the rule "
             "action: stop to scale it to zero"),
    verbs={Action.STOP: ("scale to zero", "scaled to zero")},
)

# Listed in the config, no cloud API: every host is `managed_by` (stopped from the host by the agent).
RENTED_HOST = Place(
    name="rented host", noun="GPU host", provider="rented", id_prefix=HOST_ID_PREFIX,
    takes=frozenset({Action.NOTIFY, Action.STOP, Action.TERMINATE}),
)

EC2 = Place(
    name="EC2 instance", noun="GPU instance", provider="aws", id_prefix="",
    takes=frozenset({Action.NOTIFY, Action.STOP, Action.TERMINATE}),
    irreversible=frozenset({Action.TERMINATE}),
    opt_in_by_tag=True,
)

# A Compute Engine VM: stopped (TERMINATED: vCPU and GPU billing end, disks stay), never deleted. Its Spot and
# preemptible VMs can be stopped like any other.
GCE = Place(
    name="GCE VM", noun="GPU VM", provider="gcp", id_prefix=GCE_ID_PREFIX,
    takes=frozenset({Action.NOTIFY, Action.STOP}),
    refusal="a GCE VM is stopped, never deleted, by gpufinops: notify only; give the rule action: stop",
    opt_in_by_tag=True,
    stops_any_spot=True,
)

# Its stop is ARM's deallocate, the only one that ends compute billing (a power-off leaves the VM "Stopped
# (allocated)" and billed); gpufinops never deletes a VM.
AZURE_VM = Place(
    name="Azure VM", noun="GPU VM", provider="azure", id_prefix=AZURE_ID_PREFIX,
    takes=frozenset({Action.NOTIFY, Action.STOP}),
    refusal=("an Azure VM is deallocated, never deleted by gpufinops: notify only; give the rule action: stop to "
             "deallocate it"),
    verbs={Action.STOP: ("deallocate", "deallocated")},
    # No Azure role condition can test a tag on a deallocate: the opt-in tag is the code's fence (act.plan).
    opt_in_by_tag=True,
    # A Spot VM is deallocated like any other (its eviction policy only says what Azure does on eviction).
    stops_any_spot=True,
)

SLURM_ACTIONS = frozenset({Action.REQUEUE, Action.HOLD, Action.CANCEL})
SLURM_JOB = Place(
    name="Slurm job", noun="GPU job", provider="slurm", id_prefix=SLURM_ID_PREFIX,
    takes=frozenset({Action.NOTIFY, *SLURM_ACTIONS}),
    refusal=("a Slurm job is requeued, held or cancelled through Slurm, never stopped or terminated: notify only; "
             "give the rule action: requeue, hold or cancel"),
    irreversible=frozenset({Action.CANCEL}),
    # What reconcile finds done without the rule at hand (a lost answer settled later): the job ended.
    verbs={Action.STOP: ("end", "ended"), Action.TERMINATE: ("end", "ended")},
    also_owns=SLURM_ACTIONS,
    own_action_refusal="actions requeue, hold and cancel apply to Slurm jobs only: notify only",
    selected_by=("slurm:partition", "slurm:account", "slurm:user", "slurm:qos", "slurm:job-name",
                 "slurm:interactive"),
    rule_needs=("actions requeue, hold and cancel apply to Slurm jobs only: select them with select.tags naming "
                "a slurm: tag (e.g. `tags: {\"slurm:partition\": gpu}`)"),
)

# In the order their refusals are asked (a node's and a Kueue job's own actions first), the catch-all last.
PLACES: tuple[Place, ...] = (KUBERNETES_NODE, KUEUE_JOB, SLURM_JOB, KUBERNETES_WORKLOAD, RENTED_HOST, GCE, AZURE_VM,
                             EC2)


def place_of(subject_id: str) -> Place:
    """The place a subject id belongs to, by its prefix (a Kueue job reads as a workload: only its tags tell)."""
    if subject_id.startswith(NODE_ID_PREFIX):
        return KUBERNETES_NODE
    if subject_id.startswith(KUBERNETES_ID_PREFIX):
        return KUBERNETES_WORKLOAD
    if subject_id.startswith(HOST_ID_PREFIX):
        return RENTED_HOST
    if subject_id.startswith(GCE_ID_PREFIX):
        return GCE
    if subject_id.startswith(AZURE_ID_PREFIX):
        return AZURE_VM
    if subject_id.startswith(SLURM_ID_PREFIX):
        return SLURM_JOB
    return EC2


def place_of_instance(inst: GpuInstance) -> Place:
    """The place a listed subject lives in: its provider, then its id and tags."""
    if inst.provider == "kubernetes":
        if inst.instance_id.startswith(NODE_ID_PREFIX):
            return KUBERNETES_NODE
        return KUEUE_JOB if inst.tags.get(TAG_KUEUE_WORKLOAD) else KUBERNETES_WORKLOAD
    if inst.provider == GCE.provider:
        return GCE
    if inst.provider == AZURE_VM.provider:
        return AZURE_VM
    if inst.provider == SLURM_JOB.provider:
        return SLURM_JOB
    return RENTED_HOST if inst.provider == RENTED_HOST.provider else EC2


def slurm_job_refusal(inst: GpuInstance, action: Action) -> str:
    """Why this Slurm job does not take `action` though its place does ("" when it does): only a requeueable batch
    job is requeued; an interactive one is notify-only unless its cluster says `act_on_interactive: true`."""
    if action is Action.NOTIFY:
        return ""
    interactive = inst.tags.get(TAG_SLURM_BATCH) != "true"
    if interactive and inst.tags.get(TAG_SLURM_INTERACTIVE_ACTS) != "true":
        return ("an interactive job (salloc, srun --pty, an interactive app) is notify-only: its user is at the "
                "keyboard; the cluster's act_on_interactive: true lets rules end such jobs")
    if action is Action.REQUEUE and interactive:
        return "an interactive job cannot be requeued (only batch jobs are): notify only; hold or cancel would end it"
    if action is Action.REQUEUE and inst.tags.get(TAG_SLURM_REQUEUEABLE) != "true":
        return ("the job is not requeueable (submitted with --no-requeue, or JobRequeue=0): notify only; a rule with "
                "action: hold or cancel would end it")
    return ""


def refusal(inst: GpuInstance, action: Action) -> str:
    """Why `inst`'s place refuses `action` (notify only); "" when its place takes it. An action one place alone
    takes is refused for every other subject first, in PLACES' order."""
    place = place_of_instance(inst)
    for p in PLACES:
        if p.owns(action) and p is not place:
            return p.own_action_refusal
        if p is place and action not in p.takes:
            return p.refusal
    return slurm_job_refusal(inst, action) if place is SLURM_JOB else ""


def strength(action: Action) -> int:
    """How much an action takes away: 0 a message, 1 a change a restore undoes, 2 one it never does (the stronger
    wins when several idle rules select one subject)."""
    if action is Action.NOTIFY:
        return 0
    return 2 if any(action in p.irreversible for p in PLACES) else 1


def rule_subjects(action: Action) -> tuple[tuple[str, ...], str] | None:
    """(the select.tags keys, the error without one) for an action one place alone takes; None for any other."""
    for p in PLACES:
        if p.owns(action):
            return p.selected_by, p.rule_needs
    return None
