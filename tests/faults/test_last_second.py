"""The person always wins the last second (issue 23): cancels that reach the stop, a stop fenced at the cloud,
records that equal the cloud after a late request, the opt-in the IAM policy enforces, and messages that stay
true. Each case failed on the main of 2026-12-04; each ends with the matrix' invariants.

The EC2 proxy evaluates the shipped IAM policies (deploy/iam-policy*.json) at the moment a request reaches
moto (harness.World), so a StopInstances still in flight after the mark was removed is refused as AWS would.
Standard timeline as in test_matrix: +2 min IDLE -> tag + warning, stop due at +7.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufinops.notify import interact
from gpufinops.model import TAG_MARKED, TAG_SNOOZE, ActionKind
from tests.faults.faultproxy import aws_action, aws_error_body, prom_query_contains
from tests.faults.harness import (
    METRICS_ALERT,
    OPT_IN_TAG,
    STOPPED_STATES,
    alert,
    check_invariants,
    is_warning_for,
    log_line,
)
from tests.faults.test_matrix import STOP_FAILED, state_of, wait_until

pytestmark = pytest.mark.integration

CLICKER = "U0SNOOZER1"


def click_snooze(w, name: str, *, minutes_from_now: int = 120) -> str:
    """A verified Snooze click as the HTTP endpoint stores it (gpufinops.interact), for the leader to apply."""
    until = (w.now + timedelta(minutes=minutes_from_now)).strftime("%Y-%m-%dT%H:%M:%SZ")
    interact.keep_request(w.store, interact.SnoozeRequest(
        instance_id=w.ids[name], until=until, user_id=CLICKER, user_name="ana", action_id="snooze_2h",
        channel_id="", message_ts="", requested_at=w.now.isoformat()))
    return until


def creates_tag(key: str):
    def match(req) -> bool:
        return req.aws_action == "CreateTags" and any(
            v == key for k, vs in req.params.items() if k.startswith("Tag.") and k.endswith(".Key") for v in vs)
    return match


def removes_tag(key: str):
    def match(req) -> bool:
        return req.aws_action == "DeleteTags" and any(
            v == key for k, vs in req.params.items() if k.startswith("Tag.") and k.endswith(".Key") for v in vs)
    return match


def person_removes_mark(w, name: str) -> None:
    w.aws.client("ec2").delete_tags(Resources=[w.ids[name]], Tags=[{"Key": TAG_MARKED}])


# --------------------------------------------------------------------------- 1. the Snooze click


def test_snooze_click_is_applied_under_the_shipped_policy(world):
    w = world()
    w.run(2)
    click_snooze(w, "idle")
    w.run(5, 8, 9)
    state, tags = w.cloud_state()[w.ids["idle"]]
    assert state == "running" and TAG_SNOOZE in tags and TAG_MARKED not in tags
    assert w.ec2.iam_denials() == []
    check_invariants(w, log_line("snooz", level=20))


def test_snooze_that_cannot_be_written_still_holds_and_the_clicker_is_told(world, slack_stub):
    # The tag write is refused (an older policy that denies gpufinops:snooze-until): the click is a person's
    # word to keep the machine running, and our failure to write a tag never overrides it.
    w = world()
    w.ec2.arm("aws_error", creates_tag(TAG_SNOOZE), status=403,
              body=aws_error_body("UnauthorizedOperation", "You are not authorized to perform this operation."))
    w.run(2)
    click_snooze(w, "idle")
    w.run(5, 8, 9, 10, 12)
    assert state_of(w, "idle") == "running"
    assert w.ec2.stops_reached() == {}
    told = [c for c in slack_stub.calls if c.method == "chat.postMessage" and c.ok
            and c.body.get("channel") == CLICKER]
    assert len(told) == 1 and "holds" in told[0].body["text"] and TAG_SNOOZE in told[0].body["text"]
    # the mark is gone (the stop is cancelled at the cloud too), and no more than a few tag writes were tried
    assert TAG_MARKED not in w.cloud_state()[w.ids["idle"]][1]
    assert len([r for r in w.ec2.seen if creates_tag(TAG_SNOOZE)(r)]) <= 3
    check_invariants(w, log_line("could not be written|snooze"))


# --------------------------------------------------------------------------- 2-3. requests that land late


def test_stale_leaders_stop_landing_after_a_takeover_is_refused_by_the_fence(world):
    # Leader A's StopInstances is held on the way (a paused process); the standby takes over, settles the row
    # once no request of A's can be answered any more, stops the instance itself; a person starts it again;
    # then A's old request lands: refused by AWS, because the mark that announced it is gone.
    w = world()
    w.run(2)
    w.ec2.arm("hold", aws_action("StopInstances"), times=1, seconds=120)
    w.tick(8)  # A: StopInstances held, the client times out; the outcome is unconfirmed
    assert w.ec2.stops_reached() == {}
    w.restart()  # the standby takes over the same database
    w.tick(9)  # B: A's request can no longer be in flight from B's view: settled from EC2, then B stops it
    assert state_of(w, "idle") in STOPPED_STATES and w.ec2.stops_reached() == {w.ids["idle"]: 1}
    w.aws.client("ec2").start_instances(InstanceIds=[w.ids["idle"]])  # a person starts it again
    w.restarted_by_person.add(w.ids["idle"])
    w.ec2.release_held()
    assert wait_until(lambda: w.ec2.iam_denials(aws_action("StopInstances")))
    assert state_of(w, "idle") == "running"
    assert w.ec2.stops_reached() == {w.ids["idle"]: 1}
    check_invariants(w, *STOP_FAILED, log_line("unconfirmed|in flight|timed out|timeout"))


def test_late_stop_after_a_restart_is_recorded_applied_and_announced(world):
    # StopInstances held on the way; the service is restarted 15 s later: the row stays open while the request
    # may still land, the request lands (the mark is still on: AWS lets it through), and the record follows.
    w = world()
    w.run(2)
    w.ec2.arm("hold", aws_action("StopInstances"), times=1, seconds=120)
    w.tick(8)
    w.restart()
    w.tick(8.25)  # within the in-flight window: not settled as "failed"
    [row] = w.store.action_rows(kinds=[ActionKind.STOP])
    assert row.status in ("pending", "unconfirmed")
    w.ec2.release_held()
    assert wait_until(lambda: w.ec2.stops_reached())
    w.run(10)
    [row] = w.store.action_rows(kinds=[ActionKind.STOP])
    assert row.status == "done" and state_of(w, "idle") in STOPPED_STATES
    check_invariants(w, *STOP_FAILED, log_line("in flight|unconfirmed|reconcil"))


def test_every_tag_change_that_reaches_the_cloud_has_its_row(world, slack_stub):
    # The warning is delivered late: the mark tag is rewritten with the new stop time, and audited.
    w = world()
    slack_stub.known_channels = {"#somewhere-else"}  # Slack answers channel_not_found: certainly not delivered
    w.heal_hooks.append(lambda: setattr(slack_stub, "known_channels", None))
    w.run(2)  # marked, the warning not delivered
    slack_stub.known_channels = None
    w.run(4, 5, 12, 13)  # delivered at +4: the stop moves from +7 to +9
    iid = w.ids["idle"]
    mark_writes = [r for r in w.ec2.reached(creates_tag(TAG_MARKED)) if iid in r.request.params.get("ResourceId.1", [])]
    rows = [r for r in w.store.action_rows(instance_id=iid)
            if r.kind in (ActionKind.MARK, ActionKind.TAG) and "stopped-by" not in r.reason and not r.dry_run
            and "removed" not in r.reason]
    assert len(mark_writes) >= 2, "the late delivery did not move the announced time"
    assert len(rows) == len(mark_writes), [(r.kind, r.reason) for r in rows]
    check_invariants(w, log_line("not delivered|deliver"))


# --------------------------------------------------------------------------- 4. cancels in the last seconds


def test_mark_removed_after_the_plan_is_not_stopped(world):
    # The person removes the mark between the tick's listing and its StopInstances: the re-read sees it.
    w = world()
    w.run(2)
    w.ec2.arm("hook", lambda r: r.aws_action == "DescribeInstances" and "MaxResults" in r.params, times=1,
              hook=lambda _r: person_removes_mark(w, "idle"), after=True, forward=True)
    w.run(8, 9)
    assert state_of(w, "idle") == "running" and w.ec2.stops_reached() == {}
    check_invariants(w, log_line("removed|cancel"))


def test_mark_removed_after_the_last_read_is_refused_at_the_cloud(world):
    # The person removes the mark after the service's last read, before its StopInstances lands: the IAM fence.
    w = world()
    w.run(2)
    w.ec2.arm("hook", lambda r: r.aws_action == "DescribeInstances"
              and "instance-id" in r.params.get("Filter.1.Name", []), times=1,
              hook=lambda _r: person_removes_mark(w, "idle"), after=True, forward=True)
    w.run(8)
    assert w.ec2.iam_denials(aws_action("StopInstances"))
    w.run(9)
    assert state_of(w, "idle") == "running" and w.ec2.stops_reached() == {}
    check_invariants(w, *STOP_FAILED, log_line("UnauthorizedOperation|cancel"))


# --------------------------------------------------------------------------- 5. the opt-in


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "live"])
def test_not_opted_in_is_never_warned_or_stopped_even_without_iam(world, dry_run):
    w = world(fleet={"idle": {"tags": {OPT_IN_TAG: "no"}}, "busy": {}}, dry_run=dry_run)
    w.ec2.enforce_iam()  # moto alone: the code must apply the opt-in itself
    w.run(2, 3, 8, 9)
    iid = w.ids["idle"]
    assert w.aws.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0][
        "State"]["Name"] == "running"
    assert w.ec2.reached(aws_action("StopInstances")) == []
    texts = [m.text for m in w.delivered() if iid in m.text]
    assert not any(is_warning_for(t, iid) or "would be stopped (dry-run)" in t for t in texts), texts
    assert len([t for t in texts if f"not opted in: gpufinops stops only instances tagged {OPT_IN_TAG}=true" in t]) == 1
    check_invariants(w, alert("not opted in", 1))


# --------------------------------------------------------------------------- 6. a message that is not true


def test_missing_data_under_one_rule_holds_the_stop_of_another(world, tmp_path):
    # Two rules on the same instance: the 2-minute rule's queries fail (UNKNOWN, alerted "nothing is marked or
    # stopped until metrics return"), the 1-minute rule finds it IDLE. The alert's promise holds.
    rules = tmp_path / "two-rules"
    rules.mkdir()
    (rules / "faults.yaml").write_text(
        "rules:\n"
        "  - {name: short, threshold_pct: 40, window: 60s, aggregation: stays_below, min_coverage: 0.5,\n"
        "     warning_lead: 300s, action: stop, notify_to: ['slack:#gpu-finops']}\n"
        "  - {name: longer, threshold_pct: 40, window: 120s, aggregation: stays_below, min_coverage: 0.5,\n"
        "     warning_lead: 300s, action: stop, notify_to: ['slack:#gpu-finops']}\n")
    w = world(rules_dir=rules)
    w.prom.arm("status", prom_query_contains("[119999ms]"), status=500)
    w.run(2, 3, 8, 9)
    assert state_of(w, "idle") == "running"
    assert not any(is_warning_for(m.text, w.ids["idle"]) for m in w.delivered())
    assert w.store.get_mark(w.ids["idle"]) is None
    check_invariants(w, alert(METRICS_ALERT, 1))


# --------------------------------------------------------------------------- turn 2: the process around it


def test_prometheus_dies_mid_run(world):
    # The stop tick's first queries are answered, then every connection is refused (and stays so a while).
    w = world()
    w.run(2)
    w.prom.arm("refuse", skip=2)
    w.run(8, 9, 10)
    assert state_of(w, "idle") == "running"
    check_invariants(w, alert(METRICS_ALERT, 1), log_line("prometheus|metrics"))


def test_service_down_across_the_announced_time_warns_again(world):
    # Warned at +2 (stop at +7); the service is down until +40: the old warning is not acted on.
    w = world()
    w.run(2)
    w.restart()
    w.run(40)
    assert state_of(w, "idle") == "running"
    w.run(41, 47)
    warned = [m for m in w.delivered() if is_warning_for(m.text, w.ids["idle"])]
    assert len(warned) == 2
    check_invariants(w, log_line("warning again|not running", level=20))


def test_clock_jumps_forward_after_the_warning(world):
    # The warning is delivered at +2 (stop at +7); a minute later the clock leaps an hour.
    w = world()
    w.run(2)
    w.tick(63, true_minutes=3)
    w.tick(64, true_minutes=4)
    assert state_of(w, "idle") == "running"
    w.tick(70, true_minutes=10)
    check_invariants(w, log_line("leapt|warning again", level=20))
