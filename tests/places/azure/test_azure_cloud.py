"""places.azure.cloud against the stand-in ARM (tests/armstub.py), through the official clients: the listing across
subscriptions (nextLink pages, statusOnly power states, sizes, spot, scale sets), the Tags API writes, the
deallocate's long-running operation, how each failure is classified, and the shipped role."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from gpufinops.config import ConfigError, load_settings
from gpufinops.model import STATE_STOPPED_ALLOCATED, Action, GpuInstance
from gpufinops.act.plan import opt_in_gap, stop_blocker
from gpufinops.places.azure.cloud import ADVICE_VMSS, AzureCloud, ref_of
from gpufinops.places.azure.sizes import PRICE_SOURCE, AzureSizes  # noqa: F401
from gpufinops.places.ec2.cloud import CloudError, InventoryError
from gpufinops.places.registry import AZURE_VM, place_of, place_of_instance, refusal
from tests.armstub import POWER_OFF_ACTIONS_USED, ROLE_ACTIONS_USED, Vm, role_allows
from tests.places.azure.world import OPT_IN, POWER_OFF_ROLE, ROLE, ROOT, SUB, SUB2, azure_cloud, fleet, vm_id

pytestmark = pytest.mark.integration
LIST = "Microsoft.Compute/virtualMachines/read"


def by_name(instances: list[GpuInstance]) -> dict[str, GpuInstance]:
    return {i.instance_id.rsplit("/", 1)[1]: i for i in instances}


def test_gpu_vms_are_listed_across_pages_with_state_size_spot_owner_and_manager(arm):
    fleet(arm)
    arm.add(Vm(SUB, "ml", "spot-t4", "Standard_NC8as_T4_v3", priority="Spot", location="westeurope",
               computer_name="spot-t4-host", tags={"owner": "dee", "team": "cv"}))
    found = by_name(azure_cloud(arm).list_gpu_instances())
    assert set(found) == {"idle-a100", "busy-h100", "flex-h100", "forgotten-a10", "parked-t4", "spot-t4"}
    # 7 VMs at 2 a page: 4 pages of the model, 4 of the power states, each page asked once.
    lists = [s for s in arm.seen(LIST) if s.path.endswith("/virtualMachines")]
    assert len(lists) == 8 and sum(1 for s in lists if s.query.get("statusOnly") == ["true"]) == 4
    assert sum(1 for s in lists if "$skiptoken" in s.query) == 6
    a100 = found["idle-a100"]
    assert a100.instance_id == f"azure:{SUB}/ml/idle-a100" and a100.account == SUB and a100.provider == "azure"
    assert (a100.state, a100.instance_type, a100.region, a100.gpu_model, a100.gpu_count, a100.gpu_memory_gib) == (
        "running", "Standard_NC24ads_A100_v4", "eastus", "A100-80GB", 1, 80.0)
    assert (a100.hourly_cost, a100.price_source, a100.owner(), a100.team()) == (3.673, PRICE_SOURCE, "ana", "nlp")
    assert a100.launch_time == datetime(2026, 11, 1, 8, tzinfo=timezone.utc) and a100.private_dns == "idle-a100"
    assert (found["forgotten-a10"].state, found["parked-t4"].state) == (STATE_STOPPED_ALLOCATED, "stopped")
    spot = found["spot-t4"]
    assert (spot.lifecycle, spot.private_dns, spot.region) == ("spot", "spot-t4-host", "westeurope")
    assert spot.hourly_cost == AzureSizes.load_default().price("Standard_NC8as_T4_v3", "westeurope", spot=True)
    flex = found["flex-h100"]
    assert flex.managed_by == "VM scale set 'train-pool'" and flex.managed_advice == ADVICE_VMSS
    assert stop_blocker(flex, Action.STOP).startswith("managed by VM scale set 'train-pool': never stopped")
    assert stop_blocker(spot, Action.STOP) == ""  # Azure deallocates a spot VM (unlike EC2's one-time spot)
    assert stop_blocker(a100, Action.TERMINATE).startswith("an Azure VM is deallocated, never deleted")
    assert place_of(a100.instance_id) is AZURE_VM and place_of_instance(a100) is AZURE_VM
    assert opt_in_gap(a100, "gpufinops:allow-stop", "true") == ""
    assert opt_in_gap(spot, "gpufinops:allow-stop", "true").startswith("not opted in")


def test_a_subscription_that_cannot_be_listed_leaves_the_others_and_all_failing_raises(arm):
    fleet(arm)
    arm.add(Vm(SUB2, "other", "gpu-b", "Standard_NC6s_v3", tags=dict(OPT_IN)))
    cloud = azure_cloud(arm, subscriptions=(SUB, SUB2))
    arm.arm(lambda s: f"/subscriptions/{SUB}/" in s.path, "status", status=409, times=1)
    listed = by_name(cloud.list_gpu_instances())
    assert set(listed) == {"gpu-b"} and len(cloud.last_errors) == 1 and SUB in cloud.last_errors[0]
    arm.arm(lambda s: s.path.endswith("/virtualMachines"), "status", status=404, times=2)
    with pytest.raises(InventoryError, match="failed in every subscription"):
        cloud.list_gpu_instances()


def test_a_throttled_read_is_retried_after_retry_after_and_answers(arm):
    fleet(arm)
    arm.arm(lambda s: s.path.endswith("/virtualMachines"), "status", status=429, retry_after=1, times=1)
    assert len(azure_cloud(arm).list_gpu_instances()) == 5
    assert [s.status for s in arm.seen(LIST)][:2] == [429, 200]


def test_describe_reads_each_vm_with_its_instance_view_and_a_gone_vm_is_absent(arm):
    fleet(arm)
    cloud = azure_cloud(arm)
    [vm] = cloud.describe([vm_id("forgotten-a10"), f"azure:{SUB}/ml/deleted", "i-0abc"])
    assert vm.state == STATE_STOPPED_ALLOCATED and vm.instance_id == vm_id("forgotten-a10")
    arm.arm(lambda s: s.path.endswith("/idle-a100"), "status", status=503, times=5)
    with pytest.raises(InventoryError, match="could not be read"):
        cloud.describe([vm_id("idle-a100")])


def test_tags_are_merged_and_deleted_by_name_never_replacing_a_persons(arm):
    fleet(arm)
    cloud = azure_cloud(arm)
    inst = cloud.describe([vm_id("idle-a100")])[0]
    arm.person_sets_tags("idle-a100", project="x")  # after our read
    cloud.set_tags(inst, {"gpufinops:marked-for-stop": "2026-12-07T10:00:00Z"})
    assert arm.vm("idle-a100").tags == {**OPT_IN, "owner": "ana", "team": "nlp", "project": "x",
                                        "gpufinops:marked-for-stop": "2026-12-07T10:00:00Z"}
    [patch] = arm.seen("Microsoft.Resources/tags/write")
    assert patch.method == "PATCH" and patch.body["operation"] == "Merge"
    cloud.remove_tags(cloud.describe([vm_id("idle-a100")])[0], ["gpufinops:marked-for-stop"])
    assert "gpufinops:marked-for-stop" not in arm.vm("idle-a100").tags and arm.vm("idle-a100").tags["project"] == "x"
    assert [s.body["operation"] for s in arm.seen("Microsoft.Resources/tags/write")] == ["Merge", "Delete"]


@pytest.mark.parametrize("mode,status,definite", [
    ("status", 429, True),  # throttled: refused, not done
    ("status", 412, True),  # a precondition ARM refused
    ("status", 403, True),
    ("status", 503, False),  # a 5xx before the effect: the client cannot tell
    ("after_effect", 500, False),  # done, answer lost
    ("drop", 0, False),  # done, connection closed unanswered
])
def test_a_write_is_sent_once_and_its_failure_says_whether_arm_did_nothing(arm, mode, status, definite):
    fleet(arm)
    cloud = azure_cloud(arm)
    inst = cloud.describe([vm_id("idle-a100")])[0]
    arm.arm(lambda s: s.action == "Microsoft.Resources/tags/write", mode, status=status, retry_after=0)
    with pytest.raises(CloudError) as err:
        cloud.set_tags(inst, {"gpufinops:marked-for-stop": "x"})
    assert err.value.definite is definite
    assert len(arm.seen("Microsoft.Resources/tags/write")) == 1  # never retried: one request per intent
    done = "gpufinops:marked-for-stop" in arm.vm("idle-a100").tags
    assert done is (mode != "status")


def test_deallocate_is_a_long_running_operation_followed_to_deallocated_never_a_power_off(arm):
    fleet(arm)
    arm.transition_s = 0.5
    cloud = azure_cloud(arm)
    inst = cloud.describe([vm_id("idle-a100")])[0]
    cloud.stop(inst)
    assert arm.vm("idle-a100").power == "deallocated"  # the operation was polled to its end
    [post] = arm.seen("Microsoft.Compute/virtualMachines/deallocate/action")
    assert post.method == "POST" and post.status == 202
    assert len(arm.seen("Microsoft.Compute/locations/operations/read")) >= 2  # InProgress, then Succeeded
    assert arm.seen("Microsoft.Compute/virtualMachines/powerOff/action") == []
    assert cloud.describe([vm_id("idle-a100")])[0].state == "stopped"


def test_a_deallocate_not_followed_to_its_end_still_reads_back_as_stopping(arm):
    fleet(arm)
    arm.transition_s = 30
    cloud = azure_cloud(arm, deallocate_wait_s=0.3)
    cloud.stop(cloud.describe([vm_id("idle-a100")])[0])
    assert cloud.describe([vm_id("idle-a100")])[0].state == "stopping"  # deallocating: counted done by the act stage


def test_delete_is_never_offered(arm):
    fleet(arm)
    cloud = azure_cloud(arm)
    with pytest.raises(CloudError) as err:
        cloud.terminate(cloud.describe([vm_id("idle-a100")])[0])
    assert err.value.definite and "never deletes" in str(err.value)
    assert [s.method for s in arm.requests if s.method != "GET"] == []


def test_the_shipped_role_grants_exactly_what_the_place_calls_and_no_power_off_start_or_delete():
    assert sorted(ROLE["Actions"]) == sorted(ROLE_ACTIONS_USED)
    for never in ("Microsoft.Compute/virtualMachines/powerOff/action", "Microsoft.Compute/virtualMachines/delete",
                  "Microsoft.Compute/virtualMachines/write", "Microsoft.Compute/virtualMachines/start/action"):
        assert not role_allows(ROLE, never), never
    # The power-off is the optional role's alone: an operator who never writes a power_off rule never grants it.
    assert sorted(POWER_OFF_ROLE["Actions"]) == sorted(POWER_OFF_ACTIONS_USED)
    assert role_allows([ROLE, POWER_OFF_ROLE], POWER_OFF_ACTIONS_USED[0])
    source = (ROOT / "gpufinops" / "places" / "azure" / "cloud.py").read_text()
    for action in (*ROLE["Actions"], *POWER_OFF_ROLE["Actions"]):
        assert action in source  # the module's docstring names each ARM operation it makes
    # The power-off is called from power_off() alone, never from the stop (the SDK's stop() is that trap).
    assert source.count("begin_power_off(") == 1 and "begin_power_off" not in source.split("def stop(")[1].split(
        "def power_off(")[0]


def test_power_off_is_one_request_followed_to_stopped_allocated_with_the_guest_shut_down(arm):
    fleet(arm)
    arm.role = [ROLE, POWER_OFF_ROLE]
    arm.transition_s = 0.5
    cloud = azure_cloud(arm)
    cloud.power_off(cloud.describe([vm_id("idle-a100")])[0])
    assert arm.vm("idle-a100").power == "stopped"  # polled to its end: "Stopped (allocated)"
    [post] = arm.seen("Microsoft.Compute/virtualMachines/powerOff/action")
    assert (post.method, post.status, post.query.get("skipShutdown")) == ("POST", 202, ["false"])
    assert arm.seen("Microsoft.Compute/virtualMachines/deallocate/action") == []
    assert cloud.describe([vm_id("idle-a100")])[0].state == STATE_STOPPED_ALLOCATED


@pytest.mark.parametrize("mode,status,definite", [("status", 429, True), ("after_effect", 500, False),
                                                  ("drop", 0, False)])
def test_a_power_off_is_sent_once_and_its_failure_says_whether_arm_did_nothing(arm, mode, status, definite):
    fleet(arm)
    arm.role = [ROLE, POWER_OFF_ROLE]
    cloud = azure_cloud(arm)
    inst = cloud.describe([vm_id("idle-a100")])[0]
    arm.arm(lambda s: s.action == POWER_OFF_ACTIONS_USED[0], mode, status=status, retry_after=0)
    with pytest.raises(CloudError) as err:
        cloud.power_off(inst)
    assert err.value.definite is definite and err.value.operation == "power off"
    assert len(arm.seen(POWER_OFF_ACTIONS_USED[0])) == 1  # never retried: one request per intent
    assert (arm.vm("idle-a100").power != "running") is (mode != "status")


def test_without_the_optional_role_arm_refuses_the_power_off_and_the_vm_runs_on(arm):
    fleet(arm)
    cloud = azure_cloud(arm)  # the shipped role only
    with pytest.raises(CloudError) as err:
        cloud.power_off(cloud.describe([vm_id("idle-a100")])[0])
    assert err.value.definite and "403" in str(err.value) and err.value.code == "AuthorizationFailed"
    assert arm.vm("idle-a100").power == "running"
    [refused] = arm.denied()
    assert refused.action == POWER_OFF_ACTIONS_USED[0]
    arm.requests.remove(refused)  # refused on purpose here: the fixture's check is for requests the role must allow


def test_a_bad_azure_section_names_the_key(tmp_path):
    path = tmp_path / "gpufinops.yaml"
    path.write_text("azure:\n  subscriptions: [not-a-guid]\n")
    with pytest.raises(ConfigError, match=r"azure.subscriptions.*not a subscription id"):
        load_settings(path)
    path.write_text(f"azure:\n  subscriptions: ['{SUB}']\n  endpoint_url: http://127.0.0.1:1\n")
    with pytest.raises(ConfigError, match=r"azure.endpoint_url.*https only"):
        load_settings(path)
    assert ref_of(f"azure:{SUB}/rg/vm").arm_id == \
        f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm"
    assert ref_of("i-0abc") is None and ref_of("azure:x/y") is None


def test_an_azure_section_puts_its_vms_beside_ec2_in_the_tick(arm, tmp_path):
    from gpufinops.places.azure.cloud import WithAzure
    from gpufinops.run.compose import live_inventory

    fleet(arm)
    settings = load_settings(None, azure={"subscriptions": [SUB], "endpoint_url": arm.url, "ca_file": arm.ca_file})
    inventory = live_inventory(settings)
    assert isinstance(inventory, WithAzure) and inventory.other is None  # no `aws:` section: no EC2 call
    assert isinstance(inventory.azure, AzureCloud)
    assert json.dumps(settings.azure.subscriptions) == json.dumps([SUB])


def test_a_blank_credential_variable_is_one_error_line_never_a_fall_to_the_next_credential(tmp_path, monkeypatch,
                                                                                           capsys):
    from gpufinops.cli import main

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"azure:\n  subscriptions: ['{SUB}']\n  endpoint_url: https://127.0.0.1:9\n"
                   f"database_url: sqlite:///{tmp_path / 'db.sqlite'}\n")
    monkeypatch.setenv("AZURE_TENANT_ID", "t")
    monkeypatch.setenv("AZURE_CLIENT_ID", "c")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "  ")
    assert main(["--config", str(cfg), "evaluate", "--once"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: Azure credentials: the environment variable AZURE_CLIENT_SECRET is set but blank"


def test_fields_are_read_by_their_rest_names_from_the_sdks_mapping_and_by_attribute_from_any_other_model():
    from types import SimpleNamespace

    from azure.mgmt.compute.models import VirtualMachine

    from gpufinops.places.azure.cloud import _size_of, _time, field

    answer = {"id": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/v",
              "properties": {"hardwareProfile": {"vmSize": "Standard_NC24ads_A100_v4"},
                             "timeCreated": "2026-11-01T08:00:00.1234567+00:00",  # .NET's 7 decimals
                             "virtualMachineScaleSet": {"id": "/x/virtualMachineScaleSets/pool"}}}
    vm = VirtualMachine(answer)
    assert _size_of(vm) == vm.hardware_profile.vm_size == "Standard_NC24ads_A100_v4"
    assert _time(field(vm, "properties", "timeCreated")) == vm.time_created
    assert field(vm, "properties", "virtualMachineScaleSet", "id") == vm.virtual_machine_scale_set.id
    assert field(vm, "properties", "osProfile", "computerName") is None and field(vm, "tags") is None
    # A model read by attribute (flattened, as the SDK's older models were): the same fields.
    old = SimpleNamespace(hardware_profile=SimpleNamespace(vm_size="Standard_ND96isr_H100_v5"), time_created=None)
    assert _size_of(old) == "Standard_ND96isr_H100_v5" and field(old, "properties", "timeCreated") is None
    assert _time("not a time") is None and _time("2026-11-01T08:00:00Z").tzinfo is not None


# --------------------------------------------------------------------------- Uniform scale sets' instances

SCALE_SET_READ = "Microsoft.Compute/virtualMachineScaleSets/read"
SCALE_SET_VMS_READ = "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"


def scale_sets(arm) -> None:
    """An AKS GPU node pool (Uniform, Spot, 3 instances: 2 a page), a plain Uniform GPU set (no orchestrationMode: an
    older one), a Flexible GPU set (its members are VMs of the VM list), an empty GPU set and a CPU set."""
    from tests.armstub import ScaleSet

    arm.add_scale_set(ScaleSet(SUB, "MC_ml_aks1_eastus", "aks-gpupool-12345678-vmss", "Standard_NC24ads_A100_v4",
                               powers=["running", "running", "deallocated"], priority="Spot",
                               tags={"aks-managed-poolName": "gpupool", "team": "nlp", "owner": "ana"},
                               computer_prefix="aks-gpupool-12345678-vmss"))
    arm.add_scale_set(ScaleSet(SUB, "train", "h100-set", "Standard_ND96isr_H100_v5", orchestration="",
                               powers=["running"], tags={"owner": "bo"}))
    arm.add_scale_set(ScaleSet(SUB, "train", "train-pool", "Standard_ND96isr_H100_v5", orchestration="Flexible"))
    arm.add_scale_set(ScaleSet(SUB, "train", "parked-set", "Standard_ND96isr_H100_v5", powers=[]))
    arm.add_scale_set(ScaleSet(SUB, "web", "web-set", "Standard_D4s_v5", powers=["running"] * 5))


AKS_SET = f"azure:{SUB}/mc_ml_aks1_eastus/aks-gpupool-12345678-vmss"


def test_uniform_scale_set_instances_are_listed_with_the_scale_sets_size_spot_tags_and_manager(arm):
    fleet(arm)
    scale_sets(arm)
    cloud = azure_cloud(arm)
    found = {i.instance_id: i for i in cloud.list_gpu_instances()}
    assert cloud.last_errors == []
    assert {iid for iid in found if iid.count("/") == 3} == {f"{AKS_SET}/0", f"{AKS_SET}/1", f"{AKS_SET}/2",
                                                            f"azure:{SUB}/train/h100-set/0"}
    assert vm_id("flex-h100") in found  # the Flexible set's member, once: as the VM it is
    node = found[f"{AKS_SET}/1"]
    assert (node.state, node.instance_type, node.region, node.gpu_model, node.gpu_count, node.lifecycle) == (
        "running", "Standard_NC24ads_A100_v4", "eastus", "A100-80GB", 1, "spot")
    assert node.private_dns == "aks-gpupool-12345678-vmss000001"  # the host name DCGM's series carry
    assert (node.owner(), node.team(), node.account, node.provider) == ("ana", "nlp", SUB, "azure")
    assert node.hourly_cost == AzureSizes.load_default().price("Standard_NC24ads_A100_v4", "eastus", spot=True)
    assert node.launch_time == datetime(2026, 11, 1, 8, tzinfo=timezone.utc)
    assert found[f"{AKS_SET}/2"].state == "stopped"
    assert node.managed_by == "AKS node pool 'gpupool' (VM scale set 'aks-gpupool-12345678-vmss')"
    plain = found[f"azure:{SUB}/train/h100-set/0"]
    assert (plain.managed_by, plain.managed_advice, plain.lifecycle) == ("VM scale set 'h100-set'", ADVICE_VMSS,
                                                                         "on-demand")
    # Never stopped: the registry refuses every change and the plan advises instead.
    from gpufinops.places.registry import AZURE_SCALE_SET_INSTANCE

    assert place_of(node.instance_id) is AZURE_SCALE_SET_INSTANCE and place_of_instance(node) is \
        AZURE_SCALE_SET_INSTANCE
    assert stop_blocker(node, Action.STOP).startswith("managed by AKS node pool 'gpupool'")
    # The requests: one page of scale sets; instances asked only of the GPU sets that are Uniform and not empty
    # (the AKS pool's 3 at 2 a page: 2 pages; h100-set: 1), each with its instance view.
    sets = arm.seen(SCALE_SET_READ)
    assert [s.path.rsplit("/", 1)[1] for s in sets] == ["virtualMachineScaleSets"] * 3  # 5 sets at 2 a page
    members = arm.seen(SCALE_SET_VMS_READ)
    assert sorted(s.path.split("/")[-2] for s in members) == ["aks-gpupool-12345678-vmss"] * 2 + ["h100-set"]
    assert all(s.query.get("$expand") == ["instanceView"] for s in members)


def test_a_scale_set_list_that_fails_makes_the_listing_partial_never_empty(arm):
    fleet(arm)
    scale_sets(arm)
    cloud = azure_cloud(arm)
    # The scale set list refused (retries cannot help a 403): the VMs are still listed, the error says what is missing.
    arm.arm(lambda s: s.action == SCALE_SET_READ, "status", status=403, times=1)
    listed = {i.instance_id for i in cloud.list_gpu_instances()}
    assert vm_id("idle-a100") in listed and not any(i.count("/") == 3 for i in listed)
    assert not cloud.complete and len(cloud.last_errors) == 1 and "VM scale sets" in cloud.last_errors[0]
    # One scale set's instances failing (5xx past the retries): the other scale set and the VMs are still listed.
    arm.arm(lambda s: s.action == SCALE_SET_VMS_READ and "/aks-gpupool-" in s.path, "status", status=503, times=9)
    listed = {i.instance_id for i in cloud.list_gpu_instances()}
    assert f"azure:{SUB}/train/h100-set/0" in listed and vm_id("idle-a100") in listed
    assert not any(i.startswith(AKS_SET) for i in listed)  # a scale set is listed whole, or is an error
    [error] = cloud.last_errors
    assert "aks-gpupool-12345678-vmss" in error and SUB in error
    arm.faults.clear()
    assert len(cloud.list_gpu_instances()) == 5 + 4 and cloud.complete


def test_describe_reads_a_scale_set_instance_afresh_and_a_gone_one_is_absent(arm):
    scale_sets(arm)
    cloud = azure_cloud(arm)
    [node] = cloud.describe([f"{AKS_SET}/2", f"{AKS_SET}/7", f"azure:{SUB}/train/gone-set/0"])
    assert (node.instance_id, node.state, node.lifecycle) == (f"{AKS_SET}/2", "stopped", "spot")
    assert node.managed_by.startswith("AKS node pool 'gpupool'") and node.tags["owner"] == "ana"
    assert [s.query.get("$expand") for s in arm.seen(SCALE_SET_VMS_READ)] == [["instanceView"], ["instanceView"]]
    arm.arm(lambda s: s.action == SCALE_SET_VMS_READ, "status", status=503, times=9)
    with pytest.raises(InventoryError, match="could not be read"):
        cloud.describe([f"{AKS_SET}/0"])


def test_every_change_to_a_scale_set_instance_is_refused_before_any_request(arm):
    scale_sets(arm)
    cloud = azure_cloud(arm)
    [node] = cloud.describe([f"{AKS_SET}/0"])
    before = len(arm.requests)
    for change in (lambda: cloud.stop(node), lambda: cloud.power_off(node), lambda: cloud.terminate(node),
                   lambda: cloud.set_tags(node, {"gpufinops:marked-for-stop": "x"}),
                   lambda: cloud.remove_tags(node, ["owner"])):
        with pytest.raises(CloudError) as err:
            change()
        assert err.value.definite  # certainly not done: nothing was sent
    assert arm.requests[before:] == []
    assert {a for a in Action if not refusal(node, a)} == {Action.NOTIFY}
