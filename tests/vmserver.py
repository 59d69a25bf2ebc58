"""A real VictoriaMetrics (single node) for tests and benchmarks, filled through its import API.

The counterpart of tests/promserver.py: the same `Series` are sent as Prometheus text with millisecond
timestamps to `/api/v1/import/prometheus` of a `victoria-metrics` process on a free 127.0.0.1 port with
a throwaway storage directory, then `/internal/force_flush` makes them searchable at once, and the
fixture waits until every series answers. Queries then go to its Prometheus-compatible
`/api/v1/query` exactly as the collector sends them in production.

Flags that matter (VictoriaMetrics 1.79, Debian's package):
- `-search.latencyOffset=0s`: by default VictoriaMetrics hides the last 30 s before the real now from
  queries (samples may still be arriving). The tests place samples up to the real now and count them
  exactly; in production the default only makes the newest window a little shorter (fewer samples,
  never invented ones: coverage drops, nothing looks idle that was not).
- `-search.disableCache`: backfilled data lands in the past, behind results the cache may hold.
- `-retentionPeriod=100y`: 30-day-old backfills must stay.
- VictoriaMetrics drops NaN samples on ingestion and query (Prometheus keeps them): a NaN is not a
  sample on either engine, which is what the collector wants.

Usable as a library (bench/) and as a pytest plugin (`vm_factory`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pytest

from tests.promserver import PromServer, Series, server_factory, start_on_free_port

VM_BIN = os.environ.get("GPUFINOPS_TEST_VICTORIA_METRICS", "/usr/bin/victoria-metrics")
_READY_TIMEOUT_S = 60.0
_IMPORT_CHUNK_BYTES = 8 << 20  # one POST per 8 MiB of text: bounded memory at 20k GPUs


class VictoriaMetricsUnavailable(RuntimeError):
    """victoria-metrics missing or the server would not start / ingest."""


@dataclass
class VmServer(PromServer):
    """A VictoriaMetrics process: stopped (SIGTERM, then kill) and used as a context manager like PromServer."""

    engine: str = "victoriametrics"


def binary_missing() -> str | None:
    """Reason string when VictoriaMetrics cannot be run here, else None."""
    if not (Path(VM_BIN).is_file() and os.access(VM_BIN, os.X_OK)):
        return f"{VM_BIN} not installed (apt-get install victoria-metrics)"
    return None


def text_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def import_lines(series: Iterable[Series]) -> Iterator[str]:
    """Prometheus text lines `name{labels} value timestamp_ms`, as /api/v1/import/prometheus reads them."""
    for s in series:
        body = ",".join(f'{k}="{escaped(str(v))}"' for k, v in sorted(s.labels.items()))
        prefix = f"{s.metric}{{{body}}} "
        for ts, value in s.samples:
            yield f"{prefix}{text_value(value)} {round(ts * 1000)}\n"


def escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def _post(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "text/plain"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        raise VictoriaMetricsUnavailable(f"import refused: {exc.code} {exc.read()[:500]!r}") from None


def backfill(url: str, series: Iterable[Series]) -> int:
    """Send every sample to the import API in chunks, make it searchable; the number of series sent."""
    distinct: set[tuple] = set()  # two Series with the same labels are one series to the engine
    chunk: list[str] = []
    size = 0
    for s in series:
        if not s.samples:
            continue
        distinct.add((s.metric, tuple(sorted(s.labels.items()))))
        for line in import_lines([s]):
            chunk.append(line)
            size += len(line)
        if size >= _IMPORT_CHUNK_BYTES:
            _post(f"{url}/api/v1/import/prometheus", "".join(chunk).encode())
            chunk, size = [], 0
    if chunk:
        _post(f"{url}/api/v1/import/prometheus", "".join(chunk).encode())
    _get(f"{url}/internal/force_flush")
    _wait_searchable(url, len(distinct))
    return len(distinct)


def _series_count(url: str) -> int:
    # Every series of the storage, whatever its time: the whole index is ours (a fresh storage dir).
    # (/api/v1/series stops at -search.maxSeries, 30,000 by default.)
    doc = json.loads(_get(f"{url}/api/v1/series/count", timeout=60))
    return int((doc.get("data") or [0])[0])


def _wait_searchable(url: str, expected: int) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    found = 0
    while time.monotonic() < deadline:
        found = _series_count(url)
        if found >= expected:
            return
        _get(f"{url}/internal/force_flush")
        time.sleep(0.2)
    raise VictoriaMetricsUnavailable(f"only {found} of {expected} series searchable after {_READY_TIMEOUT_S:.0f}s")


def _wait_ready(url: str, process: subprocess.Popen) -> bool:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False  # e.g. the port was taken meanwhile
        try:
            if _get(f"{url}/health", timeout=2).strip() == b"OK":
                return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    process.kill()
    process.wait()
    raise VictoriaMetricsUnavailable(f"victoria-metrics not ready after {_READY_TIMEOUT_S:.0f}s")


def start_victoria_metrics(workdir: Path, series: Iterable[Series]) -> VmServer:
    """Start VictoriaMetrics on a free 127.0.0.1 port with storage in workdir, import `series`, wait until
    every series is searchable."""
    missing = binary_missing()
    if missing:
        if os.environ.get("PYTEST_CURRENT_TEST"):
            pytest.skip(missing)
        raise VictoriaMetricsUnavailable(missing)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "victoria-metrics.log"
    started = start_on_free_port(
        lambda port: [VM_BIN, f"-storageDataPath={workdir / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
                      "-retentionPeriod=100y", "-search.disableCache", "-search.latencyOffset=0s",
                      "-loggerLevel=ERROR"],
        log_path, _wait_ready)
    if started:
        url, process = started
        server = VmServer(url=url, process=process, workdir=workdir, log_path=log_path)
        try:
            backfill(url, series)
        except BaseException:
            server.stop()
            raise
        return server
    tail = log_path.read_text(errors="replace")[-2000:]
    raise VictoriaMetricsUnavailable(f"victoria-metrics exited at startup:\n{tail}")


@pytest.fixture
def vm_factory(tmp_path_factory) -> Iterator[Callable[[Iterable[Series]], VmServer]]:
    """Start a real VictoriaMetrics holding the given series; all stopped at teardown."""
    yield from server_factory(tmp_path_factory, binary_missing(), start_victoria_metrics, "victoria-metrics")
