"""Every notice about an instance reaches its owner through the same routes as its warning (issue 35): an owner
known only by an email address (Slack has no user with it) gets the warning by email, and then its "Stop
cancelled" or "Stopped" by email too, each exactly once, threaded under the warning's email.

Real peers: the act stage (run_once over SimCloud), the real SlackNotifier against the Slack stub, the real
EmailDelivery against an SMTP server (aiosmtpd) on 127.0.0.1, behind the router the service composes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufinops.config import EmailSettings, SecretRef, SlackSettings
from gpufinops.model import TAG_SNOOZE
from gpufinops.notify.delivery import SlackNotifier
from gpufinops.notify.email import EmailDelivery
from gpufinops.notify.routing import Deliveries
from tests.act.test_act import World
from tests.notify.test_email import smtp  # noqa: F401 - the SMTP server fixture

TOKEN_ENV = "GPUFINOPS_TEST_OWNER_ROUTES_TOKEN"
OWNER = "carl@example.com"  # no Slack user has it: the stub answers users_not_found


class RoutedWorld(World):
    """The act-stage world with the notifier the live service composes: Slack (the stub) and email (aiosmtpd)."""

    def __init__(self, tmp_path, stub, smtp_port, **kw):
        self.stub, self.smtp_port = stub, smtp_port
        super().__init__(tmp_path, **kw)

    def open_store(self):
        super().open_store()
        slack = SlackSettings(token=SecretRef(env=TOKEN_ENV), base_url=self.stub.base_url, max_retries=0,
                              default_channel="#gpu")
        mail = EmailSettings(enabled=True, host="127.0.0.1", port=self.smtp_port, security="none",
                             sender="gpufinops@example.com")
        routed = self.settings.model_copy(update={"slack": slack, "email": mail})
        self.notifier = Deliveries(SlackNotifier(slack, self.store, self.clock, timeout_s=2.0), routed,
                                   EmailDelivery(mail, self.store, self.clock))


@pytest.fixture
def world(tmp_path, slack_stub, smtp, monkeypatch):  # noqa: F811 - the fixture imported above
    monkeypatch.setenv(TOKEN_ENV, "xoxb-test-token")
    return RoutedWorld(tmp_path, slack_stub, smtp.port, n=1, **{"i-00": {"owner": OWNER}})


def channel_texts(stub) -> list[str]:
    return [m["text"] for m in stub.delivered("#gpu")]


@pytest.mark.parametrize("cancel", ["snoozed", "became_busy"])
def test_an_owner_known_only_by_email_gets_the_warning_then_stop_cancelled_once(world, smtp, cancel):  # noqa: F811
    world.tick()  # marked; the warning in the channel, and by email to its owner
    [warning] = smtp.messages
    assert "will be stopped" in warning.get_body(("plain",)).get_content()
    if cancel == "snoozed":  # a person snoozes it for two hours: their cancel wins
        until = (world.clock.now + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        world.cloud.set_tags(world.cloud.get("i-00"), {TAG_SNOOZE: until})
    else:
        world.metrics.mode["i-00"] = "busy"
    world.tick()
    for _ in range(30):  # well past the announced time: nothing more, nothing twice
        world.tick()
    assert world.cloud.get("i-00").state == "running"
    first, cancelled = smtp.messages
    assert "Stop cancelled" in cancelled.get_body(("plain",)).get_content()
    # Under the warning's email (its Message-ID), not a stranger's.
    assert cancelled["In-Reply-To"] == first["Message-ID"]
    assert [m["To"] for m in smtp.messages] == [OWNER, OWNER]
    # The channel got the same two, once each.
    texts = channel_texts(world.stub)
    assert [t.split(" ")[0] for t in texts] == ["Idle", "Stop"]


def test_an_owner_known_only_by_email_gets_the_warning_then_stopped_once(world, smtp):  # noqa: F811
    for _ in range(16):  # marked, then stopped after the 15-minute lead
        world.tick()
    assert world.cloud.get("i-00").state == "stopped"
    for _ in range(10):
        world.tick()
    first, stopped = smtp.messages
    assert "will be stopped" in first.get_body(("plain",)).get_content()
    assert "Stopped idle GPU instance i-00" in stopped.get_body(("plain",)).get_content()
    assert stopped["In-Reply-To"] == first["Message-ID"]
    assert [m["To"] for m in smtp.messages] == [OWNER, OWNER]
    # Each email sent once and recorded as sent under its own key.
    rows = {r["key"]: r["status"] for r in world.store.notification_rows() if r["key"].startswith("email:")}
    assert sorted(k.split(":")[1] for k in rows) == ["stop", "warn"] and set(rows.values()) == {"sent"}


def test_a_failing_owner_lookup_is_asked_and_logged_once_an_hour_in_one_line(tmp_path, slack_stub, monkeypatch,
                                                                            caplog):
    import logging

    from gpufinops.demo.sim import SimClock
    from gpufinops.store.store import Store
    from tests.act.test_act import T0

    monkeypatch.setenv(TOKEN_ENV, "xoxb-test-token")
    clock = SimClock(T0)
    slack = SlackNotifier(SlackSettings(token=SecretRef(env=TOKEN_ENV), base_url=slack_stub.base_url, max_retries=0),
                          Store(f"sqlite:///{tmp_path / 's.db'}"), clock, timeout_s=2.0)
    caplog.set_level(logging.WARNING, logger="gpufinops.notify")
    for _ in range(3):  # three warnings about the same owner's instances within the hour
        assert slack.user_id_for_email(OWNER) is None
        clock.advance(600)
    assert len(slack_stub.calls_for("users.lookupByEmail")) == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == ("users.lookupByEmail for an owner tag failed (users_not_found): no Slack mention or direct "
                    "message for that owner; asked again after 1 h")
    clock.advance(3600)
    assert slack.user_id_for_email(OWNER) is None
    assert len(slack_stub.calls_for("users.lookupByEmail")) == 2 and len(caplog.records) == 2
