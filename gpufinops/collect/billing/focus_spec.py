"""FOCUS column metadata by version: which columns a dataset of each version has, their type and whether they
may be null. Used to tell a file's version apart (the reader accepts each version's names) and to check what
`costs --idle --output focus` writes.

Sources: FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec, tag v1.2, specification/columns/*.md ("Column ID",
"Data type", "Feature level", "Allows nulls" of each); the v1.0 and v1.1 tags for what each added. The 1.3
and 1.4 tags were not in the snapshot read: their changes below are the 1.3/1.4 release notes' as two
public FOCUS 1.4 column models restate them (65 columns in each version): 1.3 adds ServiceProviderName
(Mandatory, not null), HostProviderName (Mandatory, nullable), the Allocated* split-cost columns and
ContractApplied, and deprecates ProviderName and PublisherName (still Mandatory in 1.3); 1.4 removes those
two, adds CommitmentProgramEligibilityDetails and InvoiceDetailId, makes InvoiceId Conditional and
PricingCurrency / PricingCurrencyEffectiveCost not nullable.
"""

from __future__ import annotations

from typing import Iterable

# (column, data type, feature level, allows nulls) — FOCUS 1.2.
COLUMNS_1_2: tuple[tuple[str, str, str, bool], ...] = (
    ("AvailabilityZone", "String", "Recommended", True),
    ("BilledCost", "Decimal", "Mandatory", False),
    ("BillingAccountId", "String", "Mandatory", False),
    ("BillingAccountName", "String", "Mandatory", True),
    ("BillingAccountType", "String", "Conditional", False),
    ("BillingCurrency", "String", "Mandatory", False),
    ("BillingPeriodEnd", "Date/Time", "Mandatory", False),
    ("BillingPeriodStart", "Date/Time", "Mandatory", False),
    ("CapacityReservationId", "String", "Conditional", True),
    ("CapacityReservationStatus", "String", "Conditional", True),
    ("ChargeCategory", "String", "Mandatory", False),
    ("ChargeClass", "String", "Mandatory", True),
    ("ChargeDescription", "String", "Mandatory", True),
    ("ChargeFrequency", "String", "Recommended", False),
    ("ChargePeriodEnd", "Date/Time", "Mandatory", False),
    ("ChargePeriodStart", "Date/Time", "Mandatory", False),
    ("CommitmentDiscountCategory", "String", "Conditional", True),
    ("CommitmentDiscountId", "String", "Conditional", True),
    ("CommitmentDiscountName", "String", "Conditional", True),
    ("CommitmentDiscountQuantity", "Decimal", "Conditional", True),
    ("CommitmentDiscountStatus", "String", "Conditional", True),
    ("CommitmentDiscountType", "String", "Conditional", True),
    ("CommitmentDiscountUnit", "String", "Conditional", True),
    ("ConsumedQuantity", "Decimal", "Conditional", True),
    ("ConsumedUnit", "String", "Conditional", True),
    ("ContractedCost", "Decimal", "Mandatory", False),
    ("ContractedUnitPrice", "Decimal", "Conditional", True),
    ("EffectiveCost", "Decimal", "Mandatory", False),
    ("InvoiceId", "String", "Recommended", True),
    ("InvoiceIssuerName", "String", "Mandatory", False),
    ("ListCost", "Decimal", "Mandatory", False),
    ("ListUnitPrice", "Decimal", "Conditional", True),
    ("PricingCategory", "String", "Conditional", True),
    ("PricingCurrency", "String", "Conditional", True),
    ("PricingCurrencyContractedUnitPrice", "Decimal", "Conditional", True),
    ("PricingCurrencyEffectiveCost", "Decimal", "Conditional", True),
    ("PricingCurrencyListUnitPrice", "Decimal", "Conditional", True),
    ("PricingQuantity", "Decimal", "Mandatory", True),
    ("PricingUnit", "String", "Mandatory", True),
    ("ProviderName", "String", "Mandatory", False),
    ("PublisherName", "String", "Mandatory", False),
    ("RegionId", "String", "Conditional", True),
    ("RegionName", "String", "Conditional", True),
    ("ResourceId", "String", "Conditional", True),
    ("ResourceName", "String", "Conditional", True),
    ("ResourceType", "String", "Conditional", True),
    ("ServiceCategory", "String", "Mandatory", False),
    ("ServiceName", "String", "Mandatory", False),
    ("ServiceSubcategory", "String", "Recommended", False),
    ("SkuId", "String", "Conditional", True),
    ("SkuMeter", "String", "Conditional", True),
    ("SkuPriceDetails", "JSON", "Conditional", True),
    ("SkuPriceId", "String", "Conditional", True),
    ("SubAccountId", "String", "Conditional", True),
    ("SubAccountName", "String", "Conditional", True),
    ("SubAccountType", "String", "Conditional", True),
    ("Tags", "JSON", "Conditional", True),
)
ADDED_1_1 = ("CapacityReservationId", "CapacityReservationStatus", "CommitmentDiscountQuantity",
             "CommitmentDiscountUnit", "ServiceSubcategory", "SkuMeter", "SkuPriceDetails")
ADDED_1_2 = ("BillingAccountType", "InvoiceId", "PricingCurrency", "PricingCurrencyContractedUnitPrice",
             "PricingCurrencyEffectiveCost", "PricingCurrencyListUnitPrice", "SubAccountType")
ADDED_1_3: tuple[tuple[str, str, str, bool], ...] = (
    ("ServiceProviderName", "String", "Mandatory", False),
    ("HostProviderName", "String", "Mandatory", True),
    ("AllocatedMethodId", "String", "Conditional", True),
    ("AllocatedMethodDetails", "JSON", "Recommended", True),
    ("AllocatedResourceId", "String", "Conditional", True),
    ("AllocatedResourceName", "String", "Conditional", True),
    ("AllocatedTags", "JSON", "Conditional", True),
    ("ContractApplied", "JSON", "Conditional", True),
)
DEPRECATED_1_3 = ("ProviderName", "PublisherName")  # removed in 1.4
ADDED_1_4: tuple[tuple[str, str, str, bool], ...] = (
    ("CommitmentProgramEligibilityDetails", "JSON", "Conditional", True),
    ("InvoiceDetailId", "String", "Conditional", True),
)
CHANGED_1_4 = {"InvoiceId": ("String", "Conditional", True), "PricingCurrency": ("String", "Conditional", False),
               "PricingCurrencyEffectiveCost": ("Decimal", "Conditional", False)}
VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")


def columns(version: str) -> dict[str, tuple[str, str, bool]]:
    """column -> (data type, feature level, allows nulls) of a FOCUS version (1.0-1.4)."""
    if version not in VERSIONS:
        raise ValueError(f"unknown FOCUS version {version!r}; expected one of {', '.join(VERSIONS)}")
    out = {c: (t, level, nulls) for c, t, level, nulls in COLUMNS_1_2}
    if version < "1.2":
        for c in ADDED_1_2:
            out.pop(c)
    if version < "1.1":
        for c in ADDED_1_1:
            out.pop(c)
    if version >= "1.3":
        out.update({c: (t, level, nulls) for c, t, level, nulls in ADDED_1_3})
    if version >= "1.4":
        for c in DEPRECATED_1_3:
            out.pop(c)
        out.update({c: (t, level, nulls) for c, t, level, nulls in ADDED_1_4})
        out.update(CHANGED_1_4)
    return out


def mandatory(version: str) -> list[str]:
    return [c for c, (_, level, _n) in columns(version).items() if level == "Mandatory"]


def detect_version(names: Iterable[str]) -> str:
    """The newest FOCUS version a file's columns show: 1.4 adds CommitmentProgramEligibilityDetails and
    InvoiceDetailId and drops ProviderName; 1.3 names the provider ServiceProviderName (and adds Allocated*,
    ContractApplied); 1.2 adds InvoiceId and PricingCurrency (Azure's 1.0 export had them as x_ columns);
    1.1 adds SkuMeter, SkuPriceDetails, ServiceSubcategory, CapacityReservation* and
    CommitmentDiscountQuantity. A file with fewer columns reads as 1.0."""
    have = set(names)
    provider_1_3 = bool(have & {"ServiceProviderName", "HostProviderName"})
    if (have & {"CommitmentProgramEligibilityDetails", "InvoiceDetailId"}
            or (provider_1_3 and "ProviderName" not in have)):
        return "1.4"
    if provider_1_3 or have & {"AllocatedMethodId", "AllocatedResourceId", "ContractApplied"}:
        return "1.3"
    if have & {"InvoiceId", "PricingCurrency"}:
        return "1.2"
    if have & {"SkuMeter", "SkuPriceDetails", "ServiceSubcategory", "CapacityReservationId",
               "CommitmentDiscountQuantity"}:
        return "1.1"
    return "1.0"


def provider_column(names: Iterable[str]) -> str | None:
    """Where the provider of a charge is: ServiceProviderName (1.3+), else ProviderName (1.0-1.3), else
    HostProviderName; None when the file has none of them."""
    have = set(names)
    for c in ("ServiceProviderName", "ProviderName", "HostProviderName"):
        if c in have:
            return c
    return None
