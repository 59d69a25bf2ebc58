"""The demo runs the real pipeline over the bundled real trace: the shipped default beside the common rule,
counted as the backtest counts, and its summary matches its audit trail."""

import io
import json
import re
import sqlite3
from datetime import datetime, timezone

import pytest

from gpufinops.cli import main
from gpufinops.demo.run import DemoConsole, load_demo_trace, run_demo
from gpufinops.notify.messages import metrics_unavailable
from gpufinops.model import Decision, GpuInstance, ReasonCode, Verdict, format_money
from gpufinops.demo.sim import SimClock
from gpufinops.store.store import Store


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The whole demo once (both rules over the whole trace), shared by the tests below."""
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    out = io.StringIO()
    result = run_demo(out=out, db_path=str(db))
    return result, out.getvalue(), db


def test_bundled_trace_loads():
    trace = load_demo_trace()
    assert trace["instance_id"].nunique() == 12
    assert trace["util"].between(0, 100).all() or trace["util"].isna().any()
    assert (trace["mem_mib"] > 0).any()


def test_demo_says_the_ec2_is_simulated_and_gives_both_dates(demo):
    _, text, _ = demo
    head = text.splitlines()[:3]
    assert re.search(r"2022-09-11 \d\d:\d\d UTC -> 2022-09-12 00:00 UTC", head[0])
    assert "simulated EC2: nothing real is touched" in head[1] and "act.dry_run: true" in head[1]
    assert "dry-run: False" not in text


def test_default_does_well_and_the_common_rule_badly_side_by_side(demo):
    result, text, _ = demo
    d, c = result, result.common
    assert c is not None and d.stops > 0
    assert d.false_stop_rate <= 0.1 < 0.5 < c.false_stop_rate  # measured: 0% against about 90%
    assert d.score > c.score  # once a false stop costs anything, the common rule loses
    table = text.split("the shipped default beside the common rule")[1]
    assert "gpu-util-below-10pct-2h" in table and "gpu-util-below-40pct-10m" in table
    stops_row = next(line for line in table.splitlines() if line.strip().startswith("stops"))
    assert stops_row.split()[1:] == [str(d.stops), str(c.stops)]
    # Money as everywhere else: the sign before the $ ("-$1.02"), never "$-1.02".
    dollars = next(line for line in table.splitlines() if line.strip().startswith("net dollars saved"))
    assert "$-" not in dollars and dollars.split()[-2:] == [format_money(d.net_dollars), format_money(c.net_dollars)]
    # The backtest of the same trace is printed with the same definitions, and says why its counts differ.
    backtest = text.split("`gpufinops backtest` on the same trace")[1]
    assert "gpu-util-below-10pct-2h" in backtest and "gpu-util-below-40pct-10m" in backtest
    assert "knows no tags" in backtest


def test_demo_summary_matches_its_database(demo):
    result, _, db = demo
    s = result
    con = sqlite3.connect(db)
    stops = con.execute("select count(*) from actions where kind='stop' and status='done' and dry_run=0").fetchone()[0]
    assert s.stops == stops > 0
    # the protected instance is never stopped
    protected = con.execute("select count(*) from actions where instance_id='i-demo0005' and kind='stop'").fetchone()[0]
    assert protected == 0
    assert s.gpu_hours_stopped > 0 and s.dollars_stopped > 0
    assert s.false_stops <= s.restarts <= s.stops
    assert s.restart_gpu_hours == pytest.approx(s.restarts * 10 / 60)  # one GPU each, 10 min per restart


def test_console_names_the_instances_of_a_metrics_alert(tmp_path):
    now = datetime(2022, 9, 11, 2, 12, tzinfo=timezone.utc)
    printed = []
    console = DemoConsole(Store(f"sqlite:///{tmp_path / 'n.db'}"), SimClock(now), printed.append)
    affected = [(GpuInstance(instance_id=f"i-demo000{n}", instance_type="g5.xlarge", region="us-east-1",
                             state="running", launch_time=now),
                 Decision(f"i-demo000{n}", "r", Verdict.UNKNOWN, ReasonCode.LOW_COVERAGE, "few samples (51% < 80%)",
                          now)) for n in (1, 2)]
    assert console.send(metrics_unavailable(affected, episode_start=now, channel="#gpu-finops"))
    (message,) = printed
    assert "No usable GPU metrics for 2 instances" in message
    assert "i-demo0001" in message and "i-demo0002" in message and "&lt;" not in message


def test_quick_demo_runs_the_real_pipeline_and_shows_a_stop_and_its_messages(capsys):
    """`gpufinops demo --quick` (the CI step after installing the wheel): the first hours of the trace through
    the same pipeline, both rules side by side, with a warning, a stop and its Slack messages printed. No
    timing is asserted here (BENCHMARKS.md, "Demo": a few CPU-seconds)."""
    assert main(["demo", "--quick"]) == 0
    text = capsys.readouterr().out
    assert "(3.0 h simulated)" in text.splitlines()[0]
    assert "will be stopped at" in text and "Stopped idle GPU instance" in text
    stops_row = next(line for line in text.splitlines() if line.strip().startswith("stops"))
    default_stops, common_stops = (int(v) for v in stops_row.split()[1:])
    assert 1 <= default_stops < common_stops
    assert "A quick look: 3 h of the trace's" in text and "`gpufinops backtest` on the same trace" not in text


def test_demo_cli(capsys):
    assert main(["demo", "--hours", "1", "--quiet", "--no-compare"]) == 0
    assert "Summary" in capsys.readouterr().out


def test_idle_cost_by_instance_from_the_demo_audit_trail(demo, tmp_path, capsys):
    _, _, db = demo
    cfg = tmp_path / "g.yaml"
    cfg.write_text(f"database_url: sqlite:///{db}\nschedule: {{evaluate_every_s: 120}}\n")
    assert main(["--config", str(cfg), "costs", "--month", "2022-09", "--idle", "--by", "instance",
                 "-o", "json"]) == 0
    rows = {r["instance"]: r for r in json.loads(capsys.readouterr().out)}
    # An instance costs idle money exactly when, at some evaluation, every rule that judges it judged it IDLE:
    # when an IDLE verdict episode of each of its rules covers one tick (the raw rows hold only changes and
    # heartbeats; an episode runs from a verdict's first tick to its last, its rules judge it at every tick).
    con = sqlite3.connect(db)
    rules = dict(con.execute("select instance_id, count(distinct rule) from verdict_episodes group by instance_id"))
    idle = con.execute("select instance_id, rule, started_at, last_seen_at from verdict_episodes "
                       "where verdict = 'IDLE'").fetchall()
    idle_ticks = {i for i, _, start, _ in idle
                  if len({r for j, r, s, e in idle if j == i and s <= start <= e}) == rules[i]}
    assert 2 in rules.values() and idle_ticks
    assert {i for i, r in rows.items() if r["idle_cost"] > 0} == idle_ticks
    for r in rows.values():
        parts = r["active_cost"] + r["underutilized_cost"] + r["unknown_cost"] + r["idle_cost"]
        assert abs(parts - r["total_cost"]) < 1e-9


def test_audit_cli_explains_why_an_instance_was_stopped(demo, capsys):
    _, _, db = demo
    con = sqlite3.connect(db)
    stopped = con.execute("select instance_id, count(*) from actions where kind='stop' group by instance_id "
                          "order by 2 desc limit 1").fetchone()
    assert main(["audit", "--db", str(db), "--instance", stopped[0], "--kind", "stop", "-o", "json",
                 "--limit", "0"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == stopped[1] and all(r["what"] == "stop" and r["reason"] for r in rows)
    assert main(["audit", "--db", str(db), "--instance", stopped[0], "--decisions", "--limit", "5"]) == 0
    header, rule, *out = capsys.readouterr().out.splitlines()
    assert header.split() == ["at", "instance_id", "what", "status", "rule", "reason"] and set(rule) <= {"-", " "}
    assert len(out) == 5 and all(stopped[0] in line for line in out)


def test_demo_prints_message_counts_and_the_flapping_instance_is_alerted_at_most_twice(demo):
    result, text, db = demo
    counts = result.message_counts
    # i-demo0007's coverage flaps around 80 % all day (8 alerts before the hysteresis): one episode now.
    assert counts.get(("i-demo0007", "metrics-unavailable"), 0) <= 2
    assert all(n <= 2 for (_, kind), n in counts.items() if kind == "metrics-unavailable")
    # Printed per instance and per kind, and the same as the database holds.
    head = next(line for line in text.splitlines() if line.split()[:1] == ["instance"])
    assert "metrics-unavailable" in head.split() and "warn" in head.split()
    row = next(line for line in text.splitlines() if line.strip().startswith("i-demo0007 "))
    assert int(row.split()[-1]) == sum(n for (i, _), n in counts.items() if i == "i-demo0007")
    con = sqlite3.connect(db)
    sent = con.execute("select count(*) from notifications where key like 'metrics-unavailable:%'").fetchone()[0]
    assert 1 <= sent <= 4 and f"messages sent       {result.messages};" in text
