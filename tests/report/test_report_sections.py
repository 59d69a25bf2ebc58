"""The report's sections for finance (issue 14): coverage banner, one definition of missing data, net against gross
savings, "–" for what was not measured, stops grouped per instance, trend, budgets, breakdowns, words for people.

Months are made through the real pipeline (the demo under the common 40%/10 min rule: many real stops, restarts
and false stops) or recorded through Store.record_decisions (the method the pipeline calls each tick), and the
figures are checked against the stored rows, recomputed here in plain Python.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from datetime import date, datetime, timedelta, timezone

import pandas as pd
import pytest

from gpufinops.collect.billing.schema import save_costs
from gpufinops.config import load_settings
from gpufinops.demo.run import FLEET_SHAPES, common_rule_path, run_demo
from gpufinops.model import FALSE_STOP_COST_H, FALSE_STOP_WITHIN_S, Decision, ReasonCode, Verdict
from gpufinops.report import monthly_audit, write_monthly_report
from gpufinops.report import render
from gpufinops.model import RESTART_COST_S
from gpufinops.report.words import action_words, words
from gpufinops.store.store import Store

NOW = datetime(2026, 11, 3, 9, 0, tzinfo=timezone.utc)
DEMO_MONTH = "2022-09"


@pytest.fixture(scope="module")
def churn(tmp_path_factory):
    """3 simulated hours of the real pipeline under the common 40%/10 min rule, acting for real: stops that
    owners undo within minutes (restarts, false stops)."""
    db = tmp_path_factory.mktemp("churn") / "churn.db"
    settings = load_settings(act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 0.5},
                             rules_paths=[str(common_rule_path())],
                             store={"raw_decisions_every_s": 0})  # every tick's raw row: the counts below
    summary = run_demo(out=io.StringIO(), hours=3, db_path=str(db), quiet=True, settings=settings, compare=False)
    return db, summary


@pytest.fixture(scope="module")
def churn_page(churn, tmp_path_factory):
    """The churn month's report, written once: (html, JSON document)."""
    _, html, doc = _write(churn[0], tmp_path_factory.mktemp("churn-out"), DEMO_MONTH)
    return html, doc


def _write(db, out, month, now=NOW, settings=None):
    store = Store(f"sqlite:///{db}")
    try:
        paths = write_monthly_report(store, month, out, now, settings)
    finally:
        store.close()
    html = next(p for p in paths if p.suffix == ".html").read_text()
    doc = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    return paths, html, doc


def usd(v: float) -> str:
    """Money as the page writes it: -$6.17, $1,234.50."""
    return f"{'-' if round(v, 2) < 0 else ''}${abs(v):,.2f}"


def _stops_from_db(db):
    """Each completed real stop with its rate and whether (and how soon) the instance was evaluated again."""
    con = sqlite3.connect(db)
    stops = con.execute("select instance_id, at from actions where kind='stop' and status='done' and dry_run=0 "
                        "order by at").fetchall()
    out = []
    for inst, at in stops:
        back = con.execute("select min(evaluated_at) from decisions where instance_id=? and evaluated_at>?",
                           (inst, at)).fetchone()[0]
        rate = con.execute("select hourly_cost from decisions where instance_id=? and evaluated_at<=? "
                           "order by evaluated_at desc limit 1", (inst, at)).fetchone()[0]
        gone = (datetime.fromisoformat(back) - datetime.fromisoformat(at)).total_seconds() if back else None
        out.append({"instance_id": inst, "rate": rate, "restarted": back is not None,
                    "false": gone is not None and gone <= FALSE_STOP_WITHIN_S})
    con.close()
    return out


# --------------------------------------------------------------------------- net against gross


def test_net_savings_are_gross_less_restarts_and_false_stops(churn, churn_page):
    (db, summary), (html, doc) = churn, churn_page
    h = doc["headline"]
    stops = _stops_from_db(db)
    assert len(stops) == h["stops"] == summary.stops > 5
    # Recomputed from the stored rows: every demo instance has one GPU, so a false stop's 2 GPU-h cost 2 h of rate.
    restart = sum(RESTART_COST_S / 3600 * s["rate"] for s in stops if s["restarted"])
    false = sum(FALSE_STOP_COST_H * s["rate"] for s in stops if s["false"])
    assert h["restarts"] == sum(s["restarted"] for s in stops) == summary.restarts > 0
    assert h["false_stops"] == sum(s["false"] for s in stops) == summary.false_stops > 0
    assert h["restart_cost"] == pytest.approx(restart) == pytest.approx(summary.restart_dollars)
    assert h["false_stop_cost"] == pytest.approx(false)
    assert h["saved_cost"] == pytest.approx(summary.dollars_saved)
    assert h["net_saved_cost"] == pytest.approx(summary.dollars_saved - restart - false)
    assert h["net_saved_cost"] < 0 < h["saved_cost"]  # this rule's stops cost more than they save
    # In GPU-hours, the backtest's score: net GPU-h - c x false stops.
    assert h["net_saved_gpu_hours"] == pytest.approx(summary.score)
    # The page shows net next to gross and says how net is counted.
    card = re.search(r"Saved by stops: net</div>(.*?)</div></div>", html, re.S).group(1)
    assert usd(h["net_saved_cost"]) in card and usd(h["saved_cost"]) in card
    assert "restarts" in card and "false stops" in card
    assert "as <code>gpufinops backtest</code> counts it" in html


def test_stops_are_grouped_per_instance_sorted_by_net(churn, tmp_path, monkeypatch):
    db, _ = churn
    monkeypatch.setattr(render, "STOPS_TOP", 3)
    _, html, doc = _write(db, tmp_path / "out", DEMO_MONTH)
    grouped, h = doc["tables"]["stops_by_instance"], doc["headline"]
    stops = _stops_from_db(db)
    per_instance = {}
    for s in stops:
        per_instance[s["instance_id"]] = per_instance.get(s["instance_id"], 0) + 1
    assert {r["instance_id"]: r["stops"] for r in grouped} == per_instance
    assert [r["net_cost"] for r in grouped] == sorted((r["net_cost"] for r in grouped), reverse=True)
    assert sum(r["net_cost"] for r in grouped) == pytest.approx(h["net_saved_cost"])
    assert sum(r["false_stops"] for r in grouped) == h["false_stops"]
    # No billing in the demo: the owner is the tag the service saw on the instance (instance_labels).
    assert {r["owner"] for r in grouped} <= {tags.get("owner", "no owner tag") for _, tags in FLEET_SHAPES}
    # The page shows the top 3 and says where the rest and the per-stop log are.
    section = html[html.index('id="stops"'):html.index('id="unknown"')]
    assert section.count("<tr") == 1 + 3
    assert f"{len(grouped) - 3} more in <code>gpu-audit-{DEMO_MONTH}-stops_by_instance.csv</code>" in section
    assert f"gpu-audit-{DEMO_MONTH}-stops.csv</code> ({len(stops)} row(s))" in section
    assert "Sorted by net saving, largest first" in section
    assert len(doc["tables"]["stops"]) == len(stops)  # the full log stays in the CSV/JSON


# --------------------------------------------------------------------------- coverage, missing data, "–"


def test_partial_month_has_the_coverage_banner_and_one_missing_data_figure(churn, churn_page):
    db, (html, doc) = churn[0], churn_page
    cv, h = doc["coverage"], doc["headline"]
    assert not cv["complete"] and set(cv["partial_in"]) == {"month", "fleet", "billing"}
    assert cv["covered_hours"] == pytest.approx(doc["data_quality"]["service_covered_hours"])
    con = sqlite3.connect(db)
    seen = {i for (i,) in con.execute("select distinct instance_id from decisions")}
    judged = {i for (i,) in con.execute("select distinct instance_id from decisions where verdict != 'UNKNOWN'")}
    con.close()
    assert (cv["instances_judged"], cv["instances_seen"]) == (len(judged), len(seen))
    assert cv["instances_not_judged"] == sorted(seen - judged)
    # The banner comes before any figure.
    banner = html.index('id="coverage"')
    assert banner < html.index('id="summary"') < html.index('id="headline"') < html.index("data:image/png")
    assert f"{len(judged)} of {len(seen)} instance(s) seen have verdicts" in html
    assert "no cost rows stored" in html

    # One definition of "not judged": the card, the UNKNOWN spend of the daily table and the unknown-time table
    # are the same rows.
    t = doc["tables"]
    assert h["unknown_cost"] == pytest.approx(sum(r["unknown_cost"] or 0 for r in t["daily"]))
    assert h["unknown_cost"] == pytest.approx(sum(r["unknown_cost"] or 0 for r in t["unknown_time"]))
    assert h["unknown_hours"] == pytest.approx(sum(r["unknown_hours"] for r in t["unknown_time"]))
    assert h["missing_data_hours"] == pytest.approx(sum(r["missing_data_hours"] for r in t["unknown_time"]))
    assert h["missing_data_cost"] == pytest.approx(sum(r["missing_data_cost"] or 0 for r in t["unknown_time"]))
    assert h["unknown_hours"] == pytest.approx(h["missing_data_hours"] + h["other_unknown_hours"])
    card = re.search(r'id="card-unknown">(.*?)</div></div>', html, re.S).group(1)
    assert usd(h["unknown_cost"]) in card and f"{h['unknown_hours']:,.1f} h" in card

    # Not measured is "–" with why, never $0; $0.00 is never red.
    rec = html[html.index('id="card-recommendations"'):html.index('id="trend"')]
    assert '<div class="value">–</div>' in rec and "no recommendation run this month" in rec
    assert h["recommended_monthly_savings"] is None
    assert not re.search(r'class="[^"]*\bidle\b[^"]*">\$0\.00<', html)
    assert "Right-sizing: – (no recommendation run this month" in html
    # Every headline card says what it counts.
    cards = re.findall(r'<div class="card"[^>]*>', html)
    assert len(cards) == html.count('<div class="caption">counts: ') == 9
    # Cost per GPU-hour used: evaluated cost over the GPU-hours with some activity.
    assert h["cost_per_used_gpu_hour"] == pytest.approx(h["evaluated_cost"] / h["used_gpu_hours"])


def test_words_for_people():
    assert words("bursty_low") == "bursty, low average"
    assert words("memory_held_idle") == "memory held, no compute"
    assert words("evidence_of_work").startswith("working")
    assert words("gpu_fell_off_the_bus") == "Gpu fell off the bus"  # a code added after this mapping: still readable
    # Whatever codes the service stores, each reads as words.
    assert all(words(c.value) and "_" not in words(c.value) for c in ReasonCode)
    assert words("new-code_x") == "New code x" and words(None) == "–" and words("") == "–"
    assert action_words("unmark", "done", False, 70) == "scheduled stop called off ×70"
    assert action_words("stop", "failed", True, 2) == "stopped (dry-run), failed ×2"
    assert action_words("snooze", "brand_new", False, 1) == "snoozed by a person, brand new ×1"


def test_the_page_uses_words_not_codes(churn_page):
    html = churn_page[0]
    assert "outbox 5" not in html and not re.search(r"\boutbox \d", html)
    assert "written to the outbox file (no Slack token)" in html
    assert not re.search(r"\b(unmark|mark|notify) done\b", html)
    assert "<code>bursty_low</code>" not in html and "bursty_low" not in html
    # Every table says under it how its rows are sorted; page 1's four figures are not rows to sort and say
    # nothing of the kind (issue 40: "Rows in a fixed order." read as noise to a finance reader).
    after = re.findall(r"</table></div>\s*(<p class=\"sub\">[^<]*)", html)
    assert len(after) == html.count("<table>") - 1 and all("orted" in c or "order" in c for c in after), after
    finance = html[html.index('id="finance"'):html.index("</section>", html.index('id="finance"'))]
    assert "Rows in a fixed order" not in finance and "team(s)" not in finance
    for anchor in ("summary", "headline", "trend", "budgets", "teams", "instances", "breakdowns", "stops",
                   "unknown", "recommendations", "data-quality", "method"):
        assert f'href="#{anchor}"' in html and f'id="{anchor}"' in html


# --------------------------------------------------------------------------- a whole month, recorded


def _record_month(store, start, end, idle_hours, unknown_hours, every_s=3600):
    """One g5.xlarge (1 GPU, $1/h) evaluated every hour from start to end: idle for the first idle_hours,
    no metrics for the next unknown_hours, busy after."""
    decisions, at, n = [], start, 0
    while at < end:
        if n < idle_hours:
            v, code, act = Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, 0.0
        elif n < idle_hours + unknown_hours:
            v, code, act = Verdict.UNKNOWN, ReasonCode.NO_SERIES, None
        else:
            v, code, act = Verdict.ACTIVE, ReasonCode.BUSY, 80.0
        decisions.append(Decision("i-1", "r", v, code, "why", at, activity_mean=act, hourly_cost=1.0))
        at += timedelta(seconds=every_s)
        n += 1
    store.record_decisions("run", decisions, dry_run=False, teams={"i-1": "ml"}, types={"i-1": "g5.xlarge"},
                           max_gap_s=2 * every_s)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """September 2026 (no billing), October 2026 (billed every day, owner and account tagged) and November up to
    NOW, one hourly-evaluated instance; budgets for the whole fleet and for the team."""
    root = tmp_path_factory.mktemp("months")
    store = Store(f"sqlite:///{root / 'a.db'}")
    utc = timezone.utc
    _record_month(store, datetime(2026, 9, 1, tzinfo=utc), datetime(2026, 10, 1, tzinfo=utc), 10, 0)
    _record_month(store, datetime(2026, 10, 1, tzinfo=utc), datetime(2026, 11, 1, tzinfo=utc), 20, 5)
    _record_month(store, datetime(2026, 11, 1, tzinfo=utc), NOW, 0, 0)
    rows = [{"date": (date(2026, 10, 1) + timedelta(days=d)).isoformat(), "provider": "aws",
             "account": "111122223333", "region": "eu-west-1", "resource_id": "i-1", "instance_type": "g5.xlarge",
             "pricing_model": "on-demand", "team": "ml", "project": "", "owner": "<b>alice</b>", "tags": "{}",
             "cost": 24.0, "currency": "USD", "usage_hours": 24.0, "source": "cur"} for d in range(31)]
    save_costs(store, pd.DataFrame(rows), "cur", date(2026, 10, 1), date(2026, 11, 1), NOW)
    store.close()
    budgets = root / "budgets.yaml"
    budgets.write_text("budgets:\n"
                       "  - {name: fleet, scope: {kind: all}, amount: 1000, currency: USD}\n"
                       "  - {name: ml, scope: {kind: team, value: ml}, amount: 500, currency: USD}\n")
    settings = load_settings(report={"evaluate_every_s": 3600}, billing={"budgets_path": str(budgets)})
    return root / "a.db", settings


def test_a_full_month_is_complete_with_trend_budgets_and_breakdowns(recorded, tmp_path):
    db, settings = recorded
    _, html, doc = _write(db, tmp_path / "out", "2026-10", settings=settings)
    cv, h, t = doc["coverage"], doc["headline"], doc["tables"]
    assert cv["complete"] and cv["month_share"] == pytest.approx(1.0)
    assert (cv["instances_judged"], cv["instances_seen"], cv["billing_days"]) == (1, 1, 31)
    assert 'id="coverage">Coverage: complete' in html and "These figures cover part" not in html

    # Billing is the spend; idle and unknown are the recorded hours at the billed $1/h.
    assert h["gpu_spend"] == pytest.approx(744.0) and h["gpu_spend_source"] == "billing"
    assert h["idle_cost"] == pytest.approx(20.0) and h["unknown_cost"] == pytest.approx(5.0)
    assert h["missing_data_cost"] == pytest.approx(5.0) and h["missing_data_hours"] == pytest.approx(5.0)
    assert h["cost_per_used_gpu_hour"] == pytest.approx(744.0 / 719.0)

    # Trend against September (evaluated, not billed: 720 h at $1/h, 10 idle).
    trend = {r["metric"]: r for r in t["trend"]}
    assert doc["previous_month"] == "2026-09"
    assert trend["GPU spend"]["previous_month"] == pytest.approx(720.0)
    assert trend["GPU spend"]["change"] == pytest.approx(24.0)
    assert trend["Idle cost"]["previous_month"] == pytest.approx(10.0)
    assert trend["Idle cost"]["change_share"] == pytest.approx(1.0)
    assert trend["Net saved by stops"]["this_month"] == 0 and trend["Net saved by stops"]["previous_month"] == 0

    # Budgets against billed actual (a past month: the forecast is the actual).
    b = {r["budget"]: r for r in t["budgets"]}
    assert b["fleet"]["actual"] == pytest.approx(744.0) and b["fleet"]["actual_pct"] == pytest.approx(74.4)
    assert b["fleet"]["forecast"] == pytest.approx(744.0) and b["fleet"]["status"] == "within budget"
    assert b["ml"]["status"] == "over budget" and b["fleet"]["basis"] == "billing"

    # Owner, account, region and GPU model from billing and the catalog; the owner tag stays escaped.
    [inst] = t["instances"]
    assert (inst["owner"], inst["account"], inst["region"], inst["gpu_model"]) == (
        "<b>alice</b>", "111122223333", "eu-west-1", "A10G")
    assert "<b>alice</b>" not in html and "&lt;b&gt;alice&lt;/b&gt;" in html
    assert [r["account"] for r in t["accounts"]] == ["111122223333"]
    assert t["regions"][0]["cost"] == pytest.approx(744.0) and t["gpu_models"][0]["idle_cost"] == pytest.approx(20.0)
    for key in ("by-account", "by-region", "by-gpu_model"):
        assert f'id="{key}"' in html


def test_trend_without_a_previous_month_is_a_dash(recorded, tmp_path):
    db, settings = recorded
    _, html, doc = _write(db, tmp_path / "out", "2026-09", settings=settings)
    assert doc["previous_month"] == "2026-08"
    assert all(r["previous_month"] is None and r["change"] is None for r in doc["tables"]["trend"])
    section = html[html.index('id="trend"'):html.index('id="budgets"')]
    assert len(re.findall(r"<td[^>]*>–</td>", section)) == 6  # previous and change of each figure


def test_budget_forecast_of_a_month_in_progress(recorded):
    """November up to NOW with no billing yet: actual is the estimate from evaluated time, the forecast adds
    the running instance's $1/h for the hours left in the month."""
    db, settings = recorded
    store = Store(f"sqlite:///{db}")
    try:
        a = monthly_audit(store, "2026-11", NOW, settings)
    finally:
        store.close()
    b = a.budgets.set_index("budget")
    spent = (NOW - datetime(2026, 11, 1, tzinfo=timezone.utc)).total_seconds() / 3600
    left = (datetime(2026, 12, 1, tzinfo=timezone.utc) - NOW).total_seconds() / 3600
    assert b.loc["fleet", "basis"].startswith("estimate")
    assert b.loc["fleet", "actual"] == pytest.approx(spent)
    assert b.loc["fleet", "forecast"] == pytest.approx(spent + left)
    assert b.loc["fleet", "status"] == "within budget" and b.loc["ml", "status"] == "forecast over budget"


# --------------------------------------------------------------------------- owner, account, region as seen


def _demo_owners() -> dict[str, str]:
    """The owner tag of each demo instance, by id, as the demo's fleet carries it (i-demo0001 ... in trace order;
    one has none)."""
    return {f"i-demo{n + 1:04d}": tags.get("owner", "") for n, (_, tags) in enumerate(FLEET_SHAPES)}


def test_the_owner_account_and_region_are_what_the_service_saw(churn, churn_page):
    """The pipeline recorded each listed instance's labels every tick; with no billing row, the report's owner,
    account and region columns are those labels, not "no owner tag" / "unknown"."""
    db, _ = churn
    html, doc = churn_page
    con = sqlite3.connect(db)
    stored = {i: (o, a, r) for i, o, a, r in con.execute("select instance_id, owner, account, region from instance_labels")}
    seen = con.execute("select min(first_seen) < max(last_seen) from instance_labels").fetchone()[0]
    con.close()
    owners = _demo_owners()
    assert seen  # upserted tick after tick
    assert {i: o for i, (o, _, _) in stored.items()} == {i: owners[i] for i in stored}
    rows = doc["tables"]["instances"]
    assert rows and all(r["owner"] == (owners[r["instance_id"]] or "no owner tag") for r in rows)
    assert "no owner tag" in {r["owner"] for r in rows} and len({r["owner"] for r in rows}) > 3
    assert {(r["account"], r["region"]) for r in rows} == {("111122223333", "us-east-1")}
    assert {r["account"] for r in doc["tables"]["accounts"]} == {"111122223333"}
    section = html[html.index('id="instances"'):]
    section = section[:section.index("<h2", 1)]
    # The first cell names the instance (its Name tag) beside its id (issue 26).
    shown = re.findall(r"<tr><td[^>]*><strong>demo-\d+</strong> <span class=\"iid\">(i-demo\d+)</span></td>"
                       r"<td[^>]*>[^<]*</td><td[^>]*>([^<]*)</td>", section)
    assert shown and all(o == (owners[i] or "no owner tag") for i, o in shown)


def test_a_billing_row_wins_and_a_hostile_owner_tag_is_escaped(churn, tmp_path):
    """An owner tag is whatever a person typed: the page escapes it, the CSV will not run it, the JSON keeps it
    (clipped to the column). Billing's account and region win over the inventory's where billing has a row."""
    import shutil

    from gpufinops.model import GpuInstance

    db = tmp_path / "hostile.db"
    shutil.copy(churn[0], db)
    store = Store(f"sqlite:///{db}")
    at = datetime(2022, 9, 1, 3, tzinfo=timezone.utc)
    hostile = '<img src=x onerror=alert(3)>'
    store.record_instances([
        GpuInstance("i-demo0001", "g5.xlarge", "us-east-1", "running", at, tags={"owner": hostile}),
        GpuInstance("i-demo0003", "g5.xlarge", "us-east-1", "running", at, tags={"owner": '=HYPERLINK("http://x")'}),
    ], at)
    day = pd.DataFrame([{"date": date(2022, 9, 1), "provider": "aws", "account": "999988887777", "region": "eu-west-1",
                         "resource_id": "i-demo0002", "instance_type": "g6e.xlarge", "pricing_model": "on-demand",
                         "team": "genai", "project": "", "owner": "", "tags": "{}", "cost": 10.0, "currency": "USD",
                         "usage_hours": 5.0, "source": "cur"}])
    save_costs(store, day, "cur", date(2022, 9, 1), date(2022, 9, 2), at)
    store.close()
    paths, html, doc = _write(db, tmp_path / "out", DEMO_MONTH)
    rows = {r["instance_id"]: r for r in doc["tables"]["instances"]}
    assert rows["i-demo0001"]["owner"] == hostile  # the JSON keeps the value as it is
    assert hostile not in html and "&lt;img src=x onerror=alert(3)&gt;" in html
    assert (rows["i-demo0002"]["account"], rows["i-demo0002"]["region"]) == ("999988887777", "eu-west-1")
    assert rows["i-demo0002"]["owner"] == _demo_owners()["i-demo0002"]  # billing has no owner tag: the one seen
    assert (rows["i-demo0004"]["account"], rows["i-demo0004"]["region"]) == ("111122223333", "us-east-1")
    with next(p for p in paths if p.name.endswith("-instances.csv")).open() as fh:
        cells = {r["instance_id"]: r["owner"] for r in csv.DictReader(fh)}
    assert cells["i-demo0003"] == "'=HYPERLINK(\"http://x\")"


# --------------------------------------------------------------------------- why underused (issue 25)


def _record_underused(store, start, hours, plan, every_s=3600):
    """Instances evaluated hourly for `hours` from start; plan: instance -> (team, $/h, [(verdict, code, n)...])
    taken in order, the last one repeated."""
    decisions, teams, types = [], {}, {}
    for iid, (team, rate, steps) in plan.items():
        teams[iid], types[iid] = team, "g5.xlarge"
        codes = [(v, c) for v, c, n in steps for _ in range(n)]
        for k in range(hours):
            v, c = codes[min(k, len(codes) - 1)]
            decisions.append(Decision(iid, "r", v, c, "why", start + timedelta(seconds=k * every_s),
                                      activity_mean=30.0 if v != Verdict.IDLE else 0.0, hourly_cost=rate))
    store.record_decisions("run", decisions, dry_run=False, teams=teams, types=types, max_gap_s=2 * every_s)


def test_why_underused_breaks_underutilized_cost_down_by_cause_and_team_in_words(tmp_path):
    utc, U = timezone.utc, Verdict.UNDERUTILIZED
    store = Store(f"sqlite:///{tmp_path / 'u.db'}")
    # October: profiling causes (few SMs busy, tensor cores unused) beside activity-only ones, two teams.
    _record_underused(store, datetime(2026, 10, 1, tzinfo=utc), 100, {
        "i-vision": ("vision", 2.0, [(U, ReasonCode.FEW_SMS_BUSY, 60), (U, ReasonCode.BURSTY_LOW, 40)]),
        "i-nlp": ("nlp", 1.0, [(U, ReasonCode.TENSOR_IDLE, 30), (Verdict.ACTIVE, ReasonCode.BUSY, 70)]),
        "i-etl": ("nlp", 0.5, [(U, ReasonCode.BURSTY_LOW, 100)]),
    })
    # November: activity-only causes: nothing proves the profiling counters were read.
    _record_underused(store, datetime(2026, 11, 1, tzinfo=utc), 48, {
        "i-etl": ("nlp", 0.5, [(U, ReasonCode.LOW_STEADY, 48)]),
    })
    store.close()
    _, html, doc = _write(tmp_path / "u.db", tmp_path / "oct", "2026-10")
    causes, teams, h = doc["tables"]["underused_causes"], doc["tables"]["underused_by_team"], doc["headline"]
    # Plain sums of the recorded hours x $/h (one hour per tick, the last one's time counted up to a period).
    assert [(c["code"], c["cause"], c["profiling"], c["instances"], c["hours"], c["cost"]) for c in causes] == [
        ("bursty_low", "bursty, low average", False, 2, 140.0, 130.0),
        ("few_sms_busy", words("few_sms_busy"), True, 1, 60.0, 120.0),
        ("tensor_idle", words("tensor_idle"), True, 1, 30.0, 30.0),
    ]
    assert sum(c["cost"] for c in causes) == pytest.approx(h["underutilized_cost"])
    assert sum(c["share"] for c in causes) == pytest.approx(1.0)
    assert h["profiling_causes_cost"] == pytest.approx(150.0)
    assert [(t["team"], t["code"], t["cost"], round(t["team_share"], 4)) for t in teams] == [
        ("vision", "few_sms_busy", 120.0, 0.6), ("vision", "bursty_low", 80.0, 0.4),
        ("nlp", "bursty_low", 50.0, 0.625), ("nlp", "tensor_idle", 30.0, 0.375),
    ]
    section = html[html.index('id="why-underused"'):html.index('id="stops"')]
    assert "kernels keep few SMs busy (small batches or kernels) (profiling counters)" in section
    assert "tensor cores unused (FP32 math)" in section and "few_sms_busy" not in section
    assert "$120.00" in section and 'id="no-profiling"' not in section
    assert 'href="#why-underused"' in html
    csv_path = tmp_path / "oct" / "gpu-audit-2026-10-underused_causes.csv"
    assert csv_path.read_text().splitlines()[0] == "code,cause,profiling,instances,hours,cost_usd,share,currency"

    _, html, doc = _write(tmp_path / "u.db", tmp_path / "nov", "2026-11")
    assert [c["code"] for c in doc["tables"]["underused_causes"]] == ["low_steady"]
    assert doc["headline"]["profiling_causes_cost"] == 0.0
    assert 'id="no-profiling">No profiling data behind these causes this month' in html
