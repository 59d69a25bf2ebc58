"""Pure decisions: (instance, its GPU usage over a window, rule, now) -> Decision.

No I/O, no clock of its own. The live service, the demo and the backtest all
call `evaluate`; the backtest also uses `window_is_idle` on whole numpy arrays
of window aggregates, so the idle predicate is literally the same code.

Where a GPU exports DCGM profiling counters (docs/metrics.md, "Profiling counters"), IDLE needs every activity
figure it has to agree (the GR engine's, DCGM_FI_DEV_GPU_UTIL's, the SM activity mean), and power is a witness:
a GPU that reads idle while it draws far more than an idle GPU does is UNKNOWN (the counters may be wrong,
dcgm-exporter issue #662). UNDERUTILIZED says why from the counters: few SMs busy, tensor pipes idle, bursts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Sequence

import numpy as np

from ..metric_ranges import (
    ACTIVITY_PCT_MAX, MEMORY_CEILING_MIB, POWER_CEILING_W, PROCESS_COUNT, invalid_reason, invalidated, number_problem,
    out_of_range, samples_limit, validate_stats,
)
from ..model import (
    Aggregation,
    Decision,
    GpuInstance,
    GpuWindowStats,
    InstanceUsage,
    NoCounterPolicy,
    STATE_STOPPED_ALLOCATED,
    ReasonCode,
    Rule,
    Verdict,
    format_duration,
)

# A GPU holding at least this much memory while idle is reported as "memory held".
MEMORY_HELD_MIB = 1024.0
# "Low but bursty" (input-, host- or latency-bound work): peaks reach real load and stand
# well above the mean. Smaller flickers are reported as plain low use.
BURST_MIN_PCT = 30.0
BURST_RATIO = 2.0

# The power witness: an idle-judged GPU drawing at least this fraction of its TDP (window mean) is UNKNOWN.
# Measured on an H200 (TDP 700 W, /work/shared/data/nvidia_smi/captures_device): 79 W bare idle (11 %), 120 W
# holding 20 GiB with no kernel (17 %), 470 W at 50 % duty (67 %), 690 W busy; a T4 scraped idle draws 14.5 of
# its 70 W (21 %). 40 % stands well above every idle draw, so "memory held, no work" stays IDLE, and well below
# half-duty work, so counters that read 0 under load are caught.
POWER_WITNESS_TDP_FRACTION = 0.40
# Causes of low use, from the profiling ratios (window means, 0..1). H200 references: a bf16 matmul keeps the
# engine 99 % active with 96 % of SM cycles busy, 14 % occupancy and tensor pipes 93 % active.
KERNELS_MOSTLY_RUNNING_PCT = 80.0  # engine activity at least this: kernels run nearly all the time...
FEW_SMS_BUSY_RATIO = 0.50  # ...but SMs busy under this: small batches or kernels, too many tiny launches
TENSOR_IDLE_SMS_BUSY_RATIO = 0.30  # SMs busy at least this...
TENSOR_IDLE_RATIO = 0.05  # ...while tensor pipes stay under this: FP32 math on a tensor-core GPU


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
    gpus = tuple(checked_processes(validate_stats(g, usage.expected_samples, MEMORY_CEILING_MIB, POWER_CEILING_W),
                                   usage.expected_samples) for g in usage.gpus)
    return usage if gpus == usage.gpus else replace(usage, gpus=gpus)


def process_count_problem(stats: GpuWindowStats, expected_samples: int) -> str:
    """"" when the process figures are plausible (a whole number 0..MAX_PROCESSES_PER_GPU, a sample count the
    window can hold), else the sentence saying which is not."""
    source = "the metrics source"
    if stats.processes_max is not None and (p := number_problem(stats.processes_max, PROCESS_COUNT, whole=True)):
        return out_of_range("process count", source, p)
    if p := number_problem(stats.process_samples, samples_limit(expected_samples), whole=True):
        return out_of_range("process-count sample count", source, p)
    return ""


def checked_processes(stats: GpuWindowStats, expected_samples: int) -> GpuWindowStats:
    """`stats` invalid (no figure left, processes included) when its process figures are implausible."""
    if stats.invalid:
        return replace(stats, processes_max=None, process_samples=0) if stats.processes_max is not None else stats
    problem = process_count_problem(stats, expected_samples)
    return replace(invalidated(stats, problem), processes_max=None, process_samples=0) if problem else stats


def activity_source(gpus: Sequence[GpuWindowStats]) -> str:
    """The counter(s) the activity figures of `gpus` come from, e.g. "DCGM_FI_PROF_GR_ENGINE_ACTIVE"."""
    return " and ".join(dict.fromkeys(g.activity_signal for g in gpus))


def _pct(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"


def _age_words(gpus: Sequence[GpuWindowStats]) -> str:
    """" (occupancy and pipes as read 4 min before)" when those figures come from an earlier read than the
    window's (prometheus.profiling_reasons_every_s); "" when read with it."""
    age = max((g.profiling_age_s for g in gpus), default=0.0)
    return f" (occupancy and pipes as read {age / 60:.0f} min before)" if age >= 60 else ""


def counters_disagree(g: GpuWindowStats, rule: Rule) -> str:
    """"" when every other activity figure of an idle-judged GPU agrees it is idle under the rule, else the
    words saying which does not (the second activity counter by the rule's aggregation; the SM activity by its
    window mean, the one figure read for it)."""
    if g.second_activity_signal and not window_is_idle(g.second_activity_max, g.second_activity_mean,
                                                       rule.threshold_pct, rule.aggregation):
        shown = g.second_activity_max if rule.aggregation == Aggregation.STAYS_BELOW else g.second_activity_mean
        what = "reaches" if rule.aggregation == Aggregation.STAYS_BELOW else "averages"
        return (f"{gpu_name(g)}: {g.activity_signal} stays under {rule.threshold_pct:g}% but "
                f"{g.second_activity_signal} {what} {_fmt_pct(shown)}")
    if g.sm_active is not None and g.sm_active * 100.0 >= rule.threshold_pct:
        return (f"{gpu_name(g)}: {g.activity_signal} stays under {rule.threshold_pct:g}% but SM activity "
                f"averages {_pct(g.sm_active)}")
    return ""


def power_witness(g: GpuWindowStats, fraction: float = POWER_WITNESS_TDP_FRACTION) -> str:
    """"" when an idle-judged GPU's power agrees it is idle (or nothing can say: no power figure or no TDP),
    else the words saying it draws too much for an idle GPU. The idle draw is the catalog's TDP x `fraction`."""
    if g.power_mean_w is None or not g.tdp_w:
        return ""
    if g.power_mean_w < fraction * g.tdp_w:
        return ""
    act = _fmt_pct(g.activity_max)
    return (f"{gpu_name(g)}: activity reads {act} but the GPU draws {g.power_mean_w:.0f} W on average, "
            f"{g.power_mean_w / g.tdp_w:.0%} of its {g.tdp_w:.0f} W TDP, at or above the {fraction:.0%} an idle "
            f"GPU stays under (the catalog's TDP): the counters may be wrong")


def low_use_causes(gpus: Sequence[GpuWindowStats]) -> tuple[ReasonCode | None, str]:
    """(code, words) of why the working GPUs' use stays low, from their profiling ratios; (None, "") when the
    counters are not exported or show nothing to act on. Means over the GPUs that have each figure."""
    def mean_of(values) -> float | None:
        found = [v for v in values if v is not None]
        return sum(found) / len(found) if found else None

    engine = mean_of(g.activity_mean for g in gpus)
    sm, occupancy = mean_of(g.sm_active for g in gpus), mean_of(g.sm_occupancy for g in gpus)
    tensor, fp32 = mean_of(g.tensor_active for g in gpus), mean_of(g.pipe("fp32") for g in gpus)
    occ_words = f", occupancy {_pct(occupancy)}{_age_words(gpus)}" if occupancy is not None else ""
    if engine is not None and sm is not None and engine >= KERNELS_MOSTLY_RUNNING_PCT and sm < FEW_SMS_BUSY_RATIO:
        return ReasonCode.FEW_SMS_BUSY, (
            f"kernels run {_fmt_pct(engine)} of the time but only {_pct(sm)} of SM cycles are busy{occ_words}: "
            f"small batches or small kernels, too many tiny launches (raise the batch size, fuse kernels, "
            f"CUDA graphs), or a MIG slice / smaller GPU")
    if sm is not None and tensor is not None and sm >= TENSOR_IDLE_SMS_BUSY_RATIO and tensor < TENSOR_IDLE_RATIO:
        fp32_words = f", FP32 pipes {_pct(fp32)}" if fp32 is not None else ""
        return ReasonCode.TENSOR_IDLE, (
            f"SMs busy {_pct(sm)} of cycles but tensor pipes only {_pct(tensor)}{fp32_words}{_age_words(gpus)}: "
            f"FP32 math on a tensor-core GPU (use bf16, TF32 or mixed precision)")
    return None, ""


def _sm_words(gpus: Sequence[GpuWindowStats]) -> str:
    """", SM activity 30%, occupancy 6%" for a reason, from the GPUs that export them; "" otherwise."""
    sm = [g.sm_active for g in gpus if g.sm_active is not None]
    occ = [g.sm_occupancy for g in gpus if g.sm_occupancy is not None]
    words = f", SM activity {_pct(sum(sm) / len(sm))}" if sm else ""
    return words + (f", occupancy {_pct(sum(occ) / len(occ))}{_age_words(gpus)}" if sm and occ else "")


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

    window = format_duration(rule.window_s)
    if inst.state == STATE_STOPPED_ALLOCATED:
        # Powered off, not deallocated: nothing runs and the compute is billed all the same (the Azure trap).
        return decide(Verdict.IDLE, ReasonCode.BILLED_WHILE_STOPPED,
                      "powered off but still allocated (\"Stopped (allocated)\"): Azure bills its compute until "
                      "it is deallocated")
    if not inst.is_running:
        return decide(Verdict.UNKNOWN, ReasonCode.NOT_RUNNING, f"instance is {inst.state}, not judged")
    age_s = (now - inst.launch_time).total_seconds()
    if age_s < rule.window_s:
        return decide(
            Verdict.UNKNOWN, ReasonCode.TOO_YOUNG,
            f"running for {format_duration(max(0, int(age_s)))}; not judged before a full {window} window",
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

    no_counter = without_activity(usage.gpus, rule)
    if no_counter:
        return _judge_with_no_counter(no_counter, usage, rule, window, decide)
    return _judge_measured(tuple(g for g in usage.gpus if _measured(g)), usage.expected_samples, rule, window,
                           decide)


def _judge_measured(gpus: Sequence[GpuWindowStats], expected: int, rule: Rule, window: str, decide) -> Decision:
    """The verdict from GPUs that all have activity figures (the DCGM path)."""
    worst = min(g.samples for g in gpus) / max(expected, 1)
    if not coverage_ok(min(g.samples for g in gpus), expected, rule.min_coverage):
        low = min(gpus, key=lambda g: g.samples)
        return decide(
            Verdict.UNKNOWN, ReasonCode.LOW_COVERAGE,
            f"GPU {low.gpu} has {low.samples} of {expected} expected samples in the last {window} "
            f"({worst:.0%} < {rule.min_coverage:.0%} required)",
            coverage=worst,
        )

    act_max = max(g.activity_max for g in gpus)
    act_mean = sum(g.activity_mean for g in gpus) / len(gpus)
    mems = [g.fb_used_max_mib for g in gpus if g.fb_used_max_mib is not None]
    mem_max = max(mems) if mems else None
    source = activity_source(gpus)
    stats = dict(activity_mean=act_mean, activity_max=act_max, memory_max_mib=mem_max, coverage=worst,
                 activity_signal=source)

    idle_flags = [
        window_is_idle(g.activity_max, g.activity_mean, rule.threshold_pct, rule.aggregation) for g in gpus
    ]
    memory_veto = (
        rule.max_memory_mib is not None and mem_max is not None and mem_max > rule.max_memory_mib
    )
    if all(idle_flags) and not memory_veto:
        dropped = [g.gpu for g in gpus if g.dropped_invalid]
        if dropped:
            # Idle from the valid samples alone is a guess about the others: missing data is never idle.
            return decide(
                Verdict.UNKNOWN, ReasonCode.INVALID_DATA,
                f"GPU {', '.join(dropped[:4])}: some activity samples in the last {window} are out of range "
                f"(DCGM sentinels, i.e. no data): not judged idle", **stats,
            )
        # Every activity figure must agree, and the power must look idle, before a GPU is called idle.
        disagree = [w for g in gpus if (w := counters_disagree(g, rule))]
        if disagree:
            return decide(Verdict.UNKNOWN, ReasonCode.COUNTERS_DISAGREE,
                          f"{disagree[0]}: the counters disagree, not judged idle", **stats)
        drawing = [w for g in gpus if (w := power_witness(g))]
        if drawing:
            return decide(Verdict.UNKNOWN, ReasonCode.POWER_WITHOUT_ACTIVITY,
                          f"{drawing[0]}; not judged idle", **stats)
        how = "every sample" if rule.aggregation == Aggregation.STAYS_BELOW else "mean"
        if mem_max is not None and mem_max >= MEMORY_HELD_MIB and act_max < 1.0:
            return decide(
                Verdict.IDLE, ReasonCode.MEMORY_HELD_IDLE,
                f"holds {_fmt_gb(mem_max)} on a GPU but 0% active for {window}: memory held is not work "
                f"(activity from {source})",
                **stats,
            )
        code = ReasonCode.IDLE_STAYS_BELOW if rule.aggregation == Aggregation.STAYS_BELOW else ReasonCode.IDLE_MEAN_BELOW
        return decide(
            Verdict.IDLE, code,
            f"all {len(gpus)} GPU(s) idle: {how} under {rule.threshold_pct:g}% for {window} "
            f"(max {_fmt_pct(act_max)}, mean {_fmt_pct(act_mean)}; activity from {source})",
            **stats,
        )

    if memory_veto and all(idle_flags):
        return decide(
            Verdict.UNDERUTILIZED, ReasonCode.LOW_STEADY,
            f"activity under {rule.threshold_pct:g}% but holds {_fmt_mib(mem_max)} "
            f"(over the {rule.max_memory_mib:.0f} MiB this rule allows an idle GPU)",
            **stats,
        )
    busy = [g for g, idle in zip(gpus, idle_flags) if not idle]
    sms = [g.sm_active for g in gpus if g.sm_active is not None]
    # Kernels that run all the time on few SMs are low use too: the SM activity, where exported, says so.
    sm_low = len(sms) == len(gpus) and sum(sms) / len(sms) * 100.0 < rule.underutilized_below_pct
    if act_mean < rule.underutilized_below_pct or sm_low:
        code, causes = low_use_causes(busy)
        if len(busy) < len(gpus):
            return decide(
                Verdict.UNDERUTILIZED, ReasonCode.SOME_GPUS_BUSY,
                f"only {len(busy)} of {len(gpus)} GPUs did work in the last {window} "
                f"(mean {_fmt_pct(act_mean)}): consider a smaller instance",
                **stats,
            )
        if code is not None:
            return decide(Verdict.UNDERUTILIZED, code,
                          f"mean {_fmt_pct(act_mean)}, max {_fmt_pct(act_max)} over {window}; {causes}", **stats)
        if act_max >= max(rule.threshold_pct, BURST_MIN_PCT) and act_max >= BURST_RATIO * act_mean:
            return decide(
                Verdict.UNDERUTILIZED, ReasonCode.BURSTY_LOW,
                f"mean {_fmt_pct(act_mean)}{_sm_words(busy)} but bursts to {_fmt_pct(act_max)}: working, likely "
                f"input-, host- or latency-bound (check data loading, CPU preprocessing, batch size)",
                **stats,
            )
        return decide(
            Verdict.UNDERUTILIZED, ReasonCode.LOW_STEADY,
            f"low but not idle under this rule: mean {_fmt_pct(act_mean)}{_sm_words(busy)}, max {_fmt_pct(act_max)} "
            f"over {window}",
            **stats,
        )
    return decide(
        Verdict.ACTIVE, ReasonCode.BUSY,
        f"busy: mean {_fmt_pct(act_mean)}, max {_fmt_pct(act_max)} over {window}", **stats,
    )


# --------------------------------------------------------------------------- GPUs without an activity counter
# Under MIG, nvidia-smi and NVML give no utilization per GPU instance, so `gpufinops agent` exports memory and
# the number of compute processes per instance instead (docs/metrics.md, "Evidence of work"). Processes or
# memory held are evidence of work; their absence is evidence of idleness only where the rule opts in.


@dataclass(frozen=True)
class NoCounterJudgement:
    """One GPU without activity figures, judged by its processes and memory alone."""

    gpu: GpuWindowStats
    verdict: Verdict  # ACTIVE (evidence of work), IDLE (by the rule's option) or UNKNOWN
    code: ReasonCode
    reason: str
    coverage: float | None = None  # process-count samples / expected, where they were counted


def _measured(g: GpuWindowStats) -> bool:
    return g.activity_max is not None and g.activity_mean is not None


def _is_mig(g: GpuWindowStats) -> bool:
    return "/" in g.gpu or bool(g.mig_profile)


def gpu_name(g: GpuWindowStats) -> str:
    """How reasons name a GPU: "GPU 0/2 (3g.40gb)" for a MIG instance with its profile, else "GPU 0"."""
    return f"GPU {g.gpu} ({g.mig_profile})" if g.mig_profile else f"GPU {g.gpu}"


def _fmt_gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def evidence_of_work(g: GpuWindowStats, floor_mib: float) -> list[str]:
    """What shows work on a GPU without an activity counter, in words ("3 processes", "10.8 GiB held")."""
    found = []
    if g.processes_max is not None and g.processes_max >= 1:
        found.append(f"{g.processes_max} process{'es' if g.processes_max > 1 else ''}")
    if g.fb_used_max_mib is not None and g.fb_used_max_mib > floor_mib:
        found.append(f"{_fmt_gib(g.fb_used_max_mib)} held")
    return found


def mig_boards(gpus: Sequence[GpuWindowStats]) -> set[str]:
    """The physical GPUs split into MIG instances: their own series ("0", no GPU_I_ID) are the board's."""
    return {_physical_gpu(g) for g in gpus if "/" in g.gpu}


def without_activity(gpus: Sequence[GpuWindowStats], rule: Rule) -> tuple[GpuWindowStats, ...]:
    """The GPUs to judge by processes and memory: those without activity figures, less the board-level
    series of a MIG GPU (power, the whole GPU's process count; no GPU_I_ID) that show no work, or whose
    every instance has its own activity figure (NVML GPM, dcgm-exporter's profiling fields): its instances are
    judged, by their activity. MIG instances first, so a reason names the instance that worked rather than
    its board."""
    boards = mig_boards(gpus)
    counted = {b for b in boards
               if all(_measured(g) for g in gpus if "/" in g.gpu and _physical_gpu(g) == b)}
    found = [g for g in gpus
             if not _measured(g) and not (g.gpu in boards and (g.gpu in counted or not evidence_of_work(
                 g, rule.idle_memory_floor_mib)))]
    return tuple(sorted(found, key=lambda g: g.gpu in boards))


def judge_without_counter(g: GpuWindowStats, expected: int, rule: Rule,
                          mig: bool | None = None) -> NoCounterJudgement:
    """A GPU without activity figures: working when processes ran or memory was held above the rule's idle
    floor; idle only under `idle_without_activity_counter: no_processes_and_idle_memory`, with no process
    over the whole window (process-count coverage) and memory at or under the floor; else UNKNOWN.
    `mig`: the GPU is a MIG instance or a MIG GPU's board (None: told by its name and profile)."""
    window = format_duration(rule.window_s)
    name = gpu_name(g)
    is_mig = _is_mig(g) if mig is None else mig
    if not is_mig:
        # A whole GPU has an activity counter: when its samples are missing that is missing data (an outage to
        # alert on), and memory held is not work, so nothing here stands in for the counter.
        return NoCounterJudgement(g, Verdict.UNKNOWN, ReasonCode.NO_SERIES,
                                  f"{name} has no valid activity samples in the last {window}: not judged")
    lacks = "has no activity counter (MIG)"
    floor = rule.idle_memory_floor_mib
    evidence = evidence_of_work(g, floor)
    if evidence:
        return NoCounterJudgement(g, Verdict.ACTIVE, ReasonCode.EVIDENCE_OF_WORK,
                                  f"{name} {lacks}; {' and '.join(evidence)}: counted as work")
    if g.processes_max is None:
        return NoCounterJudgement(g, Verdict.UNKNOWN, ReasonCode.NO_SERIES,
                                  f"{name} {lacks} and no process count in the last {window}: not judged")
    option = f"idle_without_activity_counter: {NoCounterPolicy.NO_PROCESSES_AND_IDLE_MEMORY.value}"
    if rule.idle_without_activity_counter is not NoCounterPolicy.NO_PROCESSES_AND_IDLE_MEMORY:
        return NoCounterJudgement(
            g, Verdict.UNKNOWN, ReasonCode.NO_ACTIVITY_COUNTER,
            f"{name} {lacks} and no processes in the last {window}: not judged idle unless the rule accepts it "
            f"({option})")
    coverage = g.process_samples / max(expected, 1)
    if not coverage_ok(g.process_samples, expected, rule.min_coverage):
        return NoCounterJudgement(
            g, Verdict.UNKNOWN, ReasonCode.LOW_COVERAGE,
            f"{name} {lacks}; {g.process_samples} of {expected} expected process-count samples in the last "
            f"{window} ({coverage:.0%} < {rule.min_coverage:.0%} required): not judged idle", coverage)
    if g.fb_used_max_mib is None:
        return NoCounterJudgement(
            g, Verdict.UNKNOWN, ReasonCode.NO_SERIES,
            f"{name} {lacks}; no processes but no memory figure in the last {window}: not judged idle", coverage)
    return NoCounterJudgement(
        g, Verdict.IDLE, ReasonCode.IDLE_NO_PROCESSES,
        f"{name}: 0 processes and at most {_fmt_mib(g.fb_used_max_mib)} held (idle floor {floor:g} MiB) "
        f"for {window}", coverage)


def _judge_with_no_counter(no_counter: Sequence[GpuWindowStats], usage: InstanceUsage, rule: Rule, window: str,
                           decide) -> Decision:
    """Any GPU working -> ACTIVE; else any unknown -> UNKNOWN; else (every one idle by the rule's option) the
    measured GPUs decide, and IDLE only when they are idle too."""
    boards = mig_boards(usage.gpus)
    judged = [judge_without_counter(g, usage.expected_samples, rule, mig=_is_mig(g) or g.gpu in boards)
              for g in no_counter]
    mems = [g.fb_used_max_mib for g in usage.gpus if g.fb_used_max_mib is not None]
    mem_max = max(mems) if mems else None

    def more(rest: Sequence[NoCounterJudgement]) -> str:
        return f"; and {len(rest)} more GPU{'s' if len(rest) > 1 else ''}" if rest else ""

    working = [j for j in judged if j.verdict is Verdict.ACTIVE]
    if working:
        return decide(Verdict.ACTIVE, ReasonCode.EVIDENCE_OF_WORK, working[0].reason + more(working[1:]),
                      memory_max_mib=mem_max)
    unknown = [j for j in judged if j.verdict is Verdict.UNKNOWN]
    if unknown:
        return decide(Verdict.UNKNOWN, unknown[0].code, unknown[0].reason + more(unknown[1:]),
                      memory_max_mib=mem_max, coverage=unknown[0].coverage)
    option = f"idle_without_activity_counter: {NoCounterPolicy.NO_PROCESSES_AND_IDLE_MEMORY.value}"
    coverage = min(j.coverage for j in judged if j.coverage is not None)
    held = max(j.gpu.fb_used_max_mib for j in judged)
    names = ", ".join(gpu_name(j.gpu) for j in judged[:4]) + (f" and {len(judged) - 4} more" if len(judged) > 4 else "")
    idle_words = (f"{names}: no activity counter, 0 processes and at most {_fmt_mib(held)} held (idle floor "
                  f"{rule.idle_memory_floor_mib:g} MiB) for {window}: judged idle by the rule's {option}")
    measured = tuple(g for g in usage.gpus if _measured(g))
    if not measured:
        return decide(Verdict.IDLE, ReasonCode.IDLE_NO_PROCESSES,
                      f"all {len(judged)} GPU(s) idle: {idle_words}", memory_max_mib=mem_max, coverage=coverage)
    rest = _judge_measured(measured, usage.expected_samples, rule, window, decide)
    if rest.verdict is Verdict.UNKNOWN:
        return rest
    return replace(rest, reason=f"{rest.reason}; {idle_words}", memory_max_mib=mem_max,
                   coverage=min(coverage, rest.coverage) if rest.coverage is not None else coverage)


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
