"""Email: a Notice as an `email.message.EmailMessage` (text and HTML parts, attachments), sent over SMTP.

Settings: the `email:` section (config.EmailSettings): host, port, `security` starttls / ssl / none, username
and the password from the environment or a mounted file. The HTML part is a Jinja2 template with autoescape:
every piece of the notice reaches it as plain text (notify.markup.spans), so a hostile tag value is shown, never
interpreted.

Exactly once per key, in the same notifications table as Slack (the row's channel is `mailto:<addresses>`):
the key is written "pending" before the SMTP conversation, "sent" once the server answered 250 to the message
(accepted it). That 250 is the delivery: the QUIT after it is best effort, and a server that answers it 421 or
500, drops the connection or stays silent never turns an accepted message into a failed one (which would be
sent again). The Message-ID is derived from the key, so a resend carries the same id (and In-Reply-To a
follow-up's parent's). A failure before the message was handed over (connection refused, STARTTLS or AUTH
refused, a recipient or the DATA refused with an SMTP code) means the server never accepted it: "failed",
sent again with backoff (`retry_due`, and the act stage for warnings). A notice sent with attachments (the
monthly report) is never sent again by `retry_due`, which has only the saved text: its row stays "failed" for
the command that made it, which has the attachments (`report --deliver`). SMTP has no lookup: when the connection
breaks or times out after the message body was sent and before the server's answer, the server may have
accepted it, so the row stays "pending" and is **never sent again automatically** (at most once), logged at
ERROR; it never counts as delivered, so no stop follows such a warning (the mark waits; a person who sees the
mail arrived can act). The same holds after a crash between "pending" and the answer.

No error text reaches the log or the store with the SMTP password in it: a relay may quote the AUTH exchange
in its 535, so the password, its AUTH PLAIN / LOGIN encodings and its base64 at any alignment are redacted
(`redact_secret`).

Entry point for other stages (the monthly report): `EmailDelivery.send(notice, to=[...], attachments=[...])`.
"""

from __future__ import annotations

import base64
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
from ..store.schema import MAILTO

log = logging.getLogger("gpufinops.notify.email")

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
             attachments: Sequence[tuple[str, str, bytes]] = (), *, retry_now: bool = False) -> bool:
        """True when the server accepted the notice (now or before) for `to`; False when not (yet).
        `retry_now`: a person's command (`report --deliver`) tries a failed one now, before its backoff is over
        (safe: a failed one was never accepted)."""
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
        if (row is not None and row.status == "failed" and row.next_attempt_at is not None
                and now < row.next_attempt_at and not retry_now):
            return False
        if not to:
            log.error("email %s: no recipient", notice.key)
            return False
        channel = MAILTO + ",".join(to)
        attempts = (row.attempts if row else 0) + 1
        # What retry_due sends again: the notice and its recipients. Attachments are not saved, only their names:
        # a notice that had some is left to the command that made it (a resend without them would be untrue).
        saved = [{"notice": asdict(notice), "to": to, **({"attachments": [name for name, _, _ in attachments]}
                                                          if attachments else {})}]
        self.store.record_notification(notice.key, channel, notice.text, "pending", now, blocks=saved,
                                       attempts=attempts)
        try:
            self._deliver(self.build(notice, to, attachments), to)
        except _Ambiguous as exc:
            detail = self._error_text(exc)
            self.store.record_notification(notice.key, channel, notice.text, "pending", self.clock(),
                                           detail=detail[:500], blocks=saved, attempts=attempts)
            log.error("email %s to %s: answer lost after the message was sent (%s); not sent again",
                      notice.key, channel, detail)
            return False
        except Exception as exc:  # noqa: BLE001 - never accepted: safe to send again
            detail = self._error_text(exc)[:500]
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

    def _error_text(self, exc: Exception) -> str:
        """What went wrong, for the log and the row, without the SMTP password in any form."""
        text = str(exc) if isinstance(exc, _Ambiguous) else error_text(exc)
        if not self.settings.username:
            return text
        try:
            password = self.settings.password.resolve()
        except Exception:  # noqa: BLE001 - unreadable now: the conversation never sent it either
            return text
        return redact_secret(text, self.settings.username, password or "")

    def _backoff(self, attempts: int) -> timedelta:
        exponent = min(max(attempts - 1, 0), 30)
        return timedelta(seconds=min(self.settings.retry_max_backoff_s, self.settings.retry_backoff_s * 2 ** exponent))

    def _context(self) -> ssl.SSLContext:
        return self._ssl or ssl.create_default_context(cafile=self.settings.ca_file)

    def _deliver(self, msg: EmailMessage, to: Sequence[str]) -> None:
        s = self.settings
        cls = smtplib.SMTP_SSL if s.security == "ssl" else smtplib.SMTP
        kwargs = {"context": self._context()} if s.security == "ssl" else {}
        smtp = cls(s.host, s.port, timeout=s.timeout_s, **kwargs)
        # Not `with smtp:` - its __exit__ raises when the server answers QUIT with anything but 221, which would
        # turn a message the server accepted into a failed one, sent again at the next retry.
        polite = False  # QUIT first? Not on a broken connection (it would only wait out another timeout)
        try:
            self._converse(smtp, msg, to)
            polite = True
        except Exception as exc:
            polite = not isinstance(exc, (OSError, smtplib.SMTPServerDisconnected, _Ambiguous))  # a refusal
            raise
        finally:
            _close(smtp, polite, s.host)

    def _converse(self, smtp: smtplib.SMTP, msg: EmailMessage, to: Sequence[str]) -> None:
        """EHLO, STARTTLS, AUTH, MAIL, RCPT, DATA; returns once the server accepted the message (250 to DATA)."""
        s = self.settings
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
            # Sent with attachments: only the command that made it has them (`report --deliver`). A report row
            # saved before the attachments were noted (kind "report", report/deliver.py) had them too.
            if saved.get("attachments") or (saved.get("notice") or {}).get("kind") == "report":
                continue
            notice = _notice_from(saved.get("notice") or {})
            if notice is not None and self.send(notice, to=saved.get("to") or []):
                done += 1
        return done


def _close(smtp: smtplib.SMTP, polite: bool, host: str) -> None:
    """QUIT when `polite` (best effort: whatever the server answers, or whether it answers at all, changes nothing
    that happened before), then close."""
    try:
        if polite:
            code, resp = smtp.docmd("QUIT")
            if code != 221:
                log.debug("SMTP %s answered QUIT with %s %r (ignored)", host, code, resp)
    except (OSError, smtplib.SMTPException) as exc:
        log.debug("SMTP %s: QUIT not answered (%s: %s; ignored)", host, type(exc).__name__, exc)
    finally:
        smtp.close()


def error_text(exc: Exception) -> str:
    """An SMTP error as one line: its class, and for a server's answer the code and the text as the server wrote
    it (decoded, so that a redaction finds the password as the server quoted it)."""
    if isinstance(exc, smtplib.SMTPResponseException):
        answer = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
        return f"{type(exc).__name__}: {exc.smtp_code} {answer}"
    return f"{type(exc).__name__}: {exc}"


REDACTED = "[redacted]"


def secret_forms(username: str, password: str) -> list[str]:
    """Every form in which the password can come back quoted in a server's answer, longest first: as written
    (and as a bytes repr escapes it), base64 of the AUTH PLAIN string in each shape a client builds it
    ("\\0user\\0password", "user\\0user\\0password", "user\\0password"), base64 of the password alone (AUTH
    LOGIN), and, for any other framing, the base64 characters that encode only password bytes at each of the
    three byte alignments a longer base64 stream may put it at."""
    if not password:
        return []
    raw = password.encode("utf-8")
    forms = {password, repr(raw)[2:-1]}
    for framed in (f"\0{username}\0{password}", f"{username}\0{username}\0{password}",
                   f"{username}\0{password}", password):
        forms.add(base64.b64encode(framed.encode("utf-8")).decode("ascii"))
    for skip in range(3):
        aligned = raw[skip:]
        aligned = aligned[:len(aligned) - len(aligned) % 3]
        if aligned:
            forms.add(base64.b64encode(aligned).decode("ascii"))
    return sorted(forms, key=len, reverse=True)


def redact_secret(text: str, username: str, password: str) -> str:
    """`text` with every form of the password (secret_forms) replaced by [redacted]."""
    for form in secret_forms(username, password):
        text = text.replace(form, REDACTED)
    return text


def _notice_from(data: dict) -> Notice | None:
    try:
        return Notice(**{**data, **{k: tuple(tuple(x) if isinstance(x, list) else x for x in data.get(k) or ())
                                    for k in ("audience", "facts", "lines", "notes", "actions", "blocks")}})
    except TypeError:
        return None


__all__ = ["EmailDelivery", "error_text", "html_of", "message_id", "redact_secret", "secret_forms", "text_of"]
