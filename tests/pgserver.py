"""pytest plugin: a throwaway PostgreSQL server on 127.0.0.1, for the "Postgres by URL" store.

Uses Debian's PostgreSQL binaries (initdb, pg_ctl). initdb refuses to run as root, so as
root the cluster is created and run as the `postgres` system user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.promserver import free_port


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _as_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


@pytest.fixture(scope="session")
def postgres_url():
    bindir = _bin_dir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg not installed")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user for initdb")
    root = Path(tempfile.mkdtemp(prefix="gpufinops-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    port = free_port()
    subprocess.run(_as_user([str(bindir / "initdb"), "-D", str(data), "-U", "gpufinops", "--auth=trust",
                             "-E", "UTF8", "--no-locale"]), check=True, capture_output=True)
    log = root / "pg.log"
    subprocess.run(_as_user([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "30", "start",
                             "-o", f"-h 127.0.0.1 -p {port} -k {root}"]), check=True, capture_output=True)
    url = f"postgresql+psycopg://gpufinops@127.0.0.1:{port}/postgres"
    try:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(f"host=127.0.0.1 port={port} user=gpufinops dbname=postgres").close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        subprocess.run(_as_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fresh_postgres_db(postgres_url):
    """A new empty database on the shared server, per test."""
    import psycopg

    name = f"t{os.getpid()}_{time.monotonic_ns()}"
    base = postgres_url.rsplit("/", 1)[0].replace("postgresql+psycopg://", "")
    user_host = base
    user, hostport = user_host.split("@")
    host, port = hostport.split(":")
    with psycopg.connect(f"host={host} port={port} user={user} dbname=postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://{user}@{host}:{port}/{name}"
