"""What the report advises for an instance, from the same rules and tags the act stage reads (issue 26, item 3).

No second copy of the policy: the protect tag is `GpuInstance.is_protected`, the snooze `act.plan.snooze_of`,
what else manages it or a spot instance `act.plan.stop_blocker`, the opt-in `act.plan.opt_in_gap`, and a rule's
exclusions its own `Selector.matches`. The instance is rebuilt from what the service last recorded of it
(`store.rollups.instance_from_label`). Pure: no I/O.

Advice is one of ADVICE. There is no "schedule" advice: gpufinops has no time-window schedules, so it never
advises one (docs/report.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from ..act.plan import opt_in_gap, snooze_of, stop_blocker
from ..config import ActSettings
from ..model import TAG_PROTECT, Action, GpuInstance, Rule, format_duration
from ..store.rollups import instance_from_label

STOP = "stop when idle"
OPT_IN = "opt in to stopping"
RIGHTSIZE = "right-size"
NONE = "none"
ADVICE = (STOP, OPT_IN, RIGHTSIZE, NONE)


@dataclass(frozen=True)
class Advice:
    advice: str  # one of ADVICE
    why: str  # in words, always said

    @property
    def stops(self) -> bool:
        return self.advice == STOP


def _excluded_by(rule: Rule, inst: GpuInstance) -> str:
    """Why a stop rule's selector leaves this instance out, in words (the first reason found)."""
    sel = rule.selector
    for key, banned in sel.exclude_tags.items():
        if key in inst.tags and ("*" in banned or inst.tags[key] in banned):
            return f"tag {key}={inst.tags[key]}"
    for key, allowed in sel.tags.items():
        if key not in inst.tags or ("*" not in allowed and inst.tags[key] not in allowed):
            return f"no tag {key}={'|'.join(allowed)}"
    return "its type, account or region"


def advise(label: dict | None, rules: Sequence[Rule], act: ActSettings, as_of: datetime,
           rightsizing: bool = False) -> Advice:
    """The advice for one instance as the service last saw it (`label`: its instance_labels row), as of `as_of`.
    `rightsizing`: the latest recommendation run has a right-size move for it (what fits an instance that must
    not be stopped)."""
    other = RIGHTSIZE if rightsizing else NONE
    inst = instance_from_label(label) if label else None
    if inst is None:
        return Advice(NONE, "its tags were not recorded (evaluated before this release): whether a rule may stop "
                            "it is unknown, so no stop is advised")
    if inst.is_protected:
        return Advice(other, f"protected by tag {TAG_PROTECT}={inst.tags[TAG_PROTECT]}: never stopped")
    # The snooze as it stood when the service last saw the instance (a report on a past month: not today's).
    seen = label.get("last_seen")
    snooze = snooze_of(inst, min(as_of, seen) if seen is not None else as_of, max_snooze_s=act.max_snooze_s)
    if snooze.active:
        return Advice(other, f"its owner snoozed it: {snooze.reason}")
    stop_rules = [r for r in rules if r.action != Action.NOTIFY]
    if not stop_rules:
        return Advice(other, "no rule stops instances (every rule only notifies)")
    selected = [r for r in stop_rules if r.selector.matches(inst)]
    if not selected:
        why = "; ".join(f"excluded from stop rule {r.name} by {_excluded_by(r, inst)}" for r in stop_rules)
        return Advice(other, f"{why}: only notified when idle, never stopped")
    rule = selected[0]
    blocker = stop_blocker(inst, rule.action)
    if blocker:
        return Advice(other, blocker)
    gap = opt_in_gap(inst, act.opt_in_tag, act.opt_in_value)
    if gap:
        return Advice(OPT_IN, gap)
    return Advice(STOP, f"rule {rule.name} stops it after {format_duration(rule.window_s)} idle, "
                        f"{format_duration(rule.warning_lead_s)} after a warning")


__all__ = ["ADVICE", "Advice", "NONE", "OPT_IN", "RIGHTSIZE", "STOP", "advise"]
