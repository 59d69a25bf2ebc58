"""The demo runs the real pipeline over the bundled real trace and its summary matches its audit trail."""

import io
import sqlite3

from gpufinops.cli import main
from gpufinops.demo import load_demo_trace, run_demo


def test_bundled_trace_loads():
    trace = load_demo_trace()
    assert trace["instance_id"].nunique() == 12
    assert trace["util"].between(0, 100).all() or trace["util"].isna().any()
    assert (trace["mem_mib"] > 0).any()


def test_demo_summary_matches_its_database(tmp_path):
    db = tmp_path / "demo.db"
    out = io.StringIO()
    s = run_demo(out=out, hours=4, db_path=str(db), quiet=True)
    text = out.getvalue()
    assert "Summary" in text and "dollars saved" in text
    assert "gpu-util-below-40pct-10m" in text.split("Backtest of the same history")[1] and "-rule sweep:" in text
    con = sqlite3.connect(db)
    stops = con.execute("select count(*) from actions where kind='stop' and status='done' and dry_run=0").fetchone()[0]
    assert s.stops == stops > 0
    # the protected instance is never stopped
    protected = con.execute("select count(*) from actions where instance_id='i-demo0005' and kind='stop'").fetchone()[0]
    assert protected == 0
    assert s.gpu_hours_saved > 0 and s.dollars_saved > 0
    assert s.false_stops <= s.restarts <= s.stops


def test_demo_cli(capsys):
    assert main(["demo", "--hours", "1", "--quiet"]) == 0
    assert "Summary" in capsys.readouterr().out


def test_idle_cost_by_instance_from_the_demo_audit_trail(tmp_path, capsys):
    import json

    db = tmp_path / "demo.db"
    run_demo(out=io.StringIO(), hours=3, db_path=str(db), quiet=True)
    cfg = tmp_path / "g.yaml"
    cfg.write_text(f"database_url: sqlite:///{db}\nschedule: {{evaluate_every_s: 120}}\n")
    assert main(["--config", str(cfg), "costs", "--month", "2022-09", "--idle", "--by", "instance",
                 "--format", "json"]) == 0
    rows = {r["instance"]: r for r in json.loads(capsys.readouterr().out)}
    # An instance costs idle money exactly when, at some evaluation, every rule judged it IDLE.
    con = sqlite3.connect(db)
    idle_ticks = {r[0] for r in con.execute(
        "select instance_id from decisions group by instance_id, evaluated_at having min(verdict = 'IDLE') = 1")}
    assert idle_ticks and {i for i, r in rows.items() if r["idle_cost"] > 0} == idle_ticks
    for r in rows.values():
        parts = r["active_cost"] + r["underutilized_cost"] + r["unknown_cost"] + r["idle_cost"]
        assert abs(parts - r["total_cost"]) < 1e-9


def test_audit_cli_explains_why_an_instance_was_stopped(tmp_path, capsys):
    import json

    db = tmp_path / "demo.db"
    run_demo(out=io.StringIO(), hours=3, db_path=str(db), quiet=True)
    con = sqlite3.connect(db)
    stopped = con.execute("select instance_id, count(*) from actions where kind='stop' group by instance_id "
                          "order by 2 desc limit 1").fetchone()
    assert main(["audit", "--db", str(db), "--instance", stopped[0], "--kind", "stop", "--format", "json",
                 "--limit", "0"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == stopped[1] and all(r["what"] == "stop" and r["reason"] for r in rows)
    assert main(["audit", "--db", str(db), "--instance", stopped[0], "--decisions", "--limit", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 and all(stopped[0] in line for line in out)
