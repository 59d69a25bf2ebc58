"""Backtest benchmarks. Prints figures; run from the repository root:

    python bench/bench_backtest.py            # --perf and --tune
    python bench/bench_backtest.py --perf     # speed: 100 GPUs x 30 days x 20-rule sweep vs per-tick evaluate()
    python bench/bench_backtest.py --tune     # `gpufinops backtest --tune` on 100 GPUs x 30 days, whole process
    python bench/bench_backtest.py --ceiling  # fixed rules' score vs the clairvoyant-with-lead ceiling (issue 12)
    python bench/bench_backtest.py --early-warning  # the warning at the first idle sign, overlapping the window

Traces: every shared trace is split in two halves of its series (GenTD26 pods by position in the sorted id
list, Helios by VC, Philly by rank); held out = picked on one half, scored on the other, both ways. The context
policy tried for issue 12 (recent busy share, fleet-idle share) is measured in bench/bench_context_policy.py.
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

from gpufinops.backtest.engine import (  # noqa: E402
    BacktestSettings, Prepared, backtest_rule, oracle_net_seconds, rule_verdicts,
)
from gpufinops.backtest.reference import replay_per_tick  # noqa: E402
from gpufinops.backtest.sweep import candidates, pareto_front, run_sweep  # noqa: E402
from gpufinops.backtest.traces import Trace, from_arrays, load_trace, pool_ranks_trace  # noqa: E402
from gpufinops.model import FALSE_STOP_COST_H, Aggregation  # noqa: E402
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
    return tuple(concat(h) for h in halves)  # type: ignore[return-value]


def philly() -> tuple[Trace, Trace]:
    df = pd.read_csv(DATA / "philly_node_sequence_helios_artifact.csv")
    t0 = pd.Timestamp(df["time"].iloc[0]).timestamp()
    ranks = np.linspace(0.5, 0.98, 12)
    mk = lambda rs: pool_ranks_trace(df["active"].to_numpy(), df["total"].to_numpy(), ranks=rs, step_s=60.0, t0=t0,
                                     name="philly")
    return mk(ranks[0::2]), mk(ranks[1::2])


def concat(traces: list[Trace]) -> Trace:
    n = max(t.n_steps for t in traces)
    util = np.vstack([np.pad(t.util, ((0, 0), (0, n - t.n_steps)), constant_values=np.nan) for t in traces])
    ids = tuple(i for t in traces for i in t.instance_ids)
    return from_arrays(util, step_s=traces[0].step_s, t0=traces[0].t0, instance_ids=ids, source=traces[0].source)


LAMBDAS_H = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # false-stop cost: the policy's operating points
_GRID = list(itertools.product(LAMBDAS_H, (10.0, 30.0), (3.0, 8.0), (3600.0, 7200.0)))


TRACES = (("GenTD26 pods (duty cycle, 57 s)", gentd26), ("Helios Earth VC ranks (allocation, 60 s)", helios),
          ("Philly node ranks (allocation, 60 s)", philly))
CEILING_COST_H = FALSE_STOP_COST_H  # `backtest --false-stop-cost` default


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
        whole = Prepared(concat([h.trace for h in halves]), settings)
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
        prep = Prepared(concat(list(loader())), settings)
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


def tune_perf() -> None:
    """`gpufinops backtest --tune` as a whole process on 100 GPUs x 30 days (issue 13: bounded, <= 2 min), beside
    the yardstick: the same 40-rule default sweep replayed once over the whole history in this process (the tune
    replays it three times: two halves, then the whole)."""
    import subprocess
    import tempfile

    from gpufinops.backtest.sweep import DEFAULT_AGGREGATIONS, DEFAULT_THRESHOLDS, DEFAULT_WINDOWS_S

    trace = synthetic_fleet(100, 30)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.parquet"
        t = trace.times()
        pd.DataFrame({"instance_id": np.repeat(np.asarray(trace.instance_ids, dtype=object), trace.n_steps),
                      "timestamp": np.tile(t, trace.n_instances), "util": trace.util.ravel()}).to_parquet(path)
        cmd = [sys.executable, "-m", "gpufinops.cli", "backtest", "--trace", str(path), "--tune",
               "--rules", str(ROOT / "rules" / "idle-shutdown.yaml")]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
    base = load_rules([ROOT / "rules" / "idle-shutdown.yaml"])[0]
    cands = candidates(base, DEFAULT_THRESHOLDS, DEFAULT_WINDOWS_S, DEFAULT_AGGREGATIONS)
    t0 = time.perf_counter()
    run_sweep(Prepared(trace, BacktestSettings()), cands)
    sweep_s = time.perf_counter() - t0
    progress = [line for line in proc.stderr.splitlines() if "s left" in line]
    print(f"[tune] gpufinops backtest --tune, {trace.n_instances} GPUs x 30 days at 60 s, {len(cands)} rules: "
          f"{wall:.1f} s as a whole process (goal <= 120 s); yardstick, one {len(cands)}-rule sweep over the whole "
          f"history in-process: {sweep_s:.1f} s ({wall / sweep_s:.1f}x; the tune replays the grid 3 times)")
    print(f"[tune] progress lines printed: {len(progress)}, e.g. {progress[len(progress) // 2] if progress else '-'}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--perf", action="store_true")
    ap.add_argument("--tune", action="store_true", help="backtest --tune on 100 GPUs x 30 days, whole process")
    ap.add_argument("--ceiling", action="store_true", help="score vs the clairvoyant-with-lead ceiling")
    ap.add_argument("--early-warning", action="store_true", help="the warning at the first idle sign")
    args = ap.parse_args()
    if args.ceiling or args.early_warning:
        if args.ceiling:
            ceiling()
        if args.early_warning:
            early_warning()
        sys.exit(0)
    every = not (args.perf or args.tune)
    if args.perf or every:
        perf()
    if args.tune or every:
        tune_perf()
