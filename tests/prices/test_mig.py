"""The MIG profile table of prices/mig.py for A30 and B200 (NVIDIA MIG user guide, "Supported MIG Profiles"): names,
geometry, how many of each fit, the share a cost split gives each slice, and GFD product names."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpufinops.k8s.model import NodeSharing
from gpufinops.places.kubernetes.costs import request_share
from gpufinops.prices.mig import MIG_PROFILES, GpuNeed, compute_share, gpu_key_of_product, smallest_fit


@pytest.mark.parametrize("gpu, expected", [
    ("A30", {"1g.6gb": 4, "2g.12gb": 2, "4g.24gb": 1}),
    ("B200", {"1g.23gb": 7, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1}),
])
def test_the_guides_profiles_and_how_many_of_each_fit_one_gpu(gpu, expected):
    profiles = MIG_PROFILES[gpu]
    assert [p.name for p in profiles] == list(expected)
    # How many instances of a profile fit: limited by compute or memory slices, whichever runs out first.
    fit = {p.name: min(p.gpu_compute_slices // p.compute_slices, p.gpu_memory_slices // p.memory_slices)
           for p in profiles}
    assert fit == expected
    assert profiles[-1].whole_gpu and not any(p.whole_gpu for p in profiles[:-1])


def test_a30_slices_are_quarters_and_b200_sevenths():
    assert compute_share("A30", "1g.6gb") == (1, 4)
    assert compute_share("A30", "2g.12gb+me") == (2, 4)  # the media-extension variant is the same slice
    assert compute_share("B200", "3g.90gb") == (3, 7)
    assert compute_share("B200", "1g.45gb") == (1, 7)
    assert [p.memory_gb for p in MIG_PROFILES["A30"]] == [6, 12, 24]


@pytest.mark.parametrize("product, key", [
    ("NVIDIA-A30", "A30"), ("NVIDIA-A30-MIG-1g.6gb", "A30"), ("NVIDIA-B200", "B200"),
    ("NVIDIA-B200-MIG-1g.23gb", "B200"), ("NVIDIA-H200", "H200"), ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA-A300X", ""), ("Tesla-T4", ""),
])
def test_gfd_product_names_find_their_table(product, key):
    assert gpu_key_of_product(product) == key


def test_cost_shares_of_a30_and_b200_mig_slices_add_up_to_the_gpus():
    a30 = NodeSharing("mig", physical_gpus=1, product="NVIDIA-A30")
    shares = [request_share({"nvidia.com/mig-1g.6gb": 2}, a30), request_share({"nvidia.com/mig-2g.12gb": 1}, a30)]
    assert shares == [Fraction(1, 2), Fraction(1, 2)] and sum(shares) == 1
    b200 = NodeSharing("mig", physical_gpus=1, product="NVIDIA-B200")
    assert request_share({"nvidia.com/mig-3g.90gb": 2, "nvidia.com/mig-1g.23gb": 1}, b200) == 1


def test_right_sizing_picks_the_smallest_b200_and_a30_slice_that_holds_the_job():
    small = GpuNeed("0", mem_max_mib=8_000, sm_p95=0.05)
    assert smallest_fit("B200", small, 0.2, 0.5, 0.9).name == "1g.23gb"
    assert smallest_fit("A30", GpuNeed("0", mem_max_mib=4_000, sm_p95=0.1), 0.2, 0.5, 0.9).name == "1g.6gb"
    assert smallest_fit("A30", GpuNeed("0", mem_max_mib=20_000, sm_p95=0.1), 0.2, 0.5, 0.9) is None  # whole GPU
