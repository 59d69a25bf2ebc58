"""The GCE place's entry (places/registry.py) as the act stage reads it: stopped, never deleted; a Spot VM stopped
like any other; the operator's opt-in label gates it as the opt-in tag gates EC2; a managed instance group's member
never stopped; the warning's way out in labels a person can type."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from gpufinops.act.plan import opt_in_gap, stop_blocker
from gpufinops.model import Action, Decision, GpuInstance, ReasonCode, Verdict
from gpufinops.notify import messages
from gpufinops.places.registry import GCE, place_of, place_of_instance, refusal

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=timezone.utc)


def vm(**kw) -> GpuInstance:
    base = dict(instance_id="gce:ml-prod/us-central1-a/l4", instance_type="g2-standard-8", region="us-central1",
                state="running", launch_time=T0, provider="gcp", tags={"gpufinops:allow-stop": "true"})
    return GpuInstance(**{**base, **kw})


def test_a_gce_id_and_a_gcp_instance_are_the_gce_place():
    assert place_of("gce:ml-prod/us-central1-a/l4") is GCE and place_of_instance(vm()) is GCE


def test_stopped_never_deleted():
    assert refusal(vm(), Action.STOP) == ""
    assert "never deleted" in refusal(vm(), Action.TERMINATE)


def test_a_spot_vm_is_stopped_like_any_other_but_an_ec2_spot_instance_is_not():
    assert stop_blocker(vm(lifecycle="spot"), Action.STOP) == ""
    ec2 = GpuInstance("i-0abc", "g5.xlarge", "us-east-1", "running", T0, lifecycle="spot")
    assert "cannot be stopped" in stop_blocker(ec2, Action.STOP)


def test_the_opt_in_label_gates_it():
    assert opt_in_gap(vm(), "gpufinops:allow-stop", "true") == ""
    assert "not opted in" in opt_in_gap(vm(tags={}), "gpufinops:allow-stop", "true")


def test_a_mig_member_is_never_stopped():
    member = vm(managed_by="managed instance group 'trainers' (us-east4-b)", managed_advice="resize it")
    assert "never stopped by gpufinops; instead: resize it" in stop_blocker(member, Action.STOP)


def test_the_warning_says_the_labels_a_person_can_set():
    d = Decision(vm().instance_id, "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", T0, Action.STOP)
    warning = messages.idle_warning(vm(), d, marked_at=T0, stop_at=T0, channel="", dry_run=False,
                                    action=Action.STOP)
    text = warning.text
    assert "`gpufinops_snooze-until`" in text and "`gpufinops_protect`" in text and "gpufinops:snooze-until" not in text
    notes = " ".join(warning.notes)
    assert ("`gcloud compute instances add-labels l4 --project=ml-prod --zone=us-central1-a "
            "--labels=gpufinops_snooze-until=20261208t090000z`") in notes
    assert "--labels=gpufinops_protect=true`" in notes and "aws ec2" not in notes


def test_no_copy_paste_line_for_a_hostile_name():
    d = Decision("gce:ml-prod/us-central1-a/x", "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", T0, Action.STOP)
    evil = vm(instance_id="gce:ml-prod/us-central1-a/x`rm -rf`")
    warning = messages.idle_warning(evil, d, marked_at=T0, stop_at=T0, channel="", dry_run=False, action=Action.STOP)
    assert not any("gcloud compute instances add-labels x" in n for n in warning.notes)


def test_an_opt_in_tag_that_cannot_be_a_label_is_an_error_at_start(monkeypatch):
    import pytest

    from gpufinops.config import ConfigError, load_settings
    from gpufinops.run.compose import live_inventory

    monkeypatch.setenv("GPUFINOPS_GCP_ACCESS_TOKEN", "ya29.x")
    for act, key in (({"opt_in_tag": "Stop-OK"}, "act.opt_in_tag"), ({"opt_in_value": "Yes"}, "act.opt_in_value")):
        settings = load_settings(gcp={"projects": ["ml-prod"], "api_endpoint": "http://127.0.0.1:9"}, act=act)
        with pytest.raises(ConfigError, match=key):
            live_inventory(settings)


def test_no_credentials_is_an_error_that_says_where_they_come_from(monkeypatch, tmp_path):
    import pytest

    from gpufinops.config import ConfigError, load_settings
    from gpufinops.run.compose import live_inventory

    monkeypatch.delenv("GPUFINOPS_GCP_ACCESS_TOKEN", raising=False)
    # A key file that is not there: Application Default Credentials fail at once (no metadata server is asked).
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    settings = load_settings(gcp={"projects": ["ml-prod"], "api_endpoint": "http://127.0.0.1:9"})
    with pytest.raises(ConfigError, match="no Google credentials in the environment: set GPUFINOPS_GCP_ACCESS_TOKEN"):
        live_inventory(settings)


def test_a_blank_token_is_refused_at_load(monkeypatch):
    import pytest

    from gpufinops.config import ConfigError, load_settings

    monkeypatch.setenv("GPUFINOPS_GCP_ACCESS_TOKEN", "  ")
    with pytest.raises(ConfigError, match="gcp.access_token.*set but blank"):
        load_settings(gcp={"projects": ["ml-prod"]})


# ---------------------------------------------------------------- suspend: taken by GCE VMs and Kueue jobs alike
def test_suspend_is_taken_by_a_gce_vm_and_a_kueue_job_and_refused_to_every_other_subject():
    from gpufinops.k8s.model import TAG_KUEUE_WORKLOAD
    from gpufinops.places.registry import KUEUE_JOB, owners

    assert owners(Action.SUSPEND) == (KUEUE_JOB, GCE)
    assert refusal(vm(), Action.SUSPEND) == "" and stop_blocker(vm(), Action.SUSPEND) == ""
    job = GpuInstance("k8s:ml/Job/train", "p4d.24xlarge", "us-east-1", "running", T0, provider="kubernetes",
                      tags={TAG_KUEUE_WORKLOAD: "ml/job-train"})
    assert refusal(job, Action.SUSPEND) == ""
    for other in (GpuInstance("i-0abc", "p5.48xlarge", "us-east-1", "running", T0),
                  GpuInstance("k8s:ml/Deployment/web", "p4d.24xlarge", "us-east-1", "running", T0,
                              provider="kubernetes")):
        said = refusal(other, Action.SUSPEND)
        assert "Kueue-managed Kubernetes jobs" in said and "GCE VMs (selected by tag gce:zone)" in said
    assert "never deleted" in refusal(vm(), Action.TERMINATE)  # its other refusals are as they were


def test_a_suspend_rule_selects_gce_vms_by_their_zone_tag_and_rules_check_says_gces_limits(tmp_path):
    import pytest

    from gpufinops.config import ConfigError
    from gpufinops.rules import load_rule_file, rule_warnings

    path = tmp_path / "r.yaml"
    path.write_text("rules:\n- name: park\n  window: 30m\n  threshold_pct: 5\n  action: suspend\n")
    with pytest.raises(ConfigError, match="gce:zone"):
        load_rule_file(path)  # selects nothing it can suspend: refused, naming both ways to select
    path.write_text("rules:\n- name: park\n  window: 30m\n  threshold_pct: 5\n  action: suspend\n"
                    "  select: {tags: {'gce:zone': [us-central1-a]}}\n")
    rule = load_rule_file(path)[0]
    assert rule.selector.matches(vm(tags={"gce:zone": "us-central1-a"})) and not rule.selector.matches(vm())
    [caveat] = rule_warnings(rule)
    assert "GPUs attached" in caveat and "suspend-resume-instance#limitations" in caveat
    assert "never stopped instead" in caveat
    path.write_text("rules:\n- name: park-jobs\n  window: 30m\n  threshold_pct: 5\n  action: suspend\n"
                    "  select: {tags: {kueue.x-k8s.io/queue-name: '*'}}\n")
    assert rule_warnings(load_rule_file(path)[0]) == ()  # Kueue's suspend has no such limit


def test_a_gce_suspend_is_said_as_suspended_with_what_stays_billed():
    d = Decision(vm().instance_id, "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", T0, Action.SUSPEND)
    warning = messages.idle_warning(vm(), d, marked_at=T0, stop_at=T0, channel="", dry_run=False,
                                    action=Action.SUSPEND)
    notes = " ".join(warning.notes)
    assert "will be suspended" in warning.title and "memory state and disks are kept, stored and billed" in notes
    assert "keeps running, is not stopped instead" in notes
    done = messages.stopped(vm(), d, at=T0, dry_run=False, action=Action.SUSPEND)
    assert done.title.startswith("Idle GPU VM suspended") and "gcloud compute instances resume" in " ".join(done.notes)
    assert ("Saves while suspended (less its stored memory)", ) == tuple(k for k, _ in done.facts if k.startswith("Saves"))
    stop = messages.stopped(vm(), replace(d, action=Action.STOP), at=T0, dry_run=False, action=Action.STOP)
    assert stop.title.startswith("Idle GPU VM stopped") and "billed" not in " ".join(stop.notes)


def test_rules_check_prints_gces_suspend_limits_for_a_rule_suspending_gce_vms(tmp_path, capsys):
    from gpufinops.cli import main

    path = tmp_path / "park.yaml"
    path.write_text("rules:\n- name: park\n  window: 30m\n  threshold_pct: 5\n  action: suspend\n"
                    "  select: {tags: {'gce:zone': '*'}}\n")
    assert main(["rules", "check", str(path)]) == 0  # valid: warned, not refused
    out = capsys.readouterr().out
    assert "ok  park" in out and "warn park: GCE publishes limits on suspending a VM" in out
    assert "VMs with GPUs attached" in out and "1 rule(s) valid" in out
