"""`gpufinops costs` and `gpufinops budgets check`."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone

from .common import EXIT_PROBLEM_FOUND, OUTPUT_FORMATS, add_output_option, usage_error

BILLING_SOURCES = ["ce", "cur", "focus", "athena", "gcp-detailed"]  # config.BillingSettings.source


def register(subparsers) -> None:
    p = subparsers.add_parser("costs", help="GPU cost of a month from billing (CE, CUR, FOCUS, Athena or "
                                                   "Google Cloud's detailed usage cost export)")
    p.add_argument("--month", default=None, help="YYYY-MM (default: the previous full month, UTC, as `report`; "
                                                    "--by namespace|workload|nodepool: this month)")
    p.add_argument("--by", choices=["team", "instance", "instance_type", "account", "namespace", "workload",
                                      "nodepool", "slurm-account", "slurm-user", "partition", "slurm-qos"],
                   default="team", help="namespace / workload / nodepool: a Kubernetes cluster's GPU cost now, idle "
                   "capacity and GPU sharing included (docs/kubernetes.md); slurm-account / slurm-user / partition / "
                   "slurm-qos: the Slurm clusters' GPU-hours and dollars of the month from sacct, idle included "
                   "(docs/slurm.md)")
    p.add_argument("--source", choices=BILLING_SOURCES, default=None,
                   help="default: billing.source from the config; gcp-detailed: Google Cloud's detailed usage cost "
                        "export as Parquet/CSV files, cost net of credits (docs/billing.md)")
    p.add_argument("--path", default=None,
                   help="CUR/FOCUS/gcp-detailed file, folder, glob or s3:// prefix (default: billing.path)")
    # focus: with --idle, FOCUS 1.2/1.3 CSV rows of the cost split by verdict (docs/billing.md)
    add_output_option(p, (*OUTPUT_FORMATS, "focus"))
    p.add_argument("--save", action="store_true", help="also store the month's rows in the database (replacing them)")
    p.add_argument("--db", default=None,
                   help="database file or URL for --idle and --save (default: database_url from the config)")
    p.add_argument("--idle", action="store_true",
                   help="cost by verdict (ACTIVE/UNDERUTILIZED/UNKNOWN/IDLE) from the stored decisions instead of "
                        "billed cost; priced from billing when --source is given, else the decision's $/h or the catalog")
    p.set_defaults(func=cmd_costs)

    b = subparsers.add_parser("budgets", help="GPU budgets")
    bsub = b.add_subparsers(dest="budgets_command", metavar="ACTION")
    c = bsub.add_parser("check", help="evaluate budgets now and print them; --notify also sends the alerts due")
    c.add_argument("--month", default=None, help="YYYY-MM (default: this month); the check runs as of its last hour if past")
    c.add_argument("--source", choices=BILLING_SOURCES, default=None)
    c.add_argument("--path", default=None)
    c.add_argument("--notify", action="store_true",
                   help="send the alerts that are due (the service's schedule does this); default: print only")
    c.add_argument("--dry-run", action="store_true", help="send nothing, record nothing; print the alerts due")
    add_output_option(c)
    c.set_defaults(func=cmd_budgets_check)
    b.set_defaults(func=lambda args: (b.print_help(), 2)[1])


def _now() -> datetime:
    return datetime.now(timezone.utc)


def cmd_costs(args: argparse.Namespace) -> int:
    from .k8s import K8S_GROUPINGS, cmd_k8s_costs

    if args.by in K8S_GROUPINGS:  # the cluster as it is now, not billing
        return cmd_k8s_costs(args)
    from .slurm_costs import SLURM_GROUPINGS, cmd_slurm_costs

    if args.by in SLURM_GROUPINGS:  # the Slurm clusters' accounting, not billing
        return cmd_slurm_costs(args)
    from .common import check_input_path, load_settings_from_args

    check_input_path(args.path, "--path")

    if args.month is None:
        first = _now().replace(day=1)
        args.month = f"{first - timedelta(days=1):%Y-%m}"
    settings = load_settings_from_args(args, uses_database=bool(args.save or args.idle))
    if args.db is not None:
        from .common import database_url

        settings = settings.model_copy(update={"database_url": database_url(args.db)})
    if not (args.save or args.idle or args.output == "focus"):  # a CUR / FOCUS total: DuckDB, no pandas imported
        from ..collect.billing.totals import print_file_totals

        from .common import render_table

        rc = print_file_totals(settings, args.month, args.by, args.source, args.path, args.output, render=render_table)
        if rc is not None:
            return rc
    from ..collect.billing.schema import BillingDataError, month_bounds
    from ..collect.billing.schema import save_costs
    from ..cost.costs import summarize
    from ..run.compose import live_store

    now = _now()
    try:
        start, end = month_bounds(args.month)
    except BillingDataError as exc:
        return usage_error(str(exc))
    if args.output == "focus" and not args.idle:
        return usage_error("--output focus needs --idle (the cost split by verdict as FOCUS rows)")
    if args.idle and args.source is None:
        return _print_idle_costs(settings, args, start, end, now, None)
    if not (args.save or args.idle):  # a plain total: CUR is read once at the asked grain, no day x tag table
        from ..cost.costs import summarize_totals

        totals = _load_costs(settings, args, start, end, now, by=args.by)
        if totals is None:
            return EXIT_PROBLEM_FOUND
        if totals.table.empty:
            print(f"warning: no GPU instance cost in {totals.source} for {args.month}", file=sys.stderr)
        _print(summarize_totals(totals.table, args.by), args.output)
        return 0
    loaded = _load_costs(settings, args, start, end, now)
    if loaded is None:
        return EXIT_PROBLEM_FOUND
    if args.save:
        store = live_store(settings)
        n = save_costs(store, loaded.table, loaded.source, start.date(), end.date(), now)
        print(f"stored {n} rows for {args.month} from {loaded.source}", file=sys.stderr)
    if loaded.table.empty:
        print(f"warning: no GPU instance cost in {loaded.source} for {args.month}", file=sys.stderr)
    if args.idle:
        return _print_idle_costs(settings, args, start, end, now, loaded.table)
    out = summarize(loaded.table, args.by)
    _print(out, args.output)
    return 0


def _print_idle_costs(settings, args, start, end, now, table) -> int:
    """What each instance/team cost while ACTIVE, UNDERUTILIZED, UNKNOWN and IDLE, from stored verdicts."""
    from ..cost.budgets import default_catalog
    from ..cost.costs import billing_rates, idle_cost_report, resource_attrs, verdict_costs
    from ..run.compose import live_store

    store = live_store(settings)
    table = with_listed_gce_vms(table, store)
    rates, attrs = (billing_rates(table), resource_attrs(table)) if table is not None and not table.empty else ({}, {})
    vc = verdict_costs(store.verdict_hours_frame(start, min(end, now), grain="period"), start, min(end, now),
                       max_gap_s=2 * settings.schedule.evaluate_every_s, rates=rates, catalog=default_catalog(),
                       attrs=attrs, default_region=settings.aws.regions[0] if settings.aws.regions else "")
    if vc.empty:
        print(f"warning: no stored decisions for {args.month} in {settings.database_url.split('@')[-1]}",
              file=sys.stderr)
    if args.output == "focus":
        _print_focus(store, vc, start, min(end, now), table, settings)
        return 0
    _print(idle_cost_report(vc, args.by), args.output)
    return 0


def with_listed_gce_vms(table, store):
    """The cost table with each `gce-unlisted:` VM (a bill naming it only by its numeric id) renamed to the VM the
    service listed with that id (Store.cloud_ids), so that its billed rate meets its verdicts."""
    from ..model import GCE_UNLISTED_PREFIX, resolve_gce_ids

    if table is None or table.empty or not table["resource_id"].str.startswith(GCE_UNLISTED_PREFIX).any():
        return table
    return table.assign(resource_id=resolve_gce_ids(table["resource_id"], store.cloud_ids()))


def _print_focus(store, vc, start, end, table, settings) -> None:
    """The verdict split as FOCUS CSV on stdout; unpriced hours are said on stderr (FOCUS costs are not null)."""
    from ..collect.billing.focus_export import catalog_gpu_counts, focus_rows, rules_by_verdict
    from ..cost.costs import resource_attrs

    attrs = resource_attrs(table) if table is not None and not table.empty else {}
    currency = str(table["currency"].iloc[0]) if table is not None and not table.empty else "USD"
    rows = focus_rows(vc, start, end, rules=rules_by_verdict(store.episode_frame(start, end)),
                      regions={i: a.get("region", "") for i, a in attrs.items()},
                      gpu_counts=catalog_gpu_counts(vc["instance_type"] if len(vc) else []), currency=currency,
                      default_region=settings.aws.regions[0] if settings.aws.regions else "")
    unpriced = vc[vc["cost"].isna()]["hours"].sum() if len(vc) else 0.0
    if unpriced > 0:
        print(f"warning: {unpriced:.2f} instance-hours have no price (no billing rate, stored $/h or catalog "
              "price) and are not in the FOCUS rows", file=sys.stderr)
    rows.to_csv(sys.stdout, index=False)


def _load_costs(settings, args, start: datetime, end: datetime, now: datetime, by: str | None = None):
    """The period's cost table from --source/--path or the config, or with `by` only its totals at that grain
    (one pass); None (error printed) on bad data. Warnings go to stderr."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ..collect.billing.load import load_cost_table, load_cost_totals
    from ..collect.billing.schema import BillingDataError

    try:
        if by is None:
            loaded = load_cost_table(settings, start, end, now, source=args.source, path=args.path)
        else:
            loaded = load_cost_totals(settings, start, end, now, by, source=args.source, path=args.path)
    except BillingDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    except (ClientError, BotoCoreError) as exc:  # Cost Explorer / Athena / S3 down or refusing: one line, no traceback
        from ..collect.billing.settings import billing_settings

        print(f"error: billing ({args.source or billing_settings(settings).source}): {exc}", file=sys.stderr)
        return None
    for w in loaded.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return loaded


def _print(df, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(df.to_dict("records"), default=str, indent=2))
    elif fmt == "csv":
        df.to_csv(sys.stdout, index=False)
    else:
        if df.empty:
            print("(no rows)")
        else:
            from .common import print_frame

            print_frame(df)


def cmd_budgets_check(args: argparse.Namespace) -> int:
    from ..collect.billing.schema import BillingDataError, month_bounds
    from ..cost.budgets import run_budget_check
    from .common import check_input_path, load_settings_from_args
    from ..run.compose import live_notifier
    from ..run.compose import live_store

    check_input_path(args.path, "--path")
    settings = load_settings_from_args(args)
    now = _now()
    try:
        if args.month:
            start, end = month_bounds(args.month)
            if end <= now:
                now = end - timedelta(seconds=1)
        else:
            start, end = month_bounds(f"{now:%Y-%m}")
    except BillingDataError as exc:
        return usage_error(str(exc))
    from ..collect.billing.settings import billing_settings
    from ..config import ConfigError
    from ..cost.budgets import configured_budgets, no_budgets_line

    bs = billing_settings(settings)
    try:
        budgets = configured_budgets(bs.budgets_path)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM_FOUND
    if not budgets:
        print(no_budgets_line(bs.budgets_path))
        return 0
    from ..run.slurm_cost import billing_or_none, read_slurm_month

    if any(not b.scope.slurm for b in budgets):
        loaded = _load_costs(settings, args, start, end, now)
        if loaded is None:
            return EXIT_PROBLEM_FOUND
    else:  # only Slurm accounts: sacct is read, billing is not
        loaded = billing_or_none(now)
    store = live_store(settings)
    notifier = live_notifier(settings, store) if args.notify and not args.dry_run else None
    statuses = run_budget_check(settings, store, notifier, now, loaded, budgets=budgets, bs=bs,
                                send=args.notify, dry_run=args.dry_run,
                                slurm=lambda s, e: read_slurm_month(settings, store, s, e, now))
    rows = [{"budget": s.budget, "scope": s.scope, "period": s.period, "amount": s.amount, "currency": s.currency,
             "spent": round(s.spent, 2), "forecast": round(s.forecast, 2), "pct_actual": round(s.pct_actual, 1),
             "pct_forecast": round(s.pct_forecast, 1),
             "idle_share": "unknown (no priced evaluation)" if s.idle_share is None else round(s.idle_share, 3),
             "alerts_sent": ", ".join(s.alerts_sent), "error": s.error or ""} for s in statuses]
    import pandas as pd

    _print(pd.DataFrame(rows), args.output)
    due = [line for s in statuses for line in s.alerts_due]
    if due and args.output == "table":
        why = "dry-run: would send" if args.dry_run else "alerts due, not sent (add --notify to send)"
        print(f"{why}:\n" + "\n".join(f"  {line}" for line in due))
    if loaded.source == "ce" and args.output == "table":
        _print_aws_forecast(settings, now, end)
    return 1 if any(s.error for s in statuses) else 0


def _print_aws_forecast(settings, now: datetime, end: datetime) -> None:
    """AWS's own forecast, for comparison with ours (it covers the whole service, not only GPUs)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ..collect.billing.ce import fetch_ce_forecast
    from ..collect.aws_config import read_client
    from ..collect.billing.settings import billing_settings

    ce = billing_settings(settings).ce
    try:
        forecast = fetch_ce_forecast(read_client(settings, "ce", ce.region), now, end, ce)
    except (ClientError, BotoCoreError) as exc:
        print(f"note: AWS cost forecast unavailable: {forecast_error_line(exc)}", file=sys.stderr)
        return
    if forecast is not None:
        amount, unit = forecast
        print(f"AWS Cost Explorer forecast for the rest of {end - timedelta(days=1):%Y-%m} "
              f"({ce.service}, all instances, not only GPUs): {amount:,.2f} {unit}")


def forecast_error_line(exc: Exception) -> str:
    """One clear line for a failed GetCostForecast call: the error code and HTTP status, never the body of an
    HTML error page (a proxy or a 500 answers with one)."""
    import re

    resp = getattr(exc, "response", None) or {}
    err = resp.get("Error") or {}
    status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    message = str(err.get("Message") or "")
    if not message or "<" in message:  # an HTML page, not an AWS error: say so instead of printing it
        message = "the endpoint answered with an HTML page, not an AWS error" if "<" in (message or str(exc)) \
            else str(exc)
    message = re.sub(r"\s+", " ", message)[:200]
    code = err.get("Code") or type(exc).__name__
    return f"GetCostForecast failed ({code}{f', HTTP {status}' if status else ''}): {message}"
