"""Backtest benchmarks (issue 5). Prints figures; run from the repository root:

    python bench/bench_backtest.py            # --perf, --policies and --cost
    python bench/bench_backtest.py --perf     # speed: 100 GPUs x 30 days x 20-rule sweep vs per-tick evaluate()
    python bench/bench_backtest.py --policies # fixed rules vs the learned policy on the shared traces (holdout)
    python bench/bench_backtest.py --cost     # both tuned for one false-stop cost, scored held out (backtest --tune)
    python bench/bench_backtest.py --tune-decision  # --tune's own call, made on the tuning half alone (~35 min)
    python bench/bench_backtest.py --trust    # earned trust live: replay all past lulls vs only the new one
    python bench/bench_backtest.py --ceiling  # fixed rules' score vs the clairvoyant-with-lead ceiling (issue 12)
    python bench/bench_backtest.py --early-warning  # the warning at the first idle sign, overlapping the window

Policies: every trace is split in two halves of its series (GenTD26 pods by
position in the sorted id list, Helios by VC, Philly by rank). The fixed-rule
sweep and the learned policy's settings are both tuned on one half; the
table reports the other half, which neither saw, next to the best fixed rule
tuned on that half itself (hindsight) at the learned policy's false-stop rate
or lower. Both directions (A -> B, B -> A) are run. The learned policy runs
over the rule it sits on live (5 min at the demand level; time of day +-3 h,
restart grace 2 h), the same without the time of day, and over the fixed pick
itself (backtest only: it may then stop before the pick's window), each tuned.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpufinops.backtest.adaptive import AdaptiveParams, backtest_adaptive  # noqa: E402
from gpufinops.backtest.engine import (  # noqa: E402
    BacktestSettings, Prepared, backtest_rule, oracle_net_seconds, rule_verdicts,
)
from gpufinops.backtest.reference import replay_per_tick  # noqa: E402
from gpufinops.backtest.sweep import candidates, pareto_front, run_sweep, suggest  # noqa: E402
from gpufinops.backtest.tune import (  # noqa: E402
    holdout, learned_grid, live_pairing as tune_live_pairing, recommend_learned, setting_text, split_halves,
)
from gpufinops.backtest.traces import Trace, from_arrays, load_trace, pool_ranks_trace  # noqa: E402
from gpufinops.model import Aggregation  # noqa: E402
from gpufinops.rules import load_rules  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "gpu_util_traces"


def synthetic_fleet(n_gpus: int, days: int, seed: int = 7) -> Trace:
    """A mixed fleet at 60 s: day-time trainers, bursty servers, notebooks idle at night, 1% missing."""
    rng = np.random.default_rng(seed)
    n = days * 1440
    minute = np.arange(n) % 1440
    day = (minute >= 8 * 60) & (minute < 19 * 60)
    util = np.zeros((n_gpus, n))
    for g in range(n_gpus):
        kind = g % 3
        if kind == 0:  # trainer during the day, input-bound bursts
            util[g] = np.where(day, np.where(rng.random(n) < 0.4, 100.0, 5.0), 0.0)
        elif kind == 1:  # serving: Poisson requests, 0 between
            util[g] = np.where(rng.random(n) < np.where(day, 0.3, 0.05), rng.uniform(10, 95, n), 0.0)
        else:  # notebook: random sessions of 1-4 h
            on = np.zeros(n, bool)
            for start in rng.choice(n, size=days * 2, replace=False):
                on[start:start + rng.integers(60, 240)] = True
            util[g] = np.where(on & (rng.random(n) < 0.5), rng.uniform(20, 90, n), 0.0)
    util[rng.random(util.shape) < 0.01] = np.nan
    return from_arrays(util, step_s=60.0, t0=1_700_000_000.0, source=f"synthetic {n_gpus}x{days}d")


def perf() -> None:
    base = load_rules([ROOT / "rules"])[0]
    sweep = candidates(base, thresholds=(1, 5, 10, 20, 40), windows_s=(600, 3600),
                       aggregations=(Aggregation.STAYS_BELOW, Aggregation.MEAN))
    assert len(sweep) == 20
    t = time.perf_counter()
    trace = synthetic_fleet(100, 30)
    t_gen = time.perf_counter() - t
    settings = BacktestSettings()
    t = time.perf_counter()
    prep = Prepared(trace, settings)
    t_prep = time.perf_counter() - t
    t = time.perf_counter()
    results = run_sweep(prep, sweep)
    t_sweep = time.perf_counter() - t
    front = pareto_front(results)
    stops = sum(r.stops for r in results)
    samples = trace.util.size
    print(f"[perf] fleet: {trace.util.shape[0]} GPUs x {trace.n_steps} samples (30 days at 60 s) = {samples:,} samples; "
          f"generated in {t_gen:.2f} s")
    print(f"[perf] vectorised: prepare {t_prep:.2f} s + 20-rule sweep {t_sweep:.2f} s = {t_prep + t_sweep:.2f} s "
          f"({stops:,} stops simulated, front of {len(front)})")

    # Baseline: one evaluate() per instance per tick (the live code path), on a subset, extrapolated.
    sub_gpus, sub_days, sub_rules = 2, 1, 2
    sub = trace.select(range(sub_gpus))
    sub = Trace(sub.instance_ids, sub.gpu_names, sub.gpu_instance, sub.t0, sub.step_s,
                sub.util[:, : sub_days * 1440], None, sub.source)
    t = time.perf_counter()
    for r in sweep[:sub_rules]:
        replay_per_tick(sub, r, settings)
    t_ref = time.perf_counter() - t
    scale = (100 / sub_gpus) * (30 / sub_days) * (20 / sub_rules)
    print(f"[perf] baseline per-tick evaluate(): {sub_gpus} GPUs x {sub_days} day x {sub_rules} rules in {t_ref:.2f} s "
          f"-> extrapolated to 100 GPUs x 30 days x 20 rules: {t_ref * scale:,.0f} s "
          f"({t_ref * scale / (t_prep + t_sweep):,.0f}x slower)")


# --------------------------------------------------------------------------- policies


def gentd26() -> tuple[Trace, Trace]:
    tr = load_trace(DATA / "alibaba_gentd26_pod_gpu_duty_cycle.csv")
    idx = np.arange(tr.n_instances)
    return tr.select(idx[idx % 2 == 0]), tr.select(idx[idx % 2 == 1])


def helios() -> tuple[Trace, Trace]:
    df = pd.read_parquet(DATA / "helios_earth_all16vc_cluster_sequence_1min.parquet")
    halves: list[list[Trace]] = [[], []]
    for k, (vc, g) in enumerate(sorted(df.groupby("vc"), key=lambda x: x[0])):
        g = g.sort_values("time")
        t0 = pd.Timestamp(g["time"].iloc[0]).timestamp()
        halves[k % 2].append(pool_ranks_trace(g["running_gpu_num"].to_numpy(), g["total_gpu_num"].to_numpy(),
                                              ranks=(0.2, 0.4, 0.6, 0.8, 0.95), step_s=60.0, t0=t0, name=f"helios/{vc}"))
    return tuple(_concat(h) for h in halves)  # type: ignore[return-value]


def philly() -> tuple[Trace, Trace]:
    df = pd.read_csv(DATA / "philly_node_sequence_helios_artifact.csv")
    t0 = pd.Timestamp(df["time"].iloc[0]).timestamp()
    ranks = np.linspace(0.5, 0.98, 12)
    mk = lambda rs: pool_ranks_trace(df["active"].to_numpy(), df["total"].to_numpy(), ranks=rs, step_s=60.0, t0=t0,
                                     name="philly")
    return mk(ranks[0::2]), mk(ranks[1::2])


def _concat(traces: list[Trace]) -> Trace:
    n = max(t.n_steps for t in traces)
    util = np.vstack([np.pad(t.util, ((0, 0), (0, n - t.n_steps)), constant_values=np.nan) for t in traces])
    ids = tuple(i for t in traces for i in t.instance_ids)
    return from_arrays(util, step_s=traces[0].step_s, t0=traces[0].t0, instance_ids=ids, source=traces[0].source)


LAMBDAS_H = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # false-stop cost: the policy's operating points
_GRID = list(itertools.product(LAMBDAS_H, (10.0, 30.0), (3.0, 8.0), (3600.0, 7200.0)))


def live_pairing(pick):
    """The rule a `learned:` block sits on live: stays at or under the demand level for 5 minutes."""
    return tune_live_pairing(pick, BacktestSettings().demand_pct)


# name -> (the rule the policy runs over, given the fixed pick; its 48 settings). Each family is tuned on its own.
FAMILIES = {
    "learned, live pairing": (live_pairing, [
        AdaptiveParams(false_stop_cost_h=lam, prior_weight=k, min_support=n, unusual_wait_s=w) for lam, k, n, w in _GRID]),
    "  same, no time of day": (live_pairing, [
        AdaptiveParams(false_stop_cost_h=lam, prior_weight=k, min_support=n, unusual_wait_s=w, time_of_day_s=0.0)
        for lam, k, n, w in _GRID]),
    "learned over the sweep pick": (lambda pick: pick, [
        AdaptiveParams(false_stop_cost_h=lam, prior_weight=k, min_support=n, unusual_wait_s=w) for lam, k, n, w in _GRID]),
}


# Replayed as the service runs a `learned:` block: the policy only holds the rule's IDLE back.
AS_LIVE = {"learned, live pairing", "  same, no time of day"}


def _hindsight(swept_b: list, rate: float):
    """The best swept fixed rule on B itself at or under a false-stop rate (None: none that safe)."""
    return max((s for s in swept_b if s.false_stop_rate <= rate + 1e-12), key=lambda s: s.net_gpu_hours, default=None)


def _tune(prep_a: Prepared, fixed, grid: list, orc_a, base_a, budget: float, hold: bool = False) -> AdaptiveParams:
    """Most net saving on A within the false-stop budget; if no setting fits, the safest one."""
    scored = [(backtest_adaptive(prep_a, fixed, p, orc_a, base_a, hold_back_only=hold)[0], p) for p in grid]
    ok = [x for x in scored if x[0].false_stop_rate <= budget]
    return (max(ok, key=lambda x: x[0].net_gpu_hours) if ok else min(scored, key=lambda x: x[0].false_stop_rate))[1]


def compare(name: str, tune: Trace, test: Trace, settings: BacktestSettings, out: list[dict], tally: dict) -> None:
    shipped = load_rules([ROOT / "rules"])
    seed = replace(shipped[0], name="seed mean<40% 10m", aggregation=Aggregation.MEAN, threshold_pct=40.0)
    t = time.perf_counter()
    prep_a = Prepared(tune, settings)
    swept = run_sweep(prep_a, candidates(shipped[0]))
    best = suggest(pareto_front(swept), max_false_stop_rate=0.1)
    fixed = best.rule if best else shipped[1]
    # Tune each learned family on A: most net saving within the same false-stop budget as the fixed pick on A
    # (at least 10%); if no setting fits, the safest one.
    orc_a = oracle_net_seconds(prep_a)
    budget = max(best.false_stop_rate if best else 0.1, 0.1)
    over = {fam: make(fixed) for fam, (make, _) in FAMILIES.items()}
    tuned = {fam: _tune(prep_a, over[fam], grid, orc_a, rule_verdicts(prep_a, over[fam]), budget, fam in AS_LIVE)
             for fam, (_, grid) in FAMILIES.items()}
    t_tune = time.perf_counter() - t

    prep_b = Prepared(test, settings)
    orc_b = oracle_net_seconds(prep_b)
    base_b = {fam: rule_verdicts(prep_b, rule) for fam, rule in over.items()}
    rows = [backtest_rule(prep_b, r, orc_b)[0] for r in (seed, *shipped)]
    rows.append(backtest_rule(prep_b, replace(fixed, name=f"sweep pick on the tuning half: {fixed.name}"), orc_b)[0])
    swept_b = run_sweep(prep_b, candidates(shipped[0]))
    learned_b = {}
    for fam, params in tuned.items():
        learned_b[fam] = backtest_adaptive(prep_b, over[fam], params, orc_b, base_b[fam],
                                           name=f"{fam} ({params.label()}, unusual wait "
                                                f"{params.unusual_wait_s / 3600:g} h)", hold_back_only=fam in AS_LIVE)[0]
        rows.append(learned_b[fam])
        hind = _hindsight(swept_b, learned_b[fam].false_stop_rate)
        rows.append(replace(hind, policy=f"  hindsight best fixed on the test half at <= its false rate: {hind.policy}")
                    if hind else "  (no swept fixed rule gets down to its false-stop rate on the test half)")
    print(f"\n[policies] {name}: tune half {tune.n_instances} series, test half {test.n_instances} series, "
          f"{test.n_steps * test.step_s / 86400:.1f} days; oracle on test half {orc_b.sum() / 3600:.1f} net GPU-h "
          f"(tuning {sum(len(g) for _, g in FAMILIES.values())} settings took {t_tune:.1f} s)")
    print(f"  {'policy':<100} {'stops':>6} {'false':>6} {'net GPU-h':>10} {'% oracle':>9} {'t-stop p50':>10}")
    for s in rows:
        if isinstance(s, str):
            print(s)
            continue
        p50 = s.time_to_stop_min.get("p50", float("nan"))
        print(f"  {s.policy[:100]:<100} {s.stops:>6} {s.false_stop_rate:>6.0%} {s.net_gpu_hours:>10.1f} "
              f"{s.pct_of_oracle:>8.0f}% {p50:>9.0f}m")
        out.append({"trace": name, **s.to_dict()})
    # The whole trade-off curve: every false-stop cost, other settings as tuned on A, against the hindsight
    # fixed rule on B at the same or a lower false-stop rate.
    for fam, params in tuned.items():
        hind = _hindsight(swept_b, learned_b[fam].false_stop_rate)
        t_row = tally.setdefault(fam, {"tuned ahead": 0, "tuned safer": 0, "points ahead": 0, "points": 0,
                                       "safer than any fixed": 0, "runs": 0})
        t_row["runs"] += 1
        t_row["tuned safer"] += hind is None  # a false-stop rate no swept fixed rule gets down to
        t_row["tuned ahead"] += hind is not None and learned_b[fam].net_gpu_hours > hind.net_gpu_hours
        print(f"  {fam.strip()}: operating points on the test half (false-stop cost: false rate / net GPU-h vs hindsight "
              f"fixed):")
        for lam in LAMBDAS_H:
            s = backtest_adaptive(prep_b, over[fam], replace(params, false_stop_cost_h=lam), orc_b, base_b[fam],
                                  hold_back_only=fam in AS_LIVE)[0]
            h = _hindsight(swept_b, s.false_stop_rate)
            t_row["points"] += 1
            if h is None:
                t_row["safer than any fixed"] += 1
            else:
                t_row["points ahead"] += s.net_gpu_hours > h.net_gpu_hours
            print(f"    {lam:>4g} GPU-h: {s.false_stop_rate:>4.0%} / {s.net_gpu_hours:>8.1f} (t-stop p50 "
                  f"{s.time_to_stop_min.get('p50', float('nan')):.0f}m) vs "
                  + (f"{h.policy} {h.false_stop_rate:.0%} / {h.net_gpu_hours:.1f}: {s.net_gpu_hours - h.net_gpu_hours:+.1f}"
                     if h else "no swept fixed rule that safe"))


TRACES = (("GenTD26 pods (duty cycle, 57 s)", gentd26), ("Helios Earth VC ranks (allocation, 60 s)", helios),
          ("Philly node ranks (allocation, 60 s)", philly))
COSTS_H = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def costs() -> None:
    """Both tuned for the same stated false-stop cost on one half, scored on the other (`backtest --tune`)."""
    settings = BacktestSettings()
    base = load_rules([ROOT / "rules"])[0]
    cands = candidates(base)
    totals: dict = {}
    n = len(learned_grid(1.0))
    print(f"\n[cost] fixed sweep pick ({len(cands)} rules) vs learned block ({n} settings on a 5-minute demand-level "
          f"rule + {n} on the fixed pick, with earned trust: trust_wait = the fixed pick's window), each tuned on one "
          f"half for score = net GPU-h - cost x false stops, scored on the other half")
    print(f"  {'run':<34} {'cost':>5}  {'fixed pick':<16} {'false':>5} {'net':>9} {'score':>9}  "
          f"{'learned setting':<110} "
          f"{'false':>5} {'net':>9} {'score':>9} {'ahead':>8}")
    for name, loader in TRACES:
        halves = [Prepared(h, settings) for h in loader()]
        memos: list[dict] = [{}, {}]
        t = time.perf_counter()
        for a, b in ((0, 1), (1, 0)):
            for cost in COSTS_H:
                h = holdout(halves[a], halves[b], base, cands, cost, memo=memos[a])
                diff = h.learned_score - h.fixed_score
                tot = totals.setdefault(name.split()[0], [0, 0, 0.0])
                tot[0] += diff > 1e-9
                tot[1] += 1
                tot[2] += diff
                f, lr = h.fixed_test, h.learned_test
                print(f"  {name.split()[0] + ' tuned on ' + 'AB'[a] + ', test ' + 'AB'[b]:<34} {cost:>5g}  "
                      f"{f.policy:<16} {f.false_stop_rate:>5.0%} {f.net_gpu_hours:>9.1f} {h.fixed_score:>9.1f}  "
                      f"{setting_text(h.tuned):<110} "
                      f"{lr.false_stop_rate:>5.0%} {lr.net_gpu_hours:>9.1f} {h.learned_score:>9.1f} "
                      f"{diff:>+8.1f}", flush=True)
        print(f"  ({name}: {time.perf_counter() - t:.0f} s)")
    print("\n[cost] learned ahead of the fixed pick (held-out score):")
    for name, (wins, points, diff) in totals.items():
        print(f"  {name}: {wins} of {points}, sum of score differences {diff:+.1f} GPU-h")
    print(f"  all: {sum(v[0] for v in totals.values())} of {sum(v[1] for v in totals.values())}")


def tune_decision() -> None:
    """`backtest --tune`'s own call, held out: made on half A alone (its internal split of A), scored on B."""
    settings = BacktestSettings()
    base = load_rules([ROOT / "rules"])[0]
    cands = candidates(base)
    print("\n[tune decision] --tune decides on the tuning half alone (split again in two); its pick (tuned on the "
          "whole tuning half) is scored on the other half against the fixed pick")
    totals = [0, 0, 0, 0.0, 0]
    for name, loader in TRACES:
        halves = [Prepared(h, settings) for h in loader()]
        inner = [[Prepared(x, settings) for x in split_halves(h.trace)] for h in halves]
        memos: list[dict] = [{}, {}]
        inner_memos: list[list[dict]] = [[{}, {}], [{}, {}]]
        for a, b in ((0, 1), (1, 0)):
            for cost in COSTS_H:
                h = holdout(halves[a], halves[b], base, cands, cost, memo=memos[a])
                (i0, i1), (m0, m1) = inner[a], inner_memos[a]
                inner_results = [holdout(i0, i1, base, cands, cost, memo=m0), holdout(i1, i0, base, cands, cost, memo=m1)]
                use = recommend_learned(inner_results)
                inner_diffs = " ".join(f"{x.learned_score - x.fixed_score:+.1f}" for x in inner_results)
                diff = (h.learned_score - h.fixed_score) if use else 0.0
                totals[0] += use
                totals[1] += diff > 1e-9
                totals[2] += diff < -1e-9
                totals[3] += diff
                totals[4] += 1
                print(f"  {name.split()[0]} tuned on {'AB'[a]}, cost {cost:g}: {'learned' if use else 'fixed'} "
                      f"{diff:+.1f} (learned always: {h.learned_score - h.fixed_score:+.1f}; inner halves: "
                      f"{inner_diffs})", flush=True)
    print(f"[tune decision] learned chosen at {totals[0]} of {totals[4]} points: {totals[1]} wins, {totals[2]} losses, "
          f"sum {totals[3]:+.1f} GPU-h against the fixed pick")


def trust() -> None:
    """Earned trust live: replaying one host's 14 days of lulls in full (baseline) vs only the one just completed
    (what `HistoryView.trust` does between full refreshes)."""
    from gpufinops.backtest.adaptive import fleet_prior, floor_s, trust_of

    rule = load_rules([ROOT / "rules" / "examples" / "learned-idle.yaml"])[0]
    params = rule.learned.adaptive()
    rng = np.random.default_rng(3)
    # A serving host: lulls of 5 min to 8 h (mostly short), each after 5-60 min of work, on a 5-minute step.
    lengths, starts, t = [], [], 1_700_000_000.0
    while t < 1_700_000_000.0 + 14 * 86400:
        t += 300 * rng.integers(1, 13)
        d = float(300 * rng.choice([1, 2, 3, 4, 6, 12, 24, 96], p=[.3, .2, .15, .1, .1, .06, .05, .04]))
        lengths.append(d)
        starts.append(t)
        t += d
    prior = fleet_prior(lengths * 4, floor_s(params, rule.warning_lead_s))
    args = (rule, params, 1800.0, 600.0, float(rule.window_s))
    t0 = time.perf_counter()
    full = trust_of(lengths, starts, lambda _t: prior, *args)
    t_full = time.perf_counter() - t0
    before = trust_of(lengths[:-1], starts[:-1], lambda _t: prior, *args)  # kept from the previous tick
    t0 = time.perf_counter()
    resumed = trust_of(lengths, starts, lambda _t: prior, *args, resume=before)
    t_one = time.perf_counter() - t0
    assert resumed == full
    print(f"[trust] one host, 14 days, {len(lengths)} completed lulls: full replay {t_full * 1000:.0f} ms (baseline), "
          f"only the lull just completed {t_one * 1000:.2f} ms ({t_full / t_one:,.0f}x); a 1,000-host fleet whose "
          f"hosts all complete a lull in the same tick: {t_full * 1000:.0f} s full vs {t_one * 1000:.1f} s")


CEILING_COST_H = 2.0  # `backtest --false-stop-cost` default


def ceiling() -> None:
    """Issue 12: the clairvoyant-with-lead ceiling, the old oracle, and the fixed rules' score (net - c x false)."""
    settings = BacktestSettings(false_stop_cost_h=CEILING_COST_H)
    base = load_rules([ROOT / "rules"])[0]
    cands = candidates(base)
    print(f"\n[ceiling] score = net GPU-h - {CEILING_COST_H:g} x false stops; ceiling = clairvoyant with the "
          f"{base.warning_lead_s // 60}-min lead; {len(cands)} swept fixed rules (lead as {base.name})")
    print("| trace | oracle net GPU-h | ceiling score (stops, false) | ceiling / oracle | policy | false stops | "
          "net GPU-h | score | % of ceiling | restarts / instance-day |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, loader in TRACES:
        halves = [Prepared(h, settings) for h in loader()]
        whole = Prepared(_concat([h.trace for h in halves]), settings)
        c = whole.ceiling(float(base.warning_lead_s))
        orc = oracle_net_seconds(whole).sum() / 3600
        head = (f"| {name.split()[0]} | {orc:,.1f} | {c.score:,.1f} ({len(c.stop_at)}, {c.false_stops}) | "
                f"{100 * c.score / orc:.0f}% |")
        swept = run_sweep(whole, cands)
        best = max(swept, key=lambda x: x.score)
        shipped = backtest_rule(whole, base)[0]
        for label, x in ((f"shipped {base.name}", shipped), (f"best in hindsight {best.policy}", best)):
            print(f"{head} {label} | {x.false_stops} | {x.net_gpu_hours:,.1f} | {x.score:,.1f} | "
                  f"{x.pct_of_ceiling:.0f}% | {x.restarts_per_instance_day:.2f} |")
            head = "| | | | |"
        # Held out: picked by score on one half, scored on the other.
        held = []
        for a, b in ((0, 1), (1, 0)):
            pick = max(run_sweep(halves[a], cands), key=lambda x: x.score)
            assert pick.rule is not None
            held.append((pick.policy, backtest_rule(halves[b], pick.rule)[0]))
        score = sum(x.score for _, x in held)
        ceil = sum(x.ceiling_score for _, x in held)
        print(f"{head} held out: picked on one half ({', '.join(p for p, _ in held)}), scored on the other | "
              f"{sum(x.false_stops for _, x in held)} | {sum(x.net_gpu_hours for _, x in held):,.1f} | {score:,.1f} | "
              f"{100 * score / ceil:.0f}% | "
              f"{sum(x.restarts for _, x in held) / sum(h.instance_days for h in halves):.2f} |", flush=True)


def early_warning() -> None:
    """Issue 12 part 1.4: the warning at the first idle sign, overlapping the window (`backtest_rule_early_warning`),
    and the variant that keeps every stop where it is and only warns earlier."""
    from gpufinops.backtest.engine import IDLE, backtest_rule_early_warning, early_warning_rule

    settings = BacktestSettings(false_stop_cost_h=CEILING_COST_H)
    base = load_rules([ROOT / "rules"])[0]
    rules = [base, replace(base, name="below-5pct-30m", threshold_pct=5.0, window_s=1800),
             replace(base, name="below-5pct-10m", threshold_pct=5.0, window_s=600)]
    print(f"\n[early warning] score = net - {CEILING_COST_H:g} x false; notice = stop - warning (median, min)")
    print("| trace | rule | warning | stops | false stops | net GPU-h | score | % of ceiling | notice p50 min |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, loader in TRACES:
        prep = Prepared(_concat(list(loader())), settings)
        for rule in rules:
            today, rep = backtest_rule(prep, rule)
            early, rep_e = backtest_rule_early_warning(prep, rule)
            # Stop unchanged, warning at the first idle sign: the sign's idle run that ends at each stop.
            sign = rule_verdicts(prep, early_warning_rule(rule, settings.tick_s)) == IDLE
            ticks = np.arange(sign.shape[1])
            run_start = np.maximum.accumulate(np.where(~sign, ticks, -1), axis=1) + 1
            a = rep.arrays
            notice_same = (a["stop_at"] - prep.grid.times[run_start[a["instance"], a["tick"]]]) / 60
            rows = (("after the window (today)", today, (a["stop_at"] - a["mark_at"]) / 60),
                    ("at the first sign, stop unchanged", today, notice_same),
                    ("at the first sign, overlapping", early, (rep_e.arrays["stop_at"] - rep_e.arrays["mark_at"]) / 60))
            for label, x, notice in rows:
                p50 = f"{np.median(notice):.0f}" if len(notice) else "-"
                print(f"| {name.split()[0]} | {rule.name} | {label} | {x.stops} | {x.false_stops} | "
                      f"{x.net_gpu_hours:,.1f} | {x.score:,.1f} | {x.pct_of_ceiling:.0f}% | {p50} |", flush=True)


def policies() -> None:
    settings = BacktestSettings()
    out: list[dict] = []
    tally: dict = {}
    for name, loader in TRACES:
        a, b = loader()
        compare(f"{name}, tuned on A, tested on B", a, b, settings, out, tally)
        compare(f"{name}, tuned on B, tested on A", b, a, settings, out, tally)
    print("\n[policies] over the 6 holdout runs (3 traces x 2 directions):")
    for fam, t in tally.items():
        print(f"  {fam}: tuned setting ahead of the hindsight fixed rule in {t['tuned ahead']} of {t['runs']} runs "
              f"(safer than any swept fixed rule in {t['tuned safer']}); "
              f"operating points ahead {t['points ahead']} of {t['points'] - t['safer than any fixed']} "
              f"(and {t['safer than any fixed']} safer than any swept fixed rule)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--perf", action="store_true")
    ap.add_argument("--policies", action="store_true")
    ap.add_argument("--cost", action="store_true")
    ap.add_argument("--tune-decision", action="store_true", help="about 35 min; not part of the default run")
    ap.add_argument("--trust", action="store_true", help="earned trust: full replay vs the lull just completed")
    ap.add_argument("--ceiling", action="store_true", help="score vs the clairvoyant-with-lead ceiling")
    ap.add_argument("--early-warning", action="store_true", help="the warning at the first idle sign")
    args = ap.parse_args()
    if args.ceiling or args.early_warning:
        if args.ceiling:
            ceiling()
        if args.early_warning:
            early_warning()
        sys.exit(0)
    every = not (args.perf or args.policies or args.cost or args.tune_decision or args.trust)
    if args.perf or every:
        perf()
    if args.policies or every:
        policies()
    if args.cost or every:
        costs()
    if args.trust or every:
        trust()
    if args.tune_decision:
        tune_decision()
