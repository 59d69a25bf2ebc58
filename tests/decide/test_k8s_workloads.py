"""Kubernetes GPU workloads end to end: the cluster read through the official client from a kubeconfig pointing
at a real kube-apiserver (tests/kapi.py: the service's token bound to the shipped ClusterRole), per-pod DCGM usage
from a real Prometheus backfilled with pod-labelled series, cost shares with idle capacity, and verdicts per
workload by the same evaluate()."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.places.kubernetes.usage import PodMetrics
from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client, node_group_of
from gpufinops.collect.prometheus import FB_USED, GPU_UTIL, GR_ENGINE_ACTIVE
from gpufinops.config import PrometheusSettings
from gpufinops.places.kubernetes.costs import IDLE_CAPACITY, attribute, cents_of, cluster_cents, cost_by
from gpufinops.k8s.model import WorkloadRef
from gpufinops.model import Rule
from tests.kapi import KapiCluster
from tests.kubestub import node_obj, owned, pod_obj
from tests.promserver import Series, binaries_missing, dcgm_labels, start_prometheus

pytestmark = pytest.mark.integration

SCRAPE = 30
WINDOW = 1800  # 30 minutes: 60 expected samples per GPU
NOW = datetime.fromtimestamp(int(time.time()) // SCRAPE * SCRAPE, timezone.utc)
LONG_AGO = NOW - timedelta(days=2)
RULE = Rule(name="k8s-idle", threshold_pct=5.0, window_s=WINDOW)

# The module's own namespaces on the session's server (a namespace never finishes terminating there: never reused).
SUFFIX = "wl"
ML, RESEARCH, SERVING, OPERATOR = (f"{ns}-{SUFFIX}" for ns in ("ml", "research", "serving", "gpu-operator"))
NODE_A, NODE_B, NODE_MIG = "ip-10-0-1-1.ec2.internal", "ip-10-0-1-2.ec2.internal", "ip-10-0-1-3.ec2.internal"
IDLE = WorkloadRef(ML, "Deployment", "idle-infer")
BUSY = WorkloadRef(ML, "Deployment", "busy-train")
JOB = WorkloadRef(RESEARCH, "Job", "batch-eval")
GHOST = WorkloadRef(RESEARCH, "Deployment", "ghost")
CRON = WorkloadRef(RESEARCH, "CronJob", "nightly")
NOTEBOOK = WorkloadRef(RESEARCH, "Notebook", "alice-nb")
MIG = WorkloadRef(SERVING, "Deployment", "mig-infer")
FLAKY = WorkloadRef(SERVING, "StatefulSet", "flaky")
SENTINEL = 9.223372036854775e18
# Unusual rates, so that rounding to the cent is put to work.
NODE_COSTS = {NODE_A: 32.7726, NODE_B: 5.6719, NODE_MIG: 21.957642}


def grid() -> list[float]:
    end = NOW.timestamp()
    return [end - WINDOW + SCRAPE * (i + 1) for i in range(WINDOW // SCRAPE)]


def gpu_series(node: str, gpu: int, util: float, **pod_labels: str) -> list[Series]:
    labels = dcgm_labels(node.split(".")[0], gpu, **pod_labels)
    return [Series(GPU_UTIL, labels, [(t, util) for t in grid()]),
            Series(FB_USED, labels, [(t, 512.0) for t in grid()])]


def fill_cluster(stub) -> None:
    stub.add("nodes", node_obj(NODE_A, "i-0aaa0000000000001", gpus=8, created=LONG_AGO,
                               labels={"eks.amazonaws.com/nodegroup": "ml-a100"}))
    stub.add("nodes", node_obj(NODE_B, "i-0bbb0000000000002", gpus=4, instance_type="g5.12xlarge", created=LONG_AGO,
                               labels={"karpenter.sh/nodepool": "gpu-general",
                                       "karpenter.sh/capacity-type": "on-demand"}))
    stub.add("nodes", node_obj(NODE_MIG, "i-0ddd0000000000004", gpus=1, created=LONG_AGO,
                               mig={"nvidia.com/mig-3g.40gb": 2}))
    stub.add("nodes", node_obj("ip-10-0-9-9.ec2.internal", "i-0ccc0000000000003", gpus=0, instance_type="m6i.large"))
    for ns, labels in ((ML, {"team": "ml"}), (RESEARCH, {}), (SERVING, {}), (OPERATOR, {})):
        stub.add("namespaces", {"metadata": {"name": ns, "labels": labels}})
    for dep, replicas in ((IDLE.name, 2), (BUSY.name, 2)):
        stub.add("deployments", owned(ML, dep, replicas=replicas, labels={"team": "ml"},
                                      annotations={"owner": "alice@example.com"}))
        stub.add("replicasets", owned(ML, f"{dep}-7d9f", owner=("Deployment", dep)))
    stub.add("deployments", owned(RESEARCH, GHOST.name, replicas=1))
    stub.add("replicasets", owned(RESEARCH, "ghost-55c", owner=("Deployment", GHOST.name)))
    stub.add("jobs", owned(RESEARCH, JOB.name))
    stub.add("jobs", owned(RESEARCH, "nightly-29000", owner=("CronJob", CRON.name)))
    stub.add("statefulsets", owned(SERVING, FLAKY.name, replicas=1))
    stub.add("deployments", owned(SERVING, MIG.name, replicas=2))
    stub.add("replicasets", owned(SERVING, "mig-infer-6c", owner=("Deployment", MIG.name)))
    nb = owned(RESEARCH, NOTEBOOK.name, replicas=1)
    nb["metadata"]["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "name": NOTEBOOK.name,
                                          "uid": "uid-nb", "controller": True}]
    stub.add("statefulsets", nb)
    started = LONG_AGO
    pods = [
        pod_obj(ML, "idle-infer-7d9f-aaaaa", NODE_A, owner=("ReplicaSet", "idle-infer-7d9f"), started=started),
        pod_obj(ML, "idle-infer-7d9f-bbbbb", NODE_A, owner=("ReplicaSet", "idle-infer-7d9f"), started=started),
        pod_obj(ML, "busy-train-7d9f-ccccc", NODE_A, owner=("ReplicaSet", "busy-train-7d9f"), started=started),
        pod_obj(ML, "busy-train-7d9f-ddddd", NODE_A, owner=("ReplicaSet", "busy-train-7d9f"), started=started),
        pod_obj(RESEARCH, "batch-eval-x1x1x", NODE_A, owner=("Job", JOB.name), started=started),
        pod_obj(RESEARCH, "ghost-55c-eeeee", NODE_A, owner=("ReplicaSet", "ghost-55c"), started=started),
        # Two pods on NODE_A holding no GPU in the window's end: a finished CronJob run and a notebook whose
        # GPU the node's capacity covers (on gpu 7), so NODE_A has no idle capacity left but 1 GPU.
        pod_obj(RESEARCH, "nightly-29000-zzzzz", NODE_A, owner=("Job", "nightly-29000"), phase="Succeeded",
                started=started),
        pod_obj(RESEARCH, "alice-nb-0", NODE_A, owner=("StatefulSet", NOTEBOOK.name), started=started),
        # NODE_MIG: one whole GPU (flaky, with a sentinel sample) and two 3g.40gb slices of another (mig-infer).
        pod_obj(SERVING, "flaky-0", NODE_MIG, owner=("StatefulSet", FLAKY.name), started=started),
        pod_obj(SERVING, "mig-infer-6c-fffff", NODE_MIG, owner=("ReplicaSet", "mig-infer-6c"), started=started,
                resource="nvidia.com/mig-3g.40gb"),
        pod_obj(SERVING, "mig-infer-6c-ggggg", NODE_MIG, owner=("ReplicaSet", "mig-infer-6c"), started=started,
                resource="nvidia.com/mig-3g.40gb"),
        # The exporter: no GPU request; under honor_labels: false its name is every series' `pod`.
        pod_obj(OPERATOR, "nvidia-dcgm-exporter-q7x2k", NODE_A, gpus=0, started=started),
    ]
    for p in pods:
        stub.add("pods", p)


def fill_prometheus() -> list[Series]:
    s: list[Series] = []
    s += gpu_series(NODE_A, 0, 0.0, pod="idle-infer-7d9f-aaaaa", namespace=ML, container="main")
    s += gpu_series(NODE_A, 1, 0.0, pod="idle-infer-7d9f-bbbbb", namespace=ML, container="main")
    # Scraped with honor_labels: false: the pod's labels are exported_*, pod/namespace are the exporter's.
    exporter = dict(pod="nvidia-dcgm-exporter-q7x2k", namespace=OPERATOR)
    s += gpu_series(NODE_A, 2, 80.0, exported_pod="busy-train-7d9f-ccccc", exported_namespace=ML, **exporter)
    s += gpu_series(NODE_A, 3, 75.0, exported_pod="busy-train-7d9f-ddddd", exported_namespace=ML, **exporter)
    s += gpu_series(NODE_A, 4, 60.0, pod="batch-eval-x1x1x", namespace=RESEARCH)
    # ghost-55c-eeeee (gpu 5) has no series at all.
    s += gpu_series(NODE_A, 6, 0.0)  # no pod
    s += gpu_series(NODE_A, 7, 40.0, pod="alice-nb-0", namespace=RESEARCH)
    # flaky-0: idle but for one DCGM sentinel sample: read again raw (one more query), never judged idle.
    flaky = dcgm_labels(NODE_MIG.split(".")[0], 0, pod="flaky-0", namespace=SERVING)
    s.append(Series(GPU_UTIL, flaky, [(t, SENTINEL if i == 10 else 0.0) for i, t in enumerate(grid())]))
    for slot, pod in ((1, "mig-infer-6c-fffff"), (2, "mig-infer-6c-ggggg")):  # MIG slices: GR engine only
        labels = dcgm_labels(NODE_MIG.split(".")[0], 1, GPU_I_ID=str(slot), GPU_I_PROFILE="3g.40gb", pod=pod,
                             namespace=SERVING)
        s.append(Series(GR_ENGINE_ACTIVE, labels, [(t, 0.0) for t in grid()]))
    for g in range(4):  # NODE_B: GPUs reported, no pod on them for the whole window
        s += gpu_series(NODE_B, g, 0.0, model="NVIDIA A10G")
    return s


@pytest.fixture(scope="module")
def stub(kapi):
    """The module's part of the real API server, filled once (read only by the tests)."""
    kube = KapiCluster(kapi, SUFFIX)
    try:
        fill_cluster(kube)
        yield kube
        kube.check_rbac()
    finally:
        kube.close()


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory):
    missing = binaries_missing()
    if missing:
        pytest.skip(missing)
    server = start_prometheus(tmp_path_factory.mktemp("k8s-prom"), fill_prometheus())
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def kubeconfig(stub, tmp_path_factory):
    return stub.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")


@pytest.fixture(scope="module")
def snapshot(stub, kubeconfig):
    cluster = KubernetesCluster(api_client(str(kubeconfig)))
    return cluster.snapshot(NOW)


@pytest.fixture(scope="module")
def pod_usage(prom_url, snapshot):
    metrics = PodMetrics(PrometheusSettings(url=prom_url, scrape_interval_s=SCRAPE))
    usage = metrics.window_usage(snapshot, WINDOW, NOW)
    assert usage.error is None
    return usage, metrics.queries_made


# ------------------------------------------------------------------------ the cluster read


def test_kubeconfig_path_reaches_the_cluster_with_its_token(stub, snapshot):
    assert {n.name for n in snapshot.nodes} == {NODE_A, NODE_B, NODE_MIG}  # the CPU node is not a GPU node
    node = snapshot.node(NODE_A)
    assert node.instance_id == "i-0aaa0000000000001" and node.capacity == {"nvidia.com/gpu": 8}
    assert node_group_of(node.labels) == ("EKS node group", "ml-a100")
    lists = stub.calls(verb="list")
    assert lists and {r.token for r in lists} == {stub.token} and {r.status for r in lists} == {200}
    assert {r.resource for r in lists} == {"nodes", "namespaces", "pods", "replicasets", "deployments",
                                           "statefulsets", "jobs", "resourceslices", "resourceclaims"}


def test_pods_resolve_to_their_workloads(snapshot):
    by_pod = {p.name: p.workload for p in snapshot.gpu_pods}
    assert by_pod["idle-infer-7d9f-aaaaa"] == IDLE  # ReplicaSet -> Deployment
    assert by_pod["batch-eval-x1x1x"] == JOB
    assert by_pod["alice-nb-0"] == NOTEBOOK  # StatefulSet -> the Notebook custom resource
    assert "nightly-29000-zzzzz" not in by_pod  # Succeeded pods are left out server-side (fieldSelector)
    assert (OPERATOR, "nvidia-dcgm-exporter-q7x2k") in snapshot.other_pods
    info = snapshot.workloads[IDLE]
    assert info.replicas == 2 and info.annotations["owner"] == "alice@example.com"


# ------------------------------------------------------------------------ usage and verdicts


def test_usage_is_read_in_the_fixed_query_set_whatever_the_pods(pod_usage):
    usage, queries = pod_usage
    # One per signal, plus one raw-sample read for the one GPU with a sentinel (flaky-0's), by its UUID.
    assert queries == 6  # the fixed tick queries (5 since the profiling legs are a query of their own) + pods
    busy = usage.by_pod[(ML, "busy-train-7d9f-ccccc")]  # read through exported_pod / exported_namespace
    assert [g.gpu for g in busy.gpus] == ["2"] and busy.gpus[0].activity_mean == pytest.approx(80.0)


# ------------------------------------------------------------------------ cost shares


def test_cost_per_namespace_adds_up_to_the_node_costs_with_idle_capacity_to_the_cent(snapshot):
    shares = attribute(snapshot, NODE_COSTS, hours=24.0)
    rows = {r["namespace"]: r for r in cost_by(shares, "namespace")}
    node_cents = sum(cents_of(c * 24.0) for c in NODE_COSTS.values())
    assert sum(r["cents"] for r in rows.values()) == cluster_cents(shares) == node_cents
    # NODE_A: 8 GPUs, 7 requested (ml 4, research 3), 1 idle; NODE_B: 4 GPUs, all idle capacity; NODE_MIG: two
    # 3g slices leave the seventh slice of their GPU idle (the physical GPUs: a whole one and a MIG one).
    assert rows[ML]["gpus"] == 4 and rows[RESEARCH]["gpus"] == 3
    assert rows[SERVING]["gpus"] == pytest.approx(1 + 6 / 7, abs=0.001)  # a GPU and two 3g slices (3/7 each)
    assert rows[IDLE_CAPACITY]["gpus"] == pytest.approx(5 + 1 / 7, abs=0.001) and rows[IDLE_CAPACITY]["idle_capacity"]
    a_cents = cents_of(NODE_COSTS[NODE_A] * 24.0)
    assert abs(rows[ML]["cents"] - a_cents * 4 / 8) <= 1
    mig_cents = cents_of(NODE_COSTS[NODE_MIG] * 24.0)
    assert rows[IDLE_CAPACITY]["cents"] == pytest.approx(
        a_cents / 8 + cents_of(NODE_COSTS[NODE_B] * 24.0) + mig_cents / 14, abs=1)
    by_workload = {r["workload"]: r for r in cost_by(shares, "workload")}
    assert sum(r["cents"] for r in by_workload.values()) == node_cents
    assert f"node {NODE_B}" in by_workload and str(IDLE) in by_workload


def test_costs_command_by_namespace_reads_the_cluster_from_the_kubeconfig(kubeconfig, tmp_path, capsys):
    from gpufinops.cli.app import main

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {kubeconfig}\ndatabase_url: sqlite:///{tmp_path}/db.sqlite\n")
    code = main(["--config", str(cfg), "costs", "--month", f"{NOW:%Y-%m}", "--by", "namespace", "--output", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    answer = json.loads(out)
    catalog = 2 * 21.957642 + 5.672  # the bundled on-demand prices of p4d.24xlarge and g5.12xlarge in us-east-1
    assert answer["total_usd_per_hour"] == pytest.approx(2 * cents_of(21.957642) / 100 + cents_of(5.672) / 100)
    assert sum(r["usd_per_hour"] for r in answer["rows"]) == pytest.approx(answer["total_usd_per_hour"])
    assert answer["total_usd_per_hour"] == pytest.approx(catalog, abs=0.01)
    assert {r["namespace"] for r in answer["rows"]} == {ML, RESEARCH, SERVING, IDLE_CAPACITY}


def test_costs_command_by_namespace_table_goes_through_the_one_renderer(kubeconfig, tmp_path, capsys):
    """The text table has the -o json keys as its header and a rule under it, like every other command."""
    from gpufinops.cli.app import main

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {kubeconfig}\ndatabase_url: sqlite:///{tmp_path}/db.sqlite\n")
    assert main(["--config", str(cfg), "costs", "--month", f"{NOW:%Y-%m}", "--by", "namespace"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["namespace", "usd_per_hour", "usd_per_month_at_this_rate", "gpus", "pods",
                                "idle_usd_per_hour", "sharing", "allocation"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert any(line.startswith(f"{RESEARCH} ") for line in lines[2:])
    assert lines[-1].startswith("total ") and "GPU nodes" in lines[-1]
