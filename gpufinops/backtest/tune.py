"""Tune a fixed rule for a stated cost of a false stop, and check the pick on history it did not see.

Score = net GPU-hours saved minus `cost_h` GPU-hours per false stop (`engine.net_score`). `cost_h` is what the
platform team says a stop that someone needed back costs them (lost work, an annoyed team, a ticket), on top of
the restart itself.

Held out: the fleet's instances are split in two halves; the sweep's candidates are scored on one half, the best is
kept and scored on the other, both ways. The held-out score, beside the clairvoyant-with-lead ceiling of the same
half, is what the pick can be expected to do on instances it has not seen. The rule suggested is then picked on the
whole history.

(A learned per-instance policy was tried here and removed: held out on the shared traces it scored below the tuned
fixed rule on GenTD26 and did not beat it on Helios or Philly; BENCHMARKS.md, "Idle policies: the verdict".)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..model import Rule
from .engine import Prepared, Summary, backtest_rule, net_score, oracle_net_seconds, pct_of_ceiling
from .traces import Trace

Progress = Callable[[str], None]


def cost_score(s: Summary, cost_h: float) -> float:
    """Net GPU-hours saved, minus cost_h for every false stop (`engine.net_score`, the report's score)."""
    return net_score(s.net_gpu_hours, s.false_stops, cost_h)


def ceiling_score(prep: Prepared, rule: Rule, cost_h: float) -> float:
    """The clairvoyant-with-lead ceiling's score on prep for the rule's lead and this false-stop cost."""
    return prep.ceiling(float(rule.warning_lead_s), cost_h).score


def progress_line(done: int, total: int, started: float, now: float, what: str) -> str:
    """`[#####.....] 12/40 rules, 8 s left` — the ETA from the mean time per step so far."""
    width = 20
    filled = int(width * done / total) if total else width
    bar = "#" * filled + "." * (width - filled)
    left = (now - started) / done * (total - done) if done else None
    eta = "" if left is None else f", {left:.0f} s left" if left >= 1 else ", <1 s left"
    return f"[{bar}] {done}/{total} {what}{eta}"


def best_fixed(prep: Prepared, candidates: Sequence[Rule], cost_h: float, progress: Progress | None = None,
               label: str = "", clock: Callable[[], float] = time.monotonic) -> Summary:
    """The candidate with the best score on prep (the first of equals, in the sweep's order)."""
    oracle = oracle_net_seconds(prep)
    started = clock()
    best: Summary | None = None
    for k, rule in enumerate(candidates, 1):
        s = backtest_rule(prep, rule, oracle)[0]
        if best is None or cost_score(s, cost_h) > cost_score(best, cost_h) + 1e-9:
            best = s
        if progress and (k == 1 or k == len(candidates) or k % 5 == 0):
            progress(progress_line(k, len(candidates), started, clock(), f"rules{label}"))
    assert best is not None, "no candidates"
    return best


@dataclass(frozen=True)
class Holdout:
    """One direction: picked on one half, scored on the other."""

    label: str  # the half it was scored on, e.g. "B"
    cost_h: float
    picked: Summary  # on the tuning half
    test: Summary  # the same rule on the held-out half
    ceiling_score: float  # the clairvoyant-with-lead ceiling on the held-out half, same lead and cost

    @property
    def score(self) -> float:
        return cost_score(self.test, self.cost_h)

    @property
    def pct_of_ceiling(self) -> float:
        return pct_of_ceiling(self.score, self.ceiling_score)


def holdout(tune_prep: Prepared, test_prep: Prepared, candidates: Sequence[Rule], cost_h: float, label: str = "",
            progress: Progress | None = None) -> Holdout:
    picked = best_fixed(tune_prep, candidates, cost_h, progress, label=f" (tuning for half {label})")
    rule = picked.rule
    assert rule is not None
    test = backtest_rule(test_prep, rule, oracle_net_seconds(test_prep))[0]
    return Holdout(label=label, cost_h=cost_h, picked=picked, test=test,
                   ceiling_score=ceiling_score(test_prep, rule, cost_h))


def split_halves(trace: Trace) -> tuple[Trace, Trace]:
    """Every other instance (by id), so that both halves see the same days and the same mix of workloads."""
    order = np.argsort(np.asarray(trace.instance_ids, dtype=object))
    return trace.select(np.sort(order[0::2])), trace.select(np.sort(order[1::2]))
