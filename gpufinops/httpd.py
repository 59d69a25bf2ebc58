"""The tiny HTTP endpoint both long-running processes expose: /metrics and /healthz."""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger("gpufinops.httpd")


def metrics_and_health_server(address: str, port: int, metrics_body: Callable[[], bytes],
                              healthy: Callable[[], tuple[bool, str]]) -> ThreadingHTTPServer:
    """/metrics answers `metrics_body()`; /healthz answers 200 or 503 with `healthy()`'s reason."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            if self.path.startswith("/metrics"):
                body, ctype, code = metrics_body(), CONTENT_TYPE_LATEST, 200
            elif self.path.startswith("/healthz"):
                ok, why = healthy()
                body, ctype, code = why.encode(), "text/plain", 200 if ok else 503
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
