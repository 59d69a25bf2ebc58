"""The answer fold: the rows of a tick's answers mapped to the requested instances and combined per GPU and signal
(`UsageFold`, `_Agg`, `_Gpu`), every number range-checked on the way (gpufinops.metric_ranges), into one
InstanceUsage per instance. The tick's hottest loop (`UsageFold.add`): BENCHMARKS.md, "Client time per tick"."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from gpufinops.prices.catalog import CatalogError, load_catalog
from gpufinops.metric_ranges import (
    ACTIVITY_PCT, GR_ENGINE_RATIO, PROCESS_COUNT, PROFILING_RATIO, Limit, aggregate_problem, invalidated,
    memory_limit, number_problem, out_of_range, power_limit, samples_limit, validate_stats_within,
)
from gpufinops.model import SENTINEL_THRESHOLD, GpuInstance, GpuWindowStats, InstanceUsage

from .answers import Identity, Row, identity
from .instances import InstanceMatcher, gpu_key
from .signals import (
    CLEAN, DRAM_ACTIVE, FB_USED, GPU_UTIL, GR_ENGINE_ACTIVE, PIPE_ACTIVE, POWER_USAGE, PROCESSES, PROFILING_SIGNALS,
    REASON_SIGNALS, SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, WHOLE_SIGNALS, _SIGNAL_AGGS, gpu_identity_labels,
    signal_of,
)

SOURCE = "Prometheus"  # how reasons name where an implausible number came from
# How reasons name each signal and aggregate ("the activity sum read from Prometheus ...").
_SIGNAL_WORDS = {GPU_UTIL: "activity", GR_ENGINE_ACTIVE: "GR engine activity", FB_USED: "memory used",
                 POWER_USAGE: "power draw", PROCESSES: "process count", SM_ACTIVE: "SM activity",
                 SM_OCCUPANCY: "SM occupancy", TENSOR_ACTIVE: "tensor pipe activity", DRAM_ACTIVE: "DRAM activity",
                 **{metric: f"{p.upper()} pipe activity" for p, metric in PIPE_ACTIVE.items()}}
_AGG_WORDS = {"present": "presence marker", "sample": "sample", "count": "sample count", "sum": "sum",
              "max": "maximum", "min": "minimum", "mean": "mean"}


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
