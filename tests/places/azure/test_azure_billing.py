"""Azure Cost Management FOCUS exports (`FocusCost`: FOCUS 1.0 and 1.2-preview, CSV, CSV.gz or Parquet with snappy
or gzip) through the billing path (collect/billing: the cost table and the DuckDB totals): every GPU VM's cost to
the cent per VM, team and subscription, and each VM named by the very id the Azure place lists it by, so that its
billed rate meets its verdicts.

The rows are made from the Azure 1.2-preview fixture (tests/data/focus/azure_focus_1.2_gpu.csv: Microsoft's column
set, in order): hourly rows of three VMs in two subscriptions, their ResourceIds in lower case as Cost Management
writes them; the 1.0 files carry the 1.0 column set (without what FOCUS 1.1 and 1.2 added)."""

from __future__ import annotations

import csv
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pandas as pd
import pytest

from gpufinops.collect.billing import focus_spec
from gpufinops.collect.billing.duck import focus_total_rows
from gpufinops.collect.billing.focus import read_focus
from gpufinops.collect.billing.focus_rules import FILE_SUFFIXES
from gpufinops.collect.billing.settings import BillingSettings
from gpufinops.collect.billing.sources import list_files
from gpufinops.collect.billing.totals import table_totals
from gpufinops.config import AwsSettings
from gpufinops.model import azure_vm_id
from tests.armstub import Vm
from tests.places.azure.world import ROOT, SUB, SUB2, azure_cloud

FIXTURE = ROOT / "tests" / "data" / "focus" / "azure_focus_1.2_gpu.csv"
SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)
BS = BillingSettings(gpu_families=AwsSettings().gpu_families)
START = datetime(2024, 9, 21, 5, tzinfo=timezone.utc)

# (subscription, group, name, size, $/h, hours, tags, pricing category)
VMS = [(SUB, "ML", "Idle-A100", "Standard_NC24ads_A100_v4", "3.673", 20, '{"team": "nlp", "owner": "ana"}',
        "Standard"),
       (SUB, "ml", "busy-h100", "Standard_ND96isr_H100_v5", "98.32", 7, '{"team": "llm"}', "Standard"),
       (SUB2, "cv", "spot-t4", "Standard_NC8as_T4_v3", "0.292002", 13, '{"team": "cv"}', "Dynamic"),
       (SUB, "web", "frontend", "Standard_D4s_v5", "0.192", 20, '{"team": "web"}', "Standard")]


def arm_id(sub: str, group: str, name: str) -> str:
    return f"/subscriptions/{sub}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/{name}"


def rows() -> list[dict[str, str]]:
    with FIXTURE.open(newline="") as f:
        template = next(csv.DictReader(f))
    out = []
    for sub, group, name, size, price, hours, tags, category in VMS:
        for h in range(hours):
            at = START + timedelta(hours=h)
            meter = size.removeprefix("Standard_").replace("_", " ")
            out.append({**template, "BilledCost": price, "EffectiveCost": price, "ListCost": price,
                        "ContractedCost": price, "ListUnitPrice": price, "ContractedUnitPrice": price,
                        "ChargePeriodStart": f"{at:%Y-%m-%dT%H:%M:%SZ}",
                        "ChargePeriodEnd": f"{at + timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}",
                        "ResourceId": arm_id(sub, group, name).lower(), "ResourceName": name.lower(),
                        "SubAccountId": f"/subscriptions/{sub}", "x_ResourceGroupName": group.lower(),
                        "ChargeDescription": f"{meter} - Virtual Machines", "SkuMeter": meter, "x_SkuMeterName": meter,
                        "x_SkuDetails": f'{{"ServiceType": "{size}", "VCPUs": 8}}', "Tags": tags,
                        "PricingCategory": category})
    return out


def expected(by: str) -> dict[str, Decimal]:
    """Each GPU VM's cost to the cent, summed in decimal from the rows (the D4s v5 is no GPU VM)."""
    out: dict[str, Decimal] = {}
    for sub, group, name, size, price, hours, tags, _ in VMS:
        if not size.startswith("Standard_N"):
            continue
        key = {"instance": azure_vm_id(arm_id(sub, group, name)), "account": f"/subscriptions/{sub}",
               "team": tags.split('"team": "')[1].split('"')[0]}[by]
        out[key] = out.get(key, Decimal(0)) + Decimal(price) * hours
    return {k: v.quantize(Decimal("0.01")) for k, v in out.items()}


def write(tmp_path, version: str, fmt: str):
    df = pd.DataFrame(rows())
    if version == "1.0":  # the 1.0 export has none of what FOCUS 1.1 and 1.2 added
        df = df.drop(columns=[c for c in (*focus_spec.ADDED_1_1, *focus_spec.ADDED_1_2) if c in df.columns])
    path = tmp_path / f"part_0_0001.{fmt}"
    if fmt == "csv.gz":
        df.to_csv(path, index=False, compression="gzip")
    elif fmt == "csv":
        df.to_csv(path, index=False)
    else:
        codec = fmt.split(".")[0]
        path = tmp_path / f"part_0_0001.{codec}.parquet"
        for c in ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost", "ConsumedQuantity", "PricingQuantity",
                  "ListUnitPrice", "ContractedUnitPrice"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
        df.to_parquet(path, index=False, compression=codec)
    return path


@pytest.mark.parametrize("version,fmt", [("1.0", "csv.gz"), ("1.0", "snappy.parquet"), ("1.2", "csv"),
                                         ("1.2", "gzip.parquet"), ("1.2", "snappy.parquet")])
def test_focuscost_exports_total_each_gpu_vm_team_and_subscription_to_the_cent(tmp_path, version, fmt):
    path = write(tmp_path, version, fmt)
    result = read_focus(str(path), SEP, OCT, BS)
    assert result.versions == {str(path): version}
    table = result.table
    assert set(table["provider"]) == {"azure"} and "Standard_D4s_v5" not in set(table["instance_type"])
    assert set(table[table["pricing_model"] == "spot"]["resource_id"]) == {azure_vm_id(arm_id(SUB2, "cv", "spot-t4"))}
    for by in ("instance", "team", "account"):
        got = {k: Decimal(str(c)).quantize(Decimal("0.01"))
               for k, c in zip(table_totals(table, by)["key"], table_totals(table, by)["cost"])}
        assert got == expected(by), by
        duck = focus_total_rows(list_files(str(path), None, FILE_SUFFIXES, "FOCUS"), str(path), SEP, OCT, BS, by)
        assert {k: Decimal(str(c)).quantize(Decimal("0.01")) for k, _cur, c, _h in duck.rows} == expected(by), by
    hours = dict(zip(table_totals(table, "instance")["key"], table_totals(table, "instance")["usage_hours"]))
    assert hours[azure_vm_id(arm_id(SUB, "ML", "Idle-A100"))] == pytest.approx(20.0)


def test_the_bill_names_a_vm_by_the_id_the_place_lists_it_by(arm, tmp_path):
    # ARM answers with the case the VM was created with; the export writes its id in lower case: one subject.
    arm.add(Vm(SUB, "ML", "Idle-A100", "Standard_NC24ads_A100_v4"))
    [listed] = azure_cloud(arm).list_gpu_instances()
    table = read_focus(str(write(tmp_path, "1.2", "csv")), SEP, OCT, BS).table
    assert listed.instance_id in set(table["resource_id"])
    assert listed.instance_id == f"azure:{SUB}/ml/idle-a100"
    # Calls made with the lower-case id reach the same VM (ARM's names are case-insensitive).
    [again] = azure_cloud(arm).describe([listed.instance_id])
    assert again.state == "running"


def test_an_azure_vms_idle_hours_are_priced_at_its_billed_rate(tmp_path):
    from gpufinops.cost.costs import billing_rates, hourly_rate

    table = read_focus(str(write(tmp_path, "1.0", "csv.gz")), SEP, OCT, BS).table
    listed_as = f"azure:{SUB}/ml/idle-a100"  # the id AzureCloud lists the VM by
    rate = hourly_rate(listed_as, "Standard_NC24ads_A100_v4", "eastus", billing_rates(table), None, stored=9.99)
    assert (rate.source, rate.rate) == ("billing", pytest.approx(3.673))


def test_a_uniform_scale_set_instances_row_is_billed_to_the_id_the_place_lists_it_by(arm, tmp_path):
    # Cost Management names a Uniform scale set's instance by its ARM id, `.../virtualMachineScaleSets/<set>/
    # virtualMachines/<instance id>` (in lower case); the place lists it as `azure:<sub>/<group>/<set>/<instance id>`.
    from gpufinops.cost.costs import billing_rates, hourly_rate
    from tests.armstub import ScaleSet

    arm.add_scale_set(ScaleSet(SUB, "MC_ml_aks1_eastus", "aks-gpupool-12345678-vmss", "Standard_NC24ads_A100_v4",
                               powers=["running", "running"], tags={"aks-managed-poolName": "gpupool"}))
    listed = sorted(i.instance_id for i in azure_cloud(arm).list_gpu_instances())
    set_id = f"/subscriptions/{SUB}/resourceGroups/MC_ml_aks1_eastus/providers/Microsoft.Compute/" \
             "virtualMachineScaleSets/aks-gpupool-12345678-vmss"
    extra = []
    for instance, hours in (("0", 6), ("1", 3)):
        for h in range(hours):
            at = START + timedelta(hours=h)
            extra.append({**rows()[0], "ResourceId": f"{set_id}/virtualMachines/{instance}".lower(),
                          "ResourceName": f"aks-gpupool-12345678-vmss_{instance}", "Tags": '{"team": "nlp"}',
                          "ChargePeriodStart": f"{at:%Y-%m-%dT%H:%M:%SZ}",
                          "ChargePeriodEnd": f"{at + timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}"})
    path = tmp_path / "part_0_0001.csv"
    pd.DataFrame(rows() + extra).to_csv(path, index=False)
    table = read_focus(str(path), SEP, OCT, BS).table
    by_instance = {k: Decimal(str(c)).quantize(Decimal("0.01"))
                   for k, c in zip(table_totals(table, "instance")["key"], table_totals(table, "instance")["cost"])}
    assert listed == [f"azure:{SUB}/mc_ml_aks1_eastus/aks-gpupool-12345678-vmss/0",
                      f"azure:{SUB}/mc_ml_aks1_eastus/aks-gpupool-12345678-vmss/1"]
    assert [by_instance[i] for i in listed] == [Decimal("22.04"), Decimal("11.02")]  # 6 h and 3 h at $3.673
    duck = focus_total_rows(list_files(str(path), None, FILE_SUFFIXES, "FOCUS"), str(path), SEP, OCT, BS, "instance")
    assert {k: Decimal(str(c)).quantize(Decimal("0.01")) for k, _cur, c, _h in duck.rows if k in listed} == \
        dict(zip(listed, [Decimal("22.04"), Decimal("11.02")]))
    rate = hourly_rate(listed[0], "Standard_NC24ads_A100_v4", "eastus", billing_rates(table), None, stored=9.99)
    assert (rate.source, rate.rate) == ("billing", pytest.approx(3.673))
