"""The thin driver around the pure parts: record each sample, judge the host, apply the machine's move.

`on_sample(snapshot | None, reason)` is the agent's hook after every sample attempt: it only writes rows (fast,
in the sampler's thread). `tick()` runs in the autostop thread every interval: it reads the window from SQLite,
calls `decide.evaluate` for each stop rule that selects this host, checks snooze and blocks, asks
`machine.next_move` what to do, does it (warn, cancel, hook + stop), and saves the state once, after acting.
One failing tick is logged and the next one runs: the loop never dies of a bug, and nothing is stopped by one.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Callable, Mapping, Protocol, Sequence

from ...prices.catalog import Catalog
from ...collect.gpu_snapshot import HostSnapshot
from ...decide.evaluate import evaluate
from ...prices.host_prices import HostPrice, HostPriceTable, host_price, is_estimate, no_price
from ...notify.messages import escape, host_keep_hint, idle_warning, mark_cancelled, stopped, warning_key
from ...model import Action, Decision, GpuInstance, Message, Notifier, ReasonCode, Rule, Verdict, format_money
from .buffer import RingBuffer, physical_gpus, rows_from_snapshot, window_usage
from .guards import boot_time, recent_input_sessions, running_allowlisted
from .hook import run_command
from .machine import AutostopState, Move, MoveKind, Observation, Phase, after_stop, next_move, stopping, when
from .settings import AutostopSettings, PriceSettings
from .snooze import read_snooze, snooze_command

log = logging.getLogger("gpufinops.autostop")

STATE_KEY = "autostop"
# /proc/stat's btime is "now - uptime", so it moves by a second or so (and with NTP steps): not a reboot.
BOOT_TIME_JITTER_S = 60


@dataclass(frozen=True)
class HostPaths:
    """Where the host's own records are; tests point them into tmp_path."""

    snooze: str = "/run/gpufinops/snooze-until"
    utmp: str = "/var/run/utmp"
    dev: str = "/dev"
    proc: str = "/proc"


@dataclass(frozen=True)
class LocalHost:
    """Who this machine is: its EC2 identity when IMDS answered, else its hostname."""

    instance_id: str
    hostname: str
    region: str = ""
    instance_type: str = ""
    on_ec2: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)


def host_instance(host: LocalHost, *, gpu_count: int, booted_at: float, gpu_model: str = "",
                  price: HostPrice | None = None) -> GpuInstance:
    """Pure: the host as the one GpuInstance that evaluate judges. Launched at boot: a machine a person just
    started is too young to judge until a full window has passed. `price`: its $/h (local_host_price), shown in
    the warnings, "(estimate)" when it is one."""
    return GpuInstance(
        instance_id=host.instance_id, instance_type=host.instance_type, region=host.region, state="running",
        launch_time=datetime.fromtimestamp(booted_at, timezone.utc), tags=dict(host.tags),
        # Off EC2 the host is a rented host's place (places.registry.RENTED_HOST): its notices say host.
        private_dns=host.hostname, gpu_count=gpu_count, provider="aws" if host.on_ec2 else "rented",
        gpu_model=gpu_model, hourly_cost=price.usd_per_hour if price else None,
        price_source=price.source if price else "",
    )


def local_host_price(hostname: str, gpu_names: Sequence[str], configured: PriceSettings | None,
                     catalog: Catalog | None, catalog_problem: str = "") -> HostPrice:
    """Pure: this host's $/h: the settings' `price:`, else the catalog estimate for the GPUs the agent read
    (`gpu_names`: one per physical GPU, as the driver names them). Mixed models are not estimated."""
    table = HostPriceTable(per_host={hostname.lower(): configured.usd_per_hour} if configured else {},
                           origin="the autostop settings (price:)")
    models = sorted(set(gpu_names))
    if configured is None and len(models) > 1:
        return no_price(f"GPUs of several models ({', '.join(models)}): no catalog estimate; set price: in the "
                        f"autostop settings")
    return host_price(hostname, models[0] if models else "", len(gpu_names), table, catalog,
                      catalog_problem=catalog_problem)


def stop_rules(rules: Sequence[Rule], inst: GpuInstance) -> list[Rule]:
    """The rules that may stop this host: action stop (terminate is acted on as a stop: the agent never
    destroys its own machine) and a selector that matches it. Notify-only rules are the central service's."""
    return [r for r in rules if r.action in (Action.STOP, Action.TERMINATE) and r.selector.matches(inst)]


def verdicts_since(before: Mapping[str, tuple[Verdict, float]], decisions: Sequence[Decision],
                   now: float) -> dict[str, tuple[Verdict, float]]:
    """Pure: rule -> (verdict, since when it has held), carried over while a rule's verdict stays the same.
    Since the agent started at the earliest: the ring buffer keeps samples, not past verdicts."""
    out = {}
    for d in decisions:
        verdict, since = before.get(d.rule_name, (None, now))
        out[d.rule_name] = (d.verdict, since if verdict is d.verdict else now)
    return out


class Stopper(Protocol):
    describe: str

    def stop(self): ...


class Announcer:
    """Tells the people concerned: `wall` to everyone logged in, Slack when a notifier is configured.
    Delivered when either one got it (wall exited 0, Slack said ok)."""

    def __init__(self, wall_argv: Sequence[str], slack: Notifier | None = None, *, timeout_s: float = 10.0):
        self.wall_argv = tuple(wall_argv)
        self.slack = slack
        self.timeout_s = timeout_s

    def tell(self, text: str, slack_message: Message | None = None) -> tuple[bool, str]:
        wall = run_command([*self.wall_argv, text], self.timeout_s, what="wall")
        said = [f"wall: {'ok' if wall.ok else wall.reason}"]
        slack_ok = False
        if self.slack is not None and slack_message is not None:
            try:
                slack_ok = self.slack.send(slack_message)
            except Exception as exc:  # noqa: BLE001 - a notifier bug must not hide the wall message's result
                log.error("Slack send of %s failed: %s", slack_message.key, exc)
            said.append(f"Slack: {'delivered' if slack_ok else 'not delivered'}")
        return wall.ok or slack_ok, ", ".join(said)


class AutostopLoop:
    def __init__(self, *, rules: Sequence[Rule], settings: AutostopSettings, buffer: RingBuffer, host: LocalHost,
                 stopper: Stopper | None, announcer: Announcer, interval_s: float, dry_run: bool = True,
                 paths: HostPaths = HostPaths(), clock: Callable[[], float] = time.time,
                 slack_channel: str = "", catalog: Catalog | None = None, catalog_problem: str = ""):
        self.rules = list(rules)
        self.settings = settings
        self.buffer = buffer
        self.host = host
        self.stopper = stopper
        self.announcer = announcer
        self.interval_s = interval_s
        # The service's flag (act.dry_run): nothing is run or stopped while it is true, or without a stop method.
        self.dry_run = dry_run or stopper is None
        self.paths = paths
        self.clock = clock
        self.slack_channel = slack_channel
        self.catalog = catalog  # for the price estimate when the settings give no price
        self.catalog_problem = catalog_problem
        self.gpu_names: tuple[str, ...] = ()  # the driver's name of each GPU, from the last good sample
        self.price: HostPrice | None = None  # as of the last judgement, for /metrics
        self._priced_names: tuple[str, ...] = ()
        self.longest_window_s = max((r.window_s for r in rules), default=3600)
        self.last_move: Move | None = None
        self.last_tick_at: float | None = None
        self.state = AutostopState()  # as of the last tick, for /metrics
        self.blocked = False
        # The last judgement, for the agent's GET /v1/verdict (agent/verdict_api.py): one decision per stop rule,
        # what keeps the host running (blocks, snooze), and since when each rule has held its verdict.
        self.decisions: tuple[Decision, ...] = ()
        self.keeping: tuple[str, ...] = ()
        self.verdict_since: dict[str, tuple[Verdict, float]] = {}
        self.tick_errors = 0
        self.outage = False  # the GPUs could not be read for unknown_grace or longer (logged once per outage)
        self._unreadable_since: float | None = None  # first tick of the current failed-read stretch
        self.sampled_once = False
        self._kept_logged_at: float | None = None
        self._undelivered_warning_at: float | None = None  # first try of a warning not delivered yet
        self._samples_since_prune = 0
        self._stop = threading.Event()
        self._sampled = threading.Event()

    @property
    def snooze_hint(self) -> str:
        """How a person keeps this host running, naming the snooze file this agent reads."""
        return f"to keep it running: {snooze_command(self.paths.snooze)}"

    @property
    def live(self) -> bool:
        """Not dry-run: warnings say "will be stopped" and the stop is made (gpufinops_autostop_live)."""
        return not self.dry_run

    # ------------------------------------------------------------------ the agent's hook

    def on_sample(self, snapshot: HostSnapshot | None, reason: str = "") -> None:
        """Called after every sample attempt (None + reason when the GPU could not be read)."""
        now = self.clock()
        self.buffer.add(rows_from_snapshot(snapshot, reason, now))
        if snapshot is not None and snapshot.gpus:
            self.gpu_names = tuple(g.name for g in snapshot.gpus)
        self.sampled_once = True
        self._samples_since_prune += 1
        if self._samples_since_prune >= 100:
            self._samples_since_prune = 0
            self.buffer.prune(now - self.longest_window_s - self.settings.keep_margin)
        self._sampled.set()

    # ------------------------------------------------------------------ one judgement

    def booted_at(self) -> float:
        return boot_time(self.paths.proc) or 0.0  # unreadable: judged as if up for long (the window still applies)

    def observe(self, now: float) -> tuple[Observation, GpuInstance, float]:
        booted = self.booted_at()
        rows = self.buffer.rows_since(max(booted, now - self.longest_window_s))
        names = self.gpu_names
        if self.price is None or names != self._priced_names:
            self.price = local_host_price(self.host.hostname, names, self.settings.price, self.catalog,
                                          self.catalog_problem)
            self._priced_names = names
        inst = host_instance(self.host, gpu_count=len(physical_gpus(rows)), booted_at=booted,
                             gpu_model=names[0] if len(set(names)) == 1 else "", price=self.price)
        rules = stop_rules(self.rules, inst)
        at = datetime.fromtimestamp(now, timezone.utc)
        decisions = tuple(
            evaluate(inst, window_usage(rows, instance_id=inst.instance_id, window_s=r.window_s,
                                        interval_s=self.interval_s, now=now, since=booted), r, at)
            for r in rules)
        blocks = (*recent_input_sessions(self.paths.utmp, self.paths.dev, self.paths.proc, now=now,
                                         within_s=self.settings.block_if_input_within),
                  *running_allowlisted(self.paths.proc, self.settings.block_processes))
        snooze = read_snooze(self.paths.snooze, at, self.settings.max_snooze)
        return (Observation(decisions, tuple(blocks), snooze.reason if snooze.active else "",
                            {r.name: r.warning_lead_s for r in rules}, self.settings.unknown_grace), inst, booted)

    def kept_running(self, now: float) -> tuple[str, ...]:
        """What keeps the host running right now (blocks, a snooze in force), read afresh."""
        blocks = (*recent_input_sessions(self.paths.utmp, self.paths.dev, self.paths.proc, now=now,
                                         within_s=self.settings.block_if_input_within),
                  *running_allowlisted(self.paths.proc, self.settings.block_processes))
        snooze = read_snooze(self.paths.snooze, datetime.fromtimestamp(now, timezone.utc), self.settings.max_snooze)
        return (*blocks, *((snooze.reason,) if snooze.active else ()))

    def tick(self) -> Move:
        now = self.clock()
        obs, inst, booted = self.observe(now)
        stored = state = AutostopState.from_json(self.buffer.load_state(STATE_KEY))
        if state.boot_time is None or abs(state.boot_time - booted) > BOOT_TIME_JITTER_S:
            if state.phase is not Phase.WATCHING:
                log.info("host booted again since the last state (%s): starting over", state.phase.value)
            state = AutostopState(boot_time=booted)
        if state.phase in (Phase.PENDING, Phase.HELD) and self.live and not state.live:
            # Switched from dry-run to live with a dry-run warning pending, or held after a dry-run "would stop":
            # neither counts for a real stop (the warning said "it will NOT be stopped"), and a dry-run hold must
            # not delay the first real warning by a rule window. One line says so; the real warning, with its full
            # lead, comes at this judgement when the host is still idle (as the service carries a dry-run mark over).
            what = "warning" if state.phase is Phase.PENDING else "would-stop"
            log.warning("autostop: switched from dry-run to live: the dry-run %s does not count; a real warning with "
                        "its full lead comes before any stop", what)
            state = AutostopState(boot_time=booted)
        move = next_move(state, obs, now)
        new_state = self._apply(move, state, inst, now)
        if new_state != stored:
            self.buffer.save_state(STATE_KEY, new_state.to_json())
        self.last_move, self.state, self.last_tick_at = move, new_state, now
        self.blocked = bool(obs.blocks or obs.snooze)
        self.verdict_since = verdicts_since(self.verdict_since, obs.decisions, now)
        self.decisions, self.keeping = obs.decisions, (*obs.blocks, *((obs.snooze,) if obs.snooze else ()))
        self._log_outage(obs.decisions, now)
        return move

    def _log_outage(self, decisions: Sequence[Decision], now: float) -> None:
        """One ERROR when the GPUs have been unreadable for unknown_grace (autostop is then blocked), one INFO when
        they are back. A shorter failed-read stretch is DEBUG only: a reader failing one read in five must not
        flood the log (a pending stop's blip has its one INFO line from the hold)."""
        if not self.sampled_once:
            return  # the agent has just started: no read has failed yet
        missing = next((d for d in decisions if d.code is ReasonCode.QUERY_ERROR), None)  # read failed or stale
        if missing is None:
            if self.outage:
                log.info("autostop: GPU data readable again")
            elif self._unreadable_since is not None:
                log.debug("autostop: GPU data readable again after a blip")
            self.outage, self._unreadable_since = False, None
            return
        if self._unreadable_since is None:
            self._unreadable_since = now
            log.debug("autostop: GPU read failed: %s", missing.reason)
        if not self.outage and now - self._unreadable_since >= self.settings.unknown_grace:
            log.error("autostop: GPU data missing since %s, no stop while it lasts: %s",
                      when(self._unreadable_since), missing.reason)
            self.outage = True

    # ------------------------------------------------------------------ acting on a move

    def _prefix(self) -> str:
        return "gpufinops autostop" + ("" if self.live else " [DRY-RUN]")

    def _apply(self, move: Move, state: AutostopState, inst: GpuInstance, now: float) -> AutostopState:
        kind = move.kind
        if kind is not MoveKind.WARN:
            self._undelivered_warning_at = None  # the episode that could not be warned about is over
        if kind is MoveKind.NONE:
            self._log_judgement(move, now)
            return move.next_state  # the same state, or a pending stop moved later after an UNKNOWN blip
        if kind is MoveKind.HOLD:
            # One INFO line per blip (when it starts), never a broadcast: the stop waits, silently.
            (log.info if state.unknown_since is None else log.debug)("autostop: %s", move.reason)
            return move.next_state
        if kind is MoveKind.MOVED:
            self._moved(move, inst)
            return move.next_state
        if kind is MoveKind.SETTLE:
            self._settle_interrupted(move, inst, now)
            return move.next_state
        if kind is MoveKind.RELEASE:
            log.info("autostop: %s", move.reason)
            return move.next_state
        if kind is MoveKind.WARN:
            return self._warn(move, state, inst, now)
        if kind is MoveKind.CANCEL:
            self._cancel(move, state, inst)
            return move.next_state
        return self._stop_now(move, move.next_state, inst, now)

    def _log_judgement(self, move: Move, now: float) -> None:
        """An idle host that is not stopped says why (blocked, snoozed, pending) at INFO: when that starts, then
        every 10 minutes while it lasts; everything else is DEBUG."""
        idle_but_kept = move.decision is not None and move.decision.verdict is Verdict.IDLE
        if idle_but_kept and (self._kept_logged_at is None or now - self._kept_logged_at >= 600):
            log.info("autostop: %s", move.reason)
            self._kept_logged_at = now
        else:
            log.debug("autostop: %s", move.reason)
        if not idle_but_kept:
            self._kept_logged_at = None

    def _warn(self, move: Move, state: AutostopState, inst: GpuInstance, now: float) -> AutostopState:
        deadline = move.next_state.deadline or now
        will = "will be stopped" if self.live else "would be stopped (dry-run: it will NOT be)"
        cost = "" if inst.hourly_cost is None else \
            f", costs {format_money(inst.hourly_cost, per='h', estimate=is_estimate(inst.price_source))},"
        text = (f"{self._prefix()}: this GPU server {inst.instance_id} is idle ({move.decision.reason}){cost} and "
                f"{will} at {when(deadline)} (in {(deadline - now) / 60:.0f} min) unless it becomes active; "
                f"{self.snooze_hint}")
        # A warning retried after a failed or lost delivery keeps its first key: the notifier sends a key once, so a
        # post that went through while its answer was lost is not posted again.
        first_try = self._undelivered_warning_at if self._undelivered_warning_at is not None else now
        at = datetime.fromtimestamp(first_try, timezone.utc)
        slack = idle_warning(inst, move.decision, marked_at=at, stop_at=datetime.fromtimestamp(deadline, timezone.utc),
                             channel=self.slack_channel, dry_run=not self.live, action=Action.STOP,
                             keep_hint=host_keep_hint(snooze_command(self.paths.snooze)))
        delivered, how = self.announcer.tell(text, slack)
        if not delivered:
            log.error("autostop: idle warning not delivered (%s): no stop timer started; retried next tick", how)
            self._undelivered_warning_at = first_try
            return state
        self._undelivered_warning_at = None
        log.warning("autostop: warned (%s): %s", how, move.reason)
        # The lead counts from the delivery (wall or Slack may have taken a while), never from before it.
        delivered_at = max(self.clock(), now)
        return replace(move.next_state, warned_at=delivered_at, live=self.live,
                       deadline=delivered_at + (deadline - now), told_stop_at=delivered_at + (deadline - now))

    def _cancel(self, move: Move, state: AutostopState, inst: GpuInstance) -> None:
        marked = datetime.fromtimestamp(state.warned_at or self.clock(), timezone.utc)
        text = f"{self._prefix()}: {move.reason} (server {inst.instance_id})"
        _delivered, how = self.announcer.tell(text, mark_cancelled(inst, reason=move.reason, marked_at=marked,
                                                                  channel=self.slack_channel))
        log.warning("autostop: %s (%s)", move.reason, how)

    def _moved(self, move: Move, inst: GpuInstance) -> None:
        """Said once per idle episode; a later stop than announced harms nobody, so an undelivered notice is only
        logged, never retried (the stop itself still waits for the moved time)."""
        text = f"{self._prefix()}: {move.reason} (server {inst.instance_id}); {self.snooze_hint}"
        warned = datetime.fromtimestamp(move.next_state.warned_at or self.clock(), timezone.utc)
        message = Message(f"autostop-moved:{inst.instance_id}:{int(warned.timestamp())}", self.slack_channel,
                          escape(f"{inst.instance_id}: {move.reason}"),
                          thread_key=warning_key(inst.instance_id, warned))  # a reply under its warning
        delivered, how = self.announcer.tell(text, message)
        (log.warning if delivered else log.error)("autostop: %s (%s)", move.reason, how)

    def _alert(self, inst: GpuInstance, text: str, now: float) -> None:
        key = f"autostop-alert:{inst.instance_id}:{int(now)}"
        message = Message(key, self.slack_channel, escape(f"{inst.instance_id}: {text}"))
        _delivered, how = self.announcer.tell(f"{self._prefix()}: {text}", message)
        log.error("autostop: %s (%s)", text, how)

    def _stop_now(self, move: Move, state: AutostopState, inst: GpuInstance, now: float) -> AutostopState:
        decision: Decision = move.decision
        hook = self.settings.pre_stop_hook
        if not self.live:
            would = f"dry-run: would run {' '.join(hook.argv)} and stop" if hook else "dry-run: would stop"
            how = self.stopper.describe if self.stopper else "no stop method configured"
            note = f"{would} ({how}) at {when(now)}: {move.reason}; NOT stopped"
            self.announcer.tell(f"{self._prefix()}: {note}", stopped(
                inst, decision, at=datetime.fromtimestamp(now, timezone.utc), channel=self.slack_channel,
                dry_run=True, action=Action.STOP))
            log.warning("autostop: %s", note)
            return after_stop(state, decision, note=note, now=now)
        if hook is not None:
            result = run_command(hook.argv, hook.timeout, what="pre-stop hook")
            if not result.ok:
                note = f"stop cancelled: {result.reason}"
                self._alert(inst, f"{note}; the server keeps running", now)
                return after_stop(state, decision, note=note, now=self.clock())
            log.info("autostop: %s", result.reason)
        kept = self.kept_running(self.clock())
        if kept:
            # The last look: a snooze or a person's session that came while the hook ran (or since the judgement)
            # wins up to the last second, as at the service (re-read right before StopInstances).
            note = f"stop cancelled at the last look before it: {'; '.join(kept)}"
            self._alert(inst, f"{note}; the server keeps running", now)
            return after_stop(state, decision, note=note, now=self.clock())
        # The intent first (its row and the STOPPING state, both committed), then the one request: a crash between
        # them leaves a record that a stop may have gone out, and the next run settles it instead of sending again.
        action_id = self.buffer.record_intent("stop", self.stopper.describe, move.reason, now)
        self.buffer.save_state(STATE_KEY, stopping(state, action_id).to_json())
        outcome = self.stopper.stop()
        status = "done" if outcome.ok else "unknown" if outcome.ok is None else "failed"
        self.buffer.settle(action_id, status, outcome.reason, self.clock())
        if outcome.ok is None:
            # One request per intent: not sent again (HELD for a window); if it went through, the host goes down.
            note = f"stop outcome unknown: {outcome.reason}"
            self._alert(inst, f"{note}; not tried again before a new warning", now)
            return after_stop(state, decision, note=note, now=self.clock())
        if not outcome.ok:
            note = f"stop failed: {outcome.reason}"
            self._alert(inst, f"{note}; the server keeps running", now)
            return after_stop(state, decision, note=note, now=self.clock())
        note = f"stopped by {self.stopper.describe} at {when(now)}: {move.reason}"
        self.announcer.tell(f"{self._prefix()}: {note}", stopped(
            inst, decision, at=datetime.fromtimestamp(now, timezone.utc), channel=self.slack_channel,
            dry_run=False, action=Action.STOP))
        log.warning("autostop: %s (%s)", note, outcome.reason)
        return after_stop(state, decision, note=note, now=now)

    def _settle_interrupted(self, move: Move, inst: GpuInstance, now: float) -> None:
        """An earlier run sent a stop and died before recording its answer; this run is on the same boot. Its
        intent rows are settled as unknown (never sent again) and the people who were warned are told once."""
        open_rows = self.buffer.actions(status="pending")
        for row in open_rows:
            self.buffer.settle(row.id, "unknown", "the agent stopped before this request's answer was recorded; "
                                                  "the host was still up on the same boot afterwards", now)
        sent = f" (its intent was written at {when(open_rows[-1].at)})" if open_rows else ""
        self._alert(inst, f"{move.reason}{sent}; the server keeps running", now)

    # ------------------------------------------------------------------ the thread

    def run_forever(self) -> None:
        """Tick after each sample, or every interval when none comes (a wedged sampler is then UNKNOWN)."""
        while not self._stop.is_set():
            self._sampled.wait(self.interval_s)
            self._sampled.clear()
            if self._stop.is_set():
                break
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - one failing tick never ends the loop, and never stops the host
                self.tick_errors += 1
                log.exception("autostop tick failed")

    def stop(self) -> None:
        self._stop.set()
        self._sampled.set()


class AutostopCollector:
    """prometheus_client collector for the agent's /metrics: what autostop is doing, read at scrape time."""

    def __init__(self, loop: AutostopLoop):
        self.loop = loop

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        loop = self.loop
        state = loop.state
        yield GaugeMetricFamily("gpufinops_autostop_live", "1 when autostop really stops this host, 0 in dry-run",
                                value=1.0 if loop.live else 0.0)
        phase = GaugeMetricFamily("gpufinops_autostop_phase", "Autostop state: watching, pending (warned, stop at "
                                  "the deadline) or held (after a stop attempt)", labels=["phase"])
        for p in Phase:
            phase.add_metric([p.value], 1.0 if state.phase is p else 0.0)
        yield phase
        if state.phase is Phase.PENDING and state.deadline is not None:
            yield GaugeMetricFamily("gpufinops_autostop_stop_at_timestamp_seconds",
                                    "Unix time of the pending stop (only while one is pending)", value=state.deadline)
        yield GaugeMetricFamily("gpufinops_autostop_blocked", "1 when the last judgement found a block or a snooze",
                                value=1.0 if loop.blocked else 0.0)
        if loop.last_tick_at is not None:
            yield GaugeMetricFamily("gpufinops_autostop_last_tick_timestamp_seconds",
                                    "Unix time of the last autostop judgement", value=loop.last_tick_at)
        price = loop.price
        if price is not None and price.usd_per_hour is not None:
            cost = GaugeMetricFamily("gpufinops_host_hourly_cost", "What this host costs an hour; source: host (the "
                                     "settings' price) or catalog_estimate (the GPU catalog, an estimate)",
                                     labels=["currency", "source"])
            cost.add_metric([price.currency, price.kind], price.usd_per_hour)
            yield cost
        yield CounterMetricFamily("gpufinops_autostop_tick_errors", "Autostop judgements that failed with an error",
                                  value=float(loop.tick_errors))


__all__ = ["AutostopLoop", "AutostopCollector", "Announcer", "HostPaths", "LocalHost", "host_instance",
           "local_host_price", "stop_rules"]
