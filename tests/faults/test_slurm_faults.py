"""Slurm faults on the REAL Slurm 22.05 cluster (tests/slurm.py `slurm_acct`), the service acting as the Operator
user `gpufinops`: the fault sits in the command runner, around the real command (the Slurm analogue of the fault
proxy's `lost` and `status` modes), never in place of Slurm's own answer to the state.

- a lost scancel answer: the cancel went through, the service got a timeout → read back, recorded done, one
  scancel, one "cancelled" notice;
- scontrol refusing the requeue (a non-zero exit): recorded failed (the job agrees), the job left running, its
  mark kept, tried again next tick with one command;
- the job requeued by someone else after its warning (and started again): the mark was its earlier run's, so
  nothing is done to the new run, the mark is withdrawn with the reason.
"""

from __future__ import annotations

import subprocess

import pytest

from gpufinops.model import TAG_MARKED, ActionKind
from tests.places.slurm.fleet import GovernedSlurm, as_operator, trapping

pytestmark = pytest.mark.integration


class FaultyRunner:
    """Runs every Slurm command for real as the Operator; `lose(argv)` / `refuse(argv)` pick the ones whose answer
    is lost after they ran, or that are answered with an error without running."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.lose = lambda argv: False
        self.refuse = lambda argv: False

    def __call__(self, argv, env, timeout_s):
        argv = list(argv)
        self.calls.append(argv)
        if self.refuse(argv):
            return subprocess.CompletedProcess(argv, 1, "", "slurm_requeue error: Requested operation is presently "
                                                            "disabled")
        res = as_operator(argv, env, timeout_s)
        if self.lose(argv):
            raise subprocess.TimeoutExpired(argv, timeout_s)
        return res

    def count(self, *head: str) -> int:
        return sum(1 for a in self.calls if tuple(a[:len(head)]) == head)


def _kinds(report, sid):
    return [a.kind for a in report.actions if a.instance_id == sid]


# No grace signal: the plain jobs do not trap one (an untrapped USR1 ends the batch shell).
NO_GRACE = {"grace_s": 0, "grace_signal": ""}


@pytest.fixture
def govern(slurm_acct, slurm_acct_jobs, slack_stub, tmp_path, monkeypatch, prometheus_factory):
    """`govern(job_id, **settings)`: the service started on the real cluster with that job idle (GPU use 0), every
    Slurm command through a FaultyRunner; returns (service, runner)."""
    def start(job_id, **kw):
        runner = FaultyRunner()
        g = GovernedSlurm(slurm_acct, slack_stub, tmp_path, monkeypatch, runner=runner, **kw)
        g.add_series(slurm_acct_jobs.job(job_id), util=0.0)
        g.start(prometheus_factory)
        return g, runner
    return start


def _trapping_job(slurm_acct, jobs, flag_name):
    """A running job of alice's (not requeued) that touches the file `flag_name` when its grace signal USR1 comes;
    returns (flag, job_id)."""
    flag = slurm_acct.root / "jobs" / flag_name
    flag.unlink(missing_ok=True)
    return flag, jobs.submit_running("alice", script=trapping(flag), args=("--no-requeue",))


def _during_grace(g, slurm_acct, act):
    """While the service waits out the grace period, `act()` runs first (a person acting then); returns what puts the
    plain wait back."""
    cluster = g.cloud.clusters[slurm_acct.name]
    real_sleep = cluster.sleep

    def sleep(seconds):
        act()
        real_sleep(seconds)
    cluster.sleep = sleep
    return lambda: setattr(cluster, "sleep", real_sleep)


def test_a_lost_scancel_answer_is_settled_from_what_slurm_shows(slurm_acct, slurm_acct_jobs, slack_stub, govern):
    jobs = slurm_acct_jobs
    job_id = jobs.submit_running("alice", args=("--no-requeue",))
    g, runner = govern(job_id, action="cancel", **NO_GRACE)
    assert _kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]
    runner.lose = lambda argv: argv == ["scancel", str(job_id)]
    report = g.tick(27)
    stop = [a for a in report.actions if a.instance_id == g.sid(job_id)]
    assert [a.kind for a in stop] == [ActionKind.STOP] and stop[0].ok
    assert runner.count("scancel", str(job_id)) == 1
    jobs.wait_state(job_id, "CANCELLED")
    rows = [a for a in g.store.action_rows() if a.instance_id == g.sid(job_id) and a.kind == ActionKind.STOP]
    assert [r.status for r in rows] == ["done"] and "confirmed by read-back" in (rows[0].error or "")
    # Later ticks do nothing more: no second scancel, one "cancelled" notice.
    g.tick(30)
    assert runner.count("scancel", str(job_id)) == 1
    notices = [p for p in slack_stub.posted() if p.get("text", "").startswith("Cancelled idle GPU job")]
    assert len(notices) == 1, notices
    assert "does not come back" in str(notices[0]) and "gpufinops:protect" not in str(notices[0])


def test_scontrol_refusing_the_requeue_is_a_failure_the_job_agrees_with(slurm_acct, slurm_acct_jobs, slack_stub,
                                                                        govern):
    jobs = slurm_acct_jobs
    job_id = jobs.submit_running("alice")
    g, runner = govern(job_id, action="requeue", **NO_GRACE)
    assert _kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]
    runner.refuse = lambda argv: argv[:2] == ["scontrol", "requeue"]
    report = g.tick(27)
    stop = [a for a in report.actions if a.instance_id == g.sid(job_id)]
    assert [a.kind for a in stop] == [ActionKind.STOP] and not stop[0].ok
    assert "presently disabled" in stop[0].error
    rows = [a for a in g.store.action_rows() if a.instance_id == g.sid(job_id) and a.kind == ActionKind.STOP]
    assert [r.status for r in rows] == ["failed"]
    assert jobs.state(job_id) == "RUNNING" and TAG_MARKED in jobs.job(job_id)["comment"]
    assert g.store.get_mark(g.sid(job_id)) is not None
    # Next tick: one more requeue (one command per intent), now answered: done.
    runner.refuse = lambda argv: False
    g.tick(28)
    assert runner.count("scontrol", "requeue") == 2
    assert jobs.job(job_id)["job_state"] == "PENDING"


def test_a_job_requeued_by_someone_else_after_its_warning_is_not_acted_on(slurm_acct, slurm_acct_jobs, slack_stub,
                                                                          govern):
    jobs = slurm_acct_jobs
    job_id = jobs.submit_running("alice")
    g, runner = govern(job_id, action="cancel", **NO_GRACE)
    assert _kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]
    first_start = jobs.job(job_id)["start_time"]
    # An admin requeues it; it starts again at once (StartTime=now lifts the ~2 min BeginTime, pitfall 13).
    slurm_acct.run("scontrol", "requeue", str(job_id))
    jobs.wait_state(job_id, "PENDING")
    slurm_acct.run("scontrol", "update", f"jobid={job_id}", "StartTime=now")
    jobs.wait_state(job_id, "RUNNING")
    job = jobs.job(job_id)
    assert job["start_time"] != first_start and TAG_MARKED in job["comment"]  # Slurm kept the Comment
    report = g.tick(27)
    done = [a for a in report.actions if a.instance_id == g.sid(job_id)]
    assert [a.kind for a in done] == [ActionKind.UNMARK], done
    assert "requeued and started again" in done[0].reason
    assert runner.count("scancel") == 0
    job = jobs.job(job_id)
    assert job["job_state"] == "RUNNING" and TAG_MARKED not in job["comment"]


def test_a_lost_requeue_answer_with_the_job_suspended_meanwhile_is_not_settled_done(
        slurm_acct, slurm_acct_jobs, slack_stub, govern):
    """The requeue's answer is lost and, by the read-back, an admin had suspended the job instead: a SUSPENDED job
    still holds its GPUs, so the requeue is not done (before: SUSPENDED read as "back in the queue": recorded done,
    the mark removed and a "requeued" notice sent for a job that was not)."""
    jobs = slurm_acct_jobs
    job_id = jobs.submit_running("alice")
    g, runner = govern(job_id, action="requeue", **NO_GRACE)
    assert _kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]
    # The requeue never reaches slurmctld (the connection hangs, the command times out) and meanwhile an admin
    # suspends the job: the read-back finds it SUSPENDED.
    requeue = ["scontrol", "requeue", str(job_id)]

    def suspended_and_timed_out(argv):
        if argv == requeue:
            slurm_acct.run("scontrol", "suspend", str(job_id))
            jobs.wait_state(job_id, "SUSPENDED")
            raise subprocess.TimeoutExpired(argv, 20)
        return False
    runner.refuse = suspended_and_timed_out
    try:
        report = g.tick(27)
        stop = [a for a in report.actions if a.instance_id == g.sid(job_id)]
        assert [a.kind for a in stop] == [ActionKind.STOP] and not stop[0].ok, stop
        rows = [a for a in g.store.action_rows() if a.instance_id == g.sid(job_id) and a.kind == ActionKind.STOP]
        assert [r.status for r in rows] == ["unconfirmed"], rows
        assert jobs.state(job_id) == "SUSPENDED" and TAG_MARKED in jobs.job(job_id)["comment"]
        assert not [p for p in slack_stub.posted() if "Requeued idle GPU job" in p.get("text", "")]
        assert runner.count("scontrol", "requeue") == 1
    finally:
        slurm_acct.run("scontrol", "resume", str(job_id), check=False)


def test_a_cli_snooze_during_the_grace_wait_wins_over_the_cancel(slurm_acct, slurm_acct_jobs, slack_stub, govern):
    """`gpufinops slurm snooze` recorded while the job has its grace signal and the service waits grace_s: the
    cancel is not sent (before: the snooze was only read at the next tick, after the scancel)."""
    from gpufinops.notify import interact

    jobs = slurm_acct_jobs
    flag, job_id = _trapping_job(slurm_acct, jobs, "grace-snooze-usr1")
    g, runner = govern(job_id, grace_s=1, action="cancel")
    assert _kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]

    def snooze():
        until = (g.now + __import__("datetime").timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        interact.keep_request(g.store, interact.SnoozeRequest(
            instance_id=g.sid(job_id), until=until, user_id="", user_name="alice",
            action_id=interact.CLI_SNOOZE_ACTION, channel_id="", message_ts="", requested_at=g.now.isoformat()))
    plain_wait = _during_grace(g, slurm_acct, snooze)
    report = g.tick(27)
    stop = [a for a in report.actions if a.instance_id == g.sid(job_id)]
    # Called off, not failed: a person's word won (before: a failed STOP, counted toward the give-up).
    assert [a.kind for a in stop] == [ActionKind.SKIP] and stop[0].ok, stop
    assert "a person asked to snooze it" in stop[0].reason and "grace" in stop[0].reason
    assert flag.exists(), "the grace signal was sent"
    assert runner.count("scancel", "--signal=USR1") == 1 and runner.count("scancel", str(job_id)) == 0
    assert jobs.state(job_id) == "RUNNING"
    # The record: the intent's row called off ("abandoned"), saying the grace signal went out and nothing else.
    rows = [a for a in g.store.action_rows() if a.instance_id == g.sid(job_id) and a.kind == ActionKind.STOP]
    assert [r.status for r in rows] == ["abandoned"], rows
    assert "not cancelled: a person asked to snooze it" in rows[0].error
    assert "only the grace signal USR1 was sent" in rows[0].error
    assert not [p for p in slack_stub.posted() if "fail" in p.get("text", "").lower()]
    # The next tick honours the snooze: the mark is withdrawn, the job keeps running.
    plain_wait()
    later = g.tick(28)
    assert ActionKind.STOP not in _kinds(later, g.sid(job_id))
    assert jobs.state(job_id) == "RUNNING" and runner.count("scancel", str(job_id)) == 0


def test_three_cancels_during_the_grace_wait_are_no_failures_and_the_fourth_stop_goes_through(
        slurm_acct, slurm_acct_jobs, slack_stub, govern, caplog):
    """Three ticks in a row, its user writes the snooze keyword into the Comment during the grace wait (and takes
    it out again before the next tick): each time the cancel is called off, recorded "abandoned" with the grace
    signal it did send, and never counted as a failure. The fourth tick, with no word from anyone, cancels the job
    (before: three "failed" rows, and the fourth tick gave up on the job and withdrew its mark, "stop failed 3
    times")."""
    jobs = slurm_acct_jobs
    flag, job_id = _trapping_job(slurm_acct, jobs, "grace-keyword-usr1")
    g, runner = govern(job_id, grace_s=1, action="cancel")
    assert _kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]
    marked = jobs.job(job_id)["comment"]
    assert TAG_MARKED in marked
    plain_wait = _during_grace(g, slurm_acct, lambda: slurm_acct.run(
        "scontrol", "update", f"jobid={job_id}", f"Comment={marked} gpufinops:keep", user="alice"))
    for minute in (27, 28, 29):
        flag.unlink(missing_ok=True)
        with caplog.at_level("WARNING"):
            report = g.tick(minute)
        stop = [a for a in report.actions if a.instance_id == g.sid(job_id)]
        assert [a.kind for a in stop] == [ActionKind.SKIP] and stop[0].ok, (minute, stop)
        assert "snooze" in stop[0].reason and "grace" in stop[0].reason
        assert flag.exists(), f"minute {minute}: the grace signal was sent"
        assert jobs.state(job_id) == "RUNNING" and runner.count("scancel", str(job_id)) == 0
        # The user takes the keyword out again: the mark is still the one the warning announced.
        slurm_acct.run("scontrol", "update", f"jobid={job_id}", f"Comment={marked}", user="alice")
    rows = [a for a in g.store.action_rows() if a.instance_id == g.sid(job_id) and a.kind == ActionKind.STOP]
    assert [r.status for r in rows] == ["abandoned"] * 3, rows
    assert all("only the grace signal USR1 was sent" in (r.error or "") for r in rows)
    assert not [r for r in caplog.records if r.levelname == "ERROR" and g.sid(job_id) in r.getMessage()]
    # The fourth tick: nobody says no, so the job is cancelled (not given up on after "three failures").
    plain_wait()
    report = g.tick(30)
    stop = [a for a in report.actions if a.instance_id == g.sid(job_id)]
    assert [a.kind for a in stop] == [ActionKind.STOP] and stop[0].ok, stop
    assert runner.count("scancel", str(job_id)) == 1
    jobs.wait_state(job_id, "CANCELLED")
    rows = [a for a in g.store.action_rows() if a.instance_id == g.sid(job_id) and a.kind == ActionKind.STOP]
    assert [r.status for r in rows] == ["abandoned"] * 3 + ["done"], rows
    assert not [p for p in slack_stub.posted() if "fail" in p.get("text", "").lower()]
