"""`gpufinops k8s restore`: scale a workload gpufinops scaled to zero back to its replica count, through the act
stage's one door, `Actuator.change`: the same dry-run flag (`act.dry_run`, or `--dry-run`), the intent row
(kind `restore`) written before the one preconditioned PATCH, the object read back after an ambiguous answer (a
5xx, a timeout), and a row left open ("unconfirmed") settled by `Actuator.reconcile` from the workload's state
once no request can still be in flight: by the service's next tick, or by the next `gpufinops k8s restore`.

The Restore button of a stop notice (notify/interact.py records the click) comes here too: the leader's tick
calls `apply_restore_requests`, which restores each clicked subject with `restore_workload` and tells the result
once (the notice edited in place, one reply under it). A result that was "not known yet" (an ambiguous answer) is
told again, once, when reconcile has settled its row from the workload's state: restored, or not done.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..places.kubernetes.cloud import WorkloadCloud
from ..places.kubernetes.names import KubeReadFailed, Restored, parse_target, workload_id
from ..places.kubernetes.nodes import is_node_id, node_id
from ..k8s.model import KUEUE_JOB_KINDS, KUEUE_SUSPEND_KINDS, WorkloadRef
from ..model import ActionKind, GpuInstance, LeaseCheck, RunContext
from ..notify import interact, messages
from .actuator import UNSETTLED, Actuator, NotLeader, check_lease
from .plan import parse_time

log = logging.getLogger("gpufinops.kubernetes")


# What a restore came to (RestoreOutcome.status): the Restore button's result line says each differently.
RESTORED = "restored"  # done, or found done by the read-back after an error
WOULD_RESTORE = "would_restore"  # dry-run
NOTHING_TO_RESTORE = "nothing_to_restore"  # not gpufinops' to undo, not found, not readable: nothing asked
WAITING = "waiting"  # an earlier change of it is not settled: nothing done yet
FAILED = "failed"  # refused (a 4xx) and read back not restored
UNKNOWN = "unknown"  # ambiguous answer: its row stays open until reconcile settles it
SETTLED_RESTORED = "settled_restored"  # an UNKNOWN one, found restored by reconcile (by this click or by anyone)
NOT_LEADER = "not_leader"  # the scheduler lease was lost before the call: nothing done
CLI = "gpufinops k8s restore"
BUTTON = f"{interact.CHAT} Restore button"
# How long a Restore click waits for an earlier change of its subject to settle before it is answered "not done".
CLICK_PATIENCE = timedelta(minutes=10)


@dataclass(frozen=True)
class RestoreOutcome:
    ok: bool
    instance_id: str
    message: str
    dry_run: bool
    status: str = ""
    replicas: int | None = None  # the count a Deployment/StatefulSet is (or would be) restored to


def find_target(cloud: WorkloadCloud, text: str) -> WorkloadRef:
    """The Deployment or StatefulSet (or, with kubernetes.suspend_kueue, the Kueue-managed Job) `NS/NAME` (or
    `NS/Kind/NAME`, or its id) names; ValueError when none or several."""
    namespace, kind, name = parse_target(text)
    kinds = ("Deployment", "StatefulSet", *KUEUE_SUSPEND_KINDS) if getattr(cloud, "suspend_kueue", False) else (
        "Deployment", "StatefulSet")
    if kind is not None:
        ref = WorkloadRef(namespace, kind, name)
        if ref.kind not in kinds:
            also = " (or, with kubernetes.suspend_kueue: true, a Kueue-managed job)" if "Job" not in kinds else \
                f" or a Kueue-managed {'/'.join(KUEUE_SUSPEND_KINDS)}"
            raise ValueError(f"{text!r}: only a Deployment or StatefulSet{also} is restored, not a {kind}")
        return ref
    found = []
    for candidate in (k for k in kinds if k not in KUEUE_JOB_KINDS):  # a JobSet, RayJob, ... is named NS/Kind/NAME
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
                     lease: LeaseCheck | None = None, via: str = CLI) -> RestoreOutcome:
    """Scale a workload gpufinops scaled to zero back to its kept count, through `Actuator.change`.

    Dry-run reads, records "dry-run: would restore ..." and changes nothing. Live: an earlier restore of it still
    open is settled first (reconcile); any other unsettled change of it makes this wait (nothing is done to a
    workload whose last change is not settled); then the intent row, one preconditioned patch (a 409 is re-read
    and retried once by the cloud), and on an error the read-back: done, failed (a 4xx and not restored), or
    unconfirmed (the row stays open and is reconciled). The row is kind `restore`, its reason naming who asked
    and `via` what (the command, or the chat's button). `node/NAME`: uncordon a GPU node gpufinops cordoned
    (action: drain), the same way."""
    if text.startswith("node/"):
        return _uncordon(cloud, store, text[len("node/"):], now, dry_run=dry_run, who=who, lease=lease, via=via)
    try:
        ref = find_target(cloud, text)
    except (ValueError, KubeReadFailed) as exc:
        return RestoreOutcome(False, text, str(exc), dry_run, NOTHING_TO_RESTORE)
    iid = workload_id(ref)
    # Restore sends no message and reads no setting: the chokepoint needs only the cloud and the store.
    actuator = Actuator(cloud, store, notifier=None, settings=None)  # type: ignore[arg-type]
    waiting = _unsettled(actuator, iid, now, lease)
    if waiting:
        return RestoreOutcome(False, iid, waiting, dry_run, WAITING)
    count = None
    if ref.kind in KUEUE_SUSPEND_KINDS:  # a Kueue job gpufinops suspended: its Kueue Workload back to active
        kueue, problem = cloud.resumable(ref)
        what = f"resume {ref} (Kueue Workload {kueue} spec.active: true)"
    else:
        count, problem = cloud.restorable(ref)
        what = f"restore {ref} to {count} replicas"
    if problem:  # nothing of gpufinops' to undo: nothing is asked of the API server, nothing recorded
        return RestoreOutcome(False, iid, problem, dry_run, NOTHING_TO_RESTORE)
    try:
        [inst] = cloud.describe([iid])
    except (ValueError, KubeReadFailed) as exc:
        return RestoreOutcome(False, iid, f"kubernetes: {ref} could not be read: {exc}", dry_run, NOTHING_TO_RESTORE)
    by = f" for {who}" if who else ""
    reason = f"{what}{by} ({via})"
    done: list[Restored] = []
    ctx = RunContext(now=now, dry_run=dry_run, lease=lease)
    try:
        outcome = actuator.change(ctx, inst, ActionKind.RESTORE, "", reason,
                                  lambda: done.append(cloud.restore(ref, who)), verify=is_restored)
    except NotLeader as exc:
        return RestoreOutcome(False, iid, f"{reason}: not done: {exc}", dry_run, NOT_LEADER)
    if dry_run:
        return RestoreOutcome(True, iid, f"dry-run: would {what}{by} ({via}); it was NOT changed", True,
                              WOULD_RESTORE, count)
    if outcome.ok:
        message = f"{ref} {done[0].reason} ({via})" if done else \
            f"{reason}: found restored by the read-back after: {outcome.error or 'an error'}"
        log.info("%s", message)
        return RestoreOutcome(True, iid, message, False, RESTORED, count)
    if outcome.ok is None:
        return RestoreOutcome(False, iid, f"{reason}: outcome unknown ({outcome.error}); the audit row stays open and "
                                          f"is settled from the workload's state once no request can still be in "
                                          f"flight (the service's next tick, or the next k8s restore)", False,
                              UNKNOWN, count)
    return RestoreOutcome(False, iid, f"{reason}: not done: {outcome.error}", False, FAILED, count)


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
              lease: LeaseCheck | None, via: str) -> RestoreOutcome:
    """Uncordon a node gpufinops cordoned: `spec.unschedulable: false` and its annotations removed, through
    `Actuator.change` (intent row, one preconditioned PATCH, read-back). A node cordoned by someone else, or not
    cordoned, is left alone and nothing is recorded."""
    iid = node_id(name)
    actuator = Actuator(cloud, store, notifier=None, settings=None)  # type: ignore[arg-type]
    waiting = _unsettled(actuator, iid, now, lease)
    if waiting:
        return RestoreOutcome(False, iid, waiting, dry_run, WAITING)
    try:
        found = cloud.describe([iid])
    except KubeReadFailed as exc:
        return RestoreOutcome(False, iid, f"kubernetes: node {name} could not be read: {exc}", dry_run,
                              NOTHING_TO_RESTORE)
    if not found:
        return RestoreOutcome(False, iid, f"kubernetes: node {name} not found", dry_run, NOTHING_TO_RESTORE)
    inst = found[0]
    if inst.state != "stopped":
        return RestoreOutcome(False, iid, f"kubernetes: node {name} is not cordoned by gpufinops ({inst.state}): "
                                          "left alone", dry_run, NOTHING_TO_RESTORE)
    by = f" for {who}" if who else ""
    reason = f"uncordon node {name}{by} ({via})"
    ctx = RunContext(now=now, dry_run=dry_run, lease=lease)
    try:
        outcome = actuator.change(ctx, inst, ActionKind.RESTORE, "", reason, lambda: cloud.uncordon(name, who),
                                  verify=is_restored)
    except NotLeader as exc:
        return RestoreOutcome(False, iid, f"{reason}: not done: {exc}", dry_run, NOT_LEADER)
    if dry_run:
        return RestoreOutcome(True, iid, f"dry-run: would {reason}; it was NOT changed", True, WOULD_RESTORE)
    if outcome.ok:
        return RestoreOutcome(True, iid, f"node {name} uncordoned{by} ({via})", False, RESTORED)
    if outcome.ok is None:
        return RestoreOutcome(False, iid, f"{reason}: outcome unknown ({outcome.error}); the audit row stays open "
                                          "and is settled by the next tick", False, UNKNOWN)
    return RestoreOutcome(False, iid, f"{reason}: not done: {outcome.error}", False, FAILED)


# --------------------------------------------------------------------------- the Restore button (the leader's tick)


def restore_target(cloud: WorkloadCloud, instance_id: str) -> str | None:
    """What `gpufinops k8s restore` takes for this id (`node/NAME`, `NS/Kind/NAME`; a cut id resolved through
    this tick's listing), None when it names nothing gpufinops knows."""
    if is_node_id(instance_id):
        name = cloud.node_name_of(instance_id)
        return f"node/{name}" if name else None
    ref = cloud.ref_of(instance_id)
    return f"{ref.namespace}/{ref.kind}/{ref.name}" if ref else None


def apply_restore_requests(ctx: RunContext, cloud: WorkloadCloud | None, store, notifier) -> list[RestoreOutcome]:
    """The Restore clicks people made (notify/interact.py), each carried out once on the leader's tick by
    `restore_workload` (dry-run, intent row, one PATCH, read-back) and told once: the notice edited in place and
    one reply under it (`notifier`: routing.Deliveries; the reply's key is the click's, so a lost answer is
    looked up, never posted twice).

    A request is forgotten before it is carried out: a crash in between loses the click (nothing changed, nothing
    said; the button is still there) rather than repeating a change. One that waits for an earlier change of its
    subject to settle is kept for `CLICK_PATIENCE`; one that meets a lost lease is kept for the next leader."""
    if cloud is None:
        return []
    _tell_settled(cloud, store, notifier)
    requests = interact.pending_restores(store)
    out = []
    for req in requests:
        try:
            check_lease(ctx.lease)
        except NotLeader as exc:
            log.warning("Restore clicks left for the next leader: %s", exc)
            break
        interact.forget_restore(store, req.instance_id)
        target = restore_target(cloud, req.instance_id)
        who = f"{req.user_name} ({interact.CHAT} user {req.user_id})"
        outcome = restore_workload(cloud, store, target, ctx.now, dry_run=ctx.dry_run, who=who, lease=ctx.lease,
                                   via=BUTTON) if target else \
            RestoreOutcome(False, req.instance_id, f"kubernetes: {req.instance_id} names nothing gpufinops can read "
                                                   "now", ctx.dry_run, NOTHING_TO_RESTORE)
        asked = parse_time(req.requested_at) or ctx.now
        if outcome.status == NOT_LEADER or (outcome.status == WAITING and ctx.now - asked < CLICK_PATIENCE):
            interact.keep_restore(store, req)
            continue
        log.info("Restore clicked by %s on %s: %s", req.user_id, req.instance_id, outcome.message)
        if outcome.status == UNKNOWN:  # told again once its row is settled (_tell_settled, a later tick)
            interact.remember_unsettled_restore(store, req, target or req.instance_id)
        _tell(req, outcome, target or req.instance_id, notifier, cloud)
        out.append(outcome)
    return out


def _tell_settled(cloud: WorkloadCloud, store, notifier) -> None:
    """The clicks answered "not known yet" whose restore row reconcile has settled since (the act stage's
    reconcile runs earlier in the same tick): the outcome, once, as a second reply under the notice (its own key:
    a lost answer is looked up, never posted twice), the notice edited to say it, its button kept if not done."""
    for req, target in interact.unsettled_restores(store):
        asked = parse_time(req.requested_at)
        rows = [r for r in store.action_rows(kinds=[ActionKind.RESTORE], instance_id=req.instance_id, start=asked)
                if not r.dry_run]
        if any(r.status in UNSETTLED for r in rows):
            continue  # still open: told when settled
        if rows:
            row = min(rows, key=lambda r: r.at)  # the one this click made
            done = row.status == "done"
            outcome = RestoreOutcome(done, req.instance_id, f"read back once no request could still be in flight: "
                                                            f"{row.error.removeprefix('reconciled: ')}; click Restore "
                                                            f"again if it is still wanted", False,
                                     SETTLED_RESTORED if done else FAILED)
            _tell(req, outcome, target, notifier, cloud, key_suffix=":settled")
            log.info("Restore clicked by %s on %s settled: %s", req.user_id, req.instance_id, row.status)
        interact.forget_unsettled_restore(store, req.instance_id)


def _owner_and_team(cloud: WorkloadCloud, instance_id: str) -> tuple[str, str]:
    """The subject's owner and team tags as read now, so that the result reaches its owner by the routes its stop
    notice took (notify/routing.py); ("", "") when it cannot be read: the reply under the notice still goes."""
    try:
        found = cloud.describe([instance_id])
    except Exception as exc:  # noqa: BLE001 - a route, never a reason to leave the click unanswered
        log.warning("the owner of %s could not be read for the Restore result: %s", instance_id, exc)
        return "", ""
    return (found[0].owner() or "", found[0].team() or "") if found else ("", "")


def _tell(req: "interact.RestoreRequest", outcome: RestoreOutcome, target: str, notifier, cloud: WorkloadCloud,
          key_suffix: str = "") -> None:
    """The result, once: a reply under the notice the button was on, and that notice edited in place (its
    button kept where a later click may still be needed); its owner told as the stop notice told them.
    Cosmetic: never raises."""
    owner, team = _owner_and_team(cloud, req.instance_id)
    notice = messages.restore_result(
        req.instance_id, target, outcome.status, replicas=outcome.replicas, who=req.user_id, detail=outcome.message,
        dry_run=outcome.dry_run, key=f"restore:{req.instance_id}:{req.requested_at}{key_suffix}",
        thread_key=req.notice_key, channel=req.channel_id, owner=owner, team=team)
    try:
        notifier.send(notice)
        notifier.show_restored(req, notice.text, keep_button=outcome.status in (FAILED, UNKNOWN, WAITING))
    except Exception as exc:  # noqa: BLE001 - the restore is done and audited; a message is not worth a failure
        log.warning("could not tell the Restore result of %s: %s", req.instance_id, exc)
