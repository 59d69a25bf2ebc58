"""Budget escalation: an over-budget scope's idle instances go through the safe stop path.

Off by default. A budget with `escalate_idle_to_stop_at: 90` that has spent 90% of its
month records an escalation (in the store, so a restart keeps it). Until the month ends,
an IDLE decision whose rule only notifies, for an instance in that scope, is promoted to
`stop`: the act stage then marks it, warns, and stops it later if still idle, with every
guard of the normal path (dry-run, protect, snooze, cap, transitions). Nothing that is not
IDLE is ever touched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from ..model import UNTAGGED
from ..model import Action, Decision, GpuInstance, Verdict

KV_PREFIX = "budget-escalation:"


@dataclass(frozen=True)
class Escalation:
    budget: str
    period: str  # YYYY-MM
    scope_kind: str  # all | team | project | account | instance_family
    scope_value: str | None
    pct: float  # the spend share that triggered it

    def key(self) -> str:
        return f"{KV_PREFIX}{self.period}:{self.budget}"


def _tag(inst: GpuInstance, keys: Iterable[str]) -> str | None:
    for k in keys:
        if inst.tags.get(k):
            return inst.tags[k]
    return None


def in_scope(inst: GpuInstance, esc: Escalation, tag_keys: Mapping[str, Sequence[str]]) -> bool:
    if esc.scope_kind == "all":
        return True
    if esc.scope_kind == "account":
        return inst.account == esc.scope_value
    if esc.scope_kind == "instance_family":
        return inst.family == esc.scope_value
    value = _tag(inst, tag_keys.get(esc.scope_kind, (esc.scope_kind,)))
    return (value or UNTAGGED) == esc.scope_value


def promote(decisions: Sequence[Decision], by_id: Mapping[str, GpuInstance], escalations: Sequence[Escalation],
            tag_keys: Mapping[str, Sequence[str]]) -> list[Decision]:
    """Pure: notify-only IDLE decisions of escalated scopes become stop decisions, saying why."""
    if not escalations:
        return list(decisions)
    out = []
    for d in decisions:
        inst = by_id.get(d.instance_id)
        if d.verdict == Verdict.IDLE and d.action == Action.NOTIFY and inst is not None:
            hit = next((e for e in escalations if in_scope(inst, e, tag_keys)), None)
            if hit is not None:
                scope = "all" if hit.scope_kind == "all" else f"{hit.scope_kind}={hit.scope_value}"
                d = replace(d, action=Action.STOP, reason=(
                    f"{d.reason}; budget '{hit.budget}' ({scope}) is at {hit.pct:.0f}% of its month: "
                    f"idle instances are escalated to stop"))
        out.append(d)
    return out
