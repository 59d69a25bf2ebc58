"""`gpufinops agent`: DCGM-shaped GPU metrics read on the host (NVML or nvidia-smi), for hosts without dcgm-exporter.

Every `interval_s` the agent reads a HostSnapshot (gpufinops.collect.gpu_snapshot) with its reader: NVML
(`nvidia-ml-py`) when the library loads, else nvidia-smi (`--reader auto`, the default). It serves the last good
snapshot on /metrics under dcgm-exporter's metric names and labels, so Prometheus scrapes it like dcgm-exporter
and gpufinops.collect.prometheus reads it unchanged:

- per GPU (labels gpu, UUID, pci_bus_id, device, modelName, Hostname and/or hostname, DCGM_FI_DRIVER_VERSION,
  and instance_id when given): DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_POWER_USAGE,
  DCGM_FI_DEV_GPU_TEMP, gpufinops_gpu_processes;
- under MIG, one series set per GPU instance, with the parent GPU's labels (UUID is the parent's, as
  dcgm-exporter writes it) plus GPU_I_PROFILE and GPU_I_ID: DCGM_FI_DEV_FB_USED (the GI's memory, once even with
  several compute instances), gpufinops_gpu_processes. The board-wide series (power, temperature) stay on the
  parent GPU without GPU_I_ID, and the parent has no FB_USED of its own (it would count the GIs' memory twice);
- where the NVML reader has GPM figures (Hopper and later), dcgm-exporter's profiling series as ratios 0..1:
  DCGM_FI_PROF_GR_ENGINE_ACTIVE, _SM_ACTIVE, _SM_OCCUPANCY, _PIPE_TENSOR_ACTIVE, _DRAM_ACTIVE and the per-precision
  pipes (gpu_snapshot.GPM_METRICS), per GPU, or under MIG per GPU instance only (as dcgm-exporter gives them).
  No GPM (an older GPU, the nvidia-smi reader, the first sample after start) means no such series, never 0.

Missing data is never zero:
- a figure the driver does not give (`[N/A]`, NotSupported: utilization on a MIG GPU) or a sentinel/negative
  value has no series at all; processes that could not be read have no gpufinops_gpu_processes series;
- when a read fails, times out or gives something unparseable, every GPU series disappears at once (a stale
  value would read as "still measured") and gpufinops_agent_read_errors_total{reason} goes up; the agent keeps
  sampling and the series come back with the next good read;
- a snapshot older than `max_age_s` (the sampling thread wedged) is not served, nor given to latest_snapshot().
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily

from gpufinops.collect.gpu_snapshot import (
    GPM_METRICS,
    PROCESSES_METRIC,
    READ_ERROR_REASONS,
    GpuReadError,
    GpuSnapshot,
    HostSnapshot,
    MigInstance,
)
from gpufinops.collect.nvidia_smi import NvidiaSmiReader, measured
from gpufinops.collect.nvml import NvmlReader
from gpufinops.httpd import metrics_and_health_server

from .autostop.local_api import VERDICT_PATH
from .verdict_api import verdict_handler

log = logging.getLogger("gpufinops.agent")

UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
POWER = "DCGM_FI_DEV_POWER_USAGE"
TEMP = "DCGM_FI_DEV_GPU_TEMP"
# (metric, HELP) in exposition order. HELP texts are dcgm-exporter's (etc/default-counters.csv).
EXPORTED = (
    (UTIL, "GPU utilization (in %)."),
    (FB_USED, "Framebuffer memory used (in MiB)."),
    (POWER, "Power draw (in W)."),
    (TEMP, "GPU temperature (in C)."),
    *((metric, help_text) for metric, _nvml_name, help_text in GPM_METRICS),
    (PROCESSES_METRIC, "Compute processes running on the GPU or MIG GPU instance (gpufinops agent)."),
)
# A read that gave figures but not everything (processes refused): counted, the figures still served.
ERROR_REASONS = (*READ_ERROR_REASONS, "partial")
READERS = ("auto", "nvml", "nvidia-smi")
# dcgm-exporter renamed the host label `Hostname` to `hostname` (its PR #655); export either or both.
HOSTNAME_LABELS = {"Hostname": ("Hostname",), "hostname": ("hostname",), "both": ("Hostname", "hostname")}


class GpuReader(Protocol):
    source: str

    def read(self) -> HostSnapshot: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class HostIdentity:
    """Labels that say which machine the GPUs are on (not which GPU)."""

    hostname: str
    instance_id: str | None = None
    hostname_labels: tuple[str, ...] = HOSTNAME_LABELS["both"]


@dataclass(frozen=True)
class Sample:
    metric: str
    labels: dict[str, str]
    value: float


def gpu_labels(gpu: GpuSnapshot, host: HostIdentity, mig: MigInstance | None = None) -> dict[str, str]:
    """dcgm-exporter's label set for one GPU, or one MIG GPU instance of it (UUID stays the parent's).

    Empty values are left out, as Prometheus would drop them.
    """
    labels = {"gpu": str(gpu.index), "UUID": gpu.uuid, "pci_bus_id": gpu.pci_bus_id,
              "device": f"nvidia{gpu.index}", "modelName": gpu.name}
    if mig is not None:
        labels["GPU_I_PROFILE"] = mig.profile
        labels["GPU_I_ID"] = str(mig.gpu_instance_id)
    for name in host.hostname_labels:
        labels[name] = host.hostname
    labels["DCGM_FI_DRIVER_VERSION"] = gpu.driver_version
    if host.instance_id:
        labels["instance_id"] = host.instance_id
    return {k: v for k, v in labels.items() if v}


def _add(out: list[Sample], metric: str, labels: dict[str, str], value: object) -> None:
    number = measured(value)
    if number is not None:  # not measured: no sample, never 0
        out.append(Sample(metric, labels, number))


def _add_gpm(out: list[Sample], gpm: Mapping[str, float], labels: dict[str, str]) -> None:
    """GPM percentages as dcgm-exporter's ratios 0..1; a figure outside 0..100 % is left out, not clipped."""
    for metric, _nvml_name, _help in GPM_METRICS:
        pct = measured(gpm.get(metric))
        if pct is not None and pct <= 100:
            out.append(Sample(metric, labels, pct / 100.0))


def gpu_samples(snapshot: HostSnapshot, host: HostIdentity) -> list[Sample]:
    """Pure: the series to expose for one snapshot. An unmeasured figure has no sample."""
    out: list[Sample] = []
    for gpu in snapshot.gpus:
        if gpu.index < 0 or not gpu.uuid:
            continue  # a GPU that does not say which it is cannot be attributed
        labels = gpu_labels(gpu, host)
        _add(out, UTIL, labels, gpu.utilization_pct)
        if not gpu.mig_enabled:
            _add(out, FB_USED, labels, gpu.memory_used_mib)
        _add(out, POWER, labels, gpu.power_w)
        _add(out, TEMP, labels, gpu.temperature_c)
        if gpu.processes is not None:
            _add(out, PROCESSES_METRIC, labels, len(gpu.processes))
        _add_gpm(out, gpu.gpm, labels)
        for mig in gpu.mig_instances:
            mig_labels = gpu_labels(gpu, host, mig)
            _add(out, FB_USED, mig_labels, mig.memory_used_mib)
            _add_gpm(out, mig.gpm, mig_labels)
            if mig.processes is not None:
                _add(out, PROCESSES_METRIC, mig_labels, len(mig.processes))
    return out


def open_reader(kind: str = "auto", *, nvidia_smi: str = "nvidia-smi", timeout_s: float = 5.0,
                nvml: Any | None = None) -> GpuReader:
    """The reader for `--reader`: NVML if asked (GpuReadError when it does not initialise), nvidia-smi if
    asked, and for `auto` NVML when the library loads and initialises, else nvidia-smi."""
    if kind not in READERS:
        raise ValueError(f"--reader must be one of {', '.join(READERS)}, got {kind!r}")
    if kind in ("auto", "nvml"):
        try:
            return NvmlReader(nvml, timeout_s).open()
        except GpuReadError as exc:
            if kind == "nvml":
                raise
            log.info("NVML not used (%s); reading GPUs with %s", exc, nvidia_smi)
    return NvidiaSmiReader(nvidia_smi, timeout_s)


class _GpuCollector:
    """prometheus_client collector that renders the current snapshot at scrape time."""

    def __init__(self, agent: Agent):
        self.agent = agent

    def collect(self):
        samples = self.agent.current_samples()
        for metric, help_text in EXPORTED:
            mine = [s for s in samples if s.metric == metric]
            if not mine:  # nothing measured it: no family, not an empty one
                continue
            family = GaugeMetricFamily(metric, help_text)
            for s in mine:  # GPU and GI series of one metric have different label sets
                family.add_sample(metric, s.labels, s.value)
            yield family


class Agent:
    """Reads the host's GPUs every interval and holds the last good snapshot for /metrics and on_sample.

    `reader` (default: nvidia-smi at `nvidia_smi`), `clock` (monotonic seconds) and `on_sample` are injectable.
    `on_sample(snapshot, "")` is called after every good read, `on_sample(None, "<reason>: <message>")` after
    every failed one (reason one of ERROR_REASONS); an exception in it is logged and never stops sampling.
    """

    def __init__(self, host: HostIdentity, *, reader: GpuReader | None = None, nvidia_smi: str = "nvidia-smi",
                 interval_s: float = 10.0, timeout_s: float = 5.0, max_age_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_sample: Callable[[HostSnapshot | None, str], None] | None = None):
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval and timeout must be > 0")
        self.host = host
        self.reader: GpuReader = reader if reader is not None else NvidiaSmiReader(nvidia_smi, timeout_s)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        # A snapshot older than this is not served: the sampler is stuck, the values are not current.
        self.max_age_s = max_age_s if max_age_s is not None else 2 * interval_s + timeout_s
        self.clock = clock
        self.on_sample = on_sample
        # The local autostop loop when one runs (set by autostop.cli.maybe_start_autostop): GET /v1/verdict answers
        # from it; without one /v1/verdict is 404.
        self.autostop: Any | None = None
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._snapshot: HostSnapshot | None = None
        self._taken_at: float | None = None
        self._stop = threading.Event()
        self.registry = CollectorRegistry()
        self.errors = Counter("gpufinops_agent_read_errors", "GPU reads that failed, timed out, were unparseable "
                              "or were partial", ["reason"], registry=self.registry)
        for reason in ERROR_REASONS:
            self.errors.labels(reason)  # exported at 0 from the start, so rate() sees the first error
        self.last_success = Gauge("gpufinops_agent_last_success_timestamp_seconds",
                                  "Unix time of the last good GPU read", registry=self.registry)
        self.gpus = Gauge("gpufinops_agent_gpus", "GPUs in the last good read", registry=self.registry)
        Gauge("gpufinops_agent_reader", "The reader in use (1)", ["reader"],
              registry=self.registry).labels(self.reader.source).set(1)
        self.registry.register(_GpuCollector(self))

    # ------------------------------------------------------------------ sampling

    def sample_once(self) -> bool:
        """One read. True if it gave GPUs; on failure the GPU series are cleared."""
        try:
            snapshot = self.reader.read()
            if not snapshot.gpus:
                raise GpuReadError("unparseable", f"{self.reader.source}: no GPU in the answer")
        except GpuReadError as exc:
            return self._failed(exc.reason, str(exc))
        samples = gpu_samples(snapshot, self.host)
        with self._lock:
            self._samples, self._snapshot, self._taken_at = samples, snapshot, self.clock()
        for problem in snapshot.problems:
            self.errors.labels("partial").inc()
            log.warning("GPU read (%s) partial: %s", snapshot.source, problem)
        self.gpus.set(len(snapshot.gpus))
        self.last_success.set(time.time())
        self._notify(snapshot, "")
        return True

    def _failed(self, reason: str, message: str) -> bool:
        with self._lock:
            self._samples, self._snapshot, self._taken_at = [], None, None
        self.errors.labels(reason).inc()
        log.warning("GPU read (%s) failed, %s: %s", self.reader.source, reason, message)
        self._notify(None, f"{reason}: {message}")
        return False

    def _notify(self, snapshot: HostSnapshot | None, reason: str) -> None:
        if self.on_sample is None:
            return
        try:
            self.on_sample(snapshot, reason)
        except Exception:  # a consumer's bug must not stop the metrics
            log.exception("on_sample failed")

    def _is_current(self) -> bool:
        return self._taken_at is not None and self.clock() - self._taken_at <= self.max_age_s

    def current_samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples) if self._is_current() else []

    def latest_snapshot(self) -> HostSnapshot | None:
        """The last good snapshot while it is current (not older than max_age_s), else None."""
        with self._lock:
            return self._snapshot if self._is_current() else None

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

    def close(self) -> None:
        self.stop()
        self.reader.close()

    # ------------------------------------------------------------------ serving

    def metrics_text(self) -> bytes:
        return generate_latest(self.registry)

    def healthy(self) -> tuple[bool, str]:
        with self._lock:
            ok = self._is_current()
        return (True, "ok\n") if ok else (False, f"no current GPU read ({self.reader.source})\n")


def make_http_server(agent: Agent, address: str, port: int) -> ThreadingHTTPServer:
    """/metrics, the probes, and GET /v1/verdict (agent/verdict_api.py: this host's verdict under local autostop)."""
    return metrics_and_health_server(address, port, agent.metrics_text, agent.healthy,
                                     get={VERDICT_PATH: verdict_handler(agent.autostop)})


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
        self.agent.close()


# Loopback unless told otherwise: /metrics names the host, its GPUs and processes, and GET /v1/verdict its
# verdict; a Prometheus on another machine needs the bind said explicitly (--address, docs/agent.md).
DEFAULT_ADDRESS = "127.0.0.1"


def start(agent: Agent, address: str = DEFAULT_ADDRESS, port: int = 9400, *, sample: bool = True) -> RunningAgent:
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
