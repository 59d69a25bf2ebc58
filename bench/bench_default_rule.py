"""Which fixed rule to ship as the default (issue 18): the 40-rule sweep on the bundled demo trace and the
shared traces, at the service's tick (60 s), break-even 30 min, restart cost 10 min. Run from the repository
root:  python bench/bench_default_rule.py   (about 2 minutes on 2 cores)

GenTD26 is loaded as `gpufinops backtest --trace` loads it; Helios and Philly are pool allocation counts turned
into per-rank series as in bench_backtest.py (both of its halves together).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_backtest as bb  # noqa: E402

from gpufinops.backtest.engine import BacktestSettings, Prepared, oracle_net_seconds  # noqa: E402
from gpufinops.backtest.sweep import candidates, run_sweep  # noqa: E402
from gpufinops.backtest.traces import load_trace  # noqa: E402
from gpufinops.demo.run import TRACE_PATH  # noqa: E402
from gpufinops.rules import load_rules  # noqa: E402

FALSE_STOP_COST_H = 2.0  # backtest --tune's default: a false stop's cost on top of the restart
SHOWN = ("below-10pct-2h", "below-10pct-1h", "below-10pct-30m", "below-40pct-10m")


def main() -> None:
    base = load_rules([ROOT / "rules"])[0]
    cands = candidates(base)
    traces = {
        "bundled GenTD26 (12 pods, 23 h)": load_trace(TRACE_PATH),
        "GenTD26 (95 pods, 23 h)": load_trace(bb.DATA / "alibaba_gentd26_pod_gpu_duty_cycle.csv"),
        "Helios (80 VC ranks, 31 d)": bb._concat(list(bb.helios())),
        "Philly (12 ranks, 73 d)": bb._concat(list(bb.philly())),
    }
    print(f"| trace | oracle GPU-h | rule | stops | false | net GPU-h | % oracle | net - {FALSE_STOP_COST_H:g} x false |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name, trace in traces.items():
        prep = Prepared(trace, BacktestSettings(tick_s=60.0))
        oracle = oracle_net_seconds(prep).sum() / 3600
        by = {s.policy: s for s in run_sweep(prep, cands)}
        for policy in SHOWN:
            s = by[policy]
            print(f"| {name} | {oracle:,.1f} | {policy} | {s.stops} | {s.false_stop_rate:.0%} | {s.net_gpu_hours:,.1f} | "
                  f"{s.pct_of_oracle:.0f}% | {s.net_gpu_hours - FALSE_STOP_COST_H * s.false_stops:,.1f} |", flush=True)


if __name__ == "__main__":
    main()
