"""The monthly report's Kubernetes namespaces and workloads (issue 16, item 1): a month recorded through the store's
real recording path (Store.record_decisions and Store.record_instances, the calls the pipeline makes each tick) with
workloads in two namespaces beside an EC2 instance. Figures are checked against costs recomputed here in plain
Python from the recorded ticks (hourly ticks: each one is an hour at its stored $/h)."""

from __future__ import annotations

import csv
import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.places.kubernetes.names import workload_id
from gpufinops.config import load_settings
from gpufinops.k8s.model import WorkloadRef
from gpufinops.model import Decision, GpuInstance, ReasonCode, Verdict
from gpufinops.report import render
from gpufinops.report import write_monthly_report
from gpufinops.report.sections import CUT_NAME, workload_parts
from gpufinops.store.store import Store
from tests.report.test_report_browser import CHROMIUM, PROBE, measure

UTC = timezone.utc
NOW = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)
START = datetime(2026, 10, 5, tzinfo=UTC)
TICKS = 12
HOSTILE = "<img src=x onerror=alert(1)>"
LONG = "a-very-long-inference-deployment-name-that-goes-past-the-cut-of-64"
V = {"A": (Verdict.ACTIVE, ReasonCode.BUSY, 80.0), "I": (Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, 0.0),
     "U": (Verdict.UNKNOWN, ReasonCode.NO_SERIES, None)}

# id -> (team, owner, GPUs held, $/h stored with each tick, one verdict letter per hourly tick)
FLEET = {
    "i-0ec2": ("ml", "bob", 1, 1.006, "A" * TICKS),
    workload_id(WorkloadRef("ml", "Deployment", "infer")): ("ml", "alice", 2, 2.503, "I" * 6 + "A" * 6),
    workload_id(WorkloadRef("ml", "Job", "train")): ("ml", "", 1, 0.3333, "U" * 3 + "A" * 9),
    workload_id(WorkloadRef("research", "StatefulSet", HOSTILE)): ("research", HOSTILE, 1, 1.2517, "I" * 4 + "A" * 8),
    workload_id(WorkloadRef("research", "Deployment", LONG)): ("research", "carol", 4, 4.1119, "I" * 2 + "A" * 10),
}
MONTH = "2026-10"


@pytest.fixture(scope="module")
def month(tmp_path_factory):
    """October 2026 with the fleet above, September 2026 with the EC2 instance only; both reports written."""
    root = tmp_path_factory.mktemp("k8s")
    store = Store(f"sqlite:///{root / 'a.db'}")
    try:
        for first, fleet in ((START - timedelta(days=30), {"i-0ec2": FLEET["i-0ec2"]}), (START, FLEET)):  # in time order
            for n in range(TICKS):
                at = first + timedelta(hours=n)
                decisions = []
                for iid, (_, _, _, rate, verdicts) in fleet.items():
                    verdict, code, act = V[verdicts[n]]
                    decisions.append(Decision(iid, "r", verdict, code, "why", at, activity_mean=act, hourly_cost=rate))
                store.record_decisions(f"run-{first:%m}-{n}", decisions, dry_run=True,
                                       teams={i: f[0] for i, f in fleet.items()},
                                       types={i: "g5.xlarge" if i == "i-0ec2" else "p4d.24xlarge" for i in fleet},
                                       max_gap_s=7200)
                store.record_instances([
                    GpuInstance(i, "g5.xlarge" if i == "i-0ec2" else "p4d.24xlarge", "us-east-1", "running", first,
                                tags={k: v for k, v in (("team", f[0]), ("owner", f[1])) if v}, gpu_count=f[2],
                                provider="aws" if i == "i-0ec2" else "kubernetes")
                    for i, f in fleet.items()], at)
    finally:
        store.close()
    settings = load_settings(report={"evaluate_every_s": 3600})
    out = {}
    for m in (MONTH, "2026-09"):
        store = Store(f"sqlite:///{root / 'a.db'}")
        try:
            paths = write_monthly_report(store, m, root / m, NOW, settings)
        finally:
            store.close()
        html = next(p for p in paths if p.suffix == ".html").read_text()
        doc = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
        out[m] = (paths, html, doc)
    return root, settings, out


def expected() -> dict[str, dict]:
    """Per workload, from the recorded ticks: each hourly tick is one hour at the rate stored with it."""
    out = {}
    for iid, (team, owner, gpus, rate, verdicts) in FLEET.items():
        if not iid.startswith("k8s:"):
            continue
        out[iid] = {"cost": round(TICKS * rate, 2), "idle_cost": round(verdicts.count("I") * rate, 2),
                    "unknown_cost": round(verdicts.count("U") * rate, 2), "gpu_hours": TICKS * gpus,
                    "idle_hours": float(verdicts.count("I")), "unknown_hours": float(verdicts.count("U")),
                    "active_hours": float(verdicts.count("A")), "namespace": iid[4:].split("/")[0],
                    "owner": owner or "no owner tag", "team": team}
    return out


def test_namespaces_add_up_to_their_workloads_and_to_the_recorded_ticks(month):
    _, _, out = month
    _, html, doc = out[MONTH]
    want = expected()
    workloads = {r["instance_id"]: r for r in doc["tables"]["k8s_workloads"]}
    assert set(workloads) == set(want)  # the EC2 instance is not a workload
    for iid, w in want.items():
        got = workloads[iid]
        for key in ("cost", "idle_cost", "unknown_cost", "gpu_hours", "idle_hours", "unknown_hours", "active_hours",
                    "namespace", "owner", "team"):
            assert got[key] == pytest.approx(w[key]) if isinstance(w[key], float) else got[key] == w[key], (iid, key)
    namespaces = {r["namespace"]: r for r in doc["tables"]["k8s_namespaces"]}
    assert set(namespaces) == {"ml", "research"}
    for ns, row in namespaces.items():
        mine = [w for w in want.values() if w["namespace"] == ns]
        assert row["workloads"] == len(mine)
        for key in ("cost", "idle_cost", "unknown_cost"):
            # to the cent: the namespace is the sum of its workloads' rounded amounts, and of the recorded ticks
            assert round(row[key] * 100) == sum(round(w[key] * 100) for w in mine), (ns, key)
            assert round(row[key] * 100) == sum(round(workloads[i][key] * 100) for i in workloads
                                                if workloads[i]["namespace"] == ns)
        assert row["gpu_hours"] == pytest.approx(sum(w["gpu_hours"] for w in mine))  # the pods' GPUs, not the node's 8
    # The workloads' cost is part of the evaluated spend (nothing billed: the spend is the evaluated cost).
    h = doc["headline"]
    ec2_cost = TICKS * FLEET["i-0ec2"][3]
    assert h["evaluated_cost"] == pytest.approx(ec2_cost + sum(TICKS * f[3] for i, f in FLEET.items() if i != "i-0ec2"))
    assert h["k8s_cost"] == pytest.approx(sum(n["cost"] for n in namespaces.values()))
    assert h["k8s_workloads"] == 4
    assert "part of\n  the GPU spend above" in html and "gpufinops costs --by namespace" in html


def test_tables_are_sorted_as_captioned_and_listed_in_the_contents(month):
    _, _, out = month
    _, html, doc = out[MONTH]
    ns_costs = [r["cost"] for r in doc["tables"]["k8s_namespaces"]]
    assert ns_costs == sorted(ns_costs, reverse=True)
    idle = [r["idle_cost"] for r in doc["tables"]["k8s_workloads"]]
    assert idle == sorted(idle, reverse=True) and idle[0] > 0
    assert '<a href="#kubernetes">Kubernetes namespaces and workloads</a>' in html
    section = html[html.index('<h2 id="kubernetes">'):]
    section = section[:section.index("<h2", 1)]
    assert "Sorted by cost, largest first" in section and "Sorted by idle cost, largest first" in section
    # The page shows the workloads in the JSON's order.
    names = re.findall(r'<td data-label="Name" class="reason">([^<]*)</td>', section)
    assert names == [workload_parts(r["instance_id"])[2].replace("<", "&lt;").replace(">", "&gt;")
                     for r in doc["tables"]["k8s_workloads"]]


def test_a_hostile_workload_name_is_escaped_and_a_cut_id_keeps_its_namespace(month):
    _, _, out = month
    _, html, doc = out[MONTH]
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    rows = {r["instance_id"]: r for r in doc["tables"]["k8s_workloads"]}
    assert rows[workload_id(WorkloadRef("research", "StatefulSet", HOSTILE))]["name"] == HOSTILE  # JSON: as it is
    cut = workload_id(WorkloadRef("research", "Deployment", LONG))
    assert len(cut) == 64 and "~" in cut
    assert (rows[cut]["namespace"], rows[cut]["kind"]) == ("research", "Deployment")
    assert rows[cut]["name"].startswith("a-very-long") and re.search(r"~[0-9a-f]{10}$", rows[cut]["name"])
    assert workload_parts("k8s:" + "n" * 59 + "~0123456789")[2] == CUT_NAME  # cut inside the namespace


def test_the_csvs_are_written_to_the_cent(month):
    _, _, out = month
    paths, _, doc = out[MONTH]
    by_name = {p.name: p for p in paths}
    with by_name[f"gpu-audit-{MONTH}-k8s-namespaces.csv"].open() as fh:
        ns = list(csv.DictReader(fh))
    with by_name[f"gpu-audit-{MONTH}-k8s-workloads.csv"].open() as fh:
        wl = list(csv.DictReader(fh))
    assert [r["namespace"] for r in ns] == [r["namespace"] for r in doc["tables"]["k8s_namespaces"]]
    for r in ns:
        assert re.fullmatch(r"\d+\.\d{1,2}", r["cost_usd"]) and r["currency"] == "USD"
        cents = sum(round(float(w["cost_usd"]) * 100) for w in wl if w["namespace"] == r["namespace"])
        assert round(float(r["cost_usd"]) * 100) == cents
    assert len(wl) == 4 and {"idle_cost_usd", "unknown_cost_usd", "owner", "kind", "name"} <= set(wl[0])


def test_more_workloads_than_the_page_shows_are_in_the_csv(month, tmp_path, monkeypatch):
    root, settings, _ = month
    monkeypatch.setattr(render, "K8S_TOP", 2)
    store = Store(f"sqlite:///{root / 'a.db'}")
    try:
        paths = write_monthly_report(store, MONTH, tmp_path, NOW, settings, formats=["html"])
    finally:
        store.close()
    html = paths[0].read_text()
    assert f"2 more in <code>gpu-audit-{MONTH}-k8s-workloads.csv</code>" in html
    section = html[html.index('<h3 id="k8s-workloads">'):]
    assert len(re.findall(r'<td data-label="Name"', section[:section.index("</table>")])) == 2


def test_a_month_without_workloads_has_no_kubernetes_section(month):
    _, _, out = month
    paths, html, doc = out["2026-09"]
    assert doc["headline"]["evaluations"] > 0
    assert 'id="kubernetes"' not in html and "#kubernetes" not in html and "Kubernetes namespaces" not in html
    assert not [p for p in paths if "k8s" in p.name]
    assert "k8s_namespaces" not in doc["tables"] and "k8s_workloads" not in doc["tables"]
    assert doc["headline"]["k8s_workloads"] == 0 and doc["headline"]["k8s_cost"] is None


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_the_kubernetes_section_reads_on_a_phone(month, tmp_path):
    """At 400 px (test_report_browser's probe, in an iframe) every table of the page, the two Kubernetes ones
    included, is a card of labelled cells that fits the width: a 64-character workload id wraps."""
    _, _, out = month
    _, html, _ = out[MONTH]
    (tmp_path / "probed.html").write_text(html.replace("</body>", PROBE + "</body>"))
    (tmp_path / "phone.html").write_text('<!DOCTYPE html><html><body style="margin:0"><iframe src="probed.html" '
                                         'style="width:400px;height:900px;border:0"></iframe></body></html>')
    seen = measure((tmp_path / "phone.html").as_uri(), 400)
    assert seen["page"] <= 400
    assert len(seen["tables"]) >= 4  # teams, instances and the two Kubernetes tables at least
    for t in seen["tables"]:
        assert t["labelled"] == t["cells"] and not t["scrolls"] and t["right"] <= 400, t


def test_a_workload_without_a_stored_share_is_unpriced_not_priced_as_its_node(tmp_path):
    """A workload's $/h is its pods' share, stored with its verdicts; without one (a spot node, no catalog price)
    its time is unpriced. The catalog's price of its node type would be the whole node."""
    store = Store(f"sqlite:///{tmp_path / 'b.db'}")
    iid = workload_id(WorkloadRef("ml", "Deployment", "spot-infer"))
    try:
        for n in range(4):
            at = START + timedelta(hours=n)
            store.record_decisions(f"r{n}", [Decision(iid, "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "why", at,
                                                      activity_mean=0.0),
                                             Decision("i-0ec2", "r", Verdict.ACTIVE, ReasonCode.BUSY, "why", at,
                                                      activity_mean=80.0)],
                                   dry_run=True, types={iid: "p4d.24xlarge", "i-0ec2": "g5.xlarge"}, max_gap_s=7200)
        paths = write_monthly_report(store, MONTH, tmp_path / "out", NOW, load_settings(report={"evaluate_every_s": 3600}),
                                     formats=["json"])
    finally:
        store.close()
    doc = json.loads(paths[0].read_text())
    (row,) = doc["tables"]["k8s_workloads"]
    assert row["cost"] is None and row["idle_cost"] is None and row["unpriced_hours"] == pytest.approx(4.0)
    assert row["gpus"] is None and row["owner"] == "no owner tag"  # nothing listed: GPUs unknown, not the node's 8
    (ec2,) = [r for r in doc["tables"]["instances"] if r["instance_id"] == "i-0ec2"]
    assert ec2["cost"] > 0  # an EC2 instance without a stored price is still priced from the catalog
    assert doc["headline"]["unpriced_hours"] == pytest.approx(4.0)
