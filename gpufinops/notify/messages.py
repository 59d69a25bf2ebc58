"""What gpufinops says: pure functions from instances and decisions to Notices (model.Notice).

A Notice says what happened, about which subject and for whom (its audience), as a title, a lead, facts and
notes in the Notice markup; the deliveries render it (slack_blocks: Block Kit; email: HTML and text) and
notify/routing.py turns its audience into destinations. Every value a user controls (tags, names, reasons
quoting them) is escaped here (&, <, >) so a tag like `<!channel>` cannot ping a channel nor become HTML, and
clipped so a message stays readable whatever the fleet looks like.

The idempotency key of each notice names the event (warning for one mark, stop at one time, one metrics
outage), so each delivery sends it at most once however many runs see the same event.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Collection, Sequence

from ..config import SLACK_USER_ID
from ..k8s.model import (DEFAULT_PROTECT_KEY, MARK_ANNOTATION, PRE_SUSPEND_ANNOTATION,
                         REPLICAS_BEFORE_ANNOTATION, SNOOZE_ANNOTATION, TAG_KUEUE_WORKLOAD)
from ..model import (
    TAG_MARKED,
    TAG_PROTECT,
    TAG_SNOOZE,
    Action,
    Decision,
    GpuInstance,
    Notice,
    ReasonCode,
    format_duration,
    format_money,
)
from ..places.gcp.labels import gcloud_add_labels, in_label_words
from ..places.gcp.labels import keep_hint as gce_keep_hint
from ..places.registry import (ACTION_VERBS, AZURE_SCALE_SET_INSTANCE, AZURE_VM, GCE, KUBERNETES_NODE, RENTED_HOST,
                               SLURM_JOB, TAG_SLURM_JOB_ID, TAG_SLURM_SNOOZE_KEYWORD, place_of_instance)
from ..words import HINTS, POWER_OFF_BILLING, words
from .markup import clip, escape, time_token, when, without_endpoints

# Slack's limits, with a margin where Slack counts differently from len().
# The fallback `text` of chat.postMessage; Slack truncates far beyond this, but
# notifications and the outbox should stay readable.
MAX_FALLBACK = 3000
# A single user-controlled value (AWS allows 256-character tag values).
MAX_VALUE = 120
MAX_REASON = 300
# Instances listed one by one in a metrics-unavailable alert.
MAX_LISTED = 20


# --------------------------------------------------------------------------- formatting


def _clip_raw(value: object, limit: int = MAX_VALUE) -> str:
    text = " ".join(str(value).split())  # newlines in tags would break list layouts
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _shown_id(subject_id: str, limit: int = 40) -> str:
    """A subject's id, clipped in the middle when long: its end names the machine (an Azure VM's
    `azure:<subscription>/<group>/<name>` would otherwise lose its name behind the subscription's GUID)."""
    text = " ".join(str(subject_id).split())
    return text if len(text) <= limit else text[: limit // 3] + "…" + text[-(limit - limit // 3 - 1):]


def _v(value: object, limit: int = MAX_VALUE, empty: str = "—") -> str:
    """A user-controlled value, clipped then escaped (never cut inside an entity)."""
    if value is None or str(value).strip() == "":
        return empty
    return escape(_clip_raw(value, limit))


def _money_and_day(usd_per_hour: float | None, *, estimate: bool = False) -> str:
    if usd_per_hour is None or (isinstance(usd_per_hour, float) and math.isnan(usd_per_hour)):
        return format_money(None, per="h")
    return (f"{format_money(usd_per_hour, per='h')} ({'estimate, ' if estimate else ''}"
            f"≈ {format_money(usd_per_hour * 24, digits=0, per='day')})")


def _utc(dt: datetime) -> datetime:
    # Naive datetimes in this code base are UTC (store.py does the same).
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _stamp(dt: datetime) -> str:
    return f"{_utc(dt):%Y%m%dT%H%M%SZ}"


_when = when
_slack_date = time_token  # a time in the notice markup; Slack shows it in each reader's own zone


def _pct(value: float | None) -> str:
    return "no data" if value is None else f"{value:.1f}%"


def _notice(key: str, channel: str, text: str, *, inst: GpuInstance | None = None, **parts) -> Notice:
    if inst is not None:
        parts.setdefault("subject", inst.instance_id)
        parts.setdefault("owner", inst.owner() or "")
        parts.setdefault("team", inst.team() or "")
        parts.setdefault("audience", ("team", "owner"))
    return Notice(key=key, channel=channel, text=_clip_text(text, MAX_FALLBACK), **parts)


def _clip_text(text: str, limit: int) -> str:
    return clip(text, limit)


# --------------------------------------------------------------------------- instance facts


def _who_and_where(inst: GpuInstance) -> tuple[tuple[str, str], ...]:
    """The facts every notice about an instance starts with: which, what type, whose, which team, where."""
    return (("Instance", _instance_field(inst)), ("Type", _type_field(inst)), ("Owner", _owner_field(inst)),
            ("Team", _v(inst.team())), ("Where", _where_field(inst)))


def _instance_line(inst: GpuInstance) -> str:
    """'i-0abc (p4d.24xlarge, owner alice, team ml)', escaped, for fallback text; a host has no instance type:
    'gpu-box-1 (1× A10G, ...)'."""
    bits = [_host_gpus(inst) if _is_host(inst) else _v(inst.instance_type, 40)]
    if inst.owner():
        bits.append(f"owner {_v(inst.owner(), 60)}")
    if inst.team() and inst.team() != inst.owner():
        bits.append(f"team {_v(inst.team(), 60)}")
    return f"{_v(_shown_id(inst.instance_id))} ({', '.join(bits)})"


def _owner_field(inst: GpuInstance) -> str:
    if inst.owner():
        return _v(inst.owner())
    # A host's tags are the config's (hosts.inventory, or the agent's host_tags), not a cloud's tags.
    return "none set (owner in its host tags)" if _is_host(inst) else "no owner tag"


def _host_gpus(inst: GpuInstance) -> str:
    """What a host is, in place of an instance type it does not have: '1× A10G', '2 GPU' or 'host'."""
    if inst.gpu_count and inst.gpu_model:
        return f"{inst.gpu_count}× {_v(inst.gpu_model, 40)}"
    return f"{inst.gpu_count} GPU" if inst.gpu_count else "host"


def _instance_field(inst: GpuInstance) -> str:
    name = inst.tags.get("Name") or inst.tags.get("name")
    out = f"`{_v(_shown_id(inst.instance_id))}`"
    return f"{out}\n{_v(name)}" if name else out


def _type_field(inst: GpuInstance) -> str:
    if _is_host(inst):
        return f"{RENTED_HOST.name}\n{_host_gpus(inst)}"
    out = _v(inst.instance_type, 40)
    if inst.gpu_count:
        gpu = f"{inst.gpu_count}× {_v(inst.gpu_model, 40)}" if inst.gpu_model else f"{inst.gpu_count} GPU"
        out += f"\n{gpu}"
    if inst.lifecycle and inst.lifecycle != "on-demand":
        out += f" · {_v(inst.lifecycle, 20)}"
    return out


def _where_field(inst: GpuInstance) -> str:
    if _is_host(inst) and not inst.region:
        return _v(inst.private_dns or inst.instance_id, 60)  # no region: its hostname says where
    parts = [_v(inst.region, 30)]
    if inst.account:
        parts.append(_v(inst.account, 30))
    return " · ".join(parts)


def _activity_field(decision: Decision) -> str:
    out = f"mean {_pct(decision.activity_mean)}, max {_pct(decision.activity_max)}"
    if decision.memory_max_mib is not None:
        out += f"\nmemory held {decision.memory_max_mib / 1024:.1f} GiB"
    if decision.coverage is not None:
        out += f"\ncoverage {decision.coverage * 100:.0f}%"
    return out


def _cost(inst: GpuInstance, decision: Decision | None) -> float | None:
    if inst.hourly_cost is not None:
        return inst.hourly_cost
    return decision.hourly_cost if decision is not None else None


def _estimated(inst: GpuInstance) -> bool:
    """The $/h shown (the instance's own) is a guess: GpuInstance.price_source starts with "estimate"."""
    return inst.hourly_cost is not None and inst.price_source.startswith("estimate")


def _window(decision: Decision) -> str:
    return f"≥ {format_duration(decision.window_s)}" if decision.window_s else "—"


def _idle_for(decision: Decision, idle_since: datetime | None, now: datetime) -> str:
    """'1 h 40 min (since <02:12>)' when the start of the lull is known, else '≥ <the rule's window>'."""
    if idle_since is None or idle_since > now:
        return _window(decision)
    return f"{format_duration((_utc(now) - _utc(idle_since)).total_seconds())} (since {_slack_date(idle_since)})"


def _is_workload(inst: GpuInstance) -> bool:
    """A Kubernetes Deployment/StatefulSet (places.kubernetes.cloud): scaled to zero, kept by annotations."""
    return inst.provider == "kubernetes"


def _is_node(inst: GpuInstance) -> bool:
    """A Kubernetes GPU node (places.kubernetes.cloud.node_instance): cordoned, kept by annotations."""
    return place_of_instance(inst) is KUBERNETES_NODE


def _is_host(inst: GpuInstance) -> bool:
    """A GPU server that is no cloud's instance (hosts.inventory, or the agent on a host off EC2): kept running by
    `gpufinops agent snooze` on it, never by a cloud tag."""
    return place_of_instance(inst) is RENTED_HOST


# What the agent's own notices say to keep its host running, when the agent reads the default snooze file.
HOST_SNOOZE_COMMAND = "gpufinops agent snooze 2h"


def host_keep_hint(snooze_command: str = HOST_SNOOZE_COMMAND) -> str:
    """How a person keeps a host running: the command that writes the snooze file its agent reads."""
    return (f"To keep it running: make it busy, or run `{escape(snooze_command)}` on the host (no warning and no "
            f"stop until then).")


def _noun(inst: GpuInstance) -> str:
    return place_of_instance(inst).noun


def _verbs(action: Action, fn: str, inst: GpuInstance | None = None) -> tuple[str, str]:
    if action not in ACTION_VERBS:
        raise ValueError(f"{fn}() is for stop/terminate rules, got action {action.value!r}; use idle_notice()")
    # The change the subject's place makes for this action, in its words: a Kueue job is suspended and a node
    # cordoned whatever the rule's verb (stop_blocker lets only their own action through), a workload scaled to zero.
    return place_of_instance(inst).verbs_for(action) if inst is not None else ACTION_VERBS[action]


def _kueue_workload(inst: GpuInstance) -> str:
    """namespace/name of the Kueue Workload gpufinops would suspend this job through, "" for anything else."""
    return inst.tags.get(TAG_KUEUE_WORKLOAD, "") if _is_workload(inst) else ""


def _restore_target(inst: GpuInstance) -> str:
    """What `gpufinops k8s restore` takes for this workload: its id's NAMESPACE/KIND/NAME (escaped: names are
    untrusted), or a placeholder for an id cut to the store's width (its full name is not in it)."""
    raw = inst.instance_id.removeprefix("k8s:")
    return _v(raw, 200) if "~" not in raw else "<namespace>/<Kind>/<name>"


def _in_its_words(inst: GpuInstance, reason: str) -> str:
    """A reason that names gpufinops's tags, as the subject carries them: a GCE VM's labels."""
    return in_label_words(reason) if place_of_instance(inst) is GCE else reason


def _is_slurm_job(inst: GpuInstance) -> bool:
    return place_of_instance(inst) is SLURM_JOB


def _keep_hint(inst: GpuInstance | None = None) -> str:
    if inst is not None and _kueue_workload(inst):
        ns, _, name = _kueue_workload(inst).partition("/")
        return (f"To keep it running: make it busy, or annotate its Kueue Workload (`kubectl annotate workload -n "
                f"{_v(ns, 63)} {_v(name, 80)} ...`) or the job's own object `{SNOOZE_ANNOTATION}` = an ISO-8601 time (pause "
                f"until then) or `{DEFAULT_PROTECT_KEY}` = `true`; removing `{MARK_ANNOTATION}` from the Workload "
                f"cancels it. `{PRE_SUSPEND_ANNOTATION}` on the Workload says when: checkpoint before then.")
    if inst is not None and _is_node(inst):
        return (f"To keep it: run a GPU pod on it, or annotate the node `{SNOOZE_ANNOTATION}` = an ISO-8601 time "
                f"(pause until then) or `{DEFAULT_PROTECT_KEY}` = `true`; removing `{MARK_ANNOTATION}` from it "
                f"cancels the cordon. After a cordon Karpenter / cluster-autoscaler can remove the node (their "
                f"own rules decide); gpufinops evicts no pod.")
    if inst is not None and place_of_instance(inst) is GCE:
        return gce_keep_hint()
    if inst is not None and _is_host(inst):
        return host_keep_hint()
    if inst is not None and _is_slurm_job(inst):
        job = _v(inst.tags.get(TAG_SLURM_JOB_ID, "N"), 24)
        keyword = _v(inst.tags.get(TAG_SLURM_SNOOZE_KEYWORD, "gpufinops:keep"), 64)
        return (f"To keep it running: make it busy, or write `{keyword}` into its Comment (`scontrol update "
                f"jobid={job} Comment=\"... {keyword}\"`), or ask an operator to run `gpufinops slurm snooze "
                f"{job} 2h`; removing `{TAG_MARKED}=...` from its Comment cancels it.")
    if inst is not None and _is_workload(inst):
        return (f"To keep it running: make it busy, or annotate it `{SNOOZE_ANNOTATION}` = an ISO-8601 time "
                f"(pause until then) or `{DEFAULT_PROTECT_KEY}` = `true` (never scale it down).")
    return (
        f"To keep it running: make it busy, or tag it `{TAG_SNOOZE}` = an ISO-8601 time (pause until then) "
        f"or `{TAG_PROTECT}` = `true` (never stop)."
    )


# --------------------------------------------------------------------------- messages


# What each button asks for; gpufinops.interact turns a verified, allowed click into the snooze tag.
SNOOZE_ACTIONS = {
    "gpufinops_snooze_2h": "Snooze 2 h",
    "gpufinops_snooze_tomorrow": "Snooze until tomorrow 09:00",
    "gpufinops_keep_7d": "Keep running (7 days)",
}
# The button of a stop notice about a Kubernetes workload, Kueue job or node: undo what gpufinops did
# (gpufinops.interact records the request; act/restore.py carries it out on the leader's next tick).
RESTORE_ACTION = "gpufinops_restore"
# Every button's label by action id: what is drawn and what a click may name (one table for both).
BUTTON_LABELS = {**SNOOZE_ACTIONS, RESTORE_ACTION: "Restore"}


def warning_key(instance_id: str, marked_at: datetime) -> str:
    """The idempotency key of a mark's warning: one per mark, however many tries its delivery takes."""
    return f"warn:{instance_id}:{_stamp(marked_at)}"


def idle_warning(
    inst: GpuInstance,
    decision: Decision,
    *,
    marked_at: datetime,
    stop_at: datetime,
    channel: str = "",
    to: tuple[str, ...] = (),
    dry_run: bool,
    action: Action,
    sent_at: datetime | None = None,
    buttons: bool = False,
    idle_since: datetime | None = None,
    keep_hint: str = "",
) -> Notice:
    """Phase one of a stop: the instance is marked and will be stopped at stop_at if still idle.
    `keep_hint`: how to keep it running, where the sender knows better than the place (the agent: the snooze
    command naming the file it reads, host_keep_hint).
    `buttons`: Snooze / Keep running buttons (only where the service verifies clicks: slack.signing_secret).
    `idle_since`: when it really went idle (act.idle_since), shown instead of "≥ the rule's window".

    The key is the mark's (one warning per mark, however many tries its delivery takes); `sent_at` is
    this try's time, from which the lead is counted when an earlier try was not delivered."""
    verb, _done = _verbs(action, "idle_warning", inst)
    lead = format_duration((_utc(stop_at) - _utc(sent_at or marked_at)).total_seconds())
    cost = _cost(inst, decision)
    reason = _v(decision.reason, MAX_REASON)
    will = f"would be {_done} (dry-run)" if dry_run else f"will be {_done}"
    keep_hint = keep_hint or _keep_hint(inst)
    billing = _billing_continues(action)

    text = (
        ("[DRY-RUN] " if dry_run else "")
        + f"Idle {_noun(inst)} {_instance_line(inst)} {will} at {_when(stop_at)} (in {lead}) unless it becomes "
        f"active. Why: {reason}. Cost {format_money(cost, per='h', estimate=_estimated(inst))}. {billing}{keep_hint}"
    )
    return _notice(
        warning_key(inst.instance_id, marked_at), channel, text, inst=inst, kind="warning", dry_run=dry_run, to=to,
        title=f"Idle {_noun(inst)} {'would be' if dry_run else 'will be'} {_done}: {_shown_id(inst.instance_id)}",
        lead=(f"*{_v(_shown_id(inst.instance_id))}* has been idle under rule *{_v(decision.rule_name)}* and {will} "
              f"at {_slack_date(stop_at)} (in {lead}) unless it becomes active.\n*Why:* {reason}"
              + (f"\n*Billing:* {billing.strip()}" if billing else "")),
        facts=(
            *_who_and_where(inst),
            ("Cost", _money_and_day(cost, estimate=_estimated(inst))),
            ("Idle for", _idle_for(decision, idle_since, sent_at or marked_at)),
            ("GPU activity", _activity_field(decision)),
            (f"{verb.capitalize()} at", _slack_date(stop_at)),
            ("Rule", _v(decision.rule_name)),
        ),
        actions=tuple(SNOOZE_ACTIONS) if buttons else (),
        notes=(keep_hint,) + _suspend_notes(inst, action) + way_out_notes(inst, sent_at or marked_at, buttons=buttons),
    )


def _is_gce_suspend(inst: GpuInstance | None, action: Action) -> bool:
    return inst is not None and action is Action.SUSPEND and place_of_instance(inst) is GCE


def _suspend_notes(inst: GpuInstance, action: Action) -> tuple[str, ...]:
    """A GCE VM's suspend, said as it is: what stays billed, and that GCE may refuse it (its published limits)."""
    if not _is_gce_suspend(inst, action):
        return ()
    return (f"Suspended means {words('suspend')}. GCE refuses to suspend some VMs (its published limits name VMs "
            f"with GPUs attached); if it refuses, this VM keeps running, is not stopped instead, and you are told.",)


# A user id as Slack answers it (users.lookupByEmail): letters and digits only, so `<@…>` stays one mention.
SLACK_ID_ANSWERED = re.compile(r"[UW][A-Z0-9]{1,30}")

# The snooze the copy-paste command of a warning sets: this long after the warning.
CLI_SNOOZE = timedelta(hours=24)
_CLI_MAX = 400  # a longer command (a hostile id or region) is not shown rather than shown clipped, i.e. wrong


def aws_create_tags(inst: GpuInstance, key: str, value: str) -> str | None:
    """The exact `aws ec2 create-tags` line setting one tag on this instance, every argument shell-quoted (the id
    and region come from the cloud: untrusted text). None when it is not an EC2 instance, or the line could not be
    shown whole in a code span (a backquote, a line break or a control character, or too long)."""
    if inst.provider != "aws" or _is_workload(inst) or not inst.region or not inst.instance_id:
        return None
    parts = ("aws", "ec2", "create-tags", "--region", str(inst.region), "--resources", str(inst.instance_id),
             "--tags", f"Key={key},Value={value}")
    line = " ".join(shlex.quote(p) for p in parts)
    if len(line) > _CLI_MAX or "`" in line or any(ord(c) < 32 or ord(c) == 127 for c in line):
        return None
    return line


def gcloud_add_labels_line(inst: GpuInstance, key: str, value: str) -> str | None:
    """The exact `gcloud compute instances add-labels` line setting one of gpufinops's tags as a label on this GCE
    VM, shell-quoted; None when its id is not a GCE VM's or the line could not be shown whole."""
    parts = inst.instance_id.removeprefix(GCE.id_prefix).split("/")
    if not inst.instance_id.startswith(GCE.id_prefix) or len(parts) != 3 or not all(parts):
        return None
    line = " ".join(shlex.quote(p) for p in gcloud_add_labels(*parts, {key: value}))
    if len(line) > _CLI_MAX or "`" in line or any(ord(c) < 32 or ord(c) == 127 for c in line):
        return None
    return line


def way_out_notes(inst: GpuInstance, now: datetime, *, buttons: bool = False) -> tuple[str, ...]:
    """The warning's copy-paste ways out that need no console: snooze 24 h, protect for good (notice markup)."""
    until = _utc(now) + CLI_SNOOZE
    line = gcloud_add_labels_line if place_of_instance(inst) is GCE else aws_create_tags
    snooze = line(inst, TAG_SNOOZE, until.strftime("%Y-%m-%dT%H:%M:%SZ"))
    protect = line(inst, TAG_PROTECT, "true")
    if not (snooze and protect):
        return ()
    return (f"No console needed{' (or use the buttons above)' if buttons else ''}. Snooze until "
            f"{_slack_date(until)}: `{escape(snooze)}`",
            f"Never stop it: `{escape(protect)}`")


def mention_owner(notice: Notice, user_id: str) -> Notice:
    """The notice as Slack shows it to a workspace where the owner is `user_id`: `<@U…>` at the end of its text
    (so the owner is notified) and in its Owner fact. For Slack only: email shows the owner tag as written."""
    if not (SLACK_USER_ID.fullmatch(user_id or "") or SLACK_ID_ANSWERED.fullmatch(user_id or "")):
        return notice
    mention = f"<@{user_id}>"
    if mention in notice.text:
        return notice  # named already (the owner who clicked Restore): never twice in one line
    facts = tuple((label, mention if value == user_id else f"{mention} ({value})") if label == "Owner" else
                  (label, value) for label, value in notice.facts)
    suffix = f" (owner {mention})"
    return replace(notice, text=_clip_text(notice.text, MAX_FALLBACK - len(suffix)) + suffix, facts=facts)


def _billing_continues(action: Action) -> str:
    """The sentence every notice of a power-off carries (its compute is still billed), with a trailing space; ""
    for any other action."""
    return f"{POWER_OFF_BILLING[:1].upper()}{POWER_OFF_BILLING[1:]}. " if action is Action.POWER_OFF else ""


def stopped(
    inst: GpuInstance, decision: Decision, *, at: datetime, channel: str = "", to: tuple[str, ...] = (),
    dry_run: bool, action: Action, idle_since: datetime | None = None,
) -> Notice:
    """Phase two: the instance was stopped (or, in dry-run, would have been). A power-off saves nothing: its
    notice says the compute is still billed, never a saving."""
    verb, done = _verbs(action, "stopped", inst)
    noun = _noun(inst)
    cost = _cost(inst, decision)
    reason = _v(decision.reason, MAX_REASON)
    billing = _billing_continues(action)
    # A cordon saves nothing by itself: the node's cost ends when Karpenter / cluster-autoscaler remove it.
    saves = (billing.strip() if billing else
             f"Once its autoscaler removes it, that saves {format_money(cost, per='h', estimate=_estimated(inst))}."
             if _is_node(inst) else
             f"Saves {format_money(cost, per='h', estimate=_estimated(inst))} for every hour it stays {done}.")
    if dry_run:
        text = (f"[DRY-RUN] Would {verb} idle {noun} {_instance_line(inst)} at {_when(at)}; "
                f"it was NOT {done}. Why: {reason}. "
                + (billing.strip() if billing else
                   f"Would save {format_money(cost, per='h', estimate=_estimated(inst))}"
                   + (" once its autoscaler removes it." if _is_node(inst) else ".")))
        title = f"Would {verb} idle {noun}: {_shown_id(inst.instance_id)}"
        lead = f"*{_v(_shown_id(inst.instance_id))}* would have been {done} at {_slack_date(at)}; it was *not* {done}."
    else:
        text = f"{done.capitalize()} idle {noun} {_instance_line(inst)} at {_when(at)}. Why: {reason}. {saves}"
        title = f"Idle {noun} {done}: {_shown_id(inst.instance_id)}"
        lead = f"*{_v(_shown_id(inst.instance_id))}* was {done} at {_slack_date(at)}."
    if billing:
        lead += f"\n*Billing:* {billing.strip()}"
    if _kueue_workload(inst):
        after = (f"Kueue Workload {_v(_kueue_workload(inst), 120)} was set `spec.active: false`: Kueue evicted it and "
                 f"keeps it out of the queue. Resume it with `gpufinops k8s restore {_restore_target(inst)}` "
                 f"(`spec.active: true`: Kueue queues it again; it resumes from its last checkpoint if it wrote one).")
    elif _is_node(inst):
        after = (f"Nothing new is scheduled onto it (`spec.unschedulable: true`); Karpenter / cluster-autoscaler "
                 f"can remove it by their own rules, honouring PodDisruptionBudgets; gpufinops evicts no pod and "
                 f"deletes no node. Undo with "
                 f"`gpufinops k8s restore node/{_v(inst.private_dns, 120)}`.")
    elif _is_slurm_job(inst):
        job = _v(inst.tags.get(TAG_SLURM_JOB_ID, "N"), 24)
        after = {Action.REQUEUE: "The job is back in the queue: Slurm runs it again when it is scheduled (it "
                                 "resumes from its last checkpoint if it wrote one).",
                 Action.HOLD: f"The job is back in the queue, held (`scontrol requeuehold`): `scontrol release {job}` "
                              "lets it run again.",
                 Action.CANCEL: "A cancelled job does not come back: submit it again when it is needed.",
                 }.get(action)
        if after is None:
            # Settled by reconcile after a lost answer or a restart: the rule's action is not at hand, only what
            # Slurm shows now; a requeued job must not be told to submit itself again.
            after = (f"Slurm shows the job back in the queue: `squeue -j {job}` says whether it is held (then "
                     f"`scontrol release {job}` lets it run again)." if inst.state == "stopped" else
                     "Slurm shows the job ended: submit it again when it is needed." if inst.state == "terminated"
                     else f"`squeue -j {job}` shows whether it went back to the queue or ended.")
    elif _is_workload(inst):
        after = (f"Bring it back with `gpufinops k8s restore {_restore_target(inst)}` (the replica count is kept in "
                 f"`{REPLICAS_BEFORE_ANNOTATION}`); annotate it `{DEFAULT_PROTECT_KEY}` = `true` to exclude it.")
    elif _is_gce_suspend(inst, action):
        after = (f"Suspended: {words('suspend')}. Resume it with `gcloud compute instances resume` (its memory comes "
                 f"back as it was); GCE stops a VM left suspended for more than 60 days.")
    elif action is Action.TERMINATE:
        after = "A terminated instance cannot be started again; its volumes follow their DeleteOnTermination setting."
    elif billing:
        after = (f"It keeps its hardware: start it again whenever it is needed. To end its compute billing, deallocate "
                 f"it (`az vm deallocate`); tag it `{TAG_PROTECT}` = `true` to exclude it from automatic changes.")
    else:
        after = f"Start it again whenever it is needed; tag it `{TAG_PROTECT}` = `true` to exclude it from automatic stops."
    return _notice(
        stop_key(inst.instance_id, at), channel, text, inst=inst, kind="stopped", dry_run=dry_run, to=to,
        title=title, lead=f"{lead}\n*Why:* {reason}",
        facts=(
            *_who_and_where(inst),
            ("Still billed" if billing else "Would save" if dry_run else "Saves once removed" if _is_node(inst) else
             "Saves while suspended (less its stored memory)" if _is_gce_suspend(inst, action) else
             "Saves while stopped",
             format_money(cost, per="h", estimate=_estimated(inst))),
            ("Idle for", _idle_for(decision, idle_since, at)),
            ("GPU activity", _activity_field(decision)),
            ("Would stop at" if dry_run else f"{done.capitalize()} at", _slack_date(at)),
            ("Rule", _v(decision.rule_name)),
        ),
        notes=(after,),
        # Only what gpufinops changed can be undone: a workload scaled to zero, a Kueue job suspended, a node
        # cordoned (every stop of a Kubernetes subject is one of those). Shown only where clicks are verified
        # (routing.Deliveries); the command in `after` stays for email readers.
        actions=(RESTORE_ACTION,) if _is_workload(inst) and not dry_run else (),
    )


def stop_key(instance_id: str, at: datetime) -> str:
    """The idempotency key of a stop notice (the Restore button names it: its result is a reply to it)."""
    return f"stop:{instance_id}:{_stamp(at)}"


def is_stop_key_of(key: str, instance_id: str) -> bool:
    """Whether `key` is a stop notice's key (`stop_key`) about this instance."""
    return key.startswith(f"stop:{instance_id}:")


def restore_result(instance_id: str, target: str, status: str, *, replicas: int | None, who: str, detail: str,
                   dry_run: bool, key: str, thread_key: str = "", channel: str = "", owner: str = "",
                   team: str = "") -> Notice:
    """The one line a Restore click comes to, as a reply to the stop notice it was on. `target` is what
    `gpufinops k8s restore` takes (`NS/Kind/NAME`, `node/NAME`); `status` is act.restore.RestoreOutcome's;
    `who` the clicking Slack user id (or a name); `detail` the restore's own words (an error, why not), said
    without the API server's (or any) address: the log has the full text (act/restore.py).
    `owner`, `team`: the subject's tags; an owner other than the clicker gets the line as the stop notice reached
    them (notify/routing.py)."""
    by = _person(who)
    detail = without_endpoints(detail)
    subject = f"`{_v(instance_id, 64)}`"
    parts = target.split("/")
    # NS/Kind/NAME: anything but a Deployment or StatefulSet is a Kueue-managed job (suspended, resumed by Kueue).
    kind = "node" if parts[0] == "node" else "job" if len(parts) == 3 and parts[1] not in (
        "Deployment", "StatefulSet") else "workload"
    count = f" to {replicas} replicas" if replicas else ""
    if status == "would_restore":
        undo = {"node": "uncordon", "job": "resume", "workload": "restore"}[kind]
        text = (f"[DRY-RUN] Restore clicked by {by}: would {undo} {subject}{count if kind == 'workload' else ''}; "
                f"nothing was changed (`act.dry_run` is on).")
    elif status == "restored":
        text = {"node": f"Node {subject} uncordoned by {by}: new pods can be scheduled onto it again.",
                "job": f"{subject} resumed by {by}: its Kueue Workload is `spec.active: true` again, so Kueue "
                       f"queues the job again; it resumes from its last checkpoint if it wrote one.",
                "workload": f"{subject} restored{count} by {by}."}[kind]
    elif status == "settled_restored":  # an unknown outcome, settled later from the state: not said who did it
        now_is = {"node": "uncordoned", "job": "resumed (its Kueue Workload is active)",
                  "workload": "scaled back up"}[kind]
        text = (f"Restore of {subject} clicked by {by}: read back once no request could still be in flight, it is "
                f"{now_is} now.")
    elif status == "unknown":
        text = (f"Restore of {subject} clicked by {by}: the Kubernetes API gave no clear answer "
                f"({_v(detail, MAX_REASON)}), so it is not known yet whether it was done. gpufinops reads it back "
                f"and records the outcome in its audit log (`gpufinops audit --instance {_v(instance_id, 64)}`); "
                f"if it is still not back in a few minutes, click Restore again.")
    else:  # failed, nothing_to_restore, or a wait that lasted too long
        text = f"Restore of {subject} clicked by {by} was not done: {_v(detail, MAX_REASON)}"
    # The owner's routes, unless the owner is who clicked (they read the reply where they clicked).
    to_owner = bool(owner.strip()) and owner.strip() != who
    return _notice(key, channel, text, kind="restore", subject=instance_id, dry_run=dry_run, thread_key=thread_key,
                   audience=("team", "owner") if to_owner else ("team",), owner=owner, team=team)


def _person(who: str) -> str:
    """A Slack user id as a mention (`<@U…>`), anything else as escaped text."""
    return f"<@{who}>" if SLACK_USER_ID.fullmatch(who or "") else _v(who, 60, empty="someone")


def snooze_not_applied(instance_id: str, *, user_id: str, until: datetime, error: str, key: str) -> Notice:
    """To the person who clicked Snooze, when its tag could not be written: the stop is held all the same."""
    text = (f"Your snooze of {_v(instance_id, 40)} until {_when(until)} is recorded and holds: gpufinops will not "
            f"stop it before then. The tag `{TAG_SNOOZE}` could not be written on the instance "
            f"({_v(without_endpoints(error), 200)}), so other tools do not see the snooze; gpufinops's own record "
            "keeps it.")
    return _notice(key, user_id, text, kind="snooze", subject=instance_id, audience=("person",),
                   title="Your snooze holds", lead=text)


def mark_cancelled(inst: GpuInstance, *, reason: str, marked_at: datetime, channel: str = "",
                   to: tuple[str, ...] = (), verb: str = "") -> Notice:
    """The pending stop is off: the instance became active, was snoozed or protected (for a GPU node, the pending
    cordon: also when someone else cordoned it). `verb`: the change its warning announced, where the caller knows it
    (a GCE VM's suspend that GCE refused)."""
    why = _v(_in_its_words(inst, reason), MAX_REASON)
    stop = verb or ("cordon" if _is_node(inst) else "stop")  # the one change gpufinops makes to a node is a cordon
    text = (f"{stop.capitalize()} cancelled for {_noun(inst)} {_instance_line(inst)}: {why}. "
            f"It had been marked at {_when(marked_at)}; this warning is withdrawn, and any later {stop} comes with a "
            f"new warning first.")
    return _notice(
        f"unmark:{inst.instance_id}:{_stamp(marked_at)}", channel, text, inst=inst, kind="cancelled", to=to,
        title=f"{stop.capitalize()} cancelled: {_shown_id(inst.instance_id)}",
        lead=f"The {stop} planned for *{_v(_shown_id(inst.instance_id))}* is cancelled: {why}",
        facts=(
            *_who_and_where(inst)[:4],
            ("Marked at", _slack_date(marked_at)),
        ),
    )


def idle_notice(inst: GpuInstance, decision: Decision, *, since: datetime, channel: str = "",
                to: tuple[str, ...] = (), not_stopped_because: str = "") -> Notice:
    """Notify-only rule (or a stop rule that may not stop this instance, `not_stopped_because`): tell the owner,
    change nothing."""
    cost = _cost(inst, decision)
    reason = _v(decision.reason, MAX_REASON)
    # `since` is the first evaluation that found it idle; the idle time began a full window before it,
    # or earlier (what came before the first evaluation is not known).
    began = _utc(since) - timedelta(seconds=decision.window_s or 0)
    idle_s = (_utc(decision.evaluated_at) - began).total_seconds()
    hint = HINTS.get(decision.code.value, "")
    # Never "will be stopped" for what gpufinops may not stop; the way to let it is said instead.
    nothing = (f"Nothing will be stopped: {_v(_in_its_words(inst, not_stopped_because), MAX_REASON)}."
               if not_stopped_because
               else "This rule only notifies: nothing will be stopped.")
    # A VM or a rented host by its place's own noun; a Kubernetes workload as an instance, as it always read here.
    own_noun = place_of_instance(inst) in (GCE, AZURE_VM, AZURE_SCALE_SET_INSTANCE, RENTED_HOST)
    noun = "GPU node" if _is_node(inst) else _noun(inst) if own_noun else "GPU instance"
    text = (f"{noun} {_instance_line(inst)} is idle (for at least {format_duration(idle_s)}, since "
            f"{_when(began)} or earlier). "
            f"Why: {reason}. Cost {format_money(cost, per='h', estimate=_estimated(inst))}. {hint} {nothing}")
    return _notice(
        f"idle:{inst.instance_id}:{_stamp(since)}", channel, text, inst=inst, kind="idle", to=to,
        title=f"Idle {noun}: {_shown_id(inst.instance_id)}",
        lead=(f"*{_v(_shown_id(inst.instance_id))}* has been idle since {_slack_date(began)} or earlier under rule "
              f"*{_v(decision.rule_name)}*.\n*Why:* {reason}" + (f"\n{hint}" if hint else "")),
        facts=(
            *_who_and_where(inst),
            ("Cost", _money_and_day(cost, estimate=_estimated(inst))),
            ("Idle for", f"≥ {format_duration(idle_s)}"),
            ("GPU activity", _activity_field(decision)),
            ("Rule", _v(decision.rule_name)),
        ),
        notes=(f"{nothing} " + (f"Give it the tag `{TAG_PROTECT}: true` in its host tags to silence it."
                                if _is_host(inst) else f"Tag `{TAG_PROTECT}` = `true` to silence it for this instance."),),
    )


def metrics_unavailable(
    affected: Sequence[tuple[GpuInstance, Decision]], *, episode_start: datetime, channel: str = "",
    key: str | None = None, marked: Collection[str] = (),
) -> Notice:
    """One alert per outage episode; the instances are UNKNOWN, which is never idle.

    `key`: the idempotency key when the caller tracks episodes per instance (pipeline.alert_missing_data
    passes one per set of newly unavailable instances); default one per episode start. `marked`: the ids of those
    already marked for a stop (warned): their stop is held and, once metrics return, comes only after a new
    warning with a full lead (what the act stage does: plan's `metrics_missing_since_mark`), so the alert says
    that instead of "none of them is marked"."""
    n = len(affected)
    # The most expensive first: those are the ones whose blind spot costs most.
    ordered = sorted(affected, key=lambda p: (-(_cost(p[0], p[1]) or 0.0), p[0].instance_id))
    by_code: dict[str, int] = {}
    for _inst, d in affected:
        by_code[d.code.value] = by_code.get(d.code.value, 0) + 1
    breakdown = ", ".join(f"{words(code)}: {count}"
                          for code, count in sorted(by_code.items(), key=lambda kv: (-kv[1], kv[0])))
    noun = "instance" if n == 1 else "instances"
    held = sorted({inst.instance_id for inst, _d in affected} & set(marked))
    if held:
        names = ", ".join(_v(i, 40) for i in held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        were, stops = ("was", "its stop is") if len(held) == 1 else ("were", "their stops are")
        promise = (f"none of them is stopped or newly marked until metrics return. {names} {were} already marked "
                   f"for a stop: {stops} held, and once metrics return a stop comes only after a new warning with a "
                   f"full lead.")
    else:
        promise = "none of them is marked or stopped until metrics return."
    summary = (f"No usable GPU metrics for {n} {noun} since {_when(episode_start)}. They are judged UNKNOWN, "
               f"not idle: {promise}")

    lines = [
        f"• `{_v(_shown_id(inst.instance_id))}` {_v(inst.instance_type, 40)}"
        + (f" · {_v(inst.owner(), 60)}" if inst.owner() else "")
        + f": {_v(without_endpoints(d.reason), 200)}"
        for inst, d in ordered[:MAX_LISTED]
    ]
    more = n - len(lines)
    # Shorter lines for the plain fallback, so the same instances fit in its smaller budget.
    text_lines = [
        f"• {_v(_shown_id(inst.instance_id))} {_v(inst.instance_type, 40)}"
        + (f" · {_v(inst.owner(), 30)}" if inst.owner() else "")
        + f": {_v(without_endpoints(d.reason), 60)}"
        for inst, d in ordered[:MAX_LISTED]
    ]

    notes = ([f"…and {more} more."] if more > 0 else []) + [
        "Check dcgm-exporter on the hosts and the Prometheus scrape targets. "
        "Each instance is alerted once per outage; an outage ends once its metrics have been "
        "usable for a while, and a new outage of an instance alerted in the last 24 h is listed "
        "in the daily summary instead of a new alert."]
    return _notice(
        key or f"metrics-unavailable:{_stamp(episode_start)}", channel, _fallback_list(summary, text_lines, n),
        kind="metrics_unavailable", audience=("default",), title="GPU metrics unavailable",
        lead=(f"No usable GPU metrics for *{n}* {noun} since {_slack_date(episode_start)}. They are judged "
              f"*UNKNOWN*, not idle: {promise}"),
        facts=(("By reason", escape(breakdown)),) if breakdown else (),
        lines=tuple(lines), notes=tuple(notes))


def _fallback_list(summary: str, lines: Sequence[str], total: int) -> str:
    """Summary plus as many list lines as fit MAX_FALLBACK, always ending with the true 'and N more'."""
    reserve = len(f"\n…and {total} more.")
    out = [summary]
    size = len(summary)
    for line in lines:
        if size + 1 + len(line) > MAX_FALLBACK - reserve:
            break
        out.append(line)
        size += 1 + len(line)
    more = total - (len(out) - 1)
    if more > 0:
        out.append(f"…and {more} more.")
    return "\n".join(out)


__all__ = ["idle_warning", "stopped", "mark_cancelled", "metrics_unavailable", "idle_notice", "format_duration", "format_money", "escape", "SNOOZE_ACTIONS",
           "RESTORE_ACTION", "BUTTON_LABELS", "restore_result", "stop_key"]


def daily_summary(day: datetime, *, stopped: Sequence[tuple[str, float | None]], dry_run_stops: int,
                  warnings: int, cancelled: int, snoozed_by_people: Sequence[str],
                  pending: Sequence[tuple[str, datetime]], budget_alerts: Sequence[str], channel: str = "",
                  metrics_outages: Sequence[tuple[str, datetime]] = ()) -> Notice:
    """The platform channel's daily summary (the "default" audience, once a day): what was stopped, what is marked,
    who snoozed what, and the budget alerts sent, instead of every message of every team. `channel`: a chat channel
    instead of the default one's (notify/routing.py picks that)."""
    saved = sum(c for _, c in stopped if c)
    unpriced = sum(1 for _, c in stopped if c is None)
    lines = [
        f"*Last 24 h:* {len(stopped)} stopped" + (f" (saving {format_money(saved, per='h')} while they stay stopped"
                                                  + (f", {unpriced} unpriced" if unpriced else "") + ")" if stopped else "")
        + (f", {dry_run_stops} would have been stopped (dry-run)" if dry_run_stops else "")
        + f"; {warnings} warning(s) sent; {cancelled} stop(s) cancelled; {len(snoozed_by_people)} snoozed from Slack.",
    ]
    if pending:
        nxt = min(at for _, at in pending)
        lines.append(f"*Marked for stop now:* {len(pending)}, the next at {_slack_date(nxt)}: "
                     + ", ".join(_v(i, 40) for i, _ in sorted(pending, key=lambda p: p[1])[:10])
                     + (" …" if len(pending) > 10 else ""))
    else:
        lines.append("*Marked for stop now:* none.")
    if snoozed_by_people:
        lines.append("*Snoozed by people:* " + "; ".join(_v(x, 120) for x in snoozed_by_people[:10]))
    lines.append("*Budget alerts sent:* " + ("; ".join(_v(b, 120) for b in budget_alerts[:10]) if budget_alerts
                                              else "none."))
    if metrics_outages:
        # Outages of instances already alerted in the last 24 h (pipeline.alert_missing_data folds them here).
        per: dict[str, list[datetime]] = {}
        for iid, at in metrics_outages:
            per.setdefault(iid, []).append(at)
        lines.append("*Metrics lost again (already alerted, UNKNOWN, not idle):* " + "; ".join(
            f"{_v(i, 40)} {len(ats)}× (last since {_slack_date(max(ats))})" for i, ats in sorted(per.items())[:10])
            + (" …" if len(per) > 10 else ""))
    title = f"GPU FinOps daily summary, {day:%Y-%m-%d}"
    text = title + "\n" + "\n".join(lines)
    return _notice(f"daily:{day:%Y-%m-%d}:{channel or 'default'}", channel, text, kind="summary", audience=("default",),
                   title=title, lead="\n".join(lines))
