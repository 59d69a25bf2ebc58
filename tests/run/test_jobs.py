"""The service's other scheduled jobs: budget alerts and the weekly right-sizing digest."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.collect.billing import schema as _billing_tables  # noqa: F401 - costs table
from gpufinops.config import load_settings
from gpufinops.run.jobs import budget_check, recommend_digest, scheduled_jobs
from gpufinops.model import GpuInstance
from gpufinops.run.pipeline import Peers
from gpufinops.run.compose import live_usage
from gpufinops.demo.sim import ConsoleNotifier, SimCloud
from gpufinops.store.store import Store
from tests.promserver import Series, dcgm_labels

FOCUS = Path(__file__).resolve().parents[3] / "shared/data/billing/focus_1.0_sample_1000.csv"


def peers_for(tmp_path, instances, now):
    store = Store(f"sqlite:///{tmp_path / 'jobs.db'}")
    lines: list[str] = []
    return Peers(SimCloud(instances, lambda: now), None, store, ConsoleNotifier(store, lambda: now, lines.append)), lines


def test_jobs_enabled_by_settings():
    assert [j[0] for j in scheduled_jobs(load_settings(), None, None)] == ["recommend-digest", "daily-summary",
                                                                           "savings"]
    s = load_settings(billing={"source": "focus", "path": "x.csv"},
                      schedule={"recommend_digest_day": "", "monthly_report_dir": "/tmp/r", "daily_summary_hour": None,
                                "savings_every_s": 0})
    assert [(j[0], j[1]["trigger"]) for j in scheduled_jobs(s, None, None)] == [
        ("budgets", "interval"), ("monthly-report", "cron")]


def test_monthly_report_job_writes_last_month(tmp_path):
    from gpufinops.demo.run import run_demo
    from gpufinops.run.jobs import monthly_report

    db = tmp_path / "demo.db"
    run_demo(hours=1, db_path=str(db), quiet=True, out=__import__("io").StringIO())
    settings = load_settings(schedule={"monthly_report_dir": str(tmp_path / "out")})
    store = Store(f"sqlite:///{db}")
    now = datetime(2022, 10, 1, 6, tzinfo=timezone.utc)  # the demo trace is dated 2022-09
    paths = monthly_report(settings, Peers(None, None, store, None), now)
    html = [p for p in paths if p.suffix == ".html"]
    assert html and "2022-09" in html[0].name and "<img" in html[0].read_text()


@pytest.mark.skipif(not FOCUS.exists(), reason="shared FOCUS sample not present")
def test_budget_job_alerts_once_from_the_real_focus_sample(tmp_path):
    budgets = tmp_path / "budgets.yaml"
    # The sample's GPU (g5.4xlarge) cost in September 2024 is a few dollars: a $5 budget is crossed.
    budgets.write_text("budgets:\n  - name: gpu\n    scope: {kind: all}\n    amount: 5\n    thresholds: [50]\n"
                       "    kinds: [actual]\n")
    settings = load_settings(billing={"source": "focus", "path": str(FOCUS), "budgets_path": str(budgets)})
    now = datetime(2024, 9, 30, 12, tzinfo=timezone.utc)
    peers, lines = peers_for(tmp_path, [], now)
    statuses = budget_check(settings, peers, now)
    assert len(statuses) == 1 and statuses[0].spent > 2.5 and statuses[0].alerts_sent
    assert len(lines) == 1 and "gpu" in lines[0]
    budget_check(settings, peers, now)  # an hour later, same month: nothing new
    assert len(lines) == 1


def test_recommend_digest_from_a_real_prometheus(tmp_path, prometheus_factory):
    now = datetime(2026, 11, 23, 9, tzinfo=timezone.utc)
    step = 600
    ts = [now.timestamp() - k * step for k in range(int(15 * 86400 / step))][::-1]
    labels = dcgm_labels("ip-10-0-0-7", 0, instance_id="i-over", model="NVIDIA A100-SXM4-80GB")
    series = [Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, 10.0 + (i % 7)) for i, t in enumerate(ts)]),
              Series("DCGM_FI_DEV_FB_USED", labels, [(t, 12_000.0) for t in ts])]
    prom = prometheus_factory(series)
    # An A100 80GB host peaking at 12 GB and ~13% activity: the catalog decides what fits.
    inst = GpuInstance("i-over", "a2-ultragpu-1g", "us-central1", "running", now - timedelta(days=60),
                       provider="gcp", tags={"team": "search"})
    settings = load_settings(prometheus={"url": prom.url}, recommend={"scrape_interval_s": step})
    peers, lines = peers_for(tmp_path, [inst], now)
    peers.usage = live_usage(settings)  # the right-sizing reader the service's composition root builds
    recs = recommend_digest(settings, peers, now)
    assert any(r.instance_id == "i-over" and r.monthly_savings > 0 for r in recs)
    assert len(lines) == 1 and "GPU recommendations" in lines[0] and "1 with savings" in lines[0]
    assert "i-over" in peers.notifier.sent[0].text
    recommend_digest(settings, peers, now + timedelta(hours=1))  # same ISO week: no second digest
    assert len(lines) == 1
    # recommend.digest_channel and digest_top are read: the digest goes to that channel, with that many rows.
    settings = settings.model_copy(update={"recommend": settings.recommend.model_copy(
        update={"digest_channel": "#gpu-digest", "digest_top": 1})})
    recommend_digest(settings, peers, now + timedelta(hours=2))  # its own key: another channel
    assert len(lines) == 2 and lines[1].startswith("  [slack #gpu-digest] GPU recommendations")
    assert peers.notifier.sent[-1].channel == "#gpu-digest" and len(peers.notifier.sent[-1].lines) == 1


def test_daily_summary_counts_the_audit_log_and_is_sent_once_a_day(tmp_path):
    from tests.act.test_act import World

    from gpufinops.run.jobs import daily_summary

    w = World(tmp_path, n=3, **{"i-02": {"gpufinops:protect": "true"}})
    for _ in range(17):  # two marked, warned, stopped; the protected one never
        w.tick()
    now = w.clock.now
    msg = daily_summary(w.settings, Peers(w.cloud, w.metrics, w.store, w.notifier), now)
    # The job sends the "default" audience; routing (notify/routing.py) picks slack.default_channel for it.
    assert msg.channel == "" and msg.audience == ("default",) and msg.key == f"daily:{now:%Y-%m-%d}:default"
    assert w.notifier.sent[-1].key == msg.key and w.notifier.sent[-1].channel == w.settings.slack.default_channel
    assert "2 stopped (saving $2.01/h while they stay stopped)" in msg.text  # 2 x g5.xlarge at $1.006/h
    assert "2 warning(s) sent" in msg.text and "Marked for stop now:* none" in msg.text
    assert "Budget alerts sent:* none" in msg.text
    sent = len(w.notifier.sent)
    daily_summary(w.settings, Peers(w.cloud, w.metrics, w.store, w.notifier), now + timedelta(hours=1))
    assert len(w.notifier.sent) == sent  # the same day: not sent again


def test_the_month_net_saving_by_team_is_the_monthly_reports_count_on_metrics(tmp_path):
    """gpufinops_net_saving_month_to_date{team}: the real stops of this month, net, by the report's own count."""
    from tests.act.test_act import World

    from gpufinops.report.monthly import monthly_audit
    from gpufinops.run.fleet_metrics import FleetExposition
    from gpufinops.run.jobs import month_savings

    w = World(tmp_path, n=3, **{"i-02": {"gpufinops:protect": "true"}})
    for _ in range(17):  # two marked, warned, stopped
        w.tick()
    for _ in range(30):  # the service goes on judging the fleet; the two stay stopped
        w.tick()
    now = w.clock.now
    peers = Peers(w.cloud, w.metrics, w.store, w.notifier)
    by_team = month_savings(w.settings, peers, now)
    stops = monthly_audit(w.store, f"{now:%Y-%m}", now, w.settings).stops
    assert len(stops) == 2 and not stops["dry_run"].any()
    expected = sum((now - at.to_pydatetime()).total_seconds() / 3600 * 1.006 for at in stops["at"])
    [(team, (usd, n))] = by_team.items()
    assert n == 2 and usd == pytest.approx(expected, rel=0.02) and usd > 0.5
    exposition = FleetExposition()
    assert b"gpufinops_net_saving" not in exposition.text()  # nothing said before the job has counted
    exposition.note_savings(by_team, now)
    text = exposition.text().decode()
    label = team or "none"
    assert f'gpufinops_net_saving_month_to_date{{team="{label}"}} {usd}' in text
    assert f'gpufinops_net_saving_stops_month_to_date{{team="{label}"}} 2.0' in text
