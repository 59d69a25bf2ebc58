"""`gpufinops k8s restore`: scale a workload gpufinops scaled to zero back to its replica count, through the act
stage's one door, `Actuator._change`: the same dry-run flag (`act.dry_run`, or `--dry-run`), the intent row
(kind `restore`) written before the one preconditioned PATCH, the object read back after an ambiguous answer (a
5xx, a timeout), and a row left open ("unconfirmed") settled by `Actuator.reconcile` from the workload's state
once no request can still be in flight: by the service's next tick, or by the next `gpufinops k8s restore`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from ..collect.kubernetes_cloud import (
    KubeReadFailed,
    Restored,
    WorkloadCloud,
    node_id,
    parse_target,
    workload_id,
)
from ..k8s.model import WorkloadRef
from ..model import ActionKind, GpuInstance, LeaseCheck, RunContext
from .actuator import UNSETTLED, Actuator, NotLeader

log = logging.getLogger("gpufinops.kubernetes")


@dataclass(frozen=True)
class RestoreOutcome:
    ok: bool
    instance_id: str
    message: str
    dry_run: bool


def find_target(cloud: WorkloadCloud, text: str) -> WorkloadRef:
    """The Deployment or StatefulSet (or, with kubernetes.suspend_kueue, the Kueue-managed Job) `NS/NAME` (or
    `NS/Kind/NAME`, or its id) names; ValueError when none or several."""
    namespace, kind, name = parse_target(text)
    kinds = ("Deployment", "StatefulSet", "Job") if getattr(cloud, "suspend_kueue", False) else (
        "Deployment", "StatefulSet")
    if kind is not None:
        ref = WorkloadRef(namespace, kind, name)
        if ref.kind not in kinds:
            also = " (or, with kubernetes.suspend_kueue: true, a Kueue-managed Job)" if "Job" not in kinds else \
                " or a Kueue-managed Job"
            raise ValueError(f"{text!r}: only a Deployment or StatefulSet{also} is restored, not a {kind}")
        return ref
    found = []
    for candidate in kinds:
        ref = WorkloadRef(namespace, candidate, name)
        if cloud.describe([workload_id(ref)]):
            found.append(ref)
    if not found:
        raise ValueError(f"{text!r}: no Deployment or StatefulSet {name} in namespace {namespace}")
    if len(found) > 1:
        raise ValueError(f"{text!r}: {' and '.join(f'a {r.kind}' for r in found)} are named {name}: say "
                         + " or ".join(f"{namespace}/{r.kind}/{name}" for r in found))
    return found[0]


def is_restored(inst: GpuInstance | None) -> bool:
    """What the read-back and reconcile of a RESTORE row look for: the workload is no longer scaled down by
    gpufinops (it has replicas, or the kept count is gone). A workload that vanished is not restored."""
    return inst is not None and inst.state != "stopped"


def restore_workload(cloud: WorkloadCloud, store, text: str, now: datetime, *, dry_run: bool, who: str = "",
                     lease: LeaseCheck | None = None) -> RestoreOutcome:
    """Scale a workload gpufinops scaled to zero back to its kept count, through `Actuator._change`.

    Dry-run reads, records "dry-run: would restore ..." and changes nothing. Live: an earlier restore of it still
    open is settled first (reconcile); any other unsettled change of it makes this wait (nothing is done to a
    workload whose last change is not settled); then the intent row, one preconditioned patch (a 409 is re-read
    and retried once by the cloud), and on an error the read-back: done, failed (a 4xx and not restored), or
    unconfirmed (the row stays open and is reconciled). The row is kind `restore`, its reason naming who asked.
    `node/NAME`: uncordon a GPU node gpufinops cordoned (action: drain), the same way."""
    if text.startswith("node/"):
        return _uncordon(cloud, store, text[len("node/"):], now, dry_run=dry_run, who=who, lease=lease)
    try:
        ref = find_target(cloud, text)
    except (ValueError, KubeReadFailed) as exc:
        return RestoreOutcome(False, text, str(exc), dry_run)
    iid = workload_id(ref)
    # Restore sends no message and reads no setting: the chokepoint needs only the cloud and the store.
    actuator = Actuator(cloud, store, notifier=None, settings=None)  # type: ignore[arg-type]
    waiting = _unsettled(actuator, iid, now, lease)
    if waiting:
        return RestoreOutcome(False, iid, waiting, dry_run)
    if ref.kind == "Job":  # a Kueue-managed Job gpufinops suspended: its Kueue Workload back to spec.active: true
        kueue, problem = cloud.resumable(ref)
        what = f"resume {ref} (Kueue Workload {kueue} spec.active: true)"
    else:
        count, problem = cloud.restorable(ref)
        what = f"restore {ref} to {count} replicas"
    if problem:  # nothing of gpufinops' to undo: nothing is asked of the API server, nothing recorded
        return RestoreOutcome(False, iid, problem, dry_run)
    try:
        [inst] = cloud.describe([iid])
    except (ValueError, KubeReadFailed) as exc:
        return RestoreOutcome(False, iid, f"kubernetes: {ref} could not be read: {exc}", dry_run)
    by = f" for {who}" if who else ""
    reason = f"{what}{by} (gpufinops k8s restore)"
    done: list[Restored] = []
    ctx = RunContext(now=now, dry_run=dry_run, lease=lease)
    try:
        outcome = actuator._change(ctx, inst, ActionKind.RESTORE, "", reason,
                                   lambda: done.append(cloud.restore(ref, who)), verify=is_restored)
    except NotLeader as exc:
        return RestoreOutcome(False, iid, f"{reason}: not done: {exc}", dry_run)
    if dry_run:
        return RestoreOutcome(True, iid, f"dry-run: would {what}{by} (gpufinops k8s restore); it was NOT changed",
                              True)
    if outcome.ok:
        message = f"{ref} {done[0].reason} (gpufinops k8s restore)" if done else \
            f"{reason}: found restored by the read-back after: {outcome.error or 'an error'}"
        log.info("%s", message)
        return RestoreOutcome(True, iid, message, False)
    if outcome.ok is None:
        return RestoreOutcome(False, iid, f"{reason}: outcome unknown ({outcome.error}); the audit row stays open and "
                                          f"is settled from the workload's state once no request can still be in "
                                          f"flight (the service's next tick, or the next k8s restore)", False)
    return RestoreOutcome(False, iid, f"{reason}: not done: {outcome.error}", False)


def _unsettled(actuator: Actuator, iid: str, now: datetime, lease: LeaseCheck | None) -> str:
    """"" when nothing earlier of this workload is open; else why the restore waits. An open RESTORE row is
    settled here first (from the workload's state, once no request can still be in flight)."""
    rows = actuator.store.action_rows(status=UNSETTLED, instance_id=iid)
    if any(r.kind == ActionKind.RESTORE for r in rows):
        actuator.reconcile(now, lease=lease, instance_ids=[iid], kinds=[ActionKind.RESTORE])
        rows = actuator.store.action_rows(status=UNSETTLED, instance_id=iid)
    if not rows:
        return ""
    row = rows[0]
    return (f"kubernetes: an earlier {row.kind.value} of {iid} ({row.at:%Y-%m-%d %H:%M:%S} UTC) is not settled yet "
            f"({row.status}): nothing more is done to it until it is; try again in a minute")


def _uncordon(cloud: WorkloadCloud, store, name: str, now: datetime, *, dry_run: bool, who: str,
              lease: LeaseCheck | None) -> RestoreOutcome:
    """Uncordon a node gpufinops cordoned: `spec.unschedulable: false` and its annotations removed, through
    `Actuator._change` (intent row, one preconditioned PATCH, read-back). A node cordoned by someone else, or not
    cordoned, is left alone and nothing is recorded."""
    iid = node_id(name)
    actuator = Actuator(cloud, store, notifier=None, settings=None)  # type: ignore[arg-type]
    waiting = _unsettled(actuator, iid, now, lease)
    if waiting:
        return RestoreOutcome(False, iid, waiting, dry_run)
    try:
        found = cloud.describe([iid])
    except KubeReadFailed as exc:
        return RestoreOutcome(False, iid, f"kubernetes: node {name} could not be read: {exc}", dry_run)
    if not found:
        return RestoreOutcome(False, iid, f"kubernetes: node {name} not found", dry_run)
    inst = found[0]
    if inst.state != "stopped":
        return RestoreOutcome(False, iid, f"kubernetes: node {name} is not cordoned by gpufinops ({inst.state}): "
                                          "left alone", dry_run)
    by = f" for {who}" if who else ""
    reason = f"uncordon node {name}{by} (gpufinops k8s restore)"
    ctx = RunContext(now=now, dry_run=dry_run, lease=lease)
    try:
        outcome = actuator._change(ctx, inst, ActionKind.RESTORE, "", reason, lambda: cloud.uncordon(name, who),
                                   verify=is_restored)
    except NotLeader as exc:
        return RestoreOutcome(False, iid, f"{reason}: not done: {exc}", dry_run)
    if dry_run:
        return RestoreOutcome(True, iid, f"dry-run: would {reason}; it was NOT changed", True)
    if outcome.ok:
        return RestoreOutcome(True, iid, f"node {name} uncordoned{by} (gpufinops k8s restore)", False)
    if outcome.ok is None:
        return RestoreOutcome(False, iid, f"{reason}: outcome unknown ({outcome.error}); the audit row stays open "
                                          "and is settled by the next tick", False)
    return RestoreOutcome(False, iid, f"{reason}: not done: {outcome.error}", False)
