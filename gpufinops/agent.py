"""`gpufinops agent`: DCGM-shaped GPU metrics from nvidia-smi, for hosts without dcgm-exporter.

The agent runs `nvidia-smi --query-gpu=... --format=csv` every `interval_s`
and serves the last good answer on /metrics under dcgm-exporter's metric names
and labels (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_POWER_USAGE,
DCGM_FI_DEV_GPU_TEMP; gpu, UUID, pci_bus_id, device, modelName, Hostname,
DCGM_FI_DRIVER_VERSION and optionally instance_id). Prometheus scrapes it like
dcgm-exporter, so gpufinops.collect.prometheus reads it unchanged.

Missing data is never zero:
- a field nvidia-smi reports as `[N/A]`/`[Not Supported]` (utilization.gpu on
  a MIG-enabled GPU) or as a sentinel/negative value has no series at all;
- when nvidia-smi fails, times out or prints something unparseable, every GPU
  series disappears at once (a stale value would read as "still measured") and
  gpufinops_agent_nvidia_smi_errors_total{reason} goes up; the agent keeps
  sampling and the series come back with the next good answer;
- a snapshot older than `max_age_s` (the sampling thread wedged) is not served.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily

from gpufinops.collect.nvidia_smi import GpuReading, NvidiaSmiError, parse_readings
from gpufinops.httpd import metrics_and_health_server
from gpufinops.model import SENTINEL_THRESHOLD

log = logging.getLogger("gpufinops.agent")

# Only what the exported series need: a short query is cheaper for the driver.
AGENT_QUERY_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "driver_version", "mig.mode.current",
    "utilization.gpu", "memory.used", "power.draw", "temperature.gpu",
)

# (metric, HELP, nvidia-smi field). HELP texts are dcgm-exporter's.
EXPORTED = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "utilization.gpu"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory.used"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power.draw"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature.gpu"),
)
ERROR_REASONS = ("exit", "timeout", "unparseable", "not_found")


@dataclass(frozen=True)
class HostIdentity:
    """Labels that say which machine the GPUs are on (not which GPU)."""

    hostname: str
    instance_id: str | None = None


@dataclass(frozen=True)
class Sample:
    metric: str
    labels: dict[str, str]
    value: float


def _measured(value: object) -> float | None:
    """A number nvidia-smi measured, else None (missing, a word, a sentinel, negative)."""
    if isinstance(value, str):  # a column without a unit in its header, e.g. temperature.gpu
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, float) and 0 <= value < SENTINEL_THRESHOLD:
        return value
    return None


def gpu_labels(reading: GpuReading, host: HostIdentity) -> dict[str, str]:
    """dcgm-exporter's label set for one GPU. Empty values are left out, as Prometheus would drop them."""
    fields = reading.fields
    labels = {
        "gpu": str(reading.index),
        "UUID": reading.uuid,
        "pci_bus_id": str(fields.get("pci.bus_id") or ""),
        "device": f"nvidia{reading.index}",
        "modelName": reading.name,
        "Hostname": host.hostname,
        "DCGM_FI_DRIVER_VERSION": str(fields.get("driver_version") or ""),
    }
    if host.instance_id:
        labels["instance_id"] = host.instance_id
    return {k: v for k, v in labels.items() if v}


def gpu_samples(readings: Iterable[GpuReading], host: HostIdentity) -> list[Sample]:
    """Pure: the series to expose for one nvidia-smi answer. An unmeasured field has no sample."""
    out = []
    for reading in readings:
        if reading.index < 0 or not reading.uuid:
            continue  # a row that does not say which GPU it is cannot be attributed
        labels = gpu_labels(reading, host)
        for metric, _help, field_name in EXPORTED:
            value = _measured(reading.fields.get(field_name))
            if value is not None:
                out.append(Sample(metric, labels, value))
    return out


class NvidiaSmiFailed(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def run_nvidia_smi(binary: str, timeout_s: float, fields: Sequence[str] = AGENT_QUERY_FIELDS) -> str:
    """stdout of one nvidia-smi query; NvidiaSmiFailed(reason) otherwise.

    nvidia-smi runs in its own process group so that a hung one is killed with
    everything it started (a wrapper script's children would otherwise keep
    running and keep the output pipe open).
    """
    argv = [binary, f"--query-gpu={','.join(fields)}", "--format=csv"]
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True)
    except OSError as exc:  # not installed, not executable
        raise NvidiaSmiFailed("not_found", f"cannot run {binary}: {exc.strerror or exc}") from None
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise NvidiaSmiFailed("timeout", f"{binary} did not answer within {timeout_s:g}s; killed") from None
    if proc.returncode != 0:
        detail = (stderr.strip() or stdout.strip())[:200]
        raise NvidiaSmiFailed("exit", f"{binary} exited {proc.returncode}: {detail}")
    return stdout


class _GpuCollector:
    """prometheus_client collector that renders the current snapshot at scrape time."""

    def __init__(self, agent: "Agent"):
        self.agent = agent

    def collect(self):
        samples = self.agent.current_samples()
        for metric, help_text, _field in EXPORTED:
            family = None
            for s in samples:
                if s.metric != metric:
                    continue
                if family is None:
                    family = GaugeMetricFamily(metric, help_text, labels=list(s.labels))
                family.add_metric(list(s.labels.values()), s.value)
            if family is not None:  # no GPU measured it: no family, not an empty one
                yield family


class Agent:
    """Samples nvidia-smi and holds the last good answer for /metrics.

    `runner(binary, timeout_s) -> csv text` and `clock` (monotonic seconds) are injectable.
    """

    def __init__(self, host: HostIdentity, *, nvidia_smi: str = "nvidia-smi", interval_s: float = 10.0,
                 timeout_s: float = 5.0, max_age_s: float | None = None,
                 runner: Callable[[str, float], str] = run_nvidia_smi,
                 clock: Callable[[], float] = time.monotonic):
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval and timeout must be > 0")
        self.host = host
        self.nvidia_smi = nvidia_smi
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        # A snapshot older than this is not served: the sampler is stuck, the values are not current.
        self.max_age_s = max_age_s if max_age_s is not None else 2 * interval_s + timeout_s
        self.runner = runner
        self.clock = clock
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._taken_at: float | None = None
        self._stop = threading.Event()
        self.registry = CollectorRegistry()
        self.errors = Counter("gpufinops_agent_nvidia_smi_errors", "nvidia-smi runs that failed, timed out "
                              "or printed unparseable output", ["reason"], registry=self.registry)
        for reason in ERROR_REASONS:
            self.errors.labels(reason)  # exported at 0 from the start, so rate() sees the first error
        self.last_success = Gauge("gpufinops_agent_last_success_timestamp_seconds",
                                  "Unix time of the last good nvidia-smi answer", registry=self.registry)
        self.gpus = Gauge("gpufinops_agent_gpus", "GPUs in the last good nvidia-smi answer", registry=self.registry)
        self.registry.register(_GpuCollector(self))

    # ------------------------------------------------------------------ sampling

    def sample_once(self) -> bool:
        """One nvidia-smi run. True if it gave readings; on failure the GPU series are cleared."""
        try:
            text = self.runner(self.nvidia_smi, self.timeout_s)
            readings = parse_readings(text, source=self.nvidia_smi)
            if not readings:
                raise NvidiaSmiError(f"{self.nvidia_smi}: no GPU rows")
        except NvidiaSmiFailed as exc:
            return self._failed(exc.reason, str(exc))
        except NvidiaSmiError as exc:
            return self._failed("unparseable", str(exc))
        samples = gpu_samples(readings, self.host)
        with self._lock:
            self._samples, self._taken_at = samples, self.clock()
        self.gpus.set(len(readings))
        self.last_success.set(time.time())
        return True

    def _failed(self, reason: str, message: str) -> bool:
        with self._lock:
            self._samples, self._taken_at = [], None
        self.errors.labels(reason).inc()
        log.warning("nvidia-smi %s: %s", reason, message)
        return False

    def _is_current(self) -> bool:
        return self._taken_at is not None and self.clock() - self._taken_at <= self.max_age_s

    def current_samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples) if self._is_current() else []

    def run_forever(self) -> None:
        """Sample every interval until stop(); a failing sample never ends the loop."""
        delay = self.interval_s  # start() has just taken the first sample
        while not self._stop.wait(delay):
            started = self.clock()
            try:
                self.sample_once()
            except Exception:  # a bug must not silently freeze the last values: clear and go on
                log.exception("sampling failed")
                self._failed("unparseable", "unexpected error")
            delay = max(0.0, self.interval_s - (self.clock() - started))

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ serving

    def metrics_text(self) -> bytes:
        return generate_latest(self.registry)

    def healthy(self) -> tuple[bool, str]:
        with self._lock:
            ok = self._is_current()
        return (True, "ok\n") if ok else (False, "no current nvidia-smi answer\n")


def make_http_server(agent: Agent, address: str, port: int) -> ThreadingHTTPServer:
    return metrics_and_health_server(address, port, agent.metrics_text, agent.healthy)


@dataclass
class RunningAgent:
    """An agent sampling in a thread and serving HTTP in another; `close()` stops both."""

    agent: Agent
    server: ThreadingHTTPServer
    threads: tuple[threading.Thread, ...]

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def close(self) -> None:
        self.agent.stop()
        self.server.shutdown()
        self.server.server_close()
        for t in self.threads:
            t.join(timeout=self.agent.timeout_s + 5)


def start(agent: Agent, address: str = "0.0.0.0", port: int = 9400, *, sample: bool = True) -> RunningAgent:
    """Take a first sample (so the first scrape has data), then sample and serve in background threads.

    `sample=False` serves without the sampling loop (tests drive `sample_once` themselves).
    """
    agent.sample_once()
    server = make_http_server(agent, address, port)
    threads = [threading.Thread(target=server.serve_forever, name="agent-http", daemon=True)]
    if sample:
        threads.append(threading.Thread(target=agent.run_forever, name="agent-sampler", daemon=True))
    for t in threads:
        t.start()
    return RunningAgent(agent, server, tuple(threads))
