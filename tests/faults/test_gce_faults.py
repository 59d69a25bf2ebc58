"""The fault matrix's EC2 cases, on Compute Engine: the GCE stand-in (tests/gcestub.py) injects each fault at the
request it hits, the real tick runs over the official client (tests/run/test_gce_e2e.py's fleet: an idle opted-in
VM, a busy one, a managed instance group's member).

Each case ends with the same checks: at most one instances.stop per VM, and only of the idle one; no action row left
unsettled; the mark row is there exactly when the mark label is; every request within the shipped custom role.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml

from gpufinops.model import ActionKind
from tests.gcestub import Fault
from tests.run.test_gce_e2e import ROLE, GceFleet, ids

pytestmark = pytest.mark.integration

IDLE = "gce:ml-prod/us-central1-a/idle"
MARK = "gpufinops_marked-for-stop"


@pytest.fixture
def fleet(gce, prometheus_factory, slack_stub, tmp_path, monkeypatch):
    return GceFleet(gce, prometheus_factory, slack_stub, tmp_path, monkeypatch)


def check_invariants(f: GceFleet, refused_stops: int = 0) -> None:
    """`refused_stops`: stops GCE refused (a 429): each a failed intent, tried again as a new one."""
    stops = [r.path.split("/")[-2] for r in f.gce.calls("instances.stop")]
    assert set(stops) <= {"idle"} and len(stops) - refused_stops == len(set(stops)), stops
    assert not f.store.action_rows(status=("pending", "unconfirmed", "applied"))
    for name in ("idle", "busy", "mig-7x2k"):
        vm_id = next(i for i in (IDLE, f"gce:ml-prod/us-central1-b/{name}", f"gce:ml-prod/us-east4-b/{name}")
                     if i.endswith("/" + name))
        assert (f.store.get_mark(vm_id) is not None) == (MARK in f.gce.labels(name)), name
    role = set(yaml.safe_load(ROLE.read_text())["includedPermissions"])
    assert {r.permission for r in f.gce.requests} <= role


@pytest.mark.parametrize("fault", ["drop-after", "500-after"])
def test_stop_whose_answer_is_lost_is_read_back_done_and_never_sent_again(fleet, slack_stub, fault):
    fleet.tick(20)
    fleet.gce.fault("instances.stop", Fault(fault))
    r = fleet.tick(36)
    assert ids(r.actions, ActionKind.STOP) == {IDLE}  # the read-back found it STOPPING: done
    assert fleet.gce.status("idle") in ("STOPPING", "TERMINATED")
    fleet.gce.finish_operations()
    fleet.restart()
    fleet.tick(37)
    fleet.tick(38)
    assert len(fleet.gce.calls("instances.stop")) == 1
    assert len([p for p in slack_stub.posted() if p["text"].startswith("Stopped")]) == 1
    check_invariants(fleet)


def test_stop_refused_with_429_is_failed_not_done_and_tried_on_a_later_tick(fleet):
    fleet.tick(20)
    fleet.gce.fault("instances.stop", Fault("429", retry_after="1"))
    r = fleet.tick(36)
    assert not ids(r.actions, ActionKind.STOP) and fleet.gce.status("idle") == "RUNNING"
    assert [a.status for a in fleet.store.action_rows(kinds=[ActionKind.STOP])] == ["failed"]
    r = fleet.tick(37)
    assert ids(r.actions, ActionKind.STOP) == {IDLE} and fleet.gce.status("idle") == "TERMINATED"
    check_invariants(fleet, refused_stops=1)


def test_mark_label_removed_in_the_last_second_is_not_stopped(fleet):
    fleet.tick(20)
    # The person removes the mark just as the tick reads the VM again before its stop.
    fleet.gce.on("instances.get", lambda: fleet.gce.person_sets_labels("idle", **{MARK: None}))
    r = fleet.tick(36)
    assert not ids(r.actions, ActionKind.STOP) and fleet.gce.status("idle") == "RUNNING"
    assert any("was removed" in a.reason for a in r.actions if a.instance_id == IDLE)
    assert not fleet.gce.calls("instances.stop")
    fleet.tick(37)  # the next tick plans again from the cloud: the mark withdrawn, no stop
    assert fleet.gce.status("idle") == "RUNNING" and not fleet.gce.calls("instances.stop")
    check_invariants(fleet)


def test_person_restarts_the_vm_between_plan_and_stop(fleet):
    fleet.tick(20)
    later = fleet.t0 + timedelta(minutes=35)
    fleet.gce.on("instances.get", lambda: fleet.gce.person_starts("idle", at=later))
    r = fleet.tick(36)
    assert not ids(r.actions, ActionKind.STOP) and fleet.gce.status("idle") == "RUNNING"
    assert any("restarted" in a.reason for a in r.actions if a.instance_id == IDLE)
    assert not fleet.gce.calls("instances.stop")
    check_invariants(fleet)


def test_stale_fingerprint_412_never_overwrites_a_persons_labels(fleet, slack_stub):
    # A person labels the VM while gpufinops writes its mark: GCE refuses ours (412); theirs stays.
    fleet.gce.on("instances.setLabels", lambda: fleet.gce.person_sets_labels("idle", cost_center="cc-42"))
    r = fleet.tick(20)
    assert not ids(r.actions, ActionKind.MARK)
    assert fleet.gce.labels("idle")["cost_center"] == "cc-42" and MARK not in fleet.gce.labels("idle")
    assert not [p for p in slack_stub.posted() if "will be stopped at" in p["text"]]  # no warning without a mark
    r = fleet.tick(21)  # the next tick marks it, over the person's label
    assert ids(r.actions, ActionKind.MARK) == {IDLE}
    assert fleet.gce.labels("idle")["cost_center"] == "cc-42" and MARK in fleet.gce.labels("idle")
    check_invariants(fleet)


# ---------------------------------------------------------------- the fence at the cloud (act.actuator._fence)
FENCE = "gpufinops_stopping"


def fence_rows(f: GceFleet):
    return [a for a in f.store.action_rows(kinds=[ActionKind.TAG]) if a.reason.startswith("stop fence")]


def test_mark_removed_after_the_final_read_is_fenced_off_and_never_stopped(fleet, slack_stub):
    """The person removes the mark just AFTER the final read saw it: the re-read cannot see it, the fence does.
    Without the fence (the code before it) the next request after that read was the stop itself, and it stopped."""
    fleet.tick(20)
    # Set inside the hook of the final read: runs before the request right after it, whatever it is.
    fleet.gce.on("instances.get", lambda: fleet.gce.on(
        "*", lambda: fleet.gce.person_sets_labels("idle", **{MARK: None})))
    r = fleet.tick(36)
    assert not fleet.gce.calls("instances.stop") and fleet.gce.status("idle") == "RUNNING"
    assert not ids(r.actions, ActionKind.STOP)
    assert any("fence before the stop was refused" in a.reason for a in r.actions if a.instance_id == IDLE)
    assert [a.status for a in fence_rows(fleet)] == ["failed"]
    assert "labels changed since the read before the stop" in fence_rows(fleet)[0].error
    assert not fleet.gce.calls("instances.setLabels")[1:]  # the fence was refused before anything was sent
    fleet.tick(37)  # the next tick plans from the cloud: the mark withdrawn, said once, never stopped
    fleet.tick(38)
    assert fleet.gce.status("idle") == "RUNNING" and not fleet.gce.calls("instances.stop")
    assert len([p for p in slack_stub.posted() if p["text"].startswith("Stop cancelled")]) == 1
    assert not [p for p in slack_stub.posted() if p["text"].startswith("Stopped")]
    check_invariants(fleet)


def test_a_persons_label_change_between_the_fences_read_and_its_write_is_refused_412(fleet):
    fleet.tick(20)
    # Lands after the fence's own read of the fingerprint, before its setLabels: GCE itself refuses ours (412).
    fleet.gce.on("instances.setLabels", lambda: fleet.gce.person_sets_labels("idle", gpufinops_protect="true"))
    r = fleet.tick(36)
    assert not fleet.gce.calls("instances.stop") and fleet.gce.status("idle") == "RUNNING"
    assert [a.status for a in fence_rows(fleet)] == ["failed"] and "412" in fence_rows(fleet)[0].error
    assert any("fence before the stop was refused" in a.reason for a in r.actions if a.instance_id == IDLE)
    assert fleet.gce.labels("idle")["gpufinops_protect"] == "true" and FENCE not in fleet.gce.labels("idle")
    fleet.tick(37)
    assert not fleet.gce.calls("instances.stop")
    check_invariants(fleet)


@pytest.mark.parametrize("fault", ["drop-after", "500-after"])
def test_fence_write_whose_answer_is_lost_is_read_back_and_the_stop_sent_once(fleet, slack_stub, fault):
    fleet.tick(20)
    fleet.gce.fault("instances.setLabels", Fault(fault))  # the tick's first label write: the fence
    r = fleet.tick(36)
    assert [a.status for a in fence_rows(fleet)] == ["done"]
    assert "confirmed by read-back" in fence_rows(fleet)[0].error
    assert ids(r.actions, ActionKind.STOP) == {IDLE} and len(fleet.gce.calls("instances.stop")) == 1
    fleet.gce.finish_operations()
    fleet.tick(37)
    assert len(fleet.gce.calls("instances.stop")) == 1
    assert len([p for p in slack_stub.posted() if p["text"].startswith("Stopped")]) == 1
    assert FENCE not in fleet.gce.labels("idle") and MARK not in fleet.gce.labels("idle")  # cleaned up after
    check_invariants(fleet)


def test_fence_write_lost_with_the_mark_removed_before_the_read_back_is_no_stop(fleet, slack_stub):
    fleet.tick(20)
    fleet.gce.fault("instances.setLabels", Fault("drop-after"))
    # The fence landed, its answer was lost, and the person removed the mark before gpufinops read it back.
    fleet.gce.on("instances.setLabels", lambda: fleet.gce.on(
        "*", lambda: fleet.gce.person_sets_labels("idle", **{MARK: None})))
    fleet.tick(36)
    assert not fleet.gce.calls("instances.stop") and fleet.gce.status("idle") == "RUNNING"
    assert [a.status for a in fence_rows(fleet)] == ["unconfirmed"]
    fleet.tick(37)  # reconciled (the fence is there), then the plan: the mark is gone, said once; the fence removed
    fleet.tick(38)
    assert not fleet.gce.calls("instances.stop") and fleet.gce.status("idle") == "RUNNING"
    assert [a.status for a in fence_rows(fleet)] == ["done"]
    assert FENCE not in fleet.gce.labels("idle")
    assert len([p for p in slack_stub.posted() if p["text"].startswith("Stop cancelled")]) == 1
    check_invariants(fleet)


# ---------------------------------------------------------------- a rule with action suspend (GCE's instances.suspend)
SUSPEND_RULE = """rules:
  - name: park-idle-vms
    select:
      tags: {"gce:zone": "*"}
      exclude_tags: {workload: [inference, serving, interactive]}
    threshold_pct: 40
    window: 10m
    warning_lead: 15m
    action: suspend
    notify_to: ["slack:#gpu-finops"]
"""


def audit_rows(f: GceFleet) -> list[dict]:
    import contextlib
    import io

    from gpufinops.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["audit", "--db", f.settings.database_url.removeprefix("sqlite:///"), "-o", "json"]) == 0
    return json.loads(out.getvalue())


@pytest.fixture
def suspending(fleet, tmp_path):
    from gpufinops.rules import load_rules

    path = tmp_path / "suspend.yaml"
    path.write_text(SUSPEND_RULE)
    fleet.rules = load_rules([str(path)])
    return fleet


def test_idle_vm_is_warned_suspended_after_the_lead_behind_the_fence_and_said_suspended(suspending, slack_stub):
    f = suspending
    f.gce.suspend_refuses_gpus = False  # a VM GCE suspends (see the next test for GCE's published limits)
    f.tick(20)
    warning = [json.dumps(p) for p in slack_stub.posted() if "will be suspended at" in p["text"]]
    assert len(warning) == 1 and "vCPU and GPU billing ends" in warning[0] and "keeps running" in warning[0]
    r = f.tick(36)
    assert ids(r.actions, ActionKind.STOP) == {IDLE} and f.gce.status("idle") == "SUSPENDED"
    assert not f.gce.calls("instances.stop") and len(f.gce.calls("instances.suspend")) == 1
    order = [q.method for q in f.gce.requests if q.method in ("instances.setLabels", "instances.suspend")]
    at = order.index("instances.suspend")
    assert order[at - 1] == "instances.setLabels" and [a.status for a in fence_rows(f)] == ["done"]  # the fence
    done = [json.dumps(p) for p in slack_stub.posted() if p["text"].startswith("Suspended idle GPU VM")]
    assert len(done) == 1 and "memory state and disks are kept, stored and billed" in done[0]
    assert "gcloud compute instances resume" in done[0]
    row = f.store.action_rows(kinds=[ActionKind.STOP])[-1]
    assert row.status == "done" and row.reason.startswith("suspend: ")
    audit = audit_rows(f)  # `gpufinops audit` says what was done: a suspend, not a stop
    assert [a["what"] for a in audit if a["instance_id"] == IDLE and a["what"] in ("stop", "suspend")] == ["suspend"]
    f.tick(37)  # SUSPENDED reads as stopped: no GPU billing, nothing more to do
    assert len(f.gce.calls("instances.suspend")) == 1 and not f.gce.calls("instances.stop")
    assert {r.permission for r in f.gce.requests} >= {"compute.instances.suspend"}
    check_invariants(f)


@pytest.mark.parametrize("fault", ["drop-after", "500-after"])
def test_suspend_whose_answer_is_lost_is_read_back_and_said_suspended_once(suspending, slack_stub, fault):
    f = suspending
    f.gce.suspend_refuses_gpus = False
    f.gce.polls_to_done = 10_000  # still SUSPENDING when read back
    f.tick(20)
    f.gce.fault("instances.suspend", Fault(fault))
    r = f.tick(36)
    assert ids(r.actions, ActionKind.STOP) == {IDLE} and f.gce.status("idle") == "SUSPENDING"
    f.gce.finish_operations()
    f.restart()
    f.tick(37)
    f.tick(38)
    assert len(f.gce.calls("instances.suspend")) == 1 and not f.gce.calls("instances.stop")
    assert len([p for p in slack_stub.posted() if p["text"].startswith("Suspended idle GPU VM")]) == 1
    assert not [p for p in slack_stub.posted() if p["text"].startswith("Stopped")]
    check_invariants(f)


def test_a_suspend_gce_refuses_for_a_gpu_vm_is_given_up_said_once_and_never_turned_into_a_stop(suspending,
                                                                                                slack_stub):
    f = suspending  # the stand-in refuses to suspend a VM with GPUs attached, as GCE's published limits say
    f.tick(20)
    r = f.tick(36)
    assert f.gce.status("idle") == "RUNNING" and not f.gce.calls("instances.stop")
    assert len(f.gce.calls("instances.suspend")) == 1
    assert [a.status for a in f.store.action_rows(kinds=[ActionKind.STOP])] == ["failed"]
    gave_up = [a for a in r.actions if a.instance_id == IDLE and a.kind == ActionKind.UNMARK]
    assert gave_up and "refused to suspend it, for good" in gave_up[0].error
    told = [p["text"] for p in slack_stub.posted() if p["text"].startswith("Suspend cancelled")]
    assert len(told) == 1 and "not stopped instead" in told[0]
    for minute in (37, 40, 60):  # the idle episode goes on: never marked, suspended or stopped again
        f.tick(minute)
    assert len(f.gce.calls("instances.suspend")) == 1 and not f.gce.calls("instances.stop")
    assert len([p for p in slack_stub.posted() if p["text"].startswith("Suspend cancelled")]) == 1
    assert MARK not in f.gce.labels("idle") and FENCE not in f.gce.labels("idle")
    check_invariants(f)
