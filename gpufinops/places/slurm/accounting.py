"""GPU-hours from Slurm's accounting: 22.05's `sacct --json` (openapi/dbv0.0.38) read into runs, each run charged.

A run is one record of `sacct -D`: a job that Slurm requeued has one record per time it ran (REQUEUED, then the last
state), each with its own start, end and allocated TRES, so every part that held GPUs is charged. Its GPUs are the
`gres/gpu` count of `tres.allocated` (what Slurm gave it, not what it asked for); its GPU-seconds are that count
times the time it ran inside the asked window: Slurm's own `elapsed` when the run lies wholly inside, else its start
and end clipped to the window (a run that crosses a month's bound is charged to each month for its own part; a run
still going counts up to `now`). Records that never ran (start 0) or hold no GPU are left out.

The price of a GPU-hour, first that is known (SlurmClusterSettings, docs/slurm.md "Cost"):
  1. `usd_per_gpu_hour` of the run's partition (or of "*", every other partition);
  2. the GPU model — the partition's `gpu_model`, else the gres type sacct names (`gres/gpu:a100`) — priced at the
     catalog's lowest on-demand $/GPU-h of that model (an estimate, never overstated: prices.host_prices);
  3. none: the GPU-hours are kept and said unpriced, never charged $0.

A period is read in windows (read_charges): one sacct answer in memory at a time, each run charged once, by the
window that holds its first second inside the period, for its whole part of the period (docs/slurm.md "Cost").

A failing sacct (no slurmdbd, a timeout, an error in the answer) raises SlurmUnavailable: no charge at all, never $0.
Field names change in 23.02+ (data_parser): they are read here and nowhere else.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Iterator, Mapping

from ...config.sections import SlurmClusterSettings
from ...model import format_money
from ...prices.catalog import Catalog
from ...prices.host_prices import HostPriceTable, host_price
from .commands import SlurmCommands, SlurmUnavailable
from .jobs import subject_id

# usd_per_gpu_hour's key for every partition not named.
ANY_PARTITION = "*"
# More GPUs than one job has ever held on any cluster: a count above it is a garbled record (Slurm's NO_VAL is
# 4294967294), refused with its reason rather than charged as a six-figure bill.
MAX_GPUS_PER_RUN = 100_000
# Each window is asked this much wider on both sides: -S/-E are local wall time, which a DST change makes ambiguous
# for an hour; a run is charged by the one window that owns it (owning_window), so asking wider never counts twice.
SACCT_WINDOW_MARGIN = timedelta(hours=1)


@dataclass(frozen=True)
class SlurmRun:
    """One accounting record of a job that ran: one part of a requeued job, or the whole of any other."""

    cluster: str
    job_id: str  # Slurm's own number of the record
    display_id: str  # as a person knows it: "1234", "1234_7" (array task), "1240+1" (het component)
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str  # COMPLETED, REQUEUED, CANCELLED, RUNNING, ...
    gpus: int
    gpu_type: str  # the gres type sacct names (gres/gpu:<type>), "" when it names none or several
    start: datetime
    end: datetime | None  # None: still running
    elapsed_s: int  # Slurm's own run time (suspended time excluded)

    @property
    def subject_id(self) -> str:
        return subject_id(self.cluster, self.display_id)


@dataclass(frozen=True)
class GpuHourPrice:
    usd_per_gpu_hour: float | None  # None: not known
    source: str  # where it comes from, in words; why there is none when there is none


@dataclass(frozen=True)
class SlurmCharge:
    """A run's GPU time inside one window, priced."""

    run: SlurmRun
    gpu_seconds: int
    price: GpuHourPrice

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    @property
    def cost(self) -> float | None:
        p = self.price.usd_per_gpu_hour
        return None if p is None else self.gpu_seconds * p / 3600.0

    def row(self) -> dict[str, Any]:
        """The run as one row of cost.slurm's usage table (its columns: cost.slurm.USAGE_COLUMNS)."""
        r = self.run
        return {"cluster": r.cluster, "job_id": r.display_id, "subject_id": r.subject_id, "name": r.name,
                "user": r.user, "account": r.account, "partition": r.partition, "qos": r.qos, "state": r.state,
                "gpus": r.gpus, "gpu_model": r.gpu_type, "start": r.start, "end": r.end, "running": r.end is None,
                "gpu_seconds": self.gpu_seconds, "usd_per_gpu_hour": self.price.usd_per_gpu_hour,
                "price_source": self.price.source, "cost": self.cost}


# --------------------------------------------------------------------------- reading sacct (pure)


def _text(v: Any) -> str:
    return v.strip() if isinstance(v, str) else ""


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _gpus(tres: Any) -> tuple[int | None, str]:
    """(GPU count, gres type) of `tres.allocated`. The count is the plain `gpu` entry; typed entries
    (`gpu:a100`, present when AccountingStorageTRES lists the type) repeat it, so they only name the model."""
    if not isinstance(tres, list):
        return None, ""
    count: int | None = 0
    types = set()
    for t in tres:
        if not isinstance(t, dict) or t.get("type") != "gres":
            continue
        name = _text(t.get("name"))
        if name == "gpu":
            count = _int(t.get("count"))
        elif name.startswith("gpu:"):
            types.add(name[4:])
    return count, (next(iter(types)) if len(types) == 1 else "")


def _display_id(j: Mapping[str, Any], job_id: str) -> str:
    array = j.get("array") if isinstance(j.get("array"), dict) else {}
    if _int(array.get("job_id")) and _int(array.get("task_id")) is not None:
        return f"{array['job_id']}_{array['task_id']}"
    het = j.get("het") if isinstance(j.get("het"), dict) else {}
    if _int(het.get("job_id")):
        return f"{het['job_id']}+{_int(het.get('job_offset')) or 0}"
    return job_id


def _at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


def parse_sacct(doc: Mapping[str, Any], cluster: str) -> tuple[list[SlurmRun], list[str]]:
    """The runs that held GPUs in a `sacct --json -D` answer, and one line for each record that could not be read
    (its GPUs or times unreadable: left out and said, never charged as zero)."""
    runs: list[SlurmRun] = []
    unread: list[str] = []
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmUnavailable(f"slurm {cluster}: sacct --json answered no job list")
    for j in jobs:
        if not isinstance(j, dict):
            continue
        job_id = str(_int(j.get("job_id")) or "?")
        t = j.get("time") if isinstance(j.get("time"), dict) else {}
        start, end, elapsed = _int(t.get("start")), _int(t.get("end")), _int(t.get("elapsed"))
        if start == 0:  # never ran (pending when cancelled, or the pending record after a requeue): no GPU time
            continue
        gpus, gpu_type = _gpus((j.get("tres") or {}).get("allocated") if isinstance(j.get("tres"), dict) else None)
        if gpus == 0:
            continue
        state = j.get("state") if isinstance(j.get("state"), dict) else {}
        if gpus is None or start is None or end is None or elapsed is None or elapsed < 0:
            unread.append(f"slurm {cluster}: job {job_id}'s accounting record has no readable "
                          f"{'GPU count' if gpus is None else 'start, end or elapsed time'}: left out of the GPU-hours")
            continue
        absurd = _absurd(gpus, start, end, elapsed)
        if absurd:
            unread.append(f"slurm {cluster}: job {job_id}'s accounting record {absurd}: left out of the GPU-hours")
            continue
        runs.append(SlurmRun(
            cluster=cluster, job_id=job_id, display_id=_display_id(j, job_id), name=_text(j.get("name")),
            # interned: a month's rows share a few hundred users/accounts/partitions rather than a copy per record
            user=sys.intern(_text(j.get("user"))), account=sys.intern(_text(j.get("account"))),
            partition=sys.intern(_text(j.get("partition"))), qos=sys.intern(_text(j.get("qos"))),
            state=sys.intern(_text(state.get("current")) or "?"), gpus=gpus, gpu_type=sys.intern(gpu_type),
            start=_at(start), end=_at(end) if end > 0 else None, elapsed_s=elapsed))
    return runs, unread


def _absurd(gpus: int, start: int, end: int, elapsed: int) -> str:
    """Why a record's numbers cannot be charged, in words ("" when they can): a negative or impossible GPU count,
    a start before 1970 or after its end, a run time longer than its start to end (elapsed excludes suspended
    time, so it is never longer)."""
    if gpus < 0 or gpus > MAX_GPUS_PER_RUN:
        return f"gives {gpus} GPUs (not a count one job can hold)"
    if start < 0:
        return f"gives start {start} (not a time)"
    if end > 0 and end < start:
        return f"ends ({_at(end):%Y-%m-%d %H:%M:%S} UTC) before it starts ({_at(start):%Y-%m-%d %H:%M:%S} UTC)"
    if end > 0 and elapsed > end - start:
        return f"gives an elapsed time of {elapsed} s, longer than its {end - start} s from start to end"
    return ""


def _sacct_time(dt: datetime) -> str:
    # sacct reads -S/-E in its own local time (the same environment as ours): converted, not assumed UTC.
    return dt.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def read_runs(commands: SlurmCommands, start: datetime, end: datetime) -> tuple[list[SlurmRun], list[str]]:
    """Every run that held GPUs in [start, end), every user's, requeued parts included (`-D`), allocations only
    (`-X`: a job's steps would count its GPUs again), in ONE sacct answer. SlurmUnavailable when sacct cannot
    answer. A month is read in windows instead (read_charges)."""
    doc = commands.run_json("sacct", "--json", "--allusers", "--duplicates", "--allocations",
                            f"--starttime={_sacct_time(start)}", f"--endtime={_sacct_time(end)}")
    return parse_sacct(doc, commands.cluster)


def windows(start: datetime, end: datetime, size: timedelta) -> list[tuple[datetime, datetime]]:
    """[start, end) cut into consecutive windows of `size` (the last one shorter)."""
    out, lo = [], start
    while lo < end:
        out.append((lo, min(lo + size, end)))
        lo += size
    return out


def owning_window(run: SlurmRun, start: datetime, end: datetime, window: timedelta) -> int | None:
    """The index of the one window of windows(start, end, window) that charges the run: the one holding its first
    second inside [start, end) (a run begun before `start` belongs to the first). sacct lists a run in every window
    it overlaps; only this one counts it, for its whole part of [start, end), so a run across windows is charged
    once, exactly as by one whole read. None: it has no second inside."""
    first = max(run.start, start)
    return (first - start) // window if first < end else None


def read_charges(commands: SlurmCommands, start: datetime, end: datetime, now: datetime, prices: "SlurmPrices", *,
                 window: timedelta) -> Iterator[tuple[list["SlurmCharge"], list[str]]]:
    """[start, end) read from sacct one window at a time (`window`: SlurmClusterSettings.sacct_window_hours; one
    answer is parsed whole, ~9 KiB of Python objects per record, so the window, not the month, bounds the memory), each answer charged (against the whole [start, end), by
    the runs that window owns) and let go before the next is asked: (charges, unreadable-record lines) per window.
    Peak memory is one window's answer, not the month's. A window sacct cannot answer raises SlurmUnavailable
    naming it: the caller drops what earlier windows gave (never a part of the month shown as the whole)."""
    cuts = windows(start, end, window)
    for i, (lo, hi) in enumerate(cuts):
        try:
            doc = commands.run_json("sacct", "--json", "--allusers", "--duplicates", "--allocations",
                                    f"--starttime={_sacct_time(lo - SACCT_WINDOW_MARGIN)}",
                                    f"--endtime={_sacct_time(min(hi + SACCT_WINDOW_MARGIN, end))}")
            runs, unread = parse_sacct(doc, commands.cluster)
        except SlurmUnavailable as exc:
            raise type(exc)(f"{exc}, in window {i + 1} of {len(cuts)} ({lo:%Y-%m-%d %H:%M:%S} to "
                            f"{hi:%Y-%m-%d %H:%M:%S} UTC)") from None
        del doc
        mine = [r for r in runs if owning_window(r, start, end, window) == i]
        yield charge(mine, start, end, now, prices), unread


# --------------------------------------------------------------------------- charging (pure)


def run_seconds(run: SlurmRun, start: datetime, end: datetime, now: datetime) -> int:
    """How long the run held its GPUs inside [start, end): Slurm's elapsed when it lies wholly inside, else its
    own start and end clipped to the window (a run still going: up to `now`)."""
    run_end = run.end if run.end is not None else now
    if run.end is not None and start <= run.start and run.end <= end:
        return run.elapsed_s
    lo, hi = max(run.start, start), min(run_end, end)
    return max(0, int((hi - lo).total_seconds()))


@dataclass(frozen=True)
class SlurmPrices:
    """One cluster's price of a GPU-hour (module docstring: partition, then GPU model, then none)."""

    cluster: str
    per_partition: Mapping[str, float]
    model_of_partition: Mapping[str, str]
    catalog: Catalog | None = None
    catalog_problem: str = ""  # why there is no catalog, said with an unpriced run
    origin: str = "the slurm: section"

    @classmethod
    def of(cls, cluster: SlurmClusterSettings, catalog: Catalog | None, *, catalog_problem: str = "",
           origin: str = "the slurm: section") -> "SlurmPrices":
        return cls(cluster.cluster, dict(cluster.usd_per_gpu_hour), dict(cluster.gpu_model), catalog,
                   catalog_problem, origin)

    def price(self, partition: str, gpu_type: str) -> GpuHourPrice:
        """In order: the partition's own $/GPU-h, the partition's GPU model from the catalog, the "*" $/GPU-h,
        the GPU model of "*" or the one sacct names from the catalog; else none, with the reason."""
        own = self.per_partition.get(partition)
        if own is not None:
            return GpuHourPrice(own, f"partition {partition} at {format_money(own, per='GPU-h')} in {self.origin}")
        if self.model_of_partition.get(partition):
            return self._catalog(partition, self.model_of_partition[partition])
        every = self.per_partition.get(ANY_PARTITION)
        if every is not None:
            return GpuHourPrice(every, f"every partition at {format_money(every, per='GPU-h')} in {self.origin}")
        model = self.model_of_partition.get(ANY_PARTITION) or gpu_type
        if model:
            return self._catalog(partition, model)
        return GpuHourPrice(None, f"no price for partition {partition or '(none)'}: {self.origin} gives it no "
                                  "usd_per_gpu_hour or gpu_model and sacct names no GPU type")

    def _catalog(self, partition: str, model: str) -> GpuHourPrice:
        p = host_price(partition, model, 1, HostPriceTable(origin=self.origin), self.catalog,
                       catalog_problem=self.catalog_problem)
        if p.usd_per_hour is None:
            return GpuHourPrice(None, f"no price for partition {partition}'s GPU {model!r}: {p.why}")
        return GpuHourPrice(p.usd_per_hour, f"partition {partition}: {p.source}")


def charge(runs: Iterable[SlurmRun], start: datetime, end: datetime, now: datetime,
           prices: SlurmPrices) -> list[SlurmCharge]:
    """Each run's GPU time inside [start, end), priced once per (partition, GPU type); runs with none left out."""
    memo: dict[tuple[str, str], GpuHourPrice] = {}
    out = []
    for run in runs:
        seconds = run.gpus * run_seconds(run, start, end, now)
        if seconds <= 0:
            continue
        key = (run.partition, run.gpu_type)
        if key not in memo:
            memo[key] = prices.price(*key)
        out.append(SlurmCharge(run, seconds, memo[key]))
    return out
