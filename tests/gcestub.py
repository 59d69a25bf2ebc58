"""A stand-in for the Compute Engine API (compute/v1) on 127.0.0.1, speaking the exact REST subset gpufinops calls.

No emulator of Compute Engine exists; this answers as the GCE discovery document
(https://www.googleapis.com/discovery/v1/apis/compute/v1/rest) shapes each method, so that the official client
(`google-cloud-compute`, REST transport) is exercised for real: its URLs, query parameters, JSON bodies, paging,
error mapping and operation objects.

  instances.aggregatedList  GET  /compute/v1/projects/{project}/aggregated/instances
                            (filter, maxResults, pageToken; `items` keyed "zones/{zone}", a zone without VMs
                            answers `warning` NO_RESULTS_ON_PAGE, one GCE cannot reach `warning` UNREACHABLE)
  instances.get             GET  /compute/v1/projects/{project}/zones/{zone}/instances/{name}
  instances.setLabels       POST .../instances/{name}/setLabels   {labels, labelFingerprint}: a fingerprint other
                            than the VM's current one is refused 412 conditionNotMet, as GCE does
  instances.stop            POST .../instances/{name}/stop        RUNNING -> STOPPING -> TERMINATED
  instances.suspend         POST .../instances/{name}/suspend     RUNNING -> SUSPENDING -> SUSPENDED
  zoneOperations.get        GET  /compute/v1/projects/{project}/zones/{zone}/operations/{operation}

A stop or suspend answers a zone Operation PENDING; each zoneOperations.get of it moves it on (RUNNING, then DONE
after `polls_to_done` reads, or once `op_seconds` have passed on the wall clock), and the VM leaves STOPPING for
TERMINATED when its operation is DONE. Faults are queued per method: HTTP 429 with Retry-After, 5xx before or
after the effect, the connection closed after the effect (a lost answer), 412; `before` hooks run a person's change
just before a request is handled. Every request is recorded with the IAM permission the method needs
(cloud.google.com/compute/docs/reference/rest/v1/instances: "IAM permissions"), so that a test can check them
against the shipped custom role.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

import pytest

BASE = "/compute/v1/projects/"
PERMISSIONS = {
    "instances.aggregatedList": "compute.instances.list",
    "instances.get": "compute.instances.get",
    "instances.setLabels": "compute.instances.setLabels",
    "instances.stop": "compute.instances.stop",
    "instances.suspend": "compute.instances.suspend",
    "zoneOperations.get": "compute.zoneOperations.get",
}
_ROUTES = [
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/aggregated/instances$"), "instances.aggregatedList"),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$"), "instances.get"),
    ("POST", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/setLabels$"),
     "instances.setLabels"),
    ("POST", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/stop$"), "instances.stop"),
    ("POST", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/suspend$"),
     "instances.suspend"),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)$"), "zoneOperations.get"),
]


def rfc3339(at: datetime) -> str:
    """GCE's timestamps: RFC 3339 with milliseconds and an offset (it answers in Pacific time)."""
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "-00:00"


@dataclass
class Fault:
    """One injected answer. kind: "429" (refused, Retry-After), "500" (refused before the effect), "500-after"
    (done, then 500), "drop-after" (done, then the connection closed without an answer), "412"."""

    kind: str
    retry_after: str = "0"


@dataclass
class Request:
    method: str  # "instances.stop"
    path: str
    permission: str
    query: dict[str, list[str]]
    body: Any
    authorization: str


@dataclass
class Stub:
    projects: tuple[str, ...] = ("ml-prod",)
    page_size_cap: int = 500  # GCE's maxResults cap
    polls_to_done: int = 2
    op_seconds: float = 3600.0
    token: str | None = None  # when set, a request without "Bearer <token>" is answered 401
    instances: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    operations: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    before: dict[str, list[Callable[[], None]]] = field(default_factory=dict)
    unreachable: set[str] = field(default_factory=set)  # "zones/<zone>" answered with warning UNREACHABLE
    # GCE's published limits on suspend (cloud.google.com/compute/docs/instances/suspend-resume-instance#limitations):
    # a VM with GPUs attached (guestAccelerators, or an accelerator-optimized a2/a3/a4/g2 type) is refused, HTTP 400
    # reason unsupportedOperation. False: the stand-in suspends it, for the state machine's own tests.
    suspend_refuses_gpus: bool = True
    requests: list[Request] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    url: str = ""
    _next_id: int = 1000

    # ------------------------------------------------------------------ the fleet
    def add(self, name: str, zone: str = "us-central1-a", machine_type: str = "g2-standard-8", *,
            project: str = "ml-prod", status: str = "RUNNING", labels: dict[str, str] | None = None,
            accelerators: list[tuple[str, int]] | None = None, spot: bool = False, preemptible: bool = False,
            created_by: str = "", started: datetime | None = None, ip: str = "") -> dict:
        started = started or datetime.now(timezone.utc)
        self._next_id += 1
        items = [{"key": "created-by", "value": created_by}] if created_by else []
        items.append({"key": "startup-script", "value": "#!/bin/sh\necho hi"})
        inst = {
            "kind": "compute#instance",
            "id": str(7_000_000_000_000_000_000 + self._next_id),
            "creationTimestamp": rfc3339(started),
            "name": name,
            "machineType": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/machineTypes/"
                           f"{machine_type}",
            "status": status,
            "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
            "networkInterfaces": [{"kind": "compute#networkInterface", "name": "nic0", "network":
                                   f"https://www.googleapis.com/compute/v1/projects/{project}/global/networks/default",
                                   "networkIP": ip or f"10.128.0.{self._next_id % 250 + 2}"}],
            "metadata": {"kind": "compute#metadata", "fingerprint": "mdfp0000", "items": items},
            "scheduling": {"onHostMaintenance": "TERMINATE", "automaticRestart": not (spot or preemptible),
                           "preemptible": preemptible,
                           "provisioningModel": "SPOT" if spot else "STANDARD"},
            "labels": dict(labels or {}),
            "labelFingerprint": "",
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instances/{name}",
        }
        if status == "RUNNING":
            inst["lastStartTimestamp"] = rfc3339(started)
        if accelerators:
            inst["guestAccelerators"] = [{"acceleratorType": f"https://www.googleapis.com/compute/v1/projects/"
                                          f"{project}/zones/{zone}/acceleratorTypes/{t}", "acceleratorCount": n}
                                         for t, n in accelerators]
        self._refingerprint(inst)
        with self.lock:
            self.instances[(project, zone, name)] = inst
        return inst

    def vm(self, name: str) -> dict:
        with self.lock:
            return next(v for (_, _, n), v in self.instances.items() if n == name)

    def labels(self, name: str) -> dict[str, str]:
        return dict(self.vm(name)["labels"])

    def status(self, name: str) -> str:
        return self.vm(name)["status"]

    def person_sets_labels(self, name: str, **changes: str | None) -> None:
        """A person's `gcloud compute instances add-labels/remove-labels`: the fingerprint changes."""
        with self.lock:
            inst = self.vm(name)
            for k, v in changes.items():
                if v is None:
                    inst["labels"].pop(k, None)
                else:
                    inst["labels"][k] = v
            self._refingerprint(inst)

    def person_starts(self, name: str, at: datetime | None = None) -> None:
        with self.lock:
            inst = self.vm(name)
            inst["status"] = "RUNNING"
            inst["lastStartTimestamp"] = rfc3339(at or datetime.now(timezone.utc))

    def fault(self, method: str, *faults: Fault) -> None:
        with self.lock:
            self.faults.setdefault(method, []).extend(faults)

    def on(self, method: str, hook: Callable[[], None]) -> None:
        """Run `hook` once, just before the next `method` request is handled ("*": the next request of any
        method, so that a hook set inside a hook lands right after the request that ran it)."""
        with self.lock:
            self.before.setdefault(method, []).append(hook)

    def calls(self, method: str) -> list[Request]:
        return [r for r in self.requests if r.method == method]

    def finish_operations(self) -> None:
        """Every operation done now (the VM reaches its final state), as if GCE had finished while nobody asked."""
        with self.lock:
            for op in self.operations.values():
                self._finish(op)

    @staticmethod
    def _refingerprint(inst: dict) -> None:
        digest = json.dumps(inst["labels"], sort_keys=True) + str(time.monotonic_ns())
        inst["labelFingerprint"] = base64.b64encode(digest.encode()[-12:]).decode()

    # ------------------------------------------------------------------ operations
    def _operation(self, project: str, zone: str, inst: dict, kind: str) -> dict:
        self._next_id += 1
        name = f"operation-{self._next_id}-{kind}"
        op = {"kind": "compute#operation", "id": str(9_000_000 + self._next_id), "name": name,
              "operationType": kind, "targetLink": inst["selfLink"], "targetId": inst["id"], "status": "PENDING",
              "user": "gpufinops@ml-prod.iam.gserviceaccount.com", "progress": 0,
              "insertTime": rfc3339(datetime.now(timezone.utc)),
              "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
              "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/operations/{name}",
              "_polls": 0, "_started": time.monotonic(), "_target": (project, zone, inst["name"])}
        self.operations[(project, zone, name)] = op
        return op

    def _finish(self, op: dict) -> None:
        if op["status"] == "DONE":
            return
        op.update(status="DONE", progress=100, endTime=rfc3339(datetime.now(timezone.utc)))
        inst = self.instances.get(op["_target"])
        if inst is not None:
            final = {"stop": ("STOPPING", "TERMINATED"), "suspend": ("SUSPENDING", "SUSPENDED")}.get(op["operationType"])
            if final and inst["status"] == final[0]:
                inst["status"] = final[1]

    def _advance(self, op: dict) -> None:
        op["_polls"] += 1
        if op["_polls"] >= self.polls_to_done or time.monotonic() - op["_started"] >= self.op_seconds:
            self._finish(op)
        elif op["status"] == "PENDING":
            op.update(status="RUNNING", progress=50, startTime=rfc3339(datetime.now(timezone.utc)))

    @staticmethod
    def public(obj: dict) -> dict:
        return {k: v for k, v in obj.items() if not k.startswith("_")}

    # ------------------------------------------------------------------ the methods
    def handle(self, verb: str, path: str, query: dict, body: Any) -> tuple[int, dict, dict]:
        for method_verb, pattern, method in _ROUTES:
            m = pattern.match(path)
            if m and verb == method_verb:
                return getattr(self, "_" + method.replace(".", "_"))(*m.groups(), query=query, body=body)
        return 404, {}, _error(404, "notFound", f"The requested URL {path} was not found")

    def _instances_aggregatedList(self, project, *, query, body):
        if project not in self.projects:
            return 403, {}, _error(403, "forbidden", f"Required 'compute.instances.list' permission for "
                                                      f"'projects/{project}'")
        rows = sorted((k, v) for k, v in self.instances.items() if k[0] == project)
        wanted = query.get("filter", [""])[0]
        if wanted:
            m = re.fullmatch(r'status\s*!=\s*"?([A-Z]+)"?', wanted.strip())
            if m is None:
                return 400, {}, _error(400, "invalid", f"Invalid value for field 'filter': '{wanted}'")
            rows = [(k, v) for k, v in rows if v["status"] != m.group(1)]
        size = min(int(query.get("maxResults", ["500"])[0]), self.page_size_cap)
        start = int(query.get("pageToken", ["0"])[0] or 0)
        page = rows[start:start + size]
        zones = sorted({k[1] for k in self.instances if k[0] == project} | {"europe-west4-a"})
        items: dict[str, dict] = {}
        for zone in zones:
            found = [self.public(v) for k, v in page if k[1] == zone]
            items[f"zones/{zone}"] = {"instances": found} if found else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope 'zones/" + zone +
                "' on this page.", "data": [{"key": "scope", "value": f"zones/{zone}"}]}}
        for scope in self.unreachable:  # a zone GCE cannot reach now: its scope says so, the others answer
            items[scope] = {"warning": {"code": "UNREACHABLE", "message": f"Scope '{scope}' is unreachable.",
                                        "data": [{"key": "scope", "value": scope}]}}
        answer = {"kind": "compute#instanceAggregatedList", "id": f"projects/{project}/aggregated/instances",
                  "items": items, "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/aggregated/"
                                              f"instances"}
        if start + size < len(rows):
            answer["nextPageToken"] = str(start + size)
        return 200, {}, answer

    def _get_instance(self, project, zone, name):
        inst = self.instances.get((project, zone, name))
        if inst is None:
            return None, (404, {}, _error(404, "notFound",
                                          f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was "
                                          f"not found"))
        return inst, None

    def _instances_get(self, project, zone, name, *, query, body):
        inst, missing = self._get_instance(project, zone, name)
        return missing or (200, {}, self.public(inst))

    def _instances_setLabels(self, project, zone, name, *, query, body):
        inst, missing = self._get_instance(project, zone, name)
        if missing:
            return missing
        if (body or {}).get("labelFingerprint") != inst["labelFingerprint"]:
            return 412, {}, _error(412, "conditionNotMet", "Labels fingerprint either invalid or resource labels "
                                                           "have changed", location="If-Match")
        labels = dict((body or {}).get("labels") or {})
        bad = [k for k, v in labels.items() if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k)
               or not re.fullmatch(r"[a-z0-9_-]{0,63}", str(v))]
        if bad or len(labels) > 64:
            return 400, {}, _error(400, "invalid", f"Invalid value for field 'labels': {bad}")
        inst["labels"] = labels
        self._refingerprint(inst)
        op = self._operation(project, zone, inst, "setLabels")
        self._finish(op)
        return 200, {}, self.public(op)

    def _change_state(self, project, zone, name, kind, going, ok_from):
        inst, missing = self._get_instance(project, zone, name)
        if missing:
            return missing
        op = self._operation(project, zone, inst, kind)
        if inst["status"] in ok_from:
            inst["status"] = going
        elif inst["status"] not in (going, "TERMINATED", "SUSPENDED"):
            op.update(status="DONE", httpErrorStatusCode=400, httpErrorMessage="BAD REQUEST",
                      error={"errors": [{"code": "UNSUPPORTED_OPERATION",
                                         "message": f"The instance is in state {inst['status']}"}]})
        return 200, {}, self.public(op)

    def _instances_stop(self, project, zone, name, *, query, body):
        return self._change_state(project, zone, name, "stop", "STOPPING", ("RUNNING", "PROVISIONING", "STAGING"))

    def _instances_suspend(self, project, zone, name, *, query, body):
        inst = self.instances.get((project, zone, name))
        family = (inst or {}).get("machineType", "").rsplit("/", 1)[-1].split("-", 1)[0]
        if inst is not None and self.suspend_refuses_gpus and (inst.get("guestAccelerators")
                                                               or family in ("a2", "a3", "a4", "g2")):
            # The code is GCE's (troubleshooting-suspend-resume); the sentence is the stand-in's own.
            return 400, {}, _error(400, "unsupportedOperation", "UNSUPPORTED_OPERATION: an instance with GPUs "
                                                                "attached cannot be suspended")
        return self._change_state(project, zone, name, "suspend", "SUSPENDING", ("RUNNING",))

    def _zoneOperations_get(self, project, zone, name, *, query, body):
        op = self.operations.get((project, zone, name))
        if op is None:
            return 404, {}, _error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/operations/"
                                                    f"{name}' was not found")
        self._advance(op)
        return 200, {}, self.public(op)


def _error(code: int, reason: str, message: str, location: str = "") -> dict:
    err = {"domain": "global", "reason": reason, "message": message}
    if location:
        err.update(locationType="header", location=location)
    return {"error": {"code": code, "message": message, "errors": [err]}}


def method_of(verb: str, path: str) -> str:
    for method_verb, pattern, method in _ROUTES:
        if verb == method_verb and pattern.match(path):
            return method
    return "unknown"


class _Handler(BaseHTTPRequestHandler):
    stub: Stub
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args) -> None:
        pass

    def _serve(self, verb: str) -> None:
        stub = self.stub
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        method = method_of(verb, url.path)
        query = parse_qs(url.query)
        with stub.lock:
            stub.requests.append(Request(method, url.path, PERMISSIONS.get(method, "unknown"), query, body,
                                         self.headers.get("Authorization", "")))
            hooks = stub.before.pop("*", []) + stub.before.pop(method, [])
        for hook in hooks:
            hook()
        if stub.token is not None and self.headers.get("Authorization") != f"Bearer {stub.token}":
            return self._answer(401, {}, _error(401, "required", "Request is missing required authentication "
                                                                  "credential."))
        with stub.lock:
            queue = stub.faults.get(method) or []
            fault = queue.pop(0) if queue else None
            if fault is not None and fault.kind in ("429", "500", "412"):
                status = int(fault.kind)
                headers = {"Retry-After": fault.retry_after} if status == 429 else {}
                reason = {429: "rateLimitExceeded", 500: "backendError", 412: "conditionNotMet"}[status]
                return self._answer(status, headers, _error(status, reason, f"injected {fault.kind}"))
            status, headers, answer = stub.handle(verb, url.path, query, body)
        if fault is not None and fault.kind == "500-after":
            return self._answer(500, {}, _error(500, "backendError", "Internal error after the effect"))
        if fault is not None and fault.kind == "drop-after":
            self.close_connection = True
            self.connection.shutdown(2)
            return None
        return self._answer(status, headers, answer)

    def _answer(self, status: int, headers: dict, body: dict) -> None:
        data = json.dumps(body).encode()
        self._bytes_sent = len(data)
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")


def start(stub: Stub) -> tuple[ThreadingHTTPServer, threading.Thread]:
    handler = type("Handler", (_Handler,), {"stub": stub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture
def gce():
    """A fresh GCE stand-in on 127.0.0.1 (`gce.url` is the client's api_endpoint)."""
    stub = Stub()
    server, thread = start(stub)
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
