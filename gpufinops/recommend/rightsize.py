"""Right-size one instance from its long-window usage. Pure: values in, a value out.

The candidate must hold, on every GPU it keeps, the largest per-GPU peak
memory seen plus headroom (never less memory than observed), must keep at
least as many GPUs as ever did work, and must offer the observed compute
(sum over working GPUs of p95 activity x that GPU's dense BF16 TFLOPS, plus
headroom). The cheapest such offer wins; the current type is the fallback.

SM activity and memory together (issue 25). Where DCGM_FI_PROF_SM_ACTIVE is exported on every working GPU with
enough samples, the observed compute is its p95 (the share of SM cycles with work), not the activity counter's
(the share of time any kernel runs: a job on 12% of an H100's SMs reads ~100% there). On a GPU model that MIG can
split (prices.mig), each working GPU's SM activity, memory and, where exported, DRAM activity are also fitted to
the smallest MIG profile; the slices' share of what the GPU costs now competes with the cheaper instance types,
and the cheaper wins. Without SM activity the sizing is the activity-only one, and the reason says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufinops.prices.catalog import Catalog, InstanceOffer
from gpufinops.collect.prometheus import SM_ACTIVE
from gpufinops.model import GpuInstance, format_money
from gpufinops.prices.mig import MIG_PROFILES, GpuNeed, MigProfile, smallest_fit
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
    # SM activity (DCGM_FI_PROF_SM_ACTIVE, ratio 0..1): the highest p95 of the working GPUs, None when it is not
    # measured on every working GPU (then `demand_tflops` comes from the activity counter and no MIG is fitted).
    sm_p95_max: float | None = None
    sm_occupancy: float | None = None  # mean SM occupancy of the working GPUs, where exported (for the reason)
    needs: tuple[GpuNeed, ...] = ()  # per working GPU, what a MIG slice must hold (with SM activity only)
    sm_missing: str = ""  # why SM activity was not used, in words ("" when it was)


@dataclass(frozen=True)
class SizingResult:
    status: str  # "ok" | "insufficient_data" | "unknown_type"
    reason: str
    current: InstanceOffer | None = None
    candidate: InstanceOffer | None = None  # None with status ok = keep current (or `mig`)
    observed: Observed | None = None
    risk: str = "none"  # none | low | medium | high
    mig: "MigChoice | None" = None  # the work fits MIG slices of the current GPU model, cheaper than `candidate`


@dataclass(frozen=True)
class MigChoice:
    """MIG slices of the current GPU model, one per working GPU: what they take of a GPU and cost of it."""

    gpu: str  # catalog GPU key
    profiles: tuple[MigProfile, ...]
    share: float  # GPUs' worth taken from others (sum of the profiles' shares)
    usd_h: float  # share x what one GPU of the current instance costs per hour (on-demand catalog price)

    def label(self) -> str:
        names: dict[str, int] = {}
        for p in self.profiles:
            names[p.name] = names.get(p.name, 0) + 1
        what = " + ".join(f"{n}x {name}" if n > 1 else name for name, n in names.items())
        return f"{self.gpu} MIG {what} ({self.share:.2f} of a GPU, shared)"


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
    sm_missing = sm_gap(worked or list(usage.gpus), usage.expected_samples, policy)
    if sm_missing:
        used = [g.activity_p95 for g in worked]
        needs: tuple[GpuNeed, ...] = ()
    else:
        used = [g.sm_p95 * 100.0 for g in worked]
        # The GPUs a slice must hold: those that worked, else the one holding the most memory.
        placed = worked or [max(usage.gpus, key=lambda g: g.mem_max_mib)]
        needs = tuple(GpuNeed(g.gpu, g.mem_max_mib, g.sm_p95, g.dram_p95) for g in placed)
    demand = sum(min(100.0, pct * (1 + policy.compute_headroom)) / 100.0 * tflops for pct in used)
    occupancy = [g.sm_occupancy_mean for g in worked if g.sm_occupancy_mean is not None]
    return Observed(
        gpus_total=len(usage.gpus),
        gpus_worked=len(worked),
        peak_mem_mib=max(g.mem_max_mib for g in usage.gpus),
        p99_mem_mib=usage.p99_mem_mib,
        activity_p95_max=max(g.activity_p95 for g in usage.gpus),
        demand_tflops=demand,
        sm_p95_max=None if sm_missing else max((n.sm_p95 for n in needs), default=None),
        sm_occupancy=sum(occupancy) / len(occupancy) if occupancy and not sm_missing else None,
        needs=needs,
        sm_missing=sm_missing,
    ), ""


def sm_gap(gpus, expected_samples: int, policy: RecommendPolicy) -> str:
    """"" when every one of `gpus` has its SM activity p95 from enough samples; else why not, in words."""
    if all(g.sm_p95 is None and g.sm_samples == 0 for g in gpus):
        return f"no {SM_ACTIVE} series"
    missing = [g.gpu for g in gpus if g.sm_p95 is None]
    if missing:
        return f"no valid {SM_ACTIVE} figure for GPU {', '.join(missing[:4])}"
    low = [g for g in gpus if g.sm_samples < policy.min_coverage * expected_samples]
    if low:
        return (f"{SM_ACTIVE} has {min(g.sm_samples for g in low) / max(expected_samples, 1):.0%} of the samples "
                f"expected on GPU {low[0].gpu} (need {policy.min_coverage:.0%})")
    return ""


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


def fit_mig(current: InstanceOffer, obs: Observed, policy: RecommendPolicy) -> MigChoice | None:
    """One MIG slice per working GPU, each the smallest profile of the current GPU model that holds it; None when
    SM activity is not measured, the model has no MIG profiles here, or some GPU needs a whole GPU."""
    if obs.sm_p95_max is None or not obs.needs or current.gpu not in MIG_PROFILES:
        return None
    profiles = []
    for need in obs.needs:
        p = smallest_fit(current.gpu, need, policy.memory_headroom, policy.compute_headroom,
                         policy.usable_memory_fraction)
        if p is None:
            return None
        profiles.append(p)
    share = sum(p.share for p in profiles)
    if share >= current.gpu_count:
        return None
    return MigChoice(current.gpu, tuple(profiles), share, share * current.on_demand_usd_h / current.gpu_count)


def _mig_risk(choice: MigChoice, obs: Observed, policy: RecommendPolicy) -> tuple[str, str]:
    compute_margin = min(p.sm_share / max(n.sm_p95, 1e-9) for p, n in zip(choice.profiles, obs.needs))
    mem_margin = min(p.memory_gb * 1024.0 * policy.usable_memory_fraction / max(n.mem_max_mib, 1.0)
                     for p, n in zip(choice.profiles, obs.needs))
    margins = f"{mem_margin:.1f}x peak memory, {compute_margin:.1f}x p95 SM activity"
    if compute_margin < 1.5 or mem_margin < 1.3:
        return "high", f"little margin: {margins}"
    return "medium", (f"a slice has fewer SMs and a share of the L2 cache and memory bandwidth; benchmark on the "
                      f"slice before switching ({margins})")


def _observed_words(obs: Observed, policy: RecommendPolicy) -> str:
    peak_gib = obs.peak_mem_mib / 1024
    sm = ""
    if obs.sm_p95_max is not None:
        occ = f", occupancy {obs.sm_occupancy:.0%}" if obs.sm_occupancy is not None else ""
        sm = f", p95 SM activity {obs.sm_p95_max:.0%}{occ}"
    return (f"peak {peak_gib:.1f} GiB/GPU, p95 activity {obs.activity_p95_max:.0f}%{sm}, "
            f"{obs.gpus_worked} of {obs.gpus_total} GPUs did work over {policy.window_days} days")


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
    summary = _observed_words(obs, policy)
    # Without SM activity the sizing is the activity-only one (as before issue 25), and the reason says so.
    alone = (f"; sized on activity alone ({obs.sm_missing}: compute from {usage.gpus[0].signal}, "
             f"no MIG slice considered)" if obs.sm_missing else "; compute from SM activity")
    if best is not None and (best.instance_type == current.instance_type
                             or best.on_demand_usd_h >= current.on_demand_usd_h):
        best = None
    mig = fit_mig(current, obs, policy)
    if mig is not None and mig.usd_h < (best.on_demand_usd_h if best is not None else current.on_demand_usd_h):
        risk, risk_why = _mig_risk(mig, obs, policy)
        other = (f"; or {best.instance_type} ({best.gpu_count}x {best.gpu}) at "
                 f"{format_money(best.on_demand_usd_h, per='h')}"
                 if best is not None else "")
        reason = (f"{summary}{alone}; fits MIG {' + '.join(p.name for p in mig.profiles)} of a {mig.gpu}: "
                  f"{mig.share:.2f} of a GPU, saved once the GPU's other slices carry other work (pack jobs onto "
                  f"MIG-partitioned GPUs){other}: {risk_why}")
        return SizingResult("ok", reason, current, None, obs, risk, mig)
    if best is None:
        return SizingResult("ok", f"keep: {summary}{alone}; no cheaper type fits", current, None, obs, "none")
    risk, risk_why = _risk(current, best, obs, catalog, policy)
    other = f"; or MIG {' + '.join(p.name for p in mig.profiles)} ({mig.share:.2f} of a GPU)" if mig else ""
    reason = f"{summary}{alone}; {best.gpu_count}x {best.gpu} fits: {risk_why}{where}{other}"
    return SizingResult("ok", reason, current, best, obs, risk)
