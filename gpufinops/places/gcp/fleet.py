"""GCE VMs beside the other places of the tick's inventory: one Cloud that routes a change by the `gce:` id prefix.

The other side is what run/compose.live_inventory built before (EC2, several accounts, the rented hosts), or None
in a GCP-only config. Their listings merge as every composite's do (places.fleet.merge_listings): one side that
cannot be listed makes the listing partial (`last_errors`), never empty; both failing raises.
"""

from __future__ import annotations

import logging
from typing import Sequence

from ...model import Cloud, GpuInstance
from ..fleet import Listing, RoutedCloud, errors_of, merge_listings
from ..registry import GCE_ID_PREFIX
from .cloud import GceCloud

log = logging.getLogger(__name__)


class WithGce(RoutedCloud):
    def __init__(self, others: Cloud | None, gce: GceCloud):
        self.others = others
        self.gce = gce
        self.last_errors: list[str] = []

    def cloud_of(self, inst: GpuInstance) -> Cloud:
        if inst.instance_id.startswith(GCE_ID_PREFIX):
            return self.gce
        if self.others is None:
            raise ValueError(f"{inst.instance_id} is no GCE VM and no other place is configured")
        return self.others

    def list_gpu_instances(self) -> list[GpuInstance]:
        def failed(name: str):
            def said(exc: Exception) -> str:
                log.error("%s inventory not listed: %s", name, exc)
                return f"{name}: {exc}"
            return said

        parts = [Listing(lambda _: self.others.list_gpu_instances(), failed=failed("cloud"),
                         partial=lambda: errors_of(self.others))] if self.others is not None else []
        parts.append(Listing(lambda _: self.gce.list_gpu_instances(), failed=failed("GCE"),
                             partial=lambda: errors_of(self.gce)))
        listed, self.last_errors = merge_listings(parts, every_failed=lambda _errors, last: last)
        return listed

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        ours = [i for i in instance_ids if i.startswith(GCE_ID_PREFIX)]
        theirs = [i for i in instance_ids if not i.startswith(GCE_ID_PREFIX)]
        found = {i.instance_id: i for i in (self.gce.describe(ours) if ours else [])}
        if theirs and self.others is not None:
            found.update({i.instance_id: i for i in self.others.describe(theirs)})
        return [found[i] for i in instance_ids if i in found]
