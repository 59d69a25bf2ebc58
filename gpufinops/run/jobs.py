"""Scheduled jobs beside the every-minute evaluation: budget alerts, the weekly
right-sizing digest and the monthly audit report. Each is a plain function of (settings, peers, now) so tests call
it directly; `scheduled_jobs` wraps them for the service's scheduler.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Callable

# At the top, as in every runtime module: only `serve` imports this file, and it read pandas (report, cost) at its
# first /metrics scrape anyway; measured, `serve` starts about 0.7 s later, once, and no other command changes.
from ..collect.billing.load import load_cost_table
from ..collect.billing.schema import month_bounds
from ..config import Settings
from ..cost.budgets import run_budget_check
from ..model import ActionKind
from ..notify.email import EmailDelivery
from ..notify.messages import daily_summary as summary_message
from ..notify.routing import deliveries
from ..prices.catalog import load_catalog, load_refresh
from ..recommend.engine import recommend_fleet, store_recommendations, weekly_digest_message
from ..recommend.policy import policy_from_settings
from ..report.audit import build_audit
from ..report.deliver import s3_client
from ..report.inputs import read_inputs
from ..report.monthly import write_and_deliver
from ..report.options import report_settings
from ..report.period import report_period
from ..rules import load_rules
from ..store.schema import aware_utc
from .pipeline import Peers, folded_outages
from .slurm_cost import billing_or_none, read_slurm_month, slurm_reader

log = logging.getLogger("gpufinops.jobs")


def budget_check(settings: Settings, peers: Peers, now: datetime):
    """Load this month's costs from the configured billing source and send due budget alerts."""
    from ..collect.billing.settings import billing_settings
    from ..cost.budgets import configured_budgets

    start, end = month_bounds(f"{now:%Y-%m}")
    budgets = configured_budgets(billing_settings(settings).budgets_path)
    # Budgets of Slurm accounts only (a Slurm site): sacct is read, billing is not.
    costs = load_cost_table(settings, start, end, now) if any(not b.scope.slurm for b in budgets) \
        else billing_or_none(now)
    statuses = run_budget_check(settings, peers.store, peers.notifier, now, costs, budgets=budgets,
                                slurm=lambda s, e: read_slurm_month(settings, peers.store, s, e, now))
    for s in statuses:
        log.info("budget %s: %s", s.budget, s.error or f"{s.spent:,.2f} spent, {s.forecast:,.2f} forecast of {s.amount:,.2f}")
    return statuses


def recommend_digest(settings: Settings, peers: Peers, now: datetime):
    """Right-size the fleet from its observed usage, store the table, post the weekly digest."""
    policy = policy_from_settings(settings)
    catalog = load_catalog(policy.catalog_dir)
    cache = load_refresh(policy.price_cache_path)
    if cache is not None:
        catalog = catalog.with_aws_refresh(cache)
    instances = peers.cloud.list_gpu_instances()
    interval = policy.scrape_interval_s or settings.prometheus.scrape_interval_s
    if peers.usage is None:
        raise RuntimeError("the right-sizing digest needs a usage reader (compose.live_peers builds one)")
    usage = peers.usage.fleet_usage(
        instances, policy.window_days * 86400, now, interval, policy.commitment.window_days * 86400)
    # The rules and the opt-in: stop advice for idle machines respects their exclusions (recommend/idle.py).
    recs = recommend_fleet(instances, usage, catalog, policy, now, rules=load_rules(settings.rules_paths),
                           opt_in=(settings.act.opt_in_tag, settings.act.opt_in_value))
    store_recommendations(peers.store, uuid.uuid4().hex[:12], recs)
    # recommend.digest_channel when set, else the "default" audience's channel (routing picks it); the
    # recommend.digest_top largest savings.
    digest = weekly_digest_message(recs, now, channel=settings.recommend.digest_channel or "",
                                   top=settings.recommend.digest_top)
    deliveries(peers.notifier, settings).send(digest)
    return recs


def daily_summary(settings: Settings, peers: Peers, now: datetime):
    """The platform channel's summary of the last 24 h, from the audit log (one message per day), with the metrics
    outages that were not alerted because their instance had been alerted within the day (alert_missing_data)."""
    since = now - timedelta(hours=24)
    rows = peers.store.action_rows(start=since)
    stops = [r for r in rows if r.kind in (ActionKind.STOP, ActionKind.TERMINATE) and r.status == "done"]
    rates = {s.instance_id: s.hourly_cost for s in peers.cloud.list_gpu_instances()} if stops else {}
    budget_alerts = [r["text"].splitlines()[0] for r in peers.store.notification_rows()
                     if str(r["key"]).startswith("budget:") and r["status"] in ("sent", "outbox")
                     and r["at"] is not None and aware_utc(r["at"]) >= since]
    msg = summary_message(
        now, stopped=[(r.instance_id, rates.get(r.instance_id)) for r in stops if not r.dry_run],
        dry_run_stops=sum(1 for r in stops if r.dry_run),
        warnings=sum(1 for r in rows if r.kind == ActionKind.MARK and r.status == "done"),
        cancelled=sum(1 for r in rows if r.kind == ActionKind.UNMARK and r.status == "done"),
        snoozed_by_people=[f"{r.instance_id}: {r.reason}" for r in rows
                           if r.kind == ActionKind.SNOOZE and r.status == "done"],
        pending=[(m.instance_id, m.stop_at) for m in peers.store.all_marks()],
        budget_alerts=budget_alerts,
        metrics_outages=[(e["instance_id"], e["since"]) for e in folded_outages(peers.store, since)])
    deliveries(peers.notifier, settings).send(msg)  # to the "default" audience: routing picks its channel
    return msg


def monthly_report(settings: Settings, peers: Peers, now: datetime):
    """The audit report of the month that just ended (HTML + CSV + JSON), sent where `report.delivery` says
    (S3, Slack; with its PDF rendition); nothing is sent when no destination is configured."""
    d = settings.report.delivery
    email = None
    if d.email_finance:
        email = EmailDelivery(settings.email, peers.store, lambda: now)
    paths, sent = write_and_deliver(peers.store, None, settings.schedule.monthly_report_dir, now, settings,
                                    notifier=peers.notifier, s3_client=s3_client(settings) if d.s3_uri else None,
                                    email=email, slurm=slurm_reader(settings, peers.store))
    log.info("monthly report written: %s", ", ".join(str(p) for p in paths))
    for s in sent:
        (log.error if s.error else log.info)("monthly report %s", s.line(dry_run=False))
    return paths


def month_savings(settings: Settings, peers: Peers, now: datetime) -> dict[str, tuple[float, int]]:
    """This month's real stops by team: (net saving in USD, stops), counted by the monthly report's own code
    (report.audit.stop_audit, net_of_stop: stopped time less the restart's and a false stop's cost) up to `now`.
    A stop whose instance has no known rate adds to the count, not to the dollars."""
    # This month only (the report's monthly_audit also audits the month before, for its trend).
    audit = build_audit(read_inputs(peers.store, report_period(f"{now:%Y-%m}", now), settings),
                        report_settings(settings), fallback_period_s=settings.schedule.evaluate_every_s)
    out: dict[str, tuple[float, int]] = {}
    stops = audit.stops
    real = stops[(~stops["dry_run"].astype(bool)) & (stops["status"] == "done")] if len(stops) else stops
    for team, group in real.groupby(real["team"].fillna("").astype(str)) if len(real) else ():
        net = group["net_cost"].dropna().sum()
        out[str(team)] = (float(net), int(len(group)))
    return out


def scheduled_jobs(settings: Settings, peers: Peers, clock: Callable[[], datetime]) -> list[tuple[str, dict, Callable[[], None]]]:
    """(job id, APScheduler trigger arguments, function) for every job the settings enable. The service
    runs each only while it holds the scheduler lease (Service.leader_only), so one of several `serve`
    processes on a database sends the budget alerts, the digest and the monthly report."""
    jobs: list[tuple[str, dict, Callable[[], None]]] = []
    if settings.billing and settings.schedule.budget_check_every_s > 0:
        jobs.append(("budgets", {"trigger": "interval", "seconds": settings.schedule.budget_check_every_s},
                     lambda: budget_check(settings, peers, clock())))
    if settings.schedule.recommend_digest_day:
        jobs.append(("recommend-digest", {"trigger": "cron", "day_of_week": settings.schedule.recommend_digest_day,
                                          "hour": settings.schedule.recommend_digest_hour, "timezone": "UTC"},
                     lambda: recommend_digest(settings, peers, clock())))
    if settings.schedule.daily_summary_hour is not None:
        jobs.append(("daily-summary", {"trigger": "cron", "hour": settings.schedule.daily_summary_hour, "timezone": "UTC"},
                     lambda: daily_summary(settings, peers, clock())))
    if settings.schedule.savings_every_s > 0:
        jobs.append(("savings", {"trigger": "interval", "seconds": settings.schedule.savings_every_s},
                     lambda: month_savings(settings, peers, clock())))
    if settings.schedule.monthly_report_dir:
        jobs.append(("monthly-report", {"trigger": "cron", "day": 1, "hour": 6, "timezone": "UTC"},
                     lambda: monthly_report(settings, peers, clock())))
    return jobs
