"""pytest plugin: a real moto server on 127.0.0.1 and a small AWS test helper.

Tests talk to it with real boto3 clients over HTTP, exactly as the service
talks to AWS; nothing is patched inside boto3.

    def test_x(aws):
        ids = aws.launch("p4d.24xlarge", tags={"team": "ml"})
        ec2 = aws.client("ec2")

One server per pytest session (starting one costs about a second); each test
gets a clean state through moto's reset endpoint.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from botocore.config import Config

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
}

# AMI id per (endpoint, region): moto's default AMIs have fixed ids and survive resets.
_AMI_CACHE: dict[tuple[str, str], str] = {}


class AwsTestEnv:
    """Handle on the moto server for one test."""

    def __init__(self, endpoint_url: str) -> None:
        self.endpoint_url = endpoint_url
        self._clients: dict[tuple[str, str], object] = {}

    def client(self, service: str, region: str = "us-east-1"):
        key = (service, region)
        if key not in self._clients:
            self._clients[key] = boto3.session.Session(
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
                aws_session_token="testing",
                region_name=region,
            ).client(
                service,
                endpoint_url=self.endpoint_url,
                config=Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30),
            )
        return self._clients[key]

    def ami(self, region: str = "us-east-1") -> str:
        """An AMI id that moto accepts in `region` (moto's default AMIs survive resets)."""
        key = (self.endpoint_url, region)
        if key not in _AMI_CACHE:
            images = self.client("ec2", region).describe_images(
                Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}]
            )["Images"]
            if not images:  # pragma: no cover - moto always ships default AMIs
                raise RuntimeError(f"moto has no AMI in {region}")
            _AMI_CACHE[key] = sorted(i["ImageId"] for i in images)[0]
        return _AMI_CACHE[key]

    def launch(
        self,
        instance_type: str,
        *,
        region: str = "us-east-1",
        tags: dict[str, str] | None = None,
        spot: bool = False,
        count: int = 1,
        private_ip: str | None = None,
    ) -> list[str]:
        """run_instances in moto; returns the new instance ids (state 'running')."""
        if private_ip is not None and count != 1:
            raise ValueError("private_ip only makes sense with count=1")
        kwargs: dict = {
            "ImageId": self.ami(region),
            "InstanceType": instance_type,
            "MinCount": count,
            "MaxCount": count,
        }
        if tags:
            kwargs["TagSpecifications"] = [
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
            ]
        if spot:
            kwargs["InstanceMarketOptions"] = {"MarketType": "spot"}
        if private_ip is not None:
            kwargs["PrivateIpAddress"] = private_ip
        resp = self.client("ec2", region).run_instances(**kwargs)
        return [i["InstanceId"] for i in resp["Instances"]]

    def launch_asg(
        self,
        name: str,
        instance_type: str = "g5.xlarge",
        *,
        count: int = 2,
        region: str = "us-east-1",
        tags: dict[str, str] | None = None,
    ) -> list[str]:
        """A real Auto Scaling group in moto (launch template + group of `count`); its instance ids."""
        ec2 = self.client("ec2", region)
        template = f"{name}-lt"
        ec2.create_launch_template(LaunchTemplateName=template,
                                   LaunchTemplateData={"ImageId": self.ami(region), "InstanceType": instance_type})
        asg = self.client("autoscaling", region)
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name,
            LaunchTemplate={"LaunchTemplateName": template, "Version": "$Latest"},
            MinSize=count, MaxSize=count, DesiredCapacity=count,
            AvailabilityZones=[f"{region}a"],
            Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True} for k, v in (tags or {}).items()],
        )
        groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
        return sorted(i["InstanceId"] for i in groups[0]["Instances"])

    def request_spot(self, instance_type: str = "g5.xlarge", *, request_type: str = "one-time",
                     region: str = "us-east-1", tags: dict[str, str] | None = None) -> tuple[str, str]:
        """A fulfilled spot request (RequestSpotInstances, Type one-time | persistent): (request id, instance id)."""
        kwargs: dict = {"InstanceCount": 1, "Type": request_type,
                        "LaunchSpecification": {"ImageId": self.ami(region), "InstanceType": instance_type}}
        if tags:
            kwargs["TagSpecifications"] = [{"ResourceType": "spot-instances-request",
                                            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
        ec2 = self.client("ec2", region)
        (req,) = ec2.request_spot_instances(**kwargs)["SpotInstanceRequests"]
        (req,) = ec2.describe_spot_instance_requests(SpotInstanceRequestIds=[req["SpotInstanceRequestId"]])[
            "SpotInstanceRequests"]
        return req["SpotInstanceRequestId"], req["InstanceId"]

    def reset(self) -> None:
        """Drop every resource in every service (POST /moto-api/reset)."""
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()

    def state(self, instance_id: str, region: str = "us-east-1") -> str:
        """Current state name of one instance, as EC2 reports it."""
        resp = self.client("ec2", region).describe_instances(InstanceIds=[instance_id])
        return resp["Reservations"][0]["Instances"][0]["State"]["Name"]

    def tags(self, instance_id: str, region: str = "us-east-1") -> dict[str, str]:
        resp = self.client("ec2", region).describe_instances(InstanceIds=[instance_id])
        return {t["Key"]: t["Value"] for t in resp["Reservations"][0]["Instances"][0].get("Tags", [])}

    def set_cost_and_usage(self, results: list[dict]) -> None:
        """Queue canned Cost Explorer GetCostAndUsage answers (moto's ce results API).

        Each item is one ResultsByTime-shaped response body, returned in order.
        """
        body = json.dumps({"results": results}).encode()
        req = urllib.request.Request(
            f"{self.endpoint_url}/moto-api/static/ce/cost-and-usage-results",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of the moto server that counts every request by its
    Action and plays faults on chosen actions, to see what the client does with a lost answer.

        proxy.fail("StopInstances", Fault.error(500, "InternalError", forward=True))  # EC2 did it, said 500
        proxy.fail("StopInstances", Fault.reset())      # did it, then the connection dropped
        proxy.fail("DescribeInstances", Fault.error(503, "RequestLimitExceeded"), times=2)

    A fault with forward=True first passes the request to moto (the change really happens), then
    answers with the fault; forward=False refuses it without telling moto.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: Counter = Counter()
        self._faults: dict[str, list[Fault]] = {}
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                action = (urllib.parse.parse_qs(body.decode("utf-8", "replace")).get("Action") or [""])[0]
                fault = proxy._take(action)
                if fault is None or fault.forward:
                    status, headers, answer = proxy._forward(self.command, self.path, self.headers, body)
                if fault is None:
                    self._answer(status, headers, answer)
                    return
                if fault.delay_s:
                    time.sleep(fault.delay_s)
                if fault.kind == "reset":
                    # Abortive close (RST): the client sent its request and gets no answer.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                if fault.kind == "garbage":
                    self._answer(200, {"Content-Type": "text/xml"}, b"<<< not xml")
                    return
                if fault.kind == "hang":  # answer late (after the client's read timeout)
                    self._answer(status, headers, answer)
                    return
                self._answer(fault.status, {"Content-Type": "text/xml"}, _error_xml(action, fault.code))

            do_GET = do_POST

            def _answer(self, status: int, headers: dict, body: bytes) -> None:
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (read timeout)
                    self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail(self, action: str, fault: "Fault", times: int = 1) -> None:
        """Play `fault` on the next `times` requests of `action`."""
        with self._lock:
            self._faults.setdefault(action, []).extend([fault] * times)

    def _take(self, action: str) -> "Fault | None":
        with self._lock:
            self.requests[action] += 1
            queue = self._faults.get(action)
            return queue.pop(0) if queue else None

    def _forward(self, method: str, path: str, headers, body: bytes) -> tuple[int, dict, bytes]:
        req = urllib.request.Request(self.upstream + path, data=body if method == "POST" else None, method=method,
                                     headers={k: v for k, v in headers.items() if k.lower() != "host"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, dict(resp.headers.items()), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers.items()), err.read()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass(frozen=True)
class Fault:
    kind: str  # error | reset | garbage | hang
    status: int = 500
    code: str = "InternalError"
    forward: bool = True
    delay_s: float = 0.0

    @classmethod
    def error(cls, status: int, code: str, *, forward: bool = False) -> "Fault":
        return cls("error", status, code, forward)

    @classmethod
    def reset(cls, *, forward: bool = True) -> "Fault":
        return cls("reset", forward=forward)

    @classmethod
    def garbage(cls) -> "Fault":
        return cls("garbage")

    @classmethod
    def hang(cls, seconds: float) -> "Fault":
        return cls("hang", delay_s=seconds)


def _error_xml(action: str, code: str) -> bytes:
    message = f"injected {code} for {action}"
    if "AutoScaling" in action:  # the query protocol's error shape
        return (f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message>"
                f"</Error><RequestId>fault</RequestId></ErrorResponse>").encode()
    return (f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
            f"<RequestID>fault</RequestID></Response>").encode()


@pytest.fixture
def fault_proxy(aws):
    """A FaultProxy in front of this test's moto server (set its endpoint_url as the AWS endpoint)."""
    proxy = FaultProxy(aws.endpoint_url)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture(scope="session")
def moto_server():
    """Base URL of a moto server on 127.0.0.1 (a free port chosen by the OS)."""
    from moto.server import ThreadedMotoServer

    # One INFO line per request would bury the failing test's own log.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def aws(moto_server, monkeypatch) -> AwsTestEnv:
    """Clean moto state, fake credentials in the environment, and helpers."""
    for key, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # No stray profile or config file may point a test at a real account.
    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    env = AwsTestEnv(moto_server)
    env.reset()
    return env
