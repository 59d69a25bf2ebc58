"""DCGM GPU usage per Slurm job, from Prometheus, in the collector's fixed number of queries.

A job holds GPUs by (node, Slurm index): the node's host name joins DCGM's `Hostname` (or, since 2026,
`hostname`) label, compared short and case-blind; the index joins the series' `gpu` label, or, through the
cluster's `gpu_index_map`, another `gpu` value or a `UUID` where Slurm's IDX (the device minor in gres.conf order)
is not NVML's index (docs/slurm.md, "The index caveat"). The queries are collect.prometheus' own (`PromQL.queries`,
`plan_detail`, `usage_from_answers`: the same sentinel, NaN and range care) and the verdict rules are the
instances' (decide.evaluate): low is not idle, memory held is not work, the power witness, the rule's window.

A job is judged over its own life only: evaluate holds a job younger than the rule's window UNKNOWN ("too
young"), so no sample from before its start (another job on the same GPU) is ever counted as its own. A job whose
GPUs Slurm does not name (`gpus_unread`), a cluster Slurm did not answer for, a failed query: UNKNOWN, never idle.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence

import requests

from ...collect.errors import QueryFailed
from ...collect.prometheus import (PromQL, PromReader, Row, gpu_identity_labels, parse_answer, plan_detail,
                                   usage_from_answers, with_detail)
from ...config import PrometheusSettings
from ...model import GpuInstance, InstanceUsage
from .jobs import GpuSlot

# The label this module adds to each row to hand it to usage_from_answers as its "instance" (never queried).
JOB_KEY_LABEL = "gpufinops_slurm_job"


def short_host(name: str) -> str:
    return name.split(".", 1)[0].strip().lower()


def series_key(node: str, index: int, index_map: Mapping[str, Mapping[int, str]]) -> tuple[str, str, str]:
    """(short host, "gpu" or "UUID", value) a DCGM series carries for Slurm's GPU `index` on `node`."""
    mapped = (index_map.get(node) or index_map.get(short_host(node)) or index_map.get("*") or {}).get(index)
    if mapped is None:
        return short_host(node), "gpu", str(index)
    return short_host(node), ("gpu" if mapped.isdigit() else "UUID"), mapped


class JobMatcher:
    """plan_detail's and the fold's matcher: a series belongs to the job that holds its (host, GPU)."""

    def __init__(self, gpus_of: Mapping[str, Sequence[GpuSlot]], index_map: Mapping[str, Mapping[int, str]],
                 hostname_labels: Sequence[str]):
        self.hostname_labels = tuple(hostname_labels)
        self.by_gpu: dict[tuple[str, str, str], str] = {}
        for sid, slots in gpus_of.items():
            for slot in slots:
                self.by_gpu[series_key(slot.node, slot.index, index_map)] = sid

    def match(self, labels: Mapping[str, str]) -> str | None:
        host = next((labels[n] for n in self.hostname_labels if labels.get(n)), "")
        if not host:
            return None
        host = short_host(host)
        for label in ("UUID", "gpu"):
            value = labels.get(label)
            if value and (host, label, value) in self.by_gpu:
                return self.by_gpu[(host, label, value)]
        return None


def split_by_job(answers: Mapping[Any, Sequence[Row]], matcher: JobMatcher, by: Sequence[str],
                 detailed: frozenset) -> tuple[dict, frozenset]:
    """Pure: the rows of the jobs' GPUs, each tagged with JOB_KEY_LABEL, and the detailed (signal, GPU) pairs
    re-keyed to usage_from_answers' identity labels (JOB_KEY_LABEL + the GPU labels)."""
    out: dict[Any, list[Row]] = {}
    for key, rows in answers.items():
        out[key] = [({**labels, JOB_KEY_LABEL: sid}, agg, value) for labels, agg, value in rows
                    if (sid := matcher.match(labels)) is not None]
    base = gpu_identity_labels(JOB_KEY_LABEL, ())
    rekeyed = set()
    for metric, identity in detailed:
        labels = dict(zip(by, identity))
        sid = matcher.match(labels)
        if sid is not None:
            labels[JOB_KEY_LABEL] = sid
            rekeyed.add((metric, tuple(labels.get(n, "") for n in base)))
    return out, frozenset(rekeyed)


class SlurmJobMetrics:
    """A MetricsSource over Slurm jobs: `gpus_of(subject id)` gives a job's GPUs (None: Slurm did not name them,
    with `why_unknown(subject id)` saying why); `index_map_of(subject id)` its cluster's gpu_index_map."""

    def __init__(self, settings: PrometheusSettings, jobs: Callable[[str], tuple[Sequence[GpuSlot], str]],
                 index_map_of: Callable[[str], Mapping[str, Mapping[int, str]]],
                 session: requests.Session | None = None):
        self.settings = settings
        self.jobs = jobs  # subject id -> (its GPUs, why it cannot be judged: "" when it can)
        self.index_map_of = index_map_of
        self.promql = PromQL(instance_label=settings.instance_label, hostname_labels=settings.hostname_labels,
                             scrape_interval_s=settings.scrape_interval_s, selector=settings.selector)
        self.reader = PromReader(settings, session)

    def _all(self, queries: Mapping[Any, str], kind_of, at: float) -> dict[Any, list[Row]]:
        with ThreadPoolExecutor(max_workers=max(len(queries), 1)) as pool:
            futures = {key: pool.submit(lambda k, q: parse_answer(kind_of(k), self.reader.instant(q, at)), key, q)
                       for key, q in queries.items()}
            return {key: f.result() for key, f in futures.items()}

    def window_usage(self, instances: Sequence[GpuInstance], window_s: int, now: datetime) -> dict[str, InstanceUsage]:
        expected = window_s // self.settings.scrape_interval_s
        out: dict[str, InstanceUsage] = {}
        judged: list[GpuInstance] = []
        gpus_of: dict[str, Sequence[GpuSlot]] = {}
        for inst in instances:
            slots, why = self.jobs(inst.instance_id)
            if why:
                out[inst.instance_id] = InstanceUsage(inst.instance_id, window_s, expected, (), error=why)
            else:
                judged.append(inst)
                gpus_of[inst.instance_id] = slots
        if not judged:
            return out
        # One map per cluster; a subject's own map is its cluster's (the ids say which).
        index_map: dict[str, Mapping[int, str]] = {}
        for inst in judged:
            index_map.update(self.index_map_of(inst.instance_id))
        matcher = JobMatcher(gpus_of, index_map, self.promql.hostname_labels)
        at = (now if now.tzinfo else now.replace(tzinfo=timezone.utc)).timestamp()
        try:
            clean = self._all(self.promql.queries(window_s), lambda key: key, at)
            rows = {metric: r for (metric, _kind), r in clean.items()}
            detail = plan_detail(self.promql, rows, matcher, window_s, expected)
            extra = self._all(detail.queries, lambda key: key[:2], at)
        except QueryFailed as exc:
            out.update({i.instance_id: InstanceUsage(i.instance_id, window_s, expected, (), error=str(exc))
                        for i in judged})
            return out
        by = self.promql.by_labels
        answers = with_detail(clean, extra, by, detail.pairs)
        per_job, detailed = split_by_job(answers, matcher, by, detail.pairs)
        out.update(usage_from_answers(per_job, judged, window_s, expected, JOB_KEY_LABEL, (), detailed=detailed))
        return out
