"""Replicas on disjoint shards (docs/scale.md, "Two replicas"): each process owns some of the tick's shards
(`prometheus.owned_shards`) and judges, records and acts on the instances of those only. The other instances are
not listed at all here (not UNKNOWN): another replica, with its own lease name or database, owns them."""

from __future__ import annotations

from typing import Any

from ..collect.prometheus import shard_of
from ..model import Cloud, GpuInstance


class OwnedShardsCloud:
    """The inventory of `cloud` narrowed to the instances whose shard (collect.prometheus.shard_of, the same
    split the collector's queries use) is owned; every other call passes through unchanged."""

    def __init__(self, cloud: Cloud, shards: int, owned: tuple[int, ...]):
        self._cloud, self._shards, self._owned = cloud, shards, frozenset(owned)

    def list_gpu_instances(self) -> list[GpuInstance]:
        return [i for i in self._cloud.list_gpu_instances() if shard_of(i.instance_id, self._shards) in self._owned]

    def __getattr__(self, name: str) -> Any:  # set_tags, stop, describe, last_errors...: the cloud's own
        return getattr(self._cloud, name)


def owned_only(cloud: Cloud, settings) -> Cloud:
    """`cloud` as this replica sees it: narrowed when `prometheus.owned_shards` is set, else unchanged."""
    prom = settings.prometheus
    if not prom.owned_shards:
        return cloud
    return OwnedShardsCloud(cloud, int(prom.shards), prom.owned_shards)
