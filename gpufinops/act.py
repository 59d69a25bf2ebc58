"""The one chokepoint through which gpufinops changes anything in a cloud.

Two halves:
- `plan()` is pure: (instance, its primary decision, its mark, its stored state,
  now) -> Intent(kind, reason). Table-tested.
- `Actuator.apply()` carries intents out. Every cloud mutation goes through
  `Actuator._change()`, which enforces dry-run and the per-run stop cap, writes
  the intent to the database before the call and the result after it.

Stopping is two-phase: the first IDLE verdict marks the instance (tag + Slack
warning with the time it will be stopped); at that time, if it is still IDLE, it
is stopped. Activity, a snooze tag, a protect tag or a person removing the mark
tag cancels the mark. UNKNOWN never stops anything.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Callable, Sequence

from . import interact, messages
from .config import Settings
from .model import (
    TAG_MARKED,
    TAG_PROTECT,
    TAG_SNOOZE,
    TAG_STOPPED_BY,
    TAG_STOPPED_REASON,
    Action,
    ActionKind,
    ActionResult,
    Cloud,
    Decision,
    GpuInstance,
    LeaseCheck,
    Message,
    Notifier,
    ReasonCode,
    Rule,
    RunContext,
    Verdict,
)
from .store import MarkRow, StateRow, Store

log = logging.getLogger("gpufinops.act")

_ACTION_STRENGTH = {Action.NOTIFY: 0, Action.STOP: 1, Action.TERMINATE: 2}


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


DEFAULT_MAX_SNOOZE_S = 7 * 86400


def snooze_of(inst: GpuInstance, now: datetime, first_seen: datetime | None = None,
              max_snooze_s: int = DEFAULT_MAX_SNOOZE_S) -> Snooze:
    """The snooze tag, capped: no snooze lasts longer than `max_snooze_s` after gpufinops first saw it.

    An unreadable value counts as a snooze of the full cap (when in doubt, don't stop), never forever.
    """
    raw = inst.tags.get(TAG_SNOOZE)
    if raw is None:
        return Snooze(False)
    cap_until = (first_seen or now) + timedelta(seconds=max_snooze_s)
    cap_text = format_cap(max_snooze_s)
    until = parse_time(raw)
    if until is None:
        if now < cap_until:
            return Snooze(True, f"tag {TAG_SNOOZE}={raw[:64]!r} is not an ISO time; treated as snoozed until "
                                f"{cap_until:%Y-%m-%d %H:%M} UTC (at most {cap_text})", capped=True)
        return Snooze(False, f"unreadable tag {TAG_SNOOZE}={raw[:64]!r} expired after {cap_text}", capped=True)
    if until > cap_until:
        if now < cap_until:
            return Snooze(True, f"snoozed until {cap_until:%Y-%m-%d %H:%M} UTC by tag {TAG_SNOOZE} (the tag asks "
                                f"for {until:%Y-%m-%d}; snoozes are capped at {cap_text})", capped=True)
        return Snooze(False, f"snooze tag asked for {until:%Y-%m-%d}; the {cap_text} cap has passed", capped=True)
    if now < until:
        return Snooze(True, f"snoozed until {until:%Y-%m-%d %H:%M} UTC by tag {TAG_SNOOZE}")
    return Snooze(False)


def format_cap(seconds: int) -> str:
    return f"{seconds // 86400} days" if seconds % 86400 == 0 else f"{seconds / 3600:g} h"


def snoozed_until(inst: GpuInstance, now: datetime) -> tuple[bool, str]:
    """(is snoozed, reason) with the default cap, for callers that only show it."""
    s = snooze_of(inst, now)
    return s.active, s.reason


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


def primary_decision(decisions: Sequence[Decision]) -> Decision | None:
    """The decision that drives action: an IDLE one with the strongest action, else the first."""
    if not decisions:
        return None
    idle = [d for d in decisions if d.verdict == Verdict.IDLE]
    if idle:
        # max() keeps the first of equals, i.e. rule-file order breaks ties.
        return max(idle, key=lambda d: _ACTION_STRENGTH[d.action])
    return decisions[0]


def plan(
    inst: GpuInstance,
    decision: Decision | None,
    mark: MarkRow | None,
    state: StateRow | None,
    now: datetime,
    dry_run: bool,
    snooze: Snooze | None = None,
) -> Intent:
    """What to do with one instance now. Pure: no I/O, no clock."""
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

    if mark and mark.dry_run != dry_run:
        # A warning sent in the other mode does not count: a real stop needs a real warning.
        mode = "dry-run" if mark.dry_run else "live"
        return Intent(ActionKind.UNMARK, f"mark was made in {mode} mode; dry-run is now {dry_run}: marking anew",
                      decision)

    if mark and not mark.dry_run and TAG_MARKED not in inst.tags:
        return Intent(ActionKind.UNMARK, f"tag {TAG_MARKED} was removed by someone: stop cancelled", decision)

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

    blocker = stop_blocker(inst, decision.action)
    if blocker:
        # Judged, never stopped: the owner hears once per idle episode what to do instead.
        if mark:
            return Intent(ActionKind.UNMARK, blocker, decision)
        told = replace(decision, reason=f"{decision.reason}; {blocker}")
        return Intent(ActionKind.NOTIFY if new_episode else None, told.reason, told)

    if mark is None:
        # Act only on transitions: once we stopped (or, in dry-run, would have stopped)
        # an instance during this idle episode, wait until it is active and idle again.
        if (state is not None and state.stopped_at is not None and state.since <= state.stopped_at
                and state.stop_dry_run == dry_run):
            return Intent(None, f"already acted on in this idle episode ({state.stopped_at:%H:%M} UTC)", decision)
        return Intent(ActionKind.MARK, decision.reason, decision)

    if state is not None and state.since > mark.marked_at:
        # Missing data or a restart broke the idle streak after the warning: what the owner
        # was told no longer holds, so warn again rather than stop on a stale warning.
        return Intent(ActionKind.UNMARK, "not continuously idle since the warning (data missing or restarted "
                                         "in between): warning again", decision)
    if mark.warned_at is None:
        # No stop without a delivered warning; the lead counts from delivery.
        return Intent(None, "warning not delivered yet: no stop until it is, then the full lead time", decision,
                      deliver_warning=True)
    if now >= mark.stop_at:
        kind = ActionKind.TERMINATE if decision.action == Action.TERMINATE else ActionKind.STOP
        return Intent(kind, f"still idle at the announced time: {decision.reason}", decision)
    return Intent(None, f"marked; stop due at {mark.stop_at:%H:%M} UTC", decision)


def stop_cap(settings: Settings, fleet_size: int) -> int:
    """Most stops one run may make: the absolute cap and the fleet fraction, whichever is smaller."""
    by_fraction = math.ceil(settings.act.max_stops_fraction * fleet_size)
    return max(0, min(settings.act.max_stops_per_run, by_fraction))


class NotLeader(RuntimeError):
    """This process no longer holds the scheduler lease: it must change nothing."""


@dataclass(frozen=True)
class Outcome:
    """What one cloud change came to, as recorded: done, failed, or unconfirmed (fate unknown)."""

    ok: bool | None  # None: unconfirmed, to be read back next tick
    error: str | None = None
    action_id: int | None = None  # the action row, when one was written and may still be open


# A stop that failed this many times on one mark is given up for the idle episode (and said so).
MAX_STOP_ATTEMPTS = 3
# Action rows whose outcome is not settled yet: reconciled against the cloud's real state.
# "applied": the cloud change went through, its bookkeeping (tags, mark, notice) is not finished yet.
UNSETTLED = ("pending", "unconfirmed", "applied")


class Actuator:
    def __init__(self, cloud: Cloud, store: Store, notifier: Notifier, settings: Settings):
        self.cloud = cloud
        self.store = store
        self.notifier = notifier
        self.settings = settings

    # ------------------------------------------------------------------ state
    def track_states(self, decisions: Sequence[Decision], now: datetime) -> dict[tuple[str, str], StateRow]:
        """Record verdict transitions per (instance, rule); return the current rows."""
        out: dict[tuple[str, str], StateRow] = {}
        for d in decisions:
            prev = self.store.get_state(d.instance_id, d.rule_name)
            if prev is not None and prev.verdict == d.verdict:
                since, stopped_at, stop_dry_run = prev.since, prev.stopped_at, prev.stop_dry_run
            else:
                # A stop belongs to one idle episode; any transition starts clean.
                since, stopped_at, stop_dry_run = now, None, None
            self.store.put_state(d.instance_id, d.rule_name, d.verdict, since, now, stopped_at, stop_dry_run)
            out[(d.instance_id, d.rule_name)] = StateRow(d.instance_id, d.rule_name, d.verdict, since, now,
                                                         stopped_at, stop_dry_run)
        return out

    def _snooze(self, inst: GpuInstance, now: datetime) -> Snooze:
        """The instance's snooze, capped from when gpufinops first saw this tag value (kept in the store)."""
        raw = inst.tags.get(TAG_SNOOZE)
        if raw is None:
            return Snooze(False)
        key = f"snooze_seen:{inst.instance_id}"
        seen = self.store.get_kv(key)
        first_seen = None
        if seen is not None:
            value, _, at = seen.rpartition("|")
            first_seen = parse_time(at) if value == raw else None
        if first_seen is None:
            first_seen = now
            self.store.set_kv(key, f"{raw}|{now.isoformat()}")
        snooze = snooze_of(inst, now, first_seen, self.settings.act.max_snooze_s)
        if snooze.capped and snooze.active and first_seen == now:
            log.warning("%s: %s", inst.instance_id, snooze.reason)
        return snooze

    # ------------------------------------------------------------------ apply
    def apply(
        self,
        ctx: RunContext,
        instances: Sequence[GpuInstance],
        decisions: Sequence[Decision],
        rules: Sequence[Rule],
    ) -> list[ActionResult]:
        rules_by_name = {r.name: r for r in rules}
        try:
            # A stop whose outcome is not known yet is read back first; its instance waits until it is.
            self.reconcile(ctx.now, lease=ctx.lease)
        except NotLeader as exc:
            log.error("not acting: %s", exc)
            return []
        except Exception as exc:  # the cloud cannot be read: those instances wait (below), the others go on
            log.error("could not settle earlier changes yet: %s", exc)
        try:
            # Before planning: a snooze a person asked for in Slack holds on this very tick.
            instances = self.apply_snooze_requests(ctx, instances)
        except NotLeader as exc:
            log.error("not acting: %s", exc)
            return []
        unsettled = {a.instance_id for a in self.store.action_rows(status=UNSETTLED)}
        states = self.track_states(decisions, ctx.now)
        by_instance: dict[str, list[Decision]] = {}
        for d in decisions:
            by_instance.setdefault(d.instance_id, []).append(d)

        intents: list[tuple[GpuInstance, Intent, MarkRow | None]] = []
        for inst in instances:
            if inst.instance_id in unsettled:
                log.warning("%s: an earlier change is not confirmed yet; nothing else is done to it until it is",
                            inst.instance_id)
                continue
            decision = primary_decision(by_instance.get(inst.instance_id, []))
            mark = self.store.get_mark(inst.instance_id)
            state = states.get((inst.instance_id, decision.rule_name)) if decision else None
            intent = plan(inst, decision, mark, state, ctx.now, ctx.dry_run, self._snooze(inst, ctx.now))
            if intent.kind is not None or intent.deliver_warning:
                intents.append((inst, intent, mark))

        # Stops in the order they were announced, so the cap delays the newest marks.
        intents.sort(key=lambda t: (t[2].stop_at if t[2] else ctx.now, t[0].instance_id))
        self._stops_left = stop_cap(self.settings, len(instances))
        results = []
        for inst, intent, mark in intents:
            rule = rules_by_name.get(intent.decision.rule_name) if intent.decision else None
            try:
                result = self._carry_out(ctx, inst, intent, mark, rule, states)
            except NotLeader as exc:
                log.error("lease lost mid-run, nothing more is changed: %s", exc)
                break
            except Exception as exc:  # one instance's failure must not stop the others
                log.exception("action %s on %s failed", intent.kind, inst.instance_id)
                result = ActionResult(inst.instance_id, intent.kind or ActionKind.MARK, ctx.dry_run, False,
                                      intent.reason, rule.name if rule else "", ctx.now, error=str(exc))
            if result is not None:
                results.append(result)
        # Messages that failed earlier (cancellations, stop notices, alerts) go out again once their backoff is over.
        try:
            self.notifier.retry_due(ctx.now)
        except Exception:  # noqa: BLE001 - a resend must not undo what this run recorded
            log.exception("re-sending failed notifications failed; next run tries again")
        return results

    def _channel(self, rule: Rule | None, inst: GpuInstance | None = None) -> str:
        """Where an instance's messages go: its rule's channel, else its team's (slack.team_channels), else
        the default channel."""
        if rule and rule.slack_channel:
            return rule.slack_channel
        team_channel = self.settings.slack.team_channels.get(inst.team()) if inst is not None else None
        return team_channel or self.settings.slack.default_channel

    def _dm_owner(self, inst: GpuInstance, msg: Message) -> None:
        """A copy of the warning to its owner (slack.dm_owners): the owner tag as a Slack user id, or an email
        looked up. Best effort: the stop waits for the channel's delivery, never for this one."""
        owner = inst.owner().strip()
        if not self.settings.slack.dm_owners or not owner:
            return
        user_id = owner if messages.SLACK_USER_ID.fullmatch(owner) else (
            self.notifier.user_id_for_email(owner) if "@" in owner else None)
        if user_id:
            self.notifier.send(replace(msg, key=f"dm:{msg.key}", channel=user_id))

    def _carry_out(self, ctx, inst, intent: Intent, mark, rule, states) -> ActionResult | None:
        kind, decision = intent.kind, intent.decision
        rule_name = rule.name if rule else (mark.rule if mark else "")
        channel = self._channel(rule, inst)

        if intent.deliver_warning:
            return self._deliver_warning(ctx, inst, mark, decision, rule, channel)

        log.info("%s %s %s: %s%s", ctx.run_id, kind.value, inst.instance_id, intent.reason, " [dry-run]" if ctx.dry_run else "")
        if kind == ActionKind.SKIP:
            return self._record(ctx, ActionResult(inst.instance_id, kind, ctx.dry_run, True, intent.reason, rule_name, ctx.now),
                                persist=states.get((inst.instance_id, rule_name)) is not None
                                and states[(inst.instance_id, rule_name)].since >= ctx.now)

        if kind == ActionKind.NOTIFY:
            state = states[(inst.instance_id, rule_name)]
            self.notifier.send(messages.idle_notice(inst, decision, since=state.since, channel=channel))
            return self._record(ctx, ActionResult(inst.instance_id, kind, ctx.dry_run, True, intent.reason, rule_name, ctx.now))

        if kind == ActionKind.MARK:
            return self._mark(ctx, inst, intent, decision, rule, channel)

        if kind == ActionKind.UNMARK:
            return self._unmark(ctx, inst, intent, mark, rule_name, channel)

        # STOP / TERMINATE
        failures = self.store.action_rows(status="failed", kinds=[ActionKind.STOP, ActionKind.TERMINATE],
                                          start=mark.marked_at, instance_id=inst.instance_id)
        if len(failures) >= MAX_STOP_ATTEMPTS:
            return self._give_up(ctx, inst, mark, rule_name, channel, failures[-1].error or "")
        if self._stops_left <= 0:
            reason = (f"stop cap reached (at most {self.settings.act.max_stops_per_run} per run and "
                      f"{self.settings.act.max_stops_fraction:.0%} of the fleet); mark kept for the next run")
            return self._record(ctx, ActionResult(inst.instance_id, ActionKind.SKIP, ctx.dry_run, True, reason, rule_name, ctx.now))
        self._stops_left -= 1

        call = self.cloud.terminate if kind == ActionKind.TERMINATE else self.cloud.stop
        done = _terminated if kind == ActionKind.TERMINATE else _stopped
        outcome = self._change(ctx, inst, kind, rule_name, intent.reason, lambda: call(inst), verify=done,
                               keep_open=True)
        if not outcome.ok:
            return ActionResult(inst.instance_id, kind, ctx.dry_run, False, intent.reason, rule_name, ctx.now,
                                error=outcome.error)
        self._after_stop(ctx, inst, kind, rule_name, decision, ctx.now, ctx.dry_run, channel)
        if outcome.action_id is not None:
            self.store.finish_action(outcome.action_id, True, ctx.now, status="done")
        return ActionResult(inst.instance_id, kind, ctx.dry_run, True,
                            ("dry-run: would " + kind.value + ": " if ctx.dry_run else "") + intent.reason,
                            rule_name, ctx.now)

    # ------------------------------------------------------------------ the phases
    def _mark(self, ctx, inst, intent, decision, rule, channel) -> ActionResult:
        rule_name = rule.name
        stop_at = ctx.now + timedelta(seconds=rule.warning_lead_s)
        value = _stamp(stop_at)
        outcome = self._change(ctx, inst, ActionKind.MARK, rule_name, intent.reason,
                               lambda: self.cloud.set_tags(inst, {TAG_MARKED: value}),
                               verify=lambda i: i is not None and i.tags.get(TAG_MARKED) == value)
        if not outcome.ok:
            # No mark without its tag: the next tick tries again if the instance is still idle.
            return ActionResult(inst.instance_id, ActionKind.MARK, ctx.dry_run, False, intent.reason, rule_name,
                                ctx.now, error=outcome.error)
        mark = MarkRow(inst.instance_id, rule_name, ctx.now, stop_at, decision.reason, ctx.dry_run)
        self.store.put_mark(mark)
        result = self._deliver_warning(ctx, inst, mark, decision, rule, channel)
        return replace(result, kind=ActionKind.MARK, reason=f"{intent.reason}; {result.reason}")

    def _deliver_warning(self, ctx, inst, mark: MarkRow, decision, rule, channel) -> ActionResult:
        """Send (or send again) the mark's warning; once delivered, the stop is due a full lead after delivery."""
        lead = timedelta(seconds=rule.warning_lead_s if rule else (mark.stop_at - mark.marked_at).total_seconds())
        msg = messages.idle_warning(inst, decision, marked_at=mark.marked_at, stop_at=ctx.now + lead,
                                    channel=channel, dry_run=ctx.dry_run, action=decision.action, sent_at=ctx.now,
                                    buttons=bool(self.settings.slack.signing_secret.resolve()),
                                    idle_since=idle_since(self.store.get_state(inst.instance_id, mark.rule), decision))
        rule_name = mark.rule
        if not self.notifier.send(msg):
            log.warning("%s: warning not delivered; no stop until it is", inst.instance_id)
            return ActionResult(inst.instance_id, ActionKind.SKIP, ctx.dry_run, False,
                                "warning not delivered: no stop until it is (retried with backoff)", rule_name,
                                ctx.now, error="warning not delivered")
        delivered = self.store.delivered_at(msg.key) or ctx.now
        self._dm_owner(inst, msg)
        stop_at = max(mark.stop_at, delivered + lead)
        self.store.put_mark(replace(mark, warned_at=delivered, stop_at=stop_at))
        if not ctx.dry_run and stop_at - mark.stop_at >= timedelta(minutes=1):
            # Delivered late: the tag people read says the real time (bookkeeping, not an action of its own).
            self._change(ctx, inst, ActionKind.MARK, rule_name, "announced stop time moved: warning delivered late",
                         lambda: self.cloud.set_tags(inst, {TAG_MARKED: _stamp(stop_at)}), record=False)
        return ActionResult(inst.instance_id, ActionKind.MARK, ctx.dry_run, True,
                            f"warning delivered; stop announced for {stop_at:%Y-%m-%d %H:%M} UTC", rule_name, ctx.now)

    def _unmark(self, ctx, inst, intent, mark: MarkRow, rule_name, channel) -> ActionResult:
        if not mark.dry_run and TAG_MARKED in inst.tags:
            outcome = self._change(ctx, inst, ActionKind.UNMARK, rule_name, intent.reason,
                                   lambda: self.cloud.remove_tags(inst, [TAG_MARKED]),
                                   verify=lambda i: i is None or TAG_MARKED not in i.tags)
            if not outcome.ok:
                return ActionResult(inst.instance_id, ActionKind.UNMARK, ctx.dry_run, False, intent.reason,
                                    rule_name, ctx.now, error=outcome.error)
        else:
            self.store.record_action(ctx.run_id, ActionResult(inst.instance_id, ActionKind.UNMARK, ctx.dry_run, True,
                                                              intent.reason, rule_name, ctx.now))
        self.store.clear_mark(inst.instance_id)
        warning_key = messages.warning_key(inst.instance_id, mark.marked_at)
        if mark.warned_at is None:
            # Nobody was told of this stop, so nobody is told it is off; the warning is not sent any more.
            self.store.abandon_notification(warning_key, ctx.now, f"mark cancelled before delivery: {intent.reason}")
        else:
            self.notifier.send(replace(messages.mark_cancelled(inst, reason=intent.reason, marked_at=mark.marked_at,
                                                               channel=channel), thread_key=warning_key))
        return ActionResult(inst.instance_id, ActionKind.UNMARK, ctx.dry_run, True, intent.reason, rule_name, ctx.now)

    def _give_up(self, ctx, inst, mark: MarkRow, rule_name, channel, last_error: str) -> ActionResult:
        reason = (f"stop failed {MAX_STOP_ATTEMPTS} times since the warning (last: {last_error[:200]}); "
                  f"given up for this idle episode")
        log.error("%s: %s", inst.instance_id, reason)
        result = self._unmark(ctx, inst, Intent(ActionKind.UNMARK, reason), mark, rule_name, channel)
        state = self.store.get_state(inst.instance_id, rule_name)
        if state is not None:  # acted on: not marked again before the instance is active and idle again
            self.store.put_state(inst.instance_id, rule_name, state.verdict, state.since, ctx.now, ctx.now, ctx.dry_run)
        return replace(result, ok=False, error=reason)

    def _after_stop(self, ctx, inst, kind, rule_name, decision, at, dry_run, channel) -> None:
        """After a stop went through (now or found by reconcile): bookkeeping tags, mark, state, the notice."""
        self._change(ctx, inst, kind, rule_name, "stopped-by tags",
                     lambda: self._tag_stopped(inst, rule_name, decision.reason), record=False)
        mark = self.store.get_mark(inst.instance_id)
        self.store.clear_mark(inst.instance_id)
        state = self.store.get_state(inst.instance_id, rule_name)
        if state is not None:
            self.store.put_state(inst.instance_id, rule_name, state.verdict, state.since, ctx.now, at, dry_run)
        notice = messages.stopped(inst, decision, at=at, channel=channel, dry_run=dry_run, action=decision.action,
                                  idle_since=idle_since(state, decision))
        # Under its warning, so the owner reads warning and outcome in one place.
        self.notifier.send(replace(notice, thread_key=messages.warning_key(inst.instance_id, mark.marked_at))
                           if mark is not None else notice)

    def _tag_stopped(self, inst, rule_name: str, reason: str) -> None:
        """Bookkeeping after a stop; each call on its own, so one failing does not leave the other undone."""
        try:
            self.cloud.remove_tags(inst, [TAG_MARKED])
        except Exception as exc:  # noqa: BLE001 - the stop happened; the tag is bookkeeping
            log.warning("stopped %s but could not remove its %s tag: %s", inst.instance_id, TAG_MARKED, exc)
        try:
            self.cloud.set_tags(inst, {TAG_STOPPED_BY: self.settings.act.actor,
                                       TAG_STOPPED_REASON: f"{rule_name}: {reason}"[:255]})
        except Exception as exc:  # noqa: BLE001
            log.warning("stopped %s but could not tag it %s: %s", inst.instance_id, TAG_STOPPED_BY, exc)

    def _record(self, ctx, result: ActionResult, persist: bool = True) -> ActionResult:
        if persist:
            self.store.record_action(ctx.run_id, result)
        return result

    # ------------------------------------------------------------------ people's snoozes (Slack buttons)
    def apply_snooze_requests(self, ctx: RunContext, instances: Sequence[GpuInstance]) -> list[GpuInstance]:
        """Set the snooze tag people asked for with a button (gpufinops.interact), through the chokepoint; the
        instances come back with the tag as the cloud now has it, so the plan below sees the snooze.

        Live: one tag call per request; a tag already equal to the request (a retry after a lost answer) is
        not set again. Not confirmed: the request stays and its action row is reconciled; until then nothing
        else is done to the instance. Dry-run: no tag is set; the request is audited and shown once and holds
        in memory until it ends, as the tag would."""
        requests = interact.pending_requests(self.store)
        if not requests:
            return list(instances)
        by_id = {i.instance_id: i for i in instances}
        for req in requests:
            inst = by_id.get(req.instance_id)
            until = parse_time(req.until)
            if inst is None or until is None or until <= ctx.now:
                interact.forget_request(self.store, req.instance_id)  # gone, or the snooze has ended
                continue
            reason = f"snoozed until {req.until} by {req.user_name} ({req.user_id}) with a Slack button"
            if ctx.dry_run:
                if not req.recorded:
                    self._change(ctx, inst, ActionKind.SNOOZE, "", reason, lambda: None)
                    self._update_warning(req, until, dry_run=True)
                    interact.keep_request(self.store, replace(req, recorded=True))
            elif inst.tags.get(TAG_SNOOZE) != req.until:
                outcome = self._change(ctx, inst, ActionKind.SNOOZE, "", reason,
                                       lambda inst=inst, req=req: self.cloud.set_tags(inst, {TAG_SNOOZE: req.until}),
                                       verify=lambda found, req=req: found is not None
                                       and found.tags.get(TAG_SNOOZE) == req.until)
                if not outcome.ok:
                    continue  # failed: asked again next tick; unconfirmed: its row is settled first
                self._update_warning(req, until, dry_run=False)
                interact.forget_request(self.store, req.instance_id)
            else:
                interact.forget_request(self.store, req.instance_id)
            by_id[req.instance_id] = replace(inst, tags={**inst.tags, TAG_SNOOZE: req.until})
        return [by_id[i.instance_id] for i in instances]

    def _update_warning(self, req: "interact.SnoozeRequest", until: datetime, dry_run: bool) -> None:
        """The warning the button was on, updated in place: who snoozed it until when (cosmetic: never raises)."""
        if not (req.channel_id and req.message_ts):
            return
        text, blocks = messages.snoozed_in_place(req.blocks, user=req.user_id or req.user_name, until=until,
                                                 dry_run=dry_run)
        try:
            self.notifier.update(req.channel_id, req.message_ts, text, blocks)
        except Exception as exc:  # noqa: BLE001 - the snooze is set; the message edit is not worth a failure
            log.warning("could not update the Slack message of %s: %s", req.instance_id, exc)

    # ------------------------------------------------------------------ THE chokepoint
    def _change(self, ctx: RunContext, inst: GpuInstance, kind: ActionKind, rule: str, reason: str,
                call: Callable[[], None], *, verify: Callable[[GpuInstance | None], bool] | None = None,
                record: bool = True, keep_open: bool = False) -> Outcome:
        """The only place a cloud mutation is made. Dry-run makes none; a process that lost the scheduler
        lease makes none; the intent is written before the one call and its outcome after it.

        After any error the instance's real state is read back (`verify`) before the outcome is
        recorded, so the record equals the cloud: done; failed only when the error says EC2 did not do
        it and the instance agrees; else "unconfirmed" (a request may still be in flight, or the read
        failed): reconciled next tick, and until then nothing else is done to the instance.
        `keep_open`: a change that went through is recorded "applied" until the caller's bookkeeping
        is done (`Store.finish_action`), so a crash in between is finished by reconcile.
        """
        if ctx.dry_run:
            if record:
                self.store.record_action(ctx.run_id, ActionResult(inst.instance_id, kind, True, True,
                                                                  f"dry-run: would {kind.value}: {reason}", rule, ctx.now))
            return Outcome(True)
        check_lease(ctx.lease)
        action_id = self.store.begin_action(ctx.run_id, inst.instance_id, kind, rule, False, reason, ctx.now) \
            if record else None
        went_through = "applied" if keep_open else "done"
        try:
            call()
        except Exception as exc:
            error = str(exc)[:500]
            log.error("%s %s failed: %s", kind.value, inst.instance_id, error)
            seen = self._read_back(inst, verify) if verify else False
            if action_id is None:
                return Outcome(bool(seen), error)
            if seen is True:
                self.store.finish_action(action_id, True, ctx.now, status=went_through,
                                         error=f"confirmed by read-back after: {error}")
                return Outcome(True, action_id=action_id)
            if seen is False and getattr(exc, "definite", False):
                self.store.finish_action(action_id, False, ctx.now, error=error)
                return Outcome(False, error)
            why = "read-back failed" if seen is None else "not done yet by the read-back, request may be in flight"
            self.store.finish_action(action_id, False, ctx.now, status="unconfirmed",
                                     error=f"outcome unknown ({why}): {error}")
            return Outcome(None, error)
        if action_id is not None:
            self.store.finish_action(action_id, True, ctx.now, status=went_through)
        return Outcome(True, action_id=action_id)

    def _read_back(self, inst: GpuInstance, verify: Callable[[GpuInstance | None], bool]) -> bool | None:
        """Did the change happen? True/False from the instance's real state; None when it cannot be read."""
        try:
            found = self.cloud.describe([inst.instance_id])
        except Exception as exc:  # noqa: BLE001 - unknown stays unknown
            log.error("read-back of %s failed: %s", inst.instance_id, exc)
            return None
        return verify(found[0] if found else None)

    # ------------------------------------------------------------------ restart safety
    def reconcile(self, now: datetime, lease: LeaseCheck | None = None) -> list[str]:
        """Settle every change whose outcome is not recorded yet (a crash, a lost answer), from the
        instance's real state: stopping/stopped/terminated means the stop went through (done, never
        repeated, and its bookkeeping and notice follow now); anything else means it did not.
        Raises when the cloud cannot be read: nothing may be acted on before this succeeds."""
        notes: list[str] = []
        pending = self.store.action_rows(status=UNSETTLED)
        if not pending:
            return notes
        found = {i.instance_id: i for i in self.cloud.describe(sorted({p.instance_id for p in pending}))}
        ctx = RunContext(now=now, dry_run=False, lease=lease)
        for p in pending:
            inst = found.get(p.instance_id)
            if p.kind in (ActionKind.STOP, ActionKind.TERMINATE):
                done = (_terminated if p.kind == ActionKind.TERMINATE else _stopped)(inst)
                if done:
                    # Bookkeeping first, the record last: a crash in between is reconciled again.
                    if inst is not None:
                        decision = Decision(p.instance_id, p.rule, Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW,
                                            _reason_of(p.reason), p.at,
                                            action=Action.TERMINATE if p.kind == ActionKind.TERMINATE else Action.STOP,
                                            hourly_cost=inst.hourly_cost)
                        self._after_stop(ctx, inst, p.kind, p.rule, decision, p.at, False, self._channel(None, inst))
                    else:
                        self.store.clear_mark(p.instance_id)
                    self.store.finish_action(p.id, True, now, status="done",
                                             error="reconciled: instance found " + (inst.state if inst else "gone"))
                else:
                    self.store.finish_action(p.id, False, now, status="failed",
                                             error=f"reconciled: instance still {inst.state if inst else 'unknown'}; "
                                                   f"stop not done")
            elif p.kind == ActionKind.SNOOZE:
                tagged = inst is not None and bool(inst.tags.get(TAG_SNOOZE))
                self.store.finish_action(p.id, tagged, now, status="done" if tagged else "failed",
                                         error="reconciled: snooze tag " + ("present" if tagged else "absent"))
            elif p.kind == ActionKind.MARK:
                tagged = inst is not None and TAG_MARKED in inst.tags
                self.store.finish_action(p.id, tagged, now, status="done" if tagged else "failed",
                                         error="reconciled: mark tag " + ("present" if tagged else "absent"))
            else:
                untagged = inst is None or TAG_MARKED not in inst.tags
                self.store.finish_action(p.id, untagged, now, status="done" if untagged else "failed",
                                         error="reconciled: mark tag " + ("removed" if untagged else "still there"))
            notes.append(f"reconciled {p.kind.value} on {p.instance_id}")
            log.warning("reconciled unsettled %s on %s", p.kind.value, p.instance_id)
        return notes


def idle_since(state: StateRow | None, decision: Decision | None) -> datetime | None:
    """When the instance really went idle: its IDLE verdict's first tick minus the rule's window (the window
    before that tick was idle already). None when not known (no state, not IDLE): messages then say "≥ window"."""
    if state is None or decision is None or state.verdict != Verdict.IDLE or not decision.window_s:
        return None
    return state.since - timedelta(seconds=decision.window_s)


def check_lease(lease: LeaseCheck | None) -> None:
    """Raise NotLeader unless this process still holds the scheduler lease (None: no lease in use)."""
    if lease is None:
        return
    try:
        lease.check()
    except Exception as exc:  # LeaseLost, or the database cannot say: either way, change nothing
        raise NotLeader(str(exc) or type(exc).__name__) from exc


def _stopped(inst: GpuInstance | None) -> bool:
    return inst is None or inst.state in STOPPED_STATES or inst.state in TERMINATED_STATES


def _terminated(inst: GpuInstance | None) -> bool:
    return inst is None or inst.state in TERMINATED_STATES


def _stamp(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reason_of(action_reason: str) -> str:
    """The verdict's reason inside a stop intent's text ("still idle at the announced time: ...")."""
    head = "still idle at the announced time: "
    return action_reason[len(head):] if action_reason.startswith(head) else action_reason
