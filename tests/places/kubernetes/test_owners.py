"""Who owns spec.replicas (issue 28, item 3): an HPA or a KEDA ScaledObject targeting a workload, Argo CD or Flux
syncing it. Such a workload is judged and reported with the owner's way, never patched; `stop` checks again just
before its PATCH. The reader lists HPAs and ScaledObjects (KEDA's published CRD) from a real kube-apiserver
(tests/kapi.py: the service's token bound to the shipped ClusterRole, the fault proxy in front recording every
request and answering the 404 of a cluster without KEDA and the 503 the server cannot give on demand)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpufinops.act.plan import stop_blocker
from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client, autoscaler_targets
from gpufinops.places.kubernetes.cloud import WorkloadCloud
from gpufinops.places.kubernetes.names import KubeChangeError, workload_id
from gpufinops.places.kubernetes.owners import KEDA_PAUSED_REPLICAS, gitops_owner, manager_of
from gpufinops.k8s.model import WorkloadRef
from gpufinops.model import Action
from tests.kapi import KapiCluster, call_matches
from tests.kubestub import node_obj, owned, pod_obj

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
WEB = WorkloadRef("ml", "Deployment", "web")


def hpa(namespace: str, name: str, target: str, kind: str = "Deployment") -> dict:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": target},
                     "minReplicas": 1, "maxReplicas": 4}}


def scaled_object(namespace: str, name: str, target: str) -> dict:
    return {"metadata": {"name": name, "namespace": namespace},
            # a trigger's metadata is required by KEDA's CRD (the real server answers 422 without it)
            "spec": {"scaleTargetRef": {"name": target}, "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": "http://prometheus:9090", "query": "sum(rate(requests[1m]))", "threshold": "10"}}]}}


def fill(kube: KapiCluster, labels=None, annotations=None) -> None:
    ns, node = kube.ns("ml"), kube.name("n1")
    kube.add("nodes", node_obj(node, "i-0123456789abcdef0", gpus=2))
    kube.add("namespaces", {"metadata": {"name": ns}})
    kube.add("deployments", owned(ns, "web", replicas=2, labels=labels, annotations=annotations))
    kube.add("replicasets", owned(ns, "web-1", owner=("Deployment", "web")))
    kube.add("pods", pod_obj(ns, "web-1-a", node, owner=("ReplicaSet", "web-1")))


def web(kube: KapiCluster) -> WorkloadRef:
    """WEB in the test's own namespace."""
    return WorkloadRef(kube.ns("ml"), "Deployment", "web")


def cloud_of(kube: KapiCluster, tmp_path) -> WorkloadCloud:
    api = api_client(str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
    return WorkloadCloud(KubernetesCluster(api, timeout_s=5.0), lambda *_: 10.0, clock=lambda: NOW)


def listed(cloud: WorkloadCloud, ref: WorkloadRef = WEB):
    return next(i for i in cloud.list_gpu_instances() if i.instance_id == workload_id(ref))


# ------------------------------------------------------------------------ pure


def test_autoscaler_targets_name_the_workload_and_keda_wins_over_its_own_hpa():
    targets = autoscaler_targets(
        [hpa("ml", "keda-hpa-web", "web"), hpa("ml", "db", "db", kind="StatefulSet")],
        [scaled_object("ml", "web", "web")])
    assert targets[WEB] == ("ScaledObject", "ml/web")
    assert targets[WorkloadRef("ml", "StatefulSet", "db")] == ("HorizontalPodAutoscaler", "ml/db")
    assert autoscaler_targets([{"metadata": {"name": "x"}, "spec": {}}], []) == {}


@pytest.mark.parametrize("labels, annotations, owner, change", [
    ({"app.kubernetes.io/instance": "ml-apps"}, {"argocd.argoproj.io/tracking-id": "ml-apps:apps/Deployment:ml/web"},
     "Argo CD (application 'ml-apps')", "Git source of Argo CD application 'ml-apps'"),
    ({}, {"argocd.argoproj.io/tracking-id": "team-a:apps/Deployment:ml/web"},
     "Argo CD (application 'team-a')", "Argo CD application 'team-a'"),
    ({"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"}, {},
     "Flux (Kustomization 'flux-system/apps')", "source of Flux Kustomization 'flux-system/apps'"),
    ({"helm.toolkit.fluxcd.io/name": "web", "helm.toolkit.fluxcd.io/namespace": "ml"}, {},
     "Flux (HelmRelease 'ml/web')", "Flux HelmRelease 'ml/web'"),
])
def test_gitops_owners_are_named_with_the_exact_change_to_make(labels, annotations, owner, change):
    managed_by, advice = manager_of(WEB, labels, True, annotations)
    assert managed_by == owner and change in advice
    assert "set `spec.replicas: 0` on Deployment ml/web" in advice


def test_helms_instance_label_alone_is_not_gitops():
    assert gitops_owner(WEB, {"app.kubernetes.io/instance": "web"}, {}) == ("", "")
    assert manager_of(WEB, {"app.kubernetes.io/instance": "web"}, True, {}) == ("", "")


def test_an_autoscaled_workload_is_a_stop_blocker_with_the_owners_way():
    from gpufinops.places.kubernetes.cloud import workload_instance

    inst = workload_instance(WEB, None, [], {}, {}, 1.0, autoscaler=("ScaledObject", "ml/web"))
    blocker = stop_blocker(inst, Action.STOP)
    assert blocker.startswith("managed by KEDA ScaledObject 'ml/web': never stopped by gpufinops")
    assert f"kubectl annotate scaledobject -n ml web {KEDA_PAUSED_REPLICAS}=0" in blocker
    inst = workload_instance(WEB, None, [], {}, {}, 1.0, autoscaler=("HorizontalPodAutoscaler", "ml/web-hpa"))
    assert "the HPA owns spec.replicas" in stop_blocker(inst, Action.STOP)
    # Even with scale-to-zero off, the owner is the more useful thing to say.
    off = workload_instance(WEB, None, [], {}, {}, 1.0, scale_to_zero=False,
                            autoscaler=("HorizontalPodAutoscaler", "ml/web-hpa"))
    assert off.managed_by == "HorizontalPodAutoscaler 'ml/web-hpa'"


# ------------------------------------------------------------------------ through the real API server


def test_the_listing_reads_hpas_and_scaled_objects(kapi_cluster, tmp_path):
    kube = kapi_cluster
    fill(kube)
    ns, cloud = kube.ns("ml"), cloud_of(kube, tmp_path)
    assert listed(cloud, web(kube)).managed_by == ""
    kube.add("horizontalpodautoscalers", hpa(ns, "web-hpa", "web"))
    assert listed(cloud, web(kube)).managed_by == f"HorizontalPodAutoscaler '{ns}/web-hpa'"
    kube.add("scaledobjects", scaled_object(ns, "web", "web"))
    inst = listed(cloud, web(kube))
    assert inst.managed_by == f"KEDA ScaledObject '{ns}/web'" and KEDA_PAUSED_REPLICAS in inst.managed_advice
    assert {c.resource for c in kube.calls("list")} >= {"horizontalpodautoscalers", "scaledobjects"}


def test_a_cluster_without_keda_answers_404_and_that_is_no_scaled_object(kapi_cluster, tmp_path):
    kube = kapi_cluster
    fill(kube)
    # The session's server has KEDA's CRD (other tests need it), so the proxy answers the list as this very
    # server answers a path of a group it does not serve: its own 404, status, body and content type replayed.
    absent = kube.admin.session.get(kube.kapi.server + "/apis/keda-absent.example.com/v1alpha1/scaledobjects",
                                    verify=kube.admin.ca_cert, timeout=30)
    assert absent.status_code == 404
    kube.proxy.arm("status", call_matches("list", "scaledobjects"), times=1, status=404, body=absent.content,
                   headers={"Content-Type": absent.headers.get("Content-Type", "text/plain")})
    assert listed(cloud_of(kube, tmp_path), web(kube)).managed_by == ""
    assert [c.status for c in kube.calls("list", "scaledobjects")] == [None]  # answered by the proxy


def test_unreadable_autoscalers_leave_every_workload_reported_only(kapi_cluster, tmp_path):
    kube = kapi_cluster
    fill(kube)
    kube.forbid("list", "horizontalpodautoscalers", once=True)  # the server's own 403, then the right back
    cloud = cloud_of(kube, tmp_path)
    inst = listed(cloud, web(kube))
    assert inst.managed_by.startswith("an autoscaler gpufinops could not check") and "403" in inst.managed_by
    assert listed(cloud, web(kube)).managed_by == ""  # readable again on the next listing


@pytest.mark.parametrize("late_owner", ["hpa", "keda", "argocd"])
def test_an_owner_appearing_after_the_listing_refuses_the_scale_down(kapi_cluster, tmp_path, late_owner):
    """The mark was made on a workload nobody else scaled; an HPA (KEDA, Argo CD) appears before the scale-down:
    `stop` checks again just before its PATCH and refuses, definitely, with nothing changed."""
    kube = kapi_cluster
    fill(kube)
    ns, cloud = kube.ns("ml"), cloud_of(kube, tmp_path)
    inst = listed(cloud, web(kube))
    assert inst.managed_by == ""
    if late_owner == "hpa":
        kube.add("horizontalpodautoscalers", hpa(ns, "web-hpa", "web"))
    elif late_owner == "keda":
        kube.add("scaledobjects", scaled_object(ns, "web", "web"))
    else:
        kube.merge("deployments", ns, "web", {"metadata": {"annotations": {
            "argocd.argoproj.io/tracking-id": f"ml-apps:apps/Deployment:{ns}/web"}}})
    with pytest.raises(KubeChangeError, match="is managed by .* now") as err:
        cloud.stop(inst)
    assert err.value.definite and not kube.calls("patch")
    assert kube.get("deployments", ns, "web")["spec"]["replicas"] == 2
    if late_owner != "argocd":  # the namespaced lists, just before the PATCH
        assert any(c.path.startswith("/apis/") and f"/namespaces/{ns}/" in c.path for c in kube.calls("list"))


def test_an_unreadable_autoscaler_list_just_before_the_patch_refuses_it(kapi_cluster, tmp_path):
    kube = kapi_cluster
    fill(kube)
    cloud = cloud_of(kube, tmp_path)
    inst = listed(cloud, web(kube))
    kube.fail_next(503, "list", "horizontalpodautoscalers")  # from the proxy: the server never sees it
    with pytest.raises(KubeChangeError, match="could not check") as err:
        cloud.stop(inst)
    assert err.value.definite and not kube.calls("patch")
    cloud.stop(inst)  # readable, nobody else owns it: scaled
    assert kube.get("deployments", kube.ns("ml"), "web")["spec"]["replicas"] == 0
