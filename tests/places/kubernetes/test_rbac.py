"""deploy/kubernetes/workloads: the RBAC for reading GPU workloads grants every call the reader makes (as recorded
by the API stand-in) and nothing beyond the documented least verbs; it renders with kustomize and binds the
base's ServiceAccount."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client
from tests.kubestub import RESOURCES, node_obj, pod_obj

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


def test_every_call_the_reader_makes_is_granted(kube_stub, tmp_path):
    kube_stub.add("nodes", node_obj("n1", "i-0abc", gpus=1))
    kube_stub.add("pods", pod_obj("ml", "p", "n1"))
    api = api_client(str(kube_stub.write_kubeconfig(tmp_path / "kc")))
    KubernetesCluster(api).snapshot(datetime.now(timezone.utc))
    rights = granted()
    made = set()
    for call in kube_stub.requests:
        prefix = RESOURCES[call.resource.split("/")[0]][0]
        group = "" if prefix == "/api/v1" else prefix.split("/")[2]
        made.add((group, call.resource, call.verb))
    assert made and all(verb in rights.get((group, resource), set()) for group, resource, verb in made), made


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
