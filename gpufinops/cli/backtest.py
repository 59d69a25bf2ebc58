"""`gpufinops backtest`: what the rules would have done on past history, and which rule to ship."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from typing import TYPE_CHECKING

from .common import EXIT_PROBLEM_FOUND, duration_arg

if TYPE_CHECKING:
    from ..model import Aggregation



def _time(value: str, now: datetime) -> float:
    """Epoch seconds, an ISO date-time, or 'now-30d' style offsets."""
    from ..config import ConfigError
    from ..rules import parse_duration

    v = value.strip()
    if v == "now":
        return now.timestamp()
    if v.startswith("now-"):
        return (now - timedelta(seconds=parse_duration(v[4:]))).timestamp()
    try:
        return float(v)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(v)
    except ValueError:
        raise ConfigError(f"--start/--end: cannot read time {value!r} (epoch s, ISO date-time or now-30d)") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def _floats(value: str) -> list[float]:
    try:
        return [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {value!r}") from None


def _durations(value: str) -> list[int]:
    return [duration_arg(x.strip()) for x in value.split(",") if x.strip()]


def _aggs(value: str) -> list[Aggregation]:
    from ..model import Aggregation

    try:
        return [Aggregation(x.strip()) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"aggregations are stays_below and mean, got {value!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    from .common import add_output_option

    p = sub.add_parser(
        "backtest", help="replay idle rules over past GPU history: savings, false stops, score vs the ceiling, best rule",
        description="Replays the same rule files and evaluation code as the live service over history on a simulated "
                    "clock (mark, warning lead, stop, restart on demand) and reports what each rule would have done.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="CSV/Parquet history: instance/GPU id, timestamp, utilisation %% (optional memory)")
    src.add_argument("--prometheus", nargs="?", const="", metavar="URL",
                     help="range-query DCGM_FI_DEV_GPU_UTIL (default URL: prometheus.url from the config)")
    p.add_argument("--start", default="now-7d", help="Prometheus period start (epoch s, ISO, now-30d)")
    p.add_argument("--end", default="now", help="Prometheus period end")
    p.add_argument("--step", type=duration_arg, default=60, help="Prometheus server-side step (default 60s)")
    p.add_argument("--selector", default=None, help="extra PromQL label matchers, e.g. 'job=\"dcgm\"'")
    for name in ("id", "time", "util", "memory", "gpu"):
        p.add_argument(f"--{name}-column", default=None, help=f"trace column holding the {name} (auto-detected)")
    p.add_argument("--trace-step", type=float, default=None, help="sample step of the trace in s (default: inferred)")
    p.add_argument("--rules", nargs="+", default=None, help="rule files/dirs (default: rules_paths from the config)")
    p.add_argument("--tick", type=duration_arg, default=None, help="evaluation period (default: schedule.evaluate_every_s)")
    p.add_argument("--restart-cost", type=duration_arg, default=600, help="GPU time lost per restart (default 10m)")
    p.add_argument("--break-even", type=duration_arg, default=None,
                   help="a stop followed by demand sooner than this is a false stop (default 30m: the break-even "
                        "of a stop, the same the service counts false stops by)")
    p.add_argument("--demand-pct", type=float, default=5.0,
                   help="activity above this restarts a stopped instance (default 5)")
    p.add_argument("--price", type=float, default=None, help="USD per GPU-hour (default 2.745, p4d.24xlarge / 8)")
    p.add_argument("--false-stop-cost", type=float, default=None,
                   help="GPU-hours a false stop counts as, on top of the restart (default 2): every policy's score "
                        "is net GPU-h minus this per false stop, and --tune picks the rule by it")
    p.add_argument("--sweep", action="store_true", help="sweep thresholds x windows x aggregations: Pareto front")
    p.add_argument("--thresholds", type=_floats, default=None, help="sweep thresholds %%, e.g. 1,5,10,20,40")
    p.add_argument("--windows", type=_durations, default=None, help="sweep windows, e.g. 10m,30m,1h,2h")
    p.add_argument("--aggregations", type=_aggs, default=None, help="stays_below,mean")
    p.add_argument("--max-false-stop-rate", type=float, default=0.1,
                   help="the suggested rule keeps false stops at or under this share (default 0.1)")
    p.add_argument("--tune", action="store_true",
                   help="pick the sweep's best rule by score on half the instances and score it on the other half "
                        "(both ways), then suggest the pick on the whole history; prints progress with an ETA")
    p.add_argument("--suggest-out", default=None,
                   help="write the suggested rule as a rule file here (--tune's suggestion when both are asked for)")
    add_output_option(p, ("table", "json"))
    # Before -o json: --json PATH wrote the JSON to a file ('-': stdout). Still works, unlisted.
    p.add_argument("--json", dest="json_out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--chart", default=None, help="write a PNG chart of the sweep's Pareto front here")
    p.set_defaults(func=run_backtest)


def _table(rows) -> str:
    """The backtest's results through the one renderer; headers are the -o json keys."""
    from .common import format_share, render_table

    table = []
    for s in rows:
        tts = s.time_to_stop_min
        table.append({
            "policy": s.policy[:58], "stops": s.stops, "false_stop_rate": format_share(s.false_stop_rate),
            "restarts": s.restarts, "restarts_per_instance_day": f"{s.restarts_per_instance_day:.2f}",
            "gpu_hours_stopped": f"{s.gpu_hours_stopped:,.1f}", "restart_cost_gpu_hours": f"{s.restart_cost_gpu_hours:,.1f}",
            "net_gpu_hours": f"{s.net_gpu_hours:,.1f}", "net_dollars": f"{s.net_dollars:,.0f}", "score": f"{s.score:,.1f}",
            "pct_of_ceiling": f"{s.pct_of_ceiling:.0f} %",
            "time_to_stop_p50_p90_min": f"{tts['p50']:.0f}/{tts['p90']:.0f}" if tts else "-",
        })
    columns = list(table[0]) if table else []
    return render_table(table, columns, right=columns[1:])


def _progress(msg: str) -> None:
    """Progress on stderr, so stdout stays the report (and valid JSON with -o json)."""
    print(f"[backtest] {msg}", file=sys.stderr, flush=True)


def run_backtest(args: argparse.Namespace) -> int:
    """`gpufinops backtest`: load the history, replay each rule, then the sweep and the held-out tuning if asked;
    one stage a function, each adding its part of the report (printed) and of the JSON document (`out`)."""
    from ..backtest.engine import Prepared, oracle_net_seconds
    from ..backtest.sweep import DEFAULT_AGGREGATIONS, DEFAULT_THRESHOLDS, DEFAULT_WINDOWS_S, candidates
    from ..config import ConfigError
    from ..rules import load_rules
    from .common import check_input_path, check_output_path, load_settings_from_args

    check_input_path(args.trace, "--trace")
    for path, flag in ((args.suggest_out, "--suggest-out"), (args.chart, "--chart"),
                       (None if args.json_out == "-" else args.json_out, "--json")):
        check_output_path(path, flag)  # before the replay, not after minutes of it
    settings = load_settings_from_args(args, uses_database=False)  # the backtest reads traces, not the store
    now = datetime.now(timezone.utc)  # the CLI edge: the only place that reads the clock
    say = _printer(args)
    trace = _load_history(args, settings, now)
    if args.tune and trace.n_instances < 4:  # before any replay: fail fast
        raise ConfigError(f"--tune holds half the instances out: it needs at least 4 instances, the history has "
                          f"{trace.n_instances}")
    rules = load_rules(args.rules or settings.rules_paths)
    if not rules:
        raise ConfigError("no rules to backtest (empty rule files)")
    bt = _backtest_settings(args, settings)
    _progress(f"{trace.n_instances} instances, {len(trace.gpu_names)} GPUs; preparing windows ...")
    prep = Prepared(trace, bt)
    oracle = oracle_net_seconds(prep)
    out = _replay_rules(prep, rules, oracle, say)

    base = next((r for r in rules if r.action.value == "stop"), rules[0])
    cands = candidates(base, args.thresholds or DEFAULT_THRESHOLDS, args.windows or DEFAULT_WINDOWS_S,
                       args.aggregations or DEFAULT_AGGREGATIONS)
    rc = 0
    if args.sweep:
        rc = max(rc, _sweep(args, prep, base, cands, out, say))
    elif args.chart:
        print("--chart draws the sweep's front: add --sweep", file=sys.stderr)
    if args.tune:
        rc = max(rc, _tune_stage(args, prep.trace, bt, base, cands, out, say))
    text = json.dumps(out, indent=2, default=str)
    if args.output == "json" or args.json_out == "-":
        print(text)
    elif args.json_out:
        Path(args.json_out).write_text(text)
    return rc


def _load_history(args: argparse.Namespace, settings, now: datetime):
    """The history to replay: a trace file (--trace) or Prometheus over [--start, --end]."""
    from ..backtest.traces import load_trace

    _progress(f"loading history from {args.trace or 'Prometheus'} ...")
    if args.trace:
        return load_trace(args.trace, id_column=args.id_column, time_column=args.time_column,
                          util_column=args.util_column, memory_column=args.memory_column,
                          gpu_column=args.gpu_column, step_s=args.trace_step)
    from ..backtest.prometheus import load_prometheus

    prom = settings.prometheus  # its auth, TLS, timeout, labels and selector (unless --selector)
    return load_prometheus(prom.model_copy(update={"url": args.prometheus or prom.url}), _time(args.start, now),
                           _time(args.end, now), args.step, selector=args.selector)


def _backtest_settings(args: argparse.Namespace, settings):
    """The replay's settings: the flags, else the service's tick and the project's one false-stop definition."""
    from ..backtest.engine import DEFAULT_PRICE_PER_GPU_HOUR, BacktestSettings
    from ..model import FALSE_STOP_COST_H, FALSE_STOP_WITHIN_S

    return BacktestSettings(
        tick_s=float(args.tick or settings.schedule.evaluate_every_s), restart_cost_s=float(args.restart_cost),
        break_even_s=float(FALSE_STOP_WITHIN_S if args.break_even is None else args.break_even), demand_pct=args.demand_pct,
        price_per_gpu_hour=args.price if args.price is not None else DEFAULT_PRICE_PER_GPU_HOUR,
        false_stop_cost_h=FALSE_STOP_COST_H if args.false_stop_cost is None else args.false_stop_cost,
    )


def _replay_rules(prep, rules, oracle, say) -> dict:
    """Each rule replayed, beside the clairvoyant ceiling for its lead: the table printed, the JSON document begun."""
    from ..backtest.engine import backtest_rule

    trace, bt = prep.trace, prep.settings
    results, examples = [], {}
    for n, rule in enumerate(rules, 1):
        _progress(f"replaying rule {n}/{len(rules)}: {rule.name}")
        summary, rep = backtest_rule(prep, rule, oracle)
        results.append(summary)
        examples[summary.policy] = [e.__dict__ for e in rep.stops[:5]]
    span_h = trace.n_steps * trace.step_s / 3600
    say(f"history: {trace.source}: {trace.n_instances} instances, {len(trace.gpu_names)} GPUs, {span_h:.1f} h "
          f"at {trace.step_s:g} s; tick {bt.tick_s:g} s, restart cost {bt.restart_cost_s / 60:g} min, "
          f"break-even {bt.break_even_s / 60:g} min, demand > {bt.demand_pct:g}%, ${bt.price_per_gpu_hour:g}/GPU-h")
    ceilings = {lead: prep.ceiling(lead) for lead in sorted({float(r.warning_lead_s) for r in rules})}
    for lead, c in ceilings.items():
        say(f"ceiling (clairvoyant with a {lead / 60:g}-min lead: every idle stretch whose stop gains stopped one lead "
            f"after its start): {len(c.stop_at)} stops, {c.false_stops} false, {c.net_gpu_hours:.1f} net GPU-h, "
            f"score {c.score:.1f}")
    say(f"score = net GPU-h - {bt.false_stop_cost_h:g} x false stops (--false-stop-cost); pct_of_ceiling = score / the "
        f"ceiling for the rule's lead. Old yardstick, JSON only: oracle (no lead) {oracle.sum() / 3600:.1f} net GPU-h")
    say(_table(results))
    return {"history": {"source": trace.source, "instances": trace.n_instances, "gpus": len(trace.gpu_names),
                        "hours": span_h, "step_s": trace.step_s, "instance_days": prep.instance_days},
            "false_stop_cost_h": bt.false_stop_cost_h,
            "ceiling": [{"warning_lead_s": lead, "stops": len(c.stop_at), "false_stops": c.false_stops,
                         "net_gpu_hours": c.net_gpu_hours, "score": c.score} for lead, c in ceilings.items()],
            "oracle_net_gpu_hours": oracle.sum() / 3600,
            "settings": {k: v for k, v in bt.__dict__.items() if k != "snoozes"},
            "results": [s.to_dict() for s in results], "example_stops": examples}


def _sweep(args: argparse.Namespace, prep, base, cands, out: dict, say) -> int:
    """--sweep: every candidate rule replayed, the Pareto front, the suggestion (and its file, its chart); adds
    out["sweep"]; the exit code (a problem when --suggest-out cannot be written on too short a history)."""
    from ..backtest.sweep import best_by_score, history_too_short, pareto_front, rule_yaml, run_sweep, suggest

    trace = prep.trace
    _progress(f"sweeping {len(cands)} rules ...")
    swept = run_sweep(prep, cands)
    front = pareto_front(swept)
    best = suggest(front, args.max_false_stop_rate)
    say(f"\nsweep: {len(swept)} rules (based on {base.name}); Pareto front (net saving vs false-stop rate):")
    say(_table(front))
    top = best_by_score(swept)
    if top is not None:
        say(f"\nbest swept rule by score: {top.policy}: score {top.score:.1f} = {top.pct_of_ceiling:.0f}% of the "
            f"ceiling's {top.ceiling_score:.1f}, {top.false_stops} false stops, "
            f"{top.restarts_per_instance_day:.2f} restarts per instance-day")
    out["sweep"] = {"results": [s.to_dict() for s in swept], "front": [s.policy for s in front],
                    "suggested": best.policy if best else None,
                    "best_by_score": top.policy if top else None}
    rc = 0
    too_short = history_too_short(trace.n_steps * trace.step_s)
    if too_short:
        out["sweep"].update(suggested=None, too_short=too_short)
        print(f"warning: {too_short}", file=sys.stderr)
        if args.suggest_out:
            print(f"error: --suggest-out {args.suggest_out} not written", file=sys.stderr)
            rc = EXIT_PROBLEM_FOUND
    elif best is None:
        say("\nno swept rule saves anything on this history: keep notify-only rules")
    else:
        text = rule_yaml(best, comment=f"suggested by gpufinops backtest on {trace.source}")
        out["sweep"]["suggested_yaml"] = text
        if best.false_stop_rate > args.max_false_stop_rate:
            say(f"\nno swept rule stays within the false-stop budget of {args.max_false_stop_rate:.0%}; "
                  f"the safest rule that still saves is ({best.false_stop_rate:.0%} false stops):\n{text}")
        else:
            say(f"\nsuggested rule (false-stop budget {args.max_false_stop_rate:.0%}):\n{text}")
        if args.suggest_out:
            Path(args.suggest_out).write_text(text)
    if args.chart:
        from ..backtest.chart import front_png

        front_png(args.chart, swept, front, best, [], title=f"Backtest sweep: {Path(trace.source).name}")
        say(f"chart: {args.chart}")
    return rc


def _tune_stage(args: argparse.Namespace, trace, bt, base, cands, out: dict, say) -> int:
    """--tune: the held-out pick (`_tune`) unless the history is under a day; adds out["tune"]; the exit code."""
    from ..backtest.sweep import history_too_short

    too_short = history_too_short(trace.n_steps * trace.step_s)
    if not too_short:
        out["tune"] = _tune(trace, bt, base, cands, args, say)
        return 0
    # No held-out pick, no rule file, on less than a day.
    out["tune"] = {"suggested": None, "too_short": too_short}
    print(f"warning: --tune: {too_short}", file=sys.stderr)
    if args.suggest_out:
        print(f"error: --suggest-out {args.suggest_out} not written", file=sys.stderr)
        return EXIT_PROBLEM_FOUND
    return 0


def _printer(args: argparse.Namespace):
    """print() for the table report; with -o json stdout holds the JSON document only (the deprecated
    `--json -` still prints the table, then the JSON)."""
    if args.output == "json":
        return lambda *a, **k: None
    return print


def _tune(trace, bt, base, cands, args, say=print) -> dict:
    """--tune: the sweep's best rule by score, picked on one half of the instances and scored on the other,
    both ways; the suggestion is the pick on the whole history."""
    from ..backtest.engine import Prepared
    from ..backtest.sweep import rule_yaml
    from ..backtest.tune import best_fixed, cost_score, holdout, split_halves

    cost = bt.false_stop_cost_h
    halves = [Prepared(h, bt) for h in split_halves(trace)]
    _progress(f"--tune: {len(cands)} rules x 3 replays (two halves, then the whole history)")
    results = [holdout(halves[a], halves[b], cands, cost, label=label, progress=_progress)
               for (a, b), label in (((0, 1), "B"), ((1, 0), "A"))]
    whole = best_fixed(Prepared(trace, bt), cands, cost, progress=_progress, label=" (whole history)")
    say(f"\ntune: a false stop costs {cost:g} GPU-h; score = net GPU-h - {cost:g} x false stops. Instances split "
        f"in halves A and B ({halves[0].trace.n_instances} + {halves[1].trace.n_instances}); the best rule on one "
        f"half is scored on the other.")
    from .common import format_share, render_table

    rows = [{"held_out": h.label, "picked": h.picked.policy, "stops": h.test.stops,
             "false_stop_rate": format_share(h.test.false_stop_rate), "net_gpu_hours": f"{h.test.net_gpu_hours:,.1f}",
             "score": f"{h.score:,.1f}", "pct_of_ceiling": f"{h.pct_of_ceiling:.0f} %",
             "restarts_per_instance_day": f"{h.test.restarts_per_instance_day:.2f}"} for h in results]
    say(render_table(rows, list(rows[0]), right=list(rows[0])[2:]))
    text = rule_yaml(whole, comment=f"suggested by gpufinops backtest --tune on {trace.source} "
                                    f"(false-stop cost {cost:g} GPU-h)")
    say(f"\nheld out, the pick scores {sum(h.score for h in results):.1f} over both halves "
        f"({sum(h.score for h in results) / max(1e-9, sum(h.ceiling_score for h in results)):.0%} of the ceiling). "
        f"Picked on the whole history:\n{text}")
    if args.suggest_out:
        Path(args.suggest_out).write_text(text)
    return {"false_stop_cost_h": cost, "suggested_yaml": text, "pick": whole.to_dict(),
            "pick_score": cost_score(whole, cost),
            "holdout": [{"held_out": h.label, "picked": h.picked.policy, "test": h.test.to_dict(), "score": h.score,
                         "ceiling_score": h.ceiling_score, "pct_of_ceiling": h.pct_of_ceiling} for h in results]}
