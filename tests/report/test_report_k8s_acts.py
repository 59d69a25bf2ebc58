"""The monthly report's Kubernetes tables say what gpufinops did to each workload (issue 28, item 5): a Kueue job
suspended and a Deployment scaled to zero in dry-run, recorded through the store's real paths (record_decisions,
begin_action / finish_action as the act chokepoint writes them), and what the suspension saved: the same figure as
the month's stops table, summed to the cent per namespace."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from gpufinops.places.kubernetes.names import workload_id
from gpufinops.config import load_settings
from gpufinops.k8s.model import WorkloadRef
from gpufinops.model import ActionKind, ActionResult, Decision, ReasonCode, Verdict
from gpufinops.report import write_monthly_report
from gpufinops.store.store import Store
from tests.report.test_report_k8s import MONTH, NOW, START

JOB = workload_id(WorkloadRef("research", "Job", "train-llm"))
WEB = workload_id(WorkloadRef("research", "Deployment", "infer"))
IDLE_JOB = workload_id(WorkloadRef("ml", "Job", "eval"))


def test_suspended_and_scaled_down_workloads_and_their_savings(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    rates = {JOB: 3.0, WEB: 1.5, IDLE_JOB: 0.5}
    stop_at = START + timedelta(hours=4)
    try:
        for n in range(6):
            at = START + timedelta(hours=n)
            # The suspended job is judged until its suspension, never after (its pods are gone).
            ids = [i for i in rates if not (i == JOB and at > stop_at)]
            store.record_decisions(f"r{n}", [Decision(i, "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "why", at,
                                                      activity_mean=0.0, hourly_cost=rates[i]) for i in ids],
                                   dry_run=False, types={i: "p5.48xlarge" for i in ids}, max_gap_s=7200)
        row = store.begin_action("r4", JOB, ActionKind.STOP, "kueue-idle", False, "still idle", stop_at)
        store.finish_action(row, True, stop_at, status="done")
        store.record_action("r4", ActionResult(WEB, ActionKind.STOP, True, True, "dry-run: would stop: idle",
                                               "web-idle", stop_at))
        paths = write_monthly_report(store, MONTH, tmp_path / "out", NOW,
                                     load_settings(report={"evaluate_every_s": 3600}), formats=["json"])
    finally:
        store.close()
    doc = json.loads(paths[0].read_text())
    workloads = {r["instance_id"]: r for r in doc["tables"]["k8s_workloads"]}
    [stop] = [s for s in doc["tables"]["stops"] if s["instance_id"] == JOB]
    assert workloads[JOB]["acted"] == "suspended 1x"
    assert stop["saved_cost"] > 0 and workloads[JOB]["saved_cost"] == pytest.approx(round(stop["saved_cost"], 2))
    assert workloads[WEB]["acted"] == "would have been scaled to zero 1x (dry-run)"
    assert workloads[WEB]["saved_cost"] is None  # a dry-run saves nothing; its would-have figure is in the stops
    assert workloads[IDLE_JOB]["acted"] == "" and workloads[IDLE_JOB]["saved_cost"] is None
    namespaces = {r["namespace"]: r for r in doc["tables"]["k8s_namespaces"]}
    assert namespaces["research"]["saved_cost"] == workloads[JOB]["saved_cost"]
    assert namespaces["research"]["acted"] == "1 workload(s)" and namespaces["ml"]["acted"] == ""
    assert doc["headline"]["k8s_saved_cost"] == workloads[JOB]["saved_cost"]
