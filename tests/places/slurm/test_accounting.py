"""Slurm GPU-hours from sacct: a real 22.05 capture of finished jobs charged to the cent, a month's bounds clipping
the runs that cross them, the price order (partition, GPU model from the catalog, none), and the live cluster."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpufinops.config import load_settings
from gpufinops.cost.slurm import slurm_totals, usage_table
from gpufinops.places.slurm.accounting import SlurmPrices, charge, parse_sacct, read_runs, run_seconds
from gpufinops.places.slurm.commands import SlurmCommands, SlurmUnavailable
from gpufinops.prices.catalog import load_catalog
from gpufinops.run.slurm_cost import read_slurm_usage

CAPTURE = Path(__file__).parents[2] / "data" / "slurm" / "sacct-22.05.json"  # tests/data/slurm/SOURCES.md


def at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


DECEMBER = (datetime(2026, 12, 1, tzinfo=timezone.utc), datetime(2027, 1, 1, tzinfo=timezone.utc))
NOW = datetime(2026, 12, 20, tzinfo=timezone.utc)


def capture_runs():
    runs, unread = parse_sacct(json.loads(CAPTURE.read_text()), "acct")
    assert unread == []
    return runs


def prices(**cluster) -> SlurmPrices:
    s = load_settings(None, slurm={"cluster": "acct", **cluster}).slurm.clusters[0]
    return SlurmPrices.of(s, load_catalog())


def test_capture_reads_every_run_requeued_parts_included():
    runs = capture_runs()
    assert [(r.job_id, r.user, r.account, r.partition, r.qos, r.state, r.gpus, r.elapsed_s) for r in runs] == [
        ("3", "alice", "ml", "gpu", "normal", "REQUEUED", 1, 38),
        ("1", "alice", "ml", "gpu", "normal", "COMPLETED", 2, 40),
        ("2", "bob", "vision", "interactive", "normal", "COMPLETED", 1, 25),
        ("3", "alice", "ml", "gpu", "normal", "COMPLETED", 1, 30),
        ("4", "bob", "vision", "gpu", "normal", "CANCELLED", 1, 21)]
    assert runs[0].subject_id == "slurm:acct/3"
    assert runs[0].start == at(1796635384) and runs[0].end == at(1796635422)


def test_month_charge_to_the_cent_per_account_user_partition():
    # 900 $/GPU-h = $0.25 per GPU-second and 720 = $0.20: the seconds of the capture show in the cents.
    p = prices(usd_per_gpu_hour={"gpu": 900.0, "interactive": 720.0})
    usage = usage_table(c.row() for c in charge(capture_runs(), *DECEMBER, NOW, p))
    acc = slurm_totals(usage, "account")
    # ml: job 1 2 GPUs x 40 s + job 3 38 s (requeued part) + 30 s = 148 GPU-s = $37.00
    # vision: job 2 25 GPU-s at $0.20 + job 4 21 GPU-s at $0.25 = $10.25
    assert acc[["account", "jobs", "usd"]].to_dict("records") == [
        {"account": "ml", "jobs": 2, "usd": 37.00}, {"account": "vision", "jobs": 2, "usd": 10.25}]
    assert usage["gpu_seconds"].sum() == 194
    part = slurm_totals(usage, "partition")
    assert part[["partition", "usd"]].to_dict("records") == [{"partition": "gpu", "usd": 42.25},
                                                              {"partition": "interactive", "usd": 5.00}]
    users = slurm_totals(usage, "user")
    assert users[["user", "usd"]].to_dict("records") == [{"user": "alice", "usd": 37.00},
                                                          {"user": "bob", "usd": 10.25}]
    assert slurm_totals(usage, "qos")[["qos", "usd"]].to_dict("records") == [{"qos": "normal", "usd": 47.25}]


def test_runs_crossing_the_bounds_are_clipped_to_them():
    runs = capture_runs()
    lo, hi = at(1796635410), at(1796635430)  # a "month" that starts and ends while jobs run
    # job 1: [410, 424) x 2 GPUs; job 2 ended at 409: nothing; job 3: [410, 422) then [423, 430); job 4: [410, 430)
    assert [run_seconds(r, lo, hi, NOW) * r.gpus for r in runs] == [12, 28, 0, 7, 20]
    charged = charge(runs, lo, hi, NOW, prices(usd_per_gpu_hour={"*": 900.0}))
    assert [c.run.job_id for c in charged] == ["3", "1", "3", "4"]
    assert round(sum(c.cost for c in charged), 2) == 16.75  # 67 GPU-s x $0.25


def test_a_running_run_counts_up_to_now():
    run = capture_runs()[1]
    going = type(run)(**{**run.__dict__, "end": None})
    assert run_seconds(going, *DECEMBER, at(1796635384 + 100)) == 100


def test_price_order_partition_then_gpu_model_then_none():
    catalog = load_catalog()
    lowest = min(o.on_demand_usd_h / o.gpu_count for o in catalog.offers if o.gpu == "A100-80GB")
    p = prices(usd_per_gpu_hour={"gpu": 2.5}, gpu_model={"interactive": "A100-80GB"})
    assert p.price("gpu", "").usd_per_gpu_hour == 2.5
    est = p.price("interactive", "")
    assert est.usd_per_gpu_hour == pytest.approx(lowest) and est.source.startswith("partition interactive: estimate")
    none = p.price("debug", "")
    assert none.usd_per_gpu_hour is None and "no usd_per_gpu_hour or gpu_model" in none.source
    # the gres type sacct names (AccountingStorageTRES=gres/gpu:a100) when nothing is configured for the partition
    assert p.price("debug", "a100-80gb").usd_per_gpu_hour == pytest.approx(lowest)
    assert prices(usd_per_gpu_hour={"*": 1.5}, gpu_model={"gpu": "A100-80GB"}).price("gpu", "").usd_per_gpu_hour \
        == pytest.approx(lowest)  # the partition's own model before the "*" price


def test_unpriced_runs_keep_their_gpu_hours_never_zero_dollars():
    usage = usage_table(c.row() for c in charge(capture_runs(), *DECEMBER, NOW, prices(usd_per_gpu_hour={"gpu": 900.0})))
    vision = slurm_totals(usage, "account").set_index("account").loc["vision"]
    assert vision["usd"] == 5.25 and vision["unpriced_gpu_hours"] == round(25 / 3600, 2)
    assert usage.loc[usage["partition"] == "interactive", "cost"].isna().all()


def test_typed_gpu_entries_name_the_model_and_are_not_counted_twice():
    doc = json.loads(CAPTURE.read_text())
    doc["jobs"] = doc["jobs"][1:2]
    doc["jobs"][0]["tres"]["allocated"].append({"type": "gres", "name": "gpu:a100", "id": 1002, "count": 2})
    (run,), _ = parse_sacct(doc, "acct")
    assert (run.gpus, run.gpu_type) == (2, "a100")


def test_an_unreadable_record_is_said_and_left_out():
    doc = json.loads(CAPTURE.read_text())
    doc["jobs"][1]["tres"]["allocated"][-1]["count"] = None
    runs, unread = parse_sacct(doc, "acct")
    assert len(runs) == 4 and unread == ["slurm acct: job 1's accounting record has no readable GPU count: left out "
                                         "of the GPU-hours"]


def test_sacct_failing_is_an_error_never_zero(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=gone\nSlurmctldHost=localhost\nAccountingStorageType=accounting_storage/none\n")
    with pytest.raises(SlurmUnavailable, match="sacct --json failed"):
        read_runs(SlurmCommands("gone", str(conf), timeout_s=20), *DECEMBER)
    settings = load_settings(None, slurm={"cluster": "gone", "conf": str(conf), "usd_per_gpu_hour": {"*": 2.0}})
    usage = read_slurm_usage(settings, *DECEMBER, NOW)
    assert not usage.complete and usage.table.empty
    assert usage.errors[0].startswith("slurm gone: sacct --json failed") and "unknown, not zero" in usage.errors[0]


def test_live_cluster_charges_what_sacct_says(slurm_acct, slurm_acct_jobs):
    a = slurm_acct_jobs.submit("alice", gpus=2, name="cost_a", script="sleep 3")
    b = slurm_acct_jobs.submit("bob", gpus=1, name="cost_b", partition="interactive", script="sleep 2")
    for j in (a, b):
        slurm_acct_jobs.wait_state(j, "COMPLETED", timeout=60)
    settings = load_settings(None, slurm={"cluster": slurm_acct.name, "conf": str(slurm_acct.conf),
                                          "usd_per_gpu_hour": {"gpu": 900.0, "interactive": 720.0}})
    now = datetime.now(timezone.utc)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    mine = None
    for _ in range(100):  # accounting is written asynchronously (pitfall 15)
        usage = read_slurm_usage(settings, start, now.replace(year=now.year + 1), datetime.now(timezone.utc))
        assert usage.complete, usage.errors
        mine = usage.table[usage.table["job_id"].isin([str(a), str(b)]) & ~usage.table["running"]]
        if len(mine) == 2:
            break
        time.sleep(0.2)
    assert len(mine) == 2
    # What sacct's own text says, read apart from the JSON: ElapsedRaw and AllocTRES per job.
    text = slurm_acct.run("sacct", "-X", "-n", "-P", "-j", f"{a},{b}", "-o", "jobid,account,elapsedraw,alloctres").stdout
    expected = {}
    for line in text.split():
        job, account, elapsed, tres = line.split("|")
        gpus = int(dict(kv.split("=") for kv in tres.split(","))["gres/gpu"])
        expected[job] = (account, gpus * int(elapsed))
    got = {r.job_id: (r.account, r.gpu_seconds) for r in mine.itertuples()}
    assert got == expected and expected[str(a)][0] == "ml"
    cents = round(expected[str(a)][1] * 25 + expected[str(b)][1] * 20)
    assert round(mine["cost"].sum() * 100) == cents


def test_bad_prices_are_config_errors_naming_the_file_and_key(tmp_path):
    from gpufinops.config import ConfigError

    cfg = tmp_path / "g.yaml"
    for body, said in (("usd_per_gpu_hour: {gpu: -1}", "gpu: a price must be above 0"),
                       ("usd_per_gpu_hour: {gpu: cheap}", "gpu: expected a price in USD per hour"),
                       ("gpu_model: {a100: Z9000}", "a100: unknown GPU model 'Z9000'")):
        cfg.write_text(f"slurm:\n  cluster: hpc\n  {body}\n")
        with pytest.raises(ConfigError) as err:
            load_settings(cfg)
        assert str(cfg) in str(err.value) and "key 'slurm.clusters.0." in str(err.value) and said in str(err.value)


# --------------------------------------------------------------------------- a month read in windows


class WindowedSacct:
    """A `sacct` runner that answers each -S/-E window with the capture's records sacct itself would list for it
    (begun before its end, not ended before its start: in every window it overlaps), and writes down each window.
    `fail_at`: the call (1-based) that fails as slurmdbd going away does."""

    def __init__(self, doc, fail_at=0):
        self.doc, self.fail_at, self.asked = doc, fail_at, []

    def __call__(self, argv, env, timeout_s):
        import subprocess

        opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        lo, hi = (datetime.fromisoformat(opts[k]).astimezone().timestamp() for k in ("starttime", "endtime"))
        self.asked.append((lo, hi))
        if len(self.asked) == self.fail_at:
            return subprocess.CompletedProcess(argv, 1, "", "sacct: error: Problem talking to the database: "
                                                            "Connection refused")
        jobs = [j for j in self.doc["jobs"]
                if j["time"]["start"] < hi and (j["time"]["end"] >= lo or j["time"]["end"] == 0)]
        return subprocess.CompletedProcess(argv, 0, json.dumps({**self.doc, "jobs": jobs}), "")


PERIOD = (at(1796635370), at(1796635460))  # around the capture's five runs (1796635384 .. 1796635453)


def windowed_usage(runner, hours):
    settings = load_settings(None, slurm={"cluster": "acct", "usd_per_gpu_hour": {"gpu": 900.0, "interactive": 720.0},
                                          "sacct_window_hours": hours})
    return read_slurm_usage(settings, *PERIOD, NOW,
                            commands_for=lambda name, conf, t: SlurmCommands(name, conf, t, runner=runner))


def test_a_run_across_windows_is_charged_once_to_the_cent():
    doc = json.loads(CAPTURE.read_text())
    runner = WindowedSacct(doc)
    usage = windowed_usage(runner, 10 / 3600)  # 10-second windows: every run of the capture crosses one or more
    assert usage.complete and usage.warnings == []
    assert len(runner.asked) == 9  # 90 s in 10 s windows, one sacct answer each
    # job 1 (2 GPUs, 1796635384 + 40 s) is listed by five windows' answers; it is charged once, for its 40 s
    assert sum(len(WindowedSacct(doc)(["sacct", f"--starttime={datetime.fromtimestamp(lo).isoformat()}",
                                       f"--endtime={datetime.fromtimestamp(hi).isoformat()}"], {}, 1).stdout
                   .split('"job_id": 1,')) - 1 for lo, hi in runner.asked) >= 4
    whole = usage_table(c.row() for c in charge(capture_runs(), *PERIOD, NOW,
                                               prices(usd_per_gpu_hour={"gpu": 900.0, "interactive": 720.0})))
    assert sorted(usage.table["job_id"]) == sorted(whole["job_id"]) == ["1", "2", "3", "3", "4"]
    assert usage.table["gpu_seconds"].sum() == whole["gpu_seconds"].sum() == 194
    for by in ("account", "user", "partition", "qos"):
        assert slurm_totals(usage.table, by)[[by, "jobs", "usd"]].to_dict("records") == \
            slurm_totals(whole, by)[[by, "jobs", "usd"]].to_dict("records")
    assert slurm_totals(usage.table, "account")["usd"].tolist() == [37.00, 10.25]


def test_a_window_that_fails_fails_the_cluster_never_a_part_shown_as_the_whole():
    runner = WindowedSacct(json.loads(CAPTURE.read_text()), fail_at=3)
    usage = windowed_usage(runner, 10 / 3600)
    assert len(runner.asked) == 3  # nothing asked after the failing window
    assert not usage.complete and usage.table.empty  # the two windows read before it are dropped
    assert usage.errors == [
        "slurm acct: sacct --json failed (exit 1): sacct: error: Problem talking to the database: Connection refused"
        f", in window 3 of 9 ({at(1796635390):%Y-%m-%d %H:%M:%S} to {at(1796635400):%Y-%m-%d %H:%M:%S} UTC) "
        "(its GPU-hours are unknown, not zero)"]


def test_a_window_with_no_job_is_empty_not_an_outage():
    import subprocess

    # 22.05's sacct over a quiet window, as the test cluster's slurmdbd answers it: exit 0, no job, one error entry.
    quiet = {"meta": {}, "errors": [{"description": "Nothing found", "error_number": 9003,
                                     "error": "Nothing found with query", "source": "slurmdb_jobs_get"}], "jobs": []}
    sacct = SlurmCommands("acct", runner=lambda argv, env, t: subprocess.CompletedProcess(argv, 0, json.dumps(quiet), ""))
    assert read_runs(sacct, *DECEMBER) == ([], [])
    # any other error entry, or one with jobs, is still an error
    broken = {**quiet, "errors": [{**quiet["errors"][0], "error_number": 9000}]}
    sacct.runner = lambda argv, env, t: subprocess.CompletedProcess(argv, 0, json.dumps(broken), "")
    with pytest.raises(SlurmUnavailable, match="reported an error"):
        read_runs(sacct, *DECEMBER)
