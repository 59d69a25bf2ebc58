"""Slack buttons on warnings (issue 14): a click, signed as Slack signs it, reaches the service's real HTTP
endpoint; a verified click by someone allowed sets the snooze tag through the act stage's chokepoint, the stop
does not happen, the audit log names the Slack user and the warning is updated in place. Forged, stale, replayed
and unauthorised clicks change nothing. Slack is slack_sdk against the local stub; EC2 is SimCloud."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.config import load_settings
from gpufinops.notify.interact import may_act, parse_click, snooze_until, verify
from gpufinops.model import TAG_SNOOZE, ActionKind, GpuInstance
from gpufinops.run.pipeline import Peers
from gpufinops.run.service import Service, make_http_server
from gpufinops.notify.routing import Deliveries
from tests.act.test_act import T0
from tests.act.test_act_trust import SlackWorld
from tests.promserver import free_port

SECRET_ENV = "GPUFINOPS_TEST_SLACK_SIGNING_SECRET"
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
APP_TOKEN_ENV = "GPUFINOPS_TEST_SLACK_APP_TOKEN"
APP_TOKEN = "xapp-1-A0STUB-1-stubsecretvalue"


def signed(body: bytes, at: datetime, secret: str = SECRET) -> dict[str, str]:
    ts = str(int(at.timestamp()))
    digest = hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}",
            "Content-Type": "application/x-www-form-urlencoded"}


def click_body(user: str, action: str, instance_id: str, message: dict | None = None,
               username: str | None = None, block_id: str | None = None) -> bytes:
    payload = {"type": "block_actions", "user": {"id": user, "username": username or user.lower()},
               "channel": {"id": (message or {}).get("channel", "C1")},
               "container": {"type": "message", "message_ts": (message or {}).get("ts", "1.1"),
                             "channel_id": (message or {}).get("channel", "C1")},
               "message": {"ts": (message or {}).get("ts", "1.1"), "blocks": (message or {}).get("blocks", [])},
               "actions": [{"action_id": action, "value": instance_id, "type": "button",
                            **({"block_id": block_id} if block_id else {})}]}
    return urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()


class ClickEndpoints:
    """The service's two click transports in front of a world: POST /slack/actions on 127.0.0.1 and, with a
    SocketModeStub (`ws`), Slack Socket Mode. A world sets `clock` (with `.now`) and calls `serve`."""

    ws = None
    clock = None

    def serve(self, settings, peers, ws=None) -> None:
        self.ws = ws  # a SocketModeStub: clicks may also come over Slack Socket Mode
        self.service = Service(settings, peers, clock=lambda: self.clock.now)
        self.http = make_http_server(settings, self.service.metrics, self.service.live, self.service.ready,
                                     self.service.slack_actions)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/slack/actions"

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def click(self, body: bytes, transport: str = "http") -> tuple[int, str]:
        """One click (a form body as Slack posts it) through a transport: "http" (signed now, POST /slack/actions)
        or "socket" (its payload as an `interactive` envelope over the Socket Mode stub; the answer is what the
        service's one click path returned for that envelope)."""
        if transport == "http":
            return self.post(body, signed(body, self.clock.now))
        payload = json.loads(urllib.parse.parse_qs(body.decode())["payload"][0])
        return self.socket_click(payload)

    def socket_click(self, payload, envelope_id: str | None = None) -> tuple[int, str]:
        assert self.ws is not None, "a Socket Mode world needs the socket_mode_stub fixture"
        if self.service.socket_mode is None:
            self.service.start_socket_mode()
            assert self.service.socket_mode is not None and self.service.socket_mode.connected.wait(10)
            assert self.ws.wait_connected()
        before = self.ws.ack_count(envelope_id) if envelope_id else 0
        eid = self.ws.send_interactive(payload, envelope_id)
        assert self.ws.wait_ack(eid, count=before + 1), "the envelope was not acknowledged"
        answer = self.service.socket_mode.answers[eid]
        return answer.status, answer.text

    def close(self) -> None:
        if self.service.socket_mode is not None:
            self.service.socket_mode.stop()
        self.http.shutdown()
        self.http.server_close()


class ClickWorld(SlackWorld, ClickEndpoints):
    """The act-stage world with interactivity on, and the service's HTTP endpoint in front of its store."""

    def __init__(self, tmp_path, stub, slack=None, ws=None, **kw):
        super().__init__(tmp_path, stub, **kw)
        if ws is not None:
            slack = {"socket_mode": True, "app_token": {"env": APP_TOKEN_ENV}, "base_url": stub.base_url,
                     **(slack or {})}
        self.settings = load_settings(
            act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 1.0},
            slack={"signing_secret": {"env": SECRET_ENV}, "snooze_admins": ["U0ADMIN001"],
                   "team_members": {"ml": ["U0TEAM0001"]}, **(slack or {})},
            service={"host": "127.0.0.1", "port": free_port()})
        # The notifier as the live service composes it (run/compose.live_notifier): behind the router.
        self.serve(self.settings, Peers(self.cloud, self.metrics, self.store, Deliveries(self.notifier, self.settings)),
                   ws)

    def warning(self) -> dict:
        """The warning as Slack holds it, with the conversation id a click carries."""
        [warn] = [{**m, "channel": cid} for cid, msgs in self.stub.history.items() for m in msgs
                  if m["text"].startswith(("Idle GPU instance", "[DRY-RUN] Idle GPU instance", ":zzz:"))]
        return warn


@pytest.fixture
def world(tmp_path, slack_stub, monkeypatch):
    monkeypatch.setenv("GPUFINOPS_TEST_SLACK_TOKEN", "xoxb-test-token")
    monkeypatch.setenv(SECRET_ENV, SECRET)
    w = ClickWorld(tmp_path, slack_stub)
    yield w
    w.http.shutdown()


def test_owner_clicks_snooze_the_tag_is_set_no_stop_audited_and_the_message_says_who(world):
    world.cloud._replace("i-00", tags={**world.cloud.get("i-00").tags, "owner": "ana@example.com"})
    world.stub.users["U0ANA0001"] = {"id": "U0ANA0001", "name": "ana", "tz": "Europe/Berlin",
                                "profile": {"email": "Ana@Example.com"}}
    world.tick()  # marked, warning delivered with its buttons
    warn = world.warning()
    actions = [b for b in warn["blocks"] if b["type"] == "actions"]
    assert [e["action_id"] for e in actions[0]["elements"]] == [
        "gpufinops_snooze_2h", "gpufinops_snooze_tomorrow", "gpufinops_keep_7d"]
    clicked_at = world.clock.now
    body = click_body("U0ANA0001", "gpufinops_snooze_2h", "i-00",
                      {"channel": warn["channel"], "ts": warn["ts"], "blocks": warn["blocks"]})
    status, text = world.post(body, signed(body, clicked_at))
    assert status == 200, text
    assert TAG_SNOOZE not in world.cloud.get("i-00").tags  # the endpoint changes nothing; the leader's tick does
    tag_calls = [c for c in world.cloud.calls if c[0] == "set_tags"]
    for _ in range(30):  # far past the 15-minute lead
        world.tick()
    assert world.stops() == [] and world.cloud.get("i-00").state == "running"
    until = (clicked_at + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert world.cloud.get("i-00").tags[TAG_SNOOZE] == until
    [row] = world.store.action_rows(kinds=[ActionKind.SNOOZE])
    assert row.status == "done" and "ana" in row.reason and "U0ANA0001" in row.reason and until in row.reason
    # One tag call for the one intent (the mark's removal after the snooze is a remove_tags call).
    assert len([c for c in world.cloud.calls if c[0] == "set_tags"]) == len(tag_calls) + 1
    updated = world.warning()  # the same message, edited in place
    assert updated["ts"] == warn["ts"] and "Snoozed by <@U0ANA0001>" in updated["text"]
    assert not [b for b in updated["blocks"] if b["type"] == "actions"]


@pytest.mark.parametrize("case", ["forged", "stale", "replayed", "not_allowed", "unsigned"])
def test_forged_stale_replayed_and_unauthorised_clicks_change_nothing(world, case, caplog):
    world.tick()
    body = click_body("U0BOB00001", "gpufinops_keep_7d", "i-00")
    if case == "not_allowed":
        status, _ = world.post(body, signed(body, world.clock.now))
    elif case == "forged":
        status, _ = world.post(body, signed(body, world.clock.now, secret="someone-else"))
    elif case == "stale":
        status, _ = world.post(body, signed(body, world.clock.now - timedelta(minutes=6)))
    elif case == "unsigned":
        status, _ = world.post(body, {"Content-Type": "application/x-www-form-urlencoded"})
    else:
        admin = click_body("U0ADMIN001", "gpufinops_keep_7d", "i-00")
        headers = signed(admin, world.clock.now)
        assert world.post(admin, headers)[0] == 200
        world.tick()  # applied: one snooze row
        status, _ = world.post(admin, headers)  # the same request again
    assert status == {"not_allowed": 403, "forged": 401, "stale": 401, "unsigned": 401, "replayed": 409}[case]
    for _ in range(20):
        world.tick()
    snoozes = world.store.action_rows(kinds=[ActionKind.SNOOZE])
    if case == "replayed":
        assert [r.status for r in snoozes] == ["done"]  # the first click only
        assert world.stops() == []
    else:
        assert TAG_SNOOZE not in world.cloud.get("i-00").tags and len(world.stops()) == 1  # the stop went ahead
        if case == "not_allowed":
            [row] = snoozes
            assert row.error == "not allowed" and "U0BOB00001" in row.reason and "not its owner" in row.reason
        else:
            assert snoozes == []
    assert any("refused" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("minutes", [-600, 30])  # a snooze a person set that has ended; one that ends too soon
def test_a_second_snooze_click_never_rewrites_the_tag_and_holds_from_the_record(world, minutes):
    # The IAM policy lets gpufinops write gpufinops:snooze-until only where none is set (so it can never end a
    # person's snooze): a click on an instance that carries one is held from gpufinops's own record, and the
    # clicker is told exactly that, privately.
    person_set = (world.clock.now + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")
    world.cloud._replace("i-00", tags={**world.cloud.get("i-00").tags, TAG_SNOOZE: person_set})
    if minutes < 0:
        world.tick()  # the old snooze is over: marked, warned
    clicked_at = world.clock.now
    body = click_body("U0ADMIN001", "gpufinops_snooze_2h", "i-00")
    status, text = world.post(body, signed(body, clicked_at))
    until = (clicked_at + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert status == 200 and until in text and "leaves that tag as it is" in text and "own record" in text
    [told] = [c for c in world.stub.calls if c.method == "chat.postEphemeral"]
    assert told.body["user"] == "U0ADMIN001" and "only a person changes" in told.body["text"]
    tag_calls = [c for c in world.cloud.calls if c[0] == "set_tags"]
    for _ in range(110):  # past the old snooze and the 15-minute lead, short of the 2 h clicked for
        world.tick()
    assert world.stops() == [] and world.cloud.get("i-00").state == "running"
    assert world.cloud.get("i-00").tags[TAG_SNOOZE] == person_set  # never rewritten
    assert len([c for c in world.cloud.calls if c[0] == "set_tags"]) == len(tag_calls)
    [row] = world.store.action_rows(kinds=[ActionKind.SNOOZE])
    assert row.status == "done" and until in row.reason and "own record" in row.reason and person_set in row.reason
    for _ in range(40):  # the 2 h are over: idle again, a fresh warning and its full lead, then the stop
        world.tick()
    assert len(world.stops()) == 1


def test_a_click_while_the_instance_cannot_be_read_stores_nothing(world):
    world.tick()
    world.cloud.describe_fails = True
    body = click_body("U0ADMIN001", "gpufinops_snooze_2h", "i-00")
    assert world.post(body, signed(body, world.clock.now))[0] == 503
    world.cloud.describe_fails = False
    assert world.store.kv_items("snooze_request:") == []


def test_a_snooze_clicked_just_before_the_stop_holds_on_that_tick(world):
    world.tick()
    for _ in range(14):
        world.tick()
    body = click_body("U0TEAM0001", "gpufinops_snooze_2h", "i-00")  # a member of team ml, a minute before the stop
    assert world.post(body, signed(body, world.clock.now))[0] == 200
    world.tick()
    assert world.stops() == [] and TAG_SNOOZE in world.cloud.get("i-00").tags


def test_who_may_act_and_until_when():
    settings = load_settings(slack={"snooze_admins": ["U0ADMIN001"], "team_members": {"ml": ["U0TEAM0001"]}})
    inst = GpuInstance("i-1", "g5.xlarge", "us-east-1", "running", T0, tags={"owner": "U0ANA0001", "team": "ml"})
    click = parse_click(click_body("U0ANA0001", "gpufinops_snooze_2h", "i-1"))
    assert may_act(click, {}, inst, settings)[0]
    other = parse_click(click_body("U0EVE00001", "gpufinops_snooze_2h", "i-1"))
    ok, why = may_act(other, {"profile": {"email": "eve@example.com"}}, inst, settings)
    assert not ok and "owner tag 'U0ANA0001'" in why
    assert may_act(parse_click(click_body("U0TEAM0001", "gpufinops_snooze_2h", "i-1")), {}, inst, settings)[0]
    no_owner = GpuInstance("i-1", "g5.xlarge", "us-east-1", "running", T0, tags={"team": "ml"})
    assert "no owner tag" in may_act(other, {}, no_owner, settings)[1]
    assert parse_click(b"payload=%7B%22type%22%3A%22view_submission%22%7D") == "not a button click"
    assert parse_click(click_body("U0ONE00001", "gpufinops_delete_everything", "i-1")).startswith("unknown action")
    now = datetime(2026, 12, 1, 20, 30, tzinfo=timezone.utc)  # 21:30 in Berlin
    assert snooze_until("gpufinops_snooze_tomorrow", now, "Europe/Berlin", 7 * 86400) == \
        datetime(2026, 12, 2, 8, 0, tzinfo=timezone.utc)  # 09:00 Berlin
    assert snooze_until("gpufinops_snooze_tomorrow", now, "Not/AZone", 7 * 86400) == \
        datetime(2026, 12, 2, 9, 0, tzinfo=timezone.utc)
    assert snooze_until("gpufinops_keep_7d", now, None, 3600) == now + timedelta(hours=1)  # the act stage's cap


def test_signature_checks_match_slacks_documented_example():
    # The example request of Slack's "Verifying requests from Slack" page.
    body = (b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&"
            b"channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&"
            b"response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&"
            b"trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c")
    headers = {"X-Slack-Request-Timestamp": "1531420618",
               "X-Slack-Signature": "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"}
    at = datetime.fromtimestamp(1531420618, timezone.utc)
    assert verify(headers, body, "8f742231b10e8888abcd99yyyzzz85a5", at) is None
    assert verify(headers, body, "8f742231b10e8888abcd99yyyzzz85a5", at + timedelta(minutes=6)) is not None
    assert verify(headers, body + b"x", "8f742231b10e8888abcd99yyyzzz85a5", at) is not None


def test_in_dry_run_a_click_is_audited_once_shown_and_holds_without_a_tag(world):
    world.dry_run = True
    world.tick()
    warn = world.warning()
    body = click_body("U0ADMIN001", "gpufinops_snooze_2h", "i-00",
                      {"channel": warn["channel"], "ts": warn["ts"], "blocks": warn["blocks"]})
    assert world.post(body, signed(body, world.clock.now))[0] == 200
    for _ in range(20):
        world.tick()
    assert [c for c in world.cloud.calls if c[0] == "set_tags"] == []  # dry-run: no cloud call at all
    [row] = world.store.action_rows(kinds=[ActionKind.SNOOZE])
    assert row.dry_run and "would snooze" in row.reason
    assert "dry-run" in world.warning()["text"]
    assert [d for d in world.store.kv_items("snooze_request:")]  # still held: the 2 h are not over
    for _ in range(105):
        world.tick()
    assert world.store.kv_items("snooze_request:") == []  # over: forgotten


def test_an_ec2_stop_notice_carries_no_button(world):
    """Restore is for what gpufinops changed in a cluster; an EC2 instance is started again by its owner."""
    for _ in range(17):  # past the 15-minute lead: stopped
        world.tick()
    assert len(world.stops()) == 1
    [notice] = [m for m in world.stub.delivered() if m["text"].startswith("Stopped idle GPU instance")]
    assert not [b for b in notice["blocks"] if b["type"] == "actions"]
    assert [b for b in world.warning()["blocks"] if b["type"] == "actions"]  # the warning's Snooze buttons are


def test_a_refused_clicks_reason_names_no_address_when_users_info_cannot_be_reached(world, caplog):
    """users.info failing with a text that names where Slack's API was dialled (a proxy inside the VPC): the click
    is refused, the clicker is told why in words, and the address is in the log only (issue 35)."""
    from gpufinops.notify.interact import handle_verified, parse_click

    world.cloud._replace("i-00", tags={**world.cloud.get("i-00").tags, "owner": "ana@example.com"})
    world.tick()

    def users_info_unreachable(_user_id):
        raise ConnectionError("HTTPSConnectionPool(host='slack-egress.corp.internal', port=8443): Max retries "
                              "exceeded with url: https://slack-egress.corp.internal:8443/api/users.info")

    click = parse_click(click_body("U0ANA0001", "gpufinops_snooze_2h", "i-00"))
    answer = handle_verified(click, "claim-1", settings=world.settings, store=world.store, cloud=world.cloud,
                             users=users_info_unreachable, now=world.clock.now)
    assert answer.status == 403 and "users.info for U0ANA0001 failed" in answer.text
    assert "corp.internal" not in answer.text and "8443" not in answer.text and "https://" not in answer.text
    assert "slack-egress.corp.internal" in caplog.text  # the full detail for whoever runs the service
    assert world.store.kv_items("snooze_request:") == []
