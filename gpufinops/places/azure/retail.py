"""The Azure Retail Prices API (https://prices.azure.com/api/retail/prices: public, no sign-in), read only when a
person asks (`tools/refresh_azure_prices.py`): the pay-as-you-go Linux and Spot price of each GPU size in each
region, written as the size table the place reads (`azure.price_file`). No tick ever calls it.

The API answers `{"Items": [...], "NextPageLink": ..., "Count": n}` pages. One query per size
(`armSkuName eq '<size>' and priceType eq 'Consumption'`) answers every region's meters of it: Linux and Windows
(productName ends " Windows"), Spot ("... Spot" skuName) and Low Priority (the retired one) meters, each per hour.
`price_rows` keeps a Linux one per (size, region) and its Spot twin; the GPU model and count come from the bundled
table (the API names no GPU).
"""

from __future__ import annotations

import csv
import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from .sizes import AzureSizes, SizeInfo

RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
API_VERSION = "2023-01-01-preview"
COLUMNS = ("size", "gpu_model", "gpu_count", "region", "usd_per_hour", "spot_usd_per_hour", "as_of")
MAX_PAGES = 50  # per size: one page holds 1,000 meters, a size has a few hundred


class RetailPricesError(RuntimeError):
    """The API did not answer as documented; nothing is written."""


@dataclass(frozen=True)
class Meter:
    size: str
    region: str
    usd_per_hour: float
    spot: bool


def meter_of(item: Mapping[str, Any]) -> Meter | None:
    """A Linux pay-as-you-go or Spot hourly meter of a VM size; None for any other (Windows, Low Priority,
    reservations, DevTest, another currency or unit)."""
    if item.get("type") != "Consumption" or item.get("currencyCode") != "USD":
        return None
    if item.get("serviceName") != "Virtual Machines" or item.get("unitOfMeasure") != "1 Hour":
        return None
    product, sku = str(item.get("productName") or ""), str(item.get("skuName") or "")
    if product.endswith("Windows") or "Low Priority" in sku:
        return None
    try:
        price = float(item["retailPrice"])
    except (KeyError, TypeError, ValueError):
        return None
    size, region = str(item.get("armSkuName") or ""), str(item.get("armRegionName") or "")
    if not size or not region or price <= 0:
        return None
    return Meter(size, region, price, spot=sku.endswith(" Spot"))


def price_rows(items: Iterable[Mapping[str, Any]], sizes: AzureSizes, as_of: str) -> list[dict[str, str]]:
    """The size table's rows from the API's items: one per (size, region) with a Linux pay-as-you-go price, its
    Spot price where there is one. Sizes the bundled table does not know (no GPU model) are left out."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for item in items:
        meter = meter_of(item)
        if meter is None:
            continue
        prices = found.setdefault((meter.size, meter.region), {})
        key = "spot" if meter.spot else "on_demand"
        # Several meters of one kind (a zone's, a sub-region's): the lowest is the one a person pays in the region.
        prices[key] = min(prices.get(key, meter.usd_per_hour), meter.usd_per_hour)
    rows = []
    for (size, region), prices in sorted(found.items()):
        info: SizeInfo | None = sizes.info(size)
        if info is None or "on_demand" not in prices:
            continue
        rows.append({"size": info.size, "gpu_model": info.gpu_model, "gpu_count": f"{info.gpu_share:g}",
                     "region": region, "usd_per_hour": f"{prices['on_demand']:g}",
                     "spot_usd_per_hour": f"{prices['spot']:g}" if "spot" in prices else "", "as_of": as_of})
    return rows


Fetch = Callable[[str], Mapping[str, Any]]


def fetch_json(url: str, timeout_s: float = 30.0) -> Mapping[str, Any]:
    request = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "gpufinops"})
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - an https URL we built
        return json.loads(answer.read(16 * 1024 * 1024))


def size_items(size: str, fetch: Fetch, base_url: str = RETAIL_PRICES_URL) -> list[Mapping[str, Any]]:
    """Every meter of one size, across its NextPageLink pages."""
    query = urllib.parse.urlencode({"api-version": API_VERSION,
                                    "$filter": f"armSkuName eq '{size}' and priceType eq 'Consumption'"})
    url: str | None = f"{base_url}?{query}"
    items: list[Mapping[str, Any]] = []
    for _ in range(MAX_PAGES):
        if not url:
            return items
        page = fetch(url)
        if not isinstance(page.get("Items"), list):
            raise RetailPricesError(f"{url}: no Items list in the answer")
        items.extend(page["Items"])
        url = page.get("NextPageLink") or None
    raise RetailPricesError(f"more than {MAX_PAGES} pages for {size}: refused")


def refresh(out: Path, as_of: str, *, fetch: Fetch = fetch_json, base_url: str = RETAIL_PRICES_URL,
            sizes: AzureSizes | None = None, only: Sequence[str] = ()) -> int:
    """Ask the API for every size of the bundled table (or `only` these) and write the table to `out`; the number
    of (size, region) rows written. Nothing is written unless every size answered."""
    table = sizes or AzureSizes.load_default()
    items: list[Mapping[str, Any]] = []
    for size in only or table.sizes():
        items.extend(size_items(size, fetch, base_url))
    rows = price_rows(items, table, as_of)
    if not rows:
        raise RetailPricesError("the API listed no Linux pay-as-you-go price of any GPU size: nothing written")
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(out)
    return len(rows)
