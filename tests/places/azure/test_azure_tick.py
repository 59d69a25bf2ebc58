"""Azure VMs through the real tick (issue 39): the stand-in ARM (tests/armstub.py) under the shipped custom role, a
real Prometheus with DCGM series keyed by each VM's hostname, `pipeline.run_once` on a moved clock.

Timeline (rule: under 10% for 10 min, lead 10 min; minutes from START): 0 IDLE -> tag + warning; +10 the
deallocate is due."""

from __future__ import annotations

import pytest

from gpufinops.model import TAG_MARKED, TAG_SNOOZE, TAG_STOPPED_BY, ActionKind, ReasonCode, Verdict
from gpufinops.places.azure.cloud import ADVICE_VMSS
from tests.places.azure.world import START, vm_id

pytestmark = pytest.mark.integration


def stamp(minutes: float) -> str:
    from datetime import timedelta

    return (START + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def kinds(report, name: str) -> list[ActionKind]:
    return [a.kind for a in report.actions if a.instance_id == vm_id(name)]


def test_idle_vm_warned_snoozed_by_a_person_then_deallocated_busy_untouched_scale_set_member_never(world):
    first = world.tick(0)
    verdicts = {d.instance_id: (d.verdict, d.code) for d in first.decisions}
    assert verdicts[vm_id("idle-a100")] == (Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW)
    assert verdicts[vm_id("busy-h100")][0] == Verdict.ACTIVE
    assert verdicts[vm_id("flex-h100")][0] == Verdict.IDLE
    assert vm_id("parked-t4") not in verdicts and vm_id("frontend") not in verdicts  # deallocated; not a GPU size
    assert kinds(first, "idle-a100") == [ActionKind.MARK]
    assert world.stub.vm("idle-a100").tags[TAG_MARKED] == stamp(10)
    [warning] = world.messages_about("idle-a100")
    assert "will be deallocated at" in warning and "owner ana" in warning
    # The scale set's member: judged, told, never marked (the scale set would replace what is deallocated).
    assert kinds(first, "flex-h100") == [ActionKind.NOTIFY]
    [notice] = world.messages_about("flex-h100")
    assert "VM scale set 'train-pool'" in notice and ADVICE_VMSS in notice and "Nothing will be stopped" in notice
    assert TAG_MARKED not in world.stub.vm("flex-h100").tags

    # A person snoozes it in the portal (a tag) before the announced time: the mark is withdrawn, nothing stopped.
    world.stub.person_sets_tags("idle-a100", **{TAG_SNOOZE: stamp(20)})
    snoozed = world.tick(10)
    assert kinds(snoozed, "idle-a100") == [ActionKind.UNMARK]
    assert TAG_MARKED not in world.stub.vm("idle-a100").tags and world.deallocates("idle-a100") == []
    assert world.stub.vm("idle-a100").tags[TAG_SNOOZE] == stamp(20)  # a person's tag is never touched

    # The snooze over, still idle: warned again with a full lead, deallocated at its end.
    again = world.tick(21)
    assert kinds(again, "idle-a100") == [ActionKind.MARK]
    assert kinds(world.tick(26), "idle-a100") == []  # within the new lead
    done = world.tick(31)
    assert kinds(done, "idle-a100") == [ActionKind.STOP]
    assert len(world.deallocates("idle-a100")) == 1 and world.power_offs() == []
    assert world.settle("idle-a100") == "deallocated"
    vm = world.stub.vm("idle-a100")
    assert TAG_MARKED not in vm.tags and vm.tags[TAG_STOPPED_BY] == "gpufinops"
    assert any("Deallocated idle GPU VM" in m and "idle-a100" in m for m in world.messages_about("idle-a100"))
    # Busy and the scale set member: never a change, over the whole run.
    for name in ("busy-h100", "flex-h100"):
        assert world.deallocates(name) == [] and TAG_MARKED not in world.stub.vm(name).tags
    assert world.stub.vm("busy-h100").power == "running" and world.stub.vm("flex-h100").power == "running"
    world.tick(41)
    assert len(world.deallocates()) == 2  # the idle VM and the one left "Stopped (allocated)": once each


def test_a_vm_left_stopped_allocated_is_reported_billed_then_deallocated_after_the_warning(world):
    first = world.tick(0)
    [d] = [d for d in first.decisions if d.instance_id == vm_id("forgotten-a10")]
    assert (d.verdict, d.code) == (Verdict.IDLE, ReasonCode.BILLED_WHILE_STOPPED)
    assert "still allocated" in d.reason and "bills its compute until it is deallocated" in d.reason
    assert d.hourly_cost == pytest.approx(3.2)  # NV36ads A10 v5 in eastus: billed while "stopped"
    [warning] = world.messages_about("forgotten-a10")
    assert "will be deallocated at" in warning and "Stopped (allocated)" in warning
    assert world.deallocates("forgotten-a10") == []
    world.tick(5)
    assert world.deallocates("forgotten-a10") == []  # not before the lead
    world.tick(10)
    assert len(world.deallocates("forgotten-a10")) == 1 and world.power_offs() == []
    assert world.settle("forgotten-a10") == "deallocated"


def test_a_person_starting_the_stopped_vm_between_plan_and_deallocate_wins(world):
    world.tick(0)
    # The person starts it while this tick runs: after the listing, before the re-read.
    world.stub.arm(lambda s: s.method == "GET" and s.path.endswith("/forgotten-a10")
                   and s.query.get("$expand") == ["instanceView"], "hook",
                   hook=lambda _s: world.stub.person_sets_power("forgotten-a10", "running"))
    report = world.tick(10)
    [skip] = [a for a in report.actions if a.instance_id == vm_id("forgotten-a10")]
    assert skip.kind == ActionKind.SKIP and "the instance is running" in skip.reason
    assert world.deallocates("forgotten-a10") == [] and world.stub.vm("forgotten-a10").power == "running"
