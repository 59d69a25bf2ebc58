"""The tiny HTTP endpoint both long-running processes expose: /metrics, liveness and readiness.

/livez (and /healthz, its old name, kept for existing probes) answers liveness: the process works and
a restart could help if not. /readyz answers readiness: every data source answered the last tick.
"""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger("gpufinops.httpd")


def metrics_and_health_server(address: str, port: int, metrics_body: Callable[[], bytes],
                              healthy: Callable[[], tuple[bool, str]],
                              ready: Callable[[], tuple[bool, str]] | None = None) -> ThreadingHTTPServer:
    """/metrics answers `metrics_body()`; /livez and /healthz answer 200 or 503 with `healthy()`'s reason,
    /readyz with `ready()`'s (or `healthy()`'s when there is no separate readiness)."""
    probes = {"/livez": healthy, "/healthz": healthy, "/readyz": ready or healthy}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/metrics":
                body, ctype, code = metrics_body(), CONTENT_TYPE_LATEST, 200
            elif path in probes:
                ok, why = probes[path]()
                body, ctype, code = why.encode(), "text/plain; charset=utf-8", 200 if ok else 503
            else:
                body, ctype, code = b"not found\n", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:
            log.debug("http: " + fmt, *args)

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    return server
