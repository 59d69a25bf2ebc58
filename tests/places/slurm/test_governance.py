"""Slurm jobs governed end to end on a REAL Slurm 22.05 (tests/slurm.py `slurm_acct`: the service acts as the
Operator user `gpufinops`, never root), with DCGM series in a real Prometheus and the Slack stub."""

from __future__ import annotations

import pytest

from gpufinops.model import TAG_MARKED, ActionKind, Verdict
from tests.places.slurm.fleet import GovernedSlurm, trapping

pytestmark = pytest.mark.integration


def verdicts(report):
    return {d.instance_id: d for d in report.decisions}


def kinds(report, sid):
    return [a.kind for a in report.actions if a.instance_id == sid]


@pytest.fixture
def governed(slurm_acct, slurm_acct_jobs, slack_stub, tmp_path, monkeypatch):
    def make(**kw):
        return GovernedSlurm(slurm_acct, slack_stub, tmp_path, monkeypatch, **kw)
    return make


def test_two_jobs_on_one_node_one_idle_one_busy_and_the_idle_one_requeued_after_its_warning(
        governed, slurm_acct_jobs, prometheus_factory, slack_stub, slurm_acct):
    jobs = slurm_acct_jobs
    flag = slurm_acct.root / "jobs" / "idle-train-usr1"
    flag.unlink(missing_ok=True)
    idle = jobs.submit_running("alice", name="idle-train", script=trapping(flag))
    busy = jobs.submit_running("bob", name="busy-train")
    g = governed(action="requeue", grace_s=1)
    g.add_series(jobs.job(idle), util=0.0)
    g.add_series(jobs.job(busy), util=85.0)
    g.start(prometheus_factory)
    # Too young for the 10-minute window: judged on nothing from before its start.
    first = verdicts(g.tick(5))
    assert first[g.sid(idle)].verdict is Verdict.UNKNOWN and "not judged before" in first[g.sid(idle)].reason
    report = g.tick(11)
    v = verdicts(report)
    assert v[g.sid(idle)].verdict is Verdict.IDLE, v[g.sid(idle)].reason
    assert v[g.sid(busy)].verdict is Verdict.ACTIVE, v[g.sid(busy)].reason
    assert kinds(report, g.sid(idle)) == [ActionKind.MARK] and kinds(report, g.sid(busy)) == []
    # The mark is in the job's Comment, read back from Slurm; the warning went out.
    assert f"{TAG_MARKED}=" in jobs.job(idle)["comment"]
    assert any(g.sid(idle) in str(p) for p in slack_stub.posted())
    assert jobs.state(idle) == "RUNNING"
    report = g.tick(11 + 16)
    assert kinds(report, g.sid(idle)) == [ActionKind.STOP], report.actions
    assert flag.exists(), "the grace signal did not reach the batch shell before the requeue"
    job = jobs.job(idle)
    assert job["job_state"] == "PENDING" and job["restart_cnt"] == 1
    assert f"{TAG_MARKED}=" not in job["comment"]
    assert jobs.state(busy) == "RUNNING"
    row = [a for a in g.store.action_rows() if a.instance_id == g.sid(idle) and a.kind == ActionKind.STOP]
    assert row and row[-1].status == "done"


def test_cancel_sends_the_grace_signal_first_to_a_job_that_cannot_be_requeued(
        governed, slurm_acct_jobs, prometheus_factory, slurm_acct):
    jobs = slurm_acct_jobs
    flag = slurm_acct.root / "jobs" / "usr1-seen"
    flag.unlink(missing_ok=True)
    job_id = jobs.submit_running("alice", name="ckpt", script=trapping(flag), args=("--no-requeue",))
    g = governed(action="requeue", grace_s=3)
    g.add_series(jobs.job(job_id), util=0.0)
    g.start(prometheus_factory)
    # requeue is refused for a job that is not requeueable: notify only, said so, nothing changed.
    report = g.tick(11)
    assert verdicts(report)[g.sid(job_id)].verdict is Verdict.IDLE
    told = [a for a in report.actions if a.instance_id == g.sid(job_id)]
    assert [a.kind for a in told] == [ActionKind.NOTIFY] and "not requeueable" in told[0].reason
    assert TAG_MARKED not in jobs.job(job_id)["comment"]
    # A cancel rule: warned, then the grace signal to the batch shell, then scancel.
    g2 = governed(action="cancel", grace_s=3)
    g2.t0, g2.series = g.t0, g.series
    g2.tmp = g.tmp / "cancel"
    g2.tmp.mkdir()
    g2.start(prometheus_factory, prom_url=g.prom.url)
    assert kinds(g2.tick(11), g2.sid(job_id)) == [ActionKind.MARK]
    assert not flag.exists()
    assert kinds(g2.tick(27), g2.sid(job_id)) == [ActionKind.STOP]
    assert flag.exists(), "the USR1 grace signal did not reach the batch shell before the cancel"
    jobs.wait_state(job_id, "CANCELLED")


def test_a_snooze_keyword_in_the_comment_wins_over_the_warning(governed, slurm_acct_jobs, prometheus_factory,
                                                                  slurm_acct):
    jobs = slurm_acct_jobs
    job_id = jobs.submit_running("alice", name="notebook-batch")
    g = governed(action="cancel")
    g.add_series(jobs.job(job_id), util=0.0)
    g.start(prometheus_factory)
    assert kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]
    comment = jobs.job(job_id)["comment"]
    # The user writes the keyword beside gpufinops' mark, as themselves.
    slurm_acct.run("scontrol", "update", f"jobid={job_id}", f"Comment={comment} gpufinops:keep", user="alice")
    report = g.tick(27)
    assert kinds(report, g.sid(job_id)) == [ActionKind.UNMARK]
    assert "snoozed" in [a for a in report.actions if a.instance_id == g.sid(job_id)][0].reason
    job = jobs.job(job_id)
    assert job["job_state"] == "RUNNING" and TAG_MARKED not in job["comment"] and "gpufinops:keep" in job["comment"]
    later = kinds(g.tick(45), g.sid(job_id))
    assert ActionKind.MARK not in later and ActionKind.STOP not in later
    assert jobs.state(job_id) == "RUNNING"


def test_a_job_its_user_ended_between_plan_and_action_is_left_alone(governed, slurm_acct_jobs, prometheus_factory,
                                                                     slurm_acct):
    jobs = slurm_acct_jobs
    job_id = jobs.submit_running("alice")
    g = governed(action="requeue")
    g.add_series(jobs.job(job_id), util=0.0)
    g.start(prometheus_factory)
    assert kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]
    # The tick lists the job RUNNING; its user cancels it before the requeue is made.
    listed = g.cloud.list_gpu_instances
    calls = []

    def list_then_user_cancels():
        found = listed()
        slurm_acct.run("scancel", str(job_id), user="alice")
        jobs.wait_state(job_id, "CANCELLED")
        calls.append(1)
        return found
    g.cloud.list_gpu_instances = list_then_user_cancels
    report = g.tick(27)
    assert calls
    results = [a for a in report.actions if a.instance_id == g.sid(job_id)]
    assert [a.kind for a in results] == [ActionKind.SKIP] and "since this run's plan" in results[0].reason
    assert not [a for a in g.store.action_rows() if a.instance_id == g.sid(job_id) and a.kind == ActionKind.STOP]
    job = jobs.job(job_id)
    assert job["job_state"] == "CANCELLED" and job["restart_cnt"] == 0


def test_an_interactive_job_is_only_notified(governed, slurm_acct_jobs, prometheus_factory, slurm_acct):
    jobs = slurm_acct_jobs
    # salloc without a shell: an allocation held by a process, as an interactive session is.
    proc = __import__("subprocess").Popen(
        ["runuser", "-u", "alice", "--", "salloc", "--gres=gpu:1", "-p", "interactive", "-J", "jupyter",
         "--no-shell"], env=slurm_acct.env(), stdout=-1, stderr=-1, text=True)
    out, err = proc.communicate(timeout=30)
    import re
    job_id = int(re.search(r"Granted job allocation (\d+)", out + err).group(1))
    jobs.ids.append(job_id)
    jobs.wait_state(job_id, "RUNNING")
    g = governed(action="cancel")
    g.add_series(jobs.job(job_id), util=0.0)
    g.start(prometheus_factory)
    report = g.tick(11)
    assert verdicts(report)[g.sid(job_id)].verdict is Verdict.IDLE
    told = [a for a in report.actions if a.instance_id == g.sid(job_id)]
    assert [a.kind for a in told] == [ActionKind.NOTIFY] and "interactive job" in told[0].reason
    assert kinds(g.tick(40), g.sid(job_id)) == []
    assert jobs.state(job_id) == "RUNNING" and TAG_MARKED not in jobs.job(job_id)["comment"]


@pytest.fixture
def own_cluster():
    """A throw-away cluster of this test's own (no accounting, ~1 s to start): after a slurmctld restart 22.05 gave
    some jobs started later `gpu:fake:0(IDX:)` and no gres/gpu in their TRES (docs/slurm.md), which would leave a
    shared cluster unfit for the tests after this one."""
    import shutil
    import tempfile
    from pathlib import Path

    from tests.slurm import SlurmCluster, SlurmJobs

    root = Path(tempfile.mkdtemp(prefix="gpufinops-slurm-outage-"))
    root.chmod(0o755)
    cluster = SlurmCluster(root, name="outage").start()
    jobs = SlurmJobs(cluster)
    try:
        yield cluster, jobs
    finally:
        try:
            jobs.cancel_all()
        except Exception:  # noqa: BLE001 - the controller may be down: stop() ends everything anyway
            pass
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_the_controller_down_mid_tick_makes_every_job_unknown_and_nothing_is_done(
        own_cluster, prometheus_factory, slack_stub, tmp_path, monkeypatch):
    # In dry-run (nothing is changed, so no Operator is needed).
    slurm, jobs = own_cluster
    job_id = jobs.submit_running("alice")
    g = GovernedSlurm(slurm, slack_stub, tmp_path, monkeypatch, action="requeue", dry_run=True, timeout_s=5,
                      runner=None)
    g.add_series(jobs.job(job_id), util=0.0)
    g.start(prometheus_factory)
    assert kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]
    slurm.stop_controller()
    try:
        before = len(slack_stub.posted())
        for minutes in (27, 30):
            report = g.tick(minutes)
            d = verdicts(report)[g.sid(job_id)]
            assert d.verdict is Verdict.UNKNOWN and "Slurm did not answer" in d.reason
            assert kinds(report, g.sid(job_id)) == []
            assert any("slurm" in e for e in report.errors)
        alerts = [p for p in slack_stub.posted()[before:] if g.sid(job_id) in str(p)]
        assert len(alerts) == 1, alerts  # one alert for the outage, not one per tick
        assert not [a for a in g.store.action_rows() if a.instance_id == g.sid(job_id)
                    and a.kind in (ActionKind.STOP, ActionKind.UNMARK)]
    finally:
        slurm.start_controller()
    assert jobs.state(job_id) == "RUNNING"
    assert g.store.get_mark(g.sid(job_id)) is not None  # the mark kept: not taken as removed


def test_gpufinops_slurm_snooze_withdraws_the_warning_and_writes_the_snooze_into_the_comment(
        governed, slurm_acct_jobs, prometheus_factory, tmp_path, capsys):
    import yaml

    from gpufinops.cli.app import main

    jobs = slurm_acct_jobs
    job_id = jobs.submit_running("alice")
    g = governed(action="hold")
    g.add_series(jobs.job(job_id), util=0.0)
    g.start(prometheus_factory)
    assert kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]
    config = tmp_path / "gpufinops.yaml"
    config.write_text(yaml.safe_dump({"database_url": g.settings.database_url, "slurm": g.slurm_settings}))
    assert main(["-c", str(config), "slurm", "snooze", str(job_id), "2h", "--by", "ana"]) == 0
    assert "snoozed until" in capsys.readouterr().out
    assert main(["-c", str(config), "slurm", "snooze", "12a", "2h"]) == 2
    assert main(["-c", str(config), "slurm", "snooze", str(job_id), "30d"]) == 2  # past act.max_snooze_s
    report = g.tick(27)
    done = {a.kind: a for a in report.actions if a.instance_id == g.sid(job_id)}
    assert ActionKind.UNMARK in done and ActionKind.STOP not in done
    assert "gpufinops slurm snooze" in " ".join(a.reason for a in g.store.action_rows()
                                               if a.instance_id == g.sid(job_id) and a.kind == ActionKind.SNOOZE)
    job = jobs.job(job_id)
    assert job["job_state"] == "RUNNING" and TAG_MARKED not in job["comment"]
    assert "gpufinops:snooze-until=" in job["comment"]


def test_evaluate_json_lists_each_running_gpu_job_with_its_verdict(slurm, slurm_jobs, prometheus_factory, tmp_path,
                                                                   capsys):
    import json

    import yaml

    from gpufinops.cli.app import main
    from tests.places.slurm.fleet import dcgm, rule_file

    job_id = slurm_jobs.submit_running("bob", name="eval-me")
    idx = int(__import__("re").search(r"IDX:(\d+)", slurm_jobs.job(job_id)["gres_detail"][0]).group(1))
    now = __import__("time").time()
    prom = prometheus_factory(dcgm(slurm.node, idx, now - 3600, now + 600, 0.0))
    config = tmp_path / "gpufinops.yaml"
    config.write_text(yaml.safe_dump({
        "database_url": f"sqlite:///{tmp_path / 'db.sqlite'}", "prometheus": {"url": prom.url},
        "rules_paths": [str(rule_file(tmp_path / "rules.yaml", "cancel"))],
        "slurm": {"cluster": slurm.name, "conf": str(slurm.conf)}}))
    main(["-c", str(config), "evaluate", "-o", "json"])
    out = capsys.readouterr().out
    rows = json.loads(out)
    rows = rows if isinstance(rows, list) else rows.get("decisions", rows.get("rows", []))
    mine = [r for r in rows if f"slurm:{slurm.name}/{job_id}" in json.dumps(r)]
    assert mine, out[:2000]
    # Started seconds ago: too young for the 10-minute window, never judged on the GPU's earlier samples.
    assert "UNKNOWN" in json.dumps(mine[0]) and "not judged before" in json.dumps(mine[0])


def test_hold_is_a_requeuehold_the_job_back_in_the_queue_held(governed, slurm_acct_jobs, prometheus_factory):
    jobs = slurm_acct_jobs
    job_id = jobs.submit_running("bob", name="park-me")
    g = governed(action="hold", grace_s=0)
    g.add_series(jobs.job(job_id), util=0.0)
    g.start(prometheus_factory)
    assert kinds(g.tick(11), g.sid(job_id)) == [ActionKind.MARK]
    assert kinds(g.tick(27), g.sid(job_id)) == [ActionKind.STOP]
    job = jobs.job(job_id)
    # `scontrol hold` would have left it RUNNING; requeuehold parks it.
    # Requeued by the Operator, 22.05 holds it as a user hold: the job's user may `scontrol release` it themselves.
    assert (job["job_state"], job["state_reason"]) == ("PENDING", "JobHeldUser")
    assert "gpufinops:stopped-by=" in job["comment"] and TAG_MARKED not in job["comment"]
