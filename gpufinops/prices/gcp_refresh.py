"""GCP GPU VM prices refreshed from the Cloud Billing Catalog API, only when asked (`recommend --refresh-prices` with
a `gcp:` section): the bundled prices (gpufinops/data/catalog, SkyPilot-format files of 2026-05-20) stay the default.

The Catalog lists Compute Engine's SKUs (service 6F81-5844-456A: GET /v1/services/6F81-5844-456A/skus, paged by
nextPageToken). GCE bills a GPU VM in parts, each its own SKU with the regions it applies to (`serviceRegions`) and a
price per unit (`pricingInfo[0].pricingExpression.tieredRates[].unitPrice`, USD units + nanos):
- its vCPUs: "<SERIES> Instance Core running in <place>" (per vCPU-hour; N1: "N1 Predefined Instance Core ..."),
- its memory: "<SERIES> Instance Ram running in <place>" (per GiB-hour; N1: "N1 Predefined Instance Ram ..."),
- its GPUs: "Nvidia <GPU> GPU running in <place>" (per GPU-hour; an N1 VM's attached T4: "Nvidia Tesla T4 GPU"),
each with a "Spot Preemptible ..." twin (usageType Preemptible; a GPU's reads "Nvidia <GPU> GPU attached to Spot
Preemptible VMs running in <place>"). These are the descriptions GCE's own billing export carries (tests/data/focus/
gcp_focus_view_gpu.csv: "A2 Instance Core running in Americas", "Nvidia Tesla A100 GPU running in Americas").
A machine type's price is vCPUs x core + GiB x RAM + GPUs x GPU, its vCPUs and memory from the bundled catalog row;
the parts an N1 VM with attached GPUs is priced from (catalog.parts: its machine type, each GPU) are refreshed alike.
A type any part of which is not found keeps its bundled price (said in `kept`): never a price made of guesses.

Pure but for `fetch`, the one page reader the caller gives (an authorized session's GET). Imports prices.catalog.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .catalog import Catalog, CatalogError, InstanceOffer, PartPrice

COMPUTE_SERVICE = "6F81-5844-456A"
# The machine-type series priced from parts, and the word their SKUs use ("N1 Predefined Instance Core running in
# Americas": N1's predefined types; a custom N1 type bills other SKUs and is not priced).
SERIES = {"a2": "A2", "a3": "A3", "g2": "G2", "n1": "N1"}
# The catalog's GPU name -> the name in the GPU SKU's description ("Nvidia Tesla T4 GPU running in Americas", "Nvidia
# Tesla T4 GPU attached to Spot Preemptible VMs running in Americas"). A4 (B200), A4X (GB200) and G4 (RTX PRO 6000)
# are not here: their GPU SKUs' wording could not be confirmed from a published source, so none is matched by a
# guess (and none has a bundled row to refresh: the snapshot's A4 host price is $0, A4X and G4 are absent). "Tesla P4"
# follows the T4's, V100's and P100's published wording; a miss only keeps the bundled P4 price.
GPU_SKU_NAME = {"L4": "L4", "A100-40GB": "Tesla A100", "A100-80GB": "A100 80GB", "H100": "H100 80GB",
                "T4": "Tesla T4", "V100-16GB": "Tesla V100", "P100": "Tesla P100", "P4": "Tesla P4"}
_PART = re.compile(r"^(?:Spot Preemptible )?(\w+)(?: Predefined)? Instance (Core|Ram) running in ")
_GPU = re.compile(r"^Nvidia (.+?) GPU (?:attached to Spot Preemptible VMs )?running in ")


@dataclass(frozen=True)
class GcpRefresh:
    fetched_at: datetime
    # "machine_type@region" -> {"on_demand": USD/h, "spot": USD/h or absent}
    prices: dict[str, dict[str, float]] = field(default_factory=dict)
    kept: tuple[str, ...] = ()  # types whose SKUs were not all found: their bundled price kept

    def to_json(self) -> str:
        return json.dumps({"fetched_at": self.fetched_at.isoformat(), "prices": self.prices,
                           "kept": list(self.kept)}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "<cache>") -> "GcpRefresh":
        try:
            d = json.loads(text)
            fetched = datetime.fromisoformat(d["fetched_at"])
            prices = {str(k): {p: float(v) for p, v in dict(row).items()} for k, row in dict(d["prices"]).items()}
            return cls(fetched if fetched.tzinfo else fetched.replace(tzinfo=timezone.utc), prices,
                       tuple(d.get("kept", ())))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CatalogError(f"{source}: unreadable GCP price cache: {exc}") from None


def unit_price(sku: Mapping[str, Any]) -> float | None:
    """USD per unit of a SKU's current price (its last tier: the one a running VM's hours fall in); None when it
    has none in USD."""
    try:
        rates = sku["pricingInfo"][0]["pricingExpression"]["tieredRates"]
        price = rates[-1]["unitPrice"]
        if price.get("currencyCode", "USD") != "USD":
            return None
        return int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def parts_from_skus(skus: Iterable[Mapping[str, Any]], regions: set[str]) -> dict[tuple, float]:
    """(kind, name, region, spot) -> USD/unit, kind "core" | "ram" (name: the series word) or "gpu" (name: the
    GPU's SKU name), for the wanted regions."""
    parts: dict[tuple, float] = {}
    for sku in skus:
        category = sku.get("category") or {}
        usage = category.get("usageType")
        if category.get("resourceFamily") != "Compute" or usage not in ("OnDemand", "Preemptible"):
            continue
        description = str(sku.get("description") or "")
        m, g = _PART.match(description), _GPU.match(description)
        if m:
            key = ("core" if m.group(2) == "Core" else "ram", m.group(1))
        elif g:
            key = ("gpu", g.group(1))
        else:
            continue
        price = unit_price(sku)
        if price is None:
            continue
        for region in set(sku.get("serviceRegions") or ()) & regions:
            parts[(*key, region, usage == "Preemptible")] = price
    return parts


def machine_prices(parts: Mapping[tuple, float], offers: Iterable[InstanceOffer]
                   ) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The price of each bundled GCP offer from its parts; (prices, the types kept at their bundled price)."""
    prices: dict[str, dict[str, float]] = {}
    kept: list[str] = []
    for offer in offers:
        series = SERIES.get(offer.instance_type.split("-", 1)[0])
        gpu = GPU_SKU_NAME.get(offer.gpu)
        key = f"{offer.instance_type}@{offer.region}"
        if series is None or gpu is None or not offer.vcpus or not offer.memory_gib:
            kept.append(key)
            continue
        row = {}
        for spot, name in ((False, "on_demand"), (True, "spot")):
            core = parts.get(("core", series, offer.region, spot))
            ram = parts.get(("ram", series, offer.region, spot))
            each = parts.get(("gpu", gpu, offer.region, spot))
            if None not in (core, ram, each):
                row[name] = round(offer.vcpus * core + offer.memory_gib * ram + offer.gpu_count * each, 6)
        if "on_demand" in row:
            prices[key] = row
        else:
            kept.append(key)
    return prices, kept


def part_prices(parts: Mapping[tuple, float], bundled: Iterable[PartPrice]
                ) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The price of each bundled part (an N1 machine type: vCPUs x core + GiB x RAM; one attached GPU: its SKU),
    keyed "machine:<type>@<region>" / "gpu:<name>@<region>"; (prices, the parts kept at their bundled price)."""
    prices: dict[str, dict[str, float]] = {}
    kept: list[str] = []
    for part in bundled:
        key = f"{part.part}:{part.name}@{part.region}"
        row = {}
        for spot, name in ((False, "on_demand"), (True, "spot")):
            if part.part == "gpu":
                price = parts.get(("gpu", GPU_SKU_NAME.get(part.name), part.region, spot))
            else:
                series = SERIES.get(part.name.split("-", 1)[0])
                core = parts.get(("core", series, part.region, spot))
                ram = parts.get(("ram", series, part.region, spot))
                price = None if None in (core, ram) or not part.vcpus or not part.memory_gib else (
                    part.vcpus * core + part.memory_gib * ram)
            if price is not None:
                row[name] = round(price, 6)
        if "on_demand" in row:
            prices[key] = row
        else:
            kept.append(key)
    return prices, kept


def refresh_from_gcp(fetch: Callable[[str], Mapping[str, Any]], catalog: Catalog, now: datetime,
                     max_pages: int = 200) -> GcpRefresh:
    """Every page of Compute Engine's SKUs (`fetch(page_token)` answers one), then each bundled GCP offer priced
    from its parts. A page that cannot be read raises: a half-read catalog is never saved."""
    offers = [o for o in catalog.offers if o.provider == "gcp"]
    regions = {o.region for o in offers} | {p.region for p in catalog.parts}
    skus: list[Mapping[str, Any]] = []
    token = ""
    for _ in range(max_pages):
        page = fetch(token)
        skus.extend(page.get("skus") or [])
        token = str(page.get("nextPageToken") or "")
        if not token:
            break
    else:
        raise CatalogError(f"the Cloud Billing Catalog still had pages after {max_pages}: not saved")
    parts = parts_from_skus(skus, regions)
    prices, kept = machine_prices(parts, offers)
    from_parts, parts_kept = part_prices(parts, catalog.parts)
    return GcpRefresh(now, {**prices, **from_parts}, tuple(kept + parts_kept))


def with_gcp_refresh(catalog: Catalog, cache: GcpRefresh) -> Catalog:
    """The catalog with each refreshed GCP offer's and part's prices replaced, dated and sourced."""
    as_of = cache.fetched_at.date()
    offers = []
    for o in catalog.offers:
        row = cache.prices.get(f"{o.instance_type}@{o.region}") if o.provider == "gcp" else None
        offers.append(o if row is None else replace(
            o, on_demand_usd_h=row["on_demand"], spot_usd_h=row.get("spot", o.spot_usd_h), prices_as_of=as_of,
            source="cloud-billing-catalog"))
    parts = []
    for p in catalog.parts:
        row = cache.prices.get(f"{p.part}:{p.name}@{p.region}")
        parts.append(p if row is None else replace(
            p, on_demand_usd_h=row["on_demand"], spot_usd_h=row.get("spot", p.spot_usd_h), prices_as_of=as_of,
            source="cloud-billing-catalog"))
    return replace(catalog, offers=tuple(offers), parts=tuple(parts))


def save_gcp_refresh(cache: GcpRefresh, path: str | Path) -> None:
    from .catalog import save_refresh

    save_refresh(cache, path)  # the AWS cache's atomic write: the same file handling for both


def load_gcp_refresh(path: str | Path) -> GcpRefresh | None:
    p = Path(path)
    return GcpRefresh.from_json(p.read_text(), str(p)) if p.is_file() else None
