"""EC2 inventory and the few mutating EC2 calls, behind the `Cloud` protocol.

Only the act stage calls the mutating methods (set_tags, remove_tags, stop,
terminate). Everything here is I/O at the edge: no decisions are taken, and
an error in one region never hides the others.

EC2 API calls made by this module (the IAM policy in deploy/iam-policy.json
must grant each one; tests/test_deploy.py checks it by scanning this file):
DescribeInstances, DescribeInstanceTypes, DescribeSpotPriceHistory,
CreateTags, DeleteTags, StopInstances, TerminateInstances.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping, Sequence

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from gpufinops.config import AwsSettings
from gpufinops.model import Clock, GpuInstance, utcnow
from gpufinops.prices import GpuSpec, OnDemandPrices

log = logging.getLogger(__name__)

PriceLookup = Callable[[str, str, str], "float | None"]

LISTED_STATES = ("pending", "running", "stopping", "stopped")
# DescribeInstanceTypes takes at most 100 types per call.
_TYPES_PER_CALL = 100
# A spot price older than this is asked for again.
_SPOT_PRICE_TTL = timedelta(hours=1)


class CloudError(RuntimeError):
    """An EC2 call failed; the message names the operation, instance and region."""

    def __init__(self, operation: str, instance_id: str, region: str, cause: Exception) -> None:
        code = ""
        if isinstance(cause, ClientError):
            code = cause.response.get("Error", {}).get("Code", "")
        self.operation = operation
        self.instance_id = instance_id
        self.region = region
        self.code = code
        super().__init__(f"{operation} {instance_id} ({region}) failed: {code + ': ' if code else ''}{cause}")


class InventoryError(RuntimeError):
    """No trustworthy answer: every region failed (listing) or one did (describe)."""


@dataclass(frozen=True)
class RegionError:
    """One region that could not be listed in the last list_gpu_instances()."""

    region: str
    operation: str
    message: str


@dataclass(frozen=True)
class TypeInfo:
    """What the inventory needs to know about an instance type."""

    is_gpu: bool
    gpu_count: int = 0
    gpu_model: str = ""
    gpu_memory_gib: float = 0.0  # per visible GPU
    source: str = "aws"  # aws | catalog | none


class TypeInfoCache:
    """Instance-type facts per (endpoint, region, type). They do not change while
    the process runs, so one shared cache saves a DescribeInstanceTypes per run."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, str, str], TypeInfo] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str]) -> TypeInfo | None:
        with self._lock:
            return self._data.get(key)

    def put(self, key: tuple[str, str, str], info: TypeInfo) -> None:
        with self._lock:
            self._data[key] = info

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


PROCESS_TYPE_CACHE = TypeInfoCache()


def type_info_from_aws(gpu_info: Mapping[str, Any] | None) -> TypeInfo:
    """TypeInfo from a describe_instance_types GpuInfo block (None: no GPU)."""
    if not gpu_info or not gpu_info.get("Gpus"):
        return TypeInfo(is_gpu=False)
    gpus = gpu_info["Gpus"]
    # Fractional types (g6f) report Count 0 and LogicalGpuCount 1: one visible slice.
    count = sum(int(g.get("Count") or 0) or int(g.get("LogicalGpuCount") or 0) for g in gpus)
    first = gpus[0]
    memory_mib = float(first.get("MemoryInfo", {}).get("SizeInMiB") or 0)
    return TypeInfo(
        is_gpu=True,
        gpu_count=count,
        gpu_model=str(first.get("Name", "")),
        gpu_memory_gib=round(memory_mib / 1024.0, 2),
        source="aws",
    )


def type_info_from_catalog(spec: GpuSpec | None) -> TypeInfo:
    if spec is None:
        return TypeInfo(is_gpu=False, source="none")
    if spec.gpu_count < 1:  # a slice of one GPU: one visible device with a share of its memory
        return TypeInfo(True, 1, spec.gpu_model, round(spec.gpu_memory_gib * spec.gpu_count, 2), "catalog")
    return TypeInfo(True, int(math.floor(spec.gpu_count)), spec.gpu_model, spec.gpu_memory_gib, "catalog")


_INVALID_TYPES = re.compile(r"\[([^\]]*)\]")


def _unknown_types(exc: ClientError) -> set[str]:
    """Types named in an InvalidInstanceType error ('... do not exist: [a, b]')."""
    match = _INVALID_TYPES.search(exc.response.get("Error", {}).get("Message", ""))
    if not match:
        return set()
    return {t.strip() for t in match.group(1).split(",") if t.strip()}


class Ec2Cloud:
    """The `Cloud` protocol over real EC2 (or moto) with boto3.

    list_gpu_instances() lists every configured region; a region that fails is
    logged and recorded in `last_errors`, and the other regions are still
    listed. Callers must read `last_errors` (or `complete`) before treating a
    missing instance as gone. When every region fails it raises InventoryError:
    an empty list would look like "no GPU instances at all".
    """

    def __init__(
        self,
        settings: AwsSettings,
        *,
        session: boto3.session.Session | None = None,
        prices: PriceLookup | None = None,
        catalog: OnDemandPrices | None = None,
        spot_prices: bool = True,
        clock: Clock = utcnow,
        page_size: int = 1000,
        max_attempts: int = 5,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        region_endpoints: Mapping[str, str] | None = None,
        type_cache: TypeInfoCache | None = None,
    ) -> None:
        self.settings = settings
        self._session = session or boto3.session.Session(profile_name=settings.profile)
        self._prices = prices
        # GpuInfo fallback when DescribeInstanceTypes does not know a type.
        if catalog is None:
            catalog = prices if isinstance(prices, OnDemandPrices) else OnDemandPrices.load_default()
        self._catalog = catalog
        self._spot_prices = spot_prices
        self._clock = clock
        self._page_size = max(5, min(1000, page_size))  # EC2's limits for MaxResults
        self._config = Config(
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            user_agent_extra="gpufinops",
        )
        # Per-region endpoints (VPC endpoints), else the one endpoint_url, else AWS's.
        self._region_endpoints = dict(region_endpoints or {})
        self._families = frozenset(settings.gpu_families)
        self._types = type_cache if type_cache is not None else PROCESS_TYPE_CACHE
        self._clients: dict[str, Any] = {}
        self._spot_cache: dict[tuple[str, str, str], tuple[datetime, float | None]] = {}
        self._region_of: dict[str, str] = {}
        self.last_errors: list[RegionError] = []

    # ------------------------------------------------------------------ clients
    def _endpoint(self, region: str) -> str | None:
        return self._region_endpoints.get(region) or self.settings.endpoint_url

    def _client(self, region: str):
        if region not in self._clients:
            self._clients[region] = self._session.client(
                "ec2", region_name=region, endpoint_url=self._endpoint(region), config=self._config
            )
        return self._clients[region]

    # ------------------------------------------------------------------ inventory
    @property
    def complete(self) -> bool:
        """True when the last listing reached every configured region."""
        return not self.last_errors

    def list_gpu_instances(self) -> list[GpuInstance]:
        errors: list[RegionError] = []
        found: list[GpuInstance] = []
        for region in self.settings.regions:
            try:
                found.extend(self._list_region(region))
            except (ClientError, BotoCoreError) as exc:
                log.error("EC2 inventory of region %s failed: %s", region, exc)
                errors.append(RegionError(region, "DescribeInstances", str(exc)))
        self.last_errors = errors
        if errors and len(errors) == len(self.settings.regions):
            raise InventoryError("EC2 inventory failed in every region: " + "; ".join(f"{e.region}: {e.message}" for e in errors))
        return found

    def _list_region(self, region: str) -> list[GpuInstance]:
        raw = list(
            self._describe_raw(
                region,
                Filters=[{"Name": "instance-state-name", "Values": list(LISTED_STATES)}],
                PaginationConfig={"PageSize": self._page_size},
            )
        )
        infos = self._type_infos(region, {inst["InstanceType"] for _, inst in raw})
        result = []
        for owner, inst in raw:
            info = infos[inst["InstanceType"]]
            if not (info.is_gpu or self._is_gpu_family(inst["InstanceType"])):
                continue
            result.append(self._to_gpu_instance(region, owner, inst, info))
        return result

    def _describe_raw(self, region: str, **kwargs) -> Iterable[tuple[str, dict]]:
        paginator = self._client(region).get_paginator("describe_instances")
        for page in paginator.paginate(**kwargs):
            for reservation in page.get("Reservations", []):
                owner = reservation.get("OwnerId", "")
                for inst in reservation.get("Instances", []):
                    self._region_of[inst["InstanceId"]] = region
                    yield owner, inst

    def _is_gpu_family(self, instance_type: str) -> bool:
        return instance_type.split(".", 1)[0] in self._families

    def _cache_key(self, region: str, instance_type: str) -> tuple[str, str, str]:
        return (self._endpoint(region) or "aws", region, instance_type)

    def _type_infos(self, region: str, types: set[str]) -> dict[str, TypeInfo]:
        """TypeInfo per type: cache, then DescribeInstanceTypes, then the bundled catalog."""
        infos: dict[str, TypeInfo] = {}
        missing = []
        for t in sorted(types):
            cached = self._types.get(self._cache_key(region, t))
            if cached is None:
                missing.append(t)
            else:
                infos[t] = cached
        for start in range(0, len(missing), _TYPES_PER_CALL):
            infos.update(self._describe_types(region, missing[start : start + _TYPES_PER_CALL]))
        return infos

    def _describe_types(self, region: str, types: list[str]) -> dict[str, TypeInfo]:
        client = self._client(region)
        pending = list(types)
        unknown: set[str] = set()
        result: dict[str, TypeInfo] = {}
        while pending:
            try:
                resp = client.describe_instance_types(InstanceTypes=pending)
            except ClientError as exc:
                # One unknown type fails the whole call: drop those named and ask again.
                bad = _unknown_types(exc) & set(pending) if exc.response["Error"].get("Code") == "InvalidInstanceType" else set()
                if not bad:
                    raise
                unknown |= bad
                pending = [t for t in pending if t not in bad]
                continue
            for item in resp.get("InstanceTypes", []):
                result[item["InstanceType"]] = type_info_from_aws(item.get("GpuInfo"))
            unknown |= set(pending) - set(result)
            break
        for t in unknown:
            result[t] = type_info_from_catalog(self._catalog.gpu_spec(t))
            if result[t].source == "none" and self._is_gpu_family(t):
                log.warning("no GPU details for %s in %s (EC2 and bundled catalog lack it)", t, region)
        for t, info in result.items():
            self._types.put(self._cache_key(region, t), info)
        return result

    def _to_gpu_instance(self, region: str, owner: str, inst: dict, info: TypeInfo) -> GpuInstance:
        itype = inst["InstanceType"]
        lifecycle = "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand"
        launch = inst.get("LaunchTime")
        if isinstance(launch, datetime):
            launch = launch.astimezone(timezone.utc) if launch.tzinfo else launch.replace(tzinfo=timezone.utc)
        else:
            # EC2 always sends one. Without it we cannot know the instance has run a full window,
            # so it is treated as just launched (too young to judge), never as old enough to stop.
            log.warning("instance %s in %s has no LaunchTime; not judged", inst.get("InstanceId"), region)
            launch = self._clock()
        zone = inst.get("Placement", {}).get("AvailabilityZone", "")
        return GpuInstance(
            instance_id=inst["InstanceId"],
            instance_type=itype,
            region=region,
            state=inst.get("State", {}).get("Name", ""),
            launch_time=launch,
            account=owner,
            lifecycle=lifecycle,
            tags={t["Key"]: t.get("Value", "") for t in inst.get("Tags", []) or []},
            private_dns=inst.get("PrivateDnsName", "") or "",
            private_ip=inst.get("PrivateIpAddress", "") or "",
            gpu_count=info.gpu_count,
            gpu_model=info.gpu_model,
            gpu_memory_gib=info.gpu_memory_gib,
            hourly_cost=self._hourly(itype, region, lifecycle, zone),
        )

    # ------------------------------------------------------------------ prices
    def _hourly(self, instance_type: str, region: str, lifecycle: str, zone: str) -> float | None:
        price = self._prices(instance_type, region, lifecycle) if self._prices else None
        if price is None and lifecycle == "spot" and self._spot_prices:
            price = self._spot_price(instance_type, region, zone)
        return price if price is not None and price > 0 else None

    def _spot_price(self, instance_type: str, region: str, zone: str) -> float | None:
        """Current Linux spot price in the instance's zone; None when EC2 has none."""
        key = (region, instance_type, zone)
        now = self._clock()
        cached = self._spot_cache.get(key)
        if cached and now - cached[0] < _SPOT_PRICE_TTL:
            return cached[1]
        price = None
        try:
            kwargs: dict[str, Any] = {
                "InstanceTypes": [instance_type],
                "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                "StartTime": now,
                "MaxResults": 20,
            }
            if zone:
                kwargs["AvailabilityZone"] = zone
            history = self._client(region).describe_spot_price_history(**kwargs).get("SpotPriceHistory", [])
            latest = max(history, key=lambda h: h.get("Timestamp") or now, default=None)
            if latest is not None:
                price = float(latest["SpotPrice"])
        except (ClientError, BotoCoreError, ValueError) as exc:
            # A missing spot price only makes the cost unknown; the listing goes on.
            log.warning("spot price of %s in %s unavailable: %s", instance_type, zone or region, exc)
        self._spot_cache[key] = (now, price)
        return price

    # ------------------------------------------------------------------ reconciliation
    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        """Fresh state and tags of these instances, in any state (terminated too).

        Ids not found anywhere are simply absent from the result, so an absent
        id means "gone" only when the call returns: if any region that was asked
        fails, this raises InventoryError rather than let a reconciliation take
        an unreachable instance for a vanished one. Uses an instance-id filter
        rather than InstanceIds so one vanished id does not fail the whole call
        with InvalidInstanceID.NotFound.
        """
        wanted = list(dict.fromkeys(instance_ids))
        if not wanted:
            return []
        by_region: dict[str, list[str]] = {}
        for iid in wanted:
            by_region.setdefault(self._region_of.get(iid, ""), []).append(iid)
        unplaced = by_region.pop("", [])
        found: dict[str, GpuInstance] = {}
        errors: list[RegionError] = []
        for region in self.settings.regions:
            ids = by_region.get(region, []) + [i for i in unplaced if i not in found]
            if not ids:
                continue
            try:
                found.update(self._describe_ids(region, ids))
            except (ClientError, BotoCoreError) as exc:
                log.error("EC2 describe in %s failed: %s", region, exc)
                errors.append(RegionError(region, "DescribeInstances", str(exc)))
        self.last_errors = errors
        if errors:
            raise InventoryError("EC2 describe failed: " + "; ".join(f"{e.region}: {e.message}" for e in errors))
        return [found[i] for i in wanted if i in found]

    def _describe_ids(self, region: str, ids: list[str]) -> dict[str, GpuInstance]:
        out: dict[str, GpuInstance] = {}
        for start in range(0, len(ids), 200):  # EC2 filter values are capped at 200
            chunk = ids[start : start + 200]
            raw = list(self._describe_raw(region, Filters=[{"Name": "instance-id", "Values": chunk}]))
            infos = self._type_infos(region, {inst["InstanceType"] for _, inst in raw})
            for owner, inst in raw:
                out[inst["InstanceId"]] = self._to_gpu_instance(region, owner, inst, infos[inst["InstanceType"]])
        return out

    # ------------------------------------------------------------------ mutating calls (act stage only)
    def _call(self, operation: str, inst: GpuInstance, fn: Callable[..., Any], **kwargs) -> None:
        try:
            fn(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise CloudError(operation, inst.instance_id, inst.region, exc) from exc

    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        if not tags:
            return
        client = self._client(inst.region)
        self._call(
            "CreateTags",
            inst,
            client.create_tags,
            Resources=[inst.instance_id],
            Tags=[{"Key": k, "Value": str(v)} for k, v in tags.items()],
        )

    def remove_tags(self, inst: GpuInstance, keys: Sequence[str]) -> None:
        if not keys:
            return
        client = self._client(inst.region)
        self._call(
            "DeleteTags", inst, client.delete_tags, Resources=[inst.instance_id], Tags=[{"Key": k} for k in keys]
        )

    def stop(self, inst: GpuInstance) -> None:
        # Never Force (it skips the OS shutdown, so jobs get no chance to checkpoint)
        # and never hibernate unless a person asked for it on the instance.
        client = self._client(inst.region)
        self._call("StopInstances", inst, client.stop_instances, InstanceIds=[inst.instance_id], Force=False, Hibernate=False)

    def terminate(self, inst: GpuInstance) -> None:
        client = self._client(inst.region)
        self._call("TerminateInstances", inst, client.terminate_instances, InstanceIds=[inst.instance_id])
