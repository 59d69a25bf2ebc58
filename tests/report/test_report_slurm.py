"""The monthly report's Slurm section (issue 38, Cost): GPU-hours and dollars per account, user, partition and QOS from
the clusters' accounting (the real sacct capture tests/data/slurm/sacct-22.05.json, served by a `sacct` that prints
it), idle from stored `slurm:` verdicts, a Slurm account's budget, and the finance page — in the HTML, the CSVs and
the JSON, and read on a phone by headless Chromium."""

from __future__ import annotations

import csv
import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpufinops.config import load_settings
from gpufinops.report import write_monthly_report
from gpufinops.run.slurm_cost import slurm_reader
from gpufinops.store.store import Store
from gpufinops.cli import main
from gpufinops.cost.slurm import NONE
from tests.cost.test_slurm_costs import PRICES, config, record_idle_hour
from tests.report.test_report_browser import CHROMIUM, PROBE, measure

CAPTURE = Path(__file__).parents[1] / "data" / "slurm" / "sacct-22.05.json"
MONTH = "2026-12"
NOW = datetime(2027, 1, 2, 6, tzinfo=timezone.utc)  # the month is over: the whole of it


def fake_sacct(tmp_path, monkeypatch, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sacct").write_text("#!/bin/sh\n" + body)
    (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def report(tmp_path, sacct_body: str, monkeypatch, budgets: str = "") -> dict:
    fake_sacct(tmp_path, monkeypatch, sacct_body)
    db = f"sqlite:///{tmp_path / 'g.db'}"
    record_idle_hour(db, datetime(2026, 12, 3, 10, tzinfo=timezone.utc))
    extra = {}
    if budgets:
        (tmp_path / "budgets.yaml").write_text(budgets)
        extra["billing"] = {"budgets_path": str(tmp_path / "budgets.yaml")}
    settings = load_settings(None, database_url=db, slurm={"cluster": "acct", **PRICES}, **extra)
    store = Store(db)
    try:
        paths = write_monthly_report(store, MONTH, tmp_path / "out", NOW, settings, formats=["html", "csv", "json"],
                                     slurm=slurm_reader(settings, store))
    finally:
        store.close()
    return {"paths": paths, "html": next(p for p in paths if p.suffix == ".html").read_text(),
            "doc": json.loads(next(p for p in paths if p.suffix == ".json").read_text())}


@pytest.fixture
def month(tmp_path, monkeypatch):
    return report(tmp_path, f"cat {CAPTURE}\n", monkeypatch, budgets=(
        "budgets:\n  - name: ml-gpu\n    scope: {kind: slurm_account, value: ml}\n    amount: 40\n"))


def test_json_has_the_accounts_users_partitions_and_headline(month):
    doc = month["doc"]
    acc = doc["tables"]["slurm_accounts"]
    # ml: 148 GPU-s at $0.25 = $37.00, idle: job 1's IDLE hour x 2 GPUs x $900; vision: $5.00 + $5.25
    assert [(r["account"], r["jobs"], r["cost"], r["idle_gpu_hours"], r["idle_cost"]) for r in acc] == [
        ("ml", 2, 37.0, 2.0, 1800.0), ("vision", 2, 10.25, 0.0, 0.0)]
    assert [(r["user"], r["cost"]) for r in doc["tables"]["slurm_users"]] == [("alice", 37.0), ("bob", 10.25)]
    assert [(r["partition"], r["cost"]) for r in doc["tables"]["slurm_partitions"]] == [("gpu", 42.25),
                                                                                          ("interactive", 5.0)]
    h = doc["headline"]
    assert (h["slurm_jobs"], round(h["slurm_cost"], 2), round(h["slurm_idle_cost"], 2), h["slurm_errors"]) == (
        4, 47.25, 1800.0, [])
    assert h["slurm_gpu_hours"] == pytest.approx(194 / 3600)
    f = doc["finance"]["slurm"]
    assert round(f["cost"], 2) == 47.25 and [a["account"] for a in f["accounts"]] == ["ml", "vision"]


def qos_capture(tmp_path) -> Path:
    """The real capture with its QOS as a site with several shows them: job 1 (alice/ml) under `high`, job 2
    (bob/vision) with none (sacct's empty string), jobs 3 and 4 (one of each account) under `normal` as captured.
    Nothing else is changed, so the QOS groups cut across the accounts."""
    doc = json.loads(CAPTURE.read_text())
    for job in doc["jobs"]:
        job["qos"] = {1: "high", 2: ""}.get(job["job_id"], job["qos"])
    path = tmp_path / "sacct-qos.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def month_qos(tmp_path, monkeypatch):
    return report(tmp_path, f"cat {qos_capture(tmp_path)}\n", monkeypatch)


def slurm_csv(got: dict, table: str) -> list[dict]:
    """The rows of the report's `gpu-audit-<month>-slurm-<table>.csv` (exactly one such file is written)."""
    [path] = [p for p in got["paths"] if p.name == f"gpu-audit-{MONTH}-slurm-{table}.csv"]
    with path.open() as f:
        return list(csv.DictReader(f))


SUMMED = ("jobs", "gpu_hours", "cost", "unpriced_gpu_hours", "idle_gpu_hours", "idle_cost")


def test_json_has_the_qos_table(month):
    # The capture as it is: every job under Slurm's default QOS `normal`, so one row holding the month.
    assert [(r["qos"], r["jobs"], r["gpu_hours"], r["cost"], r["unpriced_gpu_hours"], r["idle_gpu_hours"],
             r["idle_cost"]) for r in month["doc"]["tables"]["slurm_qos"]] == [
        ("normal", 4, 0.05, 47.25, 0.0, 2.0, 1800.0)]


def test_qos_rows_add_up_to_the_account_table_and_a_job_without_one_is_none(month_qos):
    tables = month_qos["doc"]["tables"]
    qos = tables["slurm_qos"]
    # high: job 1, 80 GPU-s at $0.25 and its idle hour x 2 GPUs x $900; normal: jobs 3 (68 GPU-s) and 4 (21 GPU-s)
    # at $0.25; (none): job 2, 25 GPU-s at $0.20 (interactive)
    assert [(r["qos"], r["jobs"], r["cost"], r["idle_gpu_hours"], r["idle_cost"]) for r in qos] == [
        ("normal", 2, 22.25, 0.0, 0.0), ("high", 1, 20.0, 2.0, 1800.0), (NONE, 1, 5.0, 0.0, 0.0)]
    assert NONE == "(none)"  # the label `costs --by slurm-qos` prints for a run without a QOS
    accounts = tables["slurm_accounts"]
    for column in SUMMED:
        assert sum(r[column] for r in qos) == pytest.approx(sum(r[column] for r in accounts), abs=1e-9), column
    h = month_qos["doc"]["headline"]
    assert sum(r["cost"] for r in qos) == pytest.approx(h["slurm_cost"]) and sum(r["jobs"] for r in qos) == h[
        "slurm_jobs"]


def test_the_qos_table_is_what_costs_by_slurm_qos_prints(month_qos, tmp_path, capsys):
    # The same sacct on PATH and the same database (the idle hour) as the report read.
    capsys.readouterr()
    assert main(["--config", str(config(tmp_path, **PRICES)), "costs", "--by", "slurm-qos", "--month", MONTH,
                 "-o", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["slurm-qos"], r["jobs"], r["gpu_hours"], r["usd"], r["unpriced_gpu_hours"], r["idle_gpu_hours"],
             r["idle_usd"], r["idle_share"]) for r in printed] == [
        (r["qos"], r["jobs"], r["gpu_hours"], r["cost"], r["unpriced_gpu_hours"], r["idle_gpu_hours"],
         r["idle_cost"], r["idle_share"]) for r in month_qos["doc"]["tables"]["slurm_qos"]]


def test_the_qos_csv_and_html_table(month_qos):
    rows = slurm_csv(month_qos, "qos")
    assert list(rows[0]) == ["qos", "jobs", "gpu_hours", "cost_usd", "unpriced_gpu_hours", "idle_gpu_hours",
                             "idle_cost_usd", "idle_share", "currency"]
    assert [(r["qos"], r["cost_usd"], r["idle_cost_usd"]) for r in rows] == [
        ("normal", "22.25", "0.0"), ("high", "20.0", "1800.0"), ("(none)", "5.0", "0.0")]
    html = month_qos["html"]
    assert "Slurm clusters: GPU-hours by account, user, partition and QOS" in html
    table = html[html.index('<h3 id="slurm-qos">QOS</h3>'):]
    table = table[:table.index("</table>")]
    assert "<th>QOS</th>" in table
    assert [c for c in ("normal", "high", "(none)") if f'data-label="QOS">{c}</td>' in table] == [
        "normal", "high", "(none)"]
    assert f"<code>gpu-audit-{MONTH}-slurm-qos.csv</code>" in html


def test_the_budget_of_a_slurm_account_is_in_the_budget_table(month):
    (b,) = month["doc"]["tables"]["budgets"]
    assert (b["budget"], b["scope"], b["actual"], b["actual_pct"], b["status"]) == (
        "ml-gpu", "slurm_account=ml", 37.0, 92.5, "within budget")
    assert b["basis"] == "Slurm accounting (sacct GPU-hours x price)"


def test_csv_files_and_money_columns(month):
    rows = slurm_csv(month, "accounts")
    assert list(rows[0]) == ["account", "jobs", "gpu_hours", "cost_usd", "unpriced_gpu_hours", "idle_gpu_hours",
                             "idle_cost_usd", "idle_share", "currency"]
    assert [(r["account"], r["cost_usd"], r["idle_cost_usd"]) for r in rows] == [("ml", "37.0", "1800.0"),
                                                                                ("vision", "10.25", "0.0")]
    names = {p.name for p in month["paths"]}
    assert {f"gpu-audit-{MONTH}-slurm-users.csv", f"gpu-audit-{MONTH}-slurm-partitions.csv"} <= names


def test_html_section_and_finance_page(month):
    html = month["html"]
    assert 'id="slurm"' in html and 'href="#slurm"' in html and 'id="slurm-partitions"' in html
    assert "4 Slurm job(s) held GPUs this month: 0.05 GPU-hours, $47.25" in html
    finance = html[html.index('<section id="finance">'):html.index("</section>")]
    assert 'id="finance-slurm"' in finance and "$47.25" in finance and "$1,800.00" in finance


def test_sacct_failing_is_said_not_zero(tmp_path, monkeypatch):
    got = report(tmp_path, "echo 'sacct: error: Problem talking to the database' >&2\nexit 1\n", monkeypatch)
    doc = got["doc"]
    assert doc["headline"]["slurm_cost"] is None and doc["headline"]["slurm_errors"] == [
        "slurm acct: sacct --json failed (exit 1): sacct: error: Problem talking to the database, in window 1 of 31 "
        "(2026-12-01 00:00:00 to 2026-12-02 00:00:00 UTC) (its GPU-hours are unknown, not zero)"]
    assert doc["headline"]["slurm_errors"][0] in doc["data_quality"]["warnings"]
    assert "slurm_accounts" in doc["tables"] and doc["tables"]["slurm_accounts"] == []
    assert "<strong>Not read:</strong> slurm acct: sacct --json failed" in got["html"]


def test_no_slurm_section_without_slurm(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    settings = load_settings(None, database_url=f"sqlite:///{tmp_path / 'g.db'}")
    assert slurm_reader(settings, store) is None
    paths = write_monthly_report(store, MONTH, tmp_path / "out", NOW, settings, formats=["html", "json"])
    doc = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    assert "slurm_accounts" not in doc["tables"] and doc["finance"]["slurm"] is None
    assert 'id="slurm"' not in next(p for p in paths if p.suffix == ".html").read_text()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
@pytest.mark.parametrize("width", [1280, 400])
def test_the_slurm_tables_read_at_desktop_and_phone_widths(month_qos, tmp_path, width):
    html = month_qos["html"]
    assert 'id="slurm-qos"' in html
    (tmp_path / "probed.html").write_text(html.replace("</body>", PROBE + "</body>"))
    (tmp_path / "phone.html").write_text('<!DOCTYPE html><html><body style="margin:0"><iframe src="probed.html" '
                                         'style="width:400px;height:900px;border:0"></iframe></body></html>')
    seen = measure((tmp_path / ("probed.html" if width > 500 else "phone.html")).as_uri(), width)
    assert seen["page"] <= width
    assert len(seen["tables"]) == html.count("<table")  # every table measured, the QOS one with them
    for t in seen["tables"]:
        assert t["labelled"] == t["cells"] and not t["scrolls"] and t["right"] <= width, t
