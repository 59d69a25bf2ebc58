"""Per-pod usage on shared GPUs (issue 28, item 1), read from a real Prometheus backfilled with dcgm-exporter
shaped series: a time-sliced GPU's figure is the GPU's, shared by its pods, so no pod is given it as its own
(per-pod activity does not exist there); a whole GPU's pod keeps its own series."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from gpufinops.places.kubernetes.usage import PodMetrics
from gpufinops.places.kubernetes.cluster import snapshot_from
from gpufinops.collect.prometheus import FB_USED, GPU_UTIL
from gpufinops.config import PrometheusSettings
from tests.kubestub import node_obj, pod_obj
from tests.promserver import Series, binaries_missing, dcgm_labels, start_prometheus

pytestmark = pytest.mark.integration

SCRAPE, WINDOW = 30, 1800
NOW = datetime.fromtimestamp(int(time.time()) // SCRAPE * SCRAPE, timezone.utc)
T4_LABELS = {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.count": "1",
             "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.memory": "15360"}  # GPU Operator time-slicing page


def series(node: str, util: float, **pod: str) -> list[Series]:
    grid = [NOW.timestamp() - WINDOW + SCRAPE * (i + 1) for i in range(WINDOW // SCRAPE)]
    labels = dcgm_labels(node, 0, model="Tesla T4", **pod)
    return [Series(GPU_UTIL, labels, [(t, util) for t in grid]), Series(FB_USED, labels, [(t, 900.0) for t in grid])]


@pytest.fixture(scope="module")
def usage(tmp_path_factory):
    missing = binaries_missing()
    if missing:
        pytest.skip(missing)
    # dcgm-exporter maps a time-sliced GPU to one of its pods: its 90% is the GPU's, not r0's.
    server = start_prometheus(tmp_path_factory.mktemp("shared-prom"),
                              series("ts", 90.0, pod="r0", namespace="ml") + series("wh", 0.0, pod="w", namespace="ml"))
    try:
        nodes = [node_obj("ts", "i-0ts", gpus=4, instance_type="g4dn.xlarge", labels=T4_LABELS),
                 node_obj("wh", "i-0wh", gpus=1, instance_type="g4dn.xlarge")]
        pods = [pod_obj("ml", "r0", "ts"), pod_obj("ml", "r1", "ts"), pod_obj("ml", "w", "wh")]
        snap = snapshot_from(NOW, nodes, pods, {}, [])
        yield PodMetrics(PrometheusSettings(url=server.url, scrape_interval_s=SCRAPE)).window_usage(snap, WINDOW, NOW)
    finally:
        server.stop()


def test_time_sliced_pods_get_no_copy_of_the_gpus_figure(usage):
    assert usage.error is None
    for pod in ("r0", "r1"):
        u = usage.by_pod[("ml", pod)]
        assert u.gpus == () and u.error == (
            "per-pod GPU activity does not exist: node ts's GPUs are shared by time-slicing (4 replicas per GPU), "
            "and DCGM's figure is the whole GPU's, shared by every pod on it")


def test_a_whole_gpus_pod_keeps_its_own_series(usage):
    w = usage.by_pod[("ml", "w")]
    assert w.error is None and len(w.gpus) == 1 and w.gpus[0].activity_mean == pytest.approx(0.0)
    assert usage.nodes_with_pod_series == {"i-0ts", "i-0wh"}
