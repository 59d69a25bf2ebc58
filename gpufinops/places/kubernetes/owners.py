"""Who else owns a Kubernetes workload's fate, pure: an HPA or a KEDA ScaledObject, Argo CD or Flux, Kueue, or its
kind (Jobs, CronJobs, bare pods, custom resources). Each answer is `(managed_by, managed_advice)`: the owner, and
the owner's way to do what gpufinops will not (KEDA's paused-replicas annotation, the exact change in Git). And the
Kueue Workload helpers: Workloads by the job that owns them, suspended by gpufinops or not, a Workload's name, its
WorkloadPriorityClass, and the annotations a Kueue job is judged by.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from gpufinops.k8s.model import (
    DEFAULT_PROTECT_KEY,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    KUEUE_SUSPEND_KINDS,
    MARK_ANNOTATION,
    PRE_SUSPEND_ANNOTATION,
    SUSPENDED_ANNOTATION,
    TAG_WORKLOAD_PRIORITY_CLASS,
    WorkloadRef,
)
from gpufinops.places.kubernetes.cluster import controller_of
from gpufinops.places.kubernetes.names import ANNOTATION_PREFIX, KUEUE_WORKLOAD_PRIORITY_SOURCE

ARGOCD_TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
ARGOCD_INSTANCE_LABELS = ("argocd.argoproj.io/instance", "app.kubernetes.io/instance")
FLUX_OWNER_LABELS = (("kustomize.toolkit.fluxcd.io", "Kustomization"), ("helm.toolkit.fluxcd.io", "HelmRelease"))
KEDA_PAUSED_REPLICAS = "autoscaling.keda.sh/paused-replicas"


def gitops_owner(ref: WorkloadRef, labels: Mapping[str, str], annotations: Mapping[str, str]) -> tuple[str, str]:
    """(managed_by, managed_advice) when a GitOps controller syncs this object from Git (it would put spec.replicas
    back at its next sync), ("", "") otherwise. Argo CD: its tracking annotation (`<app>:<group>/<kind>:<ns>/<name>`;
    the `app.kubernetes.io/instance` label alone is Helm's too, so it only names the app); Flux: the
    `kustomize.toolkit.fluxcd.io/name` / `helm.toolkit.fluxcd.io/name` labels."""
    what = f"{ref.kind} {ref.namespace}/{ref.name}"
    tracking = annotations.get(ARGOCD_TRACKING_ANNOTATION, "")
    argo_label = labels.get(ARGOCD_INSTANCE_LABELS[0], "")
    if tracking or argo_label:
        app = tracking.split(":", 1)[0] if tracking else argo_label
        app = app or labels.get(ARGOCD_INSTANCE_LABELS[1], "") or "?"
        return (f"Argo CD (application '{app}')",
                f"notify only: Argo CD would undo a scale-down at its next sync; set `spec.replicas: 0` on {what} in "
                f"the Git source of Argo CD application '{app}' (or remove it there)")
    for group, kind in FLUX_OWNER_LABELS:
        name = labels.get(f"{group}/name")
        if name:
            owner = f"{labels.get(f'{group}/namespace', ref.namespace)}/{name}"
            return (f"Flux ({kind} '{owner}')",
                    f"notify only: Flux would undo a scale-down at its next reconcile; set `spec.replicas: 0` on "
                    f"{what} in the source of Flux {kind} '{owner}' (or remove it there)")
    return "", ""


def autoscaler_owner(ref: WorkloadRef, autoscaler: tuple[str, str] | None) -> tuple[str, str]:
    """(managed_by, managed_advice) for a workload an HPA or a KEDA ScaledObject scales; ("", "") for none."""
    if autoscaler is None:
        return "", ""
    kind, name = autoscaler
    if kind == "unreadable":
        return (f"an autoscaler gpufinops could not check ({name})",
                "reported only until the HPAs and KEDA ScaledObjects can be listed (deploy/kubernetes/workloads/"
                "rbac-clusterrole.yaml)")
    ns, _, short = name.partition("/")
    if kind == "ScaledObject":
        return (f"KEDA ScaledObject '{name}'",
                f"notify only: KEDA owns spec.replicas and would undo a scale-down; pause it at zero through KEDA: "
                f"`kubectl annotate scaledobject -n {ns} {short} {KEDA_PAUSED_REPLICAS}=0` (remove the annotation "
                f"to resume)")
    return (f"HorizontalPodAutoscaler '{name}'",
            f"reported only: the HPA owns spec.replicas (a scale to zero would switch autoscaling off, or be "
            f"undone); lower its minReplicas, or delete HPA {name} if {ref.kind} {ref.name} is not needed")


def manager_of(ref: WorkloadRef, labels: Mapping[str, str], scale_to_zero: bool = True,
               annotations: Mapping[str, str] | None = None,
               autoscaler: tuple[str, str] | None = None, kueue_workload: str = "",
               kueue_note: str = "", unread: str = "") -> tuple[str, str]:
    """(managed_by, managed_advice): what else owns this workload's fate, ("", "") for a Deployment/StatefulSet
    gpufinops may scale. With `kubernetes.scale_to_zero` off (the default) no workload may be scaled: adding a
    `kubernetes:` section must not let rules written for EC2 instances start scaling Deployments. An HPA or KEDA
    ScaledObject targeting it (`autoscaler`, from KubernetesCluster.autoscalers) or a GitOps controller syncing it
    owns spec.replicas: never patched, the owner's way is named instead. A Kueue-managed job (KUEUE_SUSPEND_KINDS)
    whose Kueue Workload was read (`kueue_workload`, with kubernetes.suspend_kueue on) is gpufinops' to suspend
    under a rule with `action: suspend` (act.plan.stop_blocker refuses any other action); `kueue_note` says why one
    is not. `unread`: why the object itself could not be read this tick (unread_reason): judged on its pods' labels,
    never changed."""
    if unread:
        return (f"its {ref.kind} '{ref.name}' (not read this tick)", f"notify only this tick: {unread}")
    queue = labels.get(KUEUE_QUEUE_LABEL)
    if queue:
        if kueue_workload and ref.kind in KUEUE_SUSPEND_KINDS:
            return "", ""
        return (f"Kueue (queue '{queue}')",
                kueue_note or ("notify only: gpufinops suspends a Kueue-managed job (a Job, JobSet, Kubeflow "
                               "training job or RayJob) through Kueue only with kubernetes.suspend_kueue: true and "
                               "a rule with action: suspend; suspend or delete it in its queue"))
    if ref.kind == "Job":
        return (f"Kubernetes Job '{ref.name}'",
                "reported only: gpufinops never stops Jobs; lower its parallelism or delete it")
    if ref.kind == "CronJob":
        return (f"Kubernetes CronJob '{ref.name}'",
                "reported only: gpufinops never stops CronJobs; suspend it (spec.suspend: true) or fix its schedule")
    if ref.kind == "Pod":
        return ("no controller (a bare Kubernetes Pod)",
                "reported only: gpufinops never deletes pods; delete it if nobody needs it")
    if not ref.scalable:
        return (f"its {ref.kind} '{ref.name}' (a custom resource's controller)",
                f"reported only: stop or scale the {ref.kind} itself (scaling what it owns would be undone)")
    owner = autoscaler_owner(ref, autoscaler)
    if not owner[0]:
        owner = gitops_owner(ref, labels, annotations or {})
    if owner[0]:
        return owner
    if not scale_to_zero:
        return ("Kubernetes (gpufinops' scale-to-zero is off)",
                "warned and reported only; set kubernetes.scale_to_zero: true to let gpufinops scale idle "
                "Deployments and StatefulSets to zero")
    return "", ""


def kueue_workloads_by_owner(objs: Iterable[Mapping[str, Any]]) -> dict[WorkloadRef, dict]:
    """Pure: Kueue Workloads by the object that owns them (Kueue makes one per job, for its top object: a Job, a
    JobSet, a PyTorchJob, a RayJob; its controller ownerReference names that object)."""
    out: dict[WorkloadRef, dict] = {}
    for obj in objs:
        meta = obj.get("metadata") or {}
        up = controller_of(meta)
        if up is not None:
            out[WorkloadRef(str(meta.get("namespace", "")), up[0], up[1])] = dict(obj)
    return out


def kueue_suspended(obj: Mapping[str, Any] | None) -> bool:
    """Suspended by gpufinops: the Kueue Workload deactivated (spec.active: false) *and* gpufinops' annotation,
    written in the same patch. Deactivated by someone else is not gpufinops' to resume."""
    if not obj:
        return False
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return (obj.get("spec") or {}).get("active") is False and SUSPENDED_ANNOTATION in annotations


def kueue_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def workload_priority_class(labels: Mapping[str, str], kueue_workload: Mapping[str, Any] | None) -> dict[str, str]:
    """{TAG_WORKLOAD_PRIORITY_CLASS: name} from the Job's kueue.x-k8s.io/priority-class label, else its Kueue
    Workload's priorityClassName when that is a WorkloadPriorityClass (not a pod PriorityClass); {} when none."""
    name = labels.get(KUEUE_PRIORITY_LABEL, "")
    spec = (kueue_workload or {}).get("spec") or {}
    if not name and spec.get("priorityClassSource") == KUEUE_WORKLOAD_PRIORITY_SOURCE:
        name = str(spec.get("priorityClassName") or "")
    return {TAG_WORKLOAD_PRIORITY_CLASS: name} if name else {}


def kueue_annotations(job_annotations: Mapping[str, str], kueue_workload: Mapping[str, Any],
                      protect_key: str = DEFAULT_PROTECT_KEY) -> dict[str, str]:
    """The annotations a Kueue-managed Job is judged by: its own, with gpufinops' (mark, snooze, protect, stopped-by)
    read from its Kueue Workload winning. The mark lives on the Workload only, the object whose patch it fences;
    a person's snooze or protect counts on either object."""
    out = {k: v for k, v in job_annotations.items() if k not in (MARK_ANNOTATION, PRE_SUSPEND_ANNOTATION)}
    theirs = (kueue_workload.get("metadata") or {}).get("annotations") or {}
    out.update({k: str(v) for k, v in theirs.items() if k.startswith(ANNOTATION_PREFIX) or k == protect_key})
    return out

