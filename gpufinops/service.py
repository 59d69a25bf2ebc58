"""The long-running service: APScheduler jobs, /metrics and /healthz. Nothing imports this module
except the CLI.

- The evaluation job runs every `schedule.evaluate_every_s` with coalescing and
  max_instances=1, so a slow run is never overlapped by the next one.
- A failing job is logged and counted; the scheduler keeps running.
- SIGTERM/SIGINT shut the scheduler down after the running job finishes.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import ThreadingHTTPServer
from typing import Callable

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from .act import Actuator
from .config import Settings
from .httpd import metrics_and_health_server
from .model import RunContext, utcnow
from .pipeline import Peers, RunReport, run_once
from .rules import load_rules

log = logging.getLogger("gpufinops.service")


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.evaluations = Counter("gpufinops_evaluations", "Evaluation runs finished", registry=self.registry)
        self.errors = Counter("gpufinops_evaluation_errors", "Evaluation runs that failed or had errors",
                              registry=self.registry)
        self.verdicts = Gauge("gpufinops_instances_by_verdict", "Instance-rule verdicts in the last run",
                              ["verdict"], registry=self.registry)
        self.stops = Counter("gpufinops_stops", "Instances stopped (or that would be in dry-run)", ["dry_run"],
                             registry=self.registry)
        self.last_success = Gauge("gpufinops_last_success_timestamp_seconds",
                                  "Unix time of the last successful evaluation", registry=self.registry)
        self.duration = Gauge("gpufinops_last_evaluation_seconds", "Wall time of the last evaluation",
                              registry=self.registry)

    def observe(self, report: RunReport, seconds: float) -> None:
        self.evaluations.inc()
        self.duration.set(seconds)
        for verdict, n in report.verdict_counts().items():
            self.verdicts.labels(verdict).set(n)
        for a in report.actions:
            if a.kind.value in ("stop", "terminate") and a.ok:
                self.stops.labels(str(a.dry_run).lower()).inc()
        if report.errors:
            self.errors.inc()
        else:
            self.last_success.set(report.now.timestamp())


def make_http_server(settings: Settings, metrics: ServiceMetrics, healthy: Callable[[], tuple[bool, str]]) -> ThreadingHTTPServer:
    return metrics_and_health_server(settings.service.host, settings.service.port,
                                     lambda: generate_latest(metrics.registry), healthy)


@dataclass
class Service:
    settings: Settings
    peers: Peers
    clock: Callable[[], datetime] = utcnow
    extra_jobs: tuple[tuple[str, dict, Callable[[], None]], ...] = ()  # (id, trigger args, fn): see jobs.py

    def __post_init__(self) -> None:
        self.metrics = ServiceMetrics()
        self.scheduler = BackgroundScheduler(timezone=timezone.utc)
        self._stop = threading.Event()
        self._started_at = self.clock()
        self._last_ok: datetime | None = None
        self._reconciled = False

    def reconcile(self) -> bool:
        """Settle stop intents left by a crash; retried before every run until it succeeds."""
        if self._reconciled:
            return True
        try:
            notes = Actuator(self.peers.cloud, self.peers.store, self.peers.notifier, self.settings).reconcile(self.clock())
        except Exception as exc:  # a region down at start must not crash the service
            log.error("reconcile after restart failed, retrying next run: %s", exc)
            return False
        for n in notes:
            log.warning(n)
        self._reconciled = True
        return True

    def evaluate_job(self) -> RunReport | None:
        if not self.reconcile():
            # Acting with unsettled intents could repeat a stop: judge nothing this run.
            self.metrics.errors.inc()
            return None
        # Rules are re-read every run so an edited rule file applies without a restart;
        # a broken edit keeps the service up and is reported as an error.
        rules = load_rules(self.settings.rules_paths)
        ctx = RunContext(now=self.clock(), dry_run=self.settings.act.dry_run)
        t0 = time.perf_counter()
        report = run_once(ctx, self.settings, rules, self.peers)
        self.metrics.observe(report, time.perf_counter() - t0)
        if not report.errors:
            self._last_ok = ctx.now
        log.info("run %s: %d instances, verdicts %s, %d actions%s", ctx.run_id, len(report.instances),
                 report.verdict_counts(), len(report.actions), " [dry-run]" if ctx.dry_run else "")
        return report

    def healthy(self) -> tuple[bool, str]:
        now = self.clock()
        limit = 5 * self.settings.schedule.evaluate_every_s
        ref = self._last_ok or self._started_at
        age = (now - ref).total_seconds()
        if age > limit:
            return False, f"no successful evaluation for {age:.0f}s\n"
        return True, f"ok; last success {self._last_ok.isoformat() if self._last_ok else 'none yet'}\n"

    def _on_job_event(self, event) -> None:
        if event.exception is not None:
            self.metrics.errors.inc()
            log.error("job %s failed: %r", event.job_id, event.exception)

    def start(self) -> None:
        self.reconcile()
        common = dict(coalesce=True, max_instances=1, misfire_grace_time=self.settings.schedule.misfire_grace_s)
        self.scheduler.add_job(self.evaluate_job, "interval", seconds=self.settings.schedule.evaluate_every_s,
                               id="evaluate", next_run_time=datetime.now(timezone.utc), **common)
        for name, trigger, fn in self.extra_jobs:
            self.scheduler.add_job(fn, id=name, **trigger, **common)
        self.scheduler.add_listener(self._on_job_event, EVENT_JOB_ERROR | EVENT_JOB_EXECUTED)
        self.scheduler.start()

    def stop(self) -> None:
        # wait=True: a running evaluation finishes (and records what it did) before we exit.
        self.scheduler.shutdown(wait=True)
        self._stop.set()

    def serve_forever(self) -> None:
        http = make_http_server(self.settings, self.metrics, self.healthy)
        threading.Thread(target=http.serve_forever, name="http", daemon=True).start()
        log.info("serving /metrics and /healthz on %s:%d", self.settings.service.host, http.server_address[1])

        def on_signal(signum, _frame) -> None:
            log.info("signal %d: stopping after the current job", signum)
            self._stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        self._stop.wait()
        self.stop()
        http.shutdown()
        log.info("stopped cleanly")
