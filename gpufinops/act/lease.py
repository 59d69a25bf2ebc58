"""One active scheduler: a leader lease in the database, shared by every `serve` process on it.

Of several processes on one database, only the holder of the unexpired lease acts (marks, stops,
scheduled jobs); the others judge read-only and take over when the lease expires. Each takeover adds
one to the lease's `token` (a fencing token), so a leader that stalled past its TTL and came back
sees that its token is superseded: `check()` raises `LeaseLost` and the act stage changes nothing.

Every change is one conditional UPDATE (or the first INSERT), atomic on SQLite and PostgreSQL alike:
"take it if it is expired", "renew it if it is still mine and unexpired". Expiry compares the
processes' clocks (UTC), so their clocks must agree to well within the TTL (NTP does).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from ..model import utcnow
from ..store.store import Store
from ..store.schema import aware_utc, leases, naive_utc

log = logging.getLogger("gpufinops.lease")

SCHEDULER_LEASE = "scheduler"


class LeaseLost(RuntimeError):
    """This process does not hold the scheduler lease (any more): it must not change anything."""


def default_holder_id() -> str:
    """hostname:pid:random: unique per process, and says in the table and the logs who holds it."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True)
class LeaseRow:
    name: str
    holder: str
    token: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime


def read_lease(store: Store, name: str = SCHEDULER_LEASE) -> LeaseRow | None:
    with store.engine.connect() as conn:
        r = conn.execute(select(leases).where(leases.c.name == name)).mappings().first()
    if r is None:
        return None
    return LeaseRow(r["name"], r["holder"], int(r["token"]), aware_utc(r["acquired_at"]),
                    aware_utc(r["renewed_at"]), aware_utc(r["expires_at"]))


class SchedulerLease:
    """The lease as seen by one process. Thread-safe: the tick, the background renewal and the act
    stage's `check()` may call it at once."""

    def __init__(self, store: Store, holder_id: str | None = None, ttl_s: float = 90,
                 clock: Callable[[], datetime] = utcnow, name: str = SCHEDULER_LEASE):
        self.store = store
        self.holder_id = holder_id or default_holder_id()
        self.ttl = timedelta(seconds=ttl_s)
        self.clock = clock
        self.name = name
        self._token: int | None = None  # the token we hold; None while we are not the leader
        self._lock = threading.Lock()

    @property
    def token(self) -> int | None:
        """Our fencing token while we hold the lease, else None."""
        return self._token

    @property
    def held(self) -> bool:
        """Whether we held the lease at the last acquire/renew (check() asks the database)."""
        return self._token is not None

    def try_acquire(self) -> bool:
        """Renew the lease when it is ours, take it when it is free or expired; True when we hold it.
        A database error propagates (the caller is then not the leader: `held` turns False)."""
        with self._lock:
            try:
                self._token = self._acquire_or_renew()
            except BaseException:
                self._token = None
                raise
            return self._token is not None

    def renew(self) -> bool:
        """Extend our unexpired lease by the TTL; False (and no longer held) when it expired or was
        taken over. Never takes a lease we do not hold."""
        with self._lock:
            if self._token is None:
                return False
            try:
                renewed = self._renew(self._token)
            except BaseException:
                self._token = None
                raise
            if not renewed:
                self._token = None
            return renewed

    def release(self) -> None:
        """Clean shutdown: expire our lease now so a standby takes over at its next tick, not after the TTL."""
        with self._lock:
            if self._token is None:
                return
            now = naive_utc(self.clock())
            with self.store.engine.begin() as conn:
                conn.execute(update(leases).where(*self._mine(self._token)).values(expires_at=now, renewed_at=now))
            self._token = None

    def check(self) -> None:
        """Raise LeaseLost unless this process still holds an unexpired lease with its token. Asks the
        database every time: a leader that stalled past the TTL and was replaced finds out here."""
        token = self._token
        if token is None:
            raise LeaseLost(f"{self.holder_id} is not the leader")
        try:
            row = read_lease(self.store, self.name)
        except Exception as exc:  # cannot prove leadership: act as if lost
            raise LeaseLost(f"cannot read the lease: {exc}") from exc
        now = self.clock()
        if row is None or row.holder != self.holder_id or row.token != token:
            holder = f"{row.holder} (token {row.token})" if row is not None else "nobody"
            raise LeaseLost(f"lease token {token} superseded: now held by {holder}")
        if row.expires_at <= now:
            raise LeaseLost(f"lease token {token} expired at {row.expires_at.isoformat()}")

    # ------------------------------------------------------------------ the conditional statements
    def _mine(self, token: int):
        return (leases.c.name == self.name, leases.c.holder == self.holder_id, leases.c.token == token)

    def _renew(self, token: int) -> bool:
        now = self.clock()
        with self.store.engine.begin() as conn:
            res = conn.execute(
                update(leases).where(*self._mine(token), leases.c.expires_at > naive_utc(now))
                .values(renewed_at=naive_utc(now), expires_at=naive_utc(now + self.ttl)))
        return res.rowcount == 1

    def _acquire_or_renew(self) -> int | None:
        if self._token is not None and self._renew(self._token):
            return self._token
        now = self.clock()
        values = dict(holder=self.holder_id, acquired_at=naive_utc(now), renewed_at=naive_utc(now),
                      expires_at=naive_utc(now + self.ttl))
        with self.store.engine.begin() as conn:
            # Takeover of an expired lease, ours included (a gap in leadership is a new term: token + 1).
            # Concurrent takers are serialised by the row lock (PostgreSQL re-checks the WHERE on the
            # new row) or the write lock (SQLite): exactly one sees it expired.
            res = conn.execute(
                update(leases).where(leases.c.name == self.name, leases.c.expires_at <= naive_utc(now))
                .values(token=leases.c.token + 1, **values))
            if res.rowcount == 1:
                return int(conn.execute(select(leases.c.token).where(
                    leases.c.name == self.name, leases.c.holder == self.holder_id)).scalar_one())
        if read_lease(self.store, self.name) is not None:
            return None  # held by someone else, unexpired
        try:
            with self.store.engine.begin() as conn:
                conn.execute(insert(leases).values(name=self.name, token=1, **values))
            return 1
        except IntegrityError:  # another process inserted the first row just now
            return None
