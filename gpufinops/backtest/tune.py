"""Tune a fixed rule and a learned block for the same stated cost of a false stop; compare them on held-out history.

The score both are tuned for is the one the learned policy optimises stretch by stretch: net GPU-hours saved
minus `cost_h` GPU-hours per false stop. `cost_h` is what the platform team says a stop that someone needed back
costs them (lost work, an annoyed team, a ticket), on top of the restart itself.

Held out: the fleet's instances are split in two halves; each candidate is tuned on one half and scored on the
other, both ways. A learned block is recommended when its held-out score, over both halves together, is higher than
the fixed rule's; otherwise (a tie included) the fixed rule, which is simpler to reason about. The learned block
need not win on each half: where its learned wait does worse on an instance, that instance's earned trust hands
the decision to the fixed wait.

The learned block is tuned as the service runs it, holding its rule's IDLE back (`hold_back_only`), so the figures
are the ones a `learned:` rule file would give. It sits either on a 5-minute rule at the demand level (free to stop
a lull early when the history says it will be long) or on the fixed pick itself (it can then only hold the pick's
stops back, where the history says the lull will be short). Every learned setting carries the fixed pick's window
as its `trust_wait`: on an instance where the learned wait has done worse than that fixed wait over the instance's
own past lulls, the fixed wait decides (earned trust, `adaptive.Trust`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from ..model import Action, Aggregation, Rule
from .adaptive import AdaptiveParams, backtest_adaptive
from .engine import (BacktestSettings, Prepared, Summary, backtest_rule, net_score, oracle_net_seconds,
                     pct_of_ceiling, rule_verdicts)
from .sweep import duration_text, rule_doc, rule_file_text
from .traces import Trace

PAIRING_WINDOW_S = 300  # the rule a learned block sits on: at or under the demand level for 5 minutes
UNUSUAL_WAITS_S = (600.0, 1800.0, 3600.0, 7200.0)
RESTART_GRACES_S = (0.0, 7200.0)
MIN_SUPPORTS = (3.0, 8.0)
COST_FACTORS = (0.5, 1.0, 2.0)  # the policy's own false-stop cost, around the stated one
FLEET_PRIOR = 10.0


def cost_score(s: Summary, cost_h: float) -> float:
    """Net GPU-hours saved, minus cost_h for every false stop (`engine.net_score`, the report's score)."""
    return net_score(s.net_gpu_hours, s.false_stops, cost_h)


def ceiling_score(prep: Prepared, rule: Rule, cost_h: float) -> float:
    """The clairvoyant-with-lead ceiling's score on prep for the rule's lead and this false-stop cost."""
    return prep.ceiling(float(rule.warning_lead_s), cost_h).score


def live_pairing(base: Rule, demand_pct: float) -> Rule:
    """The rule a learned block sits on: stays at or under the demand level for 5 minutes (base's lead, scope)."""
    return replace(base, name=f"below-{demand_pct:g}pct-5m-learned", threshold_pct=demand_pct,
                   window_s=PAIRING_WINDOW_S, aggregation=Aggregation.STAYS_BELOW, action=Action.STOP)


def learned_grid(cost_h: float, trust_wait_s: float | None = None) -> list[AdaptiveParams]:
    """The learned settings tried for one stated cost (48, on each of the two rules a block can sit on).
    trust_wait_s: the fixed wait an instance falls back on where the learned wait has done worse on its own past
    (`tune` passes the fixed pick's window)."""
    return [AdaptiveParams(false_stop_cost_h=cost_h * f, prior_weight=FLEET_PRIOR, min_support=n, unusual_wait_s=w,
                           restart_grace_s=g, trust_wait_s=trust_wait_s)
            for f, n, w, g in itertools.product(COST_FACTORS, MIN_SUPPORTS, UNUSUAL_WAITS_S, RESTART_GRACES_S)]


def setting_text(t: "Tuned") -> str:
    """The tuned learned block, short: the rule it sits on and its knobs."""
    p = t.params
    grace = duration_text(int(p.restart_grace_s)) if p.restart_grace_s > 0 else "0"
    trust = "" if p.trust_wait_s is None else f", trust wait {duration_text(int(p.trust_wait_s))}"
    return (f"on {t.pairing.name.removesuffix('-learned')}: false stop {p.false_stop_cost_h:g} GPU-h, unusual wait "
            f"{duration_text(int(p.unusual_wait_s or 0))}, restart grace {grace}, support {p.min_support:g}{trust}")


@dataclass(frozen=True)
class Tuned:
    """What one piece of history picks for the cost: the best fixed rule and learned block, with their summaries."""

    cost_h: float
    fixed: Summary
    learned: Summary
    params: AdaptiveParams
    pairing: Rule
    settings: BacktestSettings


def tune(prep: Prepared, base: Rule, candidates: Sequence[Rule], cost_h: float,
         grid: Sequence[AdaptiveParams] | None = None, progress: Callable[[str], None] | None = None,
         memo: dict | None = None) -> Tuned:
    """The fixed candidate and the learned setting with the best score on prep. memo: summaries already computed
    on this same prep and base rule, by rule name or setting (several costs share most of them)."""
    memo = {} if memo is None else memo
    oracle = oracle_net_seconds(prep)

    def fixed_summary(r: Rule) -> Summary:
        if r.name not in memo:  # rules hold dicts (selectors): keyed by name, unique in a sweep
            memo[r.name] = backtest_rule(prep, r, oracle)[0]
        return memo[r.name]

    def learned_summary(pairing: Rule, p: AdaptiveParams) -> Summary:
        if (pairing.name, p) not in memo:
            if (pairing.name, "verdicts") not in memo:
                memo[(pairing.name, "verdicts")] = rule_verdicts(prep, pairing)
            memo[(pairing.name, p)] = backtest_adaptive(prep, pairing, p, oracle, memo[(pairing.name, "verdicts")],
                                                        hold_back_only=True)[0]
        return memo[(pairing.name, p)]

    fixed = max((fixed_summary(r) for r in candidates), key=lambda s: cost_score(s, cost_h))
    assert fixed.rule is not None
    # The block on a 5-minute demand-level rule (free to stop early), or on the fixed pick (it can only hold back).
    pairings = [live_pairing(base, prep.settings.demand_pct), replace(fixed.rule, name=f"{fixed.rule.name}-learned")]
    grid = list(grid or learned_grid(cost_h, float(fixed.rule.window_s)))
    best: tuple[float, Summary, AdaptiveParams, Rule] | None = None
    for k, (pairing, p) in enumerate(itertools.product(pairings, grid), 1):
        if progress and (k == 1 or k % 24 == 0):
            progress(f"learned setting {k}/{len(grid) * len(pairings)}")
        s = learned_summary(pairing, p)
        if best is None or cost_score(s, cost_h) > best[0] + 1e-9:
            best = (cost_score(s, cost_h), s, p, pairing)
    assert best is not None
    return Tuned(cost_h=cost_h, fixed=fixed, learned=best[1], params=best[2], pairing=best[3], settings=prep.settings)


@dataclass(frozen=True)
class Holdout:
    """One direction: tuned on one half, scored on the other."""

    label: str  # the half it was scored on, e.g. "B"
    tuned: Tuned
    fixed_test: Summary
    learned_test: Summary
    ceiling_score: float = 0.0  # the clairvoyant-with-lead ceiling on the held-out half, same lead and cost

    @property
    def fixed_score(self) -> float:
        return cost_score(self.fixed_test, self.tuned.cost_h)

    @property
    def learned_score(self) -> float:
        return cost_score(self.learned_test, self.tuned.cost_h)

    @property
    def fixed_pct_of_ceiling(self) -> float:
        return pct_of_ceiling(self.fixed_score, self.ceiling_score)

    @property
    def learned_pct_of_ceiling(self) -> float:
        return pct_of_ceiling(self.learned_score, self.ceiling_score)

    @property
    def learned_ahead(self) -> bool:
        return self.learned_score > self.fixed_score + 1e-9


def holdout(tune_prep: Prepared, test_prep: Prepared, base: Rule, candidates: Sequence[Rule], cost_h: float,
            label: str = "", grid: Sequence[AdaptiveParams] | None = None,
            progress: Callable[[str], None] | None = None, memo: dict | None = None) -> Holdout:
    """memo: as for `tune`, for tune_prep."""
    t = tune(tune_prep, base, candidates, cost_h, grid, progress, memo)
    oracle = oracle_net_seconds(test_prep)
    fixed_rule = t.fixed.rule
    assert fixed_rule is not None
    fixed_test = backtest_rule(test_prep, fixed_rule, oracle)[0]
    learned_test = backtest_adaptive(test_prep, t.pairing, t.params, oracle, hold_back_only=True,
                                     name=f"{t.pairing.name} (learned, tuned)")[0]
    return Holdout(label=label, tuned=t, fixed_test=fixed_test, learned_test=learned_test,
                   ceiling_score=ceiling_score(test_prep, fixed_rule, cost_h))


def split_halves(trace: Trace) -> tuple[Trace, Trace]:
    """Every other instance (by id), so that both halves see the same days and the same mix of workloads."""
    order = np.argsort(np.asarray(trace.instance_ids, dtype=object))
    return trace.select(np.sort(order[0::2])), trace.select(np.sort(order[1::2]))


def held_out_gain(results: Sequence[Holdout]) -> float:
    """The learned block's held-out score minus the fixed rule's, over all the held-out halves together."""
    return sum(h.learned_score - h.fixed_score for h in results)


def recommend_learned(results: Sequence[Holdout]) -> bool:
    """The learned block where it scores higher than the fixed rule over the held-out halves together.

    On the shared traces (BENCHMARKS.md) this call, made on one half of each and checked on the other, gained more
    than requiring a win on every half, which rarely shows on a small fleet."""
    return bool(results) and held_out_gain(results) > 1e-9


def learned_rule_yaml(t: Tuned, comment: str = "") -> str:
    """The tuned learned block on its rule, as a rule file (`gpufinops rules check` accepts it). The
    block carries the backtest's demand level, break-even and restart cost: live, it must judge as it was tuned."""
    p, s, bt = t.params, t.learned, t.settings

    def off_or(seconds: float) -> str | int:
        return duration_text(int(seconds)) if seconds > 0 else 0

    entry = rule_doc(t.pairing, f"Learned idle policy tuned by gpufinops backtest for a false-stop cost of "
                                f"{t.cost_h:g} GPU-h: net {s.net_gpu_hours:.1f} GPU-h saved, false-stop rate "
                                f"{s.false_stop_rate:.0%}")
    entry["learned"] = {
        "demand_pct": bt.demand_pct,
        "break_even": duration_text(int(bt.break_even_s)),
        "restart_cost": duration_text(int(bt.restart_cost_s)),
        "false_stop_cost_h": p.false_stop_cost_h,
        "fleet_prior": p.prior_weight,
        "min_support": p.min_support,
        "unusual_wait": off_or(p.unusual_wait_s or bt.break_even_s),
        "restart_grace": off_or(p.restart_grace_s),
        "time_of_day": off_or(p.time_of_day_s),
    }
    if p.trust_wait_s is not None:
        entry["learned"]["trust_wait"] = duration_text(int(p.trust_wait_s))
        entry["learned"]["trust_margin_h"] = p.trust_margin_h
    return rule_file_text([entry], comment)
