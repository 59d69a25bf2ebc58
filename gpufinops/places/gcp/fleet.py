"""GCE VMs beside the other places of the tick's inventory: one Cloud that routes a change by the `gce:` id prefix.

The other side is what run/compose.live_inventory built before (EC2, several accounts, the rented hosts), or None
in a GCP-only config. Their listings merge as every composite's do (places.fleet.merge_listings): one side that
cannot be listed makes the listing partial (`last_errors`), never empty; both failing raises.
"""

from __future__ import annotations

from ...model import Cloud
from ..fleet import WithPlace
from ..registry import GCE_ID_PREFIX
from .cloud import GceCloud


class WithGce(WithPlace):
    def __init__(self, others: Cloud | None, gce: GceCloud):
        super().__init__(others, gce, prefix=GCE_ID_PREFIX, name="GCE")
        self.gce = gce
