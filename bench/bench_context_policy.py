"""Issue 12 part 1: does a context-feature idle policy beat the tuned fixed rule, held out, on every shared trace?

    python bench/bench_context_policy.py     # a few minutes on 2 cores

The context policy sits on a base fixed rule from the 40-rule sweep. An instance is judged IDLE (its warning
starts) when EITHER the base rule says IDLE, OR all of these hold:
- it has been idle for at least w by the base rule's own predicate (the base rule with its window cut to w:
  same threshold, aggregation, coverage and memory veto);
- its busy share, the fraction of valid samples at or above the base rule's threshold in the 3 h before the
  current lull began (the lull begins after the last such sample), is <= b;
- the fleet-idle share, the fraction of the trace half's other live instances already idle for 15 min (the base
  predicate over 15 min) at that tick, is >= f (f = 0: no fleet condition).
Once the condition has held in a lull, the lull stays IDLE while the w-window predicate holds (a fleet that wakes
up does not cancel a warning already sent; activity does). The context branch only turns a verdict the base rule
could judge (ACTIVE / UNDERUTILIZED) into IDLE: missing data, too few samples or a too-young instance stay UNKNOWN
and never stop. Missing history (a busy share over less than min_coverage of 3 h) never satisfies the condition.

The verdicts then go through the engine's own `replay` with the base rule's 15-min lead and its window as the grace
after a restart, exactly as `backtest_rule` does for the fixed rule, and `summarise` scores them (net GPU-h - 2 x
false stops, false stop = demand within 30 min of the stop, % of the clairvoyant-with-lead ceiling).

Held out, as `bench_backtest.py --ceiling`: the same halves (GenTD26 pods by position, Helios VCs alternately,
Philly ranks alternately); the fixed pick is the sweep's best score on one half, scored on the other; the context
policy's base rule (one of the tuning half's 3 best fixed rules), w, b and f are picked by score on the same half
and scored on the other; both directions.
"""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpufinops.backtest.engine import (  # noqa: E402
    ACTIVE, IDLE, UNDERUTILIZED, BacktestSettings, Prepared, Summary, backtest_rule, oracle_net_seconds, replay,
    rule_verdicts, summarise,
)
from gpufinops.backtest.sweep import candidates, run_sweep  # noqa: E402
from gpufinops.model import FALSE_STOP_COST_H, Rule  # noqa: E402
from gpufinops.rules import load_rules  # noqa: E402

LOOKBACK_S = 3 * 3600.0  # busy share: the 3 h before the lull began
FLEET_IDLE_S = 900.0  # fleet-idle share: instances idle for at least 15 min
TOP_BASES = 3  # the context policy may sit on any of the tuning half's 3 best fixed rules
W_S = (300, 600, 1200)
B = (0.02, 0.05, 0.1, 0.2)
F = (0.0, 0.3, 0.5, 0.7)
AUC_IDLE_S = 300.0  # the AUC's decision point: 5 min into a lull


# --------------------------------------------------------------------------- traces: the same halves as bench_backtest.py
from bench_backtest import gentd26, helios, philly  # noqa: E402

TRACES = (("GenTD26", gentd26), ("Helios", helios), ("Philly", philly))


# --------------------------------------------------------------------------- features


def rows_take(a: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """a[i, cols[i, j]] for every row i (cols has a's row count)."""
    return np.take_along_axis(a, cols, axis=1)


def last_index(mask: np.ndarray) -> np.ndarray:
    """For each column, the last column <= it where mask is true (-1 where none), row-wise."""
    return np.maximum.accumulate(np.where(mask, np.arange(mask.shape[1]), -1), axis=1)


@dataclass(frozen=True)
class LullHistory:
    """Per instance and tick, for one threshold: where the current lull began and how busy the 3 h before it were."""

    lull_start: np.ndarray  # sample index of the lull's first sample (after the last sample at/over the threshold)
    busy_share: np.ndarray  # float; NaN where under min_coverage of the 3 h has data


def lull_history(prep: Prepared, activity: np.ndarray, threshold_pct: float, min_coverage: float) -> LullHistory:
    tr = prep.trace
    valid = ~np.isnan(activity)
    with np.errstate(invalid="ignore"):
        busy = activity >= threshold_pct  # the complement of "under the threshold" (stays_below's idle sample)
    now = np.broadcast_to(prep.grid.hi - 1, (tr.n_instances, len(prep.grid.hi)))  # last sample at or before the tick
    lull_start = rows_take(last_index(busy), now) + 1
    span = int(round(LOOKBACK_S / tr.step_s))
    lo = np.maximum(lull_start - span, 0)
    zero = np.zeros((tr.n_instances, 1))
    n_busy = np.concatenate([zero, np.cumsum(busy, axis=1)], axis=1)
    n_valid = np.concatenate([zero, np.cumsum(valid, axis=1)], axis=1)
    got_busy = rows_take(n_busy, lull_start) - rows_take(n_busy, lo)
    got_valid = rows_take(n_valid, lull_start) - rows_take(n_valid, lo)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(got_valid >= min_coverage * span - 1e-9, got_busy / np.maximum(got_valid, 1), np.nan)
    return LullHistory(lull_start=lull_start, busy_share=share)


def fleet_idle_share(prep: Prepared, idle_long: np.ndarray) -> np.ndarray:
    """Per instance and tick: the share of the other live instances idle for FLEET_IDLE_S (NaN: no other)."""
    idle_long = idle_long & prep.alive
    others_idle = idle_long.sum(axis=0)[None, :] - idle_long
    others_alive = prep.alive.sum(axis=0)[None, :] - prep.alive
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(others_alive > 0, others_idle / np.maximum(others_alive, 1), np.nan)


class Features:
    """Everything the context policy reads on one prepared half, computed once per base threshold/predicate."""

    def __init__(self, prep: Prepared):
        self.prep = prep
        self.activity = prep.trace.instance_activity_max()
        self.oracle = oracle_net_seconds(prep)
        self._verdicts: dict = {}
        self._lulls: dict = {}
        self._fleet: dict = {}

    def verdicts(self, rule: Rule, window_s: float) -> np.ndarray:
        key = (rule.threshold_pct, rule.aggregation, rule.min_coverage, rule.max_memory_mib, window_s)
        if key not in self._verdicts:
            self._verdicts[key] = rule_verdicts(self.prep, replace(rule, window_s=int(window_s)))
        return self._verdicts[key]

    def lulls(self, rule: Rule) -> LullHistory:
        key = (rule.threshold_pct, rule.min_coverage)
        if key not in self._lulls:
            self._lulls[key] = lull_history(self.prep, self.activity, rule.threshold_pct, rule.min_coverage)
        return self._lulls[key]

    def fleet(self, rule: Rule) -> np.ndarray:
        key = (rule.threshold_pct, rule.aggregation, rule.min_coverage, rule.max_memory_mib)
        if key not in self._fleet:
            self._fleet[key] = fleet_idle_share(self.prep, self.verdicts(rule, FLEET_IDLE_S) == IDLE)
        return self._fleet[key]


# --------------------------------------------------------------------------- the policy


@dataclass(frozen=True)
class ContextParams:
    base: Rule
    w_s: int
    b: float
    f: float

    @property
    def text(self) -> str:
        return f"on {self.base.name}: idle {self.w_s // 60} min, busy <= {self.b:.0%}, fleet idle >= {self.f:.0%}"


def context_condition(feat: Features, p: ContextParams) -> np.ndarray:
    """Where the context branch fires: idle for w, a quiet 3 h before the lull, and enough of the fleet idle."""
    short_idle = feat.verdicts(p.base, p.w_s) == IDLE
    with np.errstate(invalid="ignore"):
        quiet = feat.lulls(p.base).busy_share <= p.b  # NaN (no history) is never quiet
        fleet_ok = np.ones_like(short_idle) if p.f <= 0 else feat.fleet(p.base) >= p.f
    return short_idle & quiet & fleet_ok


def context_verdicts(feat: Features, p: ContextParams) -> np.ndarray:
    """The base rule's verdicts, with IDLE wherever the context branch has fired earlier in the same w-idle run."""
    base = feat.verdicts(p.base, p.base.window_s)
    short_idle = feat.verdicts(p.base, p.w_s) == IDLE
    run_start = last_index(~short_idle) + 1
    latched = short_idle & (last_index(context_condition(feat, p)) >= run_start)
    out = base.copy()
    out[latched & ((base == ACTIVE) | (base == UNDERUTILIZED))] = IDLE  # UNKNOWN stays UNKNOWN
    return out


def backtest_context(feat: Features, p: ContextParams):
    rule = p.base
    rep = replay(feat.prep, context_verdicts(feat, p), rule.warning_lead_s, rule.window_s)
    return summarise(f"context {p.text}", feat.prep, rep, rule, feat.oracle), rep


def grid(bases: list[Rule]) -> list[ContextParams]:
    return [ContextParams(base=r, w_s=w, b=b, f=f) for r, w, b, f in itertools.product(bases, W_S, B, F)]


def reason_text(idle_min: float, busy_share: float, fleet_share: float, lead_s: int) -> str:
    fleet = "" if np.isnan(fleet_share) else f" and {fleet_share:.0%} of the fleet idle"
    return (f"idle {idle_min:.0f} min; busy {busy_share:.0%} of the last 3 h{fleet}: stopping after the "
            f"{lead_s // 60}-min warning")


def example_reason(feat: Features, p: ContextParams, rep) -> str | None:
    """The reason of one stop the context branch made (its mark came where the base rule was not yet IDLE)."""
    a, prep = rep.arrays, feat.prep
    base = feat.verdicts(p.base, p.base.window_s)
    ticks = np.searchsorted(prep.grid.times, a["mark_at"])
    early = np.flatnonzero(base[a["instance"], ticks] != IDLE)
    if not len(early):
        return None
    k = early[np.argmin(a["false_stop"][early])]  # a good stop if there is one
    i, m = int(a["instance"][k]), int(ticks[k])
    hist = feat.lulls(p.base)
    since = prep.trace.t0 + (hist.lull_start[i, m] - 1) * prep.trace.step_s  # the last busy sample's time
    return reason_text((prep.grid.times[m] - since) / 60, float(hist.busy_share[i, m]), float(feat.fleet(p.base)[i, m]),
                       p.base.warning_lead_s)


# --------------------------------------------------------------------------- AUC of the features


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """Mann-Whitney AUC (ties count half): P(score of a positive > score of a negative)."""
    pos, neg = int(label.sum()), int((~label).sum())
    if not pos or not neg:
        return float("nan")
    ranks = pd.Series(score).rank(method="average").to_numpy()
    return float((ranks[label].sum() - pos * (pos + 1) / 2) / (pos * neg))


def feature_auc(feat: Features, rule: Rule, lead_s: float) -> tuple[int, float, float, float]:
    """At 5 min into every lull (no sample at/over the rule's threshold), how well do the two features tell a lull
    that lasts at least lead + break-even more (a warning sent now would not stop falsely) from one that does not?
    Returns (lulls, positive share, AUC of -busy share, AUC of fleet-idle share); lulls with missing features or
    cut short by the end of the history are left out."""
    prep = feat.prep
    tr, s = prep.trace, prep.settings
    hist, fleet = feat.lulls(rule), feat.fleet(rule)
    with np.errstate(invalid="ignore"):
        busy = feat.activity >= rule.threshold_pct
    nxt = np.where(busy, np.arange(tr.n_steps), tr.n_steps)
    next_busy = np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1]  # first sample at/after k at/over it
    idle_s = prep.grid.times[None, :] - (tr.t0 + hist.lull_start * tr.step_s)
    # The first tick of each lull at which it has lasted AUC_IDLE_S.
    at = (idle_s >= AUC_IDLE_S) & prep.alive
    first = at.copy()
    first[:, 1:] &= ~(at[:, :-1] & (hist.lull_start[:, 1:] == hist.lull_start[:, :-1]))
    i, j = np.nonzero(first)
    start = hist.lull_start[i, j]
    end = next_busy[i, np.minimum(start, tr.n_steps - 1)]
    remaining = tr.t0 + end * tr.step_s - prep.grid.times[j]
    need = lead_s + s.break_even_s
    ended = end < np.minimum(prep.last_idx[i] + 1, tr.n_steps)
    known = (ended | (remaining >= need)) & ~np.isnan(hist.busy_share[i, j]) & ~np.isnan(fleet[i, j])
    label = (remaining >= need)[known]
    return (int(known.sum()), float(label.mean()) if known.any() else float("nan"),
            auc(-hist.busy_share[i, j][known], label), auc(fleet[i, j][known], label))


# --------------------------------------------------------------------------- held out


@dataclass(frozen=True)
class Direction:
    label: str
    fixed: Summary
    context: Summary
    base_alone: Summary  # the context policy's base rule without the context branch, on the test half
    params: ContextParams
    instance_days: float
    reason: str | None


def held_out(tune: Features, test: Features, cands: list[Rule], label: str) -> Direction:
    swept = run_sweep(tune.prep, cands)
    pick = max(swept, key=lambda x: x.score)  # as bench_backtest.py --ceiling: the first best score
    assert pick.rule is not None
    bases = [x.rule for x in sorted(swept, key=lambda x: -x.score)[:TOP_BASES]]
    best: tuple[float, ContextParams] | None = None
    for p in grid(bases):  # type: ignore[arg-type]
        score = backtest_context(tune, p)[0].score
        if best is None or score > best[0] + 1e-9:
            best = (score, p)
    assert best is not None
    fixed = backtest_rule(test.prep, pick.rule, test.oracle)[0]
    context, rep = backtest_context(test, best[1])
    base_alone = backtest_rule(test.prep, best[1].base, test.oracle)[0]
    return Direction(label=label, fixed=fixed, context=context, base_alone=base_alone, params=best[1],
                     instance_days=test.prep.instance_days, reason=example_reason(test, best[1], rep))


def row(name: str, policy: str, xs: list[Summary], days: float) -> tuple[str, float]:
    score = sum(x.score for x in xs)
    ceiling = sum(x.ceiling_score for x in xs)
    pct = 100 * score / ceiling if ceiling > 0 else 0.0
    line = (f"| {name} | {policy} | {sum(x.stops for x in xs)} | {sum(x.false_stops for x in xs)} | "
            f"{sum(x.net_gpu_hours for x in xs):,.1f} | {score:,.1f} | {pct:.0f}% | "
            f"{sum(x.restarts for x in xs) / days:.2f} |")
    return line, score


def main() -> None:
    t_all = time.perf_counter()
    settings = BacktestSettings(false_stop_cost_h=FALSE_STOP_COST_H)
    base = load_rules([ROOT / "rules"])[0]
    cands = candidates(base)
    n_grid = TOP_BASES * len(W_S) * len(B) * len(F)
    print(f"[context policy] score = net GPU-h - {FALSE_STOP_COST_H:g} x false stops; % of the clairvoyant-with-lead "
          f"ceiling ({base.warning_lead_s // 60}-min lead); fixed: best of {len(cands)} swept rules on the tuning half; "
          f"context: {n_grid} settings (the tuning half's {TOP_BASES} best fixed rules x w {[w // 60 for w in W_S]} min "
          f"x b {list(B)} x f {list(F)}) picked on the tuning half; both scored on the other half")
    print("| trace, run | policy | stops | false stops | net GPU-h | score | % of ceiling | restarts / instance-day |")
    print("|---|---|---|---|---|---|---|---|")
    verdict: dict[str, float] = {}
    reasons: list[str] = []
    aucs: list[str] = []
    for name, loader in TRACES:
        t = time.perf_counter()
        halves = [Features(Prepared(h, settings)) for h in loader()]
        runs = [held_out(halves[a], halves[b], cands, f"tuned on {'AB'[a]}, test {'AB'[b]}")
                for a, b in ((0, 1), (1, 0))]
        for d in runs:
            print(row(f"{name} {d.label}", f"fixed {d.fixed.policy}", [d.fixed], d.instance_days)[0])
            print(row("", f"context {d.params.text}", [d.context], d.instance_days)[0])
            print(row("", f"(its base {d.params.base.name} alone)", [d.base_alone], d.instance_days)[0])
            print(f"| | margin (context - fixed) | | | | {d.context.score - d.fixed.score:+,.1f} | | |")
            reasons += [f"{name} {d.label}: {d.reason}"] if d.reason else []
        days = sum(d.instance_days for d in runs)
        line_f, score_f = row(f"{name} held out, both", "fixed (tuned on the other half)", [d.fixed for d in runs], days)
        line_c, score_c = row("", "context (tuned on the other half)", [d.context for d in runs], days)
        print(line_f)
        print(line_c)
        print(row("", "(the context picks' base rules alone)", [d.base_alone for d in runs], days)[0])
        print(f"| | **margin (context - fixed)** | | | | **{score_c - score_f:+,.1f}** | | |", flush=True)
        verdict[name] = score_c - score_f
        for h, half in zip("AB", halves):
            n, pos, a_busy, a_fleet = feature_auc(half, runs[0].params.base, float(base.warning_lead_s))
            aucs.append(f"  {name} half {h} ({runs[0].params.base.threshold_pct:g}% threshold): {n} lulls at 5 min, "
                        f"{pos:.0%} last >= {(base.warning_lead_s + settings.break_even_s) / 60:.0f} min more; "
                        f"AUC busy share (lower = longer) {a_busy:.2f}, fleet-idle share {a_fleet:.2f}")
        print(f"  ({name}: {time.perf_counter() - t:.0f} s)", flush=True)
    print("\n[context policy] feature AUC for \"this lull lasts >= break-even + lead more\" at 5 min idle (no tuning: "
          "each half on its own; threshold = the context base picked on half A):")
    print("\n".join(aucs))
    print("\n[context policy] example reason of a stop the context branch made (held-out half):")
    print("\n".join(f"  {r}" for r in reasons) if reasons else "  (no stop came from the context branch)")
    beats = all(v > 1e-9 for v in verdict.values())
    print("\n[context policy] margins (summed held-out score, context - fixed): "
          + ", ".join(f"{k} {v:+,.1f}" for k, v in verdict.items()))
    print(f"context policy beats the tuned fixed rule held out on every trace: {'yes' if beats else 'no'}")
    print(f"[context policy] wall time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
