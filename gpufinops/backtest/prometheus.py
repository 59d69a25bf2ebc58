"""History from Prometheus: GPU activity as a range query with a server-side step, through the one reader.

The live collector's signal, labels and connection: activity is DCGM_FI_DEV_GPU_UTIL where a GPU has it,
else 100 x DCGM_FI_PROF_GR_ENGINE_ACTIVE (all a MIG slice has), per GPU (`max by` its identity labels);
read with the settings' auth and TLS in pages under Prometheus' points limit (collect.prometheus.PromReader).
Series are keyed by the first host label the live collector knows (instance label, else Hostname/hostname)
and the gpu (plus GPU_I_ID for MIG slices). A series with none of those labels names no instance: left out.
"""

from __future__ import annotations

import numpy as np

from ..collect.prometheus import (
    ACTIVITY_SIGNALS,
    PromReader,
    activity_percent,
    endpoint_of,
    gpu_identity_labels,
    gpu_key,
    host_labels,
)
from ..config import ConfigError, PrometheusSettings
from ..model import SENTINEL_THRESHOLD
from .traces import Trace


def activity_query(settings: PrometheusSettings, selector: str | None = None) -> str:
    """The backtest's one PromQL text: activity % per GPU, with the settings' labels (and selector unless given)."""
    return activity_percent(gpu_identity_labels(settings.instance_label, settings.hostname_labels),
                            settings.selector if selector is None else selector)


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
    keys: dict[tuple[str, str], int] = {}
    rows: list[np.ndarray] = []
    for series in PromReader(settings).range(query, start, end, step_s):
        labels = series["metric"]
        iid = next((labels[k] for k in hosts if labels.get(k)), None)
        if iid is None:
            continue
        key = (iid, gpu_key(labels))
        if key not in keys:
            keys[key] = len(rows)
            rows.append(np.full(n_steps, np.nan))
        row = rows[keys[key]]
        for point in series["values"]:
            k = round((float(point[0]) - start) / step_s)
            if 0 <= k < n_steps:
                try:
                    row[k] = float(point[1])
                except (TypeError, ValueError, IndexError):  # not a number: not a measurement
                    row[k] = np.nan
    if not rows:
        signals = " or ".join(metric for metric, _ in ACTIVITY_SIGNALS)
        chosen = settings.selector if selector is None else selector
        signals += f" {{{chosen}}}" if chosen.strip() else ""
        raise ConfigError(f"prometheus at {endpoint_of(settings.url)}: no {signals} series labelled "
                          f"{' / '.join(hosts)} between {start:.0f} and {end:.0f}")
    ordered = sorted(keys)
    inst_ids = sorted({k[0] for k in ordered})
    pos = {iid: i for i, iid in enumerate(inst_ids)}
    util = np.vstack([rows[keys[k]] for k in ordered])
    with np.errstate(invalid="ignore"):  # NaN compares false: it stays NaN
        util[(util >= SENTINEL_THRESHOLD) | (util < 0)] = np.nan  # DCGM sentinels and negatives are no data
    return Trace(
        instance_ids=tuple(inst_ids), gpu_names=tuple(k[1] for k in ordered),
        gpu_instance=np.array([pos[k[0]] for k in ordered], dtype=int), t0=float(start), step_s=float(step_s),
        util=util, source=f"{endpoint_of(settings.url)} activity ({' or '.join(m for m, _ in ACTIVITY_SIGNALS)})",
    )
