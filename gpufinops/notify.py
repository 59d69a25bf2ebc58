"""Slack notifications, each sent at most once per idempotency key, and the outbox.

Exactly-once as far as it can be had without Slack's help: the key is written
as "pending" *before* the HTTP call, and a pending key counts as sent
(store.notification_sent). So a crash after Slack accepted a message never
produces a second copy; the price is that a crash between writing "pending"
and the call loses that one message (at-most-once), which is the right side to
err on for "your instance will be stopped" alerts. A definite failure (HTTP
error after the retries, connection refused, ok=false) is recorded "failed",
and a later send() of the same key tries again.

Without a token the message goes to a JSON-lines outbox file instead, so a
fresh install or a dry run still shows what would have been said.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator
from slack_sdk.http_retry.interval_calculator import RetryIntervalCalculator

from .config import SlackSettings
from .model import Clock, Message, Notifier
from .store import Store

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0

# Slack token shapes: xoxb-/xoxp-/xoxa-/xoxe-/xoxs- ... and app-level xapp-.
_TOKEN_RE = re.compile(r"\b(xox[a-z]|xapp)-[A-Za-z0-9-]+")
_MAX_ERROR_CHARS = 500


def redact(text: str, token: str | None = None) -> str:
    """Remove anything that looks like a Slack token (and the configured token itself)."""
    if token:
        text = text.replace(token, "[redacted]")
    return _TOKEN_RE.sub(lambda m: f"{m.group(1)}-[redacted]", text)


def _clip(text: str, limit: int = _MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _RedactingFilter(logging.Filter):
    """slack_sdk logs request/response bodies at DEBUG; a body may quote a token back."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


# The logger handed to every WebClient: its records pass through the redaction above.
_sdk_log = logging.getLogger(__name__ + ".slack_sdk")
_sdk_log.addFilter(_RedactingFilter())


class _Undelivered(Exception):
    """A send that definitely did not reach a channel (safe to retry later)."""


class _Ambiguous(Exception):
    """A send whose fate is unknown: Slack may have posted it (read timeout)."""


class OutboxNotifier:
    """Writes each message as one JSON line to a file; used when no Slack token is set."""

    def __init__(self, settings: SlackSettings, store: Store, clock: Clock):
        self.settings = settings
        self.store = store
        self.clock = clock
        self.path = Path(settings.outbox_path)

    def send(self, msg: Message) -> bool:
        if self.store.notification_sent(msg.key):
            return True
        channel = msg.channel or self.settings.default_channel
        now = self.clock()
        self.store.record_notification(msg.key, channel, msg.text, "pending", now)
        line = {
            "key": msg.key,
            "channel": channel,
            "text": msg.text,
            "blocks": list(msg.blocks),
            "at": now.isoformat(),
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
        except OSError as exc:
            error = f"outbox {self.path}: {exc.strerror or exc}"
            self.store.record_notification(msg.key, channel, msg.text, "failed", self.clock(), detail=error)
            log.error("notification %s not written: %s", msg.key, error)
            return False
        self.store.record_notification(msg.key, channel, msg.text, "outbox", now, detail=str(self.path))
        log.info("slack outbox (no token) channel=%s key=%s: %s", channel, msg.key, msg.text)
        return True


class SlackNotifier:
    """Posts to Slack with slack-sdk's retry handlers; at most once per Message.key."""

    def __init__(
        self,
        settings: SlackSettings,
        store: Store,
        clock: Clock,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry_interval: RetryIntervalCalculator | None = None,
    ):
        self.settings = settings
        self.store = store
        self.clock = clock
        self.timeout_s = timeout_s
        # Backoff for 5xx / connection errors; 429 always waits what Retry-After says.
        self.retry_interval = retry_interval or BackoffRetryIntervalCalculator(backoff_factor=0.5)
        self._outbox = OutboxNotifier(settings, store, clock)

    def _client(self, token: str) -> WebClient:
        n = max(0, self.settings.max_retries)
        handlers = [
            RateLimitErrorRetryHandler(max_retry_count=n),
            ServerErrorRetryHandler(max_retry_count=n, interval_calculator=self.retry_interval),
            ConnectionErrorRetryHandler(max_retry_count=n, interval_calculator=self.retry_interval),
        ]
        kwargs: dict[str, Any] = {
            "token": token, "timeout": self.timeout_s, "retry_handlers": handlers, "logger": _sdk_log,
        }
        if self.settings.base_url:
            kwargs["base_url"] = self.settings.base_url
        return WebClient(**kwargs)

    def send(self, msg: Message) -> bool:
        if self.store.notification_sent(msg.key):
            log.debug("notification %s already sent, skipped", msg.key)
            return True
        # Resolved per send so a rotated token file is picked up without a restart.
        token = self.settings.token.resolve()
        if not token:
            return self._outbox.send(msg)

        channel = msg.channel or self.settings.default_channel
        if not self.store.claim_notification(msg.key, channel, msg.text, self.clock()):
            log.debug("notification %s claimed by another sender, skipped", msg.key)
            return True
        try:
            ts, channel_id = self._post(token, channel, msg)
        except _Ambiguous as exc:
            detail = redact(str(exc), token)
            # Left "pending": retrying could post a second copy (at-most-once).
            self.store.record_notification(msg.key, channel, msg.text, "pending", self.clock(), detail=detail)
            log.warning("notification %s to %s: delivery unknown, not retried: %s", msg.key, channel, detail)
            return False
        except _Undelivered as exc:
            detail = redact(str(exc), token)
            self.store.record_notification(msg.key, channel, msg.text, "failed", self.clock(), detail=detail)
            log.error("notification %s to %s failed: %s", msg.key, channel, detail)
            return False
        detail = json.dumps({"ts": ts, "channel_id": channel_id})
        self.store.record_notification(msg.key, channel, msg.text, "sent", self.clock(), detail=detail)
        log.info("notification %s sent to %s (ts=%s)", msg.key, channel, ts)
        return True

    def _post(self, token: str, channel: str, msg: Message) -> tuple[str, str]:
        """chat.postMessage; returns (ts, channel id) or raises _Undelivered / _Ambiguous."""
        client = self._client(token)
        try:
            resp = client.chat_postMessage(channel=channel, text=msg.text, blocks=list(msg.blocks) or None)
        except SlackApiError as exc:
            # HTTP 429/5xx left after the retries, or HTTP 200 with ok=false.
            status = getattr(exc.response, "status_code", None)
            data = getattr(exc.response, "data", None)
            error = data.get("error") if isinstance(data, dict) else None
            raise _Undelivered(_clip(f"slack error {error or 'unknown'} (HTTP {status})")) from None
        except TimeoutError as exc:
            # Raised raw by urllib while waiting for the answer: the request was sent.
            raise _Ambiguous(f"timed out after {self.timeout_s:g} s waiting for Slack: {exc}") from None
        except OSError as exc:
            # URLError (refused, DNS, connect timeout) and resets left after the retries.
            raise _Undelivered(_clip(f"connection error: {getattr(exc, 'reason', None) or exc}")) from None
        except Exception as exc:  # noqa: BLE001 - a notification must never take the run down
            raise _Undelivered(_clip(f"{type(exc).__name__}: {exc}")) from None
        data = resp.data if isinstance(resp.data, dict) else {}
        return str(data.get("ts", "")), str(data.get("channel", ""))


def build_notifier(settings: SlackSettings, store: Store, clock: Clock) -> Notifier:
    """Slack when a token is configured, else the outbox file."""
    if settings.token.resolve():
        return SlackNotifier(settings, store, clock)
    log.info("no Slack token configured: notifications go to %s", settings.outbox_path)
    return OutboxNotifier(settings, store, clock)


def read_outbox(path: str | Path) -> list[dict]:
    """The messages written to an outbox file, oldest first (for the CLI, demo and tests)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"{p}:{lineno}: not a JSON line: {exc}") from None
    return out


__all__ = ["SlackNotifier", "OutboxNotifier", "build_notifier", "read_outbox", "redact"]
