"""tests/kapi.py, the real kube-apiserver of the Kubernetes tests: it fails (never skips) without its files, serves
the published CRDs the code reads, and judges the service's identity by the shipped ClusterRole alone."""

from __future__ import annotations

import lzma

import pytest
import requests
import yaml

import tests.kapi as kapi_module
from tests.kapi import CRD_DIR, KapiCluster, api_path, start_kapi
from tests.kubestub import RESOURCES, owned

pytestmark = pytest.mark.integration


def test_missing_server_files_fail_the_tests_with_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(kapi_module, "KAPI_DIR", tmp_path / "no-kapi")
    with pytest.raises(pytest.fail.Exception) as failed:  # a failure, not a skip
        start_kapi(tmp_path / "work")
    assert "../shared/kapi/kube-apiserver.xz" in str(failed.value) and "kapi.sh" in str(failed.value)


def test_every_kept_crd_is_served_at_the_version_the_code_asks_for(kapi):
    # Custom kinds only: the built-in API groups (events.k8s.io, DRA's resource.k8s.io) are the server's own.
    asked = {(p.removeprefix("/apis/"), r) for r, (p, _k, _n) in RESOURCES.items() if "." in p.split("/")[2]
             and not p.split("/")[2].endswith(".k8s.io")}
    kept = set()
    for path in CRD_DIR.glob("*.yaml.xz"):
        doc = yaml.load(lzma.decompress(path.read_bytes()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        for version in doc["spec"]["versions"]:
            kept.add((f"{doc['spec']['group']}/{version['name']}", doc["spec"]["names"]["plural"]))
    assert asked <= kept, asked - kept  # every custom kind gpufinops reads has its real CRD here
    for group_version, plural in sorted(asked):
        assert kapi.admin.get(f"/apis/{group_version}/{plural}")["items"] is not None


def test_the_service_identity_has_the_shipped_role_and_nothing_more(kapi_cluster):
    kube = kapi_cluster
    kube.add("deployments", owned(kube.ns("ml"), "d", replicas=1))
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {kube.token}"
    # Through the proxy, as the service calls: granted list, refused read of Secrets (the server's own 403).
    assert session.get(kube.proxy.url + api_path("deployments")).status_code == 200
    refused = session.get(kube.proxy.url + f"/api/v1/namespaces/{kube.ns('ml')}/secrets")
    assert refused.status_code == 403
    assert f'User "{kube.user}" cannot list resource "secrets"' in refused.json()["message"]
    assert [c.resource for c in kube.forbidden()] == ["secrets"]
    kube.expect_forbidden = True  # asked for here; any other test's unasked 403 fails it at teardown


def test_conflict_next_is_a_real_409_from_a_stale_resource_version(kapi_cluster):
    kube = kapi_cluster
    dep = kube.add("deployments", owned(kube.ns("ml"), "d", replicas=1))
    kube.conflict_next("patch", "deployments")
    answer = requests.patch(kube.proxy.url + api_path("deployments", kube.ns("ml"), "d"),
                            json={"metadata": {"resourceVersion": dep["metadata"]["resourceVersion"]},
                                  "spec": {"replicas": 0}},
                            headers={"Authorization": f"Bearer {kube.token}",
                                     "Content-Type": "application/merge-patch+json"})
    assert answer.status_code == 409 and answer.json()["reason"] == "Conflict"
    assert kube.get("deployments", kube.ns("ml"), "d")["spec"]["replicas"] == 1


def test_forbid_takes_one_right_away_from_this_test_only(kapi, kapi_cluster):
    kube = kapi_cluster
    other = KapiCluster(kapi)
    try:
        kube.add("deployments", owned(kube.ns("ml"), "d", replicas=1))
        kube.forbid("patch", "deployments")
        patch = {"metadata": {"annotations": {"a": "b"}}}
        path = api_path("deployments", kube.ns("ml"), "d")
        for who, expected in ((kube, 403), (other, 200)):
            answer = requests.patch(who.proxy.url + path, json=patch, headers={
                "Authorization": f"Bearer {who.token}", "Content-Type": "application/merge-patch+json"})
            assert answer.status_code == expected, (who.user, answer.text)
    finally:
        other.close()
