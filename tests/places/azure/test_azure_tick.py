"""Azure VMs through the real tick (issue 39): the stand-in ARM (tests/armstub.py) under the shipped custom role, a
real Prometheus with DCGM series keyed by each VM's hostname, `pipeline.run_once` on a moved clock.

Timeline (rule: under 10% for 10 min, lead 10 min; minutes from START): 0 IDLE -> tag + warning; +10 the
deallocate is due."""

from __future__ import annotations

import json

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


# --------------------------------------------------------------------------- what people read: CLI, API, /metrics


def test_evaluate_json_api_and_metrics_show_azure_vms_like_ec2_instances(arm, azure_prom, tmp_path, capsys,
                                                                            monkeypatch):
    import json

    import yaml

    from gpufinops.cli import main
    from tests.armstub import CLIENT_SECRET
    from tests.places.azure.world import SUB, fleet

    fleet(arm)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "idle.yaml").write_text(
        "rules:\n- name: idle-10m\n  threshold_pct: 10\n  window: 10m\n  aggregation: stays_below\n  action: stop\n")
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(yaml.safe_dump({
        "azure": {"subscriptions": [SUB], "endpoint_url": arm.url, "ca_file": arm.ca_file,
                  "authority_host": arm.url},
        "prometheus": {"url": azure_prom.url, "scrape_interval_s": 30},
        "database_url": f"sqlite:///{tmp_path / 'cli.db'}", "rules_paths": [str(tmp_path / "rules")]}))
    # A service principal from the environment, signed in at the stand-in's Entra ID (never a real endpoint).
    monkeypatch.setenv("AZURE_TENANT_ID", "00000000-0000-0000-0000-00000000000a")
    monkeypatch.setenv("AZURE_CLIENT_ID", "00000000-0000-0000-0000-00000000000b")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", CLIENT_SECRET)
    main(["--config", str(cfg), "evaluate", "--once", "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    rows = {r["instance_id"]: r for r in data["decisions"]}
    assert data["errors"] == [] and data["instances"] == 5
    assert rows[vm_id("idle-a100")]["verdict"] == "IDLE" and rows[vm_id("idle-a100")]["owner"] == "ana"
    assert rows[vm_id("idle-a100")]["instance_type"] == "Standard_NC24ads_A100_v4"
    assert rows[vm_id("busy-h100")]["verdict"] == "ACTIVE"
    assert rows[vm_id("flex-h100")]["managed_by"] == "VM scale set 'train-pool'"
    assert rows[vm_id("forgotten-a10")]["code"] == ReasonCode.BILLED_WHILE_STOPPED.value
    assert rows[vm_id("forgotten-a10")]["hourly_cost"] == pytest.approx(3.2)
    signed_in = [s for s in arm.requests if s.action == "Entra ID sign-in"]
    assert signed_in and all(s.path.startswith("/00000000-0000-0000-0000-00000000000a/") for s in signed_in)
    assert [s for s in arm.requests if s.method != "GET" and s.action != "Entra ID sign-in"] == []  # judged only


def test_the_api_and_metrics_answer_for_azure_vms(world):
    from gpufinops.config import ApiSettings
    from gpufinops.run.api import VerdictApi
    from gpufinops.run.fleet_metrics import FleetFigures

    report = world.tick(0)
    api = VerdictApi(ApiSettings(), world.store, lambda: (report, world.now), lambda: world.now, 600)
    answer = api.answer({"instance": [vm_id("idle-a100")], "host": ["busy-h100"]})
    text = json.dumps(answer.body, default=str)
    assert answer.status == 200 and vm_id("idle-a100") in text and vm_id("busy-h100") in text
    families = {f.name: f for f in FleetFigures.from_report(report).families()}
    cost = {s.labels["instance_id"]: s.value for s in families["gpufinops_node_total_hourly_cost"].samples}
    assert cost[vm_id("idle-a100")] == pytest.approx(3.673) and cost[vm_id("forgotten-a10")] == pytest.approx(3.2)


def test_a_snooze_click_on_an_azure_vms_warning_is_taken_and_written_as_its_tag(world):
    from datetime import timedelta

    from gpufinops.notify import interact
    from tests.notify.test_interact import click_body

    world.tick(0)
    click = interact.parse_click(click_body("U0ANA0001", "gpufinops_snooze_2h", vm_id("idle-a100")))
    assert isinstance(click, interact.Click) and click.instance_id == vm_id("idle-a100")
    for forged in (vm_id("idle-a100").upper(), vm_id("idle-a100") + "/x", "azure:" + "a" * 300):
        assert isinstance(interact.parse_click(click_body("U0ANA0001", "gpufinops_snooze_2h", forged)), str)
    until = (world.now + timedelta(minutes=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    interact.keep_request(world.store, interact.SnoozeRequest(
        instance_id=vm_id("idle-a100"), until=until, user_id="U0ANA0001", user_name="ana", action_id="snooze_2h",
        channel_id="", message_ts="", requested_at=world.now.isoformat()))
    report = world.tick(1)
    assert world.stub.vm("idle-a100").tags[TAG_SNOOZE] == until  # written with the Tags API's Merge
    assert ActionKind.UNMARK in kinds(report, "idle-a100") and TAG_MARKED not in world.stub.vm("idle-a100").tags
    world.tick(11)
    assert world.deallocates("idle-a100") == []


# --------------------------------------------------------------------------- power-off, on a rule's explicit request


@pytest.fixture()
def power_off_world(arm, azure_prom, tmp_path):
    from tests.places.azure.world import POWER_OFF_ROLE, POWER_OFF_RULE, ROLE, World, fleet

    arm.role = [ROLE, POWER_OFF_ROLE]  # the operator assigned the optional role beside the shipped one
    fleet(arm)
    return World(arm, azure_prom.url, tmp_path, rules=[POWER_OFF_RULE])


def test_a_power_off_rule_warns_that_billing_continues_powers_off_once_and_never_loops(power_off_world):
    from gpufinops.words import POWER_OFF_BILLING

    w = power_off_world
    first = w.tick(0)
    assert kinds(first, "idle-a100") == [ActionKind.MARK]
    [warning] = w.messages_about("idle-a100")
    assert "will be powered off at" in warning and POWER_OFF_BILLING[1:] in warning
    # The VM a person left powered off is what this rule would make of it: judged billed, never warned or touched.
    [d] = [d for d in first.decisions if d.instance_id == vm_id("forgotten-a10")]
    assert (d.verdict, d.code) == (Verdict.IDLE, ReasonCode.BILLED_WHILE_STOPPED)
    assert kinds(first, "forgotten-a10") == [] and w.messages_about("forgotten-a10") == []

    done = w.tick(10)
    [off] = [a for a in done.actions if a.instance_id == vm_id("idle-a100")]
    assert off.kind == ActionKind.POWER_OFF and off.ok and POWER_OFF_BILLING in off.reason
    [post] = w.power_offs("idle-a100")
    assert post.query.get("skipShutdown") == ["false"] and w.deallocates() == []
    assert w.settle("idle-a100") == "stopped"  # "Stopped (allocated)": still billed
    [notice] = [m for m in w.messages_about("idle-a100") if "Powered off idle GPU VM" in m]
    assert POWER_OFF_BILLING[1:] in notice and "Saves" not in notice
    vm = w.stub.vm("idle-a100")
    assert TAG_MARKED not in vm.tags and vm.tags[TAG_STOPPED_BY] == "gpufinops"
    [row] = w.store.action_rows(status=("done",), kinds=[ActionKind.POWER_OFF])
    assert row.instance_id == vm_id("idle-a100") and POWER_OFF_BILLING in row.reason  # the audit says it

    # Now "Stopped (allocated)", judged IDLE and billed under the same rule: never warned or powered off again.
    for minute in (11, 20, 30, 45):
        later = w.tick(minute)
        [d] = [d for d in later.decisions if d.instance_id == vm_id("idle-a100")]
        assert (d.verdict, d.code) == (Verdict.IDLE, ReasonCode.BILLED_WHILE_STOPPED)
        assert kinds(later, "idle-a100") == []
    assert len(w.power_offs()) == 1 and w.deallocates() == []
    assert len(w.messages_about("idle-a100")) == 2  # the warning and the done notice, nothing more
    assert TAG_MARKED not in w.stub.vm("idle-a100").tags and TAG_MARKED not in w.stub.vm("forgotten-a10").tags


def test_a_vm_a_person_powers_off_during_the_lead_has_its_mark_withdrawn_and_is_not_powered_off(power_off_world):
    w = power_off_world
    w.tick(0)
    w.stub.person_sets_power("idle-a100", "stopped")
    report = w.tick(5)
    assert kinds(report, "idle-a100") == [ActionKind.UNMARK]
    assert TAG_MARKED not in w.stub.vm("idle-a100").tags
    assert any("already powered off" in m and "cancelled" in m.lower() for m in w.messages_about("idle-a100"))
    w.tick(10)
    w.tick(20)
    assert w.power_offs() == [] and w.deallocates() == []


def test_a_stop_rule_beside_a_power_off_rule_still_deallocates_a_powered_off_vm(power_off_world):
    from tests.places.azure.world import POWER_OFF_RULE, RULE

    w = power_off_world
    w.rules = [POWER_OFF_RULE, RULE]  # the power-off rule first: a spent power-off still ranks under the stop
    w.tick(0)
    [warning] = w.messages_about("forgotten-a10")
    assert "will be deallocated at" in warning
    w.tick(10)
    assert len(w.deallocates("forgotten-a10")) == 1 and w.power_offs("forgotten-a10") == []


# --------------------------------------------------------------------------- a Uniform scale set's instance


def test_an_idle_uniform_scale_set_instance_is_judged_and_advised_never_stopped_or_tagged(world):
    from gpufinops.places.azure.cloud import ADVICE_AKS
    from tests.armstub import ScaleSet
    from tests.places.azure.world import OPT_IN, SUB

    # An AKS GPU node pool's node, idle, opted in (as the whole subscription might be): a stop rule still only advises.
    world.stub.add_scale_set(ScaleSet(SUB, "MC_ml_aks1_eastus", "aks-gpupool-12345678-vmss",
                                      "Standard_NC24ads_A100_v4", powers=["running"],
                                      tags={**OPT_IN, "aks-managed-poolName": "gpupool", "owner": "ana"},
                                      computer_prefix="aks-gpupool-12345678-vmss"))
    node = f"azure:{SUB}/mc_ml_aks1_eastus/aks-gpupool-12345678-vmss/0"
    first = world.tick(0)
    [d] = [d for d in first.decisions if d.instance_id == node]
    assert (d.verdict, d.code) == (Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW)  # its DCGM series, by its host name
    assert [a.kind for a in first.actions if a.instance_id == node] == [ActionKind.NOTIFY]
    [notice] = [m.text for m in world.notifier.sent if "ks-gpupool-12345678-vmss/0" in m.text]  # the id shortened
    assert "AKS node pool 'gpupool'" in notice and ADVICE_AKS in notice and "Nothing will be stopped" in notice
    for minute in (10, 20, 31):
        later = world.tick(minute)
        assert not [a for a in later.actions if a.instance_id == node and a.kind is not ActionKind.NOTIFY]
    # Nothing but reads ever reached the scale set or its instance: no deallocate, power-off or tag write.
    touched = [(s.method, s.path, s.action) for s in world.stub.requests
               if "virtualmachinescalesets" in s.path.lower() and (s.method != "GET" or not s.action.endswith("/read"))]
    assert touched == []
    assert world.stub.scale_sets[next(iter(world.stub.scale_sets))].powers == ["running"]
    assert not any("aks-gpupool" in s.path for s in world.stub.seen("Microsoft.Resources/tags/write"))
    assert world.store.get_mark(node) is None
    assert len(world.deallocates("idle-a100")) == 1  # the tick did act: on the VM it may deallocate
