"""SlackNotifier against the local Slack stub (real slack_sdk over HTTP), and the outbox.

Exactly-once here means: one HTTP post per key across repeated calls and a
restart (a new Store on the same SQLite file), retries inside one send for 429
and 5xx, a definite failure recorded "failed" and retried on a later call, and
an ambiguous one (timeout, crash) never posted twice.
"""

from __future__ import annotations

import json
import logging
import socket
from datetime import datetime, timedelta, timezone

import pytest
from slack_sdk.http_retry.builtin_interval_calculators import FixedValueRetryIntervalCalculator

from gpufinops.config import SecretRef, SlackSettings
from gpufinops.model import Message
from gpufinops.notify.delivery import OutboxNotifier, SlackNotifier, build_notifier, read_outbox, redact
from gpufinops.store.store import Store

pytestmark = pytest.mark.integration

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
TOKEN = "xoxb-1234567890-0987654321-SeCrEtToKeNvAlUe42"
ENV = "GPUFINOPS_TEST_SLACK_TOKEN"
FAST = FixedValueRetryIntervalCalculator(0.01)  # 5xx/connection backoff; 429 still honours Retry-After


class Clock:
    def __init__(self, now: datetime):
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def msg(key: str = "warn:i-0abc:20240501T120000Z", channel: str = "#gpu-alerts") -> Message:
    blocks = ({"type": "section", "text": {"type": "mrkdwn", "text": "*i-0abc* is idle"}},)
    return Message(key=key, channel=channel, text="i-0abc is idle", blocks=blocks)


@pytest.fixture
def db_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/s.db"


@pytest.fixture
def store(db_url):
    s = Store(db_url)
    yield s
    s.close()


@pytest.fixture
def with_token(monkeypatch):
    monkeypatch.setenv(ENV, TOKEN)


def settings(stub, tmp_path, **kw) -> SlackSettings:
    base = dict(token=SecretRef(env=ENV), base_url=stub.base_url if stub else None, max_retries=2,
                outbox_path=str(tmp_path / "outbox" / "nested" / "out.jsonl"))
    base.update(kw)
    return SlackSettings(**base)


def notifier(stub, tmp_path, store, **kw) -> SlackNotifier:
    timeout_s = kw.pop("timeout_s", 5.0)
    return SlackNotifier(settings(stub, tmp_path, **kw), store, lambda: T0, timeout_s=timeout_s, retry_interval=FAST)


def row(store: Store, key: str) -> dict:
    rows = [r for r in store.notification_rows() if r["key"] == key]
    assert len(rows) == 1
    return rows[0]


def posts(stub) -> list:
    return stub.calls_for("chat.postMessage")


# ------------------------------------------------------------------ the happy path


def test_sends_once_with_bearer_token_json_body_and_records_ts(slack_stub, tmp_path, store, with_token):
    n = notifier(slack_stub, tmp_path, store)
    m = msg()
    assert n.send(m) is True

    [call] = posts(slack_stub)
    assert call.headers["Authorization"] == f"Bearer {TOKEN}"
    assert call.content_type.startswith("application/json")
    assert call.body == {"channel": "#gpu-alerts", "text": "i-0abc is idle", "blocks": list(m.blocks),
                         "metadata": {"event_type": "gpufinops_notification", "event_payload": {"key": m.key}}}
    assert slack_stub.posted("#gpu-alerts") == [call.body]

    r = row(store, m.key)
    assert r["status"] == "sent" and r["channel"] == "#gpu-alerts"
    assert json.loads(r["detail"])["ts"] == call.response["ts"]


def test_same_key_twice_and_after_restart_posts_once(slack_stub, tmp_path, store, db_url, with_token):
    n = notifier(slack_stub, tmp_path, store)
    assert n.send(msg()) is True
    assert n.send(msg()) is True
    # A restart: a new Store and notifier on the same SQLite file.
    store2 = Store(db_url)
    try:
        assert notifier(slack_stub, tmp_path, store2).send(msg()) is True
    finally:
        store2.close()
    assert len(posts(slack_stub)) == 1
    # A different key is a different message.
    assert n.send(msg(key="warn:i-0abc:20240501T130000Z")) is True
    assert len(slack_stub.posted()) == 2


def test_empty_channel_goes_to_default_channel(slack_stub, tmp_path, store, with_token):
    n = notifier(slack_stub, tmp_path, store, default_channel="#fallback")
    assert n.send(msg(channel="")) is True
    assert len(slack_stub.posted("#fallback")) == 1
    assert row(store, msg().key)["channel"] == "#fallback"


# ------------------------------------------------------------------ retries inside one send


def test_429_waits_retry_after_then_succeeds_once(slack_stub, tmp_path, store, with_token):
    slack_stub.fail_next(429, retry_after=1)
    assert notifier(slack_stub, tmp_path, store).send(msg()) is True
    first, second = posts(slack_stub)
    assert (first.status_returned, second.status_returned) == (429, 200)
    # The client waited at least what Retry-After asked before trying again (a lower bound, not a timing).
    assert second.received_at - first.received_at >= 1.0
    assert len(slack_stub.posted()) == 1
    assert row(store, msg().key)["status"] == "sent"


def test_500_then_success(slack_stub, tmp_path, store, with_token):
    slack_stub.fail_next(500)
    assert notifier(slack_stub, tmp_path, store).send(msg()) is True
    assert [c.status_returned for c in posts(slack_stub)] == [500, 200]
    assert len(slack_stub.posted()) == 1


def test_persistent_500_fails_then_waits_its_backoff_then_succeeds_once(slack_stub, tmp_path, store, with_token):
    clock = Clock(T0)
    n = SlackNotifier(settings(slack_stub, tmp_path, max_retries=2, retry_backoff_s=60), store, clock,
                      timeout_s=5.0, retry_interval=FAST)
    slack_stub.fail_next(500, times=3, method="chat.postMessage")  # the first try and both retries
    assert n.send(msg()) is False
    # Each 500 was looked up before the next post (the answer might have been lost after posting).
    assert [c.status_returned for c in posts(slack_stub)] == [500, 500, 500]
    assert len(slack_stub.calls_for("conversations.history")) == 3
    r = row(store, msg().key)
    assert r["status"] == "failed" and "HTTP 500" in r["detail"] and r["attempts"] == 1
    assert store.notification_sent(msg().key) is False

    clock.now = T0 + timedelta(seconds=30)  # within the backoff: not even tried
    assert n.send(msg()) is False
    assert len(posts(slack_stub)) == 3

    clock.now = T0 + timedelta(seconds=61)
    assert n.send(msg()) is True  # the stub is healthy again
    assert len(slack_stub.delivered()) == 1
    assert row(store, msg().key)["status"] == "sent"
    assert store.delivered_at(msg().key) == clock.now


def test_backoff_doubles_up_to_the_cap_and_retry_due_resends_as_stored(slack_stub, tmp_path, store, with_token):
    clock = Clock(T0)
    st = settings(slack_stub, tmp_path, max_retries=0, retry_backoff_s=60, retry_max_backoff_s=200)
    n = SlackNotifier(st, store, clock, timeout_s=5.0, retry_interval=FAST)
    notice = msg("stop:i-0abc:20240501T120000Z")
    slack_stub.valid_tokens = {"xoxb-the-only-good-one"}  # invalid_auth on every post
    waits = []
    for _ in range(4):
        assert n.send(notice) is False
        r = store.get_notification(notice.key)
        waits.append((r.next_attempt_at - clock.now).total_seconds())
        clock.now = r.next_attempt_at
    assert waits == [60, 120, 200, 200]
    assert store.undelivered_count() == 1

    warning = msg()  # a stop warning is re-sent by the act stage (with a fresh stop time), never by retry_due
    assert n.send(warning) is False
    slack_stub.valid_tokens = None  # the token is fixed
    clock.now += timedelta(days=1)
    assert store.notifications_due(clock.now) and n.retry_due(clock.now) == 1
    [delivered] = slack_stub.delivered("#gpu-alerts")
    assert delivered["blocks"] == list(notice.blocks) and delivered["metadata"]["event_payload"]["key"] == notice.key
    assert n.retry_due(clock.now) == 0 and store.undelivered_count() == 1  # only the warning waits
    assert store.get_notification(warning.key).status == "failed"


def test_lost_answer_after_slack_posted_is_found_and_not_posted_again(slack_stub, tmp_path, store, with_token):
    slack_stub.lose_next_answer(status=500)  # Slack posts, the edge loses the answer
    assert notifier(slack_stub, tmp_path, store).send(msg()) is True
    assert len(slack_stub.delivered()) == 1
    assert len(posts(slack_stub)) == 1  # looked up, not re-posted
    assert json.loads(row(store, msg().key)["detail"]) == {"found_by": "conversations.history"}


def test_lost_answer_with_an_unreadable_history_is_left_pending_never_reposted_blind(slack_stub, tmp_path, store,
                                                                                   with_token):
    n = notifier(slack_stub, tmp_path, store)
    slack_stub.lose_next_answer(status=502)
    slack_stub.fail_next(200, body={"ok": False, "error": "missing_scope"}, method="conversations.history")
    assert n.send(msg()) is False
    assert row(store, msg().key)["status"] == "pending"
    assert n.send(msg()) is True  # the next send looks again first, and finds it
    assert len(slack_stub.delivered()) == 1 and len(posts(slack_stub)) == 1


def test_channel_id_is_listed_once_then_remembered(slack_stub, tmp_path, store, with_token):
    n = notifier(slack_stub, tmp_path, store)
    slack_stub.lose_next_answer()
    assert n.send(msg("k1")) is True
    assert len(slack_stub.calls_for("conversations.list")) == 1
    slack_stub.lose_next_answer()
    assert n.send(msg("k2")) is True
    assert len(slack_stub.calls_for("conversations.list")) == 1  # the id is kept in the store
    assert len(slack_stub.delivered()) == 2


def test_503_is_retried_but_other_errors_are_not(slack_stub, tmp_path, store, with_token):
    n = notifier(slack_stub, tmp_path, store, max_retries=2)
    slack_stub.fail_next(503)
    assert n.send(msg("k1")) is True
    slack_stub.fail_next(200, body={"ok": False, "error": "fatal_error"})
    assert n.send(msg("k2")) is False
    assert [c.status_returned for c in posts(slack_stub)] == [503, 200, 200]
    assert "fatal_error" in row(store, "k2")["detail"]


# ------------------------------------------------------------------ definite failures


def test_invalid_auth_returns_false_without_retrying(slack_stub, tmp_path, store, with_token):
    slack_stub.valid_tokens = {"xoxb-the-only-good-one"}
    assert notifier(slack_stub, tmp_path, store).send(msg()) is False
    assert len(posts(slack_stub)) == 1  # ok=false is an answer, not a transient error
    r = row(store, msg().key)
    assert r["status"] == "failed" and "invalid_auth" in r["detail"]
    assert slack_stub.posted() == []


def test_unknown_channel_fails(slack_stub, tmp_path, store, with_token):
    slack_stub.known_channels = {"#gpu-alerts"}
    assert notifier(slack_stub, tmp_path, store).send(msg(channel="#nope")) is False
    assert "channel_not_found" in row(store, msg().key)["detail"]


def test_connection_refused_is_retried_then_failed(tmp_path, store, with_token, monkeypatch):
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    st = settings(None, tmp_path, base_url=f"http://127.0.0.1:{port}/api/", max_retries=1)
    n = SlackNotifier(st, store, lambda: T0, timeout_s=2.0, retry_interval=FAST)
    assert n.send(msg()) is False
    r = row(store, msg().key)
    assert r["status"] == "failed" and "connection error" in r["detail"]


# ------------------------------------------------------------------ ambiguous outcomes: never twice


def test_read_timeout_is_looked_up_and_not_reposted(slack_stub, tmp_path, store, with_token):
    slack_stub.delay_next(1.5)  # Slack receives the post but answers after the client gave up
    n = notifier(slack_stub, tmp_path, store, timeout_s=0.3)
    assert n.send(msg()) is True  # found in the channel's history
    assert n.send(msg()) is True
    assert len(posts(slack_stub)) == 1 and len(slack_stub.delivered()) == 1


def test_crash_after_slack_accepted_does_not_post_again(slack_stub, tmp_path, db_url, with_token, monkeypatch):
    store1 = Store(db_url)
    n1 = notifier(slack_stub, tmp_path, store1)
    real_post = SlackNotifier._post

    def post_then_die(self, *args, **kwargs):
        real_post(self, *args, **kwargs)
        raise SystemExit("killed between Slack's answer and recording it")

    monkeypatch.setattr(SlackNotifier, "_post", post_then_die)
    with pytest.raises(SystemExit):
        n1.send(msg())
    store1.close()
    monkeypatch.setattr(SlackNotifier, "_post", real_post)
    assert Store(db_url).get_notification(msg().key).status == "pending"

    store2 = Store(db_url)  # the restarted service
    try:
        assert notifier(slack_stub, tmp_path, store2).send(msg()) is True
        assert row(store2, msg().key)["status"] == "sent"  # found by the lookup
    finally:
        store2.close()
    assert len(slack_stub.delivered()) == 1 and len(posts(slack_stub)) == 1


def test_crash_before_the_post_sends_it_after_restart(slack_stub, tmp_path, db_url, with_token):
    store1 = Store(db_url)
    slack_stub.known_channels = {"#gpu-alerts"}  # listed by conversations.list, as on Slack
    store1.record_notification(msg().key, "#gpu-alerts", "t", "pending", T0)  # claimed, then killed
    store1.close()
    store2 = Store(db_url)
    try:
        assert notifier(slack_stub, tmp_path, store2).send(msg()) is True
    finally:
        store2.close()
    assert len(slack_stub.delivered()) == 1


# ------------------------------------------------------------------ no token: outbox


def test_no_token_writes_outbox_line_and_no_http(slack_stub, tmp_path, store, monkeypatch, caplog):
    monkeypatch.delenv(ENV, raising=False)
    st = settings(slack_stub, tmp_path)
    n = build_notifier(st, store, lambda: T0)
    assert isinstance(n, OutboxNotifier)
    caplog.set_level(logging.INFO, logger="gpufinops.notify")
    m = msg()
    assert n.send(m) is True
    assert n.send(m) is True  # same key: no second line

    lines = read_outbox(st.outbox_path)
    assert lines == [{"key": m.key, "channel": "#gpu-alerts", "text": m.text, "blocks": list(m.blocks),
                      "at": T0.isoformat()}]
    assert slack_stub.calls == []
    assert row(store, m.key)["status"] == "outbox"
    assert "i-0abc is idle" in caplog.text

    # A SlackNotifier whose token disappears (unset env) falls back to the outbox too.
    sn = notifier(slack_stub, tmp_path, store)
    assert sn.send(msg("other-key")) is True
    assert len(read_outbox(st.outbox_path)) == 2 and slack_stub.calls == []


def test_build_notifier_picks_slack_with_a_token_file(slack_stub, tmp_path, store, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    token_file = tmp_path / "slack-token"
    token_file.write_text(TOKEN + "\n")
    st = settings(slack_stub, tmp_path, token=SecretRef(env=ENV, file=str(token_file)))
    n = build_notifier(st, store, lambda: T0)
    assert isinstance(n, SlackNotifier)
    assert n.send(msg()) is True
    assert posts(slack_stub)[0].headers["Authorization"] == f"Bearer {TOKEN}"


def test_unwritable_outbox_is_a_failure(tmp_path, store, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    st = settings(None, tmp_path, outbox_path=str(blocker / "out.jsonl"))  # parent is a file
    assert build_notifier(st, store, lambda: T0).send(msg()) is False
    assert row(store, msg().key)["status"] == "failed"


# ------------------------------------------------------------------ secrets


def test_token_never_logged_nor_stored(slack_stub, tmp_path, store, with_token, caplog):
    caplog.set_level(logging.DEBUG)  # slack_sdk logs requests at DEBUG too
    n = notifier(slack_stub, tmp_path, store, max_retries=1)
    assert n.send(msg("ok")) is True
    slack_stub.fail_next(500, times=2)
    assert n.send(msg("5xx")) is False
    # A server that echoes the token back in its error must not get it into our rows or logs.
    slack_stub.fail_next(200, body={"ok": False, "error": f"invalid_auth for {TOKEN} (also xoxp-99-88-leak)"})
    assert n.send(msg("echo")) is False
    slack_stub.valid_tokens = {"xoxb-someone-else"}
    assert n.send(msg("auth")) is False

    stored = json.dumps(store.notification_rows(), default=str)
    assert TOKEN not in caplog.text and TOKEN not in stored
    assert "xoxp-99-88-leak" not in stored and "xoxp-99-88-leak" not in caplog.text
    assert "invalid_auth for [redacted]" in row(store, "echo")["detail"]
    assert "notification echo" in caplog.text  # the failure itself is logged


def test_redact():
    assert redact(f"a {TOKEN} b") == "a xoxb-[redacted] b"
    assert redact("xapp-1-A0-123-abc and xoxe.xoxp-1-x") == "xapp-[redacted] and xoxe.xoxp-[redacted]"
    assert redact("plain-secret-value here", token="plain-secret-value") == "[redacted] here"


# ------------------------------------------------------------------ the stub itself (others rely on it)


def test_stub_parses_form_bodies_and_resets(slack_stub):
    from slack_sdk import WebClient

    client = WebClient(base_url=slack_stub.base_url, retry_handlers=[])
    # Older clients send form fields, blocks as a JSON string and the token in the body.
    resp = client.api_call("chat.postMessage", params={
        "token": TOKEN, "channel": "C0TEAM", "text": "hi", "blocks": json.dumps([{"type": "divider"}])})
    assert resp["ok"] and resp["channel"] == "C0TEAM"
    [call] = slack_stub.calls
    assert call.content_type.startswith("application/x-www-form-urlencoded")
    assert call.token == TOKEN and call.body["text"] == "hi"
    assert slack_stub.posted("C0TEAM") == [call.body]
    assert WebClient(token=TOKEN, base_url=slack_stub.base_url).auth_test()["user_id"] == "U0STUB"
    ts = [c.response["ts"] for c in slack_stub.calls if c.method == "chat.postMessage"]
    slack_stub.fail_next(500, times=5)
    slack_stub.reset()
    assert slack_stub.calls == [] and slack_stub.posted() == []
    resp = WebClient(token=TOKEN, base_url=slack_stub.base_url).chat_postMessage(channel="#x", text="again")
    assert resp.status_code == 200 and resp["ts"] not in ts  # ts keeps increasing like Slack's
