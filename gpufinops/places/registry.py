"""What each place where GPUs live can do: the one table the stages ask instead of knowing the places by name.

A place is where a subject lives: an EC2 instance, a rented host, a Kubernetes workload, a Kueue-managed job, a
Kubernetes GPU node. Its entry says how its subjects' ids begin, the actions its client carries out, the words a
message uses for that change, what a rule must select to reach it, why any other action is refused (notify
only), whether the operator's opt-in tag gates its stops. act/plan.py (`stop_blocker`, the strongest of two idle
rules), rules.py (what a rule with an action must select), notify/messages.py (nouns and verbs) and report/ (the
Kubernetes sections) read it. A new place (GCP, Azure, Slurm) is a folder beside ec2/, hosts.py and kubernetes/,
and one entry here (GCE: places/gcp/).

Pure, no I/O; imports k8s.tags and model's leaves rule_types and subject_ids only (not k8s.model's or model's
records: rules.py reads this table at every start; GpuInstance for type hints only): act.plan reads it, and the host
agent imports act.plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from ..k8s.tags import KUEUE_QUEUE_LABEL, NODE_ID_PREFIX, TAG_KUEUE_WORKLOAD, TAG_NODE
from ..rule_types import Action
from ..subject_ids import AZURE_ID_PREFIX, is_azure_scale_set_vm_id

if TYPE_CHECKING:
    from ..model import GpuInstance

# Every Kubernetes subject's id begins so (a workload's `k8s:<namespace>/<Kind>/<name>`, a node's `k8s:node/<name>`).
KUBERNETES_ID_PREFIX = "k8s:"
HOST_ID_PREFIX = "host:"
GCE_ID_PREFIX = "gce:"  # a Compute Engine VM: `gce:<project>/<zone>/<name>` (places/gcp/cloud.py)
# AZURE_ID_PREFIX (imported above, from subject_ids): an Azure VM's id `azure:<subscription>/<resource group>/<name>`
# (model.azure_vm_id); a Uniform scale set's instance `azure:<subscription>/<resource group>/<scale set>/<instance id>`
# (model.azure_scale_set_vm_id).
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
# In a change's error: the cloud refused it for good (GCE's UNSUPPORTED_OPERATION: no suspend of a VM with GPUs
# attached): the act stage never tries it again in the idle episode, and never makes another change instead.
UNSUPPORTED_MARK = "[not supported for this subject]"
# The fence at the cloud (a place whose entry says `fenced_at_cloud`: a GCE VM, never EC2, whose IAM policy fences
# instead): written, with the version of the final read in which the mark was seen, right before the stop; its value
# is the time of that attempt. A person's label change after that read makes the cloud refuse it, and then no stop
# is sent (act.actuator._fence, docs/deploy.md "GCP").
TAG_STOP_FENCE = "gpufinops:stopping"
# A GCE VM's zone, as its listing tags it (places.gcp.cloud; no label can hold a `:`): what a rule selects GCE VMs by.
TAG_GCE_ZONE = "gce:zone"

# The words of a change in a message, (verb, past participle), where a place has none of its own.
ACTION_VERBS: Mapping[Action, tuple[str, str]] = {
    Action.STOP: ("stop", "stopped"),
    Action.TERMINATE: ("terminate", "terminated"),
    Action.SUSPEND: ("suspend", "suspended"),
    Action.DRAIN: ("cordon", "cordoned"),
    Action.REQUEUE: ("requeue", "requeued"),
    Action.HOLD: ("requeue and hold", "requeued and held"),
    Action.CANCEL: ("cancel", "cancelled"),
    Action.POWER_OFF: ("power off", "powered off"),
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
    # Its cloud takes a label write conditioned on the version of a read (a GCE VM's labelFingerprint): right before
    # a stop the actuator writes the fence tag (TAG_STOP_FENCE) with the version of the final read in which the
    # mark was seen, and sends the stop only when that write went through (`Cloud.set_tags_fenced`).
    fenced_at_cloud: bool = False
    # Actions its cloud carries out by a call of their own (Cloud.suspend: GCE's instances.suspend), not by its stop.
    own_calls: frozenset[Action] = frozenset()
    # What `rules check` says of a rule giving one of its actions to its subjects: a limit the cloud publishes.
    caveats: Mapping[Action, str] = field(default_factory=dict)

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
    rule_needs=(f"action 'suspend' applies to Kueue-managed Kubernetes jobs: select them with select.tags "
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

# Where GCE publishes what it refuses to suspend (docs/deploy.md, "GCP": suspend).
GCE_SUSPEND_LIMITS_URL = "https://cloud.google.com/compute/docs/instances/suspend-resume-instance#limitations"
GCE_SUSPEND_CAVEAT = (
    "GCE publishes limits on suspending a VM (" + GCE_SUSPEND_LIMITS_URL + "; errors: "
    "https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-suspend-resume): only a RUNNING VM, a guest "
    "OS that supports ACPI S3, and among the configurations it refuses, VMs with GPUs attached and VMs with more "
    "memory than it can save (every A2/A3/G2 VM gpufinops lists has GPUs attached). A suspend GCE refuses "
    "(UNSUPPORTED_OPERATION) is recorded, said once, and the mark given up for the idle episode: the VM keeps "
    "running, it is never stopped instead (its warning said suspended); give the rule action: stop to end its GPU "
    "billing")

# A Compute Engine VM: stopped (TERMINATED: vCPU and GPU billing end, disks stay) or, under a rule with action
# suspend, suspended (SUSPENDED: memory state and disks stored and billed, vCPU and GPU not); never deleted. Its Spot
# and preemptible VMs can be stopped like any other.
GCE = Place(
    name="GCE VM", noun="GPU VM", provider="gcp", id_prefix=GCE_ID_PREFIX,
    takes=frozenset({Action.NOTIFY, Action.STOP, Action.SUSPEND}),
    refusal=("a GCE VM is stopped or suspended, never deleted, by gpufinops: notify only; give the rule action: "
             "stop (or suspend)"),
    opt_in_by_tag=True,
    stops_any_spot=True,
    fenced_at_cloud=True,
    also_owns=frozenset({Action.SUSPEND}),
    own_calls=frozenset({Action.SUSPEND}),
    own_action_refusal=f"action suspend applies to GCE VMs (selected by tag {TAG_GCE_ZONE}): notify only",
    selected_by=(TAG_GCE_ZONE,),
    rule_needs=(f"action 'suspend' applies to GCE VMs: select them with select.tags naming {TAG_GCE_ZONE} (e.g. "
                f"`tags: {{\"{TAG_GCE_ZONE}\": '*'}}`)"),
    caveats={Action.SUSPEND: GCE_SUSPEND_CAVEAT},
)

# Its stop is ARM's deallocate, the only one that ends compute billing; gpufinops never deletes a VM. A power-off
# leaves the VM "Stopped (allocated)" and billed: made only where a rule says action: power_off (the operator keeps
# the VM's hardware: a deallocated GPU VM may find no capacity when started), and every notice of it says so.
AZURE_VM = Place(
    name="Azure VM", noun="GPU VM", provider="azure", id_prefix=AZURE_ID_PREFIX,
    takes=frozenset({Action.NOTIFY, Action.STOP, Action.POWER_OFF}),
    refusal=("an Azure VM is deallocated, never deleted by gpufinops: notify only; give the rule action: stop to "
             "deallocate it"),
    verbs={Action.STOP: ("deallocate", "deallocated"), Action.POWER_OFF: ("power off", "powered off")},
    # Its own action: any other subject refuses power_off. No tag selects Azure VMs, so a rule is not required to
    # (selected_by empty): its other subjects are told notify only, and `rules check` says what it does.
    also_owns=frozenset({Action.POWER_OFF}),
    own_action_refusal=("action power_off applies to Azure VMs only (ARM's powerOff: the VM stays allocated and "
                        "billed): notify only; give the rule action: stop"),
    # No Azure role condition can test a tag on a deallocate: the opt-in tag is the code's fence (act.plan).
    opt_in_by_tag=True,
    # A Spot VM is deallocated like any other (its eviction policy only says what Azure does on eviction).
    stops_any_spot=True,
)

# An instance of a Uniform VM scale set (an AKS GPU node pool's node, most GPU scale sets): its scale set owns it
# (deallocated, it is replaced or restarted; the Tags API at its scope is no change gpufinops may make either), so it
# takes no change at all: judged and advised (scale the set in, or let AKS's cluster autoscaler remove the node).
# Its subjects also carry `managed_by` (places.azure): this is the fence behind that one, for any action and any call.
AZURE_SCALE_SET_INSTANCE = Place(
    name="Azure VM scale set instance", noun="GPU VM", provider="azure", id_prefix=AZURE_ID_PREFIX,
    takes=frozenset({Action.NOTIFY}),
    refusal=("an instance of an Azure VM scale set is removed by its scale set (scale it in) or AKS's cluster "
             "autoscaler, never stopped, powered off or tagged by gpufinops: notify only"),
    verbs={Action.STOP: ("deallocate", "deallocated"), Action.POWER_OFF: ("power off", "powered off")},
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

# In the order their refusals are asked (a node's, a Kueue job's, a Slurm job's and an Azure VM's own actions first:
# a subject given another place's own action hears whose it is; a scale set's instance, before the Azure VM, hears
# its own refusal of power_off), the catch-all last.
PLACES: tuple[Place, ...] = (KUBERNETES_NODE, KUEUE_JOB, SLURM_JOB, AZURE_SCALE_SET_INSTANCE, AZURE_VM,
                             KUBERNETES_WORKLOAD, RENTED_HOST, GCE, EC2)


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
        return AZURE_SCALE_SET_INSTANCE if is_azure_scale_set_vm_id(subject_id) else AZURE_VM
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
        return AZURE_SCALE_SET_INSTANCE if is_azure_scale_set_vm_id(inst.instance_id) else AZURE_VM
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


def owners(action: Action) -> tuple[Place, ...]:
    """The places that alone take `action` (suspend: Kueue-managed jobs and GCE VMs), in PLACES' order; () for an
    action every place may take."""
    return tuple(p for p in PLACES if p.owns(action))


# Why a subject none of its owners is refuses an action several places take, in one sentence.
SHARED_REFUSALS: Mapping[Action, str] = {
    Action.SUSPEND: ("action suspend applies to Kueue-managed Kubernetes jobs (a Job, JobSet, Kubeflow training job "
                     "or RayJob labelled kueue.x-k8s.io/queue-name whose Kueue Workload gpufinops reads, with "
                     f"kubernetes.suspend_kueue: true) and to GCE VMs (selected by tag {TAG_GCE_ZONE}) only: notify "
                     "only"),
}


def refusal(inst: GpuInstance, action: Action) -> str:
    """Why `inst`'s place refuses `action` (notify only); "" when its place takes it. An action some places alone
    take is refused for every other subject first, in PLACES' order, with each owner's words."""
    place = place_of_instance(inst)
    owned_by = owners(action)
    for p in PLACES:
        if p in owned_by and place not in owned_by:
            return SHARED_REFUSALS[action] if len(owned_by) > 1 else p.own_action_refusal
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
    """(the select.tags keys, the error without one) for an action some places alone take (any owner's keys
    select); None for any other, and for one whose places no tag selects (an Azure VM's power_off: its rule's other
    subjects are notify only)."""
    owned_by = [p for p in owners(action) if p.selected_by]
    if not owned_by:
        return None
    keys = tuple(k for p in owned_by for k in p.selected_by)
    return keys, "; or ".join(dict.fromkeys(p.rule_needs for p in owned_by))


def rule_caveats(action: Action, selected_tags) -> tuple[str, ...]:
    """What the places a rule gives `action` to (those whose `selected_by` keys its select.tags name) publish as
    limits of that action: `rules check` prints them, the service logs them at load."""
    keys = set(selected_tags)
    return tuple(p.caveats[action] for p in owners(action) if action in p.caveats and keys & set(p.selected_by))
