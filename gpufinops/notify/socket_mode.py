"""Slack buttons without a public URL: Slack Socket Mode (`slack.socket_mode: true`, `slack.app_token`).

Many teams run gpufinops inside a VPC with no inbound HTTPS, where Slack cannot reach POST /slack/actions. With
Socket Mode the service dials out instead: `apps.connections.open` with the app-level token (xapp-…, scope
`connections:write`) gives a wss URL, the WebSocket says `hello`, and each click arrives as an `interactive`
envelope `{"envelope_id", "type": "interactive", "payload", "accepts_response_payload"}`, which is acknowledged
with `{"envelope_id": …}` once handled (Slack sends an envelope not acknowledged within 3 s again: the envelope id
is claimed once, so a second copy changes nothing). The payload then goes through the very function the HTTP
endpoint calls after its signature check (`interact.handle_socket_envelope` -> `handle_verified`): the same
authorisation by Slack user id, the same stored request the leader applies, the same audit of refusals.

Every envelope with an `envelope_id` is acknowledged, whatever its payload: one whose payload is missing or not a
button click is refused by the same parse as any click (logged, nothing stored) and acknowledged, so Slack does not
send it again (slack-sdk's request listener drops such an envelope before any ack, so the raw message listener is
used). Messages without an id (`hello`, `disconnect`) are not envelopes and are not acknowledged.

Every replica may hold a connection (Slack spreads envelopes over up to 10); no cloud change is made here. The
client is slack-sdk's own (`slack_sdk.socket_mode.builtin`: no extra dependency); it reconnects by itself, and a
first connection that fails is tried again with a doubling pause (5 s up to 5 min). A connection that goes silent
(no close frame, no answer: a NAT or proxy that dropped it) is noticed by its pings: slack-sdk drops a connection
that answered no ping for more than STALE_PINGS intervals, checking once an interval, and connects again at once,
so with a ping every PING_INTERVAL_S (2.5 s) a silent drop is noticed within 12.5 s (`silent_drop_noticed_s`),
under 15 s (with slack-sdk's own 5 s it took up to 25 s; at 10 s, 50 s).
The token is read when connecting, never logged; slack-sdk's records pass through the token redaction of
notify/delivery.py.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Callable

from ..config import SlackSettings
from .delivery import _RedactingFilter, redact
from .interact import Answer

log = logging.getLogger("gpufinops.interact")
_sdk_log = logging.getLogger("gpufinops.notify.slack_socket_mode")
_sdk_log.addFilter(_RedactingFilter())

# (envelope_id, payload) -> what the click came to; the service binds store, cloud and clock.
EnvelopeHandler = Callable[[Any, Any], Answer]
_KEEP_ANSWERS = 100
# slack_sdk.socket_mode.builtin.connection.Connection.check_state: stale after more than this many ping intervals
# without a pong; it checks once an interval, so a silent connection is dropped within (STALE_PINGS + 1) intervals.
STALE_PINGS = 4
PING_INTERVAL_S = 2.5


class SocketModeActions:
    """One Socket Mode connection that feeds `interactive` envelopes to `handle` and acknowledges each."""

    def __init__(self, slack: SlackSettings, handle: EnvelopeHandler, *, first_backoff_s: float = 5.0,
                 max_backoff_s: float = 300.0, ping_interval_s: float = PING_INTERVAL_S):
        self.slack = slack
        self.handle = handle
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.ping_interval_s = ping_interval_s
        self.client = None
        self.answers: OrderedDict[str, Answer] = OrderedDict()  # the last envelopes handled (logs, tests)
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Connect in the background; False (logged) when there is no app-level token to connect with."""
        if not self.slack.app_token.resolve():
            log.error("slack.socket_mode is on but slack.app_token resolves to nothing: no buttons over Socket Mode")
            return False
        self._thread = threading.Thread(target=self._connect_until_stopped, name="slack-socket-mode", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            client, self.client = self.client, None
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort on the way out
                log.warning("closing the Slack Socket Mode connection: %s", redact(str(exc))[:200])
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _connect_until_stopped(self) -> None:
        from slack_sdk import WebClient
        from slack_sdk.socket_mode.builtin import SocketModeClient

        backoff = self.first_backoff_s
        while not self._stop.is_set():
            token = self.slack.app_token.resolve()  # read again on each try: a rotated token file is picked up
            if not token:
                log.error("slack.app_token resolves to nothing: Socket Mode not connected")
            else:
                web = WebClient(token=None, base_url=self.slack.base_url or WebClient.BASE_URL, timeout=10,
                                logger=_sdk_log)
                client = SocketModeClient(app_token=token, web_client=web, logger=_sdk_log,
                                          ping_interval=self.ping_interval_s, concurrency=4)
                client.message_listeners.append(self._on_message)
                try:
                    client.connect()
                except Exception as exc:  # noqa: BLE001 - Slack down, bad token: logged, tried again later
                    log.error("Slack Socket Mode: could not connect (next try in %.0f s): %s", backoff,
                              redact(f"{type(exc).__name__}: {exc}", token)[:300])
                    try:
                        client.close()
                    except Exception:  # noqa: BLE001
                        pass
                else:
                    with self._lock:
                        if self._stop.is_set():
                            client.close()
                            return
                        self.client = client
                    self.connected.set()
                    log.info("Slack Socket Mode connected: button clicks arrive over it")
                    return  # slack-sdk reconnects this client by itself from now on
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self.max_backoff_s)

    @property
    def silent_drop_noticed_s(self) -> float:
        """At most this long from a connection's last answer until slack-sdk drops it and connects again."""
        return (STALE_PINGS + 1) * self.ping_interval_s

    def _on_message(self, client, message: dict, _raw: str) -> None:
        """One message from Slack: an envelope (it has an `envelope_id`) is acknowledged once handled, whatever its
        payload; an `interactive` one is handled (a malformed payload refused by the click parser, logged), any
        other type only acknowledged. `hello` and `disconnect` carry no envelope id (slack-sdk handles them)."""
        if not isinstance(message, dict) or "envelope_id" not in message:
            return
        envelope_id, kind = message["envelope_id"], message.get("type")
        try:
            if kind == "interactive":
                try:
                    answer = self.handle(envelope_id, message.get("payload"))
                except Exception as exc:  # noqa: BLE001 - a click never takes the connection down
                    log.error("Slack click (Socket Mode) failed: %s", redact(f"{type(exc).__name__}: {exc}")[:300])
                    answer = Answer(500, "the click could not be handled; nothing changed, try again")
                with self._lock:
                    self.answers[str(envelope_id)[:200]] = answer
                    while len(self.answers) > _KEEP_ANSWERS:
                        self.answers.popitem(last=False)
            else:
                log.info("Slack Socket Mode: ignored an envelope of type %r", str(kind)[:40])
        finally:
            try:
                client.send_socket_mode_response({"envelope_id": envelope_id})
            except Exception as exc:  # noqa: BLE001 - not acknowledged: Slack sends it again, the claim holds
                log.warning("Slack Socket Mode: could not acknowledge an envelope: %s", redact(str(exc))[:200])
