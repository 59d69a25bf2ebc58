"""The monthly report's GPU node pools (issue 28, item 5): a month recorded through the real tick (pipeline.run_once
with the cluster read from a real kube-apiserver (tests/kapi.py, the service's token bound to the shipped
ClusterRole), the node hours written by run/node_hours.py, the empty node cordoned
by a drain rule through the act chokepoint) with three pools and three ways of sharing GPUs: whole GPUs and a GPU
node left empty in a Karpenter pool, a MIG node in an EKS node group, a time-sliced T4 node in no pool. The figures
are checked against the ticks' own times and prices, worked out here in plain decimal arithmetic. The month is the
one after the server stamped the nodes' creationTimestamp (a node's GPU-free time cannot start before it)."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import pytest

from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client
from gpufinops.places.kubernetes.cloud import WorkloadCloud
from gpufinops.places.kubernetes.nodes import node_id
from gpufinops.config import load_settings
from gpufinops.demo.sim import ConsoleNotifier
from gpufinops.k8s.model import TAG_NODE
from gpufinops.model import Action, ActionKind, Rule, RunContext, Selector
from gpufinops.report import write_monthly_report
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.store.store import Store
from tests.kapi import KapiCluster
from tests.kubestub import node_obj, pod_obj
from tests.report.test_report_browser import CHROMIUM, PROBE, measure

UTC = timezone.utc
EVERY_S = 300
# Ticks (minutes after the start, t0): every five minutes, and the one that cordons the empty node a minute late (76),
# as the warning's lead runs out; the empty node is gone (Karpenter removed it) before minute 90.
MINUTES = [*range(0, 75, 5), 76, *range(80, 125, 5)]
CORDON_MINUTE, REMOVED_BEFORE = 76, 90
PRICES = {"p4d.24xlarge": 32.7726, "p4de.24xlarge": 40.966, "g4dn.12xlarge": 3.912}
TRAIN, INFER, NO_POOL = "train", "infer", "(no node pool)"
DRAIN = Rule(name="empty-gpu-nodes", threshold_pct=5.0, window_s=3600, warning_lead_s=900, action=Action.DRAIN,
             selector=Selector(tags={TAG_NODE: ("*",)}))


def gfd(product: str, count: int, memory_mib: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
              "nvidia.com/gpu.count": str(count), "nvidia.com/gpu.memory": str(memory_mib)}
    return {**labels, **{f"nvidia.com/{k}": v for k, v in (extra or {}).items()}}


# node -> (pool, instance type, physical GPUs, the share of them no pod holds, sharing mode)
NODES = {
    "train-a": (TRAIN, "p4d.24xlarge", 8, Fraction(5, 8), "whole"),  # pods hold 1 + 2 of 8 GPUs
    "train-empty": (TRAIN, "p4d.24xlarge", 8, Fraction(1), "whole"),  # no GPU pod: cordoned
    "infer-mig": (INFER, "p4de.24xlarge", 8, Fraction(25, 56), "mig"),  # a 3g.40gb slice (3/7 GPU) + 4 whole GPUs
    "ts-t4": (NO_POOL, "g4dn.12xlarge", 4, Fraction(15, 16), "time-slicing"),  # one of 4 replicas of one of 4 GPUs
}


def cluster(kube: KapiCluster) -> None:
    karpenter, eks = {"karpenter.sh/nodepool": TRAIN}, {"eks.amazonaws.com/nodegroup": INFER}
    a100 = gfd("NVIDIA-A100-SXM4-40GB", 8, 40960)
    n = kube.name
    kube.add("nodes", node_obj(n("train-a"), "i-0aaa0000000000001", labels={**a100, **karpenter}))
    kube.add("nodes", node_obj(n("train-empty"), "i-0aaa0000000000002", labels={**a100, **karpenter}))
    kube.add("nodes", node_obj(n("infer-mig"), "i-0aaa0000000000003", gpus=6, instance_type="p4de.24xlarge",
                               mig={"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 7},
                               labels={**eks, **gfd("NVIDIA-A100-SXM4-80GB", 8, 81920, {
                                   "mig.strategy": "mixed", "mig-3g.40gb.count": "2", "mig-1g.10gb.count": "7"})}))
    kube.add("nodes", node_obj(n("ts-t4"), "i-0aaa0000000000004", gpus=16, instance_type="g4dn.12xlarge",
                               labels=gfd("Tesla-T4-SHARED", 4, 15360, {"gpu.replicas": "4",
                                                                       "sharing-strategy": "time-slicing"})))
    kube.add("pods", pod_obj(kube.ns("ml"), "p1", n("train-a"), gpus=1))
    kube.add("pods", pod_obj(kube.ns("ml"), "p2", n("train-a"), gpus=2))
    kube.add("pods", pod_obj(kube.ns("serve"), "s3", n("infer-mig"), resource="nvidia.com/mig-3g.40gb"))
    kube.add("pods", pod_obj(kube.ns("serve"), "w4", n("infer-mig"), gpus=4))
    kube.add("pods", pod_obj(kube.ns("notebooks"), "t1", n("ts-t4"), gpus=1))


def month_start_after(kube: KapiCluster) -> datetime:
    """The ticks' start: the next whole hour after the server stamped the nodes (so no tick spans an hour), moved
    to the next month's first hour when the ticks (about two hours) would cross a month's end."""
    created = max(datetime.fromisoformat(n["metadata"]["creationTimestamp"]) for n in kube.list("nodes")
                  if n["metadata"]["name"].endswith(kube.suffix))
    t0 = (created + timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    end = t0 + timedelta(minutes=MINUTES[-1] + 60)
    return t0 if end.month == t0.month else end.replace(day=1, hour=0)


def cents(usd: Decimal) -> int:
    return int((usd * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def seen_ticks(node: str) -> list[tuple[int, float]]:
    """(minute, seconds it stands for) of each tick that saw the node: the time since the tick before, the first
    one a tick interval."""
    out, last = [], None
    for m in MINUTES:
        if node != "train-empty" or m < REMOVED_BEFORE:
            out.append((m, EVERY_S if last is None else (m - last) * 60.0))
        last = m
    return out


def node_cents(node: str) -> list[int]:
    """Per tick that saw it, the node's cents for the time the tick stands for (no tick here spans an hour)."""
    price = Decimal(str(PRICES[NODES[node][1]]))
    return [cents(price * Decimal(str(s)) / 3600) for _, s in seen_ticks(node)]


@pytest.fixture(scope="module")
def month(kapi, tmp_path_factory):
    root = tmp_path_factory.mktemp("pools")
    kube = KapiCluster(kapi)
    try:
        cluster(kube)
        t0 = month_start_after(kube)
        month_name = t0.strftime("%Y-%m")
        now = (t0.replace(day=28) + timedelta(days=5)).replace(day=2, hour=9)  # the next month's 2nd, 09:00
        kubeconfig = kube.write_kubeconfig(root / "kubeconfig")
        settings = load_settings(act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 1.0},
                                 schedule={"evaluate_every_s": EVERY_S}, report={"evaluate_every_s": EVERY_S},
                                 kubernetes={"kubeconfig": str(kubeconfig), "drain_nodes": True},
                                 database_url=f"sqlite:///{root / 'gpufinops.db'}")
        store = Store(settings.database_url)
        clock = {"now": t0}
        cloud = WorkloadCloud(KubernetesCluster(api_client(str(kubeconfig)), timeout_s=2.0),
                              lambda itype, region, lifecycle: PRICES.get(itype), drain_nodes=True,
                              clock=lambda: clock["now"])
        notifier = ConsoleNotifier(store, lambda: clock["now"], lambda _line: None)
        peers = Peers(cloud, NoUsage(), store, notifier)
        actions = []
        for m in MINUTES:
            if m >= REMOVED_BEFORE:
                kube.delete("nodes", "", kube.name("train-empty"))  # Karpenter removed it (404 once gone)
            clock["now"] = t0 + timedelta(minutes=m)
            report = run_once(RunContext(now=clock["now"], dry_run=False), settings, [DRAIN], peers)
            assert not report.degraded(), report.errors
            actions += report.actions
        paths = write_monthly_report(store, month_name, root / "out", now, settings)
        frame = store.node_hours_frame(t0 - timedelta(hours=1), now)
        store.close()
        kube.check_rbac()  # every request the tick made was granted by the shipped ClusterRole
    finally:
        kube.close()
    doc = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    html = next(p for p in paths if p.suffix == ".html").read_text()
    return {"actions": actions, "paths": paths, "doc": doc, "html": html, "frame": frame, "root": root,
            "t0": t0, "now": now, "month": month_name, "name": kube.name}


class NoUsage:
    def window_usage(self, instances, window_s, now):
        return {}


def pools(doc) -> dict[str, dict]:
    return {r["node_pool"]: r for r in doc["tables"]["k8s_node_pools"]}


def test_each_pools_pods_and_idle_capacity_add_up_to_its_nodes_cost_to_the_cent(month):
    got = pools(month["doc"])
    assert set(got) == {TRAIN, INFER, NO_POOL}
    for pool in got:
        mine = [n for n, spec in NODES.items() if spec[0] == pool]
        row = got[pool]
        node, pods, idle = (round(row[k] * 100) for k in ("node_cost", "pods_cost", "idle_capacity_cost"))
        assert node == sum(sum(node_cents(n)) for n in mine), pool  # each tick's time at the node's price
        assert pods + idle == node, pool
        # Idle capacity: the share of the node no pod holds, within the cent each tick's split may round.
        exact = sum(NODES[n][3] * c for n in mine for c in node_cents(n))
        ticks = sum(len(node_cents(n)) for n in mine)
        assert abs(idle - exact) < ticks, pool
        assert row["nodes"] == len(mine)
        assert row["sharing"] == ", ".join(sorted({NODES[n][4] for n in mine}))
        hours = {n: sum(s for _, s in seen_ticks(n)) / 3600 for n in mine}
        assert row["node_hours"] == pytest.approx(sum(hours.values()))
        assert row["gpu_hours"] == pytest.approx(sum(NODES[n][2] * h for n, h in hours.items()))
        assert row["unpriced_hours"] == 0
    order = [r["node_pool"] for r in month["doc"]["tables"]["k8s_node_pools"]]
    assert order == sorted(got, key=lambda p: -got[p]["node_cost"])  # largest node cost first


def test_the_empty_nodes_hours_and_its_cordon_with_what_it_saved(month):
    got = pools(month["doc"])
    empty_hours = sum(s for _, s in seen_ticks("train-empty")) / 3600
    assert got[TRAIN]["empty_hours"] == pytest.approx(empty_hours)  # train-a always had its pods
    assert got[INFER]["empty_hours"] == 0 and got[NO_POOL]["empty_hours"] == 0
    empty = node_id(month["name"]("train-empty"))
    [cordon] = [a for a in month["actions"] if a.instance_id == empty and a.kind == ActionKind.STOP]
    assert cordon.ok and cordon.at == month["t0"] + timedelta(minutes=CORDON_MINUTE)
    assert got[TRAIN]["cordoned"] == 1 and got[INFER]["cordoned"] == 0 and got[INFER]["saved_cost"] is None
    # Saved: from the cordon to the end of what the month observed (the last tick + a tick interval), less the time
    # the node was still there (the ticks at 80 and 85 saw it: 4 + 5 minutes).
    observed_end = MINUTES[-1] + EVERY_S / 60
    still_there = sum(s for m, s in seen_ticks("train-empty") if m > CORDON_MINUTE) / 60
    saved_h = (observed_end - CORDON_MINUTE - still_there) / 60
    assert still_there == 9 and got[TRAIN]["saved_hours"] == pytest.approx(saved_h)
    rate = sum(node_cents("train-empty")) / 100 / empty_hours
    assert got[TRAIN]["saved_cost"] == pytest.approx(round(saved_h * rate, 2))
    h = month["doc"]["headline"]
    assert h["k8s_cordon_saved_cost"] == pytest.approx(got[TRAIN]["saved_cost"])
    assert round(h["k8s_idle_capacity_cost"] * 100) == sum(round(r["idle_capacity_cost"] * 100) for r in got.values())


def test_the_store_keeps_one_row_per_hour_and_node(month):
    frame = month["frame"]
    assert not frame.duplicated(["hour", "node"]).any()
    assert (frame["pods_cents"] + frame["idle_cents"] == frame["node_cents"]).all()
    assert frame["ticks"].sum() == sum(len(seen_ticks(n)) for n in NODES)
    assert set(frame.loc[frame["node"] == month["name"]("infer-mig"), "node_pool"]) == {INFER}


def test_the_page_csv_and_json_show_the_pools(month):
    html, paths = month["html"], month["paths"]
    assert 'id="k8s-node-pools"' in html and "GPU node pools" in html and "1 node(s)" in html
    [path] = [p for p in paths if p.name == f"gpu-audit-{month['month']}-k8s-node-pools.csv"]
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert {r["node_pool"] for r in rows} == {TRAIN, INFER, NO_POOL}


def test_a_month_without_cluster_data_has_no_node_pool_table(month, tmp_path):
    store = Store(f"sqlite:///{month['root'] / 'gpufinops.db'}")
    try:
        before = (month["t0"].replace(day=1) - timedelta(days=1)).strftime("%Y-%m")  # the month before: no ticks
        paths = write_monthly_report(store, before, tmp_path, month["now"], load_settings(),
                                     formats=["html", "csv", "json"])
    finally:
        store.close()
    doc = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    assert "k8s_node_pools" not in doc["tables"] and doc["headline"]["k8s_node_cost"] is None
    assert not [p for p in paths if "node-pools" in p.name]
    assert 'id="k8s-node-pools"' not in next(p for p in paths if p.suffix == ".html").read_text()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_the_node_pool_table_reads_on_a_phone(month, tmp_path):
    (tmp_path / "probed.html").write_text(month["html"].replace("</body>", PROBE + "</body>"))
    (tmp_path / "phone.html").write_text('<!DOCTYPE html><html><body style="margin:0"><iframe src="probed.html" '
                                         'style="width:400px;height:900px;border:0"></iframe></body></html>')
    seen = measure((tmp_path / "phone.html").as_uri(), 400)
    assert seen["page"] <= 400
    for t in seen["tables"]:
        assert t["labelled"] == t["cells"] and not t["scrolls"] and t["right"] <= 400, t
