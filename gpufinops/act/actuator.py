"""The one chokepoint through which gpufinops changes anything in a cloud.

Two halves:
- `plan()` is pure: (instance, its primary decision, its mark, its stored state,
  now) -> Intent(kind, reason). Table-tested.
- `Actuator.apply()` carries intents out. Every cloud mutation goes through
  `Actuator.change()`, which enforces dry-run and the per-run stop cap, writes
  the intent to the database before the call and the result after it.

Stopping is two-phase: the first IDLE verdict marks the instance (tag + chat
warning with the time it will be stopped); at that time, if it is still IDLE, it
is stopped. Activity, a snooze tag, a protect tag, a snooze button click or a person
removing the mark tag cancels the mark. UNKNOWN (under any rule) never stops anything.

A person's cancel wins up to the last second: right before StopInstances the instance
is read again and the stop refused if anything changed since the plan (state, launch
time, the mark, snooze, protect, opt-in), and the shipped IAM policy lets StopInstances
through only while the mark tag is on the instance, so a request still in flight after a
cancel (or after another replica settled the stop) is refused by AWS itself. Where IAM cannot test a label (a GCE
VM) the last step before the stop is the fence at the cloud (`_fence`): a label written with the version of the
final read, refused by the cloud once a person changed a label since; no stop without it. Only an
instance carrying the opt-in tag (`act.opt_in_tag`, the one the IAM policy names) is
ever warned "will be stopped".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Callable, Sequence

from ..notify import interact, messages
from ..notify.routing import deliveries
from ..config import Settings
from ..model import (
    STATE_STOPPED_ALLOCATED,
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
    Notifier,
    ReasonCode,
    Rule,
    RunContext,
    Verdict,
)
from ..places.registry import SLURM_ACTIONS, TAG_MARK_GONE_WHY, TAG_STOP_FENCE, UNSUPPORTED_MARK, place_of
from ..words import POWER_OFF_BILLING
from ..store.schema import ActionRow, MarkRow, StateRow
from ..store.store import Store
from .plan import (
    STOPPED_STATES,
    TERMINATED_STATES,
    Intent,
    Snooze,
    opt_in_gap,
    parse_time,
    plan,
    primary_decision,
    snooze_of,
    stop_blocker,
    stop_cap,
)

log = logging.getLogger("gpufinops.act")


class NotLeader(RuntimeError):
    """This process no longer holds the scheduler lease: it must change nothing."""


@dataclass(frozen=True)
class Outcome:
    """What one cloud change came to, as recorded: done, failed, unconfirmed (fate unknown), or called off."""

    ok: bool | None  # None: unconfirmed, to be read back next tick
    error: str | None = None
    action_id: int | None = None  # the action row, when one was written and may still be open
    called_off: bool = False  # not made because the plan was overtaken (a person's word during its wait): no failure


# A button's snooze whose tag write failed this many times is not tried again; the request still holds.
MAX_SNOOZE_TAG_ATTEMPTS = 3
SNOOZE_TAG_FAILURES = "snooze_tag_failures:"

# The reasons of ActionKind.TAG rows, each settled by reconcile from what it says was written.
TAG_MARK_REMOVED = "mark tag removed after the stop"
TAG_STOPPED_BY_SET = "stopped-by tags"
TAG_MOVED = "announced stop time moved"
TAG_FENCED = "stop fence"  # the fence tag written right before the stop, conditioned on the final read (_fence)

# kv key (+ instance id) = the mark's time, when some rule of the marked instance had no usable metrics since.
METRICS_MISSING_SINCE_MARK = "metrics_missing_since_mark:"

# A stop that failed this many times on one mark is given up for the idle episode (and said so).
MAX_STOP_ATTEMPTS = 3
# Action rows whose outcome is not settled yet: reconciled against the cloud's real state.
# "applied": the cloud change went through, its bookkeeping (tags, mark, notice) is not finished yet.
UNSETTLED = ("pending", "unconfirmed", "applied")
# A change the place did not make because what it was planned on changed during its own wait (a person's word
# during a Slurm grace wait): not "failed" (not counted toward MAX_STOP_ATTEMPTS), and its row says what was sent.
CALLED_OFF = "abandoned"
# How long a mutating request may be in flight when the cloud does not say (Cloud.max_request_s does).
DEFAULT_MAX_REQUEST_S = 120.0


class Actuator:
    def __init__(self, cloud: Cloud, store: Store, notifier: Notifier, settings: Settings):
        self.cloud = cloud
        self.store = store
        self.notifier = deliveries(notifier, settings)  # routes each notice by its audience (notify/routing.py)
        self.settings = settings

    # ------------------------------------------------------------------ state
    def track_states(self, decisions: Sequence[Decision], now: datetime) -> dict[tuple[str, str], StateRow]:
        """Record verdict transitions per (instance, rule); return the current rows. One read and one batched
        write for the whole tick, in one transaction (Store.update_states), never a round trip per decision."""
        keys = [(d.instance_id, d.rule_name) for d in decisions]
        verdict_at = iter([d.verdict for d in decisions])  # update_states calls step once per key, in order

        def step(key: tuple[str, str], prev: StateRow | None) -> StateRow:
            verdict = next(verdict_at)
            if prev is not None and prev.verdict == verdict:
                since, stopped_at, stop_dry_run = prev.since, prev.stopped_at, prev.stop_dry_run
            else:
                # A stop belongs to one idle episode; any transition starts clean.
                since, stopped_at, stop_dry_run = now, None, None
            return StateRow(key[0], key[1], verdict, since, now, stopped_at, stop_dry_run)

        return self.store.update_states(keys, step)

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
        *,
        stops_already: int = 0,
    ) -> list[ActionResult]:
        """`stops_already`: stops this run made in an earlier pass (the GPU-node pass after the instances'): the
        cap is one per run, whatever the number of passes."""
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
            # Before planning: a snooze a person asked for with a button holds on this very tick.
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
            mark = self.store.get_mark(inst.instance_id)
            # Noted even on a tick that does nothing else to the instance: the metrics alert of this tick says so.
            metrics_missing = self._metrics_missing_since_mark(inst.instance_id, mark,
                                                               by_instance.get(inst.instance_id, []))
            if inst.instance_id in unsettled:
                log.warning("%s: an earlier change is not confirmed yet; nothing else is done to it until it is",
                            inst.instance_id)
                continue
            decision = primary_decision(by_instance.get(inst.instance_id, []))
            state = states.get((inst.instance_id, decision.rule_name)) if decision else None
            intent = plan(inst, decision, mark, state, ctx.now, ctx.dry_run, self._snooze(inst, ctx.now),
                          opt_in_missing=self._opt_in_gap(inst), metrics_missing_since_mark=metrics_missing)
            if intent.kind is not None or intent.deliver_warning:
                intents.append((inst, intent, mark))

        # Stops in the order they were announced, so the cap delays the newest marks.
        intents.sort(key=lambda t: (t[2].stop_at if t[2] else ctx.now, t[0].instance_id))
        self._stops_left = max(0, stop_cap(self.settings, len(instances)) - stops_already)
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

    def _metrics_missing_since_mark(self, instance_id: str, mark: MarkRow | None,
                                    decisions: Sequence[Decision]) -> bool:
        """Whether any rule of this marked instance had no usable metrics since its mark (this tick or an earlier
        one): the "No usable GPU metrics" alert (run/pipeline.alert_missing_data, the same test) tells its owner
        that the stop is held and that a new warning comes first once metrics return. Kept in the store under the
        mark's time, so it holds across ticks and restarts, and a later mark starts clean."""
        if mark is None:
            return False
        key, value = METRICS_MISSING_SINCE_MARK + instance_id, _stamp(mark.marked_at)
        seen = self.store.get_kv(key) == value
        if not seen and any(d.code.is_missing_data for d in decisions):
            self.store.set_kv(key, value)
            seen = True
        return seen

    def _opt_in_gap(self, inst: GpuInstance) -> str:
        return opt_in_gap(inst, self.settings.act.opt_in_tag, self.settings.act.opt_in_value)

    def _destinations(self, rule: Rule | None, inst: GpuInstance | None = None) -> tuple[str, ...]:
        """Where the configuration sends an instance's notices (its rule's notify_to), or () (notify/routing.py
        routes them by audience)."""
        return rule.notify_to if rule else ()

    def _carry_out(self, ctx: RunContext, inst: GpuInstance, intent: Intent, mark: MarkRow | None, rule: Rule | None,
                   states: dict[tuple[str, str], StateRow]) -> ActionResult | None:
        kind, decision = intent.kind, intent.decision
        rule_name = rule.name if rule else (mark.rule if mark else "")
        to = self._destinations(rule, inst)

        if intent.deliver_warning:
            return self._deliver_warning(ctx, inst, mark, decision, rule, to)

        # A skip repeats every tick while its state lasts: logged at INFO once per state change, else at DEBUG.
        changed = kind != ActionKind.SKIP or (states.get((inst.instance_id, rule_name)) is not None
                                              and states[(inst.instance_id, rule_name)].since >= ctx.now)
        log.log(logging.INFO if changed else logging.DEBUG, "%s %s %s: %s%s", ctx.run_id, kind.value,
                inst.instance_id, intent.reason, " [dry-run]" if ctx.dry_run else "")
        if kind == ActionKind.SKIP:
            return self._record(ctx, ActionResult(inst.instance_id, kind, ctx.dry_run, True, intent.reason, rule_name, ctx.now),
                                persist=changed)

        if kind == ActionKind.NOTIFY:
            state = states[(inst.instance_id, rule_name)]
            why_not = "" if decision.action == Action.NOTIFY else (
                stop_blocker(inst, decision.action) or self._opt_in_gap(inst))
            self.notifier.send(messages.idle_notice(inst, decision, since=state.since, to=to,
                                                    not_stopped_because=why_not))
            return self._record(ctx, ActionResult(inst.instance_id, kind, ctx.dry_run, True, intent.reason, rule_name, ctx.now))

        if kind == ActionKind.MARK:
            if mark is not None and mark.dry_run and not ctx.dry_run and mark.warned_at is None:
                # A dry-run mark carried over to a real one: its dry-run warning, never delivered, is not sent any more.
                self.store.abandon_notification(messages.warning_key(inst.instance_id, mark.marked_at), ctx.now,
                                                "dry-run mark carried over to a real one")
            return self._mark(ctx, inst, intent, decision, rule, to)

        if kind == ActionKind.UNMARK:
            return self._unmark(ctx, inst, intent, mark, rule_name, to)

        # STOP / TERMINATE / POWER_OFF
        failures = self.store.action_rows(status="failed", kinds=list(CHANGE_KINDS),
                                          start=mark.marked_at, instance_id=inst.instance_id)
        if len(failures) >= MAX_STOP_ATTEMPTS:
            return self._give_up(ctx, inst, mark, rule_name, to, failures[-1].error or "")
        if self._stops_left <= 0:
            reason = (f"stop cap reached (at most {self.settings.act.max_stops_per_run} per run and "
                      f"{self.settings.act.max_stops_fraction:.0%} of the fleet); mark kept for the next run")
            return self._record(ctx, ActionResult(inst.instance_id, ActionKind.SKIP, ctx.dry_run, True, reason, rule_name, ctx.now))
        changed, fresh = ("", None) if ctx.dry_run else self._changed_since_plan(inst, mark, rule, ctx.now)
        if changed:
            # A person's cancel in the last seconds (mark removed, snooze, protect, a restart) wins: the next
            # run plans again from what the cloud says now.
            reason = f"not stopped: {changed} since this run's plan; the next run decides again"
            log.warning("%s: %s", inst.instance_id, reason)
            return self._record(ctx, ActionResult(inst.instance_id, ActionKind.SKIP, ctx.dry_run, True, reason,
                                                  rule_name, ctx.now))
        if fresh is not None and place_of(inst.instance_id).fenced_at_cloud:
            fenced = self._fence(ctx, inst, fresh, mark, rule, rule_name)
            if fenced:
                return self._record(ctx, ActionResult(inst.instance_id, ActionKind.SKIP, ctx.dry_run, True,
                                                      f"not stopped: {fenced}; the next run decides again",
                                                      rule_name, ctx.now))
        self._stops_left -= 1

        own_call = decision.action in place_of(inst.instance_id).own_calls
        if decision.action in SLURM_ACTIONS:
            # A Slurm job's own change, the rule's (places.slurm.cloud.end_job): requeue, requeuehold or scancel.
            # A Slurm cluster (places.fleet.WithSlurm) is the only Cloud with jobs to end.
            def call(job: GpuInstance) -> None:
                # Asked again after the grace signal's wait: a click or a CLI snooze during it wins as well.
                self.cloud.end_job(job, decision.action,
                                   lambda: self._changed_since_plan(inst, mark, rule, ctx.now)[0])
        elif kind == ActionKind.POWER_OFF:
            # An Azure VM's power-off, asked for by its rule (stop_blocker lets no other subject through): the VM
            # keeps its hardware, and its bill. The record says so (audit).
            call = self.cloud.power_off
        elif own_call:
            # A change its place makes by a call of its own, never by its stop: a GCE VM's instances.suspend.
            call = self.cloud.suspend
        else:
            call = self.cloud.terminate if kind == ActionKind.TERMINATE else self.cloud.stop
        reason = _with_billing(kind, intent.reason)
        # The row says which call it was, so that reconcile (after a lost answer) tells the owner the right verb.
        row_reason = f"{decision.action.value}: {reason}" if own_call else reason
        outcome = self.change(ctx, inst, kind, rule_name, row_reason, lambda: call(inst), verify=DONE_STATES_OF[kind],
                              keep_open=True)
        if outcome.called_off:
            # A person's cancel during the grace wait (a snooze, the mark removed, a protect, a restart) won: like
            # the skip above, no failure; its row ("abandoned") says what was sent, and the next run decides again.
            return ActionResult(inst.instance_id, ActionKind.SKIP, ctx.dry_run, True,
                                f"called off: {outcome.error}; the next run decides again", rule_name, ctx.now)
        if not outcome.ok:
            if outcome.ok is False and UNSUPPORTED_MARK in (outcome.error or ""):
                # The cloud will never do it to this subject (GCE: no suspend of a VM with GPUs attached): not
                # tried again, and never turned into a stop (its warning promised this change); said once.
                verb, done_words = place_of(inst.instance_id).verbs_for(decision.action)
                return self._give_up(ctx, inst, mark, rule_name, to, outcome.error or "", verb=verb, reason=(
                    f"the cloud refused to {verb} it, for good: it keeps running, billed, and is not stopped instead "
                    f"(its warning said it would be {done_words}); a rule with action: stop would end its GPU "
                    f"billing ({(outcome.error or '')[:240]})"))
            return ActionResult(inst.instance_id, kind, ctx.dry_run, False, reason, rule_name, ctx.now,
                                error=outcome.error)
        self._after_stop(ctx, inst, kind, rule_name, decision, ctx.now, ctx.dry_run, to)
        if outcome.action_id is not None:
            self.store.finish_action(outcome.action_id, True, ctx.now, status="done")
        return ActionResult(inst.instance_id, kind, ctx.dry_run, True,
                            ("dry-run: would " + (decision.action.value if own_call else kind.value) + ": "
                             if ctx.dry_run else "") + reason,
                            rule_name, ctx.now)

    def _changed_since_plan(self, inst: GpuInstance, mark: MarkRow, rule: Rule | None,
                            now: datetime) -> tuple[str, GpuInstance | None]:
        """The instance read again right before its stop: (what changed since the plan, in words, "" when nothing
        did; that final read). What cannot be read is a change too: no stop on a state we have not seen."""
        try:
            found = self.cloud.describe([inst.instance_id])
        except Exception as exc:  # noqa: BLE001 - unknown is never a reason to stop
            return f"the instance could not be read again ({str(exc)[:200]})", None
        fresh = found[0] if found else None
        return self._what_changed(inst, fresh, mark, rule, now), fresh

    def _fence(self, ctx: RunContext, inst: GpuInstance, fresh: GpuInstance, mark: MarkRow, rule: Rule | None,
               rule_name: str) -> str:
        """The fence at the cloud, the last step before the stop of a place that has one (a GCE VM): the fence tag
        written with the version of `fresh`, the final read in which the mark was seen. A person's label change
        since that read (the mark removed, a snooze, protect) makes the cloud refuse it, and then no stop is sent.
        A mark write of its own (its own audit row), not the stop: the stop is still one call. Returns why the stop
        is not sent ("" when the fence went through); nobody is told here: the next run plans from the cloud, and
        a cancelled mark is said once, there."""
        value = _stamp(ctx.now)

        def still_fenced(found: GpuInstance | None) -> bool:
            # After a lost answer: our fence is on AND nothing a person can cancel with changed since the plan.
            return (found is not None and found.tags.get(TAG_STOP_FENCE) == value
                    and not self._what_changed(inst, found, mark, rule, ctx.now))

        outcome = self.change(ctx, fresh, ActionKind.TAG, rule_name, f"{TAG_FENCED}: {TAG_STOP_FENCE}={value}",
                              lambda: self.cloud.set_tags_fenced(fresh, {TAG_STOP_FENCE: value}),
                              verify=still_fenced)
        if outcome.ok:
            return ""
        if outcome.ok is None:
            return f"the fence before the stop is not confirmed ({(outcome.error or '')[:200]})"
        return (f"the fence before the stop was refused: a label changed since the final read "
                f"({(outcome.error or '')[:200]})")

    @staticmethod
    def _mark_keys(inst: GpuInstance) -> list[str]:
        """The tags that go with the mark: the mark, and where the place fences its stops, the fence tag."""
        return [TAG_MARKED, TAG_STOP_FENCE] if place_of(inst.instance_id).fenced_at_cloud else [TAG_MARKED]

    def _what_changed(self, inst: GpuInstance, fresh: GpuInstance | None, mark: MarkRow, rule: Rule | None,
                      now: datetime) -> str:
        """What changed between the plan's `inst` and a later read of it, in words ("" when nothing did)."""
        if fresh is None:
            return "the instance is gone"
        if fresh.state != inst.state or not fresh.is_judged:  # running, or still "Stopped (allocated)"
            return f"the instance is {fresh.state}"
        if fresh.launch_time != inst.launch_time:
            return f"the instance was restarted (launched {fresh.launch_time:%H:%M:%S} UTC)"
        value = fresh.tags.get(TAG_MARKED)
        if value is None:
            return f"tag {TAG_MARKED} was removed"
        lead = timedelta(seconds=rule.warning_lead_s) if rule else mark.stop_at - mark.marked_at
        if value not in (_stamp(mark.stop_at), _stamp(mark.marked_at + lead), inst.tags.get(TAG_MARKED)):
            return f"tag {TAG_MARKED} was changed to {value[:64]!r}"
        if fresh.is_protected:
            return f"tag {TAG_PROTECT} was set"
        if fresh.tags.get(TAG_SNOOZE) != inst.tags.get(TAG_SNOOZE) and self._snooze(fresh, now).active:
            return f"tag {TAG_SNOOZE} was set"
        if self._opt_in_gap(fresh):
            return f"tag {self.settings.act.opt_in_tag} was removed or changed"
        if self.store.get_kv(interact.REQUEST_PREFIX + inst.instance_id) is not None:
            return f"a person asked to snooze it in {interact.CHAT}"
        return ""

    # ------------------------------------------------------------------ the phases
    def _mark(self, ctx: RunContext, inst: GpuInstance, intent: Intent, decision: Decision, rule: Rule,
              to: tuple[str, ...]) -> ActionResult:
        rule_name = rule.name
        stop_at = ctx.now + timedelta(seconds=rule.warning_lead_s)
        value = _stamp(stop_at)
        outcome = self.change(ctx, inst, ActionKind.MARK, rule_name, intent.reason,
                              lambda: self.cloud.set_tags(inst, {TAG_MARKED: value}),
                              verify=lambda i: i is not None and i.tags.get(TAG_MARKED) == value)
        if not outcome.ok:
            # No mark without its tag: the next tick tries again if the instance is still idle.
            return ActionResult(inst.instance_id, ActionKind.MARK, ctx.dry_run, False, intent.reason, rule_name,
                                ctx.now, error=outcome.error)
        mark = MarkRow(inst.instance_id, rule_name, ctx.now, stop_at, decision.reason, ctx.dry_run)
        self.store.put_mark(mark)
        result = self._deliver_warning(ctx, inst, mark, decision, rule, to)
        return replace(result, kind=ActionKind.MARK, reason=f"{intent.reason}; {result.reason}")

    def _deliver_warning(self, ctx: RunContext, inst: GpuInstance, mark: MarkRow, decision: Decision, rule: Rule | None,
                         to: tuple[str, ...]) -> ActionResult:
        """Send (or send again) the mark's warning; once delivered, the stop is due a full lead after delivery."""
        lead = timedelta(seconds=rule.warning_lead_s if rule else (mark.stop_at - mark.marked_at).total_seconds())
        msg = messages.idle_warning(inst, decision, marked_at=mark.marked_at, stop_at=ctx.now + lead,
                                    to=to, dry_run=ctx.dry_run, action=decision.action, sent_at=ctx.now,
                                    buttons=self.notifier.offers_buttons(),
                                    idle_since=idle_since(self.store.get_state(inst.instance_id, mark.rule), decision))
        rule_name = mark.rule
        if not self.notifier.send(msg):
            log.warning("%s: warning not delivered; no stop until it is", inst.instance_id)
            return ActionResult(inst.instance_id, ActionKind.SKIP, ctx.dry_run, False,
                                "warning not delivered: no stop until it is (retried with backoff)", rule_name,
                                ctx.now, error="warning not delivered")
        delivered = self.store.delivered_at(msg.key) or ctx.now
        stop_at = max(mark.stop_at, delivered + lead)
        self.store.put_mark(replace(mark, warned_at=delivered, stop_at=stop_at))
        if not ctx.dry_run and stop_at - mark.stop_at >= timedelta(minutes=1):
            # Delivered late: the tag people read says the real time. A cloud change, so it has its audit row.
            value = _stamp(stop_at)
            self.change(ctx, inst, ActionKind.TAG, rule_name, f"{TAG_MOVED}: {value} (warning delivered late)",
                        lambda: self.cloud.set_tags(inst, {TAG_MARKED: value}),
                        verify=lambda i: i is not None and i.tags.get(TAG_MARKED) == value)
        return ActionResult(inst.instance_id, ActionKind.MARK, ctx.dry_run, True,
                            f"warning delivered; stop announced for {stop_at:%Y-%m-%d %H:%M} UTC", rule_name, ctx.now)

    def _unmark(self, ctx: RunContext, inst: GpuInstance, intent: Intent, mark: MarkRow, rule_name: str,
                to: tuple[str, ...], verb: str = "") -> ActionResult:
        # A mark the place no longer counts as the subject's (TAG_MARK_GONE_WHY: a Slurm job's earlier run) is still
        # written on it: removed as well, so that nobody reads a warning that no longer holds.
        if not mark.dry_run and any(k in inst.tags for k in (TAG_MARKED, TAG_MARK_GONE_WHY, TAG_STOP_FENCE)):
            outcome = self.change(ctx, inst, ActionKind.UNMARK, rule_name, intent.reason,
                                  lambda: self.cloud.remove_tags(inst, self._mark_keys(inst)),
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
                                                               to=to, verb=verb), thread_key=warning_key))
        return ActionResult(inst.instance_id, ActionKind.UNMARK, ctx.dry_run, True, intent.reason, rule_name, ctx.now)

    def _give_up(self, ctx: RunContext, inst: GpuInstance, mark: MarkRow, rule_name: str, to: tuple[str, ...],
                 last_error: str, *, reason: str = "", verb: str = "") -> ActionResult:
        reason = (f"{reason}; given up for this idle episode" if reason else
                  f"stop failed {MAX_STOP_ATTEMPTS} times since the warning (last: {last_error[:200]}); "
                  f"given up for this idle episode")
        log.error("%s: %s", inst.instance_id, reason)
        result = self._unmark(ctx, inst, Intent(ActionKind.UNMARK, reason), mark, rule_name, to, verb=verb)
        state = self.store.get_state(inst.instance_id, rule_name)
        if state is not None:  # acted on: not marked again before the instance is active and idle again
            self.store.put_state(inst.instance_id, rule_name, state.verdict, state.since, ctx.now, ctx.now, ctx.dry_run)
        return replace(result, ok=False, error=reason)

    def _after_stop(self, ctx: RunContext, inst: GpuInstance, kind: ActionKind, rule_name: str, decision: Decision,
                    at: datetime, dry_run: bool, to: tuple[str, ...]) -> None:
        """After a stop went through (now or found by reconcile): bookkeeping tags, mark, state, the notice."""
        self._tag_stopped(ctx, inst, rule_name, decision.reason)
        mark = self.store.get_mark(inst.instance_id)
        self.store.clear_mark(inst.instance_id)
        state = self.store.get_state(inst.instance_id, rule_name)
        if state is not None:
            self.store.put_state(inst.instance_id, rule_name, state.verdict, state.since, ctx.now, at, dry_run)
        notice = messages.stopped(inst, decision, at=at, to=to, dry_run=dry_run, action=decision.action,
                                  idle_since=idle_since(state, decision))
        # Under its warning, so the owner reads warning and outcome in one place.
        self.notifier.send(replace(notice, thread_key=messages.warning_key(inst.instance_id, mark.marked_at))
                           if mark is not None else notice)

    def _tag_stopped(self, ctx: RunContext, inst: GpuInstance, rule_name: str, reason: str) -> None:
        if ctx.dry_run:
            return
        """Bookkeeping after a stop, each call through the chokepoint with its own audit row, so one failing
        does not leave the other undone. Removing the mark also closes the IAM fence: a stale StopInstances
        still in flight (another replica's) is refused by AWS once the instance no longer carries it."""
        outcome = self.change(ctx, inst, ActionKind.TAG, rule_name, TAG_MARK_REMOVED,
                              lambda: self.cloud.remove_tags(inst, self._mark_keys(inst)),
                              verify=lambda i: i is None or TAG_MARKED not in i.tags)
        if outcome.ok is not True:
            log.warning("stopped %s but could not remove its %s tag: %s", inst.instance_id, TAG_MARKED, outcome.error)
        outcome = self.change(ctx, inst, ActionKind.TAG, rule_name, TAG_STOPPED_BY_SET,
                              lambda: self.cloud.set_tags(inst, {TAG_STOPPED_BY: self.settings.act.actor,
                                                                 TAG_STOPPED_REASON: f"{rule_name}: {reason}"[:255]}),
                              verify=lambda i: i is None or TAG_STOPPED_BY in i.tags)
        if outcome.ok is not True:
            log.warning("stopped %s but could not tag it %s: %s", inst.instance_id, TAG_STOPPED_BY, outcome.error)

    def _record(self, ctx: RunContext, result: ActionResult, persist: bool = True) -> ActionResult:
        if persist:
            self.store.record_action(ctx.run_id, result)
        return result

    # ------------------------------------------------------------------ people's snoozes (notify/interact's buttons)
    def apply_snooze_requests(self, ctx: RunContext, instances: Sequence[GpuInstance]) -> list[GpuInstance]:
        """Set the snooze tag people asked for with a button (gpufinops.interact), through the chokepoint; the
        instances come back with the tag as the cloud now has it, so the plan below sees the snooze.

        Live: one tag call per request; a tag already equal to the request (a retry after a lost answer), or a
        snooze tag that already holds longer, is not set again. An EC2 instance that already carries a snooze tag
        (any value) keeps it: the IAM policy lets gpufinops write that tag only where none is set, so the request
        holds from our own record (`_hold_snooze_from_record`). Not confirmed: the request stays and its action
        row is reconciled; until then nothing else is done to the instance. Failed (the IAM policy, an API
        error): the request is a person's word to keep the machine running and holds all the same, from our own
        record, until it ends; the person who clicked is told once; the tag write is tried again a few times.
        Dry-run: no tag is set; the request is audited and shown once and holds in memory until it ends, as
        the tag would."""
        requests = interact.pending_requests(self.store)
        if not requests:
            return list(instances)
        by_id = {i.instance_id: i for i in instances}
        for req in requests:
            inst = by_id.get(req.instance_id)
            until = parse_time(req.until)
            if until is None or until <= ctx.now:
                interact.forget_request(self.store, req.instance_id)  # the snooze has ended
                self.store.set_kv(SNOOZE_TAG_FAILURES + req.instance_id, None)
                continue
            if inst is None:
                continue  # not listed this run (a region's inventory failed): the request waits, and holds
            held = replace(inst, tags={**inst.tags, TAG_SNOOZE: req.until})
            existing = self._snooze(inst, ctx.now)  # capped, as the plan reads it: a tag of 2099 holds 7 d
            if existing.active and existing.until is not None and existing.until >= until:
                interact.forget_request(self.store, req.instance_id)  # a snooze as long or longer is on already
                continue
            reason = (f"snoozed until {req.until} by {req.user_name} with `gpufinops slurm snooze`"
                      if req.action_id == interact.CLI_SNOOZE_ACTION else
                      f"snoozed until {req.until} by {req.user_name} ({req.user_id}) with a {interact.CHAT} button")
            if ctx.dry_run:
                if not req.recorded:
                    self.change(ctx, inst, ActionKind.SNOOZE, "", reason, lambda: None)
                    self._update_warning(req, until, dry_run=True)
                    interact.keep_request(self.store, replace(req, recorded=True))
            elif inst.tags.get(TAG_SNOOZE) != req.until:
                if req.recorded:  # its tag write was given up: the request holds from our record alone
                    by_id[req.instance_id] = held
                    continue
                if inst.snooze_tag_is_a_persons:
                    self._hold_snooze_from_record(ctx, inst, req, until, reason)
                    by_id[req.instance_id] = held
                    continue
                outcome = self.change(ctx, inst, ActionKind.SNOOZE, "", reason,
                                      lambda inst=inst, req=req: self.cloud.set_tags(inst, {TAG_SNOOZE: req.until}),
                                      verify=lambda found, req=req: found is not None
                                      and found.tags.get(TAG_SNOOZE) == req.until)
                if not outcome.ok:
                    # Our failure to write a tag never overrides a person's request: it holds from our record.
                    by_id[req.instance_id] = held
                    if outcome.ok is False:
                        self._snooze_tag_failed(req, until, outcome.error or "")
                    continue  # unconfirmed: its row is settled first, and nothing else happens to the instance
                self._update_warning(req, until, dry_run=False)
                interact.forget_request(self.store, req.instance_id)
            else:
                interact.forget_request(self.store, req.instance_id)
            by_id[req.instance_id] = held
        return [by_id[i.instance_id] for i in instances]

    def _hold_snooze_from_record(self, ctx: RunContext, inst: GpuInstance, req: "interact.SnoozeRequest",
                                 until: datetime, reason: str) -> None:
        """A Snooze click on an EC2 instance that already carries a snooze tag (a second click, or a snooze a
        person set, expired or not): the tag is not rewritten (the IAM policy refuses it, so that gpufinops can
        never end a person's snooze; trying would be a refused call every time). The click holds from our own
        record until it ends, like a snooze whose tag write was refused; the clicker was told so when they
        clicked (interact), and the warning is updated in place as for any snooze."""
        existing = inst.tags.get(TAG_SNOOZE, "")
        self.store.record_action(ctx.run_id, ActionResult(
            inst.instance_id, ActionKind.SNOOZE, False, True,
            f"{reason}; held by gpufinops's own record, the tag {TAG_SNOOZE}={existing[:64]!r} on the instance is "
            f"not rewritten (only a person changes a snooze tag)", "", ctx.now))
        log.info("%s: snooze until %s by %s held from gpufinops's own record; its %s tag (%r) is left as it is",
                 inst.instance_id, req.until, req.user_id, TAG_SNOOZE, existing[:64])
        self._update_warning(req, until, dry_run=False)
        interact.keep_request(self.store, replace(req, recorded=True))

    def _snooze_tag_failed(self, req: "interact.SnoozeRequest", until: datetime, error: str) -> None:
        """A snooze request whose tag could not be written: told once to the person who clicked (a DM), and the
        request kept so that it holds; after a few failed writes it is not tried again (one call per intent,
        not one a minute for days), and still holds."""
        key = SNOOZE_TAG_FAILURES + req.instance_id
        failures = int(self.store.get_kv(key) or 0) + 1
        self.store.set_kv(key, str(failures))
        if failures == 1:
            log.error("%s: snooze from %s by %s could not be written as a tag (%s); it holds from gpufinops's "
                      "own record until %s", req.instance_id, interact.CHAT, req.user_id, error[:200], req.until)
            if req.user_id:
                self.notifier.send(messages.snooze_not_applied(
                    req.instance_id, user_id=req.user_id, until=until, error=error,
                    key=f"snooze-unapplied:{req.instance_id}:{req.until}"))
        if failures >= MAX_SNOOZE_TAG_ATTEMPTS:
            interact.keep_request(self.store, replace(req, recorded=True))

    def _update_warning(self, req: "interact.SnoozeRequest", until: datetime, dry_run: bool) -> None:
        """The warning the button was on, updated in place: who snoozed it until when (cosmetic: never raises)."""
        try:
            self.notifier.show_snoozed(req, until, dry_run)
        except Exception as exc:  # noqa: BLE001 - the snooze is set; the message edit is not worth a failure
            log.warning("could not update the %s message of %s: %s", interact.CHAT, req.instance_id, exc)

    # ------------------------------------------------------------------ THE chokepoint
    def change(self, ctx: RunContext, inst: GpuInstance, kind: ActionKind, rule: str, reason: str,
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
            if getattr(exc, "called_off", False):
                # The place itself decided, on a fresh read, not to send it (places.slurm.cloud.SlurmActionCalledOff):
                # nothing failed and nothing is in flight, so no read-back; the next run plans again from the cloud.
                log.warning("%s %s called off: %s", kind.value, inst.instance_id, error)
                if action_id is not None:
                    self.store.finish_action(action_id, False, ctx.now, status=CALLED_OFF, error=error)
                return Outcome(False, error, called_off=True)
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
    def reconcile(self, now: datetime, lease: LeaseCheck | None = None, *, instance_ids: Sequence[str] | None = None,
                  kinds: Sequence[ActionKind] | None = None) -> list[str]:
        """Settle every change whose outcome is not recorded yet (a crash, a lost answer), from the
        instance's real state: stopping/stopped/terminated means the stop went through (done, never
        repeated, and its bookkeeping and notice follow now); anything else means it did not. A RESTORE
        row (`gpufinops k8s restore`) is done when the workload is no longer scaled down.
        `instance_ids` / `kinds`: only those rows (`gpufinops k8s restore` settles its own earlier restore).
        Raises when the cloud cannot be read: nothing may be acted on before this succeeds."""
        notes: list[str] = []
        pending = [p for p in self.store.action_rows(status=UNSETTLED)
                   if (instance_ids is None or p.instance_id in instance_ids) and (kinds is None or p.kind in kinds)]
        if not pending:
            return notes
        found = {i.instance_id: i for i in self.cloud.describe(sorted({p.instance_id for p in pending}))}
        ctx = RunContext(now=now, dry_run=False, lease=lease)
        max_request_s = float(getattr(self.cloud, "max_request_s", DEFAULT_MAX_REQUEST_S))
        for p in pending:
            inst = found.get(p.instance_id)
            # A request sent less than the longest time one can take ago may still land (a paused process, a
            # held connection): "not done" is not an answer yet. Its row stays open, and its instance waits.
            in_flight = p.status != "applied" and (now - p.at).total_seconds() < max_request_s
            if p.kind in CHANGE_KINDS:
                done = DONE_STATES_OF[p.kind](inst)
                if not done and in_flight:
                    log.warning("%s on %s not seen done yet; it may still be in flight until %s: settled then",
                                p.kind.value, p.instance_id, _stamp(p.at + timedelta(seconds=max_request_s)))
                    continue
                if done:
                    # Bookkeeping first, the record last: a crash in between is reconciled again.
                    if inst is not None:
                        # The stop of a place that has an action of its own (a node's cordon: drain) was that
                        # action; the registry tells the place from the id (places.registry.place_of).
                        decision = Decision(p.instance_id, p.rule, Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW,
                                            _reason_of(p.reason), p.at,
                                            action=ACTION_OF_KIND.get(p.kind) or own_call_of(p)
                                            or place_of(p.instance_id).own_action or Action.STOP,
                                            hourly_cost=inst.hourly_cost)
                        self._after_stop(ctx, inst, p.kind, p.rule, decision, p.at, False, self._destinations(None, inst))
                    else:
                        self.store.clear_mark(p.instance_id)
                    self.store.finish_action(p.id, True, now, status="done",
                                             error="reconciled: instance found " + (inst.state if inst else "gone"))
                else:
                    self.store.finish_action(p.id, False, now, status="failed",
                                             error=f"reconciled: instance still {inst.state if inst else 'unknown'}; "
                                                   f"stop not done")
            else:
                done, found_text = _tag_change_seen(p, inst)
                if not done and in_flight:
                    continue
                self.store.finish_action(p.id, done, now, status="done" if done else "failed",
                                         error=f"reconciled: {found_text}")
            notes.append(f"reconciled {p.kind.value} on {p.instance_id}")
            log.warning("reconciled unsettled %s on %s", p.kind.value, p.instance_id)
        return notes


def _tag_change_seen(row: ActionRow, inst: GpuInstance | None) -> tuple[bool, str]:
    """Whether a tag change an action row intended is on the instance now, and what was found, in words."""
    tags = inst.tags if inst is not None else {}
    if row.kind == ActionKind.RESTORE:  # scaled back up: no longer "stopped" (0 replicas + the kept count)
        seen = inst is not None and inst.state != "stopped"
        return seen, "workload " + ("scaled back up" if seen else "gone" if inst is None else "still scaled down")
    if row.kind == ActionKind.SNOOZE:
        seen = bool(tags.get(TAG_SNOOZE))
        return seen, "snooze tag " + ("present" if seen else "absent")
    if row.kind == ActionKind.MARK or (row.kind == ActionKind.TAG and row.reason.startswith(TAG_MOVED)):
        seen = TAG_MARKED in tags
        return seen, "mark tag " + ("present" if seen else "absent")
    if row.kind == ActionKind.TAG and row.reason.startswith(TAG_FENCED):
        # Settled as written or not; either way no stop follows from it: the next run plans and fences again.
        seen = inst is not None and tags.get(TAG_STOP_FENCE) == row.reason.rpartition("=")[2]
        return seen, "stop fence tag " + ("present" if seen else "absent")
    if row.kind == ActionKind.TAG and row.reason.startswith(TAG_STOPPED_BY_SET):
        seen = inst is None or TAG_STOPPED_BY in tags
        return seen, "stopped-by tag " + ("present" if seen else "absent")
    # UNMARK, and the mark's removal after a stop
    seen = TAG_MARKED not in tags
    return seen, "mark tag " + ("removed" if seen else "still there")


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


def _powered_off(inst: GpuInstance | None) -> bool:
    """An Azure VM's power-off went through: powering off, or "Stopped (allocated)". A VM found deallocated was not
    powered off by gpufinops (someone deallocated it): not this change's doing, never recorded as it."""
    return inst is None or inst.state in ("powering-off", STATE_STOPPED_ALLOCATED)


# The changes that end a mark (the plan's stop-time kinds), and the state that says each went through.
DONE_STATES_OF: dict[ActionKind, Callable[[GpuInstance | None], bool]] = {
    ActionKind.STOP: _stopped, ActionKind.TERMINATE: _terminated, ActionKind.POWER_OFF: _powered_off}
CHANGE_KINDS = tuple(DONE_STATES_OF)
# The rule's action a change row stands for, where the kind says it (a stop row: its place's own action, or stop).
ACTION_OF_KIND = {ActionKind.TERMINATE: Action.TERMINATE, ActionKind.POWER_OFF: Action.POWER_OFF}


def _with_billing(kind: ActionKind, reason: str) -> str:
    """A change's recorded reason: a power-off's says that the VM's compute is still billed (the audit row)."""
    return f"{reason}; {POWER_OFF_BILLING}" if kind == ActionKind.POWER_OFF else reason


def _stamp(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def own_call_of(row: ActionRow) -> Action | None:
    """The action a stop row carried out by its place's own call (a GCE suspend: its reason begins "suspend: ")."""
    return next((a for a in place_of(row.instance_id).own_calls if row.reason.startswith(f"{a.value}: ")), None)


def _reason_of(action_reason: str) -> str:
    """The verdict's reason inside a stop intent's text ("still idle at the announced time: ...", after the call's
    name where the row names one: "suspend: still idle ...")."""
    head = "still idle at the announced time: "
    text = action_reason.split(": ", 1)[1] if action_reason.split(": ", 1)[0] in {a.value for a in Action} \
        else action_reason
    text = text.removesuffix(f"; {POWER_OFF_BILLING}")  # the notice says it in its own words
    return text[len(head):] if text.startswith(head) else text
