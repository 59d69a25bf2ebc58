"""The learned idle policy (issue 5) in the live service, for rules that opt in with a `learned:` block.

The backtest's policy (`backtest/adaptive.py`) decides from each instance's past idle stretches. Live, that
history comes from Prometheus:

- `IdleHistory` keeps, per series group (one host), the activity of every `step` over the last `history_days`,
  fetched with range queries whose number does not depend on the fleet size: one query per chunk of at most
  10,000 steps (Prometheus refuses more than 11,000 points per series) for a full refresh every `refresh`, and
  one small query for the steps completed since the last call. Each step is the max over its (t - step, t] of
  every GPU (`max_over_time`, so a short burst between two steps is not missed), DCGM_FI_DEV_GPU_UTIL or
  100 x DCGM_FI_PROF_GR_ENGINE_ACTIVE (all a MIG slice has), with the number of GPUs reporting. A step is idle
  when every GPU is at or under `demand_pct`; a step with a sentinel, or with fewer GPUs than the host usually
  reports, is unknown (missing data is never idle). A failed query leaves no history: the fixed rule decides.
- `decide_learned` wraps `adaptive.decide()`. It may only hold back the fixed rule's IDLE (LEARNED_WAIT) or let
  it through (LEARNED_IDLE, or the fixed rule's own code when the history is too thin); it never turns UNKNOWN,
  UNDERUTILIZED or ACTIVE into IDLE. Once the policy has said IDLE for a stretch, it stays IDLE until demand
  returns, as in the backtest (else a mark would be cancelled and renewed while the lull goes on).
- `apply_learned` replaces the decisions of the rules with a `learned:` block; everything else is unchanged.
- Time of day (`time_of_day`, default 3h): each stretch keeps its start time, so the evidence for the current
  lull is the past lulls begun near its time of day (the others weigh `other_times_weight`), and the fleet prior
  is built per hour from the fleet's lulls begun near it, as in the backtest.

I/O happens only in `IdleHistory.refresh`; every other function is pure and takes `now`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

import numpy as np
import requests
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .backtest import adaptive
from .backtest.adaptive import EMPTY_PRIOR, AdaptiveParams, FleetPrior
from .collect.prometheus import (
    GPU_LABELS,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    MAX_POINTS,
    InstanceMatcher,
    PromReader,
    QueryFailed,
    host_labels,
)
from .config import PrometheusSettings
from .model import (
    FALSE_STOP_WITHIN_S,
    SENTINEL_THRESHOLD,
    Decision,
    GpuInstance,
    ReasonCode,
    Rule,
    Verdict,
)

log = logging.getLogger("gpufinops.learned")

TICK_S = adaptive.REPLAY_TICK_S  # ages at which an earlier IDLE is looked for
_AGGS = ("util_max", "util_n", "gr_max", "gr_n")
UNKNOWN_STEP, IDLE_STEP, DEMAND_STEP = 0, 1, 2


# --------------------------------------------------------------------------- parameters


def _duration(v: Any) -> Any:
    from .rules import (
        parse_duration,  # here, not at the top: rules.py imports this module once wired
    )

    return None if v is None else parse_duration(v)


class LearnedParams(BaseModel):
    """A rule's `learned:` block. Durations accept 10m, 1h30m or seconds; defaults are the backtest's."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    history_days: float = Field(14.0, gt=0, le=90)  # how far back the stretches are learned from
    step_s: int = Field(300, alias="step")  # history resolution: coarse keeps the range queries small
    demand_pct: float = Field(5.0, gt=0, lt=100)  # activity above this on any GPU ends an idle stretch
    refresh_s: int = Field(3600, alias="refresh")  # full re-read of the history (and the fleet prior) this often
    break_even_s: int = Field(FALSE_STOP_WITHIN_S, alias="break_even")  # demand back sooner than this: a false stop
    restart_cost_s: int = Field(600, alias="restart_cost")  # GPU time lost per restart
    false_stop_cost_h: float = Field(2.0, ge=0)  # GPU-hours a false stop counts as, on top of the restart
    fleet_prior: float = Field(5.0, ge=0)  # pseudo-stretches borrowed from the fleet (0: own history only)
    min_support: float = Field(3.0, gt=0)  # weighted past stretches at least this long before deciding
    min_history: int = Field(10, ge=1)  # without a fleet prior: fewer own stretches and the fixed rule decides
    min_idle_s: int = Field(300, alias="min_idle")  # never stop a lull shorter than this
    # Too few past stretches this long: the fixed rule decides, after this much idleness (None: the break-even).
    unusual_wait_s: int | None = Field(None, alias="unusual_wait")
    criterion: Literal["value", "p"] = "value"
    p_min: float = Field(0.8, gt=0, le=1)  # criterion "p": confidence that the stop outlasts the break-even
    # Past stretches begun within this much of the current one's time of day weigh 1, the others
    # other_times_weight; the fleet prior uses only the former (0: time of day unused).
    time_of_day_s: int = Field(3 * 3600, alias="time_of_day", ge=0, le=12 * 3600)
    other_times_weight: float = Field(0.2, ge=0, le=1)
    # No stop within this long of the instance's (re)start (its launch time), whatever the history says.
    restart_grace_s: int = Field(2 * 3600, alias="restart_grace", ge=0)
    # Earned trust: on each instance the learned wait decides as long as, replayed over that instance's own past
    # idle stretches, it has scored at least as much as a fixed wait of this long (less trust_margin_h GPU-h per
    # GPU); behind that, the fixed wait decides until it catches up. None: the learned wait always decides.
    trust_wait_s: int | None = Field(None, alias="trust_wait")
    trust_margin_h: float = Field(0.0, ge=0)

    @field_validator("step_s", "refresh_s", "break_even_s", "restart_cost_s", "min_idle_s", "unusual_wait_s",
                     "trust_wait_s", mode="before")
    @classmethod
    def _durations(cls, v: Any) -> Any:
        return _duration(v)

    @field_validator("time_of_day_s", "restart_grace_s", mode="before")
    @classmethod
    def _time_of_day(cls, v: Any) -> Any:
        return 0 if v in (0, "0") else _duration(v)  # 0 turns it off

    @model_validator(mode="after")
    def _consistent(self) -> LearnedParams:
        if not 10 <= self.step_s <= 3600:
            raise ValueError(f"step must be between 10s and 1h, got {self.step_s}s")
        if self.refresh_s < self.step_s:
            raise ValueError(f"refresh ({self.refresh_s}s) must be at least one step ({self.step_s}s)")
        if self.history_days * 86400 < 10 * self.step_s:
            raise ValueError("history_days must cover at least 10 steps")
        return self

    @property
    def history_s(self) -> float:
        return self.history_days * 86400.0

    def adaptive(self) -> AdaptiveParams:
        return AdaptiveParams(criterion=self.criterion, false_stop_cost_h=self.false_stop_cost_h, p_min=self.p_min,
                              prior_weight=self.fleet_prior, min_support=self.min_support,
                              min_idle_s=float(self.min_idle_s), min_history=self.min_history,
                              unusual_wait_s=None if self.unusual_wait_s is None else float(self.unusual_wait_s),
                              fleet_refresh_s=float(self.refresh_s), time_of_day_s=float(self.time_of_day_s),
                              other_times_weight=self.other_times_weight,
                              restart_grace_s=float(self.restart_grace_s),
                              trust_wait_s=None if self.trust_wait_s is None else float(self.trust_wait_s),
                              trust_margin_h=self.trust_margin_h)


# --------------------------------------------------------------------------- stretches (pure)


@dataclass(frozen=True)
class Stretches:
    """Idle stretches of one host (or one instance) over the history.

    completed_s: lengths (s) of stretches with demand on both sides, oldest first: the policy's own evidence.
    censored_s: stretches that lasted *at least* this long (cut by the history's start, a gap in the data, or
      still going on at its end): for the fleet prior's Kaplan-Meier, never as completed.
    completed_start_t, censored_start_t: when each began (epoch s; for one cut by the history's start or a gap,
      the earliest time known idle), for the time of day.
    open_since: start (epoch s) of the stretch still going on at the end of the history, None if the last step
      was not idle; open_exact: False when it began before the history or after a gap (then a latest start).
    end_t: the history's last step (epoch s), at or before `now`.
    """

    completed_s: tuple[float, ...]
    censored_s: tuple[float, ...]
    open_since: float | None
    open_exact: bool
    end_t: float
    completed_start_t: tuple[float, ...] = ()
    censored_start_t: tuple[float, ...] = ()


def step_states(activity: np.ndarray, gpus: np.ndarray, demand_pct: float) -> np.ndarray:
    """Per step: IDLE_STEP (every GPU at or under demand_pct), DEMAND_STEP, or UNKNOWN_STEP.

    Unknown: no valid value (NaN, a DCGM sentinel, a negative) or fewer GPUs than this host reports at most
    over the history (a GPU whose exporter is down may be the busy one).
    """
    act = np.asarray(activity, dtype=float)
    n = np.nan_to_num(np.asarray(gpus, dtype=float), nan=0.0)
    ref = n.max() if n.size else 0.0
    valid = np.isfinite(act) & (act >= 0) & (act < SENTINEL_THRESHOLD) & (n >= ref) & (ref > 0)
    out = np.full(act.shape, UNKNOWN_STEP, dtype=np.int8)
    out[valid & (act <= demand_pct)] = IDLE_STEP
    out[valid & (act > demand_pct)] = DEMAND_STEP
    return out


def stretches(states: np.ndarray, t0: float, step_s: float) -> Stretches:
    """Idle stretches from step states on the grid t0 + k * step_s (step k covers (t_k - step, t_k]).

    A run of idle steps a..b-1 lasted (b - a) steps, from t_a - step (the end of the last step with demand)
    to t_b - step, as the backtest counts a stretch of samples.
    """
    s = np.asarray(states)
    n = len(s)
    idle = np.concatenate([[False], s == IDLE_STEP, [False]])
    edges = np.flatnonzero(np.diff(idle.astype(np.int8)))
    starts, ends = edges[0::2], edges[1::2]  # runs [a, b)
    completed, censored, completed_t, censored_t = [], [], [], []
    open_since, open_exact = None, False
    for a, b in zip(starts, ends):
        length, began = float((b - a) * step_s), t0 + (a - 1) * step_s
        after_demand = a > 0 and s[a - 1] == DEMAND_STEP
        if b == n:
            open_since, open_exact = began, bool(after_demand)
        if b < n and after_demand and s[b] == DEMAND_STEP:
            completed.append(length)
            completed_t.append(began)
        else:
            censored.append(length)
            censored_t.append(began)
    return Stretches(tuple(completed), tuple(censored), open_since, open_exact, t0 + (n - 1) * step_s,
                     tuple(completed_t), tuple(censored_t))


# --------------------------------------------------------------------------- history from Prometheus


@dataclass(frozen=True)
class _Config:
    step_s: int
    history_s: float
    refresh_s: int

    @classmethod
    def of(cls, p: LearnedParams) -> _Config:
        return cls(p.step_s, p.history_s, p.refresh_s)


class _Grid:
    """Per series group (one host), 4 aggregates x steps on the grid t0 + k * step; NaN = no answer."""

    def __init__(self, step_s: int, t0: float, fetched_at: float):
        self.step_s, self.t0, self.fetched_at = step_s, t0, fetched_at
        self.n = 0
        self.keys: list[tuple[str, ...]] = []
        self.index: dict[tuple[str, ...], int] = {}
        self.data = np.full((0, len(_AGGS), 0), np.nan, dtype=np.float32)  # 4 x 4 B per host-step
        # what is derived from this history and kept until the next full refresh: the fleet priors (one per hour
        # with time of day), the stretches they come from, and each host's earned-trust replay
        self.derived: dict[tuple, Any] = {}

    @property
    def end_t(self) -> float:
        return self.t0 + (self.n - 1) * self.step_s

    def put(self, start: float, end: float, rows: Iterable[tuple[tuple[str, ...], str, float, float]]) -> None:
        """Write the answers for [start, end]: that span is replaced (a re-read step is authoritative)."""
        k0 = round((start - self.t0) / self.step_s)
        k1 = round((end - self.t0) / self.step_s)
        if k1 + 1 > self.n:
            self.data = np.concatenate(
                [self.data, np.full((self.data.shape[0], len(_AGGS), k1 + 1 - self.n), np.nan, np.float32)],
                axis=2)
            self.n = k1 + 1
        rows = list(rows)
        new = list(dict.fromkeys(key for key, *_ in rows if key not in self.index))
        if new:  # grown once per answer, not once per host
            self.index.update((key, len(self.keys) + i) for i, key in enumerate(new))
            self.keys.extend(new)
            grown = np.full((len(new), len(_AGGS), self.n), np.nan, np.float32)
            self.data = np.concatenate([self.data, grown], axis=0)
        self.data[:, :, k0:k1 + 1] = np.nan
        if rows:
            g = np.array([self.index[key] for key, *_ in rows])
            a = np.array([_AGGS.index(agg) for _, agg, _, _ in rows])
            k = np.rint((np.array([ts for _, _, ts, _ in rows]) - self.t0) / self.step_s).astype(int)
            v = np.array([value for *_, value in rows])
            ok = (k >= k0) & (k <= k1)
            self.data[g[ok], a[ok], k[ok]] = v[ok]

    def activity(self, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(max activity %, GPUs reporting) per step over the given groups (one instance may have several)."""
        if not rows:
            return np.full(self.n, np.nan), np.zeros(self.n)
        d = self.data[list(rows)]
        with warnings.catch_warnings():  # nanmax of a step with no answer is NaN, as meant: no warning
            warnings.simplefilter("ignore", RuntimeWarning)
            act = np.nanmax(np.stack([d[:, 0], d[:, 2]]), axis=(0, 1))  # GPU_UTIL, 100 x GR_ENGINE_ACTIVE
            gpus = np.nansum(np.nanmax(np.stack([d[:, 1], d[:, 3]]), axis=0), axis=0)
        return act, gpus


@dataclass
class HistoryView:
    """The history as it stands, mapped to the current instances. Pure: no I/O."""

    grid: _Grid | None
    params: LearnedParams
    rows_by_instance: dict[str, list[int]]

    def instance(self, instance_id: str) -> Stretches | None:
        """None: no history for this instance (not in Prometheus, or the history could not be read)."""
        rows = self.rows_by_instance.get(instance_id)
        if self.grid is None or not rows:
            return None
        act, gpus = self.grid.activity(rows)
        return stretches(step_states(act, gpus, self.params.demand_pct), self.grid.t0, self.grid.step_s)

    def prior(self, lead_s: float, stretch_start_t: float | None = None) -> FleetPrior:
        """The fleet prior from every host's stretches (completed, and at-least-this-long ones); with time of day,
        only those begun near the hour of stretch_start_t (one prior per hour, as in the backtest)."""
        ap = self.params.adaptive()
        if self.grid is None or ap.prior_weight <= 0:
            return EMPTY_PRIOR
        floor = adaptive.floor_s(ap, lead_s)
        hour = adaptive.prior_hour(stretch_start_t, ap) if stretch_start_t is not None else None
        key = (self.params.demand_pct, floor, ap.prior_points, ap.time_of_day_s, hour)
        if key not in self.grid.derived:
            d, c, d_t, c_t = self._fleet_stretches()
            if hour is not None:
                d, c = d[adaptive.near_in_time_of_day(d_t, hour, ap)], c[adaptive.near_in_time_of_day(c_t, hour, ap)]
            self.grid.derived[key] = adaptive.fleet_prior(d, floor, ap.prior_points, ongoing_s=c)
        return self.grid.derived[key]

    def trust(self, instance_id: str, hist: Stretches, rule: Rule) -> adaptive.Trust | None:
        """This instance's earned trust (None: the block has no trust_wait). Replaying a past stretch is one small
        numpy step, and the fleet prior only changes at a full refresh: so the replay is kept with the history
        and, as stretches complete, only the new ones are replayed."""
        ap = self.params.adaptive()
        if ap.trust_wait_s is None or self.grid is None:
            return None
        lead = float(rule.warning_lead_s)
        key = ("trust", self.params, instance_id, lead, float(rule.window_s))
        done = (hist.completed_s, hist.completed_start_t)
        known, trust = self.grid.derived.get(key, (((), ()), adaptive.NO_TRUST))
        if known != done:
            n = trust.stretches
            same_past = known[0] == done[0][:n] and known[1] == done[1][:n]
            trust = adaptive.trust_of(*done, partial(self.prior, lead), rule, ap, float(self.params.break_even_s),
                                      float(self.params.restart_cost_s), float(rule.window_s),
                                      resume=trust if same_past else adaptive.NO_TRUST)
            self.grid.derived[key] = (done, trust)
        return trust

    def _fleet_stretches(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every host's (completed, censored) stretch lengths and start times; read once per history, then
        filtered for each hour's prior."""
        key = ("stretches", self.params.demand_pct)
        if key not in self.grid.derived:
            done, cens, done_t, cens_t = [], [], [], []
            for row in range(len(self.grid.keys)):
                act, gpus = self.grid.activity([row])
                st = stretches(step_states(act, gpus, self.params.demand_pct), self.grid.t0, self.grid.step_s)
                done.extend(st.completed_s)
                cens.extend(st.censored_s)
                done_t.extend(st.completed_start_t)
                cens_t.extend(st.censored_start_t)
            self.grid.derived[key] = tuple(np.asarray(x, dtype=float) for x in (done, cens, done_t, cens_t))
        return self.grid.derived[key]


def _epoch(now: datetime) -> float:
    return (now.replace(tzinfo=UTC) if now.tzinfo is None else now).timestamp()


class IdleHistory:
    """Per-host idle history from Prometheus, shared by every learned rule; built once per service.

    `refresh(rules, now)` is the only I/O: per distinct (step, history, refresh) of the learned rules, a full
    read every `refresh` (ceil(history / step / 10,000) range queries) and otherwise one range query for the
    steps completed since the last call. Never reads past `now`. A failed query drops that history (the
    fixed rule decides) and keeps the error in `errors` for the log.
    """

    def __init__(self, settings: PrometheusSettings, session: requests.Session | None = None,
                 max_points: int = MAX_POINTS):
        self.settings = settings
        self.max_points = max_points
        self.errors: dict[_Config, str] = {}
        self._grids: dict[_Config, _Grid] = {}
        self.host_labels = host_labels(settings.instance_label, settings.hostname_labels)
        self.reader = PromReader(settings, session)

    @property
    def queries_made(self) -> int:
        return self.reader.queries_made

    # -- queries

    def query(self, step_s: int) -> str:
        """Per host and step: max activity and GPUs reporting, for both activity signals (one PromQL text)."""
        by = ", ".join(self.host_labels)
        per_gpu = ", ".join((*self.host_labels, *[g for g in GPU_LABELS if g not in self.host_labels]))
        rng = f"{step_s * 1000 - 1}ms"  # (t - step, t]: a sample on a step boundary is counted once
        sel = self.settings.selector.strip()
        parts = []
        for metric, name, scale in ((GPU_UTIL, "util", ""), (GR_ENGINE_ACTIVE, "gr", "100 * ")):
            v = f"{metric}{{{sel}}}[{rng}]" if sel else f"{metric}[{rng}]"
            # The GPU count goes through `max by (GPU identity)`: pod labels that change mid-step make two
            # series of one GPU.
            parts.append(f'label_replace({scale}max by ({by}) (max_over_time({v})), "agg", "{name}_max", "", "")')
            parts.append(f'label_replace(count by ({by}) (max by ({per_gpu}) (max_over_time({v}))), '
                         f'"agg", "{name}_n", "", "")')
        return " or ".join(parts)

    def _range(self, promql: str, start: float, end: float, step_s: int):
        """(host key, agg, ts, value) rows of [start, end], read in pages of at most max_points steps."""
        rows = []
        try:
            for series in self.reader.range(promql, start, end, step_s, max_points=self.max_points):
                labels = series["metric"]
                agg = labels.get("agg")
                key = tuple(str(labels.get(name, "")) for name in self.host_labels)
                if agg not in _AGGS or not any(key):
                    continue
                for ts, value in series["values"]:
                    rows.append((key, agg, float(ts), float(value)))
        except (KeyError, TypeError, ValueError):
            raise QueryFailed(f"prometheus at {self.reader.where}: malformed range answer") from None
        return rows

    def _read(self, grid: _Grid, start: float, end: float) -> None:
        grid.put(start, end, self._range(self.query(grid.step_s), start, end, grid.step_s))

    # -- refresh (I/O)

    def refresh(self, rules: Iterable[Rule], now: datetime) -> None:
        configs = {_Config.of(r.learned) for r in rules if r.learned is not None}
        for gone in set(self._grids) - configs:
            del self._grids[gone]
        at = _epoch(now)
        for cfg in sorted(configs, key=lambda c: (c.step_s, c.history_s, c.refresh_s)):
            end = np.floor(at / cfg.step_s) * cfg.step_s  # the last complete step at or before now
            grid = self._grids.get(cfg)
            try:
                if grid is None or at - grid.fetched_at >= cfg.refresh_s or at < grid.fetched_at:
                    start = np.ceil((at - cfg.history_s) / cfg.step_s) * cfg.step_s
                    grid = _Grid(cfg.step_s, float(start), at)
                    self._read(grid, float(start), float(end))
                elif end > grid.end_t:
                    # Re-read the last two steps too: samples scraped late may have arrived since.
                    self._read(grid, max(grid.t0, grid.end_t - 2 * cfg.step_s), float(end))
            except QueryFailed as exc:
                self._grids.pop(cfg, None)
                self.errors[cfg] = str(exc)
                log.warning("learned policy: idle history unavailable (%s); fixed rules decide", exc)
                continue
            self._grids[cfg] = grid
            self.errors.pop(cfg, None)

    def view(self, params: LearnedParams, instances: Sequence[GpuInstance]) -> HistoryView:
        grid = self._grids.get(_Config.of(params))
        rows: dict[str, list[int]] = {}
        if grid is not None:
            matcher = InstanceMatcher.build(instances, self.settings.instance_label,
                                            tuple(self.settings.hostname_labels))
            for row, key in enumerate(grid.keys):
                iid = matcher.match({name: v for name, v in zip(self.host_labels, key) if v})
                if iid is not None:
                    rows.setdefault(iid, []).append(row)
        return HistoryView(grid, params, rows)


# --------------------------------------------------------------------------- decisions (pure)


def _fmt(s: float) -> str:
    return adaptive._fmt_min(s)


def current_idle_age(base: Decision, hist: Stretches, params: LearnedParams,
                     now: datetime) -> tuple[float | None, bool]:
    """(age of the current idle stretch in s, exact?) from the history and the fixed rule's own window.

    The window (now - w, now] must be at or under the demand level on every GPU (the base decision's max),
    else there is no idle stretch to judge (None). If the history's open stretch reaches into the window, the
    stretch has lasted since its start; otherwise at least the window (a lower bound, exact=False).
    """
    if base.activity_max is None or base.activity_max > params.demand_pct:
        return None, False
    at = _epoch(now)
    w = float(base.window_s)
    if hist.open_since is not None and hist.end_t >= at - w and hist.open_since <= at - w:
        return at - hist.open_since, hist.open_exact
    return w, False


def _first_learned_age(hist: Stretches, age_s: float, rule: Rule, prior: FleetPrior, params: LearnedParams,
                       stretch_start_t: float) -> tuple[float, str] | None:
    """The first earlier age (on the tick grid) at which the policy said IDLE for this stretch, with its reason."""
    ap = params.adaptive()
    ages = np.arange(ap.min_idle_s, age_s, TICK_S)
    if not len(ages):
        return None
    k, ev = adaptive.first_idle(ages, hist.completed_s, hist.completed_start_t, stretch_start_t, prior, rule, ap,
                                params.break_even_s, params.restart_cost_s, None)
    if k is None:
        return None
    return float(ages[k]), adaptive._idle_reason(ev, k, prior, float(ages[k]), float(rule.warning_lead_s),
                                                 params.break_even_s, ap)


def decide_learned(base: Decision, rule: Rule, history_for_instance: Stretches | None,
                   fleet_prior: FleetPrior | Callable[[float | None], FleetPrior], params: LearnedParams,
                   now: datetime, launched_at: datetime | None = None,
                   trust: adaptive.Trust | None = None) -> Decision:
    """The learned policy over `base`, `evaluate()`'s decision for `rule`. Only an IDLE can change.

    fleet_prior: the prior, or a function of a stretch's start time that gives it (time of day);
    launched_at: the instance's launch time (reset by a start), for `restart_grace`; trust: with `trust_wait`,
    the instance's earned trust if already known (`HistoryView.trust`), else it is computed here. Past stretches
    are replayed with today's fleet prior for their hour, where the backtest uses the prior as it stood then."""
    if base.verdict != Verdict.IDLE or history_for_instance is None:
        return base  # never more aggressive than the fixed rule; no history: the fixed rule decides
    ap = params.adaptive()
    prior_at = fleet_prior if callable(fleet_prior) else (lambda _t: fleet_prior)
    if trust is None and ap.trust_wait_s is not None:
        trust = adaptive.trust_of(history_for_instance.completed_s, history_for_instance.completed_start_t, prior_at,
                                  rule, ap, float(params.break_even_s), float(params.restart_cost_s),
                                  float(rule.window_s))
    age, exact = current_idle_age(base, history_for_instance, params, now)
    if age is None:
        return replace(base, verdict=Verdict.UNDERUTILIZED, code=ReasonCode.LEARNED_WAIT,
                       reason=f"activity up to {base.activity_max:.0f}% in the last {_fmt(base.window_s)}, over the "
                              f"{params.demand_pct:g}% demand level: no idle stretch yet; learned policy waits")
    began = _epoch(now) - age
    prior = prior_at(began)
    d = adaptive.decide(base, list(history_for_instance.completed_s), age, rule, ap,
                        float(params.break_even_s), now, prior, float(params.restart_cost_s),
                        history_start_t=history_for_instance.completed_start_t, trust=trust, hold_back_only=True)
    trusted = trust is None or trust.trusted(ap)  # untrusted: the fixed wait, which needs no latch
    if d.verdict != Verdict.IDLE and d.code == ReasonCode.LEARNED_WAIT and trusted:
        earlier = _first_learned_age(history_for_instance, age, rule, prior, params, began)
        if earlier is not None:  # said IDLE earlier in this stretch: it holds until demand returns
            first_age, why = earlier
            d = replace(base, verdict=Verdict.IDLE, code=ReasonCode.LEARNED_IDLE,
                        reason=f"idle {_fmt(age)}; stop decided at {_fmt(first_age)} idle, until demand returns: "
                               f"{why.split('; ', 1)[1]}" + ("" if trust is None else
                                                             f"; {adaptive.trust_note(trust, ap)}"))
    if not exact and d.reason.startswith("idle "):
        d = replace(d, reason="idle at least " + d.reason[len("idle "):])
    running = None if launched_at is None else _epoch(now) - _epoch(launched_at)
    return adaptive.within_restart_grace(d, base, running, params.adaptive())


def apply_learned(decisions: Sequence[Decision], instances: Sequence[GpuInstance], rules: Sequence[Rule],
                  history: IdleHistory | None, now: datetime) -> list[Decision]:
    """The decisions with those of learned rules replaced by `decide_learned`; the others unchanged. Pure."""
    learned = {r.name: (r, r.learned) for r in rules if r.learned is not None}
    if not learned or history is None:
        return list(decisions)
    views: dict[LearnedParams, HistoryView] = {}
    launched = {i.instance_id: i.launch_time for i in instances}
    out = []
    for d in decisions:
        if d.rule_name not in learned or d.verdict != Verdict.IDLE:
            out.append(d)
            continue
        rule, p = learned[d.rule_name]
        if p not in views:
            views[p] = history.view(p, instances)
        view = views[p]
        hist = view.instance(d.instance_id)
        trust = None if hist is None else view.trust(d.instance_id, hist, rule)
        out.append(decide_learned(d, rule, hist, partial(view.prior, float(rule.warning_lead_s)), p, now,
                                  launched.get(d.instance_id), trust))
    return out
