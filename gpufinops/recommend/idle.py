"""What can honestly be said before the right-sizing window is full, and what to do with a GPU that never works.

Right-sizing needs `recommend.window_days` (14) of samples: a smaller GPU chosen on a day of history would miss
the weekly job that needs the big one. But some things hold on day one (issue 26):

- an instance whose every GPU was measured and none ever worked (max activity under `worked_activity_pct`) over
  at least MIN_IDLE_HISTORY_H is advised to be **stopped when idle**, never moved to a smaller GPU: a GPU that does
  no work costs the same on any size, and stopping saves all of it. gpufinops has no scheduling feature, so no
  schedule is advised. The advice respects what the service respects (act.plan): a protected instance, one that
  something else manages (stop_blocker), and one that no stop rule selects (the rules' exclusions) get no stop
  advice; one without the opt-in tag is told to carry it (opt_in_gap);
- an instance that did work, with less than the window: "insufficient data", with the history's length, a
  confidence, and what was seen so far (peak memory, p95 activity), no downsizing.

Confidence of what a history shows: under a day "low" (a daily job may not have run yet), under a week "medium"
(a weekly one may not have), a week or more "high". Pure: values in, values out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from gpufinops.act.plan import opt_in_gap, stop_blocker
from gpufinops.model import TAG_PROTECT, Action, GpuInstance, Rule
from gpufinops.recommend.policy import RecommendPolicy
from gpufinops.recommend.usage import LongUsage

MIN_IDLE_HISTORY_H = 1.0  # less than the shortest shipped rule window says nothing about idleness
DEFAULT_OPT_IN = ("gpufinops:allow-stop", "true")  # act.opt_in_tag / opt_in_value defaults


@dataclass(frozen=True)
class History:
    hours: float  # measured history of the least-covered GPU
    window_hours: float
    confidence: str  # low | medium | high

    def describe(self) -> str:
        return (f"{_span(self.hours)} of history of the {_span(self.window_hours)} right-sizing looks at "
                f"(confidence {self.confidence})")


def _span(hours: float) -> str:
    return f"{hours:.0f} h" if hours < 48 else f"{hours / 24:.0f} d"


def confidence(hours: float) -> str:
    return "low" if hours < 24 else "medium" if hours < 7 * 24 else "high"


def history(usage: LongUsage | None) -> History | None:
    """How much measured history the instance has: samples of its least-covered GPU x the scrape interval."""
    if usage is None or usage.error or not usage.gpus or usage.expected_samples <= 0:
        return None
    interval_s = usage.window_s / usage.expected_samples
    hours = min(g.samples for g in usage.gpus) * interval_s / 3600
    return History(min(hours, usage.window_s / 3600), usage.window_s / 3600, confidence(hours))


def never_worked(usage: LongUsage, gpu_count: int, policy: RecommendPolicy) -> bool:
    """Every GPU measured (none missing, activity known) and none reached worked_activity_pct."""
    if len(usage.gpus) < max(1, gpu_count):
        return False
    return all(g.activity_max is not None and g.activity_max < policy.worked_activity_pct for g in usage.gpus)


def seen_so_far(usage: LongUsage) -> str:
    peak = usage.peak_mem_mib
    p95 = [g.activity_p95 for g in usage.gpus if g.activity_p95 is not None]
    parts = [f"peak memory {peak / 1024:,.1f} GiB per GPU" if peak is not None else "memory not measured",
             f"p95 activity {max(p95):.0f}%" if p95 else "activity not measured"]
    return "so far " + ", ".join(parts)


@dataclass(frozen=True)
class StopAdvice:
    action: str  # stop_when_idle (advised) | idle_kept (idle, but gpufinops must not stop it: say why)
    recommended: str
    reason: str


def stop_advice(inst: GpuInstance, rules: Sequence[Rule] | None, opt_in: tuple[str, str] = DEFAULT_OPT_IN) -> StopAdvice:
    """What to advise for an instance that does no work, with the service's own guards (act.plan)."""
    if inst.is_protected:
        return StopAdvice("idle_kept", "-", f"idle, but protected by tag {TAG_PROTECT}={inst.tags[TAG_PROTECT]!r}: "
                                            f"no stop advised; remove the tag if it is not needed")
    blocker = stop_blocker(inst, Action.STOP)
    if blocker:
        return StopAdvice("idle_kept", "-", f"idle, but {blocker}")
    if rules is not None:
        selecting = [r for r in rules if r.action in (Action.STOP, Action.TERMINATE) and r.selector.matches(inst)]
        if not selecting:
            return StopAdvice("idle_kept", "-", "idle, but no stop rule selects it (excluded or not matched by the "
                                                "rules): no stop advised")
        rule_note = f"rule {selecting[0].name} stops it when idle"
    else:
        rule_note = "the rules were not checked for exclusions"
    gap = opt_in_gap(inst, *opt_in)
    if gap:
        return StopAdvice("stop_when_idle", f"stop when idle: opt it in with {opt_in[0]}={opt_in[1]}",
                          f"idle: stop it when idle rather than a smaller GPU; {gap} ({rule_note} once opted in)")
    return StopAdvice("stop_when_idle", "stop when idle (opted in)",
                      f"idle: stop it when idle rather than a smaller GPU; {rule_note}")
