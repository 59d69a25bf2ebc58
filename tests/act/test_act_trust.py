"""The act stage's promises when a peer misbehaves: no stop without a delivered warning (and its full lead
from delivery), the record equals the cloud after any error, managed and one-time spot instances are
never stopped, snoozes are capped, a process without the lease changes nothing.

Slack is the real slack_sdk against the local stub; EC2 is SimCloud with failures injected at the call.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from gpufinops.act.actuator import Actuator
from gpufinops.act.plan import snooze_of, stop_blocker
from gpufinops.config import SecretRef, SlackSettings, load_settings
from gpufinops.model import TAG_MARKED, TAG_SNOOZE, TAG_STOPPED_BY, Action, ActionKind, GpuInstance, RunContext
from gpufinops.notify.delivery import SlackNotifier
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.demo.sim import SimCloud
from tests.act.test_act import RULE, T0, World, make_fleet

TOKEN_ENV = "GPUFINOPS_TEST_SLACK_TOKEN"


class Refused(RuntimeError):
    definite = True  # as CloudError for a 4xx: EC2 certainly did not do it


class CalledOff(Refused):
    called_off = True  # as places.slurm.cloud.SlurmActionCalledOff: a person's word during the place's own wait


class FlakyCloud(SimCloud):
    """SimCloud whose next stop can fail in the ways EC2 does: `lost` (EC2 stopped it, the answer was lost),
    `refused` (EC2 did nothing), and whose describe can fail (`describe_fails`)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.stop_fault: str | None = None
        self.describe_fails = False
        self.describe_fails_after_stop = False  # EC2 becomes unreadable once the stop was sent

    def stop(self, inst):
        fault, self.stop_fault = self.stop_fault, None
        if fault == "refused":
            self.calls.append(("stop", inst.instance_id))
            raise Refused("RequestLimitExceeded: EC2 did not do it")
        if fault == "called_off":
            self.calls.append(("stop", inst.instance_id))
            raise CalledOff(f"{inst.instance_id}: not stopped: a person asked to snooze it during the wait")
        if fault == "inflight":  # EC2 carries it out only after the client gave up and read the state back
            self.calls.append(("stop", inst.instance_id))
            self.landing, self.reads_before_landing = inst, 1
            raise TimeoutError("read timeout on StopInstances")
        super().stop(inst)
        self.describe_fails = self.describe_fails or self.describe_fails_after_stop
        if fault == "lost":
            raise TimeoutError("read timeout on StopInstances")

    def describe(self, ids):
        if self.describe_fails:
            raise RuntimeError("DescribeInstances: InternalError")
        if getattr(self, "landing", None) is not None:
            if self.reads_before_landing == 0:
                self._replace(self.landing.instance_id, state="stopped")
                self.landing = None
            else:
                self.reads_before_landing -= 1
        return super().describe(ids)


class SlackWorld(World):
    """World with the real SlackNotifier (through the stub) and a FlakyCloud."""

    def __init__(self, tmp_path, stub, n=1, **kw):
        self.stub = stub
        super().__init__(tmp_path, n=n, **kw)
        self.cloud = FlakyCloud(self.cloud.list_gpu_instances(), self.clock)

    def open_store(self):
        super().open_store()
        slack = SlackSettings(token=SecretRef(env=TOKEN_ENV), base_url=self.stub.base_url, max_retries=0,
                              retry_backoff_s=60, default_channel="#gpu")
        self.notifier = SlackNotifier(slack, self.store, self.clock, timeout_s=2.0)

    def stops(self):
        return [c for c in self.cloud.calls if c[0] == "stop"]


@pytest.fixture
def slack(slack_stub, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "xoxb-test-token")
    return slack_stub


@pytest.mark.parametrize("failure", ["http500", "invalid_auth", "channel_not_found"])
def test_no_stop_while_the_warning_is_undelivered_then_the_full_lead_from_delivery(tmp_path, slack, failure):
    w = SlackWorld(tmp_path, slack)
    if failure == "http500":
        slack.fail_next(500, times=10_000, method="chat.postMessage")
    elif failure == "invalid_auth":
        slack.valid_tokens = {"xoxb-another"}
    else:
        slack.known_channels = {"#elsewhere"}
    for _ in range(60):  # an hour of ticks: far past the announced 15 minutes
        w.tick()
    assert w.stops() == [] and w.cloud.get("i-00").state == "running"
    mark = w.store.get_mark("i-00")
    assert mark is not None and mark.warned_at is None
    assert w.store.undelivered_count() >= 1  # what /readyz and /metrics show
    attempts = w.store.get_notification(f"warn:i-00:{mark.marked_at:%Y%m%dT%H%M%SZ}").attempts
    assert 2 <= attempts <= 8  # retried across ticks with backoff, not every tick

    slack.reset()  # Slack is fine again
    delivered_at = None
    for _ in range(60):
        w.tick()
        mark = w.store.get_mark("i-00")
        if delivered_at is None and mark is not None and mark.warned_at is not None:
            delivered_at = mark.warned_at
        if w.stops():
            break
    assert delivered_at is not None and len(slack.delivered()) >= 1
    stop = w.store.action_rows(kinds=[ActionKind.STOP])[-1]
    assert stop.status == "done" and stop.at >= delivered_at + timedelta(seconds=RULE.warning_lead_s)
    assert len(w.stops()) == 1


def test_lost_answer_to_stopinstances_is_read_back_as_done_with_its_bookkeeping(tmp_path, slack):
    w = SlackWorld(tmp_path, slack)
    w.tick()  # mark + warning
    w.cloud.stop_fault = "lost"
    for _ in range(16):
        w.tick()
    assert len(w.stops()) == 1
    [stop] = w.store.action_rows(kinds=[ActionKind.STOP])
    assert stop.status == "done" and "read-back" in stop.error
    inst = w.cloud.get("i-00")
    assert inst.state == "stopped" and inst.tags[TAG_STOPPED_BY] == "gpufinops" and TAG_MARKED not in inst.tags
    assert w.store.get_mark("i-00") is None
    assert any(m["text"].startswith("Stopped") for m in slack.delivered())


def test_unreadable_outcome_is_unconfirmed_then_reconciled_never_sent_twice(tmp_path, slack):
    w = SlackWorld(tmp_path, slack)
    w.tick()
    # Readable up to the stop (the stop re-reads the instance first), unreadable from the stop on.
    w.cloud.stop_fault, w.cloud.describe_fails_after_stop = "lost", True
    for _ in range(15):
        w.tick()
    [stop] = w.store.action_rows(kinds=[ActionKind.STOP])
    assert stop.status == "unconfirmed"
    for _ in range(5):  # EC2 still unreadable: nothing more is done to the instance
        w.tick()
    assert len(w.stops()) == 1
    w.cloud.describe_fails = w.cloud.describe_fails_after_stop = False
    w.tick()
    [stop] = w.store.action_rows(kinds=[ActionKind.STOP])
    assert stop.status == "done" and "reconciled" in stop.error
    assert w.cloud.get("i-00").tags[TAG_STOPPED_BY] == "gpufinops"
    assert [m for m in slack.delivered() if m["text"].startswith("Stopped")]  # the notice after a reconcile
    assert len(w.stops()) == 1


def test_a_stop_still_in_flight_at_the_read_back_is_unconfirmed_then_done_never_sent_twice(tmp_path, slack):
    w = SlackWorld(tmp_path, slack)
    for _ in range(15):
        w.tick()
    w.cloud.stop_fault = "inflight"
    w.tick()
    [stop] = w.store.action_rows(kinds=[ActionKind.STOP])
    assert stop.status == "unconfirmed" and w.cloud.get("i-00").state == "running"  # read back as not done yet
    w.tick()  # reconcile: the request has landed
    [stop] = w.store.action_rows(kinds=[ActionKind.STOP])
    assert stop.status == "done" and w.cloud.get("i-00").state == "stopped"
    assert len(w.stops()) == 1 and w.store.get_mark("i-00") is None
    assert [m for m in slack.delivered() if m["text"].startswith("Stopped")]


def test_a_refused_stop_is_recorded_failed_retried_and_given_up_after_three(tmp_path, slack):
    w = SlackWorld(tmp_path, slack)
    for _ in range(15):  # mark, then the 15-minute lead
        w.tick()
    assert w.stops() == []
    for _ in range(5):
        w.cloud.stop_fault = "refused"
        w.tick()
    assert len(w.stops()) == 3  # one call per intent, three intents, then it gives up
    rows = w.store.action_rows(kinds=[ActionKind.STOP])
    assert [r.status for r in rows] == ["failed"] * 3
    assert w.store.get_mark("i-00") is None and w.cloud.get("i-00").state == "running"
    for _ in range(20):  # not marked again in this idle episode
        w.tick()
    assert len(w.stops()) == 3


def test_a_stop_called_off_by_its_place_is_no_failure_and_is_never_given_up_on(tmp_path, slack):
    # A person's cancel during the place's own wait (a Slurm grace signal's): recorded "abandoned", not "failed",
    # so five of them do not make the three failures that give up the stop; the next plain tick stops it.
    w = SlackWorld(tmp_path, slack)
    for _ in range(15):  # mark, then the 15-minute lead
        w.tick()
    for _ in range(5):
        w.cloud.stop_fault = "called_off"
        report = w.tick()
        assert [(a.kind, a.ok) for a in report.actions] == [(ActionKind.SKIP, True)], report.actions
        assert "called off" in report.actions[0].reason and "a person asked to snooze it" in report.actions[0].reason
    assert len(w.stops()) == 5 and w.cloud.get("i-00").state == "running"
    rows = w.store.action_rows(kinds=[ActionKind.STOP])
    assert [r.status for r in rows] == ["abandoned"] * 5
    assert w.store.get_mark("i-00") is not None
    assert not [m for m in slack.delivered() if "fail" in m["text"].lower()]
    w.tick()
    assert len(w.stops()) == 6 and w.cloud.get("i-00").state == "stopped"
    assert [r.status for r in w.store.action_rows(kinds=[ActionKind.STOP])] == ["abandoned"] * 5 + ["done"]


def test_lease_lost_changes_nothing(tmp_path):
    class Lost:
        def check(self):
            raise RuntimeError("lease taken over by host-b:42 (token 8)")

    w = World(tmp_path)
    report = run_once(RunContext(now=w.clock.now, dry_run=False, lease=Lost()), w.settings, [RULE],
                      Peers(w.cloud, w.metrics, w.store, w.notifier))
    assert report.actions == [] and w.cloud.calls == [] and w.lines == []
    assert w.store.action_rows() == []


@pytest.mark.parametrize("changes,expected", [
    (dict(tags={"aws:autoscaling:groupName": "asg", "team": "ml"}, managed_by="Auto Scaling group 'asg'",
          managed_advice="scale the group down"), "managed by Auto Scaling group 'asg'"),
    (dict(lifecycle="spot", spot_request_type="one-time"), "one-time spot instance cannot be stopped"),
    (dict(lifecycle="spot", spot_request_type=""), "request type is unknown"),
])
def test_managed_and_unstoppable_spot_are_judged_and_told_never_stopped(tmp_path, changes, expected):
    w = World(tmp_path)
    inst = dataclasses.replace(w.cloud.get("i-00"), **changes)
    w.cloud = SimCloud([inst], w.clock)
    kinds = [a.kind for _ in range(40) for a in w.tick().actions]
    assert kinds == [ActionKind.NOTIFY]  # once per idle episode
    assert [c for c in w.cloud.calls if c[0] in ("stop", "set_tags")] == []
    assert len(w.lines) == 1  # one message to the owner, no warning of a stop that will not come
    [row] = w.store.action_rows(kinds=[ActionKind.NOTIFY])
    assert expected in row.reason
    if "managed_by" in changes:  # the monthly audit says who manages it and what to do instead
        from gpufinops.report.monthly import monthly_audit
        from gpufinops.report.render import render_html

        audit = monthly_audit(w.store, "2026-11", w.clock.now)
        assert audit.managed.to_dict("records") == [
            {"team": "ml", "instance_id": "i-00", "idle_episodes": 1, "managed_by": "Auto Scaling group 'asg'",
             "instead": "scale the group down"}]
        assert "Idle but managed by something else" in render_html(audit)


def test_persistent_spot_may_be_stopped_and_terminate_rule_may_end_one_time_spot():
    spot = GpuInstance("i-1", "g5.xlarge", "us-east-1", "running", T0, lifecycle="spot",
                       spot_request_type="persistent")
    assert stop_blocker(spot, Action.STOP) == ""
    one_time = dataclasses.replace(spot, spot_request_type="one-time")
    assert stop_blocker(one_time, Action.STOP) and stop_blocker(one_time, Action.TERMINATE) == ""


@pytest.mark.parametrize("value,active_until_days", [
    ("2099-01-01T00:00:00Z", 7),   # far future: capped at 7 days after it was first seen
    ("next tuesday", 7),           # unreadable: a snooze of the cap, not forever
    ((T0 + timedelta(days=2)).isoformat(), 2),
])
def test_snooze_is_capped_from_first_seen(value, active_until_days):
    inst = make_fleet(1, **{"i-00": {TAG_SNOOZE: value}})[0]
    seen = T0
    assert snooze_of(inst, T0 + timedelta(days=active_until_days, minutes=-1), seen).active
    after = snooze_of(inst, T0 + timedelta(days=active_until_days, minutes=1), seen)
    assert not after.active
    assert snooze_of(inst, T0, seen).capped == (active_until_days == 7)


def test_a_capped_snooze_expires_in_the_service_and_the_instance_is_marked(tmp_path):
    w = World(tmp_path, **{"i-00": {TAG_SNOOZE: "2099-01-01T00:00:00Z"}})
    w.settings = load_settings(act={"dry_run": False, "max_snooze_s": 3600, "max_stops_fraction": 1.0})
    kinds = [a.kind for _ in range(50) for a in w.tick().actions]
    assert kinds[0] == ActionKind.SKIP and "capped at 1 h" in w.store.action_rows()[0].reason
    assert ActionKind.MARK not in kinds
    kinds = [a.kind for _ in range(15) for a in w.tick().actions]
    assert ActionKind.MARK in kinds  # the hour since first seen is over

    # The monthly audit counts it per team, as capped.
    from gpufinops.report.monthly import monthly_audit

    audit = monthly_audit(w.store, "2026-11", w.clock.now)
    assert audit.snoozes.to_dict("records") == [
        {"team": "ml", "instance_id": "i-00", "snoozes": 1, "capped": 1, "unreadable": 0}]


def test_cancelling_an_undelivered_warning_abandons_it_silently(tmp_path, slack):
    w = SlackWorld(tmp_path, slack)
    slack.fail_next(500, times=10_000, method="chat.postMessage")
    w.tick()
    w.metrics.mode["i-00"] = "busy"
    w.tick()
    assert w.store.get_mark("i-00") is None and TAG_MARKED not in w.cloud.get("i-00").tags
    slack.reset()
    for _ in range(90):  # past every backoff: the dead warning is never sent, nor a "cancelled" for it
        w.tick()
    assert slack.delivered() == []
    assert w.store.undelivered_count() == 0


def test_actuator_reconcile_raises_when_the_cloud_cannot_be_read(tmp_path):
    w = World(tmp_path)
    w.store.begin_action("r", "i-00", ActionKind.STOP, RULE.name, False, "idle", T0)
    cloud = FlakyCloud(w.cloud.list_gpu_instances(), w.clock)
    cloud.describe_fails = True
    with pytest.raises(RuntimeError):
        Actuator(cloud, w.store, w.notifier, w.settings).reconcile(T0)
    assert w.store.action_rows(status="pending")  # left for the next try, not guessed


def test_a_crash_between_the_stop_and_its_bookkeeping_is_finished_by_reconcile(tmp_path, slack):
    w = SlackWorld(tmp_path, slack)
    for _ in range(15):
        w.tick()
    real_after_stop = Actuator._after_stop

    def crash(self, *a, **kw):
        raise SystemExit("killed after StopInstances, before its tags and notice")

    Actuator._after_stop = crash
    try:
        with pytest.raises(SystemExit):
            w.tick()
    finally:
        Actuator._after_stop = real_after_stop
    [stop] = w.store.action_rows(kinds=[ActionKind.STOP])
    assert stop.status == "applied" and w.store.get_mark("i-00") is not None
    w.open_store()  # the restarted service
    w.tick()
    [stop] = w.store.action_rows(kinds=[ActionKind.STOP])
    assert stop.status == "done" and w.store.get_mark("i-00") is None
    inst = w.cloud.get("i-00")
    assert inst.tags[TAG_STOPPED_BY] == "gpufinops" and TAG_MARKED not in inst.tags
    assert len([m for m in slack.delivered() if m["text"].startswith("Stopped")]) == 1 and len(w.stops()) == 1


def test_the_stop_notice_replies_under_its_warning_and_a_lost_answer_is_found_in_the_thread(tmp_path, slack):
    w = SlackWorld(tmp_path, slack)
    w.tick()  # mark + warning
    [warning] = [m for m in slack.delivered() if m["text"].startswith("Idle GPU instance")]
    for _ in range(14):
        w.tick()
    slack.lose_next_answer(status=500, method="chat.postMessage")  # Slack posts the notice, the answer is lost
    for _ in range(3):
        w.tick()
    assert len(w.stops()) == 1
    stopped = [m for m in slack.delivered() if m["text"].startswith("Stopped")]
    assert len(stopped) == 1 and stopped[0]["thread_ts"] == warning["ts"]  # once, in the warning's thread
    assert slack.calls_for("conversations.replies")  # a reply is looked up where it lives, not in the history
    assert not [m for m in slack.delivered() if "thread_ts" not in m and m["text"].startswith("Stopped")]


def test_routing_team_channel_owner_dm_and_a_failed_dm_never_holds_the_stop(tmp_path, slack):
    w = SlackWorld(tmp_path, slack, n=2, **{"i-00": {"owner": "ana@example.com"}, "i-01": {"owner": "nobody@x.io"}})
    w.settings = load_settings(act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 1.0},
                               slack={"team_channels": {"ml": "#ml-gpu"}, "dm_owners": True})
    slack.users["UANA"] = {"id": "UANA", "name": "ana", "profile": {"email": "ana@example.com"}}
    w.tick()
    warnings = [p for p in slack.posted() if p["text"].startswith("Idle GPU instance")]
    by_channel = sorted((p["channel"], p["text"].split()[3]) for p in warnings)
    # Both in the team's channel (not the default one); ana's also as a direct message; nobody@x.io has no user.
    assert by_channel == [("#ml-gpu", "i-00"), ("#ml-gpu", "i-01"), ("UANA", "i-00")]
    for _ in range(16):
        w.tick()
    assert len(w.stops()) == 2  # the missing DM held nothing back
    # Replies in the warnings' threads, in the team's channel; ana's also under her DM warning (issue 35: every
    # notice about an instance takes its warning's routes).
    stopped = sorted((p["channel"], p.get("thread_ts") is not None) for p in slack.posted()
                     if p["text"].startswith("Stopped"))
    assert stopped == sorted([(slack.channel_id("#ml-gpu"), True)] * 2 + [(slack.channel_id("UANA"), True)])
    assert w.store.undelivered_count() == 0  # a DM that could not be addressed is not a failed delivery


def test_a_kubernetes_workload_is_scaled_to_zero_never_terminated():
    workload = GpuInstance("k8s:ml/Deployment/infer", "p4d.24xlarge", "us-east-1", "running", T0,
                           provider="kubernetes")
    assert stop_blocker(workload, Action.STOP) == ""
    assert "never deleted" in stop_blocker(workload, Action.TERMINATE)
