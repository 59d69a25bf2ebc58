"""Writes the FOCUS fixtures of this folder (run from the repository root; see SOURCES.md).

aws_focus_1.0_subset.csv: rows of the real FOCUS 1.0 sample, unchanged. The Google Cloud and Azure files
have the column sets of those clouds' published FOCUS exports, with values adapted from the sample's
g5.4xlarge rows and GPU list prices of ../shared/data/gpu_prices (the instances, accounts and ids are made up).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
SAMPLE = HERE.parents[3] / "shared" / "data" / "billing" / "focus_1.0_sample_1000.csv"

# Google's FOCUS BigQuery view (GoogleCloudPlatform FOCUS guide, query of 2024-03-19): its SELECT list.
GCP_COLUMNS = ["AvailabilityZone", "BilledCost", "BillingAccountId", "BillingCurrency", "BillingPeriodStart",
               "BillingPeriodEnd", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargePeriodStart",
               "ChargePeriodEnd", "CommitmentDiscountCategory", "CommitmentDiscountId", "CommitmentDiscountName",
               "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost",
               "ListCost", "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit", "ProviderName",
               "PublisherName", "RegionId", "RegionName", "ResourceId", "ResourceName", "ResourceType",
               "ServiceCategory", "ServiceName", "SkuId", "SkuPriceId", "SubAccountId", "Tags", "x_Credits",
               "x_CostType", "x_CurrencyConversionRate", "x_ExportTime", "x_Location", "x_Project", "x_ServiceId"]

# Microsoft Cost Management's FOCUS 1.2-preview export (MicrosoftDocs/azure-docs,
# articles/cost-management-billing/dataset-schema/cost-usage-details-focus.md), in its column order.
AZURE_COLUMNS = ("BilledCost BillingAccountId BillingAccountName BillingAccountType BillingCurrency BillingPeriodEnd "
                 "BillingPeriodStart CapacityReservationId CapacityReservationStatus ChargeCategory ChargeClass "
                 "ChargeDescription ChargeFrequency ChargePeriodEnd ChargePeriodStart CommitmentDiscountCategory "
                 "CommitmentDiscountId CommitmentDiscountName CommitmentDiscountQuantity CommitmentDiscountStatus "
                 "CommitmentDiscountType CommitmentDiscountUnit ConsumedQuantity ConsumedUnit ContractedCost "
                 "ContractedUnitPrice EffectiveCost InvoiceId InvoiceIssuerName ListCost ListUnitPrice "
                 "PricingCategory PricingCurrency PricingQuantity PricingUnit ProviderName PublisherName RegionId "
                 "RegionName ResourceId ResourceName ResourceType ServiceCategory ServiceName ServiceSubcategory "
                 "SkuId SkuMeter SkuPriceDetails SkuPriceId SubAccountId SubAccountName SubAccountType Tags "
                 "x_AccountId x_AccountName x_AccountOwnerId x_AmortizationClass x_BilledCostInUsd "
                 "x_BilledUnitPrice x_BillingAccountId x_BillingAccountName x_BillingExchangeRate "
                 "x_BillingExchangeRateDate x_BillingProfileId x_BillingProfileName x_ContractedCostInUsd "
                 "x_CostAllocationRuleName x_CostCenter x_CustomerId x_CustomerName x_EffectiveCostInUsd "
                 "x_EffectiveUnitPrice x_InvoiceSectionId x_InvoiceSectionName x_ListCostInUsd "
                 "x_PartnerCreditApplied x_PartnerCreditRate x_PricingBlockSize x_PricingCurrency "
                 "x_PricingSubcategory x_PricingUnitDescription x_PublisherCategory x_PublisherId x_ResellerId "
                 "x_ResellerName x_ResourceGroupName x_ResourceType x_ServiceModel x_ServicePeriodEnd "
                 "x_ServicePeriodStart x_SkuDescription x_SkuDetails x_SkuIsCreditEligible x_SkuMeterCategory "
                 "x_SkuMeterId x_SkuMeterName x_SkuMeterSubcategory x_SkuOfferId x_SkuOrderId x_SkuOrderName "
                 "x_SkuPlanName x_SkuPartNumber x_SkuRegion x_SkuServiceFamily x_SkuTier").split()

GCP_VM = "//compute.googleapis.com/projects/sunbird-ml/zones/us-central1-a/instances/4120387516662251"
GCP_OTHER = "//compute.googleapis.com/projects/sunbird-ml/zones/us-central1-a/instances/7734021185519930"


def aws_subset() -> pd.DataFrame:
    d = pd.read_csv(SAMPLE, dtype=str, keep_default_na=False)
    gpu = d[d["ChargeDescription"].str.contains("g5.4xlarge")]
    return pd.concat([gpu, d[~d.index.isin(gpu.index)].head(40)]).sort_index()


def _gcp_row(hour: int, sku: str, desc: str, qty: float, unit: str, cost: float, resource: str, machine: str,
             taxonomy: str) -> dict:
    tags = [{"key": "team", "value": "vision", "x_type": "label", "x_inherited": False, "x_namespace": "n/a"},
            {"key": "compute.googleapis.com/machine_spec", "value": machine, "x_type": "system_label",
             "x_inherited": False, "x_namespace": "n/a"}]
    return {"AvailabilityZone": "us-central1-a", "BilledCost": f"{cost:.6f}", "BillingAccountId": "01A2B3-C4D5E6-F7G8H9",
            "BillingCurrency": "USD", "BillingPeriodStart": "2024-09-01 07:00:00 UTC",
            "BillingPeriodEnd": "2024-09-30 07:00:00 UTC", "ChargeCategory": "usage", "ChargeClass": "",
            "ChargeDescription": desc, "ChargePeriodStart": f"2024-09-21 {hour:02d}:00:00 UTC",
            "ChargePeriodEnd": f"2024-09-21 {hour + 1:02d}:00:00 UTC", "CommitmentDiscountCategory": "",
            "CommitmentDiscountId": "", "CommitmentDiscountName": "", "ConsumedQuantity": f"{qty:g}",
            "ConsumedUnit": unit, "ContractedCost": f"{cost:.6f}", "ContractedUnitPrice": "", "EffectiveCost": f"{cost:.6f}",
            "ListCost": f"{cost:.6f}", "ListUnitPrice": "", "PricingCategory": "standard", "PricingQuantity": f"{qty / 3600:g}",
            "PricingUnit": "hour", "ProviderName": "Google Cloud", "PublisherName": "Google Cloud",
            "RegionId": "us-central1", "RegionName": "Iowa", "ResourceId": resource, "ResourceName": resource.rsplit("/", 1)[1],
            "ResourceType": "compute.googleapis.com/Instance", "ServiceCategory": taxonomy,
            "ServiceName": "Compute Engine", "SkuId": sku,
            "SkuPriceId": f"Billing Account ID:01A2B3-C4D5E6-F7G8H9, SKU ID: {sku}, Price Tier Start Amount: 0",
            "SubAccountId": "01A2B3-C4D5E6-F7G8H9", "Tags": json.dumps(tags), "x_Credits": "[]", "x_CostType": "regular",
            "x_CurrencyConversionRate": "1", "x_ExportTime": "2024-09-22 03:14:00 UTC", "x_Location": "us-central1-a",
            "x_Project": json.dumps({"id": "sunbird-ml", "number": "482910375561", "name": "sunbird-ml"}),
            "x_ServiceId": "6F81-5844-456A"}


def gcp_rows() -> pd.DataFrame:
    """An a2-highgpu-1g for two hours (GPU, 12 vCPU and RAM rows per hour, as Google bills it) and an n2 VM."""
    rows = []
    for hour in (1, 2):
        rows += [
            _gcp_row(hour, "039F-D0DA-4055", "Nvidia Tesla A100 GPU running in Americas", 3600, "seconds", 2.93391,
                     GCP_VM, "a2-highgpu-1g", "GCP > Compute > GPUs > GPUs On Demand"),
            _gcp_row(hour, "2E27-4F75-95CD", "A2 Instance Core running in Americas", 12 * 3600, "seconds", 0.379188,
                     GCP_VM, "a2-highgpu-1g", "GCP > Compute > GCE > VMs On Demand > Cores: Per Core"),
            _gcp_row(hour, "2C93-1E1B-0DA5", "A2 Instance Ram running in Americas", 85 * 2**30 * 3600, "byte-seconds",
                     0.360292, GCP_VM, "a2-highgpu-1g", "GCP > Compute > GCE > VMs On Demand > Memory: Per GB"),
            _gcp_row(hour, "CF4E-A0C7-E3BF", "N2 Instance Core running in Americas", 4 * 3600, "seconds", 0.126,
                     GCP_OTHER, "n2-standard-4", "GCP > Compute > GCE > VMs On Demand > Cores: Per Core"),
        ]
    return pd.DataFrame(rows, columns=GCP_COLUMNS)


GCP_N1 = "//compute.googleapis.com/projects/sunbird-ml/zones/us-central1-b/instances/5518204937716620"
GCP_A2 = "//compute.googleapis.com/projects/sunbird-ml/zones/us-central1-b/instances/6602918374410297"
GCP_N2 = "//compute.googleapis.com/projects/sunbird-ml/zones/us-central1-b/instances/3391047725108846"


def gcp_n1_rows() -> pd.DataFrame:
    """An n1-standard-8 with one T4 attached for two hours (its machine type names no GPU: the GPU is billed on its own
    SKU row, written after the VM's vCPU and RAM rows), an a2-highgpu-1g for one hour and a CPU-only n2 VM that runs
    through both hours; each VM named in ResourceName, as Google's view writes resource.name."""
    rows = []
    for hour in (1, 2):
        rows += [
            _gcp_row(hour, "2E27-4F75-95CD", "N1 Predefined Instance Core running in Americas", 8 * 3600, "seconds",
                     0.252888, GCP_N1, "n1-standard-8", "GCP > Compute > GCE > VMs On Demand > Cores: Per Core"),
            _gcp_row(hour, "6C71-A3F8-A7C1", "N1 Predefined Instance Ram running in Americas", 30 * 2**30 * 3600,
                     "byte-seconds", 0.12711, GCP_N1, "n1-standard-8",
                     "GCP > Compute > GCE > VMs On Demand > Memory: Per GB"),
            _gcp_row(hour, "CF4E-A0C7-E3BF", "N2 Instance Core running in Americas", 4 * 3600, "seconds", 0.126,
                     GCP_N2, "n2-standard-4", "GCP > Compute > GCE > VMs On Demand > Cores: Per Core"),
        ]
    rows += [
        _gcp_row(1, "039F-D0DA-4055", "Nvidia Tesla A100 GPU running in Americas", 3600, "seconds", 2.93391,
                 GCP_A2, "a2-highgpu-1g", "GCP > Compute > GPUs > GPUs On Demand"),
        _gcp_row(1, "2E27-4F75-95CD", "A2 Instance Core running in Americas", 12 * 3600, "seconds", 0.379188,
                 GCP_A2, "a2-highgpu-1g", "GCP > Compute > GCE > VMs On Demand > Cores: Per Core"),
    ]
    rows += [_gcp_row(hour, "D8D5-3C5D-2B8A", "Nvidia Tesla T4 GPU running in Americas", 3600, "seconds", 0.35, GCP_N1,
                      "n1-standard-8", "GCP > Compute > GPUs > GPUs On Demand") for hour in (1, 2)]
    names = {GCP_N1: "asr-t4-1", GCP_A2: "train-a2", GCP_N2: "web-n2"}
    teams = {GCP_N1: "speech", GCP_A2: "vision", GCP_N2: "web"}
    for row in rows:
        row["ResourceName"] = names[row["ResourceId"]]
        row["AvailabilityZone"] = row["x_Location"] = "us-central1-b"
        row["Tags"] = row["Tags"].replace('"value": "vision"', f'"value": "{teams[row["ResourceId"]]}"')
    return pd.DataFrame(rows, columns=GCP_COLUMNS)


def azure_rows() -> pd.DataFrame:
    """A Standard_NC24ads_A100_v4 VM for three hours and a D-series VM, FOCUS 1.2 as Cost Management writes it."""
    sub = "/subscriptions/5a2b6c1d-0000-4e3f-9a8b-1c2d3e4f5a6b"
    rows = []
    for hour, (vm, size, meter, price) in enumerate([("gpu-train-01", "Standard_NC24ads_A100_v4", "NC24ads A100 v4", 3.673)] * 3
                                                    + [("web-01", "Standard_D4s_v5", "D4s v5", 0.192)]):
        rid = f"{sub}/resourceGroups/ml-rg/providers/Microsoft.Compute/virtualMachines/{vm}"
        row = {c: "" for c in AZURE_COLUMNS}
        row.update({
            "BilledCost": f"{price:.6f}", "BillingAccountId": "/providers/Microsoft.Billing/billingAccounts/8611537",
            "BillingAccountName": "SunBird", "BillingAccountType": "Billing Profile", "BillingCurrency": "USD",
            "BillingPeriodEnd": "2024-10-01T00:00:00Z", "BillingPeriodStart": "2024-09-01T00:00:00Z",
            "ChargeCategory": "Usage", "ChargeDescription": f"{meter} - Virtual Machines {meter.split()[0]} Series",
            "ChargeFrequency": "Usage-Based", "ChargePeriodStart": f"2024-09-21T{hour % 3 + 5:02d}:00:00Z",
            "ChargePeriodEnd": f"2024-09-21T{hour % 3 + 6:02d}:00:00Z", "ConsumedQuantity": "1", "ConsumedUnit": "Hours",
            "ContractedCost": f"{price:.6f}", "ContractedUnitPrice": f"{price}", "EffectiveCost": f"{price:.6f}",
            "InvoiceIssuerName": "Microsoft", "ListCost": f"{price:.6f}", "ListUnitPrice": f"{price}",
            "PricingCategory": "Standard", "PricingCurrency": "USD", "PricingQuantity": "1", "PricingUnit": "1 Hour",
            "ProviderName": "Microsoft", "PublisherName": "Microsoft", "RegionId": "eastus", "RegionName": "East US",
            "ResourceId": rid, "ResourceName": vm, "ResourceType": "Virtual machine", "ServiceCategory": "Compute",
            "ServiceName": "Virtual Machines", "ServiceSubcategory": "Virtual Machines", "SkuMeter": meter,
            "SubAccountId": sub, "SubAccountName": "ml-research", "SubAccountType": "Subscription",
            "Tags": json.dumps({"team": "vision", "project": "detector"}), "x_ResourceGroupName": "ml-rg",
            "x_SkuDetails": json.dumps({"ServiceType": size, "VCPUs": 24 if "NC" in size else 4}),
            "x_SkuMeterCategory": "Virtual Machines", "x_SkuMeterName": meter,
        })
        rows.append(row)
    return pd.DataFrame(rows, columns=AZURE_COLUMNS)


if __name__ == "__main__":
    aws_subset().to_csv(HERE / "aws_focus_1.0_subset.csv", index=False)
    gcp_rows().to_csv(HERE / "gcp_focus_view_gpu.csv", index=False)
    gcp_n1_rows().to_csv(HERE / "gcp_focus_view_n1_t4.csv", index=False)
    azure_rows().to_csv(HERE / "azure_focus_1.2_gpu.csv", index=False)
