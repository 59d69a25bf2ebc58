"""A real Prometheus for tests and benchmarks, filled by backfilling.

Series are written as OpenMetrics text, turned into TSDB blocks with
`promtool tsdb create-blocks-from openmetrics`, and served by a real
`prometheus` process on a free 127.0.0.1 port with no scrape targets. Tests
then query it at an explicit evaluation time (`time=`), exactly as the
collector does in production.

Why backfill and not a scrape: samples can be placed anywhere in time
(30 days ago, the last 2 hours before real now) and counted exactly.

Prometheus 2.42 notes that shaped this module:
- The blocks are written before the server starts, so they are loaded at
  startup; the head stays empty (no scrape targets) and nothing is rejected
  by the head's out-of-order window.
- promtool re-reads the whole input once per block range it covers (2h by
  default). A wide span (old + recent data) would mean hundreds of passes,
  so the hidden `--max-block-duration` flag is raised to cover the span:
  at most a couple of passes, whatever the span.
- Retention is 3650d so that 30-day-old backfills are not deleted at startup.

Usable as a library (bench/) and as a pytest plugin (`prometheus_factory`).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pytest

PROMETHEUS_BIN = os.environ.get("GPUFINOPS_TEST_PROMETHEUS", "/usr/bin/prometheus")
PROMTOOL_BIN = os.environ.get("GPUFINOPS_TEST_PROMTOOL", "/usr/bin/promtool")

_METRIC_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_TWO_HOURS_MS = 2 * 3600 * 1000
_READY_TIMEOUT_S = 60.0


@dataclass
class Series:
    metric: str  # e.g. "DCGM_FI_DEV_GPU_UTIL"
    labels: dict[str, str]
    samples: list[tuple[float, float]]  # (unix ts seconds, value)


def dcgm_labels(
    hostname: str,
    gpu: int,
    *,
    instance_id: str | None = None,
    model: str = "NVIDIA A100-SXM4-80GB",
    hostname_label: str = "Hostname",
    **extra: str,
) -> dict[str, str]:
    """Labels shaped like a real dcgm-exporter series as stored by Prometheus.

    Shape copied from ../shared/data/dcgm_exporter/scrapes/*.prom.txt:
    gpu, UUID, pci_bus_id, device, modelName, Hostname (or the newer
    `hostname`), DCGM_FI_DRIVER_VERSION; plus the `job`/`instance` labels
    Prometheus attaches at scrape time, and `instance_id` when ec2_sd
    relabelling is configured. `extra` adds or overrides labels, e.g.
    GPU_I_ID/GPU_I_PROFILE for MIG slices or exported_pod/exported_namespace.
    """
    digest = hashlib.sha1(f"{hostname}/{gpu}".encode()).hexdigest()
    uuid = f"GPU-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    labels = {
        "gpu": str(gpu),
        "UUID": uuid,
        "pci_bus_id": f"00000000:{0x10 + gpu:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": model,
        hostname_label: hostname,
        "DCGM_FI_DRIVER_VERSION": "580.105.08",
        "job": "dcgm-exporter",
        "instance": f"{hostname}:9400",
    }
    if instance_id is not None:
        labels["instance_id"] = instance_id
    labels.update(extra)
    return labels


# --------------------------------------------------------------------------- OpenMetrics


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _check(series: Series) -> None:
    if not _METRIC_RE.match(series.metric):
        raise ValueError(f"invalid metric name {series.metric!r}")
    for name in series.labels:
        if not _LABEL_RE.match(name) or name == "__name__":
            raise ValueError(f"invalid label name {name!r} on {series.metric}")


def _series_line_prefix(series: Series) -> str:
    body = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(series.labels.items()))
    return f"{series.metric}{{{body}}} " if body else f"{series.metric} "


def write_openmetrics(series: Iterable[Series], path: Path) -> tuple[int, int] | None:
    """Write OpenMetrics text that promtool accepts.

    promtool wants each metric family in one block under its `# TYPE` line,
    the samples of each series in increasing time order (else "out of order
    sample") and a final `# EOF`. Duplicate timestamps within a series are
    dropped (last value wins). Returns (min_ms, max_ms) of the samples
    written, or None when there are none.
    """
    by_metric: dict[str, list[Series]] = {}
    for s in series:
        _check(s)
        by_metric.setdefault(s.metric, []).append(s)
    lo = hi = None
    path = Path(path)
    with path.open("w", encoding="utf-8") as out:
        for metric in sorted(by_metric):
            out.write(f"# TYPE {metric} gauge\n")
            for s in sorted(by_metric[metric], key=lambda x: sorted(x.labels.items())):
                prefix = _series_line_prefix(s)
                dedup: dict[int, float] = {}
                for ts, value in s.samples:
                    dedup[int(round(ts * 1000))] = float(value)
                if not dedup:
                    continue
                ordered = sorted(dedup.items())
                lo = ordered[0][0] if lo is None else min(lo, ordered[0][0])
                hi = ordered[-1][0] if hi is None else max(hi, ordered[-1][0])
                out.write(
                    "".join(f"{prefix}{_format_value(v)} {ms / 1000:.3f}\n" for ms, v in ordered)
                )
        out.write("# EOF\n")
    return None if lo is None else (lo, hi)


# --------------------------------------------------------------------------- server


class PrometheusUnavailable(RuntimeError):
    """prometheus/promtool binaries missing or the server would not start."""


@dataclass
class PromServer:
    url: str
    process: subprocess.Popen
    workdir: Path
    log_path: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def binaries_missing() -> str | None:
    """Reason string when the real Prometheus cannot be run here, else None."""
    for binary in (PROMETHEUS_BIN, PROMTOOL_BIN):
        if not (Path(binary).is_file() and os.access(binary, os.X_OK)):
            return f"{binary} not installed (apt-get install prometheus)"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _block_duration_ms(lo: int, hi: int) -> int:
    # A range that covers the whole span (multiple of 2h): promtool then makes
    # at most two passes over the file instead of one per 2h of span.
    span = hi - lo + 1
    return max(1, math.ceil(span / _TWO_HOURS_MS)) * _TWO_HOURS_MS


def create_blocks(series: Iterable[Series], workdir: Path) -> Path:
    """Backfill `series` into workdir/data and return that directory."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    source = workdir / "backfill.om"
    bounds = write_openmetrics(series, source)
    if bounds is not None:
        hours = _block_duration_ms(*bounds) // 3_600_000
        proc = subprocess.run(
            [PROMTOOL_BIN, "tsdb", "create-blocks-from", "openmetrics", "--quiet",
             f"--max-block-duration={hours}h", str(source), str(data)],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise PrometheusUnavailable(f"promtool backfill failed: {proc.stderr.strip()[-2000:]}")
    source.unlink()
    return data


def _wait_ready(url: str, process: subprocess.Popen, log_path: Path) -> bool:
    """True once /-/ready answers 200; False if the process died (e.g. port taken)."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    process.kill()
    process.wait()
    tail = log_path.read_text(errors="replace")[-2000:]
    raise PrometheusUnavailable(f"prometheus not ready after {_READY_TIMEOUT_S:.0f}s:\n{tail}")


def _require_binaries() -> None:
    """Skip the calling test (or raise outside pytest) when Prometheus is not installed."""
    missing = binaries_missing()
    if missing:
        if os.environ.get("PYTEST_CURRENT_TEST"):
            pytest.skip(missing)
        raise PrometheusUnavailable(missing)


def start_on_free_port(argv_for_port: Callable[[int], list[str]], log_path: Path,
                       ready: Callable[[str, subprocess.Popen], bool]) -> tuple[str, subprocess.Popen] | None:
    """Start `argv_for_port(port)` on a free 127.0.0.1 port, logging to `log_path`, until `ready(url, process)`:
    three tries, since another process may grab the free port first. None when every try failed."""
    for _attempt in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log_path.open("ab") as log:
            process = subprocess.Popen(argv_for_port(port), stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        if ready(url, process):
            return url, process
    return None


def _launch(workdir: Path, config: Path, data: Path, *extra_flags: str) -> PromServer:
    """Start /usr/bin/prometheus on a free 127.0.0.1 port and wait until it is ready."""
    log_path = workdir / "prometheus.log"
    started = start_on_free_port(
        lambda port: [PROMETHEUS_BIN, f"--config.file={config}", f"--storage.tsdb.path={data}",
                      f"--web.listen-address=127.0.0.1:{port}", *extra_flags, "--log.level=warn"],
        log_path, lambda url, process: _wait_ready(url, process, log_path))
    if started:
        url, process = started
        return PromServer(url=url, process=process, workdir=workdir, log_path=log_path)
    tail = log_path.read_text(errors="replace")[-2000:]
    raise PrometheusUnavailable(f"prometheus exited at startup:\n{tail}")


def start_prometheus(workdir: Path, series: Iterable[Series]) -> PromServer:
    """Backfill `series` into workdir/data, start Prometheus on it, wait until ready."""
    _require_binaries()
    workdir = Path(workdir)
    data = create_blocks(series, workdir)
    config = workdir / "prometheus.yml"
    # No scrape targets: the TSDB holds only what was backfilled.
    config.write_text("global:\n  scrape_interval: 1h\n  evaluation_interval: 1h\nscrape_configs: []\n")
    # retention: 30-day-old backfills must not be deleted at startup.
    return _launch(workdir, config, data, "--storage.tsdb.retention.time=3650d")


def start_scraping_prometheus(workdir: Path, targets: Iterable[str], scrape_interval_s: int = 1,
                              job: str = "dcgm-exporter") -> PromServer:
    """Start an empty Prometheus that scrapes `targets` ("127.0.0.1:port") every
    `scrape_interval_s` seconds, and wait until it is ready (not until the first scrape)."""
    _require_binaries()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    config = workdir / "prometheus.yml"
    target_list = ", ".join(f'"{t}"' for t in targets)
    config.write_text(
        f"global:\n  scrape_interval: {scrape_interval_s}s\n  scrape_timeout: {scrape_interval_s}s\n"
        f"  evaluation_interval: 1h\nscrape_configs:\n  - job_name: {job}\n"
        f"    static_configs:\n      - targets: [{target_list}]\n"
    )
    return _launch(workdir, config, data)


def server_factory(tmp_path_factory, missing: str | None, launch: Callable[[Path, Iterable[Series]], PromServer],
                   name: str) -> Iterator[Callable[[Iterable[Series]], PromServer]]:
    """The body of an engine fixture: skip when the engine is not installed, start one per call in its own
    folder, stop them all at teardown."""
    if missing:
        pytest.skip(missing)
    servers: list[PromServer] = []

    def start(series: Iterable[Series]) -> PromServer:
        server = launch(tmp_path_factory.mktemp(name), series)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def prometheus_factory(tmp_path_factory) -> Iterator[Callable[[Iterable[Series]], PromServer]]:
    """Start a real Prometheus holding the given series; all stopped at teardown."""
    yield from server_factory(tmp_path_factory, binaries_missing(), start_prometheus, "prometheus")


if __name__ == "__main__":  # pragma: no cover - manual smoke test
    print(binaries_missing() or "prometheus and promtool found", file=sys.stderr)
