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
    """The Deployment or StatefulSet `NS/NAME` (or `NS/Kind/NAME`, or its id) names; ValueError when none or both."""
    namespace, kind, name = parse_target(text)
    if kind is not None:
        ref = WorkloadRef(namespace, kind, name)
        if not ref.scalable:
            raise ValueError(f"{text!r}: only a Deployment or StatefulSet is restored, not a {kind}")
        return ref
    found = []
    for candidate in ("Deployment", "StatefulSet"):
        ref = WorkloadRef(namespace, candidate, name)
        if cloud.describe([workload_id(ref)]):
            found.append(ref)
    if not found:
        raise ValueError(f"{text!r}: no Deployment or StatefulSet {name} in namespace {namespace}")
    if len(found) > 1:
        raise ValueError(f"{text!r}: both a Deployment and a StatefulSet are named {name}: say "
                         f"{namespace}/Deployment/{name} or {namespace}/StatefulSet/{name}")
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
    unconfirmed (the row stays open and is reconciled). The row is kind `restore`, its reason naming who asked."""
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
    count, problem = cloud.restorable(ref)
    if count is None:  # nothing of gpufinops' to undo: nothing is asked of the API server, nothing recorded
        return RestoreOutcome(False, iid, problem, dry_run)
    try:
        [inst] = cloud.describe([iid])
    except (ValueError, KubeReadFailed) as exc:
        return RestoreOutcome(False, iid, f"kubernetes: {ref} could not be read: {exc}", dry_run)
    by = f" for {who}" if who else ""
    reason = f"restore {ref} to {count} replicas{by} (gpufinops k8s restore)"
    done: list[Restored] = []
    ctx = RunContext(now=now, dry_run=dry_run, lease=lease)
    try:
        outcome = actuator._change(ctx, inst, ActionKind.RESTORE, "", reason,
                                   lambda: done.append(cloud.restore(ref, who)), verify=is_restored)
    except NotLeader as exc:
        return RestoreOutcome(False, iid, f"{reason}: not done: {exc}", dry_run)
    if dry_run:
        return RestoreOutcome(True, iid, f"dry-run: would restore {ref} to {count} replicas{by} "
                                         f"(gpufinops k8s restore); it was NOT changed", True)
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
