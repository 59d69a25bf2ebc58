"""The database: SQLite file in WAL mode, survives restarts, one sender per notification key."""

import sqlite3
from datetime import datetime, timezone

from gpufinops.model import Action, Decision, ReasonCode, Verdict
from gpufinops.store import Store

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def test_sqlite_file_is_in_wal_mode(tmp_path):
    db = tmp_path / "g.db"
    Store(f"sqlite:///{db}").set_kv("x", "1")
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_decisions_survive_a_restart_with_their_reasons(tmp_path):
    url = f"sqlite:///{tmp_path / 'g.db'}"
    d = Decision("i-1", "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "all idle", NOW, Action.STOP, 600,
                 hourly_cost=1.5)
    Store(url).record_decisions("run1", [d], dry_run=True, teams={"i-1": "ml"})
    rows = Store(url).decision_rows()
    assert len(rows) == 1
    row = rows[0]
    assert (row["verdict"], row["reason"], row["team"], row["dry_run"]) == ("IDLE", "all idle", "ml", True)
    assert row["evaluated_at"] == NOW  # timezone-aware UTC back out


def test_only_one_claimant_per_notification_key(tmp_path):
    url = f"sqlite:///{tmp_path / 'g.db'}"
    a, b = Store(url), Store(url)  # two processes on one database
    assert a.claim_notification("k", "#c", "t", NOW) is True
    assert b.claim_notification("k", "#c", "t", NOW) is False
    assert b.notification_sent("k")  # pending counts as sent: at most once
    a.record_notification("k", "#c", "t", "failed", NOW, detail="HTTP 500")
    assert not b.notification_sent("k")
    assert b.claim_notification("k", "#c", "t", NOW) is True  # a failed send may be retried once
    assert a.claim_notification("k", "#c", "t", NOW) is False
