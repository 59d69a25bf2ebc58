"""FOCUS 1.0: the real public sample's g5.4xlarge rows come out as GPU cost; bad input is named."""

from __future__ import annotations

import csv
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from gpufinops.collect.billing.focus import read_focus
from gpufinops.collect.billing.schema import BillingDataError
from gpufinops.collect.billing.settings import BillingSettings
from gpufinops.config import AwsSettings

SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "billing" / "focus_1.0_sample_1000.csv"
SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)
BS = BillingSettings(gpu_families=AwsSettings().gpu_families)


@pytest.mark.skipif(not SAMPLE.exists(), reason="../shared FOCUS sample not beside the checkout")
def test_real_sample_g5_rows_are_gpu_cost():
    res = read_focus(str(SAMPLE), SEP, OCT, BS)
    # Independent count straight from the CSV: every g5.4xlarge instance-hour charge.
    with SAMPLE.open(newline="") as fh:
        g5 = [r for r in csv.DictReader(fh) if "g5.4xlarge" in r["ChargeDescription"]]
    assert len(g5) == 8
    t = res.table
    assert len(t) == 8 and set(t["instance_type"]) == {"g5.4xlarge"}
    assert set(t["resource_id"]) == {r["ResourceId"] for r in g5}
    assert t["cost"].sum() == pytest.approx(sum(float(r["BilledCost"]) for r in g5))
    assert t["usage_hours"].sum() == pytest.approx(sum(float(r["ConsumedQuantity"]) for r in g5))
    assert set(t["provider"]) == {"aws"} and set(t["pricing_model"]) == {"on-demand"}
    assert set(t["account"]) == {"11353890204"} and set(t["region"]) == {"us-east-1"}
    # The sample's EC2 data-transfer rows on the same instances are not instance cost.
    assert t["cost"].max() == pytest.approx(1.624)
    assert res.warnings == []


def _write(tmp_path, rows: list[dict]) -> str:
    p = tmp_path / "focus.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    return str(p)


def _row(**kw) -> dict:
    base = {"ChargePeriodStart": "2024-09-02 00:00:00", "BilledCost": "3.0", "BillingCurrency": "USD",
            "ChargeCategory": "Usage", "ResourceId": "/subscriptions/x/vm1", "ConsumedQuantity": "1",
            "ConsumedUnit": "Hours", "ProviderName": "Microsoft", "ServiceCategory": "Compute",
            "ChargeDescription": "Standard_NC24ads_A100_v4 Virtual Machines", "SubAccountId": "sub-1",
            "RegionId": "eastus", "Tags": '{"team": "ml"}', "PricingCategory": "Standard"}
    base.update(kw)
    return base


def test_azure_gpu_vm_and_spot_and_commitment(tmp_path):
    path = _write(tmp_path, [
        _row(),
        _row(ResourceId="vm2", PricingCategory="Dynamic", BilledCost="1.0", Tags=""),
        _row(ResourceId="vm3", PricingCategory="Committed", CommitmentDiscountType="Reservation"),
        _row(ResourceId="vm4", ChargeDescription="Standard_D4s_v5 Virtual Machines"),  # not GPU
    ])
    t = read_focus(path, SEP, OCT, BS).table
    got = {r.resource_id: (r.provider, r.instance_type, r.pricing_model, r.team) for r in t.itertuples()}
    assert got == {"/subscriptions/x/vm1": ("azure", "Standard_NC24ads_A100_v4", "on-demand", "ml"),
                   "vm2": ("azure", "Standard_NC24ads_A100_v4", "spot", ""),
                   "vm3": ("azure", "Standard_NC24ads_A100_v4", "reserved", "ml")}


def test_missing_column_is_named(tmp_path):
    path = _write(tmp_path, [{k: v for k, v in _row().items() if k != "BilledCost"}])
    with pytest.raises(BillingDataError, match=r"focus\.csv: missing FOCUS 1.0 column\(s\) \['BilledCost'\]"):
        read_focus(path, SEP, OCT, BS)


def test_non_numeric_cost_names_column_and_line(tmp_path):
    path = _write(tmp_path, [_row(), _row(BilledCost="three dollars")])
    with pytest.raises(BillingDataError, match=r"focus\.csv: column 'BilledCost' is not a number on data row 3"):
        read_focus(path, SEP, OCT, BS)


def test_negative_cost_is_excluded_with_a_count(tmp_path):
    path = _write(tmp_path, [_row(), _row(ResourceId="vm9", BilledCost="-5")])
    res = read_focus(path, SEP, OCT, BS)
    assert list(res.table["resource_id"]) == ["/subscriptions/x/vm1"]
    assert "1 GPU row(s) excluded: column 'BilledCost'" in res.warnings[0] and "focus.csv" in res.warnings[0]


def test_mixed_currency_is_an_error(tmp_path):
    path = _write(tmp_path, [_row(), _row(ResourceId="vm2", BillingCurrency="EUR")])
    with pytest.raises(BillingDataError, match=r"column 'BillingCurrency' mixes currencies"):
        read_focus(path, SEP, OCT, BS)
