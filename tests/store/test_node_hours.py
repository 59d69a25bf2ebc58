"""The hourly Kubernetes GPU node rollup (k8s_node_hours, issue 28 item 5) on SQLite and PostgreSQL: each tick adds
the time since the tick before (at most two tick intervals) cut at the hours it crosses, its cost split as
places.kubernetes.costs.attribute splits it, in one statement batch; a replayed tick adds nothing; the latest tick's
pool and sharing win."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal

import pytest
from sqlalchemy import event

from gpufinops.places.kubernetes.cluster import snapshot_from
from gpufinops.run.node_hours import hour_chunks, node_hour_rows
from gpufinops.store.store import Store
from tests.kubestub import node_obj, pod_obj

UTC = timezone.utc
EVERY_S = 300.0
RATE = 32.7726  # USD/h of each p4d node


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'nodes.db'}"
    return request.getfixturevalue("fresh_postgres_db")


def snapshot(at: datetime, nodes: int = 2, pool: str = "train"):
    """`nodes` 8-GPU nodes; the first holds a 2-GPU pod, the others none."""
    objs = [node_obj(f"n{i}", f"i-{i:017x}", labels={"karpenter.sh/nodepool": pool}) for i in range(nodes)]
    return snapshot_from(at, objs, [pod_obj("ml", "p", "n0", gpus=2)], {}, [])


def record(store: Store, at: datetime, snap) -> int:
    costs = {n.name: RATE for n in snap.nodes}
    return store.record_node_hours(at, lambda start, s: node_hour_rows(snap, costs, start, s),
                                   interval_s=EVERY_S, max_gap_s=2 * EVERY_S)


def cents(seconds: float) -> int:
    return int((Decimal(str(RATE)) * Decimal(seconds) / 3600 * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def by_key(frame) -> dict:
    return {(r["hour"].to_pydatetime(), r["node"]): r for r in frame.to_dict("records")}


def test_ticks_add_their_time_cut_at_the_hour_and_capped_at_two_intervals(db_url):
    store = Store(db_url)
    h10, h11 = datetime(2026, 11, 3, 10, tzinfo=UTC), datetime(2026, 11, 3, 11, tzinfo=UTC)
    ticks = [h10 + timedelta(minutes=58), h11 + timedelta(minutes=2), h11 + timedelta(minutes=30)]
    try:
        for at in ticks:
            assert record(store, at, snapshot(at)) > 0
        # The 11:02 tick again (a replay): nothing is added.
        assert record(store, ticks[1], snapshot(ticks[1])) == 0
        rows = by_key(store.node_hours_frame(h10, h11 + timedelta(hours=1)))
    finally:
        store.close()
    # 10:58 stands for one interval (10:53-10:58), 11:02 for 10:58-11:02 (2 min in each hour), 11:30 for two
    # intervals at most (a 28-minute gap: the rest was not watched).
    spans = {h10: [300.0, 120.0], h11: [120.0, 600.0]}
    ticks_in = {h10: 1, h11: 2}
    for hour, parts in spans.items():
        for node in ("n0", "n1"):
            r = rows[(hour, node)]
            assert r["hours"] == pytest.approx(sum(parts) / 3600) and r["gpu_hours"] == pytest.approx(8 * r["hours"])
            assert r["node_cents"] == sum(cents(s) for s in parts)
            assert r["pods_cents"] + r["idle_cents"] == r["node_cents"]
            assert r["ticks"] == ticks_in[hour] and r["unpriced_hours"] == 0
            assert r["empty_ticks"] == (0 if node == "n0" else ticks_in[hour])
            assert r["empty_hours"] == (0 if node == "n0" else pytest.approx(r["hours"]))
        assert rows[(hour, "n1")]["pods_cents"] == 0  # no pod: all of it idle capacity
        assert 0 < rows[(hour, "n0")]["pods_cents"] < rows[(hour, "n0")]["idle_cents"]  # 2 of 8 GPUs held
    assert rows[(h11, "n0")]["last_seen"].to_pydatetime() == ticks[2]
    assert len(rows) == 4


def test_the_latest_ticks_pool_and_sharing_win_and_a_tick_is_one_statement(db_url):
    store = Store(db_url)
    at = datetime(2026, 11, 3, 10, 30, tzinfo=UTC)
    statements = []

    def seen(conn, cursor, statement, parameters, context, executemany):
        if "k8s_node_hours" in statement and statement.lstrip().upper().startswith("INSERT"):
            statements.append(executemany)

    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        record(store, at, snapshot(at, nodes=60))
        assert statements == [True]  # 60 nodes, one batched statement (issue 29.4)
        record(store, at + timedelta(minutes=5), snapshot(at, nodes=60, pool="train-v2"))
        assert statements == [True, True]
        frame = store.node_hours_frame(at, at + timedelta(hours=1))
    finally:
        store.close()
    assert len(frame) == 60 and set(frame["node_pool"]) == {"train-v2"} and set(frame["ticks"]) == {2}


def test_hour_chunks_cover_the_span_exactly():
    start = datetime(2026, 11, 3, 9, 50)
    chunks = hour_chunks(start, 2 * 3600.0)
    assert [h for h, _ in chunks] == [datetime(2026, 11, 3, h) for h in (9, 10, 11)]
    assert [round(x * 60, 6) for _, x in chunks] == [10, 60, 50]
    assert hour_chunks(start, 0) == []
