"""The PromQL text of a tick: the fixed query set of one window (`PromQL`), the raw-sample and DIRTY reads of the
GPUs with invalid samples, and the label matchers that cut the fleet into shards and turns (`shard_of`). Pure:
text only, nothing is sent from here."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from gpufinops.model import SENTINEL_THRESHOLD, GpuInstance

from .signals import (
    CLEAN, FOLDED, QUERIED_SIGNALS, REASON_SIGNALS, _SIGNAL_AGGS, gpu_identity_labels, selected,
)

# Per-series range function, and how the series of one GPU are combined.
_RANGE_FN = {"count": "count_over_time", "sum": "sum_over_time", "max": "max_over_time", "min": "min_over_time",
             "mean": "avg_over_time"}
# A GPU split into series by pod labels gets the mean of its series' means for a profiling ratio (a reason's
# figure, never a verdict's threshold): exact for the one series nearly every GPU has.
_COMBINE = {"count": "sum", "sum": "sum", "max": "max", "min": "min", "mean": "avg"}


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
