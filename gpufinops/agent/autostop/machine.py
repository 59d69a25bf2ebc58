"""The autostop state machine, pure: (state, what the host looks like now, now) -> Move(kind, reason, next state).

    WATCHING --IDLE, not snoozed, not blocked--> warn --delivered--> PENDING(deadline = now + warning_lead)
    PENDING  --snooze / activity resumed--> cancel --> WATCHING
    PENDING  --UNKNOWN, for less than unknown_grace--> hold (silent; the stop waits)
    PENDING  --IDLE again after such a blip--> the deadline moves later by the blip's length; when it has moved
             STOP_MOVED_NOTICE_S or more since it was announced: "stop moved to ..." (once per idle episode)
    PENDING  --UNKNOWN for unknown_grace or longer--> cancel ("stop held: GPU state unknown since ...") --> WATCHING
             (a later stop needs a new warning and its full lead)
    PENDING  --deadline: still IDLE, not blocked--> STOP (pre-stop hook, then the stop) --> HELD
    PENDING  --blocked at the deadline--> cancel --> WATCHING
    STOPPING (the intent saved, the stop request about to go out) --the answer recorded--> HELD
    STOPPING found by a later run on the same boot (the agent died before the answer was recorded) --> HELD,
             never sent again: one mutating call per intent; a stop that went through takes the host down
    HELD     --activity, or one rule window later--> WATCHING

The one rule about missing data: a stop needs the full warning lead of *known* idle time after a delivered
warning, so time during which the GPU state was UNKNOWN does not count (each blip shorter than the grace moves the
stop later by its length) and an UNKNOWN lasting the grace withdraws the warning. UNKNOWN never stops anything:
the stop is only ever taken on a tick that judged the host IDLE. One warning per idle episode: a blip neither
cancels nor re-warns, so a reader failing one read in five makes no noise (issue 23).

ACTIVE, UNDERUTILIZED and UNKNOWN never start anything. A warning that was not delivered leaves the state as it
was (the driver applies `next_state` of a WARN only when the warning reached someone), so the lead time counts
from a delivered warning. HELD stops a failed hook, a failed stop or a dry-run "would stop" from repeating every
sample: the host is warned again after activity or one rule window.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Mapping, Sequence

from ...model import Decision, Verdict
from .defaults import DEFAULT_UNKNOWN_GRACE_S


class Phase(str, enum.Enum):
    WATCHING = "watching"
    PENDING = "pending"  # warned, waiting for the deadline
    HELD = "held"  # stopped, would-have-stopped or a stop that failed: not warned again for a while
    STOPPING = "stopping"  # the stop's intent is saved and its request sent; its answer not recorded yet


class MoveKind(str, enum.Enum):
    NONE = "none"
    WARN = "warn"
    CANCEL = "cancel"
    STOP = "stop"
    RELEASE = "release"
    HOLD = "hold"  # UNKNOWN shorter than the grace: the pending stop waits, nobody is told
    MOVED = "moved"  # the pending stop moved materially later than announced: said once per episode
    SETTLE = "settle"  # a stop request of an earlier run has no recorded answer: settled as unknown, held


# A stop that moved this much later than the time people were told is announced again ("stop moved to ..."), once
# per idle episode; smaller moves are only logged. Later is harmless (nobody loses work to a late stop), so a
# second notice would only be noise; the stop never moves earlier than announced.
STOP_MOVED_NOTICE_S = 300


@dataclass(frozen=True)
class AutostopState:
    phase: Phase = Phase.WATCHING
    rule: str = ""
    warned_at: float | None = None  # unix seconds of the delivered warning
    deadline: float | None = None  # no stop before this
    held_until: float | None = None
    note: str = ""  # why HELD
    boot_time: float | None = None  # the boot this state belongs to; another boot starts from WATCHING
    live: bool = False  # the warning said "will be stopped" (not a dry-run one, which never counts for a real stop)
    unknown_since: float | None = None  # PENDING: first UNKNOWN judgement of the blip going on now
    told_stop_at: float | None = None  # PENDING: the stop time people were last told
    moved_told: bool = False  # PENDING: "stop moved to ..." was said in this episode (said once)
    action_id: int | None = None  # STOPPING: the intent row of the stop request (buffer.actions)

    def to_json(self) -> dict:
        return {"phase": self.phase.value, "rule": self.rule, "warned_at": self.warned_at, "deadline": self.deadline,
                "held_until": self.held_until, "note": self.note, "boot_time": self.boot_time, "live": self.live,
                "unknown_since": self.unknown_since, "told_stop_at": self.told_stop_at,
                "moved_told": self.moved_told, "action_id": self.action_id}

    @classmethod
    def from_json(cls, data: dict | None) -> "AutostopState":
        if not data:
            return cls()
        try:
            return cls(Phase(data["phase"]), str(data.get("rule") or ""), data.get("warned_at"), data.get("deadline"),
                       data.get("held_until"), str(data.get("note") or ""), data.get("boot_time"),
                       data.get("live") is True, _seconds(data.get("unknown_since")),
                       _seconds(data.get("told_stop_at")), data.get("moved_told") is True,
                       data.get("action_id") if isinstance(data.get("action_id"), int) else None)
        except (KeyError, ValueError, TypeError):
            return cls()  # an unreadable state is a fresh start: the next stop needs a new warning anyway


def _seconds(value) -> float | None:
    """A unix time from the saved state; anything else is None (state written before these fields existed)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Observation:
    decisions: tuple[Decision, ...]  # one per stop rule that selects this host, in rule order
    blocks: tuple[str, ...] = ()  # people typing, allow-listed processes
    snooze: str = ""  # "" = not snoozed, else the snooze in words
    leads: Mapping[str, int] = field(default_factory=dict)  # rule name -> its warning_lead_s
    unknown_grace_s: int = DEFAULT_UNKNOWN_GRACE_S  # UNKNOWN this long withdraws a pending stop


@dataclass(frozen=True)
class Move:
    kind: MoveKind
    reason: str
    next_state: AutostopState
    decision: Decision | None = None


def when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S UTC")


def _summary(decisions: Sequence[Decision]) -> str:
    if not decisions:
        return "no stop rule selects this host"
    return "; ".join(f"{d.rule_name}: {d.verdict.value} ({d.reason})" for d in decisions)


def next_move(state: AutostopState, obs: Observation, now: float) -> Move:
    if state.phase is Phase.STOPPING:
        return _interrupted_stop(state, obs, now)
    if state.phase is Phase.PENDING:
        return _pending(state, obs, now)
    if state.phase is Phase.HELD:
        return _held(state, obs, now)
    idle = next((d for d in obs.decisions if d.verdict is Verdict.IDLE), None)
    if idle is None:
        return Move(MoveKind.NONE, _summary(obs.decisions), state)
    if obs.snooze:
        return Move(MoveKind.NONE, f"idle ({idle.reason}) but {obs.snooze}: no warning", state, idle)
    if obs.blocks:
        return Move(MoveKind.NONE, f"idle ({idle.reason}) but not stopped: {'; '.join(obs.blocks)}", state, idle)
    return _warning(state, idle, obs, now, f"idle under {idle.rule_name}: {idle.reason}")


def _warning(state: AutostopState, idle: Decision, obs: Observation, now: float, why: str) -> Move:
    """A new warning with the rule's full lead (the driver moves the deadline to count from the delivery)."""
    lead = obs.leads.get(idle.rule_name, 900)
    pending = AutostopState(Phase.PENDING, idle.rule_name, warned_at=now, deadline=now + lead,
                            boot_time=state.boot_time, live=state.live, told_stop_at=now + lead)
    return Move(MoveKind.WARN, f"{why}; stop at {when(now + lead)} unless it becomes active", pending, idle)


def _pending(state: AutostopState, obs: Observation, now: float) -> Move:
    watching = AutostopState(boot_time=state.boot_time)
    decision = next((d for d in obs.decisions if d.rule_name == state.rule), None)
    if obs.snooze:
        return Move(MoveKind.CANCEL, f"stop cancelled: {obs.snooze}", watching, decision)
    if decision is None:
        return Move(MoveKind.CANCEL, f"stop cancelled: rule {state.rule} no longer selects this host", watching)
    if decision.verdict in (Verdict.ACTIVE, Verdict.UNDERUTILIZED):
        return Move(MoveKind.CANCEL, f"stop cancelled: activity resumed ({decision.reason})", watching, decision)
    if decision.verdict is not Verdict.IDLE:
        return _unknown_while_pending(state, obs, decision, now, watching)
    if state.unknown_since is not None:
        blip = now - state.unknown_since
        if blip >= obs.unknown_grace_s:
            # No tick fell inside the gap (ticks further apart than the grace): a gap as long as the grace renews
            # the warning, here in one message instead of "held" then "warning" (its key is new: a new episode).
            return _warning(state, decision, obs, now, f"GPU state was unknown for {blip / 60:.0f} min since "
                                                       f"{when(state.unknown_since)}; idle under {state.rule} "
                                                       f"again: {decision.reason}")
        # Unknown time does not count towards the lead: the stop moves later by as long as the state was unknown.
        state = replace(state, unknown_since=None, deadline=(state.deadline or now) + blip)
    deadline = state.deadline if state.deadline is not None else now
    if now < deadline:
        told = state.told_stop_at if state.told_stop_at is not None else deadline
        if not state.moved_told and deadline - told >= STOP_MOVED_NOTICE_S:
            return Move(MoveKind.MOVED, f"stop moved to {when(deadline)} (announced for {when(told)}): the GPU "
                                        f"state was unknown for a while, and unknown time does not count towards "
                                        f"the warning lead", replace(state, told_stop_at=deadline, moved_told=True),
                        decision)
        return Move(MoveKind.NONE, f"stop pending at {when(deadline)}", state, decision)
    if obs.blocks:
        return Move(MoveKind.CANCEL, f"stop cancelled: {'; '.join(obs.blocks)}", watching, decision)
    return Move(MoveKind.STOP, f"still idle at the stop time: {decision.reason}", state, decision)


def _unknown_while_pending(state: AutostopState, obs: Observation, decision: Decision, now: float,
                           watching: AutostopState) -> Move:
    """Missing data is never idle and never stops. A blip shorter than the grace holds the stop without a word (a
    flaky reader must not flood terminals); one that lasts the grace withdraws the warning, said once, and a stop
    after it needs a new warning and its full lead, as the service renews its warnings after missing data."""
    since = state.unknown_since if state.unknown_since is not None else now
    if now - since >= obs.unknown_grace_s:
        return Move(MoveKind.CANCEL, f"stop held: GPU state unknown since {when(since)} ({decision.reason}); "
                                     f"a new warning with its full lead once it reads idle again", watching, decision)
    return Move(MoveKind.HOLD, f"GPU state unknown ({decision.reason}): the stop waits; unknown time does not count "
                               f"towards the warning lead", replace(state, unknown_since=since), decision)


def stopping(state: AutostopState, action_id: int) -> AutostopState:
    """The state saved right before the stop request goes out: its intent row is `action_id`."""
    return replace(state, phase=Phase.STOPPING, action_id=action_id)


def _interrupted_stop(state: AutostopState, obs: Observation, now: float) -> Move:
    """A stop whose request went out (or was about to) and whose answer no run recorded: this run is on the same
    boot, so the host did not go down (yet). Never sent again: HELD for a window, said once (SETTLE)."""
    decision = next((d for d in obs.decisions if d.rule_name == state.rule), None)
    note = ("a stop request of an earlier run of the agent has no recorded answer (the agent stopped meanwhile): "
            "not sent again before a new warning")
    held = AutostopState(Phase.HELD, state.rule, state.warned_at, state.deadline,
                         now + max(decision.window_s if decision else 0, 60), note, state.boot_time, state.live)
    return Move(MoveKind.SETTLE, note, held, decision)


def after_stop(state: AutostopState, decision: Decision, *, note: str, now: float) -> AutostopState:
    """HELD after a stop attempt (done, dry-run, hook failed or stop failed), until activity or one window later."""
    return AutostopState(Phase.HELD, decision.rule_name, state.warned_at, state.deadline,
                         now + max(decision.window_s, 60), note, state.boot_time, state.live)


def _held(state: AutostopState, obs: Observation, now: float) -> Move:
    watching = AutostopState(boot_time=state.boot_time)
    decision = next((d for d in obs.decisions if d.rule_name == state.rule), None)
    if decision is None or decision.verdict in (Verdict.ACTIVE, Verdict.UNDERUTILIZED):
        return Move(MoveKind.RELEASE, "activity since the last stop attempt: watching again", watching, decision)
    if state.held_until is not None and now >= state.held_until:
        return Move(MoveKind.RELEASE, "a rule window since the last stop attempt: watching again", watching, decision)
    return Move(MoveKind.NONE, f"{state.note}; not warned again before {when(state.held_until or now)} "
                               f"unless it becomes active", state, decision)
