"""The autostop state machine, pure: (state, what the host looks like now, now) -> Move(kind, reason, next state).

    WATCHING --IDLE, not snoozed, not blocked--> warn --delivered--> PENDING(deadline = now + warning_lead)
    PENDING  --snooze / activity resumed--> cancel --> WATCHING
    PENDING  --deadline: still IDLE, not blocked--> STOP (pre-stop hook, then the stop) --> HELD
    PENDING  --UNKNOWN at any time, or blocked at the deadline--> cancel --> WATCHING   (a later stop needs a new
             warning and its full lead)
    HELD     --activity, or one rule window later--> WATCHING

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

from ..model import Decision, Verdict


class Phase(str, enum.Enum):
    WATCHING = "watching"
    PENDING = "pending"  # warned, waiting for the deadline
    HELD = "held"  # stopped, would-have-stopped or a stop that failed: not warned again for a while


class MoveKind(str, enum.Enum):
    NONE = "none"
    WARN = "warn"
    CANCEL = "cancel"
    STOP = "stop"
    RELEASE = "release"


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

    def to_json(self) -> dict:
        return {"phase": self.phase.value, "rule": self.rule, "warned_at": self.warned_at, "deadline": self.deadline,
                "held_until": self.held_until, "note": self.note, "boot_time": self.boot_time, "live": self.live}

    @classmethod
    def from_json(cls, data: dict | None) -> "AutostopState":
        if not data:
            return cls()
        try:
            return cls(Phase(data["phase"]), str(data.get("rule") or ""), data.get("warned_at"), data.get("deadline"),
                       data.get("held_until"), str(data.get("note") or ""), data.get("boot_time"),
                       data.get("live") is True)
        except (KeyError, ValueError, TypeError):
            return cls()  # an unreadable state is a fresh start: the next stop needs a new warning anyway


@dataclass(frozen=True)
class Observation:
    decisions: tuple[Decision, ...]  # one per stop rule that selects this host, in rule order
    blocks: tuple[str, ...] = ()  # people typing, allow-listed processes
    snooze: str = ""  # "" = not snoozed, else the snooze in words
    leads: Mapping[str, int] = field(default_factory=dict)  # rule name -> its warning_lead_s


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
    lead = obs.leads.get(idle.rule_name, 900)
    pending = replace(state, phase=Phase.PENDING, rule=idle.rule_name, warned_at=now, deadline=now + lead,
                      held_until=None, note="")
    return Move(MoveKind.WARN, f"idle under {idle.rule_name}: {idle.reason}; stop at {when(now + lead)} "
                               f"unless it becomes active", pending, idle)


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
        # Missing data is never idle, and what happened during a gap is not known: the warning is withdrawn, and a
        # stop after the gap needs a new warning and its full lead, as the service renews its warnings.
        return Move(MoveKind.CANCEL, f"stop cancelled: GPU state unknown ({decision.reason}); "
                                     f"a later stop needs a new warning", watching, decision)
    if state.deadline is None or now < state.deadline:
        return Move(MoveKind.NONE, f"stop pending at {when(state.deadline or now)}", state, decision)
    if obs.blocks:
        return Move(MoveKind.CANCEL, f"stop cancelled: {'; '.join(obs.blocks)}", watching, decision)
    return Move(MoveKind.STOP, f"still idle at the stop time: {decision.reason}", state, decision)


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
