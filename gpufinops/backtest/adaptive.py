"""A learned idle policy: wait as long as this instance's own history says it must.

An *idle stretch* is a run of samples with no demand (activity at or under the
demand level; the same level that restarts a stopped instance). For an
instance whose current stretch has lasted `age`, a stop marked now happens
after the warning lead, at age + lead, and is a false stop if demand returns
within the break-even after that. From the stretches this instance has
*completed before the current one began* (no peeking), the policy estimates

    p = P(stretch lasts > age + lead + break_even | it lasted > age + lead)
      = #past stretches longer than age+lead+break_even / #past stretches longer than age+lead

and says IDLE once p >= p_min with at least `min_support` past stretches that
long (then it stays IDLE until demand returns). With too little history at
that age it falls back to the fixed rule's verdict; otherwise it waits
(ReasonCode.LEARNED_WAIT). Bursty serving pods whose lulls never last learn to
wait; notebooks left overnight learn that a 10-minute lull means hours.

`decide()` is the scalar decision with its reason, for the live service;
`adaptive_verdicts()` computes the same thing for every tick of a trace with
arrays, one small numpy step per idle stretch (not per sample).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from ..model import Decision, ReasonCode, Rule, Verdict
from .engine import IDLE, UNDERUTILIZED, UNKNOWN, Prepared, Replay, Summary, oracle_net_seconds, replay, rule_verdicts, summarise


@dataclass(frozen=True)
class AdaptiveParams:
    p_min: float = 0.8  # confidence that the stop outlasts the break-even
    min_support: int = 5  # past stretches at least this long before the history is trusted
    min_idle_s: float = 300.0  # never stop a lull shorter than this (and a blip between ticks cancels a mark)
    history: int = 0  # use only the last N completed stretches (0 = all): adapts to changed behaviour
    min_history: int = 10  # fewer completed stretches than this: the fixed rule decides
    # A stretch longer than all but a few past ones: the history cannot say; stop on the fixed
    # rule only once it has also lasted this long (None = the break-even).
    unusual_wait_s: float | None = None


def learned_masks(support, p, ages, n_history: int, base_idle, params: AdaptiveParams, break_even_s: float):
    """(learned, fallback) boolean arrays: IDLE because the history says so / because the fixed rule says so."""
    support, p, ages, base_idle = map(np.asarray, (support, p, ages, base_idle))
    if n_history < params.min_history:
        return np.zeros(ages.shape, bool), base_idle.astype(bool)
    enough = support >= params.min_support
    learned = enough & (p >= params.p_min) & (ages >= params.min_idle_s)
    wait = params.unusual_wait_s if params.unusual_wait_s is not None else break_even_s
    fallback = ~enough & base_idle & (ages >= wait)
    return learned, fallback


def survival(history_sorted: np.ndarray, ages_s, lead_s: float, break_even_s: float):
    """(support, p): #past stretches longer than age+lead, and the share of those longer than age+lead+break_even."""
    h = np.asarray(history_sorted, dtype=float)
    x = np.asarray(ages_s, dtype=float) + lead_s
    longer = len(h) - np.searchsorted(h, x, side="right")
    outlast = len(h) - np.searchsorted(h, x + break_even_s, side="right")
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(longer > 0, outlast / np.maximum(longer, 1), 0.0)
    return longer, p


def _fmt_min(s: float) -> str:
    m = s / 60
    return f"{m / 60:.1f} h" if m >= 120 else f"{m:.0f} min"


def _fallback_reason(n_history: int, support: int, age_s: float, rule_name: str) -> str:
    what = (f"only {n_history} past idle stretches" if support == n_history
            else f"only {support} of {n_history} past idle stretches lasted this long")
    return f"idle {_fmt_min(age_s)}; {what}: fixed rule {rule_name} decides"


def explain(support: int, p: float, age_s: float, lead_s: float, break_even_s: float) -> str:
    return (f"idle {_fmt_min(age_s)}; {p:.0%} of this instance's {support} past idle stretches longer than "
            f"{_fmt_min(age_s + lead_s)} lasted over {_fmt_min(age_s + lead_s + break_even_s)}")


def decide(base: Decision, history_s, idle_age_s: float | None, rule: Rule, params: AdaptiveParams,
           break_even_s: float, now: datetime) -> Decision:
    """The live decision: `base` is `evaluate()`'s decision under the fallback rule.

    history_s: durations (s) of this instance's completed idle stretches; idle_age_s: how long the
    current stretch has lasted (None: there is demand now).
    """
    if base.verdict == Verdict.UNKNOWN:
        return base  # missing data is never idle, whatever the history says
    hist = np.sort(np.asarray(history_s, dtype=float))
    if params.history:
        hist = np.sort(np.asarray(history_s, dtype=float)[-params.history:])
    if idle_age_s is None:
        if base.verdict != Verdict.IDLE:
            return base
        return replace(base, verdict=Verdict.UNDERUTILIZED, code=ReasonCode.LEARNED_WAIT,
                       reason="activity above the demand level in the latest sample")
    support, p = survival(hist, idle_age_s, rule.warning_lead_s, break_even_s)
    support, p = int(support), float(p)
    why = explain(support, p, idle_age_s, rule.warning_lead_s, break_even_s)
    learned, fallback = learned_masks(support, p, idle_age_s, len(hist), base.verdict == Verdict.IDLE, params,
                                      break_even_s)
    if len(hist) < params.min_history or support < params.min_support:
        note = _fallback_reason(len(hist), support, idle_age_s, rule.name)
        if bool(fallback) or base.verdict != Verdict.IDLE:
            return replace(base, reason=f"{note} ({base.reason})")
        return replace(base, verdict=Verdict.UNDERUTILIZED, code=ReasonCode.LEARNED_WAIT,
                       reason=f"{note}, but only after {_fmt_min(params.unusual_wait_s or break_even_s)} idle")
    if bool(learned):
        # Every sample of the stretch is under the demand level, and the history says it will last.
        return replace(base, verdict=Verdict.IDLE, code=ReasonCode.LEARNED_IDLE, reason=why)
    return replace(base, verdict=Verdict.UNDERUTILIZED, code=ReasonCode.LEARNED_WAIT,
                   reason=f"{why}; waiting (needs {params.p_min:.0%})")


@dataclass
class AdaptiveRun:
    verdicts: np.ndarray
    reasons: dict  # (instance index, stretch start sample) -> reason of the IDLE verdict


def _stretches(prep: Prepared, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Idle stretches of instance i as sample index ranges [start, end); end = the demand sample."""
    first, last = prep.first_idx[i], prep.last_idx[i]
    if last < first:
        return np.zeros(0, int), np.zeros(0, int)
    d = np.flatnonzero(prep.demand[i, first:last + 1]) + first
    starts = np.concatenate([[first], d + 1])
    ends = np.concatenate([d, [last + 1]])
    keep = ends > starts
    return starts[keep], ends[keep]


def adaptive_verdicts(prep: Prepared, rule: Rule, params: AdaptiveParams,
                      base: np.ndarray | None = None) -> AdaptiveRun:
    tr, s, times, hi = prep.trace, prep.settings, prep.grid.times, prep.grid.hi
    base = rule_verdicts(prep, rule) if base is None else base
    out = np.where(base == IDLE, UNDERUTILIZED, base).astype(np.int8)  # idle only where a stretch says so
    reasons: dict = {}
    lead, be = float(rule.warning_lead_s), s.break_even_s
    for i in range(tr.n_instances):  # per instance and per idle stretch; the ticks inside are arrays
        starts, ends = _stretches(prep, i)
        history: list[float] = []
        for k in range(len(starts)):
            a, b = starts[k], ends[k]
            ja = int(np.searchsorted(hi, a + 1, side="left"))
            jb = int(np.searchsorted(hi, b, side="right"))
            if jb > ja:
                t_start = tr.t0 + a * tr.step_s
                ages = times[ja:jb] - t_start
                h = np.asarray(history[-params.history:] if params.history else history)
                support, p = survival(np.sort(h) if params.history else h, ages, lead, be)
                learned, fallback = learned_masks(support, p, ages, len(h), base[i, ja:jb] == IDLE, params, be)
                hit = np.flatnonzero(learned | fallback)
                if len(hit):
                    h0 = hit[0]
                    span = slice(ja + h0, jb)
                    known = base[i, span] != UNKNOWN
                    out[i, span] = np.where(known, IDLE, UNKNOWN)
                    if learned[h0]:
                        reasons[(i, int(a))] = explain(int(support[h0]), float(p[h0]), float(ages[h0]), lead, be)
                    else:
                        reasons[(i, int(a))] = _fallback_reason(len(h), int(support[h0]), float(ages[h0]), rule.name)
            if b <= prep.last_idx[i]:  # completed (ended by demand): now part of the past
                if params.history:
                    history.append((b - a) * tr.step_s)
                else:
                    bisect.insort(history, (b - a) * tr.step_s)
    return AdaptiveRun(verdicts=out, reasons=reasons)


def stop_reason(prep: Prepared, run: AdaptiveRun, instance: str, stop_at: float) -> str:
    i = prep.trace.instance_ids.index(instance)
    k = int(np.floor((stop_at - prep.trace.t0) / prep.trace.step_s + 1e-9))
    d = prep.prev_demand[i, min(k, prep.trace.n_steps - 1)]
    start = prep.first_idx[i] if d < 0 else d + 1
    return run.reasons.get((i, int(start)), "")


def backtest_adaptive(prep: Prepared, rule: Rule, params: AdaptiveParams, oracle: np.ndarray | None = None,
                      base: np.ndarray | None = None, name: str | None = None) -> tuple[Summary, Replay, AdaptiveRun]:
    run = adaptive_verdicts(prep, rule, params, base)
    rep = replay(prep, run.verdicts, rule.warning_lead_s, rule.window_s)
    label = name or f"adaptive(p>={params.p_min:g},n>={params.min_support}; fallback {rule.name})"
    oracle = oracle_net_seconds(prep) if oracle is None else oracle
    return summarise(label, prep, rep, rule, oracle), rep, run
