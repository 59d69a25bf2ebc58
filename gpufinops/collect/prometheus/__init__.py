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

The package, in the order a tick goes through it: `signals` (metric names, what each query computes, the tests a
number meets), `promql` (the query text, shards), `reader` (PromReader, the one client), `answers` (bytes to
rows), `detail` (the GPUs read again sample by sample), `fold` (rows to per-GPU figures, range-checked) and
`metrics` (PrometheusMetrics.window_usage, the tick itself). The names other modules import are re-exported here.
"""

from .answers import Row, parse_answer, parse_body
from .detail import plan_detail, with_detail
from .fold import UsageFold, usage_from_answers
from .instances import InstanceMatcher, gpu_key
from .metrics import PrometheusMetrics
from .promql import PromQL, shard_count, shard_matcher, shard_of
from .reader import PromReader, endpoint_of
from .signals import (
    ACTIVITY_SIGNALS, CLEAN, DIRTY, DRAM_ACTIVE, FB_USED, GPU_UTIL, GR_ENGINE_ACTIVE, PIPE_ACTIVE, POWER_USAGE, RAW,
    SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, gpu_identity_labels, host_labels, selected,
)

__all__ = [
    "ACTIVITY_SIGNALS", "CLEAN", "DIRTY", "DRAM_ACTIVE", "FB_USED", "GPU_UTIL", "GR_ENGINE_ACTIVE", "PIPE_ACTIVE",
    "POWER_USAGE", "RAW", "SM_ACTIVE", "SM_OCCUPANCY", "TENSOR_ACTIVE",
    "InstanceMatcher", "PromQL", "PromReader", "PrometheusMetrics", "Row", "UsageFold",
    "endpoint_of", "gpu_identity_labels", "gpu_key", "host_labels", "parse_answer", "parse_body", "plan_detail",
    "selected", "shard_count", "shard_matcher", "shard_of", "usage_from_answers", "with_detail",
]
