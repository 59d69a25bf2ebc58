"""Long-window (14-30 day) GPU usage for right-sizing, from Prometheus + dcgm-exporter.

A fixed number of HTTP queries for the whole fleet, whatever its size:

1. memory:   max_over_time and quantile_over_time(0.99) of DCGM_FI_DEV_FB_USED (MiB)
2. activity: quantile_over_time(0.95), max_over_time, count_over_time of DCGM_FI_DEV_GPU_UTIL (%)
3. activity: the same for DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio, x100), which is all a MIG slice has; the
   same query carries the profiling ratios where dcgm-exporter exports them (docs/metrics.md, "Profiling
   counters"): quantile_over_time(0.95) and count_over_time of DCGM_FI_PROF_SM_ACTIVE, avg_over_time of
   DCGM_FI_PROF_SM_OCCUPANCY, quantile_over_time(0.95) of DCGM_FI_PROF_DRAM_ACTIVE. On a fleet without them these
   legs match nothing and cost nothing; right-sizing then sizes on activity alone (and says so).
4. presence: a range query, one point per hour over the commitment window, counting
   each host's GPUs — the hourly GPU count behind the commitment baseline.

Each instant query joins its aggregates with `or`, tagged by an `agg` label,
and aggregates per GPU server-side. Series are mapped to EC2 instances with
the collector's InstanceMatcher (instance_id label, else Hostname/hostname =
private DNS or IP). Read through the collector's PromReader: the same auth, TLS
and errors (QueryFailed) as the live service.

Sentinels: a GPU whose max is a DCGM sentinel (>= model.SENTINEL_THRESHOLD) has
that signal reported as None (not measured). Sentinels mixed into a long window can still
move a quantile if they are more than 1-5% of the samples; filtering them
sample by sample would need a 14-day subquery per series, which is too heavy
for a fleet-wide query (documented in docs/recommend.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping, Sequence

import requests

from gpufinops.collect.errors import QueryFailed
from gpufinops.collect.prometheus import (
    DRAM_ACTIVE, FB_USED, GPU_UTIL, GR_ENGINE_ACTIVE, SM_ACTIVE, SM_OCCUPANCY, InstanceMatcher, PromReader,
    gpu_identity_labels, gpu_key, host_labels,
    selected,
)
from gpufinops.config import PrometheusSettings
from gpufinops.model import SENTINEL_THRESHOLD, GpuInstance

LONG_QUERY_TIMEOUT_S = 30.0  # a 14-30 day window takes longer than the live collector's 10-minute one


@dataclass(frozen=True)
class GpuLongStats:
    gpu: str
    model_name: str = ""
    mem_max_mib: float | None = None
    mem_p99_mib: float | None = None
    activity_p95: float | None = None  # percent
    activity_max: float | None = None  # percent
    samples: int = 0  # activity samples in the window
    signal: str = GPU_UTIL
    # DCGM profiling ratios 0..1 over the window, where exported (None = not exported, or not a measurement).
    sm_p95: float | None = None  # DCGM_FI_PROF_SM_ACTIVE, 95th percentile
    sm_samples: int = 0  # DCGM_FI_PROF_SM_ACTIVE samples in the window, for its own coverage
    sm_occupancy_mean: float | None = None  # DCGM_FI_PROF_SM_OCCUPANCY, mean (shown in reasons)
    dram_p95: float | None = None  # DCGM_FI_PROF_DRAM_ACTIVE, 95th percentile (memory bandwidth)


@dataclass(frozen=True)
class LongUsage:
    instance_id: str
    window_s: int
    expected_samples: int  # per GPU: window / scrape interval
    gpus: tuple[GpuLongStats, ...] = ()
    error: str | None = None

    @property
    def peak_mem_mib(self) -> float | None:
        vals = [g.mem_max_mib for g in self.gpus if g.mem_max_mib is not None]
        return max(vals) if vals else None

    @property
    def p99_mem_mib(self) -> float | None:
        vals = [g.mem_p99_mib for g in self.gpus if g.mem_p99_mib is not None]
        return max(vals) if vals else None


@dataclass(frozen=True)
class FleetUsage:
    """What `recommend` needs from Prometheus: per-instance stats and hourly presence."""

    instances: dict[str, LongUsage]
    hourly_gpus: dict[str, list[int]]  # instance_id -> GPUs reporting, one value per hour (0 = absent)
    queries_made: int = 0


def _by(settings: PrometheusSettings) -> str:
    return ", ".join(gpu_identity_labels(settings.instance_label, settings.hostname_labels))


def _host_by(settings: PrometheusSettings) -> str:
    return ", ".join(host_labels(settings.instance_label, settings.hostname_labels))


def _vec(metric: str, settings: PrometheusSettings) -> str:
    return selected(metric, settings.selector)


def _tag(expr: str, agg: str) -> str:
    return f'label_replace({expr}, "agg", "{agg}", "", "")'


def build_queries(settings: PrometheusSettings, window_s: int) -> dict[str, str]:
    """The three instant queries (memory, GPU_UTIL, GR_ENGINE_ACTIVE with the profiling ratios). Pure text."""
    by = _by(settings)
    r = f"{int(window_s)}s"
    fb = _vec(FB_USED, settings)
    out = {
        "memory": " or ".join([
            _tag(f"max by ({by}) (max_over_time({fb}[{r}]))", "mem_max"),
            _tag(f"max by ({by}) (quantile_over_time(0.99, {fb}[{r}]))", "mem_p99"),
        ])
    }
    for key, metric in (("util", GPU_UTIL), ("engine", GR_ENGINE_ACTIVE)):
        v = _vec(metric, settings)
        out[key] = " or ".join([
            _tag(f"max by ({by}) (quantile_over_time(0.95, {v}[{r}]))", "p95"),
            _tag(f"max by ({by}) (max_over_time({v}[{r}]))", "max"),
            _tag(f"sum by ({by}) (count_over_time({v}[{r}]))", "count"),
        ])
    sm, occ, dram = (_vec(m, settings) for m in (SM_ACTIVE, SM_OCCUPANCY, DRAM_ACTIVE))
    out["engine"] += " or " + " or ".join([
        _tag(f"max by ({by}) (quantile_over_time(0.95, {sm}[{r}]))", "sm_p95"),
        _tag(f"sum by ({by}) (count_over_time({sm}[{r}]))", "sm_count"),
        _tag(f"avg by ({by}) (avg_over_time({occ}[{r}]))", "occ_mean"),
        _tag(f"max by ({by}) (quantile_over_time(0.95, {dram}[{r}]))", "dram_p95"),
    ])
    return out


def presence_query(settings: PrometheusSettings) -> str:
    return f"count by ({_host_by(settings)}) ({_vec(FB_USED, settings)})"


class PrometheusUsage:
    """Reads FleetUsage from one Prometheus, with the service's auth settings."""

    def __init__(self, settings: PrometheusSettings, session: requests.Session | None = None):
        self.settings = settings
        self.reader = PromReader(settings, session)
        self.timeout_s = max(settings.timeout_s, LONG_QUERY_TIMEOUT_S)

    @property
    def queries_made(self) -> int:
        return self.reader.queries_made

    def fleet_usage(
        self,
        instances: Sequence[GpuInstance],
        window_s: int,
        now: datetime,
        scrape_interval_s: int,
        presence_window_s: int = 30 * 86400,
    ) -> FleetUsage:
        at = now.astimezone(timezone.utc).timestamp()
        expected = max(1, window_s // scrape_interval_s)
        try:
            answers = {k: self.reader.instant(q, at, timeout_s=self.timeout_s)
                       for k, q in build_queries(self.settings, window_s).items()}
            hours = presence_window_s // 3600
            start = at - (hours - 1) * 3600
            presence = self.reader.range(presence_query(self.settings), start, at, 3600, timeout_s=self.timeout_s)
        except QueryFailed as exc:
            err = str(exc)
            return FleetUsage({i.instance_id: LongUsage(i.instance_id, window_s, expected, (), err) for i in instances},
                              {}, self.queries_made)
        matcher = InstanceMatcher.build(instances, self.settings.instance_label, tuple(self.settings.hostname_labels))
        usage = combine(instances, answers, matcher, window_s, expected)
        hourly: dict[str, list[int]] = {i.instance_id: [0] * hours for i in instances}
        for series in presence:
            iid = matcher.match(series.get("metric", {}))
            if iid is None:
                continue
            for ts, value in series.get("values", []):
                idx = int(round((float(ts) - start) / 3600))
                if 0 <= idx < hours:
                    hourly[iid][idx] += int(float(value))
        return FleetUsage(usage, hourly, self.queries_made)


def _value(v: str) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    if x != x or x < 0 or x >= SENTINEL_THRESHOLD:
        return None  # NaN, negative or a DCGM sentinel: not a measurement
    return x


def _ratio(v: float | None) -> float | None:
    """A profiling ratio, or None when it cannot be one (above 1: a blank mixed into the window)."""
    return v if v is not None and v <= 1.0 + 1e-9 else None


def combine(
    instances: Sequence[GpuInstance],
    answers: Mapping[str, list[dict]],
    matcher: InstanceMatcher,
    window_s: int,
    expected: int,
) -> dict[str, LongUsage]:
    """Fold the query answers into one LongUsage per requested instance. Pure."""
    per: dict[str, dict[str, dict]] = {i.instance_id: {} for i in instances}
    for key, rows in answers.items():
        for row in rows:
            labels = row.get("metric", {})
            iid = matcher.match(labels)
            if iid is None:
                continue
            g = per[iid].setdefault(gpu_key(labels), {"model": labels.get("modelName", "")})
            value = _value(row.get("value", [0, "NaN"])[1])
            g[f"{key}:{labels.get('agg', '')}"] = value
    out = {}
    for iid, gpus in per.items():
        stats = []
        for gk, d in sorted(gpus.items(), key=lambda kv: (len(kv[0]), kv[0])):
            # GPU_UTIL where it has samples; else GR_ENGINE_ACTIVE (ratio -> %), e.g. on MIG.
            if d.get("util:count"):
                sig, p95, mx, n = GPU_UTIL, d.get("util:p95"), d.get("util:max"), d.get("util:count")
            elif d.get("engine:count"):
                sig = GR_ENGINE_ACTIVE
                p95 = d["engine:p95"] * 100 if d.get("engine:p95") is not None else None
                mx = d["engine:max"] * 100 if d.get("engine:max") is not None else None
                n = d.get("engine:count")
            else:
                sig, p95, mx, n = GPU_UTIL, None, None, 0
            stats.append(GpuLongStats(gk, d["model"], d.get("memory:mem_max"), d.get("memory:mem_p99"),
                                      p95, mx, int(n or 0), sig,
                                      sm_p95=_ratio(d.get("engine:sm_p95")),
                                      sm_samples=int(d.get("engine:sm_count") or 0),
                                      sm_occupancy_mean=_ratio(d.get("engine:occ_mean")),
                                      dram_p95=_ratio(d.get("engine:dram_p95"))))
        out[iid] = LongUsage(iid, window_s, expected, tuple(stats))
    return out
