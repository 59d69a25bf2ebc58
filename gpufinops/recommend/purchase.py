"""How to buy: spot (with on-demand fallback), on-demand, or a commitment for the baseline. Pure.

Spot's expected cost counts the work redone after interruptions:

    rework   = interruptions/hour x (checkpoint_interval/2 + restart_overhead)   [hours lost per hour]
    expected = spot_price x (1 + rework)

Spot wins when expected < on_demand x (1 - min_saving_fraction). The break-even
rework (where spot stops paying) is on_demand / spot - 1.

Commitment: the steady baseline is the p-th percentile (default 10th) of the
hourly instance count over the window; committing to that many instances at
the committed price breaks even when they are in use for commit/on-demand of
the hours (the break-even utilisation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from gpufinops.model import GpuInstance, format_money
from gpufinops.recommend.policy import CommitmentPolicy, RecommendPolicy, SpotPolicy


@dataclass(frozen=True)
class Interruptibility:
    interruptible: bool
    reason: str


def classify(inst: GpuInstance, policy: RecommendPolicy) -> Interruptibility:
    """Interruptible only when the workload tag says so; no tag means not (safe side)."""
    value = (inst.tags.get(policy.workload_tag) or "").strip().lower()
    if value in policy.interruptible_values:
        return Interruptibility(True, f"{policy.workload_tag}={value}: can resume from checkpoints")
    if value in policy.non_interruptible_values:
        return Interruptibility(False, f"{policy.workload_tag}={value}: interruptions would hit users")
    if value:
        return Interruptibility(False, f"{policy.workload_tag}={value} is not a known interruptible kind")
    return Interruptibility(False, f"no '{policy.workload_tag}' tag: treated as not interruptible")


@dataclass(frozen=True)
class SpotVerdict:
    use_spot: bool
    expected_hourly: float  # spot price x (1 + rework)
    rework: float
    break_even_rework: float
    reason: str


def spot_expected_cost(spot_price: float, rate_per_hour: float, spot: SpotPolicy) -> tuple[float, float]:
    rework = rate_per_hour * (spot.checkpoint_interval_h / 2.0 + spot.restart_overhead_h)
    return spot_price * (1.0 + rework), rework


def spot_vs_on_demand(on_demand: float, spot_price: float | None, instance_type: str, region: str,
                      spot: SpotPolicy) -> SpotVerdict:
    if spot_price is None or spot_price <= 0:
        return SpotVerdict(False, math.nan, math.nan, math.nan, f"no spot price known for {instance_type} in {region}")
    rate = spot.rate_for(instance_type, region)
    expected, rework = spot_expected_cost(spot_price, rate, spot)
    break_even = on_demand / spot_price - 1.0
    wins = expected < on_demand * (1.0 - spot.min_saving_fraction)
    detail = (f"spot {format_money(spot_price, digits=3, per='h')} x (1 + {rework:.1%} rework at {rate:g} "
              f"interruptions/h, {spot.checkpoint_interval_h:g} h checkpoints) = "
              f"{format_money(expected, digits=3, per='h')} vs on-demand {format_money(on_demand, digits=3, per='h')}; "
              f"break-even rework {break_even:.0%}")
    return SpotVerdict(wins, expected, rework, break_even, detail)


@dataclass(frozen=True)
class Commitment:
    instance_type: str
    region: str
    baseline: int  # instances to commit
    on_demand_hourly: float
    commit_hourly: float
    break_even_utilisation: float
    monthly_savings: float
    reason: str


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default), without numpy."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def commitment(instance_type: str, region: str, hourly_counts: Sequence[int], on_demand: float,
               commit_price: float | None, policy: CommitmentPolicy, hours_per_month: float) -> Commitment | None:
    """A commitment for the steady baseline, or None when there is no steady baseline."""
    if len(hourly_counts) < policy.window_days * 24 * 0.5:
        return None  # under half the window observed: too little history to commit a year on
    baseline = int(math.floor(percentile(hourly_counts, policy.baseline_percentile)))
    if baseline < 1:
        return None
    priced = commit_price if commit_price else on_demand * (1.0 - policy.default_discount)
    src = "catalog committed price" if commit_price else f"assumed {policy.default_discount:.0%} discount"
    break_even = priced / on_demand
    savings = baseline * (on_demand - priced) * hours_per_month
    reason = (f"p{policy.baseline_percentile:g} of hourly count over {policy.window_days} days = {baseline}; "
              f"{policy.term} at {format_money(priced, digits=3, per='h')} ({src}) vs on-demand "
              f"{format_money(on_demand, digits=3, per='h')}; "
              f"pays off if those {baseline} instance(s) run at least {break_even:.0%} of hours")
    return Commitment(instance_type, region, baseline, on_demand, priced, break_even, savings, reason)
