"""Azure VMs with GPU sizes, behind the `Cloud` protocol, through the official ARM clients.

Only the act stage calls the mutating methods (set_tags, remove_tags, stop, power_off). Everything here is I/O at the
edge: no decision is taken, and a subscription that cannot be listed never hides the others.

ARM operations made by this module (the custom role in deploy/azure/gpufinops-role.json grants exactly these; every
test of tests/places/azure and tests/faults/test_azure_faults.py runs under it, the stand-in ARM answering 403 to any
request outside it and the test failing on one):
- Microsoft.Compute/virtualMachines/read: list a subscription's VMs (model, then `statusOnly=true` for their power
  states: both paged by nextLink), get one VM with its instance view (the read-back);
- Microsoft.Compute/virtualMachineScaleSets/read: list a subscription's scale sets (paged), get one (a re-read);
- Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read: list the instances of each Uniform scale set of a
  GPU size that has any (`$expand=instanceView`: model and power state in one paged read), get one. Read only: an
  instance of a scale set is never changed (below);
- Microsoft.Resources/tags/write: the Tags API's PATCH at the VM's scope, `Merge` of gpufinops's own keys or
  `Delete` of them, never a whole-map `Replace`, so a person's other tags are never overwritten;
- Microsoft.Compute/virtualMachines/deallocate/action: the stop, its long-running operation followed with
  Microsoft.Compute/locations/operations/read. Never delete.
- Microsoft.Compute/virtualMachines/powerOff/action, only under a rule that says `action: power_off` and only with
  the optional role deploy/azure/gpufinops-power-off-role.json assigned beside the first (without it ARM refuses the
  call, 403: a definite failure, the VM untouched). A powered-off VM is "Stopped (allocated)": it keeps its
  hardware (a deallocated GPU VM may find no capacity when started again) and its compute is billed until it is
  deallocated (the SDK's `stop()` is that trap, which is why no stop ever powers off).

Two clients per subscription. Reads retry a few times (429 after its Retry-After, 5xx). Mutating calls go through
a client with retries off: exactly one HTTP request per intent, and a failure says whether ARM certainly did
nothing (`CloudError.definite`: a 4xx, a 429, a connection that never opened) or its fate is unknown (a 5xx, no
answer: read back with describe()). The deallocate's long-running operation is then followed (Azure-AsyncOperation /
Location, polled by the SDK) for at most `deallocate_wait_s`; the VM is read back whatever it says.

An id says the cloud: `azure:<subscription>/<resource group>/<name>`; an instance of a Uniform scale set (an AKS
GPU node pool's node, most GPU scale sets: no VM of the VM list) `azure:<subscription>/<resource group>/<scale
set>/<instance id>`, as Cost Management's exports name it. Such an instance is its scale set's: judged and advised
(scale the set in; AKS: its cluster autoscaler), never deallocated, powered off or tagged; every mutating method
refuses it before any request (places.registry.AZURE_SCALE_SET_INSTANCE refuses every action but notify). A Flexible
scale set's members are VMs of the VM list (their `virtualMachineScaleSet`), managed alike; the scale set list skips
Flexible sets. A scale set list that fails makes the listing partial (`last_errors`), never empty of the VMs.
A VM's power state maps onto the states the
act stage reads: running; deallocating -> "stopping" and deallocated -> "stopped" (compute billing ends: a stop that
went through); "Stopped (allocated)" -> STATE_STOPPED_ALLOCATED, still billed, judged as such (decide.evaluate) and
deallocated under a rule after the usual warning; starting -> "pending"; a power-off under way -> "powering-off".
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from ...config import AzureSettings, ConfigError
from ...model import (STATE_STOPPED_ALLOCATED, Clock, GpuInstance, azure_scale_set_vm_id, azure_vm_id,
                      is_azure_scale_set_vm_id, utcnow)
from ..ec2.cloud import CloudError, InventoryError
from ..fleet import WithPlace
from ..registry import AZURE_ID_PREFIX
from .sizes import AzureSizes

log = logging.getLogger(__name__)

PROVIDER = "azure"

# ARM's power state codes (instanceView statuses "PowerState/<x>") as the act stage reads them.
POWER_STATES = {
    "running": "running",
    "starting": "pending",
    "deallocating": "stopping",
    "deallocated": "stopped",
    "stopped": STATE_STOPPED_ALLOCATED,
    "stopping": "powering-off",
}

# What to do instead of deallocating a VM something else manages.
ADVICE_VMSS = ("scale the VM scale set's capacity down or set an autoscale rule; the scale set replaces or restarts "
               "a member it did not remove itself")
ADVICE_AKS = "let the AKS cluster autoscaler remove the node (scale the node pool down); scale the workload down"
ADVICE_DATABRICKS = "terminate or autoscale the Databricks cluster (auto termination), not the VM"
ADVICE_AML = "set the Azure Machine Learning compute's idle shutdown or scale its cluster to 0 nodes"


@dataclass(frozen=True)
class VmRef:
    subscription: str
    resource_group: str
    name: str

    @property
    def instance_id(self) -> str:
        return azure_vm_id(self.arm_id)

    @property
    def arm_id(self) -> str:
        return (f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}"
                f"/providers/Microsoft.Compute/virtualMachines/{self.name}")


def ref_of_arm_id(arm_id: str) -> VmRef | None:
    subject = azure_vm_id(arm_id)
    parts = arm_id.strip("/").split("/")
    return VmRef(parts[1], parts[3], parts[7]) if subject else None


@dataclass(frozen=True)
class ScaleSetVmRef:
    """An instance of a Uniform scale set: `instance` is ARM's instanceId ("0", "12"), not a VM name."""
    subscription: str
    resource_group: str
    scale_set: str
    instance: str

    @property
    def instance_id(self) -> str:
        return azure_scale_set_vm_id(self.arm_id)

    @property
    def arm_id(self) -> str:
        return (f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}"
                f"/providers/Microsoft.Compute/virtualMachineScaleSets/{self.scale_set}"
                f"/virtualMachines/{self.instance}")


def scale_set_ref_of_arm_id(arm_id: str) -> ScaleSetVmRef | None:
    parts = arm_id.strip("/").split("/")
    return ScaleSetVmRef(parts[1], parts[3], parts[7], parts[9]) if azure_scale_set_vm_id(arm_id) else None


def scale_set_ref_of(instance_id: str) -> ScaleSetVmRef | None:
    """The scale set instance an `azure:<subscription>/<group>/<scale set>/<instance id>` id names; else None."""
    if not is_azure_scale_set_vm_id(instance_id):
        return None
    parts = instance_id[len(AZURE_ID_PREFIX):].split("/")
    return ScaleSetVmRef(*parts) if all(parts) else None


def ref_of(instance_id: str) -> VmRef | None:
    """The VM an `azure:<subscription>/<group>/<name>` id names; None for any other id."""
    if not instance_id.startswith(AZURE_ID_PREFIX):
        return None
    parts = instance_id[len(AZURE_ID_PREFIX):].split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return VmRef(*parts)


@dataclass(frozen=True)
class Manager:
    by: str
    advice: str


def manager_of(vm_scale_set_id: str, tags: Mapping[str, str]) -> Manager | None:
    """Who manages a VM: the scale set it belongs to (Flexible orchestration: listed as a VM with its
    `virtualMachineScaleSet`; Uniform members are listed from their scale set, `scale_set_manager`), else the service
    whose tags it carries (AKS, Databricks, Azure Machine Learning). None when nothing does."""
    # Tag values are untrusted: clipped here, escaped where a message shows them.
    if vm_scale_set_id:
        return scale_set_manager(vm_scale_set_id.rstrip('/').rsplit('/', 1)[-1], "", tags)
    if tags.get("aks-managed-poolName") or any(k.startswith("aks-managed-") for k in tags):
        pool = tags.get("aks-managed-poolName", "?")[:80]
        return Manager(f"AKS node pool '{pool}'", ADVICE_AKS)
    if tags.get("Vendor") == "Databricks" or ("ClusterId" in tags and "DatabricksEnvironment" in tags):
        name = (tags.get("ClusterName") or tags.get("ClusterId") or "?")[:80]
        return Manager(f"Databricks cluster '{name}'", ADVICE_DATABRICKS)
    if any(k.lower().startswith("azureml") for k in tags):
        return Manager("Azure Machine Learning compute", ADVICE_AML)
    return None


# An AKS node pool's scale set: `aks-<pool>-<digits>-vmss` in the cluster's node resource group (`MC_...`).
_AKS_SCALE_SET = re.compile(r"^aks-([a-z0-9]+)-\d+-vmss$", re.IGNORECASE)


def scale_set_manager(scale_set: str, resource_group: str, tags: Mapping[str, str]) -> Manager:
    """The manager of a scale set's instance: its AKS node pool where the scale set is one (AKS's `aks-managed-*`
    tags, its node resource group `MC_...` with an `aks-<pool>-<n>-vmss` name), else the scale set itself."""
    pool = tags.get("aks-managed-poolName") or ""
    named = _AKS_SCALE_SET.match(scale_set)
    aks = bool(pool) or any(k.startswith("aks-managed-") for k in tags) or (
        resource_group.lower().startswith("mc_") and named is not None)
    if aks:
        pool = pool or (named.group(1) if named else "?")
        return Manager(f"AKS node pool '{pool[:80]}' (VM scale set '{scale_set[:80]}')", ADVICE_AKS)
    return Manager(f"VM scale set '{scale_set[:80]}'", ADVICE_VMSS)


def power_state(statuses: Sequence[Any] | None) -> str:
    """The act stage's state from an instance view's statuses; "unknown" when none says (never judged)."""
    for status in statuses or ():
        code = str(field(status, "code") or "")
        if code.startswith("PowerState/"):
            return POWER_STATES.get(code.split("/", 1)[1].lower(), "unknown")
    return "unknown"


# ---------------------------------------------------------------------- errors


def azure_fate(exc: BaseException) -> tuple[bool, str, str]:
    """(definite, why, code): definite is True only when ARM certainly did NOT act on the request.

    An answer 4xx (a refusal: 403 not permitted, 409 conflict, 412 precondition) or 429 (throttled) is definite;
    a connection that never opened sent nothing. A 5xx, no answer or an answer that cannot be read leave the fate
    unknown: ARM may have accepted it, so the VM is read back before anything is recorded."""
    from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError

    if isinstance(exc, HttpResponseError) and exc.status_code:
        status = int(exc.status_code)
        code = str(getattr(getattr(exc, "error", None), "code", "") or "")
        if status == 429:
            return True, f"throttled (HTTP 429 {code}): refused, not done", code or "TooManyRequests"
        if 400 <= status < 500:
            return True, f"refused by ARM (HTTP {status} {code})", code or str(status)
        return False, f"ARM answered HTTP {status} {code}: it may or may not have done it", code or str(status)
    if isinstance(exc, ServiceRequestError):
        return True, f"never sent ({type(exc).__name__})", ""
    if isinstance(exc, ServiceResponseError):
        return False, "no answer to the request: it may or may not have been done", ""
    return False, f"{type(exc).__name__}: the outcome is unknown", ""


def _cloud_error(operation: str, inst: GpuInstance, exc: BaseException, *, definite: bool | None = None) -> CloudError:
    certain, why, code = azure_fate(exc)
    return CloudError(operation, inst.instance_id, inst.region, f"{why}: {_brief(exc)}",
                      definite=certain if definite is None else definite, code=code)


# ---------------------------------------------------------------------- the place


class AzureCloud:
    """The `Cloud` protocol over ARM (or tests/armstub.py), one subscription after the other.

    list_gpu_instances() lists every configured subscription; one that fails is logged and recorded in
    `last_errors`, the others still listed; every one failing raises InventoryError (an empty list would read as
    "no GPU VM at all")."""

    def __init__(self, settings: AzureSettings, credential: Any = None, *, sizes: AzureSizes | None = None,
                 clock: Clock = utcnow, polling_interval_s: float = 5.0):
        self.settings = settings
        self._credential = credential if credential is not None else default_credential(settings)
        self._sizes = sizes or (AzureSizes.load(settings.price_file) if settings.price_file
                                else AzureSizes.load_default())
        self._clock = clock
        self._polling_interval_s = polling_interval_s
        self._prefixes = tuple(p.lower() for p in settings.gpu_size_prefixes)
        self._clients: dict[tuple[str, str, bool], Any] = {}
        self.last_errors: list[str] = []
        # The longest a deallocate may be in flight: one attempt's timeouts, the operation followed, a margin.
        self.max_request_s = settings.connect_timeout_s + settings.read_timeout_s + settings.deallocate_wait_s + 30.0

    # ------------------------------------------------------------------ clients
    def _client(self, kind: str, subscription: str, write: bool = False):
        """ARM's compute or resource client for one subscription; `write`: retries off (one request per intent)."""
        key = (kind, subscription.lower(), write)
        if key not in self._clients:
            from azure.mgmt.compute import ComputeManagementClient
            from azure.mgmt.resource.resources import ResourceManagementClient

            options: dict[str, Any] = {
                "connection_timeout": self.settings.connect_timeout_s,
                "read_timeout": self.settings.read_timeout_s,
                "polling_interval": self._polling_interval_s,
                "user_agent": "gpufinops",
            }
            if self.settings.endpoint_url:
                options["base_url"] = self.settings.endpoint_url
                options["credential_scopes"] = ["https://management.azure.com/.default"]
            if self.settings.ca_file:
                options["connection_verify"] = self.settings.ca_file
            # Reads: a few retries (429 after its Retry-After, 5xx, a connection reset), 0.5, 1, 2 s apart, so that a
            # failing subscription costs a tick seconds, not azure-core's default minutes. Writes: none at all.
            options.update(retry_total=0) if write else options.update(retry_total=3, retry_backoff_factor=0.5)
            cls = ComputeManagementClient if kind == "compute" else ResourceManagementClient
            self._clients[key] = cls(self._credential, subscription, **options)
        return self._clients[key]

    # ------------------------------------------------------------------ inventory
    @property
    def complete(self) -> bool:
        return not self.last_errors

    def list_gpu_instances(self) -> list[GpuInstance]:
        found: list[GpuInstance] = []
        errors: list[str] = []
        failed: list[str] = []  # the subscriptions whose VMs could not be listed
        for sub in self.settings.subscriptions:
            try:
                found.extend(self._list_subscription(sub))
            except Exception as exc:  # noqa: BLE001 - the other subscriptions are still listed
                log.error("Azure inventory of subscription %s failed: %s", sub, _brief(exc))
                failed.append(f"Azure subscription {sub}: {_brief(exc)}")
                continue
            # Its scale sets' instances, once its VMs are listed: a scale set that fails is one error of its own.
            found.extend(self._list_scale_set_instances(sub, errors))
        self.last_errors = failed + errors
        if failed and len(failed) == len(self.settings.subscriptions):
            raise InventoryError("Azure inventory failed in every subscription: " + "; ".join(failed))
        return found

    def _is_gpu_size(self, size: str) -> bool:
        return self._sizes.info(size) is not None or size.lower().startswith(self._prefixes)

    def _list_subscription(self, sub: str) -> list[GpuInstance]:
        vms = self._client("compute", sub).virtual_machines
        models = [vm for vm in vms.list_all() if self._is_gpu_size(_size_of(vm))]
        if not models:
            return []
        # The model list carries no power state; `statusOnly=true` lists the instance views (one more paged read).
        states = {str(field(vm, "id")).lower(): power_state(field(vm, "properties", "instanceView", "statuses"))
                  for vm in vms.list_all(status_only="true")}
        return [self._to_gpu_instance(vm, states.get(str(field(vm, "id")).lower(), "unknown")) for vm in models]

    def _is_listed_scale_set(self, scale_set: Any) -> bool:
        """A Uniform scale set (no `orchestrationMode`: an older one, Uniform) of a GPU size with any instance. A
        Flexible set's members are VMs of the VM list already; an empty one costs no request."""
        mode = _text(field(scale_set, "properties", "orchestrationMode")).lower()
        capacity = field(scale_set, "sku", "capacity")
        return (mode in ("", "uniform") and self._is_gpu_size(_text(field(scale_set, "sku", "name")))
                and (capacity is None or int(capacity) > 0))

    def _list_scale_set_instances(self, sub: str, errors: list[str]) -> list[GpuInstance]:
        """The instances of the subscription's Uniform GPU scale sets: one paged list of the scale sets, then one
        paged list (with their instance views) per such scale set only. A list that fails is an error in `errors`
        (the listing is partial), never an empty answer taken for "no instance"."""
        compute = self._client("compute", sub)
        try:
            scale_sets = [s for s in compute.virtual_machine_scale_sets.list_all() if self._is_listed_scale_set(s)]
        except Exception as exc:  # noqa: BLE001 - the subscription's VMs stay listed
            log.error("Azure VM scale sets of subscription %s could not be listed: %s", sub, _brief(exc))
            errors.append(f"Azure subscription {sub}, VM scale sets: {_brief(exc)}")
            return []
        found: list[GpuInstance] = []
        for scale_set in scale_sets:
            set_id = str(field(scale_set, "id") or "")
            parts = set_id.strip("/").split("/")
            name = str(field(scale_set, "name") or parts[-1])
            try:
                if len(parts) != 8:
                    raise InventoryError(f"ARM listed a scale set with an id gpufinops cannot read: {set_id[:200]!r}")
                pages = compute.virtual_machine_scale_set_vms.list(parts[3], name, expand="instanceView")
                # Every page read before any is kept: a scale set is listed whole or is an error.
                members = [self._to_scale_set_instance(scale_set, vm) for vm in pages]
                found.extend(members)
            except Exception as exc:  # noqa: BLE001 - the other scale sets are still listed
                log.error("Azure VM scale set %s of subscription %s could not be listed: %s", name, sub, _brief(exc))
                errors.append(f"Azure VM scale set {name[:80]} in subscription {sub}: {_brief(exc)}")
        return found

    def _to_scale_set_instance(self, scale_set: Any, vm: Any) -> GpuInstance:
        arm_id = str(field(vm, "id"))
        ref = scale_set_ref_of_arm_id(arm_id)
        if ref is None:
            raise InventoryError(f"ARM listed a scale set instance with an id gpufinops cannot read: {arm_id[:200]!r}")
        # Size, priority and tags are the scale set's (an instance carries its own sku and tags where ARM gives
        # them: its model may lag the set's until upgraded).
        size = _text(field(vm, "sku", "name")) or _text(field(scale_set, "sku", "name"))
        priority = _text(field(scale_set, "properties", "virtualMachineProfile", "priority"))
        tags = {str(k): str(v) for k, v in {**(field(scale_set, "tags") or {}), **(field(vm, "tags") or {})}.items()}
        computer = (field(vm, "properties", "osProfile", "computerName")
                    or field(vm, "properties", "instanceView", "computerName") or "")
        if not computer:
            # DCGM's series are found by the host's name: without one the instance has no metrics (UNKNOWN).
            log.warning("Azure scale set instance %s has no computer name; its metrics cannot be matched",
                        ref.instance_id)
        return self._gpu_instance(
            ref.instance_id, ref.subscription, size, str(field(vm, "location") or field(scale_set, "location") or ""),
            power_state(field(vm, "properties", "instanceView", "statuses")),
            field(vm, "properties", "timeCreated") or field(scale_set, "properties", "timeCreated"),
            priority, tags, str(computer), scale_set_manager(ref.scale_set, ref.resource_group, tags))

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        """Fresh state and tags of these VMs, each with its instance view. A VM ARM says is gone (404) is absent;
        any other failure raises InventoryError, so that an unreachable VM is never taken for a vanished one."""
        from azure.core.exceptions import ResourceNotFoundError

        out: list[GpuInstance] = []
        for iid in dict.fromkeys(instance_ids):
            ref = ref_of(iid)
            if ref is None:
                found = self._describe_scale_set_instance(iid)
                out.extend([found] if found is not None else [])
                continue
            try:
                vm = self._client("compute", ref.subscription).virtual_machines.get(
                    ref.resource_group, ref.name, expand="instanceView")
            except ResourceNotFoundError:
                continue
            except Exception as exc:  # noqa: BLE001 - unknown stays unknown
                raise InventoryError(f"Azure VM {iid} could not be read: {_brief(exc)}") from exc
            out.append(self._to_gpu_instance(vm, power_state(field(vm, "properties", "instanceView", "statuses"))))
        return out

    def _describe_scale_set_instance(self, instance_id: str) -> GpuInstance | None:
        """One scale set instance read afresh (its scale set, then the instance with its instance view); None for an
        id that names none, or one ARM says is gone (404); any other failure raises InventoryError."""
        from azure.core.exceptions import ResourceNotFoundError

        ref = scale_set_ref_of(instance_id)
        if ref is None:
            return None
        compute = self._client("compute", ref.subscription)
        try:
            scale_set = compute.virtual_machine_scale_sets.get(ref.resource_group, ref.scale_set)
            vm = compute.virtual_machine_scale_set_vms.get(ref.resource_group, ref.scale_set, ref.instance,
                                                           expand="instanceView")
        except ResourceNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - unknown stays unknown
            raise InventoryError(f"Azure scale set instance {instance_id} could not be read: {_brief(exc)}") from exc
        return self._to_scale_set_instance(scale_set, vm)

    def _to_gpu_instance(self, vm: Any, state: str) -> GpuInstance:
        arm_id = str(field(vm, "id"))
        ref = ref_of_arm_id(arm_id)
        if ref is None:
            raise InventoryError(f"ARM listed a VM with an id gpufinops cannot read: {arm_id[:200]!r}")
        tags = {str(k): str(v) for k, v in (field(vm, "tags") or {}).items()}
        vmss = field(vm, "properties", "virtualMachineScaleSet", "id") or ""
        return self._gpu_instance(
            ref.instance_id, ref.subscription, _size_of(vm), str(field(vm, "location") or ""), state,
            field(vm, "properties", "timeCreated"), _text(field(vm, "properties", "priority")), tags,
            field(vm, "properties", "osProfile", "computerName") or ref.name, manager_of(vmss, tags))

    def _gpu_instance(self, instance_id: str, subscription: str, size: str, region: str, state: str,
                      time_created: Any, priority: str, tags: dict[str, str], computer: str,
                      manager: Manager | None) -> GpuInstance:
        """A listed VM or scale set instance as the stages read it: GPU model and count and price from its size."""
        info = self._sizes.info(size)
        spot = priority.lower() in ("spot", "low")
        created = _time(time_created)
        if created is not None:
            created = created if created.tzinfo else created.replace(tzinfo=timezone.utc)
        else:
            # Without it we cannot know the VM has run a full window: too young to judge, never old enough to stop.
            log.warning("Azure VM %s has no timeCreated; not judged", instance_id)
            created = self._clock()
        price = self._sizes.price(size, region, spot)
        return GpuInstance(
            instance_id=instance_id, instance_type=size, region=region, state=state,
            # ARM gives a VM's creation time, not its last start: the window's metric coverage holds a VM started
            # within it as UNKNOWN (too few samples), never idle.
            launch_time=created, account=subscription, lifecycle="spot" if spot else "on-demand", tags=tags,
            private_dns=computer, gpu_count=info.gpu_count if info else 0, gpu_model=info.gpu_model if info else "",
            gpu_memory_gib=info.gpu_memory_gib if info else 0.0, hourly_cost=price, provider=PROVIDER,
            managed_by=manager.by if manager else "", managed_advice=manager.advice if manager else "",
            price_source=self._sizes.price_source(size, region) if price is not None else "")

    # ------------------------------------------------------------------ mutating calls (act stage only)
    def _patch_tags(self, operation: str, inst: GpuInstance, patch: str, tags: Mapping[str, str]) -> None:
        from azure.mgmt.resource.resources.models import Tags, TagsPatchResource

        ref = _ref_or_refuse(operation, inst)
        tags_api = self._client("resource", ref.subscription, write=True).tags
        self._once(operation, inst, lambda: tags_api.begin_update_at_scope(
            ref.arm_id, TagsPatchResource(operation=patch, properties=Tags(tags=dict(tags)))).result())

    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        if tags:
            self._patch_tags("Tags Merge", inst, "Merge", {k: str(v) for k, v in tags.items()})

    def remove_tags(self, inst: GpuInstance, keys: Sequence[str]) -> None:
        # Name/value pairs as last read (the Tags API deletes a pair only where both match): a key whose value a
        # person changed since stays as the person set it.
        if keys:
            self._patch_tags("Tags Delete", inst, "Delete", {k: inst.tags.get(k, "") for k in keys})

    def stop(self, inst: GpuInstance) -> None:
        """ARM's deallocate (compute billing ends), never a power-off (billing goes on) and never hibernate."""
        self._operation("deallocate", inst, lambda vms, ref: vms.begin_deallocate(ref.resource_group, ref.name))

    def power_off(self, inst: GpuInstance) -> None:
        """ARM's powerOff, only for a rule that asks for it (act.Actuator, `action: power_off`): the VM stays
        allocated, "Stopped (allocated)", and its compute billed until it is deallocated. The guest OS is shut down
        first (skipShutdown=false), as a person's power-off from the portal does."""
        self._operation("power off", inst,
                        lambda vms, ref: vms.begin_power_off(ref.resource_group, ref.name, skip_shutdown=False))

    def _operation(self, operation: str, inst: GpuInstance, begin: Callable[[Any, VmRef], Any]) -> None:
        """One long-running VM operation: one request (retries off), then its operation followed for at most
        `deallocate_wait_s`; accepted is enough (the read-back counts "deallocating" / "powering-off" as done)."""
        ref = _ref_or_refuse(operation, inst)
        vms = self._client("compute", ref.subscription, write=True).virtual_machines
        poller = self._once(operation, inst, lambda: begin(vms, ref))
        try:
            poller.wait(timeout=self.settings.deallocate_wait_s)
            status = poller.status()
        except Exception as exc:  # noqa: BLE001 - ARM accepted the request: its outcome is read back
            raise _cloud_error(operation, inst, exc, definite=False) from exc
        if str(status).lower() in ("failed", "canceled"):
            raise CloudError(operation, inst.instance_id, inst.region,
                             f"the {operation} operation ended {status}", definite=False, code=str(status))

    def terminate(self, inst: GpuInstance) -> None:
        raise CloudError("delete", inst.instance_id, inst.region,
                         "gpufinops never deletes an Azure VM (its role grants no delete): deallocate it instead",
                         definite=True, code="NotOffered")

    def _once(self, operation: str, inst: GpuInstance, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - an unclassified failure is "fate unknown", never a crash
            error = _cloud_error(operation, inst, exc)
            log.error("%s", error)
            raise error from exc


def _ref_or_refuse(operation: str, inst: GpuInstance) -> VmRef:
    if is_azure_scale_set_vm_id(inst.instance_id):
        # Its scale set (or AKS) owns it: the plan never asks this (registry: notify only), and were it ever asked,
        # no request leaves.
        raise CloudError(operation, inst.instance_id, inst.region,
                         "an instance of a VM scale set is never changed by gpufinops (scale the set in instead)",
                         definite=True, code="ScaleSetInstance")
    ref = ref_of(inst.instance_id)
    if ref is None:
        raise CloudError(operation, inst.instance_id, inst.region, "not an Azure VM id", definite=True,
                         code="NotAzure")
    return ref


def _brief(exc: BaseException) -> str:
    """An ARM error on one line (azure-core's text spans several: "(Code) message\nCode: ...\nMessage: ...")."""
    return " ".join(str(exc).splitlines()[0].split())[:300] if str(exc) else type(exc).__name__


def _text(value: Any) -> str:
    """A model field as ARM wrote it (the SDK's enums carry it in `.value`)."""
    return str(getattr(value, "value", value) or "")


def _size_of(vm: Any) -> str:
    return _text(field(vm, "properties", "hardwareProfile", "vmSize"))


def field(model: Any, *rest_path: str) -> Any:
    """A field of an ARM answer by its REST names (`"properties", "hardwareProfile", "vmSize"`), None where absent.

    azure-mgmt-compute's models are mappings over the JSON ARM answered: read as such, a field costs a dict lookup,
    where the model's attribute (`vm.hardware_profile.vm_size`) serialises and deserialises the value again on every
    access; at 10,000 VMs a listing spent more time in those attributes than in its HTTP (BENCHMARKS.md, "Azure
    listing"). A model that is no mapping (an older SDK) is read by attribute, its flattened `properties` skipped."""
    for key in rest_path:
        if model is None:
            return None
        if isinstance(model, Mapping):
            model = model.get(key)
        elif key != "properties":
            model = getattr(model, _SNAKE.sub(r"_\1", key).lower(), None)
    return model


_SNAKE = re.compile(r"(?<=[a-z0-9])([A-Z])")


def _time(value: Any) -> datetime | None:
    """An ARM timestamp (`timeCreated`: ISO 8601, up to 7 decimals as .NET writes them), or one the SDK parsed."""
    if isinstance(value, datetime) or value is None:
        return value
    text = str(value).strip().replace("Z", "+00:00")
    # Python reads at most 6 decimals: .NET writes 7.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def default_credential(settings: AzureSettings | None = None) -> Any:
    """Credentials from the environment only, in this order: a service principal (AZURE_TENANT_ID, AZURE_CLIENT_ID
    and AZURE_CLIENT_SECRET or AZURE_CLIENT_CERTIFICATE_PATH), workload identity (AZURE_FEDERATED_TOKEN_FILE), the
    VM's or pod's managed identity. Never an interactive login, never a developer's CLI session in a service. A
    variable set but blank is an error (never a silent fall to the next credential)."""
    from azure.identity import (ChainedTokenCredential, EnvironmentCredential, ManagedIdentityCredential,
                                WorkloadIdentityCredential)

    blank = [name for name in ("AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET",
                               "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_FEDERATED_TOKEN_FILE")
             if name in os.environ and not os.environ[name].strip()]
    if blank:
        raise ConfigError(f"Azure credentials: the environment variable {', '.join(blank)} is set but blank")
    options: dict[str, Any] = {}
    if settings is not None and settings.authority_host:
        options.update(authority=settings.authority_host, disable_instance_discovery=True)
    if settings is not None and settings.ca_file:
        options["connection_verify"] = settings.ca_file
    chain = [EnvironmentCredential(**options)]
    if os.environ.get("AZURE_FEDERATED_TOKEN_FILE"):
        chain.append(WorkloadIdentityCredential(**options))
    chain.append(ManagedIdentityCredential())
    return ChainedTokenCredential(*chain)


def azure_cloud(settings: Any, credential: Any = None) -> AzureCloud | None:
    """The Azure place of `settings.azure`; None without an `azure:` section."""
    if getattr(settings, "azure", None) is None:
        return None
    return AzureCloud(settings.azure, credential)


class WithAzure(WithPlace):
    """Another inventory (EC2, or None where no `aws:` section is configured) and the Azure VMs ("azure:" ids)."""

    def __init__(self, other: Any, azure: AzureCloud):
        super().__init__(other, azure, prefix=AZURE_ID_PREFIX, name="Azure", brief=_brief)
        self.azure = azure
