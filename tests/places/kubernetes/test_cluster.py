"""The cluster reader's failures (typed, never "no pods") and paging on a real kube-apiserver (tests/kapi.py: a real
403 from RBAC, a 503 from the fault proxy in front of it), the stand-in's write subset through the official client,
and the pure parts: provider ids, GPU requests, pod labels of DCGM series, MIG-weighted cost shares."""

from __future__ import annotations

import socket
from datetime import datetime, timezone

import pytest

from gpufinops.places.kubernetes import cluster as kube
from gpufinops.places.kubernetes.usage import pod_of
from gpufinops.places.kubernetes.cluster import (
    ClusterReadFailed, KubernetesCluster, api_client, instance_id_of, pod_gpu_requests, snapshot_from,
)
from gpufinops.places.kubernetes.costs import IDLE_CAPACITY, apportion, attribute, cents_of, cost_by
from tests.kubestub import node_obj, owned, pod_obj

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def small_cluster(kube) -> None:
    """On the real server (a KapiCluster: names of the test's own) or the stand-in."""
    ns = kube.ns("ml") if hasattr(kube, "ns") else "ml"
    node = kube.name("n1") if hasattr(kube, "name") else "n1"
    kube.add("nodes", node_obj(node, "i-0123456789abcdef0", gpus=2))
    kube.add("namespaces", {"metadata": {"name": ns}})
    kube.add("deployments", owned(ns, "web", replicas=3))
    kube.add("replicasets", owned(ns, "web-1", owner=("Deployment", "web")))
    for i in range(5):
        kube.add("pods", pod_obj(ns, f"web-1-{i}", node, owner=("ReplicaSet", "web-1")))


def cluster(stub, tmp_path, timeout_s: float = 5.0) -> KubernetesCluster:
    return KubernetesCluster(api_client(str(stub.write_kubeconfig(tmp_path / "kubeconfig"))), timeout_s=timeout_s)


# ------------------------------------------------------------------------ failures are typed


def test_403_on_list_is_a_typed_error_naming_verb_resource_and_the_rbac_file(kapi_cluster, tmp_path):
    small_cluster(kapi_cluster)
    kapi_cluster.forbid("list", "pods")  # the server's own RBAC refuses it
    with pytest.raises(ClusterReadFailed) as err:
        cluster(kapi_cluster, tmp_path).snapshot(NOW)
    msg = str(err.value)
    assert err.value.status == 403 and err.value.verb == "list" and err.value.resource == "pods"
    assert msg.startswith(f"kubernetes API at 127.0.0.1:{kapi_cluster.url.rsplit(':', 1)[1]}: list pods: 403 Forbidden")
    assert "rbac-clusterrole.yaml" in msg and kapi_cluster.token not in msg


def test_a_server_error_is_never_an_empty_cluster(kapi_cluster, tmp_path):
    small_cluster(kapi_cluster)
    kapi_cluster.fail_next(503, verb="list", resource="replicasets")
    with pytest.raises(ClusterReadFailed, match="list replicasets: 503"):
        cluster(kapi_cluster, tmp_path).snapshot(NOW)


def test_an_api_server_that_does_not_answer_times_out_as_a_typed_error(tmp_path):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does) and never answers
    try:
        from tests.kubestub import KubeStub

        stub = KubeStub()
        stub.url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ClusterReadFailed, match="list nodes: .*no answer within 0.5s"):
            cluster(stub, tmp_path, timeout_s=0.5).snapshot(NOW)
    finally:
        silent.close()


def test_an_unreadable_kubeconfig_is_a_typed_error(tmp_path):
    with pytest.raises(ClusterReadFailed, match="cannot load kubeconfig .*nope"):
        api_client(str(tmp_path / "nope"))
    for body in ("clusters: [\n", "apiVersion: v1\nclusters: 5\n"):  # not YAML; not a kubeconfig's shape
        (tmp_path / "bad").write_text(body)
        with pytest.raises(ClusterReadFailed, match="cannot load kubeconfig"):
            api_client(str(tmp_path / "bad"))


def test_a_relative_kubeconfig_path_is_relative_to_the_config_file(tmp_path):
    from gpufinops.places.kubernetes.cluster import kubeconfig_path

    assert kubeconfig_path("kube/config", str(tmp_path / "gpufinops.yaml")) == str(tmp_path / "kube" / "config")
    assert kubeconfig_path("/etc/kube", str(tmp_path / "gpufinops.yaml")) == "/etc/kube"
    assert kubeconfig_path(None, "x.yaml") is None


def test_costs_command_prints_one_line_on_403(kapi_cluster, tmp_path, capsys):
    from gpufinops.cli.app import main

    small_cluster(kapi_cluster)
    kapi_cluster.forbid("list", "nodes")
    cfg = tmp_path / "gpufinops.yaml"
    kapi_cluster.write_kubeconfig(tmp_path / "kc")
    cfg.write_text("kubernetes:\n  kubeconfig: kc\n")  # relative to the config file, not the working directory
    code = main(["--config", str(cfg), "costs", "--month", f"{datetime.now(timezone.utc):%Y-%m}", "--by",
                 "workload"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "error: kubernetes API at 127.0.0.1" in err and "list nodes: 403 Forbidden" in err


def test_lists_are_paged_until_the_last_continue(kapi_cluster, tmp_path, monkeypatch):
    small_cluster(kapi_cluster)
    monkeypatch.setattr(kube, "PAGE_SIZE", 2)
    snap = cluster(kapi_cluster, tmp_path).snapshot(NOW)
    assert len(snap.gpu_pods) == 5
    pages = kapi_cluster.calls(verb="list", resource="pods")
    # The real server's continue tokens are opaque (the stand-in's were offsets "2", "4"): three pages, each after
    # the first asked with the token the one before answered.
    tokens = [r.query.get("continue") for r in pages]
    assert len(pages) == 3 and tokens[0] is None and all(tokens[1:]) and len(set(tokens[1:])) == 2
    assert all(r.query["limit"] == "2" and r.status == 200 for r in pages)


# ------------------------------------------------------------------------ the stand-in's write subset


def test_stand_in_serves_patch_scale_conflict_and_events_to_the_official_client(kube_stub, tmp_path):
    # Kept on the stand-in on purpose (issue 37): a test of the stand-in itself, which the CRD-absent case of
    # test_kueue_kinds.py still uses.
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    small_cluster(kube_stub)
    api = api_client(str(kube_stub.write_kubeconfig(tmp_path / "kc")))
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.patch_namespaced_deployment("web", "ml", {"metadata": {"annotations": {"gpufinops.io/x": "1"}}})
    assert kube_stub.get("deployments", "ml", "web")["metadata"]["annotations"]["gpufinops.io/x"] == "1"
    assert kube_stub.calls(verb="patch")[-1].content_type == "application/strategic-merge-patch+json"
    assert apps.read_namespaced_deployment_scale("web", "ml").spec.replicas == 3
    kube_stub.conflict_next(resource="deployments/scale")
    with pytest.raises(ApiException) as conflict:
        apps.patch_namespaced_deployment_scale("web", "ml", {"spec": {"replicas": 0}})
    assert conflict.value.status == 409
    assert apps.patch_namespaced_deployment_scale("web", "ml", {"spec": {"replicas": 0}}).spec.replicas == 0
    assert kube_stub.get("deployments", "ml", "web")["spec"]["replicas"] == 0
    event = client.CoreV1Event(metadata=client.V1ObjectMeta(generate_name="web."), reason="GpufinopsIdle",
                               message="idle", involved_object=client.V1ObjectReference(kind="Deployment",
                                                                                        name="web", namespace="ml"))
    core.create_namespaced_event("ml", event)
    assert [r.status for r in kube_stub.calls(verb="create", resource="events")] == [201]
    kube_stub.forbid("patch", "deployments/scale")
    with pytest.raises(ApiException) as forbidden:
        apps.patch_namespaced_deployment_scale("web", "ml", {"spec": {"replicas": 1}})
    assert forbidden.value.status == 403


# ------------------------------------------------------------------------ pure parts


@pytest.mark.parametrize("provider_id,expected", [
    ("aws:///us-east-1a/i-0123456789abcdef0", "i-0123456789abcdef0"),
    ("aws://us-east-1a/i-0123456789abcdef0", "i-0123456789abcdef0"),
    ("gce://project/zone/gke-node-1", "host-1"),
    ("", "host-1"),
])
def test_node_instance_id_from_provider_id_else_hostname(provider_id, expected):
    assert instance_id_of(provider_id, "host-1") == expected


def test_gpu_requests_count_limits_containers_and_the_largest_init_container():
    spec = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "4"}}},
                           {"resources": {"requests": {"nvidia.com/mig-1g.10gb": 1},
                                          "limits": {"nvidia.com/mig-1g.10gb": 1}}}],
            "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
    assert pod_gpu_requests(spec) == {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 1}
    assert pod_gpu_requests({"containers": [{"resources": {"limits": {"nvidia.com/gpu": "0.5"}}}]}) == {}


@pytest.mark.parametrize("labels,expected", [
    ({"pod": "a", "namespace": "ml"}, ("ml", "a")),
    ({"pod": "dcgm-exporter-x", "namespace": "gpu-operator", "exported_pod": "a", "exported_namespace": "ml"},
     ("ml", "a")),
    ({"Hostname": "node-1"}, None),
])
def test_series_pod_labels_prefer_the_exported_ones(labels, expected):
    assert pod_of(labels) == expected


def test_mig_requests_share_a_node_by_compute_slices_and_leave_idle_capacity():
    node = node_obj("mig-node", "i-0aaa", gpus=0, mig={"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 1})
    pods = [pod_obj("a", "p3", "mig-node", resource="nvidia.com/mig-3g.40gb"),
            pod_obj("b", "p1", "mig-node", resource="nvidia.com/mig-1g.10gb")]
    snap = snapshot_from(NOW, [node], pods, {}, [])
    shares = attribute(snap, {"mig-node": 7.0})  # 7 slices at $1/slice-hour
    cents = {s.namespace: s.cents for s in shares}
    assert cents == {"a": 300, "b": 100, IDLE_CAPACITY: 300}
    assert sum(r["cents"] for r in cost_by(shares, "namespace")) == 700


def test_apportion_is_exact_and_cents_round_half_up():
    assert apportion(100, [1, 1, 1]) == [34, 33, 33]
    assert sum(apportion(3277, [3, 2, 2, 1])) == 3277
    assert apportion(5, [0, 0]) == [0, 0]
    assert cents_of(0.125) == 13 and cents_of(32.7726 * 24) == 78654


def test_unpriced_nodes_are_counted_as_unpriced_not_free():
    snap = snapshot_from(NOW, [node_obj("n", "i-1", gpus=1)], [pod_obj("a", "p", "n")], {}, [])
    rows = cost_by(attribute(snap, {"n": None}), "namespace")
    assert rows == [{"namespace": "a", "cents": 0, "gpus": 1.0, "pods": 1, "unpriced": 1, "idle_capacity": False,
                     "sharing": "whole", "allocation": "device-plugin", "idle_cents": 0, "idle_gpus": 0.0,
                     "usd": 0.0}]


def test_an_excluded_namespace_is_not_judged_but_its_gpus_are_not_idle_capacity():
    from gpufinops.places.kubernetes.cluster import namespace_filter

    pods = [pod_obj("kube-system", "driver-check", "n"), pod_obj("ml", "p", "n")]
    snap = snapshot_from(NOW, [node_obj("n", "i-1", gpus=2)], pods, {}, [],
                         namespace_allowed=namespace_filter((), ("kube-system",), {}))
    assert [str(r) for r in snap.workload_refs()] == ["ml/Pod/p"]
    shares = attribute(snap, {"n": 2.0})
    assert {s.namespace: s.cents for s in shares} == {"kube-system": 100, "ml": 100}  # no idle capacity row


def test_costs_by_namespace_refuses_a_past_month(tmp_path, capsys):
    from gpufinops.cli.app import main

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text("kubernetes: {kubeconfig: kc}\n")
    assert main(["--config", str(cfg), "costs", "--month", "2022-9", "--by", "namespace"]) == 2
    assert "reads the cluster as it is now" in capsys.readouterr().err


def test_in_cluster_config_reads_the_service_account_token_and_service_address(tmp_path, monkeypatch):
    """The in-cluster path as far as it goes without TLS: the stand-in speaks plain HTTP, the in-cluster address
    is always https, so this checks the client is built from the pod's environment and files, not a kubeconfig."""
    from kubernetes.config import incluster_config

    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nnot checked here\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api = api_client(in_cluster=True)
    assert api.configuration.host == "https://10.96.0.1:443"
    assert api.configuration.api_key["authorization"].lower() == "bearer sa-token"  # the client writes "bearer"
    assert kube.server_of(api) == "10.96.0.1:443"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ClusterReadFailed, match="cannot load the in-cluster service account"):
        api_client(in_cluster=True)
