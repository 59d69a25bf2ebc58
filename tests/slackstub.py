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
    # True: handle the call normally (a post IS stored), then answer `status` instead: the answer is lost.
    after_handling: bool = False
    method: str | None = None  # only calls of this Slack method (None: any)


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
        # Messages Slack holds, per conversation id, oldest first (for conversations.history).
        self.history: dict[str, list[dict[str, Any]]] = {}
        self._names: dict[str, str] = {}  # conversation id -> the name it was first posted to
        # users.info answers: Slack user id -> the "user" object (name, tz, profile.email).
        self.users: dict[str, dict[str, Any]] = {}
        self._ts_counter = 0
        # apps.connections.open answers this URL (a SocketModeStub's, ws://127.0.0.1:…); None: Socket Mode is off.
        self.socket_mode_url: str | None = None
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
        self, status: int, *, retry_after: int | None = None, times: int = 1, body: dict | None = None,
        method: str | None = None,
    ) -> None:
        """The next `times` requests (any method) get `status` instead of the normal answer.

        429 defaults to `{"ok": false, "error": "ratelimited"}` (+ Retry-After when given),
        5xx to a small HTML page like Slack's load balancer sends. With status 200
        and a body this injects an application error, e.g. `{"ok": False, "error": "fatal_error"}`.
        """
        with self._lock:
            for _ in range(times):
                self._failures.append(_Failure(status, retry_after, body, method=method))

    def lose_next_answer(self, *, status: int = 500, times: int = 1, method: str | None = "chat.postMessage") -> None:
        """The next `times` requests are carried out (a post is delivered and kept in the history), but the
        answer is lost: the client gets `status` (Slack's 5xx HTML page) as if the edge dropped the reply."""
        with self._lock:
            for _ in range(times):
                self._failures.append(_Failure(status, None, None, after_handling=True, method=method))

    def delay_next(self, seconds: float, *, times: int = 1) -> None:
        """Answer the next `times` requests normally, but only after `seconds` (client timeouts)."""
        with self._lock:
            for _ in range(times):
                self._failures.append(_Failure(200, None, None, delay_s=seconds))

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self._failures.clear()
            self.history.clear()
            self._names.clear()
            self.valid_tokens = None
            self.known_channels = None

    def delivered(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Messages Slack holds (what a person sees in the channel), whatever the client was answered."""
        with self._lock:
            if channel is None:
                return [m for msgs in self.history.values() for m in msgs]
            return list(self.history.get(self.channel_id(channel), []))

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
    def _take_failure(self, method: str) -> _Failure | None:
        """The first queued failure that applies to this method, taken off the queue."""
        with self._lock:
            for i, f in enumerate(self._failures):
                if f.method is None or f.method == method:
                    return self._failures.pop(i)
            return None

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
            if method == "chat.postMessage" and body.get("thread_ts"):
                message["thread_ts"] = str(body["thread_ts"])  # a reply: in the thread, not in history
            if blocks:
                message["blocks"] = blocks
            metadata = body.get("metadata")
            if isinstance(metadata, str):
                try:
                    metadata = json.loads(metadata)
                except ValueError:
                    return {"ok": False, "error": "invalid_metadata_format"}
            if metadata is not None:
                if not isinstance(metadata, dict) or not metadata.get("event_type") \
                        or not isinstance(metadata.get("event_payload"), dict):
                    return {"ok": False, "error": "invalid_metadata_schema"}
                message["metadata"] = metadata
            cid = self.channel_id(str(channel))
            with self._lock:
                self._names.setdefault(cid, str(channel))
                msgs = self.history.setdefault(cid, [])
                if method == "chat.update":
                    found = [m for m in msgs if m["ts"] == ts]
                    if not found:
                        return {"ok": False, "error": "message_not_found"}
                    found[0].update({k: v for k, v in message.items() if k != "ts"})
                else:
                    msgs.append(message)
            return {"ok": True, "channel": cid, "ts": ts, "message": message}
        if method == "chat.postEphemeral":  # seen only by `user`, never in the channel's history
            if not body.get("channel") or not body.get("user"):
                return {"ok": False, "error": "channel_not_found" if not body.get("channel") else "user_not_found"}
            if not body.get("text") and not body.get("blocks"):
                return {"ok": False, "error": "no_text"}
            return {"ok": True, "message_ts": self._next_ts()}
        if method == "apps.connections.open":  # Socket Mode: an app-level token gets the WebSocket's URL
            if not str(token).startswith("xapp-"):
                return {"ok": False, "error": "not_allowed_token_type"}
            if not self.socket_mode_url:
                return {"ok": False, "error": "socket_mode_not_enabled"}
            return {"ok": True, "url": self.socket_mode_url}
        if method == "users.lookupByEmail":
            email = str(body.get("email") or "").lower()
            found = [u for u in self.users.values() if str((u.get("profile") or {}).get("email", "")).lower() == email]
            return {"ok": True, "user": found[0]} if found else {"ok": False, "error": "users_not_found"}
        if method == "users.info":
            user = self.users.get(str(body.get("user")))
            return {"ok": True, "user": user} if user else {"ok": False, "error": "user_not_found"}
        if method == "conversations.history":
            return self._history(body)
        if method == "conversations.replies":
            return self._history(body, thread_ts=str(body.get("ts") or ""))
        if method == "conversations.list":
            with self._lock:
                names = set(self.known_channels or ()) | set(self._names.values())
            chans = [{"id": self.channel_id(n), "name": n.lstrip("#"), "is_channel": True}
                     for n in sorted(names) if not (n[:1] in "CDG" and n[1:].isalnum() and n.isupper())]
            return {"ok": True, "channels": chans, "response_metadata": {"next_cursor": ""}}
        return {"ok": False, "error": "unknown_method"}

    def _history(self, body: dict[str, Any], thread_ts: str | None = None) -> dict[str, Any]:
        """conversations.history as Slack answers it: newest first, `oldest`/`latest` exclusive bounds,
        `limit`, cursor paging, and message metadata only with include_all_metadata=true. Slack wants the
        conversation id; a name is channel_not_found, as on Slack. Thread replies are not in the history;
        with `thread_ts` (conversations.replies) the answer is that thread: its parent and replies, oldest first."""
        cid = str(body.get("channel") or "")
        with self._lock:
            known = {self.channel_id(c) for c in self.known_channels or ()}
            if cid not in self.history and cid not in self._names and cid not in known:
                return {"ok": False, "error": "channel_not_found"}
            msgs = [dict(m) for m in self.history.get(cid, [])]
        oldest = float(body.get("oldest") or 0)
        latest = float(body.get("latest") or 9e18)
        if thread_ts is None:
            msgs = [m for m in reversed(msgs) if "thread_ts" not in m and oldest < float(m["ts"]) < latest]
        else:
            msgs = [m for m in msgs if thread_ts in (m["ts"], m.get("thread_ts"))]
            if not msgs:
                return {"ok": False, "error": "thread_not_found"}
        if str(body.get("include_all_metadata", "")).lower() not in ("true", "1"):
            for m in msgs:
                m.pop("metadata", None)
        limit = max(1, min(int(body.get("limit") or 100), 999))
        start = int(body.get("cursor") or 0)
        page = msgs[start:start + limit]
        more = start + limit < len(msgs)
        return {"ok": True, "messages": page, "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""}}


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

        channel = body.get("channel")
        if method == "chat.postMessage" and isinstance(channel, str) and channel and \
                (stub.known_channels is None or channel in stub.known_channels):
            # Any channel exists when known_channels is None: one named in a post is listed from then on.
            with stub._lock:
                stub._names.setdefault(stub.channel_id(channel), channel)
        failure = stub._take_failure(method)
        extra_headers: dict[str, str] = {}
        delay_s = 0.0
        if failure is not None and failure.delay_s:
            # Recorded (and, for a post, "delivered") now; the answer comes late.
            delay_s, failure = failure.delay_s, None
        if failure is not None and failure.after_handling:
            # Carried out as usual; only the answer is lost on the way back.
            call_probe = RecordedCall(method, headers, body, 200)
            stub.answer(method, body, call_probe.token)
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


# --------------------------------------------------------------------------- Socket Mode


_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class SocketModeStub:
    """Slack's Socket Mode end on 127.0.0.1: a minimal WebSocket server (RFC 6455: handshake, unmasked server
    frames, masked client frames, ping/pong, close) speaking Slack's envelope protocol. On connect it says
    `{"type": "hello", ...}`; `send_interactive(payload)` sends `{"envelope_id", "type": "interactive", "payload",
    "accepts_response_payload"}` to every connection; the client's `{"envelope_id": ...}` acks are recorded
    (`acks`, `wait_ack`). `send_raw` sends any envelope (a replay, another type). `go_silent()` drops the open
    connections silently, as a NAT or proxy does: no close frame, no pong, nothing sent or recorded on them, the TCP
    connection left open; `wait_handshakes(n)` waits for the n-th connection (a reconnect)."""

    def __init__(self) -> None:
        import socket as _socket
        self._sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        self._sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.url = f"ws://127.0.0.1:{self._sock.getsockname()[1]}/link/?ticket=stub-ticket"
        self.acks: list[dict[str, Any]] = []  # every JSON message a client sent (acks), in order
        self.requests: list[str] = []  # the handshake request lines (path with ticket)
        self._conns: list[Any] = []
        self._silent: list[Any] = []  # connections dropped silently: open, never answered
        # Every ping a client sent: (its payload, answered?). slack-sdk's payload is "<session id>:<its time.time()>".
        self.pings: list[tuple[str, bool]] = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._counter = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    # ---------------------------------------------------------------- test API
    def wait_connected(self, timeout: float = 10.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._conns), timeout)

    def wait_handshakes(self, count: int, timeout: float = 30.0) -> bool:
        """Whether `count` WebSocket handshakes arrived (the first connection, then each reconnect)."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.requests) >= count and bool(self._conns), timeout)

    def wait_answered_ping(self, timeout: float = 30.0) -> bool:
        """Whether a client's ping was answered (on a connection not yet silent): its staleness clock has started."""
        with self._cond:
            return self._cond.wait_for(lambda: any(answered for _, answered in self.pings), timeout)

    def go_silent(self) -> None:
        """The open connections stop answering without a close frame: the client must notice by itself."""
        with self._lock:
            self._silent.extend(self._conns)
            self._conns = []

    def send_interactive(self, payload: dict[str, Any], envelope_id: str | None = None) -> str:
        with self._lock:
            self._counter += 1
            envelope_id = envelope_id or f"env-{self._counter:04d}"
        self.send_raw({"envelope_id": envelope_id, "type": "interactive", "payload": payload,
                       "accepts_response_payload": False})
        return envelope_id

    def send_raw(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            self._send_frame(conn, 0x1, data)

    def ack_count(self, envelope_id: str) -> int:
        with self._lock:
            return sum(1 for a in self.acks if a.get("envelope_id") == envelope_id)

    def wait_ack(self, envelope_id: str, timeout: float = 10.0, count: int = 1) -> bool:
        """Whether `count` acks of this envelope id arrived (a redelivered envelope is acked again)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: sum(1 for a in self.acks if a.get("envelope_id") == envelope_id) >= count, timeout)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            conns, self._conns = list(self._conns) + self._silent, []
            self._silent = []
        for conn in conns:
            try:
                conn.close()
            except OSError:
                pass
        self._sock.close()

    # ---------------------------------------------------------------- server
    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _addr = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _send_frame(conn: Any, opcode: int, data: bytes) -> None:
        import struct
        head = bytes([0x80 | opcode])
        n = len(data)
        if n < 126:
            head += bytes([n])
        elif n < 65536:
            head += bytes([126]) + struct.pack("!H", n)
        else:
            head += bytes([127]) + struct.pack("!Q", n)
        try:
            conn.sendall(head + data)
        except OSError:
            pass

    @staticmethod
    def _read_exact(conn: Any, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = conn.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def _serve(self, conn: Any) -> None:
        import base64
        import hashlib
        import struct
        try:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(1024)
                if not chunk:
                    return
                request += chunk
            lines = request.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            key = headers.get("sec-websocket-key", "")
            accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
            conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
            self._send_frame(conn, 0x1, json.dumps({"type": "hello", "num_connections": 1,
                                                    "debug_info": {"host": "stub", "approximate_connection_time": 3600},
                                                    "connection_info": {"app_id": "A0STUB"}}).encode())
            with self._cond:
                self.requests.append(lines[0])
                self._conns.append(conn)
                self._cond.notify_all()
            while True:
                b1, b2 = self._read_exact(conn, 2)
                opcode, masked, n = b1 & 0x0F, b2 & 0x80, b2 & 0x7F
                if n == 126:
                    n = struct.unpack("!H", self._read_exact(conn, 2))[0]
                elif n == 127:
                    n = struct.unpack("!Q", self._read_exact(conn, 8))[0]
                mask = self._read_exact(conn, 4) if masked else b"\0\0\0\0"
                data = bytes(c ^ mask[i % 4] for i, c in enumerate(self._read_exact(conn, n)))
                with self._lock:
                    silent = conn in self._silent
                if opcode == 0x9:
                    with self._cond:
                        self.pings.append((data.decode(errors="replace"), not silent))
                        self._cond.notify_all()
                if silent:  # read and dropped: a dead path answers nothing
                    continue
                if opcode == 0x8:  # close
                    self._send_frame(conn, 0x8, data[:2])
                    return
                if opcode == 0x9:  # ping -> pong
                    self._send_frame(conn, 0xA, data)
                elif opcode == 0x1:
                    try:
                        message = json.loads(data.decode())
                    except ValueError:
                        message = {"unparsed": data.decode(errors="replace")}
                    with self._cond:
                        self.acks.append(message)
                        self._cond.notify_all()
        except (OSError, ConnectionError, ValueError):
            return
        finally:
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
                if conn in self._silent:
                    self._silent.remove(conn)
            try:
                conn.close()
            except OSError:
                pass


@pytest.fixture
def socket_mode_stub(slack_stub: SlackStub) -> Iterator[SocketModeStub]:
    """Socket Mode on the Slack stub: apps.connections.open answers a WebSocket stub's URL (127.0.0.1)."""
    ws = SocketModeStub()
    slack_stub.socket_mode_url = ws.url
    try:
        yield ws
    finally:
        slack_stub.socket_mode_url = None
        ws.close()
