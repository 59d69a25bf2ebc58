"""What makes a FOCUS row a GPU instance-hour, without pandas: the columns read, the time units, the
non-compute categories, the GPU instance a charge text names and the tag shapes. focus.py (the cost table)
and duck.py (the totals on DuckDB) both apply these, so the selection is one piece of code."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .errors import BillingDataError
from .focus_spec import detect_version, provider_column

REQUIRED = ("ChargePeriodStart", "BillingCurrency", "ChargeCategory", "ResourceId", "ConsumedQuantity",
            "ConsumedUnit", "ChargeDescription")
PROVIDER_COLUMNS = ("ServiceProviderName", "ProviderName", "HostProviderName")
OPTIONAL = ("SubAccountId", "RegionId", "Tags", "ResourceName", "PricingCategory", "CommitmentDiscountType",
            "CommitmentDiscountCategory", "ServiceCategory", "x_UsageType", "SkuPriceDetails", "x_SkuDetails",
            # Read only to tell the version apart (focus_spec.detect_version).
            "InvoiceId", "PricingCurrency", "SkuMeter", "ServiceSubcategory", "CapacityReservationId",
            "AllocatedMethodId", "AllocatedResourceId", "ContractApplied", "CommitmentProgramEligibilityDetails",
            "InvoiceDetailId", "ChargePeriodEnd")
FILE_SUFFIXES = (".csv", ".csv.gz", ".parquet")
HOUR_UNITS = {"hours", "hour", "hrs", "hr", "h"}
SECOND_UNITS = {"seconds", "second", "secs", "sec", "s"}
COMPOUND_TIME_UNIT = r"^[a-z].*[-\s](?:seconds?|hours?)$"
# FOCUS ServiceCategory values that are not GPU instances; other values (Google writes its product
# taxonomy, "GCP > Compute > GPUs > ...") are kept.
NON_COMPUTE_CATEGORIES = {"analytics", "business applications", "databases", "developer tools", "multicloud",
                          "identity", "integration", "internet of things", "management and governance", "media",
                          "migration", "mobile", "networking", "security", "storage", "web", "other"}
# Google's system label naming the machine type of a Compute Engine charge.
GCP_MACHINE_LABEL = "compute.googleapis.com/machine_spec"
# A GPU's own SKU ("Nvidia Tesla T4 GPU running in Americas", "Spot Preemptible Nvidia L4 GPU attached to ..."): bills
# an N1 VM's attached GPUs, whose machine type (n1-standard-8) names none. Google writes it as the detailed export's
# sku.description and as the FOCUS view's ChargeDescription.
GPU_SKU = re.compile(r"\bGPU\b")
# The prefix of a Compute Engine resource's full name (a FOCUS ResourceId): what SQL narrows on before gce_vm_id.
GCE_RESOURCE_PREFIX = "//compute.googleapis.com/"
# One line's usage hours above this are not a measurement (a month of 10,000 instances is 7.4e6).
MAX_LINE_HOURS = 1e9
_PROVIDERS = {"aws": "aws", "amazon web services": "aws", "microsoft": "azure", "azure": "azure",
              "google cloud": "gcp", "google": "gcp", "oracle": "oci", "oci": "oci"}
_AWS_TYPE = re.compile(r"\b([a-z][a-z0-9-]*)\.([0-9]*[a-z][a-z0-9]*)\b")


def subject_of(resource_id: object, resource_name: object = None) -> str:
    """The id a bill's ResourceId names its instance by, as the place lists it: an Azure VM's ARM id becomes its
    `azure:<subscription>/<group>/<name>` (model.azure_vm_id), a Uniform scale set's instance
    (`.../virtualMachineScaleSets/<set>/virtualMachines/<n>`) its `azure:<subscription>/<group>/<set>/<n>`, a GCE VM's
    full resource name with its ResourceName `gce:<project>/<zone>/<name>` (model.gce_vm_id; `gce-unlisted:...` when
    only the numeric id is there), so that a VM's billed rate and its verdicts meet; any other id is kept as it is (an
    EC2 instance id, an OCI resource, a scale set's own id)."""
    # model here, not at the top: these rules are read by every billing source (gcp_detailed's included), and
    # model's types are a start-up cost a `costs` of CUR or FOCUS files does without (tests/cli/test_start.py).
    from ...model import azure_scale_set_vm_id, azure_vm_id, gce_vm_id

    text = "" if resource_id is None else str(resource_id)
    name = "" if resource_name is None or resource_name != resource_name else str(resource_name)
    return azure_vm_id(text) or azure_scale_set_vm_id(text) or gce_vm_id(text, name) or text


def is_gce_vm(resource_id: object) -> bool:
    """Whether a FOCUS ResourceId is a GCE VM's full resource name (model.gce_vm_id)."""
    from ...model import gce_vm_id  # where used, as in subject_of

    return resource_id is not None and resource_id == resource_id and gce_vm_id(str(resource_id)) != ""


def bills_a_gpu(resource_id: object, charge_description: object) -> bool:
    """Whether a row bills a GCE VM for an attached GPU (its charge is a GPU SKU): the VM is a GPU VM, and its other
    rows (vCPU, RAM), whose machine type names no GPU, are its cost too."""
    return is_gce_vm(resource_id) and GPU_SKU.search(_as_text(charge_description)) is not None


@dataclass
class PendingGceRows:
    """A GCE VM's rows that name no GPU (an N1 VM's vCPU and RAM) count only if the VM is billed a GPU SKU
    somewhere in the export (another chunk, another file): what they would add, held until every file is read.
    focus.py and duck.py both fill it, so they settle it alike."""

    billed_gpu: set = field(default_factory=set)  # ResourceIds billed for a GPU SKU in the period
    # (file index, column order, data row, ResourceId, message) of each pending row whose value is not a number/date
    bad: list = field(default_factory=list)
    excluded: dict = field(default_factory=dict)  # (file index, ResourceId) -> rows outside the line guards

    def note_bad(self, file_index: int, column_order: int, data_row: int, resource_id: str, message: str) -> None:
        self.bad.append((file_index, column_order, data_row, resource_id, message))

    def note_excluded(self, file_index: int, resource_id: str, n: int) -> None:
        if n:
            self.excluded[(file_index, resource_id)] = self.excluded.get((file_index, resource_id), 0) + n

    def counts(self, resource_id: object) -> bool:
        return resource_id in self.billed_gpu

    def raise_first_bad(self) -> None:
        """The error of the first bad value (by file, then cost / quantity / date, then row) of a GPU VM's row."""
        mine = sorted(b for b in self.bad if b[3] in self.billed_gpu)
        if mine:
            raise BillingDataError(mine[0][4])

    def excluded_of(self, file_index: int) -> int:
        return sum(n for (f, rid), n in self.excluded.items() if f == file_index and rid in self.billed_gpu)


def bad_value_message(file_name: str, column: str, data_row: int, value, date: bool) -> str:
    """A FOCUS row's value that is not a number (or a date), as both readers say it."""
    if date:
        return f"{file_name}: column '{column}' is not a date on data row {data_row}"
    return f"{file_name}: column '{column}' is not a number on data row {data_row} (value {value!r})"


def gpu_instance_type(text: str, families: set[str], patterns: Sequence[re.Pattern]) -> str:
    """The GPU instance name a charge text mentions, or ''."""
    if not text:
        return ""
    for m in _AWS_TYPE.finditer(text):
        if m.group(1) in families:
            return m.group(0)
    for pat in patterns:
        m = pat.search(text)
        if m:
            return m.group(0)
    return ""


def focus_tags(value) -> dict:
    """Tags as a dict, from each shape exports write: a JSON object (FOCUS), a Parquet map (pairs), or a
    list of {key, value} objects (Google's view, as JSON text in a CSV)."""
    if value is None or (isinstance(value, float) and value != value):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if isinstance(value, dict):
        return value
    if hasattr(value, "tolist"):  # numpy array from Parquet
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        out = {}
        for item in value:
            if isinstance(item, dict):
                low = {str(k).lower(): v for k, v in item.items()}
                if "key" in low:
                    out[str(low["key"])] = low.get("value")
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                out[str(item[0])] = item[1]
        return out
    return {}


def _pick(tags: dict, keys: Sequence[str]) -> str:
    for k in keys:
        if tags.get(k):
            return str(tags[k])
    return ""


def _as_text(v) -> str:
    return "" if v is None or (isinstance(v, float) and v != v) else v if isinstance(v, str) else json.dumps(
        v, default=str)


def provider_name(value: str) -> str:
    p = str(value or "").strip().lower()
    return _PROVIDERS.get(p, p)


def check_columns(names: Iterable[str], name: str, cost_col: str) -> tuple[str, str]:
    """(FOCUS version, provider column) of one file from its column names, or an error naming the file and
    the missing columns."""
    names = list(names)
    version = detect_version(names)
    provider = provider_column(names)
    missing = [c for c in (*REQUIRED, cost_col) if c not in names]
    if provider is None:
        missing.append("ServiceProviderName" if version >= "1.3" else "ProviderName")
    if missing:
        raise BillingDataError(f"{name}: missing FOCUS {version} column(s) {missing}"
                               + (" (FOCUS 1.3+ names the provider ServiceProviderName, 1.0-1.2 ProviderName)"
                                  if provider is None else ""))
    return version, provider
