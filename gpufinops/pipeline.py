"""One evaluation run: collect -> evaluate -> store -> act -> notify.

`run_once` is what the scheduler calls every minute, what `evaluate --once`
calls (with act=False) and what the demo calls on its simulated clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Sequence

from . import escalation, messages
from .act import Actuator
from .config import Settings
from .evaluate import evaluate_all
from .model import (
    ActionResult,
    Cloud,
    Decision,
    GpuInstance,
    InstanceUsage,
    MetricsSource,
    Notifier,
    Rule,
    RunContext,
    Verdict,
)
from .store import Store

log = logging.getLogger("gpufinops.pipeline")

KV_METRICS_EPISODE = "metrics_unavailable_since"


@dataclass
class Peers:
    cloud: Cloud
    metrics: MetricsSource
    store: Store
    notifier: Notifier
    # The learned policy's idle history (gpufinops.learned.IdleHistory), one per service; None: fixed rules only.
    learned: Any = None


@dataclass
class RunReport:
    run_id: str
    now: datetime
    dry_run: bool
    instances: list[GpuInstance] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    actions: list[ActionResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def verdict_counts(self) -> dict[str, int]:
        counts = {v.value: 0 for v in Verdict}
        for d in self.decisions:
            counts[d.verdict.value] += 1
        return counts


def collect_usage(metrics: MetricsSource, running: Sequence[GpuInstance], rules: Sequence[Rule],
                  now: datetime) -> dict[int, dict[str, InstanceUsage]]:
    """One collector call per distinct rule window: a fixed number of queries whatever the fleet size."""
    out: dict[int, dict[str, InstanceUsage]] = {}
    for window_s in sorted({r.window_s for r in rules}):
        try:
            out[window_s] = metrics.window_usage(running, window_s, now)
        except Exception as exc:  # a collector bug must give UNKNOWN, not a crash or a stop
            log.exception("metrics collection failed for window %ss", window_s)
            out[window_s] = {
                i.instance_id: InstanceUsage(i.instance_id, window_s, 0, error=f"collector error: {exc}")
                for i in running
            }
    return out


def alert_missing_data(ctx: RunContext, settings: Settings, decisions: Sequence[Decision],
                       by_id: dict[str, GpuInstance], store: Store, notifier: Notifier) -> None:
    """One Slack alert per outage episode, however many ticks and restarts it spans."""
    missing = [d for d in decisions if d.code.is_missing_data]
    episode = store.get_kv(KV_METRICS_EPISODE)
    if not missing:
        if episode is not None:
            log.info("metrics available again (episode since %s closed)", episode)
            store.set_kv(KV_METRICS_EPISODE, None)
        return
    if episode is None:
        episode = ctx.now.isoformat()
        store.set_kv(KV_METRICS_EPISODE, episode)
    seen: dict[str, Decision] = {}
    for d in missing:
        seen.setdefault(d.instance_id, d)
    affected = [(by_id[i], d) for i, d in seen.items() if i in by_id]
    msg = messages.metrics_unavailable(affected, episode_start=datetime.fromisoformat(episode),
                                       channel=settings.slack.default_channel)
    notifier.send(msg)


def run_once(ctx: RunContext, settings: Settings, rules: Sequence[Rule], peers: Peers, *, act: bool = True) -> RunReport:
    report = RunReport(ctx.run_id, ctx.now, ctx.dry_run)
    try:
        instances = peers.cloud.list_gpu_instances()
    except Exception as exc:
        # Without an inventory there is nothing to judge and nothing may be stopped.
        log.error("inventory failed: %s", exc)
        report.errors.append(f"inventory: {exc}")
        return report
    report.instances = instances
    # A region that could not be listed makes the run partial: visible in errors and /metrics.
    for err in getattr(peers.cloud, "last_errors", []) or []:
        report.errors.append(f"inventory: {err}")
    running = [i for i in instances if i.is_running]
    usage = collect_usage(peers.metrics, running, rules, ctx.now)
    decisions = evaluate_all(running, usage, rules, ctx.now)
    if peers.learned is not None and any(r.learned is not None for r in rules):
        from .learned import apply_learned

        try:
            peers.learned.refresh(rules, ctx.now)  # a fixed number of range queries; a failure leaves no history
            decisions = apply_learned(decisions, running, rules, peers.learned, ctx.now)
        except Exception:  # a bug in the learned policy leaves the fixed rules deciding, never a crash
            log.exception("learned policy failed; the fixed rules decide this run")
    by_id = {i.instance_id: i for i in running}
    escalations = escalation.active(peers.store, ctx.now)
    if escalations:
        from .collect.billing.settings import billing_settings

        keys = billing_settings(settings).tag_keys
        decisions = escalation.promote(decisions, by_id, escalations, {"team": keys.team, "project": keys.project})
    report.decisions = decisions
    for d in decisions:
        log.info("%s decision %s rule=%s verdict=%s code=%s: %s", ctx.run_id, d.instance_id, d.rule_name,
                 d.verdict.value, d.code.value, d.reason)
    peers.store.record_decisions(
        ctx.run_id, decisions, ctx.dry_run,
        teams={i.instance_id: i.team() for i in running},
        types={i.instance_id: i.instance_type for i in running},
    )
    if not act:
        return report
    actuator = Actuator(peers.cloud, peers.store, peers.notifier, settings)
    report.actions = actuator.apply(ctx, running, decisions, rules)
    alert_missing_data(ctx, settings, decisions, by_id, peers.store, peers.notifier)
    return report
