"""The fault proxy itself, in front of a tiny echo server: each mode does what the matrix relies on; and its IAM
mode in front of the real moto server (the shipped policy decides StopInstances and tag writes)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlencode

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

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


# ---------------------------------------------------------------------- IAM mode, in front of the real moto server

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OPTED_IN_AND_MARKED = {"gpufinops:allow-stop": "true", "gpufinops:marked-for-stop": "2026-01-01T00:00:00Z"}


@pytest.fixture
def iam_moto(aws):
    """(proxy enforcing the shipped policies in front of moto, a client factory through it)."""
    p = FaultProxy(aws.endpoint_url, "moto-iam").start()
    p.enforce_iam(DEPLOY / "iam-policy.json", DEPLOY / "iam-policy-terminate.json")

    def client(region: str = "us-east-1"):
        return boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                     aws_session_token="testing", region_name=region).client(
            "ec2", endpoint_url=p.url, config=Config(retries={"total_max_attempts": 1}, read_timeout=30))

    yield p, client
    p.stop()


def _unauthorized(call) -> ClientError:
    with pytest.raises(ClientError) as caught:
        call()
    err = caught.value.response
    assert err["Error"]["Code"] == "UnauthorizedOperation" and err["ResponseMetadata"]["HTTPStatusCode"] == 403
    return caught.value


def test_iam_denies_a_stop_of_an_instance_not_opted_in_and_moto_never_sees_it(aws, iam_moto):
    proxy, client = iam_moto
    (iid,) = aws.launch("g5.xlarge", tags={"gpufinops:marked-for-stop": "2026-01-01T00:00:00Z"})
    _unauthorized(lambda: client().stop_instances(InstanceIds=[iid], Force=False, Hibernate=False))
    assert aws.state(iid) == "running" and proxy.stops_reached() == {}
    (denial,) = proxy.iam_denials()
    assert (denial.action, denial.instance_id, denial.decision.effect) == ("ec2:StopInstances", iid, "implicit deny")
    assert denial.resource_tags == {"gpufinops:marked-for-stop": "2026-01-01T00:00:00Z"}
    assert client().describe_instances(InstanceIds=[iid])["Reservations"]  # reads pass


def test_iam_allows_the_stop_of_an_opted_in_marked_instance_in_the_requests_region(aws, iam_moto):
    proxy, client = iam_moto
    (east,) = aws.launch("g5.xlarge", tags=OPTED_IN_AND_MARKED)
    (west,) = aws.launch("g5.xlarge", region="eu-west-1", tags=OPTED_IN_AND_MARKED)
    client("eu-west-1").stop_instances(InstanceIds=[west], Force=False, Hibernate=False)
    client().terminate_instances(InstanceIds=[east])
    assert aws.state(west, "eu-west-1") in ("stopping", "stopped") and aws.state(east) in ("shutting-down", "terminated")
    assert proxy.stops_reached() == {west: 1, east: 1} and proxy.iam_denials() == []


def test_iam_protect_is_an_explicit_deny_and_one_denied_instance_refuses_the_whole_request(aws, iam_moto):
    proxy, client = iam_moto
    (free,) = aws.launch("g5.xlarge", tags=OPTED_IN_AND_MARKED)
    (kept,) = aws.launch("g5.xlarge", tags={**OPTED_IN_AND_MARKED, "gpufinops:protect": "yes"})
    _unauthorized(lambda: client().stop_instances(InstanceIds=[free, kept]))
    assert aws.state(free) == aws.state(kept) == "running" and proxy.stops_reached() == {}
    (denial,) = proxy.iam_denials()
    assert denial.instance_id == kept and denial.decision.effect == "Deny"
    assert denial.decision.statements == ("NeverTouchProtectedInstances",)


def test_iam_evaluates_a_delayed_stop_when_it_arrives_not_when_it_was_sent(aws, iam_moto):
    """The fence: the mark is removed while the stop is in flight, so AWS refuses it on arrival."""
    proxy, client = iam_moto
    (iid,) = aws.launch("g5.xlarge", tags=OPTED_IN_AND_MARKED)
    ec2 = client()
    proxy.arm("delay", aws_action("StopInstances"), seconds=2.0, times=1)
    outcome: list[BaseException | dict] = []

    def stop() -> None:
        try:
            outcome.append(ec2.stop_instances(InstanceIds=[iid], Force=False, Hibernate=False))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    sender = threading.Thread(target=stop)
    sender.start()
    deadline = time.monotonic() + 10
    while not any(r.aws_action == "StopInstances" for r in proxy.seen):  # the stop is in flight
        assert time.monotonic() < deadline, "the stop never reached the proxy"
        time.sleep(0.02)
    aws.client("ec2").delete_tags(Resources=[iid], Tags=[{"Key": "gpufinops:marked-for-stop"}])  # a person cancels
    sender.join(timeout=20)
    (result,) = outcome
    assert isinstance(result, ClientError) and result.response["Error"]["Code"] == "UnauthorizedOperation"
    assert aws.state(iid) == "running" and proxy.stops_reached() == {}
    (denial,) = proxy.iam_denials()
    assert "gpufinops:marked-for-stop" not in denial.resource_tags and denial.decision.effect == "implicit deny"


def test_iam_tag_writes_snooze_may_be_created_never_deleted_protect_never_written(aws, iam_moto):
    proxy, client = iam_moto
    (iid,) = aws.launch("g5.xlarge", tags={"gpufinops:allow-stop": "true"})
    ec2 = client()
    ec2.create_tags(Resources=[iid], Tags=[{"Key": "gpufinops:snooze-until", "Value": "2026-01-02T09:00:00Z"}])
    ec2.create_tags(Resources=[iid], Tags=[{"Key": "gpufinops:marked-for-stop", "Value": "x"}])
    ec2.delete_tags(Resources=[iid], Tags=[{"Key": "gpufinops:marked-for-stop"}])
    _unauthorized(lambda: ec2.delete_tags(Resources=[iid], Tags=[{"Key": "gpufinops:snooze-until"}]))
    _unauthorized(lambda: ec2.create_tags(Resources=[iid], Tags=[{"Key": "gpufinops:protect", "Value": "false"}]))
    _unauthorized(lambda: ec2.delete_tags(Resources=[iid], Tags=[{"Key": "gpufinops:allow-stop"}]))
    _unauthorized(lambda: ec2.create_tags(Resources=[iid], Tags=[{"Key": "team", "Value": "ml"}]))
    assert aws.tags(iid) == {"gpufinops:allow-stop": "true", "gpufinops:snooze-until": "2026-01-02T09:00:00Z"}
    denied = [(d.action, tuple(d.request_tags or ()), d.decision.effect) for d in proxy.iam_denials()]
    assert denied == [("ec2:DeleteTags", ("gpufinops:snooze-until",), "Deny"),
                      ("ec2:CreateTags", ("gpufinops:protect",), "Deny"),
                      ("ec2:DeleteTags", ("gpufinops:allow-stop",), "Deny"),
                      ("ec2:CreateTags", ("team",), "implicit deny")]
    assert len(proxy.reached(aws_action("CreateTags", "DeleteTags"))) == 3  # only the allowed ones reached moto


def test_iam_off_by_default_and_a_lost_answer_still_applies_to_a_denial(aws, iam_moto):
    proxy, client = iam_moto
    (iid,) = aws.launch("g5.xlarge")
    proxy.arm("lost", aws_action("StopInstances"), times=1)
    with pytest.raises(ClientError) as caught:  # denied, and the 403 was lost on the way back: a 500
        client().stop_instances(InstanceIds=[iid])
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert aws.state(iid) == "running" and len(proxy.iam_denials()) == 1
    proxy.enforce_iam()  # off: moto decides alone, as before this mode existed
    client().stop_instances(InstanceIds=[iid])
    assert aws.state(iid) in ("stopping", "stopped") and proxy.stops_reached() == {iid: 1}


def test_iam_mode_refuses_a_policy_it_cannot_evaluate(tmp_path, iam_moto):
    proxy, _ = iam_moto
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ec2:StopInstances", "Resource": "*",
                                                      "Condition": {"StringEquals": {"aws:PrincipalTag/t": "x"}}}]}
    (tmp_path / "p.json").write_text(json.dumps(policy))
    with pytest.raises(ValueError, match="aws:PrincipalTag/t"):
        proxy.enforce_iam(tmp_path / "p.json")
