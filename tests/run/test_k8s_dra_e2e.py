"""DRA workloads end to end (issue 37): the tick (pipeline.run_once) over a REAL kube-apiserver (tests/kapi.py: the
service's token bound to the shipped ClusterRole, so every DRA list it makes must be granted there) and a real
Prometheus, on one node whose GPUs are handed out both ways at once: two by NVIDIA's device plugin
(`nvidia.com/gpu: 2`) and six by NVIDIA's DRA driver (a ResourceSlice of gpu-2 .. gpu-7, with the uuids
dcgm-exporter reports). There is no scheduler, no claim controller and no garbage collector on the test server: the
claims a template generates are created here as kube-controller-manager makes them (owned by their pod, annotated
`resource.kubernetes.io/pod-claim-name`), and each claim's allocation and reservedFor are written through its status
subresource, as the scheduler would.

On the node (pods sorted as the cost split sees them):
  ml/dra-infer-5f-aaaaa    Deployment dra-infer, a template's claim: gpu-2 (0 %)
  ml/dra-infer-5f-bbbbb    the same, gpu-3 (0 %); its pod status does not name its claim yet (found by owner)
  ml/plugin-busy-7c-ccccc  Deployment plugin-busy, nvidia.com/gpu: 1 (GPU 0, 80 %)
  ml/shared-a, ml/shared-b one claim reserved for both: gpu-5 (60 %), half each
  ml/two-claims            two claims (gpu-6 70 %, gpu-7 0 %), its container naming only the first
  research/dra-train-x1x1x Job dra-train, a template's claim: gpu-4 (0 %)
and GPU 1 (device plugin) held by no pod. The expected cents are worked by hand in each test, not recomputed.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from fractions import Fraction

import pytest

from gpufinops.collect.prometheus import FB_USED, GPU_UTIL
from gpufinops.config import load_settings
from gpufinops.k8s.model import (
    MARK_ANNOTATION, PRE_SUSPEND_ANNOTATION, REPLICAS_BEFORE_ANNOTATION, SUSPENDED_ANNOTATION, WorkloadRef,
)
from gpufinops.model import Action, ActionKind, Rule, RunContext, Verdict
from gpufinops.notify.delivery import build_notifier
from gpufinops.places.fleet import WorkloadMetrics
from gpufinops.places.kubernetes.cloud import WorkloadCloud
from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client
from gpufinops.places.kubernetes.costs import IDLE_CAPACITY, UNALLOCATED, allocation_split, attribute, cents_of
from gpufinops.places.kubernetes.names import EVENT_SCALED_DOWN, EVENT_SUSPENDED, workload_id
from gpufinops.places.kubernetes.usage import PodMetrics
from gpufinops.rules import load_rules
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.store.store import Store
from tests.kapi import KapiCluster
from tests.kubestub import jobset, kueue_workload, node_obj, owned, pod_obj
from tests.promserver import Series, binaries_missing, dcgm_labels, start_prometheus

pytestmark = pytest.mark.integration

SCRAPE, WINDOW, LEAD = 30, 1800, 900
NOW = datetime.fromtimestamp(int(time.time()) // SCRAPE * SCRAPE, timezone.utc)
LONG_AGO = NOW - timedelta(days=2)
RULE = Rule(name="k8s-idle", threshold_pct=5.0, window_s=WINDOW, warning_lead_s=LEAD, action=Action.STOP)
PRICE = 32.7726  # USD/h of the node (p4d.24xlarge): 3277 cents an hour, 409.625 per GPU
DRIVER = "gpu.nvidia.com"
R = "/apis/resource.k8s.io/v1"
EXPORTER = {"pod": "nvidia-dcgm-exporter-q7x2k", "namespace": "gpu-operator"}  # DRA leaves the pod labels empty
SUFFIXES = [f"dre{i}" for i in range(8)]  # each test its own namespaces and node; the module's Prometheus has all
_SUFFIXES = iter(SUFFIXES)
INFER_A, INFER_B, BUSY, TRAIN = "dra-infer-5f-aaaaa", "dra-infer-5f-bbbbb", "plugin-busy-7c-ccccc", "dra-train-x1x1x"
# GPU index -> util % (GPUs 0 and 1 are the device plugin's; 2..7 the DRA driver's)
UTIL = {0: 80.0, 1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0, 5: 60.0, 6: 70.0, 7: 0.0}


def node_name(suffix: str) -> str:
    return f"mixed-{suffix}"


def grid() -> list[float]:
    start, end = NOW.timestamp() - WINDOW, NOW.timestamp() + 1800
    return [start + SCRAPE * i for i in range(int((end - start) // SCRAPE) + 1)]


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory):
    missing = binaries_missing()
    if missing:
        pytest.skip(missing)
    series = []
    for suffix in SUFFIXES:
        for gpu, util in UTIL.items():
            pod = {"pod": BUSY, "namespace": f"ml-{suffix}", "container": "main"} if gpu == 0 else EXPORTER
            labels = dcgm_labels(node_name(suffix), gpu, **pod)
            series += [Series(GPU_UTIL, labels, [(t, util) for t in grid()]),
                       Series(FB_USED, labels, [(t, 1024.0) for t in grid()])]
    server = start_prometheus(tmp_path_factory.mktemp("k8s-dra-prom"), series)
    yield server.url
    server.stop()


def attrs(**values) -> dict:
    return {k: {"int": v} if isinstance(v, int) else {"string": v} for k, v in values.items()}


def claim_spec(device_class: str, count: int = 1) -> dict:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}]}}


def dra_spec(pod: dict, claims: dict[str, tuple[str, str]], seen_by_container: list[str] | None = None) -> dict:
    """`pod` (a pod_obj) made a DRA pod: no nvidia.com/gpu, `claims` its spec.resourceClaims (entry -> (key, name):
    resourceClaimName or resourceClaimTemplateName), its container naming `seen_by_container` (default: all)."""
    pod["spec"]["resourceClaims"] = [{"name": entry, key: name} for entry, (key, name) in claims.items()]
    names = list(claims) if seen_by_container is None else seen_by_container
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": n} for n in names]}
    return pod


class DraCluster:
    """The test's part of the session's server, with a node holding device-plugin and DRA GPUs at once."""

    def __init__(self, kapi, tmp_path, prom_url, slack_stub, monkeypatch, *, suspend_kueue: bool = False):
        self.suffix = next(_SUFFIXES)  # StopIteration: add suffixes to SUFFIXES
        self.kube = KapiCluster(kapi, self.suffix)
        self.made: list[str] = []  # DRA objects (admin paths), deleted at close
        self.node = node_name(self.suffix)
        self.ml, self.research = self.kube.ns("ml"), self.kube.ns("research")
        self.device_class = f"gpu-{self.suffix}"
        self.infer = WorkloadRef(self.ml, "Deployment", "dra-infer")
        self.busy = WorkloadRef(self.ml, "Deployment", "plugin-busy")
        self.train = WorkloadRef(self.research, "Job", "dra-train")
        try:
            self.fill()
        except Exception:
            self.close()
            raise
        self.now = NOW
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
        self.kubeconfig = self.kube.write_kubeconfig(tmp_path / "kubeconfig")
        self.settings = load_settings(
            prometheus={"url": prom_url, "scrape_interval_s": SCRAPE},
            slack={"base_url": slack_stub.base_url, "default_channel": "#gpu-finops", "max_retries": 1},
            act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 1.0},
            kubernetes={"kubeconfig": str(self.kubeconfig)},
            database_url=f"sqlite:///{tmp_path / 'gpufinops.db'}")
        self.store = Store(self.settings.database_url)
        self.cloud = WorkloadCloud(KubernetesCluster(api_client(str(self.kubeconfig))), lambda *_: PRICE,
                                   scale_to_zero=True, suspend_kueue=suspend_kueue, clock=lambda: self.now)
        self.peers = Peers(self.cloud, WorkloadMetrics(PodMetrics(self.settings.prometheus), self.cloud), self.store,
                           build_notifier(self.settings.slack, self.store, lambda: self.now))
        self.rules = [RULE]

    # ------------------------------------------------------------------ the cluster
    def create(self, path: str, obj: dict) -> dict:
        made = self.kube.admin.create(path, obj)
        self.made.append(f"{path}/{obj['metadata']['name']}")
        return made

    def uid(self, namespace: str, pod: str) -> str:
        return self.kube.get("pods", namespace, pod)["metadata"]["uid"]

    def claim(self, namespace: str, name: str, devices: list[str], pods: list[str], *, generated_for: str = "",
              entry: str = "gpu") -> None:
        """A claim allocated `devices` of the node's slice and reserved for `pods`; `generated_for`: the pod whose
        template it was generated from (owned by it and annotated, as the claim controller makes it)."""
        meta: dict = {"name": name, "namespace": namespace}
        if generated_for:
            meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": entry}
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": generated_for,
                                        "uid": self.uid(namespace, generated_for), "controller": True,
                                        "blockOwnerDeletion": True}]
        self.create(f"{R}/namespaces/{namespace}/resourceclaims",
                    {"metadata": meta, "spec": claim_spec(self.device_class, len(devices))})
        self.kube.admin.merge(f"{R}/namespaces/{namespace}/resourceclaims/{name}/status", {"status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": self.node,
                                                    "device": d} for d in devices]}},
            "reservedFor": [{"resource": "pods", "name": p, "uid": self.uid(namespace, p)} for p in pods]}})

    def template(self, namespace: str, name: str) -> None:
        self.kube.ensure_namespace(namespace)
        self.create(f"{R}/namespaces/{namespace}/resourceclaimtemplates",
                    {"metadata": {"name": name, "namespace": namespace},
                     "spec": {"spec": claim_spec(self.device_class)}})

    def templated_pod(self, namespace: str, pod: dict, template: str, device: str, *, status_names_it: bool = True):
        """A pod whose claim `gpu` comes from `template`; its generated claim allocated `device`."""
        claim = f"{pod['metadata']['name']}-gpu-k2x9p"
        if status_names_it:
            pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim}]
        self.kube.add("pods", dra_spec(pod, {"gpu": ("resourceClaimTemplateName", template)}))
        self.claim(namespace, claim, [device], [pod["metadata"]["name"]], generated_for=pod["metadata"]["name"])

    def fill(self) -> None:
        kube = self.kube
        kube.add("nodes", node_obj(self.node, "i-0dre0000000000001", gpus=2, created=LONG_AGO,
                                   labels={"karpenter.sh/nodepool": "mixed",
                                           "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}))
        self.create(f"{R}/deviceclasses", {"metadata": {"name": self.device_class}, "spec": {
            "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})
        self.create(f"{R}/resourceslices", {"metadata": {"name": f"{self.node}-gpu"}, "spec": {
            "driver": DRIVER, "nodeName": self.node,
            "pool": {"name": self.node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}", "attributes": attrs(
                type="gpu", uuid=dcgm_labels(self.node, i)["UUID"], index=i, productName="NVIDIA A100-SXM4-40GB")}
                for i in range(2, 8)]}})
        for ns, labels in ((self.ml, {"team": "ml"}), (self.research, {})):
            kube.add("namespaces", {"metadata": {"name": ns, "labels": labels}})
        kube.add("deployments", owned(self.ml, "dra-infer", replicas=2, labels={"team": "ml"},
                                      annotations={"owner": "alice@example.com"}))
        kube.add("replicasets", owned(self.ml, "dra-infer-5f", owner=("Deployment", "dra-infer")))
        kube.add("deployments", owned(self.ml, "plugin-busy", replicas=1, labels={"team": "ml"}))
        kube.add("replicasets", owned(self.ml, "plugin-busy-7c", owner=("Deployment", "plugin-busy")))
        self.template(self.ml, "dra-infer-gpu")
        for pod, device, named in ((INFER_A, "gpu-2", True), (INFER_B, "gpu-3", False)):
            self.templated_pod(self.ml, pod_obj(self.ml, pod, self.node, gpus=0, owner=("ReplicaSet", "dra-infer-5f"),
                                                started=LONG_AGO), "dra-infer-gpu", device, status_names_it=named)
        kube.add("pods", pod_obj(self.ml, BUSY, self.node, gpus=1, owner=("ReplicaSet", "plugin-busy-7c"),
                                 started=LONG_AGO))
        for pod in ("shared-a", "shared-b"):
            kube.add("pods", dra_spec(pod_obj(self.ml, pod, self.node, gpus=0, started=LONG_AGO),
                                      {"gpu": ("resourceClaimName", "shared-gpu")}))
        self.claim(self.ml, "shared-gpu", ["gpu-5"], ["shared-a", "shared-b"])
        kube.add("pods", dra_spec(pod_obj(self.ml, "two-claims", self.node, gpus=0, started=LONG_AGO),
                                  {"first": ("resourceClaimName", "two-first"),
                                   "second": ("resourceClaimName", "two-second")}, seen_by_container=["first"]))
        self.claim(self.ml, "two-first", ["gpu-6"], ["two-claims"])
        self.claim(self.ml, "two-second", ["gpu-7"], ["two-claims"])
        kube.add("jobs", owned(self.research, "dra-train"))
        self.template(self.research, "dra-train-gpu")
        self.templated_pod(self.research, pod_obj(self.research, TRAIN, self.node, gpus=0, owner=("Job", "dra-train"),
                                                  started=LONG_AGO), "dra-train-gpu", "gpu-4")

    # ------------------------------------------------------------------ the service
    def tick(self, minutes: float):
        self.now = NOW + timedelta(minutes=minutes)
        return run_once(RunContext(now=self.now, dry_run=False), self.settings, self.rules, self.peers)

    def snapshot(self):
        return KubernetesCluster(api_client(str(self.kubeconfig))).snapshot(NOW)

    def patches(self, resource: str | None = None):
        return self.kube.calls(verb="patch", resource=resource)

    def close(self) -> None:
        for path in reversed(self.made):
            self.kube.admin.delete(path)
        self.kube.close()


@pytest.fixture
def cluster(kapi, tmp_path, prom_url, slack_stub, monkeypatch):
    c = DraCluster(kapi, tmp_path, prom_url, slack_stub, monkeypatch)
    try:
        yield c
        c.kube.check_rbac()  # any request the shipped ClusterRole does not grant fails the test
    finally:
        c.close()


def test_one_node_with_device_plugin_and_dra_gpus_is_priced_to_the_cent(cluster):
    """3277 cents over 8 GPUs (409.625 each): infer-a 1, infer-b 1, busy 1 (device plugin), shared-a 1/2,
    shared-b 1/2, two-claims 2, train 1, idle capacity 1 (GPU 1). Floors 409 409 409 204 204 819 409 409 = 3272; the
    5 cents left go to the largest remainders: shared-a and shared-b (.8125), then infer-a, infer-b and busy
    (.625, the earlier rows of the tie)."""
    snap = cluster.snapshot()
    shares = attribute(snap, {cluster.node: PRICE})
    got = {s.pod or IDLE_CAPACITY: s.cents for s in shares}
    assert got == {INFER_A: 410, INFER_B: 410, BUSY: 410, "shared-a": 205, "shared-b": 205, "two-claims": 819,
                   TRAIN: 409, IDLE_CAPACITY: 409}
    assert sum(got.values()) == cents_of(PRICE) == 3277
    assert {s.pod: (s.gpus, s.allocation) for s in shares if s.pod} == {
        INFER_A: (1, "dra"), INFER_B: (1, "dra"), BUSY: (1, "device-plugin"), "shared-a": (Fraction(1, 2), "dra"),
        "shared-b": (Fraction(1, 2), "dra"), "two-claims": (2, "dra"), TRAIN: (1, "dra")}
    # DRA shares + device-plugin shares + unallocated = the node's cost, and its 8 GPUs.
    split = allocation_split(shares)[cluster.node]
    assert split == {"device-plugin": (1, 410), "dra": (6, 410 + 410 + 205 + 205 + 819 + 409),
                     UNALLOCATED: (1, 409)}
    assert sum(c for _g, c in split.values()) == 3277 and sum(g for g, _c in split.values()) == 8
    [node] = [n for n in snap.nodes if n.name == cluster.node]
    assert (node.gpu_devices, node.dra_gpus, node.gpu_count) == (2, 6, 8)
    pods = {p.name: p for p in snap.gpu_pods}
    # The Deployment's pod whose status does not name its generated claim yet: found by its owner and annotation.
    assert [h.claim for h in pods[INFER_B].dra] == [f"{cluster.ml}/{INFER_B}-gpu-k2x9p"]
    assert pods[INFER_B].dra[0].template == f"{cluster.ml}/dra-infer-gpu"
    assert pods[INFER_B].dra[0].device_class == cluster.device_class
    # A template's claim is the pod's, so the Job's.
    assert pods[TRAIN].workload == cluster.train and pods[TRAIN].dra[0].template == f"{cluster.research}/dra-train-gpu"
    # A container naming one of the pod's two claims: the pod holds both (each its own GPU).
    assert {h.device: h.containers for h in pods["two-claims"].dra} == {"gpu-6": ("main",), "gpu-7": ()}
    assert snap.device_classes[cluster.device_class] == (DRIVER,)


def test_the_tick_records_and_exports_how_each_gpu_was_allocated(cluster):
    """Through the tick: the node-hour row carries the node's allocation and the DRA part of its pods' cents, the
    workloads' labels their allocation, and /metrics each node's cost and GPUs per allocation."""
    from gpufinops.run.service import Service

    # The service's own tick (as `serve` runs it), covering the one interval before it (60 s): within one hour.
    service = Service(cluster.settings, cluster.peers, clock=lambda: cluster.now)
    cluster.now = NOW + timedelta(minutes=0 if (NOW.minute, NOW.second) >= (1, 0) else 1.5)
    report = service.tick()
    # Only the shared claim's pods go without metrics (UNKNOWN, said): the cluster was read.
    assert not report.errors and set(report.degraded()) == {"prometheus"}
    assert "shared by 2 pods" in report.degraded()["prometheus"]
    [row] = cluster.store.node_hours_frame(NOW - timedelta(hours=1), NOW + timedelta(hours=1)).to_dict("records")
    # 60 s of 3277 cents an hour: 55 cents, 6.875 per GPU: floors 6 6 6 3 3 13 6 6 = 49, the 6 cents left to the
    # five .875 (infer-a, infer-b, busy, train, idle) and two-claims' .75: busy 7 (device plugin), DRA 7 + 7 + 3 + 3
    # + 14 + 7 = 41, idle capacity 7.
    assert (row["allocation"], row["gpus"], row["sharing"], row["hours"]) == ("device-plugin,dra", 8, "whole",
                                                                                pytest.approx(1 / 60))
    assert (row["node_cents"], row["pods_cents"], row["dra_cents"], row["idle_cents"]) == (55, 48, 41, 7)
    labels = cluster.store.instance_labels()
    assert labels[workload_id(cluster.infer)]["allocation"] == "dra"
    assert labels[workload_id(cluster.busy)]["allocation"] == "device-plugin"
    assert labels[workload_id(cluster.train)]["allocation"] == "dra"

    text = service.metrics.body().decode()  # /metrics
    for way, gpus, usd in (("device-plugin", 1.0, 4.1), ("dra", 6.0, 24.58), ("unallocated", 1.0, 4.09)):
        labels_ = f'node="{cluster.node}",node_pool="mixed",allocation="{way}"'
        assert f"gpufinops_k8s_node_gpus{{{labels_}}} {gpus!r}" in text
        assert f"gpufinops_k8s_node_hourly_cost{{{labels_}}} {usd!r}" in text


def test_an_idle_dra_deployment_is_marked_warned_scaled_to_zero_and_restored(cluster, slack_stub, tmp_path, capsys):
    from gpufinops.cli.app import main

    infer_id = workload_id(cluster.infer)
    decisions = {d.instance_id: d for d in cluster.tick(0).decisions}
    # Judged by its devices' DCGM series (joined by node and UUID; the pod labels name the exporter's own pod).
    assert decisions[infer_id].verdict == Verdict.IDLE, decisions[infer_id].reason
    assert decisions[workload_id(cluster.busy)].verdict == Verdict.ACTIVE
    # Both claims' GPUs are the pod's, the one its container does not name (gpu-7, 0 %) too: half its GPUs idle.
    assert decisions[workload_id(WorkloadRef(cluster.ml, "Pod", "two-claims"))].verdict == Verdict.UNDERUTILIZED
    shared = decisions[workload_id(WorkloadRef(cluster.ml, "Pod", "shared-a"))]
    assert shared.verdict == Verdict.UNKNOWN and "shared by 2 pods" in shared.reason
    stop_at = (NOW + timedelta(seconds=LEAD)).strftime("%Y-%m-%dT%H:%M:%SZ")
    dep = cluster.kube.get("deployments", cluster.ml, "dra-infer")
    assert dep["metadata"]["annotations"][MARK_ANNOTATION] == stop_at
    warnings = [m for m in slack_stub.posted("#gpu-finops") if infer_id in m.get("text", "")]
    assert warnings and "will be scaled to zero" in warnings[0]["text"]
    assert {r.name for r in cluster.patches()} == {"dra-infer"}

    cluster.tick(10)  # before the announced time: nothing more
    assert cluster.kube.get("deployments", cluster.ml, "dra-infer")["spec"]["replicas"] == 2
    cluster.tick(16)  # the lead is over, still idle: scaled to zero, the count kept
    dep = cluster.kube.get("deployments", cluster.ml, "dra-infer")
    assert dep["spec"]["replicas"] == 0 and dep["metadata"]["annotations"][REPLICAS_BEFORE_ANNOTATION] == "2"
    assert [(s.instance_id, s.status) for s in cluster.store.action_rows(kinds=[ActionKind.STOP])] == [
        (infer_id, "done")]
    assert cluster.kube.events(EVENT_SCALED_DOWN)
    assert {r.resource for r in cluster.patches()} == {"deployments"}  # no claim, slice or pod was ever changed

    # The controllers take the pods and their generated claims away; the workload keeps its allocation in the store.
    for pod in (INFER_A, INFER_B):
        cluster.kube.delete("pods", cluster.ml, pod)
        cluster.kube.admin.delete(f"{R}/namespaces/{cluster.ml}/resourceclaims/{pod}-gpu-k2x9p")
    cluster.tick(20)
    assert cluster.store.instance_labels()[infer_id]["allocation"] == "dra"
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {cluster.kubeconfig}\nact:\n  dry_run: false\n"
                   f"database_url: {cluster.settings.database_url}\n")
    assert main(["--config", str(cfg), "k8s", "restore", f"{cluster.ml}/dra-infer", "--by", "alice"]) == 0, \
        capsys.readouterr().err
    assert "restored to 2 replicas for alice" in capsys.readouterr().out
    dep = cluster.kube.get("deployments", cluster.ml, "dra-infer")
    assert dep["spec"]["replicas"] == 2 and REPLICAS_BEFORE_ANNOTATION not in dep["metadata"]["annotations"]
    assert cluster.kube.calls() and not cluster.kube.forbidden()


# --------------------------------------------------------------------------- Kueue suspend of a DRA job


def kueue_rules(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: idle-kueue\n    threshold_pct: 5\n    window: 30m\n    warning_lead: 15m\n"
                     "    action: suspend\n    select:\n      tags:\n        kueue.x-k8s.io/queue-name: '*'\n"
                     "        k8s:workload-priority-class: [batch-low]\n")
    return load_rules([rules])


def as_jobset(c: DraCluster) -> WorkloadRef:
    """The idle DRA pod (gpu-4) owned instead by a JobSet's Job, its claim still from a template."""
    objects = jobset(c.research, "pretrain", c.node, replicas=1, gpus=0, started=LONG_AGO,
                     labels={"kueue.x-k8s.io/priority-class": "batch-low"}, pod_names=[f"{TRAIN}-js"])
    [pod] = objects.pop("pods")
    c.kube.add_all(objects)
    c.templated_pod(c.research, pod, "dra-train-gpu", "gpu-4")
    # The Job's own pod and claim are gone: gpu-4 is the JobSet pod's now.
    c.kube.delete("pods", c.research, TRAIN)
    c.kube.admin.delete(f"{R}/namespaces/{c.research}/resourceclaims/{TRAIN}-gpu-k2x9p")
    c.made.remove(f"{R}/namespaces/{c.research}/resourceclaims/{TRAIN}-gpu-k2x9p")
    c.kube.add("workloads", kueue_workload(c.research, "pretrain", priority_class="batch-low", kind="JobSet",
                                           api_version="jobset.x-k8s.io/v1alpha2"))
    return WorkloadRef(c.research, "JobSet", "pretrain")


@pytest.fixture(params=["Job", "JobSet"])
def kueue_cluster(request, kapi, tmp_path, prom_url, slack_stub, monkeypatch):
    c = DraCluster(kapi, tmp_path, prom_url, slack_stub, monkeypatch, suspend_kueue=True)
    try:
        if request.param == "Job":
            c.kube.merge("jobs", c.research, "dra-train", {"metadata": {"labels": {
                "kueue.x-k8s.io/queue-name": "gpu-queue", "kueue.x-k8s.io/priority-class": "batch-low"}}})
            c.kube.add("workloads", kueue_workload(c.research, "dra-train", priority_class="batch-low"))
            c.ref, c.wl = c.train, "job-dra-train-5b8c1"
        else:
            c.ref, c.wl = as_jobset(c), "jobset-pretrain-5b8c1"
        c.rules = kueue_rules(tmp_path)
        yield c
        c.kube.check_rbac()
    finally:
        c.close()


def test_an_idle_dra_job_or_jobset_is_suspended_through_kueue_and_resumed(kueue_cluster, slack_stub, tmp_path,
                                                                          capsys):
    from gpufinops.cli.app import main

    c = kueue_cluster
    iid = workload_id(c.ref)
    decision = {d.instance_id: d for d in c.tick(0).decisions}[iid]
    assert decision.verdict == Verdict.IDLE, decision.reason
    stop_at = (NOW + timedelta(seconds=LEAD)).strftime("%Y-%m-%dT%H:%M:%SZ")
    wl = c.kube.get("workloads", c.research, c.wl)
    assert wl["metadata"]["annotations"][MARK_ANNOTATION] == stop_at
    assert wl["metadata"]["annotations"][PRE_SUSPEND_ANNOTATION] == stop_at
    [warning] = [m for m in slack_stub.posted("#gpu-finops") if iid in m.get("text", "")]
    assert "will be suspended" in warning["text"]
    c.tick(10)
    assert c.kube.get("workloads", c.research, c.wl)["spec"]["active"] is True  # not before the lead ends
    c.tick(16)
    wl = c.kube.get("workloads", c.research, c.wl)
    assert wl["spec"]["active"] is False and SUSPENDED_ANNOTATION in wl["metadata"]["annotations"]
    assert [s.status for s in c.store.action_rows(kinds=[ActionKind.STOP])] == ["done"]
    [event] = c.kube.events(EVENT_SUSPENDED)
    assert (event["involvedObject"]["kind"], event["involvedObject"]["name"]) == (c.ref.kind, c.ref.name)
    assert {r.resource for r in c.patches()} == {"workloads"}  # the DRA Deployment is under no rule here
    assert c.store.instance_labels()[iid]["allocation"] == "dra"

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {c.kubeconfig}\n  suspend_kueue: true\nact:\n  dry_run: false\n"
                   f"database_url: {c.settings.database_url}\n")
    assert main(["--config", str(cfg), "k8s", "restore", f"{c.ref.namespace}/{c.ref.kind}/{c.ref.name}", "--by",
                 "bob"]) == 0, capsys.readouterr().err
    assert "spec.active: true" in capsys.readouterr().out
    assert c.kube.get("workloads", c.research, c.wl)["spec"]["active"] is True


def test_the_monthly_report_says_how_each_gpu_was_allocated(cluster, tmp_path):
    """The month so far, written by three ticks: the node pool table's allocation and DRA part of the pods' cost (the
    stored node hours' sums, to the cent), the workloads table's allocation, in the JSON, the CSV and the page."""
    import csv
    import json

    from gpufinops.report import write_monthly_report

    first = 0 if (NOW.minute, NOW.second) >= (3, 0) else 3.5  # the three ticks within one hour
    for m in (first, first + 1, first + 2):
        cluster.tick(m)
    frame = cluster.store.node_hours_frame(NOW - timedelta(hours=1), NOW + timedelta(hours=1))
    assert len(frame) == 1 and frame["ticks"].sum() == 3
    month = NOW.strftime("%Y-%m")
    paths = write_monthly_report(cluster.store, month, tmp_path / "out", cluster.now + timedelta(minutes=1),
                                 cluster.settings)
    doc = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    [pool] = doc["tables"]["k8s_node_pools"]
    assert (pool["node_pool"], pool["allocation"], pool["sharing"]) == ("mixed", "device-plugin, dra", "whole")
    assert round(pool["dra_pods_cost"] * 100) == int(frame["dra_cents"].sum()) > 0
    assert round(pool["pods_cost"] * 100) == int(frame["pods_cents"].sum()) > round(pool["dra_pods_cost"] * 100)
    # Each tick's 55 cents: 41 DRA, 7 device plugin, 7 idle capacity.
    assert (int(frame["dra_cents"].sum()), int(frame["pods_cents"].sum()), int(frame["idle_cents"].sum())) == (
        3 * 41, 3 * 48, 3 * 7)
    workloads = {r["instance_id"]: r["allocation"] for r in doc["tables"]["k8s_workloads"]}
    assert workloads[workload_id(cluster.infer)] == "dra"
    assert workloads[workload_id(cluster.busy)] == "device-plugin"
    [pools_csv] = [p for p in paths if p.name.endswith("-k8s-node-pools.csv")]
    with pools_csv.open() as f:
        [row] = list(csv.DictReader(f))
    assert row["allocation"] == "device-plugin, dra" and float(row["dra_pods_cost_usd"]) == pool["dra_pods_cost"]
    html = next(p for p in paths if p.suffix == ".html").read_text()
    assert "GPUs allocated by" in html and "of which DRA" in html and "device-plugin, dra" in html
