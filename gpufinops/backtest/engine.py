"""Vectorised replay of idle rules over a Trace, with the live act semantics.

Two stages, both without a per-sample Python loop:

1. Verdicts. For every evaluation tick (default every 60 s) and instance, the
   window (now - window, now] is summarised per GPU exactly as the live
   collector does server-side (count, mean, max), with cumulative sums and
   pandas rolling maxima, and judged by `evaluate.window_is_idle` and
   `evaluate.coverage_ok` (the live predicates, called on whole arrays).
   The remaining branches of `evaluate()` (too young, not running, missing
   GPU, memory veto, underutilised vs active) are mirrored on arrays;
   tests/test_backtest_equivalence.py replays traces through `evaluate()` tick
   by tick and asserts identical verdicts and stops.

2. Acting. The live two-phase stop: the first IDLE verdict marks the
   instance with stop_at = now + warning lead; at/after stop_at an IDLE verdict
   stops it; an ACTIVE/UNDERUTILIZED verdict (or a snooze) before that cancels
   the mark; UNKNOWN keeps the mark and never stops, and IDLE after UNKNOWN renews the warning. A stopped instance is
   restarted at the first later sample whose activity shows demand and is not
   judged for a full window after that (launch time resets). The loop runs per
   *event* (mark, stop) using precomputed "next idle tick" indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ..decide.evaluate import coverage_ok, window_is_idle
from ..model import FALSE_STOP_COST_H, FALSE_STOP_WITHIN_S, RESTART_COST_S, Aggregation, GpuInstance, Rule
from .traces import Trace

# Verdict codes in the int8 matrices (order matters only for readability).
UNKNOWN, IDLE, UNDERUTILIZED, ACTIVE = 0, 1, 2, 3
VERDICT_NAMES = ("UNKNOWN", "IDLE", "UNDERUTILIZED", "ACTIVE")

# p4d.24xlarge on-demand us-east-1, 21.957642 USD/h for 8 A100 GPUs
# (../shared/data/gpu_prices/aws_ec2_ondemand_prices_karpenter_us-east-1.csv).
DEFAULT_PRICE_PER_GPU_HOUR = 2.745
_EPS = 1e-9


@dataclass(frozen=True)
class BacktestSettings:
    tick_s: float = 60.0  # evaluation period of the live service
    restart_cost_s: float = RESTART_COST_S  # GPU time lost per restart (boot, model load, warm-up)
    break_even_s: float = float(FALSE_STOP_WITHIN_S)  # a stop followed by demand sooner than this is a false stop
    demand_pct: float = 5.0  # activity above this while stopped means someone needs the GPU: restart
    price_per_gpu_hour: float = DEFAULT_PRICE_PER_GPU_HOUR
    # GPU-hours a false stop costs a person on top of the restart (lost work, a ticket): the score's c, one
    # meaning for the report, the sweep and --tune (`gpufinops backtest --false-stop-cost`).
    false_stop_cost_h: float = FALSE_STOP_COST_H
    scrape_interval_s: float | None = None  # expected samples = window / this; default: the trace step
    # instance id -> [(start, end) epoch s] during which a gpufinops:snooze-until tag is set.
    snoozes: Mapping[str, Sequence[tuple[float, float]]] = field(default_factory=dict)

    def expected_samples(self, window_s: float, step_s: float) -> int:
        return max(1, int(window_s // (self.scrape_interval_s or step_s)))


@dataclass(frozen=True)
class Grid:
    """Tick times and, per tick, the sample range (lo, hi] of every window length."""

    times: np.ndarray  # epoch s of each tick
    hi: np.ndarray  # samples with index < hi have t <= now

    @staticmethod
    def for_trace(trace: Trace, tick_s: float) -> "Grid":
        last = trace.t0 + (trace.n_steps - 1) * trace.step_s
        n = int(np.floor((last - trace.t0) / tick_s + _EPS)) + 1
        times = trace.t0 + np.arange(n) * tick_s
        hi = np.floor((times - trace.t0) / trace.step_s + _EPS).astype(np.int64) + 1
        return Grid(times=times, hi=np.minimum(hi, trace.n_steps))

    def lo(self, trace: Trace, window_s: float) -> np.ndarray:
        """First sample index inside (now - window, now] (may be negative: clipped by users)."""
        return np.floor((self.times - window_s - trace.t0) / trace.step_s + _EPS).astype(np.int64) + 1


@dataclass
class WindowStats:
    """Per GPU row, per tick: the server-side aggregates of one window length."""

    count: np.ndarray
    mean: np.ndarray  # NaN where count == 0
    max: np.ndarray  # NaN where count == 0
    mem_max: np.ndarray | None
    # Window mean of DCGM_FI_PROF_SM_ACTIVE (ratio), NaN where no sample; None: the trace has no SM column.
    sm_mean: np.ndarray | None = None


def _rolling_max(a: np.ndarray, length: int) -> np.ndarray:
    """Max of the last `length` samples along axis 1, NaN-skipping (pandas' rolling is O(n))."""
    frame = pd.DataFrame(a.T)
    return frame.rolling(length, min_periods=1).max().to_numpy().T


class Prepared:
    """Everything about a trace that does not depend on the rule: computed once per backtest/sweep."""

    def __init__(self, trace: Trace, settings: BacktestSettings):
        self.trace = trace
        self.settings = settings
        self.grid = Grid.for_trace(trace, settings.tick_s)
        valid = ~np.isnan(trace.util)
        zero = np.zeros((trace.util.shape[0], 1))
        self._csum_n = np.concatenate([zero, np.cumsum(valid, axis=1)], axis=1)
        self._csum_v = np.concatenate([zero, np.cumsum(np.where(valid, trace.util, 0.0), axis=1)], axis=1)
        self._csum_sm = None
        if trace.sm_active is not None:
            sm_valid = ~np.isnan(trace.sm_active)
            sm_values = np.where(sm_valid, trace.sm_active, 0.0)
            self._csum_sm = (np.concatenate([zero, np.cumsum(sm_valid, axis=1)], axis=1),
                             np.concatenate([zero, np.cumsum(sm_values, axis=1)], axis=1))
        self._windows: dict[float, WindowStats] = {}
        first, last = trace.instance_span()
        self.first_idx, self.last_idx = first, last
        self.first_t = trace.t0 + first * trace.step_s
        self.end_t = trace.t0 + (last + 1) * trace.step_s  # instance gone after its last sample's step
        times = self.grid.times
        self.alive = (times[None, :] >= self.first_t[:, None] - _EPS) & (times[None, :] < self.end_t[:, None] - _EPS)
        # Demand (restart trigger) per instance and sample: any of its GPUs above the level.
        act = trace.instance_activity_max()
        with np.errstate(invalid="ignore"):
            self.demand = act > settings.demand_pct
        n = trace.n_steps
        idx = np.where(self.demand, np.arange(n)[None, :], n)
        self.next_demand = np.minimum.accumulate(idx[:, ::-1], axis=1)[:, ::-1]  # first demand sample >= k
        idx = np.where(self.demand, np.arange(n)[None, :], -1)
        self.prev_demand = np.maximum.accumulate(idx, axis=1)  # last demand sample <= k
        self.gpus = trace.gpus_per_instance()
        self.snoozed = self._snooze_mask()
        self._ceilings: dict[tuple[float, float], CeilingStops] = {}

    def ceiling(self, warning_lead_s: float, false_stop_cost_h: float | None = None) -> CeilingStops:
        """`ceiling_stops` for this lead and cost (default: the settings'), computed once (a sweep shares it)."""
        c = self.settings.false_stop_cost_h if false_stop_cost_h is None else false_stop_cost_h
        if (warning_lead_s, c) not in self._ceilings:
            self._ceilings[(warning_lead_s, c)] = ceiling_stops(self, warning_lead_s, c)
        return self._ceilings[(warning_lead_s, c)]

    @property
    def instance_days(self) -> float:
        """Days of history summed over instances (first sample to the end of the last one's step)."""
        span = np.where(self.last_idx >= self.first_idx, self.end_t - self.first_t, 0.0)
        return float(span.sum() / 86400)

    def _snooze_mask(self) -> np.ndarray:
        mask = np.zeros((self.trace.n_instances, len(self.grid.times)), dtype=bool)
        pos = {iid: i for i, iid in enumerate(self.trace.instance_ids)}
        for iid, periods in self.settings.snoozes.items():
            if iid in pos:
                for start, end in periods:
                    mask[pos[iid]] |= (self.grid.times >= start) & (self.grid.times < end)
        return mask

    def window(self, window_s: float) -> WindowStats:
        if window_s in self._windows:
            return self._windows[window_s]
        tr, hi = self.trace, self.grid.hi
        lo_raw = self.grid.lo(tr, window_s)
        lo = np.clip(lo_raw, 0, tr.n_steps)
        count = self._csum_n[:, hi] - self._csum_n[:, lo]
        total = self._csum_v[:, hi] - self._csum_v[:, lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        mx = np.full(count.shape, np.nan)
        mem = None if tr.mem_mib is None else np.full(count.shape, np.nan)
        lengths = hi - lo_raw
        end = np.maximum(hi - 1, 0)
        for length in np.unique(lengths):  # one or two distinct window lengths in samples
            cols = np.flatnonzero(lengths == length)
            mx[:, cols] = _rolling_max(tr.util, int(max(length, 1)))[:, end[cols]]
            if mem is not None:
                mem[:, cols] = _rolling_max(tr.mem_mib, int(max(length, 1)))[:, end[cols]]
        mx[count == 0] = np.nan
        sm_mean = None
        if self._csum_sm is not None:
            sm_n = self._csum_sm[0][:, hi] - self._csum_sm[0][:, lo]
            sm_v = self._csum_sm[1][:, hi] - self._csum_sm[1][:, lo]
            with np.errstate(invalid="ignore", divide="ignore"):
                sm_mean = np.where(sm_n > 0, sm_v / np.maximum(sm_n, 1), np.nan)
        stats = WindowStats(count=count, mean=mean, max=mx, mem_max=mem, sm_mean=sm_mean)
        self._windows[window_s] = stats
        return stats

    def matches(self, rule: Rule) -> np.ndarray:
        """Which instances the rule's selector takes (trace instances have no tags or type)."""
        out = np.zeros(self.trace.n_instances, dtype=bool)
        for i, iid in enumerate(self.trace.instance_ids):
            inst = GpuInstance(instance_id=iid, instance_type="", region="", state="running",
                               launch_time=pd.Timestamp(0, tz="UTC").to_pydatetime(), gpu_count=int(self.gpus[i]))
            out[i] = rule.selector.matches(inst)
        return out


def _per_instance(values: np.ndarray, gpu_instance: np.ndarray, n_inst: int, how: str) -> np.ndarray:
    """Reduce GPU rows to instance rows (all/any/min/max/mean) with ufunc.at: a loop in C."""
    shape = (n_inst,) + values.shape[1:]
    if how == "all":
        out = np.ones(shape, dtype=bool)
        np.logical_and.at(out, gpu_instance, values)
    elif how == "any":
        out = np.zeros(shape, dtype=bool)
        np.logical_or.at(out, gpu_instance, values)
    elif how == "min":
        out = np.full(shape, np.inf)
        np.minimum.at(out, gpu_instance, values)
    elif how == "max":
        out = np.full(shape, -np.inf)
        np.fmax.at(out, gpu_instance, values)
    elif how == "mean":
        out = np.zeros(shape)
        np.add.at(out, gpu_instance, values)
        out /= np.bincount(gpu_instance, minlength=n_inst).reshape((-1,) + (1,) * (values.ndim - 1))
    else:  # pragma: no cover
        raise ValueError(how)
    return out


def _reduce(values: np.ndarray, prep: Prepared, how: str) -> np.ndarray:
    tr = prep.trace
    if tr.util.shape[0] == tr.n_instances and np.array_equal(tr.gpu_instance, np.arange(tr.n_instances)):
        return values.copy() if how != "all" and how != "any" else values.astype(bool)
    return _per_instance(values, tr.gpu_instance, tr.n_instances, how)


def rule_verdicts(prep: Prepared, rule: Rule) -> np.ndarray:
    """int8 (instances, ticks): what `evaluate()` would say at every tick, for instances running since their first sample."""
    tr, s = prep.trace, prep.settings
    ws = prep.window(rule.window_s)
    expected = s.expected_samples(rule.window_s, tr.step_s)
    no_samples = _reduce(ws.count == 0, prep, "any")
    min_count = _reduce(ws.count, prep, "min")
    covered = coverage_ok(min_count, expected, rule.min_coverage)
    gpu_idle = window_is_idle(ws.max, ws.mean, rule.threshold_pct, rule.aggregation)
    all_idle = _reduce(gpu_idle, prep, "all")
    with np.errstate(invalid="ignore"):
        act_mean = _reduce(np.nan_to_num(ws.mean), prep, "mean")
    veto = np.zeros_like(all_idle)
    if rule.max_memory_mib is not None and ws.mem_max is not None:
        mem = _reduce(np.nan_to_num(ws.mem_max, nan=-np.inf), prep, "max")
        veto = mem > rule.max_memory_mib

    disagree = np.zeros_like(all_idle)
    sm_low = np.zeros_like(all_idle)
    if ws.sm_mean is not None:
        # As evaluate(): IDLE needs the SM activity's window mean under the threshold too (else UNKNOWN
        # counters_disagree), and kernels on few SMs are low use (UNDERUTILIZED) where every GPU has the figure.
        with np.errstate(invalid="ignore"):
            disagree = _reduce(np.nan_to_num(ws.sm_mean * 100.0, nan=-np.inf) >= rule.threshold_pct, prep, "any")
            every = _reduce(~np.isnan(ws.sm_mean), prep, "all")
            sm_low = every & (_reduce(np.nan_to_num(ws.sm_mean), prep, "mean") * 100.0 < rule.underutilized_below_pct)
    v = np.where((act_mean < rule.underutilized_below_pct) | sm_low, UNDERUTILIZED, ACTIVE).astype(np.int8)
    v[all_idle & ~veto] = IDLE
    v[all_idle & ~veto & disagree] = UNKNOWN
    v[all_idle & veto] = UNDERUTILIZED
    young = prep.grid.times[None, :] - prep.first_t[:, None] < rule.window_s - _EPS
    v[~prep.alive | young | no_samples | ~covered] = UNKNOWN
    v[~prep.matches(rule)] = UNKNOWN
    return v


# --------------------------------------------------------------------------- acting


@dataclass(frozen=True)
class StopEvent:
    instance: str
    stop_at: float  # epoch s
    restart_at: float | None  # None: never needed again before the instance's history ends
    stopped_s: float  # wall time stopped (to restart or end of the instance's history)
    gpus: int
    false_stop: bool
    time_to_stop_s: float  # from the start of the idle stretch (last demand) to the stop
    mark_at: float
    tick: int = -1


@dataclass(frozen=True)
class Replay:
    """Stops as parallel arrays (fast to sum); `stops` builds StopEvent values on demand."""

    arrays: dict  # instance (index), stop_at, restart_at (NaN: none), stopped_s, false_stop, time_to_stop_s, mark_at, tick
    instance_ids: tuple
    gpus: np.ndarray  # per instance
    marks: int
    cancelled: int
    verdicts: np.ndarray  # int8 (instances, ticks); with timeline=True as the live service saw them (stopped -> UNKNOWN)

    @property
    def n_stops(self) -> int:
        return len(self.arrays["stop_at"])

    @property
    def stops(self) -> tuple[StopEvent, ...]:
        a = self.arrays
        order = np.lexsort((a["stop_at"], a["instance"]))
        return tuple(
            StopEvent(
                instance=self.instance_ids[a["instance"][k]], stop_at=float(a["stop_at"][k]),
                restart_at=None if np.isnan(a["restart_at"][k]) else float(a["restart_at"][k]),
                stopped_s=float(a["stopped_s"][k]), gpus=int(self.gpus[a["instance"][k]]),
                false_stop=bool(a["false_stop"][k]), time_to_stop_s=float(a["time_to_stop_s"][k]),
                mark_at=float(a["mark_at"][k]), tick=int(a["tick"][k]),
            )
            for k in order
        )


def next_index(mask: np.ndarray) -> np.ndarray:
    """For each column, the first column >= it where mask is true (n where none), row-wise."""
    n = mask.shape[-1]
    idx = np.where(mask, np.arange(n), n)
    return np.minimum.accumulate(idx[..., ::-1], axis=-1)[..., ::-1]


def replay(prep: Prepared, verdicts: np.ndarray, warning_lead_s: float, grace_s: float,
           timeline: bool = False, stop_verdicts: np.ndarray | None = None) -> Replay:
    """Apply mark/stop/cancel/restart to a verdict matrix.

    All instances advance together, one event (a mark and its outcome) per round, with numpy on the
    vector of instances: rounds = the most events any one instance has, not ticks or samples.
    grace_s: after a restart, ticks until restart + grace_s are UNKNOWN (too young): the rule window.
    timeline: also return the verdicts the live service would have seen (stopped -> UNKNOWN).
    stop_verdicts: where given, the stop (at or after mark + lead) waits for an IDLE here, while marks and
    cancels follow `verdicts` (the early warning, `backtest_rule_early_warning`).
    """
    tr, s, times = prep.trace, prep.settings, prep.grid.times
    n_ticks, n_steps, t0, step, tick = len(times), tr.n_steps, tr.t0, tr.step_s, s.tick_s
    eligible = (verdicts == IDLE) & ~prep.snoozed
    # Live act: missing data between a warning and its stop breaks the idle streak, and the first
    # IDLE tick after it cancels the mark ("warning again"); the new mark comes one tick later.
    renew = np.zeros_like(eligible)
    renew[:, 1:] = eligible[:, 1:] & (verdicts[:, :-1] == UNKNOWN)
    cancels = (verdicts == UNDERUTILIZED) | (verdicts == ACTIVE) | prep.snoozed | renew
    pad = np.full((tr.n_instances, 1), n_ticks)
    nxt_idle = np.concatenate([next_index(eligible), pad], axis=1)
    nxt_stop = nxt_idle if stop_verdicts is None else np.concatenate(
        [next_index((stop_verdicts == IDLE) & ~prep.snoozed), pad], axis=1)
    nxt_cancel = np.concatenate([next_index(cancels), pad, pad], axis=1)
    lead_ticks = lead_in_ticks(warning_lead_s, tick)
    seen = verdicts.copy() if timeline else verdicts
    out: dict[str, list] = {k: [] for k in ("instance", "stop_at", "restart_at", "stopped_s", "false_stop",
                                            "time_to_stop_s", "mark_at", "tick")}
    marks = cancelled = 0
    rows = np.flatnonzero(eligible.any(axis=1))
    j = np.zeros(len(rows), dtype=np.int64)
    while len(rows):
        m = nxt_idle[rows, j]
        go = m < n_ticks
        rows, m = rows[go], m[go]
        marks += len(rows)
        # stop_at beyond the history: no stop, but the mark can still be cancelled (then marked again).
        stop_tick = np.minimum(m + lead_ticks, n_ticks)
        c = nxt_cancel[rows, m + 1]
        st = nxt_stop[rows, stop_tick]
        # A renewal on the very tick the stop would happen wins: the live plan unmarks first.
        cancel = (c < st) | ((c == st) & (c < n_ticks))
        cancelled += int(np.count_nonzero(cancel & (c < n_ticks)))
        stop = ~cancel & (st < n_ticks)
        # Stops of this round.
        r, st_, m_ = rows[stop], st[stop], m[stop]
        ts = times[st_]
        k0 = np.floor((ts - t0) / step + _EPS).astype(np.int64) + 1  # first sample strictly after the stop
        k = np.where(k0 < n_steps, prep.next_demand[r, np.minimum(k0, n_steps - 1)], n_steps)
        has_restart = k < n_steps
        restart = np.where(has_restart, t0 + k * step, np.nan)
        until = np.where(has_restart, restart, np.maximum(prep.end_t[r], ts))
        last_d = prep.prev_demand[r, np.minimum(k0 - 1, n_steps - 1)]
        idle_since = np.where(last_d < 0, prep.first_t[r], t0 + (last_d + 1) * step)
        out["instance"].append(r)
        out["stop_at"].append(ts)
        out["restart_at"].append(restart)
        out["stopped_s"].append(until - ts)
        out["false_stop"].append(has_restart & (restart - ts < s.break_even_s))
        out["time_to_stop_s"].append(np.maximum(0.0, ts - idle_since))
        out["mark_at"].append(times[m_])
        out["tick"].append(st_)
        j_next = np.where(has_restart, np.ceil((restart + grace_s - t0) / tick - _EPS), n_ticks).astype(np.int64)
        if timeline:
            for ri, a, b in zip(r, st_ + 1, np.minimum(j_next, n_ticks)):  # per stop, test-sized traces only
                seen[ri, a:b] = UNKNOWN
        # Next round: cancelled marks resume at the cancel tick, stops after the restart's grace.
        nxt_rows = np.concatenate([rows[cancel], r])
        cc = c[cancel]
        again = np.zeros(len(cc), dtype=np.int64)
        inside = cc < n_ticks
        again[inside] = renew[rows[cancel][inside], cc[inside]]  # re-marked on the next tick, as live
        nxt_j = np.concatenate([cc + again, j_next])
        go = nxt_j < n_ticks
        rows, j = nxt_rows[go], nxt_j[go]
    arrays = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in out.items()}
    arrays["instance"] = arrays["instance"].astype(np.int64)
    arrays["false_stop"] = arrays["false_stop"].astype(bool)
    return Replay(arrays=arrays, instance_ids=tr.instance_ids, gpus=prep.gpus, marks=marks, cancelled=cancelled,
                  verdicts=seen)


# --------------------------------------------------------------------------- savings


def idle_stretches(prep: Prepared, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Instance i's stretches without demand, as sample indices: (starts, ends, ended by demand). `ends` is the
    sample where demand shows (last + 1 when the history ends first); only those have a restart. The
    oracle and the ceiling read the same stretches."""
    first, last = prep.first_idx[i], prep.last_idx[i]
    d = np.flatnonzero(prep.demand[i, first:last + 1]) + first
    starts = np.concatenate([[first], d + 1])
    ends = np.concatenate([d, [last + 1]])
    ended_by_demand = np.concatenate([np.ones(len(d), dtype=bool), [False]])
    return starts, ends, ended_by_demand


def oracle_net_seconds(prep: Prepared) -> np.ndarray:
    """GPU-seconds the oracle saves per instance: every idle stretch (no demand) longer than the
    break-even, stopped at its start, minus the restart cost when demand comes back."""
    tr, s = prep.trace, prep.settings
    out = np.zeros(tr.n_instances)
    for i in range(tr.n_instances):  # per instance; the stretches themselves are arrays
        if prep.last_idx[i] < prep.first_idx[i]:
            continue
        starts, ends, restarts = idle_stretches(prep, i)
        dur = (ends - starts) * tr.step_s
        keep = dur > s.break_even_s
        out[i] = (dur[keep] - np.where(restarts[keep], s.restart_cost_s, 0.0)).sum() * prep.gpus[i]
    return out


def lead_in_ticks(warning_lead_s: float, tick_s: float) -> int:
    """Ticks from a mark to its stop: the live service marks on one tick and stops on a later one, even with
    no lead time."""
    return max(1, math.ceil(warning_lead_s / tick_s - _EPS))


@dataclass(frozen=True)
class CeilingStops:
    """The clairvoyant-with-lead policy's stops, as parallel arrays (one entry per idle stretch it stops)."""

    instance: np.ndarray  # instance index
    mark_at: np.ndarray  # epoch s: the stretch's first tick, where the warning goes out
    stop_at: np.ndarray  # epoch s: mark + the lead, on the grid
    restart_at: np.ndarray  # epoch s; NaN: never needed again before the instance's history ends
    net_s: np.ndarray  # GPU-seconds saved: stopped time minus the restart cost, times the instance's GPUs
    false_stop: np.ndarray  # bool; only where the stop's net outweighs the false-stop cost (a many-GPU instance)
    false_stop_cost_h: float

    @property
    def net_gpu_hours(self) -> float:
        return float(self.net_s.sum() / 3600)

    @property
    def false_stops(self) -> int:
        return int(np.count_nonzero(self.false_stop))

    @property
    def score(self) -> float:
        return net_score(self.net_gpu_hours, self.false_stops, self.false_stop_cost_h)


def ceiling_stops(prep: Prepared, warning_lead_s: float, false_stop_cost_h: float | None = None) -> CeilingStops:
    """The clairvoyant-with-lead ceiling: what perfect foresight saves when it obeys a real rule's constraints.

    Why not the oracle (`oracle_net_seconds`): the oracle stops every idle stretch longer than the break-even at
    its first second, without a warning. No rule may do that: the live service stops only after a delivered
    warning and its full lead. With a 15-min lead, perfect foresight reaches only about 58% of the oracle on the
    shared traces, so "% of oracle" cannot approach 100% and says little about how good a rule is.

    This policy knows the whole future but obeys what any rule obeys, on the grid the engine replays:
    - idle stretch: samples with no demand (no activity above `demand_pct`; missing data counts as no demand,
      which only raises the ceiling), ended by the first demand sample, where a stopped instance restarts;
    - the warning goes out on the stretch's first tick (the first tick at or after its first sample) and the
      stop comes `lead_in_ticks(warning_lead_s, tick)` ticks later, as `replay` counts a mark and its stop;
    - it stops a stretch exactly when that gains on the score (`net_score`): the stop comes before the demand (or
      the instance's end), and the stopped time minus the restart cost, times the GPUs, exceeds the false-stop
      cost c (`false_stop_cost_h`, default the settings') when the stop is a false one (demand sooner than
      `break_even_s` after it). A false stop nets at most (break-even - restart cost) x GPUs, 20 GPU-min per GPU
      by default, so with c = 2 GPU-h the ceiling never stops falsely on instances of up to 6 GPUs; with c = 0 it
      takes every false stop that nets anything.
    Every rule's stop in a stretch comes at or after the ceiling's (when its warning needs no demand in its
    window), and a later stop never scores more, so no such rule's score exceeds the ceiling's for the same c.
    Not modelled (each only raises the ceiling): snoozes, a rule's window, the grace after a restart.
    A rule whose warning goes out on a sign that is not idle by this definition (a threshold above the demand
    level, or a mean that hides a demand sample) can warn before the stretch starts and so beat the ceiling on
    that stretch; the ceiling bounds rules whose warning goes out only while no demand shows.
    """
    tr, s = prep.trace, prep.settings
    c = s.false_stop_cost_h if false_stop_cost_h is None else false_stop_cost_h
    n_ticks = len(prep.grid.times)
    lead = lead_in_ticks(warning_lead_s, s.tick_s)
    parts: dict[str, list] = {k: [] for k in ("instance", "mark_at", "stop_at", "restart_at", "net_s", "false_stop")}
    for i in range(tr.n_instances):  # per instance; the stretches themselves are arrays
        if prep.last_idx[i] < prep.first_idx[i]:
            continue
        starts, ends, has_restart = idle_stretches(prep, i)
        nonempty = ends > starts
        starts, ends, has_restart = starts[nonempty], ends[nonempty], has_restart[nonempty]
        mark = np.ceil((starts * tr.step_s) / s.tick_s - _EPS).astype(np.int64)  # first tick at/after the start
        stop = mark + lead
        stop_t = tr.t0 + stop * s.tick_s
        restart_t = np.where(has_restart, tr.t0 + ends * tr.step_s, np.nan)
        until = np.where(has_restart, restart_t, prep.end_t[i])
        stopped = until - stop_t
        net = (stopped - np.where(has_restart, s.restart_cost_s, 0.0)) * prep.gpus[i]
        false_stop = has_restart & (stopped < s.break_even_s)
        gain_s = net - np.where(false_stop, c * 3600.0, 0.0)
        keep = (stop < n_ticks) & (stopped > _EPS) & (gain_s > _EPS)
        parts["instance"].append(np.full(int(keep.sum()), i, dtype=np.int64))
        parts["mark_at"].append(tr.t0 + mark[keep] * s.tick_s)
        parts["stop_at"].append(stop_t[keep])
        parts["restart_at"].append(restart_t[keep])
        parts["net_s"].append(net[keep])
        parts["false_stop"].append(false_stop[keep])
    cat = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in parts.items()}
    return CeilingStops(instance=cat["instance"].astype(np.int64), mark_at=cat["mark_at"], stop_at=cat["stop_at"],
                        restart_at=cat["restart_at"], net_s=cat["net_s"], false_stop=cat["false_stop"].astype(bool),
                        false_stop_cost_h=c)


def ceiling_net_seconds(prep: Prepared, warning_lead_s: float, false_stop_cost_h: float | None = None) -> np.ndarray:
    """GPU-seconds the clairvoyant-with-lead ceiling (`ceiling_stops`) saves per instance."""
    stops = ceiling_stops(prep, warning_lead_s, false_stop_cost_h)
    return np.bincount(stops.instance, weights=stops.net_s, minlength=prep.trace.n_instances).astype(float)


def net_score(net_gpu_hours: float, false_stops: int, false_stop_cost_h: float) -> float:
    """The score a policy is judged by: net GPU-hours saved minus `false_stop_cost_h` per false stop."""
    return net_gpu_hours - false_stop_cost_h * false_stops


def pct_of_ceiling(score: float, ceiling_score: float) -> float:
    """A score as a share of the ceiling's score for the same false-stop cost (0 where the ceiling saves nothing)."""
    return 100.0 * score / ceiling_score if ceiling_score > 0 else 0.0


@dataclass(frozen=True)
class Summary:
    policy: str
    instances: int
    stops: int
    restarts: int
    false_stops: int
    false_stop_rate: float
    marks: int
    marks_cancelled: int
    gpu_hours_stopped: float
    restart_cost_gpu_hours: float
    net_gpu_hours: float
    net_dollars: float
    oracle_net_gpu_hours: float
    pct_of_oracle: float
    time_to_stop_min: dict  # p10/p50/p90/mean minutes
    rule: Rule | None = None
    # The yardstick (issue 12): score = net GPU-h - false_stop_cost_h x false stops, against the clairvoyant-with-
    # lead ceiling for the rule's own lead (`ceiling_stops`). pct_of_oracle above is kept for old readers only.
    false_stop_cost_h: float = FALSE_STOP_COST_H
    score: float = 0.0
    ceiling_net_gpu_hours: float = 0.0
    ceiling_false_stops: int = 0
    ceiling_score: float = 0.0
    pct_of_ceiling: float = 0.0
    restarts_per_instance_day: float = 0.0

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "rule"}
        if self.rule is not None:
            d["rule"] = {"threshold_pct": self.rule.threshold_pct, "window_s": self.rule.window_s,
                         "aggregation": self.rule.aggregation.value, "warning_lead_s": self.rule.warning_lead_s}
        return d


def summarise(name: str, prep: Prepared, rep: Replay, rule: Rule | None = None,
              oracle: np.ndarray | None = None) -> Summary:
    s, a = prep.settings, rep.arrays
    n = rep.n_stops
    gpus = prep.gpus[a["instance"]] if n else np.zeros(0)
    restarted = ~np.isnan(a["restart_at"]) if n else np.zeros(0, bool)
    stopped_h = float((a["stopped_s"] * gpus).sum() / 3600) if n else 0.0
    cost_h = float(gpus[restarted].sum() * s.restart_cost_s / 3600) if n else 0.0
    false = int(np.count_nonzero(a["false_stop"])) if n else 0
    net = stopped_h - cost_h
    oracle_h = float((oracle_net_seconds(prep) if oracle is None else oracle).sum() / 3600)
    ceiling = prep.ceiling(float(rule.warning_lead_s) if rule is not None else 0.0)
    score = net_score(net, false, s.false_stop_cost_h)
    days = prep.instance_days
    tts = a["time_to_stop_s"] / 60 if n else np.zeros(0)
    dist = ({"p10": float(np.percentile(tts, 10)), "p50": float(np.median(tts)), "p90": float(np.percentile(tts, 90)),
             "mean": float(tts.mean())} if n else {})
    return Summary(
        policy=name, instances=prep.trace.n_instances, stops=n, restarts=int(restarted.sum()), false_stops=false,
        false_stop_rate=false / n if n else 0.0, marks=rep.marks, marks_cancelled=rep.cancelled,
        gpu_hours_stopped=stopped_h, restart_cost_gpu_hours=cost_h, net_gpu_hours=net,
        net_dollars=net * s.price_per_gpu_hour, oracle_net_gpu_hours=oracle_h,
        pct_of_oracle=100.0 * net / oracle_h if oracle_h > 0 else 0.0, time_to_stop_min=dist, rule=rule,
        false_stop_cost_h=s.false_stop_cost_h, score=score, ceiling_net_gpu_hours=ceiling.net_gpu_hours,
        ceiling_false_stops=ceiling.false_stops, ceiling_score=ceiling.score,
        pct_of_ceiling=pct_of_ceiling(score, ceiling.score),
        restarts_per_instance_day=int(restarted.sum()) / days if days > 0 else 0.0,
    )


def backtest_rule(prep: Prepared, rule: Rule, oracle: np.ndarray | None = None) -> tuple[Summary, Replay]:
    """One rule, simulated as if its action were stop (a notify rule shows what enforcing it would do)."""
    rep = replay(prep, rule_verdicts(prep, rule), rule.warning_lead_s, rule.window_s)
    return summarise(rule.name, prep, rep, rule, oracle), rep


def early_warning_rule(rule: Rule, tick_s: float) -> Rule:
    """The first idle sign of a rule: its own predicate over one tick's samples (window = the tick)."""
    return replace(rule, name=f"{rule.name} (early warning)", window_s=math.ceil(tick_s))


def backtest_rule_early_warning(prep: Prepared, rule: Rule) -> tuple[Summary, Replay]:
    """The rule with a warning that starts at the first idle sign and overlaps the window.

    Today: the window W must be idle before the warning goes out, then the lead L runs: an idle stretch that
    begins at s is stopped at s + W + L, with L of notice. Early warning, precisely: the warning goes out at the
    first tick where the rule's own predicate holds over that tick's samples alone (`early_warning_rule`); any
    later tick where that one-tick sign fails (activity at or over the threshold) cancels it, as an ACTIVE
    verdict cancels a mark today, and missing data renews it; the stop comes at the first tick at or after
    warning + L where the rule's full window verdict is IDLE. For a stays_below rule the sign holds for the whole
    window, so the stop comes at s + max(W, L) (on the grid) with max(W, L) of notice. After a restart no
    warning starts within the rule's window (the launch-time reset), as today.
    The other variant, stop time unchanged (s + W + L) with the warning at s, changes no stop and no figure
    but the notice (W + L instead of L): bench/bench_backtest.py --early-warning measures both.
    """
    sign = rule_verdicts(prep, early_warning_rule(rule, prep.settings.tick_s))
    rep = replay(prep, sign, rule.warning_lead_s, rule.window_s, stop_verdicts=rule_verdicts(prep, rule))
    return summarise(f"{rule.name} (early warning)", prep, rep, rule), rep


def backtest(trace: Trace, rules: Sequence[Rule], settings: BacktestSettings | None = None) -> list[Summary]:
    prep = Prepared(trace, settings or BacktestSettings())
    oracle = oracle_net_seconds(prep)
    return [backtest_rule(prep, r, oracle)[0] for r in rules]


__all__ = [
    "Aggregation", "BacktestSettings", "backtest_rule_early_warning", "early_warning_rule", "Prepared", "Replay", "StopEvent", "Summary", "backtest", "backtest_rule",
    "CeilingStops", "ceiling_net_seconds", "ceiling_stops", "lead_in_ticks", "net_score", "pct_of_ceiling",
    "oracle_net_seconds", "replay", "rule_verdicts", "summarise", "UNKNOWN", "IDLE", "UNDERUTILIZED", "ACTIVE",
]
