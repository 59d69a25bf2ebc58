"""Email: a Notice as an `email.message.EmailMessage` (text and HTML parts, attachments), sent over SMTP.

Settings: the `email:` section (config.EmailSettings): host, port, `security` starttls / ssl / none, username
and the password from the environment or a mounted file. The HTML part is a Jinja2 template with autoescape:
every piece of the notice reaches it as plain text (notify.markup.spans), so a hostile tag value is shown, never
interpreted.

Exactly once per key, in the same notifications table as Slack (the row's channel is `mailto:<addresses>`):
the key is written "pending" before the SMTP conversation, "sent" once the server answered 250 to the message
(accepted it). The Message-ID is derived from the key, so a resend carries the same id (and In-Reply-To a
follow-up's parent's). A failure before the message was handed over (connection refused, STARTTLS or AUTH
refused, a recipient or the DATA refused with an SMTP code) means the server never accepted it: "failed",
sent again with backoff (`retry_due`, and the act stage for warnings). SMTP has no lookup: when the connection
breaks or times out after the message body was sent and before the server's answer, the server may have
accepted it, so the row stays "pending" and is **never sent again automatically** (at most once), logged at
ERROR; it never counts as delivered, so no stop follows such a warning (the mark waits; a person who sees the
mail arrived can act). The same holds after a crash between "pending" and the answer.

Entry point for other stages (the monthly report): `EmailDelivery.send(notice, to=[...], attachments=[...])`.
"""

from __future__ import annotations

import email.policy
import hashlib
import json
import logging
import smtplib
import ssl
from dataclasses import asdict
from datetime import datetime, timedelta
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Sequence

from jinja2 import Environment

from ..config import EmailSettings
from ..model import Clock, Notice
from ..store.store import Store
from .markup import plain, spans

log = logging.getLogger("gpufinops.notify.email")

# The channel column of an email's notification row: "mailto:" and the addresses.
MAILTO = "mailto:"

_HTML = Environment(autoescape=True).from_string("""<!doctype html>
<html><body style="font-family: sans-serif">
{%- macro rich(parts) -%}
{%- for kind, text in parts -%}
{%- if kind == "bold" %}<b>{{ text }}</b>{% elif kind == "code" %}<code>{{ text }}</code>
{%- else %}{{ text }}{% endif -%}
{%- endfor -%}
{%- endmacro %}
{% if dry_run %}<p><b>DRY-RUN</b>: nothing is changed on any instance; this shows what <i>would</i> happen.</p>{% endif %}
{% if title %}<h2>{{ title }}</h2>{% endif %}
{% for para in lead %}<p>{{ rich(para) }}</p>
{% endfor %}
{% if facts %}<table cellpadding="4">
{% for label, value in facts %}<tr><th align="left" valign="top">{{ label }}</th><td>{{ rich(value) }}</td></tr>
{% endfor %}</table>{% endif %}
{% if lines %}<ul>{% for line in lines %}<li>{{ rich(line) }}</li>{% endfor %}</ul>{% endif %}
{% for note in notes %}<p style="color: #555"><small>{{ rich(note) }}</small></p>
{% endfor %}
</body></html>
""")


def _lines(text: str) -> list[list[tuple[str, str]]]:
    return [spans(line) for line in text.split("\n")]


def html_of(notice: Notice) -> str:
    """The HTML part: every value autoescaped by the template."""
    return _HTML.render(
        title=plain(notice.title), dry_run=notice.dry_run, lead=_lines(notice.lead or notice.text),
        facts=[(plain(label), [p for line in _lines(value) for p in line + [("text", " ")]])
               for label, value in notice.facts],
        lines=[spans(x.lstrip("• ")) for x in notice.lines], notes=[spans(n) for n in notice.notes])


def text_of(notice: Notice) -> str:
    """The plain-text part: the title, the notice's text, its facts and notes."""
    out = [plain(notice.title)] if notice.title else []
    out.append(plain(notice.text))
    if notice.facts:
        out.append("")
        out += [f"{plain(label)}: {plain(value).replace(chr(10), ', ')}" for label, value in notice.facts]
    if notice.lines:
        out += [""] + [plain(x) for x in notice.lines]
    if notice.notes:
        out += [""] + [plain(n) for n in notice.notes]
    return "\n".join(out) + "\n"


def message_id(key: str, domain: str) -> str:
    """<hash-of-key@domain>: the same key always gives the same id (a resend is recognisably the same mail)."""
    return f"<{hashlib.sha256(key.encode()).hexdigest()[:32]}@{domain}>"


class _Ambiguous(Exception):
    """The server may have accepted the message (its answer to the body was lost)."""


class EmailDelivery:
    """Sends notices by SMTP, exactly once per key when the server's answer arrives, at most once otherwise."""

    def __init__(self, settings: EmailSettings, store: Store, clock: Clock, *,
                 ssl_context: ssl.SSLContext | None = None):
        self.settings = settings
        self.store = store
        self.clock = clock
        self._ssl = ssl_context

    def build(self, notice: Notice, to: Sequence[str], attachments: Sequence[tuple[str, str, bytes]] = ()) -> EmailMessage:
        """The message as sent: text and HTML parts, then the attachments (filename, MIME type, bytes)."""
        msg = EmailMessage()
        msg["From"] = self.settings.sender
        msg["To"] = ", ".join(to)
        msg["Subject"] = " ".join(((("[DRY-RUN] " if notice.dry_run else "") + plain(notice.title or notice.text))
                                   .split()))[:200]
        msg["Message-ID"] = message_id(notice.key, self.settings.message_id_domain)
        msg["Date"] = format_datetime(self.clock())
        if notice.thread_key:
            parent = message_id(notice.thread_key, self.settings.message_id_domain)
            msg["In-Reply-To"] = parent
            msg["References"] = parent
        msg.set_content(text_of(notice))
        msg.add_alternative(html_of(notice), subtype="html")
        for filename, mime, data in attachments:
            maintype, _, subtype = mime.partition("/")
            msg.add_attachment(data, maintype=maintype, subtype=subtype or "octet-stream", filename=filename)
        return msg

    def send(self, notice: Notice, to: str | Sequence[str] = (),
             attachments: Sequence[tuple[str, str, bytes]] = ()) -> bool:
        """True when the server accepted the notice (now or before) for `to`; False when not (yet)."""
        to = [to] if isinstance(to, str) else list(to)
        row = self.store.get_notification(notice.key)
        if row is not None and row.delivered:
            return True
        if row is not None and row.status == "abandoned":
            return False
        if row is not None and row.status == "pending":
            log.error("email %s: an earlier try's answer was lost (the server may have it); not sent again",
                      notice.key)
            return False
        now = self.clock()
        if row is not None and row.status == "failed" and row.next_attempt_at is not None and now < row.next_attempt_at:
            return False
        if not to:
            log.error("email %s: no recipient", notice.key)
            return False
        channel = MAILTO + ",".join(to)
        attempts = (row.attempts if row else 0) + 1
        saved = [{"notice": asdict(notice), "to": to}]  # what retry_due sends again (not the attachments)
        self.store.record_notification(notice.key, channel, notice.text, "pending", now, blocks=saved,
                                       attempts=attempts)
        try:
            self._deliver(self.build(notice, to, attachments), to)
        except _Ambiguous as exc:
            self.store.record_notification(notice.key, channel, notice.text, "pending", self.clock(),
                                           detail=str(exc)[:500], blocks=saved, attempts=attempts)
            log.error("email %s to %s: answer lost after the message was sent (%s); not sent again",
                      notice.key, channel, exc)
            return False
        except Exception as exc:  # noqa: BLE001 - never accepted: safe to send again
            detail = f"{type(exc).__name__}: {exc}"[:500]
            retry_at = self.clock() + self._backoff(attempts)
            self.store.record_notification(notice.key, channel, notice.text, "failed", self.clock(), detail=detail,
                                           blocks=saved, attempts=attempts, next_attempt_at=retry_at)
            log.error("email %s to %s not accepted (attempt %d, next at %s): %s", notice.key, channel, attempts,
                      retry_at.isoformat(timespec="seconds"), detail)
            return False
        self.store.record_notification(notice.key, channel, notice.text, "sent", self.clock(),
                                       detail=json.dumps({"message_id": message_id(notice.key,
                                                                                    self.settings.message_id_domain)}),
                                       blocks=saved, attempts=attempts)
        log.info("email %s accepted for %s", notice.key, channel)
        return True

    def _backoff(self, attempts: int) -> timedelta:
        exponent = min(max(attempts - 1, 0), 30)
        return timedelta(seconds=min(self.settings.retry_max_backoff_s, self.settings.retry_backoff_s * 2 ** exponent))

    def _context(self) -> ssl.SSLContext:
        return self._ssl or ssl.create_default_context(cafile=self.settings.ca_file)

    def _deliver(self, msg: EmailMessage, to: Sequence[str]) -> None:
        s = self.settings
        cls = smtplib.SMTP_SSL if s.security == "ssl" else smtplib.SMTP
        kwargs = {"context": self._context()} if s.security == "ssl" else {}
        with cls(s.host, s.port, timeout=s.timeout_s, **kwargs) as smtp:
            smtp.ehlo()
            if s.security == "starttls":
                smtp.starttls(context=self._context())
                smtp.ehlo()
            if s.username:
                password = s.password.resolve()
                if not password:
                    raise RuntimeError("email.password resolves to nothing (env or file)")
                smtp.login(s.username, password)
            code, resp = smtp.mail(s.sender)
            if code != 250:
                raise smtplib.SMTPSenderRefused(code, resp, s.sender)
            for rcpt in to:
                code, resp = smtp.rcpt(rcpt)
                if code not in (250, 251):
                    raise smtplib.SMTPRecipientsRefused({rcpt: (code, resp)})
            try:
                code, resp = smtp.data(msg.as_bytes(policy=email.policy.SMTP))  # CRLF line ends
            except smtplib.SMTPDataError:
                raise  # the server answered with a refusal: never accepted
            except (OSError, smtplib.SMTPException) as exc:
                raise _Ambiguous(f"{type(exc).__name__}: {exc}") from None
            if code != 250:
                raise smtplib.SMTPDataError(code, resp)

    def retry_due(self, now: datetime) -> int:
        """Send again every failed email whose backoff is over (warnings: the act stage does); how many went."""
        done = 0
        for row in self.store.notifications_due(now):
            if not row.channel.startswith(MAILTO) or not row.blocks:
                continue
            saved = row.blocks[0]
            notice = _notice_from(saved.get("notice") or {})
            if notice is not None and self.send(notice, to=saved.get("to") or []):
                done += 1
        return done


def _notice_from(data: dict) -> Notice | None:
    try:
        return Notice(**{**data, **{k: tuple(tuple(x) if isinstance(x, list) else x for x in data.get(k) or ())
                                    for k in ("audience", "facts", "lines", "notes", "actions", "blocks")}})
    except TypeError:
        return None


__all__ = ["EmailDelivery", "html_of", "text_of", "message_id"]
