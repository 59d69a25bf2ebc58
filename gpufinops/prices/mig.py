"""MIG (Multi-Instance GPU) profiles of the GPU models right-sizing can split, and the smallest one a job fits.

Per catalog GPU key, the GPU instance profiles of NVIDIA's MIG user guide ("Supported MIG Profiles": A100-SXM4
40GB/80GB, H100-SXM5 80GB, H200-SXM5 141GB, B200 180GB, A30 24GB), each with its compute slices (of 7; A30 of 4),
memory slices (of 8; A30 of 4) and SMs (B200 and A30: the guide's fraction of SMs, see the table).
SM counts: A100 108 SMs, a 1g slice 14 (7g: 98); GH100 (H100 SXM, H200) 132 SMs, 1g 16, 2g 32, 3g 60, 4g 64 (seen
in ../shared/data/nvidia_smi/captures_raw/linux-x86_64__nvidia-h100-mig__590.48.01.txt: 3g.40gb 60 SMs, 2g.20gb 32,
1g.10gb 16). H100 PCIe/NVL and GH200 have other SM counts and are not listed: no MIG choice for them.

DCGM_FI_PROF_SM_ACTIVE is measured over all the SMs of the whole GPU, so a job whose SM activity stays at 12% needs
about 12% of the GPU's SMs: a profile fits when its SMs / the GPU's SMs hold the p95 SM activity with the compute
headroom, its memory holds the peak with the memory headroom (profile GB x usable_memory_fraction, the same rule as a
whole GPU), and, where DCGM_FI_PROF_DRAM_ACTIVE is exported, its share of the memory bandwidth (memory slices / 8)
holds the p95 DRAM activity. Pure data and arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

COMPUTE_SLICES = 7  # a MIG-capable A100 / H100 / H200 / B200 splits into at most 7 compute slices...
MEMORY_SLICES = 8  # ...and 8 memory slices (one eighth of the memory and of its bandwidth each); an A30 into 4 and 4


@dataclass(frozen=True)
class MigProfile:
    name: str  # "2g.20gb"
    compute_slices: int  # of COMPUTE_SLICES
    memory_slices: int  # of MEMORY_SLICES
    memory_gb: float  # the GB in its name: what the slice's processes see, before the usable fraction
    sms: int
    gpu_sms: int  # SMs of the whole GPU (not in MIG mode): what SM activity is a share of
    gpu_compute_slices: int = COMPUTE_SLICES  # the GPU's own geometry (A30: 4 and 4)
    gpu_memory_slices: int = MEMORY_SLICES

    @property
    def sm_share(self) -> float:
        return self.sms / self.gpu_sms

    @property
    def share(self) -> float:
        """The part of the GPU it takes from others: its compute or its memory slices, whichever is more (a
        1g.20gb takes a quarter of the memory, so no more than four fit)."""
        return max(self.compute_slices / self.gpu_compute_slices, self.memory_slices / self.gpu_memory_slices)

    @property
    def bandwidth_share(self) -> float:
        return self.memory_slices / self.gpu_memory_slices

    @property
    def whole_gpu(self) -> bool:
        return self.compute_slices >= self.gpu_compute_slices


def _profiles(gb: tuple[float, float, float, float, float, float], sms: tuple[int, ...], gpu_sms: int
              ) -> tuple[MigProfile, ...]:
    shapes = ((1, 1), (1, 2), (2, 2), (3, 4), (4, 4), (7, 8))  # (compute, memory) slices of the six profiles
    return tuple(MigProfile(f"{c}g.{g:g}gb", c, m, g, s, gpu_sms) for (c, m), g, s in zip(shapes, gb, sms))


# Smallest first (by the share of the GPU they take, then compute).
MIG_PROFILES: dict[str, tuple[MigProfile, ...]] = {
    "A100-40GB": _profiles((5, 10, 10, 20, 20, 40), (14, 14, 28, 42, 56, 98), 108),
    "A100-80GB": _profiles((10, 20, 20, 40, 40, 80), (14, 14, 28, 42, 56, 98), 108),
    "H100": _profiles((10, 20, 20, 40, 40, 80), (16, 16, 32, 60, 64, 132), 132),
    "H200": _profiles((18, 35, 35, 71, 71, 141), (16, 16, 32, 60, 64, 132), 132),
    # B200 (180 GB): 1g.23gb x7, 1g.45gb x4, 2g.45gb x3, 3g.90gb x2, 4g.90gb x1, 7g.180gb x1, the A100/H100 shapes
    # (NVIDIA MIG user guide, "Supported MIG Profiles"; the same names in AWS's p6-b200 MIG list). Its SM counts per
    # slice were not verified here, so its SM share is the guide's fraction form, compute slices of 7 (sms = slices,
    # gpu_sms = 7), not an SM count.
    "B200": _profiles((23, 45, 45, 90, 90, 180), (1, 1, 2, 3, 4, 7), 7),
    # A30 (24 GB): 4 compute and 4 memory slices. NVIDIA MIG user guide, "Supported MIG Profiles", A30-24GB table:
    # 1g.6gb (1/4 of the memory and of the SMs, 4 instances), 2g.12gb (2/4, 2), 4g.24gb (full, 1); the +me
    # variants are the same slices with media engines. SM share in the guide's fraction form (of 4).
    "A30": tuple(MigProfile(f"{c}g.{g}gb", c, c, float(g), c, 4, gpu_compute_slices=4, gpu_memory_slices=4)
                 for c, g in ((1, 6), (2, 12), (4, 24))),
}


def gpu_key_of_product(product: str) -> str:
    """The table's key for GFD's nvidia.com/gpu.product ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-H200"); "" when the table has none."""
    p = product.upper()
    if "B200" in p:
        return "B200"
    if "A30" in p.replace("-", " ").split():  # "NVIDIA-A30", "NVIDIA-A30-MIG-1g.6gb"; never "A300"
        return "A30"
    if "H200" in p:
        return "H200"
    if "H100" in p:
        return "H100"
    if "A100" in p:
        return "A100-40GB" if "40GB" in p else "A100-80GB"
    return ""


def compute_share(gpu_key: str, profile: str) -> tuple[int, int]:
    """(compute slices, slices of the whole GPU) of a MIG profile name ("3g.40gb", "2g.12gb+me"): from the GPU's
    table, else any table naming the profile, else the name's "<n>g" of 7 (a GPU the table does not list)."""
    profile = profile.removesuffix("+me")
    tables = [MIG_PROFILES.get(gpu_key, ()), *MIG_PROFILES.values()]
    for table in tables:
        for p in table:
            if p.name == profile:
                return p.compute_slices, p.gpu_compute_slices
    head = profile.split("g.", 1)[0]
    return (int(head) if head.isdigit() else 1), COMPUTE_SLICES


@dataclass(frozen=True)
class GpuNeed:
    """What one working GPU used over the window (ratios 0..1, memory in MiB)."""

    gpu: str
    mem_max_mib: float
    sm_p95: float
    dram_p95: float | None = None


def smallest_fit(gpu_key: str, need: GpuNeed, memory_headroom: float, compute_headroom: float,
                 usable_memory_fraction: float) -> MigProfile | None:
    """The smallest profile of `gpu_key` that holds `need` with headroom; None when the GPU has no MIG profiles
    here or only the whole GPU (7g) fits."""
    for p in sorted(MIG_PROFILES.get(gpu_key, ()), key=lambda p: (p.share, p.compute_slices)):
        if p.whole_gpu:
            return None  # the whole GPU: no slice to give away
        if p.memory_gb * 1024.0 * usable_memory_fraction < need.mem_max_mib * (1 + memory_headroom):
            continue
        if p.sm_share < need.sm_p95 * (1 + compute_headroom):
            continue
        if need.dram_p95 is not None and p.bandwidth_share < need.dram_p95 * (1 + compute_headroom):
            continue
        return p
    return None


__all__ = ["COMPUTE_SLICES", "GpuNeed", "MEMORY_SLICES", "MIG_PROFILES", "MigProfile", "compute_share",
           "gpu_key_of_product", "smallest_fit"]
