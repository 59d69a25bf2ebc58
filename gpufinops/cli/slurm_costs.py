"""`gpufinops costs --by slurm-account|slurm-user|partition|slurm-qos`: a month's GPU-hours and dollars on the Slurm
clusters, from their accounting (sacct), with the idle GPU-hours the stored verdicts give (docs/slurm.md "Cost").
Reached from `gpufinops.cli.billing`'s `costs` command."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone

from .common import EXIT_PROBLEM_FOUND, usage_error

# `--by` -> the usage table's column (cost.slurm's sums group by it; the one table of the groupings).
SLURM_GROUPINGS = {"slurm-account": "account", "slurm-user": "user", "partition": "partition", "slurm-qos": "qos"}


def cmd_slurm_costs(args: argparse.Namespace) -> int:
    from ..collect.billing.schema import BillingDataError, month_bounds
    from ..cost.slurm import slurm_totals
    from ..run.compose import live_store
    from ..run.slurm_cost import read_slurm_idle, read_slurm_usage
    from .common import load_settings_from_args, print_frame

    settings = load_settings_from_args(args)
    if settings.slurm is None or not settings.slurm.enabled:
        return usage_error(f"costs --by {args.by} reads Slurm's accounting: add a `slurm:` section to "
                           f"{settings.source_path or 'the config'} (docs/slurm.md)")
    if args.output not in ("table", "json", "csv"):
        return usage_error(f"--by {args.by} prints table, json or csv, not {args.output}")
    if args.db is not None:
        from .common import database_url

        settings = settings.model_copy(update={"database_url": database_url(args.db)})
    now = datetime.now(timezone.utc)
    month = args.month or f"{now.replace(day=1) - timedelta(days=1):%Y-%m}"  # as billing: the last full month
    try:
        start, end = month_bounds(month)
    except BillingDataError as exc:
        return usage_error(str(exc))
    if start > now:
        return usage_error(f"--month {month} has not begun")
    usage = read_slurm_usage(settings, start, end, now)
    for line in usage.errors:
        print(f"error: {line}", file=sys.stderr)
    for line in usage.warnings:
        print(f"warning: {line}", file=sys.stderr)
    if not usage.clusters or len(usage.errors) == len(usage.clusters):
        return EXIT_PROBLEM_FOUND  # nothing was read: no table of zeros
    from sqlalchemy.exc import SQLAlchemyError

    try:
        store = live_store(settings)
    except SQLAlchemyError as exc:  # the database is down: the GPU-hours stand, idle is unknown (never 0)
        store, why = None, f"the database could not be opened ({type(exc).__name__}): idle GPU-hours unknown"
    idle, why = read_slurm_idle(settings, store, start, end, now, usage.table) if store else (None, why)
    if why:
        print(f"warning: {why}", file=sys.stderr)
    column = SLURM_GROUPINGS[args.by]
    out = slurm_totals(usage.table, column, idle).rename(columns={column: args.by})
    t = usage.table
    total = {"gpu_hours": round(float(t["gpu_seconds"].sum()) / 3600, 2), "usd": round(float(t["cost"].sum()), 2),
             "unpriced_gpu_hours": round(float(t.loc[t["cost"].isna(), "gpu_seconds"].sum()) / 3600, 2),
             "jobs": int(t["subject_id"].nunique()) if len(t) else 0}
    read = [c for c in usage.clusters if not any(e.startswith(f"slurm {c}:") for e in usage.errors)]
    until = min(end, now)
    if args.output == "json":
        print(json.dumps({"month": month, "by": args.by, "clusters": read, "through": until.isoformat(),
                          "rows": json.loads(out.to_json(orient="records")), "total": total,
                          "errors": usage.errors}, indent=2))
    elif args.output == "csv":
        out.to_csv(sys.stdout, index=False)
    elif out.empty:
        print(f"(no GPU jobs in {month} on {', '.join(read)})")
    else:
        shown = out.astype(object)
        for col in ("usd", "idle_gpu_hours", "idle_usd"):  # not known (unpriced, verdicts unread): said, never 0
            shown[col] = shown[col].where(out[col].notna(), "unknown")
        print_frame(shown, right=list(out.columns[1:]))
        partial = f" ({until:%Y-%m-%d %H:%M} UTC so far)" if until < end else ""
        unpriced = f", {total['unpriced_gpu_hours']:,.2f} GPU-hours unpriced" if total["unpriced_gpu_hours"] else ""
        print(f"total {total['gpu_hours']:,.2f} GPU-hours, ${total['usd']:,.2f}{unpriced}, {total['jobs']} jobs in "
              f"{month}{partial} on {', '.join(read)} (sacct)")
    return EXIT_PROBLEM_FOUND if usage.errors else 0
