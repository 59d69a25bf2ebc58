"""Cost per pod for every way a GPU is shared (issue 28, items 1 and 5): the pods' shares plus the node's idle
capacity equal the node's cost to the cent, per node and per hour, whatever the sharing.

Nodes and pods are shaped as the API server returns them with NVIDIA GPU feature discovery (GFD) and the device
plugin in place; sources of each label are cited in gpufinops.k8s.model ("how a node's GPUs are shared"):
- time-slicing: GPU Operator, "Time-Slicing GPUs in Kubernetes" (gpu.count=4, gpu.replicas=4, product
  Tesla-T4-SHARED, nvidia.com/gpu: 16 advertised);
- MPS: k8s-device-plugin README, "Shared Access to GPUs" (nvidia.com/gpu.sharing-strategy=mps);
- MIG mixed / single: GPU Operator, "GPUs with MIG" (mig-<profile>.count labels; single: product <GPU>-MIG-<profile>);
- HAMi: Project-HAMi/HAMi README (nvidia.com/gpumem MiB, nvidia.com/gpucores %, per vGPU).
Expected cents are worked by hand (largest remainder, ties to the earlier row) and written out, not recomputed.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from fractions import Fraction

import pytest

from gpufinops.places.kubernetes.usage import shared_gpu_reason
from gpufinops.places.kubernetes.cluster import KubernetesCluster, api_client, snapshot_from
from gpufinops.k8s.model import node_sharing
from gpufinops.places.kubernetes.costs import IDLE_CAPACITY, attribute, cents_of, cluster_cents, cost_by, request_share
from tests.kubestub import node_obj, pod_obj

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def gfd(product: str, count: int, memory_mib: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """GFD's labels for a node (the ones costs read), plus `extra` under "nvidia.com/"."""
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
              "nvidia.com/gpu.count": str(count), "nvidia.com/gpu.memory": str(memory_mib)}
    labels.update({f"nvidia.com/{k}": v for k, v in (extra or {}).items()})
    return labels


def hami_pod(namespace: str, name: str, node: str, **limits: str) -> dict:
    obj = pod_obj(namespace, name, node)
    res = {"nvidia.com/gpu": "1", **{f"nvidia.com/{k}": v for k, v in limits.items()}}
    obj["spec"]["containers"][0]["resources"] = {"limits": res, "requests": dict(res)}
    return obj


def per_pod(shares) -> dict[str, int]:
    return {s.pod or IDLE_CAPACITY: s.cents for s in shares}


def test_whole_gpus_split_by_count_and_the_rest_is_idle_capacity():
    node = node_obj("a", "i-1", gpus=8, labels={**gfd("NVIDIA-A100-SXM4-40GB", 8, 40960),
                                                "karpenter.sh/nodepool": "train"})
    pods = [pod_obj("ml", "p1", "a", gpus=1), pod_obj("ml", "p2", "a", gpus=2), pod_obj("x", "p4", "a", gpus=4)]
    shares = attribute(snapshot_from(NOW, [node], pods, {}, []), {"a": 32.7726})
    # 3277 cents over 1, 2, 4 and 1 idle eighths: 409.625, 819.25, 1638.5, 409.625 -> the two .625 get a cent.
    assert per_pod(shares) == {"p1": 410, "p2": 819, "p4": 1638, IDLE_CAPACITY: 410}
    assert {s.sharing for s in shares} == {"whole"} and cluster_cents(shares) == 3277


def test_mig_mixed_slices_weigh_their_compute_slices_and_a_layouts_stranded_slices_are_idle():
    # p4de.24xlarge: 8 A100 80GB; one GPU as 2 x 3g.40gb, one as 7 x 1g.10gb, six whole.
    node = node_obj("m", "i-2", gpus=6, instance_type="p4de.24xlarge",
                    mig={"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 7},
                    labels=gfd("NVIDIA-A100-SXM4-80GB", 8, 81920, {"mig.strategy": "mixed", "mig-3g.40gb.count": "2",
                                                                          "mig-1g.10gb.count": "7"}))
    pods = [pod_obj("a", "s3", "m", resource="nvidia.com/mig-3g.40gb"),
            pod_obj("b", "s1x2", "m", gpus=2, resource="nvidia.com/mig-1g.10gb"),
            pod_obj("c", "w4", "m", gpus=4)]
    snap = snapshot_from(NOW, [node], pods, {}, [])
    assert node_sharing(snap.nodes[0]).physical_gpus == 8  # GFD's gpu.count, not the 15 advertised devices
    shares = attribute(snap, {"m": 40.966})
    assert {s.pod: s.gpus for s in shares} == {"s3": Fraction(3, 7), "s1x2": Fraction(2, 7), "w4": 4,
                                               "": Fraction(23, 7)}
    # 4097 cents in 56ths: 3 -> 219.48, 2 -> 146.32, 28 -> 2048.5, 23 (idle) -> 1682.70; .70 and .5 get a cent.
    assert per_pod(shares) == {"s3": 219, "s1x2": 146, "w4": 2049, IDLE_CAPACITY: 1683}
    assert sum(per_pod(shares).values()) == cents_of(40.966)


def test_mig_single_strategy_prices_each_nvidia_gpu_as_its_profile():
    # p5.48xlarge-like node, two H100s in all-1g.10gb: GFD says 14 devices of product <GPU>-MIG-1g.10gb.
    node = node_obj("s", "i-3", gpus=14, labels=gfd("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 14, 9856,
                                                    {"mig.strategy": "single"}))
    pods = [pod_obj("a", f"p{i}", "s") for i in range(3)]
    shares = attribute(snapshot_from(NOW, [node], pods, {}, []), {"s": 24.0})
    assert node_sharing(snapshot_from(NOW, [node], [], {}, []).nodes[0]).physical_gpus == 2
    # 2400 cents in 14ths: 1/14 each = 171.43 x3, idle 11/14 = 1885.71; floors 2398, the two spare cents go to
    # the idle row (.71) and the first pod (.43, the tie to the earlier).
    assert per_pod(shares) == {"p0": 172, "p1": 171, "p2": 171, IDLE_CAPACITY: 1886}


@pytest.mark.parametrize("labels", [
    gfd("Tesla-T4-SHARED", 4, 15360, {"gpu.replicas": "4"}),  # GFD's replicas label
    gfd("Tesla-T4-SHARED", 4, 15360),  # no replicas label: 16 advertised over 4 physical
    gfd("Tesla-T4-SHARED", 4, 15360, {"gpu.replicas": "4", "gpu.sharing-strategy": "time-slicing"}),
])
def test_time_sliced_replicas_are_a_share_of_a_physical_gpu(labels):
    node = node_obj("t", "i-4", gpus=16, instance_type="g4dn.12xlarge", labels=labels)
    pods = [pod_obj("a", f"r{i}", "t") for i in range(5)] + [pod_obj("b", "r2x", "t", gpus=2)]
    snap = snapshot_from(NOW, [node], pods, {}, [])
    assert node_sharing(snap.nodes[0], snap.pods_on("t")).replicas == 4
    shares = attribute(snap, {"t": 3.912})
    # 391 cents in 16ths: 1 -> 24.4375 (x5), 2 -> 48.875, 9 idle -> 219.9375; sum of floors 387, the four
    # largest remainders (.9375 idle, .875, then the first two .4375) get a cent.
    assert per_pod(shares) == {"r0": 25, "r1": 25, "r2": 24, "r3": 24, "r4": 24, "r2x": 49, IDLE_CAPACITY: 220}
    assert {s.sharing for s in shares} == {"time-slicing"}
    # Over a day the same shares, still to the cent.
    assert cluster_cents(attribute(snap, {"t": 3.912}, hours=24.0)) == cents_of(3.912 * 24)


def test_mps_replicas_share_like_time_slicing_and_say_per_pod_activity_does_not_exist():
    node = node_obj("g", "i-5", gpus=10, instance_type="g5.xlarge",
                    labels=gfd("NVIDIA-A10G-SHARED", 1, 23028, {"gpu.replicas": "10", "gpu.sharing-strategy": "mps"}))
    pods = [pod_obj("a", f"m{i}", "g") for i in range(3)]
    snap = snapshot_from(NOW, [node], pods, {}, [])
    shares = attribute(snap, {"g": 1.006})
    assert per_pod(shares) == {"m0": 10, "m1": 10, "m2": 10, IDLE_CAPACITY: 71}  # 10.1 x3, 70.7
    assert {s.sharing for s in shares} == {"mps"}
    reason = shared_gpu_reason(snap.nodes[0], snap)
    assert reason.startswith("per-pod GPU activity does not exist") and "mps (10 replicas per GPU)" in reason


def test_hami_share_is_the_larger_of_memory_and_cores(kapi_cluster, tmp_path):
    """Read through the official client from a real kube-apiserver (tests/kapi.py, the service's token bound to the
    shipped ClusterRole): the pods' gpumem / gpucores survive the server's validation and the reader."""
    kube = kapi_cluster
    h = kube.name("h")
    kube.add("nodes", node_obj(h, "i-6", gpus=10, labels=gfd("NVIDIA-A100-SXM4-80GB", 1, 81920)))
    kube.add("pods", hami_pod(kube.ns("ml"), "mem", h, gpumem="20480", gpucores="10"))  # 1/4 of memory > 10%
    kube.add("pods", hami_pod(kube.ns("ml"), "cores", h, gpumem="8192", gpucores="50"))  # 50% of cores > 1/10
    cluster = KubernetesCluster(api_client(str(kube.write_kubeconfig(tmp_path / "kc"))))
    snap = cluster.snapshot(NOW)
    # The field selector is the real server's to evaluate (pods' status.phase is a selectable field).
    assert [(c.query.get("fieldSelector"), c.status) for c in kube.calls("list", "pods")] == [
        ("status.phase!=Succeeded,status.phase!=Failed", 200)]
    assert snap.pods_on(h)[0].gpu_requests == {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192,
                                                 "nvidia.com/gpucores": 50}
    assert snap.pods_on(h)[0].gpu_devices == 1  # MiB and percent are never counted as devices
    shares = attribute(snap, {h: 4.10})
    assert {s.pod: s.gpus for s in shares} == {"cores": Fraction(1, 2), "mem": Fraction(1, 4), "": Fraction(1, 4)}
    # 410 cents: 205, 102.5, 102.5 -> the tie goes to the earlier row (mem).
    assert per_pod(shares) == {"cores": 205, "mem": 103, IDLE_CAPACITY: 102}
    assert {s.sharing for s in shares} == {"hami"} and shared_gpu_reason(snap.nodes[0], snap) is None
    # No gpumem: HAMi gives the vGPU the whole memory, so the pod holds the whole GPU whatever its cores.
    sharing = node_sharing(snap.nodes[0], snap.pods_on(h))
    assert request_share({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30}, sharing) == 1


def test_a_hami_node_by_its_label_prices_a_plain_request_as_a_whole_gpu_not_a_replica():
    """HAMi advertises 10 vGPUs per GPU (deviceSplitCount); a pod asking only nvidia.com/gpu: 1 gets a whole
    GPU's memory by HAMi's default, so it is one GPU, not a tenth as if time-sliced."""
    node = node_obj("h", "i-7", gpus=20, labels={**gfd("NVIDIA-A100-SXM4-80GB", 2, 81920), "gpu": "on"})
    snap = snapshot_from(NOW, [node], [pod_obj("ml", "plain", "h")], {}, [])
    assert node_sharing(snap.nodes[0], snap.pods_on("h")).mode == "hami"
    assert {s.pod: s.gpus for s in attribute(snap, {"h": 8.2})} == {"plain": 1, "": 1}


def test_idle_capacity_per_node_pool_with_the_sharing_modes():
    nodes = [node_obj("a", "i-1", gpus=8, labels={**gfd("NVIDIA-A100-SXM4-40GB", 8, 40960),
                                                  "karpenter.sh/nodepool": "train"}),
             node_obj("t", "i-4", gpus=16, labels={**gfd("Tesla-T4-SHARED", 4, 15360, {"gpu.replicas": "4"}),
                                                   "eks.amazonaws.com/nodegroup": "infer-t4"}),
             node_obj("n", "i-9", gpus=1)]
    pods = [pod_obj("ml", "p4", "a", gpus=4), pod_obj("web", "r", "t"), pod_obj("web", "w", "n")]
    shares = attribute(snapshot_from(NOW, nodes, pods, {}, []), {"a": 32.7726, "t": 3.912, "n": 1.006})
    rows = {r["nodepool"]: r for r in cost_by(shares, "nodepool")}
    assert {k: (r["cents"], r["idle_cents"], r["idle_gpus"], r["sharing"]) for k, r in rows.items()} == {
        "train": (3277, 1638, 4.0, "whole"),  # 3277 / 2 = 1638.5: the tie goes to the pod's row
        "infer-t4": (391, 367, 3.75, "time-slicing"),  # 1/16 of 391 = 24.4375 -> 24, idle 366.5625 -> 367
        "(no node pool)": (101, 0, 0.0, "whole"),
    }
    by_ns = {r["namespace"]: r for r in cost_by(shares, "namespace")}
    assert by_ns["web"]["sharing"] == "time-slicing,whole" and by_ns["web"]["gpus"] == 1.25
    assert sum(r["cents"] for r in rows.values()) == cluster_cents(shares) == 3277 + 391 + 101


def test_costs_by_nodepool_command_shows_sharing_and_idle_capacity(kapi_cluster, tmp_path, capsys):
    """`gpufinops costs` against a real kube-apiserver (tests/kapi.py), as the shipped ClusterRole lets it read."""
    from gpufinops.cli.app import main

    kube = kapi_cluster
    kube.add("nodes", node_obj(kube.name("a"), "i-1", gpus=8, labels={**gfd("NVIDIA-A100-SXM4-40GB", 8, 40960),
                                                                      "karpenter.sh/nodepool": "train"}))
    kube.add("nodes", node_obj(kube.name("t"), "i-4", gpus=16, instance_type="g5.12xlarge",
                               labels={**gfd("NVIDIA-A10G-SHARED", 4, 23028, {"gpu.replicas": "4"}),
                                       "eks.amazonaws.com/nodegroup": "infer"}))
    for name, node, n in (("big", "a", 4), ("small", "t", 2)):
        kube.add("pods", pod_obj(kube.ns("ml"), name, kube.name(node), gpus=n))
    kube.write_kubeconfig(tmp_path / "kc")
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text("kubernetes:\n  kubeconfig: kc\n")
    code = main(["--config", str(cfg), "costs", "--month", f"{datetime.now(timezone.utc):%Y-%m}", "--by",
                 "nodepool", "--output", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {r["nodepool"]: r for r in json.loads(out)["rows"]}
    # The bundled on-demand catalog: p4d.24xlarge 21.957642 $/h (2196 cents), g5.12xlarge 5.672 (567 cents).
    # train: 4 of 8 GPUs -> 1098 / 1098; infer: 2 of 16 replicas (half of one of 4 GPUs) -> 70.875 and 496.125.
    assert {k: (r["usd_per_hour"], r["idle_usd_per_hour"], r["idle_gpus"], r["sharing"], r["pods"])
            for k, r in rows.items()} == {"train": (21.96, 10.98, 4.0, "whole", 1),
                                          "infer": (5.67, 4.96, 3.5, "time-slicing", 1)}
    assert [c.resource for c in kube.calls("list")][:3] == ["nodes", "namespaces", "pods"]
