"""The tiny HTTP endpoint both long-running processes expose, the service (run/service.py) and the host agent
(agent/exporter.py): /metrics, liveness and readiness, the service's read-only GET routes (the idleness API at
/v1/verdicts, run/api.py; the agent's /v1/verdict, agent/verdict_api.py) and its POST routes (Slack button clicks
at /slack/actions, notify/interact.py). It stands on the ground floor, beside procs.py, so that the agent does not
import the service's run/: it imports only the standard library, prometheus_client, and model for a type.

/livez (and /healthz, its old name, kept for existing probes) answers liveness: the process works and
a restart could help if not. /readyz answers readiness: every data source answered the last tick.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from dataclasses import dataclass
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Callable, Mapping

from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from .model import Decision

log = logging.getLogger("gpufinops.httpd")

MAX_POST_BYTES = 64 * 1024  # a Slack interaction payload is a few KB
PostHandler = Callable[[Mapping[str, str], bytes], tuple[int, str]]
# GET routes beyond /metrics and the probes: handler(headers, query string, client address) -> (status,
# content type, body). The client address is the socket's peer, never a forwarded header.
GetHandler = Callable[[Mapping[str, str], str, str], tuple[int, str, bytes]]

JSON = "application/json"


# Access to the read-only JSON routes, shared by the service's /v1/verdicts (run/api.py) and the agent's
# /v1/verdict (agent/verdict_api.py): a bearer token when one is set, else loopback clients only.


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict

    def encoded(self) -> tuple[int, str, bytes]:
        return self.status, JSON, (json.dumps(self.body, indent=1) + "\n").encode()


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def authorize(headers: Mapping[str, str], client: str, token: str | None,
              token_name: str = "api.bearer_token") -> Answer | None:
    """None when the request may be answered; else the refusal. The token itself is never echoed or logged.

    `token`: None when none is configured (loopback clients only); a blank one ("": a variable or file set but
    empty, or a file that cannot be read) answers nobody, 503: it is a broken secret, never an open door (an empty
    `Authorization: Bearer` would match it)."""
    if token is None:
        if is_loopback(client):
            return None
        return Answer(403, {"error": f"no {token_name} is configured: only loopback clients are answered"})
    if not token.strip():
        return Answer(503, {"error": f"{token_name} is set but blank or cannot be read: nobody is answered"})
    sent = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    scheme, _, value = sent.partition(" ")
    if scheme.lower() == "bearer" and value.strip() and hmac.compare_digest(value.strip().encode(), token.encode()):
        return None
    return Answer(401, {"error": "missing or wrong bearer token"})


def figures(d: Decision) -> dict:
    return {"window_s": d.window_s, "activity_mean": d.activity_mean, "activity_max": d.activity_max,
            "memory_max_mib": d.memory_max_mib, "coverage": d.coverage, "activity_signal": d.activity_signal}


def _reply(handler: BaseHTTPRequestHandler, code: int, ctype: str, body: bytes) -> None:
    handler.send_response(code)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def metrics_and_health_server(address: str, port: int, metrics_body: Callable[[], bytes],
                              healthy: Callable[[], tuple[bool, str]],
                              ready: Callable[[], tuple[bool, str]] | None = None,
                              post: Mapping[str, PostHandler] | None = None,
                              get: Mapping[str, GetHandler] | None = None) -> ThreadingHTTPServer:
    """/metrics answers `metrics_body()`; `get`: path -> GetHandler for read-only routes (/v1/verdicts); /livez and /healthz answer 200 or 503 with `healthy()`'s reason,
    /readyz with `ready()`'s (or `healthy()`'s when there is no separate readiness). `post`: path ->
    handler(headers, raw body) -> (status, text), for bodies up to MAX_POST_BYTES."""
    probes = {"/livez": healthy, "/healthz": healthy, "/readyz": ready or healthy}
    posts = dict(post or {})
    gets = dict(get or {})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            path, _, query = self.path.partition("?")
            path = path.rstrip("/")
            if path == "/metrics":
                body, ctype, code = metrics_body(), CONTENT_TYPE_LATEST, 200
            elif path in gets:
                try:
                    code, ctype, body = gets[path]({k: v for k, v in self.headers.items()}, query,
                                                   self.client_address[0])
                except Exception:  # noqa: BLE001 - one bad request must not take the endpoint down
                    log.exception("GET %s failed", path)
                    body, ctype, code = b"internal error\n", "text/plain", 500
            elif path in probes:
                ok, why = probes[path]()
                body, ctype, code = why.encode(), "text/plain; charset=utf-8", 200 if ok else 503
            else:
                body, ctype, code = b"not found\n", "text/plain", 404
            _reply(self, code, ctype, body)

        def do_POST(self) -> None:  # noqa: N802 - http.server API
            path = self.path.split("?", 1)[0].rstrip("/")
            handler = posts.get(path)
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if handler is None:
                code, text = 404, "not found"
            elif not 0 <= length <= MAX_POST_BYTES:
                code, text = 413, "body too large"
            else:
                raw = self.rfile.read(length)
                try:
                    code, text = handler({k: v for k, v in self.headers.items()}, raw)
                except Exception:  # noqa: BLE001 - one bad request must not take the endpoint down
                    log.exception("POST %s failed", path)
                    code, text = 500, "internal error"
            _reply(self, code, "text/plain; charset=utf-8", (text + "\n").encode())

        def log_message(self, fmt: str, *args) -> None:
            log.debug("http: " + fmt, *args)

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    return server


def mutual_tls_context(cert_file: str, key_file: str, client_ca_file: str) -> ssl.SSLContext:
    """A server context that requires a client certificate signed by `client_ca_file` (TLS 1.2 or newer); the
    files of `api.tls` (config.ApiTlsSettings), PEM."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    context.load_verify_locations(cafile=client_ca_file)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


_SUBJECT_NAMES = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU"}


def certificate_subject(cert: dict | None) -> str:
    """The verified client certificate's subject as "CN=…, O=…" (for the log line of each answer)."""
    parts = [f"{_SUBJECT_NAMES[k]}={v}" for rdn in (cert or {}).get("subject", ()) for k, v in rdn
             if k in _SUBJECT_NAMES]
    return ", ".join(parts) or "(no subject)"


def mutual_tls_server(address: str, port: int, get: Mapping[str, GetHandler],
                      context: ssl.SSLContext) -> ThreadingHTTPServer:
    """The read-only GET routes (`get`) over mutual TLS. The handshake runs in the request's own thread (a slow
    or silent client never holds up the others) and must present a certificate the context accepts; a client
    without one is dropped in the handshake with one log line, never a traceback. Each handler gets, as its
    client, "tls:" + the peer's address + the verified certificate's subject."""
    gets = dict(get)

    class Handler(BaseHTTPRequestHandler):
        timeout = 30  # a connection that never finishes its handshake or request is closed

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            path, _, query = self.path.partition("?")
            handler = gets.get(path.rstrip("/"))
            client = f"tls:{self.client_address[0]} {certificate_subject(self.connection.getpeercert())}"
            if handler is None:
                code, ctype, body = 404, "text/plain", b"not found\n"
            else:
                try:
                    code, ctype, body = handler({k: v for k, v in self.headers.items()}, query, client)
                except Exception:  # noqa: BLE001 - one bad request must not take the endpoint down
                    log.exception("GET %s (mutual TLS) failed", path)
                    code, ctype, body = 500, "text/plain", b"internal error\n"
            _reply(self, code, ctype, body)

        def log_message(self, fmt: str, *args) -> None:
            log.debug("https: " + fmt, *args)

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self):
            sock, addr = self.socket.accept()
            return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

        def handle_error(self, request, client_address) -> None:
            exc = sys.exc_info()[1]
            log.warning("api (mutual TLS): refused %s: %s", client_address[0], str(exc)[:200] or type(exc).__name__)

    return Server((address, port), Handler)
