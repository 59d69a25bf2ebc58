"""Slack notifications, each delivered exactly once per idempotency key, and the outbox.

Exactly-once even when Slack's answer is lost. Every message carries its key in Slack message
`metadata` (event_type `gpufinops_notification`, payload `{"key": ...}`). The key is written
"pending" *before* the HTTP call. When the fate of a post is unknown (a 5xx or a reset after the
request went out, a read timeout, a crash between the call and the record), the notifier looks the
key up with `conversations.history` before it posts again: found means delivered, absent means it
may post, and a lookup that fails leaves the row "pending" (never a blind second post). slack-sdk's
own 5xx / connection retries are off for that reason; only 429 (Slack did not process the call) is
retried inside one send.

A definite failure (`ok: false` such as invalid_auth or channel_not_found, or an unknown answer
that the lookup shows was not posted, after `max_retries` tries) is recorded "failed" with a next
attempt time: later calls (the act stage every tick, `retry_due` for everything else) try again
with exponential backoff from `retry_backoff_s` up to `retry_max_backoff_s`. Each failure is logged
at ERROR with the attempt count; the service's readiness and /metrics read the failed rows.

"Delivered" (`Store.delivered_at`) is what the act stage waits for before any stop: Slack answered
`ok: true`, the lookup found the message, or, without a token, the line is in the outbox file.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler
from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator
from slack_sdk.http_retry.interval_calculator import RetryIntervalCalculator

from ..config import SlackSettings
from ..model import Clock, Message, Notice, Notifier, format_duration
from ..store.schema import NotificationRow
from ..store.store import Store
from .markup import redact

log = logging.getLogger("gpufinops.notify")

# A failed users.lookupByEmail (per address) is not asked again before this: one try and one log line an hour.
LOOKUP_RETRY_AFTER = timedelta(hours=1)


def _as_sent(notice: Notice, settings: SlackSettings) -> Notice:
    """The notice as Slack and the outbox get it: rendered to Block Kit, its channel routed."""
    from .routing import chat_channel
    from .slack_blocks import render
    text, blocks = render(notice)
    return replace(notice, channel=chat_channel(notice, settings), text=text, blocks=blocks)

DEFAULT_TIMEOUT_S = 10.0

# Slack token shapes: xoxb-/xoxp-/xoxa-/xoxe-/xoxs- ... and app-level xapp-.
_MAX_ERROR_CHARS = 500


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
_sdk_log = logging.getLogger("gpufinops.notify" + ".slack_sdk")
_sdk_log.addFilter(_RedactingFilter())


class _Undelivered(Exception):
    """A send that definitely did not reach a channel (safe to send again)."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        # Transient (connection refused, 429 left after the handler): worth another try in this send.
        self.transient = transient


class _Ambiguous(Exception):
    """A send whose fate is unknown: Slack may have posted it (5xx, reset or timeout after sending)."""


# The channel column of a notification row of another transport starts with its scheme ("mailto:" for email);
# Slack channels and user ids never do.
_OTHER_TRANSPORT = re.compile(r"^[a-z][a-z0-9+.-]*:")

# Message metadata that carries the idempotency key (needs no extra scope to write; reading it back
# with conversations.history needs channels:history / groups:history).
METADATA_EVENT = "gpufinops_notification"
# How far back the lookup reads a channel: newest first, pages of 200.
_LOOKUP_PAGES = 3
_LOOKUP_PAGE_SIZE = 200
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{6,}$")


def next_attempt_after(attempts: int, settings: SlackSettings) -> timedelta:
    """Backoff after the `attempts`-th failed delivery: base, 2x base, 4x base ... capped."""
    exponent = min(max(attempts - 1, 0), 30)
    return timedelta(seconds=min(settings.retry_max_backoff_s, settings.retry_backoff_s * (2 ** exponent)))


def _waiting(row: NotificationRow | None, now: datetime) -> bool:
    """A failed message whose backoff has not run out yet."""
    return row is not None and row.status == "failed" and row.next_attempt_at is not None and now < row.next_attempt_at


class OutboxNotifier:
    """Writes each message as one JSON line to a file; used when no Slack token is set."""

    def __init__(self, settings: SlackSettings, store: Store, clock: Clock):
        self.settings = settings
        self.store = store
        self.clock = clock
        self.path = Path(settings.outbox_path)

    def send(self, msg: Message) -> bool:
        msg = _as_sent(msg, self.settings)
        row = self.store.get_notification(msg.key)
        if row is not None and row.delivered:
            return True
        if row is not None and row.status == "abandoned":
            return False  # withdrawn before delivery: never written
        now = self.clock()
        if _waiting(row, now):
            return False
        channel = msg.channel or self.settings.default_channel
        attempts = (row.attempts if row else 0) + 1
        self.store.record_notification(msg.key, channel, msg.text, "pending", now, blocks=msg.blocks,
                                       attempts=attempts)
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
            self.store.record_notification(msg.key, channel, msg.text, "failed", now, detail=error,
                                           blocks=msg.blocks, attempts=attempts,
                                           next_attempt_at=now + next_attempt_after(attempts, self.settings))
            log.error("notification %s not written (attempt %d): %s", msg.key, attempts, error)
            return False
        self.store.record_notification(msg.key, channel, msg.text, "outbox", now, detail=str(self.path),
                                       blocks=msg.blocks, attempts=attempts)
        log.info("slack outbox (no token) channel=%s key=%s: %s", channel, msg.key, msg.text)
        return True

    def retry_due(self, now: datetime) -> int:
        """Send again every failed message whose backoff is over; returns how many were delivered."""
        return _retry_due(self, now)

    def user_id_for_email(self, email: str) -> str | None:
        return None  # no token: no workspace to look people up in

    def user_info(self, user_id: str) -> dict:
        return {}  # no token: nobody to look up

    def tell_privately(self, channel_id: str, user_id: str, text: str) -> bool:
        return False  # no token: no click arrives either

    def update(self, channel_id: str, ts: str, text: str, blocks) -> bool:
        """No Slack message to edit: the edit is written as a line of its own."""
        line = {"update_of": {"channel": channel_id, "ts": ts}, "text": text, "blocks": list(blocks),
                "at": self.clock().isoformat()}
        try:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
        except OSError as exc:
            log.warning("outbox %s: message update not written: %s", self.path, exc)
            return False
        return True


def _retry_due(notifier, now: datetime) -> int:
    delivered = 0
    for row in notifier.store.notifications_due(now):
        if _OTHER_TRANSPORT.match(row.channel):
            continue  # another delivery's row (mailto:… is notify/email.py's): it sends its own again
        msg = Message(key=row.key, channel=row.channel, text=row.text, blocks=row.blocks)
        if notifier.send(msg):
            delivered += 1
    return delivered


class SlackNotifier:
    """Posts to Slack with the key in message metadata; delivered exactly once per Message.key."""

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
        # Pause between tries inside one send; 429 always waits what Retry-After says.
        self.retry_interval = retry_interval or BackoffRetryIntervalCalculator(backoff_factor=0.5)
        self._outbox = OutboxNotifier(settings, store, clock)

    def _client(self, token: str) -> WebClient:
        # Only 429 is retried by slack-sdk: Slack did not process the call. A 5xx or a reset may come
        # after Slack posted the message, so those are looked up (here) before any second post.
        handlers = [RateLimitErrorRetryHandler(max_retry_count=max(0, self.settings.max_retries))]
        kwargs: dict[str, Any] = {
            "token": token, "timeout": self.timeout_s, "retry_handlers": handlers, "logger": _sdk_log,
        }
        if self.settings.base_url:
            kwargs["base_url"] = self.settings.base_url
        return WebClient(**kwargs)

    def retry_due(self, now: datetime) -> int:
        """Send again every failed message whose backoff is over; returns how many were delivered."""
        return _retry_due(self, now)

    def update(self, channel_id: str, ts: str, text: str, blocks) -> bool:
        """chat.update of a delivered message: one try (an edit repeated is harmless, one lost is cosmetic)."""
        token = self.settings.token.resolve()
        if not token:
            return False
        try:
            self._client(token).chat_update(channel=channel_id, ts=ts, text=text, blocks=list(blocks) or None)
        except Exception as exc:  # noqa: BLE001 - reported, never raised into the act stage
            log.warning("chat.update of %s in %s failed: %s", ts, channel_id, redact(_clip(str(exc)), token))
            return False
        return True

    def user_id_for_email(self, email: str) -> str | None:
        """users.lookupByEmail (scope users:read.email), remembered in the store; None when nobody has it or the
        lookup fails (logged): a direct message is a copy, never what a stop waits for."""
        key = f"slack:user_by_email:{email.strip().lower()}"
        cached = self.store.get_kv(key)
        if cached:
            return cached
        # A lookup that failed (nobody has the address, a missing scope, Slack down) is not asked again for an
        # hour: every warning about that owner's instances would otherwise ask, and log, once more.
        failed_key = f"slack:user_by_email_failed:{email.strip().lower()}"
        now = self.clock()
        retry_at = self.store.get_kv(failed_key)
        if retry_at and now.isoformat() < retry_at:
            return None
        token = self.settings.token.resolve()
        if not token:
            return None
        try:
            resp = self._client(token).users_lookupByEmail(email=email.strip())
        except Exception as exc:  # noqa: BLE001 - users_not_found, missing scope, Slack down: no DM this time
            self.store.set_kv(failed_key, (now + LOOKUP_RETRY_AFTER).isoformat())
            # One line: Slack's error code when it answered (users_not_found, missing_scope), never the raw answer.
            answer = getattr(exc, "response", None)
            code = answer.get("error") if answer is not None and hasattr(answer, "get") else None
            why = code or " ".join(redact(_clip(str(exc)), token).split())
            log.warning("users.lookupByEmail for an owner tag failed (%s): no Slack mention or direct message for "
                        "that owner; asked again after %s", why, format_duration(LOOKUP_RETRY_AFTER.total_seconds()))
            return None
        user_id = (resp.get("user") or {}).get("id") if isinstance(resp.data, dict) else None
        if user_id:
            self.store.set_kv(key, str(user_id))
        return str(user_id) if user_id else None

    def user_info(self, user_id: str) -> dict:
        """users.info's user (name, tz, profile.email with the users:read.email scope); {} when unknown."""
        token = self.settings.token.resolve()
        if not token:
            return {}
        resp = self._client(token).users_info(user=user_id)
        user = resp.get("user") if isinstance(resp.data, dict) else None
        return user if isinstance(user, dict) else {}

    def tell_privately(self, channel_id: str, user_id: str, text: str) -> bool:
        """chat.postEphemeral: a line only `user_id` sees in `channel_id` (why their click changed nothing). One
        try, never retried or stored: it answers a click now, and a lost one is repaired by clicking again."""
        token = self.settings.token.resolve()
        if not token or not channel_id or not user_id:
            return False
        try:
            self._client(token).chat_postEphemeral(channel=channel_id, user=user_id, text=_clip(text))
        except Exception as exc:  # noqa: BLE001 - the click's answer is logged and audited anyway
            log.warning("chat.postEphemeral to %s in %s failed: %s", user_id, channel_id,
                        redact(_clip(str(exc)), token))
            return False
        return True

    def send(self, msg: Message) -> bool:
        """True when the message is delivered (now or before); False when it is not (yet)."""
        msg = _as_sent(msg, self.settings)
        row = self.store.get_notification(msg.key)
        if row is not None and row.delivered:
            log.debug("notification %s already delivered, skipped", msg.key)
            return True
        if row is not None and row.status == "abandoned":
            return False  # withdrawn (its stop was cancelled before anyone was told): never sent
        # Resolved per send so a rotated token file is picked up without a restart.
        token = self.settings.token.resolve()
        if not token:
            return self._outbox.send(msg)
        now = self.clock()
        if _waiting(row, now):
            return False
        channel = msg.channel or self.settings.default_channel
        thread = self._thread_of(msg)
        if thread is not None:
            channel = thread[0]  # a reply lives in its parent's conversation
        client = self._client(token)
        if row is not None and row.status == "pending":
            # An earlier try's fate is unknown (answer lost, timeout, crash): look before posting again.
            found = self._find_posted(client, token, channel, msg.key, thread)
            if found is None:
                log.warning("notification %s: earlier delivery unknown and the lookup failed; not re-sent",
                            msg.key)
                return False
            if found:
                return self._delivered(msg, channel, json.dumps({"found_by": "conversations.history"}))
        attempts = (row.attempts if row else 0) + 1
        self.store.record_notification(msg.key, channel, msg.text, "pending", now, blocks=msg.blocks,
                                       attempts=attempts)
        tries = 1 + max(0, self.settings.max_retries)
        detail = ""
        for attempt in range(tries):
            if attempt:
                time.sleep(self.retry_interval.calculate_sleep_duration(attempt - 1))
            try:
                ts, channel_id = self._post(client, channel, msg, thread[1] if thread else None)
            except _Undelivered as exc:
                detail = redact(str(exc), token)
                if exc.transient:
                    continue
                break
            except _Ambiguous as exc:
                detail = redact(str(exc), token)
                found = self._find_posted(client, token, channel, msg.key, thread)
                if found:
                    return self._delivered(msg, channel, json.dumps({"found_by": "conversations.history"}))
                if found is None:
                    # Cannot tell: left "pending", so the next send looks again instead of posting twice.
                    self.store.record_notification(msg.key, channel, msg.text, "pending", self.clock(),
                                                   detail=detail, blocks=msg.blocks, attempts=attempts)
                    log.warning("notification %s to %s: delivery unknown (%s) and not verifiable yet",
                                msg.key, channel, detail)
                    return False
                continue  # not posted: safe to try again
            if channel_id:
                self.store.set_kv(_channel_key(channel), channel_id)
            return self._delivered(msg, channel, json.dumps({"ts": ts, "channel_id": channel_id}))
        retry_at = self.clock() + next_attempt_after(attempts, self.settings)
        self.store.record_notification(msg.key, channel, msg.text, "failed", self.clock(), detail=detail,
                                       blocks=msg.blocks, attempts=attempts, next_attempt_at=retry_at)
        log.error("notification %s to %s not delivered (attempt %d, next at %s): %s", msg.key, channel, attempts,
                  retry_at.isoformat(timespec="seconds"), detail)
        return False

    def _delivered(self, msg: Message, channel: str, detail: str) -> bool:
        row = self.store.get_notification(msg.key)
        self.store.record_notification(msg.key, channel, msg.text, "sent", self.clock(), detail=detail,
                                       blocks=msg.blocks, attempts=row.attempts if row else 1)
        log.info("notification %s delivered to %s (%s)", msg.key, channel, detail)
        return True

    def _thread_of(self, msg: Message) -> tuple[str, str] | None:
        """(conversation id, ts) of the delivered parent this message replies to, or None (posted on its own).
        The parent's key is remembered for the message, so a retry from the store lands in the same thread."""
        remembered = f"slack:thread:{msg.key}"
        parent_key = msg.thread_key or self.store.get_kv(remembered) or ""
        if not parent_key:
            return None
        if msg.thread_key and self.store.get_kv(remembered) != parent_key:
            self.store.set_kv(remembered, parent_key)
        # A reply to a reply (a Restore click's result under the stop notice, itself under its warning) goes
        # into the thread of the first: Slack threads are one level deep. The parent where its own parent was not
        # found (it was posted on its own) is the thread.
        grandparent = self.store.get_kv(f"slack:thread:{parent_key}") or ""
        return (self._posted_at(grandparent) if grandparent else None) or self._posted_at(parent_key)

    def _posted_at(self, key: str) -> tuple[str, str] | None:
        """(conversation id, ts) of a delivered message, None when not delivered or its ts is not known."""
        parent = self.store.get_notification(key)
        if parent is None or not parent.delivered:
            return None
        try:
            where = json.loads(parent.detail or "{}")
        except ValueError:
            return None
        if not (isinstance(where, dict) and where.get("ts") and where.get("channel_id")):
            return None  # found by a lookup or in the outbox: its ts is not known
        return str(where["channel_id"]), str(where["ts"])

    def _post(self, client: WebClient, channel: str, msg: Message, thread_ts: str | None = None) -> tuple[str, str]:
        """chat.postMessage with the key in metadata (in a thread when thread_ts is given); (ts, channel id)
        or _Undelivered / _Ambiguous."""
        try:
            resp = client.chat_postMessage(
                channel=channel, text=msg.text, blocks=list(msg.blocks) or None, thread_ts=thread_ts,
                metadata={"event_type": METADATA_EVENT, "event_payload": {"key": msg.key}},
            )
        except SlackApiError as exc:
            status = getattr(exc.response, "status_code", None)
            data = getattr(exc.response, "data", None)
            error = data.get("error") if isinstance(data, dict) else None
            text = _clip(f"slack error {error or 'unknown'} (HTTP {status})")
            if status is not None and status >= 500:
                raise _Ambiguous(text) from None  # the edge may have answered after Slack posted
            raise _Undelivered(text, transient=status == 429) from None
        except TimeoutError as exc:
            # Raised raw by urllib while waiting for the answer: the request was sent.
            raise _Ambiguous(f"timed out after {self.timeout_s:g} s waiting for Slack: {exc}") from None
        except OSError as exc:
            reason = getattr(exc, "reason", None) or exc
            if isinstance(reason, ConnectionRefusedError) or "refused" in str(reason).lower():
                raise _Undelivered(_clip(f"connection error: {reason}"), transient=True) from None
            # A reset or a cut answer: the request may have been read and acted on.
            raise _Ambiguous(_clip(f"connection error: {reason}")) from None
        except Exception as exc:  # noqa: BLE001 - a notification must never take the run down
            raise _Ambiguous(_clip(f"{type(exc).__name__}: {exc}")) from None
        data = resp.data if isinstance(resp.data, dict) else {}
        return str(data.get("ts", "")), str(data.get("channel", ""))

    # ------------------------------------------------------------------ the lookup
    def _find_posted(self, client: WebClient, token: str, channel: str, key: str,
                     thread: tuple[str, str] | None = None) -> bool | None:
        """Is a message with this key in the channel (or, for a reply, in its thread: replies are not in the
        channel's history)? None when that cannot be told (lookup failed)."""
        try:
            channel_id = thread[0] if thread else self._channel_id(client, channel)
            if channel_id is None:
                log.warning("cannot look up %s: no conversation id for channel %s", key, channel)
                return None
            cursor = None
            for _ in range(_LOOKUP_PAGES):
                if thread:
                    resp = client.conversations_replies(channel=channel_id, ts=thread[1], limit=_LOOKUP_PAGE_SIZE,
                                                        include_all_metadata=True, cursor=cursor)
                else:
                    resp = client.conversations_history(channel=channel_id, limit=_LOOKUP_PAGE_SIZE,
                                                        include_all_metadata=True, cursor=cursor)
                for message in resp.get("messages") or []:
                    meta = message.get("metadata") or {}
                    if meta.get("event_type") == METADATA_EVENT and (meta.get("event_payload") or {}).get("key") == key:
                        return True
                cursor = (resp.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    break
            return False
        except Exception as exc:  # noqa: BLE001 - an unverifiable delivery is reported, not raised
            log.warning("lookup of %s in %s failed: %s", key, channel, redact(_clip(str(exc)), token))
            return None

    def _channel_id(self, client: WebClient, channel: str) -> str | None:
        """The conversation id conversations.history needs: as configured, remembered from a post, or listed."""
        if _CHANNEL_ID.match(channel):
            return channel
        cached = self.store.get_kv(_channel_key(channel))
        if cached:
            return cached
        name = channel.lstrip("#")
        cursor = None
        for _ in range(20):
            resp = client.conversations_list(types="public_channel,private_channel", limit=1000, cursor=cursor,
                                             exclude_archived=True)
            for conv in resp.get("channels") or []:
                if conv.get("name") == name and conv.get("id"):
                    self.store.set_kv(_channel_key(channel), conv["id"])
                    return conv["id"]
            cursor = (resp.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                break
        return None


def _channel_key(channel: str) -> str:
    return f"slack:channel_id:{channel}"


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
