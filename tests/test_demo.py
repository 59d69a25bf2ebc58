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
