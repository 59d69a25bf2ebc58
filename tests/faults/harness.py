"""The fault matrix' world and its one invariant checker.

One Prometheus for the whole folder holds a few DCGM "profiles", each for a fixed private IP
(idle, busy, raw sentinel, out of range, no series). A case launches its fleet in moto at those
IPs (moto is reset between cases, so ids are new every case) and the collector matches the series
by the `Hostname` label = private IP. The service runs in-process: `Service.evaluate_job()` (what
the scheduler calls: reconcile on start, run_once, metrics) on a simulated clock, with every peer
behind a `FaultProxy`.

`check_invariants(world, signal)` is the matrix' contract; every case ends with it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from slack_sdk.http_retry.builtin_interval_calculators import (
    FixedValueRetryIntervalCalculator,
)

from gpufinops.places.ec2.cloud import Ec2Cloud
from gpufinops.collect.prometheus import PrometheusMetrics
from gpufinops.config import load_settings
from gpufinops.model import TAG_MARKED, ActionKind
from gpufinops.notify.delivery import OutboxNotifier, SlackNotifier, read_outbox
from gpufinops.run.pipeline import Peers, RunReport
from gpufinops.run.service import Service
from gpufinops.store.store import Store
from tests.faults.faultproxy import DCGM_SENTINEL, FaultProxy
from tests.promserver import Series, dcgm_labels

log = logging.getLogger("tests.faults")

STEP_S = 15  # the profiles' scrape interval
WINDOW_S = 60
LEAD_S = 300  # in-process rule: warn, then stop 5 minutes later (simulated)
STOPPED_STATES = ("stopping", "stopped", "shutting-down", "terminated")
OPT_IN_TAG = "gpufinops:allow-stop"
IAM_POLICIES = [Path(__file__).resolve().parents[2] / "deploy" / name
                for name in ("iam-policy.json", "iam-policy-terminate.json")]

# Private IP -> (GPU_UTIL pattern, FB_USED MiB). None: no series at all.
PROFILES: dict[str, tuple[list[float], float] | None] = {
    "idle": ([0, 2, 1, 0], 20_000.0),
    "idle2": ([1, 0, 3, 0], 18_000.0),
    "idle3": ([0, 0, 1, 2], 10_000.0),
    "busy": ([90, 97, 95, 99], 15_000.0),
    "sentinel": ([0, 1, float(DCGM_SENTINEL), 0], 20_000.0),  # one raw DCGM "not available" sample per minute
    "out_of_range": ([0, 1, 250.0, 0], 20_000.0),  # 250% utilization: not a measurement
    "nodata": None,
}
IPS = {name: f"10.0.0.{10 + k}" for k, name in enumerate(PROFILES)}


def profile_series(start: float, end: float, step: int = STEP_S) -> list[Series]:
    """Every profile's DCGM series over [start, end), each matched by Hostname = its IP."""
    out = []
    for name, profile in PROFILES.items():
        if profile is None:
            continue
        util, fb = profile
        labels = dcgm_labels(IPS[name], 0, model="NVIDIA A10G")
        ts = list(range(int(start), int(end), step))
        out.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, float(util[k % len(util)])) for k, t in enumerate(ts)]))
        out.append(Series("DCGM_FI_DEV_FB_USED", labels, [(t, fb) for t in ts]))
        # An A10G (TDP 150 W) at idle draws ~20 W; an idle power this low lets the power witness agree.
        out.append(Series("DCGM_FI_DEV_POWER_USAGE", labels, [(t, 20.0) for t in ts]))
    return out


def write_rules(folder: Path, *, window_s: int, lead_s: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "faults.yaml").write_text(
        "rules:\n"
        "  - name: faults-idle\n"
        "    threshold_pct: 40\n"
        f"    window: {window_s}s\n"
        "    aggregation: stays_below\n"
        "    min_coverage: 0.5\n"
        f"    warning_lead: {lead_s}s\n"
        "    action: stop\n"
        "    notify_to: ['slack:#gpu-finops']\n"
    )
    return folder


# --------------------------------------------------------------------------- signals


@dataclass(frozen=True)
class Signal:
    """What a person would see of the fault: a log line, a metric, an alert or a run error."""

    kind: str  # log | alert | metric | run_error
    pattern: str = ""
    count: int | None = None  # alert: exactly this many delivered messages
    level: int = logging.WARNING  # log: the lowest level that counts

    def describe(self) -> str:
        return f"{self.kind}({self.pattern!r}{'' if self.count is None else f', x{self.count}'})"


def log_line(pattern: str, level: int = logging.WARNING) -> Signal:
    return Signal("log", pattern, level=level)


def alert(pattern: str, count: int = 1) -> Signal:
    return Signal("alert", pattern, count)


def metric(name: str) -> Signal:
    return Signal("metric", name)


def run_error(pattern: str = "") -> Signal:
    return Signal("run_error", pattern)


METRICS_ALERT = "No usable GPU metrics"


# --------------------------------------------------------------------------- the world


@dataclass
class Tick:
    index: int
    now: datetime
    true_s: float  # seconds that really passed since t0 (differs from `now` only when the clock jumps)
    slack_from: int  # index into stub.calls at the start of the tick
    slack_to: int = 0
    ec2_from: int = 0  # index into the EC2 proxy's forwarded list
    ec2_to: int = 0
    report: RunReport | None = None
    error: str | None = None


class World:
    """One case: a fleet in moto, every peer behind a fault proxy, the service on a simulated clock."""

    def __init__(self, *, aws, prom_url: str, slack_stub, tmp_path: Path, monkeypatch, caplog, rules_dir: Path,
                 fleet: dict[str, dict] | None = None, token: bool = True, lead_s: int = LEAD_S,
                 prom_timeout_s: float = 3.0, slack_timeout_s: float = 2.0, ec2_read_timeout_s: float = 2.0,
                 db_dir: Path | None = None, dry_run: bool = False):
        self.aws = aws
        self.stub = slack_stub
        self.tmp_path = tmp_path
        self.caplog = caplog
        self.lead_s = lead_s
        self.slack_timeout_s = slack_timeout_s
        self.ec2_read_timeout_s = ec2_read_timeout_s
        caplog.set_level(logging.INFO)
        stub_root = slack_stub.base_url.rstrip("/").rsplit("/api", 1)[0]
        self.prom = FaultProxy(prom_url, "prometheus").start()
        self.ec2 = FaultProxy(aws.endpoint_url, "moto").start()
        # moto does not evaluate IAM: the proxy evaluates the policies users deploy, at the moment a request
        # reaches AWS (after any delay), with the instance's tags then.
        self.ec2.enforce_iam(*IAM_POLICIES)
        self.slack = FaultProxy(stub_root, "slack").start()
        self.proxies = (self.prom, self.ec2, self.slack)
        if token:
            monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-fault-matrix")
        else:
            monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
        # Launched directly in moto (not through the proxy): the fleet is the test's, not the service's.
        fleet = fleet if fleet is not None else {"idle": {}, "busy": {}}
        self.ids: dict[str, str] = {}
        self.stoppable: set[str] = set()
        # Instances a person started again after gpufinops stopped them: running, with a done stop row.
        self.restarted_by_person: set[str] = set()
        for name, spec in fleet.items():
            profile = spec.get("profile", name)
            # Opted in (the tag the IAM policy and act.opt_in_tag name), unless the case's tags say otherwise.
            iid = aws.launch("g5.xlarge", tags={"team": "ml", "owner": "ana", OPT_IN_TAG: "true",
                                                **spec.get("tags", {})},
                             spot=spec.get("spot", False), private_ip=IPS[profile])[0]
            self.ids[name] = iid
            if spec.get("stoppable", profile.startswith("idle") and not spec.get("tags") and not spec.get("spot")):
                self.stoppable.add(iid)
        self.t0 = datetime.now(UTC).replace(microsecond=0)
        self.settings = load_settings(
            prometheus={"url": self.prom.url, "scrape_interval_s": STEP_S, "timeout_s": prom_timeout_s},
            aws={"regions": ["us-east-1"], "endpoint_url": self.ec2.url},
            slack={"base_url": self.slack.url + "/api/", "default_channel": "#gpu-finops", "max_retries": 1,
                   "retry_backoff_s": 60, "retry_max_backoff_s": 600,
                   "outbox_path": str(tmp_path / "outbox.jsonl")},
            act={"dry_run": dry_run, "max_stops_per_run": 5, "max_stops_fraction": 1.0},
            schedule={"evaluate_every_s": 60},
            database_url=f"sqlite:///{(db_dir or tmp_path) / 'gpufinops.db'}",
            rules_paths=[str(rules_dir)],
        )
        self.now = self.t0
        self.ticks: list[Tick] = []
        self.services: list[Service] = []
        self.heal_hooks: list[Callable[[], None]] = []
        self.restart()

    # ------------------------------------------------------------------ the service
    def clock(self) -> datetime:
        return self.now

    def restart(self) -> Service:
        """A new process over the same database: new store, peers and service (it reconciles on its first run).

        A clean restart, as after SIGTERM: the old service gives its scheduler lease back (a crashed
        one would hold it for the TTL; the process cases test that)."""
        old = getattr(self, "service", None)
        if old is not None and old.lease.held:
            try:
                old.lease.release()
            except Exception as exc:  # noqa: BLE001 - the database may be the fault; the lease then expires
                log.warning("old service could not release its lease: %s", exc)
        self.store = Store(self.settings.database_url)
        cloud = Ec2Cloud(self.settings.aws, spot_prices=False, clock=self.clock, max_attempts=3,
                         connect_timeout_s=1.0, read_timeout_s=self.ec2_read_timeout_s)
        metrics = PrometheusMetrics(self.settings.prometheus)
        if self.settings.slack.token.resolve():
            notifier = SlackNotifier(self.settings.slack, self.store, self.clock, timeout_s=self.slack_timeout_s,
                                     retry_interval=FixedValueRetryIntervalCalculator(0.05))
        else:
            notifier = OutboxNotifier(self.settings.slack, self.store, self.clock)
        self.peers = Peers(cloud, metrics, self.store, notifier)
        self.service = Service(self.settings, self.peers, clock=self.clock)
        self.services.append(self.service)
        return self.service

    def tick(self, minutes: float, *, true_minutes: float | None = None) -> RunReport | None:
        """One scheduled run at t0 + `minutes` on the service's clock (`true_minutes`: what really passed)."""
        self.now = self.t0 + timedelta(minutes=minutes)
        true_s = 60.0 * (minutes if true_minutes is None else true_minutes)
        t = Tick(len(self.ticks), self.now, true_s, len(self.stub.calls), ec2_from=len(self.ec2.forwarded))
        self.ticks.append(t)
        try:
            t.report = self.service.evaluate_job()
        except Exception as exc:  # noqa: BLE001 - as APScheduler does with a failing job: log, count, go on
            t.error = f"{type(exc).__name__}: {exc}"
            log.error("evaluation job failed: %s", t.error)
        t.slack_to, t.ec2_to = len(self.stub.calls), len(self.ec2.forwarded)
        return t.report

    def run(self, *minutes: float) -> None:
        for m in minutes:
            self.tick(m)

    def heal(self) -> None:
        for p in self.proxies:
            p.clear()
        while self.heal_hooks:
            self.heal_hooks.pop()()

    def stop_proxies(self) -> None:
        for p in self.proxies:
            p.stop()

    # ------------------------------------------------------------------ what happened
    def tick_of_slack_call(self, index: int) -> Tick | None:
        return next((t for t in self.ticks if t.slack_from <= index < t.slack_to), None)

    def tick_of_ec2_call(self, index: int) -> Tick | None:
        return next((t for t in self.ticks if t.ec2_from <= index < t.ec2_to), None)

    def delivered_posts(self) -> list[tuple[int, dict]]:
        """(stub call index, body) of every chat.postMessage Slack accepted."""
        return [(k, c.body) for k, c in enumerate(list(self.stub.calls))
                if c.method == "chat.postMessage" and c.ok]

    def delivered(self) -> list[Delivered]:
        """Every message a person could read: accepted by Slack, or written to the outbox (no token)."""
        def at(tick: Tick | None) -> float | None:
            return tick.true_s if tick is not None else None

        out = [Delivered(at(self.tick_of_slack_call(k)), b.get("text", ""), message_key(b))
               for k, b in self.delivered_posts()]
        by_now = {t.now.isoformat(): t for t in self.ticks}
        for line in read_outbox(self.settings.slack.outbox_path):
            out.append(Delivered(at(by_now.get(line.get("at", ""))), line.get("text", ""), line.get("key")))
        return out

    def stop_time(self, iid: str) -> float | None:
        """When (true seconds) the first StopInstances/TerminateInstances for `iid` reached moto."""
        first = next((k for k, f in enumerate(self.ec2.forwarded)
                      if f.request.aws_action in ("StopInstances", "TerminateInstances")
                      and iid in f.request.instance_ids), None)
        tick = self.tick_of_ec2_call(first) if first is not None else None
        return tick.true_s if tick is not None else None

    def recover(self) -> list[str]:
        """Heal every fault, restart the service and let it run once more; what went wrong, if anything."""
        self.heal()
        last = self.ticks[-1] if self.ticks else None
        minutes = (last.now - self.t0).total_seconds() / 60 + 1 if last else 1
        true_minutes = (last.true_s / 60 + 1) if last else minutes
        self.restart()
        recovery = self.tick(minutes, true_minutes=true_minutes)
        if recovery is None:
            return [f"service did not recover: the run after healing failed: {self.ticks[-1].error}"]
        if recovery.errors:
            return [f"the run after healing reported errors: {recovery.errors}"]
        return []

    def signal_seen(self, signal: Signal) -> bool:
        if signal.kind == "alert":
            return sum(signal.pattern in m.text for m in self.delivered()) == signal.count
        if signal.kind == "log":
            rx = re.compile(signal.pattern, re.IGNORECASE)
            return any(r.levelno >= signal.level and rx.search(r.getMessage()) for r in self.caplog.records)
        if signal.kind == "metric":
            return any((s.metrics.registry.get_sample_value(signal.pattern) or 0) > 0 for s in self.services)
        if signal.kind == "run_error":
            return any(t.error and signal.pattern in t.error for t in self.ticks) or any(
                t.report is not None and any(signal.pattern in e for e in report_errors(t.report)) for t in self.ticks)
        raise ValueError(signal.kind)

    def cloud_state(self) -> dict[str, tuple[str, dict[str, str]]]:
        """Real state and tags of every instance of the fleet, read from moto directly."""
        res = self.aws.client("ec2").describe_instances(InstanceIds=list(self.ids.values()))
        return {i["InstanceId"]: (i["State"]["Name"], {t["Key"]: t["Value"] for t in i.get("Tags", [])})
                for r in res["Reservations"] for i in r["Instances"]}


@dataclass(frozen=True)
class Delivered:
    at: float | None  # true seconds since the case began (None: not placed on the timeline)
    text: str
    key: str | None


def report_errors(report) -> list[str]:
    """A run's errors and its degraded data sources, as text."""
    degraded = report.degraded() if hasattr(report, "degraded") else {}
    return list(report.errors) + [f"{name}: {err}" for name, err in degraded.items()]


def message_key(body: dict) -> str | None:
    meta = body.get("metadata")
    if isinstance(meta, str):
        import json

        try:
            meta = json.loads(meta)
        except ValueError:
            return None
    if not isinstance(meta, dict) or meta.get("event_type") != "gpufinops_notification":
        return None
    key = (meta.get("event_payload") or {}).get("key")
    return key if isinstance(key, str) and key else None


def is_warning_for(text: str, iid: str) -> bool:
    lowered = text.lower()
    return (iid in text and "will be stopped" in lowered.replace("nothing will be stopped", "")
            and "dry-run" not in lowered)


def is_stopped_notice_for(text: str, iid: str) -> bool:
    return iid in text and text.startswith("Stopped")


# --------------------------------------------------------------------------- the invariants


def check_invariants(world, *signals: Signal) -> None:
    """The matrix' contract, checked after the fault is healed and the service ran once more.

    1. no wrong stop: only the idle, unmanaged, on-demand instances may be stopped;
    2. no stop without a delivered warning and its full lead time (on the real timeline), and each
       stop announced ("Stopped" notice delivered);
    3. at most one StopInstances per instance reached moto (counted at the proxy);
    4. records equal the cloud: a done stop row <=> stopped in moto; no row left pending; a mark
       row <=> the marked-for-stop tag;
    5. no duplicate Slack message per idempotency key (counted at the stub), every message keyed;
    6. the service still runs: the run after healing finishes without error (a process: is alive);
    7. one visible signal of the fault (any of `signals`: log line, metric, alert, run error).
    All violations are reported together. `world` is a World (in-process) or a ServeWorld (processes):
    both give ids, stoppable, lead_s, ec2 (the proxy), store, cloud_state(), delivered(), stop_time(),
    recover() and signal_seen().
    """
    problems: list[str] = []
    # 7 is judged on what the fault produced, before the recovery run adds anything.
    if signals and not any(world.signal_seen(s) for s in signals):
        problems.append("no visible signal: expected one of " + ", ".join(s.describe() for s in signals))
    # 6. the service still runs (after healing)
    problems += world.recover()

    state = world.cloud_state()
    stops = world.ec2.stops_reached()
    posts = world.delivered()
    name_of = {iid: name for name, iid in world.ids.items()}
    stopped = {iid for iid, (s, _) in state.items() if s in STOPPED_STATES} | {i for i, n in stops.items() if n}

    for iid in sorted(stopped):
        who = f"{name_of.get(iid, '?')} {iid}"
        # 1. no wrong stop
        if iid not in world.stoppable:
            problems.append(f"wrong stop: {who} is busy, unknown or managed and was stopped")
        # 3. one StopInstances per intent
        if stops.get(iid, 0) > 1:
            problems.append(f"{stops[iid]} StopInstances reached moto for {who}")
        # 2. a delivered warning and its full lead time before the (first) stop
        stopped_at = world.stop_time(iid)
        warned = [m.at for m in posts if m.at is not None and is_warning_for(m.text, iid)]
        if not warned:
            problems.append(f"stop without a delivered warning: {who}")
        elif stopped_at is not None and stopped_at - min(warned) < world.lead_s:
            problems.append(f"stop before the full lead: {who} warned at +{min(warned):.0f}s, "
                            f"stopped at +{stopped_at:.0f}s, lead {world.lead_s}s")
        if not any(is_stopped_notice_for(m.text, iid) for m in posts):
            problems.append(f"stop not announced: no delivered 'Stopped' notice for {who}")

    # 4. records equal the cloud
    rows = world.store.action_rows(kinds=[ActionKind.STOP, ActionKind.TERMINATE])
    pending = [r for r in world.store.action_rows() if r.status in ("pending", "unconfirmed")]
    for r in pending:
        problems.append(f"action row left pending after restart: {r.kind.value} {r.instance_id} ({r.reason})")
    restarted = getattr(world, "restarted_by_person", set())
    for iid, (s, tags) in state.items():
        who = f"{name_of.get(iid, '?')} {iid}"
        done = any(r.instance_id == iid and r.status == "done" and not r.dry_run for r in rows)
        if iid in restarted:
            if s in STOPPED_STATES or not done:
                problems.append(f"{who} was stopped once and started again by a person: expected running with "
                                f"its done stop row, found {s} and {'a' if done else 'no'} done row")
        elif (s in STOPPED_STATES) != done:
            problems.append(f"records differ from the cloud: {who} is {s} in EC2 but "
                            f"{'a' if done else 'no'} done stop row is recorded")
        has_mark = world.store.get_mark(iid) is not None
        if has_mark != (TAG_MARKED in tags):
            problems.append(f"records differ from the cloud: {who} mark row {'present' if has_mark else 'absent'}, "
                            f"tag {TAG_MARKED} {'present' if TAG_MARKED in tags else 'absent'}")

    # 5. exactly one delivered message per idempotency key
    seen: dict[str, int] = {}
    unkeyed = [m for m in posts if m.key is None]
    if unkeyed:
        problems.append(f"{len(unkeyed)} delivered message(s) without the idempotency key in metadata, e.g. "
                        f"{unkeyed[0].text[:80]!r}")
    for m in posts:
        if m.key is not None:
            seen[m.key] = seen.get(m.key, 0) + 1
    problems += [f"duplicate Slack message: key {key!r} delivered {n} times" for key, n in seen.items() if n > 1]

    assert not problems, "fault matrix invariants violated:\n  - " + "\n  - ".join(dict.fromkeys(problems))
