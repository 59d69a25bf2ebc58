"""One recommendation per instance (plus commitment rows per type), stored for reports and the digest.

`recommend_fleet` is pure: inventory + usage + catalog + policy + now in,
Recommendation values out. Storing and messaging hang off those values.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import date, datetime, timezone
from typing import Mapping, Sequence

from sqlalchemy import insert, select

from gpufinops.prices.catalog import Catalog
from gpufinops.model import GpuInstance, Message, Rule, format_money
from gpufinops.recommend.idle import DEFAULT_OPT_IN, MIN_IDLE_HISTORY_H, history, never_worked, seen_so_far, stop_advice
from gpufinops.recommend.policy import RecommendPolicy
from gpufinops.recommend.purchase import classify, commitment, spot_vs_on_demand
from gpufinops.recommend.rightsize import rightsize
from gpufinops.recommend.usage import FleetUsage
from gpufinops.store.store import Store
from gpufinops.store.schema import aware_utc, naive_utc, metadata
from gpufinops.store.schema import recommendations

RISK_ORDER = {"none": 0, "low": 1, "medium": 2, "high": 3}


@dataclass(frozen=True)
class Recommendation:
    instance_id: str  # "" for a fleet-level commitment row
    team: str
    instance_type: str
    region: str
    # keep | rightsize | spot | rightsize+spot | commit | insufficient_data | unknown_type | stop_when_idle | idle_kept
    action: str
    current_monthly: float | None
    recommended: str
    recommended_monthly: float | None
    monthly_savings: float
    risk: str
    reason: str
    prices_as_of: date | None
    created_at: datetime
    history_h: float | None = None  # measured usage history the row rests on (not stored: JSON/CSV only)
    confidence: str = ""  # low | medium | high: what that history can show (recommend/idle.py)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["prices_as_of"] = self.prices_as_of.isoformat() if self.prices_as_of else None
        d["created_at"] = self.created_at.isoformat()
        return d


def _price_age(as_of: date | None, now: datetime, policy: RecommendPolicy) -> str:
    if as_of is None:
        return "price date unknown"
    days = (now.date() - as_of).days  # stale ones are said once for the run (stale_prices_warning), not per row
    return f"prices as of {as_of.isoformat()} ({days} days old)"


def stale_prices_warning(recs: Sequence[Recommendation], now: datetime, policy: RecommendPolicy) -> str:
    """One warning for all the rows priced older than price_max_age_days; "" when none is."""
    old = [r.prices_as_of for r in recs if r.prices_as_of and (now.date() - r.prices_as_of).days > policy.price_max_age_days]
    if not old:
        return ""
    oldest = min(old)
    return (f"{len(old)} recommendation(s) rest on prices older than {policy.price_max_age_days} days (oldest "
            f"{oldest.isoformat()}, {(now.date() - oldest).days} days): costs and savings may be off; refresh AWS "
            f"prices with --refresh-prices (AWS credentials allowed to call pricing:GetProducts) or update the catalog")


def recommend_instance(inst: GpuInstance, fleet: FleetUsage, catalog: Catalog, policy: RecommendPolicy,
                       now: datetime, *, rules: Sequence[Rule] | None = None,
                       opt_in: tuple[str, str] = DEFAULT_OPT_IN) -> Recommendation:
    """`rules`: the service's rules, so stop advice respects their exclusions (None: not checked);
    `opt_in`: act.opt_in_tag and opt_in_value."""
    hpm = policy.hours_per_month
    sized = rightsize(inst, fleet.instances.get(inst.instance_id), catalog, policy)
    cur = sized.current
    on_spot = inst.lifecycle == "spot"
    current_hourly = inst.hourly_cost
    if current_hourly is None and cur is not None:
        current_hourly = cur.spot_usd_h if on_spot and cur.spot_usd_h else cur.on_demand_usd_h
    current_monthly = current_hourly * hpm if current_hourly is not None else None

    usage = fleet.instances.get(inst.instance_id)
    hist = history(usage)

    def rec(action, recommended, rec_monthly, risk, reason, as_of):
        savings = (current_monthly - rec_monthly) if (current_monthly is not None and rec_monthly is not None) else 0.0
        return Recommendation(inst.instance_id, inst.team(), inst.instance_type, inst.region, action,
                              current_monthly, recommended, rec_monthly, max(0.0, savings), risk,
                              f"{reason}; {_price_age(as_of, now, policy)}" if as_of or cur else reason, as_of, now,
                              round(hist.hours, 1) if hist else None, hist.confidence if hist else "")

    as_of = cur.prices_as_of if cur else None
    gpu_count = cur.gpu_count if cur else inst.gpu_count
    if hist is not None and hist.hours >= MIN_IDLE_HISTORY_H and never_worked(usage, gpu_count, policy):
        # No GPU did any work: stop it when idle (never a smaller GPU, never a schedule), within the service's guards.
        advice = stop_advice(inst, rules, opt_in)
        why = f"{advice.reason}; no GPU worked in {hist.describe()}"
        if advice.action == "idle_kept":
            return rec(advice.action, advice.recommended, current_monthly, "none", why, as_of)
        risk = {"high": "low", "medium": "medium"}.get(hist.confidence, "high")
        return rec(advice.action, advice.recommended, 0.0 if current_monthly is not None else None, risk,
                   f"{why}; saves its cost while it stays idle", as_of)
    if sized.status == "insufficient_data" and hist is not None and \
            hist.hours < hist.window_hours * policy.min_coverage and len(usage.gpus) >= gpu_count:
        # It works, but on less history than right-sizing needs: what was seen, and no smaller GPU yet.
        return rec(sized.status, "-", None, "none", f"{sized.reason}; {hist.describe()}; {seen_so_far(usage)}; "
                                                    f"no smaller GPU advised on less than {policy.window_days} days",
                   as_of)
    if sized.status != "ok":
        return rec(sized.status, "-", None, "none", sized.reason, cur.prices_as_of if cur else None)
    if sized.mig is not None:
        # MIG slices of the GPU it has: their share of what one of its GPUs costs now (spot or on-demand).
        per_gpu = (current_hourly if current_hourly is not None else cur.on_demand_usd_h) / cur.gpu_count
        hourly = sized.mig.share * per_gpu
        return rec("rightsize", sized.mig.label(), hourly * hpm, sized.risk,
                   f"{sized.reason}; {format_money(hourly, per='h')} of the {format_money(per_gpu, per='h')} "
                   f"one of its GPUs costs now "
                   f"(spot not considered for a share of a GPU)", cur.prices_as_of)
    target = sized.candidate or cur
    label = f"{target.instance_type} ({target.gpu_count}x {target.gpu})"
    parts = [sized.reason]
    action = "rightsize" if sized.candidate else "keep"
    hourly = target.on_demand_usd_h
    risk = sized.risk
    kind = classify(inst, policy)
    if on_spot:
        parts.append("already on spot")
        hourly = target.spot_usd_h or hourly
    elif kind.interruptible:
        verdict = spot_vs_on_demand(target.on_demand_usd_h, target.spot_usd_h, target.instance_type, target.region,
                                    policy.spot)
        parts.append(f"{kind.reason}; {verdict.reason}")
        if verdict.use_spot:
            action = "rightsize+spot" if sized.candidate else "spot"
            label += " on spot, on-demand fallback"
            hourly = verdict.expected_hourly
            risk = max(risk, "low", key=RISK_ORDER.__getitem__)
    else:
        parts.append(f"on-demand: {kind.reason}")
    rec_monthly = hourly * hpm
    if current_monthly is not None and rec_monthly >= current_monthly and action != "keep":
        action, label, rec_monthly, risk = "keep", f"{cur.instance_type} ({cur.gpu_count}x {cur.gpu})", current_monthly, "none"
    return rec(action, label, rec_monthly, risk, "; ".join(parts), target.prices_as_of)


def recommend_fleet(instances: Sequence[GpuInstance], fleet: FleetUsage, catalog: Catalog, policy: RecommendPolicy,
                    now: datetime, *, rules: Sequence[Rule] | None = None,
                    opt_in: tuple[str, str] = DEFAULT_OPT_IN) -> list[Recommendation]:
    running = [i for i in instances if i.is_running]
    recs = [recommend_instance(i, fleet, catalog, policy, now, rules=rules, opt_in=opt_in) for i in running]
    recs += commitment_recs(running, fleet.hourly_gpus, catalog, policy, now)
    return sorted(recs, key=lambda r: (-r.monthly_savings, r.instance_id))


def commitment_recs(instances: Sequence[GpuInstance], hourly_gpus: Mapping[str, Sequence[int]], catalog: Catalog,
                    policy: RecommendPolicy, now: datetime) -> list[Recommendation]:
    """Per (provider, type, region): commit to the baseline number of on-demand instances."""
    groups: dict[tuple[str, str, str], list[GpuInstance]] = defaultdict(list)
    for inst in instances:
        if inst.lifecycle != "spot" and inst.instance_id in hourly_gpus:
            groups[(inst.provider, inst.instance_type, inst.region)].append(inst)
    out = []
    for (provider, itype, region), members in sorted(groups.items()):
        offer = catalog.offer(provider, itype, region)
        if offer is None:
            continue
        hours = min(len(hourly_gpus[m.instance_id]) for m in members)
        counts = [sum(1 for m in members if hourly_gpus[m.instance_id][h] > 0) for h in range(hours)]
        c = commitment(itype, region, counts, offer.on_demand_usd_h, offer.commit_usd_h, policy.commitment,
                       policy.hours_per_month)
        if c is None:
            continue
        teams = sorted({m.team() for m in members if m.team()})
        out.append(Recommendation(
            "", ",".join(teams), itype, region, "commit", c.baseline * c.on_demand_hourly * policy.hours_per_month,
            f"commit {c.baseline}x {itype} ({policy.commitment.term})", c.baseline * c.commit_hourly * policy.hours_per_month,
            c.monthly_savings, "low",
            f"{c.reason}; right-size first: commit to what remains; {_price_age(offer.prices_as_of, now, policy)}",
            offer.prices_as_of, now,
        ))
    return out


# --------------------------------------------------------------------------- storage


def store_recommendations(store: Store, run_id: str, recs: Sequence[Recommendation]) -> None:
    if not recs:
        return
    columns = set(recommendations.c.keys())
    rows = [{k: v for k, v in {**r.to_dict(), "prices_as_of": r.prices_as_of, "created_at": naive_utc(r.created_at),
                               "run_id": run_id}.items() if k in columns} for r in recs]
    with store.engine.begin() as conn:
        conn.execute(insert(recommendations), rows)


def latest_recommendations(store: Store, since: datetime | None = None) -> list[Recommendation]:
    """The rows of the most recent run (at or after `since`), for the monthly report."""
    with store.engine.connect() as conn:
        q = select(recommendations.c.run_id, recommendations.c.created_at).order_by(
            recommendations.c.created_at.desc(), recommendations.c.id.desc()).limit(1)
        if since is not None:
            q = q.where(recommendations.c.created_at >= naive_utc(since))
        last = conn.execute(q).first()
        if last is None:
            return []
        rows = conn.execute(select(recommendations).where(recommendations.c.run_id == last[0])
                            .order_by(recommendations.c.monthly_savings.desc())).mappings().all()
    fields = Recommendation.__dataclass_fields__
    return [Recommendation(**{k: (aware_utc(v) if k == "created_at" else v) for k, v in r.items() if k in fields})
            for r in rows]


# --------------------------------------------------------------------------- weekly digest


def weekly_digest_message(recs: Sequence[Recommendation], now: datetime, channel: str = "",
                          top: int = 10) -> Message:
    """The digest of the largest savings, one per ISO week (the key makes it exactly-once); a notice every
    delivery renders (Slack blocks, email, outbox). Instance ids, teams and types are escaped: tags are not markup."""
    from gpufinops.notify.markup import escape

    year, week, _ = now.astimezone(timezone.utc).isocalendar()
    actionable = [r for r in recs if r.monthly_savings > 0]
    total = sum(r.monthly_savings for r in actionable)
    waiting = sum(1 for r in recs if r.action == "insufficient_data")
    head = (f"GPU recommendations, week {year}-W{week:02d}: {len(actionable)} with savings, "
            f"{format_money(total, digits=0, per='month')} in total"
            + (f"; {waiting} instance(s) with insufficient data" if waiting else ""))
    lines = []
    for r in sorted(actionable, key=lambda r: -r.monthly_savings)[:top]:
        who = escape(r.instance_id or "fleet")
        team = f" [{escape(r.team)}]" if r.team else ""
        lines.append(f"• {who}{team} {escape(r.instance_type)} → {escape(r.recommended)}: save "
                     f"{format_money(r.monthly_savings, digits=0, per='mo')}, risk {escape(r.risk)}")
    text = head + ("\n" + "\n".join(lines) if lines else "\nNothing to change this week.")
    return Message(key=f"recommend-digest:{year}-W{week:02d}:{channel or 'default'}", channel=channel, text=text, kind="digest",
                   subject=f"{year}-W{week:02d}", audience=("default",), title=f"GPU recommendations {year}-W{week:02d}",
                   lead=head if lines else head + "\nNothing to change this week.", lines=tuple(lines))
