"""A Cloud made of several: each mutating call goes to the one cloud that listed the instance.

Used by every composite inventory (accounts.MultiAccountCloud: one EC2 per account; static_hosts.WithRentedHosts:
EC2 beside the rented hosts; fleet.FleetCloud: instances beside Kubernetes workloads), so that the routing of a
change, the one thing that must never guess, is written once. A subclass says which cloud owns an instance.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..model import Cloud, GpuInstance


class RoutedCloud:
    def member_clouds(self) -> Sequence[object]:
        """The clouds this one routes to (for what holds for all of them)."""
        return [c for c in vars(self).values() if hasattr(c, "describe") and c is not self]

    @property
    def max_request_s(self) -> float:
        """The longest a mutating request may be in flight on any member (act's reconcile waits that long)."""
        return max((float(getattr(c, "max_request_s", 0.0)) for c in self.member_clouds()), default=0.0) or 120.0

    def cloud_of(self, inst: GpuInstance) -> Cloud:
        """The cloud that owns `inst`; raise rather than guess (a change must never go to the wrong place)."""
        raise NotImplementedError

    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        self.cloud_of(inst).set_tags(inst, tags)

    def remove_tags(self, inst: GpuInstance, keys: Sequence[str]) -> None:
        self.cloud_of(inst).remove_tags(inst, keys)

    def stop(self, inst: GpuInstance) -> None:
        self.cloud_of(inst).stop(inst)

    def terminate(self, inst: GpuInstance) -> None:
        self.cloud_of(inst).terminate(inst)
