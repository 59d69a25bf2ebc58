"""EC2 inventory and the few mutating EC2 calls, behind the `Cloud` protocol.

Only the act stage calls the mutating methods (set_tags, remove_tags, stop,
terminate). Everything here is I/O at the edge: no decisions are taken, and
an error in one region never hides the others.

API calls made by this module (the IAM policy in deploy/iam-policy.json
must grant each one; tests/test_deploy.py checks it by scanning this file):
EC2 DescribeInstances, DescribeInstanceTypes, DescribeSpotPriceHistory,
DescribeSpotInstanceRequests, CreateTags, DeleteTags, StopInstances,
TerminateInstances (opt-in policy); Auto Scaling DescribeAutoScalingInstances.

Two kinds of client per region. Reads keep botocore's standard retries, and
every failed attempt is logged at once and counted (`last_retries`,
`last_throttles`), so a throttled inventory shows within one run. Mutating
calls go through a client with retries off: exactly one HTTP request per
intent, and a failure says whether EC2 certainly did nothing
(`CloudError.definite`) or its fate is unknown (read back with describe()).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping, Sequence

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ProxyConnectionError,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError

from gpufinops.collect.aws_config import read_config
from gpufinops.config import AwsSettings
from gpufinops.model import Clock, GpuInstance, utcnow
from gpufinops.prices.prices import GpuSpec, OnDemandPrices

log = logging.getLogger(__name__)

PriceLookup = Callable[[str, str, str], "float | None"]

LISTED_STATES = ("pending", "running", "stopping", "stopped")
# DescribeInstanceTypes takes at most 100 types per call.
_TYPES_PER_CALL = 100
# DescribeAutoScalingInstances takes at most 50 instance ids per call.
_ASG_IDS_PER_CALL = 50
# An EC2 filter takes at most 200 values.
_FILTER_VALUES_PER_CALL = 200
# A spot price older than this is asked for again.
_SPOT_PRICE_TTL = timedelta(hours=1)


# Error codes by which AWS says "too many requests": the call was refused, not done.
THROTTLE_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "ProvisionedThroughputExceededException", "TransactionInProgressException",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "LimitExceededException", "RequestThrottled",
    "SlowDown", "PriorRequestNotComplete", "EC2ThrottledException",
})
# Raised before any byte of the request left this process (or before a connection existed).
_NEVER_SENT = (EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError, ParamValidationError,
               NoCredentialsError, PartialCredentialsError, CredentialRetrievalError, NoRegionError)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ("" for anything else)."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "") or "")
    return ""


def fate_is_certain(exc: BaseException) -> tuple[bool, str]:
    """(definite, why): definite is True only when the call certainly did NOT take effect.

    A 4xx answer (UnsupportedOperation, IncorrectInstanceState, UnauthorizedOperation...) and a
    throttle are refusals; a connection that never opened sent nothing. A 5xx, a read timeout, a
    connection closed after sending or an answer that cannot be parsed leave the fate unknown:
    EC2 may have done it, so the caller must read the instance back before recording anything.
    """
    if isinstance(exc, ClientError):
        code = error_code(exc)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in THROTTLE_CODES:
            return True, f"throttled ({code}): refused, not done"
        if 400 <= status < 500:
            return True, f"refused by AWS (HTTP {status} {code})"
        return False, f"AWS answered HTTP {status or '?'} {code}: it may or may not have done it"
    if isinstance(exc, _NEVER_SENT):
        return True, f"never sent ({type(exc).__name__})"
    if isinstance(exc, ReadTimeoutError):
        return False, "no answer before the read timeout: it may or may not have been done"
    if isinstance(exc, ConnectionClosedError):
        return False, "the connection closed after the request was sent: it may or may not have been done"
    if isinstance(exc, ResponseParserError):
        return False, "the answer could not be parsed: it may or may not have been done"
    return False, f"{type(exc).__name__}: the outcome is unknown"


class CloudError(RuntimeError):
    """An EC2 call failed; the message names the operation, instance and region.

    `definite` is True when EC2 certainly did not do it (a refusal: 4xx, throttled, never sent),
    False when its fate is unknown (5xx, timeout, connection lost, unparsable answer): then the
    instance must be read back (describe()) before anything is recorded or tried again.
    """

    def __init__(self, operation: str, instance_id: str, region: str, cause: BaseException | str,
                 *, definite: bool | None = None, code: str | None = None) -> None:
        if isinstance(cause, BaseException):
            certain, why = fate_is_certain(cause)
        else:
            certain, why = False, ""
        self.operation = operation
        self.instance_id = instance_id
        self.region = region
        self.code = code if code is not None else (error_code(cause) if isinstance(cause, BaseException) else "")
        self.definite = certain if definite is None else definite
        self.fate = why
        shown = self.code
        super().__init__(f"{operation} {instance_id} ({region}) failed: {shown + ': ' if shown else ''}{cause}"
                         + (f" [{'not done' if self.definite else 'outcome unknown'}]"))


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


# ---------------------------------------------------------------------- managed instances

# What to do instead of stopping, per kind of manager (shown in the reason and the report).
ADVICE_ASG = ("scale the Auto Scaling group's desired capacity down or set a scheduled action; "
              "a stopped member is marked unhealthy, terminated and replaced")
ADVICE_NODE = ("let the cluster autoscaler / Karpenter consolidation remove the node; scale the workload "
               "down (stopping a node takes its pods with it)")
ADVICE_NODEGROUP = ("scale the node group's desired size down or let the cluster autoscaler remove the node; "
                    "scale the workload down")
ADVICE_KARPENTER = ("let Karpenter consolidation remove the node (consolidationPolicy WhenEmptyOrUnderutilized); "
                    "scale the workload down")
ADVICE_BATCH = "lower the compute environment's minimum vCPUs to 0: Batch removes idle instances itself"
ADVICE_PCLUSTER = ("let the scheduler scale the compute fleet down (ScaledownIdletime) or run "
                   "`pcluster update-compute-fleet --status STOP_REQUESTED`")
ADVICE_SAGEMAKER = "stop or scale it in SageMaker (notebook, endpoint, HyperPod cluster), not in EC2"
ADVICE_EMR = "resize the EMR cluster's instance group or use managed scaling"
ADVICE_FLEET = "lower the fleet's target capacity; a maintained fleet replaces a stopped instance"
ADVICE_BEANSTALK = "scale the Elastic Beanstalk environment down"
ADVICE_UNKNOWN_ASG = ("nothing is stopped until DescribeAutoScalingInstances answers (grant "
                      "autoscaling:DescribeAutoScalingInstances, see docs/deploy.md)")
MANAGED_UNKNOWN = "unknown (DescribeAutoScalingInstances failed)"

_K8S_CLUSTER_TAG = "kubernetes.io/cluster/"


@dataclass(frozen=True)
class Manager:
    """Something other than a person that owns an instance's lifecycle."""

    by: str  # in words: "Auto Scaling group 'ml-asg'"
    advice: str  # what to do instead of stopping it


def _cluster_of(tags: Mapping[str, str]) -> str:
    for key in ("eks:cluster-name", "eks:eks-cluster-name", "aws:eks:cluster-name"):
        if tags.get(key):
            return tags[key]
    for key in tags:
        if key.startswith(_K8S_CLUSTER_TAG) and len(key) > len(_K8S_CLUSTER_TAG):
            return key[len(_K8S_CLUSTER_TAG):]
    return ""


def manager_from_tags(tags: Mapping[str, str]) -> Manager | None:
    """Who manages an instance, from the tags its manager puts on it; None when no tag says so.

    The most specific manager wins: an EKS node group or Karpenter node is also a Kubernetes node
    (and a node group is also an Auto Scaling group), and its advice is about that manager.
    """
    def has_prefix(*prefixes: str) -> bool:
        return any(k.startswith(prefixes) for k in tags)

    cluster = _cluster_of(tags)
    of_cluster = f" of cluster '{cluster}'" if cluster else ""
    if "aws:batch:compute-environment" in tags:
        return Manager(f"AWS Batch compute environment '{tags['aws:batch:compute-environment']}'", ADVICE_BATCH)
    if has_prefix("parallelcluster:", "aws-parallelcluster-"):
        name = tags.get("parallelcluster:cluster-name") or tags.get("ClusterName") or "?"
        return Manager(f"AWS ParallelCluster '{name}'", ADVICE_PCLUSTER)
    if has_prefix("sagemaker:", "aws:sagemaker:"):
        return Manager("SageMaker", ADVICE_SAGEMAKER)
    if "aws:elasticmapreduce:job-flow-id" in tags:
        return Manager(f"EMR cluster '{tags['aws:elasticmapreduce:job-flow-id']}'", ADVICE_EMR)
    for key in ("karpenter.sh/nodepool", "karpenter.sh/provisioner-name"):
        if key in tags:
            kind = "NodePool" if key.endswith("nodepool") else "Provisioner"
            return Manager(f"Karpenter {kind} '{tags[key]}'{of_cluster}", ADVICE_KARPENTER)
    if has_prefix("karpenter.sh/", "karpenter.k8s.aws/"):
        return Manager(f"Karpenter{of_cluster}", ADVICE_KARPENTER)
    if "eks:nodegroup-name" in tags:
        return Manager(f"EKS node group '{tags['eks:nodegroup-name']}'{of_cluster}", ADVICE_NODEGROUP)
    if "aws:autoscaling:groupName" in tags:
        return Manager(f"Auto Scaling group '{tags['aws:autoscaling:groupName']}'", ADVICE_ASG)
    if "aws:ec2spot:fleet-request-id" in tags:
        return Manager(f"Spot Fleet request '{tags['aws:ec2spot:fleet-request-id']}'", ADVICE_FLEET)
    if "aws:ec2:fleet-id" in tags:
        return Manager(f"EC2 Fleet '{tags['aws:ec2:fleet-id']}'", ADVICE_FLEET)
    if "elasticbeanstalk:environment-name" in tags:
        return Manager(f"Elastic Beanstalk environment '{tags['elasticbeanstalk:environment-name']}'",
                       ADVICE_BEANSTALK)
    if cluster:
        return Manager(f"Kubernetes cluster '{cluster}'", ADVICE_NODE)
    return None


def manager_from_asg(group_name: str) -> Manager:
    return Manager(f"Auto Scaling group '{group_name}'", ADVICE_ASG)


def spot_request_type(request: Mapping[str, Any]) -> str:
    """"one-time" | "persistent" from a DescribeSpotInstanceRequests item; "" when it cannot be relied on.

    A cancelled or closed request no longer governs the instance the way its type says, so the
    answer is "" (unknown), which the act stage treats as not stoppable.
    """
    kind = str(request.get("Type") or "")
    if kind not in ("one-time", "persistent"):
        return ""
    if request.get("State") in ("cancelled", "closed", "failed"):
        return ""
    return kind


# ---------------------------------------------------------------------- retries of the read calls


def retryable_failure(response: Any, caught_exception: BaseException | None) -> tuple[str, bool] | None:
    """(what failed, is it a throttle) for one failed attempt that botocore's standard mode retries;
    None for a success or a final answer (4xx other than throttling)."""
    if caught_exception is not None:
        return f"{type(caught_exception).__name__}: {caught_exception}", False
    if not response:
        return None
    http, parsed = response
    code = str((parsed or {}).get("Error", {}).get("Code", "") or "")
    status = int(getattr(http, "status_code", 0) or 0)
    if code in THROTTLE_CODES:
        return f"throttled ({code}, HTTP {status})", True
    if status == 429:
        return f"throttled (HTTP 429 {code})", True
    if status >= 500:
        return f"HTTP {status} {code}".rstrip(), False
    return None


REQUEST_MARGIN_S = 30.0


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
        # Reads: botocore's standard retries (max_attempts retries after the first attempt).
        self._read_attempts = max_attempts + 1
        self._config = read_config(max_attempts, connect_timeout_s, read_timeout_s)
        # Mutating calls: exactly one HTTP request per call. A retried StopInstances whose first
        # answer was lost would be a second stop of the same intent, and botocore would hide it.
        self._write_config = Config(
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"total_max_attempts": 1, "mode": "standard"},
            user_agent_extra="gpufinops",
        )
        # The longest a StopInstances may be in flight: one attempt's connect + read timeout, and a margin for a
        # request held on the way (a paused process, a proxy). An unknown outcome is settled only after it.
        self.max_request_s = connect_timeout_s + read_timeout_s + REQUEST_MARGIN_S
        # Per-region endpoints (VPC endpoints), else the one endpoint_url, else AWS's.
        self._region_endpoints = dict(region_endpoints or {})
        self._families = frozenset(settings.gpu_families)
        self._types = type_cache if type_cache is not None else PROCESS_TYPE_CACHE
        self._clients: dict[tuple[str, str], Any] = {}
        self._spot_cache: dict[tuple[str, str, str], tuple[datetime, float | None]] = {}
        self._region_of: dict[str, str] = {}
        self.last_errors: list[RegionError] = []
        # Failed read attempts botocore retries, since the last list_gpu_instances() (one run), and
        # how many of them were throttles; total_retries counts over the process's life.
        self.last_retries = 0
        self.last_throttles = 0
        self.total_retries = 0
        # (region, API) whose failure was logged, so an outage logs once, not every run.
        self._failing: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ clients
    def _endpoint(self, region: str) -> str | None:
        return self._region_endpoints.get(region) or self.settings.endpoint_url

    def _client(self, region: str):
        """EC2 for reads: standard retries, each failed attempt logged and counted."""
        key = ("ec2", region)
        if key not in self._clients:
            client = self._session.client("ec2", region_name=region, endpoint_url=self._endpoint(region),
                                          config=self._config)
            client.meta.events.register("needs-retry", functools.partial(self._on_failed_attempt, region))
            self._clients[key] = client
        return self._clients[key]

    def _write_client(self, region: str):
        """EC2 for the mutating calls: retries off, one HTTP request per call."""
        key = ("ec2-write", region)
        if key not in self._clients:
            self._clients[key] = self._session.client(
                "ec2", region_name=region, endpoint_url=self._endpoint(region), config=self._write_config)
        return self._clients[key]

    def _autoscaling(self, region: str):
        # Per-region endpoints are EC2's (VPC endpoints); Auto Scaling has its own, so only endpoint_url.
        key = ("autoscaling", region)
        if key not in self._clients:
            client = self._session.client("autoscaling", region_name=region,
                                          endpoint_url=self.settings.endpoint_url, config=self._config)
            client.meta.events.register("needs-retry", functools.partial(self._on_failed_attempt, region))
            self._clients[key] = client
        return self._clients[key]

    def _on_failed_attempt(self, region: str, response=None, operation=None, attempts=1, caught_exception=None,
                           **_) -> None:
        """botocore's needs-retry hook: log a failed read attempt now, not after the last retry
        (the backoff of five attempts adds up to about 24 s of silence), and count it."""
        failure = retryable_failure(response, caught_exception)
        if failure is None:
            return None
        what, throttled = failure
        name = getattr(operation, "name", "?")
        if attempts < self._read_attempts:
            self.last_retries += 1
            self.total_retries += 1
            self.last_throttles += int(throttled)
            log.warning("AWS %s in %s: attempt %d of %d failed: %s; retrying",
                        name, region, attempts, self._read_attempts, what)
        else:
            log.error("AWS %s in %s: attempt %d of %d failed: %s; giving up",
                      name, region, attempts, self._read_attempts, what)
        return None  # the decision to retry stays botocore's

    def _log_failure_once(self, region: str, api: str, exc: BaseException) -> None:
        if (region, api) not in self._failing:
            self._failing.add((region, api))
            log.error("%s in %s failed: %s", api, region, exc)

    def _log_recovery(self, region: str, api: str) -> None:
        if (region, api) in self._failing:
            self._failing.discard((region, api))
            log.info("%s in %s answers again", api, region)

    # ------------------------------------------------------------------ inventory
    @property
    def complete(self) -> bool:
        """True when the last listing reached every configured region."""
        return not self.last_errors

    def list_gpu_instances(self) -> list[GpuInstance]:
        errors: list[RegionError] = []
        found: list[GpuInstance] = []
        self.last_retries = self.last_throttles = 0
        for region in self.settings.regions:
            try:
                found.extend(self._list_region(region))
            except (ClientError, BotoCoreError, ResponseParserError) as exc:
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
        return self._with_managers_and_spot(region, result, {inst["InstanceId"]: inst for _, inst in raw})

    # ------------------------------------------------------------------ managers and spot requests
    def _with_managers_and_spot(self, region: str, instances: list[GpuInstance],
                                raw: Mapping[str, dict]) -> list[GpuInstance]:
        """Fills managed_by/managed_advice (tags, then DescribeAutoScalingInstances for the rest)
        and spot_request_type (DescribeSpotInstanceRequests)."""
        if not instances:
            return instances
        managers = {i.instance_id: manager_from_tags(i.tags) for i in instances}
        untagged = [iid for iid, m in managers.items() if m is None]
        managers.update(self._asg_managers(region, untagged))
        spot = [i.instance_id for i in instances if i.lifecycle == "spot"]
        types = self._spot_request_types(region, spot, raw) if spot else {}
        out = []
        for inst in instances:
            m = managers.get(inst.instance_id)
            out.append(dataclasses.replace(
                inst,
                managed_by=m.by if m else "",
                managed_advice=m.advice if m else "",
                spot_request_type=types.get(inst.instance_id, "") if inst.lifecycle == "spot" else "",
            ))
        return out

    def _asg_managers(self, region: str, instance_ids: list[str]) -> dict[str, Manager]:
        """Auto Scaling group of each id that belongs to one, asked of the API (tags can be missing or
        edited). If the API fails, every asked id is managed by "unknown": nothing is stopped on doubt."""
        if not instance_ids:
            return {}
        found: dict[str, Manager] = {}
        try:
            paginator = self._autoscaling(region).get_paginator("describe_auto_scaling_instances")
            for start in range(0, len(instance_ids), _ASG_IDS_PER_CALL):
                chunk = instance_ids[start : start + _ASG_IDS_PER_CALL]
                for page in paginator.paginate(InstanceIds=chunk):
                    for item in page.get("AutoScalingInstances", []):
                        if item.get("InstanceId") in chunk and item.get("AutoScalingGroupName"):
                            found[item["InstanceId"]] = manager_from_asg(item["AutoScalingGroupName"])
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            self._log_failure_once(region, "DescribeAutoScalingInstances", exc)
            return {iid: Manager(MANAGED_UNKNOWN, ADVICE_UNKNOWN_ASG) for iid in instance_ids}
        self._log_recovery(region, "DescribeAutoScalingInstances")
        return found

    def _spot_request_types(self, region: str, instance_ids: list[str], raw: Mapping[str, dict]) -> dict[str, str]:
        """"one-time" | "persistent" per spot instance id; absent (unknown) when EC2 does not say.

        Asked by request id (the instance's SpotInstanceRequestId) and, for instances that do not
        carry one, by the request's instance-id filter; filters, not ids, so one expired request
        does not fail the whole call with InvalidSpotInstanceRequestID.NotFound.
        """
        by_request = {raw[i]["SpotInstanceRequestId"]: i for i in instance_ids if raw.get(i, {}).get("SpotInstanceRequestId")}
        without = [i for i in instance_ids if i not in by_request.values()]
        types: dict[str, str] = {}
        try:
            paginator = self._client(region).get_paginator("describe_spot_instance_requests")
            for name, values in (("spot-instance-request-id", list(by_request)), ("instance-id", without)):
                for start in range(0, len(values), _FILTER_VALUES_PER_CALL):
                    chunk = values[start : start + _FILTER_VALUES_PER_CALL]
                    for page in paginator.paginate(Filters=[{"Name": name, "Values": chunk}]):
                        for req in page.get("SpotInstanceRequests", []):
                            iid = by_request.get(req.get("SpotInstanceRequestId", "")) or req.get("InstanceId")
                            if iid in instance_ids and spot_request_type(req):
                                types[iid] = spot_request_type(req)
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            # Unknown type: the act stage treats a spot instance of unknown type as not stoppable.
            self._log_failure_once(region, "DescribeSpotInstanceRequests", exc)
            return {}
        self._log_recovery(region, "DescribeSpotInstanceRequests")
        return types

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
            except (ClientError, BotoCoreError, ResponseParserError) as exc:
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
            built = [self._to_gpu_instance(region, owner, inst, infos[inst["InstanceType"]]) for owner, inst in raw]
            for inst in self._with_managers_and_spot(region, built, {i["InstanceId"]: i for _, i in raw}):
                out[inst.instance_id] = inst
        return out

    # ------------------------------------------------------------------ mutating calls (act stage only)
    def _call(self, operation: str, inst: GpuInstance, fn: Callable[..., Any], **kwargs) -> None:
        """One HTTP request (the write client has no retries). Any failure is a CloudError that says
        whether EC2 certainly did nothing (definite) or may have done it (read it back)."""
        try:
            fn(**kwargs)
        except Exception as exc:  # noqa: BLE001 - an unclassified failure is "fate unknown", never a crash
            error = CloudError(operation, inst.instance_id, inst.region, exc)
            log.error("%s", error)
            raise error from exc

    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        if not tags:
            return
        client = self._write_client(inst.region)
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
        client = self._write_client(inst.region)
        self._call(
            "DeleteTags", inst, client.delete_tags, Resources=[inst.instance_id], Tags=[{"Key": k} for k in keys]
        )

    def stop(self, inst: GpuInstance) -> None:
        # Never Force (it skips the OS shutdown, so jobs get no chance to checkpoint)
        # and never hibernate unless a person asked for it on the instance.
        client = self._write_client(inst.region)
        self._call("StopInstances", inst, client.stop_instances, InstanceIds=[inst.instance_id], Force=False, Hibernate=False)

    def terminate(self, inst: GpuInstance) -> None:
        client = self._write_client(inst.region)
        self._call("TerminateInstances", inst, client.terminate_instances, InstanceIds=[inst.instance_id])
