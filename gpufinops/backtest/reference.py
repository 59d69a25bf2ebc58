"""The slow, obvious replay: one `evaluate()` call per instance per tick.

It builds InstanceUsage/GpuWindowStats from each window's samples the way the
live collector reports them, judges them with the live `evaluate()`, and acts with
the live `act.plan()` (marks, snoozes as tags, state transitions as the Actuator
keeps them). It exists to prove the vectorised engine decides alike
(tests/test_backtest_equivalence.py) and as the baseline in bench/bench_backtest.py.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import numpy as np

from ..act.plan import plan
from ..decide.evaluate import evaluate
from ..model import (TAG_MARKED, TAG_SNOOZE, Action, ActionKind, GpuInstance, GpuWindowStats, InstanceUsage, Rule,
                     Verdict)
from ..store.schema import MarkRow, StateRow
from .engine import ACTIVE, IDLE, UNDERUTILIZED, UNKNOWN, _EPS, BacktestSettings, Grid, StopEvent
from .traces import Trace

_CODE = {Verdict.UNKNOWN: UNKNOWN, Verdict.IDLE: IDLE, Verdict.UNDERUTILIZED: UNDERUTILIZED, Verdict.ACTIVE: ACTIVE}


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def window_usage(trace: Trace, rows: np.ndarray, iid: str, lo: int, hi: int, window_s: int, expected: int) -> InstanceUsage:
    """What the live collector would report for samples [lo, hi) of these GPU rows."""
    gpus = []
    for r in rows:
        vals = trace.util[r, max(lo, 0):hi]
        vals = vals[~np.isnan(vals)]
        mem = None
        if trace.mem_mib is not None:
            m = trace.mem_mib[r, max(lo, 0):hi]
            m = m[~np.isnan(m)]
            mem = float(m.max()) if len(m) else None
        sm = None
        if trace.sm_active is not None:
            a = trace.sm_active[r, max(lo, 0):hi]
            a = a[~np.isnan(a)]
            sm = float(a.mean()) if len(a) else None
        gpus.append(GpuWindowStats(
            gpu=trace.gpu_names[r], samples=len(vals),
            activity_max=float(vals.max()) if len(vals) else None,
            activity_mean=float(vals.mean()) if len(vals) else None,
            activity_min=float(vals.min()) if len(vals) else None, fb_used_max_mib=mem, sm_active=sm,
        ))
    return InstanceUsage(instance_id=iid, window_s=window_s, expected_samples=expected, gpus=tuple(gpus))


def replay_per_tick(trace: Trace, rule: Rule, settings: BacktestSettings, instances: list[int] | None = None):
    """Returns (verdicts int8 (instances, ticks), stops, marks, cancelled) for the chosen instances."""
    grid = Grid.for_trace(trace, settings.tick_s)
    lo_all = grid.lo(trace, rule.window_s)
    expected = settings.expected_samples(rule.window_s, trace.step_s)
    chosen = list(range(trace.n_instances)) if instances is None else list(instances)
    # The backtest asks what a rule would have stopped: every rule is replayed as a stop rule.
    stop_rule = replace(rule, action=Action.STOP)
    verdicts = np.zeros((len(chosen), len(grid.times)), dtype=np.int8)
    stops: list[StopEvent] = []
    marks = cancelled = 0
    for out_row, i in enumerate(chosen):
        iid = trace.instance_ids[i]
        rows = np.flatnonzero(trace.gpu_instance == i)
        valid = ~np.isnan(trace.util[rows])
        cols = np.flatnonzero(valid.any(0))
        if not len(cols):
            continue
        first_t = trace.t0 + cols[0] * trace.step_s
        end_t = trace.t0 + (cols[-1] + 1) * trace.step_s
        with np.errstate(invalid="ignore"):
            demand = np.fmax.reduce(trace.util[rows], axis=0) > settings.demand_pct
        snoozes = settings.snoozes.get(iid, ())
        launch, stopped_at, mark, st = first_t, None, None, None
        for j, now in enumerate(grid.times):
            hi = int(grid.hi[j])
            if stopped_at is not None:
                after = int(np.floor((stopped_at - trace.t0) / trace.step_s + _EPS)) + 1
                hits = np.flatnonzero(demand[after:hi])
                if len(hits):  # someone needed it: restarted at that sample, launch time resets
                    restart = trace.t0 + (after + hits[0]) * trace.step_s
                    ev = stops[-1]
                    stops[-1] = StopEvent(**{**ev.__dict__, "restart_at": restart, "stopped_s": restart - ev.stop_at,
                                             "false_stop": restart - ev.stop_at < settings.break_even_s})
                    launch, stopped_at = restart, None
            alive = first_t - _EPS <= now < end_t - _EPS
            state = "running" if alive and stopped_at is None else "stopped"
            snooze_end = next((b for a, b in snoozes if a <= now < b), None)
            tags = {}
            if snooze_end is not None:
                tags[TAG_SNOOZE] = _dt(snooze_end).strftime("%Y-%m-%dT%H:%M:%SZ")
            if mark is not None:
                tags[TAG_MARKED] = mark.stop_at.strftime("%Y-%m-%dT%H:%M:%SZ")
            inst = GpuInstance(instance_id=iid, instance_type="", region="", state=state, launch_time=_dt(launch),
                               gpu_count=len(rows), tags=tags)
            usage = window_usage(trace, rows, iid, int(lo_all[j]), hi, rule.window_s, expected)
            d = evaluate(inst, usage, stop_rule, _dt(now)) if rule.selector.matches(inst) else None
            v = _CODE[d.verdict] if d is not None else UNKNOWN
            verdicts[out_row, j] = v
            if not inst.is_running:
                continue  # the live service neither judges nor acts on a stopped instance
            # The live act stage: state transitions as Actuator.track_states keeps them, then act.plan().
            if d is not None and (st is None or st.verdict != d.verdict):
                st = StateRow(iid, rule.name, d.verdict, _dt(now), _dt(now), None, None)
            intent = plan(inst, d, mark, st if d is not None else None, _dt(now), dry_run=False)
            if intent.kind == ActionKind.MARK:
                # The backtest models a warning delivered at once (the live act stage waits for delivery).
                mark = MarkRow(iid, rule.name, _dt(now), _dt(now + rule.warning_lead_s), d.reason, False,
                               warned_at=_dt(now))
                marks += 1
            elif intent.kind == ActionKind.UNMARK:
                mark = None
                cancelled += 1
            elif intent.kind == ActionKind.STOP:
                seen = np.flatnonzero(demand[:hi])
                last_demand_t = trace.t0 + (seen[-1] + 1) * trace.step_s if len(seen) else first_t
                stops.append(StopEvent(
                    instance=iid, stop_at=float(now), restart_at=None, stopped_s=float(max(end_t, now) - now),
                    gpus=len(rows), false_stop=False, time_to_stop_s=float(max(0.0, now - last_demand_t)),
                    mark_at=mark.marked_at.timestamp(), tick=j,
                ))
                stopped_at, mark = now, None
                st = replace(st, stopped_at=_dt(now), stop_dry_run=False)
    return verdicts, stops, marks, cancelled
