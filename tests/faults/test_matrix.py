"""The fault matrix, in-process: Prometheus, EC2, Slack, managed instances, the database and the clock.

Every case injects one fault through the proxies (or the stub, the database file, the clock), runs
the service on its simulated clock over a standard timeline, and ends with `check_invariants`.

The standard timeline (rule: idle under 40% for 60 s, warning lead 5 min):
    +2 min  the idle instance is judged IDLE: tag + Slack warning, stop due at +7
    +8 min  past the lead: the stop is due
"""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpufinops.model import TAG_MARKED, ActionKind
from tests.faults.faultproxy import (
    DCGM_SENTINEL,
    aws_action,
    aws_error_body,
    prom_query_contains,
    sentinel_values,
    slack_method,
)
from tests.faults.harness import (
    METRICS_ALERT,
    STOPPED_STATES,
    alert,
    check_invariants,
    log_line,
    metric,
    run_error,
)

pytestmark = pytest.mark.integration

TIMELINE = (2, 8)
PROM_DOWN = (alert(METRICS_ALERT, 1), log_line("prometheus|metrics"))
STOP_FAILED = (log_line(r"stop.*(fail|unconfirmed|error)|StopInstances"), metric("gpufinops_evaluation_errors_total"))
EVALUATION_FAILED = (metric("gpufinops_evaluation_errors_total"), run_error(""), log_line("fail|error"))


def failed_visibly(tick) -> bool:
    """The run raised (a job error) or reported an error or a degraded source."""
    return bool(tick.error or tick.report.errors or tick.report.degraded())


def wait_until(pred, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def state_of(w, name: str) -> str:
    return w.aws.state(w.ids[name])


# --------------------------------------------------------------------------- Prometheus

PROM_FAULTS = {
    "prom_refused": {"mode": "refuse"},
    "prom_http_503": {"mode": "status", "status": 503},
    "prom_http_429_retry_after": {"mode": "status", "status": 429, "headers": {"Retry-After": "1"}},
    "prom_slow_past_timeout": {"mode": "delay", "seconds": 4.0},
    "prom_cut_body": {"mode": "cut"},
    "prom_lost_answer_500": {"mode": "lost"},
}


@pytest.mark.parametrize("fault", list(PROM_FAULTS), ids=list(PROM_FAULTS))
def test_prometheus_unavailable_means_unknown_no_stop_one_alert(world, fault):
    w = world()
    w.prom.arm(**PROM_FAULTS[fault])
    w.run(*TIMELINE)
    for t in w.ticks:
        assert t.report is not None and t.report.decisions
        assert all(d.verdict.value == "UNKNOWN" for d in t.report.decisions), fault
    assert state_of(w, "idle") == "running"
    check_invariants(w, *PROM_DOWN)


@pytest.mark.parametrize("value", [str(DCGM_SENTINEL), "250", "-3"], ids=["sentinel", "util_250pct", "negative"])
def test_prom_rewritten_values_in_every_answer_mean_invalid_data(world, value):
    w = world()
    w.prom.arm("rewrite", prom_query_contains(""), transform=lambda body: sentinel_values(body, value))
    w.run(*TIMELINE)
    codes = {d.code.value for t in w.ticks for d in t.report.decisions}
    assert codes == {"invalid_data"}, codes
    assert state_of(w, "idle") == "running"
    check_invariants(w, alert(METRICS_ALERT, 1))


def test_prom_sentinel_in_aggregated_answers_only(world):
    # Only the clean (server-side aggregated) answers carry the sentinel; the raw ones look fine.
    w = world()
    w.prom.arm("rewrite", prom_query_contains("label_replace"), transform=sentinel_values)
    w.run(*TIMELINE)
    assert all(d.code.value == "invalid_data" for t in w.ticks for d in t.report.decisions)
    assert state_of(w, "idle") == "running"
    check_invariants(w, alert(METRICS_ALERT, 1))


@pytest.mark.parametrize("profile", ["sentinel", "out_of_range"])
def test_prom_raw_bad_samples_in_the_tsdb_mean_unknown(world, profile):
    # No proxy fault: the stored series themselves hold a DCGM sentinel / a 250% sample each minute.
    w = world(fleet={"bad": {"profile": profile, "stoppable": False}, "busy": {}})
    w.run(*TIMELINE)
    assert all(d.verdict.value == "UNKNOWN" for t in w.ticks for d in t.report.decisions if d.instance_id == w.ids["bad"])
    check_invariants(w, alert(METRICS_ALERT, 1))


def test_prom_outage_during_the_lead_blocks_the_stop(world):
    w = world()
    w.tick(2)  # warned with good data
    w.prom.arm("status", status=500)
    w.run(8, 12)  # the stop falls due during the outage
    assert state_of(w, "idle") == "running"
    assert TAG_MARKED in w.aws.tags(w.ids["idle"])  # UNKNOWN keeps the mark, never stops
    check_invariants(w, *PROM_DOWN)


def test_prom_one_query_of_the_set_fails(world):
    # A partial answer set (one query 500, the others fine) is not a verdict.
    w = world()
    w.prom.arm("status", prom_query_contains("count_over_time"), status=500)
    w.run(*TIMELINE)
    assert all(d.verdict.value == "UNKNOWN" for t in w.ticks for d in t.report.decisions)
    check_invariants(w, *PROM_DOWN)


# --------------------------------------------------------------------------- EC2 inventory

INVENTORY_FAULTS = {
    "describe_http_500": {"mode": "status", "status": 500},
    "describe_refused": {"mode": "refuse"},
    "describe_request_limit_exceeded": {"mode": "aws_error", "status": 503, "body": aws_error_body("RequestLimitExceeded")},
    "describe_cut_body": {"mode": "cut"},
}


@pytest.mark.parametrize("fault", list(INVENTORY_FAULTS), ids=list(INVENTORY_FAULTS))
def test_inventory_failure_stops_nothing(world, fault):
    w = world()
    w.tick(2)
    w.ec2.arm(when=aws_action("DescribeInstances"), **INVENTORY_FAULTS[fault])
    w.run(8, 12)
    assert state_of(w, "idle") == "running"
    check_invariants(w, run_error("inventory"), log_line("inventory|DescribeInstances"))


# --------------------------------------------------------------------------- EC2 stop

STOP_REFUSED = {
    "stop_request_limit_exceeded": {"mode": "aws_error", "status": 503, "body": aws_error_body("RequestLimitExceeded")},
    "stop_unsupported_operation": {"mode": "aws_error", "status": 400, "body": aws_error_body("UnsupportedOperation")},
    "stop_internal_error": {"mode": "aws_error", "status": 500, "body": aws_error_body("InternalError")},
    "stop_connection_refused": {"mode": "refuse"},
}


@pytest.mark.parametrize("fault", list(STOP_REFUSED), ids=list(STOP_REFUSED))
def test_stop_rejected_is_recorded_failed_and_not_repeated_blindly(world, fault):
    # The StopInstances never reaches moto: the instance keeps running and the record says so. No case here waits
    # for a timeout, so the EC2 read timeout is roomier than the 2 s default: a moto answer slowed by a busy
    # machine must not turn the mark before it into an unconfirmed one (then re-marked, and the stop falls
    # outside the timeline), which is another case (test_mark_tag_fails_no_warning_no_stop).
    w = world(ec2_read_timeout_s=6.0)
    w.ec2.arm(when=aws_action("StopInstances"), **STOP_REFUSED[fault])
    w.run(*TIMELINE, 9)
    assert state_of(w, "idle") == "running"
    assert w.ec2.stops_reached() == {}
    # A 4xx is failed at once; a 5xx or a reset is "unconfirmed" until the next tick reads the instance back
    # (the request might have been carried out), then failed. check_invariants runs once more: none left open.
    rows = w.store.action_rows(kinds=[ActionKind.STOP])
    assert rows and all(r.status in ("failed", "unconfirmed") for r in rows)
    assert all(r.status == "failed" for r in rows[:-1])
    check_invariants(w, *STOP_FAILED)


STOP_AMBIGUOUS = {
    "stop_lost_answer_500": {"mode": "lost"},
    "stop_lost_answer_reset": {"mode": "lost", "as_reset": True},
    "stop_answer_after_timeout": {"mode": "late", "seconds": 3.5},
    "stop_delayed_before_forward": {"mode": "delay", "seconds": 3.5},
}


@pytest.mark.parametrize("fault", list(STOP_AMBIGUOUS), ids=list(STOP_AMBIGUOUS))
def test_stop_acted_but_answer_lost_is_read_back_never_repeated(world, fault):
    # moto stops the instance, the client sees a 500 / reset / timeout: one StopInstances only,
    # the state is read back and the stop is recorded done.
    w = world()
    w.ec2.arm(when=aws_action("StopInstances"), times=1, **STOP_AMBIGUOUS[fault])
    w.run(*TIMELINE)
    # No race with the next tick: the delayed request has reached moto before the service runs again.
    assert wait_until(lambda: w.ec2.stops_reached()), "the StopInstances never reached moto"
    w.run(9, 10)
    assert state_of(w, "idle") in STOPPED_STATES
    assert w.ec2.stops_reached() == {w.ids["idle"]: 1}
    check_invariants(w, *STOP_FAILED, log_line("unconfirmed|read back|timed out|timeout|reset|500"))


def test_stop_lost_answer_then_readback_fails_too(world):
    w = world()
    w.ec2.arm("lost", aws_action("StopInstances"), times=1)
    w.run(*TIMELINE)
    w.ec2.arm("status", aws_action("DescribeInstances"), status=500, times=2)  # the read-back fails as well
    w.run(9, 10, 11)
    assert w.ec2.stops_reached() == {w.ids["idle"]: 1}
    check_invariants(w, *STOP_FAILED)


def test_mark_tag_fails_no_warning_no_stop(world):
    w = world()
    w.ec2.arm("aws_error", aws_action("CreateTags"), status=500,
              body=aws_error_body("InternalError"))
    w.run(*TIMELINE)
    assert state_of(w, "idle") == "running"
    check_invariants(w, log_line("mark|CreateTags|tag"))


def test_stopped_by_tag_fails_after_the_stop(world):
    # StopInstances goes through, the CreateTags stopped-by after it fails: the stop is still one stop, recorded done.
    w = world()
    w.ec2.arm("aws_error", lambda r: r.aws_action == "CreateTags" and "stopped-by" in r.body.decode(),
              status=500, body=aws_error_body("InternalError"))
    w.run(*TIMELINE, 9)
    assert state_of(w, "idle") in STOPPED_STATES
    check_invariants(w, log_line("tag"))


# --------------------------------------------------------------------------- managed and spot

@pytest.mark.parametrize("tag", ["aws:autoscaling:groupName", "eks:cluster-name", "karpenter.sh/nodepool"])
def test_managed_by_tag_is_judged_never_stopped(world, tag):
    w = world(fleet={"idle": {"tags": {tag: "pool-a"}, "stoppable": False}, "busy": {}})
    w.run(*TIMELINE)
    assert state_of(w, "idle") == "running" and w.ec2.stops_reached() == {}
    assert any(d.verdict.value == "IDLE" for d in w.ticks[0].report.decisions)  # judged
    check_invariants(w, alert("managed by"), log_line("managed"))


def test_member_of_a_real_asg_is_never_stopped(world, aws):
    w = world(fleet={"idle": {"stoppable": False}, "busy": {}})
    asg = aws.client("autoscaling")
    asg.create_launch_configuration(LaunchConfigurationName="faults-lc", ImageId=aws.ami(), InstanceType="g5.xlarge")
    asg.create_auto_scaling_group(AutoScalingGroupName="faults-asg", LaunchConfigurationName="faults-lc", MinSize=0,
                                  MaxSize=2, DesiredCapacity=0, AvailabilityZones=["us-east-1a"])
    asg.attach_instances(InstanceIds=[w.ids["idle"]], AutoScalingGroupName="faults-asg")
    w.run(*TIMELINE)
    assert state_of(w, "idle") == "running"
    check_invariants(w, alert("managed by"), log_line("managed"))


def test_one_time_spot_is_never_stopped(world):
    w = world(fleet={"idle": {"spot": True, "stoppable": False}, "busy": {}})
    w.run(*TIMELINE)
    assert state_of(w, "idle") == "running"
    check_invariants(w, alert("spot instance"), log_line("spot"))


# --------------------------------------------------------------------------- Slack

UNDELIVERABLE = {
    "slack_500_every_post": {"mode": "status", "status": 500},
    "slack_refused": {"mode": "refuse"},
}


@pytest.mark.parametrize("fault", list(UNDELIVERABLE), ids=list(UNDELIVERABLE))
def test_warning_never_delivered_means_no_stop(world, fault):
    w = world()
    w.slack.arm(when=slack_method("chat.postMessage"), **UNDELIVERABLE[fault])
    w.run(*TIMELINE, 12, 20)
    assert state_of(w, "idle") == "running" and w.ec2.stops_reached() == {}
    check_invariants(w, log_line("not delivered|deliver|slack"))


@pytest.mark.parametrize("error", ["invalid_auth", "channel_not_found"])
def test_slack_refuses_the_warning_means_no_stop(world, slack_stub, error):
    w = world()
    if error == "invalid_auth":
        slack_stub.valid_tokens = {"xoxb-someone-else"}
    else:
        slack_stub.known_channels = {"#somewhere-else"}
    w.heal_hooks.append(lambda: setattr(slack_stub, "valid_tokens", None))
    w.heal_hooks.append(lambda: setattr(slack_stub, "known_channels", None))
    w.run(*TIMELINE, 12)
    assert state_of(w, "idle") == "running"
    check_invariants(w, log_line(error))


def test_slack_429_retry_after_is_waited_and_delivered_once(world):
    w = world()
    w.slack.arm("status", slack_method("chat.postMessage"), status=429, headers={"Retry-After": "1"},
                body=b'{"ok": false, "error": "ratelimited"}', times=1)
    w.run(*TIMELINE, 9)
    assert any("will be stopped" in m.text for m in w.delivered())
    check_invariants(w, log_line("rate|429|retry", logging.INFO))


SLACK_AMBIGUOUS = {
    "slack_lost_answer_500": {"mode": "lost"},
    "slack_lost_answer_reset": {"mode": "lost", "as_reset": True},
    "slack_answer_after_timeout": {"mode": "late", "seconds": 3.0},
    "slack_cut_body": {"mode": "cut"},  # Slack posted it; the client reads half an answer
}


@pytest.mark.parametrize("fault", list(SLACK_AMBIGUOUS), ids=list(SLACK_AMBIGUOUS))
def test_slack_accepted_but_answer_lost_is_looked_up_not_reposted(world, fault):
    w = world()
    w.slack.arm(when=slack_method("chat.postMessage"), times=1, **SLACK_AMBIGUOUS[fault])
    w.run(*TIMELINE, 9, 10)
    assert w.slack.reached(slack_method("conversations.history")), "no conversations.history look-up"
    check_invariants(w, log_line("unknown|ambiguous|timed out|look|history|found", logging.INFO))


def test_slack_lost_answer_and_history_lookup_fails(world):
    w = world()
    w.slack.arm("lost", slack_method("chat.postMessage"), times=1)
    w.slack.arm("status", slack_method("conversations.history"), status=500)
    w.run(*TIMELINE, 9)
    check_invariants(w, log_line("unknown|ambiguous|history|look"))


def test_no_token_outbox_counts_as_delivered(world):
    w = world(token=False)
    w.run(*TIMELINE, 9)
    assert state_of(w, "idle") in STOPPED_STATES  # the outbox line is the delivered warning
    check_invariants(w, log_line("outbox", logging.INFO))


# --------------------------------------------------------------------------- the database

def db_path(w) -> Path:
    return Path(w.settings.database_url.removeprefix("sqlite:///"))


def hold_exclusive_lock(path: Path, seconds: float) -> threading.Thread:
    """Another process-like connection holding BEGIN EXCLUSIVE for longer than busy_timeout (5 s)."""
    ready = threading.Event()

    def hold():
        conn = sqlite3.connect(path, isolation_level=None, timeout=10)
        conn.execute("BEGIN EXCLUSIVE")
        ready.set()
        threading.Event().wait(seconds)
        conn.execute("ROLLBACK")
        conn.close()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    ready.wait(10)
    return t


def test_db_locked_when_the_stop_is_due(world):
    w = world()
    w.tick(2)
    holder = hold_exclusive_lock(db_path(w), 6.0)
    w.heal_hooks.append(holder.join)
    w.tick(8)
    assert failed_visibly(w.ticks[-1])
    stopped = state_of(w, "idle") in STOPPED_STATES
    assert not stopped or w.store.action_rows(kinds=[ActionKind.STOP]), "stopped without its record"
    check_invariants(w, *EVALUATION_FAILED)


def test_db_locked_while_the_stop_is_in_flight(world):
    # The lock is taken when StopInstances reaches the proxy: the intent is written, the result cannot be.
    w = world()
    w.tick(2)
    holders: list[threading.Thread] = []
    w.ec2.arm("hook", aws_action("StopInstances"), times=1, forward=True,
              hook=lambda _req: holders.append(hold_exclusive_lock(db_path(w), 6.0)))
    w.heal_hooks.append(lambda: [h.join() for h in holders])
    w.run(8, 9)
    check_invariants(w, *EVALUATION_FAILED)


def make_read_only(path: Path) -> callable:
    """The database file and its WAL read-only, even for root (chattr +i); returns the undo.

    The -shm file is left alone: SQLite mmaps it, and making it immutable under a live mapping
    raised SIGBUS in the test process here."""
    files = [p for p in (path, Path(f"{path}-wal")) if p.exists()]
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", *map(str, files)], check=False, capture_output=True).returncode == 0:
        return lambda: subprocess.run(["chattr", "-i", *map(str, files)], check=True)
    for p in files:
        p.chmod(0o444)
    path.parent.chmod(0o555)
    return lambda: (path.parent.chmod(0o755), [p.chmod(0o644) for p in files])


def test_db_read_only_when_the_stop_is_due(world):
    w = world()
    w.tick(2)
    w.heal_hooks.append(make_read_only(db_path(w)))
    w.store.engine.dispose()  # open connections kept their write access; new ones meet the read-only file
    w.tick(8)
    w.tick(9)
    assert state_of(w, "idle") == "running" or w.store.action_rows(kinds=[ActionKind.STOP])
    check_invariants(w, *EVALUATION_FAILED)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MiB tmpfs for the database (mounting needs root; skipped, and said so, where it is not allowed)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_disk(db: Path) -> Path:
    """Fill the database's file system to the last byte; returns the filler file (delete it to heal).

    Two SQLite details make this a real "disk full" and not a crash of the test process:
    the WAL is checkpointed and truncated first, so the next write must grow a file; and every page
    of the mmapped -shm file is written once, so no page of it is left to allocate (touching an
    unallocated mmapped page on a full tmpfs raises SIGBUS).
    """
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    shm = Path(f"{db}-shm")
    if shm.exists():
        fd = os.open(shm, os.O_RDWR)
        try:
            os.pwrite(fd, os.pread(fd, shm.stat().st_size, 0), 0)
        finally:
            os.close(fd)
    filler = db.parent / "filler"
    with open(filler, "wb", buffering=0) as fh:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    fh.write(b"\0" * size)
            except OSError:
                pass
    return filler


def test_db_disk_full_when_the_stop_is_due(world, small_tmpfs):
    w = world(db_dir=small_tmpfs)
    w.tick(2)
    filler = fill_disk(db_path(w))
    w.heal_hooks.append(lambda: filler.unlink(missing_ok=True))
    w.tick(8)
    w.tick(9)
    assert any(failed_visibly(t) for t in w.ticks[-2:]), "the full disk went unnoticed"
    assert state_of(w, "idle") == "running" or w.store.action_rows(kinds=[ActionKind.STOP])
    check_invariants(w, *EVALUATION_FAILED)


# --------------------------------------------------------------------------- the clock

def test_clock_jumps_backwards_mid_episode(world):
    w = world()
    w.tick(2)
    w.tick(4)
    w.tick(-3, true_minutes=5)  # NTP steps the clock back 7 minutes
    w.tick(-2, true_minutes=6)
    w.tick(1, true_minutes=9)
    w.tick(8, true_minutes=16)
    check_invariants(w, log_line("clock|time"))


def test_clock_jumps_past_the_lead_before_the_warning_was_delivered(world):
    w = world()
    w.slack.arm("status", slack_method("chat.postMessage"), status=500)
    w.tick(2)  # marked, warning undelivered
    w.slack.clear()
    w.tick(62, true_minutes=3)  # the clock leaps an hour; the warning is delivered now
    w.tick(63, true_minutes=4)
    w.tick(64, true_minutes=5)
    assert state_of(w, "idle") == "running"
    check_invariants(w, log_line("not delivered|deliver"))
