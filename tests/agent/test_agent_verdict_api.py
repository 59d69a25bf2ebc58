"""GET /v1/verdict on the agent's own HTTP server (issue 27): a real server on 127.0.0.1, a real HTTP client, the
fake nvidia-smi replaying an H100 capture and the autostop loop of test_autostop_loop driven by its clock."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from gpufinops.agent.exporter import Agent, HostIdentity, start
from gpufinops.agent.verdict_api import TOKEN_ENV, TOKEN_FILE_ENV, verdict_handler
from gpufinops.agent.autostop.machine import MoveKind
from tests.agent.test_autostop_loop import Host


@pytest.fixture
def host(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    h = Host(tmp_path, monkeypatch)
    yield h
    if h.loop is not None:
        h.loop.buffer.close()


def get(port: int, path: str = "/v1/verdict", token: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def serve(host: Host):
    """The agent with its autostop loop, served as `gpufinops agent --autostop` wires it (sampling driven by hand)."""
    loop = host.start()
    host.agent.autostop = loop  # as maybe_start_autostop does
    return start(host.agent, "127.0.0.1", 0, sample=False)


def test_unknown_before_the_first_judgement_then_idle_then_a_pending_stop(host):
    running = serve(host)
    try:
        status, body = get(running.port)
        assert status == 200 and body["verdict"] == "UNKNOWN" and body["code"] == "no_evaluation_yet"
        assert body["stop"]["pending"] is False and body["host"] == "gpu-box-1"
        host.sample()  # one sample of a 5-minute window: not enough coverage, never idle by default
        status, body = get(running.port)
        assert body["verdict"] == "UNKNOWN" and body["rule"] == "idle-5m" and body["figures"]["coverage"] < 0.8
        _warn, _n = host.until(MoveKind.WARN)
        status, body = get(running.port)
        assert status == 200 and body["verdict"] == "IDLE" and body["rule"] == "idle-5m"
        assert body["since"] is not None and body["figures"]["activity_max"] == 0
        assert body["stop"]["pending"] is True and body["stop"]["at"] and body["stop"]["dry_run"] is False
        assert [r["rule"] for r in body["rules"]] == ["idle-5m"]  # notify-only rules are the service's
    finally:
        running.close()


def test_a_stale_judgement_is_unknown(host):
    running = serve(host)
    try:
        host.sample(5)
        host.clock.t += 3600  # the autostop thread stopped judging an hour ago
        _status, body = get(running.port)
        assert body["verdict"] == "UNKNOWN" and body["code"] == "stale"
    finally:
        running.close()


def test_token_is_required_when_set_and_never_echoed(host, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "s3cret-agent-token")
    running = serve(host)
    try:
        status, body = get(running.port)
        assert status == 401 and "s3cret" not in json.dumps(body)
        assert get(running.port, token="wrong")[0] == 401
        assert get(running.port, token="s3cret-agent-token")[0] == 200
        assert get(running.port, "/v1/verdict?instance=x", token="s3cret-agent-token")[0] == 400
    finally:
        running.close()


def test_an_unreadable_token_file_opens_nothing(host, monkeypatch, tmp_path):
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing-token"))
    running = serve(host)
    try:
        assert get(running.port, token="")[0] == 503
    finally:
        running.close()


def test_without_autostop_it_is_404_with_a_json_error(host):
    agent = Agent(HostIdentity("gpu-box-1"), reader=host.reader, interval_s=60.0, timeout_s=20.0)
    running = start(agent, "127.0.0.1", 0, sample=False)
    try:
        status, body = get(running.port)
        assert status == 404 and "--autostop" in body["error"]
    finally:
        running.close()


def test_only_loopback_without_a_token():
    handle = verdict_handler(None, token=lambda: None)
    assert handle({}, "", "10.0.0.5")[0] == 403
    assert handle({"X-Forwarded-For": "127.0.0.1"}, "", "10.0.0.5")[0] == 403
    assert handle({}, "", "127.0.0.1")[0] == 404


def test_a_hosts_warning_says_host_and_names_the_snooze_file_the_agent_reads_and_agent_snooze_finds_it(
        host, capsys, monkeypatch):
    """docs/agent.md's foreground example reads a snooze file of its own (not /run/gpufinops/snooze-until): the
    printed command names it, and a bare `gpufinops agent snooze 2h` asks the running agent which file it reads."""
    from gpufinops.cli import main as gpufinops_main
    from gpufinops.notify.slack_blocks import render
    from tests.agent.test_autostop_loop import KeyRecordingSlack

    class Recording(KeyRecordingSlack):
        def send(self, msg) -> bool:
            self.sent.append(msg)
            return super().send(msg)

    monkeypatch.delenv("GPUFINOPS_AGENT_SNOOZE_FILE", raising=False)
    running = serve(host)
    slack = Recording([])
    slack.sent = []
    host.loop.announcer.slack = slack
    try:
        host.until(MoveKind.WARN)
        (wall,) = host.walls()
        assert f"to keep it running: gpufinops agent snooze 2h --snooze-file {host.snooze}" in wall
        text, blocks = render(slack.sent[0])
        shown = text + "\n" + "\n".join(json.dumps(b, ensure_ascii=False) for b in blocks)
        assert "Idle GPU host gpu-box-1 (1× " in text  # a host says host, and what it is: no "(—)"
        assert "GPU instance" not in shown and "(—)" not in shown and "no owner tag" not in shown
        assert "snooze-until` =" not in shown and "gpufinops:snooze-until" not in shown  # no EC2 tag to set
        assert f"gpufinops agent snooze 2h --snooze-file {host.snooze}" in shown
        # No --snooze-file: the running agent says which file it reads.
        assert gpufinops_main(["agent", "--port", str(running.port), "snooze", "2h"]) == 0
        out = capsys.readouterr().out
        assert f"({host.snooze}: the file the agent on port {running.port} reads)" in out
        cancel = host.sample()
        assert cancel.kind is MoveKind.CANCEL and "snoozed until" in cancel.reason
    finally:
        running.close()
