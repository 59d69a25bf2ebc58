"""What the service saw of each instance (Store.record_instances, written by the pipeline once per tick next to
the decisions): owner, team, account, region and type for the report. Labels are bookkeeping: a database error
writing them is reported like any database error, and never holds back acting or loses the tick's decisions."""

from __future__ import annotations

from sqlalchemy import text

from gpufinops.model import ActionKind
from tests.act.test_act import World


def test_the_tick_records_what_it_listed(tmp_path):
    w = World(tmp_path, n=2, **{"i-01": {"owner": "ana"}})
    first = w.clock.now
    w.tick()
    w.tick()
    labels = w.store.instance_labels()
    assert {i: (lab["owner"], lab["team"], lab["region"]) for i, lab in labels.items()} == {
        "i-00": ("", "ml", "us-east-1"), "i-01": ("ana", "ml", "us-east-1")}
    assert all(lab["first_seen"] == first < lab["last_seen"] for lab in labels.values())


def test_a_labels_error_never_holds_back_acting_or_the_decisions(tmp_path):
    w = World(tmp_path)
    with w.store.engine.begin() as conn:  # a real store error on that table only: it is gone
        conn.execute(text("DROP TABLE instance_labels"))
    r = w.tick()
    assert [(a.instance_id, a.kind) for a in r.actions] == [("i-00", ActionKind.MARK)]  # acted all the same
    assert len(w.store.decision_rows()) == 1  # the tick's decisions are recorded
    assert any(e.startswith("database: recording instance labels") for e in r.errors)
    assert r.sources["database"].startswith("recording instance labels")
    for _ in range(15):
        r = w.tick()
    assert [(a.instance_id, a.kind) for a in r.actions] == [("i-00", ActionKind.STOP)]  # the stop is not held back
    w.open_store()  # a restart rebuilds the missing table; the next tick fills it
    w.tick()
    assert set(w.store.instance_labels()) == {"i-00"}
