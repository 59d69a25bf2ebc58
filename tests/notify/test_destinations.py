"""A rule's `notify_to` (destinations with their transport) reaches each destination, exactly once; producers send
an audience and routing picks its channel (issue 36, item 4).

Real peers: the act stage (run_once over SimCloud), the real SlackNotifier against the Slack stub, the real
EmailDelivery against an SMTP server (aiosmtpd) on 127.0.0.1, behind the router the service composes."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from gpufinops.model import Action, Rule
from gpufinops.rules import load_rules
from tests.act.test_act import RULE
from tests.notify.test_email import smtp  # noqa: F401 - the SMTP server fixture
from tests.notify.test_owner_routes import TOKEN_ENV, RoutedWorld

OWNER = "kim"  # an owner tag that is neither a Slack user nor an address: no owner copy, only the rule's destinations


@pytest.fixture
def world(tmp_path, slack_stub, smtp, monkeypatch):  # noqa: F811 - the fixture imported above
    monkeypatch.setenv(TOKEN_ENV, "xoxb-test-token")
    return RoutedWorld(tmp_path, slack_stub, smtp.port, n=1, **{"i-00": {"owner": OWNER}})


def rule_from_file(tmp_path, notify_to: str) -> Rule:
    """RULE as a rule file writes it, with this notify_to: what the service loads."""
    path = tmp_path / "r.yaml"
    path.write_text(f"rules:\n  - name: {RULE.name}\n    threshold_pct: {RULE.threshold_pct:g}\n"
                    f"    window: {RULE.window_s}s\n    warning_lead: {RULE.warning_lead_s}s\n"
                    f"    action: stop\n    notify_to: {notify_to}\n")
    (rule,) = load_rules([path])
    return rule


def texts(stub, channel: str) -> list[str]:
    return [m["text"].split(" ")[0] for m in stub.delivered(channel)]


def test_a_rules_slack_and_email_destinations_each_get_the_warning_and_the_stop_once(world, smtp, tmp_path):  # noqa: F811
    rule = rule_from_file(tmp_path, "['slack:#ml-gpus', 'email:finance@example.com', 'slack:#ml-oncall']")
    for _ in range(16):  # marked and warned, then stopped after the 15-minute lead
        world.tick(rules=(rule,))
    assert world.cloud.get("i-00").state == "stopped"
    for _ in range(10):  # nothing more, nothing twice
        world.tick(rules=(rule,))
    # The first chat destination is the notice's own; the second gets a copy; the default channel nothing.
    assert texts(world.stub, "#ml-gpus") == ["Idle", "Stopped"]
    assert texts(world.stub, "#ml-oncall") == ["Idle", "Stopped"]
    assert world.stub.delivered("#gpu") == []
    warning, stopped = smtp.messages
    assert [m["To"] for m in smtp.messages] == ["finance@example.com"] * 2
    assert "will be stopped" in warning.get_body(("plain",)).get_content()
    assert "Stopped idle GPU instance i-00" in stopped.get_body(("plain",)).get_content()
    assert stopped["In-Reply-To"] == warning["Message-ID"]  # the stop under its warning, in that inbox too
    # Each recorded under its own key: the warning's own key is the first channel's delivery.
    keys = {r["key"]: r["channel"] for r in world.store.notification_rows()}
    warn_key = next(k for k in keys if k.startswith("warn:"))
    assert keys[warn_key] != "" and keys[f"to:slack:#ml-oncall:{warn_key}"] != ""
    assert f"to:email:finance@example.com:{warn_key}" in keys


def test_an_email_only_rule_warns_by_email_and_the_channel_gets_nothing(world, smtp, tmp_path):  # noqa: F811
    rule = rule_from_file(tmp_path, "['email:oncall@example.com', owner]")
    for _ in range(16):
        world.tick(rules=(rule,))
    assert world.cloud.get("i-00").state == "stopped"
    assert world.stub.delivered() == []
    assert [m["To"] for m in smtp.messages] == ["oncall@example.com"] * 2
    # That email is the warning's delivery: recorded under the warning's own key, sent.
    rows = {r["key"]: r["status"] for r in world.store.notification_rows()}
    assert any(k.startswith("warn:") and s == "sent" for k, s in rows.items())


def test_a_rule_naming_team_and_default_reaches_both_channels(world, tmp_path):
    routed = world.notifier.settings
    world.notifier.settings = routed.model_copy(update={"slack": routed.slack.model_copy(
        update={"team_channels": {"ml": "#ml-team"}})})
    rule = replace(rule_from_file(tmp_path, "[team, default]"), action=Action.NOTIFY)
    world.tick(rules=(rule,))
    assert texts(world.stub, "#ml-team") == ["GPU"] and texts(world.stub, "#gpu") == ["GPU"]  # "GPU instance ... idle"


def test_producers_send_an_audience_and_routing_picks_the_default_channel(world):
    """The daily summary (run/jobs.py) names no channel: the router sends it to `slack.default_channel`."""
    from gpufinops.run.jobs import daily_summary
    from gpufinops.run.pipeline import Peers

    world.tick()
    msg = daily_summary(world.settings, Peers(world.cloud, world.metrics, world.store, world.notifier),
                        world.clock.now + timedelta(hours=1))
    assert msg.channel == "" and msg.to == ()  # the builder's notice: an audience, no channel
    assert [m["text"].splitlines()[0] for m in world.stub.delivered("#gpu")][-1].startswith("GPU FinOps daily summary")


def test_an_email_destination_without_the_email_delivery_is_logged_and_the_team_channel_gets_it(world, smtp,  # noqa: F811
                                                                                                 tmp_path, caplog):
    world.notifier.email = None  # email.enabled: false
    rule = rule_from_file(tmp_path, "['email:oncall@example.com']")
    with caplog.at_level("WARNING", logger="gpufinops.notify"):
        world.tick(rules=(rule,))
    assert texts(world.stub, "#gpu") == ["Idle"] and smtp.messages == []  # warned where people read it
    assert "email destinations oncall@example.com need the email delivery" in caplog.text
