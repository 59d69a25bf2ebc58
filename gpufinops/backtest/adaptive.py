"""A learned idle policy: stop when this instance's past lulls (and the fleet's) say stopping now pays.

An *idle stretch* is a run of samples with no demand (activity at or under the
demand level; the same level that restarts a stopped instance). When the
current stretch has lasted `age`, a mark set now stops the instance at
y = age + lead (if it is still idle then). That stop is false if demand comes
back within the break-even, and costs a restart if demand comes back at all.

Evidence. The instance's own stretches *completed before the current one
began* (no peeking), plus a fleet prior: `prior_weight` pseudo-stretches drawn
from the stretches every instance completed before the current stretch's
refresh block began (empirical Bayes: an instance with a short history borrows
the fleet's; one with a long history mostly speaks for itself). Only
stretches longer than min_idle + lead matter, since every question is
conditional on the lull having lasted at least that long.

Decision (criterion "value", the default). With D the length of the stretch and
the weighted past stretches as its distribution, stopping at y is worth

    G(y) = E[(D - y) - restart_cost - false_cost * [D < y + break_even]; D > y]

(GPU time saved minus the restart, minus a penalty `false_stop_cost_h` per
false stop), and the policy stops at the first y where G(y) >= G(y') for every
later y' (optimal stopping under that distribution: no later stop is worth
more). G decreases between past stretch lengths and jumps up at each one, so
"every later y'" is checked at those lengths only. Criterion "p" is the
simpler cut P(D >= y + break_even | D > y) >= p_min.

Time of day. Lulls that begin in the evening tend to last the night; lulls
that begin mid-morning end at the next meeting. With `time_of_day_s` (default
3 h) the evidence is the past stretches that *began* within that much of the
current stretch's start time of day (circular, UTC), each weighing 1; the
others still count, at `other_times_weight` (default 0.2), so an instance with
little history at this hour falls back on the rest of its day; the fleet
prior is built from the fleet's stretches that began within the same window.

No stop within `restart_grace_s` (default 2 h) of an instance's start or
restart: the learned verdict is held back until then (as the fixed rule's own
window does after a restart).

Where the evidence is too thin (weighted support under `min_support`; or with
no fleet prior, fewer than `min_history` own stretches), the fixed rule decides,
after `unusual_wait_s` of idleness. Once IDLE, the policy stays IDLE until
demand returns.

Earned trust (`trust_wait_s`, off by default). The learned wait can be wrong where
nothing in the history predicts how long a lull lasts. Each instance keeps a running
score: every completed stretch of its own is replayed once with the learned wait (as it
would have decided then, `replayed_mark_age`) and once with a fixed wait of
`trust_wait_s`, each valued like a stop (`stop_value`). While the learned wait is level
or ahead (within `trust_margin_h`), it decides; behind, the fixed wait does.

`decide()` is the scalar decision with its reason, for the live service;
`adaptive_verdicts()` computes the same thing for every tick of a trace with
arrays, one small numpy step per idle stretch (not per sample).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np

from ..model import Decision, ReasonCode, Rule, Verdict
from .engine import (
    IDLE,
    UNDERUTILIZED,
    UNKNOWN,
    Prepared,
    Replay,
    Summary,
    oracle_net_seconds,
    replay,
    rule_verdicts,
    summarise,
)

_TOL = 1e-6  # seconds x weight: ties between "stop now" and "stop later" go to stopping now


@dataclass(frozen=True)
class AdaptiveParams:
    criterion: str = "value"  # "value": optimal stopping of G(y); "p": P(outlasts the break-even) >= p_min
    false_stop_cost_h: float = 2.0  # "value": GPU-hours a false stop is counted as (on top of the restart)
    p_min: float = 0.8  # "p": confidence that the stop outlasts the break-even
    prior_weight: float = 5.0  # pseudo-stretches from the fleet prior (0: this instance's history only)
    min_support: float = 3.0  # weighted past stretches (own + prior) at least this long before deciding
    min_idle_s: float = 300.0  # never stop a lull shorter than this (and a blip between ticks cancels a mark)
    history: int = 0  # use only the last N completed stretches of the instance (0 = all)
    min_history: int = 10  # without a fleet prior: fewer own stretches than this and the fixed rule decides
    # Evidence too thin at this age: stop on the fixed rule only once the stretch has also lasted this long
    # (None = the break-even).
    unusual_wait_s: float | None = None
    fleet_refresh_s: float = 3600.0  # the fleet prior is rebuilt from completed stretches this often
    prior_points: int = 64  # the fleet prior is summarised by this many quantiles
    # Past stretches that began within this much of the current one's start time of day weigh 1, the others
    # other_times_weight; the fleet prior uses only the former. 0: every past stretch weighs 1.
    time_of_day_s: float = 3 * 3600.0
    other_times_weight: float = 0.2
    # After an instance starts (or restarts), no stop for this long: whoever started it is likely setting it up,
    # and a short rule paired with the policy would otherwise stop it in its first lull. 0: the rule's window only.
    restart_grace_s: float = 2 * 3600.0
    # Earned trust: on an instance the learned wait decides as long as, replayed over that instance's completed
    # lulls, it has scored at least as much as a fixed wait of this long (less trust_margin_h GPU-h per GPU);
    # once it falls further behind, the fixed wait decides until it catches up. None: the learned wait always
    # decides.
    trust_wait_s: float | None = None
    trust_margin_h: float = 0.0

    def label(self) -> str:
        how = (f"false stop = {self.false_stop_cost_h:g} GPU-h" if self.criterion == "value"
               else f"p>={self.p_min:g}")
        tod = f", time of day +-{self.time_of_day_s / 3600:g} h" if self.time_of_day_s > 0 else ""
        return f"{how}, fleet prior {self.prior_weight:g}, support>={self.min_support:g}{tod}"


@dataclass(frozen=True)
class FleetPrior:
    """The fleet's idle stretches longer than `floor_s`: Kaplan-Meier masses and the quantile pseudo-stretches.

    durations: sorted lengths (s), completed stretches and ongoing ones ("lasted at least this long");
    mass: the Kaplan-Meier probability mass at each length (0 at an ongoing one, except the longest);
    points: `prior_points` quantiles of that distribution, the pseudo-stretches that `assess` weighs in.
    """

    durations: np.ndarray
    mass: np.ndarray
    points: np.ndarray
    floor_s: float

    @property
    def n(self) -> int:
        return len(self.durations)

    def share_outlasting(self, y: float, break_even_s: float) -> tuple[int, float]:
        """(fleet stretches that lasted over y, Kaplan-Meier share of them that lasted y + break_even or more)."""
        gt = int(np.searchsorted(self.durations, y, side="right"))
        ok = int(np.searchsorted(self.durations, y + break_even_s, side="left"))
        m_gt, m_ok = self.mass[gt:].sum(), self.mass[ok:].sum()
        return self.n - gt, (float(m_ok / m_gt) if m_gt > 0 else 0.0)


EMPTY_PRIOR = FleetPrior(np.zeros(0), np.zeros(0), np.zeros(0), 0.0)


def fleet_prior(durations_s, floor_s: float, points: int = 64, ongoing_s=(), min_stretches: int = 5) -> FleetPrior:
    """The prior from fleet stretches (s): completed ones and, censored, the ones still going on.

    Only stretches longer than floor_s count. An ongoing stretch says "at least this long": Kaplan-Meier
    hands its weight to the longer stretches, so a young history does not make lulls look short.
    Fewer than `min_stretches` completed stretches above the floor: no prior.
    """
    done = np.asarray(durations_s, dtype=float)
    cens = np.asarray(ongoing_s, dtype=float)
    done, cens = done[done > floor_s], cens[cens > floor_s]
    vals = np.concatenate([done, cens])
    event = np.concatenate([np.ones(len(done), bool), np.zeros(len(cens), bool)])
    order = np.lexsort((~event, vals))  # by length; at a tie the completed stretch leaves the risk set first
    vals, event = vals[order], event[order]
    n = len(vals)
    if len(done) < min_stretches:
        return FleetPrior(vals, np.zeros(n), np.zeros(0), floor_s)
    at_risk = n - np.arange(n)
    surv = np.cumprod(np.where(event, 1.0 - 1.0 / at_risk, 1.0))
    before = np.concatenate([[1.0], surv[:-1]])
    mass = np.where(event, before / at_risk, 0.0)
    mass[-1] += surv[-1]  # longest one ongoing: what is left sits there (a lower bound)
    cdf = np.cumsum(mass)
    q = (np.arange(points) + 0.5) / points
    pts = vals[np.minimum(np.searchsorted(cdf, q * cdf[-1], side="left"), n - 1)]
    return FleetPrior(vals, mass, pts, floor_s)


def floor_s(params: AdaptiveParams, lead_s: float) -> float:
    """Stretches not longer than this never inform a decision (every question is about D > min_idle + lead)."""
    return params.min_idle_s + lead_s


def near_in_time_of_day(start_t, at_t: float, params: AdaptiveParams) -> np.ndarray:
    """Which stretches (start epoch s) began within `time_of_day_s` of at_t's time of day (circular, UTC)."""
    d = np.abs(np.mod(np.asarray(start_t, dtype=float) - at_t, 86400.0))
    return np.minimum(d, 86400.0 - d) <= params.time_of_day_s + 1e-6


def prior_hour(stretch_start_t: float, params: AdaptiveParams) -> float | None:
    """The time the fleet prior is centred on for a stretch begun then: the middle of its UTC hour, so that one
    prior per hour serves every stretch (None: time of day unused)."""
    if params.time_of_day_s <= 0:
        return None
    return float(np.floor(stretch_start_t / 3600.0) * 3600.0 + 1800.0)


def _time_of_day_scope(at_t: float | None, params: AdaptiveParams) -> str:
    """The words that say which past stretches the evidence is about (empty: all of them)."""
    if params.time_of_day_s <= 0 or at_t is None:
        return ""

    def hhmm(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%H:%M")

    return f" (begun {hhmm(at_t - params.time_of_day_s)}-{hhmm(at_t + params.time_of_day_s)} UTC)"


@dataclass
class Evidence:
    """Per queried age (arrays): what the history says about a stop at age + lead."""

    support: np.ndarray  # weighted past stretches longer than age + lead (own + prior)
    p: np.ndarray  # weighted share of those that lasted the break-even past the stop
    own_support: np.ndarray  # this instance's stretches longer than age + lead (near in time of day, if used)
    own_p: np.ndarray
    stop_now: np.ndarray  # "value": no later stop is worth more than a stop at age + lead
    scope: str = ""  # which past stretches own_support counts, for the reason


def assess(own_sorted, prior: FleetPrior, ages_s, lead_s: float, break_even_s: float, restart_cost_s: float,
           params: AdaptiveParams, own_weights=None, scope: str = "") -> Evidence:
    """The evidence for a stop marked at each age.

    own_sorted: this instance's stretches longer than the floor, sorted; own_weights: their weights (None: 1 each;
    see `own_evidence`). The own counts in the reason are over the stretches of weight 1.
    """
    own = np.asarray(own_sorted, dtype=float)
    own_w = np.ones(len(own)) if own_weights is None else np.asarray(own_weights, dtype=float)
    pts = prior.points if params.prior_weight > 0 else np.zeros(0)
    w_prior = params.prior_weight / len(pts) if len(pts) else 0.0
    vals = np.concatenate([own, pts])
    wts = np.concatenate([own_w, np.full(len(pts), w_prior)])
    order = np.argsort(vals, kind="stable")
    vals, wts = vals[order], wts[order]
    w_suf = np.concatenate([np.cumsum(wts[::-1])[::-1], [0.0]])  # weight of vals[j:]
    d_suf = np.concatenate([np.cumsum((wts * vals)[::-1])[::-1], [0.0]])
    y = np.asarray(ages_s, dtype=float) + lead_s
    gt = np.searchsorted(vals, y, side="right")  # stretches longer than y: the stop happens
    ok = np.searchsorted(vals, y + break_even_s, side="left")  # ... and is not false
    support, outlast = w_suf[gt], w_suf[ok]
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(support > 0, outlast / np.maximum(support, 1e-12), 0.0)
        near = own[own_w >= 1.0 - 1e-9]  # sorted, as own is
        own_gt = len(near) - np.searchsorted(near, y, side="right")
        own_ok = len(near) - np.searchsorted(near, y + break_even_s, side="left")
        own_p = np.where(own_gt > 0, own_ok / np.maximum(own_gt, 1), 0.0)
    stop_now = np.zeros(y.shape, bool)
    if params.criterion == "value" and len(vals):
        lam = params.false_stop_cost_h * 3600.0

        def gain(yy, gt_idx, ok_idx):
            return d_suf[gt_idx] - (yy + restart_cost_s + lam) * w_suf[gt_idx] + lam * w_suf[ok_idx]

        g_now = gain(y, gt, ok)
        # Later stops worth checking: just after each past stretch length (G only decreases in between).
        g_bp = gain(vals, np.searchsorted(vals, vals, side="right"),
                    np.searchsorted(vals, vals + break_even_s, side="left"))
        best_after = np.concatenate([np.maximum.accumulate(g_bp[::-1])[::-1], [-np.inf]])
        stop_now = g_now >= best_after[gt] - _TOL
    return Evidence(support=support, p=p, own_support=own_gt, own_p=own_p, stop_now=stop_now, scope=scope)


def learned_masks(ev: Evidence, ages, n_history: int, has_prior: bool, base_idle, params: AdaptiveParams,
                  break_even_s: float):
    """(learned, fallback) boolean arrays: IDLE because the history says so / because the fixed rule says so."""
    ages, base_idle = np.asarray(ages, dtype=float), np.asarray(base_idle, dtype=bool)
    # Thin evidence: the fixed rule decides, and never before unusual_wait (a short rule paired with the policy
    # would otherwise stop a new instance, or a new fleet, minutes into its first lull).
    wait = params.unusual_wait_s if params.unusual_wait_s is not None else break_even_s
    if not has_prior and n_history < params.min_history:
        return np.zeros(ages.shape, bool), base_idle & (ages >= wait)
    enough = ev.support >= params.min_support - 1e-9
    says_stop = ev.stop_now if params.criterion == "value" else ev.p >= params.p_min
    learned = enough & says_stop & (ages >= params.min_idle_s)
    fallback = ~enough & base_idle & (ages >= wait)
    return learned, fallback


def _epoch(now: datetime) -> float:
    return (now.replace(tzinfo=UTC) if now.tzinfo is None else now).timestamp()


def _fmt_min(s: float) -> str:
    m = s / 60
    return f"{m / 60:.1f} h" if m >= 120 else f"{m:.0f} min"


def explain(ev: Evidence, k: int, prior: FleetPrior, age_s: float, lead_s: float, break_even_s: float,
            params: AdaptiveParams) -> str:
    """The sentence behind a learned verdict, from the evidence at index k."""
    y, y_ok = age_s + lead_s, age_s + lead_s + break_even_s
    n_own = int(ev.own_support[k])
    own = (f"{float(ev.own_p[k]):.0%} of this instance's {n_own} past idle stretches longer than {_fmt_min(y)}"
           f"{ev.scope} lasted over {_fmt_min(y_ok)}" if n_own
           else f"no past idle stretch of this instance{ev.scope} lasted {_fmt_min(y)}")
    fleet = ""
    if params.prior_weight > 0 and len(prior.points):
        f_n, f_p = prior.share_outlasting(y, break_even_s)
        fleet = f" (fleet: {f_p:.0%} of {f_n})" if f_n else " (fleet: none that long)"
    return f"idle {_fmt_min(age_s)}; {own}{fleet}"


def _idle_reason(ev: Evidence, k: int, prior: FleetPrior, age_s: float, lead_s: float, break_even_s: float,
                 params: AdaptiveParams) -> str:
    tail = "; stopping now is worth more than waiting" if params.criterion == "value" else ""
    return explain(ev, k, prior, age_s, lead_s, break_even_s, params) + tail


def _fallback_reason(thin_history: bool, n_history: int, support: float, age_s: float, rule_name: str) -> str:
    what = (f"only {n_history} past idle stretches and no fleet prior" if thin_history
            else f"too few past idle stretches lasted this long ({support:.1f} weighted)")
    return f"idle {_fmt_min(age_s)}; {what}: fixed rule {rule_name} decides"


def own_evidence(history_s, params: AdaptiveParams, floor: float, history_start_t=None,
                 stretch_start_t: float | None = None) -> tuple[np.ndarray, np.ndarray | None, int, str]:
    """(this instance's past stretches longer than the floor, sorted; their weights or None; how many in all;
    the words that say which ones weigh fully, for the reason), the first, second and fourth for `assess`.

    Weights come from the time of day when both the past stretches' starts and the current one's are known.
    """
    h = np.asarray(history_s, dtype=float)
    starts = None if history_start_t is None else np.asarray(history_start_t, dtype=float)
    if starts is not None and len(starts) != len(h):
        starts = None  # start times not known for every stretch: the time of day is not used
    if params.history:
        h = h[-params.history:]
        starts = None if starts is None else starts[-params.history:]
    n = len(h)
    keep = h > floor
    h = h[keep]
    order = np.argsort(h, kind="stable")
    if params.time_of_day_s <= 0 or starts is None or stretch_start_t is None:
        return h[order], None, n, ""
    w = np.where(near_in_time_of_day(starts[keep], stretch_start_t, params), 1.0, params.other_times_weight)
    return h[order], w[order], n, _time_of_day_scope(stretch_start_t, params)


def decide(base: Decision, history_s, idle_age_s: float | None, rule: Rule, params: AdaptiveParams,
           break_even_s: float, now: datetime, prior: FleetPrior = EMPTY_PRIOR,
           restart_cost_s: float = 600.0, history_start_t=None, running_s: float | None = None,
           trust: Trust | None = None, prior_at: Callable[[float | None], FleetPrior] | None = None,
           hold_back_only: bool = False) -> Decision:
    """The live decision: `base` is `evaluate()`'s decision under the fallback rule.

    history_s: durations (s) of this instance's completed idle stretches, oldest first; history_start_t: their
    start times (epoch s; None: time of day unused); idle_age_s: how long the current stretch has lasted (None:
    there is demand now); prior: `fleet_prior()` of the fleet's completed stretches (those begun near the current
    stretch's time of day, when it is used); running_s: time since the instance (re)started (None: unknown).
    With `trust_wait`: trust, or else it is computed from the history with prior_at (the fleet prior for a
    stretch begun then; default `prior`); hold_back_only as in `adaptive_verdicts`.
    """
    if params.trust_wait_s is not None and trust is None:
        trust = trust_of(history_s, history_start_t, prior_at or (lambda _t: prior), rule, params, break_even_s,
                         restart_cost_s, float(rule.window_s) if hold_back_only else 0.0)
    if trust is not None and not trust.trusted(params):
        d = _fixed_wait(base, idle_age_s, trust, rule, params, hold_back_only)
    else:
        d = _decide(base, history_s, idle_age_s, rule, params, break_even_s, now, prior, restart_cost_s,
                    history_start_t)
        if trust is not None and d.code in (ReasonCode.LEARNED_IDLE, ReasonCode.LEARNED_WAIT):
            d = replace(d, reason=f"{d.reason}; {trust_note(trust, params)}")
    return within_restart_grace(d, base, running_s, params)


def _fixed_wait(base: Decision, idle_age_s: float | None, trust: Trust, rule: Rule, params: AdaptiveParams,
                hold_back_only: bool) -> Decision:
    """The decision where the learned wait has not earned this instance's trust: IDLE once the stretch has lasted
    trust_wait (and the rule's window, where the block only holds its rule back)."""
    if base.verdict == Verdict.UNKNOWN:
        return base  # missing data is never idle
    assert params.trust_wait_s is not None
    wait = max(params.trust_wait_s, float(rule.window_s) if hold_back_only else 0.0)
    note = trust_note(trust, params)
    if idle_age_s is None:
        if base.verdict != Verdict.IDLE:
            return base
        return replace(base, verdict=Verdict.UNDERUTILIZED, code=ReasonCode.LEARNED_WAIT,
                       reason=f"activity above the demand level in the latest sample; {note}")
    if idle_age_s >= wait - 1e-9 and (base.verdict == Verdict.IDLE or not hold_back_only):
        return replace(base, verdict=Verdict.IDLE, code=ReasonCode.LEARNED_IDLE,
                       reason=_fixed_wait_reason(idle_age_s, trust, params))
    if base.verdict != Verdict.IDLE:
        return base
    return replace(base, verdict=Verdict.UNDERUTILIZED, code=ReasonCode.LEARNED_WAIT,
                   reason=f"{_fixed_wait_reason(idle_age_s, trust, params)}: waiting until {_fmt_min(wait)} idle")


def within_restart_grace(d: Decision, base: Decision, running_s: float | None, params: AdaptiveParams) -> Decision:
    """`d`, or a wait if it is IDLE and the instance (re)started less than `restart_grace_s` ago."""
    if d.verdict == Verdict.IDLE and running_s is not None and running_s < params.restart_grace_s - 1e-9:
        return replace(base, verdict=Verdict.UNDERUTILIZED, code=ReasonCode.LEARNED_WAIT,
                       reason=f"started {_fmt_min(running_s)} ago: no stop within {_fmt_min(params.restart_grace_s)} "
                              f"of a start ({d.reason})")
    return d


def _decide(base: Decision, history_s, idle_age_s: float | None, rule: Rule, params: AdaptiveParams,
            break_even_s: float, now: datetime, prior: FleetPrior, restart_cost_s: float,
            history_start_t) -> Decision:
    if base.verdict == Verdict.UNKNOWN:
        return base  # missing data is never idle, whatever the history says
    if idle_age_s is None:
        if base.verdict != Verdict.IDLE:
            return base
        return replace(base, verdict=Verdict.UNDERUTILIZED, code=ReasonCode.LEARNED_WAIT,
                       reason="activity above the demand level in the latest sample")
    lead = float(rule.warning_lead_s)
    at = _epoch(now) - idle_age_s if history_start_t is not None else None
    own, own_w, n_history, scope = own_evidence(history_s, params, floor_s(params, lead), history_start_t, at)
    ev = assess(own, prior, np.array([idle_age_s]), lead, break_even_s, restart_cost_s, params, own_w, scope)
    has_prior = params.prior_weight > 0 and len(prior.points) > 0
    learned, fallback = learned_masks(ev, np.array([idle_age_s]), n_history, has_prior,
                                      np.array([base.verdict == Verdict.IDLE]), params, break_even_s)
    thin = not has_prior and n_history < params.min_history
    if thin or ev.support[0] < params.min_support - 1e-9:
        note = _fallback_reason(thin, n_history, float(ev.support[0]), idle_age_s, rule.name)
        if bool(fallback[0]) or base.verdict != Verdict.IDLE:
            return replace(base, reason=f"{note} ({base.reason})")
        return replace(base, verdict=Verdict.UNDERUTILIZED, code=ReasonCode.LEARNED_WAIT,
                       reason=f"{note}, but only after {_fmt_min(params.unusual_wait_s or break_even_s)} idle")
    why = explain(ev, 0, prior, idle_age_s, lead, break_even_s, params)
    if bool(learned[0]):
        # Every sample of the stretch is under the demand level, and the history says stopping now pays.
        return replace(base, verdict=Verdict.IDLE, code=ReasonCode.LEARNED_IDLE,
                       reason=_idle_reason(ev, 0, prior, idle_age_s, lead, break_even_s, params))
    need = (f"a later stop is worth more (a false stop counts {params.false_stop_cost_h:g} GPU-h)"
            if params.criterion == "value" else f"needs {params.p_min:.0%}")
    if idle_age_s < params.min_idle_s:
        need = f"idle under {_fmt_min(params.min_idle_s)}"
    return replace(base, verdict=Verdict.UNDERUTILIZED, code=ReasonCode.LEARNED_WAIT, reason=f"{why}; waiting: {need}")


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


class FleetHistory:
    """Every instance's idle stretches, and the fleet prior as it stood at the start of each refresh block."""

    def __init__(self, prep: Prepared, stretches: list, params: AdaptiveParams, floor: float):
        tr = prep.trace
        st, en = [], []
        for i, (starts, stops) in enumerate(stretches):
            done = stops <= prep.last_idx[i]  # ended by demand; the others run to the end of the history
            st.append(tr.t0 + starts * tr.step_s)
            en.append(np.where(done, tr.t0 + stops * tr.step_s, np.inf))  # the demand sample: known from then on
        self.start_t = np.concatenate(st) if st else np.zeros(0)
        self.end_t = np.concatenate(en) if en else np.zeros(0)
        self.t0, self.params, self.floor = tr.t0, params, floor
        self._cache: dict[tuple[int, float | None], FleetPrior] = {}

    def prior_at(self, t: float) -> FleetPrior:
        """The prior for a stretch begun at t, from what was known at the start of t's refresh block (completed
        and ongoing stretches; with time of day, only those begun near t's hour)."""
        if self.params.prior_weight <= 0:
            return EMPTY_PRIOR
        b = int(np.floor((t - self.t0) / self.params.fleet_refresh_s + 1e-9))
        hour = prior_hour(t, self.params)
        if (b, hour) not in self._cache:
            now = self.t0 + b * self.params.fleet_refresh_s
            done = self.end_t <= now + 1e-9
            ongoing = (self.start_t < now) & ~done
            if hour is not None:
                near = near_in_time_of_day(self.start_t, hour, self.params)
                done, ongoing = done & near, ongoing & near
            self._cache[(b, hour)] = fleet_prior(self.end_t[done] - self.start_t[done], self.floor,
                                                 self.params.prior_points, ongoing_s=now - self.start_t[ongoing])
        return self._cache[(b, hour)]


REPLAY_TICK_S = 60.0  # the age grid on which a stretch is replayed (the service's default evaluation period)


def stop_value(length_s: float, mark_age_s: float, lead_s: float, break_even_s: float, restart_cost_s: float,
               false_cost_s: float) -> float:
    """What a mark at mark_age_s in a completed idle stretch of length_s was worth (GPU-s per GPU): the time
    stopped minus the restart, minus false_cost_s if demand came back within the break-even; 0 if the stretch
    ended before the stop (the mark was cancelled)."""
    stop = mark_age_s + lead_s
    if not length_s > stop:
        return 0.0
    return length_s - stop - restart_cost_s - (false_cost_s if length_s < stop + break_even_s else 0.0)


def first_idle(ages, history_s, history_start_t, start_t: float | None, prior: FleetPrior, rule: Rule,
               params: AdaptiveParams, break_even_s: float, restart_cost_s: float,
               base_idle) -> tuple[int | None, Evidence]:
    """The first of `ages` (into a stretch begun at start_t) at which the policy says IDLE, learned or by its
    thin-evidence fallback where base_idle (None: never), with the evidence behind it."""
    lead = float(rule.warning_lead_s)
    own, own_w, n_hist, scope = own_evidence(history_s, params, floor_s(params, lead), history_start_t, start_t)
    ev = assess(own, prior, ages, lead, break_even_s, restart_cost_s, params, own_w, scope)
    has_prior = params.prior_weight > 0 and len(prior.points) > 0
    never = np.zeros(len(ev.support), bool)
    learned, fallback = learned_masks(ev, ages, n_hist, has_prior, never if base_idle is None else base_idle, params,
                                      break_even_s)
    hit = np.flatnonzero(learned | fallback)
    return (int(hit[0]) if len(hit) else None), ev


def replayed_mark_age(length_s: float, history_s, history_start_t, start_t: float | None, prior: FleetPrior,
                      rule: Rule, params: AdaptiveParams, break_even_s: float, restart_cost_s: float) -> float:
    """When the policy would have marked a past idle stretch of length_s (begun at start_t), from the stretches
    completed before it: the first age on a 60 s grid from min_idle at which it says IDLE, its thin-evidence
    fallback counted as IDLE once the rule's whole window is idle. inf: not within the stretch. The backtest and
    the live service both replay past stretches with this one function."""
    ages = np.arange(params.min_idle_s, length_s, REPLAY_TICK_S)
    if not len(ages):
        return np.inf
    k, _ = first_idle(ages, history_s, history_start_t, start_t, prior, rule, params, break_even_s, restart_cost_s,
                      ages >= rule.window_s - 1e-9)
    return np.inf if k is None else float(ages[k])


@dataclass(frozen=True)
class Trust:
    """Earned trust: over this instance's completed idle stretches, what the learned wait was worth minus what a
    fixed wait of `trust_wait` was worth (GPU-s per GPU, a false stop counted at the policy's cost)."""

    edge_s: float
    stretches: int

    def trusted(self, params: AdaptiveParams) -> bool:
        return params.trust_wait_s is None or self.edge_s >= -params.trust_margin_h * 3600.0 - 1e-6


NO_TRUST = Trust(0.0, 0)


def stretch_edge(length_s: float, mark_age_s: float, rule: Rule, params: AdaptiveParams, break_even_s: float,
                 restart_cost_s: float, window_floor_s: float) -> float:
    """One completed stretch's contribution to the trust: the learned mark against the fixed wait's. Both marks
    are at least window_floor_s (the rule's window where the block may only hold its rule back)."""
    assert params.trust_wait_s is not None
    lead, lam = float(rule.warning_lead_s), params.false_stop_cost_h * 3600.0
    learned = stop_value(length_s, max(mark_age_s, window_floor_s), lead, break_even_s, restart_cost_s, lam)
    fixed = stop_value(length_s, max(params.trust_wait_s, window_floor_s), lead, break_even_s, restart_cost_s, lam)
    return learned - fixed


def trust_of(history_s, history_start_t, prior_at: Callable[[float | None], FleetPrior], rule: Rule,
             params: AdaptiveParams, break_even_s: float, restart_cost_s: float, window_floor_s: float,
             resume: Trust = NO_TRUST) -> Trust:
    """The trust from an instance's completed stretches (oldest first), each replayed on the ones before it with
    prior_at(its start) as the fleet prior. The backtest accumulates the same sum stretch by stretch.
    resume: the trust of the first resume.stretches of them, already replayed (only the later ones are)."""
    h = [float(x) for x in history_s]
    starts = None if history_start_t is None or len(history_start_t) != len(h) else list(history_start_t)
    edge = resume.edge_s
    for k in range(resume.stretches, len(h)):
        length = h[k]
        t = None if starts is None else starts[k]
        age = replayed_mark_age(length, h[:k], None if starts is None else starts[:k], t, prior_at(t), rule, params,
                                break_even_s, restart_cost_s)
        edge += stretch_edge(length, age, rule, params, break_even_s, restart_cost_s, window_floor_s)
    return Trust(edge, len(h))


def _fixed_wait_reason(age_s: float, trust: Trust, params: AdaptiveParams) -> str:
    return f"idle {_fmt_min(age_s)}; {trust_note(trust, params)}"


def trust_note(trust: Trust, params: AdaptiveParams) -> str:
    """The words that say where the trust stands, for a reason."""
    wait = _fmt_min(params.trust_wait_s or 0.0)
    gain = trust.edge_s / 3600.0
    past = f"over this instance's {trust.stretches} past idle stretches"
    if not trust.trusted(params):
        return f"the learned wait is {-gain:.1f} GPU-h per GPU behind a fixed {wait} wait {past}: the fixed wait decides"
    if trust.edge_s > 1e-6:
        return f"the learned wait is {gain:.1f} GPU-h per GPU ahead of a fixed {wait} wait {past}"
    if trust.edge_s < -1e-6:
        return (f"the learned wait is {-gain:.1f} GPU-h per GPU behind a fixed {wait} wait {past}, within the "
                f"{params.trust_margin_h:g} GPU-h margin")
    return f"the learned wait has done as well as a fixed {wait} wait {past}"


def adaptive_verdicts(prep: Prepared, rule: Rule, params: AdaptiveParams,
                      base: np.ndarray | None = None, hold_back_only: bool = False) -> AdaptiveRun:
    """The learned verdict of every instance at every tick.

    hold_back_only: as the live service runs a rule's `learned:` block, the policy may only hold the rule's own
    IDLE back: IDLE only where the rule says IDLE and its whole window lies inside the idle stretch; every other
    verdict is the rule's. Otherwise (the backtest's `--adaptive`) it may say IDLE from `min_idle` of idleness,
    whatever the rule's window.
    """
    tr, s, times, hi = prep.trace, prep.settings, prep.grid.times, prep.grid.hi
    base = rule_verdicts(prep, rule) if base is None else base
    out = np.where(base == IDLE, UNDERUTILIZED, base).astype(np.int8)  # idle only where a stretch says so
    reasons: dict = {}
    # Too young at the start of its history (replay() applies the same grace after each restart).
    young = times[None, :] - prep.first_t[:, None] < params.restart_grace_s - 1e-9
    lead, be, cost = float(rule.warning_lead_s), s.break_even_s, s.restart_cost_s
    floor = floor_s(params, lead)
    stretches = [_stretches(prep, i) for i in range(tr.n_instances)]
    fleet = FleetHistory(prep, stretches, params, floor)
    window_floor = float(rule.window_s) if hold_back_only else 0.0
    for i in range(tr.n_instances):  # per instance and per idle stretch; the ticks inside are arrays
        starts, ends = stretches[i]
        history: list[float] = []  # completed stretches, oldest first
        history_start: list[float] = []  # and when each began
        trust = NO_TRUST
        for k in range(len(starts)):
            a, b = starts[k], ends[k]
            ja = int(np.searchsorted(hi, a + 1, side="left"))
            jb = int(np.searchsorted(hi, b, side="right"))
            t_start = tr.t0 + a * tr.step_s
            if not trust.trusted(params):  # the fixed wait decides this stretch
                assert params.trust_wait_s is not None
                ages = times[ja:jb] - t_start
                wait = max(params.trust_wait_s, window_floor)
                ok = (base[i, ja:jb] == IDLE) if hold_back_only else (base[i, ja:jb] != UNKNOWN)
                hit = np.flatnonzero((ages >= wait - 1e-9) & ok)
                if len(hit):
                    out[i, ja + hit] = IDLE
                    reasons[(i, int(a))] = _fixed_wait_reason(float(ages[hit[0]]), trust, params)
            elif jb > ja and times[jb - 1] - t_start >= min(params.min_idle_s, params.unusual_wait_s or be):
                ages = times[ja:jb] - t_start
                prior = fleet.prior_at(t_start)
                own, own_w, n_hist, scope = own_evidence(history, params, floor, history_start, t_start)
                ev = assess(own, prior, ages, lead, be, cost, params, own_w, scope)
                has_prior = params.prior_weight > 0 and len(prior.points) > 0
                learned, fallback = learned_masks(ev, ages, n_hist, has_prior, base[i, ja:jb] == IDLE, params, be)
                hit = np.flatnonzero(learned | fallback)
                if len(hit):
                    h0 = hit[0]
                    span = slice(ja + h0, jb)
                    if hold_back_only:
                        whole = ages[h0:] >= rule.window_s - 1e-9  # live: the window's max under the demand level
                        out[i, span] = np.where((base[i, span] == IDLE) & whole, IDLE, out[i, span])
                    else:
                        out[i, span] = np.where(base[i, span] != UNKNOWN, IDLE, UNKNOWN)
                    if learned[h0]:
                        reasons[(i, int(a))] = _idle_reason(ev, h0, prior, float(ages[h0]), lead, be, params)
                    else:
                        thin = not has_prior and n_hist < params.min_history
                        reasons[(i, int(a))] = _fallback_reason(thin, n_hist, float(ev.support[h0]),
                                                                float(ages[h0]), rule.name)
                    if params.trust_wait_s is not None:
                        reasons[(i, int(a))] += f"; {trust_note(trust, params)}"
            if b <= prep.last_idx[i]:  # completed (ended by demand): now part of the past
                length = (b - a) * tr.step_s
                if params.trust_wait_s is not None:  # what the learned wait would have made of it, as live
                    age = replayed_mark_age(length, history, history_start, t_start, fleet.prior_at(t_start), rule,
                                            params, be, cost)
                    trust = Trust(trust.edge_s + stretch_edge(length, age, rule, params, be, cost, window_floor),
                                  trust.stretches + 1)
                history.append(length)
                history_start.append(t_start)
    out[young & (out == IDLE)] = UNDERUTILIZED
    return AdaptiveRun(verdicts=out, reasons=reasons)


def stop_reason(prep: Prepared, run: AdaptiveRun, instance: str, stop_at: float) -> str:
    i = prep.trace.instance_ids.index(instance)
    k = int(np.floor((stop_at - prep.trace.t0) / prep.trace.step_s + 1e-9))
    d = prep.prev_demand[i, min(k, prep.trace.n_steps - 1)]
    start = prep.first_idx[i] if d < 0 else d + 1
    return run.reasons.get((i, int(start)), "")


def backtest_adaptive(prep: Prepared, rule: Rule, params: AdaptiveParams, oracle: np.ndarray | None = None,
                      base: np.ndarray | None = None, name: str | None = None,
                      hold_back_only: bool = False) -> tuple[Summary, Replay, AdaptiveRun]:
    run = adaptive_verdicts(prep, rule, params, base, hold_back_only)
    rep = replay(prep, run.verdicts, rule.warning_lead_s, max(float(rule.window_s), params.restart_grace_s))
    label = name or f"adaptive({params.label()}; fallback {rule.name})"
    oracle = oracle_net_seconds(prep) if oracle is None else oracle
    return summarise(label, prep, rep, rule, oracle), rep, run
