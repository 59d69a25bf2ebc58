"""`gpufinops backtest`: what the rules would have done on past history, and which rule to ship."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from .config import ConfigError
from .model import FALSE_STOP_WITHIN_S, Aggregation
from .rules import load_rules, parse_duration


def _duration(value: str) -> int:
    try:
        return parse_duration(value if not value.isdigit() else int(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _time(value: str, now: datetime) -> float:
    """Epoch seconds, an ISO date-time, or 'now-30d' style offsets."""
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


def _duration_or_off(value: str) -> int:
    return 0 if value.strip() == "0" else _duration(value)


def _durations(value: str) -> list[int]:
    return [_duration(x.strip()) for x in value.split(",") if x.strip()]


def _aggs(value: str) -> list[Aggregation]:
    try:
        return [Aggregation(x.strip()) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"aggregations are stays_below and mean, got {value!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    from .cli import add_output_option

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
    p.add_argument("--step", type=_duration, default=60, help="Prometheus server-side step (default 60s)")
    p.add_argument("--selector", default=None, help="extra PromQL label matchers, e.g. 'job=\"dcgm\"'")
    for name in ("id", "time", "util", "memory", "gpu"):
        p.add_argument(f"--{name}-column", default=None, help=f"trace column holding the {name} (auto-detected)")
    p.add_argument("--trace-step", type=float, default=None, help="sample step of the trace in s (default: inferred)")
    p.add_argument("--rules", nargs="+", default=None, help="rule files/dirs (default: rules_paths from the config)")
    p.add_argument("--tick", type=_duration, default=None, help="evaluation period (default: schedule.evaluate_every_s)")
    p.add_argument("--restart-cost", type=_duration, default=600, help="GPU time lost per restart (default 10m)")
    p.add_argument("--break-even", type=_duration, default=FALSE_STOP_WITHIN_S,
                   help=f"a stop followed by demand sooner than this is a false stop (default {FALSE_STOP_WITHIN_S // 60}m)")
    p.add_argument("--demand-pct", type=float, default=5.0,
                   help="activity above this restarts a stopped instance (default 5)")
    p.add_argument("--price", type=float, default=None, help="USD per GPU-hour (default 2.745, p4d.24xlarge / 8)")
    p.add_argument("--adaptive", action="store_true",
                   help="also run the learned policy (each instance's idle-stretch history) over each rule")
    p.add_argument("--false-stop-cost", type=float, default=2.0,
                   help="GPU-hours a false stop counts as, on top of the restart (default 2): every policy's score "
                        "is net GPU-h minus this per false stop; also the learned policy's setting, and with --tune "
                        "the cost both candidates are tuned and scored for")
    p.add_argument("--fleet-prior", type=float, default=5.0,
                   help="learned policy: pseudo-stretches from the fleet's history (0: each instance's own only)")
    p.add_argument("--p-min", type=float, default=None,
                   help="learned policy: stop at this confidence of outlasting the break-even instead")
    p.add_argument("--min-support", type=float, default=3.0, help="learned policy: past stretches needed (default 3)")
    p.add_argument("--time-of-day", type=_duration_or_off, default=3 * 3600,
                   help="learned policy: past stretches begun within this much of the current one's time of day "
                        "weigh fully, the others 0.2 (default 3h; 0: all alike)")
    p.add_argument("--restart-grace", type=_duration_or_off, default=2 * 3600,
                   help="learned policy: no stop within this long of an instance's start or restart (default 2h)")
    p.add_argument("--trust-wait", type=_duration, default=None,
                   help="learned policy: per instance, a fixed wait of this long decides where the learned wait has "
                        "done worse on that instance's past idle stretches (default: none, the learned wait decides)")
    p.add_argument("--sweep", action="store_true", help="sweep thresholds x windows x aggregations: Pareto front")
    p.add_argument("--thresholds", type=_floats, default=None, help="sweep thresholds %%, e.g. 1,5,10,20,40")
    p.add_argument("--windows", type=_durations, default=None, help="sweep windows, e.g. 10m,30m,1h,2h")
    p.add_argument("--aggregations", type=_aggs, default=None, help="stays_below,mean")
    p.add_argument("--max-false-stop-rate", type=float, default=0.1,
                   help="the suggested rule keeps false stops at or under this share (default 0.1)")
    p.add_argument("--tune", action="store_true",
                   help="tune a fixed rule (over the sweep's grid) and a learned block for --false-stop-cost, each on "
                        "half the instances and scored on the other half; suggest the learned block only if it scores "
                        "higher over the held-out halves together")
    p.add_argument("--suggest-out", default=None,
                   help="write the suggested rule as a rule file here (--tune's suggestion when both are asked for)")
    add_output_option(p, ("table", "json"))
    # Before -o json: --json PATH wrote the JSON to a file ('-': stdout). Still works, unlisted.
    p.add_argument("--json", dest="json_out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--chart", default=None, help="write a PNG chart of the sweep's Pareto front here")
    p.set_defaults(func=run_backtest)


def _table(rows) -> str:
    head = ("policy", "stops", "false", "restarts", "restarts/inst-day", "GPU-h stopped", "restart GPU-h",
            "net GPU-h", "net $", "score", "% ceiling", "t-stop p50/p90 min")
    lines = [head]
    for s in rows:
        tts = s.time_to_stop_min
        lines.append((
            s.policy[:58], str(s.stops), f"{s.false_stop_rate:.0%}", str(s.restarts),
            f"{s.restarts_per_instance_day:.2f}", f"{s.gpu_hours_stopped:.1f}", f"{s.restart_cost_gpu_hours:.1f}",
            f"{s.net_gpu_hours:.1f}", f"{s.net_dollars:,.0f}", f"{s.score:.1f}", f"{s.pct_of_ceiling:.0f}%",
            f"{tts['p50']:.0f}/{tts['p90']:.0f}" if tts else "-",
        ))
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join(fmt(r) for r in lines)


def _progress(msg: str) -> None:
    """Progress on stderr, so stdout stays the report (and valid JSON with -o json)."""
    print(f"[backtest] {msg}", file=sys.stderr, flush=True)


def run_backtest(args: argparse.Namespace) -> int:
    from .backtest.adaptive import AdaptiveParams, backtest_adaptive, stop_reason
    from .backtest.engine import BacktestSettings, DEFAULT_PRICE_PER_GPU_HOUR, Prepared, backtest_rule, oracle_net_seconds
    from .backtest.traces import load_trace
    from .cli import load_settings_from_args

    settings = load_settings_from_args(args)
    now = datetime.now(timezone.utc)  # the CLI edge: the only place that reads the clock
    say = _printer(args)
    _progress(f"loading history from {args.trace or 'Prometheus'} ...")
    if args.trace:
        trace = load_trace(args.trace, id_column=args.id_column, time_column=args.time_column,
                           util_column=args.util_column, memory_column=args.memory_column,
                           gpu_column=args.gpu_column, step_s=args.trace_step)
    else:
        from .backtest.prometheus import load_prometheus

        prom = settings.prometheus  # its auth, TLS, timeout, labels and selector (unless --selector)
        trace = load_prometheus(prom.model_copy(update={"url": args.prometheus or prom.url}), _time(args.start, now),
                                _time(args.end, now), args.step, selector=args.selector)
    if args.tune and trace.n_instances < 4:  # before any replay: fail fast
        raise ConfigError(f"--tune holds half the instances out: it needs at least 4 instances, the history has "
                          f"{trace.n_instances}")
    rules = load_rules(args.rules or settings.rules_paths)
    if not rules:
        raise ConfigError("no rules to backtest (empty rule files)")
    bt = BacktestSettings(
        tick_s=float(args.tick or settings.schedule.evaluate_every_s), restart_cost_s=float(args.restart_cost),
        break_even_s=float(args.break_even), demand_pct=args.demand_pct,
        price_per_gpu_hour=args.price if args.price is not None else DEFAULT_PRICE_PER_GPU_HOUR,
        false_stop_cost_h=args.false_stop_cost,
    )
    _progress(f"{trace.n_instances} instances, {len(trace.gpu_names)} GPUs; preparing windows ...")
    prep = Prepared(trace, bt)
    oracle = oracle_net_seconds(prep)
    results, examples = [], {}
    for n, rule in enumerate(rules, 1):
        _progress(f"replaying rule {n}/{len(rules)}: {rule.name}" + (" (+ learned policy)" if args.adaptive else ""))
        lp = rule.learned
        if lp is not None:
            # A rule with a `learned:` block is replayed as the service runs it: the policy, with the block's
            # settings, holding the rule's own IDLE back. The rule without its block is shown after it.
            if (lp.demand_pct, lp.break_even_s, lp.restart_cost_s) != (bt.demand_pct, bt.break_even_s, bt.restart_cost_s):
                _progress(f"  {rule.name}: its learned block's demand/break-even/restart cost differ from this "
                          f"backtest's; the replay uses the backtest's (--demand-pct, --break-even, --restart-cost)")
            summary, rep, run = backtest_adaptive(prep, rule, lp.adaptive(), oracle, name=f"{rule.name} (learned, as live)",
                                                  hold_back_only=True)
            results.append(summary)
            examples[summary.policy] = [{**e.__dict__, "reason": stop_reason(prep, run, e.instance, e.stop_at)}
                                        for e in rep.stops[:5]]
        summary, rep = backtest_rule(prep, rule, oracle)
        if lp is not None:
            summary = replace(summary, policy=f"{rule.name} without its learned block")
        results.append(summary)
        examples[summary.policy] = [e.__dict__ for e in rep.stops[:5]]
        if args.adaptive:
            params = AdaptiveParams(false_stop_cost_h=args.false_stop_cost, prior_weight=args.fleet_prior,
                                    min_support=args.min_support, time_of_day_s=float(args.time_of_day),
                                    restart_grace_s=float(args.restart_grace),
                                    trust_wait_s=None if args.trust_wait is None else float(args.trust_wait),
                                    **({"criterion": "p", "p_min": args.p_min} if args.p_min is not None else {}))
            a_sum, a_rep, run = backtest_adaptive(prep, rule, params, oracle)
            results.append(a_sum)
            examples[a_sum.policy] = [{**e.__dict__, "reason": stop_reason(prep, run, e.instance, e.stop_at)}
                                      for e in a_rep.stops[:5]]
    span_h = trace.n_steps * trace.step_s / 3600
    say(f"history: {trace.source}: {trace.n_instances} instances, {len(trace.gpu_names)} GPUs, {span_h:.1f} h "
          f"at {trace.step_s:g} s; tick {bt.tick_s:g} s, restart cost {bt.restart_cost_s / 60:g} min, "
          f"break-even {bt.break_even_s / 60:g} min, demand > {bt.demand_pct:g}%, ${bt.price_per_gpu_hour:g}/GPU-h")
    ceilings = {lead: prep.ceiling(lead) for lead in sorted({float(r.warning_lead_s) for r in rules})}
    for lead, c in ceilings.items():
        say(f"ceiling (clairvoyant with a {lead / 60:g}-min lead: every idle stretch whose stop gains stopped one lead "
            f"after its start): {len(c.stop_at)} stops, {c.false_stops} false, {c.net_gpu_hours:.1f} net GPU-h, "
            f"score {c.score:.1f}")
    say(f"score = net GPU-h - {bt.false_stop_cost_h:g} x false stops (--false-stop-cost); % ceiling = score / the "
        f"ceiling for the rule's lead. Old yardstick, JSON only: oracle (no lead) {oracle.sum() / 3600:.1f} net GPU-h")
    say(_table(results))
    out = {"history": {"source": trace.source, "instances": trace.n_instances, "gpus": len(trace.gpu_names),
                       "hours": span_h, "step_s": trace.step_s, "instance_days": prep.instance_days},
           "false_stop_cost_h": bt.false_stop_cost_h,
           "ceiling": [{"warning_lead_s": lead, "stops": len(c.stop_at), "false_stops": c.false_stops,
                        "net_gpu_hours": c.net_gpu_hours, "score": c.score} for lead, c in ceilings.items()],
           "oracle_net_gpu_hours": oracle.sum() / 3600,
           "settings": {k: v for k, v in bt.__dict__.items() if k != "snoozes"},
           "results": [s.to_dict() for s in results], "example_stops": examples}

    from .backtest.sweep import DEFAULT_AGGREGATIONS, DEFAULT_THRESHOLDS, DEFAULT_WINDOWS_S, candidates

    base = next((r for r in rules if r.action.value == "stop"), rules[0])
    cands = candidates(base, args.thresholds or DEFAULT_THRESHOLDS, args.windows or DEFAULT_WINDOWS_S,
                       args.aggregations or DEFAULT_AGGREGATIONS)
    if args.sweep:
        from .backtest.sweep import best_by_score, pareto_front, rule_yaml, run_sweep, suggest

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
        if best is None:
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
            from .backtest.chart import front_png

            extra = [s for s in results if s.policy.startswith("adaptive")]
            front_png(args.chart, swept, front, best, extra, title=f"Backtest sweep: {Path(trace.source).name}")
            say(f"chart: {args.chart}")
    elif args.chart:
        print("--chart draws the sweep's front: add --sweep", file=sys.stderr)
    if args.tune:
        out["tune"] = _tune(trace, bt, base, cands, args, say)
    text = json.dumps(out, indent=2, default=str)
    if args.output == "json" or args.json_out == "-":
        print(text)
    elif args.json_out:
        Path(args.json_out).write_text(text)
    return 0


def _printer(args: argparse.Namespace):
    """print() for the table report; with -o json stdout holds the JSON document only (the deprecated
    `--json -` still prints the table, then the JSON)."""
    if args.output == "json":
        return lambda *a, **k: None
    return print


def _tune(trace, bt, base, cands, args, say=print) -> dict:
    """--tune: both candidates tuned on one half of the instances and scored on the other, both ways."""
    from .backtest.engine import Prepared
    from .backtest.sweep import rule_yaml
    from .backtest.tune import (cost_score, held_out_gain, holdout, learned_rule_yaml,
                                recommend_learned, setting_text, split_halves, tune)

    cost = args.false_stop_cost
    halves = [Prepared(h, bt) for h in split_halves(trace)]
    results = []
    for (a, b), label in (((0, 1), "B"), ((1, 0), "A")):
        _progress(f"tuning on half {'AB'[a]}, scoring on half {label} ...")
        results.append(holdout(halves[a], halves[b], base, cands, cost, label=label, progress=_progress))
    _progress("tuning on the whole history ...")
    whole = tune(Prepared(trace, bt), base, cands, cost, progress=_progress)
    learned_wins = recommend_learned(results)
    gain = held_out_gain(results)
    say(f"\ntune: a false stop costs {cost:g} GPU-h; score = net GPU-h - {cost:g} x false stops. Instances split "
          f"in halves A and B ({halves[0].trace.n_instances} + {halves[1].trace.n_instances}); each candidate is tuned "
          f"on one half and scored on the other.")
    rows = [("held out", "candidate (tuned on the other half)", "stops", "false", "net GPU-h", "score", "% ceiling",
             "restarts/inst-day")]
    for h in results:
        for s, what, pct in ((h.fixed_test, f"fixed {h.tuned.fixed.policy}", h.fixed_pct_of_ceiling),
                             (h.learned_test, f"learned {setting_text(h.tuned)}", h.learned_pct_of_ceiling)):
            rows.append((h.label, what, str(s.stops), f"{s.false_stop_rate:.0%}", f"{s.net_gpu_hours:.1f}",
                         f"{cost_score(s, cost):.1f}", f"{pct:.0f}%",
                         f"{s.restarts_per_instance_day:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        say("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    source = f"{trace.source} (false-stop cost {cost:g} GPU-h)"
    if learned_wins:
        text = learned_rule_yaml(whole, comment=f"learned block suggested by gpufinops backtest --tune on {source}")
        say(f"\nthe learned block scores {gain:+.1f} GPU-h against the fixed rule over the held-out halves together; "
              f"tuned on the whole history:\n{text}")
    else:
        text = rule_yaml(whole.fixed, comment=f"suggested by gpufinops backtest --tune on {source}")
        say(f"\nthe learned block scores {gain:+.1f} GPU-h against the fixed rule over the held-out halves together: "
              f"keep a fixed rule. Tuned on the whole history:\n{text}")
    if args.suggest_out:
        Path(args.suggest_out).write_text(text)
    return {"false_stop_cost_h": cost, "learned_suggested": learned_wins, "held_out_gain": gain,
            "suggested_yaml": text,
            "fixed_pick": whole.fixed.to_dict(), "learned_pick": {**whole.learned.to_dict(),
                                                                  "params": whole.params.__dict__},
            "holdout": [{"held_out": h.label, "fixed": h.fixed_test.to_dict(), "learned": h.learned_test.to_dict(),
                         "learned_rule": h.tuned.pairing.name, "learned_params": h.tuned.params.__dict__,
                         "fixed_score": h.fixed_score, "learned_score": h.learned_score,
                         "ceiling_score": h.ceiling_score,
                         "fixed_pct_of_ceiling": h.fixed_pct_of_ceiling,
                         "learned_pct_of_ceiling": h.learned_pct_of_ceiling} for h in results]}
