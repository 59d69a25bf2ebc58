"""GPU catalog: GPU models and priced GPU instance types across providers.

The catalog ships as two small CSVs under gpufinops/data/catalog/ (gpus.csv,
instances.csv), produced offline by tools/build_catalog.py from the public
snapshots in shared/data/gpu_specs and shared/data/gpu_prices (see SOURCES.md
there); this module is the run-time side and imports nothing from tools/.
`load_catalog()` reads them, skipping bad rows with a count and a
"file:line: why" for each (or raising in strict mode). AWS prices can be
refreshed from the EC2/Pricing APIs into a timestamped cache that overlays the
bundled prices; every price carries the date it was true on, so a
recommendation can say how old its prices are.

Units: memory_gb is the vendor's nominal per-GPU memory (an "80GB" A100 has
80 GiB of device memory); TFLOPS are dense (no sparsity) tensor-core figures.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Iterable, Protocol, Sequence

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "catalog"
GPUS_FILE = "gpus.csv"
INSTANCES_FILE = "instances.csv"
# Prices of parts a VM is billed as (GCE N1: its machine type, then each attached GPU); optional in a catalog folder.
PARTS_FILE = "gcp_parts.csv"

GPU_COLUMNS = ("gpu", "vendor", "memory_gb", "bf16_tflops", "fp8_tflops", "tdp_w", "source")
INSTANCE_COLUMNS = (
    "provider", "instance_type", "region", "gpu", "gpu_count", "gpu_memory_gb", "vcpus", "memory_gib",
    "on_demand_usd_h", "spot_usd_h", "commit_usd_h", "prices_as_of", "source",
)
PART_COLUMNS = ("part", "name", "region", "vcpus", "memory_gib", "on_demand_usd_h", "spot_usd_h", "prices_as_of",
                "source")
PART_KINDS = ("machine", "gpu")  # a machine type without GPUs; one attached GPU


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
    raise UnknownGpuError(f"unknown GPU name {name!r} (normalised {s!r}); add it to catalog._GPU_PATTERNS and "
                          "tools/build_catalog.py, then rebuild gpus.csv")


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
class PartPrice:
    """One billed part of a GCE VM in one region: a machine type on its own ("machine", e.g. n1-standard-8) or one
    attached GPU ("gpu", named as gpus.csv and places/gcp/machines.py name it: T4, V100-16GB, P100, P4)."""

    part: str
    name: str
    region: str
    vcpus: float | None
    memory_gib: float | None
    on_demand_usd_h: float
    spot_usd_h: float | None = None
    prices_as_of: date | None = None
    source: str = ""


@dataclass(frozen=True)
class Catalog:
    gpus: dict[str, GpuSpec]
    offers: tuple[InstanceOffer, ...]
    skipped: tuple[str, ...] = ()  # "file:line: why" for every row left out
    refreshed_at: datetime | None = None  # when AWS prices were last refreshed from the API
    parts: tuple[PartPrice, ...] = ()

    @cached_property
    def _parts_index(self) -> dict[tuple[str, str, str], PartPrice]:
        return {(p.part, p.name, p.region): p for p in self.parts}

    def part(self, part: str, name: str, region: str) -> PartPrice | None:
        return self._parts_index.get((part, name, region))

    def price_from_parts(self, machine_type: str, region: str, attached: Sequence[tuple[str, int]], spot: bool
                         ) -> tuple[float | None, str]:
        """The hourly price of a VM billed in parts (GCE N1 with attached GPUs): its machine type's own price plus
        count x each attached GPU's, all in its region, spot or on-demand. `attached` holds (catalog GPU name, count);
        a name "" is a GPU nobody mapped. Returns (price, what it is made of) or (None, why it is unpriced): a part
        not known never counts as $0."""
        kind = "spot" if spot else "on-demand"
        machine = self.part("machine", machine_type, region)
        if machine is None:
            return None, f"unpriced: no bundled price of machine type {machine_type} in {region}"
        prices = [(machine_type, machine, 1)]
        for gpu, count in attached:
            if not gpu:
                return None, "unpriced: its attached GPU is not one gpufinops knows"
            each = self.part("gpu", gpu, region)
            if each is None:
                return None, f"unpriced: no bundled price of an attached {gpu} in {region}"
            prices.append((gpu, each, count))
        total = 0.0
        for name, p, count in prices:
            price = p.spot_usd_h if spot else p.on_demand_usd_h
            if price is None:
                return None, f"unpriced: no {kind} price of {name} in {region}"
            total += count * price
        dates = sorted({str(p.prices_as_of) for _, p, _ in prices if p.prices_as_of})
        made_of = " + ".join(name if n == 1 else f"{n} × {name}" for name, _, n in prices)
        return round(total, 6), f"{made_of}, {kind}, priced in parts (GCE bills them apart) as of {', '.join(dates)}"

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


def _parse_part(row: dict) -> PartPrice:
    part = (row.get("part") or "").strip()
    if part not in PART_KINDS:
        raise ValueError(f"column 'part': {part!r} is not one of {', '.join(PART_KINDS)}")
    name, region = (row.get("name") or "").strip(), (row.get("region") or "").strip()
    if not name or not region:
        raise ValueError("columns 'name' and 'region' are required")
    as_of_raw = (row.get("prices_as_of") or "").strip()
    try:
        as_of = date.fromisoformat(as_of_raw) if as_of_raw else None
    except ValueError:
        raise ValueError(f"column 'prices_as_of': {as_of_raw!r} is not an ISO date") from None
    return PartPrice(part, name, region, _num(row, "vcpus", required=False), _num(row, "memory_gib", required=False),
                     _num(row, "on_demand_usd_h", required=True), _num(row, "spot_usd_h", required=False), as_of,
                     (row.get("source") or "").strip())


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
    parts: list[PartPrice] = []
    parts_file = folder / PARTS_FILE
    if parts_file.is_file():  # optional: a catalog folder without it prices no VM from parts
        for line, row in _read_rows(parts_file, PART_COLUMNS):
            try:
                parts.append(_parse_part(row))
            except ValueError as exc:
                bad(parts_file, line, exc)
    return Catalog(gpus=gpus, offers=tuple(offers), skipped=tuple(skipped), parts=tuple(parts))


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


class PriceCache(Protocol):
    """A refreshed price cache (AwsRefresh, prices.gcp_refresh.GcpRefresh) as save_refresh writes it."""

    def to_json(self) -> str: ...


def save_refresh(cache: PriceCache, path: str | Path) -> None:
    """A refreshed price cache written atomically: a crash never leaves half a cache."""
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
