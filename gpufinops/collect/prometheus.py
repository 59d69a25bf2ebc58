"""DCGM GPU usage from Prometheus (or VictoriaMetrics), in a fixed number of queries.

One `window_usage` call sends five instant queries, concurrently, whatever the fleet size: one per signal
(activity from DCGM_FI_DEV_GPU_UTIL, activity from DCGM_FI_PROF_GR_ENGINE_ACTIVE, memory, power, and the DCGM
profiling ratios). They
aggregate the window ending at `now` per GPU; the answers are mapped to EC2 instances here. The memory query
also carries the compute-process counts `gpufinops agent` exports per GPU / MIG instance (FOLDED): evidence of
work where no activity counter exists (docs/metrics.md, "Evidence of work"). The fifth query reads the DCGM
profiling ratios where exported (SM active, SM occupancy, tensor / FP64 / FP32 / FP16 pipes), one window mean
each: the SM activity that IDLE needs to agree, and what says why a GPU's use stays low (docs/metrics.md,
"Profiling counters"). It is a query of its own because Prometheus pays more than the sum of the parts for one
long `or` of legs (BENCHMARKS.md, "Profiling counters in the tick").
Where a GPU has both activity counters, the GR engine's is its activity figure and GPU_UTIL's the second one
that IDLE needs to agree. The profiling ratios that only say why (occupancy, tensor and FP pipes: REASON_SIGNALS)
are read for a fifth of the instances per tick, kept per GPU between reads with their age (`_slots_due`).

Shards (`prometheus.shards`, issue 29.3): the same query set per shard of the instances, narrowed by a label
matcher on the last character of the instance id (`shard_of`, `shard_matcher`), `shard_parallelism` shards at a
time, each shard's answers turned into its instances' usage as they land and dropped: client memory follows the
shard. A shard that fails makes its own instances UNKNOWN, and no other (docs/scale.md).

Sentinels. DCGM writes huge values (~9.2e18, 2^47, 2147483632...) when a field is unavailable, and a
broken exporter may write negatives or NaN. Such samples are not measurements: they must neither count as
samples nor move max/mean/min. Range functions cannot skip samples, and a filtering subquery
`(x < SENTINEL_THRESHOLD >= 0)[w:s]` re-samples every step with the 5-minute lookback (a series that
stopped would keep being counted for 5 minutes) and costs Prometheus a whole-fleet evaluation per step.
Hence:
- the "clean" query per signal: per-GPU count/sum/max/min over the raw samples of every GPU, with
  `sum|max|min by (<GPU identity>) (<fn>_over_time(x[w]))`, one range function per figure. Exact for a
  GPU without invalid samples (nearly all), and they show the others: an invalid sample raises the max or
  the sum to the sentinel, lowers the min below 0, or makes the sum NaN (`needs_detail`);
- for those GPUs only (of requested instances), and only when there are any: their raw samples, with a
  label matcher on their UUID (else host) label, `x{UUID=~"..."}[w]`; the valid ones are counted here,
  exactly (`plan_detail`). Past MAX_DETAIL_POINTS samples (a field blank on most of the fleet), the
  whole-fleet subquery of earlier versions (`dirty_query`) filters them server-side instead.
Per GPU, series are combined `by` the GPU identity labels (pod labels come and go while the GPU stays the
same). See docs/metrics.md. (Reading the window from recorded 5-minute buckets was measured and removed: it
cost Prometheus more CPU per tick than the raw samples, BENCHMARKS.md "Prometheus work per tick".)

Ranges. Every number an answer holds is checked as it enters (a sentinel, a negative, NaN or inf in a count
or in the figures of a GPU read clean) and again once a GPU's answers are combined (activity 0-100% or a
0-1 ratio, memory up to the GPU's, power up to a multiple of its TDP, counts whole and within the window,
sums within count x the maximum): a query layer that hands back sentinels inside aggregates must not turn
sentinel/sentinel into "1% active". A GPU with any implausible figure comes back `invalid`
(gpufinops.metric_ranges), and its instance is UNKNOWN.
"""

from __future__ import annotations

import functools
import gc
import math
import threading
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Iterable, Mapping, Sequence
from urllib.parse import urlparse

import msgspec
import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from gpufinops.prices.catalog import CatalogError, load_catalog
from gpufinops.collect.errors import QueryFailed
from gpufinops.collect.gpu_snapshot import PROCESSES_METRIC
from gpufinops.config import PrometheusSettings
from gpufinops.metric_ranges import (
    ACTIVITY_PCT, GR_ENGINE_RATIO, PROCESS_COUNT, PROFILING_RATIO, REL_TOL, Limit, aggregate_problem, invalidated,
    memory_limit, number_problem, out_of_range, power_limit, samples_limit, validate_stats_within,
)
from gpufinops.model import SENTINEL_THRESHOLD, GpuInstance, GpuWindowStats, InstanceUsage

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
MAX_POINTS = 10_000  # steps per range query: under Prometheus' 11,000 points per series


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
# Per-series range function, and how the series of one GPU are combined.
_RANGE_FN = {"count": "count_over_time", "sum": "sum_over_time", "max": "max_over_time", "min": "min_over_time",
             "mean": "avg_over_time"}
# A GPU split into series by pod labels gets the mean of its series' means for a profiling ratio (a reason's
# figure, never a verdict's threshold): exact for the one series nearly every GPU has.
_COMBINE = {"count": "sum", "sum": "sum", "max": "max", "min": "min", "mean": "avg"}
CLEAN, DIRTY, RAW = "clean", "dirty", "raw"
SOURCE = "Prometheus"  # how reasons name where an implausible number came from
# How reasons name each signal and aggregate ("the activity sum read from Prometheus ...").
_SIGNAL_WORDS = {GPU_UTIL: "activity", GR_ENGINE_ACTIVE: "GR engine activity", FB_USED: "memory used",
                 POWER_USAGE: "power draw", PROCESSES: "process count", SM_ACTIVE: "SM activity",
                 SM_OCCUPANCY: "SM occupancy", TENSOR_ACTIVE: "tensor pipe activity", DRAM_ACTIVE: "DRAM activity",
                 **{metric: f"{p.upper()} pipe activity" for p, metric in PIPE_ACTIVE.items()}}
_AGG_WORDS = {"present": "presence marker", "sample": "sample", "count": "sample count", "sum": "sum",
              "max": "maximum", "min": "minimum", "mean": "mean"}
# Raw samples read back per tick for GPUs with invalid samples, at most; past it the whole-fleet subquery
# (the DIRTY query) filters them server-side instead (a fleet whose exporter blanks a field everywhere).
MAX_DETAIL_POINTS = 200_000
# GPUs named in one detail query: its URL stays under the 8 KiB a reverse proxy accepts (nginx's default).
DETAIL_GPUS_PER_QUERY = 100


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


@contextmanager
def translated_errors(where: str, timeout_s: float):
    """Whatever a Prometheus HTTP call raises becomes one short QueryFailed (no secrets, no stack)."""
    try:
        yield
    except requests.exceptions.JSONDecodeError:  # a proxy's HTML page, a truncated body
        raise QueryFailed(f"prometheus at {where}: malformed answer (not JSON)") from None
    except requests.Timeout:
        raise QueryFailed(f"prometheus at {where}: timed out after {timeout_s:g}s") from None
    except requests.ConnectionError:
        raise QueryFailed(f"prometheus at {where}: cannot connect") from None
    except requests.RequestException as exc:
        raise QueryFailed(f"prometheus at {where}: {type(exc).__name__}") from None
    except PrometheusApiClientException as exc:
        raise QueryFailed(f"prometheus at {where}: {str(exc)[:200]}") from None
    except (ValueError, KeyError, TypeError):  # body not JSON or not the API's shape
        raise QueryFailed(f"prometheus at {where}: malformed answer") from None


@dataclass(frozen=True)
class PromQL:
    """Builds the fixed query set for one window. Pure: text only."""

    instance_label: str = "instance_id"
    hostname_labels: tuple[str, ...] = ("Hostname", "hostname")
    scrape_interval_s: int = 30
    selector: str = ""

    @property
    def by_labels(self) -> tuple[str, ...]:
        return gpu_identity_labels(self.instance_label, self.hostname_labels)

    def _vector(self, metric: str) -> str:
        return selected(metric, self.selector)

    @staticmethod
    def range_of(window_s: int) -> str:
        # (now - w, now]: one millisecond short of w, so a sample exactly w
        # seconds old is out, as in Prometheus 3 (2.x ranges include both ends).
        return f"{window_s * 1000 - 1}ms"

    def dirty_gpus(self, metric: str, window_s: int, *, at_end: bool = False) -> str:
        """GPUs (by identity) with at least one invalid sample in the window."""
        v, r = self._vector(metric), self.range_of(window_s)
        sel = f"{v}[{r}] @ end()" if at_end else f"{v}[{r}]"
        hi = f"{SENTINEL_THRESHOLD:g}"
        # NaN is the one value not equal to itself; it makes avg_over_time NaN.
        return (
            f"group by ({', '.join(self.by_labels)}) (max_over_time({sel}) >= {hi} or min_over_time({sel}) < 0"
            f" or avg_over_time({sel}) != avg_over_time({sel}))"
        )

    def clean_query(self, metric: str, window_s: int, reasons: bool | str = True) -> str:
        """Per-GPU aggregates over the raw samples of every GPU, labelled agg=count|sum|max|min (what the
        signal needs, _SIGNAL_AGGS). One range function per aggregate and nothing else: GPUs whose figures
        show invalid samples (`needs_detail`, nearly never) are read again by `detail_query`. `reasons`:
        False leaves the REASON_SIGNALS legs out (the ticks between two reads of them); a label matcher
        (`slots_matcher`) narrows them to the instances whose turn it is."""
        r = self.range_of(window_s)
        legs = [(metric, a, a) for a in _SIGNAL_AGGS[metric]]
        legs += [(folded, a, f"{prefix}_{a}") for folded, (host, prefix) in FOLDED.items() if host == metric
                 and (reasons or folded not in REASON_SIGNALS) for a in _SIGNAL_AGGS[folded]]

        def vector(m: str) -> str:
            if isinstance(reasons, str) and reasons and m in REASON_SIGNALS:
                return selected(m, ", ".join(x for x in (self.selector.strip(), reasons) if x))
            return self._vector(m)

        return " or ".join(
            self._labelled(label, f"{_COMBINE[a]} by ({self._by}) ({_RANGE_FN[a]}({vector(m)}[{r}]))")
            for m, a, label in legs)

    @property
    def _by(self) -> str:
        return ", ".join(self.by_labels)

    @staticmethod
    def _labelled(agg: str, expr: str) -> str:
        return f'label_replace({expr}, "agg", "{agg}", "", "")'

    def detail_query(self, metric: str, window_s: int, label: str, values: Iterable[str]) -> str:
        """The raw samples of the window of the series whose `label` is one of `values` (the GPUs with
        invalid samples): a range vector, filtered and aggregated here, exactly, sample by sample."""
        alternatives = "|".join(sorted({regex_literal(x) for x in values}))
        matchers = ", ".join(m for m in (self.selector.strip(), f'{label}=~"{alternatives}"') if m)
        return f"{metric}{{{matchers}}}[{self.range_of(window_s)}]"

    def dirty_query(self, metric: str, window_s: int) -> str:
        """For GPUs with an invalid sample only: their valid samples, one per
        scrape interval, as a range vector (aggregated here, client-side).

        `last_over_time(x[step - 1ms])` at step t is the last real sample in
        (t - step, t]: unlike a bare selector it has no 5-minute lookback, so a
        series that stopped contributes nothing after its last sample. `@ end()`
        pins the dirty test to the query time so it is computed once, not per step.
        """
        v, r = self._vector(metric), self.range_of(window_s)
        hi = f"{SENTINEL_THRESHOLD:g}"
        fresh_valid = f"last_over_time({v}[{self.scrape_interval_s * 1000 - 1}ms]) < {hi} >= 0"
        dirty = self.dirty_gpus(metric, window_s, at_end=True)
        return f"({fresh_valid} and on({', '.join(self.by_labels)}) {dirty})[{r}:{self.scrape_interval_s}s]"

    def queries(self, window_s: int, reasons: bool | str = True) -> dict[tuple[str, str], str]:
        """The fixed query set of every tick: (signal, clean) -> PromQL text; the same number of queries with or
        without the REASON_SIGNALS legs."""
        if window_s < 1:
            raise ValueError(f"window_s must be >= 1, got {window_s}")
        return {(metric, CLEAN): self.clean_query(metric, window_s, reasons) for metric in QUERIED_SIGNALS}

    def shard(self, index: int, count: int) -> PromQL:
        """The same queries narrowed to shard `index` of `count` (shard_matcher on the instance label)."""
        if count <= 1:
            return self
        extra = shard_matcher(self.instance_label, index, count)
        return replace(self, selector=", ".join(m for m in (self.selector.strip(), extra) if m))


# --------------------------------------------------------------------------- shards
# A shard is picked by the last character of the instance label's value: an EC2 instance id ends in a hex digit
# spread evenly, and PromQL can select on it with a short regex whatever the fleet (no list of ids in the URL),
# every value falling in exactly one shard: hex digit d (either case) in shard d % count, anything else in the
# last one. The engine tests the regex once per distinct label value (one per instance), not per sample.
_HEX = "0123456789abcdef"
MAX_SHARDS = 16
AUTO_GPUS_PER_SHARD = 10_000  # `shards: auto`: about 10k GPUs a shard (~30 MiB of answers, BENCHMARKS.md)


def shard_of(value: str, count: int) -> int:
    """The shard (0-based) of one instance label value among `count` shards."""
    if count <= 1:
        return 0
    last = value[-1:].lower()
    return _HEX.index(last) % count if last and last in _HEX else count - 1


def shard_matcher(label: str, index: int, count: int) -> str:
    """PromQL label matcher selecting shard `index` of `count` (see shard_of)."""
    return slots_matcher(label, (index,), count)


def slots_matcher(label: str, slots: Iterable[int], count: int, unlabelled: bool = False) -> str:
    """PromQL label matcher selecting the values whose shard_of(value, count) is in `slots`; with `unlabelled`,
    the series without the label too when the last slot is among them (shard_of("") is the last)."""
    slots = set(slots)
    digits = "".join(d + d.upper() if d.isalpha() else d for i, d in enumerate(_HEX) if i % count in slots)
    alternatives = [f".*[{digits}]"] if digits else []
    if count - 1 in slots:  # and every value not ending in a hex digit
        alternatives.append(".*[^0-9a-fA-F]")
        if unlabelled:
            alternatives.append("")
    return f'{label}=~"{"|".join(alternatives)}"'


def shard_count(setting: int | str, instances: Sequence[GpuInstance]) -> int:
    """The number of shards a tick over `instances` is split into (`prometheus.shards`)."""
    if setting != "auto":
        return int(setting)
    gpus = sum(max(inst.gpu_count, 1) for inst in instances)
    count = 1
    while count < MAX_SHARDS and gpus > count * AUTO_GPUS_PER_SHARD:
        count *= 2
    return count


def regex_literal(value: str) -> str:
    """`value` as a literal inside a PromQL double-quoted RE2 regex (metacharacters escaped, then the string)."""
    escaped = "".join(f"\\{c}" if c in r".^$*+?()[]{}|\\" else c for c in value)
    return escaped.replace("\\", "\\\\").replace('"', '\\"')


# --------------------------------------------------------------------------- instance mapping


def _short(name: str) -> str:
    return name.strip().lower().split(".", 1)[0]


@dataclass
class InstanceMatcher:
    """Maps a series' labels to a requested instance id.

    Order: the configured instance label (set by ec2_sd relabelling); else a
    hostname label matched to the private DNS name (full or short, e.g.
    ip-10-0-1-2), to the private IP, or to the instance id itself (some
    clusters name nodes after the instance id). Pod labels are ignored.
    """

    instance_label: str
    hostname_labels: tuple[str, ...]
    by_id: dict[str, str] = field(default_factory=dict)
    by_host: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, instances: Iterable[GpuInstance], instance_label: str, hostname_labels: tuple[str, ...]):
        m = cls(instance_label, hostname_labels)
        ambiguous: set[str] = set()
        for inst in instances:
            m.by_id[inst.instance_id] = inst.instance_id
            keys = {inst.instance_id.lower()}
            if inst.private_dns:
                keys |= {inst.private_dns.strip().lower(), _short(inst.private_dns)}
            if inst.private_ip:
                ip = inst.private_ip.strip()
                keys |= {ip, "ip-" + ip.replace(".", "-")}
            for key in keys:
                if m.by_host.setdefault(key, inst.instance_id) != inst.instance_id:
                    ambiguous.add(key)
        # The same private IP in two VPCs/regions: a hostname that could be either
        # instance maps to neither (no data beats another machine's data).
        for key in ambiguous:
            del m.by_host[key]
        return m

    def match(self, labels: Mapping[str, str]) -> str | None:
        value = labels.get(self.instance_label)
        if value:
            # The label is authoritative: a series of another instance is not ours.
            return self.by_id.get(value)
        for name in self.hostname_labels:
            host = (labels.get(name) or "").strip().lower()
            if not host:
                continue
            found = self.by_host.get(host) or self.by_host.get(_short(host))
            if found:
                return found
        return None


def gpu_key(labels: Mapping[str, str]) -> str:
    """gpu index, or "gpu/GPU_I_ID" for a MIG slice."""
    gpu = labels.get("gpu", "") or labels.get("UUID", "") or "?"
    mig = labels.get("GPU_I_ID")
    return f"{gpu}/{mig}" if mig else gpu


# --------------------------------------------------------------------------- combining answers


@dataclass(frozen=True)
class GpuLimits:
    """The largest plausible figures of one GPU over one window (see gpufinops.metric_ranges)."""

    expected_samples: int
    memory: Limit
    power: Limit
    tdp_w: float | None = None  # the GPU model's TDP when the catalog knows it (the power witness's scale)

    @functools.cached_property  # read once per signal of every GPU
    def samples(self) -> Limit:
        return samples_limit(self.expected_samples)


@functools.lru_cache(maxsize=1)
def _bundled_catalog():
    try:
        return load_catalog()
    except (CatalogError, OSError):  # no TDP known: the absolute power ceiling applies
        return None


@functools.lru_cache(maxsize=256)  # a fleet has a handful of GPU models; this runs once per GPU per window
def gpu_tdp_w(names: tuple[str, ...], gpu_memory_gib: float = 0.0) -> float | None:
    """The TDP of the first of `names` (EC2 GpuInfo model, DCGM modelName) the bundled catalog knows."""
    catalog = _bundled_catalog()
    if catalog is None:
        return None
    for name in names:
        if not name:
            continue
        try:
            return catalog.gpu(name, gpu_memory_gib or None).tdp_w
        except CatalogError:
            continue
    return None


def gpu_limits(inst: GpuInstance, model_name: str, expected_samples: int) -> GpuLimits:
    """Memory from the instance's GPU memory (else an absolute ceiling), power from the catalog's TDP."""
    tdp = gpu_tdp_w((inst.gpu_model, model_name), inst.gpu_memory_gib)
    return GpuLimits(expected_samples, memory_limit(inst.gpu_memory_gib), power_limit(tdp), tdp)


def row_problem(agg: str, value: float, whole: bool = False) -> str:
    """What is wrong with one number of an answer as it enters, before it is combined with others
    (a negative count added to a positive one would otherwise look plausible). `whole`: the signal counts
    things (processes), so its sums, maxima and minima are whole numbers too (a fraction in a sample shows
    in one of them)."""
    if agg == "present":
        # `group` answers 1; anything else is not Prometheus's answer to this query.
        return "" if value == 1.0 else "not the 1 a presence marker is"
    return number_problem(value, whole=(agg == "count" or whole))


@dataclass(slots=True)  # one per signal of every GPU, every tick: slots make them cheaper to create and read
class _Agg:
    count: float = 0.0
    sum: float = 0.0
    max: float | None = None
    min: float | None = None
    avg: float | None = None  # a window mean read as such (profiling ratios), when no sample was counted here
    bad: tuple[str, str] | None = None  # (agg, what is wrong) of the first implausible number read
    dirty: bool = False  # came through the dirty query: the window held invalid raw samples, left out
    whole: bool = False  # a count of things (WHOLE_SIGNALS): every value read must be a whole number

    def check(self, agg: str, value: float) -> None:
        """Note an implausible count or presence marker of an answer whose other figures are not used."""
        if agg in ("count", "present") and (problem := row_problem(agg, value)):
            self.bad = self.bad or (agg, problem)

    def add(self, agg: str, value: float) -> None:
        if agg == "sample":
            self.dirty = True
        # The words are only worked out for a number that is not plainly a reading (row_problem): a tick adds
        # one number per figure of every GPU.
        if agg == "present" or not 0.0 <= value < SENTINEL_THRESHOLD or (
                (self.whole or agg == "count") and not float(value).is_integer()):
            problem = row_problem(agg, value, self.whole)
            if problem:
                self.bad = self.bad or (agg, problem)
                return
        if agg == "present":
            pass  # creating the _Gpu entry was the point
        elif agg == "sample":  # one valid sample of a dirty GPU
            self.count += 1
            self.sum += value
            self.max = value if self.max is None else max(self.max, value)
            self.min = value if self.min is None else min(self.min, value)
        elif agg == "count":
            self.count += value
        elif agg == "sum":
            self.sum += value
        elif agg == "max":
            self.max = value if self.max is None else max(self.max, value)
        elif agg == "min":
            self.min = value if self.min is None else min(self.min, value)
        elif agg == "mean":
            self.avg = value

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else self.avg

    def problem(self, metric: str, limits: GpuLimits) -> str:
        """"" when every number read for this signal is plausible, else the sentence saying which is not."""
        found = (_AGG_WORDS[self.bad[0]], self.bad[1]) if self.bad else None
        if found is None:
            aggs = _SIGNAL_AGGS[metric]
            found = aggregate_problem(
                self.count if "count" in aggs else None,
                self.sum if "sum" in aggs else None,
                self.max, self.min,
                _VALUE_LIMIT[metric](limits), limits.samples,
            )
        return out_of_range(f"{_SIGNAL_WORDS[metric]} {found[0]}", SOURCE, found[1]) if found else ""


# A signal no answer had, read by `_Gpu.stats` and never written: one instance, not one per GPU and signal.
_NOT_READ = _Agg()

# The range of each signal's values, in its own unit.
_VALUE_LIMIT = {
    GPU_UTIL: lambda limits: ACTIVITY_PCT,
    GR_ENGINE_ACTIVE: lambda limits: GR_ENGINE_RATIO,
    FB_USED: lambda limits: limits.memory,
    POWER_USAGE: lambda limits: limits.power,
    PROCESSES: lambda limits: PROCESS_COUNT,
    **{metric: (lambda limits: PROFILING_RATIO) for metric in PROFILING_SIGNALS},
}


_PROFILING_SET = frozenset(PROFILING_SIGNALS)


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


@dataclass(slots=True)
class _Gpu:
    uuid: str = ""
    model_name: str = ""
    mig_profile: str = ""
    signals: dict[str, _Agg] = field(default_factory=dict)
    profiling_age_s: float = 0.0  # how old its REASON_SIGNALS figures are (PrometheusMetrics._slots_due)

    def stats(self, key: str, limits: GpuLimits) -> GpuWindowStats:
        """The GPU's window figures; `invalid` when any number read for any of its signals is implausible."""
        util = self.signals.get(GPU_UTIL, _NOT_READ)
        gr = self.signals.get(GR_ENGINE_ACTIVE, _NOT_READ)
        fb = self.signals.get(FB_USED, _NOT_READ)
        power = self.signals.get(POWER_USAGE, _NOT_READ)
        procs = self.signals.get(PROCESSES, _NOT_READ)
        second, second_signal = _NOT_READ, ""
        if gr.count > 0:  # preferred; GPU_UTIL, where the GPU has it too, must agree before IDLE
            signal, act, scale = GR_ENGINE_ACTIVE, gr, 100.0  # ratio -> percent
            if util.count > 0:
                second, second_signal = util, GPU_UTIL
        elif util.count > 0:
            signal, act, scale = GPU_UTIL, util, 1.0
        else:
            signal, act, scale = GPU_UTIL, _NOT_READ, 1.0

        # The window means of the profiling ratios read (none on most fleets: no signal of theirs was read).
        ratios = {metric: figures.mean for metric, figures in self.signals.items() if metric in _PROFILING_SET}
        stats = GpuWindowStats(
            gpu=key,
            samples=int(act.count) if math.isfinite(act.count) else 0,
            activity_max=_scaled(act.max, scale) if act.count else None,
            activity_mean=_scaled(act.mean, scale),
            activity_min=_scaled(act.min, scale) if act.count else None,
            activity_signal=signal,
            fb_used_max_mib=fb.max,
            power_mean_w=power.mean,
            uuid=self.uuid,
            model_name=self.model_name,
            dropped_invalid=act.dirty,
            processes_max=int(procs.max) if procs.count > 0 and procs.max is not None else None,
            process_samples=int(procs.count) if math.isfinite(procs.count) else 0,
            mig_profile=self.mig_profile,
            second_activity_signal=second_signal,
            second_activity_max=second.max if second_signal else None,
            second_activity_mean=second.mean if second_signal else None,
            sm_active=ratios.get(SM_ACTIVE),
            sm_occupancy=ratios.get(SM_OCCUPANCY),
            tensor_active=ratios.get(TENSOR_ACTIVE),
            pipes=tuple((p, v) for p, metric in PIPE_ACTIVE.items() if (v := ratios.get(metric)) is not None)
            if ratios else (),
            tdp_w=limits.tdp_w,
            profiling_age_s=self.profiling_age_s if ratios and any(m in ratios for m in REASON_SIGNALS) else 0.0,
        )
        for metric in _SIGNAL_AGGS:  # every signal read, not only the one judged, in this order
            figures = self.signals.get(metric)
            if figures is not None and (problem := figures.problem(metric, limits)):
                return replace(invalidated(stats, problem), processes_max=None, process_samples=0)
        checked = validate_stats_within(stats, limits.expected_samples, limits.memory, limits.power, source=SOURCE)
        return replace(checked, processes_max=None, process_samples=0) if checked.invalid else checked


def parse_answer(key: tuple[str, str], answer: Any) -> list[tuple[dict[str, str], str, float]]:
    """(labels, agg, value) rows of one answer; QueryFailed if malformed.

    A clean answer is an instant vector with an `agg` label; a dirty answer is a range vector whose every
    point is one valid sample (agg "sample"); a raw answer is a range vector of raw samples, of which only
    the valid ones (`is_valid_sample`) become "sample" rows: the others are not measurements.
    """
    metric, kind = key
    if not isinstance(answer, list):
        raise QueryFailed(f"malformed answer for {metric}: expected a list of series")
    rows = []
    try:
        for item in answer:
            labels = item["metric"]
            if not isinstance(labels, dict):
                raise TypeError
            if kind == CLEAN:
                agg = labels["agg"]
                if agg not in _ACCEPTED_AGGS[metric]:
                    raise QueryFailed(f"malformed answer for {metric}: unexpected agg {agg[:20]!r}")
                points = [item["value"]]
            else:
                agg, points = "sample", item["values"]
            for point in points:
                # NaN and inf are kept: they are implausible numbers, checked where combined (row_problem).
                value = float(point[1])
                if kind != RAW or is_valid_sample(value):
                    rows.append((labels, agg, value))
    except (KeyError, IndexError, TypeError, ValueError):
        raise QueryFailed(f"malformed answer for {metric}") from None
    return rows


# The two shapes of answer the collector reads, decoded typed by msgspec straight from the bytes (BENCHMARKS.md,
# "Client time per tick"): no dict per series or list per point, and no object the cyclic GC tracks (gc=False).
# A body of another shape fails the decode: "malformed answer".
class _Point(msgspec.Struct, array_like=True, gc=False):
    at: float
    value: str  # Prometheus writes sample values as strings ("0.5", "NaN", "+Inf")


class _Instant(msgspec.Struct, gc=False):  # one series of an instant vector (the clean queries)
    metric: dict[str, str]
    value: _Point


class _Range(msgspec.Struct, gc=False):  # one series of a range vector (the raw and dirty reads)
    metric: dict[str, str]
    values: list[_Point]


class _VectorData(msgspec.Struct, gc=False):
    result: list[_Instant]


class _MatrixData(msgspec.Struct, gc=False):
    result: list[_Range]


class _VectorAnswer(msgspec.Struct, gc=False):
    data: _VectorData


class _MatrixAnswer(msgspec.Struct, gc=False):
    data: _MatrixData


_DECODERS = {CLEAN: msgspec.json.Decoder(_VectorAnswer), DIRTY: msgspec.json.Decoder(_MatrixAnswer),
             RAW: msgspec.json.Decoder(_MatrixAnswer)}
_ACCEPTED_SETS = {metric: frozenset(aggs) for metric, aggs in _ACCEPTED_AGGS.items()}


def parse_body(key: tuple[str, str], body: bytes) -> list[Row]:
    """`parse_answer` of an answer's bytes, decoded typed (the collector's path: the same rows, one pass)."""
    metric, kind = key
    try:
        result = _DECODERS[kind].decode(body).data.result
        if kind == CLEAN:
            accepted = _ACCEPTED_SETS[metric]
            rows = [(s.metric, s.metric.get("agg"), float(s.value.value)) for s in result]
            for _labels, agg, _value in rows:
                if agg not in accepted:
                    raise QueryFailed(f"malformed answer for {metric}: unexpected agg {str(agg)[:20]!r}")
            return rows
        if kind == RAW:  # only the valid samples are measurements (is_valid_sample)
            return [(s.metric, "sample", v) for s in result for p in s.values
                    if 0.0 <= (v := float(p.value)) < SENTINEL_THRESHOLD]
        return [(s.metric, "sample", float(p.value)) for s in result for p in s.values]
    except (msgspec.DecodeError, ValueError):
        raise QueryFailed(f"malformed answer for {metric}") from None


def _as_utc(now: datetime) -> datetime:
    return now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now


# --------------------------------------------------------------------------- the source


def auth_of(settings: PrometheusSettings) -> tuple[dict[str, str], tuple[str, str] | None]:
    """HTTP headers and basic auth for the Prometheus API, from the env vars / files the settings name."""
    headers = {}
    token = settings.bearer_token.resolve()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    auth = None
    if settings.basic_auth_user:
        auth = (settings.basic_auth_user, settings.basic_auth_password.resolve() or "")
    return headers, auth


def connect(settings: PrometheusSettings, session: requests.Session | None = None) -> PrometheusConnect:
    """The one way gpufinops opens the Prometheus API: auth from settings, TLS as configured, no retries
    (a failed query is reported and the next run tries again; a read timeout stays a ReadTimeout)."""
    headers, auth = auth_of(settings)
    return PrometheusConnect(url=settings.url.rstrip("/"), headers=headers or None,
                             disable_ssl=not settings.verify_tls, retry=Retry(0, read=False), auth=auth,
                             session=session, timeout=settings.timeout_s)


def endpoint_of(url: str) -> str:
    """host[:port] of a Prometheus URL: how errors name it (never the credentials a URL may hold)."""
    parsed = urlparse(url)
    where = parsed.hostname or "prometheus"
    return f"{where}:{parsed.port}" if parsed.port else where


class PromReader:
    """The one way gpufinops reads Prometheus (collector, backtest, right-sizing, learned policy): the client
    from `connect` (bearer or basic auth, TLS, timeout), every failure one short QueryFailed naming host:port,
    and the count of HTTP queries sent. Answers are the API's `result` lists, shape-checked."""

    def __init__(self, settings: PrometheusSettings, session: requests.Session | None = None):
        self.settings = settings
        self.where = endpoint_of(settings.url)
        self.queries_made = 0
        self._lock = threading.Lock()  # the collector sends its queries from several threads
        if session is None:
            session = requests.Session()
            session.verify = settings.verify_tls
        connect(settings, session)  # mounts its adapter without retries on the session
        self._session = session
        self._url = settings.url.rstrip("/")
        self._headers, self._auth = auth_of(settings)

    def _get(self, path: str, params: Mapping[str, str], timeout: float) -> bytes:
        """The body of one GET of the API (as prometheus_api_client sends it: same session, auth, TLS), unparsed:
        the caller decodes it with the shape it expects. A status other than 200 raises as that client does."""
        response = self._session.get(f"{self._url}{path}", params=params, headers=self._headers or None,
                                     auth=self._auth, verify=self._session.verify, cert=self._session.cert,
                                     timeout=timeout)
        if response.status_code != 200:
            raise PrometheusApiClientException(
                f"HTTP Status Code {response.status_code} ({response.content!r})")
        return response.content

    def instant_body(self, promql: str, at: float, timeout_s: float | None = None) -> bytes:
        """/api/v1/query at `at` (epoch s), the answer's bytes (the collector decodes them typed: `parse_body`)."""
        timeout, params = self._timeouts(timeout_s)
        with translated_errors(self.where, timeout):
            return self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}", **params}, timeout)

    def _timeouts(self, timeout_s: float | None) -> tuple[float, dict[str, str]]:
        timeout = self.settings.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self.queries_made += 1
        # Server-side timeout as float seconds: Prometheus rejects "2.5s" (400).
        return timeout, {"timeout": f"{max(timeout, 0.001):.3f}"}

    def instant(self, promql: str, at: float, timeout_s: float | None = None) -> list[dict]:
        """/api/v1/query at `at` (epoch s)."""
        timeout, params = self._timeouts(timeout_s)
        with translated_errors(self.where, timeout):
            body = self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}", **params}, timeout)
            answer = msgspec.json.decode(body)["data"]["result"]
        return self._series(answer, ("value", "values"))  # a subquery answers a range vector

    def range(self, promql: str, start: float, end: float, step_s: float, *, max_points: int = MAX_POINTS,
              timeout_s: float | None = None) -> list[dict]:
        """/api/v1/query_range over [start, end] (epoch s) every `step_s`, in pages of at most `max_points` steps
        (Prometheus refuses more than 11,000 points per series). The series of every page, in page order: a
        series spanning pages appears once per page, each with its own steps."""
        if max_points < 1 or step_s <= 0:
            raise ValueError(f"range read needs max_points >= 1 and step_s > 0, got {max_points}, {step_s}")
        out: list[dict] = []
        t = start
        while t <= end:
            t1 = min(end, t + (max_points - 1) * step_s)
            timeout, params = self._timeouts(timeout_s)
            # start/end as params: to the millisecond (the client's own arguments round them to seconds).
            params.update(query=promql, start=f"{t:.3f}", end=f"{t1:.3f}", step=f"{step_s:g}")
            with translated_errors(self.where, timeout):
                body = self._get("/api/v1/query_range", params, timeout)
                answer = msgspec.json.decode(body)["data"]["result"]
            out.extend(self._series(answer, ("values",)))
            t = t1 + step_s
        return out

    def _series(self, answer: Any, points: tuple[str, ...]) -> list[dict]:
        ok = isinstance(answer, list) and all(
            isinstance(s, dict) and isinstance(s.get("metric"), dict)
            and any(isinstance(s.get(p), list) for p in points)
            for s in answer)
        if not ok:
            raise QueryFailed(f"prometheus at {self.where}: malformed answer")
        return answer


Row = tuple[dict[str, str], str, float]  # (series labels, agg, value) as parsed from one answer
Identity = tuple[str, ...]  # the values of a GPU's identity labels (gpu_identity_labels), "" when absent


@dataclass(frozen=True)
class Detail:
    """Which (signal, GPU) pairs had invalid samples in the window, and the raw-sample queries that read
    their valid samples back (or the whole-fleet DIRTY subquery when there are too many to read raw)."""

    pairs: frozenset[tuple[str, Identity]]
    queries: dict[tuple[str, str, str], str]  # (signal, kind, narrowing label#chunk) -> PromQL


_EMPTY = ("",) * 64  # more than any identity has labels


def identity(labels: Mapping[str, str], by: Sequence[str]) -> Identity:
    """The values of a series' GPU identity labels, "" when absent (what a GPU's figures are combined by)."""
    return tuple(map(labels.get, by, _EMPTY))


class _DetailedRows(dict):
    """(signal, agg) of each agg label of one queried signal's answer, worked out once per label (`signal_of`);
    (None, agg) for a signal that never needs the detail read. A dict: a row finds its pair in one look-up."""

    def __init__(self, host_metric: str) -> None:
        super().__init__()
        self.host_metric = host_metric

    def __missing__(self, host_agg: str) -> tuple[str | None, str]:
        metric, agg = signal_of(self.host_metric, host_agg)
        found = self[host_agg] = (metric if metric in DETAILED_SIGNALS else None, agg)
        return found


def narrowing(labels: Mapping[str, str], by_labels: Sequence[str]) -> tuple[str, str] | None:
    """The one label that picks a GPU's series out of the fleet: its UUID, else its host label."""
    for name in ("UUID", *by_labels):
        if labels.get(name):
            return name, labels[name]
    return None


@dataclass
class DetailWanted:
    """What the clean answers read so far ask of the detail read (`plan_detail`, in steps): the (signal, GPU)
    pairs with invalid samples, the narrowing label values that pick them out, the signals that cannot be
    narrowed. Each answer adds its own (`add`): a signal comes from one query only (FOLDED), so the pairs one
    answer adds are final for its signals as soon as it lands."""

    pairs: set[tuple[str, Identity]] = field(default_factory=set)
    wanted: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # signal -> narrowing label -> values
    unnarrowable: set[str] = field(default_factory=set)

    def add(self, host_metric: str, rows: Sequence[Row], matcher: InstanceMatcher, by: Sequence[str]
            ) -> set[tuple[str, Identity]]:
        """Note the GPUs of requested instances whose figures in this answer show invalid samples
        (`needs_detail`); returns this answer's pairs."""
        added: set[tuple[str, Identity]] = set()
        detailed = _DetailedRows(host_metric)
        for labels, host_agg, value in rows:
            metric, agg = detailed[host_agg]
            if metric is None or not needs_detail(agg, value) or matcher.match(labels) is None:
                continue
            added.add((metric, identity(labels, by)))
            pick = narrowing(labels, by)
            if pick is None:
                self.unnarrowable.add(metric)
            else:
                self.wanted.setdefault(metric, {}).setdefault(pick[0], set()).add(pick[1])
        self.pairs |= added
        return added

    def plan(self, promql: PromQL, window_s: int, expected_samples: int, max_points: int | None = None) -> Detail:
        """The raw-sample queries for every pair noted, narrowed by label matchers; the whole-fleet DIRTY
        subquery instead for a signal that cannot be narrowed or when there are too many samples to read raw."""
        queries: dict[tuple[str, str, str], str] = {}
        too_many = len(self.pairs) * max(expected_samples, 1) > (
            MAX_DETAIL_POINTS if max_points is None else max_points)
        for metric in sorted({m for m, _ in self.pairs}):
            if too_many or metric in self.unnarrowable:
                queries[(metric, DIRTY, "")] = promql.dirty_query(metric, window_s)
                continue
            for label, values in sorted(self.wanted[metric].items()):
                ordered = sorted(values)
                for i in range(0, len(ordered), DETAIL_GPUS_PER_QUERY):
                    queries[(metric, RAW, f"{label}#{i}")] = promql.detail_query(
                        metric, window_s, label, ordered[i:i + DETAIL_GPUS_PER_QUERY])
        return Detail(frozenset(self.pairs), queries)


def plan_detail(promql: PromQL, rows_by_signal: Mapping[str, Sequence[Row]], matcher: InstanceMatcher,
                window_s: int, expected_samples: int, max_points: int | None = None) -> Detail:
    """Pure: the GPUs of requested instances whose clean figures show invalid samples (`needs_detail`),
    and the queries for their raw samples, narrowed by label matchers; none when no GPU needs them."""
    wanted = DetailWanted()
    for host_metric, rows in rows_by_signal.items():
        wanted.add(host_metric, rows, matcher, promql.by_labels)
    return wanted.plan(promql, window_s, expected_samples, max_points)


def detail_rows(metric: str, kind: str, found: Sequence[Row], by: Sequence[str], pairs) -> Sequence[Row]:
    """The rows of one detail answer that count: a raw read keeps only the GPUs that needed it, since the
    narrowing label may select more than were asked for."""
    if kind != RAW:
        return found
    kept: list[Row] = []
    series, wanted = None, False
    for row in found:
        if row[0] is not series:  # a series' samples come in a row and share its labels: one identity per series
            series, wanted = row[0], (metric, identity(row[0], by)) in pairs
        if wanted:
            kept.append(row)
    return kept


def with_detail(clean: Mapping[tuple[str, str], Sequence[Row]], extra: Mapping[tuple, Sequence[Row]],
                by: Sequence[str], pairs) -> dict[tuple[str, str], Sequence[Row]]:
    """The clean answers plus the detail read for the GPUs that needed it (`plan_detail`): the raw reads keep only
    those GPUs' series, since the narrowing label may select more than were asked for."""
    answers: dict[tuple[str, str], Sequence[Row]] = dict(clean)
    for (metric, kind, _label), found in extra.items():
        answers[(metric, kind)] = [*answers.get((metric, kind), ()), *detail_rows(metric, kind, found, by, pairs)]
    return answers


class _GcPause:
    """Python's cyclic garbage collector held off while a tick builds its rows and figures (`gc_paused`).

    A tick at 10k GPUs makes some 200k short-lived containers (rows, per-signal figures, stats); each time the
    young ones pile up the collector walks every live object, so it ran again and again over the same answers:
    measured, it was a third of the client's CPU (BENCHMARKS.md, "Client time per tick"). Reference counting
    frees them as usual meanwhile; a cycle made during the tick waits for the next collection. Counted, so that
    two ticks at once (two rule windows) turn it back on only when both are done, and only if it was on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._was_enabled = False

    @contextmanager
    def held(self):
        with self._lock:
            if self._holders == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._was_enabled:
                    gc.enable()


gc_paused = _GcPause().held  # the one per process: the collector it holds off is the process's


class PrometheusMetrics:
    """MetricsSource over Prometheus + dcgm-exporter (or VictoriaMetrics: the same API)."""

    def __init__(self, settings: PrometheusSettings, session: requests.Session | None = None):
        self.settings = settings
        self.promql = PromQL(
            instance_label=settings.instance_label,
            hostname_labels=tuple(settings.hostname_labels),
            scrape_interval_s=settings.scrape_interval_s,
            selector=settings.selector,
        )
        self.reader = PromReader(settings, session)
        # (window_s, shard) -> slot -> the occupancy / tensor / FP-pipe rows of its last read (`_slots_due`).
        # Bounded: one entry per rule window and shard, a few rows per profiled GPU in all.
        self._reasons: dict[tuple[int, int], dict[int, _KeptReasons]] = {}

    @property
    def queries_made(self) -> int:
        """HTTP queries sent, for tests and the benchmark."""
        return self.reader.queries_made

    def _query(self, key: tuple[str, str], promql: str, at: float) -> list[Row]:
        return parse_body(key, self.reader.instant_body(promql, at))

    def _all(self, queries: Mapping[Any, str], kind_of, at: float) -> dict[Any, list[Row]]:
        return dict(self._landing(queries, kind_of, at))

    def _landing(self, queries: Mapping[Any, str], kind_of, at: float) -> Iterator[tuple[Any, list[Row]]]:
        """(key, rows) of each query as its answer lands. Concurrent: Prometheus evaluates queries in parallel,
        so the wall time is that of the slowest; the caller works on each answer while the others are computed.
        The first failed query raises (QueryFailed), after the others have ended."""
        with ThreadPoolExecutor(max_workers=max(len(queries), 1)) as pool:
            futures = {pool.submit(self._query, kind_of(key), q, at): key for key, q in queries.items()}
            for future in as_completed(futures):
                yield futures[future], future.result()

    def window_usage(
        self, instances: Sequence[GpuInstance], window_s: int, now: datetime
    ) -> dict[str, InstanceUsage]:
        at = _as_utc(now).timestamp()
        count = shard_count(self.settings.shards, instances)
        with gc_paused():
            if count == 1:
                return self._shard_usage(self.promql, instances, window_s, at, (window_s, 0), "")
            shards: dict[int, list[GpuInstance]] = {}
            for inst in instances:
                shards.setdefault(shard_of(inst.instance_id, count), []).append(inst)
            owned = set(self.settings.owned_shards) or set(range(count))
            usage: dict[str, InstanceUsage] = {}
            expected = window_s // self.settings.scrape_interval_s
            for index in sorted(set(shards) - owned):  # another replica's (docs/scale.md, "Two replicas")
                usage.update({inst.instance_id: InstanceUsage(
                    inst.instance_id, window_s, expected, (),
                    error=f"shard {index + 1} of {count} is another replica's (prometheus.owned_shards)")
                    for inst in shards[index]})
            # Each shard's answers become its instances' usage as soon as they land, and are dropped: at most
            # `shard_parallelism` shards' answers are held at once, whatever the fleet.
            with ThreadPoolExecutor(max_workers=self.settings.shard_parallelism) as pool:
                futures = [pool.submit(self._shard_usage, self.promql.shard(index, count), members, window_s, at,
                                       (window_s, index), f"shard {index + 1} of {count}: ")
                           for index, members in sorted(shards.items()) if index in owned]
                for future in as_completed(futures):
                    usage.update(future.result())
            return {inst.instance_id: usage[inst.instance_id] for inst in instances}

    def _slots_due(self, kept: Mapping[int, _KeptReasons], at: float) -> set[int]:
        """The slots whose REASON_SIGNALS legs this tick reads (REASON_SLOTS, by instance): all of them when
        nothing is kept (or a kept read is from a later time than this tick: a replay), else every slot whose
        read is `profiling_reasons_every_s` old, and the stalest once it is a fifth of that old: on a tick a
        minute with the default, one fifth of the fleet per tick, each GPU read again every 5 minutes."""
        every, slots = self.settings.profiling_reasons_every_s, range(REASON_SLOTS)
        if every == 0 or any(s not in kept or kept[s].at > at for s in slots):
            return set(slots)
        due = {s for s in slots if at - kept[s].at >= every}
        stalest = min(slots, key=lambda s: kept[s].at)
        if at - kept[stalest].at >= every / REASON_SLOTS:
            due.add(stalest)
        return due

    def _shard_usage(self, promql: PromQL, instances: Sequence[GpuInstance], window_s: int, at: float,
                     key: tuple[int, int], where: str) -> dict[str, InstanceUsage]:
        """The usage of `instances` from one query set (the whole fleet's, or one shard's). A failed or timed-out
        query makes every instance of this set UNKNOWN, with the reason (never idle, never dropped)."""
        expected = window_s // self.settings.scrape_interval_s
        label = self.settings.instance_label
        kept = self._reasons.setdefault(key, {})
        due = self._slots_due(kept, at)
        if due and not label:  # no instance label to take turns by: all at once
            due = set(range(REASON_SLOTS))
        reasons: bool | str = (True if len(due) == REASON_SLOTS else
                               slots_matcher(label, due, REASON_SLOTS, unlabelled=True) if due else False)
        # The other instances' profiling figures as last read (their slots are not due), with their ages.
        ages = [0.0 if slot in due else at - kept[slot].at for slot in range(REASON_SLOTS)]
        old = [kept[slot] for slot in range(REASON_SLOTS) if slot not in due]
        old_pairs = frozenset().union(*(k.pairs for k in old))
        fold = UsageFold(instances, window_s, expected, label, tuple(self.settings.hostname_labels),
                         profiling_age_of=(lambda labels: ages[shard_of(labels.get(label, ""), REASON_SLOTS)])
                         if old else None)  # none kept: every GPU's are read now, none is older
        matcher = fold.matcher
        by = promql.by_labels
        wanted = DetailWanted()
        try:
            # Each answer is folded as it lands, while the engine still computes the others: its invalid-sample
            # pairs are final on landing (a signal comes from one query), so its clean rows can be counted.
            clean: dict[tuple[str, str], list[Row]] = {}
            for key, rows in self._landing(promql.queries(window_s, reasons), lambda k: k, at):
                clean[key] = rows
                fold.add(key, rows, wanted.add(key[0], rows, matcher, by) | old_pairs)
            detail = wanted.plan(promql, window_s, expected)
            extra: dict[tuple[str, str, str], Sequence[Row]] = {}
            for key, found in self._landing(detail.queries, lambda k: k[:2], at):
                extra[key] = detail_rows(key[0], key[1], found, by, detail.pairs)
                fold.add(key[:2], extra[key])
        except QueryFailed as exc:
            return {
                inst.instance_id: InstanceUsage(inst.instance_id, window_s, expected, (), error=f"{where}{exc}")
                for inst in instances
            }
        for part in old:
            for key, rows in part.joined({}).items():
                fold.add(key, rows, part.pairs)
        if due:
            answers = dict(clean)
            for (metric, kind, _label), rows in extra.items():
                answers[(metric, kind)] = [*answers.get((metric, kind), ()), *rows]
            kept.update(_KeptReasons.of(answers, detail.pairs, at).parts(label, by, due))
        return fold.usage()


@dataclass(frozen=True)
class _KeptReasons:
    """The REASON_SIGNALS rows of the last tick that read them (clean, and the raw/dirty reads of GPUs with
    invalid samples), for one window, shard and slot, with the time of that tick. Rows keep their labels, so each
    GPU finds its own figures again; a GPU first seen since has none until its next read (None: not read, never 0)."""

    at: float
    clean: tuple[Row, ...]
    detail: dict[tuple[str, str], tuple[Row, ...]]
    pairs: frozenset[tuple[str, Identity]]

    @classmethod
    def of(cls, answers: Mapping[tuple[str, str], Sequence[Row]], pairs, at: float) -> _KeptReasons:
        hosted = tuple(FOLDED[m][1] + "_" for m in REASON_SIGNALS)
        clean = tuple(r for r in answers.get((SM_ACTIVE, CLEAN), ()) if r[1].startswith(hosted))
        detail = {k: tuple(v) for k, v in answers.items() if k[0] in REASON_SIGNALS and k[1] != CLEAN}
        return cls(at, clean, detail, frozenset(p for p in pairs if p[0] in REASON_SIGNALS))

    def parts(self, label: str, by: Sequence[str], slots: Iterable[int]) -> dict[int, _KeptReasons]:
        """Per slot of `slots`, the rows of the instances in it (their instance label's shard_of among
        REASON_SLOTS). One pass over the rows whatever the number of slots (all five on a first tick), and one
        shard_of per instance: every row of an instance has the same label value."""
        slot_of = functools.lru_cache(maxsize=None)(functools.partial(shard_of, count=REASON_SLOTS))
        clean: dict[int, list[Row]] = {slot: [] for slot in slots}
        detail: dict[int, dict[tuple[str, str], list[Row]]] = {slot: {k: [] for k in self.detail} for slot in clean}
        pairs: dict[int, set[tuple[str, Identity]]] = {slot: set() for slot in clean}
        for row in self.clean:
            if (slot := slot_of(row[0].get(label, ""))) in clean:
                clean[slot].append(row)
        for key, rows in self.detail.items():
            for row in rows:
                if (slot := slot_of(row[0].get(label, ""))) in detail:
                    detail[slot][key].append(row)
        at = by.index(label) if label in by else None  # where an identity holds the instance label
        for pair in self.pairs:
            if (slot := slot_of("" if at is None else pair[1][at])) in pairs:
                pairs[slot].add(pair)
        return {slot: _KeptReasons(self.at, tuple(clean[slot]), {k: tuple(v) for k, v in detail[slot].items()},
                                   frozenset(pairs[slot])) for slot in clean}

    def joined(self, answers: Mapping[tuple[str, str], Sequence[Row]]) -> dict[tuple[str, str], Sequence[Row]]:
        out = dict(answers)
        if self.clean:
            out[(SM_ACTIVE, CLEAN)] = [*out.get((SM_ACTIVE, CLEAN), ()), *self.clean]
        for k, rows in self.detail.items():
            if rows:
                out[k] = [*out.get(k, ()), *rows]
        return out


def usage_from_answers(
    answers: Mapping[tuple[str, str], Sequence[Row]],
    instances: Sequence[GpuInstance],
    window_s: int,
    expected_samples: int,
    instance_label: str = "instance_id",
    hostname_labels: tuple[str, ...] = ("Hostname", "hostname"),
    detailed: frozenset[tuple[str, Identity]] = frozenset(),
    profiling_age_of: Callable[[Mapping[str, str]], float] | None = None,
) -> dict[str, InstanceUsage]:
    """Pure: the parsed answers of the query set, keyed (signal, clean|dirty|raw), mapped to instances and
    combined per GPU, every number range-checked on the way (see gpufinops.metric_ranges). For the
    (signal, GPU) pairs in `detailed` the clean figures held invalid samples: only their valid samples
    (dirty/raw answers) count. `profiling_age_of(labels)`: how old the REASON_SIGNALS rows of that GPU are."""
    fold = UsageFold(instances, window_s, expected_samples, instance_label, hostname_labels, profiling_age_of)
    for key, rows in answers.items():
        fold.add(key, rows, detailed)
    return fold.usage()


class UsageFold:
    """`usage_from_answers` in steps, so that the tick folds each answer as it lands, while the engine still
    works on the others (BENCHMARKS.md, "Client time per tick"): `add` one answer's rows, then `usage` once.
    The same figures whatever the order the answers are added in: each signal's numbers are combined by sums,
    maxima and minima, and a GPU's labels are the same in every answer."""

    def __init__(self, instances: Sequence[GpuInstance], window_s: int, expected_samples: int,
                 instance_label: str = "instance_id", hostname_labels: tuple[str, ...] = ("Hostname", "hostname"),
                 profiling_age_of: Callable[[Mapping[str, str]], float] | None = None):
        self.instances, self.window_s, self.expected_samples = instances, window_s, expected_samples
        self.matcher = InstanceMatcher.build(instances, instance_label, hostname_labels)
        self.by = gpu_identity_labels(instance_label, hostname_labels)
        self.profiling_age_of = profiling_age_of
        self.per_instance: dict[str, dict[str, _Gpu]] = {inst.instance_id: {} for inst in instances}
        # Everything a row's labels decide (its instance, its GPU) depends on its identity labels only: worked
        # out once per identity, not once per row (a GPU has some 20 rows). None: a GPU of no requested instance.
        self.gpus: dict[Identity, _Gpu | None] = {}
        # signal -> identity -> that GPU's figures of the signal (the _Agg its _Gpu.signals holds), None for a GPU
        # of no requested instance: a row finds its figures in one look-up, not the GPU's and then its signal's
        # (the tick's hottest loop: 8 to 15 rows per GPU; measured at 10k GPUs without profiling ratios, the fold
        # took 0.14 CPU-s instead of 0.17).
        self.figures: dict[str, dict[Identity, _Agg | None]] = {}
        # queried signal -> agg label -> (signal, agg, the signal's `figures`): `signal_of`, once per agg label.
        self.legs: dict[str, dict[str, tuple[str, str, dict[Identity, _Agg | None]]]] = {}

    def add(self, key: tuple[str, str], rows: Sequence[Row], detailed=frozenset()) -> None:
        """Fold one answer's rows. `detailed`: the (signal, GPU) pairs whose clean figures held invalid samples
        (at least those of this answer's signals): their clean rows are checked, not counted."""
        host_metric, kind = key
        dirty: dict[str, set[Identity]] = {}
        if kind == CLEAN:
            for metric, ident in detailed:
                dirty.setdefault(metric, set()).add(ident)
        by, legs = self.by, self.legs.setdefault(host_metric, {})
        series = series_leg = ident = figures = None  # those of the row before
        for labels, host_agg, value in rows:
            leg = legs.get(host_agg)
            if leg is None:
                metric, agg = signal_of(host_metric, host_agg)
                leg = legs[host_agg] = (metric, agg, self.figures.setdefault(metric, {}))
            metric, agg, figures_of = leg
            # A raw read's samples of one series come in a row and share its labels: the same figures again.
            if labels is not series or leg is not series_leg:
                series, series_leg, ident = labels, leg, identity(labels, by)
                figures = figures_of.get(ident, _UNSEEN)
                if figures is _UNSEEN:
                    figures = figures_of[ident] = self._figures_of(metric, ident, labels)
            if figures is None:
                continue
            if dirty and metric in dirty and ident in dirty[metric]:
                figures.dirty = True  # its figures come from the valid samples only
                figures.check(agg, value)  # but a count no query can answer still says the layer is broken
                continue
            figures.add(agg, value)

    def _figures_of(self, metric: str, ident: Identity, labels: Mapping[str, str]) -> _Agg | None:
        """The figures of `metric` of the GPU `labels` name (created on first sight, with the GPU), None when no
        requested instance has that GPU."""
        gpu = self.gpus.get(ident, _UNSEEN)
        if gpu is _UNSEEN:
            gpu = self.gpus[ident] = _gpu_of(labels, self.matcher, self.per_instance)
            if gpu is not None and self.profiling_age_of is not None:
                gpu.profiling_age_s = max(gpu.profiling_age_s, self.profiling_age_of(labels))
        if gpu is None:
            return None
        figures = gpu.signals.get(metric)
        if figures is None:
            figures = gpu.signals[metric] = _Agg(whole=metric in WHOLE_SIGNALS)
        return figures

    def usage(self) -> dict[str, InstanceUsage]:
        by_id = {inst.instance_id: inst for inst in self.instances}
        limits: dict[tuple, GpuLimits] = {}  # a fleet has a handful of GPU models

        def limits_of(inst: GpuInstance, model_name: str) -> GpuLimits:
            key = (inst.gpu_model, inst.gpu_memory_gib, model_name)
            if key not in limits:
                limits[key] = gpu_limits(inst, model_name, self.expected_samples)
            return limits[key]

        return {
            iid: InstanceUsage(iid, self.window_s, self.expected_samples, tuple(
                g.stats(k, limits_of(by_id[iid], g.model_name))
                for k, g in sorted(gpus.items(), key=_gpu_sort)
            ))
            for iid, gpus in self.per_instance.items()
        }


_UNSEEN = object()


def _gpu_of(labels: Mapping[str, str], matcher: InstanceMatcher, per_instance: dict[str, dict[str, _Gpu]]
            ) -> _Gpu | None:
    """The GPU a series belongs to (created on first sight), None when no requested instance has it."""
    instance_id = matcher.match(labels)
    if instance_id is None:
        return None
    gpus, key = per_instance[instance_id], gpu_key(labels)
    gpu = gpus.get(key)
    if gpu is None:
        gpu = gpus[key] = _Gpu()
    gpu.uuid = gpu.uuid or labels.get("UUID", "")
    gpu.model_name = gpu.model_name or labels.get("modelName", "")
    gpu.mig_profile = gpu.mig_profile or labels.get("GPU_I_PROFILE", "")
    return gpu


def _gpu_sort(item: tuple[str, _Gpu]) -> tuple:
    return _gpu_order(item[0])


@functools.lru_cache(maxsize=4096)  # every instance has the same few keys ("0".."7")
def _gpu_order(key: str) -> tuple:
    gpu, _, mig = key.partition("/")
    return (int(gpu) if gpu.isdigit() else 1 << 30, gpu, int(mig) if mig.isdigit() else -1, mig)
