"""GceCloud against the GCE stand-in (tests/gcestub.py) through the official client: listing every zone with paging,
GPUs from machine types and accelerators, managed instance groups, labels written with the fingerprint (412 when a
person changed them), the stop's operation polled to DONE, 429 / 5xx / a lost answer; every request checked against
the shipped custom role (deploy/gcp/gpufinops-role.yaml)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from gpufinops.config import load_settings
from gpufinops.model import TAG_MARKED, TAG_SNOOZE
from gpufinops.places.registry import TAG_GCE_ZONE, TAG_STOP_FENCE, UNSUPPORTED_MARK
from gpufinops.places.gcp.cloud import GceCloud, GceError, InventoryError
from gpufinops.prices.catalog import load_catalog
from gpufinops.prices.host_prices import is_estimate
from tests.gcestub import Fault

ROLE = Path(__file__).resolve().parents[3] / "deploy" / "gcp" / "gpufinops-role.yaml"
TOKEN = "ya29.test-token"


def role_permissions() -> set[str]:
    return set(yaml.safe_load(ROLE.read_text())["includedPermissions"])


def assert_within_role(stub) -> None:
    used = {r.permission for r in stub.requests}
    assert used <= role_permissions(), used - role_permissions()
    assert all(r.authorization == f"Bearer {TOKEN}" for r in stub.requests)


def cloud_of(stub, monkeypatch, **gcp) -> GceCloud:
    stub.token = TOKEN
    monkeypatch.setenv("GPUFINOPS_GCP_ACCESS_TOKEN", TOKEN)
    settings = load_settings(gcp={"projects": list(stub.projects), "api_endpoint": stub.url,
                                  "operation_timeout_s": 5, **gcp})
    return GceCloud(settings.gcp, catalog=load_catalog(), sleep=lambda s: None, poll_s=0.01)


def by_name(instances):
    return {i.instance_id.rsplit("/", 1)[1]: i for i in instances}


def test_lists_gpu_vms_of_every_zone_across_pages_and_nothing_else(gce, monkeypatch):
    started = datetime(2026, 12, 7, 8, 0, tzinfo=timezone.utc)
    gce.add("l4-idle", "us-central1-a", "g2-standard-8", labels={"team": "ml", "owner": "ana"}, started=started)
    gce.add("a100x8", "us-central1-b", "a2-highgpu-8g", spot=True)
    gce.add("t4-n1", "europe-west4-a", "n1-standard-8", accelerators=[("nvidia-tesla-t4", 2)], preemptible=True)
    gce.add("web", "us-central1-a", "e2-medium")  # no GPU: not listed
    gce.add("mig-1", "us-east4-b", "a3-highgpu-8g",
            created_by="projects/123456/zones/us-east4-b/instanceGroupManagers/trainers")
    gce.add("off", "us-central1-a", "g2-standard-4", status="TERMINATED")
    cloud = cloud_of(gce, monkeypatch, page_size=2)

    vms = by_name(cloud.list_gpu_instances())

    assert set(vms) == {"l4-idle", "a100x8", "t4-n1", "mig-1", "off"}
    assert len(gce.calls("instances.aggregatedList")) == 3  # 6 VMs, 2 a page
    l4 = vms["l4-idle"]
    assert l4.instance_id == "gce:ml-prod/us-central1-a/l4-idle" and l4.provider == "gcp"
    assert (l4.region, l4.account, l4.state, l4.lifecycle) == ("us-central1", "ml-prod", "running", "on-demand")
    assert (l4.gpu_count, l4.gpu_model, l4.gpu_memory_gib) == (1, "L4", 24.0)
    assert l4.launch_time == started and l4.owner() == "ana" and l4.team() == "ml"
    assert l4.private_dns == "l4-idle.us-central1-a.c.ml-prod.internal" and l4.private_ip.startswith("10.128.0.")
    assert l4.hourly_cost == pytest.approx(0.85362) and l4.price_source == ""  # bundled catalog, us-central1
    a100 = vms["a100x8"]
    assert (a100.gpu_count, a100.gpu_model, a100.lifecycle) == (8, "A100-40GB", "spot")
    assert a100.hourly_cost == pytest.approx(14.4308)  # the spot price
    t4 = vms["t4-n1"]
    assert (t4.gpu_count, t4.gpu_model, t4.lifecycle) == (2, "T4", "spot")
    assert t4.hourly_cost == pytest.approx(0.16565 + 2 * 0.1732)  # N1 in parts: the VM's and two T4s' spot prices
    assert vms["mig-1"].managed_by == "managed instance group 'trainers' (us-east4-b)"
    assert "resize the managed instance group" in vms["mig-1"].managed_advice
    assert vms["off"].state == "stopped"
    assert cloud.complete
    assert_within_role(gce)


def test_an_n1_vm_with_attached_gpus_is_priced_from_its_parts_to_the_cent(gce, monkeypatch):
    """GCE bills an N1 VM's machine type and each attached GPU apart: its price is their sum, on-demand and spot
    (gcp_parts.csv: n1-standard-8 in us-central1 $0.38 / spot $0.13954, a T4 $0.35 / spot $0.1654)."""
    gce.add("t4", "us-central1-a", "n1-standard-8", accelerators=[("nvidia-tesla-t4", 1)])
    gce.add("t4-spot", "us-central1-b", "n1-standard-8", accelerators=[("nvidia-tesla-t4", 1)], spot=True)
    gce.add("v100x4", "us-central1-a", "n1-highmem-16", accelerators=[("nvidia-tesla-v100", 4)])
    vms = by_name(cloud_of(gce, monkeypatch).list_gpu_instances())

    assert round(vms["t4"].hourly_cost, 2) == 0.73 and vms["t4"].hourly_cost == pytest.approx(0.38 + 0.35)
    assert vms["t4"].price_source.startswith("n1-standard-8 + T4, on-demand, priced in parts")
    spot = vms["t4-spot"]
    assert spot.hourly_cost == pytest.approx(0.13954 + 0.1654) and round(spot.hourly_cost, 2) == 0.30
    assert "spot" in spot.price_source and not is_estimate(spot.price_source)
    assert (vms["v100x4"].gpu_model, vms["v100x4"].gpu_count) == ("V100-16GB", 4)
    assert vms["v100x4"].hourly_cost == pytest.approx(0.94642 + 4 * 2.48)


def test_an_n1_vm_whose_parts_are_not_all_known_stays_unpriced_and_says_why(gce, monkeypatch):
    gce.add("k80", "us-central1-a", "n1-standard-8", accelerators=[("nvidia-tesla-k80", 1)])
    gce.add("custom", "us-central1-a", "n1-custom-8-30720", accelerators=[("nvidia-tesla-t4", 1)])
    gce.add("nowhere", "me-central2-a", "n1-standard-8", accelerators=[("nvidia-tesla-p100", 1)])
    gce.add("vws", "us-central1-a", "n1-standard-8", accelerators=[("nvidia-tesla-t4-vws", 1)])
    vms = by_name(cloud_of(gce, monkeypatch).list_gpu_instances())

    assert {n: v.hourly_cost for n, v in vms.items()} == dict.fromkeys(["k80", "custom", "nowhere", "vws"])  # not $0
    assert vms["vws"].price_source == ("unpriced: the virtual workstation licence of nvidia-tesla-t4-vws is not in the "
                                       "bundled prices")
    assert vms["k80"].price_source == ("unpriced: its attached GPU nvidia-tesla-k80 is not in places/gcp/machines.py's "
                                       "table")
    assert vms["custom"].price_source == "unpriced: no bundled price of machine type n1-custom-8-30720 in us-central1"
    assert vms["nowhere"].price_source == "unpriced: no bundled price of machine type n1-standard-8 in me-central2"


def test_an_unreachable_zone_makes_the_listing_partial_never_empty(gce, monkeypatch):
    gce.add("l4", "us-central1-a", "g2-standard-8")
    gce.unreachable.add("zones/us-east4-b")
    cloud = cloud_of(gce, monkeypatch)
    assert set(by_name(cloud.list_gpu_instances())) == {"l4"}
    assert [str(e) for e in cloud.last_errors] == ["GCE ml-prod/zones/us-east4-b: unreachable"]


def test_a_project_that_refuses_is_an_error_every_project_failing_raises(gce, monkeypatch):
    cloud = cloud_of(gce, monkeypatch)
    gce.projects = ("other-project",)  # ml-prod now answers 403, as GCE does without compute.instances.list
    with pytest.raises(InventoryError, match="403"):
        cloud.list_gpu_instances()


def test_a_throttled_read_waits_its_retry_after_and_goes_on(gce, monkeypatch):
    gce.add("l4", "us-central1-a", "g2-standard-8")
    gce.fault("instances.aggregatedList", Fault("429", retry_after="7"), Fault("500"))
    waited = []
    cloud = cloud_of(gce, monkeypatch)
    cloud._sleep = waited.append
    assert set(by_name(cloud.list_gpu_instances())) == {"l4"}
    assert waited[0] == 7.0 and len(gce.calls("instances.aggregatedList")) == 3 and cloud.last_retries == 2


def test_labels_are_written_with_the_fingerprint_and_read_back_as_tags(gce, monkeypatch):
    gce.add("l4", labels={"team": "ml"})
    cloud = cloud_of(gce, monkeypatch)
    vm = cloud.list_gpu_instances()[0]
    cloud.set_tags(vm, {TAG_MARKED: "2026-12-07T10:15:00Z"})
    assert gce.labels("l4") == {"team": "ml", "gpufinops_marked-for-stop": "20261207t101500z"}
    assert cloud.describe([vm.instance_id])[0].tags[TAG_MARKED] == "2026-12-07T10:15:00Z"
    cloud.remove_tags(vm, [TAG_MARKED])
    assert gce.labels("l4") == {"team": "ml"}
    writes = gce.calls("instances.setLabels")
    assert len(writes) == 2 and all(w.body["labelFingerprint"] for w in writes)
    assert_within_role(gce)


def test_a_person_changing_labels_between_our_read_and_write_wins(gce, monkeypatch):
    gce.add("l4", labels={"team": "ml"})
    cloud = cloud_of(gce, monkeypatch)
    vm = cloud.list_gpu_instances()[0]
    # Just before our setLabels lands, a person snoozes the VM: the fingerprint we send is stale.
    gce.on("instances.setLabels", lambda: gce.person_sets_labels("l4", **{"gpufinops_snooze-until": "20261209t0900z"}))
    with pytest.raises(GceError) as caught:
        cloud.set_tags(vm, {TAG_MARKED: "2026-12-07T10:15:00Z"})
    assert caught.value.definite and "412" in str(caught.value)
    assert gce.labels("l4") == {"team": "ml", "gpufinops_snooze-until": "20261209t0900z"}
    assert cloud.describe([vm.instance_id])[0].tags[TAG_SNOOZE] == "2026-12-09T09:00:00Z"


def test_stop_sends_one_request_and_polls_its_operation_to_done(gce, monkeypatch):
    gce.add("l4")
    gce.polls_to_done = 3
    cloud = cloud_of(gce, monkeypatch)
    vm = cloud.list_gpu_instances()[0]
    cloud.stop(vm)
    assert gce.status("l4") == "TERMINATED"
    stops = gce.calls("instances.stop")
    assert len(stops) == 1 and stops[0].query["discardLocalSsd"] == ["false"] and stops[0].query["requestId"]
    assert len(gce.calls("zoneOperations.get")) == 3
    assert cloud.describe([vm.instance_id])[0].state == "stopped"
    assert_within_role(gce)


def test_a_stop_not_done_in_time_is_unknown_and_reads_back_as_stopping(gce, monkeypatch):
    gce.add("l4")
    gce.polls_to_done = 10_000
    cloud = cloud_of(gce, monkeypatch, operation_timeout_s=0.05)
    vm = cloud.list_gpu_instances()[0]
    with pytest.raises(GceError) as caught:
        cloud.stop(vm)
    assert not caught.value.definite and "not DONE" in str(caught.value)
    assert cloud.describe([vm.instance_id])[0].state == "stopping"


@pytest.mark.parametrize("fault, definite", [("500-after", False), ("drop-after", False), ("500", False),
                                             ("429", True)])
def test_a_failed_stop_says_whether_gce_may_have_done_it_and_is_never_sent_twice(gce, monkeypatch, fault, definite):
    gce.add("l4")
    cloud = cloud_of(gce, monkeypatch)
    vm = cloud.list_gpu_instances()[0]
    gce.fault("instances.stop", Fault(fault))
    with pytest.raises(GceError) as caught:
        cloud.stop(vm)
    assert caught.value.definite is definite
    assert len(gce.calls("instances.stop")) == 1
    assert gce.status("l4") == ("STOPPING" if fault.endswith("-after") else "RUNNING")


def test_describe_says_gone_for_a_deleted_vm_and_raises_when_it_cannot_read(gce, monkeypatch):
    gce.add("l4")
    cloud = cloud_of(gce, monkeypatch, read_attempts=1)
    assert cloud.describe(["gce:ml-prod/us-central1-a/nope"]) == []
    gce.fault("instances.get", Fault("500"))
    with pytest.raises(InventoryError):
        cloud.describe(["gce:ml-prod/us-central1-a/l4"])


def test_the_vm_is_never_deleted(gce, monkeypatch):
    gce.add("l4")
    cloud = cloud_of(gce, monkeypatch)
    with pytest.raises(GceError, match="never deletes"):
        cloud.terminate(cloud.list_gpu_instances()[0])
    assert [r.method for r in gce.requests] == ["instances.aggregatedList"]


def test_the_start_time_is_the_last_start_so_a_restart_is_seen(gce, monkeypatch):
    gce.add("l4", started=datetime(2026, 12, 1, tzinfo=timezone.utc))
    cloud = cloud_of(gce, monkeypatch)
    before = cloud.list_gpu_instances()[0].launch_time
    gce.person_starts("l4", at=before + timedelta(days=6))
    assert cloud.describe([cloud.list_gpu_instances()[0].instance_id])[0].launch_time == before + timedelta(days=6)


# ---------------------------------------------------------------- instances.suspend (a rule with action suspend)
def test_suspend_sends_one_request_and_polls_it_to_suspended_which_reads_as_stopped(gce, monkeypatch):
    gce.suspend_refuses_gpus = False  # the state machine itself; GCE's refusal of GPU VMs is the next test
    gce.add("l4")
    gce.polls_to_done = 3
    cloud = cloud_of(gce, monkeypatch)
    vm = cloud.list_gpu_instances()[0]
    cloud.suspend(vm)
    assert gce.status("l4") == "SUSPENDED" and not gce.calls("instances.stop")
    sent = gce.calls("instances.suspend")
    assert len(sent) == 1 and sent[0].query["discardLocalSsd"] == ["false"] and sent[0].query["requestId"]
    assert len(gce.calls("zoneOperations.get")) == 3
    assert cloud.describe([vm.instance_id])[0].state == "stopped"  # no GPU billing: stopped for the record
    assert_within_role(gce)  # compute.instances.suspend is in the shipped role


def test_a_suspend_not_done_in_time_reads_back_as_stopping(gce, monkeypatch):
    gce.suspend_refuses_gpus = False
    gce.add("l4")
    gce.polls_to_done = 10_000
    cloud = cloud_of(gce, monkeypatch, operation_timeout_s=0.05)
    vm = cloud.list_gpu_instances()[0]
    with pytest.raises(GceError) as caught:
        cloud.suspend(vm)
    assert not caught.value.definite and gce.status("l4") == "SUSPENDING"
    assert cloud.describe([vm.instance_id])[0].state == "stopping"


@pytest.mark.parametrize("fault, definite", [("500-after", False), ("drop-after", False), ("429", True)])
def test_a_failed_suspend_says_whether_gce_may_have_done_it(gce, monkeypatch, fault, definite):
    gce.suspend_refuses_gpus = False
    gce.add("l4")
    cloud = cloud_of(gce, monkeypatch)
    vm = cloud.list_gpu_instances()[0]
    gce.fault("instances.suspend", Fault(fault))
    with pytest.raises(GceError) as caught:
        cloud.suspend(vm)
    assert caught.value.definite is definite and UNSUPPORTED_MARK not in str(caught.value)
    assert len(gce.calls("instances.suspend")) == 1
    assert gce.status("l4") == ("SUSPENDING" if fault.endswith("-after") else "RUNNING")


@pytest.mark.parametrize("machine_type, accelerators", [("g2-standard-8", None), ("a3-highgpu-8g", None),
                                                        ("n1-standard-8", [("nvidia-tesla-t4", 1)])])
def test_gce_refuses_to_suspend_a_vm_with_gpus_for_good_and_nothing_else_is_sent(gce, monkeypatch, machine_type,
                                                                                 accelerators):
    gce.add("gpu", machine_type=machine_type, accelerators=accelerators)
    cloud = cloud_of(gce, monkeypatch)
    vm = cloud.list_gpu_instances()[0]
    with pytest.raises(GceError) as caught:
        cloud.suspend(vm)
    assert caught.value.definite and UNSUPPORTED_MARK in str(caught.value)
    assert gce.status("gpu") == "RUNNING" and not gce.calls("instances.stop")


def test_suspending_a_vm_that_is_not_running_is_unsupported_for_good(gce, monkeypatch):
    gce.suspend_refuses_gpus = False
    gce.add("l4")
    cloud = cloud_of(gce, monkeypatch)
    vm = cloud.list_gpu_instances()[0]
    gce.vm("l4")["status"] = "STOPPING"  # a person stopped it after our read
    with pytest.raises(GceError) as caught:
        cloud.suspend(vm)
    assert caught.value.definite and UNSUPPORTED_MARK in str(caught.value)  # the operation's UNSUPPORTED_OPERATION


def test_a_listed_vm_carries_its_zone_as_the_tag_rules_select_it_by_and_its_fingerprint(gce, monkeypatch):
    gce.add("l4", "us-east4-b", labels={"team": "ml"})
    cloud = cloud_of(gce, monkeypatch)
    vm = cloud.list_gpu_instances()[0]
    assert vm.tags == {"team": "ml", TAG_GCE_ZONE: "us-east4-b"}
    assert vm.version == gce.vm("l4")["labelFingerprint"]


def test_the_fence_writes_only_on_the_fingerprint_of_the_read_it_was_given(gce, monkeypatch):
    gce.add("l4", labels={"team": "ml"})
    cloud = cloud_of(gce, monkeypatch)
    vm = cloud.list_gpu_instances()[0]
    gce.person_sets_labels("l4", gpufinops_protect="true")  # after our read
    with pytest.raises(GceError) as caught:
        cloud.set_tags_fenced(vm, {TAG_STOP_FENCE: "2026-12-07T10:00:00Z"})
    assert caught.value.definite and "labels changed since the read before the stop" in str(caught.value)
    assert not gce.calls("instances.setLabels")  # refused before anything was sent
    fresh = cloud.describe([vm.instance_id])[0]
    cloud.set_tags_fenced(fresh, {TAG_STOP_FENCE: "2026-12-07T10:00:00Z"})
    assert gce.labels("l4") == {"team": "ml", "gpufinops_protect": "true", "gpufinops_stopping": "20261207t100000z"}
    with pytest.raises(GceError, match="no labelFingerprint"):
        cloud.set_tags_fenced(replace(fresh, version=""), {TAG_STOP_FENCE: "2026-12-07T10:01:00Z"})
    assert_within_role(gce)
