"""The GPUs of a GCE VM, from its machine type or its attached accelerators: a small bundled table.

Sources (read 2026-12): cloud.google.com/compute/docs/accelerator-optimized-machines (A2, A3, A4, A4X, G2, G4: the
GPU model and count of each machine type) and cloud.google.com/compute/docs/gpus (the accelerator types attached to
N1 VMs, `guestAccelerators[].acceleratorType`). GPU names are the catalog's (gpufinops/data/catalog/gpus.csv), so a
VM's GPU prices and sizes like an EC2 instance's.

A VM is a GPU VM when it has guest accelerators or its machine type is accelerator-optimised; an
accelerator-optimised type missing here (a family newer than this table) is still a GPU VM, its GPU unknown (never
dropped from the listing: an unlisted VM is one nobody judges).

Pure, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

# Machine-type series whose VMs come with GPUs attached.
ACCELERATOR_SERIES = ("a2-", "a3-", "a4-", "a4x-", "g2-", "g4-")

# (machine-type prefix, GPU, memory GiB per GPU); the count is the type's `-<N>g` suffix, else COUNT_BY_TYPE.
_FAMILIES: tuple[tuple[str, str, float], ...] = (
    ("a2-highgpu-", "A100-40GB", 40.0),
    ("a2-megagpu-", "A100-40GB", 40.0),
    ("a2-ultragpu-", "A100-80GB", 80.0),
    ("a3-highgpu-", "H100", 80.0),
    ("a3-megagpu-", "H100", 80.0),
    ("a3-edgegpu-", "H100", 80.0),
    ("a3-ultragpu-", "H200", 141.0),
    ("a4-highgpu-", "B200", 180.0),
    ("a4x-highgpu-", "GB200", 186.0),
    ("g2-standard-", "L4", 24.0),
    ("g4-standard-", "RTX-PRO-6000", 96.0),
)
# Types whose name does not end in the GPU count.
COUNT_BY_TYPE = {
    "g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1, "g2-standard-32": 1,
    "g2-standard-24": 2, "g2-standard-48": 4, "g2-standard-96": 8,
    "g4-standard-48": 1, "g4-standard-96": 2, "g4-standard-192": 4, "g4-standard-384": 8,
}
# Accelerator types attachable to N1 (and named in guestAccelerators of every GPU VM).
ACCELERATOR_TYPES: dict[str, tuple[str, float]] = {
    "nvidia-tesla-t4": ("T4", 16.0), "nvidia-tesla-t4-vws": ("T4", 16.0),
    "nvidia-tesla-p4": ("P4", 8.0), "nvidia-tesla-p4-vws": ("P4", 8.0),
    "nvidia-tesla-p100": ("P100", 16.0), "nvidia-tesla-p100-vws": ("P100", 16.0),
    "nvidia-tesla-v100": ("V100-16GB", 16.0),
    "nvidia-tesla-a100": ("A100-40GB", 40.0), "nvidia-a100-80gb": ("A100-80GB", 80.0),
    "nvidia-l4": ("L4", 24.0), "nvidia-l4-vws": ("L4", 24.0),
    "nvidia-h100-80gb": ("H100", 80.0), "nvidia-h100-mega-80gb": ("H100", 80.0),
    "nvidia-h200-141gb": ("H200", 141.0), "nvidia-b200": ("B200", 180.0), "nvidia-gb200": ("GB200", 186.0),
    "nvidia-rtx-pro-6000": ("RTX-PRO-6000", 96.0),
}
_COUNT_SUFFIX = re.compile(r"-(\d+)g$")


@dataclass(frozen=True)
class Gpus:
    count: int
    model: str  # "" when not known
    memory_gib: float  # per GPU; 0 when not known


def is_accelerator_type(machine_type: str) -> bool:
    return machine_type.startswith(ACCELERATOR_SERIES)


def gpus_of(machine_type: str, accelerators: Iterable[tuple[str, int]] = ()) -> Gpus | None:
    """The GPUs of a VM of `machine_type` with these (accelerator type, count) attached; None when it has none.
    Attached accelerators say it first (GCE lists them on accelerator-optimised VMs too); the table the rest."""
    attached = [(t, n) for t, n in accelerators if n > 0]
    if attached:
        count = sum(n for _, n in attached)
        model, memory = ACCELERATOR_TYPES.get(attached[0][0], ("", 0.0))
        return Gpus(count, model, memory)
    if not is_accelerator_type(machine_type):
        return None
    for prefix, model, memory in _FAMILIES:
        if machine_type.startswith(prefix):
            m = _COUNT_SUFFIX.search(machine_type)
            count = int(m.group(1)) if m else COUNT_BY_TYPE.get(machine_type, 0)
            return Gpus(count, model, memory)
    return Gpus(0, "", 0.0)
