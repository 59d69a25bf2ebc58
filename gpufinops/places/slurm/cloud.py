"""One Slurm cluster as a Cloud: each RUNNING job holding GPUs is a GpuInstance `slurm:<cluster>/<jobid>`.

Listed from one `squeue --json` (22.05 ignores `--jobs` and `--states` with `--json`: every job comes back, so the
filter is ours). A job's instance carries what rules select by, as tags: `slurm:user`, `slurm:account`,
`slurm:partition`, `slurm:qos`, `slurm:job-name`, `slurm:interactive` / `slurm:batch` / `slurm:requeueable`
("true"/"false"), `owner` (the user's address or Slack id, places.slurm.people) and `team` (the account); its
start time is its launch time (a requeued job that runs again is a new start: a mark made before does not carry
over), its GPUs its gpu_count and model (the gres type).

gpufinops' marks live in the job's Comment (or AdminComment: `mark_field`) as words (places.slurm.comments); the
snooze keyword a user writes there, and the cluster's protect lists, are tags the act stage reads like any other.

An outage (squeue failing, or 22.05's exit 0 with an error and no jobs) is never "no jobs": the jobs last listed
are listed again, unread (`tags_unread`: a mark is kept, not taken as removed), and their usage carries the
outage (`outage`), so every one is UNKNOWN, the tick's missing-data alert says so once, and nothing is acted on.

The changes (`set_tags`, `remove_tags`, `end_job`) are the Actuator's alone: each is one scontrol / scancel.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable, Sequence

from ...config.sections import SlurmClusterSettings
from ...model import TAG_MARKED, TAG_PROTECT, TAG_SNOOZE, Action, GpuInstance, utcnow
from ..registry import (ACTION_VERBS, TAG_MARK_GONE_WHY, TAG_SLURM_BATCH, TAG_SLURM_INTERACTIVE_ACTS,
                        TAG_SLURM_JOB_ID, TAG_SLURM_REQUEUEABLE, TAG_SLURM_SNOOZE_KEYWORD)
from .comments import KEYWORD_SNOOZE, TAG_MARK_RUN, WRITTEN, keyword_in, read_tags, with_tags, without_tags
from .commands import SlurmCommands, SlurmUnavailable
from .jobs import SlurmJob, gpu_jobs, parse_squeue
from .people import People

log = logging.getLogger("gpufinops.slurm")

PROVIDER = "slurm"
TAG_USER, TAG_ACCOUNT, TAG_PARTITION, TAG_QOS = "slurm:user", "slurm:account", "slurm:partition", "slurm:qos"
TAG_JOB_NAME, TAG_INTERACTIVE = "slurm:job-name", "slurm:interactive"
_GRES_TYPE = re.compile(r"(?:^|,)gpu:([^:(),]+):\d+\(")

# Job states (squeue's job_state) as the act stage reads an instance's: running, "stopped" (back in the queue:
# requeued, held), "terminated" (ended: cancelled, completed, failed, timed out...), "suspended" (SUSPENDED, or
# STOPPED by SIGSTOP: it still holds its GPUs, so a requeue or cancel is not done by it) or "unknown" (a state this
# code does not know: never read as ended, so a lost answer is never settled "done" on it).
NEVER_STARTED = datetime.min.replace(tzinfo=timezone.utc)
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "RESV_DEL_HOLD"})
SUSPENDED_STATES = frozenset({"SUSPENDED", "STOPPED"})
ENDED_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                          "DEADLINE", "OUT_OF_MEMORY", "REVOKED"})


class SlurmActionRefused(RuntimeError):
    """A change gpufinops did not make, for a reason it knows for sure (the job changed under it)."""

    definite = True  # act.Actuator.change: not done, and the job agrees
    called_off = False  # act.Actuator.change: see SlurmActionCalledOff


class SlurmActionCalledOff(SlurmActionRefused):
    """The one command not sent because what the stop was planned on changed during the grace wait: most often a
    person's word (a snooze, the mark removed, a protect, a restart). No failure of the change: the actuator records
    it "abandoned", never counted toward its give-up after repeated failures, and the next run plans again. The grace
    signal did go out: the message says so."""

    called_off = True


# Passing states: a job being requeued or cancelled shows COMPLETING (or CONFIGURING, SIGNALING...) for a moment.
PASSING_STATES = frozenset({"COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "RESIZING", "REQUEUED"})
# How long a requeue or hold is watched until Slurm shows the job back in the queue (its read-back).
SETTLE_S = 15.0


def instance_state(job: SlurmJob) -> str:
    if job.state == "RUNNING":
        return "running"
    if job.state in PASSING_STATES:
        return "stopping"
    if job.state in QUEUED_STATES:
        return "stopped"
    if job.state in SUSPENDED_STATES:
        return "suspended"
    return "terminated" if job.state in ENDED_STATES else "unknown"


def run_of(job: SlurmJob) -> str:
    """The run a mark belongs to: the job's start, epoch seconds ("0": not started)."""
    return str(int(job.start_time.timestamp())) if job.start_time else "0"


def gpu_model(job_gres: Sequence[str]) -> str:
    for detail in job_gres:
        m = _GRES_TYPE.search(detail)
        if m:
            return m.group(1)
    return ""


class SlurmCloud:
    """One cluster (`settings`: its SlurmClusterSettings), through `commands`."""

    def __init__(self, settings: SlurmClusterSettings, commands: SlurmCommands | None = None,
                 people: People | None = None, *,
                 clock: Callable[[], datetime] = utcnow, sleep: Callable[[float], None] = time.sleep):
        self.settings = settings
        self.cluster = settings.cluster
        self.commands = commands or SlurmCommands(settings.cluster, settings.conf, settings.timeout_s)
        self.people = people if people is not None else People.from_settings(settings)
        self.clock, self.sleep = clock, sleep
        self.last_errors: list[str] = []
        self.outage = ""  # why the last listing failed ("" when it answered)
        self._last: dict[str, GpuInstance] = {}  # the jobs last listed, by subject id (what an outage lists again)
        self._gres: dict[str, tuple[str, ...]] = {}
        self._jobs: dict[str, SlurmJob] = {}  # this tick's running GPU jobs, by subject id

    @property
    def max_request_s(self) -> float:
        # A command's own timeout, the grace the job is given before its requeue or cancel, and a margin.
        return self.commands.timeout_s * 3 + self.settings.grace_s

    # ------------------------------------------------------------------ reading
    def _read(self) -> list[SlurmJob]:
        doc = self.commands.squeue()
        jobs, problems = parse_squeue(self.cluster, doc)
        self.last_errors = problems
        for p in problems:
            log.error("%s", p)
        self._gres = {str(j.get("job_id")): tuple(str(d) for d in (j.get("gres_detail") or []))
                      for j in doc.get("jobs") or [] if isinstance(j, dict)}
        return jobs

    def list_gpu_instances(self) -> list[GpuInstance]:
        try:
            jobs = self._read()
        except SlurmUnavailable as exc:
            if not self.outage:
                log.error("slurm %s: jobs not listed: %s", self.cluster, exc)
            self.outage = str(exc)
            self.last_errors = [str(exc)]
            if not self._last:
                raise
            why = f"Slurm did not answer: {exc}"
            return [replace(i, tags_unread=why) for i in self._last.values()]
        if self.outage:
            log.info("slurm %s: listed again after: %s", self.cluster, self.outage)
        self.outage = ""
        running = gpu_jobs(jobs)
        self._jobs = {j.subject_id: j for j in running}
        found = [self.as_instance(j) for j in running]
        self._last = {i.instance_id: i for i in found}
        return found

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        """The jobs named, as Slurm shows them now, in any state (a job no longer shown: absent). Raises
        SlurmUnavailable when Slurm does not answer: a read-back that cannot be made is never "gone"."""
        wanted = set(instance_ids)
        found = {j.subject_id: self.as_instance(j) for j in self._read() if j.subject_id in wanted}
        return [found[i] for i in instance_ids if i in found]

    def as_instance(self, job: SlurmJob) -> GpuInstance:
        s = self.settings
        interactive = not job.batch
        tags = {
            TAG_USER: job.user, TAG_ACCOUNT: job.account, TAG_PARTITION: job.partition, TAG_QOS: job.qos,
            TAG_JOB_NAME: job.name, TAG_SLURM_JOB_ID: job.job_id,
            TAG_INTERACTIVE: str(interactive).lower(), TAG_SLURM_BATCH: str(job.batch).lower(),
            TAG_SLURM_REQUEUEABLE: str(job.requeueable).lower(),
            TAG_SLURM_INTERACTIVE_ACTS: str(s.act_on_interactive).lower(), TAG_SLURM_SNOOZE_KEYWORD: s.snooze_keyword,
            "team": job.account,
        }
        owner = self.people.owner(job.user)
        if owner:
            tags["owner"] = owner
        marks = read_tags(job.admin_comment if s.mark_field == "admin_comment" else job.comment)
        tags.update({k: v for k, v in marks.items() if k not in (TAG_SNOOZE, TAG_MARK_RUN)})
        if TAG_MARKED in marks and marks.get(TAG_MARK_RUN) != run_of(job):
            # Slurm keeps a Comment across a requeue: a mark written on an earlier run is not this run's.
            del tags[TAG_MARKED]
            # The run's value is the Comment's, which the job's user can write: clipped (it goes to the audit and
            # the user's "cancelled" notice).
            tags[TAG_MARK_GONE_WHY] = (f"the job was requeued and started again since its warning (mark of the run "
                                       f"started {marks.get(TAG_MARK_RUN, 'earlier')[:24]})")
        # A snooze is the user's: read from the Comment (a word they write), whichever field holds the mark.
        user_words = read_tags(job.comment)
        if TAG_SNOOZE in user_words:
            tags[TAG_SNOOZE] = user_words[TAG_SNOOZE]
        elif TAG_SNOOZE in marks:
            tags[TAG_SNOOZE] = marks[TAG_SNOOZE]
        elif keyword_in(job.comment, s.snooze_keyword):
            tags[TAG_SNOOZE] = f"{s.snooze_keyword} {KEYWORD_SNOOZE}"
        protected = self.protected_by(job)
        if protected:
            tags[TAG_PROTECT] = protected
        return GpuInstance(
            instance_id=job.subject_id, instance_type=f"slurm/{job.partition}", region=self.cluster,
            state=instance_state(job), launch_time=job.start_time or NEVER_STARTED,
            tags=tags, private_dns=job.nodes[0] if job.nodes else "", gpu_count=job.gpu_count,
            gpu_model=gpu_model(self._gres.get(job.job_id, ())), provider=PROVIDER,
        )

    def protected_by(self, job: SlurmJob) -> str:
        """Which protect list of the cluster holds the job, in words ("" when none does)."""
        s = self.settings
        for what, value, listed in (("user", job.user, s.protect_users), ("account", job.account, s.protect_accounts),
                                    ("QOS", job.qos, s.protect_qos),
                                    ("partition", job.partition, s.protect_partitions)):
            if value and value in listed:
                return f"slurm.protect_{'qos' if what == 'QOS' else what + 's'}: {what} {value}"
        return ""

    def usage_basis(self, subject_id: str) -> tuple[tuple, str]:
        """(the job's GPUs as last listed, why it cannot be judged: "" when it can) for SlurmJobMetrics."""
        if self.outage:
            return (), f"Slurm did not answer ({self.outage}): its jobs are not judged"
        job = self._jobs.get(subject_id)
        if job is None:
            return (), "the job is not in this tick's Slurm listing"
        if job.gpus_unread:
            return (), job.gpus_unread
        return job.gpus, ""

    def job_of(self, inst: GpuInstance) -> SlurmJob:
        """The job as Slurm shows it now; SlurmActionRefused when it shows it no more."""
        for job in self._read():
            if job.subject_id == inst.instance_id:
                return job
        raise SlurmActionRefused(f"{inst.instance_id}: Slurm no longer shows the job")

    # ------------------------------------------------------------------ the changes (act.Actuator's alone)
    def _field(self) -> str:
        return self.settings.mark_field

    def set_tags(self, inst: GpuInstance, tags) -> None:
        """gpufinops' words written into the job's mark field (the rest of its text kept): one scontrol update. A job
        that ended has nothing to mark: nothing is written (its record is the audit's)."""
        job = self.job_of(inst)
        if instance_state(job) == "terminated":
            return
        text = job.admin_comment if self._field() == "admin_comment" else job.comment
        if TAG_MARKED in tags:  # the mark is this run's: a later run of the job (after a requeue) is not marked
            tags = {**tags, TAG_MARK_RUN: run_of(job)}
        self.commands.update_comment(job.job_id, self._field(), with_tags(text, tags))
        # Read back: a job that was passing (COMPLETING) may not have taken it.
        seen = self.as_instance(self.job_of(inst)).tags
        if not all(seen.get(k) == v for k, v in tags.items() if k in WRITTEN and k != TAG_MARK_RUN):
            raise SlurmUnavailable(f"{inst.instance_id}: Slurm did not keep the comment written")

    def remove_tags(self, inst: GpuInstance, keys: Sequence[str]) -> None:
        try:
            job = self.job_of(inst)
        except SlurmActionRefused:
            return  # gone: no mark left to remove
        if instance_state(job) == "terminated":
            return
        text = job.admin_comment if self._field() == "admin_comment" else job.comment
        if TAG_MARKED in keys:
            keys = [*keys, TAG_MARK_RUN]
        if text != without_tags(text, keys):
            self.commands.update_comment(job.job_id, self._field(), without_tags(text, keys))
            if any(k in self.as_instance(self.job_of(inst)).tags for k in keys if k in WRITTEN):
                raise SlurmUnavailable(f"{inst.instance_id}: Slurm did not keep the comment written")

    def stop(self, inst: GpuInstance) -> None:
        raise SlurmActionRefused(f"{inst.instance_id}: a Slurm job is requeued, held or cancelled, never stopped")

    def terminate(self, inst: GpuInstance) -> None:
        raise SlurmActionRefused(f"{inst.instance_id}: a Slurm job is cancelled, never terminated")

    def end_job(self, inst: GpuInstance, action: Action, recheck: Callable[[], str] | None = None) -> None:
        """Requeue, hold (`scontrol requeuehold`) or cancel the job: ONE command. A cancel or requeue first sends
        the grace signal to the batch shell and waits `grace_s`; then the job is read again and the change made
        only while it still runs the same start, GPUs and mark (else SlurmActionRefused: nothing done).
        `recheck` (the actuator's own last check: a Slack click or `gpufinops slurm snooze` recorded meanwhile, a
        protect, ...) is asked again after the grace wait: a person's word given during it wins too.
        A person's word (or any change `recheck` names) is SlurmActionCalledOff, not a failed change; every refusal
        after the grace signal says that the signal went out (the one change made)."""
        job = self.job_of(inst)
        signalled = ""
        if action in (Action.REQUEUE, Action.CANCEL) and self.settings.grace_signal and job.batch:
            self.commands.signal_batch(job.job_id, self.settings.grace_signal)
            signalled = f"; only the grace signal {self.settings.grace_signal} was sent (to the batch shell)"
            log.info("%s: %s sent to the batch shell; %s in %g s", inst.instance_id, self.settings.grace_signal,
                     action.value, self.settings.grace_s)
            if self.settings.grace_s:
                self.sleep(self.settings.grace_s)
            changed = recheck() if recheck is not None else ""
            if changed:
                raise SlurmActionCalledOff(f"{inst.instance_id}: not {ACTION_VERBS[action][1]}: {changed} during "
                                           f"the {self.settings.grace_s:g} s grace{signalled}")
            try:
                job = self.job_of(inst)
            except SlurmActionRefused as gone:
                raise SlurmActionRefused(f"{gone}{signalled}") from None
        fresh = self.as_instance(job)
        if fresh.state != "running":
            raise SlurmActionRefused(f"{inst.instance_id}: the job is {job.state.lower()} now, not running{signalled}")
        if fresh.gpu_count != inst.gpu_count:
            # Resized (its user gave GPUs back, or its nodes changed): the verdict was of GPUs it holds no more.
            raise SlurmActionRefused(f"{inst.instance_id}: the job now holds {fresh.gpu_count} GPUs, not the "
                                     f"{inst.gpu_count} judged idle{signalled}")
        # A person's word seen in this last read (a requeue of theirs, the mark removed, a snooze): called off.
        if fresh.launch_time != inst.launch_time:
            raise SlurmActionCalledOff(f"{inst.instance_id}: the job was started again since{signalled}")
        if fresh.tags.get(TAG_MARKED) != inst.tags.get(TAG_MARKED):
            raise SlurmActionCalledOff(f"{inst.instance_id}: its mark {TAG_MARKED} was removed or "
                                       f"changed{signalled}")
        if TAG_SNOOZE in fresh.tags and fresh.tags.get(TAG_SNOOZE) != inst.tags.get(TAG_SNOOZE):
            raise SlurmActionCalledOff(f"{inst.instance_id}: its user snoozed it{signalled}")
        if action is Action.REQUEUE:
            self.commands.requeue(job.job_id)
        elif action is Action.HOLD:
            self.commands.requeue_hold(job.job_id)
        elif action is Action.CANCEL:
            self.commands.cancel(job.job_id)
        else:
            raise SlurmActionRefused(f"{inst.instance_id}: action {action.value} is not one a Slurm job takes")
        self._settle(inst)

    def _settle(self, inst: GpuInstance) -> None:
        """Read the job back until it has left COMPLETING (the mark's removal that follows needs a settled job);
        a job still passing after SETTLE_S is left to the actuator's read-back."""
        end = time.monotonic() + SETTLE_S
        while time.monotonic() < end:
            try:
                state = instance_state(self.job_of(inst))
            except SlurmActionRefused:
                return  # gone
            if state != "stopping":
                return
            self.sleep(0.2)
