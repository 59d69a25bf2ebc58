"""Rented GPU hosts listed in the config (`hosts.inventory`), behind the `Cloud` protocol: no cloud API, no bill.

Such a host (bare metal or any provider's VM) runs `gpufinops agent`; Prometheus scrapes it and the collector
matches its series to the host by the Hostname/hostname label (private_dns here is the configured hostname). Each
host is one GpuInstance "host:<hostname>", priced by gpufinops.host_prices (its own price, the GPU model's, else a
catalog estimate, marked as one) and judged like any instance; it is *managed* (`managed_by`), so the act stage
never tries to stop it: nothing central can. `gpufinops agent --autostop` stops it from the host (docs/agent.md).
Every mutating call raises a definite CloudError (nothing was called, nothing happened).

Reads nothing but the settings and the catalog; `static_hosts_cloud(settings)` builds it (None without hosts).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Mapping, Sequence

from ..prices.catalog import Catalog, CatalogError, load_catalog
from ..config import HostsSettings, RentedHost, Settings
from ..prices.host_prices import HostPrice, HostPriceTable, host_price
from ..model import GpuInstance
from .ec2.cloud import CloudError
from .registry import HOST_ID_PREFIX

log = logging.getLogger(__name__)

PROVIDER = "rented"
INSTANCE_TYPE = "rented"  # selectors: instance_families: [rented] or instance_types: [rented]
ID_PREFIX = HOST_ID_PREFIX
MANAGED_BY = "a rented host (no cloud API)"
MANAGED_ADVICE = "stop it from the host: gpufinops agent --autostop (docs/agent.md)"
# Central inventory cannot know when a rented host booted: it is judged on its metrics alone (a host that just came
# back has too few samples in the window, so it is UNKNOWN, never idle).
UNKNOWN_LAUNCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def instance_id(hostname: str) -> str:
    return f"{ID_PREFIX}{hostname}"


def price_table(hosts: HostsSettings, origin: str = "the hosts: section") -> HostPriceTable:
    """The configured prices as host_prices reads them (hostnames lower case, GPU keys canonical)."""
    return HostPriceTable(
        per_host={h.hostname.lower(): h.usd_per_hour for h in hosts.inventory if h.usd_per_hour is not None},
        per_gpu=dict(hosts.usd_per_gpu_hour), origin=origin)


def host_instance(host: RentedHost, price: HostPrice) -> GpuInstance:
    """Pure: one listed host as the GpuInstance every stage reads."""
    return GpuInstance(
        instance_id=instance_id(host.hostname), instance_type=INSTANCE_TYPE, region=host.region, state="running",
        launch_time=UNKNOWN_LAUNCH, tags=dict(host.tags), private_dns=host.hostname, gpu_count=host.gpu_count,
        gpu_model=host.gpu_model, hourly_cost=price.usd_per_hour, provider=PROVIDER, managed_by=MANAGED_BY,
        managed_advice=MANAGED_ADVICE, price_source=price.source)


class StaticHostsCloud:
    """The listed hosts, read-only. The list is fixed at load; so is each price."""

    def __init__(self, hosts: HostsSettings, catalog: Catalog | None, *, catalog_problem: str = "",
                 origin: str = "the hosts: section"):
        table = price_table(hosts, origin)
        self.prices: dict[str, HostPrice] = {}
        instances = []
        for h in hosts.inventory:
            price = host_price(h.hostname, h.gpu_model, h.gpu_count, table, catalog, catalog_problem=catalog_problem)
            if price.usd_per_hour is None:
                log.warning("rented host %s has no price: %s", h.hostname, price.why)
            instances.append(host_instance(h, price))
            self.prices[instance_id(h.hostname)] = price
        self.instances: tuple[GpuInstance, ...] = tuple(instances)

    def list_gpu_instances(self) -> list[GpuInstance]:
        return list(self.instances)

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        wanted = set(instance_ids)
        return [i for i in self.instances if i.instance_id in wanted]

    def _refuse(self, operation: str, inst: GpuInstance) -> CloudError:
        return CloudError(operation, inst.instance_id, inst.region or PROVIDER,
                          f"{MANAGED_BY}: nothing to call; {MANAGED_ADVICE}", definite=True, code="NoCloudApi")

    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        raise self._refuse("set_tags", inst)

    def remove_tags(self, inst: GpuInstance, keys: Sequence[str]) -> None:
        raise self._refuse("remove_tags", inst)

    def stop(self, inst: GpuInstance) -> None:
        raise self._refuse("stop", inst)

    def terminate(self, inst: GpuInstance) -> None:
        raise self._refuse("terminate", inst)


def static_hosts_cloud(settings: Settings) -> StaticHostsCloud | None:
    """The rented hosts of `settings.hosts`, priced with the configured catalog (recommend.catalog_dir, else the
    bundled one); None when none is listed. A catalog that cannot be read leaves estimates out (said per host)."""
    hosts = settings.hosts
    if hosts is None or not hosts.inventory:
        return None
    try:
        catalog, problem = load_catalog(settings.recommend.catalog_dir), ""
    except CatalogError as exc:
        catalog, problem = None, f"the GPU catalog could not be read: {exc}"
    origin = f"the hosts: section of {settings.source_path}" if settings.source_path else "the hosts: section"
    return StaticHostsCloud(hosts, catalog, catalog_problem=problem, origin=origin)


__all__ = ["MANAGED_ADVICE", "MANAGED_BY", "PROVIDER", "StaticHostsCloud", "host_instance", "instance_id",
           "price_table", "static_hosts_cloud"]

