"""The scheduler lease on a real database (SQLite file and PostgreSQL), on an injected clock; and the
schema created by six processes at once on one fresh database."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.act.lease import LeaseLost, SchedulerLease, read_lease
from gpufinops.store.store import Store

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lease.db'}"
    return request.getfixturevalue("fresh_postgres_db")


def two_processes(db_url, clock, ttl_s=90):
    """Two leases on one database, each with its own Store, as two `serve` processes would have."""
    return (SchedulerLease(Store(db_url), "host-a:1:aaa", ttl_s, clock),
            SchedulerLease(Store(db_url), "host-b:2:bbb", ttl_s, clock))


def test_one_holder_renews_and_the_other_waits(db_url):
    clock = Clock(T0)
    a, b = two_processes(db_url, clock)
    assert a.try_acquire() and a.token == 1
    assert not b.try_acquire() and b.token is None
    a.check()  # held: no exception
    with pytest.raises(LeaseLost):
        b.check()
    clock.advance(60)
    assert a.try_acquire() and a.token == 1  # renewal keeps the token
    assert a.renew()
    clock.advance(80)  # 140 s after the start, 80 s after the last renewal: still held
    assert not b.try_acquire()
    row = read_lease(a.store)
    assert (row.holder, row.token, row.acquired_at, row.expires_at) == ("host-a:1:aaa", 1, T0,
                                                                         T0 + timedelta(seconds=150))


def test_expired_lease_is_taken_over_with_the_next_token_and_the_old_leader_is_fenced(db_url):
    clock = Clock(T0)
    a, b = two_processes(db_url, clock)
    assert a.try_acquire()
    clock.advance(91)  # a stalled past its TTL
    assert b.try_acquire() and b.token == 2
    with pytest.raises(LeaseLost, match="superseded: now held by host-b:2:bbb"):
        a.check()
    assert not a.renew() and not a.held  # renew never takes a lease it does not hold
    assert not a.try_acquire()
    b.check()
    assert read_lease(b.store).token == 2


def test_check_raises_once_the_lease_expired_even_before_a_takeover(db_url):
    clock = Clock(T0)
    a, _ = two_processes(db_url, clock, ttl_s=10)
    assert a.try_acquire()
    clock.advance(10)
    with pytest.raises(LeaseLost, match="expired"):
        a.check()
    assert a.try_acquire() and a.token == 2  # a gap in leadership is a new term, even for the same holder


def test_release_lets_the_standby_take_over_at_once(db_url):
    clock = Clock(T0)
    a, b = two_processes(db_url, clock)
    assert a.try_acquire()
    a.release()
    assert not a.held
    with pytest.raises(LeaseLost):
        a.check()
    assert b.try_acquire() and b.token == 2


def test_only_one_of_many_concurrent_takers_wins(db_url):
    clock = Clock(T0)
    contenders = [SchedulerLease(Store(db_url), f"h:{n}:x", 90, clock) for n in range(4)]
    import threading

    results = {}
    barrier = threading.Barrier(len(contenders))

    def take(lease):
        barrier.wait()
        results[lease.holder_id] = lease.try_acquire()

    threads = [threading.Thread(target=take, args=(c,)) for c in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results.values()) == 1
    clock.advance(91)
    threads = [threading.Thread(target=take, args=(c,)) for c in contenders]
    barrier.reset()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results.values()) == 1
    assert read_lease(contenders[0].store).token == 2


SCHEMA_STARTER = """
import sys, time
from gpufinops.store.store import Store
start = float(sys.argv[2])
while time.time() < start:  # all six start creating the schema at the same instant
    pass
Store(sys.argv[1]).close()
"""


def test_six_processes_create_the_schema_on_one_fresh_database_at_once(db_url):
    start = time.time() + 2.0  # after the six interpreters have imported gpufinops
    procs = [subprocess.Popen([sys.executable, "-c", SCHEMA_STARTER, db_url, str(start)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(6)]
    outs = [(p.wait(timeout=60), p.stdout.read()) for p in procs]
    assert [rc for rc, _ in outs] == [0] * 6, "\n".join(out for _, out in outs)
    from sqlalchemy import inspect

    store = Store(db_url)
    assert {"decisions", "leases", "notifications"} <= set(inspect(store.engine).get_table_names())


def test_lease_ttl_is_bounded_and_the_error_names_the_key(tmp_path):
    from gpufinops.config import ConfigError, load_settings

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text("lease:\n  ttl_s: 1\n")
    with pytest.raises(ConfigError, match=r"gpufinops.yaml:2: key 'lease.ttl_s'"):
        load_settings(cfg)
    assert load_settings().lease.ttl_s == 90
