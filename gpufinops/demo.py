"""`gpufinops demo`: the real pipeline on a simulated clock, with no cloud and no Prometheus.

A fleet of 12 single-GPU instances replays 12 pods of the real Alibaba GenTD26
serving trace (bundled, see gpufinops/data/SOURCES.md). EC2 is simulated behind
the same `Cloud` interface; Slack messages are printed. When the trace shows
demand on a stopped instance, its owner starts it again (that is what a false
stop costs). The summary gives stops, GPU-hours and dollars saved at catalog
prices.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TextIO

import pandas as pd

from .config import Settings, load_settings
from .model import GpuInstance, RunContext
from .pipeline import Peers, run_once
from .prices import OnDemandPrices
from .rules import load_rules
from .sim import ConsoleNotifier, SimClock, SimCloud, TraceMetrics
from .store import Store

TRACE_PATH = Path(__file__).resolve().parent / "data" / "demo_trace_gentd26.csv.gz"
TRACE_STEP_S = 57  # the GenTD26 sampling step
DEMAND_PCT = 5.0
FALSE_STOP_S = 30 * 60  # demand back within this long after a stop: the stop cost more than it saved
MAX_PRINTED_MESSAGES = 25  # a stopped instance whose trace shows this much activity gets started again

# (instance type, tags) per pod, in trace order: a plausible mixed fleet.
FLEET_SHAPES = [
    ("g5.xlarge", {"team": "vision", "owner": "ana", "workload": "batch"}),
    ("g6e.xlarge", {"team": "genai", "owner": "li", "workload": "batch"}),
    ("g5.xlarge", {"team": "search", "owner": "sam", "workload": "batch"}),
    ("g6.xlarge", {"team": "genai", "owner": "li", "workload": "training"}),
    ("g5.xlarge", {"team": "vision", "owner": "ana", "workload": "batch", "gpufinops:protect": "true"}),
    ("g6e.xlarge", {"team": "genai", "owner": "kim", "workload": "inference"}),
    ("g5.xlarge", {"team": "search", "owner": "sam", "workload": "batch"}),
    ("g6.xlarge", {"team": "vision", "owner": "raj", "workload": "batch"}),
    ("g6e.xlarge", {"team": "genai", "owner": "kim", "workload": "training"}),
    ("g5.xlarge", {"team": "research", "workload": "batch"}),
    ("g6.xlarge", {"team": "research", "owner": "eve", "workload": "batch"}),
    ("g5.xlarge", {"team": "search", "owner": "sam", "workload": "batch"}),
]


def load_demo_trace(path: Path = TRACE_PATH) -> pd.DataFrame:
    raw = pd.read_csv(path)
    pods = list(dict.fromkeys(raw["container_ip"]))
    ids = {pod: f"i-demo{n:04d}" for n, pod in enumerate(pods, 1)}
    return pd.DataFrame({
        "instance_id": raw["container_ip"].map(ids),
        "gpu": "0",
        "ts": raw["timestamp_anon"].astype(float),
        "util": raw["duty_cycle"].astype(float),
        "mem_mib": raw["memory_used_bytes"].astype(float) / 2**20,
    })


def build_fleet(trace: pd.DataFrame, start: datetime, prices: OnDemandPrices) -> list[GpuInstance]:
    fleet = []
    for n, inst_id in enumerate(dict.fromkeys(trace["instance_id"])):
        itype, tags = FLEET_SHAPES[n % len(FLEET_SHAPES)]
        spec = prices.gpu_spec(itype)
        fleet.append(GpuInstance(
            instance_id=inst_id, instance_type=itype, region="us-east-1", state="running",
            launch_time=start - timedelta(days=3), account="111122223333", tags=dict(tags, Name=f"demo-{n + 1}"),
            private_dns=f"ip-10-0-0-{n + 10}.ec2.internal", private_ip=f"10.0.0.{n + 10}",
            gpu_count=1, gpu_model=spec.gpu_model if spec else "", gpu_memory_gib=spec.gpu_memory_gib if spec else 0.0,
            hourly_cost=prices.hourly(itype, "us-east-1"),
        ))
    return fleet


def print_backtest(out: TextIO, rules, tick_s: int) -> None:
    """What `gpufinops backtest` says about the same history: the rules' false stops and a safer rule."""
    from .backtest.engine import BacktestSettings, Prepared, backtest_rule, oracle_net_seconds
    from .backtest.sweep import candidates, pareto_front, run_sweep, suggest
    from .backtest.traces import load_trace

    trace = load_trace(TRACE_PATH, id_column="container_ip", time_column="timestamp_anon", util_column="duty_cycle")
    prep = Prepared(trace, BacktestSettings(tick_s=float(tick_s)))
    oracle = oracle_net_seconds(prep)
    print("\nBacktest of the same history (every instance under every rule, as `gpufinops backtest` replays it):",
          file=out)
    for rule in rules:
        s, _ = backtest_rule(prep, rule, oracle)
        print(f"  {rule.name:<28} {s.stops:>4} stops, {s.false_stop_rate:>4.0%} false, net {s.net_gpu_hours:6.1f} GPU-h",
              file=out)
    base = next((r for r in rules if r.action.value == "stop"), rules[0])
    swept = candidates(base)
    best = suggest(pareto_front(run_sweep(prep, swept)))
    if best is not None:
        print(f"  suggested by a {len(swept)}-rule sweep: {best.policy}: {best.stops} stops, "
              f"{best.false_stop_rate:.0%} false, net {best.net_gpu_hours:.1f} GPU-h", file=out)
    print("On bursty serving work a 10-minute rule stops instances that are wanted again minutes later: replay "
          "rules on your own history before enforcing them (gpufinops backtest --sweep).", file=out)


@dataclass
class DemoSummary:
    ticks: int
    simulated_hours: float
    stops: int
    restarts: int
    false_stops: int
    gpu_hours_saved: float
    dollars_saved: float
    restart_cost_dollars: float
    warnings: int
    messages: int


def run_demo(out: TextIO | None = None, tick_s: int = 120, hours: float | None = None,
             settings: Settings | None = None, db_path: str | None = None, quiet: bool = False) -> DemoSummary:
    out = out or sys.stdout
    trace = load_demo_trace()
    t_start = datetime.fromtimestamp(trace["ts"].min(), tz=timezone.utc) + timedelta(hours=1)
    t_end = datetime.fromtimestamp(trace["ts"].max(), tz=timezone.utc)
    if hours is not None:
        t_end = min(t_end, t_start + timedelta(hours=hours))
    clock = SimClock(t_start)
    prices = OnDemandPrices.load_default()
    fleet = build_fleet(trace, t_start, prices)
    cloud = SimCloud(fleet, clock)
    metrics = TraceMetrics(trace, scrape_interval_s=TRACE_STEP_S)
    tmpdir = None
    if db_path is None:
        tmpdir = tempfile.TemporaryDirectory(prefix="gpufinops-demo-")
        db_path = str(Path(tmpdir.name) / "demo.db")
    store = Store(f"sqlite:///{db_path}")
    shown = [0]

    def printer(line: str) -> None:
        # The first messages show what users would see in Slack; the rest are in the database.
        shown[0] += 1
        if not quiet and shown[0] <= MAX_PRINTED_MESSAGES:
            print(line, file=out)

    notifier = ConsoleNotifier(store, clock, printer)
    # The demo acts for real on its simulated EC2, so stops and their cost are visible.
    settings = settings or load_settings(act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 0.5})
    rules = load_rules(settings.rules_paths)
    peers = Peers(cloud, metrics, store, notifier)

    print(f"gpufinops demo: {len(fleet)} GPU instances replaying the Alibaba GenTD26 serving trace, "
          f"{t_start:%Y-%m-%d %H:%M} -> {t_end:%H:%M} UTC (simulated), a tick every {tick_s} s", file=out)
    print(f"rules: {', '.join(r.name for r in rules)}; dry-run: {settings.act.dry_run}", file=out)

    stopped_since: dict[str, datetime] = {}
    gpu_hours_saved = dollars_saved = restart_cost = 0.0
    restarts = stops = ticks = false_stops = 0
    total_ticks = max(1, int((t_end - t_start).total_seconds() // tick_s))
    while clock.now <= t_end:
        report = run_once(RunContext(now=clock.now, dry_run=settings.act.dry_run), settings, rules, peers)
        stops += sum(1 for a in report.actions if a.kind.value in ("stop", "terminate") and a.ok)
        for a in report.actions:
            if a.kind.value in ("stop", "terminate") and a.ok:
                stopped_since[a.instance_id] = clock.now
        clock.advance(tick_s)
        ticks += 1
        # A stopped instance whose workload shows demand again is started by its owner.
        window = metrics.window_usage([cloud.get(i) for i in stopped_since], tick_s, clock.now)
        for inst_id, since in list(stopped_since.items()):
            inst = cloud.get(inst_id)
            usage = window[inst_id]
            stopped_h = (clock.now - since).total_seconds() / 3600
            wanted = any((g.activity_max or 0) >= DEMAND_PCT for g in usage.gpus)
            if wanted or clock.now > t_end:
                gpu_hours_saved += stopped_h * max(1, inst.gpu_count)
                dollars_saved += stopped_h * (inst.hourly_cost or 0.0)
                del stopped_since[inst_id]
                if wanted:
                    cloud.start(inst_id)
                    restarts += 1
                    false_stops += (clock.now - since).total_seconds() <= FALSE_STOP_S
                    # Restarting costs ~10 minutes of paid, unproductive time (boot, model load).
                    restart_cost += (10 / 60) * (inst.hourly_cost or 0.0)
                    printer(f"  [{clock.now:%H:%M}] demand returned on {inst_id}: owner starts it again")
        if sys.stderr.isatty() and ticks % max(1, total_ticks // 40) == 0:
            bar = "#" * int(30 * ticks / total_ticks)
            print(f"\r[{bar:<30}] {clock.now:%H:%M} simulated, {stops} stops", end="", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)

    summary = DemoSummary(
        ticks=ticks, simulated_hours=(t_end - t_start).total_seconds() / 3600, stops=stops, restarts=restarts, false_stops=false_stops,
        gpu_hours_saved=gpu_hours_saved, dollars_saved=dollars_saved, restart_cost_dollars=restart_cost,
        warnings=sum(1 for m in notifier.sent if m.key.startswith("warn:")), messages=len(notifier.sent),
    )
    print("", file=out)
    print("Summary", file=out)
    print(f"  simulated time      {summary.simulated_hours:.1f} h in {ticks} evaluations", file=out)
    print(f"  idle warnings sent  {summary.warnings}", file=out)
    if shown[0] > MAX_PRINTED_MESSAGES and not quiet:
        print(f"  ... {shown[0] - MAX_PRINTED_MESSAGES} more messages (all in the audit database)", file=out)
    print(f"  stops               {summary.stops} (restarted by their owners later: {summary.restarts}; "
          f"false stops, demand back within {FALSE_STOP_S // 60} min: {summary.false_stops})", file=out)
    print(f"  GPU-hours saved     {summary.gpu_hours_saved:.1f}", file=out)
    print(f"  dollars saved       ${summary.dollars_saved:,.2f} at on-demand catalog prices "
          f"(restart cost ${summary.restart_cost_dollars:,.2f}, net ${summary.dollars_saved - summary.restart_cost_dollars:,.2f})",
          file=out)
    print(f"  audit trail         {db_path}" + ("  (temporary: pass --db PATH to keep it)" if tmpdir else ""), file=out)
    print_backtest(out, rules, tick_s)
    store.close()
    if tmpdir is not None:
        tmpdir.cleanup()
    return summary
