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
import urllib.request

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
