"""A local Slack Web API stub: a real HTTP server on 127.0.0.1 that answers like Slack.

Used as a pytest plugin (tests/conftest.py `pytest_plugins`). Tests point
`slack_sdk.WebClient(base_url=stub.base_url)` at it, so the real client code
(JSON body, Authorization header, retry handlers, error parsing) runs unchanged.

What slack_sdk 3.x sends, and what the stub records:
  * chat.postMessage (and every method given `json=`): POST, body JSON,
    `Content-Type: application/json;charset=utf-8`, token in
    `Authorization: Bearer xoxb-...`.
  * methods called with form params: `application/x-www-form-urlencoded`; the
    token may also come as a `token` form field (older clients do this).
Both are parsed into `RecordedCall.body` (a dict).

Slack answers HTTP 200 with `{"ok": false, "error": "..."}` for application
errors (bad token, unknown channel, missing text), and uses HTTP status codes
only for rate limits (429 + Retry-After) and server trouble (5xx); the stub
does the same, and `fail_next` injects the HTTP-level failures.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import parse_qsl, urlsplit

import pytest

# Tokens Slack issues: bot (xoxb), user (xoxp), app-level (xapp), legacy/others.
TOKEN_PREFIXES = ("xoxb-", "xoxp-", "xoxa-", "xoxe-", "xoxs-", "xapp-")


@dataclass
class RecordedCall:
    method: str  # Slack API method, e.g. "chat.postMessage"
    headers: dict[str, str]
    body: dict[str, Any]  # parsed JSON, or form fields (query string merged in)
    status_returned: int
    response: dict[str, Any] = field(default_factory=dict)
    received_at: float = 0.0  # time.monotonic() when the request arrived
    content_type: str = ""

    @property
    def token(self) -> str | None:
        auth = self.headers.get("Authorization") or self.headers.get("authorization") or ""
        if auth.startswith("Bearer "):
            return auth[len("Bearer "):]
        tok = self.body.get("token")
        return tok if isinstance(tok, str) else None

    @property
    def ok(self) -> bool:
        return self.status_returned == 200 and bool(self.response.get("ok"))


@dataclass
class _Failure:
    status: int
    retry_after: int | None
    body: dict | None
    delay_s: float = 0.0


class SlackStub:
    """State shared between the test and the server thread (all access under a lock)."""

    def __init__(self) -> None:
        self.base_url: str = ""
        self.calls: list[RecordedCall] = []
        # None: any token with a Slack prefix is accepted; a set restricts to those tokens.
        self.valid_tokens: set[str] | None = None
        # None: any channel exists; a set restricts ("#name" or id), others get channel_not_found.
        self.known_channels: set[str] | None = None
        self._failures: list[_Failure] = []
        self._ts_counter = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ test API
    def posted(self, channel: str | None = None) -> list[dict]:
        """Parsed bodies of chat.postMessage calls that got HTTP 200 and ok=true.

        `channel` matches what the client sent ("#gpu-finops") or the id the
        stub answered with ("C...").
        """
        with self._lock:
            calls = list(self.calls)
        out = []
        for c in calls:
            if c.method != "chat.postMessage" or not c.ok:
                continue
            if channel is not None and channel not in (c.body.get("channel"), c.response.get("channel")):
                continue
            out.append(c.body)
        return out

    def fail_next(
        self, status: int, *, retry_after: int | None = None, times: int = 1, body: dict | None = None
    ) -> None:
        """The next `times` requests (any method) get `status` instead of the normal answer.

        429 defaults to `{"ok": false, "error": "ratelimited"}` (+ Retry-After when given),
        5xx to a small HTML page like Slack's load balancer sends. With status 200
        and a body this injects an application error, e.g. `{"ok": False, "error": "fatal_error"}`.
        """
        with self._lock:
            for _ in range(times):
                self._failures.append(_Failure(status, retry_after, body))

    def delay_next(self, seconds: float, *, times: int = 1) -> None:
        """Answer the next `times` requests normally, but only after `seconds` (client timeouts)."""
        with self._lock:
            for _ in range(times):
                self._failures.append(_Failure(200, None, None, delay_s=seconds))

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self._failures.clear()
            self.valid_tokens = None
            self.known_channels = None

    def calls_for(self, method: str) -> list[RecordedCall]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        stub = self

        class Handler(_Handler):
            pass

        Handler.stub = stub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{port}/api/"
        # A short poll interval: shutdown() waits up to one interval, once per test.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="slack-stub", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    # ------------------------------------------------------------------ Slack behaviour
    def _take_failure(self) -> _Failure | None:
        with self._lock:
            return self._failures.pop(0) if self._failures else None

    def _next_ts(self) -> str:
        with self._lock:
            self._ts_counter += 1
            n = self._ts_counter
        return f"{1700000000 + n // 1000000}.{n % 1000000:06d}"

    def _token_ok(self, token: str | None) -> str | None:
        """None when the token is accepted, else Slack's error code."""
        if not token:
            return "not_authed"
        if self.valid_tokens is not None:
            return None if token in self.valid_tokens else "invalid_auth"
        return None if token.startswith(TOKEN_PREFIXES) else "invalid_auth"

    @staticmethod
    def channel_id(channel: str) -> str:
        """A stable fake conversation id for a channel name, like Slack's "C0123ABCD"."""
        if channel[:1] in ("C", "D", "G") and channel[1:].isalnum() and channel.isupper():
            return channel
        return f"C{zlib.crc32(channel.lstrip('#').encode()):08X}"

    def answer(self, method: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
        """The JSON Slack would answer with HTTP 200 for this call."""
        err = self._token_ok(token)
        if err:
            return {"ok": False, "error": err}
        if method in ("api.test",):
            return {"ok": True, "args": body}
        if method == "auth.test":
            return {"ok": True, "url": "https://stub.slack.com/", "team": "Stub", "user": "gpufinops",
                    "team_id": "T0STUB", "user_id": "U0STUB", "bot_id": "B0STUB"}
        if method in ("chat.postMessage", "chat.update"):
            channel = body.get("channel")
            if not channel:
                return {"ok": False, "error": "channel_not_found"}
            if self.known_channels is not None and channel not in self.known_channels:
                return {"ok": False, "error": "channel_not_found"}
            blocks = body.get("blocks")
            if isinstance(blocks, str):  # form-encoded clients send blocks as a JSON string
                try:
                    blocks = json.loads(blocks)
                except ValueError:
                    return {"ok": False, "error": "invalid_blocks_format"}
            if not body.get("text") and not blocks and not body.get("attachments"):
                return {"ok": False, "error": "no_text"}
            if blocks is not None and (not isinstance(blocks, list) or len(blocks) > 50):
                return {"ok": False, "error": "invalid_blocks"}
            ts = body.get("ts") if method == "chat.update" else self._next_ts()
            if method == "chat.update" and not ts:
                return {"ok": False, "error": "message_not_found"}
            message = {"type": "message", "user": "U0STUB", "bot_id": "B0STUB", "text": body.get("text", ""),
                       "ts": ts}
            if blocks:
                message["blocks"] = blocks
            return {"ok": True, "channel": self.channel_id(str(channel)), "ts": ts, "message": message}
        return {"ok": False, "error": "unknown_method"}


class _Handler(BaseHTTPRequestHandler):
    stub: SlackStub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:  # Slack accepts GET for most methods; slack_sdk always POSTs
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _parse_body(self) -> tuple[dict[str, Any], str]:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        ctype = self.headers.get("Content-Type", "")
        body: dict[str, Any] = dict(parse_qsl(parts.query, keep_blank_values=True))
        if raw:
            if ctype.startswith("application/json"):
                try:
                    parsed = json.loads(raw.decode("utf-8"))
                except ValueError:
                    parsed = {"_unparseable": raw.decode("utf-8", "replace")}
                if isinstance(parsed, dict):
                    body.update(parsed)
            else:
                body.update(parse_qsl(raw.decode("utf-8"), keep_blank_values=True))
        return body, ctype

    def _handle(self) -> None:
        received = time.monotonic()
        stub = self.stub
        parts = urlsplit(self.path)
        path = parts.path
        method = path[len("/api/"):] if path.startswith("/api/") else path.lstrip("/")
        body, ctype = self._parse_body()
        headers = {k: v for k, v in self.headers.items()}

        failure = stub._take_failure()
        extra_headers: dict[str, str] = {}
        delay_s = 0.0
        if failure is not None and failure.delay_s:
            # Recorded (and, for a post, "delivered") now; the answer comes late.
            delay_s, failure = failure.delay_s, None
        if failure is not None:
            status = failure.status
            if failure.retry_after is not None:
                extra_headers["Retry-After"] = str(failure.retry_after)
            if failure.body is not None:
                payload: Any = failure.body
            elif status == 429:
                payload = {"ok": False, "error": "ratelimited"}
            elif status >= 500:
                payload = None  # Slack's edge answers 5xx with HTML, not JSON
            else:
                payload = {"ok": False, "error": f"http_{status}"}
        else:
            status = 200
            call_probe = RecordedCall(method, headers, body, 200)
            payload = stub.answer(method, body, call_probe.token)

        if payload is None:
            data = b"<html><body><h1>Slack is having trouble</h1></body></html>"
            content_type = "text/html; charset=utf-8"
            response: dict[str, Any] = {}
        else:
            data = json.dumps(payload).encode("utf-8")
            content_type = "application/json; charset=utf-8"
            response = payload if isinstance(payload, dict) else {}

        with stub._lock:
            stub.calls.append(RecordedCall(method, headers, body, status, response, received, ctype))
        if delay_s:
            time.sleep(delay_s)

        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra_headers.items():
            self.send_header(k, v)
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
            pass


@pytest.fixture
def slack_stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackStub]:
    """A Slack Web API stub on 127.0.0.1 with a free port, started and stopped per test."""
    # slack_sdk routes through HTTP(S)_PROXY and ignores NO_PROXY; the stub is local.
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    stub = SlackStub()
    stub.start()
    try:
        yield stub
    finally:
        stub.stop()
