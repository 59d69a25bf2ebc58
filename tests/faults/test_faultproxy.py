"""The fault proxy itself, in front of a tiny echo server: each mode does what the matrix relies on."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import urlencode

import pytest

from tests.faults.faultproxy import (
    DCGM_SENTINEL,
    FaultProxy,
    aws_action,
    aws_error_body,
    sentinel_values,
    slack_method,
)


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    received: ClassVar[list[bytes]] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Echo.received.append(body)
        data = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                         "result": [{"metric": {}, "value": [1, "3.5"]}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST


@pytest.fixture
def proxy():
    Echo.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    p = FaultProxy(f"http://127.0.0.1:{server.server_address[1]}", "echo").start()
    yield p
    p.stop()
    server.shutdown()
    server.server_close()


def post(proxy: FaultProxy, path: str, form: dict, timeout: float = 5.0) -> tuple[int, bytes]:
    host, port = proxy.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, body=urlencode(form), headers={"Content-Type": "application/x-www-form-urlencoded"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


STOP = {"Action": "StopInstances", "InstanceId.1": "i-0abc"}


def test_untouched_requests_are_forwarded_and_recorded(proxy):
    assert post(proxy, "/", STOP)[0] == 200
    assert proxy.stops_reached() == {"i-0abc": 1}
    assert proxy.reached(aws_action("StopInstances"))[0].request.instance_ids == ["i-0abc"]


def test_aws_error_is_answered_without_forwarding(proxy):
    proxy.arm("aws_error", aws_action("StopInstances"), status=503, body=aws_error_body("RequestLimitExceeded"))
    status, body = post(proxy, "/", STOP)
    assert status == 503 and b"<Code>RequestLimitExceeded</Code>" in body
    assert proxy.stops_reached() == {} and Echo.received == []


def test_lost_answer_is_forwarded_then_500(proxy):
    proxy.arm("lost", aws_action("StopInstances"), times=1)
    assert post(proxy, "/", STOP)[0] == 500
    assert proxy.stops_reached() == {"i-0abc": 1} and len(Echo.received) == 1
    assert post(proxy, "/", STOP)[0] == 200  # times=1: the next one passes


def test_refuse_and_lost_reset_reset_the_connection(proxy):
    proxy.arm("refuse", aws_action("DescribeInstances"))
    proxy.arm("lost", aws_action("StopInstances"), as_reset=True)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        post(proxy, "/", {"Action": "DescribeInstances"})
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        post(proxy, "/", STOP)
    assert proxy.stops_reached() == {"i-0abc": 1}  # the reset came after forwarding


def test_cut_body_and_rewrite(proxy):
    proxy.arm("cut", slack_method("chat.postMessage"), times=1)
    with pytest.raises(http.client.IncompleteRead):
        post(proxy, "/api/chat.postMessage", {"text": "x"})
    proxy.arm("rewrite", transform=sentinel_values)
    answer = json.loads(post(proxy, "/api/v1/query", {"query": "up"})[1])
    assert answer["data"]["result"][0]["value"][1] == str(DCGM_SENTINEL)


def test_late_answer_times_the_client_out_after_forwarding(proxy):
    proxy.arm("late", seconds=1.0, times=1)
    with pytest.raises(TimeoutError):
        post(proxy, "/", STOP, timeout=0.3)
    assert proxy.stops_reached() == {"i-0abc": 1}


def test_hook_runs_before_forwarding_and_skip_counts(proxy):
    seen = []
    proxy.arm("hook", aws_action("StopInstances"), skip=1, times=1, hook=lambda req: seen.append(req.seq))
    assert post(proxy, "/", STOP)[0] == 200  # skipped: the first match passes
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        post(proxy, "/", STOP)
    assert seen == [2] and proxy.stops_reached() == {"i-0abc": 1}
