"""The pure pieces of the Slurm place: marks in a Comment, who a user is to the notifiers, the DCGM join."""

from __future__ import annotations

import pytest

from gpufinops.config import ConfigError, load_settings
from gpufinops.model import TAG_MARKED, TAG_SNOOZE, TAG_STOPPED_BY, TAG_STOPPED_REASON
from gpufinops.places.slurm.comments import keyword_in, read_tags, with_tags, without_tags
from gpufinops.places.slurm.jobs import GpuSlot
from gpufinops.places.slurm.people import People, PeopleMapError
from gpufinops.places.slurm.usage import JobMatcher, series_key
from tests.promserver import dcgm_labels


def test_marks_are_words_beside_the_users_own_text_which_is_kept():
    text = with_tags("ckpt every 10 min; ask ana", {TAG_MARKED: "2026-12-07T10:00:00Z"})
    assert text == f"ckpt every 10 min; ask ana {TAG_MARKED}=2026-12-07T10:00:00Z"
    assert read_tags(text) == {TAG_MARKED: "2026-12-07T10:00:00Z"}
    again = with_tags(text, {TAG_MARKED: "2026-12-07T11:00:00Z", TAG_STOPPED_BY: "gpu finops",
                             TAG_STOPPED_REASON: "not written: the audit has it"})
    assert read_tags(again) == {TAG_MARKED: "2026-12-07T11:00:00Z", TAG_STOPPED_BY: "gpu_finops"}
    assert without_tags(again, [TAG_MARKED, TAG_STOPPED_BY]) == "ckpt every 10 min; ask ana"
    assert read_tags(f"x {TAG_SNOOZE}=2026-12-08T00:00:00Z") == {TAG_SNOOZE: "2026-12-08T00:00:00Z"}
    assert keyword_in("please gpufinops:keep thanks", "gpufinops:keep")
    assert not keyword_in("gpufinops:keeper", "gpufinops:keep")


def test_a_user_is_reached_by_the_map_then_the_domain(tmp_path):
    emails = tmp_path / "emails.txt"
    emails.write_text("# who\nalice ana.lopez@uni.example\n\n")
    slack = tmp_path / "slack.txt"
    slack.write_text("bob U0123ABCDE  # bob's Slack id\n")
    conf = load_settings(slurm={"cluster": "c", "email_domain": "lab.example", "email_map": str(emails),
                                "slack_users": str(slack)}).slurm.clusters[0]
    people = People.from_settings(conf)
    assert people.owner("alice") == "ana.lopez@uni.example"
    assert people.owner("bob") == "U0123ABCDE"
    assert people.owner("carol") == "carol@lab.example"
    emails.write_text("alice\n")
    with pytest.raises(PeopleMapError, match=rf"{emails}:1: expected `<slurm user> <email address>`"):
        People.from_settings(conf)


def test_bad_slurm_settings_name_the_key():
    with pytest.raises(ConfigError, match="gpu_index_map"):
        load_settings(slurm={"cluster": "c", "gpu_index_map": {"n1": {0: "first"}}})
    with pytest.raises(ConfigError, match="grace_signal"):
        load_settings(slurm={"cluster": "c", "grace_signal": "usr1; rm"})


@pytest.mark.parametrize("index_map, labels, job", [
    ({}, dcgm_labels("gpu07.cluster.example", 2), "slurm:c/1"),  # FQDN host, same index
    ({}, dcgm_labels("GPU07", 2, hostname_label="hostname"), "slurm:c/1"),  # the 2026 label, case-blind
    ({}, dcgm_labels("gpu07", 3), None),  # another GPU of the node
    ({"gpu07": {2: "0"}}, dcgm_labels("gpu07", 0), "slurm:c/1"),  # Slurm's IDX 2 is NVML's 0 there
    ({"gpu07": {2: "0"}}, dcgm_labels("gpu07", 2), None),
    ({"*": {2: dcgm_labels("gpu07", 5)["UUID"]}}, dcgm_labels("gpu07", 5), "slurm:c/1"),  # by UUID
    ({}, {**dcgm_labels("gpu07", 2), "Hostname": ""}, None),  # no host: never guessed
])
def test_a_series_joins_the_job_by_host_and_slurms_index(index_map, labels, job):
    matcher = JobMatcher({"slurm:c/1": [GpuSlot("gpu07", 2)]}, index_map, ("Hostname", "hostname"))
    assert matcher.match(labels) == job


def test_the_index_map_of_a_node_wins_over_every_nodes():
    assert series_key("gpu07", 1, {"*": {1: "9"}, "gpu07": {1: "4"}}) == ("gpu07", "gpu", "4")
    assert series_key("gpu08", 1, {"*": {1: "9"}, "gpu07": {1: "4"}}) == ("gpu08", "gpu", "9")


def test_a_bad_map_file_is_one_error_line_naming_it(tmp_path, capsys):
    from gpufinops.cli.app import main

    emails = tmp_path / "emails.txt"
    emails.write_text("alice ana@uni.example\nbob not-an-address\n")
    config = tmp_path / "gpufinops.yaml"
    config.write_text(f"database_url: sqlite:///{tmp_path / 'db.sqlite'}\nslurm:\n  cluster: c\n"
                      f"  conf: {tmp_path / 'slurm.conf'}\n  email_map: {emails}\n")
    assert main(["-c", str(config), "evaluate", "--once"]) == 2
    err = capsys.readouterr().err
    assert f"{emails}:2: expected `<slurm user> <email address>`" in err and "Traceback" not in err


def _job_instance(comment: str = "", start: int = 1796600000, **settings):
    from gpufinops.places.slurm.cloud import SlurmCloud
    from gpufinops.places.slurm.jobs import parse_job

    conf = load_settings(slurm={"cluster": "c", "email_domain": "lab.example", **settings}).slurm.clusters[0]
    job = parse_job("c", {"job_id": 42, "job_state": "RUNNING", "nodes": "gpu07", "user_name": "alice",
                          "account": "ml", "partition": "gpu", "qos": "normal", "batch_flag": True, "requeue": True,
                          "start_time": start, "gres_detail": ["gpu:a100:1(IDX:2)"], "comment": comment})
    return SlurmCloud(conf, commands=object()).as_instance(job)


def test_protect_lists_and_a_users_snooze_become_what_the_plan_reads():
    from datetime import datetime, timezone

    from gpufinops.act.plan import plan, snooze_of

    inst = _job_instance(protect_accounts=["ml"])
    assert inst.is_protected and "protect_accounts: account ml" in inst.tags["gpufinops:protect"]
    assert inst.tags["owner"] == "alice@lab.example" and inst.tags["slurm:partition"] == "gpu"
    now = datetime(2026, 12, 7, 12, tzinfo=timezone.utc)
    assert plan(inst, None, None, None, now, False).reason == "protected"
    snoozed = _job_instance("please keep gpufinops:keep")
    assert snooze_of(snoozed, now).active
    until = _job_instance("gpufinops:snooze-until=2026-12-07T14:00:00Z")
    assert snooze_of(until, now).until == datetime(2026, 12, 7, 14, tzinfo=timezone.utc)


def test_a_mark_of_an_earlier_run_is_not_this_runs():
    from gpufinops.places.registry import TAG_MARK_GONE_WHY

    mine = _job_instance(f"{TAG_MARKED}=2026-12-07T10:00:00Z gpufinops:mark-run=1796600000", start=1796600000)
    assert mine.tags[TAG_MARKED] == "2026-12-07T10:00:00Z" and TAG_MARK_GONE_WHY not in mine.tags
    later = _job_instance(f"{TAG_MARKED}=2026-12-07T10:00:00Z gpufinops:mark-run=1796600000", start=1796601234)
    assert TAG_MARKED not in later.tags and "requeued and started again" in later.tags[TAG_MARK_GONE_WHY]


def test_a_snooze_button_may_name_a_slurm_job_and_restore_may_not():
    from gpufinops.notify import interact
    from gpufinops.notify.messages import RESTORE_ACTION

    assert interact._names_its_subject("gpufinops_snooze_2h", "slurm:hpc1/1234_7")
    assert not interact._names_its_subject(RESTORE_ACTION, "slurm:hpc1/1234_7")
    assert not interact._names_its_subject("gpufinops_snooze_2h", "slurm:" + "x" * 400)
