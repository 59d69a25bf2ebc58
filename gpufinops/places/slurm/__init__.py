"""Slurm clusters as a place (docs/slurm.md): each RUNNING job that holds GPUs is a subject `slurm:<cluster>/<jobid>`.

`commands` runs the cluster's client commands (squeue, scontrol, scancel, sacct) with the cluster's SLURM_CONF and
a timeout: a command that fails, times out or answers what cannot be read raises SlurmUnavailable (UNKNOWN, never
"no jobs"); `jobs` reads 22.05's `squeue --json` (openapi/v0.0.38) into SlurmJob values, with the GPUs each job holds
per node (Slurm's IDX: the device minor, which can differ from NVML's index) — pure, the one place where Slurm's
version-specific JSON is parsed.

May import: model, config, collect (errors, prometheus), decide.workloads. Never imports places.ec2, places.hosts,
places.kubernetes, places.fleet or anything above places.
"""
