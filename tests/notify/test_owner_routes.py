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
