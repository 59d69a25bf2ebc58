"""`gpufinops demo`: the real pipeline on a simulated clock, with no cloud and no Prometheus.

A fleet of 12 single-GPU instances replays 12 pods of the real Alibaba GenTD26
serving trace (bundled, see gpufinops/data/SOURCES.md). EC2 is simulated behind
the same `Cloud` interface; Slack messages are printed. When the trace shows
demand on a stopped instance, its owner starts it again (that is what a false
stop costs). The summary puts the shipped default rule beside the common
"below 40% for 10 minutes" rule over the same history, counted as
`gpufinops backtest` counts: stops, false stops, GPU-hours and dollars saved.
"""

from __future__ import annotations

import html
import sys
import tempfile
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TextIO

import pandas as pd

from ..collect.billing.settings import billing_settings
from ..backtest.engine import BacktestSettings, Prepared, backtest_rule, oracle_net_seconds
from ..backtest.traces import load_trace
from ..config import DEFAULT_RULES_DIR, ActSettings, Settings, load_settings
from ..model import FALSE_STOP_COST_H, FALSE_STOP_WITHIN_S, RESTART_COST_S, GpuInstance, RunContext, format_money
from ..run.pipeline import Peers, run_once
from ..prices.prices import OnDemandPrices
from ..rules import load_rules
from .sim import ConsoleNotifier, SimClock, SimCloud, TraceMetrics
from ..store.store import Store

TRACE_PATH = Path(__file__).resolve().parents[1] / "data" / "demo_trace_gentd26.csv.gz"
TRACE_STEP_S = 57  # the GenTD26 sampling step
DEMAND_PCT = 5.0  # a stopped instance whose trace shows more activity than this gets started again
MAX_PRINTED_MESSAGES = 27
QUICK_HOURS = 3.0  # `gpufinops demo --quick`: the first warning (03:12), its stop held by a metrics gap, renewed, 03:56

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
    # The demo's fleet is opted in (the tag the IAM policy names), so the shipped rule may stop it there.
    opt_in = {ActSettings().opt_in_tag: ActSettings().opt_in_value}
    for n, inst_id in enumerate(dict.fromkeys(trace["instance_id"])):
        itype, tags = FLEET_SHAPES[n % len(FLEET_SHAPES)]
        spec = prices.gpu_spec(itype)
        fleet.append(GpuInstance(
            instance_id=inst_id, instance_type=itype, region="us-east-1", state="running",
            launch_time=start - timedelta(days=3), account="111122223333", tags={**tags, **opt_in, "Name": f"demo-{n + 1}"},
            private_dns=f"ip-10-0-0-{n + 10}.ec2.internal", private_ip=f"10.0.0.{n + 10}",
            gpu_count=1, gpu_model=spec.gpu_model if spec else "", gpu_memory_gib=spec.gpu_memory_gib if spec else 0.0,
            hourly_cost=prices.hourly(itype, "us-east-1"),
        ))
    return fleet


COMMON_RULE_PATH = Path(__file__).resolve().parents[2] / "rules" / "examples" / "common-40pct-10min.yaml"
PRINTED_LINES_PER_MESSAGE = 6  # a metrics alert lists its instances on the lines after its summary


def common_rule_path() -> Path:
    """rules/examples/common-40pct-10min.yaml in a checkout, or where a wheel installs the shipped rules."""
    installed = Path(DEFAULT_RULES_DIR) / "examples" / COMMON_RULE_PATH.name
    return COMMON_RULE_PATH if COMMON_RULE_PATH.is_file() else installed


@dataclass
class DemoSummary:
    """One simulated run, counted as `gpufinops backtest` counts (docs/backtest.md, "What is reported")."""

    rules: str
    ticks: int
    simulated_hours: float
    stops: int
    restarts: int
    false_stops: int  # demand back within FALSE_STOP_WITHIN_S of the stop (the backtest's break-even)
    gpu_hours_stopped: float
    restart_gpu_hours: float
    dollars_stopped: float
    restart_dollars: float
    warnings: int
    messages: int
    # Messages sent, per (instance id, kind): kind is the message key's first part (warn, stop, unmark, idle,
    # metrics-unavailable); an alert naming several instances counts once for each.
    message_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    # With run_demo(compare=True): the common 40%/10 min rule over the same history, counted alike.
    common: "DemoSummary | None" = None

    @property
    def gpu_hours_saved(self) -> float:
        """GPU-hours the instances were stopped (before the restarts' cost), as the monthly report counts."""
        return self.gpu_hours_stopped

    @property
    def dollars_saved(self) -> float:
        return self.dollars_stopped

    @property
    def false_stop_rate(self) -> float:
        return self.false_stops / self.stops if self.stops else 0.0

    @property
    def net_gpu_hours(self) -> float:
        return self.gpu_hours_stopped - self.restart_gpu_hours

    @property
    def net_dollars(self) -> float:
        return self.dollars_stopped - self.restart_dollars

    @property
    def score(self) -> float:
        """Net GPU-hours less what the false stops cost people (backtest --tune's score)."""
        return self.net_gpu_hours - FALSE_STOP_COST_H * self.false_stops


class DemoConsole(ConsoleNotifier):
    """The console notifier, printing a message's list lines too (the instances a metrics alert names)."""

    def send(self, msg) -> bool:
        printed: list[str] = []
        shown, self.printer = self.printer, printed.append  # ConsoleNotifier prints the first line only
        try:
            ok = super().send(msg)
        finally:
            self.printer = shown
        if printed:
            more = (msg.text or "").splitlines()[1:PRINTED_LINES_PER_MESSAGE]
            # Slack shows &lt; as <: print what a person reads.
            shown(html.unescape("\n".join(printed + [f"      {line}" for line in more])))
        return ok


def simulate(trace: pd.DataFrame, rules, settings: Settings, t_start: datetime, t_end: datetime, tick_s: int,
             db_path: str, printer, progress: bool = False) -> DemoSummary:
    """The service's pipeline (run_once) every tick on a simulated clock, EC2 and Slack; owners restart on demand."""
    clock = SimClock(t_start)
    prices = OnDemandPrices.load_default()
    fleet = build_fleet(trace, t_start, prices)
    cloud = SimCloud(fleet, clock)
    metrics = TraceMetrics(trace, scrape_interval_s=TRACE_STEP_S)
    store = Store(f"sqlite:///{db_path}")
    notifier = DemoConsole(store, clock, printer)
    peers = Peers(cloud, metrics, store, notifier, scope_tag_keys=billing_settings(settings).tag_keys)
    stopped_since: dict[str, datetime] = {}
    gpu_h = restart_gpu_h = dollars = restart_dollars = 0.0
    restarts = stops = ticks = false_stops = 0
    total_ticks = max(1, int((t_end - t_start).total_seconds() // tick_s))
    while clock.now <= t_end:
        report = run_once(RunContext(now=clock.now, dry_run=settings.act.dry_run), settings, rules, peers)
        for a in report.actions:
            if a.kind.value in ("stop", "terminate") and a.ok:
                stops += 1
                stopped_since[a.instance_id] = clock.now
        clock.advance(tick_s)
        ticks += 1
        # A stopped instance whose workload shows demand again is started by its owner.
        window = metrics.window_usage([cloud.get(i) for i in stopped_since], tick_s, clock.now)
        for inst_id, since in list(stopped_since.items()):
            inst = cloud.get(inst_id)
            gpus = max(1, inst.gpu_count)
            stopped_h = (clock.now - since).total_seconds() / 3600
            wanted = any((g.activity_max or 0) > DEMAND_PCT for g in window[inst_id].gpus)
            if wanted or clock.now > t_end:
                gpu_h += stopped_h * gpus
                dollars += stopped_h * (inst.hourly_cost or 0.0)
                del stopped_since[inst_id]
                if wanted:
                    cloud.start(inst_id)
                    restarts += 1
                    false_stops += (clock.now - since).total_seconds() <= FALSE_STOP_WITHIN_S
                    restart_gpu_h += RESTART_COST_S / 3600 * gpus
                    restart_dollars += RESTART_COST_S / 3600 * (inst.hourly_cost or 0.0)
                    printer(f"  [{clock.now:%H:%M}] demand returned on {inst_id}: owner starts it again")
        if progress and sys.stderr.isatty() and ticks % max(1, total_ticks // 40) == 0:
            bar = "#" * int(30 * ticks / total_ticks)
            print(f"\r[{bar:<30}] {clock.now:%H:%M} simulated, {stops} stops", end="", file=sys.stderr, flush=True)
    if progress and sys.stderr.isatty():
        print(file=sys.stderr)
    store.close()
    return DemoSummary(
        rules=", ".join(r.name for r in rules), ticks=ticks, simulated_hours=(t_end - t_start).total_seconds() / 3600,
        stops=stops, restarts=restarts, false_stops=false_stops, gpu_hours_stopped=gpu_h, restart_gpu_hours=restart_gpu_h,
        dollars_stopped=dollars, restart_dollars=restart_dollars,
        warnings=sum(1 for m in notifier.sent if m.key.startswith("warn:")), messages=len(notifier.sent),
        message_counts=count_messages(notifier.sent),
    )


def count_messages(sent) -> dict[tuple[str, str], int]:
    """(instance id, kind) -> messages: every instance a message names counts (a metrics alert names several)."""
    counts: Counter[tuple[str, str]] = Counter()
    for msg in sent:
        kind = msg.key.split(":", 1)[0]
        for iid in dict.fromkeys(re.findall(r"\bi-[0-9a-z]+", msg.text or "")) or ["(fleet)"]:
            counts[(iid, kind)] += 1
    return dict(counts)


def message_table(counts: dict[tuple[str, str], int]) -> list[str]:
    """Messages per instance (rows) and per kind (columns), with totals per kind."""
    kinds = sorted({k for _, k in counts})
    ids = sorted({i for i, _ in counts})
    rows = [["instance"] + kinds + ["total"]]
    for iid in ids:
        vals = [counts.get((iid, k), 0) for k in kinds]
        rows.append([iid] + [str(v) for v in vals] + [str(sum(vals))])
    totals = [sum(v for (_, k), v in counts.items() if k == kind) for kind in kinds]
    rows.append(["all (by mention)"] + [str(v) for v in totals] + [str(sum(totals))])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  " + "  ".join(v.ljust(w) if c == 0 else v.rjust(w) for c, (v, w) in enumerate(zip(r, widths)))
            for r in rows]


def side_by_side(default: DemoSummary, common: DemoSummary | None) -> list[str]:
    """The shipped default and the common rule over the same history, counted alike."""
    cols = [("shipped default", default.rules.split(",")[0])]
    if common is not None:
        cols.append(("common rule", common.rules))
    summaries = [default] + ([common] if common is not None else [])
    rows = [
        ("", [c[0] for c in cols]),
        ("", [c[1] for c in cols]),
        ("stops", [str(s.stops) for s in summaries]),
        (f"false stops (demand back within {FALSE_STOP_WITHIN_S // 60} min)",
         [f"{s.false_stops} ({s.false_stop_rate:.0%})" for s in summaries]),
        ("restarted by their owners", [str(s.restarts) for s in summaries]),
        ("GPU-hours stopped", [f"{s.gpu_hours_stopped:.1f}" for s in summaries]),
        (f"restart cost, GPU-h ({RESTART_COST_S / 60:.0f} min each)", [f"{s.restart_gpu_hours:.1f}" for s in summaries]),
        ("net GPU-hours saved", [f"{s.net_gpu_hours:.1f}" for s in summaries]),
        ("net dollars saved (on-demand prices)", [format_money(s.net_dollars) for s in summaries]),  # -$1.02
        (f"net GPU-h - {FALSE_STOP_COST_H:g} GPU-h per false stop", [f"{s.score:.1f}" for s in summaries]),
        ("idle warnings sent", [str(s.warnings) for s in summaries]),
    ]
    label_w = max(len(r[0]) for r in rows)
    col_w = [max(len(r[1][i]) for r in rows) + 2 for i in range(len(cols))]
    return ["  " + label.ljust(label_w) + "".join(v.rjust(w) for v, w in zip(vals, col_w)) for label, vals in rows]


def print_backtest(out: TextIO, rules, tick_s: int) -> None:
    """What `gpufinops backtest` says about the same history, and why its counts are not the demo's."""
    trace = load_trace(TRACE_PATH, id_column="container_ip", time_column="timestamp_anon", util_column="duty_cycle")
    prep = Prepared(trace, BacktestSettings(tick_s=float(tick_s)))
    oracle = oracle_net_seconds(prep)
    print(f"\n`gpufinops backtest` on the same trace (tick {tick_s} s; the same definitions of a false stop and of net "
          "GPU-hours):", file=out)
    for rule in rules:
        s, _ = backtest_rule(prep, rule, oracle)
        print(f"  {rule.name:<28} {s.stops:>4} stops, {s.false_stop_rate:>4.0%} false, net {s.net_gpu_hours:6.1f} GPU-h",
              file=out)
    head_h = max(r.window_s for r in rules) / 3600
    print("  Its counts differ from the demo's because it judges every pod alike: it knows no tags, so it also stops "
          f"the protected pod and the inference one; it starts at the trace's first sample, {head_h:g} h before the "
          "demo (which waits for a full window of metrics); and it has no stop cap. Replay rules on your own history "
          "before enforcing them: gpufinops backtest --trace history.csv --sweep", file=out)


def run_demo(out: TextIO | None = None, tick_s: int = 120, hours: float | None = None,
             settings: Settings | None = None, db_path: str | None = None, quiet: bool = False,
             compare: bool = True, quick: bool = False) -> DemoSummary:
    """Replay the bundled trace under the shipped rules and print messages and summary; returns the default
    rules' summary, with `.common` the common rule's over the same history (when `compare`).

    quick: only the first QUICK_HOURS of the trace (the first idle warning and stop, and the common rule's
    false stops), through the same pipeline; the whole-trace backtest is left out (it counts another span)."""
    if quick:
        hours = QUICK_HOURS if hours is None else min(hours, QUICK_HOURS)
    out = out or sys.stdout
    trace = load_demo_trace()
    # The simulated EC2 is acted on for real (dry-run off), so that stops and what they cost are visible.
    settings = settings or load_settings(act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 0.5})
    rules = load_rules(settings.rules_paths)
    # The service judges a rule only over a full window of metrics: start once the longest window has history.
    longest_window_s = max(r.window_s for r in rules)
    t_start = datetime.fromtimestamp(trace["ts"].min(), tz=timezone.utc) + timedelta(seconds=longest_window_s)
    t_end = datetime.fromtimestamp(trace["ts"].max(), tz=timezone.utc)
    full_hours = (t_end - t_start).total_seconds() / 3600
    if hours is not None:
        t_end = min(t_end, t_start + timedelta(hours=hours))
    tmpdir = tempfile.TemporaryDirectory(prefix="gpufinops-demo-")
    kept_db = db_path is not None
    db_path = db_path or str(Path(tmpdir.name) / "demo.db")
    shown = [0]

    def printer(line: str) -> None:
        # The first messages show what users would see in Slack; the rest are in the database.
        shown[0] += 1
        if not quiet and shown[0] <= MAX_PRINTED_MESSAGES:
            print(line, file=out)

    print(f"gpufinops demo: {len(FLEET_SHAPES)} GPU instances replaying 12 pods of the Alibaba GenTD26 serving trace, "
          f"{t_start:%Y-%m-%d %H:%M} UTC -> {t_end:%Y-%m-%d %H:%M} UTC ({(t_end - t_start).total_seconds() / 3600:.1f} h "
          f"simulated), an evaluation every {tick_s} s", file=out)
    print("simulated EC2: nothing real is touched. The demo lets gpufinops stop instances on it "
          f"(dry-run {'on' if settings.act.dry_run else 'off'}) to show stops and savings; a real install starts in "
          "dry-run (act.dry_run: true), which tags and stops nothing and only says what it would do.", file=out)
    print(f"rules (the shipped defaults, rules/*.yaml): {', '.join(r.name for r in rules)}", file=out)

    default = simulate(trace, rules, settings, t_start, t_end, tick_s, db_path, printer, progress=True)
    common = None
    common_path = common_rule_path()
    if compare and common_path.is_file():
        common_rules = load_rules([common_path])
        common = simulate(trace, common_rules, settings, t_start, t_end, tick_s,
                          str(Path(tmpdir.name) / "common.db"), lambda line: None)

    print("", file=out)
    print("Summary", file=out)
    print(f"  simulated time      {default.simulated_hours:.1f} h in {default.ticks} evaluations", file=out)
    if shown[0] > MAX_PRINTED_MESSAGES and not quiet:
        print(f"  ... {shown[0] - MAX_PRINTED_MESSAGES} more messages (all in the audit database)", file=out)
    print(f"  audit trail         {db_path}" + ("" if kept_db else "  (temporary: pass --db PATH to keep it)"), file=out)
    print(f"  messages sent       {default.messages}; per instance and kind (a metrics alert counts for each "
          "instance it names):", file=out)
    for line in message_table(default.message_counts):
        print(line, file=out)
    print("\nThe same history through the same pipeline, the shipped default beside the common rule "
          f"({common_path.name}):" if common else "\nThe shipped default:", file=out)
    for line in side_by_side(default, common):
        print(line, file=out)
    if common is not None:
        print(f"  The common rule stops serving instances that are wanted again minutes later: "
              f"{common.false_stop_rate:.0%} of its {common.stops} stops are false, against "
              f"{default.false_stop_rate:.0%} of the default's {default.stops}. Its restarts look cheap in GPU-hours; "
              f"counted at {FALSE_STOP_COST_H:g} GPU-h of lost work each, its false stops cost more than it saves.",
              file=out)
    if quick:
        print(f"\nA quick look: {default.simulated_hours:g} h of the trace's {full_hours:.1f}. The whole day, with "
              "the backtest of the same trace: gpufinops demo", file=out)
    else:
        print_backtest(out, rules + (load_rules([common_path]) if common is not None else []), tick_s)
    tmpdir.cleanup()
    return replace(default, common=common)
