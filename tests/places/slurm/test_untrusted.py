"""What Slurm, a map file or accounting may hand over garbled, read on the safe side (pure: no Slurm needed, the
behaviour is our reading of a value): a flag of another type is not a yes, a running job without its start is not
judged, a state we do not know is never "ended", a map file's bad bytes or a user given twice name the file and
line, and an accounting record with impossible numbers is refused with its reason, never charged."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpufinops.act.actuator import _stopped, _terminated
from gpufinops.config import load_settings
from gpufinops.model import TAG_MARKED, Action
from gpufinops.places.slurm.accounting import parse_sacct
from gpufinops.places.slurm.cloud import SlurmActionCalledOff, SlurmActionRefused, SlurmCloud, instance_state
from gpufinops.places.slurm.jobs import parse_job
from gpufinops.places.slurm.people import People, PeopleMapError

START = 1796600000


def _job(**fields) -> dict:
    return {"job_id": 42, "job_state": "RUNNING", "nodes": "gpu07", "user_name": "alice", "account": "ml",
            "partition": "gpu", "qos": "normal", "batch_flag": True, "requeue": True, "start_time": START,
            "gres_detail": ["gpu:a100:2(IDX:0-1)"], **fields}


def _cloud(commands=None, **settings) -> SlurmCloud:
    conf = load_settings(slurm={"cluster": "c", **settings}).slurm.clusters[0]
    return SlurmCloud(conf, commands=commands or object(), people=People(), sleep=lambda s: None)


@pytest.mark.parametrize("value", ["false", "0", "no", [False], {"set": False}, None])
def test_a_flag_of_another_type_is_never_a_yes(value):
    # bool("false") is True: a requeue rule would have announced "will be requeued" for a job Slurm refuses to.
    job = parse_job("c", _job(requeue=value, batch_flag=value))
    assert job.requeueable is False and job.batch is False
    assert parse_job("c", _job(requeue=1, batch_flag=True)).requeueable is True


def test_a_running_job_without_its_start_time_is_unknown_not_judged_over_the_gpus_past():
    cloud = _cloud()
    job = parse_job("c", _job(start_time=None))
    assert "no start time" in job.gpus_unread
    cloud._jobs = {job.subject_id: job}
    slots, why = cloud.usage_basis(job.subject_id)
    assert slots == () and "no start time" in why
    # With its start it is judged.
    fine = parse_job("c", _job())
    cloud._jobs = {fine.subject_id: fine}
    assert cloud.usage_basis(fine.subject_id) == (fine.gpus, "")


@pytest.mark.parametrize("state, reads_as", [
    ("COMPLETED", "terminated"), ("CANCELLED", "terminated"), ("OUT_OF_MEMORY", "terminated"),
    ("PENDING", "stopped"), ("REQUEUE_HOLD", "stopped"), ("SPECIAL_EXIT", "stopped"),
    ("SUSPENDED", "suspended"), ("STOPPED", "suspended"),
    ("COMPLETING", "stopping"), ("RUNNING", "running"),
    ("SOMETHING_NEW", "unknown"), ("", "unknown"), ("['RUNNING']", "unknown"),
])
def test_a_state_we_do_not_know_is_never_read_as_the_change_done(state, reads_as):
    job = parse_job("c", _job(job_state=state))
    assert instance_state(job) == reads_as
    inst = _cloud().as_instance(job)
    # The read-back after a lost scancel / requeue (act.actuator): only a known end or queue settles it "done";
    # a suspended job still holds its GPUs, a state of a newer Slurm is not known to be either.
    assert _terminated(inst) is (reads_as == "terminated")
    assert _stopped(inst) is (reads_as in ("terminated", "stopped", "stopping"))


class _Listing:
    """squeue's answers, one per read, as SlurmCloud reads them (commands.squeue): the decision under test is ours,
    what to make of a job that changed between the plan and the command."""

    def __init__(self, *docs):
        self.docs = list(docs)
        self.sent: list[tuple[str, str]] = []
        self.timeout_s = 5.0

    def squeue(self, job_ids=()):
        return self.docs.pop(0) if len(self.docs) > 1 else self.docs[0]

    def signal_batch(self, job_id, signal):
        self.sent.append(("signal", job_id))

    def cancel(self, job_id):
        self.sent.append(("scancel", job_id))

    def requeue(self, job_id):
        self.sent.append(("requeue", job_id))


def test_a_job_resized_since_its_verdict_is_not_cancelled():
    mark = {"comment": f"{TAG_MARKED}=2026-12-07T10:00:00Z gpufinops:mark-run={START}"}
    judged = parse_job("c", _job(**mark))
    # The user gave a GPU back after the warning: squeue now shows one of the two.
    commands = _Listing({"jobs": [_job(gres_detail=["gpu:a100:1(IDX:0)"], **mark)]})
    cloud = _cloud(commands)
    inst = cloud.as_instance(judged)
    with pytest.raises(SlurmActionRefused, match="now holds 1 GPUs, not the 2 judged idle"):
        cloud.end_job(inst, Action.CANCEL)
    assert commands.sent == []


def test_a_persons_word_during_the_grace_wait_stops_the_command():
    mark = {"comment": f"{TAG_MARKED}=2026-12-07T10:00:00Z gpufinops:mark-run={START}"}
    commands = _Listing({"jobs": [_job(**mark)]})
    cloud = _cloud(commands, grace_signal="USR1", grace_s=30)
    inst = cloud.as_instance(parse_job("c", _job(**mark)))
    with pytest.raises(SlurmActionCalledOff, match="not cancelled: a person asked to snooze it in Slack during the "
                                                   "30 s grace; only the grace signal USR1 was sent") as word:
        cloud.end_job(inst, Action.CANCEL, recheck=lambda: "a person asked to snooze it in Slack")
    # Called off, not refused as a failure (act.Actuator.change records it "abandoned", not "failed").
    assert word.value.called_off is True
    assert commands.sent == [("signal", "42")]
    cloud.end_job(inst, Action.CANCEL, recheck=lambda: "")
    assert commands.sent[-1] == ("scancel", "42")


@pytest.mark.parametrize("after_grace, called_off", [
    # The user's own word in the last read (the mark taken out of the Comment, a snooze written): called off.
    ({"comment": "ckpt gpufinops:keep"}, "its mark gpufinops:marked-for-stop was removed or changed"),
    ({"comment": f"{TAG_MARKED}=2026-12-07T10:00:00Z gpufinops:mark-run={START} gpufinops:snooze-until="
                 "2026-12-08T10:00:00Z"}, "its user snoozed it"),
    ({"start_time": START + 600}, "the job was started again since"),
])
def test_a_persons_word_in_the_last_read_after_the_grace_is_called_off_and_says_the_signal_went_out(after_grace,
                                                                                                   called_off):
    mark = {"comment": f"{TAG_MARKED}=2026-12-07T10:00:00Z gpufinops:mark-run={START}"}
    commands = _Listing({"jobs": [_job(**mark)]}, {"jobs": [_job(**{**mark, **after_grace})]})
    cloud = _cloud(commands, grace_signal="USR1", grace_s=30)
    inst = cloud.as_instance(parse_job("c", _job(**mark)))
    with pytest.raises(SlurmActionCalledOff, match=rf"{called_off}; only the grace signal USR1 was sent"):
        cloud.end_job(inst, Action.REQUEUE, recheck=lambda: "")
    assert commands.sent == [("signal", "42")]


def test_a_refusal_after_the_grace_is_a_failure_that_still_says_the_signal_went_out():
    # Resized during the grace (its user gave a GPU back): no person's cancel of the stop, a refusal (failed).
    mark = {"comment": f"{TAG_MARKED}=2026-12-07T10:00:00Z gpufinops:mark-run={START}"}
    commands = _Listing({"jobs": [_job(**mark)]}, {"jobs": [_job(gres_detail=["gpu:a100:1(IDX:0)"], **mark)]})
    cloud = _cloud(commands, grace_signal="USR1", grace_s=30)
    inst = cloud.as_instance(parse_job("c", _job(**mark)))
    with pytest.raises(SlurmActionRefused, match="not the 2 judged idle; only the grace signal USR1 was sent") as no:
        cloud.end_job(inst, Action.REQUEUE, recheck=lambda: "")
    assert no.value.called_off is False and commands.sent == [("signal", "42")]


def test_a_map_files_bad_bytes_and_a_user_given_twice_name_the_file_and_line(tmp_path):
    emails = tmp_path / "emails.txt"
    emails.write_bytes(b"alice ana@uni.example\n# caf\xe9\nbob b\xf6b@uni.example\n")
    with pytest.raises(PeopleMapError, match=rf"{emails}:3: not UTF-8 text"):
        People.from_settings(load_settings(slurm={"cluster": "c", "email_map": str(emails)}).slurm.clusters[0])
    slack = tmp_path / "slack.txt"
    slack.write_text("alice U0123ABCDE\nbob U0123ABCDF\nalice U0999ZZZZZ\nbob U0123ABCDF\n")
    with pytest.raises(PeopleMapError, match=rf"{slack}:3: user 'alice' is already given 'U0123ABCDE' on line 1"):
        People.from_settings(load_settings(slurm={"cluster": "c", "slack_users": str(slack)}).slurm.clusters[0])
    slack.write_text("alice U0123ABCDE\nalice U0123ABCDE\n")  # the same answer twice is no conflict
    assert People.from_settings(load_settings(
        slurm={"cluster": "c", "slack_users": str(slack)}).slurm.clusters[0]).owner("alice") == "U0123ABCDE"


def _record(job_id: int, gpus, start: int, end: int, elapsed: int) -> dict:
    return {"job_id": job_id, "name": "train", "user": "alice", "account": "ml", "partition": "gpu", "qos": "normal",
            "state": {"current": "COMPLETED"}, "time": {"start": start, "end": end, "elapsed": elapsed},
            "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": gpus}]}}


def test_an_accounting_record_with_impossible_numbers_is_refused_with_its_reason():
    t0 = int(datetime(2026, 12, 3, tzinfo=timezone.utc).timestamp())
    runs, unread = parse_sacct({"jobs": [
        _record(1, 2, t0, t0 + 3600, 3600),  # fine
        _record(2, -4, t0, t0 + 3600, 3600),  # a negative count
        _record(3, 4294967294, t0, t0 + 3600, 3600),  # NO_VAL as a count
        _record(4, 1, t0, t0 - 60, 0),  # ends before it starts
        _record(5, 1, t0, t0 + 60, 10 * 365 * 86400),  # ten years of run time in a minute
    ]}, "acct")
    assert [r.job_id for r in runs] == ["1"]
    assert len(unread) == 4, unread
    assert "job 2's accounting record gives -4 GPUs" in unread[0]
    assert "job 3's accounting record gives 4294967294 GPUs" in unread[1]
    assert "job 4's accounting record ends" in unread[2] and "before it starts" in unread[2]
    assert "job 5's accounting record gives an elapsed time of 315360000 s, longer than its 60 s" in unread[3]
    assert all("left out of the GPU-hours" in u for u in unread)


def test_a_cluster_name_too_long_for_the_stored_job_ids_is_refused_at_start():
    from gpufinops.config import ConfigError
    from gpufinops.places.slurm.jobs import subject_id

    longest = "c" * 41
    assert len(subject_id(longest, "67043328_4000000")) == 64  # fits the store's instance_id column
    load_settings(slurm={"cluster": longest})
    with pytest.raises(ConfigError, match=r"slurm.*cluster.*42 characters: at most 41"):
        load_settings(slurm={"cluster": "c" * 42})


@pytest.mark.parametrize("state, says, never", [
    ("PENDING", "Slurm shows the job back in the queue", "does not come back"),
    ("CANCELLED", "Slurm shows the job ended", "back in the queue"),
    ("COMPLETING", "shows whether it went back to the queue or ended", "does not come back"),
])
def test_a_stop_settled_by_reconcile_tells_what_slurm_shows_never_submit_it_again_for_a_requeued_job(
        state, says, never):
    # After a restart reconcile settles the row without the rule (its action: STOP, the place's "ended").
    from gpufinops.model import Decision, ReasonCode, Verdict
    from gpufinops.notify import messages

    inst = _cloud().as_instance(parse_job("c", _job(job_state=state)))
    decision = Decision(inst.instance_id, "slurm-idle", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle",
                        datetime(2026, 12, 7, 12, tzinfo=timezone.utc), action=Action.STOP)
    notice = messages.stopped(inst, decision, at=datetime(2026, 12, 7, 12, tzinfo=timezone.utc), dry_run=False,
                              action=Action.STOP)
    assert says in str(notice) and never not in str(notice), str(notice)


def test_a_job_whose_gpus_slurm_names_on_only_some_of_its_nodes_is_unknown():
    # Two nodes, one gres_detail entry: judging gpu07's GPUs alone could call the job idle while gpu08's work.
    job = parse_job("c", _job(nodes="gpu[07-08]", gres_detail=["gpu:a100:2(IDX:0-1)"]))
    assert job.gpus == () and "2 nodes" in job.gpus_unread
    whole = parse_job("c", _job(nodes="gpu[07-08]", gres_detail=["gpu:a100:2(IDX:0-1)", "gpu:a100:2(IDX:2-3)"]))
    assert [(g.node, g.index) for g in whole.gpus] == [("gpu07", 0), ("gpu07", 1), ("gpu08", 2), ("gpu08", 3)]
    assert whole.gpus_unread == ""


def test_a_users_long_word_in_the_comment_is_clipped_in_the_reason_it_lands_in():
    from gpufinops.places.registry import TAG_MARK_GONE_WHY

    inst = _cloud().as_instance(parse_job("c", _job(
        comment=f"{TAG_MARKED}=2026-12-07T10:00:00Z gpufinops:mark-run={'9' * 50_000}")))
    why = inst.tags[TAG_MARK_GONE_WHY]
    assert "requeued and started again" in why and len(why) < 200
