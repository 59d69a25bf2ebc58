"""DRA (Dynamic Resource Allocation, resource.k8s.io/v1, GA since Kubernetes 1.34): which devices each pod holds.

Pure: from the listed ResourceSlices (per node: driver, pool, devices with attributes) and ResourceClaims
(status.allocation.devices.results: driver, pool, device; status.reservedFor: the pods using the claim), the
devices of each node (`slices_by_node`) and each pod's part of each device its claims were allocated
(`pod_holds`). A pod names its claims in spec.resourceClaims: `resourceClaimName` directly, or
`resourceClaimTemplateName`, whose generated claim is named in status.resourceClaimStatuses. Containers'
`resources.claims` only say which of the pod's claims a container sees: the pod holds every allocated device of
its claims either way, so they are not read.

A claim reserved for several pods is split evenly among them (each its 1/n); a reserved pod that is not listed
(finished, another namespace left out) keeps its part unassigned, so it stays the node's idle capacity rather
than being loaded onto the others. A device no ResourceSlice of the pod's node publishes is kept with `found`
None: a GPU driver's is a GPU that cannot be told apart (its workload UNKNOWN, its cost not guessed).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Iterable, Mapping

from gpufinops.k8s.model import DRA_GPU_DRIVERS, DRA_GPU_TYPES, DraDevice, DraHold

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"
# Read with the official client's ApiClient as raw REST (kubernetes 33.x has no resource.k8s.io/v1 models), paged
# like every other list (cluster.KubeReader.list).
SLICES, CLAIMS = "resourceslices", "resourceclaims"


def _attribute(attrs: Mapping[str, Any], driver: str, name: str) -> str:
    """A device attribute's value as text: v1 writes each as {"string"|"int"|"bool"|"version": value}; its key is
    the bare name in the driver's own domain, or qualified (`gpu.nvidia.com/uuid`)."""
    for key in (name, f"{driver}/{name}"):
        value = attrs.get(key)
        if isinstance(value, dict):
            for kind in ("string", "int", "version", "bool"):
                if kind in value and value[kind] is not None:
                    return str(value[kind])
    return ""


def parse_slice(obj: Mapping[str, Any]) -> list[DraDevice]:
    """The devices one ResourceSlice publishes for its node ([] for a slice of no node: a network-attached pool)."""
    spec = obj.get("spec") or {}
    node = str(spec.get("nodeName") or "")
    driver = str(spec.get("driver") or "")
    pool = str((spec.get("pool") or {}).get("name") or "")
    if not node or not driver:
        return []
    out = []
    for dev in spec.get("devices") or []:
        if not isinstance(dev, dict) or not dev.get("name"):
            continue
        attrs = dev.get("attributes") or {}
        attrs = attrs if isinstance(attrs, dict) else {}
        kind = _attribute(attrs, driver, "type") or "gpu"
        kind = kind if driver in DRA_GPU_DRIVERS and kind in DRA_GPU_TYPES else "other"
        out.append(DraDevice(
            driver=driver, pool=pool, name=str(dev["name"]), node=node, kind=kind,
            uuid=_attribute(attrs, driver, "uuid"), index=_attribute(attrs, driver, "index"),
            product=_attribute(attrs, driver, "productName"), profile=_attribute(attrs, driver, "profile"),
            parent_uuid=_attribute(attrs, driver, "parentUUID"), parent_index=_attribute(attrs, driver, "parentIndex"),
        ))
    return out


def slices_by_node(slices: Iterable[Mapping[str, Any]]) -> dict[str, tuple[DraDevice, ...]]:
    """Node -> the devices its ResourceSlices publish (every driver), sorted."""
    out: dict[str, list[DraDevice]] = {}
    for obj in slices:
        for dev in parse_slice(obj):
            out.setdefault(dev.node, []).append(dev)
    return {node: tuple(sorted(devs, key=lambda d: d.key)) for node, devs in out.items()}


def pod_claim_names(obj: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims a pod uses, by name in its namespace: spec.resourceClaims' resourceClaimName, or for a
    resourceClaimTemplateName the claim generated for it (status.resourceClaimStatuses; none yet: not listed)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    generated = {str(s.get("name")): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
                 if isinstance(s, dict)}
    out = []
    for ref in spec.get("resourceClaims") or []:
        if not isinstance(ref, dict):
            continue
        name = ref.get("resourceClaimName") or (generated.get(str(ref.get("name")))
                                                 if ref.get("resourceClaimTemplateName") else None)
        if name:
            out.append(str(name))
    return out


def uses_claims(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("spec") or {}).get("resourceClaims"))


def claim_index(claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(str((c.get("metadata") or {}).get("namespace", "")), str((c.get("metadata") or {}).get("name", ""))): c
            for c in claims}


def _reserved_pods(claim: Mapping[str, Any]) -> list[str]:
    return [str(r.get("name")) for r in (claim.get("status") or {}).get("reservedFor") or []
            if isinstance(r, dict) and r.get("resource", "pods") == "pods" and not r.get("apiGroup") and r.get("name")]


def pod_holds(obj: Mapping[str, Any], claims: Mapping[tuple[str, str], Mapping[str, Any]],
              devices_by_node: Mapping[str, tuple[DraDevice, ...]], users: Mapping[tuple[str, str], int]) -> tuple[
        DraHold, ...]:
    """The devices the pod's allocated claims hold, each with the pod's part. `users`: per claim, the listed pods
    that use it (the split when the claim's status.reservedFor names no pod)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    namespace, pod, node = str(meta.get("namespace", "")), str(meta.get("name", "")), str(spec.get("nodeName") or "")
    if not node:
        return ()
    published = {d.key: d for d in devices_by_node.get(node, ())}
    out = []
    for name in pod_claim_names(obj):
        claim = claims.get((namespace, name))
        if claim is None:
            continue
        reserved = _reserved_pods(claim)
        if reserved and pod not in reserved:
            continue  # not (yet, or no longer) reserved for it: the pods it is reserved for hold it
        sharers = len(reserved) or max(users.get((namespace, name), 1), 1)
        allocation = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        for result in allocation.get("results") or []:
            if not isinstance(result, dict):
                continue
            key = (str(result.get("driver") or ""), str(result.get("pool") or ""), str(result.get("device") or ""))
            out.append(DraHold(claim=f"{namespace}/{name}", driver=key[0], pool=key[1], device=key[2],
                               share=Fraction(1, sharers), found=published.get(key), node=node))
    return tuple(out)


def claim_users(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """Per (namespace, claim): how many listed pods on a node use it."""
    out: dict[tuple[str, str], int] = {}
    for obj in pods:
        if not (obj.get("spec") or {}).get("nodeName"):
            continue
        namespace = str((obj.get("metadata") or {}).get("namespace", ""))
        for name in pod_claim_names(obj):
            out[(namespace, name)] = out.get((namespace, name), 0) + 1
    return out
