"""Slack button clicks under attack (issue 23, item 7), through the service's real HTTP endpoint on 127.0.0.1.

- Twelve copies of one signed click sent at the same instant: exactly one goes on (the signature is claimed with
  one INSERT the database refuses a second time), on SQLite and on PostgreSQL.
- Malformed headers and bodies: 401 or 400, a log line, no traceback, nothing stored.
- Who may click is decided by Slack user id only (owner tag = the id, or an email users.info gives for that
  id); a user name equal to the owner tag is nobody. users.info failing refuses, it never answers 500.
Slack is slack_sdk against the local stub (users.info included); EC2 is SimCloud; clocks are simulated."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from contextlib import contextmanager

import pytest
from sqlalchemy import event

from gpufinops.config import ConfigError, load_settings
from gpufinops.model import ActionKind, GpuInstance
from tests.act.test_act_trust import TOKEN_ENV
from tests.notify.test_interact import APP_TOKEN, APP_TOKEN_ENV, SECRET, SECRET_ENV, ClickWorld, click_body, signed

COPIES = 12
OWNER = "U0ANA00001"
STRANGER = "U0EVE00001"


@pytest.fixture
def make_world(tmp_path, slack_stub, monkeypatch, request):
    """make(**ClickWorld kwargs) -> a world with its HTTP endpoint up (and, with socket=True, its Socket Mode
    connection to a local WebSocket stub); endpoints shut at teardown."""
    monkeypatch.setenv(TOKEN_ENV, "xoxb-test-token")
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.setenv(APP_TOKEN_ENV, APP_TOKEN)
    made: list[ClickWorld] = []

    def make(socket: bool = False, **kw) -> ClickWorld:
        ws = request.getfixturevalue("socket_mode_stub") if socket else None
        w = ClickWorld(tmp_path, slack_stub, ws=ws, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'buttons.db'}"
    return request.getfixturevalue("fresh_postgres_db")


@contextmanager
def slow_database(world: ClickWorld, seconds: float = 0.05):
    """Every SQL statement waits first, as on a database across a network: a check-then-write has a window
    this wide for a copy of the request to slip through; a single INSERT refused by the key has none."""
    def wait(*_args) -> None:
        time.sleep(seconds)

    event.listen(world.store.engine, "before_cursor_execute", wait)
    try:
        yield
    finally:
        event.remove(world.store.engine, "before_cursor_execute", wait)


def post_at_once(world: ClickWorld, body: bytes, headers: dict[str, str], copies: int = COPIES) -> list[int]:
    """The same request from `copies` threads released together; the HTTP statuses, sorted."""
    barrier = threading.Barrier(copies)
    statuses: list[int] = []

    def one() -> None:
        barrier.wait()
        statuses.append(world.post(body, headers)[0])

    threads = [threading.Thread(target=one) for _ in range(copies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(statuses)


def snooze_rows(world: ClickWorld):
    return world.store.action_rows(kinds=[ActionKind.SNOOZE])


@pytest.mark.parametrize("who", ["admin", "stranger"])
def test_twelve_copies_of_one_signed_click_at_once_only_one_goes_on(make_world, db_url, who):
    world = make_world(url=db_url)
    world.tick()  # marked and warned
    clicker = "U0ADMIN001" if who == "admin" else STRANGER
    body = click_body(clicker, "gpufinops_keep_7d", "i-00")
    with slow_database(world):
        statuses = post_at_once(world, body, signed(body, world.clock.now))
    first = 200 if who == "admin" else 403
    assert statuses == sorted([first] + [409] * (COPIES - 1))
    assert len(world.store.kv_items("slack_click_seen:")) == 1
    if who == "admin":
        [(_, stored)] = world.store.kv_items("snooze_request:")
        assert json.loads(stored)["user_id"] == clicker
        world.tick()  # the leader applies the one request
        assert [r.status for r in snooze_rows(world)] == ["done"]
    else:
        [row] = snooze_rows(world)  # one refusal audited, not one per copy
        assert row.error == "not allowed" and STRANGER in row.reason
        assert world.store.kv_items("snooze_request:") == []


def _form(payload: object) -> bytes:
    return urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()


def _without(headers: dict[str, str], key: str) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k != key}


GOOD = click_body("U0ADMIN001", "gpufinops_snooze_2h", "i-00")
# name -> (body, headers(body, signed headers) -> headers sent, expected status)
BAD_REQUESTS = {
    "timestamp_not_a_number": (GOOD, lambda h: {**h, "X-Slack-Request-Timestamp": "abc"}, 401),
    "timestamp_missing": (GOOD, lambda h: _without(h, "X-Slack-Request-Timestamp"), 401),
    "timestamp_huge": (GOOD, lambda h: {**h, "X-Slack-Request-Timestamp": "9" * 400}, 401),
    "timestamp_negative": (GOOD, lambda h: {**h, "X-Slack-Request-Timestamp": "-1"}, 401),
    "signature_missing": (GOOD, lambda h: _without(h, "X-Slack-Signature"), 401),
    "signature_not_hex": (GOOD, lambda h: {**h, "X-Slack-Signature": "v0=" + "z" * 64}, 401),
    "signature_not_ascii": (GOOD, lambda h: {**h, "X-Slack-Signature": "v0=" + "\u00e9" * 64}, 401),
    "body_is_json_not_a_form": (json.dumps({"type": "block_actions"}).encode(), lambda h: h, 400),
    "payload_not_json": (b"payload=%7Bnot+json", lambda h: h, 400),
    "payload_user_not_an_object": (_form({"type": "block_actions", "user": "U0ADMIN001", "container": 5,
                                          "actions": [{"action_id": "gpufinops_snooze_2h", "value": "i-00"}]}),
                                   lambda h: h, 400),
    "payload_user_id_not_a_slack_id": (click_body("ana", "gpufinops_snooze_2h", "i-00"), lambda h: h, 400),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_a_malformed_request_is_refused_logged_without_a_traceback_and_stores_nothing(make_world, case, caplog,
                                                                                      capfd):
    world = make_world()
    world.tick()
    body, tamper, expected = BAD_REQUESTS[case]
    status, text = world.post(body, tamper(signed(body, world.clock.now)))
    assert status == expected, text
    assert "refused a Slack click" in caplog.text
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.exc_info]
    assert "Traceback" not in capfd.readouterr().err  # nothing escaped the handler either
    assert world.store.kv_items("slack_click_seen:") == [] and world.store.kv_items("snooze_request:") == []
    assert snooze_rows(world) == []


def slack_user(user_id: str, email: str, name: str = "") -> dict[str, dict]:
    """users.info's answer for one user, keyed by id as the stub holds it."""
    return {user_id: {"id": user_id, "name": name or user_id.lower(), "profile": {"email": email}}}


ANA = "ana@example.com"
# name -> (owner tag, clicker id, payload username, users.info answers, extra slack settings, users.info fails,
#          expected status, in the refusal's reason)
WHO_MAY_CLICK = {
    "owner_tag_is_the_id": (OWNER, OWNER, "ana", {}, {}, False, 200, ""),
    "owner_tag_is_the_email_users_info_gives": (
        ANA, OWNER, "ana", slack_user(OWNER, "Ana@Example.com", "ana"), {}, False, 200, ""),
    "team_member_listed_by_email": (
        ANA, "U0BO000001", "bo", slack_user("U0BO000001", "bo@example.com"),
        {"team_members": {"ml": ["bo@example.com"]}}, False, 200, ""),
    "admin_listed_by_email": (
        ANA, "U0BOSS0001", "boss", slack_user("U0BOSS0001", "boss@example.com"),
        {"snooze_admins": ["boss@example.com"]}, False, 200, ""),
    "username_equals_the_owner_tag_name": (
        "ana", STRANGER, "ana", slack_user(STRANGER, "eve@example.com", "ana"),
        {}, False, 403, "neither a Slack user id nor an email"),
    "username_equals_the_owner_tag_id": (OWNER, STRANGER, OWNER, {}, {}, False, 403, "is another Slack user"),
    "username_equals_the_owner_tag_email": (
        ANA, STRANGER, ANA, slack_user(STRANGER, "eve@example.com", ANA), {}, False, 403,
        f"not the email of {STRANGER}"),
    "users_info_does_not_know_the_user": (
        ANA, OWNER, "ana", {}, {}, False, 403, f"users.info for {OWNER} failed (user_not_found)"),
    "users_info_is_down": (ANA, OWNER, "ana", {}, {}, True, 403, f"users.info for {OWNER} failed (HTTP 500)"),
}


# The buttons the table is checked for: (action id, subject, kv prefix of its request, audit kind, label). A Restore
# button is on the notice that gpufinops scaled a workload to zero; the click itself reads the subject only.
WORKLOAD = "k8s:ml/Deployment/idle-infer"
BUTTONS = {"snooze": ("gpufinops_snooze_2h", "i-00", "snooze_request:", ActionKind.SNOOZE, "Snooze 2 h"),
           "restore": ("gpufinops_restore", WORKLOAD, "restore_request:", ActionKind.RESTORE, "Restore")}


def scaled_to_zero(world: ClickWorld, owner: str) -> None:
    """A Deployment gpufinops scaled to zero, as the cloud describes it (state stopped), owned by `owner`."""
    world.cloud._instances[WORKLOAD] = GpuInstance(WORKLOAD, "p4d.24xlarge", "us-east-1", "stopped",
                                                   world.clock.now, gpu_count=2, provider="kubernetes",
                                                   tags={"owner": owner, "team": "ml", "k8s:namespace": "ml"})


@pytest.mark.parametrize("button", sorted(BUTTONS))
@pytest.mark.parametrize("transport", ["http", "socket"])
@pytest.mark.parametrize("case", sorted(WHO_MAY_CLICK))
def test_who_may_click_is_decided_by_slack_user_id_never_by_name(make_world, case, transport, button, caplog):
    """One table for both transports and every button: POST /slack/actions and Slack Socket Mode reach the same
    decision for a Snooze of an instance and a Restore of a workload."""
    owner, clicker, username, users, slack, users_info_down, expected, because = WHO_MAY_CLICK[case]
    action, subject, prefix, kind, label = BUTTONS[button]
    world = make_world(slack=slack, socket=transport == "socket")
    world.cloud._replace("i-00", tags={**world.cloud.get("i-00").tags, "owner": owner})
    scaled_to_zero(world, owner)
    world.stub.users.update(users)
    world.tick()
    if users_info_down:
        world.stub.fail_next(500, method="users.info")
    body = click_body(clicker, action, subject, username=username)
    status, text = world.click(body, transport)
    assert status == expected, text
    assert "Traceback" not in caplog.text and APP_TOKEN not in caplog.text
    requests = world.store.kv_items(prefix)
    rows = world.store.action_rows(kinds=[kind])
    if expected == 200:
        [(_, stored)] = requests
        assert json.loads(stored)["user_id"] == clicker
        assert rows == []  # audited when the leader applies it
    else:
        assert requests == [] and because in text
        [row] = rows
        assert row.error == "not allowed" and clicker in row.reason and because in row.reason
    # A refusal is told to the clicker alone, by either transport (a Socket Mode ack carries no answer).
    told = [c.body for c in world.stub.calls_for("chat.postEphemeral")]
    if expected == 200:
        assert told == []
    else:
        [one] = told
        assert (one["user"], one["channel"]) == (clicker, "C1") and because in one["text"]
        assert one["text"].startswith(f"'{label}' on {subject} not allowed")


@pytest.mark.parametrize("action, subject", [("gpufinops_restore", "i-00"), ("gpufinops_snooze_2h", "vol-0abc"),
                                             ("gpufinops_restore", "k8s:" + "x" * 80),
                                             ("gpufinops_snooze_2h", "k8s:" + "x" * 80)])
def test_a_button_naming_the_wrong_kind_of_subject_is_malformed(make_world, action, subject):
    """Restore is offered on Kubernetes subjects only (EC2 instances have no Restore button), Snooze on EC2
    instances and Kubernetes subjects (tests/run/test_k8s_restore_button_e2e.py), nothing else."""
    world = make_world()
    scaled_to_zero(world, "U0ADMIN001")
    world.tick()
    status, text = world.click(click_body("U0ADMIN001", action, subject))
    assert status == 400 and "instance" in text
    assert world.store.kv_items("restore_request:") == [] and world.store.kv_items("snooze_request:") == []


@pytest.mark.parametrize("slack, key", [
    ({"snooze_admins": ["ana"]}, "slack.snooze_admins"),
    ({"team_members": {"ml": ["U0TEAM0001", "Bo Smith"]}}, "slack.team_members"),
])
def test_people_allowed_to_click_are_configured_by_id_or_email_never_by_name(slack, key):
    with pytest.raises(ConfigError) as err:
        load_settings(slack=slack)
    assert key in str(err.value) and "must be a Slack user id" in str(err.value) and "Traceback" not in str(err.value)
    ok = load_settings(slack={"snooze_admins": ["W0ADMIN001", "boss@example.com"],
                              "team_members": {"ml": ["U0TEAM0001", "bo@example.com"]}}).slack
    assert ok.snooze_admins == ("W0ADMIN001", "boss@example.com")
