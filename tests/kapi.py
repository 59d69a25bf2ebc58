"""A REAL Kubernetes API server for the tests: kube-apiserver v1.36.2 + etcd from ../shared/kapi (kapi.sh).

One server per test session (`kapi`, session fixture): started in a temporary folder, the real published CRDs of
tests/data/crds/ applied (their sources in SOURCES.md there), the shipped ClusterRole of deploy/kubernetes/workloads
applied as `kubectl kustomize` renders it; stopped at the end of the session. Missing binaries or tools FAIL the
tests with what is missing: they never skip.

Each test gets a `KapiCluster` (`kapi_cluster` fixture, or `KapiCluster(kapi)`):
  * its own namespaces (`ns("ml")` -> "ml-k7"): a namespace never finishes terminating on a bare API server (no
    namespace controller), so no name is ever reused, and its own cluster-scoped names (`name("node")`);
  * its own identity: a ServiceAccount bound to the SHIPPED ClusterRole by a ClusterRoleBinding, its token from
    the TokenRequest API, written into the kubeconfig the service under test reads. Every request the service
    makes is then judged by the server's own RBAC; any 403 the test did not ask for fails it at teardown;
  * a fault proxy (tests/faults/faultproxy.py) between the service and the server: every request is recorded
    (`calls()`, parsed into verb / resource / namespace / name), and faults a real server cannot produce on demand
    (a 500, a lost answer) are armed there; a 409 is produced for real (`conflict_next`: the object is changed just
    before the request reaches the server) and so is a 403 (`forbid`: the test's identity loses that one right);
  * `add()` creates an object as the test's fixtures describe it, then writes its status through the status
    subresource (the server ignores status on create, except for nodes) and points ownerReferences at the real
    uids of the owners added before it (the server assigns uids);
  * at teardown everything it added is deleted (pods with grace 0: no kubelet ever confirms a deletion).
"""

from __future__ import annotations

import copy
import itertools
import json
import lzma
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import yaml

from tests.faults.faultproxy import FaultProxy, Request
from tests.kubestub import RESOURCES

ROOT = Path(__file__).resolve().parents[1]
KAPI_DIR = (ROOT / ".." / "shared" / "kapi").resolve()
CRD_DIR = ROOT / "tests" / "data" / "crds"
WORKLOADS_RBAC = ROOT / "deploy" / "kubernetes" / "workloads"
TOOLS = ("openssl", "xz", "curl", "python3", "kubectl")
# The shipped ClusterRole's name (deploy/kubernetes/workloads/rbac-clusterrole.yaml, as kustomize renders it).
SHIPPED_ROLE = "gpufinops-workloads"


def kapi_missing() -> str | None:
    """What is missing to start the server, said so a person can install it; None when nothing is."""
    lost = [f"../shared/kapi/{f}" for f in ("kapi.sh", "kube-apiserver.xz", "tiny-etcd.xz", "SHA256SUMS")
            if not (KAPI_DIR / f).is_file()]
    tools = [t for t in TOOLS if shutil.which(t) is None]
    if not lost and not tools:
        return None
    parts = []
    if lost:
        parts.append(f"the real API server's files are missing: {', '.join(lost)}")
    if tools:
        parts.append(f"commands not found: {', '.join(tools)} (Debian: apt-get install openssl xz-utils curl "
                     "python3 kubectl; .ci/run installs them)")
    return "kube-apiserver tests cannot run: " + "; ".join(parts)


class ApiError(RuntimeError):
    def __init__(self, status: int, body: Any, what: str):
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{what}: {status} {message}")


def api_path(resource: str, namespace: str = "", name: str = "", sub: str = "") -> str:
    """The REST path of a resource known to tests/kubestub.RESOURCES (the kinds gpufinops reads)."""
    prefix, _kind, namespaced = RESOURCES[resource]
    plural = "events" if resource == "events.k8s.io" else resource
    path = prefix + (f"/namespaces/{namespace}" if namespaced and namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


class Admin:
    """Plain REST calls to the server with the admin token (system:masters): the test's own hands."""

    def __init__(self, server: str, token: str, ca_cert: Path):
        self.server = server
        self.session = requests.Session()
        self.ca_cert = str(ca_cert)  # kapi.sh's self-signed serving certificate for 127.0.0.1
        self.session.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
             params: dict | None = None, ok: tuple[int, ...] = (200, 201, 202)) -> Any:
        data = None if body is None else json.dumps(body)
        answer = self.session.request(method, self.server + path, data=data, params=params, timeout=30,
                                      verify=self.ca_cert,  # per request: REQUESTS_CA_BUNDLE would win otherwise
                                      headers={"Content-Type": content_type} if data is not None else {})
        try:
            doc = answer.json()
        except ValueError:
            doc = answer.text
        if answer.status_code not in ok:
            raise ApiError(answer.status_code, doc, f"{method} {path}")
        return doc

    def create(self, path: str, obj: dict) -> dict:
        return self.call("POST", path, obj)

    def get(self, path: str) -> dict:
        return self.call("GET", path)

    def merge(self, path: str, patch: dict) -> dict:
        return self.call("PATCH", path, patch, content_type="application/merge-patch+json")

    def delete(self, path: str, **params: Any) -> None:
        self.call("DELETE", path, params=params or None, ok=(200, 202, 404))


@dataclass
class Kapi:
    """The session's server: where it is, the admin's hands, and what it cost to start."""

    server: str
    workdir: Path
    admin: Admin
    started_s: float  # kapi.sh start: unpack, certificates, etcd, kube-apiserver ready
    setup_s: float  # the CRDs applied and Established, the shipped ClusterRole applied
    ca_cert: Path


def _apply_crds(admin: Admin) -> list[str]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 1 s for the 7 MB, not 20
    docs = [doc for path in sorted(CRD_DIR.glob("*.yaml.xz"))
            for doc in yaml.load_all(lzma.decompress(path.read_bytes()), Loader=loader)
            if doc and doc.get("kind") == "CustomResourceDefinition"]
    # Created side by side: the server's per-CRD work (schema, OpenAPI) is most of the session's start.
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda doc: admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc),
                      docs))
    names = [doc["metadata"]["name"] for doc in docs]
    deadline = time.monotonic() + 60
    for name in names:  # served only once Established
        while True:
            crd = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRD {name} not Established after 60 s: {conditions}")
            time.sleep(0.05)
    # Established is not yet servable: the first lists answer 429 "storage is (re)initializing" until the
    # resource's watch cache is ready. Wait for a 200 on each kind, so no test meets that (a real cluster's
    # service meets it only right after a CRD is installed).
    for doc in docs:
        spec = doc["spec"]
        for version in (v["name"] for v in spec["versions"] if v.get("served")):
            while True:
                try:
                    admin.get(f"/apis/{spec['group']}/{version}/{spec['names']['plural']}")
                    break
                except ApiError as exc:
                    if exc.status != 429 or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
    return names


def shipped_rbac() -> list[dict]:
    """The ClusterRole(s) and Role(s) of deploy/kubernetes/workloads, as `kubectl kustomize` renders them."""
    out = subprocess.run(["kubectl", "kustomize", str(WORKLOADS_RBAC)], capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d and d.get("kind") in ("ClusterRole", "Role")]


def start_kapi(workdir: Path) -> tuple[Kapi, callable]:
    missing = kapi_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    env = {**os.environ, "KAPI_BIN_DIR": str(KAPI_DIR)}
    began = time.monotonic()
    started = subprocess.run(["bash", str(KAPI_DIR / "kapi.sh"), "start", str(workdir)], capture_output=True,
                             text=True, env=env, timeout=180)

    def stop() -> None:
        subprocess.run(["bash", str(KAPI_DIR / "kapi.sh"), "stop", str(workdir)], capture_output=True, env=env,
                       timeout=60)

    if started.returncode != 0:
        stop()
        pytest.fail(f"kapi.sh start failed ({started.returncode}): {started.stderr[-2000:]}", pytrace=False)
    exports = dict(re.findall(r"(KAPI_\w+)=(\S+)", started.stdout))
    up = time.monotonic()
    admin = Admin(exports["KAPI_SERVER"], exports["KAPI_ADMIN_TOKEN"], workdir / "pki" / "serving.crt")
    try:
        _apply_crds(admin)
        for role in shipped_rbac():
            kind_path = "clusterroles" if role["kind"] == "ClusterRole" else \
                f"namespaces/{role['metadata']['namespace']}/roles"
            admin.create(f"/apis/rbac.authorization.k8s.io/v1/{kind_path}", role)
    except Exception:
        stop()
        raise
    return Kapi(exports["KAPI_SERVER"], workdir, admin, up - began, time.monotonic() - up,
                workdir / "pki" / "serving.crt"), stop


@pytest.fixture(scope="session")
def kapi(tmp_path_factory) -> Iterator[Kapi]:
    """The session's real kube-apiserver (see the module docstring)."""
    server, stop = start_kapi(tmp_path_factory.mktemp("kapi"))
    try:
        yield server
    finally:
        stop()


# --------------------------------------------------------------------------- one test's cluster


@dataclass
class KubeCall:
    """One request the service made, as RBAC names it."""

    seq: int
    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int | None  # None: never answered by the server (a fault answered for it)
    verb: str  # list | get | create | patch | update | delete | watch
    group: str
    resource: str  # pods, deployments/scale, workloads, ...
    namespace: str
    name: str
    token: str = ""  # the bearer token it carried
    content_type: str = ""  # of the request's body (a PATCH's patch type)
    fault: str = ""  # the fault proxy's mode applied to it after forwarding ("lost": the server acted, the answer
    # never reached the service), "" if none


def parse_call(req: Request, status: int | None, fault: str = "") -> KubeCall:
    parts = urlsplit(req.path)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    segs = [p for p in parts.path.split("/") if p]
    group = ""
    if segs[:1] == ["api"]:
        rest = segs[2:]
    elif segs[:1] == ["apis"] and len(segs) >= 3:
        group, rest = segs[1], segs[3:]
    else:
        rest = segs
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    elif len(rest) == 2 and rest[0] == "namespaces":  # the namespace object itself
        rest = ["namespaces", rest[1]]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    if len(rest) > 2:
        resource += "/" + rest[2]
    verb = {"GET": "get", "PATCH": "patch", "POST": "create", "PUT": "update", "DELETE": "delete"}.get(
        req.method, req.method.lower())
    if req.method == "GET" and not name:
        verb = "watch" if query.get("watch") in ("1", "true") else "list"
    try:
        body = json.loads(req.body) if req.body else None
    except ValueError:
        body = req.body.decode(errors="replace")
    auth = next((v for k, v in req.headers.items() if k.lower() == "authorization"), "")
    ctype = next((v for k, v in req.headers.items() if k.lower() == "content-type"), "")
    return KubeCall(req.seq, req.method, parts.path, query, body, status, verb, group, resource, namespace, name,
                    auth.removeprefix("Bearer "), ctype.split(";")[0].strip(), fault)


def _k8s_status(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code}).encode()


def call_matches(verb: str | None, resource: str | None):
    def match(req: Request) -> bool:
        call = parse_call(req, None)
        return (verb is None or call.verb == verb) and (resource is None or call.resource == resource)
    return match


def as_real_job(obj: dict) -> None:
    """A batch/v1 Job as the real server takes it: no selector of its own (the server generates one from the
    Job's uid unless manualSelector is set) and a pod template that never restarts (Always is refused, 422).
    The stand-in's `owned()` builder makes neither."""
    spec = obj.setdefault("spec", {})
    spec.pop("selector", None)
    spec.pop("replicas", None)
    template = spec.setdefault("template", {})
    template.setdefault("spec", {}).setdefault("restartPolicy", "Never")


_COUNTER = itertools.count(1)
_CLUSTER_SCOPED = {r for r, (_p, _k, namespaced) in RESOURCES.items() if not namespaced}


class KapiCluster:
    """One test's part of the session's server (see the module docstring)."""

    def __init__(self, kapi: Kapi, suffix: str | None = None):
        """`suffix` names the test's namespaces (`ns()`); a module whose peers are keyed by namespace (DCGM series
        in a module's Prometheus) hands out its own, each used once in the session."""
        self.kapi = kapi
        self.admin = kapi.admin
        self.suffix = suffix or f"k{next(_COUNTER)}"
        self.created: list[tuple[str, str, str]] = []  # (resource, namespace, name), in creation order
        self.uids: dict[tuple[str, str, str], str] = {}  # (namespace, kind, name) -> uid
        self.namespaces: set[str] = set()
        self.expect_forbidden = False  # a test that asks for a 403 (forbid) says so
        self.proxy = FaultProxy(kapi.server, name=f"kapi-{self.suffix}").start()
        self.home = self.ns("gpufinops")  # the service's own namespace: its ServiceAccount
        self.ensure_namespace(self.home)
        self.account = "gpufinops"
        self.admin.create(f"/api/v1/namespaces/{self.home}/serviceaccounts", {"metadata": {"name": self.account}})
        self.binding = self._bind(SHIPPED_ROLE)
        self.token = self.admin.create(
            f"/api/v1/namespaces/{self.home}/serviceaccounts/{self.account}/token",
            {"spec": {"expirationSeconds": 7200}})["status"]["token"]
        self.extra_roles: list[str] = []
        self.forbidden_rights: list[tuple[str, str]] = []  # (verb, resource) taken away by `forbid`

    # ------------------------------------------------------------------ names
    def ns(self, name: str) -> str:
        """The test's own namespace for `name` (never reused in the session: namespaces never finish deleting)."""
        return f"{name}-{self.suffix}"

    def name(self, name: str) -> str:
        """A cluster-scoped name of this test's own (nodes)."""
        return f"{name}-{self.suffix}"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.home}:{self.account}"

    # ------------------------------------------------------------------ objects
    def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        if name in self.namespaces:
            if labels:
                self.admin.merge(f"/api/v1/namespaces/{name}", {"metadata": {"labels": labels}})
            return
        self.admin.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}})
        self.namespaces.add(name)

    def add(self, resource: str, obj: dict) -> dict:
        """Create `obj` as the stand-in's builders describe it (tests/kubestub.py), then write its status through
        the status subresource; ownerReferences name the real uids of owners added before."""
        obj = copy.deepcopy(obj)
        prefix, kind, namespaced = RESOURCES[resource]
        meta = obj.setdefault("metadata", {})
        if resource == "namespaces":
            self.ensure_namespace(meta["name"], meta.get("labels"))
            return self.get("namespaces", "", meta["name"])
        namespace = meta.get("namespace", "") if namespaced else ""
        if namespaced:
            self.ensure_namespace(namespace)
        obj.setdefault("apiVersion", prefix.removeprefix("/apis/").removeprefix("/api/"))
        obj.setdefault("kind", kind)
        for drop in ("uid", "resourceVersion"):
            meta.pop(drop, None)
        for ref in meta.get("ownerReferences") or []:
            ref["uid"] = self.uids.get((namespace, ref["kind"], ref["name"]), ref.get("uid", "no-such-owner"))
        if resource == "jobs":
            as_real_job(obj)
        status = obj.pop("status", None) if resource != "nodes" else None
        made = self.admin.create(api_path(resource, namespace), obj)
        self.created.append((resource, namespace, meta["name"]))
        self.uids[(namespace, kind, meta["name"])] = made["metadata"]["uid"]
        if status:
            made = self.admin.merge(api_path(resource, namespace, meta["name"], "status"), {"status": status})
        return made

    def add_all(self, objects: dict[str, list[dict]]) -> None:
        """The stand-in's multi-object builders (jobset(), pytorchjob(), rayjob()): owners first."""
        order = ["jobsets", "pytorchjobs", "tfjobs", "xgboostjobs", "paddlejobs", "mpijobs", "rayjobs",
                 "rayclusters", "deployments", "statefulsets", "replicasets", "jobs", "pods"]
        for resource in sorted(objects, key=lambda r: order.index(r) if r in order else -1):
            for obj in objects[resource]:
                self.add(resource, obj)

    def get(self, resource: str, namespace: str, name: str) -> dict:
        return self.admin.get(api_path(resource, namespace, name))

    def delete(self, resource: str, namespace: str, name: str) -> None:
        """Gone at once: grace 0 (no kubelet confirms a pod's end) and background propagation (no garbage
        collector would ever clear the orphan / foreground finalizers)."""
        self.admin.delete(api_path(resource, namespace, name), gracePeriodSeconds=0,
                          propagationPolicy="Background")

    def merge(self, resource: str, namespace: str, name: str, patch: dict) -> dict:
        return self.admin.merge(api_path(resource, namespace, name), patch)

    def list(self, resource: str, namespace: str = "") -> list[dict]:
        return self.admin.get(api_path(resource, namespace))["items"]

    def events(self, reason: str | None = None) -> list[dict]:
        """core/v1 and events.k8s.io/v1 Events in the test's namespaces (both are the same objects in the API)."""
        out = []
        for ns in sorted(self.namespaces):
            out += [e for e in self.list("events", ns) if reason is None or e.get("reason") == reason]
        return out

    # ------------------------------------------------------------------ the service's side
    def write_kubeconfig(self, path: Path) -> Path:
        """The service's kubeconfig: through the proxy, with the test's ServiceAccount token."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kapi",
            "clusters": [{"name": "kapi", "cluster": {"server": self.proxy.url}}],
            "users": [{"name": "kapi", "user": {"token": self.token}}],
            "contexts": [{"name": "kapi", "context": {"cluster": "kapi", "user": "kapi"}}],
        }))
        return path

    def calls(self, verb: str | None = None, resource: str | None = None) -> list[KubeCall]:
        with self.proxy._lock:
            seen = list(self.proxy.seen)
            answered = {f.request.seq: (f.status, f.fault) for f in self.proxy.forwarded}
        out = []
        for req in seen:
            call = parse_call(req, *answered.get(req.seq, (None, "")))
            if (verb is None or call.verb == verb) and (resource is None or call.resource == resource):
                out.append(call)
        return out

    def forbidden(self) -> list[KubeCall]:
        return [c for c in self.calls() if c.status == 403]

    def check_rbac(self) -> None:
        """Every request the service made was allowed by the shipped ClusterRole (unless the test forbade one)."""
        unasked = [f"{c.verb} {c.resource} {c.namespace}/{c.name}" for c in self.forbidden()]
        assert self.expect_forbidden or not unasked, \
            f"the shipped ClusterRole does not allow what the service asked: {unasked}"

    # ------------------------------------------------------------------ faults
    def conflict_next(self, verb: str = "patch", resource: str | None = None, times: int = 1) -> None:
        """A real 409: just before each of the next `times` matching requests reaches the server, the object it
        names is changed (an annotation written by the admin), so a resourceVersion precondition taken from an
        earlier read is stale."""
        def bump(req: Request) -> None:
            call = parse_call(req, None)
            base = call.resource.split("/")[0]
            path = call.path[:call.path.index(f"/{base}/{call.name}")] + f"/{base}/{call.name}"
            self.admin.merge(path, {"metadata": {"annotations": {"kapi.test/bumped": str(time.monotonic_ns())}}})

        self.proxy.arm("hook", call_matches(verb, resource), times=times, hook=bump, forward=True)

    def fail_next(self, status: int, verb: str | None = None, resource: str | None = None) -> None:
        """The proxy answers `status` (a Kubernetes Status body) without forwarding: what a real server cannot
        be made to answer on demand (a 500, a 503); 0: the connection is closed unanswered, nothing forwarded."""
        if status == 0:
            self.proxy.arm("refuse", call_matches(verb, resource), times=1)
            return
        reason = {500: "InternalError", 503: "ServiceUnavailable", 422: "Invalid", 429: "TooManyRequests"}.get(
            status, "Unknown")
        self.proxy.arm("status", call_matches(verb, resource), times=1, status=status,
                       body=_k8s_status(status, reason, f"injected {status} by the fault proxy"),
                       headers={"Content-Type": "application/json"})

    def lose_answer_next(self, status: int = 500, verb: str | None = None, resource: str | None = None) -> None:
        """The server makes the change; its answer is lost: `status` (a 500, a 503) from the proxy, or (0) the
        connection reset."""
        self.proxy.arm("lost", call_matches(verb, resource), times=1, as_reset=(status == 0), status=status or 500)

    @property
    def url(self) -> str:
        """Where the service reaches the API server (the proxy's address)."""
        return self.proxy.url

    def forbid(self, verb: str, resource: str, once: bool = False) -> None:
        """A real 403: the test's identity is rebound to the shipped ClusterRole less `verb` on `resource`
        (e.g. "patch", "deployments"); waits until the server's authorizer says so. `once`: the right comes back
        (the shipped ClusterRole rebound) as soon as the server has answered the next such request, before that
        answer reaches the service."""
        self.expect_forbidden = True
        if once:
            self.proxy.arm("hook", call_matches(verb, resource), times=1, after=True, forward=True,
                           hook=lambda _req: self.restore_rights())
        role = self.admin.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{SHIPPED_ROLE}")
        rules = []
        for rule in role["rules"]:
            if resource in rule.get("resources", []) and verb in rule.get("verbs", []):
                if len(rule["resources"]) > 1:
                    rules.append({**rule, "resources": [r for r in rule["resources"] if r != resource]})
                if len(rule["verbs"]) > 1:
                    rules.append({**rule, "resources": [resource], "verbs": [v for v in rule["verbs"] if v != verb]})
            else:
                rules.append(rule)
        name = f"{SHIPPED_ROLE}-without-{verb}-{resource.replace('/', '-')}-{self.suffix}"
        self.admin.create("/apis/rbac.authorization.k8s.io/v1/clusterroles",
                          {"metadata": {"name": name}, "rules": rules})
        self.extra_roles.append(name)
        old = self.binding
        self.binding = self._bind(name)
        self.admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{old}")
        self.forbidden_rights.append((verb, resource))
        self._wait_until_allowed(verb, resource, False)

    def restore_rights(self) -> None:
        """The test's identity bound to the shipped ClusterRole again (after `forbid`); waits until the server's
        authorizer allows what was forbidden."""
        old = self.binding
        self.binding = self._bind(SHIPPED_ROLE)
        self.admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{old}")
        for verb, resource in self.forbidden_rights:
            self._wait_until_allowed(verb, resource, True)
        self.forbidden_rights.clear()

    def _wait_until_allowed(self, verb: str, resource: str, allowed: bool) -> None:
        role = self.admin.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{SHIPPED_ROLE}")
        group = next((r["apiGroups"][0] for r in role["rules"] if resource in r.get("resources", [])), "")
        base, _, sub = resource.partition("/")
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": self.user, "groups": ["system:serviceaccounts"],
                           "resourceAttributes": {"verb": verb, "group": group, "resource": base,
                                                  "subresource": sub, "namespace": "any"}}}
        deadline = time.monotonic() + 10
        while bool(self.admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)["status"].get(
                "allowed")) != allowed:
            assert time.monotonic() < deadline, "RBAC change not seen by the authorizer after 10 s"
            time.sleep(0.05)

    def _bind(self, role: str) -> str:
        name = f"{role}-{self.suffix}" if not role.endswith(self.suffix) else role
        self.admin.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": self.account, "namespace": self.home}]})
        return name

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        self.proxy.stop()
        for resource, namespace, name in reversed(self.created):
            self.delete(resource, namespace, name)
        # Events the service created, so no later test lists them.
        for ns in self.namespaces:
            self.admin.call("DELETE", f"/api/v1/namespaces/{ns}/events", ok=(200, 404))
        self.admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{self.binding}")
        for role in self.extra_roles:
            self.admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}")
        for ns in self.namespaces:  # stays Terminating for ever, empty
            self.admin.delete(f"/api/v1/namespaces/{ns}")


@pytest.fixture
def kapi_cluster(kapi) -> Iterator[KapiCluster]:
    """This test's part of the real API server; any 403 it did not ask for fails it."""
    cluster = KapiCluster(kapi)
    try:
        yield cluster
        cluster.check_rbac()
    finally:
        cluster.close()
