"""DRA (Dynamic Resource Allocation, resource.k8s.io/v1, GA since Kubernetes 1.34): which devices each pod holds.

Pure: from the listed ResourceSlices (per node: driver, pool, devices with attributes) and ResourceClaims
(status.allocation.devices.results: driver, pool, device; status.reservedFor: the pods using the claim), the
devices of each node (`slices_by_node`) and each pod's part of each device its claims were allocated
(`pod_holds`). A pod names its claims in spec.resourceClaims: `resourceClaimName` directly, or
`resourceClaimTemplateName`, whose generated claim is named in status.resourceClaimStatuses; until the pod's
status says so (the claim controller writes it after creating the claim), the generated claim is the one the pod
owns (its controller ownerReference) with the annotation `resource.kubernetes.io/pod-claim-name` naming the pod's
claim entry, as the controller makes it. A generated claim is the pod's, so it is the pod's workload's: a Job's, a
JobSet's (through its Jobs), like every other pod of it.

Containers' `resources.claims` say which of the pod's claims each container sees (`DraHold.containers`). They do
not change what the pod holds: a claim is allocated and reserved for the pod, so every allocated device of every
claim of the pod is the pod's, whether one container, several or none names it (a claim no container names is held
all the same, and costs the same).

DeviceClasses and ResourceClaimTemplates are listed too (`device_classes`, `claim_templates`): each hold says the
class its request asked for and, for a generated claim, the template it came from, so reasons and `costs --by pod`
can name them. Neither changes a figure: the allocation result is what the pod holds.

A claim reserved for several pods is split evenly among them (each its 1/n); a reserved pod that is not listed
(finished, another namespace left out) keeps its part unassigned, so it stays the node's idle capacity rather
than being loaded onto the others. A device no ResourceSlice of the pod's node publishes is kept with `found`
None: a GPU driver's is a GPU that cannot be told apart (its workload UNKNOWN, its cost not guessed).

Not read: a claim's or class's opaque driver configuration (NVIDIA's time-slicing / MPS sharing of a claim's GPU,
status.allocation.devices.config), consumable capacity (a device's `capacity` shared by requests' amounts) and
partitionable devices (a slice's `sharedCounters`, devices that `consumesCounters`): docs/kubernetes.md, "DRA".
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Iterable, Mapping

from gpufinops.k8s.model import DRA_GPU_DRIVERS, DRA_GPU_TYPES, DraDevice, DraHold

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"
# Read with the official client's ApiClient as raw REST (kubernetes 33.x has no resource.k8s.io/v1 models), paged
# like every other list (cluster.KubeReader.list).
SLICES, CLAIMS = "resourceslices", "resourceclaims"
CLASSES, TEMPLATES = "deviceclasses", "resourceclaimtemplates"
# The annotation kube-controller-manager's resource claim controller puts on a claim it generates from a pod's
# ResourceClaimTemplate: the pod's spec.resourceClaims entry it is for.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


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


def generated_claims(claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(pod uid, the pod's claim entry) -> the claim generated for it from a template: a claim whose controller
    ownerReference is the pod, annotated with POD_CLAIM_NAME_ANNOTATION (as kube-controller-manager makes it)."""
    out = {}
    for c in claims:
        meta = c.get("metadata") or {}
        entry = (meta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION)
        for r in meta.get("ownerReferences") or []:
            if entry and isinstance(r, dict) and r.get("kind") == "Pod" and r.get("controller") and r.get("uid"):
                out[(str(r["uid"]), str(entry))] = str(meta.get("name", ""))
    return out


def pod_claims(obj: Mapping[str, Any],
               generated: Mapping[tuple[str, str], str] | None = None) -> list[tuple[str, str, str]]:
    """(pod's claim entry, ResourceClaim name, template name or "") of each claim the pod uses, in its namespace:
    spec.resourceClaims' resourceClaimName, or for a resourceClaimTemplateName the claim generated for it
    (status.resourceClaimStatuses; before the status says, the claim the pod owns for that entry: `generated`,
    from generated_claims; none yet: not listed)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    named = {str(s.get("name")): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
             if isinstance(s, dict)}
    uid = str(meta.get("uid") or "")
    out = []
    for ref in spec.get("resourceClaims") or []:
        if not isinstance(ref, dict):
            continue
        entry, template = str(ref.get("name") or ""), str(ref.get("resourceClaimTemplateName") or "")
        name = ref.get("resourceClaimName") or (
            (named.get(entry) or (generated or {}).get((uid, entry))) if template else None)
        if name:
            out.append((entry, str(name), "" if ref.get("resourceClaimName") else template))
    return out


def pod_claim_names(obj: Mapping[str, Any], generated: Mapping[tuple[str, str], str] | None = None) -> list[str]:
    """The ResourceClaims a pod uses, by name in its namespace (pod_claims)."""
    return [name for _entry, name, _template in pod_claims(obj, generated)]


def claim_containers(obj: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Pod claim entry -> the containers (init containers too) whose resources.claims name it."""
    spec = obj.get("spec") or {}
    out: dict[str, list[str]] = {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if not isinstance(c, dict):
            continue
        for ref in (c.get("resources") or {}).get("claims") or []:
            if isinstance(ref, dict) and ref.get("name"):
                out.setdefault(str(ref["name"]), []).append(str(c.get("name") or ""))
    return {entry: tuple(names) for entry, names in out.items()}


def request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """A claim's (or a template's claim spec's) request name -> the DeviceClass it asks for (v1: `exactly`, or the
    first of `firstAvailable`'s subrequests)."""
    out = {}
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if not isinstance(req, dict) or not req.get("name"):
            continue
        exact = req.get("exactly") or next(iter(req.get("firstAvailable") or []), None) or {}
        if isinstance(exact, dict) and exact.get("deviceClassName"):
            out[str(req["name"])] = str(exact["deviceClassName"])
    return out


def device_classes(objs: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """DeviceClass name -> the drivers its CEL selectors name (`device.driver == "gpu.nvidia.com"`; () when they
    name none: a class selecting by attribute only)."""
    out = {}
    for obj in objs:
        name = str((obj.get("metadata") or {}).get("name") or "")
        drivers = []
        for sel in (obj.get("spec") or {}).get("selectors") or []:
            expression = str(((sel or {}).get("cel") or {}).get("expression") or "") if isinstance(sel, dict) else ""
            drivers += _DRIVER_IN_CEL.findall(expression)
        if name:
            out[name] = tuple(sorted({a or b for a, b in drivers}))
    return out


_DRIVER_IN_CEL = re.compile(r"""device\.driver\s*==\s*(?:"([^"]+)"|'([^']+)')""")


def claim_templates(objs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, str]]:
    """(namespace, ResourceClaimTemplate) -> its request name -> DeviceClass."""
    return {(str((o.get("metadata") or {}).get("namespace", "")), str((o.get("metadata") or {}).get("name", ""))):
            request_classes(o.get("spec") or {}) for o in objs}


def uses_claims(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("spec") or {}).get("resourceClaims"))


def claim_index(claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(str((c.get("metadata") or {}).get("namespace", "")), str((c.get("metadata") or {}).get("name", ""))): c
            for c in claims}


def _reserved_pods(claim: Mapping[str, Any]) -> list[str]:
    return [str(r.get("name")) for r in (claim.get("status") or {}).get("reservedFor") or []
            if isinstance(r, dict) and r.get("resource", "pods") == "pods" and not r.get("apiGroup") and r.get("name")]


def pod_holds(obj: Mapping[str, Any], claims: Mapping[tuple[str, str], Mapping[str, Any]],
              devices_by_node: Mapping[str, tuple[DraDevice, ...]], users: Mapping[tuple[str, str], int],
              templates: Mapping[tuple[str, str], Mapping[str, str]] | None = None,
              generated: Mapping[tuple[str, str], str] | None = None) -> tuple[DraHold, ...]:
    """The devices the pod's allocated claims hold, each with the pod's part. `users`: per claim, the listed pods
    that use it (the split when the claim's status.reservedFor names no pod). `templates`: claim_templates (the
    class a generated claim's request asked for when the claim itself does not say). `generated`:
    generated_claims."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    namespace, pod, node = str(meta.get("namespace", "")), str(meta.get("name", "")), str(spec.get("nodeName") or "")
    if not node:
        return ()
    published = {d.key: d for d in devices_by_node.get(node, ())}
    seen_by = claim_containers(obj)
    out = []
    for entry, name, template in pod_claims(obj, generated):
        claim = claims.get((namespace, name))
        if claim is None:
            continue
        reserved = _reserved_pods(claim)
        if reserved and pod not in reserved:
            continue  # not (yet, or no longer) reserved for it: the pods it is reserved for hold it
        sharers = len(reserved) or max(users.get((namespace, name), 1), 1)
        classes = {**(templates or {}).get((namespace, template), {}), **request_classes(claim)}
        allocation = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        for result in allocation.get("results") or []:
            if not isinstance(result, dict):
                continue
            key = (str(result.get("driver") or ""), str(result.get("pool") or ""), str(result.get("device") or ""))
            request = str(result.get("request") or "").split("/")[0]  # "gpu/subrequest" of a firstAvailable
            out.append(DraHold(claim=f"{namespace}/{name}", driver=key[0], pool=key[1], device=key[2],
                               share=Fraction(1, sharers), found=published.get(key), node=node,
                               template=f"{namespace}/{template}" if template else "",
                               device_class=classes.get(request, ""), containers=seen_by.get(entry, ())))
    return tuple(out)


def claim_users(pods: Iterable[Mapping[str, Any]],
                generated: Mapping[tuple[str, str], str] | None = None) -> dict[tuple[str, str], int]:
    """Per (namespace, claim): how many listed pods on a node use it."""
    out: dict[tuple[str, str], int] = {}
    for obj in pods:
        if not (obj.get("spec") or {}).get("nodeName"):
            continue
        namespace = str((obj.get("metadata") or {}).get("namespace", ""))
        for name in pod_claim_names(obj, generated):
            out[(namespace, name)] = out.get((namespace, name), 0) + 1
    return out
