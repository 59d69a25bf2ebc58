"""Slurm GPU-hours and their cost, grouped; idle GPU-hours from the stored verdicts of `slurm:` subjects (pure).

The usage table is one row per accounting run charged for a window (places.slurm.accounting.SlurmCharge.row():
USAGE_COLUMNS); it is built where Slurm is read (run.slurm_cost) and handed here. Sums are exact: GPU-seconds are
integers, and each group's dollars are the sum of its runs' GPU-seconds x their own $/GPU-h, rounded once, to the
cent, at the end. An unpriced run keeps its GPU-hours (`unpriced_gpu_hours`) and adds nothing to the dollars: the
dollars of a group with unpriced runs are a floor, said so, never $0 for unknown.

Idle: the tick stores a verdict per `slurm:<cluster>/<job>` subject like any other (Store.verdict_hours_frame);
a job's IDLE hours x its GPUs are its idle GPU-hours, priced at its run's $/GPU-h (else the $/h stored with the
verdict, the whole job's). User and account come from the job's accounting record, joined by subject id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

SUBJECT_PREFIX = "slurm:"  # places.slurm.jobs.ID_PREFIX (cost may not import places)

USAGE_COLUMNS = ["cluster", "job_id", "subject_id", "name", "user", "account", "partition", "qos", "state", "gpus",
                 "gpu_model", "start", "end", "running", "gpu_seconds", "usd_per_gpu_hour", "price_source", "cost"]



@dataclass
class SlurmUsage:
    """The Slurm clusters' runs charged for a window, as run.slurm_cost reads them."""

    table: pd.DataFrame  # USAGE_COLUMNS, one row per run charged
    clusters: tuple[str, ...] = ()  # the clusters asked
    errors: list[str] = field(default_factory=list)  # one line per cluster whose accounting could not be read
    warnings: list[str] = field(default_factory=list)  # records left out (unreadable), unpriced GPU-hours
    idle: pd.DataFrame | None = None  # idle_by_job() when the verdicts were read; None: not read / unreadable

    @property
    def complete(self) -> bool:
        return not self.errors

    def cluster_errors(self, cluster: str) -> list[str]:
        return [e for e in self.errors if e.startswith(f"slurm {cluster}:")]


# `costs --by` grouping -> the usage table's column: cli.slurm_costs.SLURM_GROUPINGS (the parser's choices, read
# without loading this module); the report's tables: report.sections.SLURM_GROUPS.
NONE = "(none)"


def usage_table(rows) -> pd.DataFrame:
    """The usage rows (dicts of USAGE_COLUMNS) as a table, with the columns even when there is none."""
    t = pd.DataFrame(list(rows), columns=USAGE_COLUMNS)
    t["gpu_seconds"] = t["gpu_seconds"].astype("int64")
    t["cost"] = pd.to_numeric(t["cost"], errors="coerce").astype("float64")
    t["usd_per_gpu_hour"] = pd.to_numeric(t["usd_per_gpu_hour"], errors="coerce").astype("float64")
    return t


def slurm_totals(usage: pd.DataFrame, by: str, idle: pd.DataFrame | None = None) -> pd.DataFrame:
    """GPU-hours and USD per group (`by`: a usage column, e.g. account, or cluster), costliest first (ties: the
    key), with the idle GPU-hours and USD of idle_by_job() (None: the verdicts could not be read, so idle is NaN,
    not 0); `idle_share`: idle USD / priced USD."""
    cols = [by, "jobs", "gpu_hours", "usd", "unpriced_gpu_hours", "idle_gpu_hours", "idle_usd", "idle_share"]
    if usage.empty:
        return pd.DataFrame({c: [] for c in cols})
    u = usage.assign(key=usage[by].fillna("").replace("", NONE),
                     priced_cost=usage["cost"].fillna(0.0),
                     unpriced_s=usage["gpu_seconds"].where(usage["cost"].isna(), 0))
    g = u.groupby("key", sort=True).agg(jobs=("subject_id", "nunique"), gpu_seconds=("gpu_seconds", "sum"),
                                        usd=("priced_cost", "sum"), unpriced_s=("unpriced_s", "sum"))
    out = pd.DataFrame({by: g.index, "jobs": g["jobs"].to_numpy(),
                        "gpu_hours": (g["gpu_seconds"] / 3600.0).round(2).to_numpy(),
                        # a group with no priced run has no known dollars: NaN, never $0
                        "usd": g["usd"].round(2).where(g["unpriced_s"] < g["gpu_seconds"]).to_numpy(),
                        "unpriced_gpu_hours": (g["unpriced_s"] / 3600.0).round(2).to_numpy()})
    if idle is None:  # the verdicts could not be read: idle is not known, never 0
        out["idle_gpu_hours"], out["idle_usd"] = float("nan"), float("nan")
    else:
        i = idle.assign(key=idle[by].fillna("").replace("", NONE)).groupby("key")[["idle_gpu_hours", "idle_usd"]] \
            .sum() if not idle.empty else pd.DataFrame(columns=["idle_gpu_hours", "idle_usd"], dtype="float64")
        out = out.merge(i, left_on=by, right_index=True, how="left")
        out[["idle_gpu_hours", "idle_usd"]] = out[["idle_gpu_hours", "idle_usd"]].fillna(0.0)
    out[["idle_gpu_hours", "idle_usd"]] = out[["idle_gpu_hours", "idle_usd"]].round(2)
    out["idle_share"] = (out["idle_usd"] / out["usd"].where(out["usd"] > 0)).round(3)
    return out.sort_values(["usd", by], ascending=[False, True], kind="stable").reset_index(drop=True)[cols]


def slurm_verdicts(verdict_costs: pd.DataFrame) -> pd.DataFrame:
    """The rows of cost.costs.verdict_costs() that are Slurm jobs."""
    if verdict_costs.empty:
        return verdict_costs
    return verdict_costs[verdict_costs["instance_id"].astype(str).str.startswith(SUBJECT_PREFIX)]


def idle_by_job(verdict_costs: pd.DataFrame, usage: pd.DataFrame) -> pd.DataFrame:
    """Per Slurm job judged IDLE: its idle hours, idle GPU-hours and idle USD, with its cluster, user, account,
    partition and QOS from accounting. A job accounting does not show (yet) keeps its idle hours with user and
    account unknown ("") and its GPUs unknown (its idle GPU-hours 0), priced at the $/h stored with the verdict."""
    cols = ["subject_id", "cluster", "user", "account", "partition", "qos", "gpus", "idle_hours", "idle_gpu_hours",
            "idle_usd"]
    v = slurm_verdicts(verdict_costs)
    if v.empty:
        return pd.DataFrame({c: [] for c in cols})
    idle = v[v["verdict"] == "IDLE"]
    if idle.empty:
        return pd.DataFrame({c: [] for c in cols})
    per_job = idle.assign(stored_cost=idle["cost"]).groupby("instance_id").agg(
        idle_hours=("hours", "sum"), stored_cost=("stored_cost", lambda s: s.sum(min_count=1)))
    jobs = (usage.sort_values("start").groupby("subject_id").agg(
        cluster=("cluster", "last"), user=("user", "last"), account=("account", "last"),
        partition=("partition", "last"), qos=("qos", "last"), gpus=("gpus", "last"),
        rate=("usd_per_gpu_hour", "last")) if not usage.empty else pd.DataFrame())
    out = per_job.join(jobs, how="left") if not jobs.empty else per_job.assign(
        cluster=None, user=None, account=None, partition=None, qos=None, gpus=None, rate=None)
    out["gpus"] = pd.to_numeric(out["gpus"], errors="coerce")
    out["rate"] = pd.to_numeric(out["rate"], errors="coerce")
    out["idle_gpu_hours"] = (out["idle_hours"] * out["gpus"]).fillna(0.0)
    out["idle_usd"] = (out["idle_gpu_hours"] * out["rate"]).where(out["rate"].notna(), out["stored_cost"]).fillna(0.0)
    for c in ("cluster", "user", "account", "partition", "qos"):
        out[c] = out[c].fillna("")
    out["cluster"] = [c or sid[len(SUBJECT_PREFIX):].split("/", 1)[0] for sid, c in zip(out.index, out["cluster"])]
    out = out.reset_index().rename(columns={"instance_id": "subject_id"})
    return out[cols].sort_values(["idle_usd", "subject_id"], ascending=[False, True], kind="stable") \
        .reset_index(drop=True)


def running_rate(usage: pd.DataFrame) -> tuple[float, int]:
    """USD per hour of the runs still going (their GPUs x $/GPU-h), and how many of them are unpriced."""
    if usage.empty:
        return 0.0, 0
    r = usage[usage["running"].astype(bool)]
    priced = r[r["usd_per_gpu_hour"].notna()]
    return float((priced["gpus"] * priced["usd_per_gpu_hour"]).sum()), int(len(r) - len(priced))


def account_mask(table: pd.DataFrame, value: str) -> pd.Series:
    """Rows of one Slurm account: `account` on every cluster, or `cluster/account` on one."""
    cluster, _, account = value.rpartition("/")
    mask = table["account"].fillna("") == account
    if cluster:
        mask &= table["cluster"].fillna("") == cluster
    return mask
