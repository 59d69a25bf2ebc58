"""Core subcommands: serve, evaluate, rules check, demo."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .config import DEFAULT_RULES_DIR, ConfigError, Settings
from .model import RunContext, utcnow

log = logging.getLogger("gpufinops.cli")


def build_live_peers(settings: Settings):
    """Real peers from settings: EC2 inventory, Prometheus, the database, Slack (or the outbox)."""
    from .collect.billing import schema as _billing_tables  # noqa: F401 - registers the costs table
    from .collect.accounts import build_cloud
    from .collect.prometheus import PrometheusMetrics
    from .notify import build_notifier
    from .pipeline import Peers
    from .prices import OnDemandPrices
    from .store import Store

    store = Store(settings.database_url)
    prices = OnDemandPrices.load_default()
    cloud = build_cloud(settings.aws, prices=prices)
    metrics = PrometheusMetrics(settings.prometheus)
    notifier = build_notifier(settings.slack, store, utcnow)
    from .learned import IdleHistory

    # Built once per process: the service keeps it, so the history is read in full only every `refresh`.
    return Peers(cloud, metrics, store, notifier, learned=IdleHistory(settings.prometheus))


def cmd_serve(args: argparse.Namespace) -> int:
    from .cli import load_settings_from_args
    from .jobs import scheduled_jobs
    from .rules import load_rules
    from .service import Service

    settings = load_settings_from_args(args)
    load_rules(settings.rules_paths)  # fail fast on a broken rule file before starting
    if args.port is not None:
        settings = settings.model_copy(update={"service": settings.service.model_copy(update={"port": args.port})})
    peers = build_live_peers(settings)
    log.info("gpufinops serve: dry-run=%s, every %ss, database %s", settings.act.dry_run,
             settings.schedule.evaluate_every_s, settings.database_url.split("@")[-1])
    Service(settings, peers, extra_jobs=tuple(scheduled_jobs(settings, peers, utcnow))).serve_forever()
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .cli import load_settings_from_args
    from .pipeline import run_once
    from .rules import load_rules

    settings = load_settings_from_args(args)
    rules = load_rules(args.rules or settings.rules_paths)
    peers = build_live_peers(settings)
    # evaluate --once judges and records; it never tags, stops or messages anyone.
    report = run_once(RunContext(now=utcnow(), dry_run=True), settings, rules, peers, act=False)
    by_id = {i.instance_id: i for i in report.instances}
    if args.json:
        out = []
        for d in report.decisions:
            inst = by_id.get(d.instance_id)
            row = d.to_dict()
            row.update(instance_type=inst.instance_type if inst else None, team=inst.team() if inst else None)
            out.append(row)
        json.dump({"run_id": report.run_id, "evaluated_at": report.now.isoformat(), "errors": report.errors,
                   "decisions": out}, sys.stdout, indent=2)
        print()
    else:
        print(format_decision_table(report, by_id))
    return 1 if report.errors else 0


def format_decision_table(report, by_id) -> str:
    rows = [("INSTANCE", "TYPE", "TEAM", "RULE", "VERDICT", "$/H", "REASON")]
    for d in report.decisions:
        inst = by_id.get(d.instance_id)
        rows.append((d.instance_id, inst.instance_type if inst else "", inst.team() if inst else "", d.rule_name,
                     d.verdict.value, f"{d.hourly_cost:.2f}" if d.hourly_cost is not None else "?", d.reason))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:6], widths)) + "  " + r[6] for r in rows]
    lines.append(f"{len(report.instances)} instances, verdicts {report.verdict_counts()}")
    lines.extend(f"error: {e}" for e in report.errors)
    return "\n".join(lines)


def cmd_rules_check(args: argparse.Namespace) -> int:
    from .rules import load_rules

    paths = args.paths or [str(DEFAULT_RULES_DIR)]
    try:
        rules = load_rules(paths)
    except ConfigError as exc:
        print(f"rules check failed:\n{exc}", file=sys.stderr)
        return 1
    for r in rules:
        print(f"ok  {r.name:<32} {r.action.value:<9} {r.aggregation.value} < {r.threshold_pct:g}% "
              f"for {r.window_s}s (lead {r.warning_lead_s}s)  [{r.source}]")
    print(f"{len(rules)} rule(s) valid")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    """What gpufinops did (and, with --decisions, what it judged), newest last: "why was my instance stopped?"."""
    from datetime import timedelta

    from .cli import load_settings_from_args
    from .model import ActionKind
    from .rules import parse_duration
    from .store import Store

    settings = load_settings_from_args(args)
    if args.db is None:
        url = settings.database_url
    else:
        url = args.db if "://" in args.db else f"sqlite:///{args.db}"
    store = Store(url)
    start = utcnow() - timedelta(seconds=parse_duration(args.since)) if args.since else None
    kinds = [ActionKind(k) for k in args.kind] if args.kind else None
    # Filtered in the query: a month of decisions for a whole fleet is large.
    actions = store.action_rows(kinds=kinds, start=start, instance_id=args.instance)
    rows = [{"at": a.at.isoformat(), "instance_id": a.instance_id, "what": a.kind.value, "rule": a.rule,
             "dry_run": a.dry_run, "status": a.status, "reason": a.reason, "error": a.error or ""} for a in actions]
    if args.decisions:
        rows += [{"at": d["evaluated_at"].isoformat(), "instance_id": d["instance_id"], "what": "decision",
                  "rule": d["rule"], "dry_run": d["dry_run"], "status": d["verdict"], "reason": d["reason"],
                  "error": ""}
                 for d in store.decision_rows(start=start, instance_id=args.instance)]
        rows.sort(key=lambda r: r["at"])
    rows = rows[-args.limit:] if args.limit else rows
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    if not rows:
        print("no matching audit records")
        return 0
    for r in rows:
        flags = " [dry-run]" if r["dry_run"] else ""
        err = f" error: {r['error']}" if r["error"] else ""
        print(f"{r['at'][:19]}  {r['instance_id']:<20} {r['what']:<9} {r['status']:<13} {r['rule']}{flags}: "
              f"{r['reason']}{err}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if not args.verbose:
        # Per-decision log lines would bury the Slack messages and the summary.
        logging.getLogger("gpufinops").setLevel(logging.WARNING)
    run_demo(tick_s=args.tick, hours=args.hours, db_path=args.db, quiet=args.quiet)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the scheduled service (evaluation every minute, /metrics, /healthz)")
    p.add_argument("--port", type=int, default=None, help="port for /metrics and /healthz (default from config)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("evaluate", help="judge every GPU instance once and print verdicts (changes nothing)")
    p.add_argument("--once", action="store_true", default=True, help="one evaluation (the only mode)")
    p.add_argument("--json", action="store_true", help="JSON instead of a table")
    p.add_argument("--rules", nargs="*", default=None, help="rule files or folders (default from config)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("rules", help="rule files")
    rsub = p.add_subparsers(dest="rules_command", metavar="SUBCOMMAND")
    c = rsub.add_parser("check", help="validate rule files; non-zero exit with file, line and key on error")
    c.add_argument("paths", nargs="*", help="files or folders (default: the shipped rules/)")
    c.set_defaults(func=cmd_rules_check)

    p = sub.add_parser("audit", help="the audit trail: what was marked, stopped, cancelled or skipped, and why")
    p.add_argument("--instance", default=None, help="only this instance id")
    p.add_argument("--since", default=None, help="only the last DURATION, e.g. 24h, 7d")
    p.add_argument("--kind", nargs="*", choices=["mark", "stop", "terminate", "unmark", "skip", "notify"],
                   help="only these action kinds")
    p.add_argument("--decisions", action="store_true", help="also list every verdict with its reason")
    p.add_argument("--limit", type=int, default=200, help="at most this many rows, newest (0: all)")
    p.add_argument("--db", default=None, help="database file or URL (default: database_url from the config)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("demo", help="the whole pipeline on a simulated fleet replaying a real trace (no cloud)")
    p.add_argument("--tick", type=int, default=120, help="simulated seconds between evaluations")
    p.add_argument("--hours", type=float, default=None, help="simulate only this many hours")
    p.add_argument("--db", default=None, help="keep the demo's audit database at this path")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--verbose", action="store_true", help="log every decision and action")
    p.set_defaults(func=cmd_demo)
