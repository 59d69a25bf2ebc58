"""The pure half of the act stage: (instance, its primary decision, its mark, its stored state, now) ->
Intent(kind, reason). No I/O; table-tested. `Actuator.apply()` (act/actuator.py) carries the intents out.

A power_off rule over an Azure VM already "Stopped (allocated)" (gpufinops powered it off on that rule, or a person
did) has nothing left to do: the VM is judged IDLE and billed (decide.evaluate: the report says so), but neither
warned nor powered off again, a mark of it withdrawn (ALREADY_POWERED_OFF); a deallocate (stop) rule over the same
VM still deallocates it after its own warning (primary_decision ranks the spent power-off last).

Also the snooze rules (`snooze_of`: capped at act.max_snooze_s from when the value was first seen, an unreadable
value snoozes for the cap), the opt-in gap, what blocks a stop (`stop_blocker`) and the per-run cap (`stop_cap`).
`snooze_value` is the one snooze parser and cap: the service reads it from a tag, a workload annotation or a chat
click, the host agent (agent/autostop/snooze.py) from its snooze file. Imports model, words (no imports of its own)
and places.registry (pure: what each place takes) only at run time, so the agent's command line stays light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Sequence

# No I/O, no third-party import: the agent's import stays light.
from ..k8s.model import NODE_CORDONED_BY_OTHERS
from ..model import (STATE_STOPPED_ALLOCATED, TAG_MARKED, TAG_PROTECT, TAG_SNOOZE, Action, ActionKind, Decision,
                     GpuInstance, ReasonCode, Verdict, format_duration)
from ..places.registry import KUBERNETES_NODE, TAG_MARK_GONE_WHY, place_of, place_of_instance, refusal, strength
from ..words import POWER_OFF_BILLING

if TYPE_CHECKING:
    from ..config import Settings
    from ..store.schema import MarkRow, StateRow


@dataclass(frozen=True)
class Intent:
    kind: ActionKind | None  # None: nothing to do this tick
    reason: str
    decision: Decision | None = None
    # The mark's warning has not been delivered yet: try again this tick (the notifier keeps the backoff).
    deliver_warning: bool = False


def parse_time(value: str) -> datetime | None:
    try:
        dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError, OverflowError):
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Snooze:
    """Whether a snooze tag holds the instance now, and why (in words)."""

    active: bool
    reason: str = ""
    capped: bool = False  # the tag asked for longer than the cap, or could not be read
    until: datetime | None = None  # while active: when it ends (the cap's end when capped)


DEFAULT_MAX_SNOOZE_S = 7 * 86400


def snooze_of(inst: GpuInstance, now: datetime, first_seen: datetime | None = None,
              max_snooze_s: int = DEFAULT_MAX_SNOOZE_S) -> Snooze:
    """The snooze tag, capped: no snooze lasts longer than `max_snooze_s` after gpufinops first saw it.

    An unreadable value counts as a snooze of the full cap (when in doubt, don't stop), never forever.
    """
    return snooze_value(inst.tags.get(TAG_SNOOZE), now, first_seen, max_snooze_s)


def snooze_value(raw: str | None, now: datetime, first_seen: datetime | None = None,
                 max_snooze_s: int = DEFAULT_MAX_SNOOZE_S, source: str = f"tag {TAG_SNOOZE}") -> Snooze:
    """The one snooze parser and cap: what a snooze value (`raw`, None: none) means at `now`, capped at
    `max_snooze_s` after `first_seen` (when the value was first seen, or the snooze file written). `source` names
    where it was read, in the reason ("tag gpufinops:snooze-until", "snooze file /run/...")."""
    if raw is None:
        return Snooze(False)
    cap_until = (first_seen or now) + timedelta(seconds=max_snooze_s)
    cap_text = format_cap(max_snooze_s)
    until = parse_time(raw)
    if until is None:
        if now < cap_until:
            return Snooze(True, f"{source}={raw[:64]!r} is not an ISO time; treated as snoozed until "
                                f"{cap_until:%Y-%m-%d %H:%M} UTC (at most {cap_text})", capped=True, until=cap_until)
        return Snooze(False, f"unreadable {source}={raw[:64]!r} expired after {cap_text}", capped=True)
    if until > cap_until:
        if now < cap_until:
            return Snooze(True, f"snoozed until {cap_until:%Y-%m-%d %H:%M} UTC by {source} (it asks "
                                f"for {until:%Y-%m-%d}; snoozes are capped at {cap_text})", capped=True,
                          until=cap_until)
        return Snooze(False, f"{source} asked for {until:%Y-%m-%d}; the {cap_text} cap has passed", capped=True)
    if now < until:
        return Snooze(True, f"snoozed until {until:%Y-%m-%d %H:%M} UTC by {source}", until=until)
    return Snooze(False)


format_cap = format_duration  # a snooze cap in words: the one duration formatter ("7 d", "2 h")


def snoozed_until(inst: GpuInstance, now: datetime) -> tuple[bool, str]:
    """(is snoozed, reason) with the default cap, for callers that only show it."""
    s = snooze_of(inst, now)
    return s.active, s.reason


def opt_in_gap(inst: GpuInstance, tag: str, value: str) -> str:
    """Why this instance may not be stopped for want of the operator's opt-in; "" when it carries it.

    The same test the shipped IAM policy makes (`aws:ResourceTag/<tag>` equals `<value>`), so nothing is ever
    announced as "will be stopped" that AWS would refuse to stop; Azure VMs the same (no Azure role can test a tag
    on a deallocate: the code's test is the fence). EC2 instances, GCE VMs (their label, the same key and value:
    places/gcp/labels.py) and Azure VMs only (the places whose entry says opt_in_by_tag): a Kubernetes workload's
    opt-in is `kubernetes.scale_to_zero` and the RBAC that lets it patch replicas."""
    place = place_of_instance(inst)
    if not (place.opt_in_by_tag and inst.provider == place.provider) or inst.tags.get(tag) == value:
        return ""
    # Worded so that, skimmed, it never reads as a stop warning: nothing here "would be stopped".
    return f"not opted in: gpufinops stops only instances tagged {tag}={value}"


# A stop found due this long after its announced time (the service was down, or its clock leapt forward) is
# not carried out on the old warning: the owner was told a time that has long passed, so they are warned again
# with a full lead. At least the rule's lead itself.
LATE_STOP_LIMIT_S = 600


# Why a mark on a GPU node someone else cordoned is withdrawn (and the words of its "cordon cancelled" notice).
NODE_CORDONED_ELSEWHERE = ("the node was cordoned by someone else (spec.unschedulable set, not by gpufinops): "
                           "their cordon stands and gpufinops changes nothing more on it")


# Instance states that mean a stop (or terminate) went through.
STOPPED_STATES = ("stopping", "stopped")


TERMINATED_STATES = ("shutting-down", "terminated")


def stop_blocker(inst: GpuInstance, action: Action) -> str:
    """Why this instance must not be stopped (or terminated) by gpufinops; "" when it may be.

    Something else manages it (stopping an Auto Scaling group member makes the group replace it, a
    Kubernetes node takes its pods with it), or it is a spot instance that EC2 cannot stop.
    """
    if inst.managed_by:
        advice = f"; instead: {inst.managed_advice}" if inst.managed_advice else ""
        return f"managed by {inst.managed_by}: never stopped by gpufinops{advice}"
    refused = refusal(inst, action)  # the subject's place does not take this action (places.registry)
    if refused:
        return refused
    if inst.lifecycle == "spot" and action == Action.STOP and not place_of_instance(inst).stops_any_spot:
        if inst.spot_request_type == "persistent":
            return ""
        kind = f"a {inst.spot_request_type} spot instance" if inst.spot_request_type else \
            "a spot instance whose request type is unknown"
        return (f"{kind} cannot be stopped (EC2 only terminates it): notify only; a rule with "
                f"action: terminate and confirm_terminate: true would terminate it")
    return ""


def power_off_spent(decision: Decision) -> bool:
    """A power_off rule's IDLE verdict on a VM that is powered off already ("Stopped (allocated)": the verdict's
    code says it): nothing left for that rule to do. Pure: read from the decision alone."""
    return decision.action is Action.POWER_OFF and decision.code is ReasonCode.BILLED_WHILE_STOPPED


# Why a power_off rule does nothing more to a VM powered off already (its intent's reason: the log, `evaluate`, a
# withdrawn mark's notice).
ALREADY_POWERED_OFF = ("already powered off (\"Stopped (allocated)\"): nothing more for a power_off rule to do; "
                       + POWER_OFF_BILLING)


def primary_decision(decisions: Sequence[Decision]) -> Decision | None:
    """The decision that drives action: an IDLE one with the strongest action, else the first.

    Missing data under any rule holds every stop of the instance (a rule whose window is longer than the
    instance's age does not: that is no outage): when one rule has no usable data the
    "No usable GPU metrics" alert promises that nothing of it is stopped or newly marked (and that a mark it
    already has leads to a stop only after a new warning: plan's `metrics_missing_since_mark`), and another rule's
    IDLE (a longer window, other coverage) must not break that promise."""
    if not decisions:
        return None
    idle = [d for d in decisions if d.verdict == Verdict.IDLE]
    unknown = [d for d in decisions if d.verdict == Verdict.UNKNOWN and d.code.is_missing_data]
    if idle and unknown and any(d.action != Action.NOTIFY for d in idle):
        return unknown[0]
    if idle:
        # max() keeps the first of equals, i.e. rule-file order breaks ties. A spent power-off (the VM is powered
        # off already) ranks under any other IDLE rule: a notify rule still tells, a stop rule still deallocates.
        return max(idle, key=lambda d: (not power_off_spent(d), strength(d.action)))
    return decisions[0]


def plan(
    inst: GpuInstance,
    decision: Decision | None,
    mark: MarkRow | None,
    state: StateRow | None,
    now: datetime,
    dry_run: bool,
    snooze: Snooze | None = None,
    opt_in_missing: str = "",
    metrics_missing_since_mark: bool = False,
) -> Intent:
    """What to do with one instance now. Pure: no I/O, no clock.

    `opt_in_missing`: why the instance may not be stopped for want of the opt-in tag (`opt_in_gap`), "" when
    it is opted in. `metrics_missing_since_mark`: some rule of the instance had no usable metrics since it was
    marked (the "No usable GPU metrics" alert named it): its stop is held, and once metrics return it is warned
    again with a full lead, as that alert says, even when the marking rule's own verdict never broke."""
    if place_of(inst.instance_id) is KUBERNETES_NODE and inst.state == NODE_CORDONED_BY_OTHERS:
        # Someone else cordoned the node: theirs to undo, never gpufinops' to act on. A mark of ours on it is
        # withdrawn and its warning told so (as when a person removes the mark), never left to outlive its time.
        if mark:
            return Intent(ActionKind.UNMARK, NODE_CORDONED_ELSEWHERE, decision)
        return Intent(None, NODE_CORDONED_ELSEWHERE, decision)
    if inst.is_protected:
        if mark:
            return Intent(ActionKind.UNMARK, f"protected by tag {TAG_PROTECT}={inst.tags[TAG_PROTECT]!r}", decision)
        if decision and decision.verdict == Verdict.IDLE and decision.action != Action.NOTIFY:
            return Intent(ActionKind.SKIP, f"idle but protected by tag {TAG_PROTECT}={inst.tags[TAG_PROTECT]!r}", decision)
        return Intent(None, "protected", decision)

    snooze = snooze if snooze is not None else snooze_of(inst, now)
    if snooze.active:
        if mark:
            return Intent(ActionKind.UNMARK, snooze.reason, decision)
        if decision and decision.verdict == Verdict.IDLE and decision.action != Action.NOTIFY:
            return Intent(ActionKind.SKIP, f"idle but {snooze.reason}", decision)
        return Intent(None, snooze.reason, decision)

    if mark and not mark.dry_run and dry_run:
        # Switched to dry-run with a real mark: withdrawn (its tag removed, "stop cancelled"); dry-run marks anew.
        return Intent(ActionKind.UNMARK, "mark was made in live mode; dry-run is now on: withdrawn", decision)

    if mark and inst.tags_unread:
        return Intent(None, f"mark kept, its tags not read this tick: {inst.tags_unread}", decision)

    if mark and not mark.dry_run and TAG_MARKED not in inst.tags:
        # A place that knows why the mark is not on the subject any more says so (a Slurm job requeued and started
        # again: the mark was on its earlier run).
        why = inst.tags.get(TAG_MARK_GONE_WHY) or f"tag {TAG_MARKED} was removed by someone"
        return Intent(ActionKind.UNMARK, f"{why}: stop cancelled", decision)

    if decision is None:
        if mark:
            return Intent(ActionKind.UNMARK, "no rule applies to this instance any more", None)
        return Intent(None, "no rule applies")

    if decision.verdict == Verdict.UNKNOWN:
        if mark:
            return Intent(None, f"mark kept, not stopping on unknown data: {decision.reason}", decision)
        return Intent(None, decision.reason, decision)

    if decision.verdict != Verdict.IDLE:
        if mark:
            return Intent(ActionKind.UNMARK, f"no longer idle ({decision.verdict.value}: {decision.reason})", decision)
        return Intent(None, decision.reason, decision)

    # IDLE from here on.
    new_episode = state is None or state.since >= now
    if decision.action == Action.NOTIFY:
        return Intent(ActionKind.NOTIFY if new_episode else None, decision.reason, decision)

    if power_off_spent(decision) and inst.state == STATE_STOPPED_ALLOCATED:
        # Powered off already (by this rule, or by a person): warning it again, then powering it off, would be a
        # loop of notices about a change that changes nothing. Its mark, if any, is withdrawn (its warning told so).
        if mark:
            return Intent(ActionKind.UNMARK, ALREADY_POWERED_OFF, decision)
        return Intent(None, ALREADY_POWERED_OFF, decision)

    blocker = stop_blocker(inst, decision.action) or opt_in_missing
    if blocker:
        # Judged, never stopped: the owner hears once per idle episode what to do instead.
        if mark:
            return Intent(ActionKind.UNMARK, blocker, decision)
        # The intent's reason (logs, `evaluate`, the record) names the blocker; the decision stays as judged, so
        # the notice says the blocker once, in its own sentence (notify.messages.idle_notice).
        return Intent(ActionKind.NOTIFY if new_episode else None, f"{decision.reason}; {blocker}", decision)

    if mark is None:
        # Act only on transitions: once we stopped (or, in dry-run, would have stopped)
        # an instance during this idle episode, wait until it is active and idle again.
        if (state is not None and state.stopped_at is not None and state.since <= state.stopped_at
                and state.stop_dry_run == dry_run):
            return Intent(None, f"already acted on in this idle episode ({state.stopped_at:%H:%M} UTC)", decision)
        return Intent(ActionKind.MARK, decision.reason, decision)

    if mark.dry_run and not dry_run:
        # Dry-run was switched off with a dry-run mark on a still idle, stoppable instance: a warning that said "it
        # will NOT be stopped" does not count, so the mark is carried over as a real one (the tag written, ONE real
        # warning with a fresh full lead), never "stop cancelled" followed by a new warning.
        return Intent(ActionKind.MARK, f"dry-run was switched off: the dry-run warning becomes a real one with a "
                                       f"fresh full lead: {decision.reason}", decision)
    if (state is not None and state.since > mark.marked_at) or metrics_missing_since_mark:
        # Missing data or a restart broke the idle streak after the warning: what the owner
        # was told no longer holds, so warn again rather than stop on a stale warning.
        return Intent(ActionKind.UNMARK, "not continuously idle since the warning (data missing or restarted "
                                         "in between): warning again", decision)
    if mark.warned_at is None:
        # No stop without a delivered warning; the lead counts from delivery.
        return Intent(None, "warning not delivered yet: no stop until it is, then the full lead time", decision,
                      deliver_warning=True)
    late_s = (now - mark.stop_at).total_seconds()
    if late_s > max(LATE_STOP_LIMIT_S, (mark.stop_at - mark.warned_at).total_seconds()):
        return Intent(ActionKind.UNMARK, f"the announced stop time ({mark.stop_at:%Y-%m-%d %H:%M} UTC) passed "
                                         f"{late_s / 60:.0f} min ago while gpufinops was not running or its clock "
                                         f"leapt forward: warning again with a full lead", decision)
    if now >= mark.stop_at:
        kind = {Action.TERMINATE: ActionKind.TERMINATE, Action.POWER_OFF: ActionKind.POWER_OFF}.get(
            decision.action, ActionKind.STOP)
        return Intent(kind, f"still idle at the announced time: {decision.reason}", decision)
    return Intent(None, f"marked; stop due at {mark.stop_at:%H:%M} UTC", decision)


def stop_cap(settings: Settings, fleet_size: int) -> int:
    """Most stops one run may make: the absolute cap and the fleet fraction, whichever is smaller."""
    by_fraction = math.ceil(settings.act.max_stops_fraction * fleet_size)
    return max(0, min(settings.act.max_stops_per_run, by_fraction))
