"""Slack buttons over Socket Mode (issue 26, item 7): no public URL; the service dials out with the app-level token
(apps.connections.open on the Slack stub), a local WebSocket stub on 127.0.0.1 speaks Slack's envelope protocol
(hello, `interactive` envelopes, the client's `{"envelope_id"}` acks), and each click goes through the same parse,
claim, authorisation and stored request as POST /slack/actions (the shared table: tests/faults/test_buttons.py)."""

from __future__ import annotations

import json
import logging

import pytest

from gpufinops.model import TAG_SNOOZE
from tests.act.test_act_trust import TOKEN_ENV
from tests.notify.test_interact import APP_TOKEN, APP_TOKEN_ENV, SECRET, SECRET_ENV, ClickWorld, click_body

OWNER = "U0ANA00001"


def _payload(user: str, action: str = "gpufinops_keep_7d", iid: str = "i-00") -> dict:
    return json.loads(__import__("urllib.parse").parse.parse_qs(click_body(user, action, iid).decode())["payload"][0])


@pytest.fixture
def world(tmp_path, slack_stub, socket_mode_stub, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "xoxb-test-token")
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.setenv(APP_TOKEN_ENV, APP_TOKEN)
    w = ClickWorld(tmp_path, slack_stub, ws=socket_mode_stub)
    w.cloud._replace("i-00", tags={**w.cloud.get("i-00").tags, "owner": OWNER})
    yield w
    w.close()


def test_a_click_over_socket_mode_is_acked_stored_and_applied_by_the_leader_and_a_replay_changes_nothing(
        world, caplog):
    caplog.set_level(logging.DEBUG)
    world.tick()  # marked, warning delivered
    status, text = world.socket_click(_payload(OWNER), envelope_id="env-click-1")
    assert status == 200, text
    [opened] = world.stub.calls_for("apps.connections.open")
    assert opened.token == APP_TOKEN and world.ws.requests[0].startswith("GET /link/?ticket=stub-ticket")
    [(_, stored)] = world.store.kv_items("snooze_request:")
    assert json.loads(stored)["user_id"] == OWNER
    # Slack sends an envelope again when its ack was late: claimed once, nothing new happens.
    world.store.set_kv("snooze_request:i-00", None)
    assert world.socket_click(_payload(OWNER), envelope_id="env-click-1")[0] == 409
    assert world.store.kv_items("snooze_request:") == []
    world.store.set_kv("snooze_request:i-00", stored)
    world.tick()  # the leader applies the request through the act stage's chokepoint
    assert TAG_SNOOZE in world.cloud.get("i-00").tags
    assert APP_TOKEN not in caplog.text and "stubsecretvalue" not in caplog.text


def test_strangers_malformed_payloads_and_other_envelopes_are_acked_and_change_nothing(world):
    world.tick()
    assert world.socket_click(_payload("U0EVE00001"))[0] == 403  # audited like the HTTP endpoint's refusals
    assert world.socket_click({"type": "view_submission"})[0] == 400
    assert world.socket_click(_payload(OWNER, action="gpufinops_terminate_now"))[0] == 400  # only keep-running
    world.ws.send_raw({"envelope_id": "env-events-1", "type": "events_api", "payload": {"event": {}},
                       "accepts_response_payload": False})
    assert world.ws.wait_ack("env-events-1")  # acknowledged, so Slack does not send it again; not handled
    assert "env-events-1" not in world.service.socket_mode.answers
    assert world.store.kv_items("snooze_request:") == []
    assert world.cloud.get("i-00").tags.get(TAG_SNOOZE) is None


def test_without_an_app_token_socket_mode_does_not_start_and_says_why(tmp_path, slack_stub, socket_mode_stub,
                                                                      monkeypatch, caplog):
    monkeypatch.setenv(TOKEN_ENV, "xoxb-test-token")
    monkeypatch.delenv(APP_TOKEN_ENV, raising=False)
    w = ClickWorld(tmp_path, slack_stub, ws=socket_mode_stub)
    try:
        w.service.start_socket_mode()
        assert w.service.socket_mode is None and "slack.app_token resolves to nothing" in caplog.text
        assert not w.settings.slack.interactive()  # no signing secret either: no buttons are offered
        monkeypatch.setenv(APP_TOKEN_ENV, APP_TOKEN)
        assert w.settings.slack.interactive()
    finally:
        w.close()


@pytest.mark.parametrize("envelope", [
    {"type": "interactive", "accepts_response_payload": False},  # no payload
    {"type": "interactive", "payload": [1, 2], "accepts_response_payload": False},
    {"type": "interactive", "payload": 42},
    {"type": "interactive", "payload": "not an object"},
    {"type": "events_api"},  # another type, no payload
], ids=["no_payload", "list_payload", "number_payload", "text_payload", "events_api_no_payload"])
def test_an_envelope_with_an_id_but_a_malformed_payload_is_acked_logged_and_dropped(world, envelope, caplog):
    """slack-sdk's request listener drops such an envelope before any ack, so Slack sent it again and again
    (issue 35): every envelope with an id is acknowledged, the malformed click refused by the click parser."""
    world.tick()
    world.socket_click(_payload(OWNER, action="gpufinops_terminate_now"))  # connected (a refused click)
    world.ws.send_raw({"envelope_id": "env-bad-1", **envelope})
    assert world.ws.wait_ack("env-bad-1"), "the malformed envelope was never acknowledged"
    answer = world.service.socket_mode.answers.get("env-bad-1")
    if envelope["type"] == "interactive":
        assert answer is not None and answer.status == 400 and "not a button click" in caplog.text
    else:
        assert answer is None
    assert world.store.kv_items("snooze_request:") == []
    assert world.cloud.get("i-00").tags.get(TAG_SNOOZE) is None
    # The connection is still up: a good click after it is handled.
    assert world.socket_click(_payload(OWNER))[0] == 200


def test_a_silently_dropped_connection_is_noticed_by_its_pings_and_reconnected(world):
    """The server stops answering without a close frame (a NAT or proxy dropped the path): slack-sdk's pings go
    unanswered, it drops the connection after STALE_PINGS + 1 intervals and connects again. At the shipped ping
    interval that is within 15 s (it was 50 s); here an interval of 1 s, so the test waits seconds."""
    from gpufinops.notify.socket_mode import STALE_PINGS, SocketModeActions

    shipped = SocketModeActions(world.settings.slack, world.service.slack_socket_click)
    assert shipped.silent_drop_noticed_s == (STALE_PINGS + 1) * shipped.ping_interval_s < 15

    world.tick()
    actions = SocketModeActions(world.settings.slack, world.service.slack_socket_click, ping_interval_s=1.0)
    world.service.socket_mode = actions
    assert actions.start() and actions.connected.wait(10) and world.ws.wait_connected()
    assert actions.client.ping_interval == 1.0  # what slack-sdk pings and judges staleness with
    # One ping answered first, so the drop is judged from an answered ping (on a loaded machine the first ping could
    # otherwise come after the connection went silent, and there would be no last answered ping to measure from).
    assert world.ws.wait_answered_ping(), "no ping answered on the live connection"
    world.ws.go_silent()
    assert world.ws.wait_handshakes(2, timeout=60), "never reconnected after a silent drop"
    # Noticed by its own pings, not by an error from the socket, by the rule the shipped bound is computed from,
    # read from the client's own clock in its pings (no timing of the test's): the silent connection was dropped at
    # its first ping more than STALE_PINGS intervals after its last answered one, and not at the ping before.
    pings = [(payload.split(":")[0], float(payload.split(":")[1]), answered) for payload, answered in world.ws.pings]
    silent = [t for session, t, answered in pings if not answered]
    [session] = {s for s, _, answered in pings if not answered}
    last_answered = max(t for s, t, answered in pings if answered and s == session)
    assert len(silent) >= 2
    assert silent[-2] - last_answered < (STALE_PINGS + 1) * 1.0 and silent[-1] - last_answered > STALE_PINGS * 1.0
    assert len(world.stub.calls_for("apps.connections.open")) == 2
    # Clicks arrive over the new connection.
    status, text = world.socket_click(_payload(OWNER), envelope_id="env-after-reconnect")
    assert status == 200, text
