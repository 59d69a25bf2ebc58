"""deploy/kubernetes/workloads: the RBAC for reading GPU workloads grants every call the reader makes (judged by a
real kube-apiserver's RBAC, tests/kapi.py) and nothing beyond the documented least verbs; it renders with kustomize
and binds the base's ServiceAccount, which the real server then lets read GPU workloads and nothing else."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client
from tests.kubestub import node_obj, pod_obj

ROOT = Path(__file__).resolve().parents[3]
WORKLOADS = ROOT / "deploy" / "kubernetes" / "workloads"
# The documented least verbs (issue 16): read; patch annotations and the scale subresource; create events.
EXPECTED = {
    ("", "nodes"): {"get", "list", "watch", "patch"}, ("", "pods"): {"get", "list", "watch"},
    ("", "namespaces"): {"get", "list", "watch"},
    ("apps", "deployments"): {"get", "list", "watch", "patch"},
    ("apps", "statefulsets"): {"get", "list", "watch", "patch"},
    ("apps", "replicasets"): {"get", "list", "watch"}, ("batch", "jobs"): {"get", "list", "watch"},
    ("apps", "deployments/scale"): {"get", "patch"}, ("apps", "statefulsets/scale"): {"get", "patch"},
    ("", "events"): {"create"}, ("events.k8s.io", "events"): {"create"},
    ("autoscaling", "horizontalpodautoscalers"): {"list"}, ("keda.sh", "scaledobjects"): {"list"},
    ("kueue.x-k8s.io", "workloads"): {"get", "list", "patch"},
    # The Kueue-integrated kinds a GPU pod resolves to: read only (the suspension patches the Workload above).
    ("jobset.x-k8s.io", "jobsets"): {"get", "list"}, ("kubeflow.org", "pytorchjobs"): {"get", "list"},
    ("kubeflow.org", "tfjobs"): {"get", "list"}, ("kubeflow.org", "xgboostjobs"): {"get", "list"},
    ("kubeflow.org", "paddlejobs"): {"get", "list"}, ("kubeflow.org", "mpijobs"): {"get", "list"},
    ("ray.io", "rayjobs"): {"get", "list"}, ("ray.io", "rayclusters"): {"list"},
    # DRA (resource.k8s.io/v1): read only.
    ("resource.k8s.io", "deviceclasses"): {"get", "list"}, ("resource.k8s.io", "resourceslices"): {"get", "list"},
    ("resource.k8s.io", "resourceclaims"): {"get", "list"},
    ("resource.k8s.io", "resourceclaimtemplates"): {"get", "list"},
}


def granted() -> dict[tuple[str, str], set[str]]:
    role = yaml.safe_load((WORKLOADS / "rbac-clusterrole.yaml").read_text())
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_the_cluster_role_grants_exactly_the_least_verbs():
    assert granted() == EXPECTED


def test_every_call_the_reader_makes_is_granted(kapi_cluster, tmp_path):
    """The service's token is bound to the shipped ClusterRole: the real server refuses anything it does not grant
    (the fixture fails the test on any 403)."""
    kube = kapi_cluster
    kube.add("nodes", node_obj(kube.name("n1"), "i-0abc", gpus=1))
    kube.add("pods", pod_obj(kube.ns("ml"), "p", kube.name("n1")))
    api = api_client(str(kube.write_kubeconfig(tmp_path / "kc")))
    KubernetesCluster(api).snapshot(datetime.now(timezone.utc))
    made = {(c.group, c.resource, c.verb, c.status) for c in kube.calls()}
    assert made and {status for *_, status in made} == {200}, made
    rights = granted()
    assert all(verb in rights.get((group, resource), set()) for group, resource, verb, _ in made), made


def test_the_rendered_binding_lets_the_base_service_account_read_gpu_workloads_and_nothing_else(kapi):
    """The ClusterRoleBinding as kustomize renders it, applied to the real server: the base's ServiceAccount
    (gpufinops/gpufinops) may do what the ClusterRole grants, and the server refuses it the rest."""
    import requests

    out = subprocess.run(["kubectl", "kustomize", str(WORKLOADS)], capture_output=True, text=True, check=True)
    [binding] = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "ClusterRoleBinding"]
    [subject] = binding["subjects"]
    admin = kapi.admin
    admin.create("/api/v1/namespaces", {"metadata": {"name": subject["namespace"]}})
    admin.create(f"/api/v1/namespaces/{subject['namespace']}/serviceaccounts", {"metadata": {"name": subject["name"]}})
    admin.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    try:
        token = admin.create(f"/api/v1/namespaces/{subject['namespace']}/serviceaccounts/{subject['name']}/token",
                             {"spec": {"expirationSeconds": 600}})["status"]["token"]
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        assert session.get(kapi.server + "/api/v1/pods", verify=admin.ca_cert).status_code == 200
        refused = session.get(kapi.server + "/api/v1/secrets", verify=admin.ca_cert)
        assert refused.status_code == 403 and 'cannot list resource "secrets"' in refused.json()["message"]
        user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"

        def allowed(verb: str, group: str, resource: str, sub: str = "") -> bool:
            review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
                "user": user, "groups": ["system:serviceaccounts"], "resourceAttributes": {
                    "verb": verb, "group": group, "resource": resource, "subresource": sub, "namespace": "ml"}}}
            return admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)["status"]["allowed"]

        for (group, resource), verbs in EXPECTED.items():
            base, _, sub = resource.partition("/")
            for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
                assert allowed(verb, group, base, sub) is (verb in verbs), (verb, group, resource)
        assert not allowed("get", "", "secrets") and not allowed("create", "", "pods", "eviction")
    finally:
        admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding['metadata']['name']}")


def test_the_binding_names_the_base_service_account_and_kustomize_renders_it():
    binding = yaml.safe_load((WORKLOADS / "rbac-clusterrolebinding.yaml").read_text())
    base_sa = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "serviceaccount.yaml").read_text())
    role = yaml.safe_load((WORKLOADS / "rbac-clusterrole.yaml").read_text())
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": base_sa["metadata"]["name"],
                                    "namespace": "gpufinops"}]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    result = subprocess.run([kubectl, "kustomize", str(WORKLOADS)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert sorted(d["kind"] for d in yaml.safe_load_all(result.stdout) if d) == ["ClusterRole", "ClusterRoleBinding"]
