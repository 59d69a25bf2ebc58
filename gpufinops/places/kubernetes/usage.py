"""DCGM GPU usage per Kubernetes pod, from Prometheus, in the collector's fixed number of queries.

dcgm-exporter with its Kubernetes mapping labels each GPU's series with the pod, namespace and container that
hold the GPU. Scraped with `honor_labels: false` (a ServiceMonitor's default) those become `exported_pod`,
`exported_namespace`, `exported_container`, and `pod`/`namespace` then name the exporter's own pod: both forms
are read, the exported ones first.

The queries are collect.prometheus' own (`PromQL.queries`, `plan_detail`, `parse_answer`, `usage_from_answers`:
the same sentinel, NaN and range care) with the pod labels added to the per-GPU `by` labels (`PodPromQL`): a
GPU that two pods held in turn over the window gives one row per pod. Four queries per window whatever the
number of pods, plus the raw-sample reads for GPUs with invalid samples, as for instances.

A pod with no series is given usage with no GPUs (its workload is UNKNOWN, never idle); a failed query gives
every pod the error. A pod on a time-sliced or MPS GPU has no activity of its own: DCGM measures the GPU, which
every pod on it shares, so such a pod's usage says so (`shared_gpu_reason`) and is never the GPU's figure
copied to it as if it were its own. MIG slices are measured per GPU instance and kept per pod.

GPUs allocated through DRA (ResourceClaims, places.kubernetes.dra) are joined by device, not by pod labels:
dcgm-exporter leaves the pod labels of a DRA-allocated GPU empty on many installs, so a series whose pod labels
name no GPU pod is matched by its node (the same InstanceMatcher as the node inventory) and its `UUID` (else its
`gpu` index) to the device a claim was allocated, as the node's ResourceSlice publishes it. A MIG device is matched
by its GPU and `GPU_I_PROFILE` when it is the only device of that profile on that GPU (the slice publishes no GPU
instance id). What cannot be joined is said (`dra_reason`), never guessed: a device no slice of the node
publishes, one without uuid or index, a claim shared by several pods (the figure is the device's, shared).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

import requests

from gpufinops.collect.errors import QueryFailed
from gpufinops.collect.prometheus import (
    InstanceMatcher, PromQL, PromReader, Row, gpu_identity_labels, parse_answer, plan_detail,
    usage_from_answers, with_detail,
)
from gpufinops.config import PrometheusSettings
from gpufinops.k8s.model import (
    SHARED_FIGURE_MODES, ClusterSnapshot, DraDevice, NodeInfo, PodInfo, node_sharing,
)
from gpufinops.model import GpuInstance, InstanceUsage

# Pod labels of dcgm-exporter's Kubernetes mapping, both as written and as renamed by honor_labels: false.
POD_LABELS = ("exported_namespace", "exported_pod", "namespace", "pod")
# Labels Prometheus' kubernetes_sd relabelling usually gives the node a series was scraped on; tried after the
# configured instance label, before dcgm-exporter's Hostname (in a pod network, the exporter pod's own name).
NODE_LABELS = ("node", "kubernetes_node")
# The label this module adds to each row to hand it to usage_from_answers as its "instance" (never queried).
POD_KEY_LABEL = "gpufinops_pod"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # GPU feature discovery: MiB per GPU
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


class PodPromQL(PromQL):
    """The collector's query set, aggregated per GPU *and* per pod holding it."""

    @property
    def by_labels(self) -> tuple[str, ...]:
        return (*super().by_labels, *POD_LABELS)


def pod_of(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(namespace, pod) a series names: exported_* when present (honor_labels: false), else pod/namespace."""
    for ns_label, pod_label in (("exported_namespace", "exported_pod"), ("namespace", "pod")):
        if labels.get(pod_label):
            return labels.get(ns_label, ""), labels[pod_label]
    return None


def pod_key(key: tuple[str, str]) -> str:
    return f"{key[0]}/{key[1]}"


def _dra_keys(device: DraDevice) -> list[tuple[str, ...]]:
    """The ways a DCGM series may name a DRA device: by UUID, else by index (a MIG device by its GPU and profile)."""
    if device.kind == "mig":
        return [("mig", gpu, device.profile) for gpu in (device.parent_uuid, f"index:{device.parent_index}")
                if device.profile and gpu not in ("", "index:")]
    return [("gpu", gpu) for gpu in (device.uuid, f"index:{device.index}") if gpu not in ("", "index:")]


def _series_keys(labels: Mapping[str, str]) -> list[tuple[str, ...]]:
    profile = labels.get("GPU_I_PROFILE", "")
    gpus = [g for g in (labels.get("UUID", ""), f"index:{labels.get('gpu', '')}") if g not in ("", "index:")]
    return [("mig", g, profile) for g in gpus] if profile else [("gpu", g) for g in gpus]


def dra_reason(pod: PodInfo, node: NodeInfo | None) -> str | None:
    """Why the pod's DRA GPUs cannot be joined to DCGM series (its workload UNKNOWN); None when each can."""
    for hold in pod.dra_gpus:
        where = f"claim {hold.claim}'s device {hold.driver}/{hold.pool}/{hold.device}"
        if hold.found is None:
            return f"{where} is published by no ResourceSlice of node {hold.node}: which GPU it is cannot be told"
        if not _dra_keys(hold.found):
            missing = "parentUUID / parentIndex or profile" if hold.found.kind == "mig" else "uuid or index"
            return f"{where} has no {missing} attribute in its ResourceSlice: its DCGM series cannot be told"
        if hold.share < 1:
            return (f"per-pod GPU activity does not exist: {where} is shared by {hold.share.denominator} pods, and "
                    "DCGM's figure is the whole device's")
        if hold.found.kind == "mig" and node is not None:
            twins = [d for d in node.dra_devices if d.kind == "mig" and d.profile == hold.found.profile
                     and d.physical_gpu == hold.found.physical_gpu]
            if len(twins) > 1:
                return (f"{where} is one of {len(twins)} MIG devices {hold.found.profile} on one GPU: DCGM's series "
                        "name the GPU instance id, which the ResourceSlice does not publish")
    return None


@dataclass(frozen=True)
class DraJoin:
    """DCGM series -> the pod holding the DRA device they measure: by node, then UUID or index (module docstring)."""

    matcher: InstanceMatcher | None
    by_device: dict[tuple[str, tuple[str, ...]], str]  # (node instance id, device key) -> pod key

    @classmethod
    def build(cls, snapshot: ClusterSnapshot, pods: Sequence[PodInfo], matcher: InstanceMatcher | None) -> "DraJoin":
        by_device = {}
        for pod in pods:
            node = snapshot.node(pod.node_name)
            if node is None or dra_reason(pod, node):
                continue
            for hold in pod.dra_gpus:
                for key in _dra_keys(hold.found):
                    by_device[(node.instance_id, key)] = pod_key(pod.key)
        return cls(matcher if by_device else None, by_device)

    def pod_for(self, labels: Mapping[str, str]) -> str | None:
        if self.matcher is None:
            return None
        node = self.matcher.match(labels)
        if node is None:
            return None
        return next((self.by_device[(node, k)] for k in _series_keys(labels) if (node, k) in self.by_device), None)


NO_DRA = DraJoin(None, {})


@dataclass
class PodMatcher:
    """plan_detail's matcher for pods: a series belongs to a requested pod, by its pod labels, else (DRA) by its
    node and GPU."""

    wanted: frozenset[tuple[str, str]]
    dra: DraJoin = NO_DRA

    def match(self, labels: Mapping[str, str]) -> str | None:
        key = pod_of(labels)
        return pod_key(key) if key in self.wanted else self.dra.pod_for(labels)


def node_subject(node: NodeInfo) -> GpuInstance:
    """The node as an instance, for InstanceMatcher (id, node name as DNS name, internal IP)."""
    return GpuInstance(instance_id=node.instance_id, instance_type=node.instance_type, region=node.region,
                       state="running", launch_time=node.created, private_dns=node.name,
                       private_ip=node.internal_ip, gpu_count=node.gpu_devices)


def pod_subject(pod: PodInfo, node: NodeInfo | None) -> GpuInstance:
    """The pod as an instance for usage_from_answers: its GPU limits come from its node's GPU (GFD labels)."""
    labels = node.labels if node else {}
    try:
        memory_gib = float(labels.get(GPU_MEMORY_LABEL, "0")) / 1024
    except ValueError:
        memory_gib = 0.0
    return GpuInstance(
        instance_id=pod_key(pod.key), instance_type=node.instance_type if node else "",
        region=node.region if node else "", state="running",
        launch_time=pod.started or datetime.min.replace(tzinfo=timezone.utc),
        gpu_count=pod.gpu_devices, gpu_model=labels.get(GPU_PRODUCT_LABEL, ""), gpu_memory_gib=memory_gib,
    )


@dataclass(frozen=True)
class PodWindowUsage:
    """Usage over one window: per GPU pod of the snapshot, and which nodes' GPUs served any pod."""

    window_s: int
    by_pod: Mapping[tuple[str, str], InstanceUsage]
    # Node instance ids whose DCGM series named a GPU pod in the window (current or gone), and those with any
    # series at all: a node in the second set but not the first had GPUs and no pod on them for the window.
    nodes_with_pod_series: frozenset[str] = frozenset()
    nodes_with_series: frozenset[str] = frozenset()
    error: str | None = None
    queries_made: int = 0


def split_by_pod(answers: Mapping[tuple[str, str], Sequence[Row]], wanted: frozenset[tuple[str, str]],
                 pod_by: Sequence[str], detailed: frozenset, dra: DraJoin = NO_DRA) -> tuple[dict, frozenset]:
    """Pure: the rows of requested pods, each tagged with POD_KEY_LABEL, and the detailed (signal, GPU) pairs
    re-keyed to usage_from_answers' identity labels (POD_KEY_LABEL + the GPU labels). A row whose pod labels name
    no requested pod is a DRA pod's when `dra` joins its node and GPU to one."""
    matcher = PodMatcher(wanted, dra)
    out: dict[tuple[str, str], list[Row]] = {}
    for key, rows in answers.items():
        kept = []
        for labels, agg, value in rows:
            pod = matcher.match(labels)
            if pod is not None:
                kept.append(({**labels, POD_KEY_LABEL: pod}, agg, value))
        out[key] = kept
    base = gpu_identity_labels(POD_KEY_LABEL, ())
    rekeyed = set()
    for metric, identity in detailed:
        labels = dict(zip(pod_by, identity))
        pod = matcher.match(labels)
        if pod is not None:
            labels[POD_KEY_LABEL] = pod
            rekeyed.add((metric, tuple(labels.get(n, "") for n in base)))
    return out, frozenset(rekeyed)


def node_series(answers: Mapping[tuple[str, str], Sequence[Row]], matcher: InstanceMatcher,
                other_pods: frozenset[tuple[str, str]], dra: DraJoin = NO_DRA) -> tuple[frozenset[str], frozenset[str]]:
    """Pure: (nodes whose series named a GPU pod, nodes with any series). A pod the cluster lists as
    requesting no GPU (the exporter's own, under honor_labels: false) names no GPU pod; a pod gone since does; a
    GPU a DRA claim of a listed pod holds is a GPU pod's."""
    with_pod, with_any = set(), set()
    for rows in answers.values():
        for labels, _agg, _value in rows:
            node = matcher.match(labels)
            if node is None:
                continue
            with_any.add(node)
            pod = pod_of(labels)
            if (pod is not None and pod not in other_pods) or dra.pod_for(labels) is not None:
                with_pod.add(node)
    return frozenset(with_pod), frozenset(with_any)


def shared_gpu_reason(node: NodeInfo, snapshot: ClusterSnapshot) -> str | None:
    """Why per-pod activity does not exist on a node whose GPUs are time-sliced or shared through MPS; None for
    whole GPUs, MIG and HAMi."""
    sharing = node_sharing(node, snapshot.pods_on(node.name))
    if sharing.mode not in SHARED_FIGURE_MODES:
        return None
    return (f"per-pod GPU activity does not exist: node {node.name}'s GPUs are shared by {sharing.mode} "
            f"({sharing.replicas} replicas per GPU), and DCGM's figure is the whole GPU's, shared by every pod on it")


class PodMetrics:
    """Per-pod DCGM usage over a window (the pods of a ClusterSnapshot), through the one PromReader."""

    def __init__(self, settings: PrometheusSettings, session: requests.Session | None = None):
        self.settings = settings
        host_labels = (*NODE_LABELS, *settings.hostname_labels)
        self.promql = PodPromQL(instance_label=settings.instance_label, hostname_labels=host_labels,
                                scrape_interval_s=settings.scrape_interval_s, selector=settings.selector)
        self.reader = PromReader(settings, session)

    @property
    def queries_made(self) -> int:
        return self.reader.queries_made

    def _all(self, queries: Mapping[Any, str], kind_of, at: float) -> dict[Any, list[Row]]:
        with ThreadPoolExecutor(max_workers=max(len(queries), 1)) as pool:
            futures = {key: pool.submit(lambda k, q: parse_answer(kind_of(k), self.reader.instant(q, at)), key, q)
                       for key, q in queries.items()}
            return {key: f.result() for key, f in futures.items()}

    def window_usage(self, snapshot: ClusterSnapshot, window_s: int, now: datetime) -> PodWindowUsage:
        expected = window_s // self.settings.scrape_interval_s
        at = (now if now.tzinfo else now.replace(tzinfo=timezone.utc)).timestamp()
        pods = [p for p in snapshot.gpu_pods if p.holds_gpus]
        wanted = frozenset(p.key for p in pods)
        matcher = InstanceMatcher.build([node_subject(n) for n in snapshot.nodes], self.settings.instance_label,
                                        self.promql.hostname_labels)
        dra = DraJoin.build(snapshot, pods, matcher)
        before = self.queries_made
        try:
            clean = self._all(self.promql.queries(window_s), lambda key: key, at)
            rows = {metric: r for (metric, _kind), r in clean.items()}
            detail = plan_detail(self.promql, rows, PodMatcher(wanted, dra), window_s, expected)
            extra = self._all(detail.queries, lambda key: key[:2], at)
        except QueryFailed as exc:
            return PodWindowUsage(window_s, {p.key: InstanceUsage(pod_key(p.key), window_s, expected, (),
                                                                  error=str(exc)) for p in pods},
                                  error=str(exc), queries_made=self.queries_made - before)
        by = self.promql.by_labels
        answers = with_detail(clean, extra, by, detail.pairs)
        per_pod, detailed = split_by_pod(answers, wanted, by, detail.pairs, dra)
        subjects = [pod_subject(p, snapshot.node(p.node_name)) for p in pods]
        usage = usage_from_answers(per_pod, subjects, window_s, expected, POD_KEY_LABEL, (), detailed=detailed)
        with_pod, with_any = node_series(clean, matcher, snapshot.other_pods, dra)
        by_pod = {}
        for p in pods:
            node = snapshot.node(p.node_name)
            reason = (dra_reason(p, node) if p.dra_gpus else None) or (
                shared_gpu_reason(node, snapshot) if node and p.gpu_requests else None)
            by_pod[p.key] = (InstanceUsage(pod_key(p.key), window_s, expected, (), error=reason) if reason
                             else usage[pod_key(p.key)])
        return PodWindowUsage(window_s, by_pod, with_pod, with_any, queries_made=self.queries_made - before)
