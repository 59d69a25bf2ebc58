"""What a person sees when `prometheus.url` is wrong (issue 40, item 5): a URL without a scheme is a config error
naming the key (exit 2); a server that is not Prometheus is named as such; a wrong path on a real Prometheus says
404 and where the API lives, never a Python bytes repr; the failed source is said once, on stderr."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufinops.cli import main

HOSTS = """hosts:
  inventory:
    - {hostname: gpu-box-1, gpu_count: 1, gpu_model: A10G}
"""


def config(tmp_path, url: str) -> str:
    path = tmp_path / "gpufinops.yaml"
    path.write_text(f"database_url: sqlite:///{tmp_path / 'g.db'}\nslack: {{outbox_path: {tmp_path / 'o.jsonl'}}}\n"
                    f"prometheus:\n  url: {url}\n  timeout_s: 5\n" + HOSTS)
    return str(path)


def evaluate(capsys, cfg: str) -> tuple[int, str, str]:
    code = main(["--config", cfg, "--log-level", "ERROR", "evaluate"])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def web_page():
    """A web server that is not Prometheus: every path answers 200 with an HTML page (a Grafana, a login page)."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = b"<!doctype html><html><head><title>Grafana</title></head><body>Sign in</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_url_without_a_scheme_is_a_config_error_naming_the_key(tmp_path, capsys):
    code, out, err = evaluate(capsys, config(tmp_path, "127.0.0.1:9095"))
    assert code == 2 and out == ""
    assert err.strip().endswith("key 'prometheus.url': Value error, '127.0.0.1:9095' is not an http:// or "
                                "https:// URL with a host")
    assert "InvalidURL" not in err


def test_a_server_that_is_not_prometheus_is_named_so_once_on_stderr(tmp_path, capsys, web_page):
    code, out, err = evaluate(capsys, config(tmp_path, web_page))
    port = web_page.rsplit(":", 1)[1]
    assert code == 1 and "error:" not in out and "malformed answer" not in out + err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line == (f"error: prometheus: 2 of 2 judgements without metrics: metrics unavailable: prometheus at "
                    f"127.0.0.1:{port}: this is not a Prometheus API: /api/v1/query answered 200 with an HTML page "
                    f"(Grafana Sign in): check prometheus.url")


@pytest.mark.integration
def test_a_wrong_path_on_a_real_prometheus_says_404_and_where_the_api_is(tmp_path, capsys, prometheus_factory):
    prom = prometheus_factory([])
    code, out, err = evaluate(capsys, config(tmp_path, f"{prom.url}/prometheus"))
    assert code == 1 and "error:" not in out and "b'" not in out + err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.endswith(": HTTP 404 for /api/v1/query: no Prometheus API there; prometheus.url is the server's "
                         "base URL (e.g. http://prometheus:9090, or the path prefix it is served under)")
