"""What a rented GPU host costs an hour when no cloud bill says it (bare metal, any provider): pure lookup.

`host_price(hostname, gpu_model_name, gpu_count, table, catalog)` answers, in this order:

1. the host's own price in the table (`hosts.inventory[].usd_per_hour`, or the agent's autostop `price:`);
2. the table's price per GPU of that model (`hosts.usd_per_gpu_hour`) x the host's GPU count;
3. an **estimate** from the GPU catalog (gpufinops/data/catalog/instances.csv): the lowest on-demand $/GPU-h of
   that GPU model among every offer there (AWS, GCP, Azure, Lambda, RunPod; price / gpu_count of the offer) x the
   host's GPU count. The lowest, so that an idle host's cost is never overstated; the source names the offer.

No price is None with the reason, never $0 (a zero would read as "this idle host costs nothing"). Every price is
USD: the bills, the catalog and every message are in USD, and no conversion is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..model import format_money
from .catalog import Catalog, InstanceOffer, UnknownGpuError, canonical_gpu

CURRENCY = "USD"
# GpuInstance.price_source starts with this when the price is a guess; messages then say "(estimate)".
ESTIMATE = "estimate"
# What HostPrice.kind says, and the `source` label of the agent's gpufinops_host_hourly_cost.
KIND_HOST = "host"  # the host's own price, as configured
KIND_GPU_MODEL = "gpu_model"  # the configured price per GPU of its model x its GPU count
KIND_ESTIMATE = "catalog_estimate"  # the catalog's lowest on-demand price per GPU of its model x its GPU count


@dataclass(frozen=True)
class HostPriceTable:
    """The prices a person gave, in USD/h. `per_host`: hostname (lower case) -> the whole host's price;
    `per_gpu`: canonical GPU key (catalog.canonical_gpu, e.g. "H100") -> the price of one GPU of it.
    `origin` says where the table was written, for the price's source ("hosts: in /etc/gpufinops.yaml")."""

    per_host: Mapping[str, float] = field(default_factory=dict)
    per_gpu: Mapping[str, float] = field(default_factory=dict)
    origin: str = "the hosts: price table"


@dataclass(frozen=True)
class HostPrice:
    usd_per_hour: float | None  # the whole host; None = not known
    currency: str = CURRENCY
    source: str = ""  # where the price comes from, in words; "estimate: ..." for a guess; "" when there is none
    why: str = ""  # why there is no price ("" when there is one)
    kind: str = ""  # KIND_HOST | KIND_GPU_MODEL | KIND_ESTIMATE; "" when there is no price

    @property
    def is_estimate(self) -> bool:
        return self.source.startswith(ESTIMATE)


def is_estimate(price_source: str) -> bool:
    """Whether a GpuInstance.price_source describes a guessed price."""
    return price_source.startswith(ESTIMATE)


def no_price(why: str) -> HostPrice:
    return HostPrice(None, why=why)


def cheapest_offer_per_gpu(catalog: Catalog, gpu: str) -> InstanceOffer | None:
    """The catalog offer with the lowest on-demand price per GPU of this canonical GPU (ties: provider, type,
    region, so the answer does not depend on the file's order); None when the catalog has none."""
    offers = [o for o in catalog.offers if o.gpu == gpu and o.gpu_count > 0]
    if not offers:
        return None
    return min(offers, key=lambda o: (o.on_demand_usd_h / o.gpu_count, o.provider, o.instance_type, o.region))


def _gpus(count: int, gpu: str) -> str:
    return f"{count} × {gpu}"


def host_price(hostname: str, gpu_model_name: str, gpu_count: int, table: HostPriceTable | None,
               catalog: Catalog | None, *, catalog_problem: str = "") -> HostPrice:
    """The host's USD/h and where it comes from (module docstring: host, then GPU model, then the catalog).
    `catalog` None: no estimate; `catalog_problem` says why (e.g. the catalog could not be read)."""
    table = table or HostPriceTable()
    own = table.per_host.get((hostname or "").strip().lower())
    if own is not None:
        return HostPrice(own, source=f"the price of {hostname} in {table.origin}", kind=KIND_HOST)
    if gpu_count <= 0:
        return no_price(f"the GPU count of {hostname or 'this host'} is not known (no GPU read yet), and "
                    f"{table.origin} has no price for the host")
    if not (gpu_model_name or "").strip():
        return no_price(f"the GPU model of {hostname or 'this host'} is not known (no GPU read yet), and "
                    f"{table.origin} has no price for the host")
    try:
        gpu = canonical_gpu(gpu_model_name)
    except UnknownGpuError:
        return no_price(f"GPU model {gpu_model_name!r} is not one gpufinops knows, so no catalog estimate; give the "
                    f"host's price in {table.origin}")
    per_gpu = table.per_gpu.get(gpu)
    if per_gpu is not None:
        return HostPrice(per_gpu * gpu_count, kind=KIND_GPU_MODEL, source=(
            f"{_gpus(gpu_count, gpu)} at {format_money(per_gpu, per='GPU-h')} from {table.origin}"))
    if catalog is None:
        return no_price(f"no price for {_gpus(gpu_count, gpu)} in {table.origin}, and no catalog estimate"
                    + (f": {catalog_problem}" if catalog_problem else ""))
    offer = cheapest_offer_per_gpu(catalog, gpu)
    if offer is None:
        return no_price(f"the GPU catalog has no on-demand offer with {gpu} to estimate from; give the host's price "
                    f"in {table.origin}")
    unit = offer.on_demand_usd_h / offer.gpu_count
    as_of = f", prices of {offer.prices_as_of.isoformat()}" if offer.prices_as_of else ""
    return HostPrice(
        unit * gpu_count, kind=KIND_ESTIMATE,
        source=(f"{ESTIMATE}: {_gpus(gpu_count, gpu)} at {format_money(unit, per='GPU-h')}, the lowest on-demand "
                f"price per {gpu} in the GPU catalog ({offer.provider} {offer.instance_type}, {offer.region}{as_of})"))


__all__ = ["CURRENCY", "ESTIMATE", "HostPrice", "HostPriceTable", "KIND_ESTIMATE", "KIND_GPU_MODEL", "KIND_HOST",
           "cheapest_offer_per_gpu", "host_price", "is_estimate", "no_price"]
