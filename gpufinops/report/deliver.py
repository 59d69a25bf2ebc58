"""Deliver the month's report where `report.delivery` says (issue 26, item 1): an S3 prefix and a Slack message
to a channel. Each destination is one setting, off by default; with dry_run nothing is sent and each Delivery
says what would have been sent where.

- S3 (`s3_uri: s3://bucket/prefix`): every file written (HTML, its PDF rendition, JSON, CSVs) is put under
  `prefix/YYYY-MM/`, with its content type. Through the configured AWS endpoint (boto3; moto in the tests).
- Slack (`slack_channel`): one message through the notifier (exactly once per month and channel: its key is
  `report:<YYYY-MM>:<channel>`), with the finance page's figures in one line each and where the files are (the
  S3 location when S3 is on, else the folder on the machine that wrote them). No file is uploaded to Slack.
- Email (`email_finance: true`): one message to `email.finance` through notify/email.py (exactly once per month:
  key `report-email:<YYYY-MM>`), the finance page's figures as its text, the PDF (and the HTML) attached.
"""

from __future__ import annotations

import logging
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..config import ReportDeliverySettings
from ..model import Message, Notifier
from ..notify.markup import escape
from .audit import MonthlyAudit
from .render import _money, _share

log = logging.getLogger("gpufinops.report")


@dataclass(frozen=True)
class Delivery:
    destination: str  # "s3" | "slack" | "email"
    target: str  # s3://bucket/key or the channel
    detail: str  # what was (or would be) sent, in words
    sent: bool  # False in dry-run, or when it failed (then `error`)
    error: str = ""

    def line(self, dry_run: bool) -> str:
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


def slack_text(a: MonthlyAudit, where: str) -> str:
    """The finance page in a few lines (plain text: tag values never reach it, only team names, as text)."""
    h, f, cur, p = a.headline, a.finance, a.currency, a.period
    basis = "billed" if f.get("basis") == "billed" else "estimated (no bill stored: running time x hourly price)"
    lines = [f"GPU spend report {p.month}" + (" (month in progress)" if p.partial else ""),
             f"Spend: {_money(h['gpu_spend'], cur)}, {basis}",
             f"Idle spend: {_money(h['idle_cost'], cur)} ({_share(h['idle_share'])} of what ran)",
             f"What stopping saved (net): {_money(h['net_saved_cost'], cur)}"]
    budgets = "; ".join(f"{b['budget']} {_money(b['amount'], cur, 0)}" for b in f.get("budgets", []))
    lines.append(f"Forecast for the month: {_money(f.get('forecast'), cur)}"
                 + (f" (budgets: {budgets})" if budgets else " (no budget configured)"))
    teams = ", ".join(f"{t['team']} {_money(t['spend'], cur)}" for t in f.get("teams", []))
    if teams:
        lines.append(f"Top teams: {teams}")
    lines.append(f"Full report: {where}")
    return "\n".join(lines)


def s3_client(settings):
    """An S3 client through the configured AWS endpoint and credentials (the billing reader's client)."""
    from ..collect.aws_config import read_client

    region = settings.aws.regions[0] if settings.aws.regions else "us-east-1"
    return read_client(settings, "s3", region)


def deliver_report(a: MonthlyAudit, paths: Sequence[Path], d: ReportDeliverySettings, *, dry_run: bool,
                   notifier: Notifier | None = None, s3_client=None, email=None,
                   email_to: Sequence[str] = ()) -> list[Delivery]:
    """Send the written files (`paths`) to each configured destination; what was (or would be) sent, per
    destination. A failed destination is reported in its Delivery and logged; the others are still tried."""
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
        text = slack_text(a, where)
        first = text.splitlines()[1]
        if dry_run:
            out.append(Delivery("slack", d.slack_channel, f"one message: {first} ...", False))
        else:
            # A notice like every other (title and lead, rendered by each delivery); team names come from tags,
            # so they are escaped: text, never markup.
            title, _, rest = escape(text).partition("\n")
            msg = Message(key=f"report:{month}:{d.slack_channel}", channel=d.slack_channel, text=escape(text),
                          kind="report", subject=month, audience=("default",), title=title, lead=rest)
            ok = notifier.send(msg)
            out.append(Delivery("slack", d.slack_channel, f"one message: {first} ...", ok,
                                "" if ok else "not delivered (see the log; retried with the other messages)"))
    if d.email_finance:
        out.append(_email(a, paths, where, email, list(email_to), dry_run))
    return out


# What a finance reader opens: the PDF first, the page itself second.
_ATTACHED = {".pdf": "application/pdf", ".html": "text/html"}


def _email(a: MonthlyAudit, paths: Sequence[Path], where: str, email, to: list[str], dry_run: bool) -> Delivery:
    """One email to the finance list with the PDF (and HTML) attached, exactly once per month."""
    files = sorted((Path(p) for p in paths if Path(p).suffix in _ATTACHED), key=lambda p: p.suffix != ".pdf")
    target = ", ".join(to) or "(email.finance is empty)"
    detail = "one email with " + (", ".join(p.name for p in files) or "no attachment")
    if dry_run:
        return Delivery("email", target, detail, False)
    if email is None or not to:
        return Delivery("email", target, detail, False, "email.enabled and email.finance must be set")
    text = slack_text(a, where)
    notice = Message(key=f"report-email:{a.period.month}", kind="report", subject=a.period.month,
                     audience=("finance",), title=text.splitlines()[0], text=text,
                     lines=tuple(text.splitlines()[1:]))
    attachments = [(p.name, _ATTACHED[p.suffix], p.read_bytes()) for p in files]
    ok = email.send(notice, to=to, attachments=attachments)
    return Delivery("email", target, detail, ok, "" if ok else "not accepted by the mail server (see the log)")


__all__ = ["Delivery", "configured", "deliver_report", "s3_client", "s3_location", "slack_text"]
