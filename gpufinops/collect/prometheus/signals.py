"""The signals the collector reads and the facts about them: DCGM metric names, the labels that identify one GPU,
what the clean query computes per signal (`_SIGNAL_AGGS`), which signals ride in another's query (FOLDED), and the
tests a number of an answer meets (`is_valid_sample`, `needs_detail`). Pure: names and numbers only."""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

from gpufinops.collect.gpu_snapshot import PROCESSES_METRIC
from gpufinops.metric_ranges import PROFILING_RATIO, REL_TOL
from gpufinops.model import SENTINEL_THRESHOLD

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # ratio 0..1; all a MIG slice has
# DCGM profiling ratios 0..1 (dcgm-exporter's DCP fields; SM_ACTIVE, SM_OCCUPANCY and the FP pipes are off in its
# default CSV, docs/metrics.md shows the lines to add). Read as window means, to say why use stays low. DRAM_ACTIVE
# is named for right-sizing (recommend.usage reads its p95 over days); the tick does not read it: no verdict or
# cause uses it, and it cost a range function per GPU.
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
SM_OCCUPANCY = "DCGM_FI_PROF_SM_OCCUPANCY"
TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
PIPE_ACTIVE = {"fp64": "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp32": "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
               "fp16": "DCGM_FI_PROF_PIPE_FP16_ACTIVE"}
PROFILING_SIGNALS = (SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, *PIPE_ACTIVE.values())  # what a tick reads
# The profiling ratios that only say why use is low (never a verdict's figure: IDLE needs SM activity, not these),
# read every `profiling_reasons_every_s` and kept per GPU between reads: the engine pays one range function per
# GPU for each (BENCHMARKS.md, "Profiling counters in the tick").
REASON_SIGNALS = (SM_OCCUPANCY, TENSOR_ACTIVE, *PIPE_ACTIVE.values())
# Instances are read for them in turns, a fifth at a time (by the last character of the instance label, as shards
# are): each tick pays a fifth of their cost instead of all of it every fifth tick.
REASON_SLOTS = 5
FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"  # W
# Compute processes per GPU / MIG instance, exported by `gpufinops agent` only (not dcgm-exporter): evidence of
# work where no activity counter exists. Read in the memory query (see FOLDED), so it adds no query.
PROCESSES = PROCESSES_METRIC

# Labels that identify one GPU (or MIG slice) on one host. `instance`, `job`,
# driver version and pod labels are left out on purpose: they change while the
# GPU stays the same, and per-GPU figures must span those changes.
GPU_LABELS = ("gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "modelName")
# The activity signals of the backtest's history read (`activity_percent`), in its order, each with its factor to
# percent: a MIG slice has only the second. The live collector prefers the GR engine where a GPU has both
# (`_Gpu.stats`); the backtest's order is kept until its replays are re-based (issue 25, reported).
ACTIVITY_SIGNALS = ((GPU_UTIL, 1.0), (GR_ENGINE_ACTIVE, 100.0))


def host_labels(instance_label: str, hostname_labels: Iterable[str]) -> tuple[str, ...]:
    """The labels that name a GPU's host, in the order InstanceMatcher tries them (instance id, then hostnames:
    dcgm-exporter's `Hostname` and, since 2026, `hostname`)."""
    return tuple(dict.fromkeys(n for n in (instance_label, *hostname_labels) if n))


def gpu_identity_labels(instance_label: str, hostname_labels: Iterable[str]) -> tuple[str, ...]:
    """The labels that identify one GPU (or MIG slice) on one host: what per-GPU aggregates go `by`."""
    return tuple(dict.fromkeys((*host_labels(instance_label, hostname_labels), *GPU_LABELS)))


def selected(metric: str, selector: str) -> str:
    """The metric with the configured extra label matchers, if any."""
    return f"{metric}{{{selector}}}" if selector.strip() else metric


def activity_percent(by: Sequence[str], selector: str) -> str:
    """PromQL: activity in percent per GPU (`max by` its identity), DCGM_FI_DEV_GPU_UTIL where the GPU has a
    valid sample, else 100 x DCGM_FI_PROF_GR_ENGINE_ACTIVE (the fallback, per step). Sentinels,
    negatives and NaN are dropped before the fallback (no data, never a figure). Both sides are aggregated by
    the same labels, so `or` falls back per GPU and per step, never mixing two signals of one GPU."""
    labels, hi = ", ".join(by), f"{SENTINEL_THRESHOLD:g}"
    return " or ".join(
        f"{'' if scale == 1.0 else f'{scale:g} * '}max by ({labels}) ({selected(metric, selector)} < {hi} >= 0)"
        for metric, scale in ACTIVITY_SIGNALS)

# What the clean query computes per GPU, by the `agg` label of its answer. Unfiltered aggregates over the raw
# samples; together they reveal any invalid sample (see `needs_detail`): a sentinel or +Inf raises the
# maximum (FB_USED, activity) or the sum (power: a real sum stays far below the threshold), a negative or -Inf
# lowers the minimum, a NaN makes the sum NaN (Prometheus' max/min skip NaN; VictoriaMetrics drops NaN samples).
_SIGNAL_AGGS: dict[str, tuple[str, ...]] = {
    GPU_UTIL: ("count", "sum", "max", "min"),
    GR_ENGINE_ACTIVE: ("count", "sum", "max", "min"),
    FB_USED: ("max",),  # max skips a NaN, and a negative never beats a valid sample
    POWER_USAGE: ("count", "sum", "min"),
    # count for coverage, max for "a process ran"; min and sum reveal a negative or a non-whole count.
    PROCESSES: ("count", "sum", "max", "min"),
    # One range function each (engine CPU per tick, BENCHMARKS.md "Profiling counters"): the window mean says
    # why use is low; a sentinel, NaN or a mean above 1 shows invalid samples (`needs_detail`). Their coverage
    # is the activity counter's: dcgm-exporter writes every profiling field of a GPU in the same scrape.
    **{metric: ("mean",) for metric in PROFILING_SIGNALS},
}
# Signals whose clean legs ride in another signal's query, with agg labels prefixed "<prefix>_": the
# processes legs are `or`-ed into the memory query (both come from gpufinops agent, per GPU instance), so the
# number of HTTP queries per tick stays fixed. The engine evaluates the legs alike either way: free on a fleet
# without the series, four more range functions per GPU that has it (docs/metrics.md, "Evidence of work").
# The other profiling ratios ride in the SM activity query alike (agg "sm_occupancy_mean", ...): they come from
# the same DCGM profiling module, and a GPU without it costs nothing more. Not in the GR engine query: measured,
# Prometheus spent 4.0 CPU-s on the GR engine legs `or`-ed with the profiling legs at 10k GPUs, against 1.4 + 1.2
# for the two sets apart (each `or` hashes every series it has gathered so far).
FOLDED: Mapping[str, tuple[str, str]] = {
    PROCESSES: (FB_USED, "processes"),
    **{metric: (SM_ACTIVE, metric.removeprefix("DCGM_FI_PROF_").lower()) for metric in PROFILING_SIGNALS
       if metric != SM_ACTIVE},
}
# The signals with a query of their own, in query order.
QUERIED_SIGNALS = tuple(m for m in _SIGNAL_AGGS if m not in FOLDED)
# Signals whose GPUs with invalid samples are read again sample by sample (plan_detail). Process counts are
# not: gpufinops agent writes no sentinels, so an implausible count is a broken exporter and the GPU invalid.
DETAILED_SIGNALS = (GPU_UTIL, GR_ENGINE_ACTIVE, FB_USED, POWER_USAGE, *PROFILING_SIGNALS)
# Signals whose every value is a whole number (a count of things, not a measurement).
WHOLE_SIGNALS = (PROCESSES,)


def accepted_aggs() -> dict[str, tuple[str, ...]]:
    """What an answer may hold, per queried signal: its aggregates, those of the signals folded into its query
    (prefixed), and `present` (the marker of earlier query sets)."""
    accepted = {metric: ("present", *aggs) for metric, aggs in _SIGNAL_AGGS.items()}
    for folded, (host, prefix) in FOLDED.items():
        accepted[host] += tuple(f"{prefix}_{a}" for a in _SIGNAL_AGGS[folded])
    return accepted


_ACCEPTED_AGGS = accepted_aggs()
CLEAN, DIRTY, RAW = "clean", "dirty", "raw"


def signal_of(metric: str, agg: str) -> tuple[str, str]:
    """(signal, agg) of one row of `metric`'s answer: a folded signal's row (FOLDED) is its own signal's."""
    for folded, (host, prefix) in FOLDED.items():
        if metric == host and agg.startswith(prefix + "_"):
            return folded, agg[len(prefix) + 1:]
    return metric, agg


def is_valid_sample(value: float) -> bool:
    """A measurement, as the PromQL filter `x < SENTINEL_THRESHOLD >= 0` keeps it (NaN fails both)."""
    return 0.0 <= value < SENTINEL_THRESHOLD


def needs_detail(agg: str, value: float) -> bool:
    """True when an unfiltered aggregate shows the window held invalid raw samples (sentinel, negative, NaN,
    inf), so the GPU's figures must come from its valid samples instead. A count or presence marker never
    does: an implausible one is the query layer's fault, and flagged as such (row_problem)."""
    if agg == "mean":  # a profiling ratio's window mean: a sentinel among its samples lifts it over 1
        return not (math.isfinite(value) and 0.0 <= value <= PROFILING_RATIO.ceiling * (1 + REL_TOL))
    if agg not in ("sum", "max", "min"):
        return False
    return not (math.isfinite(value) and 0.0 <= value < SENTINEL_THRESHOLD)
