"""A stand-in Azure Resource Manager on 127.0.0.1 (https, a self-signed certificate) for the Azure place's tests.

No compute emulator exists for Azure, so this speaks the exact REST subset gpufinops's official clients call
(azure-mgmt-compute, azure-mgmt-resource), with requests and answers shaped as the Azure REST API specs say
(specification/compute/.../ComputeRP/stable/*/virtualMachine.json, resources/.../tags):

- GET  /subscriptions/{s}/providers/Microsoft.Compute/virtualMachines             list, paged by `nextLink`
       (...&statusOnly=true: each VM's `properties.instanceView` only)
- GET  /subscriptions/{s}/resourceGroups/{g}/providers/Microsoft.Compute/virtualMachines/{n}[?$expand=instanceView]
- GET  /subscriptions/{s}/providers/Microsoft.Compute/virtualMachineScaleSets              list, paged by `nextLink`
       (virtualMachineScaleSet.json: `sku` {name, tier, capacity}, `properties.orchestrationMode`,
       `properties.virtualMachineProfile` {osProfile.computerNamePrefix, priority})
- GET  /subscriptions/{s}/resourceGroups/{g}/providers/Microsoft.Compute/virtualMachineScaleSets/{n}
- GET  {scale set id}/virtualMachines[?$expand=instanceView]    a Uniform set's instances, paged by `nextLink`
       (virtualMachineScaleSetVM.json: `instanceId`, `sku`, `properties.osProfile.computerName`, the instance view)
- GET  {scale set id}/virtualMachines/{instanceId}[?$expand=instanceView]
- PATCH {vm id}/providers/Microsoft.Resources/tags/default   {"operation": "Merge"|"Delete"|"Replace", ...}
- POST {vm id}/deallocate, {vm id}/powerOff[?skipShutdown=false]   202 + Azure-AsyncOperation + Location
       (long-running operations)
- GET  /subscriptions/{s}/providers/Microsoft.Compute/locations/{l}/operations/{id}   {"status": "InProgress"...}
       (...?monitor=true: the Location header's URL, 202 while running, 200 when done)

The power states move as ARM's do, over real time: deallocate makes a running VM "deallocating" for
`transition_s`, then "deallocated"; powerOff "stopping" then "stopped" (allocated: still billed). A person's
changes are `person_*` calls (no HTTP, as from the portal). Every request needs the bearer token, is checked against
the custom roles assigned (`role`: deploy/azure/gpufinops-role.json, or a list of roles, e.g. that one and the
optional gpufinops-power-off-role.json: ARM grants what any assigned role grants; a request outside them gets ARM's
403 AuthorizationFailed and is not carried out) and is recorded (`requests`). Faults are armed per request
(`arm(predicate, mode, ...)`): `status` (answer it without acting: 429 + Retry-After, 503), `after_effect` (act,
then answer 500: the answer is lost), `drop` (act, then close the connection unanswered), `hook` (call a function
before the request is handled: a person's last-second change).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

TOKEN = "armstub-token"
CLIENT_SECRET = "armstub-client-secret"
COMPUTE = "Microsoft.Compute/virtualMachines"
SCALE_SETS = "Microsoft.Compute/virtualMachineScaleSets"
POWER_WORDS = {"running": "VM running", "deallocated": "VM deallocated", "stopped": "VM stopped",
               "deallocating": "VM deallocating", "stopping": "VM stopping", "starting": "VM starting"}


def statuses_of(power: str, created: str) -> list[dict[str, Any]]:
    """An instance view's statuses, as ARM writes them for a VM and a scale set's instance alike."""
    return [{"code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Provisioning succeeded",
             "time": created},
            {"code": f"PowerState/{power}", "level": "Info", "displayStatus": POWER_WORDS.get(power, power)}]


@dataclass
class Vm:
    subscription: str
    group: str
    name: str
    size: str
    location: str = "eastus"
    power: str = "running"  # running | deallocating | deallocated | stopping | stopped | starting
    tags: dict[str, str] = field(default_factory=dict)
    priority: str = "Regular"
    scale_set: str = ""  # a Flexible scale set's name
    computer_name: str = ""
    created: str = "2026-11-01T08:00:00Z"
    version: int = 1  # the ETag's counter
    # (to_state, at monotonic time) of a transition under way.
    pending: tuple[str, float] | None = None

    @property
    def arm_id(self) -> str:
        return f"/subscriptions/{self.subscription}/resourceGroups/{self.group}/providers/{COMPUTE}/{self.name}"

    def settle(self) -> None:
        if self.pending and time.monotonic() >= self.pending[1]:
            self.power, self.pending = self.pending[0], None

    def statuses(self) -> list[dict[str, Any]]:
        return statuses_of(self.power, self.created)

    def body(self, instance_view: bool = False) -> dict[str, Any]:
        props: dict[str, Any] = {
            "vmId": str(uuid.uuid5(uuid.NAMESPACE_URL, self.arm_id)),
            "hardwareProfile": {"vmSize": self.size},
            "osProfile": {"computerName": self.computer_name or self.name, "adminUsername": "azureuser"},
            "provisioningState": "Succeeded",
            "timeCreated": self.created,
            "priority": self.priority,
        }
        if self.priority == "Spot":
            props["evictionPolicy"] = "Deallocate"
        if self.scale_set:
            props["virtualMachineScaleSet"] = {
                "id": f"/subscriptions/{self.subscription}/resourceGroups/{self.group}/providers/"
                      f"Microsoft.Compute/virtualMachineScaleSets/{self.scale_set}"}
        if instance_view:
            props["instanceView"] = {"computerName": self.computer_name or self.name, "statuses": self.statuses()}
        out = {"id": self.arm_id, "name": self.name, "type": COMPUTE, "location": self.location,
               "etag": f'"{self.version}"', "properties": props}
        if self.tags:
            out["tags"] = dict(self.tags)
        return out


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


@dataclass
class ScaleSet:
    """A scale set and its instances (`powers`: one power state per instance, instance ids 0, 1, ...). Its instances'
    computer names are ARM's: the prefix and the instance id in base 36 on six digits (`aks-gpu-1234-vmss000000`)."""
    subscription: str
    group: str
    name: str
    size: str
    powers: list[str] = field(default_factory=lambda: ["running"])
    location: str = "eastus"
    tags: dict[str, str] = field(default_factory=dict)
    priority: str = "Regular"
    orchestration: str = "Uniform"  # Uniform | Flexible ("" : an older set that does not say, Uniform)
    computer_prefix: str = ""
    created: str = "2026-11-01T08:00:00Z"

    @property
    def arm_id(self) -> str:
        return f"/subscriptions/{self.subscription}/resourceGroups/{self.group}/providers/{SCALE_SETS}/{self.name}"

    def computer_name(self, instance: int) -> str:
        return f"{self.computer_prefix or self.name}{_base36(instance).rjust(6, '0')}"

    def body(self) -> dict[str, Any]:
        profile: dict[str, Any] = {"osProfile": {"computerNamePrefix": self.computer_prefix or self.name,
                                                 "adminUsername": "azureuser"},
                                   "storageProfile": {"osDisk": {"createOption": "FromImage"}}}
        if self.priority != "Regular":
            profile |= {"priority": self.priority, "evictionPolicy": "Delete"}
        props: dict[str, Any] = {"upgradePolicy": {"mode": "Manual"}, "virtualMachineProfile": profile,
                                 "provisioningState": "Succeeded", "overprovision": False,
                                 "uniqueId": str(uuid.uuid5(uuid.NAMESPACE_URL, self.arm_id)),
                                 "timeCreated": self.created}
        if self.orchestration:
            props["orchestrationMode"] = self.orchestration
        out = {"id": self.arm_id, "name": self.name, "type": SCALE_SETS, "location": self.location,
               "sku": {"name": self.size, "tier": "Standard", "capacity": len(self.powers)}, "properties": props}
        if self.tags:
            out["tags"] = dict(self.tags)
        return out

    def instance_body(self, instance: int, instance_view: bool = False) -> dict[str, Any]:
        arm_id = f"{self.arm_id}/virtualMachines/{instance}"
        props: dict[str, Any] = {
            "latestModelApplied": True, "vmId": str(uuid.uuid5(uuid.NAMESPACE_URL, arm_id)),
            "osProfile": {"computerName": self.computer_name(instance), "adminUsername": "azureuser"},
            "provisioningState": "Succeeded", "timeCreated": self.created}
        if instance_view:
            props["instanceView"] = {"platformUpdateDomain": 0, "platformFaultDomain": 0,
                                     "computerName": self.computer_name(instance), "osName": "ubuntu",
                                     "statuses": statuses_of(self.powers[instance], self.created)}
        return {"id": arm_id, "name": f"{self.name}_{instance}", "type": f"{SCALE_SETS}/virtualMachines",
                "location": self.location, "instanceId": str(instance), "sku": {"name": self.size, "tier": "Standard"},
                "properties": props}


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    action: str  # the ARM operation (role action) the request needs
    status: int = 0
    body: Any = None
    denied: bool = False  # refused by the role


@dataclass
class Fault:
    match: Callable[[Seen], bool]
    mode: str  # status | after_effect | drop | hook
    status: int = 503
    retry_after: int | None = None
    hook: Callable[[Seen], None] | None = None
    times: int = 1


def operation_of(method: str, path: str) -> str:
    """The role action an ARM request needs (Microsoft's resource provider operations)."""
    low = path.lower()
    if "/providers/microsoft.resources/tags/" in low:
        return "Microsoft.Resources/tags/write" if method in ("PATCH", "PUT", "DELETE") else \
            "Microsoft.Resources/tags/read"
    if "/providers/microsoft.compute/locations/" in low and "/operations/" in low:
        return "Microsoft.Compute/locations/operations/read"
    if "/providers/microsoft.compute/virtualmachinescalesets" in low:
        # A scale set, or one of its instances (".../virtualMachines/{id}"): their own operations, never a VM's.
        kind = SCALE_SETS + ("/virtualMachines" if "/virtualmachines" in low.split("virtualmachinescalesets", 1)[1]
                             else "")
        if method == "POST":
            return f"{kind}/{path.rsplit('/', 1)[1]}/action"
        return {"GET": f"{kind}/read", "DELETE": f"{kind}/delete"}.get(method, f"{kind}/write")
    if low.endswith("/deallocate"):
        return "Microsoft.Compute/virtualMachines/deallocate/action"
    if low.endswith("/poweroff"):
        return "Microsoft.Compute/virtualMachines/powerOff/action"
    if low.endswith("/start"):
        return "Microsoft.Compute/virtualMachines/start/action"
    if "/providers/microsoft.compute/virtualmachines" in low:
        return {"GET": "Microsoft.Compute/virtualMachines/read", "DELETE": "Microsoft.Compute/virtualMachines/delete"
                }.get(method, "Microsoft.Compute/virtualMachines/write")
    return f"?{method} {path}"


def role_allows(role: dict[str, Any] | list[dict[str, Any]], action: str) -> bool:
    """ARM's test of a role definition's Actions / NotActions (wildcards, case-insensitive); of several roles
    assigned, any one that grants it."""
    if isinstance(role, list):
        return any(role_allows(r, action) for r in role)
    perms = role.get("permissions") or [{"actions": role.get("Actions", []), "notActions": role.get("NotActions", [])}]
    for p in perms:
        actions = p.get("actions", p.get("Actions", []))
        not_actions = p.get("notActions", p.get("NotActions", []))
        if any(fnmatch.fnmatch(action.lower(), a.lower()) for a in actions) and \
                not any(fnmatch.fnmatch(action.lower(), n.lower()) for n in not_actions):
            return True
    return False


class ArmStub:
    def __init__(self, tmp: Path, *, role: dict[str, Any] | list[dict[str, Any]] | None = None, page_size: int = 2,
                 transition_s: float = 0.3):
        self.vms: dict[str, Vm] = {}
        self.scale_sets: dict[str, ScaleSet] = {}
        self.role = role
        self.page_size = page_size
        self.transition_s = transition_s
        self.requests: list[Seen] = []
        self.faults: list[Fault] = []
        self.operations: dict[str, tuple[str, float]] = {}  # id -> (vm id, done at)
        self.lock = threading.RLock()
        self.ca_file = str(tmp / "armstub-ca.pem")
        cert, key = _self_signed(tmp)
        handler = _handler(self)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ the fleet and a person's hand
    def add(self, vm: Vm) -> Vm:
        with self.lock:
            self.vms[vm.arm_id.lower()] = vm
        return vm

    def add_scale_set(self, scale_set: ScaleSet) -> ScaleSet:
        with self.lock:
            self.scale_sets[scale_set.arm_id.lower()] = scale_set
        return scale_set

    def vm(self, name: str) -> Vm:
        with self.lock:
            [found] = [v for v in self.vms.values() if v.name == name]
            found.settle()
            return found

    def person_sets_tags(self, name: str, **tags: str) -> None:
        with self.lock:
            vm = self.vm(name)
            vm.tags.update(tags)
            vm.version += 1

    def person_removes_tag(self, name: str, key: str) -> None:
        with self.lock:
            vm = self.vm(name)
            vm.tags.pop(key, None)
            vm.version += 1

    def person_sets_power(self, name: str, power: str) -> None:
        with self.lock:
            vm = self.vm(name)
            vm.power, vm.pending = power, None
            vm.version += 1

    # ------------------------------------------------------------------ faults and what was seen
    def arm(self, match: Callable[[Seen], bool], mode: str, **kw: Any) -> None:
        self.faults.append(Fault(match, mode, **kw))

    def seen(self, action: str | None = None) -> list[Seen]:
        return [s for s in self.requests if action is None or s.action == action]

    def denied(self) -> list[Seen]:
        """The requests the role refused (an injected 403 is not one)."""
        return [s for s in self.requests if s.denied]

    def _fault_for(self, seen: Seen) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.times > 0 and f.match(seen):
                    f.times -= 1
                    return f
        return None


# ---------------------------------------------------------------------- the HTTP side


def _handler(stub: ArmStub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: with Nagle on, the body waits for the client's delayed ACK of the
        # headers (40 ms a request on Linux), which a benchmark would count as the listing's time. ARM does not.
        disable_nagle_algorithm = True

        def log_message(self, *_args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _answer(self, seen: Seen, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
            seen.status = status
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("x-ms-request-id", str(uuid.uuid4()))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, seen: Seen, status: int, code: str, message: str, headers: dict[str, str] | None = None):
            self._answer(seen, status, {"error": {"code": code, "message": message}}, headers)

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            seen = Seen(method, parts.path, parse_qs(parts.query), operation_of(method, parts.path))
            try:
                seen.body = json.loads(raw) if raw else None
            except ValueError:
                seen.body = raw
            stub.requests.append(seen)
            if "/oauth2/v2.0/token" in parts.path or parts.path.endswith("/.well-known/openid-configuration"):
                seen.action = "Entra ID sign-in"
                return self._answer(seen, *_entra(stub, seen, raw))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._error(seen, 401, "AuthenticationFailed", "the bearer token is missing or wrong")
            if "api-version" not in seen.query and "$skiptoken" not in seen.query:
                return self._error(seen, 400, "MissingApiVersionParameter", "api-version is required")
            if stub.role is not None and not role_allows(stub.role, seen.action):
                seen.denied = True
                return self._error(seen, 403, "AuthorizationFailed",
                                   f"The client does not have authorization to perform action '{seen.action}'")
            fault = stub._fault_for(seen)
            if fault is not None and fault.mode == "hook" and fault.hook is not None:
                fault.hook(seen)
                fault = None
            if fault is not None and fault.mode == "status":
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                code = {429: "TooManyRequests", 403: "AuthorizationFailed", 404: "ResourceNotFound", 409: "Conflict",
                        412: "PreconditionFailed"}.get(fault.status, "InternalServerError")
                return self._error(seen, fault.status, code, "injected", headers)
            with stub.lock:
                status, body, headers = _route(stub, seen, self.headers)
            if fault is not None and fault.mode == "after_effect":
                return self._error(seen, 500, "InternalServerError", "the answer was lost after the effect")
            if fault is not None and fault.mode == "drop":
                seen.status = -1
                self.close_connection = True
                self.connection.shutdown(2)
                return None
            self._answer(seen, status, body, headers)

    return Handler


def _route(stub: ArmStub, seen: Seen, headers: Any) -> tuple[int, Any, dict[str, str]]:
    path = seen.path
    low = path.lower()
    segs = path.strip("/").split("/")
    for vm in stub.vms.values():
        vm.settle()
    if "/providers/microsoft.compute/locations/" in low and "/operations/" in low:
        op = segs[-1]
        if op not in stub.operations:
            return 404, {"error": {"code": "NotFound", "message": "no such operation"}}, {}
        _vm, done_at = stub.operations[op]
        done = time.monotonic() >= done_at
        if seen.query.get("monitor"):
            return (200, None, {}) if done else (202, None, {"Retry-After": "0", "Location": _url(stub, seen)})
        return 200, {"name": op, "status": "Succeeded" if done else "InProgress",
                     "startTime": _now()} | ({"endTime": _now()} if done else {}), {}
    if low.endswith("/providers/microsoft.resources/tags/default"):
        vm = stub.vms.get(path[: low.index("/providers/microsoft.resources/tags/")].lower())
        if vm is None:
            return 404, {"error": {"code": "ResourceNotFound", "message": "no such VM"}}, {}
        body = seen.body or {}
        operation = body.get("operation")
        given = (body.get("properties") or {}).get("tags") or {}
        if operation == "Merge":
            vm.tags.update(given)
        elif operation == "Delete":
            # Names with their values: a pair is deleted where both match (ARM's "name/value pairs").
            for k, v in given.items():
                if k in vm.tags and (vm.tags[k] == v):
                    del vm.tags[k]
        elif operation == "Replace":
            vm.tags = dict(given)
        else:
            return 400, {"error": {"code": "InvalidTagOperation", "message": f"operation {operation!r}"}}, {}
        vm.version += 1
        return 200, {"id": f"{vm.arm_id}/providers/Microsoft.Resources/tags/default", "name": "default",
                     "type": "Microsoft.Resources/tags", "properties": {"tags": dict(vm.tags)}}, {}
    if seen.method == "POST" and (low.endswith("/deallocate") or low.endswith("/poweroff")):
        vm = stub.vms.get(path.rsplit("/", 1)[0].lower())
        if vm is None:
            return 404, {"error": {"code": "ResourceNotFound", "message": "no such VM"}}, {}
        deallocate = low.endswith("/deallocate")
        if not deallocate and (seen.query.get("skipShutdown") or ["false"])[0] not in ("true", "false"):
            return 400, {"error": {"code": "InvalidParameter", "message": "skipShutdown must be true or false"}}, {}
        if vm.power in ("starting",):
            return 409, {"error": {"code": "OperationNotAllowed", "message": "the VM is starting"}}, {}
        if deallocate and vm.power not in ("deallocated", "deallocating"):
            vm.power, vm.pending = "deallocating", ("deallocated", time.monotonic() + stub.transition_s)
        elif not deallocate and vm.power == "running":
            vm.power, vm.pending = "stopping", ("stopped", time.monotonic() + stub.transition_s)
        vm.version += 1
        op = str(uuid.uuid4())
        stub.operations[op] = (vm.arm_id, time.monotonic() + stub.transition_s)
        base = f"{stub.url}/subscriptions/{vm.subscription}/providers/Microsoft.Compute/locations/{vm.location}/" \
               f"operations/{op}?api-version={seen.query['api-version'][0]}"
        return 202, None, {"Azure-AsyncOperation": base, "Location": base + "&monitor=true", "Retry-After": "0"}
    if "/providers/microsoft.compute/virtualmachinescalesets" in low:
        return _scale_set_route(stub, seen)
    if seen.method == "GET" and len(segs) == 5 and low.endswith("/providers/microsoft.compute/virtualmachines"):
        sub = segs[1].lower()
        every = [v for k, v in sorted(stub.vms.items()) if v.subscription.lower() == sub]
        start = int((seen.query.get("$skiptoken") or ["0"])[0])
        page = every[start: start + stub.page_size]
        status_only = (seen.query.get("statusOnly") or [""])[0] == "true"
        value = []
        for v in page:
            if status_only:
                value.append({"id": v.arm_id, "name": v.name, "type": COMPUTE, "location": v.location,
                              "properties": {"instanceView": {"statuses": v.statuses()}}})
            else:
                value.append(v.body())
        out: dict[str, Any] = {"value": value}
        if start + stub.page_size < len(every):
            query = "&".join(f"{k}={vs[0]}" for k, vs in seen.query.items() if k != "$skiptoken")
            out["nextLink"] = f"{stub.url}{path}?{query}&$skiptoken={start + stub.page_size}"
        return 200, out, {}
    if seen.method == "GET" and "/providers/microsoft.compute/virtualmachines/" in low:
        vm = stub.vms.get(low)
        if vm is None:
            return 404, {"error": {"code": "ResourceNotFound",
                                   "message": f"The Resource '{COMPUTE}/{segs[-1]}' was not found."}}, {}
        return 200, vm.body(instance_view=(seen.query.get("$expand") or [""])[0] == "instanceView"), {}
    return 404, {"error": {"code": "NotFound", "message": f"the stand-in does not serve {seen.method} {path}"}}, {}


def _paged(stub: ArmStub, seen: Seen, items: list[Any]) -> dict[str, Any]:
    """One page of a list and its `nextLink` (the same query, the next `$skiptoken`), as ARM pages."""
    start = int((seen.query.get("$skiptoken") or ["0"])[0])
    out: dict[str, Any] = {"value": items[start: start + stub.page_size]}
    if start + stub.page_size < len(items):
        query = "&".join(f"{k}={vs[0]}" for k, vs in seen.query.items() if k != "$skiptoken")
        out["nextLink"] = f"{stub.url}{seen.path}?{query}&$skiptoken={start + stub.page_size}"
    return out


def _scale_set_route(stub: ArmStub, seen: Seen) -> tuple[int, Any, dict[str, str]]:
    """The scale set reads (virtualMachineScaleSet.json, virtualMachineScaleSetVM.json). Nothing else is served:
    gpufinops changes no scale set nor any instance of one (its role grants no such action)."""
    segs = seen.path.strip("/").split("/")
    low = [s.lower() for s in segs]
    expand = (seen.query.get("$expand") or [""])[0] == "instanceView"
    if seen.method != "GET":
        return 404, {"error": {"code": "NotFound", "message": f"the stand-in does not serve {seen.method}"}}, {}
    if len(segs) == 5:  # the subscription's scale sets
        every = [s.body() for k, s in sorted(stub.scale_sets.items()) if s.subscription.lower() == low[1]]
        return 200, _paged(stub, seen, every), {}
    scale_set = stub.scale_sets.get("/" + "/".join(low[:8]))
    if scale_set is None or len(segs) not in (8, 9, 10) or (len(segs) > 8 and low[8] != "virtualmachines"):
        return 404, {"error": {"code": "ResourceNotFound",
                               "message": f"The Resource '{SCALE_SETS}/{segs[7] if len(segs) > 7 else ''}' was not "
                                          f"found."}}, {}
    if len(segs) == 8:
        return 200, scale_set.body(), {}
    if len(segs) == 9:
        every = [scale_set.instance_body(i, expand) for i in range(len(scale_set.powers))]
        return 200, _paged(stub, seen, every), {}
    if not segs[9].isdigit() or int(segs[9]) >= len(scale_set.powers):
        return 404, {"error": {"code": "NotFound", "message": f"instance {segs[9]} not found"}}, {}
    return 200, scale_set.instance_body(int(segs[9]), expand), {}


def _entra(stub: ArmStub, seen: Seen, raw: bytes) -> tuple[int, Any]:
    """Microsoft Entra ID's two endpoints a service principal's sign-in calls (OpenID discovery of the tenant, the
    client-credentials token), at the stand-in: its `authority_host` (instance discovery off)."""
    tenant = seen.path.strip("/").split("/")[0]
    base = f"{stub.url}/{tenant}"
    if seen.path.endswith("/.well-known/openid-configuration"):
        return 200, {"token_endpoint": f"{base}/oauth2/v2.0/token", "issuer": f"{base}/v2.0",
                     "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                     "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode"}
    form = parse_qs(raw.decode())
    if form.get("client_secret") != [CLIENT_SECRET] or form.get("grant_type") != ["client_credentials"]:
        return 401, {"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret"}
    return 200, {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": TOKEN}


def _url(stub: ArmStub, seen: Seen) -> str:
    query = "&".join(f"{k}={vs[0]}" for k, vs in seen.query.items())
    return f"{stub.url}{seen.path}?{query}"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _self_signed(tmp: Path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "armstub")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "armstub-ca.pem", tmp / "armstub-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


class StaticToken:
    """A TokenCredential that hands the stand-in's token: no identity endpoint is ever called."""

    def get_token(self, *scopes: str, **_kw: Any):
        from azure.core.credentials import AccessToken

        return AccessToken(TOKEN, int(time.time()) + 3600)

    def get_token_info(self, *scopes: str, options: Any = None):
        from azure.core.credentials import AccessTokenInfo

        return AccessTokenInfo(TOKEN, int(time.time()) + 3600)


# What places.azure.cloud calls, as role actions (the shipped role must grant exactly these).
ROLE_ACTIONS_USED = ("Microsoft.Compute/virtualMachines/read", "Microsoft.Compute/locations/operations/read",
                     "Microsoft.Resources/tags/write", "Microsoft.Compute/virtualMachines/deallocate/action",
                     "Microsoft.Compute/virtualMachineScaleSets/read",
                     "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read")
# What it calls only under a power_off rule: the optional role grants exactly this.
POWER_OFF_ACTIONS_USED = ("Microsoft.Compute/virtualMachines/powerOff/action",)
