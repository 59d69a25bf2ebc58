"""One tick's Kubernetes listing on a REAL kube-apiserver, against `kubectl get --raw` of the same lists (issue 37).

    python bench/bench_k8s_listing.py                                   # quick: 1,000 pods / 125 nodes / 250 claims
    python bench/bench_k8s_listing.py --pods 10000 --nodes 1250 --claims 2500   # the issue's size

Starts kube-apiserver v1.36 + etcd from ../shared/kapi (tests/kapi.py's start_kapi: the published CRDs and the
shipped ClusterRole applied), and fills it (parallel creates, a progress line on stderr):
  * GPU nodes: device-plugin nodes with `nvidia.com/gpu: 8` allocatable, and DRA nodes (ceil(claims / 8)) that
    publish one ResourceSlice of 8 GPUs (driver gpu.nvidia.com) and no `nvidia.com/gpu` resource;
  * pods, Running (status written through /status), each on its node (`spec.nodeName`): `claims` of them take
    their GPU through a ResourceClaim (`spec.resourceClaims`, container `resources.claims`), owned by Jobs of 8;
    the rest request `nvidia.com/gpu: 1`, owned by ReplicaSets of 8 under Deployments;
  * ResourceClaims (resource.k8s.io/v1), `status.allocation` (driver, pool, device) and `reservedFor` the pod
    written through the claim's status subresource; one DeviceClass.
The service reads as the shipped ClusterRole's ServiceAccount (a TokenRequest token, as tests/kapi.py does);
kubectl uses the same kubeconfig.

Then, in the same run, interleaved, `--repeat` times each (medians reported):
  gpufinops  KubernetesCluster(api).snapshot(now): the listing one tick makes, through the official client,
             warm connection pool; HTTP requests and the bytes of their answers counted by wrapping the client's
             REST call; peak Python memory from one more snapshot under tracemalloc;
  yardstick  `kubectl get --raw` of exactly the paths the service requested (same query, same page size,
             following `continue`), one kubectl process per page, `--disable-compression` so the server sends the
             same uncompressed JSON the Python client receives: wall time and bytes.
The DRA lists (resourceclaims, resourceslices; deviceclasses and resourceclaimtemplates where DRA is in use) are
fetched with kubectl as well, for what a tick that read them would add; whether the service reads them shows in its
request list.
`--src DIR` imports gpufinops from another worktree (e.g. a branch that reads ResourceClaims).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlencode, urlsplit

ROOT = Path(__file__).resolve().parent.parent
GPU_DRIVER = "gpu.nvidia.com"
DRA_API = "/apis/resource.k8s.io/v1"
GPUS_PER_NODE = 8
PODS_PER_OWNER = 8


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Needs ../shared/kapi (kube-apiserver + etcd), kubectl, openssl, xz, curl.")
    p.add_argument("--pods", type=int, default=1000, help="pods, all Running (default 1000)")
    p.add_argument("--nodes", type=int, default=125, help="GPU nodes, device-plugin + DRA (default 125)")
    p.add_argument("--claims", type=int, default=250, help="allocated ResourceClaims, one per DRA pod (default 250)")
    p.add_argument("--repeat", type=int, default=5, help="timed repeats of each side (default 5)")
    p.add_argument("--threads", type=int, default=8, help="parallel creates while filling (default 8)")
    p.add_argument("--src", type=Path, default=ROOT, help="import gpufinops from this worktree (default: this one)")
    p.add_argument("--keep", action="store_true", help="leave the server's folder (etcd data) in place")
    args = p.parse_args()
    if args.pods < 1 or args.nodes < 1 or args.claims < 0 or args.repeat < 1 or args.threads < 1:
        p.error("--pods, --nodes, --repeat and --threads must be at least 1, --claims at least 0")
    if args.claims > args.pods:
        p.error("--claims cannot exceed --pods (one claim per DRA pod)")
    if math.ceil(args.claims / GPUS_PER_NODE) > args.nodes:
        p.error(f"--claims {args.claims} needs {math.ceil(args.claims / GPUS_PER_NODE)} DRA nodes: raise --nodes")
    return args


# --------------------------------------------------------------------------- filling the cluster


class Progress:
    """A one-line progress bar on stderr: done/total, rate, time left."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done = label, total, 0
        self.began = self.shown = time.monotonic()
        self.lock = threading.Lock()

    def step(self, n: int = 1) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.shown >= 0.5 or self.done >= self.total:
                self.shown = now
                self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self.began, 1e-9)
        left = (self.total - self.done) / rate if rate else 0
        width = 30
        fill = int(width * self.done / max(self.total, 1))
        sys.stderr.write(f"\r[fill] {self.label:<15} [{'#' * fill}{'.' * (width - fill)}] {self.done:>6}/{self.total}"
                         f"  {rate:5.0f}/s  {left:4.0f} s left ")
        sys.stderr.flush()

    def close(self) -> float:
        took = time.monotonic() - self.began
        rate = self.total / max(took, 1e-9)
        sys.stderr.write(f"\r[fill] {self.label:<15} {self.total:>6} in {took:6.1f} s ({rate:.0f}/s)"
                         + " " * 60 + "\n")
        return took


def parallel(label: str, items: list, fn, threads: int) -> list:
    bar = Progress(label, len(items))

    def one(item):
        out = fn(item)
        bar.step()
        return out

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(one, items))
    bar.close()
    return results


def filler_token(kapi) -> str:
    """The admin's token (system:masters), as tests/kapi.Admin carries it."""
    return kapi.admin.session.headers["Authorization"].removeprefix("Bearer ")


class Filler:
    """Creates the cluster's objects as the admin (one requests.Session per thread)."""

    def __init__(self, kapi, admin_cls, threads: int):
        self.kapi, self.threads = kapi, threads
        self.local = threading.local()
        self.admin_cls = admin_cls
        self.token = filler_token(kapi)

    def admin(self):
        if not hasattr(self.local, "admin"):
            self.local.admin = self.admin_cls(self.kapi.server, self.token, self.kapi.ca_cert)
        return self.local.admin

    def create(self, path: str, obj: dict) -> dict:
        return self.admin().create(path, obj)

    def status(self, path: str, status: dict) -> dict:
        return self.admin().merge(path + "/status", {"status": status})


def fill(kapi, admin_cls, args) -> dict:
    started = datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    f = Filler(kapi, admin_cls, args.threads)
    dra_nodes = math.ceil(args.claims / GPUS_PER_NODE)
    plugin_nodes = args.nodes - dra_nodes
    node_names = [f"gpu-{i:05d}" for i in range(args.nodes)]
    n_ns = max(1, args.pods // 200)
    namespaces = [f"team-{i:03d}" for i in range(n_ns)]
    took = {}
    began = time.monotonic()

    def node(i: int) -> dict:
        name, dra = node_names[i], i >= plugin_nodes
        alloc = {"cpu": "96", "memory": "1Ti", "pods": "110"}
        if not dra:
            alloc["nvidia.com/gpu"] = str(GPUS_PER_NODE)
        return f.create("/api/v1/nodes", {
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/zone": "us-east-1a", "topology.kubernetes.io/region": "us-east-1",
                "karpenter.sh/nodepool": "gpu-dra" if dra else "gpu", "nvidia.com/gpu.present": "true"}},
            "spec": {"providerID": f"aws:///us-east-1a/i-{i:017x}"},
            "status": {"capacity": alloc, "allocatable": alloc,
                       "addresses": [{"type": "InternalIP", "address": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"},
                                     {"type": "Hostname", "address": name}]}})

    parallel("nodes", list(range(args.nodes)), node, args.threads)
    parallel("namespaces", namespaces,
             lambda ns: f.create("/api/v1/namespaces", {"metadata": {"name": ns, "labels": {"team": ns}}}),
             args.threads)
    f.create(f"{DRA_API}/deviceclasses", {"metadata": {"name": GPU_DRIVER}, "spec": {"selectors": [
        {"cel": {"expression": f"device.driver == '{GPU_DRIVER}'"}}]}})

    def slice_(i: int) -> dict:
        name = node_names[plugin_nodes + i]
        return f.create(f"{DRA_API}/resourceslices", {
            "metadata": {"name": f"{name}-{GPU_DRIVER}"},
            "spec": {"driver": GPU_DRIVER, "nodeName": name,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{d}", "attributes": {
                         "index": {"int": d}, "uuid": {"string": f"GPU-{plugin_nodes + i:08x}-{d:04x}"},
                         "productName": {"string": "NVIDIA H100 80GB HBM3"}, "type": {"string": "gpu"}},
                         "capacity": {"memory": {"value": "80Gi"}}} for d in range(GPUS_PER_NODE)]}})

    parallel("resourceslices", list(range(dra_nodes)), slice_, args.threads)

    # Pods 0..claims-1 take their GPU through a claim (on the DRA nodes); the rest through the device plugin.
    def ns_of(p: int) -> str:
        return namespaces[p % n_ns]

    def owner_of(p: int) -> tuple[str, str]:  # (kind, name): groups of 8 pods of one namespace
        return ("Job", f"train-{p // (PODS_PER_OWNER * n_ns):05d}") if p < args.claims else \
            ("ReplicaSet", f"serve-{(p - args.claims) // (PODS_PER_OWNER * n_ns):05d}-7d9f")

    owners = sorted({(ns_of(p), *owner_of(p)) for p in range(args.pods)})
    jobs = [o for o in owners if o[1] == "Job"]
    sets = [o for o in owners if o[1] == "ReplicaSet"]

    def template(app: str) -> dict:
        return {"metadata": {"labels": {"app": app}},
                "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:25.01-py3"}]}}

    def job(o) -> dict:
        ns, _k, name = o
        t = template(name)
        t["spec"]["restartPolicy"] = "Never"
        return f.create(f"/apis/batch/v1/namespaces/{ns}/jobs", {"metadata": {"name": name}, "spec": {"template": t}})

    def deployment(o) -> dict:
        ns, _k, name = o
        dep = name.rsplit("-", 1)[0]
        return f.create(f"/apis/apps/v1/namespaces/{ns}/deployments", {
            "metadata": {"name": dep}, "spec": {"replicas": PODS_PER_OWNER, "selector": {"matchLabels": {"app": dep}},
                                                "template": template(dep)}})

    uids = {}
    for o, made in zip(jobs, parallel("jobs", jobs, job, args.threads)):
        uids[o] = made["metadata"]["uid"]
    for o, made in zip(sets, parallel("deployments", sets, deployment, args.threads)):
        uids[(o[0], "Deployment", made["metadata"]["name"])] = made["metadata"]["uid"]

    def replicaset(o) -> dict:
        ns, _k, name = o
        dep = name.rsplit("-", 1)[0]
        return f.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", {
            "metadata": {"name": name, "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "Deployment", "name": dep, "controller": True,
                "uid": uids[(ns, "Deployment", dep)]}]},
            "spec": {"replicas": PODS_PER_OWNER, "selector": {"matchLabels": {"app": dep}}, "template": template(dep)}})

    for o, made in zip(sets, parallel("replicasets", sets, replicaset, args.threads)):
        uids[o] = made["metadata"]["uid"]

    def pod(p: int) -> dict:
        ns, (kind, owner) = ns_of(p), owner_of(p)
        dra = p < args.claims
        node_name = node_names[plugin_nodes + p // GPUS_PER_NODE] if dra else \
            node_names[(p - args.claims) // GPUS_PER_NODE % max(plugin_nodes, 1)]
        container = {"name": "main", "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                     "resources": {"claims": [{"name": "gpu"}]} if dra else
                     {"limits": {"nvidia.com/gpu": "1"}}}
        spec = {"nodeName": node_name, "containers": [container]}
        if dra:
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"pod-{p:06d}-gpu"}]
            spec["restartPolicy"] = "Never"
        name = f"pod-{p:06d}"
        made = f.create(f"/api/v1/namespaces/{ns}/pods", {"metadata": {
            "name": name, "labels": {"app": owner.rsplit("-", 1)[0] if kind == "ReplicaSet" else owner},
            "ownerReferences": [{"apiVersion": "batch/v1" if kind == "Job" else "apps/v1", "kind": kind,
                                 "name": owner, "controller": True, "uid": uids[(ns, kind, owner)]}]},
            "spec": spec})
        f.status(f"/api/v1/namespaces/{ns}/pods/{name}", {
            "phase": "Running", "startTime": started,
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "main", "image": container["image"], "imageID": "", "ready": True,
                                   "restartCount": 0, "started": True,
                                   "state": {"running": {"startedAt": started}}}]})
        return (ns, name, node_name, made["metadata"]["uid"])

    pods = parallel("pods (+status)", list(range(args.pods)), pod, args.threads)

    def claim(p: int) -> dict:
        ns, name, node_name, uid = pods[p]
        path = f"{DRA_API}/namespaces/{ns}/resourceclaims"
        f.create(path, {"metadata": {"name": f"{name}-gpu"}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": GPU_DRIVER, "count": 1}}]}}})
        return f.status(f"{path}/{name}-gpu", {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": GPU_DRIVER, "pool": node_name,
                                                    "device": f"gpu-{p % GPUS_PER_NODE}"}]},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": uid}]})

    parallel("claims (+status)", list(range(args.claims)), claim, args.threads)
    took["fill_s"] = time.monotonic() - began
    took["objects"] = (args.nodes + n_ns + 1 + dra_nodes + len(jobs) + 2 * len(sets) + args.pods + args.claims)
    took["requests"] = took["objects"] + args.pods + args.claims  # + the status writes
    return took


# --------------------------------------------------------------------------- the two sides


class Recorder:
    """Wraps the official client's REST call: every request the service makes, and the bytes of its answer."""

    def __init__(self, api):
        self.requests: list[tuple[str, str]] = []  # (path, query string)
        self.bytes = 0
        rest = api.rest_client
        inner = rest.request

        def request(method, url, query_params=None, *a, **kw):
            answer = inner(method, url, query_params, *a, **kw)
            self.bytes += len(answer.data)  # urllib3 keeps the body: the caller's .data reads the same bytes
            self.requests.append((urlsplit(url).path, urlencode(query_params or [])))
            return answer

        rest.request = request

    def reset(self) -> None:
        self.requests, self.bytes = [], 0


def kubectl_raw(kubeconfig: Path, path: str, query: str) -> tuple[int, int]:
    """One list through `kubectl get --raw`, following `continue`: (pages, bytes)."""
    pages = size = 0
    token = ""
    while True:
        q = "&".join(x for x in (query, f"continue={token}" if token else "") if x)
        out = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "--disable-compression=true",
                              "get", "--raw", f"{path}?{q}" if q else path], capture_output=True, check=True).stdout
        pages, size = pages + 1, size + len(out)
        token = (json.loads(out).get("metadata") or {}).get("continue") or ""
        if not token:
            return pages, size


def first_pages(requests: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The service's lists as first-page requests (the `continue` pages are followed by kubectl_raw)."""
    out = []
    for path, query in requests:
        q = "&".join(x for x in query.split("&") if x and not x.startswith("continue="))
        if (path, q) not in out:
            out.append((path, q))
    return out


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    args = parse_args()
    sys.path.insert(0, str(args.src.resolve()))
    sys.path.insert(1, str(ROOT))  # tests.kapi: the server's start
    if shutil.which("kubectl") is None:
        print("kubectl not found (Debian: apt-get install kubectl; .ci/run installs it)", file=sys.stderr)
        return 2
    kapi_mod = importlib.import_module("tests.kapi")
    cluster_mod = importlib.import_module("gpufinops.places.kubernetes.cluster")
    missing = kapi_mod.kapi_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-k8s-"))
    print(f"gpufinops from {Path(cluster_mod.__file__).resolve().parents[3]}; server folder {workdir}", file=sys.stderr)
    began = time.monotonic()
    kapi, stop = kapi_mod.start_kapi(workdir)
    print(f"[kapi] started in {kapi.started_s:.1f} s, CRDs + ClusterRole applied in {kapi.setup_s:.1f} s",
          file=sys.stderr)
    try:
        return run(args, kapi_mod, cluster_mod, kapi, workdir, began)
    finally:
        stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def run(args, kapi_mod, cluster_mod, kapi, workdir: Path, began: float) -> int:
    filled = fill(kapi, kapi_mod.Admin, args)
    # The service's identity: a ServiceAccount bound to the shipped ClusterRole, a TokenRequest token.
    home = "gpufinops"
    kapi.admin.create("/api/v1/namespaces", {"metadata": {"name": home}})
    kapi.admin.create(f"/api/v1/namespaces/{home}/serviceaccounts", {"metadata": {"name": "gpufinops"}})
    kapi.admin.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": "gpufinops-bench"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": kapi_mod.SHIPPED_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": "gpufinops", "namespace": home}]})
    token = kapi.admin.create(f"/api/v1/namespaces/{home}/serviceaccounts/gpufinops/token",
                              {"spec": {"expirationSeconds": 7200}})["status"]["token"]
    kubeconfig, admin_kubeconfig = workdir / "kubeconfig", workdir / "kubeconfig-admin"
    for path, user_token in ((kubeconfig, token), (admin_kubeconfig, filler_token(kapi))):
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kapi",
            "clusters": [{"name": "kapi", "cluster": {"server": kapi.server,
                                                      "certificate-authority": str(kapi.ca_cert)}}],
            "users": [{"name": "kapi", "user": {"token": user_token}}],
            "contexts": [{"name": "kapi", "context": {"cluster": "kapi", "user": "kapi"}}]}))

    api = cluster_mod.api_client(str(kubeconfig))
    rec = Recorder(api)
    cluster = cluster_mod.KubernetesCluster(api, timeout_s=60)
    snap = cluster.snapshot(datetime.now(timezone.utc))  # warm: connections, the server's watch caches
    lists = first_pages(rec.requests)
    gpus_seen = sum(p.gpu_devices for p in snap.gpu_pods)
    print(f"[tick] lists: {', '.join(p.rsplit('/', 1)[-1] for p, _q in lists)}; snapshot: {len(snap.nodes)} GPU "
          f"nodes, {len(snap.gpu_pods)} GPU pods ({gpus_seen} GPUs), {len(snap.workloads)} workloads, "
          f"{len(snap.other_pods)} other pods", file=sys.stderr)
    dra_lists = [(f"{DRA_API}/resourceclaims", "limit=500"), (f"{DRA_API}/resourceslices", "limit=500")]
    reads_dra = any("resource.k8s.io" in p for p, _q in lists)

    svc_s, svc_req, svc_bytes, kc_s, kc_pages, kc_bytes, dra_s, dra_pages, dra_bytes, floor_s = ([] for _ in range(10))
    for i in range(args.repeat):
        sides = ["service", "kubectl"] if i % 2 == 0 else ["kubectl", "service"]
        for side in sides:
            if side == "service":
                rec.reset()
                t = time.perf_counter()
                cluster.snapshot(datetime.now(timezone.utc))
                svc_s.append(time.perf_counter() - t)
                svc_req.append(len(rec.requests))
                svc_bytes.append(rec.bytes)
            else:
                t = time.perf_counter()
                got = [kubectl_raw(kubeconfig, p, q) for p, q in lists]
                kc_s.append(time.perf_counter() - t)
                kc_pages.append(sum(g[0] for g in got))
                kc_bytes.append(sum(g[1] for g in got))
        if not reads_dra:  # what a tick that read the DRA lists would add, by kubectl
            t = time.perf_counter()
            # The shipped ClusterRole does not allow these lists yet: read as the admin.
            got = [kubectl_raw(admin_kubeconfig, p, q) for p, q in dra_lists]
            dra_s.append(time.perf_counter() - t)
            dra_pages.append(sum(g[0] for g in got))
            dra_bytes.append(sum(g[1] for g in got))
        t = time.perf_counter()  # kubectl's own floor: one process, one tiny answer
        subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "get", "--raw", "/version"], capture_output=True,
                       check=True)
        floor_s.append(time.perf_counter() - t)
        sys.stderr.write(f"\r[measure] repeat {i + 1}/{args.repeat}: service {svc_s[-1]:.2f} s, "
                         f"kubectl {kc_s[-1]:.2f} s   ")
        sys.stderr.flush()
    sys.stderr.write("\n")

    rec.reset()
    tracemalloc.start()
    cluster.snapshot(datetime.now(timezone.utc))
    _cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    mib = 1024 * 1024
    print(f"\ncluster: {args.nodes} nodes ({math.ceil(args.claims / GPUS_PER_NODE)} DRA), {args.pods} pods, "
          f"{args.claims} ResourceClaims; filled in {filled['fill_s']:.0f} s ({filled['requests']} requests, "
          f"{filled['requests'] / filled['fill_s']:.0f}/s, {args.threads} threads); median of {args.repeat}, "
          f"interleaved; {os.cpu_count()} cores")
    print(f"service lists ({len(lists)}): " + ", ".join(p for p, _q in lists))
    print("\n| | wall s | requests | bytes from the server | peak Python MiB |")
    print("|---|---:|---:|---:|---:|")
    print(f"| gpufinops `KubernetesCluster.snapshot` | {median(svc_s):.2f} | {median(svc_req):.0f} | "
          f"{median(svc_bytes):,.0f} | {peak / mib:.0f} |")
    print(f"| yardstick `kubectl get --raw`, same lists | {median(kc_s):.2f} | {median(kc_pages):.0f} | "
          f"{median(kc_bytes):,.0f} | - |")
    print(f"| (kubectl's floor: one process, `get --raw /version`) | {median(floor_s):.2f} | 1 | - | - |")
    if not reads_dra:
        print(f"| not read by this code: resourceclaims + resourceslices, `kubectl get --raw` (admin) | "
              f"{median(dra_s):.2f} | {median(dra_pages):.0f} | {median(dra_bytes):,.0f} | - |")
    print(f"\nservice: GPU nodes {len(snap.nodes)}, GPU pods {len(snap.gpu_pods)}, GPUs {gpus_seen}; "
          f"DRA lists read: {'yes' if reads_dra else 'no'}; runs: service {', '.join(f'{s:.2f}' for s in svc_s)} s, "
          f"kubectl {', '.join(f'{s:.2f}' for s in kc_s)} s; whole run {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
