"""Issue 41 item 3: an idle policy that catches more idle time than a fixed window, held out by pod.

    python bench/bench_idle_policy.py [--chart docs/img/idle_policy_frontier.png]   # about 2 min on 2 cores
    python bench/bench_idle_policy.py --tuning-only   # stop when the picks are frozen (held-out pods not read)
    python bench/bench_idle_policy.py --features   # also the lull features' AUC on the tuning pods (+15 s)
    python bench/bench_idle_policy.py --held-out-trace PODS.csv   # the same frozen picks on other pods too

Data: the shared GenTD26 serving trace (95 pods, 22.8 h, 57 s step, `../shared/data/gpu_util_traces/`), the
only shared trace with per-workload activity (Helios and Philly are pool allocation counts). The pods are split
once, by pod, before anything is tuned: a pod whose id's SHA-256 is divisible by 3 is held out (37 pods), the
other 58 tune. Nothing of the held-out pods is read until the picks are frozen; they are then scored once, by the
engine's own replay (`engine.replay` + `summarise`: tick 60 s, 15-min warning, restart cost 10 min, false stop =
demand within 30 min of the stop, restart at demand > 5%), the fixed picks also by the project's CLI
(`gpufinops backtest --trace <held-out pods> --rules <picks> -o json`), whose figures the script checks equal.

Families, each replayed by the engine on the tuning pods:
- fixed: thresholds 1/5/10/20 % x windows 10 min .. 4 h (13) x stays_below/mean (104 rules);
- quiet window (built here only; not a rule option, see the verdict in docs/backtest.md): below 5 % for the window
  W, or, on an instance whose every GPU averaged at most m % over the lookback H, below 5 % for the shorter quiet
  window Q (only where W judges the instance busy: UNKNOWN stays UNKNOWN). W 90 min/2 h/3 h/4 h,
  Q 15/30/45/60/90 min, m 0.5/1/2/3/5 %, H 3 h/6 h (190 rules);
- two windows (built here only; not a rule option): every sample below X % for W (stays_below) AND every GPU's
  mean below Y % over the longer L (the engine's mean predicate over L): IDLE only where both are; where L cannot
  judge (too few samples, too young) UNKNOWN; after a restart too young for L. X 5/10/20 %, W 20 min .. 2 h (7),
  Y 1/2/3/5/10 %, L 3/4/6 h (315 rules);
- any of the three: the union, picked as one grid.
Two ways to pick, per family:
- in-sample (the earlier method): the rule with the most net GPU-h on the tuning pods at a false-stop rate at or
  under a cap (5/10/15/20 %);
- robust: the most net GPU-h among the rules whose false-stop rate, judged either on all the pick's pods or as
  the 60/70/80/90th percentile of its rates on 50 x 2 random halves of them, is at or under a pick cap (5 to 20 %
  by 2.5). Which (pick cap, quantile) is chosen by repeated k-fold by pod inside the tuning pods (20 x 5-fold: pick
  on 4/5, score on the fifth): for each goal cap, the configuration that saved the most out of fold at a mean
  out-of-fold false-stop rate at or under it; none, no pick. Choosing the best of 35 configurations on the same
  folds flatters that figure, so for fixed and two windows the whole procedure (its choice made inside each
  training fold) is cross-validated too (4 x 5-fold, 10 x 5-fold inside).
The picks are frozen (`--tuning-only` prints them and stops) before the held-out pods are read.

Figures: "% of ceiling" = net GPU-h saved as a share of the clairvoyant-with-lead ceiling's net GPU-h on the same
pods (`engine.ceiling_stops`: perfect foresight that still gives the 15-min warning; c = 2 GPU-h, so it makes no
false stop); score = net GPU-h - 2 x false stops. The held-out frontier of every rule of a family is drawn too,
marked "hindsight": it is chosen on the held-out pods themselves, so it is what the best rule of the family could
have done, not what tuning delivers.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpufinops.backtest.engine import (  # noqa: E402
    ACTIVE, IDLE, UNDERUTILIZED, BacktestSettings, Prepared, Replay, replay, rule_verdicts, summarise,
)
from gpufinops.decide.evaluate import coverage_ok  # noqa: E402
from gpufinops.backtest.sweep import rule_doc, rule_file_text  # noqa: E402
from gpufinops.backtest.traces import load_trace  # noqa: E402
from gpufinops.model import Action, Aggregation, Rule, Selector  # noqa: E402
from gpufinops.rules import duration_spec  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "gpu_util_traces"
TRACE = DATA / "alibaba_gentd26_pod_gpu_duty_cycle.csv"
CAPS = (0.05, 0.10, 0.15, 0.20)
GOAL_CAP, GOAL_PCT = 0.15, 35.0
SHIPPED = ("gpu-util-below-10pct-2h", 10.0, 7200)  # rules/idle-shutdown.yaml

FIXED_THRESHOLDS = (1.0, 5.0, 10.0, 20.0)
FIXED_WINDOWS_MIN = (10, 15, 20, 30, 45, 60, 75, 90, 105, 120, 150, 180, 240)
QUIET_THRESHOLD = 5.0  # the demand level: a warning only while no demand shows
QUIET_WINDOWS_MIN = (90, 120, 180, 240)
QUIET_SHORT_MIN = (15, 30, 45, 60, 90)
QUIET_MEAN_PCT = (0.5, 1.0, 2.0, 3.0, 5.0)
QUIET_LOOKBACK_H = (3, 6)
# Two windows: every sample below X % for W (the rule engine's stays_below) AND every GPU's mean below Y % over the
# longer L (its mean aggregation): both must say IDLE.
TWO_THRESHOLDS = (5.0, 10.0, 20.0)
TWO_WINDOWS_MIN = (20, 30, 45, 60, 75, 90, 120)
TWO_MEAN_PCT = (1.0, 2.0, 3.0, 5.0, 10.0)
TWO_LONG_H = (3, 4, 6)
BOOTSTRAP = 2000  # resamples of the held-out pods for the intervals
CV_SPLITS = 100  # random halves of the tuning pods for the cross-check
# The robust pick: a rule's false-stop rate on random halves of the pods it is picked on (INNER_HALVES splits, both
# halves of each), capped at this quantile of them; None = its rate on all those pods (the in-sample pick).
ROBUST_QUANTILES = (None, 0.6, 0.7, 0.8, 0.9)
PICK_CAPS = (0.05, 0.075, 0.10, 0.125, 0.15, 0.175, 0.20)  # the cap the robust pick applies, chosen by CV per goal cap
INNER_HALVES = 50
CV_REPEATS, CV_FOLDS = 20, 5  # repeated k-fold by pod: which quantile, judged on pods the pick did not see


def held_out(pod: str) -> bool:
    """The split, fixed before any tuning: by pod id, a third of the pods."""
    return int(hashlib.sha256(pod.encode()).hexdigest(), 16) % 3 == 0


def base_rule() -> Rule:
    return Rule(name="base", threshold_pct=5.0, window_s=3600, warning_lead_s=900, action=Action.STOP,
                selector=Selector(), min_coverage=0.8)


@dataclass(frozen=True)
class Quiet:
    """The quiet window: on an instance whose every GPU averaged at most mean_below_pct over the lookback, the
    rule's predicate over the shorter window_s is enough for IDLE (where the rule's own window judged it busy)."""

    window_s: int
    lookback_s: int
    mean_below_pct: float


@dataclass(frozen=True)
class Also:
    """A second window every GPU's mean must also be under: the rule's own window AND this one say IDLE."""

    window_s: int
    mean_below_pct: float


@dataclass(frozen=True)
class Policy:
    name: str
    rule: Rule  # the fixed rule (the quiet policy's long window; the two-window policy's short one)
    quiet: Quiet | None = None
    also: Also | None = None

    @property
    def grace_s(self) -> int:
        """After a restart, too young to judge until its longest window has samples again."""
        return max(self.rule.window_s, self.also.window_s if self.also else 0)


def fixed_policies() -> list[Policy]:
    out = []
    for thr, win, agg in itertools.product(FIXED_THRESHOLDS, FIXED_WINDOWS_MIN, Aggregation):
        kind = "below" if agg == Aggregation.STAYS_BELOW else "mean"
        name = f"{kind}-{thr:g}pct-{duration_spec(win * 60)}"
        out.append(Policy(name, replace(base_rule(), name=name, threshold_pct=thr, window_s=win * 60,
                                        aggregation=agg)))
    return out


def quiet_policies() -> list[Policy]:
    out = []
    for win, short, mean, look in itertools.product(QUIET_WINDOWS_MIN, QUIET_SHORT_MIN, QUIET_MEAN_PCT,
                                                    QUIET_LOOKBACK_H):
        if short >= win:
            continue
        name = (f"below-{QUIET_THRESHOLD:g}pct-{duration_spec(win * 60)}-quiet-{duration_spec(short * 60)}"
                f"-mean{mean:g}pct-{look}h")
        rule = replace(base_rule(), name=name, threshold_pct=QUIET_THRESHOLD, window_s=win * 60)
        out.append(Policy(name, rule, Quiet(window_s=short * 60, lookback_s=look * 3600, mean_below_pct=mean)))
    return out


def two_window_policies() -> list[Policy]:
    out = []
    for thr, win, mean, long_h in itertools.product(TWO_THRESHOLDS, TWO_WINDOWS_MIN, TWO_MEAN_PCT, TWO_LONG_H):
        name = f"below-{thr:g}pct-{duration_spec(win * 60)}-and-mean-{mean:g}pct-{long_h}h"
        rule = replace(base_rule(), name=name, threshold_pct=thr, window_s=win * 60)
        out.append(Policy(name, rule, also=Also(window_s=long_h * 3600, mean_below_pct=mean)))
    return out


def quiet_instances(prep: Prepared, rule: Rule, q: Quiet) -> np.ndarray:
    """Per instance and tick: every GPU's mean activity over the lookback at or under the level, with the rule's
    min_coverage of the lookback's samples on every GPU (too few samples is never quiet)."""
    ws = prep.window(q.lookback_s)
    gpu_rows = prep.trace.gpu_instance
    min_count = np.full((prep.trace.n_instances, ws.count.shape[1]), np.inf)
    np.minimum.at(min_count, gpu_rows, ws.count)
    covered = coverage_ok(min_count, prep.settings.expected_samples(q.lookback_s, prep.trace.step_s), rule.min_coverage)
    with np.errstate(invalid="ignore"):
        gpu_quiet = ws.mean <= q.mean_below_pct  # NaN (no sample) is not quiet
    every = np.ones_like(covered)
    np.logical_and.at(every, gpu_rows, gpu_quiet)
    return covered & every


def policy_verdicts(prep: Prepared, policy: Policy) -> np.ndarray:
    """The fixed rule's verdicts (`engine.rule_verdicts`); with a quiet window, IDLE where the rule's own window
    judged the instance busy, it is quiet and the quiet window alone is IDLE. UNKNOWN stays UNKNOWN."""
    verdicts = rule_verdicts(prep, policy.rule)
    if policy.also is not None:
        # Both windows: IDLE only where the longer mean window is IDLE too; where it cannot judge (too few
        # samples, too young) UNKNOWN, never a stop; where it judges the pod busy, its verdict (cancels a mark).
        long = rule_verdicts(prep, replace(policy.rule, window_s=policy.also.window_s,
                                           threshold_pct=policy.also.mean_below_pct, aggregation=Aggregation.MEAN))
        out = verdicts.copy()
        idle = verdicts == IDLE
        out[idle] = long[idle]
        return out
    if policy.quiet is None:
        return verdicts
    short = rule_verdicts(prep, replace(policy.rule, window_s=policy.quiet.window_s))
    judged_busy = (verdicts == ACTIVE) | (verdicts == UNDERUTILIZED)
    out = verdicts.copy()
    out[judged_busy & (short == IDLE) & quiet_instances(prep, policy.rule, policy.quiet)] = IDLE
    return out


@dataclass(frozen=True)
class Point:
    policy: Policy
    stops: int
    false_stops: int
    net_gpu_hours: float
    ceiling_net_gpu_hours: float
    score: float
    per_pod: np.ndarray | None = None  # (3, pods): stops, false stops, net GPU-h

    @property
    def false_rate(self) -> float:
        return self.false_stops / self.stops if self.stops else 0.0

    @property
    def pct(self) -> float:
        return 100.0 * self.net_gpu_hours / self.ceiling_net_gpu_hours if self.ceiling_net_gpu_hours > 0 else 0.0


def per_pod(prep: Prepared, rep: Replay) -> np.ndarray:
    a, n = rep.arrays, prep.trace.n_instances
    inst = a["instance"].astype(np.int64)
    restarted = ~np.isnan(a["restart_at"])
    net_s = (a["stopped_s"] - np.where(restarted, prep.settings.restart_cost_s, 0.0)) * prep.gpus[inst]
    return np.stack([np.bincount(inst, minlength=n), np.bincount(inst, weights=a["false_stop"].astype(float),
                                                                   minlength=n),
                     np.bincount(inst, weights=net_s, minlength=n) / 3600])


def replay_all(prep: Prepared, policies: list[Policy]) -> list[Point]:
    """Each policy through the engine's own replay (the rule's lead; its window as the grace after a restart)."""
    out = []
    for p in policies:
        rep = replay(prep, policy_verdicts(prep, p), p.rule.warning_lead_s, p.grace_s)
        s = summarise(p.name, prep, rep, p.rule)
        out.append(Point(p, s.stops, s.false_stops, s.net_gpu_hours, s.ceiling_net_gpu_hours, s.score,
                         per_pod(prep, rep)))
    return out


def ceiling_per_pod(prep: Prepared, lead_s: float) -> np.ndarray:
    c = prep.ceiling(lead_s)
    return np.bincount(c.instance, weights=c.net_s, minlength=prep.trace.n_instances) / 3600


def pick(points: list[Point], cap: float) -> Point | None:
    """The most net GPU-h at a false-stop rate at or under the cap (ties: the first in the grid's order)."""
    ok = [p for p in points if p.stops and p.false_rate <= cap + 1e-12]
    return max(ok, key=lambda p: p.net_gpu_hours) if ok else None


def frontier(points: list[Point]) -> list[Point]:
    """Rules no other rule beats on both false-stop rate (lower) and net GPU-h (higher), by false-stop rate."""
    ordered = sorted((p for p in points if p.stops), key=lambda p: (p.false_rate, -p.net_gpu_hours))
    front, best = [], -np.inf
    for p in ordered:
        if p.net_gpu_hours > best + 1e-9:
            front.append(p)
            best = p.net_gpu_hours
    return front


def interval(p: Point, ceiling: np.ndarray, rng: np.random.Generator) -> tuple[tuple[float, float], tuple[float, float]]:
    """90% bootstrap intervals over pods (resampled with replacement) of the false-stop rate and the % of ceiling."""
    assert p.per_pod is not None
    n = len(ceiling)
    idx = rng.integers(0, n, size=(BOOTSTRAP, n))
    stops, false, net = (p.per_pod[k][idx].sum(axis=1) for k in range(3))
    rate = 100 * false / np.maximum(stops, 1)
    pct = 100 * net / np.maximum(ceiling[idx].sum(axis=1), 1e-9)
    return tuple(np.percentile(rate, (5, 95))), tuple(np.percentile(pct, (5, 95)))  # type: ignore[return-value]


def cross_check(tuned: dict[str, list[Point]], ceiling: np.ndarray, cap: float, rng: np.random.Generator) -> dict:
    """Within the tuning pods only: pick on a random half at the cap, score on the other half, CV_SPLITS times.
    What the tuning data said before the held-out pods were read (mean false-stop rate, mean % of ceiling)."""
    n = len(ceiling)
    out = {}
    for fam, points in tuned.items():
        per = np.stack([p.per_pod for p in points])  # type: ignore[misc]
        rates, pcts = [], []
        for _ in range(CV_SPLITS):
            a = np.zeros(n, dtype=bool)
            a[rng.permutation(n)[: n // 2]] = True
            sa, sb = per[:, :, a].sum(axis=2), per[:, :, ~a].sum(axis=2)
            rate_a = np.where(sa[:, 0] > 0, sa[:, 1] / np.maximum(sa[:, 0], 1), np.inf)
            ok = np.flatnonzero(rate_a <= cap + 1e-12)
            if not len(ok):
                continue
            k = ok[np.argmax(sa[ok, 2])]
            rates.append(100 * sb[k, 1] / max(sb[k, 0], 1))
            pcts.append(100 * sb[k, 2] / ceiling[~a].sum())
        out[fam] = (float(np.mean(rates)), float(np.mean(pcts)))
    return out


def stacked(points: list[Point]) -> np.ndarray:
    """(rules, 3, pods): stops, false stops, net GPU-h of each rule on each pod."""
    return np.stack([p.per_pod for p in points])  # type: ignore[misc]


def half_rate_quantiles(per: np.ndarray, pods: np.ndarray, rng: np.random.Generator) -> dict:
    """Each rule's false-stop rate as the pick would judge it on these pods: for None, on all of them; for a
    quantile q, the q-quantile of its rates on random halves of them (a half where it never stops is left out)."""
    sub = per[:, :, pods]
    total = sub.sum(axis=2)
    m = len(pods)
    masks = np.zeros((INNER_HALVES, m))
    for h in range(INNER_HALVES):
        masks[h, rng.permutation(m)[: m // 2]] = 1.0
    a = np.einsum("rkp,hp->rhk", sub, masks)
    both = np.concatenate([a, total[:, None, :] - a], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(both[..., 0] > 0, both[..., 1] / both[..., 0], np.nan)
        out: dict = {None: np.where(total[:, 0] > 0, total[:, 1] / np.maximum(total[:, 0], 1), np.inf)}
    stopped = total[:, 0] > 0  # a rule that never stops here has no rate (and is not picked)
    for q in ROBUST_QUANTILES:
        if q is not None:
            out[q] = np.full(len(per), np.inf)
            out[q][stopped] = np.nanquantile(rates[stopped], q, axis=1)
    return out


def robust_pick(per: np.ndarray, pods: np.ndarray, rates: np.ndarray, cap: float) -> int | None:
    """The rule with the most net GPU-h on these pods whose judged false-stop rate is at or under the cap (ties:
    the first in the grid's order)."""
    ok = np.flatnonzero(rates <= cap + 1e-12)
    if not len(ok):
        return None
    net = per[ok, 2][:, pods].sum(axis=1)
    return int(ok[np.argmax(net)])


def nested_cv(per: np.ndarray, ceiling: np.ndarray, rng: np.random.Generator,
              repeats: int = CV_REPEATS) -> tuple[np.ndarray, np.ndarray]:
    """Repeated k-fold by pod, within the tuning pods: pick on k-1 folds with every (pick cap, quantile), score the
    pick on the fold it did not see. Out-of-fold false-stop rate and % of ceiling over all the tuning pods, per
    repeat: arrays (pick caps, quantiles, repeats)."""
    n = per.shape[2]
    shape = (len(PICK_CAPS), len(ROBUST_QUANTILES), repeats)
    stops, false, net = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for r in range(repeats):
        fold = rng.permutation(n) % CV_FOLDS
        for f in range(CV_FOLDS):
            train, test = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
            rates = half_rate_quantiles(per, train, rng)
            for (i, cap), (j, q) in itertools.product(enumerate(PICK_CAPS), enumerate(ROBUST_QUANTILES)):
                k = robust_pick(per, train, rates[q], cap)
                if k is None:
                    continue
                got = per[k][:, test].sum(axis=1)
                stops[i, j, r] += got[0]
                false[i, j, r] += got[1]
                net[i, j, r] += got[2]
    return 100 * false / np.maximum(stops, 1), 100 * net / ceiling.sum()


def chosen_config(cv_rate: np.ndarray, cv_pct: np.ndarray, target: float) -> tuple[float, float | None] | None:
    """The (pick cap, quantile) whose picks saved the most out of fold at a mean out-of-fold false-stop rate at or
    under the target; None if no configuration kept to it."""
    rate, pct = cv_rate.mean(axis=2), cv_pct.mean(axis=2)
    ok = np.argwhere(rate <= 100 * target + 1e-9)
    if not len(ok):
        return None
    i, j = ok[np.argmax(pct[ok[:, 0], ok[:, 1]])]
    return PICK_CAPS[i], ROBUST_QUANTILES[j]


def whole_procedure_cv(per: np.ndarray, ceiling: np.ndarray, rng: np.random.Generator, target: float,
                       repeats: int = 4, inner_repeats: int = 10) -> tuple[np.ndarray, np.ndarray, int]:
    """The robust pick's own out-of-fold figure, its choice of (pick cap, quantile) included: on each k-1 folds the
    whole procedure runs (its own repeated k-fold, the choice, the pick), and the pick is scored on the fold left
    out. The out-of-fold rate above is optimistic by that choice (the best of the configurations on the same
    folds); this is not. Per repeat: false-stop rate, % of ceiling; and how many times the procedure made no pick."""
    n = per.shape[2]
    rates, pcts, declined = [], [], 0
    for _ in range(repeats):
        fold = rng.permutation(n) % CV_FOLDS
        stops = false = net = 0.0
        for f in range(CV_FOLDS):
            train, test = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
            cv_rate, cv_pct = nested_cv(per[:, :, train], ceiling[train], rng, inner_repeats)
            config = chosen_config(cv_rate, cv_pct, target)
            if config is None:
                declined += 1
                continue
            k = robust_pick(per, train, half_rate_quantiles(per, train, rng)[config[1]], config[0])
            if k is None:
                declined += 1
                continue
            got = per[k][:, test].sum(axis=1)
            stops, false, net = stops + got[0], false + got[1], net + got[2]
        rates.append(100 * false / max(stops, 1))
        pcts.append(100 * net / ceiling.sum())
    return np.array(rates), np.array(pcts), declined


def q_words(q: float | None) -> str:
    return "in-sample" if q is None else f"q{100 * q:g}"


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """Mann-Whitney AUC (ties count half): P(score of a positive > score of a negative)."""
    pos, neg = int(label.sum()), int((~label).sum())
    ranks = pd.Series(score).rank(method="average").to_numpy()
    return float((ranks[label].sum() - pos * (pos + 1) / 2) / (pos * neg)) if pos and neg else float("nan")


def lull_features(trace, memory: np.ndarray | None, lead_s: float, break_even_s: float) -> pd.DataFrame:
    """The tuning pods' lulls (samples at or under the 5 % demand level), seen r = 5/10/20/30 min in: label = the
    lull lasts lead + break-even more (a warning now would not end in a false stop), and what a policy could know
    then. Lulls cut short by the end of a pod's history before the label is known are left out."""
    step, need = trace.step_s, lead_s + break_even_s
    activity = trace.instance_activity_max()  # by instance (trace.util's rows are GPUs, in the file's order)
    rows = []
    for i in range(trace.n_instances):  # per pod and lull: a few thousand lulls
        a = activity[i]
        valid = np.flatnonzero(~np.isnan(a))
        if len(valid) < 10:
            continue
        lo, hi = valid[0], valid[-1]
        busy = np.nan_to_num(a, nan=0.0) > QUIET_THRESHOLD
        edges = np.flatnonzero(np.diff(np.concatenate([[True], busy[lo:hi + 1], [True]]).astype(np.int8))) + lo
        past: list[float] = []
        span = int(3 * 3600 / step)
        for s, e in zip(edges[0::2], edges[1::2]):  # lull = samples s .. e-1
            length, ended = (e - s) * step, e <= hi
            before = a[max(lo, s - span):s]
            busy_share = float(np.mean(before[~np.isnan(before)] > QUIET_THRESHOLD)) if np.sum(~np.isnan(before)) >= 0.8 * span else np.nan
            for r in (5, 10, 20, 30):
                k = int(round(r * 60 / step))
                rest = length - k * step
                if rest < 0 or (not ended and rest < need):
                    continue
                rows.append({"r": r, "label": rest >= need, "busy_share_3h": busy_share,
                             "mean_before": float(np.nanmean(a[max(lo, s - 30):s])) if s > lo else np.nan,
                             "longest_earlier_lull": max(past, default=0.0),
                             "earlier_long_share": float(np.mean(np.array(past) >= r * 60 + need)) if past else np.nan,
                             "memory_mib": memory[i, s + k - 1] if memory is not None else np.nan})
            past.append(length)
    return pd.DataFrame(rows)


def print_feature_aucs(trace, settings: BacktestSettings, lead_s: float) -> None:
    mem = None
    mem_path = DATA / "alibaba_gentd26_pod_gpu_memory_used_bytes.csv"
    if mem_path.exists():
        m = pd.read_csv(mem_path)
        m = m[m["container_ip"].astype(str).isin(set(trace.instance_ids))]
        col = np.rint((m["timestamp_anon"].to_numpy() - trace.t0) / trace.step_s).astype(np.int64)
        row = pd.Index(trace.instance_ids).get_indexer(m["container_ip"].astype(str))
        ok = (col >= 0) & (col < trace.n_steps) & (row >= 0)
        mem = np.full((trace.n_instances, trace.n_steps), np.nan)  # by instance, as lull_features reads it
        mem[row[ok], col[ok]] = m["value"].to_numpy()[ok] / 2**20
        idle = (trace.instance_activity_max() == 0) & ~np.isnan(mem)
        print(f"[idle policy] tuning pods: {100 * np.mean(mem[idle] > 1024):.1f}% of zero-activity samples hold more "
              f"than 1 GiB of GPU memory (median {np.median(mem[idle]) / 1024:.1f} GiB)")
    df = lull_features(trace, mem, lead_s, settings.break_even_s)
    signs = {"busy_share_3h": -1, "mean_before": -1, "longest_earlier_lull": 1, "earlier_long_share": 1,
             "memory_mib": -1}
    print("[idle policy] tuning pods: AUC for \"the lull lasts lead + break-even more\", r min into it:")
    for r, g in df.groupby("r"):
        parts = []
        for f, sign in signs.items():
            known = g[f].notna().to_numpy()
            parts.append(f"{f} {auc(sign * g[f].to_numpy()[known], g['label'].to_numpy()[known]):.2f}")
        print(f"  r {r:2d} min: {len(g)} lulls, {100 * g['label'].mean():.0f}% long; " + ", ".join(parts))


def score_fixed_by_cli(held_csv: Path, rules: list[Rule], workdir: Path) -> dict[str, dict]:
    """The fixed picks and the shipped rule on the held-out pods, by the project's own CLI."""
    rule_path = workdir / "picks.yaml"
    rule_path.write_text(rule_file_text([rule_doc(r, "picked on the tuning pods (bench/bench_idle_policy.py)")
                                         for r in rules]))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", "from gpufinops.cli.app import main; main()", "backtest", "--trace", str(held_csv),
           "--rules", str(rule_path), "--tick", "60", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"gpufinops backtest failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {r["policy"]: r for r in json.loads(proc.stdout)["results"]}


def line(label: str, p: Point, ceiling: np.ndarray, rng: np.random.Generator, tuning: Point | None = None,
         oof: tuple[float, float] | None = None) -> str:
    (r_lo, r_hi), (p_lo, p_hi) = interval(p, ceiling, rng)
    tuned = f"{100 * tuning.false_rate:.0f}% / {tuning.pct:.1f}%" if tuning is not None else "—"
    if oof is not None:
        tuned = f"out of fold {oof[0]:.1f}% / {oof[1]:.1f}%"
    return (f"| {label} | {p.policy.name} | {p.stops} | {p.false_stops} | {100 * p.false_rate:.1f}% "
            f"({r_lo:.0f}–{r_hi:.0f}) | {p.net_gpu_hours:,.1f} | {p.pct:.1f}% ({p_lo:.0f}–{p_hi:.0f}) | "
            f"{p.score:,.1f} | {tuned} |")


ANY = "any of the three"  # the union of the families' rules, picked as one grid
COLORS = {"fixed": "#1f77b4", "quiet window": "#d62728", "two windows": "#2ca02c", ANY: "#9467bd"}


def chart(path: Path, held_fronts: dict[str, list[Point]], held_picks: dict[str, list[tuple[float, Point]]],
          held_robust: dict[str, list[tuple[float, Point]]], intervals: dict, shipped: Point, n_tune: int,
          n_held: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    ax.add_patch(plt.Rectangle((0, GOAL_PCT), 100 * GOAL_CAP, 100 - GOAL_PCT, color="#2ca02c", alpha=0.08,
                               label=f"goal: >= {GOAL_PCT:g}% at <= {100 * GOAL_CAP:g}% false stops"))
    for fam, front in held_fronts.items():
        ax.step([100 * p.false_rate for p in front], [p.pct for p in front], where="post", color=COLORS[fam],
                alpha=0.35, linewidth=1, linestyle="--", label=f"{fam}: best rule per false-stop rate (hindsight)")
    for fam, picks in held_picks.items():  # the in-sample picks: hollow, no interval (the table has them)
        seen = set()
        for _, p in picks:
            if p.policy.name in seen:
                continue
            seen.add(p.policy.name)
            ax.scatter([100 * p.false_rate], [p.pct], s=40, facecolors="none", edgecolors=COLORS[fam], alpha=0.8,
                       label=f"{fam}: in-sample pick" if len(seen) == 1 else None)
    for fam, picks in held_robust.items():  # the robust picks, with 90% intervals
        by_point: dict[str, list[float]] = {}
        for target, p in picks:
            by_point.setdefault(p.policy.name, []).append(target)
        first = True
        for target, p in picks:
            if by_point[p.policy.name][0] != target:
                continue  # one marker per rule (two targets can pick the same one)
            (r_lo, r_hi), (p_lo, p_hi) = intervals[p.policy.name]
            x, y = 100 * p.false_rate, p.pct
            ax.errorbar([x], [y], xerr=[[x - r_lo], [r_hi - x]], yerr=[[y - p_lo], [p_hi - y]], fmt="o",
                        color=COLORS[fam], markersize=7, elinewidth=0.8, capsize=2, alpha=0.9,
                        label=f"{fam}: robust pick, scored held out (90% interval)" if first else None)
            first = False
            targets = "/".join(f"{100 * c:g}" for c in by_point[p.policy.name])
            ax.annotate(f"<= {targets}% out of fold", (x, y), fontsize=7, xytext=(5, 4), textcoords="offset points",
                        color=COLORS[fam])
    ax.scatter([100 * shipped.false_rate], [shipped.pct], marker="s", s=60, color="black",
               label=f"shipped {shipped.policy.name}", zorder=5)
    ax.set_xlim(0, 45)
    ax.set_ylim(0, 75)
    ax.set_xlabel("false-stop rate on the held-out pods (%)")
    ax.set_ylabel("net GPU-h saved, % of the clairvoyant-with-lead ceiling")
    ax.set_title(f"Idle policies on {n_held} held-out GenTD26 serving pods (tuned on the other {n_tune})")
    ax.legend(fontsize=6.5, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def print_cv(fam: str, cv_rate: np.ndarray, cv_pct: np.ndarray) -> None:
    print(f"  {fam} (pick cap: " + ", ".join(f"{100 * c:g}%" for c in PICK_CAPS) + "):")
    for j, q in enumerate(ROBUST_QUANTILES):
        print(f"    {q_words(q):9s}: " + "; ".join(
            f"{cv_rate[i, j].mean():.0f}% ({np.percentile(cv_rate[i, j], 10):.0f}–{np.percentile(cv_rate[i, j], 90):.0f})"
            f" / {cv_pct[i, j].mean():.0f}%" for i in range(len(PICK_CAPS))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chart", default=str(ROOT / "docs" / "img" / "idle_policy_frontier.png"))
    ap.add_argument("--features", action="store_true", help="also the lull features' AUC on the tuning pods")
    ap.add_argument("--tuning-only", action="store_true",
                    help="stop when the picks are frozen: the held-out pods are not read")
    ap.add_argument("--held-out-trace", default=None,
                    help="also score the same frozen picks on this trace's instances (e.g. pods never shared)")
    args = ap.parse_args()
    t_all = time.perf_counter()
    rng = np.random.default_rng(41)
    trace = load_trace(TRACE)
    held = np.array([held_out(p) for p in trace.instance_ids])
    tune_idx, held_idx = np.flatnonzero(~held), np.flatnonzero(held)
    settings = BacktestSettings(tick_s=60.0)
    lead = float(base_rule().warning_lead_s)
    prep = Prepared(trace.select(tune_idx), settings)
    if args.features:
        print_feature_aucs(prep.trace, settings, lead)
    families = {"fixed": fixed_policies(), "quiet window": quiet_policies(), "two windows": two_window_policies()}
    tuned = {fam: replay_all(prep, policies) for fam, policies in families.items()}
    tuned[ANY] = [pt for points in tuned.values() for pt in points]
    tune_ceiling = ceiling_per_pod(prep, lead)
    print(f"[idle policy] GenTD26: {len(tune_idx)} pods tune, {len(held_idx)} held out (by pod); tuning ceiling "
          f"{tune_ceiling.sum():,.1f} net GPU-h; " + ", ".join(f"{fam} {len(p)} rules" for fam, p in families.items())
          + f", replayed in {time.perf_counter() - t_all:.0f} s")
    cv = cross_check(tuned, tune_ceiling, GOAL_CAP, rng)
    print(f"[idle policy] within the tuning pods ({CV_SPLITS} random halves: picked in-sample at <= "
          f"{100 * GOAL_CAP:g}% on one, scored on the other): " + "; ".join(
              f"{fam} {r:.0f}% false stops, {p:.0f}% of ceiling" for fam, (r, p) in cv.items()))

    # The in-sample picks (the previous method): the most net GPU-h at a tuning false-stop rate <= the cap.
    picks = {fam: [(cap, p) for cap in CAPS if (p := pick(points, cap)) is not None]
             for fam, points in tuned.items() if fam != ANY}
    # The robust picks: which quantile of a rule's rate on random halves to cap is chosen by repeated k-fold by pod
    # within the tuning pods (the mean out-of-fold false-stop rate at or under the cap), then applied to all of them.
    print(f"[idle policy] within the tuning pods, {CV_REPEATS} x {CV_FOLDS}-fold by pod: the pick made on 4/5 of the "
          f"pods at each cap, capping the in-sample rate or a quantile of the rate on {INNER_HALVES} x 2 random "
          "halves; out-of-fold false-stop rate mean (10th–90th percentile over repeats) / % of ceiling:")
    robust: dict[str, list[tuple[float, Point, str, float, float]]] = {}  # goal cap, pick, how, out-of-fold
    all_pods = np.arange(len(tune_idx))
    for fam, points in tuned.items():
        per = stacked(points)
        cv_rate, cv_pct = nested_cv(per, tune_ceiling, rng)
        print_cv(fam, cv_rate, cv_pct)
        rates = half_rate_quantiles(per, all_pods, rng)
        robust[fam] = []
        for target in CAPS:
            config = chosen_config(cv_rate, cv_pct, target)
            if config is None:
                print(f"    for <= {100 * target:g}% out of fold: no configuration kept to it, no pick")
                continue
            cap, q = config
            k = robust_pick(per, all_pods, rates[q], cap)
            i, j = PICK_CAPS.index(cap), ROBUST_QUANTILES.index(q)
            if k is not None:
                robust[fam].append((target, points[k], f"{q_words(q)} <= {100 * cap:g}%",
                                    float(cv_rate[i, j].mean()), float(cv_pct[i, j].mean())))
    whole: dict[str, float] = {}
    for fam in ("fixed", "two windows"):  # the whole procedure, its choice included (about 30 s each)
        per = stacked(tuned[fam])
        w_rate, w_pct, declined = whole_procedure_cv(per, tune_ceiling, np.random.default_rng(43), GOAL_CAP)
        whole[fam] = float(w_rate.mean())
        print(f"[idle policy] {fam}, the whole robust procedure at <= {100 * GOAL_CAP:g}% (its choice of pick cap "
              f"and quantile made inside each training fold), out of fold in the tuning pods: {w_rate.mean():.1f}% "
              f"false stops ({w_rate.min():.0f}–{w_rate.max():.0f} over {len(w_rate)} repeats), {w_pct.mean():.1f}% "
              f"of ceiling; no pick on {declined} of {len(w_rate) * CV_FOLDS} training folds")
    print("[idle policy] robust picks, frozen (on all the tuning pods: false rate / % of ceiling; out of fold: "
          "false rate / %):")
    for fam, rows in robust.items():
        for target, pt, how, r, pc in rows:
            print(f"  {fam}, <= {100 * target:g}% ({how}): {pt.policy.name}  {100 * pt.false_rate:.0f}% / "
                  f"{pt.pct:.1f}%; out of fold {r:.1f}% / {pc:.1f}%")
    if args.tuning_only:
        print(f"[idle policy] --tuning-only: the held-out pods were not read; {time.perf_counter() - t_all:.0f} s")
        return
    shipped = Policy(SHIPPED[0], replace(base_rule(), name=SHIPPED[0], threshold_pct=SHIPPED[1], window_s=SHIPPED[2]))

    # ---- frozen: the held-out pods are read from here on.
    held_prep = Prepared(trace.select(held_idx), settings)
    held_ceiling = ceiling_per_pod(held_prep, lead)
    chosen = ({p.policy.name: p.policy for ps in picks.values() for _, p in ps}
              | {row[1].policy.name: row[1].policy for rows in robust.values() for row in rows}
              | {shipped.name: shipped})
    held_pts = {pt.policy.name: pt for pt in replay_all(held_prep, list(chosen.values()))}
    with tempfile.TemporaryDirectory(prefix="idle-policy-") as tmp:
        workdir = Path(tmp)
        df = pd.read_csv(TRACE)
        keep = {trace.instance_ids[i] for i in held_idx}
        held_csv = workdir / "gentd26_held_out.csv"
        df[df["container_ip"].astype(str).isin(keep)].to_csv(held_csv, index=False)
        cli = score_fixed_by_cli(held_csv, [p.rule for p in chosen.values() if p.quiet is None and p.also is None],
                                 workdir)
    for name, row in cli.items():  # the CLI and this replay agree on every fixed rule
        pt = held_pts[name]
        assert (row["stops"], row["false_stops"]) == (pt.stops, pt.false_stops), (name, row, pt)
        assert abs(row["net_gpu_hours"] - pt.net_gpu_hours) < 1e-6, (name, row, pt)
    held_picks = {fam: [(cap, held_pts[p.policy.name]) for cap, p in ps] for fam, ps in picks.items()}
    held_robust = {fam: [(target, held_pts[pt.policy.name]) for target, pt, *_ in rows] for fam, rows in robust.items()}

    header = ("| family, pick | rule | stops | false | false rate | net GPU-h | % of ceiling | score | "
              "on the tuning pods: false rate / % |\n|---|---|---|---|---|---|---|---|---|")
    print(f"\n[idle policy] held out ({len(held_idx)} pods, ceiling {held_ceiling.sum():,.1f} net GPU-h; fixed rules "
          f"also by `gpufinops backtest --trace <held-out pods> --rules <picks> -o json`, same figures); "
          f"(90% bootstrap interval over the held-out pods). In-sample picks:")
    print(header)
    for fam, ps in picks.items():
        for cap, p in ps:
            print(line(f"{fam}, cap {100 * cap:g}%", held_pts[p.policy.name], held_ceiling, rng, p))
    print(line("shipped default", held_pts[shipped.name], held_ceiling, rng))
    print("\n[idle policy] robust picks (quantile chosen by cross-validation; last column: out of fold in the tuning "
          "pods):")
    print(header)
    for fam, rows in robust.items():
        for target, pt, how, r, pc in rows:
            print(line(f"{fam}, <= {100 * target:g}% out of fold ({how})", held_pts[pt.policy.name], held_ceiling, rng,
                       oof=(r, pc)))

    # Hindsight (reference only): every rule of each family on the held-out pods.
    held_fronts = {fam: frontier(replay_all(held_prep, policies)) for fam, policies in families.items()}
    print("\n[idle policy] frontier, false-stop rate -> % of ceiling (each point the best rule of its family at that "
          "rate; on the held-out pods this is hindsight):")
    for where, fronts in (("held out", held_fronts),
                          ("tuning", {f: frontier(p) for f, p in tuned.items() if f != ANY})):
        for fam, front in fronts.items():
            print(f"  {where:8s} {fam:12s}: " + "; ".join(f"{100 * p.false_rate:.0f}% -> {p.pct:.0f}%" for p in front
                                                          if p.false_rate <= 0.3))

    for fam, rows in robust.items():
        goal_rows = [row for row in rows if row[0] == GOAL_CAP]
        if not goal_rows:
            print(f"[idle policy] goal (>= {GOAL_PCT:g}% of the ceiling at <= {100 * GOAL_CAP:g}% false stops), {fam}: "
                  "no robust pick (no configuration kept to the cap out of fold in the tuning pods)")
        for _, pt, how, r, pc in goal_rows:
            h = held_pts[pt.policy.name]
            held_met = h.false_rate <= GOAL_CAP + 1e-12 and h.pct >= GOAL_PCT
            cv_rate = max(r, whole.get(fam, r))  # the whole procedure's, where it was cross-validated
            print(f"[idle policy] goal (>= {GOAL_PCT:g}% of the ceiling at <= {100 * GOAL_CAP:g}% false stops), "
                  f"{fam} robust pick {h.policy.name}: held out {h.pct:.1f}% at {100 * h.false_rate:.1f}% -> "
                  f"{'met' if held_met else 'not met'}; false stops out of fold in the tuning pods {r:.1f}% (the "
                  f"chosen configuration), {whole.get(fam, float('nan')):.1f}% (the whole procedure) -> "
                  f"{'met' if cv_rate <= 100 * GOAL_CAP else 'not met'}; ship only if both are met")
    if args.held_out_trace:
        other = Prepared(load_trace(args.held_out_trace), settings)
        other_ceiling = ceiling_per_pod(other, lead)
        other_pts = {pt.policy.name: pt for pt in replay_all(other, list(chosen.values()))}
        print(f"\n[idle policy] the same picks on {args.held_out_trace} ({other.trace.n_instances} instances, ceiling "
              f"{other_ceiling.sum():,.1f} net GPU-h):")
        print(header)
        for fam, ps in picks.items():
            for cap, p in ps:
                print(line(f"{fam}, cap {100 * cap:g}%", other_pts[p.policy.name], other_ceiling, rng, p))
        for fam, rows in robust.items():
            for target, pt, how, r, pc in rows:
                print(line(f"{fam}, <= {100 * target:g}% out of fold ({how})", other_pts[pt.policy.name],
                           other_ceiling, rng, oof=(r, pc)))
        print(line("shipped default", other_pts[shipped.name], other_ceiling, rng))
    intervals = {name: interval(pt, held_ceiling, np.random.default_rng(41)) for name, pt in held_pts.items()}
    chart(Path(args.chart), held_fronts, held_picks, held_robust, intervals, held_pts[shipped.name], len(tune_idx),
          len(held_idx))
    print(f"[idle policy] chart: {args.chart}; wall time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
