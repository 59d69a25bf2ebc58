"""History from Prometheus: GPU activity as a range query with a server-side step, through the one reader.

The live collector's signal, labels and connection: activity is 100 x DCGM_FI_PROF_GR_ENGINE_ACTIVE where a GPU
has it (all a MIG slice has, and what the live collector prefers since issue 25), else DCGM_FI_DEV_GPU_UTIL, per GPU
(`max by` its identity labels), falling back per step where the preferred sample is no data; read with the
settings' auth and TLS in pages under Prometheus' points limit (collect.prometheus.PromReader). Where the history
has DCGM_FI_PROF_SM_ACTIVE, a second range query reads it into the trace's `sm_active` (optional: a fleet without
it replays on activity alone), so the replay applies it as the live evaluate() does.
Series are keyed by the first host label the live collector knows (instance label, else Hostname/hostname)
and the gpu (plus GPU_I_ID for MIG slices). A series with none of those labels names no instance: left out.
"""

from __future__ import annotations

import numpy as np

from ..collect.prometheus import (
    ACTIVITY_SIGNALS,
    GR_ENGINE_ACTIVE,
    SM_ACTIVE,
    PromReader,
    endpoint_of,
    gpu_identity_labels,
    gpu_key,
    host_labels,
    selected,
)
from ..config import ConfigError, PrometheusSettings
from ..model import SENTINEL_THRESHOLD
from .traces import Trace, clean_ratio

# The live collector's preference (collect.prometheus `_Gpu.stats`): the GR engine's activity where the GPU has it,
# GPU_UTIL otherwise. collect.prometheus.ACTIVITY_SIGNALS still lists GPU_UTIL first for `activity_percent`, which
# nothing else reads; the order is the backtest's to choose, so it is set here.
HISTORY_SIGNALS = tuple(sorted(ACTIVITY_SIGNALS, key=lambda signal: signal[0] != GR_ENGINE_ACTIVE))


def _valid(metric: str, by: str, selector: str) -> str:
    """`max by` the GPU identity of the metric's valid samples: sentinels, negatives and NaN are no data."""
    return f"max by ({by}) ({selected(metric, selector)} < {SENTINEL_THRESHOLD:g} >= 0)"


def activity_query(settings: PrometheusSettings, selector: str | None = None) -> str:
    """The backtest's activity PromQL: activity % per GPU, the preferred signal first and the other where it has no
    valid sample (per step, never two signals of one GPU mixed in one step), with the settings' labels (and
    selector unless given)."""
    by = ", ".join(gpu_identity_labels(settings.instance_label, settings.hostname_labels))
    chosen = settings.selector if selector is None else selector
    return " or ".join(f"{'' if scale == 1.0 else f'{scale:g} * '}{_valid(metric, by, chosen)}"
                       for metric, scale in HISTORY_SIGNALS)


def sm_query(settings: PrometheusSettings, selector: str | None = None) -> str:
    """DCGM_FI_PROF_SM_ACTIVE (ratio) per GPU, valid samples only (a ratio over 1 is dropped when read)."""
    by = ", ".join(gpu_identity_labels(settings.instance_label, settings.hostname_labels))
    return _valid(SM_ACTIVE, by, settings.selector if selector is None else selector)


def load_prometheus(settings: PrometheusSettings | str, start: float, end: float, step_s: float,
                    selector: str | None = None) -> Trace:
    """GPU activity (%) between start and end (epoch s) at `step_s`, as a Trace.

    `settings` gives the URL, auth, TLS, timeout and labels (a bare URL means the defaults). A failed query
    raises QueryFailed; a period or selector with no series at all is a ConfigError (nothing to replay)."""
    if isinstance(settings, str):
        settings = PrometheusSettings(url=settings)
    if end <= start:
        raise ConfigError(f"prometheus: empty period ({start} .. {end})")
    query = activity_query(settings, selector)
    hosts = host_labels(settings.instance_label, settings.hostname_labels)
    n_steps = int((end - start) // step_s) + 1
    end = start + (n_steps - 1) * step_s  # on the grid: the last page's steps are the trace's
    reader = PromReader(settings)

    def grid(promql: str) -> dict[tuple[str, str], np.ndarray]:
        out: dict[tuple[str, str], np.ndarray] = {}
        for series in reader.range(promql, start, end, step_s):
            labels = series["metric"]
            iid = next((labels[k] for k in hosts if labels.get(k)), None)
            if iid is None:
                continue
            row = out.setdefault((iid, gpu_key(labels)), np.full(n_steps, np.nan))
            for point in series["values"]:
                k = round((float(point[0]) - start) / step_s)
                if 0 <= k < n_steps:
                    try:
                        row[k] = float(point[1])
                    except (TypeError, ValueError, IndexError):  # not a number: not a measurement
                        row[k] = np.nan
        return out

    rows = grid(query)
    if not rows:
        signals = " or ".join(metric for metric, _ in HISTORY_SIGNALS)
        chosen = settings.selector if selector is None else selector
        signals += f" {{{chosen}}}" if chosen.strip() else ""
        raise ConfigError(f"prometheus at {endpoint_of(settings.url)}: no {signals} series labelled "
                          f"{' / '.join(hosts)} between {start:.0f} and {end:.0f}")
    ordered = sorted(rows)
    inst_ids = sorted({k[0] for k in ordered})
    pos = {iid: i for i, iid in enumerate(inst_ids)}
    util = np.vstack([rows[k] for k in ordered])
    sm_rows = grid(sm_query(settings, selector))  # optional: none on a fleet without the profiling field
    sm = (clean_ratio(np.vstack([sm_rows.get(k, np.full(n_steps, np.nan)) for k in ordered]))
          if any(k in sm_rows for k in ordered) else None)
    with np.errstate(invalid="ignore"):  # NaN compares false: it stays NaN
        util[(util >= SENTINEL_THRESHOLD) | (util < 0)] = np.nan  # DCGM sentinels and negatives are no data
    return Trace(
        instance_ids=tuple(inst_ids), gpu_names=tuple(k[1] for k in ordered),
        gpu_instance=np.array([pos[k[0]] for k in ordered], dtype=int), t0=float(start), step_s=float(step_s),
        util=util, sm_active=sm,
        source=(f"{endpoint_of(settings.url)} activity ({' or '.join(m for m, _ in HISTORY_SIGNALS)})"
                + (f", {SM_ACTIVE}" if sm is not None else "")),
    )
