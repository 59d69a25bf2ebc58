"""The long-running service: APScheduler jobs, /metrics, /livez (/healthz) and /readyz. Nothing imports
this module except the CLI.

- The evaluation job runs every `schedule.evaluate_every_s` with coalescing and
  max_instances=1, so a slow run is never overlapped by the next one.
- One active scheduler: every tick first takes or renews the leader lease in the database
  (gpufinops/lease.py). The leader judges, records and acts; a standby judges read-only (no audit
  rows, no changes) and takes over when the leader's lease expires. Scheduled jobs run on the leader only.
  A background thread renews the lease every ttl/3 so a long tick does not lose it.
- A failing job is logged and counted; the scheduler keeps running.
- Every tick says which data source failed (inventory, prometheus, database, slack, and email where it is
  enabled) in /metrics and /readyz, so an outage is visible within one tick.
- SIGTERM/SIGINT shut the scheduler down after the running job finishes, then release the lease.
- The fleet's cost and verdict figures (fleet_metrics.py) are built once per tick from the last RunReport and
  served at each scrape; the idleness API (api.py, GET /v1/verdicts) answers from the same report.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import ThreadingHTTPServer
from types import FrameType
from typing import Any, Callable, Mapping, Sequence

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from sqlalchemy.exc import SQLAlchemyError

from ..act.actuator import Actuator
from ..config import Settings
from .api import VERDICTS_PATH, VerdictApi
from .fleet_metrics import FleetExposition, FleetFigures
from .nodes import workload_cloud_of
from ..httpd import GetHandler, PostHandler, metrics_and_health_server, mutual_tls_context, mutual_tls_server
from ..act.lease import LeaseLost, SchedulerLease, read_lease
from ..model import ActionKind, RunContext, utcnow
from ..notify.interact import Answer, handle_click, handle_socket_envelope
from ..notify.routing import deliveries
from ..notify.socket_mode import SocketModeActions
from .pipeline import SOURCES, Peers, RunReport, run_once, sources_of
from ..rules import load_rules

log = logging.getLogger("gpufinops.service")

EVALUATE_JOB = "evaluate"
BUDGETS_JOB = "budgets"  # run/jobs.py: its BudgetStatus list feeds the budget gauges
SAVINGS_JOB = "savings"  # run/jobs.py month_savings: its team figures feed the net-saving gauge
# Liveness: the last tick finished within this many evaluation periods (and at least LIVENESS_FLOOR_S,
# so one slow tick on a short period does not get the process restarted).
LIVENESS_PERIODS = 5
LIVENESS_FLOOR_S = 60


class ServiceMetrics:
    def __init__(self, sources: Sequence[str] = SOURCES) -> None:
        self.registry = CollectorRegistry()
        self.evaluations = Counter("gpufinops_evaluations", "Evaluation runs finished", registry=self.registry)
        self.errors = Counter("gpufinops_evaluation_errors",
                              "Evaluation runs that failed, had errors, or in which a data source failed",
                              registry=self.registry)
        # Fleet figures (cost, verdicts per instance, UNKNOWN by reason, idle $ this month, stops, budgets).
        # Rendered once per tick and appended to each scrape (fleet_metrics.py).
        self.fleet = FleetExposition()
        self.stops = Counter("gpufinops_stops", "Instances stopped (or that would be in dry-run)", ["dry_run"],
                             registry=self.registry)
        self.last_success = Gauge("gpufinops_last_success_timestamp_seconds",
                                  "Unix time of the last evaluation in which every data source answered",
                                  registry=self.registry)
        self.duration = Gauge("gpufinops_last_evaluation_seconds", "Wall time of the last evaluation",
                              registry=self.registry)
        self.clock_steps_back = Counter("gpufinops_clock_steps_back", "Ticks that began earlier than the one before",
                                        registry=self.registry)
        self.leader = Gauge("gpufinops_leader", "1 while this process holds the scheduler lease (it acts), "
                            "0 on a standby (it judges read-only)", registry=self.registry)
        self.lease_token = Gauge("gpufinops_lease_token", "Fencing token of the scheduler lease this process "
                                 "holds, 0 when it holds none", registry=self.registry)
        self.source_up = Gauge("gpufinops_source_up", "1 when the data source answered in the last tick, else 0",
                               ["source"], registry=self.registry)
        self.source_errors = Counter("gpufinops_source_errors", "Ticks in which the data source failed",
                                     ["source"], registry=self.registry)
        for source in sources:
            self.source_errors.labels(source)  # exported at 0 from the start, so rate() sees the first error

    def body(self) -> bytes:
        """The /metrics text: the service's own series, then the fleet's."""
        return generate_latest(self.registry) + self.fleet.text()

    def observe(self, report: RunReport, seconds: float, figures: FleetFigures | None = None) -> None:
        self.evaluations.inc()
        self.duration.set(seconds)
        self.fleet.set_figures(figures if figures is not None else FleetFigures.from_report(report))
        for a in report.actions:
            if a.kind.value in ("stop", "terminate") and a.ok:
                self.stops.labels(str(a.dry_run).lower()).inc()
        for source, error in report.sources.items():
            self.source_up.labels(source).set(0 if error else 1)
            if error:
                self.source_errors.labels(source).inc()
        if report.errors or report.degraded():
            self.errors.inc()
        else:
            self.last_success.set(report.now.timestamp())


def make_http_server(settings: Settings, metrics: ServiceMetrics, healthy: Callable[[], tuple[bool, str]],
                     ready: Callable[[], tuple[bool, str]] | None = None,
                     slack_actions: "PostHandler | None" = None,
                     verdicts: "GetHandler | None" = None) -> ThreadingHTTPServer:
    return metrics_and_health_server(settings.service.host, settings.service.port,
                                     metrics.body, healthy, ready,
                                     post={"/slack/actions": slack_actions} if slack_actions else None,
                                     get={VERDICTS_PATH: verdicts} if verdicts else None)


@dataclass
class Service:
    settings: Settings
    peers: Peers
    clock: Callable[[], datetime] = utcnow
    extra_jobs: tuple[tuple[str, dict, Callable[[], None]], ...] = ()  # (id, trigger args, fn): see jobs.py

    def __post_init__(self) -> None:
        self.metrics = ServiceMetrics(sources_of(self.settings))
        self.scheduler = BackgroundScheduler(timezone=timezone.utc)
        self.lease = SchedulerLease(self.peers.store, ttl_s=self.settings.lease.ttl_s, clock=self.clock)
        self._stop = threading.Event()
        self._renewal_stop = threading.Event()
        self._leader_lock = threading.Lock()
        self._was_leader: bool | None = None  # None: no tick yet
        self._started = False
        self._started_at = self.clock()
        self._last_tick_end: datetime | None = None
        self._last_tick_start: datetime | None = None
        self._last_ok: datetime | None = None  # last tick in which every source answered
        self._tick_error: tuple[str, datetime] | None = None  # (what failed, since when)
        self._degraded: dict[str, tuple[str, datetime]] = {}  # source -> (error, since when)
        self._reconciled = False
        self._last_report: tuple[RunReport, datetime] | None = None  # the last judged tick and when it ended
        self.socket_mode = None  # notify.socket_mode.SocketModeActions while slack.socket_mode is on and started
        self.verdict_api = VerdictApi(self.settings.api, self.peers.store, self.last_report, self.clock,
                                      stale_after_s=self.liveness_limit_s(),
                                      opt_in=(self.settings.act.opt_in_tag, self.settings.act.opt_in_value))

    def last_report(self) -> tuple[RunReport | None, datetime | None]:
        """The last tick that judged (RunReport) and when it finished; (None, None) before the first."""
        return self._last_report if self._last_report is not None else (None, None)

    def liveness_limit_s(self) -> float:
        return max(LIVENESS_PERIODS * self.settings.schedule.evaluate_every_s, LIVENESS_FLOOR_S)

    # ------------------------------------------------------------------ leadership
    def lead(self) -> tuple[bool, str | None]:
        """Take or renew the lease: (leader?, the database error when it could not be asked)."""
        try:
            leader, error = self.lease.try_acquire(), None
        except SQLAlchemyError as exc:  # database down: not the leader, and say so
            leader, error = False, str(exc)
        self.note_leadership(leader)
        return leader, error

    def note_leadership(self, leader: bool) -> None:
        """Log a change of leadership once, and keep the gauges current."""
        with self._leader_lock:
            was, self._was_leader = self._was_leader, leader
            self.metrics.leader.set(1 if leader else 0)
            self.metrics.lease_token.set(self.lease.token or 0)
            if leader and not was:
                self._reconciled = False  # the previous leader may have left stop intents to settle
                log.info("became leader, token %s (%s)", self.lease.token, self.lease.holder_id)
            elif not leader and was is not False:
                holder = self.current_holder()
                if was:
                    log.warning("lost the lease to %s; judging read-only until it expires", holder)
                else:
                    log.warning("standby: the lease is held by %s; judging read-only", holder)

    def current_holder(self) -> str:
        try:
            row = read_lease(self.peers.store)
        except SQLAlchemyError as exc:
            return f"unknown (database: {exc})"
        return "nobody" if row is None else f"{row.holder} (token {row.token})"

    def keep_lease(self) -> None:
        """Background renewal every ttl/3, so a tick longer than the TTL keeps the lease. A wedged
        scheduler (no tick finished within the liveness limit) stops renewing and lets a standby lead."""
        every = self.settings.lease.ttl_s / 3
        while not self._renewal_stop.wait(every):
            if not self.lease.held:
                continue
            live, why = self.live()
            if not live:
                log.error("not renewing the lease: %s", why.strip())
                continue
            try:
                renewed = self.lease.renew()
            except SQLAlchemyError as exc:
                log.error("lease renewal failed: %s", exc)
                renewed = False
            if not renewed:
                self.note_leadership(False)

    def leader_only(self, name: str, fn: Callable[[], object]) -> Callable[[], object]:
        """A scheduled job that runs only on the leader (budgets, digest, monthly report)."""
        def run():
            try:
                self.lease.check()
            except LeaseLost as exc:
                log.info("job %s skipped on this standby: %s", name, exc)
                return None
            result = fn()
            if name == BUDGETS_JOB:
                self.metrics.fleet.note_budgets(result)
            elif name == SAVINGS_JOB:
                self.metrics.fleet.note_savings(result, self.clock())
            return result
        return run

    # ------------------------------------------------------------------ the tick
    def reconcile(self) -> bool:
        """Settle stop intents left by a crash; retried before every run until it succeeds."""
        if self._reconciled:
            return True
        try:
            notes = Actuator(self.peers.cloud, self.peers.store, self.peers.notifier, self.settings).reconcile(
                self.clock(), lease=self.lease)  # fenced: a leader replaced meanwhile settles nothing
        except Exception as exc:  # a region down at start must not crash the service
            log.error("reconcile after restart failed, retrying next run: %s", exc)
            return False
        for n in notes:
            log.warning(n)
        self._reconciled = True
        return True

    def evaluate_job(self) -> RunReport | None:
        try:
            report = self.tick()
        except Exception as exc:
            self.finish_tick(None, f"{type(exc).__name__}: {exc}")
            raise
        if report is None:
            # Acting with unsettled intents could repeat a stop: judge nothing this run.
            self.finish_tick(None, "reconcile of earlier stop intents failed; nothing judged")
        else:
            self.finish_tick(report, "; ".join(report.errors) or None)
        return report

    def tick(self) -> RunReport | None:
        leader, lease_error = self.lead()
        if leader and not self.reconcile():
            return None
        # Rules are re-read every run so an edited rule file applies without a restart;
        # a broken edit keeps the service up and is reported as an error.
        rules = load_rules(self.settings.rules_paths)
        ctx = RunContext(now=self.clock(), dry_run=self.settings.act.dry_run, lease=self.lease)
        self.note_clock(ctx.now)
        t0 = time.perf_counter()
        # A standby judges read-only and records nothing, so the audit log holds each tick once.
        report = run_once(ctx, self.settings, rules, self.peers, act=leader, record=leader)
        if lease_error and report.sources.get("database") is None:
            report.sources["database"] = f"scheduler lease: {lease_error}"
        seconds = time.perf_counter() - t0
        if leader:
            # Month figures read the store: on a database that failed this tick they are left out (logged).
            figures = FleetFigures.from_report(report, None if report.sources.get("database") else self.peers.store,
                                               max_gap_s=2 * self.settings.schedule.evaluate_every_s)
            cluster = workload_cloud_of(self.peers.cloud)
            if cluster is not None and cluster.listed_ok and cluster.last_snapshot is not None:  # a failed read: none
                figures.note_cluster(cluster.last_snapshot, cluster.hourly_shares)
            self.metrics.observe(report, seconds, figures)
        else:
            # Fleet series come from the leader only: a standby's would double every fleet sum in Grafana.
            self.metrics.observe(report, seconds, FleetFigures())
            self.metrics.fleet.standby()
        role = f"leader token {self.lease.token}" if leader else "standby, read-only"
        # What changed something (a mark, a notice, a stop...): a skip repeated every tick (idle but protected,
        # snoozed) changes nothing, and counting it read as "2 actions" each minute while nothing happened.
        changes = sum(a.kind is not ActionKind.SKIP for a in report.actions)
        log.info("run %s [%s]: %d instances, verdicts %s, %d change(s)%s%s", ctx.run_id, role, len(report.instances),
                 report.verdict_counts(), changes, " [dry-run]" if ctx.dry_run else "",
                 "".join(f"; {s} degraded: {e}" for s, e in report.degraded().items()))
        return report

    def note_clock(self, now: datetime) -> None:
        """A clock that steps back (NTP, a VM restored) is said: times in the audit log go out of order.
        Nothing else depends on it: leads count from stored times, which only a later tick reaches."""
        last = self._last_tick_start
        if last is not None and now < last:
            log.warning("system clock went back %.0f s since the last tick (%s -> %s)",
                        (last - now).total_seconds(), last.isoformat(), now.isoformat())
            self.metrics.clock_steps_back.inc()
        self._last_tick_start = now

    def finish_tick(self, report: RunReport | None, error: str | None) -> None:
        now = self.clock()
        self._last_tick_end = now
        if report is None:
            self.metrics.errors.inc()
        else:
            self._last_report = (report, now)
            self._degraded = track_degraded(self._degraded, report.sources, now)
            if error is None and not report.degraded():
                self._last_ok = now
        if error is None:
            self._tick_error = None
        elif self._tick_error is None or self._tick_error[0] != error:
            self._tick_error = (error, self._tick_error[1] if self._tick_error else now)

    # ------------------------------------------------------------------ probes
    def live(self) -> tuple[bool, str]:
        """Liveness: the scheduler runs and its last tick finished recently (failed ticks count: a
        restart does not cure an outage, it only helps a wedged process)."""
        if self._started and not self.scheduler.running:
            return False, "scheduler is not running\n"
        limit = self.liveness_limit_s()
        ref = self._last_tick_end or self._started_at
        age = (self.clock() - ref).total_seconds()
        if age > limit:
            return False, f"no evaluation tick finished for {age:.0f}s (limit {limit}s)\n"
        last = self._last_tick_end.isoformat() if self._last_tick_end else "none yet"
        return True, f"ok; last tick finished {last}; {self.role()}\n"

    healthy = live  # /healthz, the old name of liveness

    def ready(self) -> tuple[bool, str]:
        """Readiness: live, the last tick succeeded and every data source answered it."""
        live, why = self.live()
        if not live:
            return False, f"not ready: {why}"
        if self._last_tick_end is None:
            return False, f"not ready: no evaluation tick finished yet; {self.role()}\n"
        problems = [f"{source}: degraded since {since.isoformat()}: {error}"
                    for source, (error, since) in sorted(self._degraded.items())]
        if self._tick_error is not None:
            problems.insert(0, f"evaluation: failing since {self._tick_error[1].isoformat()}: {self._tick_error[0]}")
        if problems:
            return False, "not ready\n" + "".join(f"{p}\n" for p in problems)
        return True, (f"ready; {self.role()}; {', '.join(sources_of(self.settings))} answered; "
                      f"last tick finished {self._last_tick_end.isoformat()}\n")

    def role(self) -> str:
        token = self.lease.token
        return f"leader (lease token {token})" if token is not None else "standby (read-only)"

    def _on_job_event(self, event: JobExecutionEvent) -> None:
        if event.exception is not None:
            if event.job_id != EVALUATE_JOB:  # evaluate_job counts its own failures
                self.metrics.errors.inc()
            log.error("job %s failed: %r", event.job_id, event.exception)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        common = dict(coalesce=True, max_instances=1, misfire_grace_time=self.settings.schedule.misfire_grace_s)
        # The first tick runs now: it takes the lease if free and, only when leader, reconciles.
        self.scheduler.add_job(self.evaluate_job, "interval", seconds=self.settings.schedule.evaluate_every_s,
                               id=EVALUATE_JOB, next_run_time=datetime.now(timezone.utc), **common)
        for name, trigger, fn in self.extra_jobs:
            self.scheduler.add_job(self.leader_only(name, fn), id=name, **trigger, **common)
        self.scheduler.add_listener(self._on_job_event, EVENT_JOB_ERROR | EVENT_JOB_EXECUTED)
        self.scheduler.start()
        self._started = True
        threading.Thread(target=self.keep_lease, name="lease-renewal", daemon=True).start()
        self.start_socket_mode()

    def start_socket_mode(self) -> None:
        """Slack Socket Mode (slack.socket_mode): clicks over a WebSocket this replica opens, as on every replica
        POST /slack/actions answers them; no public URL needed."""
        if not self.settings.slack.socket_mode or self.socket_mode is not None:
            return
        self.socket_mode = SocketModeActions(self.settings.slack, self.slack_socket_click)
        if not self.socket_mode.start():
            self.socket_mode = None

    def stop(self) -> None:
        # wait=True: a running evaluation finishes (and records what it did) before we exit.
        self.scheduler.shutdown(wait=True)
        if self.socket_mode is not None:
            self.socket_mode.stop()
            self.socket_mode = None
        self._renewal_stop.set()
        self._stop.set()
        if self.lease.held:
            try:
                self.lease.release()  # a standby takes over at its next tick instead of after the TTL
                log.info("released the scheduler lease")
            except SQLAlchemyError as exc:
                log.error("could not release the lease (it expires in %ss): %s", self.settings.lease.ttl_s, exc)

    def slack_actions(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        """POST /slack/actions: a button click, verified and stored as a request (gpufinops.interact); the
        leader's next tick applies it. Any replica answers it: no cloud change is made here."""
        chat = deliveries(self.peers.notifier, self.settings)
        answer = handle_click(headers, body, settings=self.settings, store=self.peers.store, cloud=self.peers.cloud,
                              users=chat.user_info, now=self.clock())
        self._tell_clicker(chat, answer)
        return answer.status, answer.text

    def slack_socket_click(self, envelope_id: Any, payload: Any) -> Answer:
        """An `interactive` envelope of Slack Socket Mode: the same parse, claim, authorisation and stored request
        as slack_actions (gpufinops.interact.handle_verified), and the same private answer to a refused click."""
        chat = deliveries(self.peers.notifier, self.settings)
        answer = handle_socket_envelope(envelope_id, payload, settings=self.settings, store=self.peers.store,
                                        cloud=self.peers.cloud, users=chat.user_info, now=self.clock())
        self._tell_clicker(chat, answer)
        return answer

    @staticmethod
    def _tell_clicker(chat, answer) -> None:
        """A refused or failed click is told to its clicker alone (chat.postEphemeral), whichever transport it
        came by: Slack shows nothing of an HTTP 403's text, and a Socket Mode ack has no answer at all."""
        if answer.tell is not None:
            channel_id, user_id = answer.tell
            chat.tell_privately(channel_id, user_id, answer.text[:1].upper() + answer.text[1:] + ".")

    def mutual_tls_server(self) -> ThreadingHTTPServer | None:
        """The idleness API's mutual-TLS listener when `api.tls` is set (not yet serving), else None."""
        tls = self.settings.api.tls
        if tls is None:
            return None
        return mutual_tls_server(self.settings.service.host, tls.port, {VERDICTS_PATH: self.verdict_api.handle_mutual_tls},
                                 mutual_tls_context(tls.cert_file, tls.key_file, tls.client_ca_file))

    def serve_forever(self) -> None:
        api = self.verdict_api.handle if self.settings.api.enabled else None
        http = make_http_server(self.settings, self.metrics, self.live, self.ready, self.slack_actions, api)
        threading.Thread(target=http.serve_forever, name="http", daemon=True).start()
        access = ("off" if api is None else "bearer token" if self.settings.api.bearer_token.resolve()
                  else "loopback clients only, no token set")
        log.info("serving /metrics, /livez (/healthz), /readyz and %s (%s) on %s:%d as %s", VERDICTS_PATH, access,
                 self.settings.service.host, http.server_address[1], self.lease.holder_id)
        https = self.mutual_tls_server() if api is not None else None
        if https is not None:
            threading.Thread(target=https.serve_forever, name="https-api", daemon=True).start()
            log.info("serving %s over mutual TLS on %s:%d (client certificates of %s)", VERDICTS_PATH,
                     self.settings.service.host, https.server_address[1], self.settings.api.tls.client_ca_file)

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %d: stopping after the current job", signum)
            self._stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        self._stop.wait()
        self.stop()
        http.shutdown()
        if https is not None:
            https.shutdown()
        log.info("stopped cleanly")


def track_degraded(before: dict[str, tuple[str, datetime]], sources: dict[str, str | None],
                   now: datetime) -> dict[str, tuple[str, datetime]]:
    """Which sources are degraded after this tick, each with the time it first failed in this outage."""
    return {source: (error, before[source][1] if source in before else now)
            for source, error in sources.items() if error is not None}
