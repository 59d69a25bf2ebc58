"""`gpufinops k8s restore` through the act stage's one door (`Actuator.change`), against a real kube-apiserver
(tests/kapi.py: the service's token bound to the shipped ClusterRole, the fault proxy in front recording every
request) and the official client: the intent row before the PATCH, one PATCH per intent, the object read back after
an ambiguous answer, an open row settled by reconcile, dry-run by the same flag."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.act.actuator import Actuator
from gpufinops.act.restore import restore_workload
from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client
from gpufinops.places.kubernetes.cloud import WorkloadCloud
from gpufinops.places.kubernetes.names import workload_id
from gpufinops.k8s.model import MARK_ANNOTATION, REPLICAS_BEFORE_ANNOTATION, WorkloadRef
from gpufinops.model import ActionKind
from gpufinops.store.store import Store
from tests.kapi import KapiCluster
from tests.kubestub import owned

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
NAME = "idle-infer"  # a Deployment in the test's own namespace: `kube.ns("ml")`


def ref(kube: KapiCluster) -> WorkloadRef:
    return WorkloadRef(kube.ns("ml"), "Deployment", NAME)


def target(kube: KapiCluster) -> str:
    """What a person types: NAMESPACE/NAME."""
    return f"{kube.ns('ml')}/{NAME}"


@pytest.fixture
def world(kapi_cluster, tmp_path):
    kube = kapi_cluster
    kube.add("namespaces", {"metadata": {"name": kube.ns("ml")}})
    kube.add("deployments", owned(kube.ns("ml"), NAME, replicas=0, annotations={
        REPLICAS_BEFORE_ANNOTATION: "3", MARK_ANNOTATION: "2026-12-01T11:00:00Z", "owner": "alice@example.com"}))
    cloud = WorkloadCloud(KubernetesCluster(api_client(str(kube.write_kubeconfig(tmp_path / "kubeconfig"))),
                                            timeout_s=2.0), lambda *_: 1.0, clock=lambda: NOW)
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    return kube, cloud, store


def replicas(kube: KapiCluster) -> int:
    return kube.get("deployments", kube.ns("ml"), NAME)["spec"]["replicas"]


def patches(kube: KapiCluster) -> list:
    return kube.calls(verb="patch", resource="deployments")


def test_a_live_restore_writes_its_intent_then_patches_once(world):
    kube, cloud, store = world
    out = restore_workload(cloud, store, target(kube), NOW, dry_run=False, who="alice")
    assert out.ok and "restored to 3 replicas for alice" in out.message, out.message
    assert replicas(kube) == 3 and len(patches(kube)) == 1
    [row] = store.action_rows(kinds=[ActionKind.RESTORE])
    assert (row.instance_id, row.status, row.dry_run) == (workload_id(ref(kube)), "done", False)
    assert row.reason == \
        f"restore {kube.ns('ml')}/Deployment/idle-infer to 3 replicas for alice (gpufinops k8s restore)"


def test_dry_run_records_and_patches_nothing(world):
    kube, cloud, store = world
    out = restore_workload(cloud, store, target(kube), NOW, dry_run=True)
    assert out.ok and out.dry_run and "would restore" in out.message and "NOT changed" in out.message
    assert not patches(kube) and not kube.calls(verb="create") and replicas(kube) == 0
    [row] = store.action_rows(kinds=[ActionKind.RESTORE])
    assert row.dry_run and row.reason.startswith("dry-run: would restore")


def test_a_lost_answer_is_read_back_and_found_done(world):
    """The PATCH went through, its answer was lost (a 503 after the change): one PATCH, no retry; the read-back
    finds the workload scaled back up, so the row is done, never sent again."""
    kube, cloud, store = world
    kube.lose_answer_next(503, "patch", "deployments")
    out = restore_workload(cloud, store, target(kube), NOW, dry_run=False)
    assert out.ok and "found restored by the read-back" in out.message, out.message
    # One PATCH: applied by the server (200), answered 503 by the proxy in front of it.
    assert [(p.status, p.fault) for p in patches(kube)] == [(200, "lost")] and replicas(kube) == 3
    [row] = store.action_rows(kinds=[ActionKind.RESTORE])
    assert row.status == "done" and "confirmed by read-back" in row.error


def test_an_unknown_outcome_stays_open_until_no_request_can_be_in_flight(world):
    """A 503 that did not change it: the outcome is unknown (a 5xx may land later), so the row stays open and a
    second restore waits (no second PATCH while the first may be in flight); once it cannot be, reconcile settles
    the row from the object (still scaled down: failed) and the restore goes ahead."""
    kube, cloud, store = world
    kube.fail_next(503, "patch", "deployments")  # from the proxy: the server never sees it
    out = restore_workload(cloud, store, target(kube), NOW, dry_run=False)
    assert not out.ok and "outcome unknown" in out.message, out.message
    [row] = store.action_rows(kinds=[ActionKind.RESTORE])
    assert row.status == "unconfirmed" and replicas(kube) == 0
    again = restore_workload(cloud, store, target(kube), NOW + timedelta(seconds=5), dry_run=False)
    assert not again.ok and "not settled yet" in again.message and len(patches(kube)) == 1
    later = NOW + timedelta(seconds=cloud.max_request_s + 1)
    done = restore_workload(cloud, store, target(kube), later, dry_run=False)
    assert done.ok, done.message
    first, second = store.action_rows(kinds=[ActionKind.RESTORE])
    assert first.status == "failed" and "reconciled: workload still scaled down" in first.error
    assert second.status == "done" and len(patches(kube)) == 2 and replicas(kube) == 3


def test_a_refusal_is_a_definite_failure(world):
    kube, cloud, store = world
    kube.forbid("patch", "deployments")  # the server's own 403: the right taken away
    out = restore_workload(cloud, store, target(kube), NOW, dry_run=False)
    assert not out.ok and "not done" in out.message and "403" in out.message
    [row] = store.action_rows(kinds=[ActionKind.RESTORE])
    assert row.status == "failed" and replicas(kube) == 0


def test_the_service_reconciles_a_restore_cut_short_by_a_crash(world):
    """The restore's intent was written and its PATCH went through, then the process died: the service's
    reconcile reads the object and settles the row done (scaled back up)."""
    kube, cloud, store = world
    iid = workload_id(ref(kube))
    row = store.begin_action("crashed", iid, ActionKind.RESTORE, "", False, "restore ... (gpufinops k8s restore)",
                             NOW)
    cloud.restore(ref(kube), "alice")
    assert Actuator(cloud, store, None, None).reconcile(NOW + timedelta(minutes=5)) == [f"reconciled restore on {iid}"]
    [settled] = store.action_rows(kinds=[ActionKind.RESTORE])
    assert settled.id == row and settled.status == "done" and "scaled back up" in settled.error


def test_the_audit_command_lists_restores_by_their_kind(world, tmp_path, capsys):
    """`gpufinops audit --kind restore` (its choices are ActionKind's: every kind of row the audit holds)."""
    import json

    from gpufinops.cli import main

    kube, cloud, store = world
    restore_workload(cloud, store, target(kube), NOW, dry_run=False, who="alice")
    assert main(["audit", "--db", str(tmp_path / "s.db"), "--kind", "restore", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["instance_id"], r["what"]) for r in rows] == [(workload_id(ref(kube)), "restore")]
