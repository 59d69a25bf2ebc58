"""Recorded buckets for a backfilled Prometheus, as the shipped recording rules would have written them.

A rule group evaluates each rule's expression as an instant query at its evaluation times and stores the
result at that time. `recorded_buckets` does the same through /api/v1/query_range (start + k x step are
the evaluation times) against a server holding the raw series, and returns the results as `Series` to
backfill into a second server with the raw series: the same data a Prometheus running
deploy/prometheus/gpufinops-recording.yml for hours would hold. (`promtool tsdb create-blocks-from rules`
does this too, but writes blocks a running server would have to be restarted on.)
"""

from __future__ import annotations

from gpufinops.collect.prometheus import BUCKET_S, PromQL, PromReader
from gpufinops.config import PrometheusSettings
from tests.promserver import Series


def recorded_buckets(url: str, first_eval: float, last_eval: float, promql: PromQL | None = None,
                     skip: frozenset[tuple[str, float]] = frozenset()) -> list[Series]:
    """Every recording rule evaluated every BUCKET_S from first_eval to last_eval (epoch s). `skip` holds
    (GPU UUID, evaluation time) pairs whose buckets are left out: an evaluation the rule engine missed."""
    reader = PromReader(PrometheusSettings(url=url, timeout_s=300))
    out = []
    for record, expr in (promql or PromQL()).recording_rules():
        for item in reader.range(expr, first_eval, last_eval, BUCKET_S):
            labels = {k: v for k, v in item["metric"].items() if k != "__name__"}
            samples = [(float(t), float(v)) for t, v in item["values"]
                       if (labels.get("UUID", ""), float(t)) not in skip]
            out.append(Series(record, labels, samples))
    return out
