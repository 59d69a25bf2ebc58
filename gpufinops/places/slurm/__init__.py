"""Slurm clusters as a place (docs/slurm.md): each RUNNING job that holds GPUs is a subject `slurm:<cluster>/<jobid>`.

`commands` runs the cluster's client commands (squeue, scontrol, scancel, sacct) with the cluster's SLURM_CONF and
a timeout: a command that fails, times out or answers what cannot be read raises SlurmUnavailable (UNKNOWN, never
"no jobs"); `jobs` reads 22.05's `squeue --json` (openapi/v0.0.38) into SlurmJob values, with the GPUs each job holds
per node (Slurm's IDX: the device minor, which can differ from NVML's index) — pure, the one place where Slurm's
version-specific JSON is parsed; `comments` gpufinops' words in a job's Comment (its mark, a user's snooze);
`people` a user's address and Slack id; `usage` DCGM usage per job (by host name and Slurm's GPU index, with the
cluster's index map); `cloud` one cluster as a Cloud (SlurmCloud: the listing, its tags, the marks, and the one
command per change: requeue, requeuehold, scancel, with the grace signal and the last re-read), which
places.fleet.WithSlurm puts beside the other places.

May import: model, config, collect (errors, prometheus), decide.workloads, places.registry. Never imports
places.ec2, places.hosts, places.kubernetes, places.fleet or anything above places.
"""
