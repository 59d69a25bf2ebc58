"""What a GPU metric can physically be: every number read is checked where it enters.

A DCGM sentinel (~9.2e18, "no data") divided by itself is 1: a query layer that
hands back sentinels inside aggregates (a sum and a count) made a 90%-busy GPU
look 1% active, and a mean rule stopped it. So every number a metrics source
reports, raw or aggregated, is checked against what its signal can be:
activity 0-100% (GR engine and every other DCGM profiling ratio 0-1), memory up to the GPU's memory,
power up to a multiple of its TDP, sample counts whole and no more than the
window holds, sums no more than count x the signal's maximum, never NaN or inf.
A GPU with any implausible figure is *invalid*: its instance is UNKNOWN
(ReasonCode.INVALID_DATA), never judged.

Pure functions, no I/O. The Prometheus collector calls them as it combines
answers; `evaluate` calls `validate_stats` again on whatever any MetricsSource
produced. The words returned say what was wrong and never print the number
read (a reason must never say "max 9223372036854775808%").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterable

from .model import MAX_PROCESSES_PER_GPU, SENTINEL_THRESHOLD, GpuWindowStats

ACTIVITY_PCT_MAX = 100.0  # DCGM_FI_DEV_GPU_UTIL, and GpuWindowStats activity, in percent
GR_ENGINE_RATIO_MAX = 1.0  # DCGM_FI_PROF_GR_ENGINE_ACTIVE is a ratio
# FB_USED may read a little over the nominal size (GB vs GiB rounding, reserved memory).
MEMORY_TOLERANCE = 1.05
# When the GPU's memory is unknown: above the largest GPU sold (288 GB), far below any sentinel.
MEMORY_CEILING_MIB = 512 * 1024.0
# Board power may spike past TDP; a window mean at twice TDP is not a measurement.
POWER_TDP_MULTIPLE = 2.0
# When the TDP is unknown: per GPU, above any board sold today.
POWER_CEILING_W = 2000.0
# More samples than window/scrape interval: scrape jitter may add one, a series
# handed over between pods inside one interval another; 10% more covers both.
SAMPLES_TOLERANCE = 0.10
# Floating-point slack for sums and ratios scaled to percent (not a measurement tolerance).
REL_TOL = 1e-6


@dataclass(frozen=True)
class Limit:
    """The largest plausible value, and how to say it in a reason."""

    ceiling: float
    words: str


def max_samples(expected_samples: int) -> int:
    """The most samples one GPU can have in a window that expects `expected_samples`."""
    expected = max(int(expected_samples), 0)
    return expected + max(1, math.ceil(expected * SAMPLES_TOLERANCE))


@lru_cache(maxsize=64)  # a tick asks it once per GPU for the same few windows
def samples_limit(expected_samples: int) -> Limit:
    most = max_samples(expected_samples)
    return Limit(float(most), f"more than the {most} samples the window can hold at the scrape interval")


def memory_limit(gpu_memory_gib: float | None) -> Limit:
    """The GPU's memory (with MEMORY_TOLERANCE) when known, else MEMORY_CEILING_MIB."""
    if gpu_memory_gib and math.isfinite(gpu_memory_gib) and gpu_memory_gib > 0:
        return Limit(gpu_memory_gib * 1024.0 * MEMORY_TOLERANCE, f"above the GPU's {gpu_memory_gib:g} GiB")
    return Limit(MEMORY_CEILING_MIB, f"above {MEMORY_CEILING_MIB / 1024:.0f} GiB, more than any GPU has")


def power_limit(tdp_w: float | None) -> Limit:
    """POWER_TDP_MULTIPLE x the GPU's TDP when known, else POWER_CEILING_W."""
    if tdp_w and math.isfinite(tdp_w) and tdp_w > 0:
        ceiling = min(POWER_TDP_MULTIPLE * tdp_w, POWER_CEILING_W)
        return Limit(ceiling, f"above {ceiling:.0f} W, {POWER_TDP_MULTIPLE:g}x the GPU's {tdp_w:.0f} W TDP")
    return Limit(POWER_CEILING_W, f"above {POWER_CEILING_W:.0f} W, more than any GPU draws")


ACTIVITY_PCT = Limit(ACTIVITY_PCT_MAX, "above 100%")
GR_ENGINE_RATIO = Limit(GR_ENGINE_RATIO_MAX, "above 1, the most a ratio can be")
PROFILING_RATIO = GR_ENGINE_RATIO  # every DCGM_FI_PROF_* ratio (SM active, occupancy, pipes, DRAM) is 0..1
PROCESS_COUNT = Limit(float(MAX_PROCESSES_PER_GPU), f"above {MAX_PROCESSES_PER_GPU}, more processes than a GPU runs")


def number_problem(value: float, limit: Limit | None = None, *, whole: bool = False) -> str:
    """"" when `value` is a plausible reading, else what is wrong with it in words (never the value)."""
    # The common case first, in one test (a tick checks some 14 numbers per GPU): a plain number in range. NaN
    # fails every comparison and infinity the sentinel's, so both go on to the words below.
    if (value.__class__ is float or value.__class__ is int) and 0 <= value < SENTINEL_THRESHOLD and (
            limit is None or value <= limit.ceiling * (1 + REL_TOL)) and (not whole or float(value).is_integer()):
        return ""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "not a number"
    if math.isnan(value):
        return "not a number (NaN)"
    if math.isinf(value):
        return "infinite"
    if value >= SENTINEL_THRESHOLD:
        return "a DCGM sentinel, i.e. no data"
    if value < 0:
        return "negative"
    if whole and not value.is_integer():
        return "not a whole number"
    if limit is not None and value > limit.ceiling * (1 + REL_TOL):
        return limit.words
    return ""


def out_of_range(what: str, source: str, problem: str) -> str:
    """The sentence for one implausible figure, e.g. "the activity sum read from Prometheus is out of range
    (a DCGM sentinel, i.e. no data)"."""
    return f"the {what} read from {source} is out of range ({problem})"


def aggregate_problem(
    count: float | None,
    total: float | None,
    maximum: float | None,
    minimum: float | None,
    value: Limit,
    samples: Limit,
) -> tuple[str, str] | None:
    """(which aggregate, what is wrong) for one signal of one GPU over a window, or None when plausible.

    count/total/maximum/minimum are None when the source did not report them. Checks each
    against the signal's range, then against each other (a sum above count x maximum, a
    minimum above the maximum), so a number that is in range alone but not with the rest fails.
    """
    if count is not None and (p := number_problem(count, samples, whole=True)):
        return "sample count", p
    if maximum is not None and (p := number_problem(maximum, value)):
        return "maximum", p
    if minimum is not None and (p := number_problem(minimum, value)):
        return "minimum", p
    if maximum is not None and minimum is not None and minimum > maximum * (1 + REL_TOL) + REL_TOL:
        return "minimum", "above the maximum read with it"
    if total is not None:
        if p := number_problem(total):
            return "sum", p
        if count is not None:
            n = int(count)
            if n == 0 and total > 0:
                return "sum", "a sum without samples"
            if total > n * value.ceiling * (1 + REL_TOL):
                return "sum", f"{value.words} on average over its {n} samples"
            if maximum is not None and total > n * maximum * (1 + REL_TOL) + REL_TOL:
                return "sum", f"above {n} samples x the maximum read with it"
            if minimum is not None and total < n * minimum * (1 - REL_TOL) - REL_TOL:
                return "sum", f"below {n} samples x the minimum read with it"
    return None


def stats_problem(
    stats: GpuWindowStats,
    expected_samples: int,
    memory: Limit,
    power: Limit,
    source: str,
) -> str:
    """"" when every figure of `stats` is plausible, else the sentence saying which is not and why."""
    if p := number_problem(stats.samples, samples_limit(expected_samples), whole=True):
        return out_of_range("activity sample count", source, p)
    activity = (("activity maximum", stats.activity_max), ("activity mean", stats.activity_mean),
                ("activity minimum", stats.activity_min))
    for what, v in activity:
        if v is not None and (p := number_problem(v, ACTIVITY_PCT)):
            return out_of_range(what, source, p)
    if stats.activity_mean is not None:
        lo = stats.activity_min if stats.activity_min is not None else 0.0
        hi = stats.activity_max if stats.activity_max is not None else ACTIVITY_PCT_MAX
        slack = REL_TOL * max(1.0, hi)
        if not (lo - slack <= stats.activity_mean <= hi + slack):
            return out_of_range("activity mean", source, "outside the minimum..maximum read with it")
    if stats.activity_min is not None and stats.activity_max is not None and \
            stats.activity_min > stats.activity_max + REL_TOL * max(1.0, stats.activity_max):
        return out_of_range("activity minimum", source, "above the maximum read with it")
    for what, v in (("second activity maximum", stats.second_activity_max),
                    ("second activity mean", stats.second_activity_mean)):
        if v is not None and (p := number_problem(v, ACTIVITY_PCT)):
            return out_of_range(what, source, p)
    for what, v in profiling_ratios(stats):
        if p := number_problem(v, PROFILING_RATIO):
            return out_of_range(what, source, p)
    if stats.fb_used_max_mib is not None and (p := number_problem(stats.fb_used_max_mib, memory)):
        return out_of_range("memory used", source, p)
    if stats.power_mean_w is not None and (p := number_problem(stats.power_mean_w, power)):
        return out_of_range("power draw", source, p)
    return ""


def profiling_ratios(stats: GpuWindowStats) -> list[tuple[str, float]]:
    """(how a reason names it, value) of every DCGM profiling ratio `stats` holds."""
    named = [("SM activity", stats.sm_active), ("SM occupancy", stats.sm_occupancy),
             ("tensor pipe activity", stats.tensor_active), ("DRAM activity", stats.dram_active)]
    named += [(f"{precision.upper()} pipe activity", v) for precision, v in stats.pipes]
    return [(what, v) for what, v in named if v is not None]


def invalidated(stats: GpuWindowStats, problem: str) -> GpuWindowStats:
    """The stats marked invalid, with every figure blanked: nothing downstream can use or print them."""
    return replace(stats, invalid=problem, samples=0, activity_max=None, activity_mean=None,
                   activity_min=None, fb_used_max_mib=None, power_mean_w=None, second_activity_max=None,
                   second_activity_mean=None, sm_active=None, sm_occupancy=None, tensor_active=None,
                   dram_active=None, pipes=())


def validate_stats(
    stats: GpuWindowStats,
    expected_samples: int,
    memory_ceiling_mib: float = MEMORY_CEILING_MIB,
    power_ceiling_w: float = POWER_CEILING_W,
    *,
    source: str = "the metrics source",
) -> GpuWindowStats:
    """`stats` unchanged when plausible (or already invalid), else invalidated with the reason.

    The ceilings are plain numbers here (the defensive check in evaluate knows no TDP);
    the collector passes the GPU's own limits through `validate_stats_within`.
    """
    return validate_stats_within(
        stats, expected_samples,
        Limit(memory_ceiling_mib, f"above {memory_ceiling_mib / 1024:g} GiB"),
        Limit(power_ceiling_w, f"above {power_ceiling_w:g} W"),
        source=source,
    )


def validate_stats_within(
    stats: GpuWindowStats, expected_samples: int, memory: Limit, power: Limit, *, source: str
) -> GpuWindowStats:
    if stats.invalid:
        return stats
    problem = stats_problem(stats, expected_samples, memory, power, source)
    return invalidated(stats, problem) if problem else stats


def invalid_reason(gpus: Iterable[GpuWindowStats], shown: int = 2) -> str:
    """The reason for an instance some of whose GPUs are invalid, e.g. "GPU 3: the activity sum read from
    Prometheus is out of range (a DCGM sentinel, i.e. no data): not judged"."""
    bad = [g for g in gpus if g.invalid]
    parts = [f"GPU {g.gpu}: {g.invalid}" for g in bad[:shown]]
    more = len(bad) - len(parts)
    tail = f"; and {more} more GPU{'s' if more > 1 else ''}" if more > 0 else ""
    return "; ".join(parts) + tail + ": not judged"


__all__ = [
    "Limit", "ACTIVITY_PCT", "GR_ENGINE_RATIO", "PROFILING_RATIO", "profiling_ratios", "max_samples",
    "samples_limit", "memory_limit", "power_limit",
    "number_problem", "out_of_range", "aggregate_problem", "stats_problem", "invalidated", "validate_stats",
    "validate_stats_within", "invalid_reason",
]
