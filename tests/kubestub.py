"""A Kubernetes API server STAND-IN for tests: a real HTTP server on 127.0.0.1, not a kube-apiserver.

No kube-apiserver binary is packaged for this system (Debian ships kubectl and etcd-server only), so the tests
point the official `kubernetes` client (through a kubeconfig file) at this server. It speaks the subset of the
REST API gpufinops calls, with the answers' real shapes:
  * list (cluster-wide and per namespace) with `limit` / `continue` paging, `labelSelector` (a=b, a!=b, a, !a)
    and `fieldSelector` (dotted path = / != value), and metadata.resourceVersion on the list and each item;
  * get; patch as strategic-merge (maps merged, like merge patch: all the service patches), merge and JSON patch,
    a metadata.resourceVersion in the patch that is not the object's answers 409 Conflict;
  * the scale subresource of apps/v1 deployments and statefulsets (get and patch, autoscaling/v1 Scale);
  * events create (core/v1 and events.k8s.io/v1);
  * injected failures: `forbid(verb, resource)` answers 403 with Kubernetes' Status body, `conflict_next(...)`
    answers 409 once, `fail_next(status)` any status once (422 Invalid, 500, ...), `lose_answer_next(status)` makes
    the change and then answers `status` or (0) closes the connection unanswered;
  * Kueue's Workload custom resource (kueue.x-k8s.io/v1beta1 workloads; `kueue_workload()` builds one) and the
    Kueue-integrated kinds as their controllers make them: JobSet (jobset.x-k8s.io/v1alpha2, its pods owned by its
    Jobs), Kubeflow's PyTorchJob / TFJob / XGBoostJob / PaddleJob (kubeflow.org/v1) and MPIJob (kubeflow.org/
    v2beta1), their pods owned by the job itself, and KubeRay's RayJob and RayCluster (ray.io/v1, a RayJob's pods
    owned by the RayCluster it made): `jobset()`, `pytorchjob()`, `rayjob()` build one with its objects and pods;
    `remove_crd(resource)` makes every call on a kind answer 404, as a cluster without its CRD does;
  * every request recorded (method, path, query, body, content type, bearer token), like tests/slackstub.py.
It does not do watches, admission, defaulting, validation, RBAC evaluation or strategic-merge list semantics.
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

# resource -> (API prefix, kind, namespaced)
RESOURCES = {
    "nodes": ("/api/v1", "Node", False),
    "namespaces": ("/api/v1", "Namespace", False),
    "pods": ("/api/v1", "Pod", True),
    "events": ("/api/v1", "Event", True),
    "replicasets": ("/apis/apps/v1", "ReplicaSet", True),
    "deployments": ("/apis/apps/v1", "Deployment", True),
    "statefulsets": ("/apis/apps/v1", "StatefulSet", True),
    "jobs": ("/apis/batch/v1", "Job", True),
    "cronjobs": ("/apis/batch/v1", "CronJob", True),
    "events.k8s.io": ("/apis/events.k8s.io/v1", "Event", True),
    "horizontalpodautoscalers": ("/apis/autoscaling/v2", "HorizontalPodAutoscaler", True),
    "scaledobjects": ("/apis/keda.sh/v1alpha1", "ScaledObject", True),  # KEDA's custom resource
    "workloads": ("/apis/kueue.x-k8s.io/v1beta1", "Workload", True),  # Kueue's custom resource
    # Kueue-integrated training kinds (their CRDs: JobSet, Kubeflow training-operator v1 and MPI operator, KubeRay)
    "jobsets": ("/apis/jobset.x-k8s.io/v1alpha2", "JobSet", True),
    "pytorchjobs": ("/apis/kubeflow.org/v1", "PyTorchJob", True),
    "tfjobs": ("/apis/kubeflow.org/v1", "TFJob", True),
    "xgboostjobs": ("/apis/kubeflow.org/v1", "XGBoostJob", True),
    "paddlejobs": ("/apis/kubeflow.org/v1", "PaddleJob", True),
    "mpijobs": ("/apis/kubeflow.org/v2beta1", "MPIJob", True),
    "rayjobs": ("/apis/ray.io/v1", "RayJob", True),
    "rayclusters": ("/apis/ray.io/v1", "RayCluster", True),
    # DRA (resource.k8s.io/v1): the reader lists both every tick; the stand-in answers what it holds (none).
    "resourceslices": ("/apis/resource.k8s.io/v1", "ResourceSlice", False),
    "resourceclaims": ("/apis/resource.k8s.io/v1", "ResourceClaim", True),
}
_PREFIX_RESOURCES = {(p, r if r != "events.k8s.io" else "events"): r for r, (p, _, _) in RESOURCES.items()}
_API_VERSION = {"/api/v1": "v1", "/apis/apps/v1": "apps/v1", "/apis/batch/v1": "batch/v1",
                "/apis/events.k8s.io/v1": "events.k8s.io/v1", "/apis/autoscaling/v2": "autoscaling/v2",
                "/apis/keda.sh/v1alpha1": "keda.sh/v1alpha1", "/apis/kueue.x-k8s.io/v1beta1": "kueue.x-k8s.io/v1beta1",
                "/apis/jobset.x-k8s.io/v1alpha2": "jobset.x-k8s.io/v1alpha2",
                "/apis/kubeflow.org/v1": "kubeflow.org/v1", "/apis/kubeflow.org/v2beta1": "kubeflow.org/v2beta1", "/apis/ray.io/v1": "ray.io/v1",
                "/apis/resource.k8s.io/v1": "resource.k8s.io/v1"}
_VERB_OF = {"GET": "get", "PATCH": "patch", "POST": "create", "PUT": "update", "DELETE": "delete"}


@dataclass
class KubeRequest:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str
    token: str | None
    status: int
    verb: str = ""  # list | get | patch | create
    resource: str = ""  # pods, deployments/scale, ...


@dataclass
class _Injected:
    status: int
    verb: str | None = None
    resource: str | None = None
    once: bool = True
    after: bool = False  # do the call first, then answer `status` (the answer was lost)


class KubeStub:
    """Objects and injected failures, shared between the test and the server thread (under a lock)."""

    def __init__(self) -> None:
        self.url = ""
        self.requests: list[KubeRequest] = []
        self.objects: dict[str, dict[tuple[str, str], dict]] = {r: {} for r in RESOURCES}
        self._injected: list[_Injected] = []
        self._version = 1000
        self.lock = threading.RLock()
        self.absent: set[str] = set()  # resources whose CRD is not installed: every call answers 404

    # ------------------------------------------------------------------ the test's side
    def add(self, resource: str, obj: dict) -> dict:
        """Store an object (a deep copy, with uid/resourceVersion/creationTimestamp filled in when absent)."""
        with self.lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            prefix, kind, namespaced = RESOURCES[resource]
            obj.setdefault("apiVersion", _API_VERSION[prefix])
            obj.setdefault("kind", kind)
            meta.setdefault("uid", f"uid-{resource}-{meta.get('namespace', '')}-{meta['name']}")
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            meta["resourceVersion"] = self._next_version()
            self.objects[resource][(meta.get("namespace", "") if namespaced else "", meta["name"])] = obj
            return obj

    def get(self, resource: str, namespace: str, name: str) -> dict:
        with self.lock:
            return copy.deepcopy(self.objects[resource][(namespace, name)])

    def remove_crd(self, resource: str) -> None:
        """The kind's CustomResourceDefinition is not installed: list, get and patch answer 404, as kube-apiserver
        does for a path it does not serve."""
        with self.lock:
            self.absent.add(resource)

    def forbid(self, verb: str, resource: str, once: bool = False) -> None:
        """Answer 403 Forbidden to `verb` on `resource` (e.g. "list", "pods"; "patch", "deployments/scale")."""
        with self.lock:
            self._injected.append(_Injected(403, verb, resource, once))

    def conflict_next(self, verb: str = "patch", resource: str | None = None) -> None:
        """Answer the next matching call 409 Conflict, once."""
        with self.lock:
            self._injected.append(_Injected(409, verb, resource, True))

    def fail_next(self, status: int, verb: str | None = None, resource: str | None = None) -> None:
        with self.lock:
            self._injected.append(_Injected(status, verb, resource, True))

    def lose_answer_next(self, status: int, verb: str | None = None, resource: str | None = None) -> None:
        """Do the next matching call, then answer `status` instead of its result, once: a change that went
        through while its answer was lost (a 5xx from a proxy; 0: the connection is closed with no answer at all,
        as a reset)."""
        with self.lock:
            self._injected.append(_Injected(status, verb, resource, True, after=True))

    def calls(self, verb: str | None = None, resource: str | None = None) -> list[KubeRequest]:
        with self.lock:
            return [r for r in self.requests if (verb is None or r.verb == verb)
                    and (resource is None or r.resource == resource)]

    def write_kubeconfig(self, path: Path, token: str = "stub-token-not-a-secret") -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "stub",
            "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
            "users": [{"name": "stub", "user": {"token": token}}],
            "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub"}}],
        }))
        return path

    # ------------------------------------------------------------------ the server's side
    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def take_injected(self, verb: str, resource: str, after: bool = False) -> int | None:
        with self.lock:
            for inj in self._injected:
                if inj.after == after and (inj.verb in (None, verb)) and (inj.resource in (None, resource)):
                    if inj.once:
                        self._injected.remove(inj)
                    return inj.status
        return None


def _status(code: int, reason: str, message: str, kind: str = "") -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": {"kind": kind} if kind else {}, "code": code}


_REASONS = {403: "Forbidden", 404: "NotFound", 409: "Conflict", 500: "InternalError", 503: "ServiceUnavailable",
            422: "Invalid", 415: "UnsupportedMediaType", 400: "BadRequest"}


def _dotted(obj: Any, path: str) -> str:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def field_selector_matches(selector: str, obj: dict) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if _dotted(obj, k.strip()) == v.strip():
                return False
        else:
            k, v = term.replace("==", "=").split("=", 1)
            if _dotted(obj, k.strip()) != v.strip():
                return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 (and the map part of a strategic merge patch): null deletes, maps merge, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def json_patch(target: dict, ops: list[dict]) -> dict:
    """RFC 6902 add / replace / remove / test on object members ("~1" is "/")."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"]) if op["op"] == "add" \
                    else parent.__setitem__(int(last), op["value"])
            else:
                if op["op"] == "replace" and last not in parent:
                    raise KeyError(op["path"])
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif op["op"] == "test":
            if (parent[int(last)] if isinstance(parent, list) else parent.get(last)) != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return doc


def _route(path: str) -> tuple[str, str, str, str] | None:
    """(resource key, namespace, name, subresource) of an API path, None when not one the stub serves."""
    for prefix in _API_VERSION:
        if path == prefix or path.startswith(prefix + "/"):
            rest = [p for p in path[len(prefix):].split("/") if p]
            break
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces" and (prefix, rest[2]) in _PREFIX_RESOURCES:
        namespace, rest = rest[1], rest[2:]
    if not rest or (prefix, rest[0]) not in _PREFIX_RESOURCES:
        return None
    resource = _PREFIX_RESOURCES[(prefix, rest[0])]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    return resource, namespace, name, sub


class _Handler(BaseHTTPRequestHandler):
    stub: KubeStub  # set on the server's handler subclass

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        stub = self.stub
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        auth = self.headers.get("Authorization") or ""
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        route = _route(parts.path)
        verb = _VERB_OF.get(self.command, self.command.lower())
        if route and self.command == "GET" and not route[2]:
            verb = "list"
        resource_name = ""
        if route:
            key = route[0] if route[0] != "events.k8s.io" else "events"
            resource_name = f"{key}/{route[3]}" if route[3] else key
        status, answer = self._dispatch(route, verb, resource_name, query, body, ctype)
        lost = self.stub.take_injected(verb, resource_name, after=True) if status < 300 else None
        if lost is not None:
            status, answer = lost, _status(lost, _REASONS.get(lost, "Unknown"), f"injected {lost} after the change")
        with stub.lock:
            stub.requests.append(KubeRequest(self.command, parts.path, query, body, ctype, token, status, verb,
                                             resource_name))
        if status == 0:  # the change is made; the client's connection is closed before any answer
            self.close_connection = True
            return
        self._answer(status, answer)

    def _dispatch(self, route, verb: str, resource_name: str, query: dict, body: Any, ctype: str) -> tuple[int, dict]:
        stub = self.stub
        if route is None:
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({self.path})")
        resource, namespace, name, sub = route
        if resource in stub.absent:
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        injected = stub.take_injected(verb, resource_name)
        if injected == 403:
            scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
            group = RESOURCES[resource][0].removeprefix("/apis/").removeprefix("/api/").rsplit("/", 1)[0]
            group = "" if group == "v1" else group
            return 403, _status(403, "Forbidden", f'{resource_name} is forbidden: User "system:serviceaccount:'
                                f'gpufinops:gpufinops" cannot {verb} resource "{resource_name}" in API group '
                                f'"{group}" {scope}', resource_name)
        if injected is not None:
            return injected, _status(injected, _REASONS.get(injected, "Unknown"),
                                     "Operation cannot be fulfilled: the object has been modified; please apply "
                                     "your changes to the latest version and try again" if injected == 409
                                     else f"injected {injected}")
        store = stub.objects[resource]
        with stub.lock:
            if verb == "list":
                return 200, self._list(resource, namespace, query)
            if verb == "create" and not name:
                return self._create(resource, namespace, body)
            obj = store.get((namespace, name))
            if obj is None:
                return 404, _status(404, "NotFound", f'{resource} "{name}" not found', resource)
            if sub == "scale" and resource in ("deployments", "statefulsets"):
                return self._scale(obj, verb, body, ctype)
            if sub:
                return 404, _status(404, "NotFound", f"subresource {sub} not served by the stand-in")
            if verb == "get":
                return 200, copy.deepcopy(obj)
            if verb == "patch":
                return self._patch(obj, body, ctype)
        return 405, _status(405, "MethodNotAllowed", f"{self.command} not served by the stand-in")

    def _list(self, resource: str, namespace: str, query: dict) -> dict:
        stub = self.stub
        items = [o for (ns, _), o in sorted(stub.objects[resource].items()) if not namespace or ns == namespace]
        items = [o for o in items if label_selector_matches(query.get("labelSelector", ""),
                                                            o["metadata"].get("labels") or {})]
        items = [o for o in items if field_selector_matches(query.get("fieldSelector", ""), o)]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items) or 1
        page = items[start:start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(stub._version)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        prefix, kind, _ = RESOURCES[resource]
        return {"kind": f"{kind}List", "apiVersion": _API_VERSION[prefix], "metadata": meta,
                "items": copy.deepcopy(page)}

    def _create(self, resource: str, namespace: str, body: Any) -> tuple[int, dict]:
        if not isinstance(body, dict):
            return 400, _status(400, "BadRequest", "body is not an object")
        meta = body.setdefault("metadata", {})
        if namespace:
            meta.setdefault("namespace", namespace)
        if not meta.get("name"):
            base = meta.get("generateName") or "event-"
            meta["name"] = f"{base}{self.stub._version + 1}"
        return 201, copy.deepcopy(self.stub.add(resource, body))

    def _patch(self, obj: dict, body: Any, ctype: str) -> tuple[int, dict]:
        try:
            if ctype == "application/json-patch+json":
                new = json_patch(obj, body)
            elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json",
                           "application/apply-patch+yaml"):
                asked = ((body or {}).get("metadata") or {}).get("resourceVersion")
                if asked and asked != obj["metadata"]["resourceVersion"]:
                    return 409, _status(409, "Conflict", "the object has been modified; please apply your "
                                        "changes to the latest version and try again")
                new = merge_patch(obj, body)
            else:
                return 415, _status(415, "UnsupportedMediaType", f"the body of the request was in an unknown "
                                    f"format - accepted media types include: application/json-patch+json, "
                                    f"application/merge-patch+json, application/apply-patch+yaml ({ctype})")
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            return 422, _status(422, "Invalid", f"patch failed: {exc}")
        obj.clear()
        obj.update(new)
        obj["metadata"]["resourceVersion"] = self.stub._next_version()
        return 200, copy.deepcopy(obj)

    def _scale(self, obj: dict, verb: str, body: Any, ctype: str) -> tuple[int, dict]:
        if verb == "patch":
            asked = (body or {}).get("spec", {}).get("replicas") if ctype != "application/json-patch+json" else \
                next((op["value"] for op in body if op.get("path") == "/spec/replicas"), None)
            if not isinstance(asked, int) or asked < 0:
                return 422, _status(422, "Invalid", "spec.replicas must be a non-negative integer")
            obj.setdefault("spec", {})["replicas"] = asked
            obj.setdefault("status", {})["replicas"] = asked
            obj["metadata"]["resourceVersion"] = self.stub._next_version()
        elif verb != "get":
            return 405, _status(405, "MethodNotAllowed", f"{verb} on scale not served by the stand-in")
        meta = obj["metadata"]
        labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        return 200, {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace", ""), "uid": meta["uid"],
                         "resourceVersion": meta["resourceVersion"],
                         "creationTimestamp": meta.get("creationTimestamp")},
            "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 1)},
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                       "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))},
        }

    do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _handle


def start_kube_stub() -> tuple[KubeStub, ThreadingHTTPServer]:
    stub = KubeStub()
    handler = type("BoundHandler", (_Handler,), {"stub": stub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return stub, server


@pytest.fixture
def kube_stub() -> Iterator[KubeStub]:
    """A fresh Kubernetes API stand-in on 127.0.0.1 (see the module docstring); stopped at teardown."""
    stub, server = start_kube_stub()
    yield stub
    server.shutdown()
    server.server_close()


# --------------------------------------------------------------------------- object builders


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_obj(name: str, instance_id: str, *, gpus: int = 8, instance_type: str = "p4d.24xlarge",
             zone: str = "us-east-1a", labels: dict[str, str] | None = None, mig: dict[str, int] | None = None,
             created: datetime | None = None) -> dict:
    capacity = {"cpu": "96", "memory": "1143416852Ki", "pods": "110"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    for res, n in (mig or {}).items():
        capacity[res] = str(n)
    return {
        "metadata": {"name": name, "creationTimestamp": iso(created) if created else "2026-01-01T00:00:00Z",
                     "labels": {"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": instance_type,
                                "topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": zone[:-1],
                                **(labels or {})}},
        "spec": {"providerID": f"aws:///{zone}/{instance_id}"},
        "status": {"capacity": capacity, "allocatable": dict(capacity),
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}]},
    }


def pod_obj(namespace: str, name: str, node: str, *, gpus: int = 1, resource: str = "nvidia.com/gpu",
            owner: tuple[str, str] | None = None, phase: str = "Running", started: datetime | None = None,
            labels: dict[str, str] | None = None, priority_class: str = "") -> dict:
    limits = {resource: str(gpus)} if gpus else {}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner:
        kind, oname = owner
        api = {"ReplicaSet": "apps/v1", "StatefulSet": "apps/v1", "Job": "batch/v1",
               "RayCluster": "ray.io/v1"}.get(kind, "kubeflow.org/v1")
        meta["ownerReferences"] = [{"apiVersion": api, "kind": kind, "name": oname, "uid": f"uid-{oname}",
                                    "controller": True, "blockOwnerDeletion": True}]
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "main", "image": "img",
                                                              "resources": {"limits": limits,
                                                                            "requests": dict(limits)}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"metadata": meta, "spec": spec,
            "status": {"phase": phase, "startTime": iso(started) if started else "2026-01-01T00:00:00Z"}}


def owned(namespace: str, name: str, owner: tuple[str, str] | None = None, replicas: int | None = None,
          labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {},
                            "annotations": annotations or {}}
    if owner:
        api = "apps/v1" if owner[0] in ("Deployment", "StatefulSet") else "batch/v1"
        meta["ownerReferences"] = [{"apiVersion": api, "kind": owner[0], "name": owner[1], "uid": f"uid-{owner[1]}",
                                    "controller": True}]
    # A pod template, as the API server would hold it (the official client's models require one on read).
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": name}}, "template": {
        "metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "main", "image": "img"}]}}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"metadata": meta, "spec": spec, "status": {"replicas": replicas or 0}}


def kueue_workload(namespace: str, job: str, *, queue: str = "gpu-queue", active: bool = True,
                   priority_class: str = "", annotations: dict[str, str] | None = None, kind: str = "Job",
                   api_version: str = "batch/v1") -> dict:
    """A Kueue Workload as Kueue makes it for a job (`<kind, lower case>-<name>-<hash>`, its controller
    ownerReference the job's top object: a batch Job, a JobSet, a PyTorchJob, a RayJob; spec.active defaulted to
    true, admitted to a ClusterQueue)."""
    # podSets[].template is required by Kueue's CRD (the real API server refuses a Workload without it, 422).
    spec: dict[str, Any] = {"active": active, "queueName": queue, "podSets": [{"name": "main", "count": 1, "template": {
        "spec": {"containers": [{"name": "main", "image": "img"}], "restartPolicy": "Never"}}}]}
    if priority_class:
        spec.update(priorityClassName=priority_class, priorityClassSource="kueue.x-k8s.io/workloadpriorityclass",
                    priority=100)
    return {"metadata": {"name": f"{kind.lower()}-{job}-5b8c1", "namespace": namespace,
                         "labels": {"kueue.x-k8s.io/job-uid": f"uid-{job}"}, "annotations": annotations or {},
                         "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": job,
                                              "uid": f"uid-{job}", "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec,
            # podSetAssignments and each condition's lastTransitionTime and message: required by Kueue's CRD
            "status": {"admission": {"clusterQueue": "cluster-gpu", "podSetAssignments": [
                           {"name": "main", "count": 1, "flavors": {"nvidia.com/gpu": "default-flavor"}}]},
                       "conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted",
                                       "message": "The workload is admitted",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


# The Kueue-integrated kinds, each with what its controller makes (its objects and GPU pods), as the real API holds
# them. Each returns {resource: [objects]} for `add_all`; uids are `uid-<name>`, as ownerReferences name them.


def _controller_ref(api_version: str, kind: str, name: str) -> dict:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": f"uid-{name}", "controller": True,
            "blockOwnerDeletion": True}


def _pod_template(gpus: int) -> dict:
    return {"spec": {"containers": [{"name": "main", "image": "img", "resources": {
        "limits": {"nvidia.com/gpu": str(gpus)}}}], "restartPolicy": "Never"}}


def _owned_pod(namespace: str, name: str, node: str, owner: dict, gpus: int, labels: dict[str, str],
               started: datetime | None) -> dict:
    pod = pod_obj(namespace, name, node, gpus=gpus, labels=labels, started=started)
    pod["metadata"]["ownerReferences"] = [owner]
    return pod


def jobset(namespace: str, name: str, node: str, *, replicas: int = 2, gpus: int = 2, queue: str = "gpu-queue",
           labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
           started: datetime | None = None, pod_names: list[str] | None = None) -> dict[str, list[dict]]:
    """A JobSet (jobset.x-k8s.io/v1alpha2) with one replicatedJob `workers` of `replicas` Jobs
    (`<jobset>-workers-<i>`, each owned by the JobSet, labelled jobset.sigs.k8s.io/jobset-name) and one GPU pod per
    Job owned by its Job (`pod_names` to name them)."""
    meta_labels = {**({"kueue.x-k8s.io/queue-name": queue} if queue else {}), **(labels or {})}
    top = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": meta_labels,
                        "annotations": annotations or {}},
           "spec": {"suspend": False, "replicatedJobs": [{"name": "workers", "replicas": replicas, "template": {
               "spec": {"parallelism": 1, "completions": 1, "template": _pod_template(gpus)}}}]},
           # failed / succeeded / suspended are required by JobSet's CRD (the real server refuses the status without)
           "status": {"replicatedJobsStatus": [{"name": "workers", "active": replicas, "ready": replicas, "failed": 0,
                                                "succeeded": 0, "suspended": 0}]}}
    jobs, pods = [], []
    for i in range(replicas):
        job_name = f"{name}-workers-{i}"
        job_labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "workers"}
        job = owned(namespace, job_name, labels=job_labels)
        job["metadata"]["uid"] = f"uid-{job_name}"
        job["metadata"]["ownerReferences"] = [_controller_ref("jobset.x-k8s.io/v1alpha2", "JobSet", name)]
        jobs.append(job)
        pod_name = pod_names[i] if pod_names else f"{job_name}-{i}-x7k2p"
        pods.append(_owned_pod(namespace, pod_name, node, _controller_ref("batch/v1", "Job", job_name), gpus,
                               job_labels, started))
    return {"jobsets": [top], "jobs": jobs, "pods": pods}


def pytorchjob(namespace: str, name: str, node: str, *, workers: int = 2, gpus: int = 1, queue: str = "gpu-queue",
               labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
               started: datetime | None = None) -> dict[str, list[dict]]:
    """A Kubeflow PyTorchJob (kubeflow.org/v1): a Master and `workers` Workers, each pod (`<name>-master-0`,
    `<name>-worker-<i>`) owned by the PyTorchJob itself, labelled training.kubeflow.org/*."""
    meta_labels = {**({"kueue.x-k8s.io/queue-name": queue} if queue else {}), **(labels or {})}
    top = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": meta_labels,
                        "annotations": annotations or {}},
           "spec": {"runPolicy": {"suspend": False}, "pytorchReplicaSpecs": {
               "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": _pod_template(gpus)},
               "Worker": {"replicas": workers, "restartPolicy": "OnFailure", "template": _pod_template(gpus)}}},
           "status": {"conditions": [{"type": "Running", "status": "True"}]}}
    owner = _controller_ref("kubeflow.org/v1", "PyTorchJob", name)
    pods = []
    for rtype, index in [("master", 0)] + [("worker", i) for i in range(workers)]:
        pod_labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type": rtype,
                      "training.kubeflow.org/replica-index": str(index)}
        pods.append(_owned_pod(namespace, f"{name}-{rtype}-{index}", node, owner, gpus, pod_labels, started))
    return {"pytorchjobs": [top], "pods": pods}


def rayjob(namespace: str, name: str, node: str, *, workers: int = 2, gpus: int = 1, queue: str = "gpu-queue",
           labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
           started: datetime | None = None, pod_names: list[str] | None = None) -> dict[str, list[dict]]:
    """A KubeRay RayJob (ray.io/v1) as KubeRay runs it: the RayCluster it made (`<name>-<5 chars>`, its controller
    ownerReference the RayJob, labelled ray.io/originated-from-*), a GPU head pod and `workers` GPU worker pods
    owned by the RayCluster (labelled ray.io/cluster, ray.io/node-type), and the submitter Job (owned by the RayJob)
    whose pod requests no GPU."""
    cluster = f"{name}-k7x2p"
    meta_labels = {**({"kueue.x-k8s.io/queue-name": queue} if queue else {}), **(labels or {})}
    top = {"apiVersion": "ray.io/v1", "kind": "RayJob",
           "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": meta_labels,
                        "annotations": annotations or {}},
           "spec": {"entrypoint": "python train.py", "suspend": False, "shutdownAfterJobFinishes": True,
                    "rayClusterSpec": {"headGroupSpec": {"template": _pod_template(gpus)},
                                       "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers,
                                                             "template": _pod_template(gpus)}]}},
           "status": {"rayClusterName": cluster, "jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}
    ray_cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
                   "metadata": {"name": cluster, "namespace": namespace, "uid": f"uid-{cluster}",
                                "labels": {"ray.io/originated-from-crd": "RayJob",
                                           "ray.io/originated-from-cr-name": name},
                                "ownerReferences": [_controller_ref("ray.io/v1", "RayJob", name)]},
                   "spec": dict(top["spec"]["rayClusterSpec"]), "status": {"state": "ready"}}
    owner = _controller_ref("ray.io/v1", "RayCluster", cluster)
    names = pod_names or [f"{cluster}-head-abcde"] + [f"{cluster}-gpu-worker-{i}abcd" for i in range(workers)]
    pods = []
    for i, pod_name in enumerate(names):
        node_type = "head" if i == 0 else "worker"
        pods.append(_owned_pod(namespace, pod_name, node, owner, gpus,
                               {"ray.io/cluster": cluster, "ray.io/node-type": node_type}, started))
    submitter = owned(namespace, name)
    submitter["metadata"]["ownerReferences"] = [_controller_ref("ray.io/v1", "RayJob", name)]
    submit_pod = _owned_pod(namespace, f"{name}-submit-q8w4z", node, _controller_ref("batch/v1", "Job", name), 0,
                            {}, started)
    return {"rayjobs": [top], "rayclusters": [ray_cluster], "jobs": [submitter], "pods": pods + [submit_pod]}


def add_all(stub: KubeStub, objects: dict[str, list[dict]]) -> None:
    for resource, objs in objects.items():
        for obj in objs:
            stub.add(resource, obj)
