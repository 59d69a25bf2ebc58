"""One evaluation run: collect -> evaluate -> store -> act -> notify.

`run_once` is what the scheduler calls every minute, what `evaluate --once`
calls (with act=False) and what the demo calls on its simulated clock.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Sequence

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from ..notify import messages
from ..decide import escalation
from ..act.actuator import Actuator
from ..config import Settings, TagKeys
from ..decide.evaluate import evaluate_all
from ..model import (
    ActionResult,
    Cloud,
    Decision,
    GpuInstance,
    InstanceUsage,
    MetricsSource,
    Notifier,
    ReasonCode,
    Rule,
    RunContext,
    Verdict,
)
from ..act.lease import LeaseLost
from .nodes import judge_and_act_on_nodes, workload_cloud_of
from ..act.restore import apply_restore_requests
from ..notify.routing import deliveries
from .node_hours import record_node_hours
from ..store.store import Store
from ..store.schema import MAILTO, aware_utc, notifications

if TYPE_CHECKING:  # read only by the weekly digest job; not imported on the every-minute path
    from ..recommend.usage import PrometheusUsage
from ..cost import escalations as cost_escalations

log = logging.getLogger("gpufinops.pipeline")

# Outage episodes of the "metrics unavailable" alert, one kv entry per instance (prefix + instance id).
KV_METRICS_EPISODE_PREFIX = "metrics_unavailable:"
KV_METRICS_EPISODE = "metrics_unavailable_since"  # the single fleet-wide episode of earlier versions; removed


class DecisionLog:
    """The per-decision log line: at INFO when an (instance, rule)'s verdict or reason code changes (and the
    first time this process judges it), at DEBUG on the ticks that only repeat it. A fleet of 9 instances and
    2 rules would otherwise write 18 INFO lines a minute that say nothing new."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[str, str]] = {}

    def write(self, run_id: str, decisions: Sequence[Decision]) -> None:
        seen = {}
        for d in decisions:
            key, now = (d.instance_id, d.rule_name), (d.verdict.value, d.code.value)
            seen[key] = now
            level = logging.INFO if self._last.get(key) != now else logging.DEBUG
            log.log(level, "%s decision %s rule=%s verdict=%s code=%s: %s", run_id, d.instance_id, d.rule_name,
                    d.verdict.value, d.code.value, d.reason)
        self._last = seen  # an instance gone and back is new again


@dataclass
class Peers:
    cloud: Cloud
    metrics: MetricsSource
    store: Store
    notifier: Notifier
    # Fleet usage over days for right-sizing (recommend.usage.PrometheusUsage); None where nothing right-sizes.
    usage: "PrometheusUsage | None" = None
    decision_log: DecisionLog = field(default_factory=DecisionLog)
    # The tag keys that say an instance's team and project (`billing.tag_keys`): a budget escalation's scope is
    # matched on them. The composition root hands the configured ones (compose.live_peers), so the tick reads no
    # billing settings itself; the default is the config's own default.
    scope_tag_keys: TagKeys = field(default_factory=TagKeys)


@dataclass
class RunReport:
    run_id: str
    now: datetime
    dry_run: bool
    instances: list[GpuInstance] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    actions: list[ActionResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Each data source this tick: None = it answered, else what went wrong (see SOURCES). Prometheus
    # errors do not go to `errors` (they are UNKNOWN decisions); they are visible here.
    sources: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(SOURCES))

    def verdict_counts(self) -> dict[str, int]:
        counts = {v.value: 0 for v in Verdict}
        for d in self.decisions:
            counts[d.verdict.value] += 1
        return counts

    def degraded(self) -> dict[str, str]:
        """The sources that failed this tick, with their error."""
        return {name: err for name, err in self.sources.items() if err is not None}


# The data sources a tick depends on: EC2 inventory, Prometheus metrics, the database, Slack delivery (chat:
# Slack or the outbox), and email delivery where email is enabled (sources_of). Each transport is its own
# source: an SMTP refusal degrades "email", never "slack".
SOURCES = ("inventory", "prometheus", "database", "slack")
EMAIL_SOURCE = "email"


def sources_of(settings: Settings) -> tuple[str, ...]:
    """The sources of a tick under these settings: SOURCES, and "email" when email is enabled."""
    return SOURCES + ((EMAIL_SOURCE,) if settings.email.enabled else ())


def prometheus_status(decisions: Sequence[Decision],
                      usage: dict[int, dict[str, InstanceUsage]] | None = None) -> str | None:
    """None when Prometheus answered; else how many judgements it failed and the first error. A query
    error is an UNKNOWN decision with code QUERY_ERROR (missing series are not a Prometheus failure). A query
    that failed for instances judged on something else first (too young to judge) is still a failure: it is
    read from the collected usage itself."""
    failed = [d for d in decisions if d.code is ReasonCode.QUERY_ERROR]
    if failed:
        return f"{len(failed)} of {len(decisions)} judgements without metrics: {failed[0].reason}"
    errors = sorted({u.error for by_id in (usage or {}).values() for u in by_id.values() if u.error})
    return f"metrics unavailable: {errors[0]}" if errors else None


def delivery_status(store: Store, transport: str) -> str | None:
    """None when no notification of this transport ("slack": every chat row; "email": the mailto: rows) is
    marked failed; else how many and since when (the deliveries retry them on later ticks, so this clears once
    they are accepted; a failed report email waits for `report --deliver`, which has its attachments)."""
    is_email = notifications.c.channel.startswith(MAILTO, autoescape=True)
    with store.engine.connect() as conn:
        count, first = conn.execute(
            select(func.count(), func.min(notifications.c.at))
            .where(notifications.c.status == "failed", is_email if transport == EMAIL_SOURCE else ~is_email)).one()
    if not count:
        return None
    what = "email(s) not accepted by the mail server" if transport == EMAIL_SOURCE else "notification(s) not delivered"
    return f"{count} {what}, the oldest since {aware_utc(first).isoformat()}"


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


def metrics_alert_key(since: datetime, instance_ids: Sequence[str]) -> str:
    """The idempotency key of the alert for the instances that went missing together at `since`:
    the same instances and start give the same key, so a restart never sends it twice."""
    since = since if since.tzinfo else since.replace(tzinfo=timezone.utc)
    digest = hashlib.sha256("\n".join(sorted(instance_ids)).encode()).hexdigest()[:12]
    return f"metrics-unavailable:{since.astimezone(timezone.utc):%Y%m%dT%H%M%SZ}:{digest}"


def _open_episodes(store: Store) -> dict[str, dict]:
    """instance id -> {"since": ISO time, "key": alert key, "alerted": bool} of every open outage episode."""
    out = {}
    for kv_key, value in store.kv_items(KV_METRICS_EPISODE_PREFIX):
        try:
            episode = json.loads(value)
            datetime.fromisoformat(episode["since"])
            str(episode["key"])
        except (ValueError, KeyError, TypeError):
            # Unreadable: kept as open and alerted, so it can never cause a second alert.
            log.warning("kv %s: unreadable metrics episode, treated as already alerted", kv_key)
            episode = {"since": datetime.min.replace(tzinfo=timezone.utc).isoformat(), "key": "", "alerted": True}
        out[kv_key[len(KV_METRICS_EPISODE_PREFIX):]] = episode
    return out


def _save_episode(store: Store, instance_id: str, episode: dict | None) -> None:
    store.set_kv(KV_METRICS_EPISODE_PREFIX + instance_id, None if episode is None else json.dumps(episode))


# Per instance, when its last "metrics unavailable" alert was sent (ISO time): a new outage within REPEAT_FOLD_S
# of it is not messaged again but folded into the daily summary (KV_METRICS_FOLDED_PREFIX, one entry per outage).
KV_METRICS_ALERTED_PREFIX = "metrics_alerted:"
KV_METRICS_FOLDED_PREFIX = "metrics_folded:"
REPEAT_FOLD_S = 86400


def _alerted_at(store: Store, now: datetime) -> dict[str, datetime]:
    """instance id -> when its last alert was sent, for alerts within REPEAT_FOLD_S; older entries are removed."""
    out = {}
    for kv_key, value in store.kv_items(KV_METRICS_ALERTED_PREFIX):
        try:
            at = aware_utc(datetime.fromisoformat(value))
        except (ValueError, TypeError):
            at = None
        if at is None or (now - at).total_seconds() >= REPEAT_FOLD_S:
            store.set_kv(kv_key, None)
        else:
            out[kv_key[len(KV_METRICS_ALERTED_PREFIX):]] = at
    return out


def folded_outages(store: Store, since: datetime) -> list[dict]:
    """The outages not messaged because their instance had been alerted within a day, started at or after `since`
    (for the daily summary), oldest first: {"instance_id", "since", "reason"}. Older entries are removed."""
    out = []
    for kv_key, value in store.kv_items(KV_METRICS_FOLDED_PREFIX):
        try:
            entry = json.loads(value)
            start = aware_utc(datetime.fromisoformat(entry["since"]))
        except (ValueError, KeyError, TypeError):
            start = None
        if start is None or start < since:
            store.set_kv(kv_key, None)
        else:
            out.append({"instance_id": str(entry.get("instance_id", "")), "since": start,
                        "reason": str(entry.get("reason", ""))})
    return sorted(out, key=lambda e: (e["since"], e["instance_id"]))


def alert_missing_data(ctx: RunContext, settings: Settings, decisions: Sequence[Decision],
                       by_id: dict[str, GpuInstance], store: Store, notifier: Notifier) -> None:
    """One Slack alert per instance and outage episode, however many ticks and restarts it spans.

    Episodes are kept per instance in the kv table. An episode opens when an instance has no usable data and
    closes only once it has had usable data for `slack.metrics_recovered_after_s` without a break (hysteresis: an
    instance whose coverage flaps around the threshold stays in one episode, one alert). An instance alerted
    less than a day ago whose new episode opens is not messaged again: the outage goes into the daily summary
    (when one is scheduled). Instances that go missing in the same tick are named in one message. The episode is
    written with its message key before the send and marked alerted once the notifier took it: a crash in between
    resends the same key, which the notifier sends at most once; a send the notifier could not make is retried
    next tick.
    """
    missing: dict[str, Decision] = {}
    judged: set[str] = set()
    for d in decisions:
        judged.add(d.instance_id)
        if d.code.is_missing_data:
            missing.setdefault(d.instance_id, d)
    if store.get_kv(KV_METRICS_EPISODE) is not None:  # the fleet-wide episode of earlier versions
        store.set_kv(KV_METRICS_EPISODE, None)
    episodes = _open_episodes(store)
    now = aware_utc(ctx.now)
    recovered_after_s = settings.slack.metrics_recovered_after_s
    # Closed only on evidence: judged with data, for long enough. An instance not judged this tick (stopped, or
    # its region not listed) keeps its episode as it is, so a partial inventory cannot cause a second alert.
    for iid in sorted((judged - set(missing)) & set(episodes)):
        episode = episodes[iid]
        try:
            ok_since = aware_utc(datetime.fromisoformat(episode["ok_since"])) if episode.get("ok_since") else None
        except (ValueError, TypeError):
            ok_since = None
        if ok_since is None:
            episode["ok_since"] = (ok_since := now).isoformat()
            _save_episode(store, iid, episode)
        if (now - ok_since).total_seconds() >= recovered_after_s:
            log.info("metrics available again for %s since %s (episode since %s closed)", iid,
                     ok_since.isoformat(), episode["since"])
            _save_episode(store, iid, None)
            del episodes[iid]
    for iid in sorted(set(missing) & set(episodes)):
        if episodes[iid].get("ok_since"):  # a relapse within the hysteresis: the same episode goes on
            episodes[iid].pop("ok_since")
            _save_episode(store, iid, episodes[iid])
    new = sorted(i for i in missing if i not in episodes)
    if new:
        alerted_at = _alerted_at(store, now)
        fold = settings.schedule.daily_summary_hour is not None
        key = metrics_alert_key(ctx.now, new)
        for iid in new:
            episodes[iid] = {"since": ctx.now.isoformat(), "key": key, "alerted": False}
            if fold and iid in alerted_at:
                # Alerted less than a day ago: this outage is told in the daily summary, not in a new message.
                episodes[iid].update(key="", alerted=True, folded=True)
                store.set_kv(f"{KV_METRICS_FOLDED_PREFIX}{iid}:{ctx.now:%Y%m%dT%H%M%SZ}", json.dumps(
                    {"instance_id": iid, "since": ctx.now.isoformat(), "reason": missing[iid].reason}))
                log.info("metrics unavailable again for %s (alerted at %s): folded into the daily summary", iid,
                         alerted_at[iid].isoformat())
            _save_episode(store, iid, episodes[iid])
    unsent: dict[str, list[str]] = {}
    for iid in sorted(missing):
        if not episodes[iid].get("alerted"):
            unsent.setdefault(episodes[iid]["key"], []).append(iid)
    for key, iids in unsent.items():
        affected = [(by_id[i], missing[i]) for i in iids if i in by_id]
        if not affected:
            continue
        since = min(datetime.fromisoformat(episodes[i]["since"]) for i in iids)
        # Those already warned of a stop are named: their stop is held and comes only after a new warning.
        marked = [inst.instance_id for inst, _d in affected if store.get_mark(inst.instance_id) is not None]
        msg = messages.metrics_unavailable(affected, episode_start=since, key=key, marked=marked)  # to "default"
        if notifier.send(msg):
            for iid in iids:
                episodes[iid]["alerted"] = True
                _save_episode(store, iid, episodes[iid])
                store.set_kv(KV_METRICS_ALERTED_PREFIX + iid, ctx.now.isoformat())


def run_once(ctx: RunContext, settings: Settings, rules: Sequence[Rule], peers: Peers, *, act: bool = True,
             record: bool = True) -> RunReport:
    """One tick. act=False judges without changing anything (evaluate --once, a standby scheduler);
    record=False also leaves the audit log alone (a standby: the leader records the tick)."""
    report = RunReport(ctx.run_id, ctx.now, ctx.dry_run, sources=dict.fromkeys(sources_of(settings)))
    try:
        instances = peers.cloud.list_gpu_instances()
    except Exception as exc:
        # Without an inventory there is nothing to judge and nothing may be stopped.
        log.error("inventory failed: %s", exc)
        report.errors.append(f"inventory: {exc}")
        report.sources["inventory"] = str(exc)
        return with_store_status(report, peers.store)
    report.instances = instances
    # A region that could not be listed makes the run partial: visible in errors and /metrics.
    region_errors = [str(err) for err in getattr(peers.cloud, "last_errors", []) or []]
    report.errors.extend(f"inventory: {err}" for err in region_errors)
    report.sources["inventory"] = "; ".join(region_errors) or None
    running = [i for i in instances if i.is_judged]  # running, or an Azure VM stopped but still billed
    usage = collect_usage(peers.metrics, running, rules, ctx.now)
    decisions = evaluate_all(running, usage, rules, ctx.now)
    report.sources["prometheus"] = prometheus_status(decisions, usage)
    by_id = {i.instance_id: i for i in running}
    report.decisions = decisions
    try:
        escalations = cost_escalations.active(peers.store, ctx.now)
    except SQLAlchemyError as exc:
        return database_failed(report, "reading escalations", exc)
    if escalations:
        keys = peers.scope_tag_keys
        decisions = escalation.promote(decisions, by_id, escalations, {"team": keys.team, "project": keys.project})
    report.decisions = decisions
    peers.decision_log.write(ctx.run_id, decisions)
    if record:
        try:
            peers.store.record_decisions(
                ctx.run_id, decisions, ctx.dry_run,
                teams={i.instance_id: i.team() for i in running},
                types={i.instance_id: i.instance_type for i in running},
                max_gap_s=2 * settings.schedule.evaluate_every_s,
                raw_keep_s=settings.store.raw_decisions_days * 86400,
                raw_every_s=settings.store.raw_decisions_every_s,
            )
        except SQLAlchemyError as exc:
            # Acting on decisions the audit log does not hold would break "records equal the cloud".
            return database_failed(report, "recording decisions", exc)
        try:
            # Owner, account and region for the report: labels only, so a failure here never holds back acting.
            peers.store.record_instances(instances, ctx.now)
        except SQLAlchemyError as exc:
            log.error("database failed recording instance labels, acting goes on: %s", exc)
            report.errors.append(f"database: recording instance labels: {exc}")
            report.sources["database"] = f"recording instance labels: {exc}"
        try:
            # The node pool table of the monthly report: the GPU nodes' cost, their pods' shares and idle capacity.
            record_node_hours(ctx.now, settings, peers)
        except SQLAlchemyError as exc:
            log.error("database failed recording GPU node hours, acting goes on: %s", exc)
            report.errors.append(f"database: recording GPU node hours: {exc}")
            report.sources["database"] = f"recording GPU node hours: {exc}"
    if not act:
        return with_store_status(report, peers.store)
    actuator = Actuator(peers.cloud, peers.store, peers.notifier, settings)
    try:
        report.actions = actuator.apply(ctx, running, decisions, rules)
    except LeaseLost as exc:
        return lease_lost(report, peers.store, "during the act stage", exc)
    except SQLAlchemyError as exc:
        return database_failed(report, "acting", exc)
    if record:
        try:
            # Kubernetes GPU nodes whose GPU work is gone: their own pass, from this tick's cluster listing.
            report.actions += judge_and_act_on_nodes(ctx, settings, rules, peers, report.actions)
        except LeaseLost as exc:
            return lease_lost(report, peers.store, "while acting on GPU nodes", exc)
        except SQLAlchemyError as exc:
            return database_failed(report, "acting on GPU nodes", exc)
        except Exception as exc:  # noqa: BLE001 - the tick's other work stands; nodes are judged again next tick
            log.exception("GPU nodes not judged this tick")
            report.errors.append(f"kubernetes nodes: {exc}")
    try:
        # Restore buttons clicked since the last tick (notify/interact.py), each done once through the chokepoint.
        apply_restore_requests(ctx, workload_cloud_of(peers.cloud), peers.store, deliveries(peers.notifier, settings))
    except SQLAlchemyError as exc:
        return database_failed(report, "restoring what people clicked", exc)
    except Exception as exc:  # noqa: BLE001 - the tick's other work stands; the click is logged, not repeated
        log.exception("Restore clicks not carried out this tick")
        report.errors.append(f"restore clicks: {exc}")
    alert_missing_data(ctx, settings, decisions, by_id, peers.store, deliveries(peers.notifier, settings))
    return with_store_status(report, peers.store)


def lease_lost(report: RunReport, store: Store, when: str, exc: Exception) -> RunReport:
    """Another scheduler took over mid-tick: it acts from now on; this one changes nothing more."""
    log.warning("lease lost %s, nothing more is changed this tick: %s", when, exc)
    report.errors.append(f"lease: {exc}")
    return with_store_status(report, store)


def database_failed(report: RunReport, doing: str, exc: Exception) -> RunReport:
    log.error("database failed %s, nothing is acted on this tick: %s", doing, exc)
    report.errors.append(f"database: {doing}: {exc}")
    report.sources["database"] = f"{doing}: {exc}"
    return report


def with_store_status(report: RunReport, store: Store) -> RunReport:
    """Fill each transport's delivery status from the notifications table (that read also proves the database)."""
    try:
        for transport in ("slack", EMAIL_SOURCE):
            if transport in report.sources:
                report.sources[transport] = delivery_status(store, transport)
    except SQLAlchemyError as exc:
        return database_failed(report, "reading notifications", exc)
    return report
