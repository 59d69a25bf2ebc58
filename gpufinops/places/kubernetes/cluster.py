"""The Kubernetes cluster as gpufinops needs it: GPU nodes, the pods that request GPUs, and their workloads.

Read with the official `kubernetes` client, from a kubeconfig file (a path, or the client's default
~/.kube/config) or the in-cluster service account. Lists are paged (`limit` + `continue`); answers are read as
plain JSON (`_preload_content=False`): the objects are walked as the API server wrote them, custom resource
owners (a Kubeflow Notebook) included, without the client's model classes.

Every failure (403, 5xx, a timeout, a refused connection, a kubeconfig that cannot be read) is one
`ClusterReadFailed` naming the API server, the verb and the resource: never an empty cluster. "No pods" read
from a failed call would look like idle GPUs; missing data is never idle.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import urlparse

from gpufinops.collect.errors import QueryFailed
from gpufinops.places.kubernetes import dra
from gpufinops.k8s.model import (  # noqa: F401 - NODE_GROUP_LABELS, node_group_of: this module's API too
    KUEUE_JOB_KINDS, NODE_GROUP_LABELS, RAY_CLUSTER, ApiKind, ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo,
    WorkloadRef, devices, is_gpu_resource, is_share_resource, node_group_of,
)

log = logging.getLogger("gpufinops.kubernetes")
PAGE_SIZE = 500
# Controllers followed upwards from a pod; an owner of another kind (a custom resource) is the workload itself.
_LISTED_OWNER_KINDS = ("ReplicaSet", "Deployment", "StatefulSet", "Job", RAY_CLUSTER.kind)
# Custom resource owners listed only when a GPU pod resolves to one (pointed_kinds): a cluster without them pays no
# call, and one with them pays one paged list per kind, whatever its objects. Their labels (the Kueue queue, team)
# and annotations (a person's snooze or protect) are what the workload is judged and suspended by; a RayCluster's
# ownerReference is what makes a RayJob's pods one workload.
_CUSTOM_OWNER_KINDS = {k.kind: k for k in (RAY_CLUSTER, *KUEUE_JOB_KINDS.values())}
_MAX_OWNER_DEPTH = 5
_SPOT_LABELS = (("karpenter.sh/capacity-type", "spot"), ("eks.amazonaws.com/capacityType", "SPOT"),
                ("cloud.google.com/gke-spot", "true"), ("kubernetes.azure.com/scalesetpriority", "spot"))


class ClusterReadFailed(QueryFailed):
    """The Kubernetes API did not answer a read; the message names the server, verb and resource (no secret)."""

    def __init__(self, message: str, *, status: int | None = None, verb: str = "", resource: str = ""):
        super().__init__(message)
        self.status = status
        self.verb = verb
        self.resource = resource


# --------------------------------------------------------------------------- connecting


def api_client(kubeconfig: str | None = None, context: str | None = None, in_cluster: bool = False):
    """An ApiClient of the official client, from the in-cluster service account or a kubeconfig file
    (None: the client's default, $KUBECONFIG or ~/.kube/config). Nothing global is changed."""
    import yaml
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg,
                                    persist_config=False)
    except (config.ConfigException, yaml.YAMLError, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        where = "the in-cluster service account" if in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
        raise ClusterReadFailed(f"kubernetes: cannot load {where}: {str(exc)[:200]}") from None
    cfg.retries = 1  # urllib3 would retry 3 times per call; a failed read is reported, the next tick retries
    return client.ApiClient(cfg)


def server_of(api) -> str:
    """host:port of the API server, as errors name it (never a token)."""
    parsed = urlparse(api.configuration.host)
    return f"{parsed.hostname}:{parsed.port}" if parsed.port else (parsed.hostname or "kubernetes")


@dataclass(frozen=True)
class Listing:
    """One list call's items and the resourceVersion the server answered it at."""

    items: tuple[dict, ...]
    resource_version: str


class KubeReader:
    """Reads the API through the official client; every failure is a ClusterReadFailed."""

    def __init__(self, api, timeout_s: float = 10.0):
        self.api = api
        self.timeout_s = timeout_s
        self.server = server_of(api)
        self.calls_made = 0

    def _call(self, verb: str, resource: str, fn: Callable[..., Any], **kwargs) -> dict:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        self.calls_made += 1
        try:
            answer = fn(_preload_content=False, _request_timeout=(self.timeout_s, self.timeout_s), **kwargs)
            return json.loads(answer.data)
        except ApiException as exc:
            raise ClusterReadFailed(self._api_error(exc, verb, resource), status=exc.status, verb=verb,
                                    resource=resource) from None
        except HTTPError as exc:  # timeouts, refused connections, a TLS failure (MaxRetryError wraps them)
            cause = getattr(exc, "reason", None) or exc
            raise ClusterReadFailed(f"kubernetes API at {self.server}: {verb} {resource}: "
                                    f"{type(cause).__name__} (no answer within {self.timeout_s:g}s or refused)",
                                    verb=verb, resource=resource) from None
        except (ValueError, TypeError):  # not JSON: a proxy's page, a truncated body
            raise ClusterReadFailed(f"kubernetes API at {self.server}: {verb} {resource}: malformed answer",
                                    verb=verb, resource=resource) from None

    def _api_error(self, exc, verb: str, resource: str) -> str:
        message = ""
        try:
            message = str(json.loads(exc.body or "{}").get("message", ""))[:300]
        except (ValueError, AttributeError):
            pass
        head = f"kubernetes API at {self.server}: {verb} {resource}: {exc.status} {exc.reason}"
        if exc.status == 403:
            head += (f" (the service account needs {verb} on {resource}: deploy/kubernetes/workloads/"
                     "rbac-clusterrole.yaml)")
        elif exc.status == 401:
            head += " (credentials rejected: the kubeconfig's user or the service account token)"
        return f"{head}: {message}" if message else head

    def list(self, resource: str, fn: Callable[..., Any], **kwargs) -> Listing:
        """Every item of a paged list; the resourceVersion of its first page."""
        items: list[dict] = []
        token, version = None, ""
        while True:
            page = self._call("list", resource, fn, limit=PAGE_SIZE, **({"_continue": token} if token else {}),
                              **kwargs)
            if not isinstance(page, dict) or not isinstance(page.get("items"), list):
                raise ClusterReadFailed(f"kubernetes API at {self.server}: list {resource}: malformed answer",
                                        verb="list", resource=resource)
            items.extend(i for i in page["items"] if isinstance(i, dict))
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion", ""))
            token = meta.get("continue")
            if not token:
                return Listing(tuple(items), version)


# --------------------------------------------------------------------------- parsing (pure)


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(timezone.utc)
    except ValueError:
        return None


def quantity(value: Any) -> int:
    """A device count as Kubernetes writes it ("2", 2); GPUs are whole devices, anything else counts 0."""
    try:
        n = float(str(value).strip())
    except ValueError:
        return 0
    return int(n) if n >= 0 and n == int(n) else 0


def gpu_resources(resources: Mapping[str, Any] | None) -> dict[str, int]:
    """GPU devices (whole, MIG, shared replicas) and HAMi's fractional requests (nvidia.com/gpumem MiB,
    nvidia.com/gpucores %), which k8s.model.devices never counts as devices."""
    out: dict[str, int] = {}
    for name, value in (resources or {}).items():
        if (is_gpu_resource(name) or is_share_resource(name)) and quantity(value) > 0:
            out[name] = quantity(value)
    return out


def instance_id_of(provider_id: str, hostname: str) -> str:
    """The EC2 instance id from `aws:///us-east-1a/i-0abc` (or `aws://us-east-1a/i-0abc`), else the hostname."""
    if provider_id.startswith("aws://"):
        last = provider_id.rstrip("/").rsplit("/", 1)[-1]
        if last.startswith("i-"):
            return last
    return hostname


def parse_node(obj: Mapping[str, Any]) -> NodeInfo:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    labels = dict(meta.get("labels") or {})
    addresses = {a.get("type"): a.get("address", "") for a in status.get("addresses") or [] if isinstance(a, dict)}
    name = str(meta.get("name", ""))
    hostname = labels.get("kubernetes.io/hostname") or addresses.get("Hostname") or name
    provider_id = str(spec.get("providerID", ""))
    zone = labels.get("topology.kubernetes.io/zone", "")
    if not zone and provider_id.startswith("aws://"):
        parts = [p for p in provider_id[len("aws://"):].split("/") if p]
        zone = parts[0] if len(parts) == 2 else ""
    region = labels.get("topology.kubernetes.io/region") or (zone[:-1] if zone[-1:].isalpha() else zone)
    spot = any(labels.get(k) == v for k, v in _SPOT_LABELS)
    return NodeInfo(
        name=name, instance_id=instance_id_of(provider_id, hostname), provider_id=provider_id,
        instance_type=(labels.get("node.kubernetes.io/instance-type")
                       or labels.get("beta.kubernetes.io/instance-type", "")),
        region=region, zone=zone,
        created=parse_time(meta.get("creationTimestamp")) or datetime.min.replace(tzinfo=timezone.utc),
        # Allocatable is what pods can request; capacity when a server omits it.
        capacity=gpu_resources(status.get("allocatable") or status.get("capacity")),
        labels=labels, hostname=hostname, internal_ip=addresses.get("InternalIP", ""),
        lifecycle="spot" if spot else "on-demand",
        annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        unschedulable=spec.get("unschedulable") is True, resource_version=str(meta.get("resourceVersion", "")),
    )


def pod_gpu_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """The pod's effective GPU request per resource: its containers' sum, or its largest init container's
    (they run one at a time, before the others). Extended resources are set in limits; requests equal them."""

    def of(container: Mapping[str, Any]) -> dict[str, int]:
        res = container.get("resources") or {}
        return gpu_resources(res.get("requests") or res.get("limits"))

    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for name, n in of(c).items():
            total[name] = total.get(name, 0) + n
    for c in spec.get("initContainers") or []:
        for name, n in of(c).items():
            total[name] = max(total.get(name, 0), n)
    return total


def controller_of(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's controller ownerReference (else its first owner), None when unowned."""
    refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict) and r.get("kind") and r.get("name")]
    if not refs:
        return None
    ref = next((r for r in refs if r.get("controller")), refs[0])
    return str(ref["kind"]), str(ref["name"])


def resolve_workload(namespace: str, pod_meta: Mapping[str, Any],
                     owners: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> WorkloadRef:
    """Pure: pod -> the top controller, following ownerReferences through the listed ReplicaSets, Deployments,
    StatefulSets, Jobs and RayClusters (ReplicaSet -> Deployment, Job -> CronJob or JobSet, StatefulSet ->
    Notebook, RayCluster -> RayJob). An owner of another kind, or one not listed, is the workload as reported; an
    unowned pod is its own workload."""
    kind, name = "Pod", str(pod_meta.get("name", ""))
    meta: Mapping[str, Any] = pod_meta
    for _ in range(_MAX_OWNER_DEPTH):
        up = controller_of(meta)
        if up is None:
            break
        kind, name = up
        if kind not in _LISTED_OWNER_KINDS:
            break
        owner = owners.get((namespace, kind, name))
        if owner is None:
            break
        meta = owner.get("metadata") or {}
    return WorkloadRef(namespace, kind, name)


def parse_pod(obj: Mapping[str, Any], owners: Mapping[tuple[str, str, str], Mapping[str, Any]],
              holds: tuple = ()) -> PodInfo:
    """`holds`: the DRA devices its claims were allocated (dra.pod_holds)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    namespace = str(meta.get("namespace", ""))
    return PodInfo(dra=holds, 
        namespace=namespace, name=str(meta.get("name", "")), node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Unknown"), started=parse_time(status.get("startTime")),
        gpu_requests=pod_gpu_requests(spec), workload=resolve_workload(namespace, meta, owners),
        labels=dict(meta.get("labels") or {}), annotations=dict(meta.get("annotations") or {}),
        priority_class=str(spec.get("priorityClassName") or ""),
    )


def gpu_work_ended(obj: Mapping[str, Any]) -> tuple[bool, datetime | None]:
    """Pure: (requests GPUs, when its last container finished) of a finished pod; the time is None when no
    container status says (the caller then cannot tell when its GPU work ended)."""
    status = obj.get("status") or {}
    if not may_hold_gpus(obj):  # a DRA pod's claims may be gone with it: its claims are enough to count
        return False, None
    ends = [parse_time(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            for key in ("initContainerStatuses", "containerStatuses") for c in status.get(key) or []
            if isinstance(c, dict)]
    ends = [e for e in ends if e is not None]
    return True, max(ends) if ends else None


def workload_info(ref: WorkloadRef, owners: Mapping[tuple[str, str, str], Mapping[str, Any]],
                  pods: Sequence[PodInfo]) -> WorkloadInfo:
    """The workload's own labels and annotations (its pods' when the owner was not listed: `listed` False)."""
    obj = owners.get((ref.namespace, ref.kind, ref.name))
    if obj is None:
        first = next((p for p in pods if p.workload == ref), None)
        return WorkloadInfo(ref, dict(first.labels) if first else {}, dict(first.annotations) if first else {},
                            listed=False)
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    replicas = spec.get("replicas") if ref.scalable else None
    return WorkloadInfo(ref, dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}),
                        replicas if isinstance(replicas, int) else None, str(meta.get("resourceVersion", "")))


def owner_index(owners_by_kind: Mapping[str, Iterable[dict]]) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """Pure: the listed owners by (namespace, kind, name)."""
    owners: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for kind, objs in owners_by_kind.items():
        for obj in objs:
            meta = obj.get("metadata") or {}
            owners[(str(meta.get("namespace", "")), kind, str(meta.get("name", "")))] = obj
    return owners


def pointed_kinds(pods: Iterable[Mapping[str, Any]], owners_by_kind: Mapping[str, Iterable[dict]]) -> list[ApiKind]:
    """Pure: the custom owner kinds (RayCluster, JobSet, the Kubeflow jobs, RayJob) that a GPU pod resolves to
    through the owners listed so far and that were not listed (or tried) yet: what the snapshot lists next. A
    RayJob shows up only once the RayClusters are listed (its pods point to their RayCluster)."""
    owners = owner_index(owners_by_kind)
    done = set(owners_by_kind)
    wanted: dict[str, ApiKind] = {}
    for obj in pods:
        if not may_hold_gpus(obj):
            continue
        meta = obj.get("metadata") or {}
        kind = resolve_workload(str(meta.get("namespace", "")), meta, owners).kind
        if kind in _CUSTOM_OWNER_KINDS and kind not in done:
            wanted[kind] = _CUSTOM_OWNER_KINDS[kind]
    return [wanted[k] for k in sorted(wanted)]


def may_hold_gpus(obj: Mapping[str, Any]) -> bool:
    """Pure: requests device-plugin GPUs, or uses DRA ResourceClaims (which devices, the claims tell)."""
    return bool(devices(pod_gpu_requests(obj.get("spec") or {}))) or dra.uses_claims(obj)


def snapshot_from(read_at: datetime, nodes: Iterable[dict], pods: Iterable[dict],
                  owners_by_kind: Mapping[str, Iterable[dict]], namespaces: Iterable[dict], *,
                  namespace_allowed: Callable[[str, Mapping[str, str]], bool] = lambda n, l: True,
                  server: str = "", unread: Mapping[str, str] | None = None,
                  resource_slices: Iterable[dict] = (), resource_claims: Iterable[dict] = (),
                  device_classes: Iterable[dict] = (), claim_templates: Iterable[dict] = ()) -> ClusterSnapshot:
    """Pure: the listed objects as a ClusterSnapshot: GPU nodes, every pod holding GPUs (for cost shares) with
    the namespaces `namespace_allowed` leaves out of verdicts, their workloads. `unread`: owner kinds whose list
    failed, and why. `resource_slices` / `resource_claims`: DRA's (module dra): a node's published GPUs make it a
    GPU node, a pod's allocated claims its GPUs; `device_classes` / `claim_templates` name each hold's class and
    template."""
    owners = owner_index(owners_by_kind)
    ns_labels = {str((o.get("metadata") or {}).get("name", "")): dict((o.get("metadata") or {}).get("labels") or {})
                 for o in namespaces}
    pods = list(pods)
    by_node = dra.slices_by_node(resource_slices)
    resource_claims = list(resource_claims)
    claims = dra.claim_index(resource_claims)
    generated = dra.generated_claims(resource_claims)
    templates = dra.claim_templates(claim_templates)
    users = dra.claim_users((p for p in pods if dra.uses_claims(p)), generated)
    gpu_pods, others, out_of_scope = [], set(), set()
    for obj in pods:
        holds = dra.pod_holds(obj, claims, by_node, users, templates, generated) if dra.uses_claims(obj) else ()
        pod = parse_pod(obj, owners, holds)
        if not pod.gpu_devices:
            others.add(pod.key)
            continue
        gpu_pods.append(pod)
        if not namespace_allowed(pod.namespace, ns_labels.get(pod.namespace, {})):
            out_of_scope.add(pod.namespace)
    parsed = (replace(n, dra_devices=by_node.get(n.name, ())) for n in map(parse_node, nodes))
    gpu_nodes = tuple(sorted((n for n in parsed if n.is_gpu_node), key=lambda n: n.name))
    refs = sorted({p.workload for p in gpu_pods})
    return ClusterSnapshot(
        read_at=read_at, nodes=gpu_nodes, gpu_pods=tuple(sorted(gpu_pods, key=lambda p: p.key)),
        workloads={r: workload_info(r, owners, gpu_pods) for r in refs}, namespace_labels=ns_labels,
        other_pods=frozenset(others), server=server, out_of_scope=frozenset(out_of_scope),
        unread=dict(unread or {}), device_classes=dra.device_classes(device_classes),
    )


def namespace_filter(include: Sequence[str], exclude: Sequence[str],
                     selector: Mapping[str, str]) -> Callable[[str, Mapping[str, str]], bool]:
    """Which namespaces are read: listed ones (empty = all), minus excluded, whose labels carry `selector`."""

    def allowed(name: str, labels: Mapping[str, str]) -> bool:
        if include and name not in include:
            return False
        if name in exclude:
            return False
        return all(labels.get(k) == v for k, v in selector.items())

    return allowed


def kubeconfig_path(kubeconfig: str | None, config_path: str = "") -> str | None:
    """`~` expanded; relative to the folder of the config file that names it (None: the client's default)."""
    if not kubeconfig:
        return None
    path = Path(kubeconfig).expanduser()
    if not path.is_absolute() and config_path:
        path = Path(config_path).resolve().parent / path
    return str(path)


# --------------------------------------------------------------------------- who else owns spec.replicas (pure)

# KEDA's ScaledObject (keda.sh/v1alpha1): absent from a cluster without KEDA (its list answers 404).
KEDA_GROUP, KEDA_VERSION, KEDA_PLURAL = "keda.sh", "v1alpha1", "scaledobjects"


def autoscaler_targets(hpas: Iterable[Mapping[str, Any]],
                       scaled_objects: Iterable[Mapping[str, Any]]) -> dict[WorkloadRef, tuple[str, str]]:
    """Pure: workload -> (kind, namespace/name) of the autoscaler whose scaleTargetRef names it: an
    autoscaling/v2 HorizontalPodAutoscaler, or a KEDA ScaledObject (its target's kind defaults to Deployment).
    A ScaledObject wins over the HPA KEDA makes for it (`keda-hpa-<name>`): KEDA is the owner to act through."""
    out: dict[WorkloadRef, tuple[str, str]] = {}
    for kind, objs, default_kind in (("HorizontalPodAutoscaler", hpas, ""), ("ScaledObject", scaled_objects,
                                                                              "Deployment")):
        for obj in objs:
            meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
            target = spec.get("scaleTargetRef") or {}
            namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            target_kind = str(target.get("kind") or default_kind)
            if not target.get("name") or not target_kind:
                continue
            out[WorkloadRef(namespace, target_kind, str(target["name"]))] = (kind, f"{namespace}/{name}")
    return out


# --------------------------------------------------------------------------- the source


class KubernetesCluster:
    """The cluster reader: one snapshot = nodes, namespaces, pods, ReplicaSets, Deployments, StatefulSets and
    Jobs, each one paged list across all namespaces (7 list calls for a small cluster, whatever its pods), and one
    more per custom owner kind a GPU pod points to (RayCluster, JobSet, PyTorchJob, RayJob, ...: pointed_kinds)."""

    def __init__(self, api, *, timeout_s: float = 10.0,
                 namespace_allowed: Callable[[str, Mapping[str, str]], bool] = lambda n, l: True):
        self.reader = KubeReader(api, timeout_s)
        self.namespace_allowed = namespace_allowed

    @classmethod
    def from_settings(cls, settings, config_path: str = "") -> "KubernetesCluster":
        """From the `kubernetes:` section of the config (gpufinops.config.KubernetesSettings); a relative
        kubeconfig path is relative to the config file at `config_path`, as every path of the config is."""
        api = api_client(kubeconfig_path(settings.kubeconfig, config_path), settings.context, settings.in_cluster)
        return cls(api, timeout_s=settings.timeout_s, namespace_allowed=namespace_filter(
            settings.namespaces, settings.exclude_namespaces, settings.namespace_selector))

    @property
    def calls_made(self) -> int:
        return self.reader.calls_made

    def autoscalers(self, namespace: str = "") -> dict[WorkloadRef, tuple[str, str]]:
        """Workload -> the HPA or KEDA ScaledObject scaling it, cluster-wide or in one namespace (two paged lists;
        KEDA's 404 = KEDA is not installed). Raises ClusterReadFailed when the API does not answer."""
        from kubernetes import client

        r = self.reader
        hpa, custom = client.AutoscalingV2Api(r.api), client.CustomObjectsApi(r.api)
        if namespace:
            hpas = r.list("horizontalpodautoscalers", hpa.list_namespaced_horizontal_pod_autoscaler,
                          namespace=namespace)
            keda = lambda **kw: custom.list_namespaced_custom_object(  # noqa: E731
                KEDA_GROUP, KEDA_VERSION, namespace, KEDA_PLURAL, **kw)
        else:
            hpas = r.list("horizontalpodautoscalers", hpa.list_horizontal_pod_autoscaler_for_all_namespaces)
            keda = lambda **kw: custom.list_cluster_custom_object(  # noqa: E731
                KEDA_GROUP, KEDA_VERSION, KEDA_PLURAL, **kw)
        try:
            scaled = r.list(KEDA_PLURAL, keda).items
        except ClusterReadFailed as exc:
            if exc.status != 404:
                raise
            scaled = ()
        return autoscaler_targets(hpas.items, scaled)

    def gpu_work_ended_on(self, node_names: Iterable[str]) -> dict[str, datetime | None]:
        """Node -> when the last finished GPU pod on it ended, for the nodes named (those the watch saw free at the
        last read too): a GPU pod that started and finished between two reads is invisible to the snapshot, which
        leaves finished pods out. One paged list per node, `spec.nodeName` and the phase filtered server-side
        (finished pods stay listed until the pod garbage collector or their Job's TTL removes them). A node
        absent from the answer had none; None: a finished GPU pod whose end time no status gives. Raises
        ClusterReadFailed when the API does not answer (the caller then judges no node this tick)."""
        from kubernetes import client

        core = client.CoreV1Api(self.reader.api)
        out: dict[str, datetime | None] = {}
        for name in sorted(set(node_names)):
            pods = self.reader.list("pods", core.list_pod_for_all_namespaces,
                                    field_selector=f"spec.nodeName={name},status.phase!=Running,"
                                                   f"status.phase!=Pending")
            ends = [ended for wanted, ended in map(gpu_work_ended, pods.items) if wanted]
            if ends:
                out[name] = None if None in ends else max(ends)
        return out

    def snapshot(self, now: datetime) -> ClusterSnapshot:
        from kubernetes import client

        r = self.reader
        core, apps, batch = client.CoreV1Api(r.api), client.AppsV1Api(r.api), client.BatchV1Api(r.api)
        nodes = r.list("nodes", core.list_node)
        namespaces = r.list("namespaces", core.list_namespace)
        # Finished pods hold no GPU: left out server-side.
        pods = r.list("pods", core.list_pod_for_all_namespaces,
                      field_selector="status.phase!=Succeeded,status.phase!=Failed")
        owners = {
            "ReplicaSet": r.list("replicasets", apps.list_replica_set_for_all_namespaces).items,
            "Deployment": r.list("deployments", apps.list_deployment_for_all_namespaces).items,
            "StatefulSet": r.list("statefulsets", apps.list_stateful_set_for_all_namespaces).items,
            "Job": r.list("jobs", batch.list_job_for_all_namespaces).items,
        }
        unread: dict[str, str] = {}
        slices, claims, classes, templates = self.dra_objects(unread)
        gpu_pods = [p for p in pods.items if may_hold_gpus(p)]
        # Round one finds RayClusters, JobSets and Kubeflow jobs; round two the RayJobs above the RayClusters.
        for _ in range(2):
            for kind in pointed_kinds(gpu_pods, owners):
                owners[kind.kind], problem = self.custom_objects(kind)  # () when it failed: tried once a tick
                if problem:
                    unread[kind.kind] = problem
        return snapshot_from(now, nodes.items, pods.items, owners, namespaces.items,
                             namespace_allowed=self.namespace_allowed, server=r.server, unread=unread,
                             resource_slices=slices, resource_claims=claims, device_classes=classes,
                             claim_templates=templates)

    def dra_objects(self, unread: dict[str, str]) -> tuple[tuple[dict, ...], ...]:
        """DRA's ResourceSlices, ResourceClaims, DeviceClasses and ResourceClaimTemplates, cluster-wide (four paged
        lists). The official client 33.x has no resource.k8s.io/v1 models, so they are read as raw REST through its
        ApiClient (`call_api`), with the same paging, timeouts and errors as every other list. A 404 (a server
        before 1.34, or the API switched off) is none. Any other failure of the slices or the claims is neither,
        the reason in `unread`: claims without their slices, or slices without their claims, would price every DRA
        GPU as idle capacity. Classes and templates only name what the claims already say: their failure (an
        older ClusterRole without resourceclaimtemplates) is logged and leaves them out, every figure unchanged."""
        r = self.reader

        def raw(plural: str):
            def call(_preload_content=False, _request_timeout=None, limit=None, _continue=None):
                query = [("limit", limit)] + ([("continue", _continue)] if _continue else [])
                return r.api.call_api(f"/apis/{dra.RESOURCE_GROUP}/{dra.RESOURCE_VERSION}/{plural}", "GET",
                                      query_params=query, header_params={"Accept": "application/json"},
                                      auth_settings=["BearerToken"], _return_http_data_only=True,
                                      _preload_content=_preload_content, _request_timeout=_request_timeout)
            return call

        try:
            slices = r.list(f"{dra.SLICES}.{dra.RESOURCE_GROUP}", raw(dra.SLICES)).items
            claims = r.list(f"{dra.CLAIMS}.{dra.RESOURCE_GROUP}", raw(dra.CLAIMS)).items
        except ClusterReadFailed as exc:
            if exc.status != 404:
                unread[dra.RESOURCE_GROUP] = str(exc)
                log.warning("DRA not read this tick (GPUs allocated through ResourceClaims are not seen, priced "
                            "or judged): %s", exc)
            return (), (), (), ()
        if not slices and not claims:
            return (), (), (), ()  # no DRA in use: the names of classes and templates would say nothing
        named = []
        for plural in (dra.CLASSES, dra.TEMPLATES):
            try:
                named.append(r.list(f"{plural}.{dra.RESOURCE_GROUP}", raw(plural)).items)
            except ClusterReadFailed as exc:
                if exc.status != 404:
                    log.warning("DRA %s not read this tick (claims are priced and judged all the same, without "
                                "their names): %s", plural, exc)
                named.append(())
        return slices, claims, named[0], named[1]

    def custom_objects(self, kind: ApiKind) -> tuple[tuple[dict, ...], str]:
        """Every object of a custom resource kind, cluster-wide (one paged list), and "" ; a 404 (its CRD is not
        installed) is none. Any other failure is none and why (a 403 names the RBAC file): the workloads of that
        kind are reported with the reason, never changed, and everything else is read as usual."""
        from kubernetes import client

        custom = client.CustomObjectsApi(self.reader.api)
        try:
            return self.reader.list(kind.resource, lambda **kw: custom.list_cluster_custom_object(
                kind.group, kind.version, kind.plural, **kw)).items, ""
        except ClusterReadFailed as exc:
            return (), "" if exc.status == 404 else str(exc)
