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
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable, Sequence

from . import messages
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
    Notifier,
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


def parse_time(value: str) -> datetime | None:
    try:
        dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def snoozed_until(inst: GpuInstance, now: datetime) -> tuple[bool, str]:
    """(is snoozed, reason). An unreadable snooze value counts as snoozed: when in doubt, don't stop."""
    raw = inst.tags.get(TAG_SNOOZE)
    if raw is None:
        return False, ""
    until = parse_time(raw)
    if until is None:
        return True, f"tag {TAG_SNOOZE}={raw!r} is not an ISO time; treated as snoozed"
    if now < until:
        return True, f"snoozed until {until:%Y-%m-%d %H:%M} UTC by tag {TAG_SNOOZE}"
    return False, ""


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
) -> Intent:
    """What to do with one instance now. Pure: no I/O, no clock."""
    if inst.is_protected:
        if mark:
            return Intent(ActionKind.UNMARK, f"protected by tag {TAG_PROTECT}={inst.tags[TAG_PROTECT]!r}", decision)
        if decision and decision.verdict == Verdict.IDLE and decision.action != Action.NOTIFY:
            return Intent(ActionKind.SKIP, f"idle but protected by tag {TAG_PROTECT}={inst.tags[TAG_PROTECT]!r}", decision)
        return Intent(None, "protected", decision)

    snoozed, why = snoozed_until(inst, now)
    if snoozed:
        if mark:
            return Intent(ActionKind.UNMARK, why, decision)
        if decision and decision.verdict == Verdict.IDLE and decision.action != Action.NOTIFY:
            return Intent(ActionKind.SKIP, f"idle but {why}", decision)
        return Intent(None, why, decision)

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
    if decision.action == Action.NOTIFY:
        new_episode = state is None or state.since >= now
        return Intent(ActionKind.NOTIFY if new_episode else None, decision.reason, decision)

    if mark is None:
        # Act only on transitions: once we stopped (or, in dry-run, would have stopped)
        # an instance during this idle episode, wait until it is active and idle again.
        if (state is not None and state.stopped_at is not None and state.since <= state.stopped_at
                and state.stop_dry_run == dry_run):
            return Intent(None, f"already stopped in this idle episode ({state.stopped_at:%H:%M} UTC)", decision)
        return Intent(ActionKind.MARK, decision.reason, decision)

    if state is not None and state.since > mark.marked_at:
        # Missing data or a restart broke the idle streak after the warning: what the owner
        # was told no longer holds, so warn again rather than stop on a stale warning.
        return Intent(ActionKind.UNMARK, "not continuously idle since the warning (data missing or restarted "
                                         "in between): warning again", decision)
    if now >= mark.stop_at:
        kind = ActionKind.TERMINATE if decision.action == Action.TERMINATE else ActionKind.STOP
        return Intent(kind, f"still idle at the announced time: {decision.reason}", decision)
    return Intent(None, f"marked; stop due at {mark.stop_at:%H:%M} UTC", decision)


def stop_cap(settings: Settings, fleet_size: int) -> int:
    """Most stops one run may make: the absolute cap and the fleet fraction, whichever is smaller."""
    by_fraction = math.ceil(settings.act.max_stops_fraction * fleet_size)
    return max(0, min(settings.act.max_stops_per_run, by_fraction))


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

    # ------------------------------------------------------------------ apply
    def apply(
        self,
        ctx: RunContext,
        instances: Sequence[GpuInstance],
        decisions: Sequence[Decision],
        rules: Sequence[Rule],
    ) -> list[ActionResult]:
        rules_by_name = {r.name: r for r in rules}
        states = self.track_states(decisions, ctx.now)
        by_instance: dict[str, list[Decision]] = {}
        for d in decisions:
            by_instance.setdefault(d.instance_id, []).append(d)

        intents: list[tuple[GpuInstance, Intent, MarkRow | None]] = []
        for inst in instances:
            decision = primary_decision(by_instance.get(inst.instance_id, []))
            mark = self.store.get_mark(inst.instance_id)
            state = states.get((inst.instance_id, decision.rule_name)) if decision else None
            intent = plan(inst, decision, mark, state, ctx.now, ctx.dry_run)
            if intent.kind is not None:
                intents.append((inst, intent, mark))

        # Stops in the order they were announced, so the cap delays the newest marks.
        intents.sort(key=lambda t: (t[2].stop_at if t[2] else ctx.now, t[0].instance_id))
        self._stops_left = stop_cap(self.settings, len(instances))
        results = []
        for inst, intent, mark in intents:
            rule = rules_by_name.get(intent.decision.rule_name) if intent.decision else None
            try:
                results.append(self._carry_out(ctx, inst, intent, mark, rule, states))
            except Exception as exc:  # one instance's failure must not stop the others
                log.exception("action %s on %s failed", intent.kind, inst.instance_id)
                results.append(ActionResult(inst.instance_id, intent.kind, ctx.dry_run, False, intent.reason,
                                            rule.name if rule else "", ctx.now, error=str(exc)))
        return results

    def _channel(self, rule: Rule | None) -> str:
        return (rule.slack_channel if rule and rule.slack_channel else "") or self.settings.slack.default_channel

    def _carry_out(self, ctx, inst, intent: Intent, mark, rule, states) -> ActionResult:
        kind, decision = intent.kind, intent.decision
        rule_name = rule.name if rule else (mark.rule if mark else "")
        channel = self._channel(rule)
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
            stop_at = ctx.now + timedelta(seconds=rule.warning_lead_s)
            self._change(ctx, inst, ActionKind.MARK, rule_name, intent.reason,
                         lambda: self.cloud.set_tags(inst, {TAG_MARKED: stop_at.strftime("%Y-%m-%dT%H:%M:%SZ")}))
            self.store.put_mark(MarkRow(inst.instance_id, rule_name, ctx.now, stop_at, decision.reason, ctx.dry_run))
            self.notifier.send(messages.idle_warning(inst, decision, marked_at=ctx.now, stop_at=stop_at,
                                                     channel=channel, dry_run=ctx.dry_run, action=decision.action))
            return ActionResult(inst.instance_id, kind, ctx.dry_run, True,
                                f"{intent.reason}; stop announced for {stop_at:%Y-%m-%d %H:%M} UTC", rule_name, ctx.now)

        if kind == ActionKind.UNMARK:
            if not mark.dry_run and TAG_MARKED in inst.tags:
                self._change(ctx, inst, ActionKind.UNMARK, rule_name, intent.reason,
                             lambda: self.cloud.remove_tags(inst, [TAG_MARKED]))
            else:
                self.store.record_action(ctx.run_id, ActionResult(inst.instance_id, kind, ctx.dry_run, True,
                                                                  intent.reason, rule_name, ctx.now))
            self.store.clear_mark(inst.instance_id)
            self.notifier.send(messages.mark_cancelled(inst, reason=intent.reason, marked_at=mark.marked_at, channel=channel))
            return ActionResult(inst.instance_id, kind, ctx.dry_run, True, intent.reason, rule_name, ctx.now)

        # STOP / TERMINATE
        if self._stops_left <= 0:
            reason = (f"stop cap reached (at most {self.settings.act.max_stops_per_run} per run and "
                      f"{self.settings.act.max_stops_fraction:.0%} of the fleet); mark kept for the next run")
            return self._record(ctx, ActionResult(inst.instance_id, ActionKind.SKIP, ctx.dry_run, True, reason, rule_name, ctx.now))
        self._stops_left -= 1

        def stop_and_tag() -> None:
            (self.cloud.terminate if kind == ActionKind.TERMINATE else self.cloud.stop)(inst)
            try:
                self.cloud.set_tags(inst, {TAG_STOPPED_BY: self.settings.act.actor,
                                           TAG_STOPPED_REASON: f"{rule_name}: {decision.reason}"[:255]})
                self.cloud.remove_tags(inst, [TAG_MARKED])
            except Exception as exc:  # the stop happened; tagging is bookkeeping
                log.warning("stopped %s but could not tag it: %s", inst.instance_id, exc)

        ok, error = self._change(ctx, inst, kind, rule_name, intent.reason, stop_and_tag)
        if not ok:
            return ActionResult(inst.instance_id, kind, ctx.dry_run, False, intent.reason, rule_name, ctx.now, error=error)
        self.store.clear_mark(inst.instance_id)
        state = states.get((inst.instance_id, rule_name))
        if state is not None:
            self.store.put_state(inst.instance_id, rule_name, state.verdict, state.since, ctx.now, ctx.now, ctx.dry_run)
        self.notifier.send(messages.stopped(inst, decision, at=ctx.now, channel=channel, dry_run=ctx.dry_run,
                                            action=decision.action))
        return ActionResult(inst.instance_id, kind, ctx.dry_run, True,
                            ("dry-run: would " + kind.value + ": " if ctx.dry_run else "") + intent.reason,
                            rule_name, ctx.now)

    def _record(self, ctx, result: ActionResult, persist: bool = True) -> ActionResult:
        if persist:
            self.store.record_action(ctx.run_id, result)
        return result

    def _change(self, ctx: RunContext, inst: GpuInstance, kind: ActionKind, rule: str, reason: str,
                call: Callable[[], None]) -> tuple[bool, str | None]:
        """THE chokepoint: the only place a cloud mutation is made. Dry-run makes none."""
        if ctx.dry_run:
            self.store.record_action(ctx.run_id, ActionResult(inst.instance_id, kind, True, True,
                                                              f"dry-run: would {kind.value}: {reason}", rule, ctx.now))
            return True, None
        action_id = self.store.begin_action(ctx.run_id, inst.instance_id, kind, rule, False, reason, ctx.now)
        try:
            call()
        except Exception as exc:
            self.store.finish_action(action_id, False, ctx.now, error=str(exc)[:500])
            log.error("%s %s failed: %s", kind.value, inst.instance_id, exc)
            return False, str(exc)
        self.store.finish_action(action_id, True, ctx.now)
        return True, None

    # ------------------------------------------------------------------ restart safety
    def reconcile(self, now: datetime) -> list[str]:
        """After a crash: settle stop/terminate intents that were written but never finished.

        The instance's real state decides: stopping/stopped/terminated means the call went
        through (done, never repeated); anything else means it did not (failed, and the
        normal mark/stop cycle may try again only if the instance is still idle).
        """
        notes = []
        pending = self.store.action_rows(status="pending", kinds=[ActionKind.STOP, ActionKind.TERMINATE, ActionKind.MARK, ActionKind.UNMARK])
        if not pending:
            return notes
        found = {i.instance_id: i for i in self.cloud.describe([p.instance_id for p in pending])}
        for p in pending:
            inst = found.get(p.instance_id)
            if p.kind in (ActionKind.STOP, ActionKind.TERMINATE):
                went_through = inst is None or inst.state in ("stopping", "stopped", "shutting-down", "terminated")
                if went_through:
                    self.store.finish_action(p.id, True, now, status="done", error="reconciled after restart: instance found " + (inst.state if inst else "gone"))
                    self.store.clear_mark(p.instance_id)
                    state = self.store.get_state(p.instance_id, p.rule)
                    if state is not None:
                        self.store.put_state(p.instance_id, p.rule, state.verdict, state.since, now, p.at, False)
                else:
                    self.store.finish_action(p.id, False, now, error=f"reconciled after restart: instance still {inst.state}; stop not confirmed")
            else:
                self.store.finish_action(p.id, False, now, status="failed", error="reconciled after restart: tag change not confirmed")
            notes.append(f"reconciled {p.kind.value} on {p.instance_id}")
            log.warning("reconciled pending %s on %s", p.kind.value, p.instance_id)
        return notes
