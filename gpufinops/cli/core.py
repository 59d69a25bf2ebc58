"""Core subcommands: serve, evaluate, rules check, audit, demo."""

from __future__ import annotations

import argparse
import logging
import sys

from typing import TYPE_CHECKING

from ..rule_types import ActionKind  # model hands it on; its leaf, so that `rules check` loads none of model

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger("gpufinops.cli")


def force_dry_run(settings: Settings, args: argparse.Namespace) -> Settings:
    """`--dry-run` wins over the config: nothing is tagged or stopped, whatever `act.dry_run` says."""
    if not getattr(args, "dry_run", False):
        return settings
    if not settings.act.dry_run:
        log.warning("dry-run forced by --dry-run (the config says act.dry_run: false)")
    else:
        log.info("dry-run forced by --dry-run")
    return settings.model_copy(update={"act": settings.act.model_copy(update={"dry_run": True})})


def cmd_serve(args: argparse.Namespace) -> int:
    from ..run.compose import live_peers
    from ..run.jobs import scheduled_jobs
    from ..model import utcnow
    from .common import load_settings_from_args
    from ..rules import load_rules
    from ..run.service import Service

    settings = force_dry_run(load_settings_from_args(args), args)
    load_rules(settings.rules_paths)  # fail fast on a broken rule file before starting
    if args.port is not None:
        settings = settings.model_copy(update={"service": settings.service.model_copy(update={"port": args.port})})
    peers = live_peers(settings)
    log.info("gpufinops serve: dry-run=%s, every %ss, database %s", settings.act.dry_run,
             settings.schedule.evaluate_every_s, settings.database_url.split("@")[-1])
    Service(settings, peers, extra_jobs=tuple(scheduled_jobs(settings, peers, utcnow))).serve_forever()
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ..run.compose import live_peers
    from ..model import RunContext, utcnow
    from ..run.pipeline import run_once
    from .common import EXIT_PROBLEM_FOUND, load_settings_from_args
    from ..rules import load_rules

    settings = force_dry_run(load_settings_from_args(args), args)
    rules = load_rules(args.rules or settings.rules_paths)
    peers = live_peers(settings)
    # evaluate --once judges and records; it never tags, stops or messages anyone.
    now = utcnow()
    pipeline_log = logging.getLogger("gpufinops.pipeline")
    level = pipeline_log.level
    if not args.verbose:
        # The table (or JSON) already holds every decision; their INFO log lines are the service's log.
        pipeline_log.setLevel(logging.WARNING)
    try:
        report = run_once(RunContext(now=now, dry_run=True), settings, rules, peers, act=False)
    finally:
        pipeline_log.setLevel(level)
    errors = failed_sources(report)
    by_id = {i.instance_id: i for i in report.instances}
    rules_by_name = {r.name: r for r in rules}
    opt_in = (settings.act.opt_in_tag, settings.act.opt_in_value)
    rows = [decision_row(d, by_id.get(d.instance_id), rules_by_name.get(d.rule_name), now, settings.act.dry_run,
                         opt_in)
            for d in report.decisions]
    if args.output == "json":
        import json  # here, not at the top: `rules check` and the other commands of this module print no JSON

        json.dump({"run_id": report.run_id, "evaluated_at": report.now.isoformat(), "dry_run": settings.act.dry_run,
                   "instances": len(report.instances), "rules": len(rules), "errors": errors,
                   "decisions": rows}, sys.stdout, indent=2)
        print()
    elif args.output == "csv":
        import csv

        fields = list(rows[0]) if rows else ["instance_id", "rule", "verdict", "outcome", "reason"]
        writer = csv.DictWriter(sys.stdout, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    else:
        print(format_decision_table(rows, len(report.instances), len(rules), wide=args.output == "wide"))
    # Whatever the output, a failed source is said once, on stderr (stdout stays the table, JSON or CSV).
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return EXIT_PROBLEM_FOUND if errors else 0


# The sources `evaluate` reads. Slack is not one: evaluate sends nothing, so an old undelivered message is the
# service's problem (its /readyz), not this command's.
EVALUATE_SOURCES = ("inventory", "prometheus", "database")


def failed_sources(report) -> list[str]:
    """Every source of the run that failed, one `source: what went wrong` line each: the run's errors plus
    the failures it only notes per source. A Prometheus outage makes every verdict UNKNOWN (correct, nothing is
    stopped) and is not in `report.errors`, yet the command must still say the source failed and exit 1."""
    errors = list(report.errors)
    for source in EVALUATE_SOURCES:
        problem = report.sources.get(source)
        if problem and not any(e.startswith(f"{source}:") for e in errors):
            errors.append(f"{source}: {problem}")
    return errors


def decision_outcome(decision, inst, rule, now, dry_run: bool, opt_in: tuple[str, str] | None = None) -> str:
    """What the act stage will do with this verdict, in words ("" when it does nothing).

    Mirrors act.plan()'s order: protection, then being managed by something else, then a snooze; only an
    IDLE verdict of a stop rule leads to a warning and a stop.
    """
    from ..act.plan import ALREADY_POWERED_OFF, opt_in_gap, power_off_spent, snoozed_until
    from ..model import Action, Verdict, format_duration

    if decision.verdict != Verdict.IDLE:
        return ""
    if decision.action == Action.NOTIFY:
        return "notify only, never stopped by this rule"
    if power_off_spent(decision):
        return ALREADY_POWERED_OFF
    if inst is not None and inst.is_protected:
        return "protected, never stopped"
    if inst is not None and getattr(inst, "managed_by", ""):
        return f"managed by {inst.managed_by}, never stopped"
    if inst is not None and (getattr(inst, "provider", "") == "kubernetes" or decision.action == Action.POWER_OFF):
        # A workload's action decides what may be done to it (a Kueue job is only suspended, never scaled).
        from ..act.plan import stop_blocker

        blocker = stop_blocker(inst, decision.action)
        if blocker:
            return blocker
    if inst is not None:
        snoozed, why = snoozed_until(inst, now)
        if snoozed:
            return f"{why}: not stopped"
        missing = opt_in_gap(inst, *opt_in) if opt_in else ""
        if missing:
            return missing
    verb = decision.action.value
    lead = f" {format_duration(rule.warning_lead_s)} later" if rule is not None else " after the warning"
    # A power-off ends no billing: the outcome says so, as every notice of it does.
    billed = " (still billed: not deallocated)" if decision.action == Action.POWER_OFF else ""
    if dry_run:
        return f"dry-run: would warn, then {verb}{lead}{billed} (nothing is changed)"
    return f"warn, then {verb}{lead}{billed}"


def decision_row(decision, inst, rule, now, dry_run: bool, opt_in: tuple[str, str] | None = None) -> dict:
    row = decision.to_dict()
    row.update(
        instance_type=inst.instance_type if inst else None, team=inst.team() if inst else None,
        owner=(inst.owner() or None) if inst else None, name=(inst.tags.get("Name") or None) if inst else None,
        protected=bool(inst and inst.is_protected), managed_by=(getattr(inst, "managed_by", "") if inst else "") or None,
        snoozed_until=(inst.tags.get("gpufinops:snooze-until") if inst else None),
        outcome=decision_outcome(decision, inst, rule, now, dry_run, opt_in),
    )
    return row


# The evaluate table fits a terminal this wide (its reason wrapped); `-o wide` prints every column unwrapped.
TABLE_WIDTH = 120
WIDE_COLUMNS = ("instance_id", "name", "instance_type", "owner", "team", "rule", "verdict", "usd_per_hour", "reason")
NARROW_COLUMNS = ("instance_id", "rule", "verdict", "usd_per_hour", "reason")


def format_decision_table(rows: list[dict], n_instances: int, n_rules: int, wide: bool = False) -> str:
    from .common import render_table

    def reason(r: dict) -> str:  # the narrow table says what act will do at the end of the reason
        return r["reason"] + (f"; then: {r['outcome']}" if r["outcome"] and not wide else "")

    table = [{"instance_id": r["instance_id"], "name": r.get("name") or "", "instance_type": r["instance_type"] or "",
              "owner": r.get("owner") or "", "team": r["team"] or "", "rule": r["rule"],
              "verdict": r["verdict"] + (f" — {r['outcome']}" if r["outcome"] and wide else ""),
              "usd_per_hour": f"{r['hourly_cost']:.2f}" if r["hourly_cost"] is not None else "?",
              "reason": reason(r)} for r in rows]
    columns = WIDE_COLUMNS if wide else NARROW_COLUMNS
    lines = render_table(table, columns, right=("usd_per_hour",),
                         **({} if wide else {"width": TABLE_WIDTH, "wrap": "reason"})).splitlines()
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    tally = ", ".join(f"{v} {n}" for v, n in counts.items()) or "none"
    lines.append(f"{n_instances} instance(s) judged under {n_rules} rule(s): {len(rows)} verdict(s), "
                 f"one per instance and rule ({tally})")
    return "\n".join(lines)  # a failed source goes to stderr (cmd_evaluate), never into the table


def cmd_rules_check(args: argparse.Namespace) -> int:
    from ..config import DEFAULT_RULES_DIR, ConfigError
    from ..rules import load_rules, rule_warnings
    from .common import defaults_hold, load_settings_from_args, usage_error

    if any(not p.strip() for p in args.paths):
        return usage_error("rules check: an empty path: name a rule file or folder")
    if args.paths:
        paths, where = args.paths, "the paths given"
    elif defaults_hold(args):
        # No config: the defaults' rules_paths, the shipped rules, without loading the settings' models to read it.
        paths, where = [str(DEFAULT_RULES_DIR)], "the shipped rules"
    else:
        # With a config (--config or $GPUFINOPS_CONFIG), check the rules that config runs; else the shipped ones.
        settings = load_settings_from_args(args, uses_database=False)
        paths = list(settings.rules_paths)
        where = f"rules_paths of {settings.source_path}" if settings.source_path else "the shipped rules"
    try:
        rules = load_rules(paths)
    except ConfigError as exc:
        print(f"rules check failed ({where}):\n{exc}", file=sys.stderr)
        return 1
    from ..rule_types import Action
    from ..words import POWER_OFF_BILLING, format_duration

    for r in rules:
        # The opt-in for GPUs without an activity counter (MIG under gpufinops agent), shown only when on.
        no_counter = (f"  no counter: idle if {r.idle_without_activity_counter.value} "
                      f"(floor {r.idle_memory_floor_mib:g} MiB)" if r.idle_without_activity_counter.value != "never"
                      else "")
        # Where its notices go (notify_to), or who routing picks when the rule names no one.
        to = ", ".join(r.notify_to) or "by audience (team channel, else default)"
        print(f"ok  {r.name:<32} {r.action.value:<9} {r.aggregation.value} < {r.threshold_pct:g}% "
              f"for {format_duration(r.window_s)} (lead {format_duration(r.warning_lead_s)}){no_counter}  to {to}  "
              f"[{r.source}]")
        if r.action is Action.POWER_OFF:
            # Valid, and costly: the operator reads here what the rule's power-off leaves billed.
            print(f"    note: {r.name}: power_off applies to Azure VMs only (any other subject it selects: notify "
                  f"only); {POWER_OFF_BILLING}; needs the optional role deploy/azure/gpufinops-power-off-role.json")
        for warning in rule_warnings(r):  # valid, but the cloud publishes a limit on what it asks: said here
            print(f"warn {r.name}: {warning}")
    print(f"{len(rules)} rule(s) valid ({where}: {', '.join(paths)})")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    """What gpufinops did (and, with --decisions, what it judged), newest last: "why was my instance stopped?"."""
    from datetime import timedelta

    from ..model import utcnow
    from .common import database_url, load_settings_from_args, open_store

    settings = load_settings_from_args(args)
    if args.db is None:
        url, what = settings.database_url, ""
    else:
        url, what = database_url(args.db), f"--db {args.db}"
    store = open_store(url, what)
    start = utcnow() - timedelta(seconds=args.since) if args.since else None
    kinds = [ActionKind(k) for k in args.kind] if args.kind else None
    # Filtered in the query: a month of decisions for a whole fleet is large.
    actions = store.action_rows(kinds=kinds, start=start, instance_id=args.instance)
    from ..act.actuator import own_call_of

    # A stop row its place carried out by a call of its own says that call (a GCE VM's "suspend"), not "stop".
    rows = [{"at": a.at.isoformat(), "instance_id": a.instance_id,
             "what": (own_call_of(a).value if a.kind == ActionKind.STOP and own_call_of(a) else a.kind.value),
             "rule": a.rule,
             "dry_run": a.dry_run, "status": a.status, "reason": a.reason, "error": a.error or ""} for a in actions]
    if args.decisions:
        rows += [{"at": d["evaluated_at"].isoformat(), "instance_id": d["instance_id"], "what": "decision",
                  "rule": d["rule"], "dry_run": d["dry_run"], "status": d["verdict"], "reason": d["reason"],
                  "error": ""}
                 for d in store.verdict_history(start=start, instance_id=args.instance)]
        rows.sort(key=lambda r: r["at"])
    rows = rows[-args.limit:] if args.limit else rows
    if args.output == "json":
        import json

        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    if args.output == "csv":
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=["at", "instance_id", "what", "rule", "dry_run", "status",
                                                        "reason", "error"])
        writer.writeheader()
        writer.writerows(rows)
        return 0
    if not rows:
        print("no matching audit records")
        return 0
    from .common import render_table

    print(render_table([{"at": r["at"][:19], "instance_id": r["instance_id"], "what": r["what"], "status": r["status"],
                         "rule": r["rule"] + (" [dry-run]" if r["dry_run"] else ""),
                         "reason": r["reason"] + (f" error: {r['error']}" if r["error"] else "")} for r in rows]))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo.run import run_demo
    from .common import database_url

    if args.db is not None:
        database_url(args.db)  # a folder, a device or an empty path is refused before the simulation starts

    package_log = logging.getLogger("gpufinops")
    level = package_log.level
    if not args.verbose:
        # Per-decision log lines would bury the Slack messages and the summary.
        package_log.setLevel(logging.WARNING)
    try:
        run_demo(tick_s=args.tick, hours=args.hours, db_path=args.db, quiet=args.quiet, compare=not args.no_compare,
                 quick=args.quick)
    finally:  # main() can be called again in the same process (tests, an embedding tool)
        package_log.setLevel(level)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from .common import add_output_option, duration_arg, float_in, int_in

    dry_run_help = "dry-run whatever the config says (act.dry_run: true): nothing is tagged or stopped"
    p = sub.add_parser("serve", help="run the scheduled service (evaluation every minute, /metrics, /healthz)")
    # 0 is allowed here, not in the config: a person (or a test running several replicas) asks for any free port
    # once, and the start line names the port taken; a config's port is what Prometheus is told to scrape.
    p.add_argument("--port", type=int_in(0, 65535), default=None,
                   help="port for /metrics and /healthz (default from config; 0: any free port, named at start)")
    p.add_argument("--dry-run", action="store_true", help=dry_run_help)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("evaluate", help="judge every GPU instance once and print verdicts (changes nothing)",
                       description="Judge every GPU instance once, print the verdicts and exit: evaluate has no other "
                                   "mode (`serve` runs the schedule). The table fits 120 columns, its reason wrapped; "
                                   "-o wide prints every column (name, type, owner, team) unwrapped.")
    # Kept for old scripts and docs: evaluate always judges once (the schedule is `serve`'s), so it is not listed.
    p.add_argument("--once", action="store_true", default=True, help=argparse.SUPPRESS)
    add_output_option(p, ("table", "json", "csv", "wide"))
    p.add_argument("--json", dest="output", action="store_const", const="json", help=argparse.SUPPRESS)
    p.add_argument("--rules", nargs="*", default=None, help="rule files or folders (default from config)")
    p.add_argument("--dry-run", action="store_true",
                   help="show what serve would do in dry-run, whatever the config says (evaluate never acts)")
    p.add_argument("-v", "--verbose", action="store_true", help="also log every decision on stderr")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("rules", help="rule files")
    rsub = p.add_subparsers(dest="rules_command", metavar="SUBCOMMAND")
    c = rsub.add_parser("check", help="validate rule files; non-zero exit with file, line and key on error")
    c.add_argument("paths", nargs="*",
                   help="files or folders (default: rules_paths of the config, else the shipped rules/)")
    c.set_defaults(func=cmd_rules_check)

    p = sub.add_parser("audit", help="the audit trail: what was marked, stopped, cancelled or skipped, and why")
    p.add_argument("--instance", default=None, help="only this instance id")
    p.add_argument("--since", type=duration_arg, default=None, help="only the last DURATION, e.g. 24h, 7d")
    p.add_argument("--kind", nargs="*", choices=[k.value for k in ActionKind], help="only these action kinds")
    p.add_argument("--decisions", action="store_true", help="also list every verdict with its reason")
    p.add_argument("--limit", type=int_in(0, 10**9), default=200, help="at most this many rows, newest (0: all)")
    p.add_argument("--db", default=None, help="database file or URL (default: database_url from the config)")
    add_output_option(p)
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("demo", help="the whole pipeline on a simulated fleet replaying a real trace (no cloud)")
    # A tick from 1 s to a day, at most ten years simulated: anything else is a typo (0 would never advance).
    p.add_argument("--tick", type=int_in(1, 86400), default=120, help="simulated seconds between evaluations")
    p.add_argument("--hours", type=float_in(0, 10 * 366 * 24, low_open=True), default=None,
                   help="simulate only this many hours")
    p.add_argument("--db", default=None, help="keep the demo's audit database at this path")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--quick", action="store_true",
                   help="the first 3 simulated hours only (a few seconds): the same pipeline, both rules")
    p.add_argument("--no-compare", action="store_true",
                   help="skip the second run with the common 40%%/10 min rule (about half the time)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every decision and action")
    p.set_defaults(func=cmd_demo)
