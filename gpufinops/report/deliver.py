"""Deliver the month's report where `report.delivery` says (issue 26, item 1): an S3 prefix and a Slack message
to a channel. Each destination is one setting, off by default; with dry_run nothing is sent and each Delivery
says what would have been sent where.

- S3 (`s3_uri: s3://bucket/prefix`): every file written (HTML, its PDF rendition, JSON, CSVs) is put under
  `prefix/YYYY-MM/`, with its content type. Through the configured AWS endpoint (boto3; moto in the tests).
- Slack (`slack_channel`): one message through the notifier (exactly once per report and channel: its key is
  `report:<report_key>:<channel>`), with the finance page's figures in one line each and where the files are (the
  S3 location when S3 is on, else the folder on the machine that wrote them). No file is uploaded to Slack.
- Email (`email_finance: true`): one message to `email.finance` through notify/email.py (exactly once per report:
  key `report-email:<report_key>`), the finance page's figures as its text, the PDF (and the HTML) attached.

Both start with how much of the month was observed (report.observed) and label the forecast a projection.
`report_key` is the month, or for a month in progress the month and the day it was observed to, so a mid-month
delivery never stands in for the month-end one. Delivered once, each is not sent again: the Delivery says when
and to whom it went (`plan_send`); a failed try is sent again now, the email with its attachments; `again`
sends another copy under a key of its own (`<key>:again-2` ...), itself exactly once.
"""

from __future__ import annotations

import logging
import mimetypes
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Sequence

from ..config import ReportDeliverySettings
from ..model import Message, Notifier
from ..store.schema import MAILTO
from ..notify.markup import escape
from ..store.schema import NotificationRow
from ..store.store import Store
from .audit import MonthlyAudit
from .formats import money, share
from .observed import FORECAST_LABEL
from .period import ReportPeriod

log = logging.getLogger("gpufinops.report")



@dataclass(frozen=True)
class Delivery:
    destination: str  # "s3" | "slack" | "email"
    target: str  # s3://bucket/key or the channel
    detail: str  # what was (or would be) sent, in words
    sent: bool  # False in dry-run, or when it failed (then `error`), or when not sent again (then `already`)
    error: str = ""
    already: str = ""  # sent before, so not sent again: when and to whom, and how to send it anyway

    def line(self, dry_run: bool) -> str:
        if self.already:
            return f"{'would not send' if dry_run else 'not sent'} to {self.destination} {self.target}: {self.already}"
        if dry_run:
            return f"would send to {self.destination} {self.target}: {self.detail}"
        if self.error:
            return f"FAILED {self.destination} {self.target}: {self.error}"
        return f"sent to {self.destination} {self.target}: {self.detail}"


def configured(d: ReportDeliverySettings) -> list[str]:
    """The destinations switched on."""
    return [name for name, on in (("s3", bool(d.s3_uri)), ("slack", bool(d.slack_channel)),
                                  ("email", d.email_finance)) if on]


def s3_location(uri: str, month: str) -> tuple[str, str]:
    """(bucket, key prefix ending in '/') of an s3:// URI for one month's files."""
    rest = uri[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    return bucket, (f"{prefix}/" if prefix else "") + f"{month}/"


# --------------------------------------------------------------------------- exactly once, and again on request


def report_key(p: ReportPeriod) -> str:
    """What one delivery of the report is about: the month, or for a month in progress the month up to the day
    it was observed to. A mid-month delivery is another report than the month-end one, so it never stands in
    for it (issue 35: a `--deliver` on the 10th suppressed the delivery of the finished month)."""
    return p.month if not p.partial else f"{p.month}:partial-to-{p.as_of:%Y-%m-%d}"


def email_key(p: ReportPeriod) -> str:
    return f"report-email:{report_key(p)}"


def slack_key(p: ReportPeriod, channel: str) -> str:
    return f"report:{report_key(p)}:{channel}"


AGAIN = ":again-"  # a copy a person asked for with --again: <key>:again-2, :again-3 ...
MAX_COPIES = 50  # copies looked at; a person does not ask for more


def copy_keys(key: str) -> list[str]:
    """The key of the report's first delivery, then of each copy sent with --again, in order."""
    return [key] + [f"{key}{AGAIN}{n}" for n in range(2, MAX_COPIES + 1)]


@dataclass(frozen=True)
class SendPlan:
    key: str  # the key to send under ("" when nothing is sent)
    earlier: NotificationRow | None  # that key's row, when it has one (a failed try)
    already: str = ""  # why nothing is sent, in words (with how to send it anyway)
    error: bool = False  # nothing sent and the fate of the last try is unknown: a problem, not a success


def _when(t: datetime) -> str:
    return f"{t:%Y-%m-%d %H:%M} UTC"


def _to_whom(row: NotificationRow) -> str:
    return ", ".join(row.channel[len(MAILTO):].split(",")) if row.channel.startswith(MAILTO) else row.channel


def plan_send(rows: Sequence[NotificationRow | None], keys: Sequence[str], again: bool, *,
              looks_up_unknown: bool) -> SendPlan:
    """Whether and under which key to send the report, from its earlier deliveries (pure).

    `rows`: the stored row of each key of copy_keys (None: never tried), `keys` those keys. Without `again`:
    send when the report was never delivered (a failed try is tried again, under its key); say so and send
    nothing when it was. With `again`: a failed copy is tried again, else a new copy under the next key, so each
    copy is exactly once. `looks_up_unknown`: the transport finds out itself whether a try whose answer was
    lost arrived (Slack reads the channel); email cannot, so such a try is never repeated under its key.
    """
    tried = [(k, r) for k, r in zip(keys, rows) if r is not None]
    if not tried:
        return SendPlan(keys[0], None)
    delivered = [r for _, r in tried if r.delivered]
    last_key, last = tried[-1]
    retry = last.status == "failed" or (last.status == "pending" and looks_up_unknown)
    if again:
        if retry:
            return SendPlan(last_key, last)
        nxt = keys[len(tried)] if len(tried) < len(keys) else ""
        if not nxt:
            return SendPlan("", None, f"{len(keys)} copies sent already; not sent again", error=True)
        return SendPlan(nxt, None)
    if delivered:
        r = delivered[-1]
        verb = "written to the outbox (no Slack token)" if r.status == "outbox" else "delivered"
        return SendPlan("", None, f"already {verb} on {_when(r.at)} to {_to_whom(r)}; `--again` to send it again")
    first_key, first = tried[0]
    if first.status == "pending" and not looks_up_unknown:
        return SendPlan("", None, f"an earlier try on {_when(first.at)} went unanswered, so the server may have it; "
                                  "not sent again so nobody gets it twice; `--again` to send it anyway", error=True)
    if first.status == "abandoned":
        return SendPlan("", None, f"withdrawn on {_when(first.at)}; `--again` to send it", error=True)
    return SendPlan(first_key, first)


def _plan(store: Store | None, key: str, again: bool, looks_up_unknown: bool) -> SendPlan:
    if store is None:  # nothing to look up (a caller without the store): send under the key
        return SendPlan(key, None)
    keys = copy_keys(key)
    rows: list[NotificationRow | None] = []
    for k in keys:  # the copies in order, up to the first never tried
        row = store.get_notification(k)
        rows.append(row)
        if row is None:
            break
    return plan_send(rows, keys[:len(rows)], again, looks_up_unknown=looks_up_unknown)


def _due_now(store: Store | None, row: NotificationRow | None) -> None:
    """The Slack line asked for now (a person's `report --deliver`, the month's job) is tried now: the backoff
    spaces the service's automatic retries, not a person's (who may just have fixed the mail server). Email has
    the same in `EmailDelivery.send(retry_now=True)`."""
    if store is not None and row is not None and row.status == "failed" and row.next_attempt_at is not None:
        store.record_notification(row.key, row.channel, row.text, row.status, row.at, row.detail, blocks=row.blocks,
                                  attempts=row.attempts, next_attempt_at=None)


# --------------------------------------------------------------------------- what is said


def slack_text(a: MonthlyAudit, where: str) -> str:
    """The finance page in a few lines (plain text: tag values never reach it, only team names, as text): how
    much of the month was observed first, then the figures, the forecast said to be a projection."""
    h, f, cur, p = a.headline, a.finance, a.currency, a.period
    basis = "billed" if f.get("basis") == "billed" else "estimated (no bill stored: running time x hourly price)"
    lines = [f"GPU spend report {p.month}" + (" (month in progress)" if p.partial else ""),
             f"Observed: {f['observed_words']}",
             f"Spend: {money(h['gpu_spend'], cur)}, {basis}, {f['spend_words']}",
             f"Idle spend: {money(h['idle_cost'], cur)} ({share(h['idle_share'])} of what ran)",
             f"What stopping saved (net): {money(h['net_saved_cost'], cur)}"]
    budgets = "; ".join(f"{b['budget']} {money(b['amount'], cur, 0)}" for b in f.get("budgets", []))
    lines.append(f"{FORECAST_LABEL}: {money(f.get('forecast'), cur)}: {f['forecast_words']}; "
                 + (f"budgets: {budgets}" if budgets else "no budget configured"))
    teams = ", ".join(f"{t['team']} {money(t['spend'], cur)}" for t in f.get("teams", []))
    if teams:
        lines.append(f"Top teams: {teams}")
    lines.append(f"Full report: {where}")
    return "\n".join(lines)


def _spend_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Spend: "))


def s3_client(settings):
    """An S3 client through the configured AWS endpoint and credentials (the billing reader's client)."""
    from ..collect.aws_config import read_client

    region = settings.aws.regions[0] if settings.aws.regions else "us-east-1"
    return read_client(settings, "s3", region)


def deliver_report(a: MonthlyAudit, paths: Sequence[Path], d: ReportDeliverySettings, *, dry_run: bool,
                   notifier: Notifier | None = None, s3_client=None, email=None,
                   email_to: Sequence[str] = (), store: Store | None = None, again: bool = False) -> list[Delivery]:
    """Send the written files (`paths`) to each configured destination; what was (or would be) sent, per
    destination. A failed destination is reported in its Delivery and logged; the others are still tried.
    Slack and email go once per report (`store`: their earlier deliveries); `again` sends another copy."""
    out: list[Delivery] = []
    month = a.period.month
    where = str(Path(paths[0]).resolve().parent) + "/" if paths else "(no file written)"
    if d.s3_uri:
        bucket, prefix = s3_location(d.s3_uri, month)
        where = f"s3://{bucket}/{prefix}"
        for path in paths:
            path = Path(path)
            key = prefix + path.name
            ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            detail = f"{path.name} ({path.stat().st_size:,} bytes, {ctype})"
            if dry_run:
                out.append(Delivery("s3", f"s3://{bucket}/{key}", detail, False))
                continue
            try:
                s3_client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes(), ContentType=ctype)
                out.append(Delivery("s3", f"s3://{bucket}/{key}", detail, True))
            except Exception as exc:  # noqa: BLE001 - one line per failed file, the rest still tried
                err = getattr(exc, "response", {}).get("Error", {}) if hasattr(exc, "response") else {}
                msg = f"{err.get('Code')}: {err.get('Message')}" if err else f"{type(exc).__name__}: {exc}"
                log.error("report upload to s3://%s/%s failed: %s", bucket, key, msg[:300])
                out.append(Delivery("s3", f"s3://{bucket}/{key}", detail, False, msg[:300]))
    if d.slack_channel:
        out.append(_slack(a, where, d.slack_channel, notifier, store, dry_run, again))
    if d.email_finance:
        out.append(_email(a, paths, where, email, list(email_to), dry_run, store, again))
    return out


def _not_sent(destination: str, target: str, detail: str, plan: SendPlan) -> Delivery:
    return Delivery(destination, target, detail, False, plan.already if plan.error else "", plan.already)


def _slack(a: MonthlyAudit, where: str, channel: str, notifier, store: Store | None, dry_run: bool,
           again: bool) -> Delivery:
    """One message to the channel, once per report (and once per copy asked with `again`)."""
    text = slack_text(a, where)
    detail = f"one message: {_spend_line(text)} ..."
    plan = _plan(store, slack_key(a.period, channel), again, looks_up_unknown=True)
    if not plan.key:
        return _not_sent("slack", channel, detail, plan)
    if dry_run:
        return Delivery("slack", channel, detail, False)
    _due_now(store, plan.earlier)
    # A notice like every other (title and lead, rendered by each delivery); team names come from tags, so they
    # are escaped: text, never markup.
    title, _, rest = escape(text).partition("\n")
    msg = Message(key=plan.key, channel=channel, text=escape(text), kind="report", subject=a.period.month,
                  audience=("default",), title=title, lead=rest)
    ok = notifier.send(msg)
    return Delivery("slack", channel, detail, ok,
                    "" if ok else "not delivered (see the log; retried with the other messages)")


# What a finance reader opens: the PDF first, the page itself second.
_ATTACHED = {".pdf": "application/pdf", ".html": "text/html"}


def _email(a: MonthlyAudit, paths: Sequence[Path], where: str, email, to: list[str], dry_run: bool,
           store: Store | None, again: bool) -> Delivery:
    """One email to the finance list with the PDF (and HTML) attached, once per report (and once per copy asked
    with `again`). A try the mail server did not accept is sent again, attachments and all, by the next
    `report --deliver`, never by the service's generic retry (which has the text only)."""
    files = sorted((Path(p) for p in paths if Path(p).suffix in _ATTACHED), key=lambda p: p.suffix != ".pdf")
    target = ", ".join(to) or "(email.finance is empty)"
    detail = "one email with " + (", ".join(p.name for p in files) or "no attachment")
    if store is None and email is not None:
        store = email.store
    plan = _plan(store, email_key(a.period), again, looks_up_unknown=False)
    if not plan.key:
        return _not_sent("email", target, detail, plan)
    if dry_run:
        return Delivery("email", target, detail, False)
    if email is None or not to:
        return Delivery("email", target, detail, False, "email.enabled and email.finance must be set")
    text = slack_text(a, where)
    title, observed, *figures = text.splitlines()
    notice = Message(key=plan.key, kind="report", subject=a.period.month, audience=("finance",), title=title,
                     text=observed, lines=tuple(figures))
    attachments = [(p.name, _ATTACHED[p.suffix], p.read_bytes()) for p in files]
    # retry_now: a person's (or the month's job's) request is tried now, not after the automatic retry's backoff.
    ok = email.send(notice, to=to, attachments=attachments, retry_now=True)
    rerun = f"gpufinops report --deliver --month {a.period.month}"
    return Delivery("email", target, detail, ok,
                    "" if ok else f"not accepted by the mail server (see the log); `{rerun}` sends it again, "
                                  "with its attachments, once the server takes mail")


__all__ = ["Delivery", "SendPlan", "configured", "copy_keys", "deliver_report", "email_key", "plan_send",
           "report_key", "s3_client", "s3_location", "slack_key", "slack_text"]
