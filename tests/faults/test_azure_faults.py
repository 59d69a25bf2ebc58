"""The fault matrix's EC2 cases, for Azure VMs (issue 39): the real tick (`pipeline.run_once`) over the stand-in ARM
(tests/armstub.py, under the shipped custom role deploy/azure/gpufinops-role.json) and a real Prometheus, faults
injected per request at the stand-in. Timeline (tests/places/azure/world.py): minute 0 IDLE -> tag + warning,
minute 10 the deallocate is due.

Each case ends with `check_azure_invariants`: no deallocate before a delivered warning and its full lead, never a
second deallocate that takes effect, never a power-off, records equal ARM (no action row left open; a mark row
<=> the mark tag; a done deallocate <=> the VM deallocating/deallocated), every request inside the role.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufinops.act.actuator import UNSETTLED
from gpufinops.model import TAG_MARKED, ActionKind
from tests.places.azure.world import LEAD_S, START, World, fleet, start_arm, start_prom, stop_arm, vm_id

pytestmark = pytest.mark.integration

DEALLOCATE = "Microsoft.Compute/virtualMachines/deallocate/action"
TAGS = "Microsoft.Resources/tags/write"


@pytest.fixture()
def arm(tmp_path):
    stub = start_arm(tmp_path)
    yield stub
    stop_arm(stub)


@pytest.fixture(scope="module")
def azure_prom(tmp_path_factory):
    server = start_prom(tmp_path_factory.mktemp("azure-fault-prom"))
    yield server
    server.stop()


@pytest.fixture()
def azure_world(arm, azure_prom, tmp_path):
    fleet(arm)
    return World(arm, azure_prom.url, tmp_path)


def is_deallocate_of(name: str):
    return lambda s: s.action == DEALLOCATE and s.path.endswith(f"/{name}/deallocate")


def rereads_of(name: str):
    """The act stage's read right before it acts (one VM with its instance view)."""
    return lambda s: s.method == "GET" and s.path.endswith(f"/{name}") and s.query.get("$expand") == ["instanceView"]


def actions_on(report, name: str) -> list:
    """The tick's actions on the VM `name`."""
    return [a for a in report.actions if a.instance_id == vm_id(name)]


def open_rows_of(w: World, name: str) -> list:
    """The VM's action rows not settled yet (unconfirmed or under way)."""
    return [r for r in w.store.action_rows(status=UNSETTLED) if r.instance_id == vm_id(name)]


def took_effect_by_vm(sent) -> dict[str, int]:
    """How many of the sent stop requests (deallocate or power-off) took effect, per VM name."""
    took_effect: dict[str, int] = {}
    for s in sent:
        if s.status in (202, 500, -1):  # accepted (its answer lost or not)
            name = s.path.rsplit("/", 2)[1]
            took_effect[name] = took_effect.get(name, 0) + 1
    return took_effect


def open_rows_and_marks_problems(w: World) -> list[str]:
    """Records against ARM, the part every action shares: no action row left open, a mark row <=> the mark tag."""
    problems = [f"action row left {r.status}: {r.kind.value} {r.instance_id}" for r in w.store.action_rows(
        status=UNSETTLED)]
    for name in ("idle-a100", "forgotten-a10", "busy-h100", "flex-h100"):
        tagged = TAG_MARKED in w.stub.vm(name).tags
        marked = w.store.get_mark(vm_id(name)) is not None
        if marked != tagged:
            problems.append(f"{name}: mark row {marked} but tag {tagged}")
    return problems


def check_azure_invariants(w: World) -> None:
    problems = []
    took_effect = took_effect_by_vm(w.deallocates())
    problems += [f"{n} deallocated {k} times" for n, k in took_effect.items() if k > 1]
    if w.power_offs():
        problems.append("a power-off was sent: the VM would stay billed")
    for name in took_effect:
        if name in ("busy-h100", "flex-h100"):
            problems.append(f"{name} deallocated: busy or managed by a scale set")
        warned = [m for m in w.notifier.sent if name in m.text and "will be deallocated" in m.text]
        if not warned:
            problems.append(f"{name} deallocated without a delivered warning")
    problems += open_rows_and_marks_problems(w)
    for name in ("idle-a100", "forgotten-a10", "busy-h100", "flex-h100"):
        done = [a for a in w.store.action_rows(status=("done",), kinds=[ActionKind.STOP]) if a.instance_id == vm_id(name)]
        if bool(done) != (w.settle(name) == "deallocated"):
            problems.append(f"{name}: done stop rows {len(done)} but ARM says {w.stub.vm(name).power}")
    assert not problems, problems


def test_deallocate_acted_but_answer_lost_is_read_back_never_repeated(azure_world):
    w = azure_world
    w.tick(0)
    w.stub.arm(is_deallocate_of("idle-a100"), "after_effect")
    report = w.tick(10)
    [stop] = actions_on(report, "idle-a100")
    assert stop.kind == ActionKind.STOP and stop.ok  # confirmed by the read-back
    w.tick(11)
    w.tick(20)
    assert len(w.deallocates("idle-a100")) == 1
    assert sum("Deallocated idle GPU VM" in m and "idle-a100" in m for m in w.messages_about("idle-a100")) == 1
    check_azure_invariants(w)


def test_deallocate_connection_closed_after_the_effect_is_read_back(azure_world):
    w = azure_world
    w.tick(0)
    w.stub.arm(is_deallocate_of("idle-a100"), "drop")
    w.tick(10)
    w.tick(20)
    assert len(w.deallocates("idle-a100")) == 1 and w.settle("idle-a100") == "deallocated"
    check_azure_invariants(w)


def test_deallocate_5xx_before_any_effect_stays_unconfirmed_until_it_cannot_land_then_is_tried_again(azure_world):
    w = azure_world
    w.tick(0)
    w.stub.arm(is_deallocate_of("idle-a100"), "status", status=503)
    w.tick(10)
    [row] = open_rows_of(w, "idle-a100")
    assert row.status == "unconfirmed"  # a 5xx: ARM may have taken it; nothing else is done to the VM meanwhile
    w.tick(10.5)  # within the longest a request may be in flight: still open, no second request
    assert len(w.deallocates("idle-a100")) == 1
    w.tick(13)  # past it: settled from ARM's answer (still running: not done); the mark stands, tried again
    w.tick(14)
    assert len(w.deallocates("idle-a100")) == 2 and w.settle("idle-a100") == "deallocated"
    check_azure_invariants(w)


def test_deallocate_throttled_is_refused_recorded_failed_and_tried_again_next_tick(azure_world):
    w = azure_world
    w.tick(0)
    w.stub.arm(is_deallocate_of("idle-a100"), "status", status=429, retry_after=1)
    report = w.tick(10)
    [stop] = actions_on(report, "idle-a100")
    assert stop.ok is False and "throttled" in (stop.error or "")
    assert w.stub.vm("idle-a100").power == "running"
    w.tick(11)
    assert len(w.deallocates("idle-a100")) == 2 and w.settle("idle-a100") == "deallocated"
    check_azure_invariants(w)


def test_mark_removed_in_the_last_second_is_not_deallocated(azure_world):
    # A person removes the mark after the tick's listing, before its re-read: the re-read sees it.
    w = azure_world
    w.tick(0)
    w.stub.arm(rereads_of("idle-a100"), "hook", hook=lambda _s: w.stub.person_removes_tag("idle-a100", TAG_MARKED))
    report = w.tick(10)
    [skip] = actions_on(report, "idle-a100")
    assert skip.kind == ActionKind.SKIP and f"tag {TAG_MARKED} was removed" in skip.reason
    w.tick(11)  # the next tick sees the mark gone: withdrawn, the warning told so
    assert w.deallocates("idle-a100") == [] and w.stub.vm("idle-a100").power == "running"
    assert any("cancelled" in m for m in w.messages_about("idle-a100"))
    check_azure_invariants(w)


def test_person_starts_the_stopped_allocated_vm_between_plan_and_deallocate(azure_world):
    w = azure_world
    w.tick(0)
    w.stub.arm(rereads_of("forgotten-a10"), "hook",
               hook=lambda _s: w.stub.person_sets_power("forgotten-a10", "running"))
    report = w.tick(10)
    [skip] = actions_on(report, "forgotten-a10")
    assert skip.kind == ActionKind.SKIP and "the instance is running" in skip.reason
    assert w.deallocates("forgotten-a10") == [] and w.stub.vm("forgotten-a10").power == "running"
    check_azure_invariants(w)


@pytest.mark.parametrize("status", [412, 409])
def test_a_refused_mark_write_means_no_warning_and_no_deallocate(azure_world, status):
    # ARM refuses the tag write (412 PreconditionFailed, 409 Conflict: another write under way): nothing was written,
    # nobody is warned, nothing is deallocated; the next tick marks it, and the lead runs from then.
    w = azure_world
    w.stub.arm(lambda s: s.action == TAGS and s.path.split("/virtualMachines/")[1].startswith("idle-a100/"),
               "status", status=status)
    first = w.tick(0)
    [mark] = actions_on(first, "idle-a100")
    assert mark.kind == ActionKind.MARK and mark.ok is False
    assert w.messages_about("idle-a100") == [] and TAG_MARKED not in w.stub.vm("idle-a100").tags
    w.tick(1)
    assert w.stub.vm("idle-a100").tags[TAG_MARKED] == (START + timedelta(minutes=1, seconds=LEAD_S)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    w.tick(10)  # within the lead of the mark written at minute 1
    assert w.deallocates("idle-a100") == []
    w.tick(1 + LEAD_S / 60)
    assert len(w.deallocates("idle-a100")) == 1
    check_azure_invariants(w)


def test_not_opted_in_is_never_warned_or_deallocated(azure_world):
    # Azure's role cannot test the opt-in tag on a deallocate: the code's test is the only fence, and it holds.
    w = azure_world
    w.stub.person_removes_tag("idle-a100", "gpufinops:allow-stop")
    first = w.tick(0)
    [notice] = actions_on(first, "idle-a100")
    assert notice.kind == ActionKind.NOTIFY
    [text] = w.messages_about("idle-a100")
    assert "will be deallocated" not in text and "not opted in" in text
    w.tick(10)
    w.tick(20)
    assert w.deallocates("idle-a100") == [] and TAG_MARKED not in w.stub.vm("idle-a100").tags
    check_azure_invariants(w)


def test_a_scale_set_list_that_fails_leaves_the_tick_partial_and_reported_and_its_node_never_touched(azure_world):
    # An AKS GPU node pool's idle node, listed from its Uniform scale set; then the scale set list fails (503 past
    # the client's retries): the tick is partial, says so, and goes on with the VMs; the node is only ever advised.
    from tests.armstub import ScaleSet
    from tests.places.azure.world import OPT_IN, SUB

    w = azure_world
    w.stub.add_scale_set(ScaleSet(SUB, "MC_ml_aks1_eastus", "aks-gpupool-12345678-vmss", "Standard_NC24ads_A100_v4",
                                  tags={**OPT_IN, "aks-managed-poolName": "gpupool"},
                                  computer_prefix="aks-gpupool-12345678-vmss"))
    node = f"azure:{SUB}/mc_ml_aks1_eastus/aks-gpupool-12345678-vmss/0"
    first = w.tick(0)
    assert first.errors == [] and [a.kind for a in first.actions if a.instance_id == node] == [ActionKind.NOTIFY]
    w.stub.arm(lambda s: s.action == "Microsoft.Compute/virtualMachineScaleSets/read", "status", status=503, times=9)
    partial = w.tick(10)
    assert node not in {i.instance_id for i in partial.instances}
    [error] = partial.errors
    assert "VM scale sets" in error and SUB in error and "VM scale sets" in partial.sources["inventory"]
    assert [a.kind for a in partial.actions if a.instance_id == vm_id("idle-a100")] == [ActionKind.STOP]
    w.stub.faults.clear()
    again = w.tick(20)
    assert again.errors == [] and node in {i.instance_id for i in again.instances}
    assert [s for s in w.stub.requests if "virtualmachinescalesets" in s.path.lower() and s.method != "GET"] == []
    assert w.store.get_mark(node) is None
    check_azure_invariants(w)


# --------------------------------------------------------------------------- power-off (a rule's action: power_off)

POWER_OFF = "Microsoft.Compute/virtualMachines/powerOff/action"


@pytest.fixture()
def power_off_world(arm, azure_prom, tmp_path):
    from tests.places.azure.world import POWER_OFF_ROLE, POWER_OFF_RULE, ROLE

    arm.role = [ROLE, POWER_OFF_ROLE]  # the shipped role and the optional power-off role, as an operator assigns
    fleet(arm)
    return World(arm, azure_prom.url, tmp_path, rules=[POWER_OFF_RULE])


def is_power_off_of(name: str):
    return lambda s: s.action == POWER_OFF and s.path.endswith(f"/{name}/powerOff")


def check_power_off_invariants(w: World) -> None:
    """No power-off before a delivered warning that said billing continues, never two that take effect, never a
    deallocate (no rule asked for one), records equal ARM, every request inside the two roles."""
    from gpufinops.words import POWER_OFF_BILLING

    problems = []
    took_effect = took_effect_by_vm(w.power_offs())
    problems += [f"{n} powered off {k} times" for n, k in took_effect.items() if k > 1]
    if w.deallocates():
        problems.append("a deallocate was sent: no rule asked for one")
    for name in took_effect:
        if name in ("busy-h100", "flex-h100", "forgotten-a10"):
            problems.append(f"{name} powered off: busy, managed by a scale set, or powered off already")
        if not [m for m in w.notifier.sent if name in m.text and "will be powered off" in m.text
                and POWER_OFF_BILLING[1:] in m.text]:
            problems.append(f"{name} powered off without a delivered warning saying billing continues")
    problems += open_rows_and_marks_problems(w)
    for name in ("idle-a100", "forgotten-a10", "busy-h100", "flex-h100"):
        done = [a for a in w.store.action_rows(status=("done",), kinds=[ActionKind.POWER_OFF])
                if a.instance_id == vm_id(name)]
        if len(done) != took_effect.get(name, 0):
            problems.append(f"{name}: done power-off rows {len(done)} but {took_effect.get(name, 0)} took effect")
    assert not problems, problems


@pytest.mark.parametrize("mode", ["after_effect", "drop"])
def test_power_off_acted_but_answer_lost_is_read_back_never_repeated(power_off_world, mode):
    w = power_off_world
    w.tick(0)
    w.stub.arm(is_power_off_of("idle-a100"), mode)
    w.tick(10)
    w.tick(11)
    w.tick(20)
    assert len(w.power_offs("idle-a100")) == 1 and w.settle("idle-a100") == "stopped"
    done = [m for m in w.messages_about("idle-a100") if "Powered off idle GPU VM" in m]
    assert len(done) == 1  # one notice, however the outcome was learnt
    check_power_off_invariants(w)


def test_mark_removed_in_the_last_second_is_not_powered_off(power_off_world):
    w = power_off_world
    w.tick(0)
    w.stub.arm(rereads_of("idle-a100"), "hook", hook=lambda _s: w.stub.person_removes_tag("idle-a100", TAG_MARKED))
    report = w.tick(10)
    [skip] = actions_on(report, "idle-a100")
    assert skip.kind == ActionKind.SKIP and f"tag {TAG_MARKED} was removed" in skip.reason
    w.tick(11)
    assert w.power_offs("idle-a100") == [] and w.stub.vm("idle-a100").power == "running"
    assert any("cancelled" in m for m in w.messages_about("idle-a100"))
    check_power_off_invariants(w)


def test_person_restarts_the_vm_between_plan_and_power_off(power_off_world):
    w = power_off_world
    w.tick(0)
    w.stub.arm(rereads_of("idle-a100"), "hook", hook=lambda _s: w.stub.person_sets_power("idle-a100", "starting"))
    report = w.tick(10)
    [skip] = actions_on(report, "idle-a100")
    assert skip.kind == ActionKind.SKIP and "the instance is pending" in skip.reason
    assert w.power_offs("idle-a100") == []
    check_power_off_invariants(w)


def test_person_starts_the_vm_gpufinops_powered_off_and_it_is_not_powered_off_again_in_that_idle_episode(
        power_off_world):
    # The person wins: started after the power-off, it runs; the same idle episode never brings a second power-off.
    w = power_off_world
    w.tick(0)
    w.tick(10)
    assert w.settle("idle-a100") == "stopped"
    w.stub.person_sets_power("idle-a100", "running")
    for minute in (11, 20, 30):
        w.tick(minute)
    assert len(w.power_offs("idle-a100")) == 1 and w.stub.vm("idle-a100").power == "running"
    check_power_off_invariants(w)


def test_power_off_throttled_is_refused_recorded_failed_and_tried_again_next_tick(power_off_world):
    w = power_off_world
    w.tick(0)
    w.stub.arm(is_power_off_of("idle-a100"), "status", status=429, retry_after=1)
    report = w.tick(10)
    [off] = actions_on(report, "idle-a100")
    assert off.kind == ActionKind.POWER_OFF and off.ok is False and "throttled" in (off.error or "")
    w.tick(11)
    assert len(w.power_offs("idle-a100")) == 2 and w.settle("idle-a100") == "stopped"
    check_power_off_invariants(w)


def test_power_off_5xx_before_any_effect_stays_unconfirmed_until_it_cannot_land_then_is_tried_again(power_off_world):
    w = power_off_world
    w.tick(0)
    w.stub.arm(is_power_off_of("idle-a100"), "status", status=503)
    w.tick(10)
    [row] = open_rows_of(w, "idle-a100")
    assert (row.kind, row.status) == (ActionKind.POWER_OFF, "unconfirmed")  # ARM may have taken it
    w.tick(10.5)  # within the longest a request may be in flight: still open, no second request
    assert len(w.power_offs("idle-a100")) == 1
    w.tick(13)  # past it: settled from ARM's answer (still running: not done); the mark stands, tried again
    w.tick(14)
    assert len(w.power_offs("idle-a100")) == 2 and w.settle("idle-a100") == "stopped"
    check_power_off_invariants(w)


def test_power_off_answer_lost_and_read_back_failing_is_settled_by_the_next_ticks_reconcile(power_off_world):
    # The answer is lost and the read-back cannot say either: unconfirmed; the next tick reads ARM ("Stopped
    # (allocated)") and settles it done: its notice then, once, saying billing continues; never a second power-off.
    from gpufinops.words import POWER_OFF_BILLING

    w = power_off_world
    w.tick(0)
    reads = {"n": 0}

    def read_back_after_the_power_off(s):
        if not rereads_of("idle-a100")(s):
            return False
        reads["n"] += 1
        return reads["n"] > 1  # the act stage's re-read before acting passes; the read-back after it fails

    w.stub.arm(is_power_off_of("idle-a100"), "after_effect")
    w.stub.arm(read_back_after_the_power_off, "status", status=503, times=4)  # every retry of the read-back
    w.tick(10)
    [row] = open_rows_of(w, "idle-a100")
    assert (row.kind, row.status) == (ActionKind.POWER_OFF, "unconfirmed")
    assert [m for m in w.messages_about("idle-a100") if "Powered off" in m] == []
    w.settle("idle-a100")
    w.tick(11)
    [notice] = [m for m in w.messages_about("idle-a100") if "Powered off idle GPU VM" in m]
    assert POWER_OFF_BILLING[1:] in notice
    w.tick(20)
    assert len(w.power_offs("idle-a100")) == 1
    check_power_off_invariants(w)
