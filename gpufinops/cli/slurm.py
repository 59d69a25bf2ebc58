"""`gpufinops slurm snooze JOBID 2h`: keep a Slurm job from being requeued, held or cancelled for a while
(docs/slurm.md). The snooze is recorded as a Slack click's is (notify.interact): it holds from gpufinops' own record
at once, and the leader's next tick writes it into the job's Comment through the one actuator (`gpufinops:snooze-
until=<time>`), where the job's user sees it; capped at act.max_snooze_s like every snooze."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta, timezone

from .common import usage_error


def register(subparsers) -> None:
    s = subparsers.add_parser("slurm", help="Slurm GPU jobs: snooze one (keep it from being requeued, held or "
                                            "cancelled)")
    ssub = s.add_subparsers(dest="slurm_command", metavar="ACTION")
    z = ssub.add_parser("snooze", help="keep a job running for a while: its warning's requeue, hold or cancel is "
                                       "withdrawn at the next tick")
    z.add_argument("job", metavar="JOBID", help="the job as squeue shows it (1234, 1234_7, 1240+1), or "
                                                "slurm:<cluster>/<jobid>")
    z.add_argument("duration", metavar="DURATION", help="how long: 30m, 2h, 1d (at most act.max_snooze_s)")
    z.add_argument("--cluster", default="", help="the cluster's name (needed when several are configured)")
    z.add_argument("--by", default="", help="who asks, for the audit log (default: $USER)")
    z.set_defaults(func=cmd_slurm_snooze)
    s.set_defaults(func=lambda args: (s.print_help(), 2)[1])


def cmd_slurm_snooze(args: argparse.Namespace) -> int:
    import os

    from ..notify import interact
    from ..places.slurm.jobs import parse_subject_id, subject_id
    from ..rules import parse_duration
    from ..run.compose import live_store
    from .common import load_settings_from_args

    settings = load_settings_from_args(args)
    clusters = [c.cluster for c in (settings.slurm.enabled if settings.slurm is not None else ())]
    where = settings.source_path or "the config"
    if not clusters:
        return usage_error(f"slurm snooze needs a `slurm:` section with an enabled cluster in {where} "
                           "(docs/slurm.md)")
    if args.job.startswith("slurm:"):
        try:
            cluster, job = parse_subject_id(args.job)
        except ValueError as exc:
            return usage_error(str(exc))
    else:
        cluster, job = args.cluster or (clusters[0] if len(clusters) == 1 else ""), args.job
        if not cluster:
            return usage_error(f"several Slurm clusters are configured ({', '.join(clusters)}): "
                               "name one with --cluster")
    if cluster not in clusters:
        return usage_error(f"Slurm cluster {cluster!r} is not an enabled cluster of {where} ({', '.join(clusters)})")
    if not job or not job.replace("_", "").replace("+", "").isdigit():
        return usage_error(f"{job!r} is not a Slurm job id (1234, 1234_7 or 1240+1)")
    try:
        seconds = parse_duration(args.duration, max_s=settings.act.max_snooze_s)
    except ValueError as exc:
        return usage_error(f"duration {args.duration!r}: {exc}")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    until = now + timedelta(seconds=seconds)
    who = args.by or os.environ.get("USER", "") or "a person"
    sid = subject_id(cluster, job)
    interact.keep_request(live_store(settings), interact.SnoozeRequest(
        instance_id=sid, until=until.strftime("%Y-%m-%dT%H:%M:%SZ"), user_id="", user_name=who,
        action_id=interact.CLI_SNOOZE_ACTION, channel_id="", message_ts="", requested_at=now.isoformat()))
    print(f"{sid} snoozed until {until:%Y-%m-%d %H:%M} UTC by {who}: nothing is requeued, held or cancelled until "
          "then; the next tick withdraws a warning it was given and writes the snooze into the job's Comment",
          file=sys.stdout)
    return 0
