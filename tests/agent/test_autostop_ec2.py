"""Local autostop on EC2 and with Slack: a tiny IMDSv2 on 127.0.0.1, the moto server, the Slack stub, the CLI.

The IMDS stub answers only with a session token (PUT /latest/api/token with a TTL header first), as IMDSv2
requires; the EC2 stop goes through a FaultProxy in front of moto that counts requests by action, so "one
StopInstances per intent" is checked on the wire, and moto says whether the instance really stopped.
"""

from __future__ import annotations

import threading
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufinops.agent.autostop.cli import maybe_start_autostop
from gpufinops.agent.autostop.machine import MoveKind
from gpufinops.agent.autostop.settings import load_autostop_settings
from gpufinops.agent.autostop.stopper import imds_identity
from gpufinops.model import TAG_MARKED
from gpufinops.cli.app import build_parser
from tests.agent.test_autostop_loop import Host

TOKEN = "AQAEAtest-token=="
DEPLOY_SYSTEMD = Path(__file__).resolve().parents[2] / "deploy" / "systemd"


class Imds:
    def __init__(self, instance_id: str = "i-0123456789abcdef0", region: str = "us-east-1"):
        self.instance_id, self.region = instance_id, region
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, had a valid token)
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_PUT(self) -> None:
                imds.requests.append(("PUT", self.path, False))
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._answer(400, "")
                self._answer(200, TOKEN)

            def do_GET(self) -> None:
                ok = self.headers.get("X-aws-ec2-metadata-token") == TOKEN
                imds.requests.append(("GET", self.path, ok))
                if not ok:
                    return self._answer(401, "")
                answers = {"/latest/meta-data/instance-id": imds.instance_id,
                           "/latest/meta-data/placement/region": imds.region,
                           "/latest/meta-data/instance-type": "g5.xlarge"}
                if self.path not in answers:
                    return self._answer(404, "")
                self._answer(200, answers[self.path])

            def _answer(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def host(tmp_path, monkeypatch):
    h = Host(tmp_path, monkeypatch)
    yield h
    if h.loop is not None:
        h.loop.buffer.close()


@pytest.fixture
def imds():
    stub = Imds()
    yield stub
    stub.close()


def test_imdsv2_identity_needs_the_token_and_no_imds_is_not_ec2(imds):
    ident = imds_identity(imds.url)
    assert (ident.instance_id, ident.region, ident.instance_type) == ("i-0123456789abcdef0", "us-east-1", "g5.xlarge")
    assert imds.requests[0] == ("PUT", "/latest/api/token", False)
    assert all(ok for method, _path, ok in imds.requests if method == "GET")
    assert imds_identity("http://127.0.0.1:9", timeout_s=0.5) is None  # nothing listens: not on EC2


def test_on_ec2_an_idle_host_stops_itself_with_one_stop_instances(host, aws, fault_proxy, imds):
    (instance_id,) = aws.launch("g5.xlarge", tags={"team": "ml"})
    imds.instance_id = instance_id
    host.write_settings(f"stop_method: auto\nimds_url: {imds.url}\nec2_endpoint_url: {fault_proxy.endpoint_url}\n")
    loop = host.start()
    assert loop.host.instance_id == instance_id and loop.host.on_ec2
    host.until(MoveKind.WARN)
    assert instance_id in host.walls()[0]
    assert host.sample().kind is MoveKind.STOP
    assert host.calls("hook") == [[str(host.bin / "hook"), "--save"]]
    assert host.calls("stop") == []  # the EC2 API, not the command
    assert fault_proxy.requests["StopInstances"] == 1
    assert aws.state(instance_id) in ("stopping", "stopped")
    assert f"StopInstances on {instance_id}" in host.walls()[-1]


def test_a_refused_stop_instances_cancels_and_alerts(host, aws, fault_proxy, imds):
    from tests.motoserver import Fault

    (instance_id,) = aws.launch("g5.xlarge")
    imds.instance_id = instance_id
    fault_proxy.fail("StopInstances", Fault.error(403, "UnauthorizedOperation"))
    host.write_settings(f"stop_method: ec2\nimds_url: {imds.url}\nec2_endpoint_url: {fault_proxy.endpoint_url}\n")
    host.start()
    host.until(MoveKind.WARN)
    host.sample()
    assert fault_proxy.requests["StopInstances"] == 1  # no retry behind our back
    assert aws.state(instance_id) == "running"
    assert "stop failed" in host.walls()[-1] and "UnauthorizedOperation" in host.walls()[-1]


def test_slack_alone_delivers_the_warning_when_wall_fails(host, slack_stub, monkeypatch):
    monkeypatch.setenv("GPUFINOPS_TEST_SLACK", "xoxb-test-token")
    host.fail("wall")
    host.write_settings("stop_method: command\nslack:\n  token: {env: GPUFINOPS_TEST_SLACK}\n"
                        f"  base_url: {slack_stub.base_url}/\n  default_channel: '#gpu-box'\n  max_retries: 0\n")
    host.start()
    host.until(MoveKind.WARN)
    (warning,) = slack_stub.posted("#gpu-box")
    assert "gpu-box-1" in warning["text"] and "will be stopped" in warning["text"]
    assert host.sample().kind is MoveKind.STOP
    assert len(host.calls("stop")) == 1
    assert "Stopped idle GPU host gpu-box-1" in slack_stub.posted("#gpu-box")[-1]["text"]


def test_the_cli_flags_wire_the_loop_on_the_agent(host, monkeypatch):
    args = build_parser().parse_args(["agent", "--autostop", str(host.rules), "--autostop-config",
                                      str(host.settings_file), "--autostop-db", str(host.db), "--snooze-file",
                                      str(host.snooze), "--interval", "60"])
    assert args.autostop == [str(host.rules)] and not args.autostop_live
    assert maybe_start_autostop(build_parser().parse_args(["agent"]), agent=None) is None  # off without --autostop

    class FakeAgent:  # what maybe_start_autostop reads of the agent, before `start()` takes the first sample
        host = type("H", (), {"hostname": "gpu-box-1", "instance_id": None})()
        interval_s = 60.0
        on_sample = None

    agent = FakeAgent()
    running = maybe_start_autostop(args, agent)
    try:
        assert agent.on_sample == running.loop.on_sample and running.thread.is_alive()
        assert running.loop.live  # the settings file says dry_run: false
        assert [r.name for r in running.loop.rules] == ["idle-5m", "notify-only"]
    finally:
        running.close()
        running.loop.buffer.close()
    assert not running.thread.is_alive()


def test_bad_autostop_input_is_a_clear_error_not_a_traceback(host, capsys):
    from gpufinops.cli.app import main

    host.settings_file.write_text("stop_command: systemctl poweroff\n")
    argv = ["agent", "--reader", "nvidia-smi", "--nvidia-smi", str(host.nvidia_smi), "--port", "0",
            "--autostop", str(host.rules), "--autostop-config", str(host.settings_file),
            "--autostop-db", str(host.db)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{host.settings_file}:1: key 'stop_command'" in err and "Traceback" not in err
    host.write_settings()
    (host.root / "not-a-db").write_text("hello, not SQLite " * 100)
    assert main([*argv[:-1], str(host.root / "not-a-db")]) == 2
    assert "cannot open the autostop database" in capsys.readouterr().err


def test_a_lost_stop_answer_is_read_back_through_the_services_ec2_client(host, aws, fault_proxy, imds):
    """StopInstances went through but its answer was lost (a 500 after moto did it): one request, no retry, and the
    instance is read back (DescribeInstances) before anything is said: it is stopping, so the stop is done."""
    from tests.motoserver import Fault

    (instance_id,) = aws.launch("g5.xlarge")
    imds.instance_id = instance_id
    fault_proxy.fail("StopInstances", Fault.error(500, "InternalError", forward=True))
    host.write_settings(f"stop_method: ec2\nimds_url: {imds.url}\nec2_endpoint_url: {fault_proxy.endpoint_url}\n")
    host.start()
    host.until(MoveKind.WARN)
    host.sample()
    assert fault_proxy.requests["StopInstances"] == 1 and fault_proxy.requests["DescribeInstances"] >= 1
    assert aws.state(instance_id) in ("stopping", "stopped")
    assert f"stopped by EC2 StopInstances on {instance_id}" in host.walls()[-1]


def test_an_unknown_stop_outcome_is_said_and_never_retried(host, aws, fault_proxy, imds):
    """A 500 that did not stop it: the read-back finds it running, but a 5xx may still land, so the outcome is
    unknown: said once, and no second StopInstances (the host is held until a new warning)."""
    from tests.motoserver import Fault

    (instance_id,) = aws.launch("g5.xlarge")
    imds.instance_id = instance_id
    fault_proxy.fail("StopInstances", Fault.error(500, "InternalError", forward=False))
    host.write_settings(f"stop_method: ec2\nimds_url: {imds.url}\nec2_endpoint_url: {fault_proxy.endpoint_url}\n")
    host.start()
    host.until(MoveKind.WARN)
    host.sample()
    for _ in range(3):
        host.sample()
    assert fault_proxy.requests["StopInstances"] == 1 and aws.state(instance_id) == "running"
    assert any("stop outcome unknown" in w and "request may be in flight" in w for w in host.walls())


# ---------------------------------------------------------------------- issue 35: the metadata address, the mark


def test_without_ec2_self_stop_the_metadata_address_is_never_contacted(host, imds, caplog):
    # The default stop method (and the shipped settings') is the stop command: nothing goes to the metadata
    # address; the stand-in records every request it gets. The log says so.
    host.write_settings(f"imds_url: {imds.url}\n")  # no stop_method: the default
    with caplog.at_level("INFO", logger="gpufinops.autostop"):
        loop = host.start()
    assert not loop.host.on_ec2 and loop.stopper.describe.startswith("command ")
    host.until(MoveKind.WARN)
    assert imds.requests == []
    assert "the EC2 instance metadata address is not contacted" in caplog.text
    shipped = load_autostop_settings(DEPLOY_SYSTEMD / "autostop.yaml")
    assert shipped.stop_method == "command" and shipped.imds_url == "http://169.254.169.254"
    # Asked for, it is contacted (so the stand-in above would have seen a request).
    host.loop.buffer.close()
    host.write_settings(f"stop_method: auto\nimds_url: {imds.url}\n")
    with caplog.at_level("INFO", logger="gpufinops.autostop"):
        host.start()
    assert imds.requests and f"asking the EC2 instance metadata at {imds.url}" in caplog.text


def _reboot(host) -> None:
    """The host booted again: /proc/stat's btime moves (the autostop loop's notion of a boot)."""
    host.clock.t += 600
    (host.proc / "stat").write_text(f"cpu 1 2 3\nbtime {int(host.clock.t - 60)}\n")


def test_at_boot_the_agent_withdraws_the_services_stop_mark_once(host, aws, fault_proxy, imds):
    # A person stopped and started the machine while the central service's stop was announced (the mark tag
    # survives a stop/start): at boot the agent removes the mark through its own EC2 client, so the service's
    # stop, even one still in flight, is refused by the shipped IAM policy. Once per boot: an agent restart on
    # the same boot leaves a new mark alone.
    (iid,) = aws.launch("g5.xlarge", tags={"gpufinops:allow-stop": "true", TAG_MARKED: "2026-12-07T10:00:00Z"})
    imds.instance_id = iid
    host.write_settings(f"stop_method: ec2\nimds_url: {imds.url}\nec2_endpoint_url: {fault_proxy.endpoint_url}\n")
    host.start()
    assert TAG_MARKED not in aws.tags(iid) and aws.tags(iid)["gpufinops:allow-stop"] == "true"
    assert fault_proxy.requests["DeleteTags"] == 1 and aws.state(iid) == "running"
    host.loop.buffer.close()

    aws.client("ec2").create_tags(Resources=[iid], Tags=[{"Key": TAG_MARKED, "Value": "2026-12-07T11:00:00Z"}])
    host.start()  # the agent restarted (Restart=on-failure), same boot: the service's new mark stands
    assert aws.tags(iid)[TAG_MARKED] == "2026-12-07T11:00:00Z" and fault_proxy.requests["DeleteTags"] == 1
    host.loop.buffer.close()

    _reboot(host)
    host.start()
    assert TAG_MARKED not in aws.tags(iid) and fault_proxy.requests["DeleteTags"] == 2
    host.loop.buffer.close()

    _reboot(host)  # no mark: nothing to remove, no DeleteTags sent
    host.start()
    assert fault_proxy.requests["DeleteTags"] == 2


@pytest.mark.parametrize("settings, dry_run", [("stop_method: command\n", False),
                                               ("stop_method: ec2\nunmark_at_boot: false\n", False),
                                               ("stop_method: ec2\n", True)])
def test_the_mark_is_withdrawn_only_when_configured_and_live(host, aws, fault_proxy, imds, settings, dry_run, caplog):
    (iid,) = aws.launch("g5.xlarge", tags={TAG_MARKED: "2026-12-07T10:00:00Z"})
    imds.instance_id = iid
    host.write_settings(f"{settings}imds_url: {imds.url}\nec2_endpoint_url: {fault_proxy.endpoint_url}\n")
    with caplog.at_level("INFO", logger="gpufinops.autostop"):
        host.start(**({"dry_run": True} if dry_run else {}))
    assert aws.tags(iid)[TAG_MARKED] == "2026-12-07T10:00:00Z" and fault_proxy.requests["DeleteTags"] == 0
    assert ("dry-run: would remove gpufinops:marked-for-stop" in caplog.text) is dry_run


def test_a_refused_withdrawal_is_logged_and_tried_again_at_the_next_start(host, aws, fault_proxy, imds, caplog):
    from tests.motoserver import Fault

    (iid,) = aws.launch("g5.xlarge", tags={TAG_MARKED: "2026-12-07T10:00:00Z"})
    imds.instance_id = iid
    fault_proxy.fail("DeleteTags", Fault.error(403, "UnauthorizedOperation"))  # an older iam-self-stop.json
    host.write_settings(f"stop_method: ec2\nimds_url: {imds.url}\nec2_endpoint_url: {fault_proxy.endpoint_url}\n")
    with caplog.at_level("ERROR", logger="gpufinops.autostop"):
        loop = host.start()  # the agent starts all the same
    assert loop.host.on_ec2 and TAG_MARKED in aws.tags(iid)
    assert "could not be withdrawn" in caplog.text and "UnauthorizedOperation" in caplog.text
    host.loop.buffer.close()
    host.start()
    assert TAG_MARKED not in aws.tags(iid) and fault_proxy.requests["DeleteTags"] == 2
