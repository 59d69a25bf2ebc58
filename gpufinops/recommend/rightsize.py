"""Right-size one instance from its long-window usage. Pure: values in, a value out.

The candidate must hold, on every GPU it keeps, the largest per-GPU peak
memory seen plus headroom (never less memory than observed), must keep at
least as many GPUs as ever did work, and must offer the observed compute
(sum over working GPUs of p95 activity x that GPU's dense BF16 TFLOPS, plus
headroom). The cheapest such offer wins; the current type is the fallback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufinops.catalog import Catalog, InstanceOffer
from gpufinops.model import GpuInstance
from gpufinops.recommend.policy import RecommendPolicy
from gpufinops.recommend.usage import LongUsage


@dataclass(frozen=True)
class Observed:
    gpus_total: int
    gpus_worked: int
    peak_mem_mib: float  # largest per-GPU peak
    p99_mem_mib: float | None
    activity_p95_max: float  # highest per-GPU p95, percent
    demand_tflops: float  # compute the work used, in dense BF16 TFLOPS


@dataclass(frozen=True)
class SizingResult:
    status: str  # "ok" | "insufficient_data" | "unknown_type"
    reason: str
    current: InstanceOffer | None = None
    candidate: InstanceOffer | None = None  # None with status ok = keep current
    observed: Observed | None = None
    risk: str = "none"  # none | low | medium | high


def _usable_mib(gpu_memory_gb: float, policy: RecommendPolicy) -> float:
    return gpu_memory_gb * 1024.0 * policy.usable_memory_fraction


def observe(inst: GpuInstance, usage: LongUsage | None, current: InstanceOffer, catalog: Catalog,
            policy: RecommendPolicy) -> tuple[Observed | None, str]:
    """Summarise usage, or say why it is not enough to judge."""
    days = policy.window_days
    if usage is None:
        return None, f"insufficient data: no DCGM series for this instance in the last {days} days"
    if usage.error:
        return None, f"insufficient data: {usage.error}"
    expected_gpus = current.gpu_count
    if len(usage.gpus) < expected_gpus:
        return None, (f"insufficient data: {len(usage.gpus)} of {expected_gpus} GPUs have DCGM series "
                      f"(a GPU without data is unknown, not unused)")
    low = [g for g in usage.gpus if g.samples < policy.min_coverage * usage.expected_samples]
    if low:
        worst = min(g.samples for g in low) / usage.expected_samples
        return None, (f"insufficient data: GPU {low[0].gpu} has {worst:.0%} of the samples expected over "
                      f"{days} days (need {policy.min_coverage:.0%})")
    if any(g.mem_max_mib is None or g.activity_p95 is None for g in usage.gpus):
        return None, "insufficient data: memory or activity not measured (DCGM sentinel values) on some GPU"
    tflops = catalog.gpus[current.gpu].bf16_tflops
    worked = [g for g in usage.gpus if (g.activity_max or 0) >= policy.worked_activity_pct]
    demand = sum(min(100.0, g.activity_p95 * (1 + policy.compute_headroom)) / 100.0 * tflops for g in worked)
    return Observed(
        gpus_total=len(usage.gpus),
        gpus_worked=len(worked),
        peak_mem_mib=max(g.mem_max_mib for g in usage.gpus),
        p99_mem_mib=usage.p99_mem_mib,
        activity_p95_max=max(g.activity_p95 for g in usage.gpus),
        demand_tflops=demand,
    ), ""


def fits(offer: InstanceOffer, obs: Observed, catalog: Catalog, policy: RecommendPolicy) -> bool:
    need_mib = obs.peak_mem_mib * (1 + policy.memory_headroom)
    if _usable_mib(offer.gpu_memory_gb, policy) < need_mib:
        return False
    if offer.gpu_count < max(1, obs.gpus_worked):
        return False
    return catalog.tflops(offer) >= obs.demand_tflops


def _risk(current: InstanceOffer, cand: InstanceOffer, obs: Observed, catalog: Catalog,
          policy: RecommendPolicy) -> tuple[str, str]:
    mem_margin = _usable_mib(cand.gpu_memory_gb, policy) / max(obs.peak_mem_mib, 1.0)
    compute_margin = catalog.tflops(cand) / obs.demand_tflops if obs.demand_tflops > 0 else math.inf
    if compute_margin < 1.5 or mem_margin < 1.3:
        return "high", f"little margin: {mem_margin:.1f}x peak memory, {compute_margin:.1f}x observed compute"
    if cand.gpu != current.gpu:
        cur_bw = catalog.gpus[current.gpu]
        return "medium", (f"different GPU ({current.gpu} -> {cand.gpu}): memory bandwidth, interconnect and "
                          f"kernel support differ from {cur_bw.gpu}; benchmark before switching "
                          f"({mem_margin:.1f}x peak memory, {compute_margin:.1f}x observed compute)")
    return "low", (f"same GPU model, only GPUs that never worked are dropped "
                   f"({mem_margin:.1f}x peak memory, {compute_margin:.1f}x observed compute)")


def rightsize(inst: GpuInstance, usage: LongUsage | None, catalog: Catalog, policy: RecommendPolicy) -> SizingResult:
    current = catalog.offer(inst.provider, inst.instance_type, inst.region)
    if current is None:
        return SizingResult("unknown_type", f"{inst.provider}:{inst.instance_type} is not in the GPU catalog")
    obs, why = observe(inst, usage, current, catalog, policy)
    if obs is None:
        return SizingResult("insufficient_data", why, current)
    providers = policy.providers or (inst.provider,)
    pool = catalog.offers_for(providers, inst.region if policy.same_region else None)
    where = ""
    if not pool:  # the catalog has no prices for this region: compare the provider's bundled regions
        pool = catalog.offers_for(providers)
        where = f" (no catalog prices for {inst.region}; compared at {', '.join(sorted({o.region for o in pool}))})"
    best: InstanceOffer | None = None
    for offer in pool:
        if fits(offer, obs, catalog, policy) and (best is None or offer.on_demand_usd_h < best.on_demand_usd_h):
            best = offer
    peak_gib = obs.peak_mem_mib / 1024
    summary = (f"peak {peak_gib:.1f} GiB/GPU, p95 activity {obs.activity_p95_max:.0f}%, "
               f"{obs.gpus_worked} of {obs.gpus_total} GPUs did work over {policy.window_days} days")
    if best is None or best.instance_type == current.instance_type or best.on_demand_usd_h >= current.on_demand_usd_h:
        return SizingResult("ok", f"keep: {summary}; no cheaper type fits", current, None, obs, "none")
    risk, risk_why = _risk(current, best, obs, catalog, policy)
    reason = f"{summary}; {best.gpu_count}x {best.gpu} fits: {risk_why}{where}"
    return SizingResult("ok", reason, current, best, obs, risk)
