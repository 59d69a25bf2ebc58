"""Verdicts per Kubernetes workload, and GPU nodes no pod used. Pure: no I/O, no clock of its own.

A workload (k8s.model.WorkloadRef) is judged by the very `evaluate()` instances are judged by, over the GPUs of
all its replicas: its subject is a GpuInstance named `namespace/Kind/name` whose GPU count is what its pods
request, and its usage is the pods' GPUs side by side (each named `pod:gpu`). So the same rules hold: IDLE
only when every GPU of every replica meets the rule for the whole window; a pod whose GPU series are missing
leaves GPUs unseen and makes the workload UNKNOWN (the reason names the pod); a replica started within the
window makes it too young to judge. Reasons begin with the workload's name.

Nodes are never stopped: a GPU node that ran no GPU pod for the window is reported with its node group or
NodePool, what to change there, and its cost (`empty_gpu_nodes`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Mapping, Sequence

from ..k8s.model import PodInfo, WorkloadRef
from ..model import InstanceUsage

PodKey = tuple[str, str]
_EPOCH = datetime.min.replace(tzinfo=timezone.utc)


def workload_usage(ref: WorkloadRef, pods: Sequence[PodInfo], by_pod: Mapping[PodKey, InstanceUsage],
                   window_s: int) -> tuple[InstanceUsage, tuple[str, ...]]:
    """The pods' GPUs side by side (`pod:gpu`, a MIG slice `pod:gpu.instance` so that each device counts once)
    and the pods that had none. A failed read of any pod is the workload's error."""
    gpus, missing, expected = [], [], 0
    for pod in pods:
        usage = by_pod.get(pod.key)
        if usage is None:
            return InstanceUsage(str(ref), window_s, expected, (), error="no usage collected"), ()
        if usage.error:
            return InstanceUsage(str(ref), window_s, usage.expected_samples, (), error=usage.error), ()
        expected = usage.expected_samples
        if not usage.gpus:
            missing.append(pod.name)
        gpus.extend(replace(g, gpu=f"{pod.name}:{g.gpu.replace('/', '.')}") for g in usage.gpus)
    return InstanceUsage(str(ref), window_s, expected, tuple(gpus)), tuple(missing)


# --------------------------------------------------------------------------- nodes
