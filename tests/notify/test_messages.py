"""Message builders: keys, wording, escaping of user-controlled values, Slack limits.

Limits are checked twice: by our own walk over every text object and by
slack_sdk's Block Kit model validation (an independent implementation of
Slack's documented limits).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest
from slack_sdk.models.blocks import Block

from gpufinops.notify import messages as m
from gpufinops.notify import slack_blocks as sb
from gpufinops.model import Action, Decision, GpuInstance, ReasonCode, Verdict
from gpufinops import config

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
EVIL = "<!channel> & <@U012AB3CD> <https://evil.example|click>"


def inst(i: int = 0, **kw) -> GpuInstance:
    base = dict(
        instance_id=f"i-{i:017x}",
        instance_type="p4d.24xlarge",
        region="us-east-1",
        state="running",
        launch_time=T0 - timedelta(days=3),
        account="123456789012",
        tags={"owner": "alice", "team": "ml-research", "Name": "train-box"},
        gpu_count=8,
        gpu_model="A100",
        hourly_cost=32.77,
    )
    base.update(kw)
    return GpuInstance(**base)


def decision(instance_id: str, *, code: ReasonCode = ReasonCode.IDLE_STAYS_BELOW, verdict=Verdict.IDLE,
             reason: str = "max activity 0.4% < 5% over 30 min", **kw) -> Decision:
    base = dict(
        instance_id=instance_id, rule_name="stop-idle-training", verdict=verdict, code=code, reason=reason,
        evaluated_at=T0, action=Action.STOP, window_s=1800, activity_mean=0.1, activity_max=0.4,
        memory_max_mib=71680.0, coverage=0.97, hourly_cost=32.77,
    )
    base.update(kw)
    return Decision(**base)


# ------------------------------------------------------------------ helpers over Block Kit

_DATE_TOKEN = re.compile(r"<!date\^\d+\^[^|>]*\|[^<>]*>")


def B(notice) -> tuple[dict, ...]:
    """The notice as Slack shows it (notify/slack_blocks.py renders every Notice)."""
    return sb.render(notice)[1]


def text_objects(blocks) -> list[dict]:
    out = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") in ("mrkdwn", "plain_text") and "text" in node:
                out.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(list(blocks))
    return out


def assert_within_slack_limits(notice) -> None:
    text, blocks = sb.render(notice)
    msg = m.Notice(key=notice.key, text=text, blocks=blocks)
    assert len(msg.blocks) <= 50
    assert len(msg.text) <= 3000
    for b in msg.blocks:
        Block.parse(b).validate_json()  # raises SlackObjectFormationError on any limit
        if b["type"] == "section" and "fields" in b:
            assert len(b["fields"]) <= 10
            assert all(len(f["text"]) <= 2000 for f in b["fields"])
    for t in text_objects(msg.blocks):
        assert len(t["text"]) <= (150 if t["type"] == "plain_text" else 3000)
    json.dumps(list(msg.blocks))  # serialisable as sent


def assert_safely_escaped(s: str) -> None:
    """No control characters except our own date tokens; every & starts an entity."""
    stripped = _DATE_TOKEN.sub("", s)
    assert "<" not in stripped and ">" not in stripped, stripped
    assert not re.search(r"&(?!amp;|lt;|gt;)", stripped), stripped


def all_mrkdwn(msg) -> list[str]:
    return [msg.text] + [t["text"] for t in text_objects(B(msg)) if t["type"] == "mrkdwn"]


# ------------------------------------------------------------------ formatting


@pytest.mark.parametrize("seconds,expected", [
    (0, "0 s"), (45, "45 s"), (90, "1 min 30 s"), (14 * 60, "14 min"), (14 * 60 + 29, "14 min"), (59 * 60 + 40, "1 h"), (7200, "2 h"), (7 * 86400, "7 d"),
    (3 * 3600 + 5 * 60, "3 h 05 min"), (2 * 86400 + 4 * 3600, "2 d 4 h"), (-30, "0 s"), (None, "unknown"),
    (float("nan"), "unknown"),
])
def test_format_duration(seconds, expected):
    assert m.format_duration(seconds) == expected


@pytest.mark.parametrize("value,expected", [
    (32.77, "$32.77/h"), (0.5, "$0.50/h"), (1234.5, "$1,234.50/h"), (0.0, "$0.00/h"), (None, "unknown $/h"),
    (float("nan"), "unknown $/h"),
])
def test_format_money(value, expected):
    assert m.format_money(value, per="h") == expected


@pytest.mark.parametrize("value,kwargs,expected", [
    # One function, each spelling a parameter (issue 36): a price in a message, a report's cell, a monthly figure
    # in the recommendations, another currency, a guessed price.
    (31.92, {"per": "h", "estimate": True}, "$31.92/h (estimate)"),
    (-6.17, {}, "-$6.17"), (-0.001, {}, "$0.00"), (1234.5, {"digits": 0}, "$1,234"),
    (1234.5, {"digits": 0, "per": "month"}, "$1,234/month"), (1234.5, {"currency": "EUR"}, "1,234.50 EUR"),
    (None, {}, "unknown"), (None, {"unknown": "–"}, "–"), (0.125, {"digits": 3, "per": "h"}, "$0.125/h"),
])
def test_one_money_spelling_with_parameters(value, kwargs, expected):
    assert m.format_money(value, **kwargs) == expected


# ------------------------------------------------------------------ keys


def test_keys_name_the_event_in_utc():
    i = inst()
    d = decision(i.instance_id)
    cest = timezone(timedelta(hours=2))
    marked = datetime(2024, 5, 1, 14, 0, 5, tzinfo=cest)  # 12:00:05Z
    warn = m.idle_warning(i, d, marked_at=marked, stop_at=marked + timedelta(minutes=15), channel="#c",
                          dry_run=False, action=Action.STOP)
    assert warn.key == f"warn:{i.instance_id}:20240501T120005Z"
    assert m.stopped(i, d, at=T0, channel="#c", dry_run=False, action=Action.STOP).key == f"stop:{i.instance_id}:20240501T120000Z"
    assert m.mark_cancelled(i, reason="became active", marked_at=T0, channel="#c").key == f"unmark:{i.instance_id}:20240501T120000Z"
    assert m.idle_notice(i, d, since=T0, channel="#c").key == f"idle:{i.instance_id}:20240501T120000Z"
    assert m.metrics_unavailable([(i, d)], episode_start=T0, channel="#c").key == "metrics-unavailable:20240501T120000Z"
    # Naive datetimes are UTC, as in the store.
    assert m.idle_notice(i, d, since=T0.replace(tzinfo=None), channel="#c").key.endswith(":20240501T120000Z")


# ------------------------------------------------------------------ wording


def test_idle_warning_says_what_when_and_how_to_keep_it():
    i = inst()
    msg = m.idle_warning(i, decision(i.instance_id), marked_at=T0, stop_at=T0 + timedelta(minutes=15),
                         channel="#gpu", dry_run=False, action=Action.STOP)
    assert msg.channel == "#gpu"
    assert "will be stopped at 2024-05-01 12:15 UTC (in 15 min)" in msg.text
    assert "alice" in msg.text and "p4d.24xlarge" in msg.text and "$32.77/h" in msg.text
    assert "gpufinops:snooze-until" in msg.text and "gpufinops:protect" in msg.text
    assert "DRY-RUN" not in msg.text
    fields = [f["text"] for b in B(msg) if "fields" in b for f in b["fields"]]
    joined = "\n".join(fields)
    for expected in (i.instance_id, "p4d.24xlarge", "8× A100", "alice", "ml-research", "$32.77/h",
                     "≥ 30 min", "max 0.4%", "70.0 GiB", "stop-idle-training", "<!date^1714565700^"):
        assert expected in joined, expected
    assert B(msg)[0]["type"] == "header"
    assert_within_slack_limits(msg)


def test_dry_run_wording_and_banner():
    i = inst()
    d = decision(i.instance_id)
    live = m.stopped(i, d, at=T0, channel="#c", dry_run=False, action=Action.STOP)
    dry = m.stopped(i, d, at=T0, channel="#c", dry_run=True, action=Action.STOP)
    assert live.text.startswith("Stopped idle GPU instance")
    assert "Saves $32.77/h" in live.text
    assert "would" not in live.text.lower()
    assert dry.text.startswith("[DRY-RUN] Would stop idle GPU instance")
    assert "NOT stopped" in dry.text
    assert "Would stop" in B(dry)[0]["text"]["text"]
    banner = [b for b in B(dry) if b["type"] == "context" and "DRY-RUN" in b["elements"][0]["text"]]
    assert len(banner) == 1
    assert not [b for b in B(live) if "DRY-RUN" in json.dumps(b)]

    warn_dry = m.idle_warning(i, d, marked_at=T0, stop_at=T0 + timedelta(hours=3, minutes=5), channel="#c",
                              dry_run=True, action=Action.STOP)
    assert warn_dry.text.startswith("[DRY-RUN] ")
    assert "would be stopped (dry-run) at 2024-05-01 15:05 UTC (in 3 h 05 min)" in warn_dry.text
    assert "DRY-RUN" in json.dumps(B(warn_dry))


def test_terminate_wording_and_notify_only_refused():
    i = inst()
    d = decision(i.instance_id, action=Action.TERMINATE)
    msg = m.stopped(i, d, at=T0, channel="#c", dry_run=False, action=Action.TERMINATE)
    assert msg.text.startswith("Terminated idle GPU instance")
    assert "cannot be started again" in json.dumps(B(msg))
    with pytest.raises(ValueError, match="idle_notice"):
        m.idle_warning(i, d, marked_at=T0, stop_at=T0, channel="#c", dry_run=False, action=Action.NOTIFY)


def test_mark_cancelled_and_idle_notice():
    i = inst()
    c = m.mark_cancelled(i, reason="became active (max 87% >= 5%)", marked_at=T0, channel="#c")
    assert "Stop cancelled" in c.text and "became active (max 87% &gt;= 5%)" in c.text
    assert_within_slack_limits(c)

    d = decision(i.instance_id, code=ReasonCode.MEMORY_HELD_IDLE, evaluated_at=T0 + timedelta(hours=2),
                 action=Action.NOTIFY, reason="70 GiB held, activity 0%")
    n = m.idle_notice(i, d, since=T0, channel="#c")
    # First found idle at T0 after a 30-min window, evaluated 2 h later: idle since T0 - 30 min or earlier.
    assert "at least 2 h 30 min" in n.text and "or earlier" in n.text
    assert "Memory held is not work" in n.text
    assert "nothing will be stopped" in n.text
    assert_within_slack_limits(n)


def test_unknown_cost_is_unknown_not_zero():
    i = inst(hourly_cost=None)
    d = decision(i.instance_id, hourly_cost=None)
    msg = m.stopped(i, d, at=T0, channel="#c", dry_run=False, action=Action.STOP)
    assert "unknown $/h" in msg.text and "$0" not in msg.text


# ------------------------------------------------------------------ escaping


def test_user_controlled_values_are_escaped_everywhere():
    i = inst(tags={"owner": EVIL, "team": "R&D <ml>", "Name": "x>y"})
    d = decision(i.instance_id, rule_name="rule<&>", reason="tag owner=" + EVIL)
    built = [
        m.idle_warning(i, d, marked_at=T0, stop_at=T0 + timedelta(minutes=15), channel="#c", dry_run=True,
                       action=Action.STOP),
        m.stopped(i, d, at=T0, channel="#c", dry_run=False, action=Action.STOP),
        m.mark_cancelled(i, reason=EVIL, marked_at=T0, channel="#c"),
        m.idle_notice(i, d, since=T0, channel="#c"),
        m.metrics_unavailable([(i, d)], episode_start=T0, channel="#c"),
    ]
    for msg in built:
        for s in all_mrkdwn(msg):
            assert "<!channel>" not in s and "<@U012AB3CD>" not in s
            assert_safely_escaped(s)
        assert "&lt;!channel&gt; &amp; &lt;@U012AB3CD&gt;" in msg.text
        assert_within_slack_limits(msg)
    assert "R&amp;D &lt;ml&gt;" in json.dumps(B(built[0]))


def test_long_tag_values_are_clipped_without_breaking_entities():
    nasty = "&" * 256  # AWS allows 256-character tag values; each & becomes 5 characters
    i = inst(tags={"owner": nasty, "team": "<" * 256, "Name": ">" * 256})
    d = decision(i.instance_id, reason="r" * 5000)
    msg = m.idle_warning(i, d, marked_at=T0, stop_at=T0 + timedelta(minutes=15), channel="#c", dry_run=False,
                         action=Action.STOP)
    assert_within_slack_limits(msg)
    for s in all_mrkdwn(msg):
        assert_safely_escaped(s)


def test_clip_mrkdwn_never_cuts_an_entity_or_token():
    s = "a" * 2995 + "&amp;b"
    clipped = sb.clip_mrkdwn(s, 3000)
    assert len(clipped) <= 3000 and clipped.endswith("a…")
    s2 = "a" * 2990 + "<!date^1714564800^{time}|12:00 UTC>"
    assert sb.clip_mrkdwn(s2, 3000) == "a" * 2990 + "…"


# ------------------------------------------------------------------ many instances


def test_metrics_unavailable_with_500_instances_stays_within_limits():
    pairs = []
    for k in range(500):
        code = ReasonCode.NO_SERIES if k % 5 else ReasonCode.QUERY_ERROR
        i = inst(k, hourly_cost=float(k), tags={"owner": "o" * 256 if k % 2 else "&<>" * 80})
        pairs.append((i, decision(i.instance_id, verdict=Verdict.UNKNOWN, code=code,
                                  reason=f"no DCGM series for {i.instance_id} " + "x" * 400)))
    msg = m.metrics_unavailable(pairs, episode_start=T0, channel="#ops")
    assert_within_slack_limits(msg)
    for s in all_mrkdwn(msg):
        assert_safely_escaped(s)
    body = json.dumps(B(msg))
    assert "for 500 instances" in msg.text and "and 480 more" in body
    # The fallback text has a smaller budget: with hostile tag values it lists fewer, but the count stays true.
    shown = [line for line in msg.text.splitlines() if line.startswith("• ")]
    more = int(re.search(r"and (\d+) more", msg.text).group(1))
    assert 10 <= len(shown) <= 20 and len(shown) + more == 500
    listed = re.findall(r"`(i-[0-9a-f]{17})`", body)
    # The 20 most expensive, most expensive first.
    assert listed == [f"i-{k:017x}" for k in range(499, 479, -1)]
    assert "no metrics reported: 400" in body and "metrics query failed: 100" in body  # gpufinops/words.py
    assert "not idle" in msg.text


def test_metrics_unavailable_fallback_lists_twenty_with_ordinary_values():
    pairs = [(inst(k), decision(inst(k).instance_id, verdict=Verdict.UNKNOWN, code=ReasonCode.NO_SERIES,
                                reason="no DCGM series in the last 30 min")) for k in range(500)]
    msg = m.metrics_unavailable(pairs, episode_start=T0, channel="#ops")
    assert len([line for line in msg.text.splitlines() if line.startswith("• ")]) == 20
    assert msg.text.endswith("…and 480 more.")
    assert_within_slack_limits(msg)


def test_metrics_unavailable_single_instance_lists_it_without_more():
    i = inst()
    d = decision(i.instance_id, verdict=Verdict.UNKNOWN, code=ReasonCode.QUERY_ERROR, reason="Prometheus timeout")
    msg = m.metrics_unavailable([(i, d)], episode_start=T0, channel="#ops")
    assert "for 1 instance since" in msg.text
    assert "more" not in json.dumps(B(msg))
    assert "Prometheus timeout" in msg.text


def test_a_team_is_not_an_owner_and_a_stop_promises_no_daily_saving():
    # Issue 14: without an owner tag the message says so instead of printing the team as the owner.
    i = inst(tags={"team": "ml-research"})
    d = decision(i.instance_id)
    warn = m.idle_warning(i, d, marked_at=T0, stop_at=T0 + timedelta(minutes=15), channel="#c", dry_run=False,
                          action=Action.STOP)
    stop = m.stopped(i, d, at=T0, channel="#c", dry_run=False, action=Action.STOP)
    for msg in (warn, stop):
        fields = json.dumps(B(msg))
        assert "no owner tag" in fields and "owner ml-research" not in msg.text
    assert "/day" not in json.dumps(B(stop)) and "for every hour it stays stopped" in stop.text
    cancelled = m.mark_cancelled(i, reason="became active", marked_at=T0, channel="#c")
    # A warning withdrawn (say in dry-run) must not promise that nothing will ever be done.
    assert "nothing will be done" not in cancelled.text and "new warning first" in cancelled.text


def test_warning_buttons_are_valid_block_kit_and_the_snoozed_edit_drops_them():
    i = inst(instance_id=EVIL[:30])
    msg = m.idle_warning(i, decision(i.instance_id), marked_at=T0, stop_at=T0 + timedelta(minutes=15),
                         channel="#c", dry_run=False, action=Action.STOP, buttons=True)
    assert_within_slack_limits(msg)
    [actions] = [b for b in B(msg) if b["type"] == "actions"]
    assert {e["value"] for e in actions["elements"]} == {i.instance_id}
    assert not [b for b in B(m.idle_warning(i, decision(i.instance_id), marked_at=T0, stop_at=T0, channel="#c",
                                            dry_run=False, action=Action.STOP)) if b["type"] == "actions"]
    text, blocks = sb.snoozed_in_place(B(msg), user="U0ANA0001", until=T0, dry_run=False)
    assert "Snoozed by <@U0ANA0001>" in text and not [b for b in blocks if b["type"] == "actions"]
    assert not config.SLACK_USER_ID.fullmatch("WEB") and not config.SLACK_USER_ID.fullmatch("ml-team")  # tags, not ids
    text, _ = sb.snoozed_in_place(B(msg), user=EVIL, until=T0, dry_run=True)
    assert "<!channel>" not in text and "dry-run" in text  # a name that is not a user id is escaped


def test_idle_for_is_the_real_time_since_the_lull_began():
    i = inst()
    d = decision(i.instance_id)
    since = T0 - timedelta(hours=1, minutes=40)
    warn = m.idle_warning(i, d, marked_at=T0, stop_at=T0 + timedelta(minutes=15), channel="#c", dry_run=False,
                          action=Action.STOP, idle_since=since)
    fields = json.dumps(B(warn), ensure_ascii=False)
    assert "1 h 40 min (since <!date^" in fields and "≥ 30 min" not in fields
    unknown = m.idle_warning(i, d, marked_at=T0, stop_at=T0 + timedelta(minutes=15), channel="#c", dry_run=False,
                             action=Action.STOP)
    assert "≥ 30 min" in json.dumps(B(unknown), ensure_ascii=False)  # without the lull's start, the rule's window as a lower bound


def test_metrics_unavailable_names_the_marked_and_never_says_none_is_marked():
    """Issue 35: the alert about an instance already warned of a stop says its stop is held and comes only after a
    new warning once metrics return; about one not marked, that nothing is marked or stopped."""
    a, b = inst(0), inst(1)
    missing = dict(verdict=Verdict.UNKNOWN, code=ReasonCode.NO_SERIES, reason="no DCGM series")
    pairs = [(a, decision(a.instance_id, **missing)), (b, decision(b.instance_id, **missing))]
    plain_alert = m.metrics_unavailable(pairs, episode_start=T0, channel="#c")
    assert "none of them is marked or stopped until metrics return" in plain_alert.text
    held = m.metrics_unavailable(pairs, episode_start=T0, channel="#c", marked=[b.instance_id, "i-elsewhere"])
    for words in (held.text, held.lead):
        assert "none of them is marked" not in words
        assert "none of them is stopped or newly marked until metrics return" in words
        assert (f"{b.instance_id} was already marked for a stop: its stop is held, and once metrics return a stop "
                f"comes only after a new warning with a full lead.") in words
        promise = words.split("not idle: ", 1)[1].split("full lead.", 1)[0]
        assert a.instance_id not in promise and "i-elsewhere" not in words  # only the affected that are marked
    assert held.key == plain_alert.key  # the same event: its words change, not its identity


def test_metrics_unavailable_names_no_address_of_the_prometheus_it_could_not_reach():
    """The collector's reason names where Prometheus is (for the log); the alert says it in words (issue 35)."""
    i = inst()
    d = decision(i.instance_id, verdict=Verdict.UNKNOWN, code=ReasonCode.QUERY_ERROR,
                 reason="prometheus at 10.20.30.40:9090: cannot connect")
    msg = m.metrics_unavailable([(i, d)], episode_start=T0, channel="#ops")
    for text in (msg.text, json.dumps(B(msg))):
        assert "10.20.30.40" not in text and ":9090" not in text
        assert "Prometheus: cannot connect" in text
