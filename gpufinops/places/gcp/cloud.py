"""Compute Engine GPU VMs behind the `Cloud` protocol, through the official client (`google-cloud-compute`, REST).

Only the act stage calls the mutating methods (set_tags, set_tags_fenced, remove_tags, stop, suspend). Nothing is decided here, and a zone or
project that cannot be listed never hides the others.

API methods called (the custom role in deploy/gcp/gpufinops-role.yaml grants each one's permission;
tests/places/gcp/test_gcp_cloud.py checks every request a test makes against it): instances.aggregatedList
(compute.instances.list), instances.get (compute.instances.get), instances.setLabels (compute.instances.setLabels),
instances.stop (compute.instances.stop), instances.suspend (compute.instances.suspend, a rule with action
suspend), zoneOperations.get (compute.zoneOperations.get).

A VM's id says the cloud and where it is: `gce:<project>/<zone>/<name>`; its numeric id is kept as `cloud_id` (Google's
bill names a VM by it: model.gce_vm_id, gce_ids). Its labels are read as gpufinops's tags
(places/gcp/labels.py), its state as EC2's words (RUNNING is "running", STOPPING and SUSPENDING "stopping",
TERMINATED and SUSPENDED "stopped"), so that every stage reads a VM as it reads an EC2 instance.

Reads try again on a 429 (waiting its Retry-After), a 5xx or a dropped connection, `read_attempts` in all, each
failed attempt logged at once. Mutating calls are sent once (retry off): a label write re-reads the VM and sends
its current `labelFingerprint`, so that a person's label change since that read makes GCE refuse ours (412) rather
than be overwritten (`set_tags_fenced`, the fence before a stop, also refuses once the labels differ from those of
an earlier read: act.actuator._fence); a stop's or a suspend's zone operation is polled until DONE. A failure says whether GCE certainly did nothing
(`GceError.definite`) or its fate is unknown (the actuator reads the VM back).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence

from gpufinops.config import GcpSettings
from gpufinops.model import GCE_ID_PREFIX, Clock, GpuInstance, utcnow
from gpufinops.prices.catalog import Catalog

from ..registry import TAG_GCE_ZONE, UNSUPPORTED_MARK
from .labels import labels_to_tags, tags_to_labels
from .machines import ACCELERATOR_TYPES, gpus_of, is_accelerator_type

log = logging.getLogger(__name__)

ID_PREFIX = GCE_ID_PREFIX  # model.gce_vm_id writes the same id from a bill
PROVIDER = "gcp"

# GCE's instance status in the words every stage reads (EC2's): a VM stopping or suspended no longer bills its GPUs.
STATES = {
    "PROVISIONING": "pending", "STAGING": "pending", "RUNNING": "running", "STOPPING": "stopping",
    "SUSPENDING": "stopping", "SUSPENDED": "stopped", "TERMINATED": "stopped", "REPAIRING": "repairing",
}
# Each poll of a running operation waits this long (capped by what is left of operation_timeout_s).
OPERATION_POLL_S = 2.0
# A Retry-After longer than this is not waited for within a tick: the read fails, the tick reports it.
MAX_RETRY_AFTER_S = 30.0
REQUEST_TIMEOUT_S = 30.0
REQUEST_MARGIN_S = 30.0

ADVICE_MIG = ("resize the managed instance group (`gcloud compute instance-groups managed resize --size`) or set "
              "its autoscaler's minimum; the group recreates or restarts a member it did not stop itself")
ADVICE_GKE = "let the GKE cluster autoscaler remove the node (scale the node pool down); scale the workload down"
ADVICE_DATAPROC = "scale the Dataproc cluster's workers down or delete the cluster when its jobs are done"


class GceError(RuntimeError):
    """A Compute Engine call failed; the message names the method and the VM. `definite`: GCE certainly did not do
    it (a 4xx refusal, a 412 stale fingerprint, a throttle, never sent); else its fate is unknown (read it back)."""

    def __init__(self, method: str, subject: str, cause: BaseException | str, *, definite: bool | None = None):
        certain, why = fate_of(cause) if isinstance(cause, BaseException) else (False, str(cause))
        # GCE's reasons for a refusal ("unsupportedOperation"), as the answer's `errors` list gives them.
        self.reasons = tuple(str(e.get("reason", "")) for e in getattr(cause, "errors", None) or []
                             if isinstance(e, dict))
        self.method = method
        self.definite = certain if definite is None else definite
        self.fate = why
        unsupported = self.definite and (UNSUPPORTED in why or "unsupportedOperation" in self.reasons)
        super().__init__(f"{method} {subject} failed: {why}"
                         f" [{'not done' if self.definite else 'outcome unknown'}]"
                         + (f" {UNSUPPORTED_MARK}" if unsupported else ""))


UNSUPPORTED = "UNSUPPORTED_OPERATION"  # GCE's code for an operation a VM does not support (an operation's error)


class InventoryError(RuntimeError):
    """No trustworthy answer: every project failed (listing) or a VM could not be read (describe)."""


def status_of(exc: BaseException) -> int:
    """The HTTP status of a google.api_core error (0 when there is none)."""
    code = getattr(exc, "code", None)
    return int(code) if isinstance(code, int) else 0


def fate_of(exc: BaseException) -> tuple[bool, str]:
    """(definite, why): definite only when the call certainly did NOT take effect. A 4xx answer (a 412 stale
    fingerprint, a 403, a 429 throttle) is a refusal and a connection never opened sent nothing; a 5xx, a read
    timeout or a connection closed after sending leave the fate unknown."""
    import requests

    status = status_of(exc)
    message = str(getattr(exc, "message", "") or exc)[:300]
    if 400 <= status < 500:
        return True, f"refused by GCE (HTTP {status}: {message})"
    if status >= 500:
        return False, f"GCE answered HTTP {status} ({message}): it may or may not have done it"
    if isinstance(exc, (requests.exceptions.ConnectTimeout, requests.exceptions.InvalidURL)):
        return True, f"never sent ({type(exc).__name__})"
    if isinstance(exc, requests.exceptions.ConnectionError) and "NewConnectionError" in repr(exc):
        return True, "never sent (the connection could not be opened)"
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return False, "no answer before the read timeout: it may or may not have been done"
    if isinstance(exc, requests.exceptions.ConnectionError):
        return False, "the connection closed after the request was sent: it may or may not have been done"
    return False, f"{type(exc).__name__}: {message}: the outcome is unknown"


def retry_after_s(exc: BaseException) -> float | None:
    """A 429's Retry-After in seconds (delta-seconds form), None when it has none."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    try:
        return max(0.0, float(headers.get("Retry-After")))
    except (TypeError, ValueError):
        return None


def is_transient(exc: BaseException) -> bool:
    """A read worth trying again: throttled, a 5xx, or the connection failed."""
    import requests

    status = status_of(exc)
    return status == 429 or status >= 500 or isinstance(exc, requests.exceptions.RequestException)


def subject_id(project: str, zone: str, name: str) -> str:
    return f"{ID_PREFIX}{project}/{zone}/{name}"


def gce_ids(instances: Sequence[GpuInstance]) -> dict[str, str]:
    """Numeric id -> subject id of listed GCE VMs: what model.resolve_gce_ids needs to turn a bill's
    `gce-unlisted:` id into the VM's."""
    return {i.cloud_id: i.instance_id for i in instances if i.cloud_id and i.instance_id.startswith(ID_PREFIX)}


def parse_subject(instance_id: str) -> tuple[str, str, str] | None:
    """(project, zone, name) of a `gce:` id; None for any other."""
    if not instance_id.startswith(ID_PREFIX):
        return None
    parts = instance_id[len(ID_PREFIX):].split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 and all(parts) else None


def tail(url: str) -> str:
    """The last segment of a GCE resource URL (".../zones/us-central1-a" -> "us-central1-a")."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone


def parse_timestamp(text: str) -> datetime | None:
    """GCE's RFC 3339 timestamps ("2026-12-07T01:15:00.123-08:00") in UTC; None when absent or unreadable."""
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


@dataclass(frozen=True)
class Manager:
    by: str
    advice: str


def manager_of(labels: Mapping[str, str], metadata: Mapping[str, str]) -> Manager | None:
    """Who else owns a VM's lifecycle: a managed instance group (its `created-by` metadata names it), GKE, Dataproc
    (their labels); None when nothing says so."""
    created_by = metadata.get("created-by", "")
    if "/instanceGroupManagers/" in created_by:
        where = created_by.split("/zones/")[-1].split("/regions/")[-1].split("/")[0]
        return Manager(f"managed instance group '{tail(created_by)}' ({where})", ADVICE_MIG)
    cluster = labels.get("goog-k8s-cluster-name") or metadata.get("cluster-name", "")
    if cluster or "goog-gke-node" in labels:
        pool = labels.get("goog-k8s-node-pool-name", "")
        return Manager(f"GKE cluster '{cluster or '?'}'" + (f" node pool '{pool}'" if pool else ""), ADVICE_GKE)
    if labels.get("goog-dataproc-cluster-name"):
        return Manager(f"Dataproc cluster '{labels['goog-dataproc-cluster-name']}'", ADVICE_DATAPROC)
    return None


@dataclass(frozen=True)
class ListingError:
    """A project or zone that could not be listed in the last list_gpu_instances()."""

    scope: str  # "ml-prod" or "ml-prod/zones/us-east4-b"
    message: str

    def __str__(self) -> str:
        return f"GCE {self.scope}: {self.message}"


def _default_credentials(settings: GcpSettings):
    token = settings.access_token.resolve()
    if token:
        from google.oauth2.credentials import Credentials

        return Credentials(token=token)
    import google.auth

    credentials, _project = google.auth.default(scopes=["https://www.googleapis.com/auth/compute"])
    return credentials


class GceCloud:
    """The `Cloud` protocol over Compute Engine (or its stand-in). list_gpu_instances() lists every configured
    project, every zone in one aggregated, paged listing; a project or zone that fails is in `last_errors` and the
    others are listed; all of them failing raises InventoryError (an empty list would read as "no GPU VMs")."""

    def __init__(self, settings: GcpSettings, *, credentials: Any = None, catalog: Catalog | None = None,
                 clock: Clock = utcnow, sleep: Callable[[float], None] = time.sleep,
                 request_timeout_s: float = REQUEST_TIMEOUT_S, poll_s: float = OPERATION_POLL_S):
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

        self.settings = settings
        options = ClientOptions(api_endpoint=settings.api_endpoint) if settings.api_endpoint else None
        credentials = credentials if credentials is not None else _default_credentials(settings)
        self._instances = compute_v1.InstancesClient(credentials=credentials, transport="rest",
                                                     client_options=options)
        self._operations = compute_v1.ZoneOperationsClient(credentials=credentials, transport="rest",
                                                           client_options=options)
        self._compute = compute_v1
        self._catalog = catalog
        self._clock = clock
        self._sleep = sleep
        self._timeout = request_timeout_s
        self._poll_s = poll_s
        # The longest a mutating call may take to land: its request, then its operation polled to DONE. A stop not
        # seen done before is settled by reconcile only after it.
        self.max_request_s = request_timeout_s + settings.operation_timeout_s + REQUEST_MARGIN_S
        self.last_errors: list[ListingError] = []
        self.last_retries = 0

    # ------------------------------------------------------------------ reads
    def _read(self, what: str, call: Callable[[], Any]) -> Any:
        """A read, tried again on a throttle, a 5xx or a dropped connection (Retry-After waited when given)."""
        attempts = self.settings.read_attempts
        for attempt in range(1, attempts + 1):
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - classified below; anything final is raised as it is
                if not is_transient(exc) or attempt == attempts:
                    raise
                wait = retry_after_s(exc)
                if wait is not None and wait > MAX_RETRY_AFTER_S:
                    raise
                wait = min(2.0 ** (attempt - 1), 8.0) if wait is None else wait
                self.last_retries += 1
                log.warning("GCE %s: attempt %d of %d failed (%s); trying again in %.0f s", what, attempt,
                            attempts, fate_of(exc)[1], wait)
                self._sleep(wait)
        raise AssertionError("unreachable")

    @property
    def complete(self) -> bool:
        return not self.last_errors

    def list_gpu_instances(self) -> list[GpuInstance]:
        errors: list[ListingError] = []
        found: list[GpuInstance] = []
        self.last_retries = 0
        for project in self.settings.projects:
            try:
                vms, unreachable = self._read(f"instances.aggregatedList of {project}",
                                              lambda project=project: self._list_project(project))
            except Exception as exc:  # noqa: BLE001 - the other projects are still listed
                log.error("GCE inventory of project %s failed: %s", project, fate_of(exc)[1])
                errors.append(ListingError(project, fate_of(exc)[1]))
                continue
            errors.extend(unreachable)
            found.extend(vms)
        self.last_errors = errors
        if errors and len(errors) >= len(self.settings.projects) and not found and all(
                "/zones/" not in e.scope for e in errors):
            raise InventoryError("GCE inventory failed in every project: " + "; ".join(map(str, errors)))
        return found

    def _list_project(self, project: str) -> tuple[list[GpuInstance], list[ListingError]]:
        request = self._compute.AggregatedListInstancesRequest(project=project, max_results=self.settings.page_size)
        vms: list[GpuInstance] = []
        unreachable: list[ListingError] = []
        for scope, scoped in self._instances.aggregated_list(request=request, timeout=self._timeout, retry=None):
            warning = scoped.warning.code if "warning" in scoped else ""
            if warning == "UNREACHABLE":
                log.error("GCE %s/%s unreachable: its VMs are not listed this run", project, scope)
                unreachable.append(ListingError(f"{project}/{scope}", "unreachable"))
                continue
            for vm in scoped.instances:
                inst = self._to_gpu_instance(project, vm)
                if inst is not None:
                    vms.append(inst)
        return vms, unreachable

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        """Fresh state and labels of these VMs (absent: gone). Any VM that cannot be read raises InventoryError: an
        unreadable VM is never taken for a vanished one."""
        from google.api_core.exceptions import NotFound

        out = []
        for iid in dict.fromkeys(instance_ids):
            where = parse_subject(iid)
            if where is None:
                continue
            try:
                vm = self._get(*where)
            except NotFound:
                continue
            except Exception as exc:  # noqa: BLE001
                raise InventoryError(f"GCE instances.get {iid} failed: {fate_of(exc)[1]}") from exc
            inst = self._to_gpu_instance(where[0], vm, gpu_or_not=False)
            if inst is not None:
                out.append(inst)
        return out

    def _get(self, project: str, zone: str, name: str):
        return self._read(f"instances.get {project}/{zone}/{name}", lambda: self._instances.get(
            project=project, zone=zone, instance=name, timeout=self._timeout, retry=None))

    def _to_gpu_instance(self, project: str, vm, *, gpu_or_not: bool = True) -> GpuInstance | None:
        zone = tail(vm.zone)
        machine_type = tail(vm.machine_type)
        attached = [(tail(a.accelerator_type), int(a.accelerator_count)) for a in vm.guest_accelerators]
        gpus = gpus_of(machine_type, attached)
        if gpus is None and gpu_or_not:
            return None
        labels = dict(vm.labels)
        metadata = {item.key: item.value for item in vm.metadata.items}
        manager = manager_of(labels, metadata)
        launch = parse_timestamp(vm.last_start_timestamp) or parse_timestamp(vm.creation_timestamp)
        if launch is None:
            # Without a start time the VM cannot be known to have run a full window: judged as just started.
            log.warning("GCE VM %s/%s/%s has no start time; not judged old enough to stop", project, zone, vm.name)
            launch = self._clock()
        spot = vm.scheduling.provisioning_model == "SPOT" or bool(vm.scheduling.preemptible)
        region = region_of(zone)
        hourly, source = self._price(machine_type, region, spot, attached)
        nics = list(vm.network_interfaces)
        return GpuInstance(
            instance_id=subject_id(project, zone, vm.name),
            instance_type=machine_type,
            region=region,
            state=STATES.get(vm.status, vm.status.lower()),
            launch_time=launch,
            account=project,
            lifecycle="spot" if spot else "on-demand",
            # Its labels, and its zone under a key no label can have: what a rule selects GCE VMs by.
            tags={**labels_to_tags(labels), TAG_GCE_ZONE: zone},
            # dcgm-exporter's Hostname on a GCE VM: its short name, or the internal DNS name.
            private_dns=vm.hostname or f"{vm.name}.{zone}.c.{project}.internal",
            private_ip=nics[0].network_i_p if nics else "",
            gpu_count=gpus.count if gpus else 0,
            gpu_model=gpus.model if gpus else "",
            gpu_memory_gib=gpus.memory_gib if gpus else 0.0,
            hourly_cost=hourly,
            provider=PROVIDER,
            managed_by=manager.by if manager else "",
            managed_advice=manager.advice if manager else "",
            price_source=source,
            # Google's bill names the VM by this id (model.gce_vm_id): kept so that a bill without the name meets it.
            cloud_id=str(vm.id) if vm.id else "",
            version=vm.label_fingerprint,
        )

    def _price(self, machine_type: str, region: str, spot: bool, attached: Sequence[tuple[str, int]] = ()
               ) -> tuple[float | None, str]:
        """The VM's hourly price, spot or on-demand, and its note. An accelerator-optimised type is the bundled
        catalog's offer (VM and GPUs; another region's price is an estimate, and said so); a general-purpose type
        with attached GPUs (N1) is priced in parts, as GCE bills it: the machine type plus each GPU. Unpriced: None
        and why (never $0)."""
        if self._catalog is None:
            return None, "unpriced: no price catalog"
        attached = [(t, n) for t, n in attached if n > 0]
        if attached and not is_accelerator_type(machine_type):
            unknown = [t for t, _ in attached if t not in ACCELERATOR_TYPES]
            if unknown:
                return None, f"unpriced: its attached GPU {unknown[0]} is not in places/gcp/machines.py's table"
            licensed = [t for t, _ in attached if t.endswith("-vws")]
            if licensed:  # billed as the GPU plus an NVIDIA RTX Virtual Workstation licence the bundle lacks
                return None, f"unpriced: the virtual workstation licence of {licensed[0]} is not in the bundled prices"
            return self._catalog.price_from_parts(
                machine_type, region, [(ACCELERATOR_TYPES[t][0], n) for t, n in attached], spot)
        offer = self._catalog.offer(PROVIDER, machine_type, region)
        if offer is None:
            return None, f"unpriced: no bundled price of machine type {machine_type}"
        price = offer.spot_usd_h if spot else offer.on_demand_usd_h
        if price is None or price <= 0:
            kind = "spot" if spot else "on-demand"
            return None, f"unpriced: no {kind} price of {machine_type} in the bundled catalog"
        return price, "" if offer.region == region else f"estimate: the {offer.region} price"

    # ------------------------------------------------------------------ mutating calls (act stage only)
    def _send(self, method: str, inst: GpuInstance, call: Callable[[], Any]) -> Any:
        """One request, no retry; any failure a GceError that says whether GCE certainly did nothing."""
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - an unclassified failure is "fate unknown", never a crash
            error = GceError(method, inst.instance_id, exc)
            log.error("%s", error)
            raise error from exc

    def _wait(self, method: str, inst: GpuInstance, operation, project: str, zone: str) -> None:
        """Poll a zone operation until DONE, at most operation_timeout_s. An operation that ends in error did not
        change the VM (definite); one not seen DONE leaves the fate to the read-back."""
        deadline = time.monotonic() + self.settings.operation_timeout_s
        op = operation
        while op.status != self._compute.Operation.Status.DONE:
            if time.monotonic() >= deadline:
                raise GceError(method, inst.instance_id, f"operation {op.name} not DONE after "
                               f"{self.settings.operation_timeout_s:.0f} s (last {op.status.name})", definite=False)
            self._sleep(min(self._poll_s, max(0.0, deadline - time.monotonic())))
            try:
                op = self._read(f"zoneOperations.get {op.name}", lambda name=op.name: self._operations.get(
                    project=project, zone=zone, operation=name, timeout=self._timeout, retry=None))
            except Exception as exc:  # noqa: BLE001
                raise GceError(method, inst.instance_id, f"operation {operation.name} could not be read "
                               f"({fate_of(exc)[1]})", definite=False) from exc
        if op.error.errors:
            first = op.error.errors[0]
            raise GceError(method, inst.instance_id, f"operation {op.name} failed: {first.code}: {first.message}",
                           definite=True)

    def _where(self, inst: GpuInstance) -> tuple[str, str, str]:
        where = parse_subject(inst.instance_id)
        if where is None:
            raise GceError("instances", inst.instance_id, "not a GCE VM id", definite=True)
        return where

    def _write_labels(self, inst: GpuInstance, change: Callable[[dict[str, str]], dict[str, str]], *,
                      since: str | None = None) -> None:
        """The VM read again, its labels changed by `change`, written with the fingerprint of that read: a person's
        label change in between makes GCE refuse ours (412, definite), never lose theirs. `since`: the fingerprint
        of an earlier read the write must still stand on (the fence): labels changed after it refuse the write
        here, before anything is sent."""
        project, zone, name = self._where(inst)
        try:
            vm = self._get(project, zone, name)
        except Exception as exc:  # noqa: BLE001 - nothing was written
            raise GceError("instances.setLabels", inst.instance_id,
                           f"not sent: the VM could not be read first ({fate_of(exc)[1]})", definite=True) from exc
        if since is not None and vm.label_fingerprint != since:
            raise GceError("instances.setLabels", inst.instance_id,
                           "not sent: its labels changed since the read before the stop (labelFingerprint "
                           f"{since!r} read then, {vm.label_fingerprint!r} now)", definite=True)
        labels = change(dict(vm.labels))
        if labels == dict(vm.labels):
            return
        body = self._compute.InstancesSetLabelsRequest(labels=labels, label_fingerprint=vm.label_fingerprint)
        op = self._send("instances.setLabels", inst, lambda: self._instances.set_labels_unary(
            request=self._compute.SetLabelsInstanceRequest(
                project=project, zone=zone, instance=name, instances_set_labels_request_resource=body,
                request_id=str(uuid.uuid4())),
            timeout=self._timeout, retry=None))
        self._wait("instances.setLabels", inst, op, project, zone)

    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        if not tags:
            return
        wanted = tags_to_labels(tags)
        self._write_labels(inst, lambda labels: {**labels, **wanted})

    def set_tags_fenced(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        """The fence before a stop: these tags written only while the VM's labels are still those of the read that
        gave `inst` (its labelFingerprint, `inst.version`). A person's label change since (the mark removed, a
        snooze, protect) refuses it, definite: here when the fresh read's fingerprint differs, at GCE (412) when the
        change lands between that read and the write. Only when it went through is the stop sent."""
        if not inst.version:
            raise GceError("instances.setLabels", inst.instance_id,
                           "not sent: the read before the stop gave no labelFingerprint to fence on", definite=True)
        wanted = tags_to_labels(tags)
        self._write_labels(inst, lambda labels: {**labels, **wanted}, since=inst.version)

    def remove_tags(self, inst: GpuInstance, keys: Sequence[str]) -> None:
        if not keys:
            return
        gone = set(tags_to_labels({k: "" for k in keys}))
        self._write_labels(inst, lambda labels: {k: v for k, v in labels.items() if k not in gone})

    def stop(self, inst: GpuInstance) -> None:
        """instances.stop, local SSD data kept (discardLocalSsd false), the guest's graceful shutdown kept; its
        operation polled until DONE."""
        project, zone, name = self._where(inst)
        op = self._send("instances.stop", inst, lambda: self._instances.stop_unary(
            request=self._compute.StopInstanceRequest(project=project, zone=zone, instance=name,
                                                      discard_local_ssd=False, request_id=str(uuid.uuid4())),
            timeout=self._timeout, retry=None))
        self._wait("instances.stop", inst, op, project, zone)

    def suspend(self, inst: GpuInstance) -> None:
        """instances.suspend (a rule with action suspend), local SSD data kept (discardLocalSsd false); its operation
        polled until DONE (RUNNING -> SUSPENDING -> SUSPENDED: memory state and disks stored and billed, vCPU and
        GPU billing end). A VM GCE will not suspend (GPUs attached, too much memory, a guest without ACPI S3) is
        refused (UNSUPPORTED_OPERATION), definite, its error marked UNSUPPORTED_MARK: never a stop instead."""
        project, zone, name = self._where(inst)
        op = self._send("instances.suspend", inst, lambda: self._instances.suspend_unary(
            request=self._compute.SuspendInstanceRequest(project=project, zone=zone, instance=name,
                                                         discard_local_ssd=False, request_id=str(uuid.uuid4())),
            timeout=self._timeout, retry=None))
        self._wait("instances.suspend", inst, op, project, zone)

    def terminate(self, inst: GpuInstance) -> None:
        # The registry never gives a GCE VM this action (places.registry.GCE takes notify and stop): a VM is never
        # deleted by gpufinops. Refused here too, before any request.
        raise GceError("instances.delete", inst.instance_id, "gpufinops never deletes a GCE VM", definite=True)
