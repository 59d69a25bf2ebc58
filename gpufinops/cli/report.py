"""`gpufinops report`: the monthly audit as HTML (with charts), one CSV per table, JSON and PDF; delivered by
S3, Slack and email with --deliver."""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path

FORMATS = ("html", "csv", "json")  # the default
ALL_FORMATS = (*FORMATS, "pdf")  # pdf: the HTML printed by headless Chromium


def _formats(text: str) -> tuple[str, ...]:
    items = tuple(dict.fromkeys(x.strip().lower() for x in text.split(",") if x.strip()))
    bad = [x for x in items if x not in ALL_FORMATS]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(ALL_FORMATS)}, got {text!r}")
    return items


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="monthly GPU audit: spend, idle cost, stops and savings, teams, recommendations "
                       "(HTML/CSV/JSON/PDF; --deliver sends it by S3, Slack, email)",
        description="Write the monthly GPU FinOps audit of one month from the audit database: an HTML report with "
                    "charts, one CSV per table and a JSON document, and a PDF with --formats pdf (needs Chromium). "
                    "--deliver also sends it where report.delivery says: S3, a Slack summary, and an email to "
                    "email.finance with the PDF attached (docs/report.md). Prints the paths written, then one line "
                    "per delivery; exits 1 when the month has no data (said on stderr).")
    p.add_argument("--month", default=None, help="YYYY-MM (default: the previous full month, UTC)")
    # The report writes files, so it has no -o/--output (the print format of other commands): it prints the
    # paths it wrote. The old --out and --format still work, unlisted.
    p.add_argument("--out-dir", default="reports-out", metavar="DIR",
                   help="folder to write into (created if missing; default: reports-out)")
    p.add_argument("--out", dest="out_dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--formats", type=_formats, default=FORMATS, metavar="html,csv,json",
                   help="which files to write (default: html,csv,json; pdf needs Chromium)")
    p.add_argument("--format", dest="formats", type=_formats, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--db", default=None,
                   help="audit database: a SQLite file path or a SQLAlchemy URL "
                        "(default: database_url from the config)")
    p.add_argument("--deliver", action="store_true",
                   help="also send the report where report.delivery says (S3, Slack, email), with its PDF rendition; "
                        "Slack and email once per report: run again, it sends what was not delivered and says "
                        "what was")
    p.add_argument("--again", action="store_true",
                   help="with --deliver: send the Slack message and the email again even when this report was "
                        "delivered already (another copy, itself sent once)")
    p.add_argument("--dry-run", action="store_true",
                   help="with --deliver: write the files, send nothing, print what would be sent where")
    p.set_defaults(func=cmd_report)


def _database_url(db: str | None, default: str) -> str:
    url = default if db is None else (db if "://" in db else f"sqlite:///{Path(db).resolve()}")
    if url.startswith("sqlite:///") and ":memory:" not in url:
        path = Path(url[len("sqlite:///"):])
        if not path.is_file():
            # Opening it would create an empty database and a report saying "no data": almost surely a typo.
            raise FileNotFoundError(f"audit database {path} does not exist")
    return url


def cmd_report(args: argparse.Namespace) -> int:
    from .common import EXIT_PROBLEM_FOUND, load_settings_from_args, usage_error
    from ..collect.billing.schema import BillingDataError
    from ..report.deliver import configured, s3_client
    from ..report.monthly import PdfError, write_and_deliver
    from ..run.slurm_cost import slurm_reader
    from ..report.period import ReportPeriodError
    from ..store.store import Store

    settings = load_settings_from_args(args)
    if args.dry_run and not args.deliver:
        return usage_error("--dry-run goes with --deliver (without it nothing is sent anyway)")
    if args.again and not args.deliver:
        return usage_error("--again goes with --deliver (it sends a delivered report once more)")
    if args.deliver and not configured(settings.report.delivery):
        return usage_error("--deliver: no destination configured (report.delivery.s3_uri, "
                           "report.delivery.slack_channel or report.delivery.email_finance in the config; "
                           "docs/report.md)")
    if not args.out_dir.strip():
        return usage_error("--out-dir is empty: name the folder to write into")
    try:  # a folder that cannot be made (a file is there, a name too long) is a bad --out-dir, said before any work
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        return usage_error(f"--out-dir {args.out_dir!r}: cannot create the folder: {why}")
    now = datetime.now(timezone.utc)
    try:
        store = Store(_database_url(args.db, settings.database_url))
    except FileNotFoundError as exc:
        return usage_error(str(exc))
    d = settings.report.delivery
    quiet = _quiet_info_logs()
    try:
        from ..report.monthly import monthly_audit

        audit = monthly_audit(store, args.month, now, settings, slurm_reader(settings, store))
        if args.deliver:
            from ..run.compose import live_notifier

            notifier = live_notifier(settings, store) if d.slack_channel and not args.dry_run else None
            s3 = s3_client(settings) if d.s3_uri and not args.dry_run else None
            email = None
            if d.email_finance and not args.dry_run:
                from ..notify.email import EmailDelivery

                email = EmailDelivery(settings.email, store, lambda: now)
            paths, sent = write_and_deliver(store, args.month, args.out_dir, now, settings, args.formats,
                                            dry_run=args.dry_run, notifier=notifier, s3_client=s3, email=email,
                                            again=args.again, audit=audit)
        else:
            from ..report.render import write_report

            paths, sent = write_report(audit, Path(args.out_dir), args.formats), []
    except PdfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM_FOUND
    except ReportPeriodError as exc:  # a bad --month: the same exit code as in `costs` and `budgets check`
        return usage_error(str(exc))
    except BillingDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM_FOUND
    finally:
        quiet()
        store.close()
    for path in paths:
        print(path)
    for s in sent:
        print(s.line(args.dry_run))
    if not audit.has_data:
        # The files say so too, but a person at the terminal sees only paths: the likely causes, once, on stderr.
        print(f"note: no data for {audit.period.month}: no evaluation and no billing row is stored for that month "
              f"in this database (was the service running and writing to it? --month picks another month, --db "
              f"another database)", file=sys.stderr)
    return EXIT_PROBLEM_FOUND if any(s.error for s in sent) or not audit.has_data else 0


def _quiet_info_logs():
    """Keep the service's INFO lines (deliveries, the outbox) out of the command's output at the default level:
    the printed lines say what was written and sent. Returns the undo. `--log-level DEBUG` shows everything."""
    service_log = logging.getLogger("gpufinops")
    before = service_log.level
    if logging.getLogger().getEffectiveLevel() == logging.INFO:
        service_log.setLevel(logging.WARNING)
    return lambda: service_log.setLevel(before)
