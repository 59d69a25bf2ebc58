"""A fault-injecting HTTP proxy on 127.0.0.1, put in front of a real peer (Prometheus, moto, the Slack stub).

The service under test is pointed at the proxy instead of the peer. Each request is read in full,
described as a `Request` (path, AWS `Action=` from the form body, Slack method, a per-proxy sequence
number) and matched against the armed `Fault`s in order; the first one whose predicate holds (and
that has uses left) decides what happens:

    refuse        reset the connection without forwarding (the peer never sees it)
    delay         wait `seconds`, then forward and answer normally (client read timeouts)
    status        answer `status` (5xx, 429 + Retry-After, ...) with `body`, without forwarding
    aws_error     answer an AWS XML error (RequestLimitExceeded, UnsupportedOperation, InternalError ...)
    lost          forward (the peer ACTS), then answer `status` (500 by default; `as_reset=False`) or reset the
                  connection
    late          forward, then answer only after `seconds` (the peer acted; the client has given up)
    cut           forward, then send the headers and only half the body, and close
    rewrite       forward, then answer `transform(body)` (e.g. DCGM sentinels in a Prometheus answer)
    strip         forward without the request headers named in `drop` (e.g. If-Match: a store or proxy that
                  ignores a precondition), answer normally; `seen` keeps what the client sent, `forwarded`
                  what reached the peer
    hook          call `hook(request)` (e.g. kill -9 the client), then reset the connection; before
                  forwarding (`after=False`: the peer never sees it) or after (`after=True`: the peer acted)

What reached the peer is recorded (`forwarded`), so a test can count the StopInstances moto really got.

IAM mode (`proxy.enforce_iam("deploy/iam-policy.json", ...)`, in front of moto): moto does not evaluate IAM
conditions, so the proxy does it for the conditioned EC2 actions (StopInstances, TerminateInstances,
CreateTags, DeleteTags) with `iampolicy.py`. At the moment such a request would be forwarded (after any
`delay`: AWS evaluates a request when it arrives, so a stop delayed in flight meets the tags of that moment)
the proxy reads the instances' current tags from moto (a DescribeInstances straight to the upstream, with
the request's own Host and Authorization headers, so the region and account are the request's), evaluates
the policy for every instance of the request, and on any denial answers as EC2 does (HTTP 403,
`UnauthorizedOperation`) without forwarding; `iam_denials()` lists them. Faults applied after forwarding
(`lost`, `late`, `cut`, ...) then apply to that answer. Every other request passes untouched.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import re
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit
from xml.etree import ElementTree

from tests.faults import iampolicy

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
    drop: tuple[str, ...] = ()  # strip: the request headers (any case) not forwarded
    used: int = 0
    # hold: the request waits in the proxy (a paused process, a stuck connection) until `release_held()`, then
    # reaches the peer (through the IAM check, as AWS evaluates at arrival); the client meanwhile times out.
    released: threading.Event = field(default_factory=threading.Event)

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


# The EC2 actions whose shipped-policy statements carry conditions the proxy must evaluate.
IAM_CONDITIONED_ACTIONS = ("StopInstances", "TerminateInstances", "CreateTags", "DeleteTags")


@dataclass(frozen=True)
class IamDenial:
    request: Request
    action: str  # "ec2:StopInstances"
    instance_id: str
    decision: iampolicy.Decision
    resource_tags: dict[str, str]  # the instance's tags in moto when the request arrived
    request_tags: dict[str, str | None] | None  # what the request wrote / removed


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
        # An https upstream (the real kube-apiserver, tests/kapi.py) is reached over TLS without verifying its
        # self-signed certificate: the proxy itself listens in plain http on 127.0.0.1.
        self.upstream_tls = parts.scheme == "https"
        self.upstream_port = parts.port or (443 if self.upstream_tls else 80)
        self.upstream_prefix = parts.path.rstrip("/")
        self.faults: list[Fault] = []
        self.seen: list[Request] = []
        self.forwarded: list[Forwarded] = []
        self._seq = 0
        self._iam_policy: list[dict] | None = None
        self._iam_denials: list[IamDenial] = []
        self._held: list[Fault] = []  # hold faults whose requests still wait (kept through clear())
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
            self._held.extend(f for f in self.faults if f.mode == "hold" and f.used and not f.released.is_set())
            self.faults.clear()

    def reset(self) -> None:
        with self._lock:
            self.faults.clear()
            self.seen.clear()
            self.forwarded.clear()
            self._iam_denials.clear()

    def enforce_iam(self, *policy_paths: str | Path) -> FaultProxy:
        """Evaluate these IAM policy files (attached together) for the conditioned EC2 actions from now on.
        The policy stays on through `clear()`/`reset()`; `enforce_iam()` with no file turns it off."""
        policy = iampolicy.load(*policy_paths) if policy_paths else None
        for action in IAM_CONDITIONED_ACTIONS if policy else ():  # a policy it cannot evaluate fails here, loudly
            iampolicy.evaluate(policy, f"ec2:{action}", iampolicy.instance_arn("i-0"), resource_tags={"k": "v"},
                               request_tags={"k": "v"} if action.endswith("Tags") else None)
        with self._lock:
            self._iam_policy = policy
        return self

    def release_held(self) -> None:
        """Let every request held by a `hold` fault go on to the peer now (a stale request landing late)."""
        with self._lock:
            holds = [f for f in self.faults if f.mode == "hold"] + list(self._held)
            self._held.clear()
        for fault in holds:
            fault.released.set()

    def iam_denials(self, pred: Predicate = any_request) -> list[IamDenial]:
        """The requests the policy refused (never forwarded), one entry per denied instance."""
        with self._lock:
            return [d for d in self._iam_denials if pred(d.request)]

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
        if self.upstream_tls:
            conn = http.client.HTTPSConnection(self.upstream_host, self.upstream_port, timeout=120,
                                               context=ssl._create_unverified_context())
        else:
            conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
        try:
            headers = {k: v for k, v in req.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(req.body))
            conn.request(req.method, self.upstream_prefix + req.path, body=req.body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            # A HEAD's Content-Length is the object's size, not its (empty) body's: it passes through.
            out_headers = [(k, v) for k, v in resp.getheaders()
                           if k.lower() not in _HOP_BY_HOP or (req.method == "HEAD" and k.lower() == "content-length")]
            return resp.status, out_headers, data
        finally:
            conn.close()

    def _iam_check(self, req: Request) -> list[IamDenial]:
        """The denials AWS would answer for this request now (empty: allowed, or not a conditioned action)."""
        with self._lock:
            policy = self._iam_policy
        action = req.aws_action
        if policy is None or action not in IAM_CONDITIONED_ACTIONS:
            return []
        params = req.params
        request_tags: dict[str, str | None] | None = None
        if action in ("CreateTags", "DeleteTags"):
            request_tags = {}
            for k, v in sorted(params.items()):
                m = re.fullmatch(r"Tag\.(\d+)\.Key", k)
                if m:
                    value = params.get(f"Tag.{m.group(1)}.Value")
                    request_tags[v[0]] = value[0] if value else (None if action == "DeleteTags" else "")
        region, current = _credential_region(req.headers), self._describe_tags(req, req.instance_ids)
        denials = []
        for iid in req.instance_ids:
            account, tags = current.get(iid, ("123456789012", {}))
            decision = iampolicy.evaluate(policy, f"ec2:{action}", _ec2_arn(iid, region, account),
                                          resource_tags=tags, request_tags=request_tags)
            if not decision.allowed:
                denials.append(IamDenial(req, f"ec2:{action}", iid, decision, tags, request_tags))
        return denials

    def _describe_tags(self, req: Request, instance_ids: list[str]) -> dict[str, tuple[str, dict[str, str]]]:
        """instance id -> (owner account, current tags), read from the upstream with the request's headers."""
        if not instance_ids:
            return {}
        form = {"Action": "DescribeInstances", "Version": "2016-11-15", "Filter.1.Name": "instance-id"}
        form.update({f"Filter.1.Value.{i}": iid for i, iid in enumerate(instance_ids, 1)})
        body = urlencode(form).encode()
        headers = {k: v for k, v in req.headers.items()
                   if k.lower() in ("host", "authorization", "x-amz-date", "x-amz-security-token", "user-agent")}
        headers["Content-Type"] = "application/x-www-form-urlencoded; charset=utf-8"
        probe = Request(0, "POST", urlsplit(req.path).path or "/", headers, body, time.monotonic())
        status, _, data = self._forward(probe)
        if status != 200:
            raise RuntimeError(f"fault proxy IAM: DescribeInstances answered {status}: {data[:300]!r}")
        out: dict[str, tuple[str, dict[str, str]]] = {}
        root = ElementTree.fromstring(data)
        for reservation in root.iter():
            if _local(reservation.tag) != "item" or reservation.find("./{*}instancesSet") is None:
                continue
            account = reservation.findtext("./{*}ownerId") or "123456789012"
            for inst in reservation.findall("./{*}instancesSet/{*}item"):
                tags = {t.findtext("./{*}key") or "": t.findtext("./{*}value") or ""
                        for t in inst.findall("./{*}tagSet/{*}item")}
                out[inst.findtext("./{*}instanceId") or ""] = (account, tags)
        return out

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

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
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
            if not any(k.lower() == "content-length" for k, _ in headers):
                self.send_header("Content-Length", str(len(body)))
            if cut:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
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
        if mode == "hold":
            fault.released.wait(fault.seconds or 600.0)
        if mode == "strip":
            dropped = {name.lower() for name in fault.drop}
            req = dataclasses.replace(req, headers={k: v for k, v in req.headers.items() if k.lower() not in dropped})

        try:
            denials = proxy._iam_check(req)  # AWS evaluates the policy when the request arrives
        except (OSError, RuntimeError, ValueError, ElementTree.ParseError) as exc:  # ValueError: PolicyError too
            self._answer(500, [("Content-Type", "text/xml")],
                         aws_error_body("InternalError", f"fault proxy could not evaluate IAM: {exc}"))
            return
        if denials:
            with proxy._lock:
                proxy._iam_denials.extend(denials)
            status, headers = 403, [("Content-Type", "text/xml;charset=UTF-8")]
            data = aws_error_body("UnauthorizedOperation", "You are not authorized to perform this operation. "
                                  f"({denials[0].action} on {denials[0].instance_id}: {denials[0].decision.effect})")
        else:
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
            else:  # `status`: 500 unless armed otherwise (a 503 from a load balancer in front)
                self._answer(fault.status, [("Content-Type", "text/html; charset=utf-8")],
                             b"<html><body>internal error (the answer was lost)</body></html>")
            return
        if mode == "late":
            time.sleep(fault.seconds)
        if mode == "rewrite" and fault.transform is not None:
            data = fault.transform(data)
        self._answer(status, headers, data, cut=(mode == "cut"))


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _credential_region(headers: dict[str, str]) -> str:
    """The region of a SigV4 Authorization header's credential scope (us-east-1 without one)."""
    auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    m = re.search(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/", auth)
    return m.group(1) if m else "us-east-1"


def _ec2_arn(resource_id: str, region: str, account: str) -> str:
    kinds = {"i": "instance", "vol": "volume", "snap": "snapshot", "ami": "image", "sg": "security-group"}
    return f"arn:aws:ec2:{region}:{account}:{kinds.get(resource_id.split('-', 1)[0], 'unknown')}/{resource_id}"
