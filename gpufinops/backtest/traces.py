"""Load utilisation history into one regular grid: `Trace`.

A trace is a matrix of GPU activity (%), one row per GPU series, one column per
sample step. NaN means "no sample" (missing data is never idle, never zero).
Rows are grouped into instances (several GPUs per instance are allowed); an
instance exists from its first to its last sample, like a pod or a VM that the
owner created and deleted.

Sources: a CSV/Parquet file (column names detected, GenTD26's
`value,timestamp_anon,container_ip` as they are), Prometheus range queries
(`prometheus.py`), or arrays built in code (tests, benchmarks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from ..config import ConfigError, not_utf8_error
from ..model import SENTINEL_THRESHOLD

# Candidate column names, most specific first. Matching is case-insensitive.
ID_COLUMNS = ("instance_id", "instance", "gpu_id", "gpu_uuid", "uuid", "container_ip", "pod", "host", "hostname", "node", "id")
GPU_COLUMNS = ("gpu", "gpu_index", "gpu_idx")
TIME_COLUMNS = ("timestamp", "timestamp_anon", "time", "ts", "datetime", "date")
UTIL_COLUMNS = (
    "utilization", "utilisation", "util", "gpu_util", "gpu_utilization", "utilization_pct", "util_pct",
    "dcgm_fi_dev_gpu_util", "duty_cycle", "value",
)
MEM_COLUMNS = ("memory_mib", "mem_mib", "fb_used_mib", "memory_used_mib", "dcgm_fi_dev_fb_used", "memory_used_bytes", "memory_bytes")
# Optional profiling column (issue 25): DCGM_FI_PROF_SM_ACTIVE, a ratio 0..1 (percent when its name ends in _pct).
SM_COLUMNS = ("sm_active", "dcgm_fi_prof_sm_active", "sm_active_ratio", "sm_active_pct")

# Bounds checked before the grid is allocated: a millisecond epoch read as seconds (or a date in
# the year 3000) would otherwise ask for a grid of hundreds of GiB.
MAX_EPOCH_S = 7_258_118_400.0  # 2200-01-01T00:00Z: a larger "epoch second" is milliseconds or a typo
MAX_SPAN_S = 400 * 86400  # a backtest replays months of history, not years
MAX_STEP_S = 86400.0
MAX_GRID_CELLS = 100_000_000  # GPU series x steps: 800 MB of float64 (twice that with memory)


@dataclass(frozen=True)
class Trace:
    """Activity of GPUs on a regular time grid.

    util: float (n_gpus, n_steps), percent, NaN = no sample.
    mem_mib: same shape or None (not measured).
    sm_active: same shape or None: DCGM_FI_PROF_SM_ACTIVE as a ratio 0..1 (NaN = no sample), where the history
    has it; replayed as the live evaluate() uses it (IDLE needs its window mean under the threshold too; a low
    mean makes busy kernels UNDERUTILIZED).
    gpu_instance: for each GPU row, the index of its instance in `instance_ids`.
    """

    instance_ids: tuple[str, ...]
    gpu_names: tuple[str, ...]
    gpu_instance: np.ndarray
    t0: float  # epoch seconds of column 0
    step_s: float
    util: np.ndarray
    mem_mib: np.ndarray | None = None
    source: str = ""
    sm_active: np.ndarray | None = None

    @property
    def n_steps(self) -> int:
        return self.util.shape[1]

    @property
    def n_instances(self) -> int:
        return len(self.instance_ids)

    @property
    def end(self) -> float:
        """Time just after the last sample."""
        return self.t0 + self.n_steps * self.step_s

    def times(self) -> np.ndarray:
        return self.t0 + np.arange(self.n_steps) * self.step_s

    def gpus_per_instance(self) -> np.ndarray:
        return np.bincount(self.gpu_instance, minlength=self.n_instances)

    def instance_span(self) -> tuple[np.ndarray, np.ndarray]:
        """First and last sample column of each instance (any of its GPUs)."""
        valid = ~np.isnan(self.util)
        first_gpu = np.where(valid.any(1), valid.argmax(1), self.n_steps)
        last_gpu = np.where(valid.any(1), self.n_steps - 1 - valid[:, ::-1].argmax(1), -1)
        first = np.full(self.n_instances, self.n_steps)
        last = np.full(self.n_instances, -1)
        np.minimum.at(first, self.gpu_instance, first_gpu)
        np.maximum.at(last, self.gpu_instance, last_gpu)
        return first, last

    def instance_activity_max(self) -> np.ndarray:
        """Per instance, per step: max activity over its GPUs (NaN if none measured)."""
        out = np.full((self.n_instances, self.n_steps), np.nan)
        for i in range(self.n_instances):  # loop over instances, not samples
            rows = self.util[self.gpu_instance == i]
            if len(rows):
                with np.errstate(invalid="ignore"):
                    out[i] = rows[0] if len(rows) == 1 else np.fmax.reduce(rows, axis=0)
        return out

    def select(self, instance_indices: Sequence[int]) -> "Trace":
        """A trace with only these instances (for tuning/holdout splits)."""
        keep = np.asarray(instance_indices, dtype=int)
        remap = {old: new for new, old in enumerate(keep)}
        rows = np.flatnonzero(np.isin(self.gpu_instance, keep))
        return Trace(
            instance_ids=tuple(self.instance_ids[i] for i in keep),
            gpu_names=tuple(self.gpu_names[r] for r in rows),
            gpu_instance=np.array([remap[self.gpu_instance[r]] for r in rows], dtype=int),
            t0=self.t0, step_s=self.step_s, util=self.util[rows],
            mem_mib=None if self.mem_mib is None else self.mem_mib[rows], source=self.source,
            sm_active=None if self.sm_active is None else self.sm_active[rows],
        )


def from_arrays(
    util: np.ndarray, step_s: float, t0: float = 0.0, instance_ids: Sequence[str] | None = None,
    mem_mib: np.ndarray | None = None, gpu_instance: Sequence[int] | None = None, source: str = "arrays",
    sm_active: np.ndarray | None = None,
) -> Trace:
    """One GPU per instance unless `gpu_instance` maps rows to instances."""
    util = np.atleast_2d(np.asarray(util, dtype=float))
    n = util.shape[0]
    gi = np.arange(n) if gpu_instance is None else np.asarray(gpu_instance, dtype=int)
    n_inst = int(gi.max()) + 1 if n else 0
    ids = tuple(instance_ids) if instance_ids is not None else tuple(f"gpu-{i}" for i in range(n_inst))
    if len(ids) != n_inst:
        raise ValueError(f"{len(ids)} instance ids for {n_inst} instances")
    return Trace(
        instance_ids=ids, gpu_names=tuple(str(i) for i in range(n)), gpu_instance=gi, t0=float(t0),
        step_s=float(step_s), util=_clean(util), mem_mib=None if mem_mib is None else _clean(np.asarray(mem_mib, float)),
        source=source, sm_active=None if sm_active is None else clean_ratio(np.atleast_2d(np.asarray(sm_active, float))),
    )


def _clean(a: np.ndarray) -> np.ndarray:
    """DCGM sentinels (~9.2e18) and negatives are not measurements."""
    a = np.array(a, dtype=float)
    a[(a >= SENTINEL_THRESHOLD) | (a < 0)] = np.nan
    return a


def clean_ratio(a: np.ndarray, percent: bool = False) -> np.ndarray:
    """A profiling ratio grid (0..1; a column named *_pct is divided by 100): sentinels, negatives and values over 1
    are no data (NaN), as the live collector's range checks have it."""
    a = _clean(a)
    if percent:
        a = a / 100.0
    with np.errstate(invalid="ignore"):
        a[a > 1.0 + 1e-9] = np.nan
    return a


def _pick(columns: Sequence[str], wanted: str | None, candidates: Sequence[str], what: str, path: str, required=True):
    lower = {c.lower(): c for c in columns}
    if wanted:
        if wanted in columns:
            return wanted
        if wanted.lower() in lower:
            return lower[wanted.lower()]
        raise ConfigError(f"{path}: column {wanted!r} ({what}) not found; columns are {', '.join(columns)}")
    for c in candidates:
        if c in lower:
            return lower[c]
    if required:
        raise ConfigError(
            f"{path}: no {what} found (looked for {', '.join(candidates)}); columns are {', '.join(columns)}; "
            f"name it with --{what.split()[0]}-column"
        )
    return None


def _to_epoch(col: pd.Series, path: str, name: str) -> np.ndarray:
    """Epoch seconds of a time column; row numbers in errors count the header as row 1."""
    if pd.api.types.is_numeric_dtype(col):
        v = col.to_numpy(dtype=float)
        bad = np.flatnonzero(np.isnan(v))
        if len(bad):
            raise ConfigError(f"{path}: row {bad[0] + 2}: column {name!r}: empty timestamp")
    else:
        try:
            parsed = pd.to_datetime(col, errors="coerce", utc=True)
        except (ValueError, TypeError, OverflowError) as exc:
            raise ConfigError(f"{path}: column {name!r}: cannot read timestamps: {exc}") from None
        bad = np.flatnonzero(parsed.isna().to_numpy())
        if len(bad):
            raise ConfigError(f"{path}: row {bad[0] + 2}: column {name!r}: cannot read timestamp {col.iloc[bad[0]]!r}")
        # In the parsed unit (pandas may keep seconds or microseconds): year 2999 must reach the check below.
        naive = parsed.dt.tz_localize(None).to_numpy()
        v = (naive - np.datetime64(0, "s")) / np.timedelta64(1, "s")
    far = np.flatnonzero(~(np.abs(v) <= MAX_EPOCH_S))  # also catches inf
    if len(far):
        hint = " (milliseconds since the epoch? divide by 1000)" if pd.api.types.is_numeric_dtype(col) else ""
        raise ConfigError(f"{path}: row {far[0] + 2}: column {name!r}: timestamp '{col.iloc[far[0]]}' is "
                          f"{'after 2200-01-01' if v[far[0]] > 0 else 'before 1740'} as epoch seconds{hint}")
    return v


def check_grid(path: str, t: np.ndarray, step: float, n_series: int, time_column: str) -> int:
    """The number of grid steps, or a ConfigError when the span or the grid is too large to be real."""
    first, last = int(np.argmin(t)), int(np.argmax(t))
    span = float(t[last] - t[first])
    if span > MAX_SPAN_S:
        raise ConfigError(
            f"{path}: column {time_column!r}: the trace spans {span / 86400:,.0f} days (row {first + 2} to row "
            f"{last + 2}), more than {MAX_SPAN_S // 86400} days; are some timestamps in milliseconds?")
    if not (math.isfinite(step) and 0 < step <= MAX_STEP_S):
        raise ConfigError(f"{path}: sample step {step!r} s: expected a number of seconds in (0, {MAX_STEP_S:g}]")
    n_steps = int(round(span / step)) + 1
    if n_steps * n_series > MAX_GRID_CELLS:
        raise ConfigError(
            f"{path}: {n_series} GPU series x {n_steps:,} steps of {step:g} s is more than {MAX_GRID_CELLS:,} "
            f"samples; give a coarser step (--trace-step) or a shorter trace")
    return n_steps


def _ids(df: pd.DataFrame, column: str, path: str) -> np.ndarray:
    """An id column as strings; an empty cell is an error naming its row (it would join no instance)."""
    empty = df[column].isna().to_numpy() | (df[column].astype(str).str.strip() == "").to_numpy()
    bad = np.flatnonzero(empty)
    if len(bad):
        raise ConfigError(f"{path}: row {bad[0] + 2}: column {column!r}: empty id")
    return df[column].astype(str).to_numpy()



def infer_step(times: np.ndarray) -> float:
    """The sampling step: the most common gap between distinct timestamps."""
    uniq = np.unique(times)
    if len(uniq) < 2:
        return 60.0
    gaps = np.diff(uniq)
    vals, counts = np.unique(np.round(gaps, 3), return_counts=True)
    return float(vals[counts.argmax()])


def load_trace(
    path: str | Path, id_column: str | None = None, time_column: str | None = None, util_column: str | None = None,
    memory_column: str | None = None, gpu_column: str | None = None, step_s: float | None = None,
) -> Trace:
    """Read a CSV or Parquet history file into a Trace.

    Timestamps: epoch seconds (numbers) or ISO date-times. The grid step is
    the most common gap between distinct timestamps unless `step_s` is given;
    samples are snapped to the nearest grid point.
    """
    p = Path(path)
    try:
        df = pd.read_parquet(p) if p.suffix.lower() in (".parquet", ".pq") else pd.read_csv(p)
    except FileNotFoundError:
        raise ConfigError(f"{p}: trace file does not exist") from None
    except UnicodeDecodeError:
        raise not_utf8_error(p) from None
    except Exception as exc:  # pandas/pyarrow parse errors carry their own position
        raise ConfigError(f"{p}: cannot read trace: {exc}") from None
    cols = [str(c) for c in df.columns]
    src = str(p)
    tcol = _pick(cols, time_column, TIME_COLUMNS, "time column", src)
    ucol = _pick(cols, util_column, UTIL_COLUMNS, "util column", src)
    icol = _pick(cols, id_column, ID_COLUMNS, "id column", src)
    gcol = _pick(cols, gpu_column, GPU_COLUMNS, "gpu column", src, required=False)
    mcol = _pick(cols, memory_column, MEM_COLUMNS, "memory column", src, required=False)
    scol = _pick(cols, None, SM_COLUMNS, "SM activity column", src, required=False)
    if len(df) == 0:
        raise ConfigError(f"{p}: trace has no rows")
    util = pd.to_numeric(df[ucol], errors="coerce")
    bad = np.flatnonzero(util.isna().to_numpy() & df[ucol].notna().to_numpy())
    if len(bad):
        raise ConfigError(f"{p}: row {bad[0] + 2}: column {ucol!r}: not a number: {df[ucol].iloc[bad[0]]!r}")
    util = util.to_numpy(dtype=float)
    if np.nanmax(np.where(util < SENTINEL_THRESHOLD, util, np.nan), initial=0) <= 1.0 and "ratio" in ucol.lower():
        util = util * 100.0  # ratio column (e.g. DCGM_FI_PROF_GR_ENGINE_ACTIVE) -> percent
    t = _to_epoch(df[tcol], src, tcol)
    ids = _ids(df, icol, src)
    gpus = _ids(df, gcol, src) if gcol else np.full(len(df), "0", dtype=object)
    mem = None
    if mcol:
        mem = pd.to_numeric(df[mcol], errors="coerce").to_numpy(dtype=float)
        if "bytes" in mcol.lower():
            mem = mem / 2**20

    step = float(step_s) if step_s is not None else infer_step(t)
    keys = pd.MultiIndex.from_arrays([ids, gpus])
    codes, uniques = pd.factorize(keys)
    check_grid(src, t, step, len(uniques), tcol)  # before any allocation
    t0 = float(t.min())
    col = np.rint((t - t0) / step).astype(np.int64)
    n_steps = int(col.max()) + 1

    inst_of_row = [u[0] for u in uniques]
    inst_ids, gpu_instance = np.unique(np.array(inst_of_row, dtype=object), return_inverse=True)
    grid = np.full((len(uniques), n_steps), np.nan)
    grid[codes, col] = util  # duplicates on one grid point: last sample wins
    mem_grid = None
    if mem is not None:
        mem_grid = np.full_like(grid, np.nan)
        mem_grid[codes, col] = mem
    sm_grid = None
    if scol:
        sm_grid = np.full_like(grid, np.nan)
        sm_grid[codes, col] = pd.to_numeric(df[scol], errors="coerce").to_numpy(dtype=float)
    return Trace(
        instance_ids=tuple(str(i) for i in inst_ids), gpu_names=tuple(str(u[1]) for u in uniques),
        gpu_instance=gpu_instance.astype(int), t0=t0, step_s=step, util=_clean(grid),
        mem_mib=None if mem_grid is None else _clean(mem_grid), source=src,
        sm_active=None if sm_grid is None else clean_ratio(sm_grid, percent=scol.lower().endswith("_pct")),
    )


# --------------------------------------------------------------------------- per-GPU-like series from pool traces


def pool_ranks_trace(
    running: np.ndarray, total: np.ndarray, ranks: Sequence[float], step_s: float, t0: float = 0.0, name: str = "pool",
) -> Trace:
    """Per-GPU-like series from a pool's "running GPUs" count (Helios VCs, Philly nodes).

    With packed allocation (lowest ranks busy first), GPU number k of a pool of
    `total` is busy while more than k GPUs run: activity = 100 * clip(running - k, 0, 1).
    `ranks` are fractions of the pool size (0.1 = the GPU at 10% of the pool):
    low ranks are nearly always busy, high ranks see the pool's idle gaps.
    Allocation, not SM activity: a busy rank means "a job holds it".
    """
    running = np.asarray(running, dtype=float)
    total = np.asarray(total, dtype=float)
    size = float(np.nanmax(total))
    rows, ids = [], []
    for r in ranks:
        k = min(size - 1, np.floor(r * size))
        rows.append(100.0 * np.clip(running - k, 0.0, 1.0))
        ids.append(f"{name}/gpu{int(k)}")
    return from_arrays(np.vstack(rows), step_s=step_s, t0=t0, instance_ids=ids, source=name)
