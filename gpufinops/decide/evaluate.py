"""Pure decisions: (instance, its GPU usage over a window, rule, now) -> Decision.

No I/O, no clock of its own. The live service, the demo and the backtest all
call `evaluate`; the backtest also uses `window_is_idle` on whole numpy arrays
of window aggregates, so the idle predicate is literally the same code.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime
from typing import Sequence

import numpy as np

from ..metric_ranges import ACTIVITY_PCT_MAX, MEMORY_CEILING_MIB, POWER_CEILING_W, invalid_reason, validate_stats
from ..model import (
    Aggregation,
    Decision,
    GpuInstance,
    GpuWindowStats,
    InstanceUsage,
    ReasonCode,
    Rule,
    Verdict,
)

# A GPU holding at least this much memory while idle is reported as "memory held".
MEMORY_HELD_MIB = 1024.0
# "Low but bursty" (input-, host- or latency-bound work): peaks reach real load and stand
# well above the mean. Smaller flickers are reported as plain low use.
BURST_MIN_PCT = 30.0
BURST_RATIO = 2.0


def window_is_idle(activity_max, activity_mean, threshold_pct: float, aggregation: Aggregation):
    """The idle predicate for one GPU-window (scalars or numpy arrays).

    stays_below: every sample under the threshold (the window max is under it).
    mean: the window mean is under it.
    NaN (not measured) is never idle.
    """
    value = activity_max if aggregation == Aggregation.STAYS_BELOW else activity_mean
    value = np.asarray(value, dtype=float)
    result = np.less(value, threshold_pct, where=~np.isnan(value), out=np.zeros(value.shape, dtype=bool))
    return bool(result) if result.ndim == 0 else result


def coverage_ok(samples, expected_samples: int, min_coverage: float):
    """Enough valid samples to judge (scalars or numpy arrays)."""
    ratio = np.asarray(samples, dtype=float) / max(expected_samples, 1)
    ok = ratio >= min_coverage - 1e-9
    return bool(ok) if ok.ndim == 0 else ok


def _plausible(v: float | None, ceiling: float) -> bool:
    return v is not None and math.isfinite(v) and 0.0 <= v <= ceiling * (1 + 1e-6)


def _fmt_pct(v: float | None) -> str:
    # Only validated figures reach here; an implausible one is still never printed.
    return f"{v:.0f}%" if _plausible(v, ACTIVITY_PCT_MAX) else "n/a"


def _fmt_gb(mib: float | None) -> str:
    return f"{mib / 1024:.0f} GB" if _plausible(mib, MEMORY_CEILING_MIB) else "n/a"


def _fmt_mib(mib: float | None) -> str:
    return f"{mib:.0f} MiB" if _plausible(mib, MEMORY_CEILING_MIB) else "n/a"


def checked_usage(usage: InstanceUsage) -> InstanceUsage:
    """`usage` with every GPU's figures range-checked (metric_ranges), whichever MetricsSource produced them.

    The memory and power ceilings are the absolute ones: the collector checks against the GPU's own
    memory and TDP where it reads them; this check is the last line against sentinels and garbage.
    """
    gpus = tuple(validate_stats(g, usage.expected_samples, MEMORY_CEILING_MIB, POWER_CEILING_W) for g in usage.gpus)
    return usage if gpus == usage.gpus else replace(usage, gpus=gpus)


def _fmt_window(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def _physical_gpu(stats: GpuWindowStats) -> str:
    # MIG slices are reported as "gpu/instance"; the physical GPU is the part before "/".
    return stats.gpu.split("/", 1)[0]


def evaluate(inst: GpuInstance, usage: InstanceUsage | None, rule: Rule, now: datetime) -> Decision:
    """Judge one instance under one rule. Missing or partial data is UNKNOWN, never IDLE."""

    def decide(verdict: Verdict, code: ReasonCode, reason: str, **stats) -> Decision:
        return Decision(
            instance_id=inst.instance_id,
            rule_name=rule.name,
            verdict=verdict,
            code=code,
            reason=reason,
            evaluated_at=now,
            action=rule.action,
            window_s=rule.window_s,
            hourly_cost=inst.hourly_cost,
            **stats,
        )

    window = _fmt_window(rule.window_s)
    if not inst.is_running:
        return decide(Verdict.UNKNOWN, ReasonCode.NOT_RUNNING, f"instance is {inst.state}, not judged")
    age_s = (now - inst.launch_time).total_seconds()
    if age_s < rule.window_s:
        return decide(
            Verdict.UNKNOWN, ReasonCode.TOO_YOUNG,
            f"running for {_fmt_window(max(0, int(age_s)))}; not judged before a full {window} window",
        )
    if usage is None or usage.error:
        err = usage.error if usage is not None else "no usage collected"
        return decide(Verdict.UNKNOWN, ReasonCode.QUERY_ERROR, f"metrics unavailable: {err}")
    if not usage.gpus:
        return decide(Verdict.UNKNOWN, ReasonCode.NO_SERIES, "no DCGM series for this instance (exporter down or not mapped)")
    usage = checked_usage(usage)
    if any(g.invalid for g in usage.gpus):
        return decide(Verdict.UNKNOWN, ReasonCode.INVALID_DATA, invalid_reason(usage.gpus))

    seen = {_physical_gpu(g) for g in usage.gpus}
    if inst.gpu_count and len(seen) < inst.gpu_count:
        return decide(
            Verdict.UNKNOWN, ReasonCode.NO_SERIES,
            f"{inst.gpu_count - len(seen)} of {inst.gpu_count} GPUs have no DCGM series",
        )

    expected = usage.expected_samples
    worst = min(g.samples for g in usage.gpus) / max(expected, 1)
    unmeasured = [g.gpu for g in usage.gpus if g.activity_max is None or g.activity_mean is None]
    if unmeasured:
        return decide(
            Verdict.UNKNOWN, ReasonCode.NO_SERIES,
            f"GPU {', '.join(unmeasured[:4])} has no valid activity samples in the last {window}", coverage=worst,
        )
    if not coverage_ok(min(g.samples for g in usage.gpus), expected, rule.min_coverage):
        low = min(usage.gpus, key=lambda g: g.samples)
        return decide(
            Verdict.UNKNOWN, ReasonCode.LOW_COVERAGE,
            f"GPU {low.gpu} has {low.samples} of {expected} expected samples in the last {window} "
            f"({worst:.0%} < {rule.min_coverage:.0%} required)",
            coverage=worst,
        )

    act_max = max(g.activity_max for g in usage.gpus)
    act_mean = sum(g.activity_mean for g in usage.gpus) / len(usage.gpus)
    mems = [g.fb_used_max_mib for g in usage.gpus if g.fb_used_max_mib is not None]
    mem_max = max(mems) if mems else None
    stats = dict(activity_mean=act_mean, activity_max=act_max, memory_max_mib=mem_max, coverage=worst)

    idle_flags = [
        window_is_idle(g.activity_max, g.activity_mean, rule.threshold_pct, rule.aggregation) for g in usage.gpus
    ]
    memory_veto = (
        rule.max_memory_mib is not None and mem_max is not None and mem_max > rule.max_memory_mib
    )
    if all(idle_flags) and not memory_veto:
        dropped = [g.gpu for g in usage.gpus if g.dropped_invalid]
        if dropped:
            # Idle from the valid samples alone is a guess about the others: missing data is never idle.
            return decide(
                Verdict.UNKNOWN, ReasonCode.INVALID_DATA,
                f"GPU {', '.join(dropped[:4])}: some activity samples in the last {window} are out of range "
                f"(DCGM sentinels, i.e. no data): not judged idle", **stats,
            )
        how = "every sample" if rule.aggregation == Aggregation.STAYS_BELOW else "mean"
        if mem_max is not None and mem_max >= MEMORY_HELD_MIB and act_max < 1.0:
            return decide(
                Verdict.IDLE, ReasonCode.MEMORY_HELD_IDLE,
                f"holds {_fmt_gb(mem_max)} on a GPU but 0% active for {window}: memory held is not work",
                **stats,
            )
        code = ReasonCode.IDLE_STAYS_BELOW if rule.aggregation == Aggregation.STAYS_BELOW else ReasonCode.IDLE_MEAN_BELOW
        return decide(
            Verdict.IDLE, code,
            f"all {len(usage.gpus)} GPU(s) idle: {how} under {rule.threshold_pct:g}% for {window} "
            f"(max {_fmt_pct(act_max)}, mean {_fmt_pct(act_mean)})",
            **stats,
        )

    if memory_veto and all(idle_flags):
        return decide(
            Verdict.UNDERUTILIZED, ReasonCode.LOW_STEADY,
            f"activity under {rule.threshold_pct:g}% but holds {_fmt_mib(mem_max)} "
            f"(over the {rule.max_memory_mib:.0f} MiB this rule allows an idle GPU)",
            **stats,
        )
    busy = [g for g, idle in zip(usage.gpus, idle_flags) if not idle]
    if act_mean < rule.underutilized_below_pct:
        if len(busy) < len(usage.gpus):
            return decide(
                Verdict.UNDERUTILIZED, ReasonCode.SOME_GPUS_BUSY,
                f"only {len(busy)} of {len(usage.gpus)} GPUs did work in the last {window} "
                f"(mean {_fmt_pct(act_mean)}): consider a smaller instance",
                **stats,
            )
        if act_max >= max(rule.threshold_pct, BURST_MIN_PCT) and act_max >= BURST_RATIO * act_mean:
            return decide(
                Verdict.UNDERUTILIZED, ReasonCode.BURSTY_LOW,
                f"mean {_fmt_pct(act_mean)} but bursts to {_fmt_pct(act_max)}: working, likely input-, host- or "
                f"latency-bound (check data loading, CPU preprocessing, batch size)",
                **stats,
            )
        return decide(
            Verdict.UNDERUTILIZED, ReasonCode.LOW_STEADY,
            f"low but not idle under this rule: mean {_fmt_pct(act_mean)}, max {_fmt_pct(act_max)} over {window}",
            **stats,
        )
    return decide(
        Verdict.ACTIVE, ReasonCode.BUSY,
        f"busy: mean {_fmt_pct(act_mean)}, max {_fmt_pct(act_max)} over {window}", **stats,
    )


def evaluate_all(
    instances: Sequence[GpuInstance],
    usage_by_window: dict[int, dict[str, InstanceUsage]],
    rules: Sequence[Rule],
    now: datetime,
) -> list[Decision]:
    """Every matching (instance, rule) pair, in rule order."""
    out = []
    for inst in instances:
        for rule in rules:
            if rule.selector.matches(inst):
                usage = usage_by_window.get(rule.window_s, {}).get(inst.instance_id)
                out.append(evaluate(inst, usage, rule, now))
    return out
