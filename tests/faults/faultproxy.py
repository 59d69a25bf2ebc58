"""A fault-injecting HTTP proxy on 127.0.0.1, put in front of a real peer (Prometheus, moto, the Slack stub).

The service under test is pointed at the proxy instead of the peer. Each request is read in full,
described as a `Request` (path, AWS `Action=` from the form body, Slack method, a per-proxy sequence
number) and matched against the armed `Fault`s in order; the first one whose predicate holds (and
that has uses left) decides what happens:

    refuse        reset the connection without forwarding (the peer never sees it)
    delay         wait `seconds`, then forward and answer normally (client read timeouts)
    status        answer `status` (5xx, 429 + Retry-After, ...) with `body`, without forwarding
    aws_error     answer an AWS XML error (RequestLimitExceeded, UnsupportedOperation, InternalError ...)
    lost          forward (the peer ACTS), then answer 500 (`as_reset=False`) or reset the connection
    late          forward, then answer only after `seconds` (the peer acted; the client has given up)
    cut           forward, then send the headers and only half the body, and close
    rewrite       forward, then answer `transform(body)` (e.g. DCGM sentinels in a Prometheus answer)
    hook          call `hook(request)` (e.g. kill -9 the client), then reset the connection; before
                  forwarding (`after=False`: the peer never sees it) or after (`after=True`: the peer acted)

What reached the peer is recorded (`forwarded`), so a test can count the StopInstances moto really got.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

# DCGM's "field not available" value (int64 max - 13); numbers near it are never a measurement.
DCGM_SENTINEL = 9223372036854775794

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection",
               "te", "trailer", "upgrade", "accept-encoding", "content-encoding"}


@dataclass(frozen=True)
class Request:
    seq: int  # 1-based order of arrival at this proxy
    method: str
    path: str  # path and query string
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() on arrival

    @property
    def route(self) -> str:
        return urlsplit(self.path).path

    @property
    def params(self) -> dict[str, list[str]]:
        """Query-string and form-body parameters together (AWS query protocol, Slack form calls)."""
        out = parse_qs(urlsplit(self.path).query)
        ctype = self.headers.get("Content-Type", self.headers.get("content-type", ""))
        if self.body and "json" not in ctype:
            for k, v in parse_qs(self.body.decode("utf-8", "replace")).items():
                out.setdefault(k, []).extend(v)
        return out

    @property
    def aws_action(self) -> str | None:
        values = self.params.get("Action")
        return values[0] if values else None

    @property
    def slack_method(self) -> str | None:
        route = self.route
        return route[len("/api/"):] if route.startswith("/api/") else None

    @property
    def instance_ids(self) -> list[str]:
        """InstanceId.N (StopInstances) and ResourceId.N (CreateTags/DeleteTags) values."""
        return [v[0] for k, v in sorted(self.params.items()) if re.fullmatch(r"(InstanceId|ResourceId)\.\d+", k)]

    def json_body(self) -> dict:
        try:
            data = json.loads(self.body.decode("utf-8"))
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}


Predicate = Callable[[Request], bool]


def any_request(_req: Request) -> bool:
    return True


def aws_action(*names: str) -> Predicate:
    return lambda req: req.aws_action in names


def slack_method(*names: str) -> Predicate:
    return lambda req: req.slack_method in names


def path_contains(text: str) -> Predicate:
    return lambda req: text in req.path


def prom_query_contains(text: str) -> Predicate:
    """A Prometheus instant query whose PromQL contains `text`."""
    def match(req: Request) -> bool:
        return req.route.startswith("/api/v1/query") and any(text in q for q in req.params.get("query", []))
    return match


def all_of(*preds: Predicate) -> Predicate:
    return lambda req: all(p(req) for p in preds)


@dataclass
class Fault:
    mode: str
    when: Predicate = any_request
    times: int | None = None  # uses left; None: every matching request
    skip: int = 0  # let this many matching requests through untouched first
    seconds: float = 0.0
    status: int = 500
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    as_reset: bool = False
    transform: Callable[[bytes], bytes] | None = None
    hook: Callable[[Request], None] | None = None
    after: bool = False
    forward: bool = False  # hook: after calling it, forward and answer normally instead of resetting
    used: int = 0

    def take(self, req: Request) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if not self.when(req):
            return False
        if self.skip > 0:
            self.skip -= 1
            return False
        if self.times is not None:
            self.times -= 1
        self.used += 1
        return True


def aws_error_body(code: str, message: str = "") -> bytes:
    """An EC2 query-protocol error document, as EC2 answers it."""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{message or code}</Message></Error></Errors>"
            f"<RequestID>00000000-fault-proxy</RequestID></Response>").encode()


def sentinel_values(body: bytes, value: str = str(DCGM_SENTINEL)) -> bytes:
    """A Prometheus query answer with every sample value replaced by `value` (vector and matrix)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    for series in (doc.get("data") or {}).get("result") or []:
        if isinstance(series, dict):
            if isinstance(series.get("value"), list) and len(series["value"]) == 2:
                series["value"][1] = value
            for sample in series.get("values") or []:
                if isinstance(sample, list) and len(sample) == 2:
                    sample[1] = value
    return json.dumps(doc).encode()


@dataclass(frozen=True)
class Forwarded:
    request: Request
    status: int | None  # the peer's answer (None: it failed to answer)
    fault: str  # mode of the fault applied to this request, "" if none


class FaultProxy:
    """One proxy per peer. `arm()` faults, `clear()` them, read `forwarded` / `seen`."""

    def __init__(self, upstream: str, name: str = "") -> None:
        parts = urlsplit(upstream)
        self.name = name or upstream
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.upstream_prefix = parts.path.rstrip("/")
        self.faults: list[Fault] = []
        self.seen: list[Request] = []
        self.forwarded: list[Forwarded] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # ------------------------------------------------------------------ test API
    def arm(self, mode: str, when: Predicate = any_request, **kwargs) -> Fault:
        fault = Fault(mode, when, **kwargs)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def reset(self) -> None:
        with self._lock:
            self.faults.clear()
            self.seen.clear()
            self.forwarded.clear()

    def reached(self, pred: Predicate = any_request) -> list[Forwarded]:
        """Requests the peer really received (and so may have acted on)."""
        with self._lock:
            return [f for f in self.forwarded if pred(f.request)]

    def stops_reached(self) -> dict[str, int]:
        """StopInstances/TerminateInstances that reached moto, per instance id."""
        counts: dict[str, int] = {}
        for f in self.reached(aws_action("StopInstances", "TerminateInstances")):
            for iid in f.request.instance_ids:
                counts[iid] = counts.get(iid, 0) + 1
        return counts

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_ProxyHandler):
            pass

        Handler.proxy = proxy
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fault-proxy-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    # ------------------------------------------------------------------ internals
    def _admit(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[Request, Fault | None]:
        with self._lock:
            self._seq += 1
            req = Request(self._seq, method, path, headers, body, time.monotonic())
            self.seen.append(req)
            fault = next((f for f in self.faults if f.take(req)), None)
        return req, fault

    def _forward(self, req: Request) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
        try:
            headers = {k: v for k, v in req.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(req.body))
            conn.request(req.method, self.upstream_prefix + req.path, body=req.body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            return resp.status, out_headers, data
        finally:
            conn.close()

    def _record(self, req: Request, status: int | None, fault: Fault | None) -> None:
        with self._lock:
            self.forwarded.append(Forwarded(req, status, fault.mode if fault else ""))


class _ProxyHandler(BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _reset(self) -> None:
        """Close with RST (SO_LINGER 0): the client sees 'connection reset by peer'."""
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close_connection = True
        try:
            self.connection.close()
        except OSError:
            pass

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes, *, cut: bool = False) -> None:
        try:
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            if cut:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[: len(body) // 2] if cut else body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        if cut:
            self.close_connection = True

    def _handle(self) -> None:
        proxy = self.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        req, fault = proxy._admit(self.command, self.path, dict(self.headers.items()), body)
        mode = fault.mode if fault else ""

        if mode == "hook" and not fault.after:
            fault.hook(req)  # e.g. kill -9 the client: the request never reaches the peer
            if not fault.forward:
                self._reset()
                return
        if mode == "refuse":
            self._reset()
            return
        if mode == "status":
            headers = [("Content-Type", "text/html; charset=utf-8")] + list(fault.headers.items())
            self._answer(fault.status, headers, fault.body or b"<html><body>fault proxy</body></html>")
            return
        if mode == "aws_error":
            self._answer(fault.status, [("Content-Type", "text/xml")], fault.body)
            return
        if mode == "delay":
            time.sleep(fault.seconds)

        try:
            status, headers, data = proxy._forward(req)
        except OSError:
            proxy._record(req, None, fault)
            self._answer(502, [("Content-Type", "text/plain")], b"fault proxy: upstream unreachable")
            return
        proxy._record(req, status, fault)

        if mode == "hook" and fault.after:
            fault.hook(req)
            if not fault.forward:
                self._reset()
                return
        if mode == "lost":
            if fault.as_reset:
                self._reset()
            else:
                self._answer(500, [("Content-Type", "text/html; charset=utf-8")],
                             b"<html><body>internal error (the answer was lost)</body></html>")
            return
        if mode == "late":
            time.sleep(fault.seconds)
        if mode == "rewrite" and fault.transform is not None:
            data = fault.transform(data)
        self._answer(status, headers, data, cut=(mode == "cut"))
