"""History from Prometheus: range queries of DCGM_FI_DEV_GPU_UTIL with a server-side step.

One query per chunk of at most 10,000 steps (Prometheus refuses more than
11,000 points per series). Series are keyed by the instance label the live
collector uses (instance_id, else Hostname/hostname, else instance) and the
gpu label (plus GPU_I_ID for MIG slices).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Mapping

import numpy as np

from ..config import ConfigError
from .traces import Trace

METRIC = "DCGM_FI_DEV_GPU_UTIL"
MAX_POINTS = 10_000
ID_LABELS = ("instance_id", "Hostname", "hostname", "exported_pod", "instance")


def _get(url: str, params: Mapping[str, str], headers: Mapping[str, str], timeout_s: float) -> dict:
    full = f"{url.rstrip('/')}/api/v1/query_range?{urllib.parse.urlencode(params)}"
    req = urllib.request.Request(full, headers=dict(headers))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise ConfigError(f"prometheus {url}: range query failed: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ConfigError(f"prometheus {url}: unreachable: {getattr(exc, 'reason', exc)}") from None
    if body.get("status") != "success":
        raise ConfigError(f"prometheus {url}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def load_prometheus(url: str, start: float, end: float, step_s: float, selector: str = "",
                    headers: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> Trace:
    """GPU activity between start and end (epoch s) at `step_s`, as a Trace."""
    if end <= start:
        raise ConfigError(f"prometheus: empty period ({start} .. {end})")
    query = f"{METRIC}{{{selector}}}" if selector else METRIC
    n_steps = int((end - start) // step_s) + 1
    keys: dict[tuple[str, str], int] = {}
    rows: list[np.ndarray] = []
    for c0 in range(0, n_steps, MAX_POINTS):
        c1 = min(n_steps, c0 + MAX_POINTS) - 1
        data = _get(url, {"query": query, "start": f"{start + c0 * step_s:.3f}", "end": f"{start + c1 * step_s:.3f}",
                          "step": f"{step_s:g}"}, headers or {}, timeout_s)
        for series in data.get("result", []):
            labels = series["metric"]
            iid = next((labels[k] for k in ID_LABELS if labels.get(k)), "unknown")
            gpu = labels.get("gpu", "0") + (f"/{labels['GPU_I_ID']}" if labels.get("GPU_I_ID") else "")
            key = (iid, gpu)
            if key not in keys:
                keys[key] = len(rows)
                rows.append(np.full(n_steps, np.nan))
            row = rows[keys[key]]
            for ts, value in series.get("values", []):
                k = int(round((float(ts) - start) / step_s))
                if 0 <= k < n_steps:
                    try:
                        row[k] = float(value)
                    except ValueError:  # "NaN" and friends: not a measurement
                        row[k] = np.nan
    if not rows:
        raise ConfigError(f"prometheus {url}: no {query} series between {start:.0f} and {end:.0f}")
    ordered = sorted(keys, key=lambda k: k)
    inst_ids = sorted({k[0] for k in ordered})
    pos = {iid: i for i, iid in enumerate(inst_ids)}
    util = np.vstack([rows[keys[k]] for k in ordered])
    util[(util >= 1e9) | (util < 0)] = np.nan
    return Trace(
        instance_ids=tuple(inst_ids), gpu_names=tuple(k[1] for k in ordered),
        gpu_instance=np.array([pos[k[0]] for k in ordered], dtype=int), t0=float(start), step_s=float(step_s),
        util=util, source=f"{url} {query}",
    )
