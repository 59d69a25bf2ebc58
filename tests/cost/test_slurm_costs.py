"""`gpufinops costs --by slurm-account|slurm-user|partition|slurm-qos`: the month's GPU-hours and dollars per group,
with the idle GPU-hours and dollars of the stored `slurm:` verdicts, printed as text; against the replayed real
capture (tests/data/slurm/sacct-22.05.json, served by a `sacct` that prints it) and against the live cluster."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.cli import main
from gpufinops.config import load_settings
from gpufinops.cost.costs import verdict_costs
from gpufinops.cost.slurm import idle_by_job, slurm_totals, usage_table
from gpufinops.model import Decision, ReasonCode, Verdict
from gpufinops.places.slurm.accounting import SlurmPrices, charge, parse_sacct
from gpufinops.prices.catalog import load_catalog
from gpufinops.store.store import Store

CAPTURE = Path(__file__).parents[1] / "data" / "slurm" / "sacct-22.05.json"
MONTH = "2026-12"  # the capture's month
START = datetime(2026, 12, 1, tzinfo=timezone.utc)


@pytest.fixture
def replayed_sacct(tmp_path, monkeypatch):
    """A `sacct` first on PATH that prints the real capture and writes down its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    args = tmp_path / "sacct.args"
    (bin_dir / "sacct").write_text(f"#!/bin/sh\necho \"$@\" >> {args}\ncat {CAPTURE}\n")
    (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return args


def config(tmp_path, **slurm) -> Path:
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(json.dumps({"database_url": f"sqlite:///{tmp_path / 'g.db'}",
                               "slurm": {"cluster": "acct", "conf": str(tmp_path / "slurm.conf"), **slurm}}))
    return cfg


PRICES = {"usd_per_gpu_hour": {"gpu": 900.0, "interactive": 720.0}}


def record_idle_hour(db: str, at: datetime) -> None:
    """Job 1 (2 GPUs) IDLE for exactly one hour (ticks a minute apart, then ACTIVE), job 2 ACTIVE throughout."""
    store = Store(db)
    ds = []
    for m in range(61):
        t = at + timedelta(minutes=m)
        idle = m < 60
        ds.append(Decision("slurm:acct/1", "slurm-idle", Verdict.IDLE if idle else Verdict.ACTIVE,
                           ReasonCode.IDLE_STAYS_BELOW if idle else ReasonCode.BUSY, "test", t))
        ds.append(Decision("slurm:acct/2", "slurm-idle", Verdict.ACTIVE, ReasonCode.BUSY, "test", t))
    store.record_decisions("run-1", ds, dry_run=True)


def test_costs_by_slurm_account_prints_gpu_hours_dollars_and_idle(tmp_path, capsys, replayed_sacct):
    cfg = config(tmp_path, **PRICES)
    record_idle_hour(f"sqlite:///{tmp_path / 'g.db'}", datetime(2026, 12, 3, 10, tzinfo=timezone.utc))
    assert main(["--config", str(cfg), "costs", "--by", "slurm-account", "--month", MONTH]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["slurm-account", "jobs", "gpu_hours", "usd", "unpriced_gpu_hours", "idle_gpu_hours",
                              "idle_usd", "idle_share"]
    # ml: 148 GPU-s at $0.25 = $37.00, and job 1's idle hour x 2 GPUs x $900 = $1,800 (the verdicts are this test's)
    assert out[2].split() == ["ml", "2", "0.04", "37.00", "0.00", "2.00", "1,800.00", "4864.9", "%"]
    assert out[3].split() == ["vision", "2", "0.01", "10.25", "0.00", "0.00", "0.00", "0.0", "%"]
    assert out[4].startswith("total 0.05 GPU-hours, $47.25, 4 jobs in 2026-12")
    assert out[4].endswith(" on acct (sacct)")
    argv = replayed_sacct.read_text().split()
    assert {"--json", "--allusers", "--duplicates", "--allocations"} <= set(argv)
    assert any(a.startswith("--starttime=2026-12-01T") or a.startswith("--starttime=2026-11-30T") for a in argv)


def test_costs_by_partition_user_and_qos(tmp_path, capsys, replayed_sacct):
    cfg = config(tmp_path, **PRICES)
    assert main(["--config", str(cfg), "costs", "--by", "partition", "--month", MONTH]) == 0
    rows = [line.split()[:4] for line in capsys.readouterr().out.splitlines()[2:4]]
    assert rows == [["gpu", "3", "0.05", "42.25"], ["interactive", "1", "0.01", "5.00"]]
    assert main(["--config", str(cfg), "costs", "--by", "slurm-user", "--month", MONTH, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["slurm-user"], r["usd"], r["idle_usd"]) for r in doc["rows"]] == [("alice", 37.0, 0.0),
                                                                                 ("bob", 10.25, 0.0)]
    assert doc["total"] == {"gpu_hours": 0.05, "usd": 47.25, "unpriced_gpu_hours": 0.0, "jobs": 4}
    assert main(["--config", str(cfg), "costs", "--by", "slurm-qos", "--month", MONTH, "-o", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("normal,4,0.05,47.25,")


def test_unpriced_partition_is_said_never_zero_dollars(tmp_path, capsys, replayed_sacct):
    cfg = config(tmp_path, usd_per_gpu_hour={"gpu": 900.0})
    assert main(["--config", str(cfg), "costs", "--by", "partition", "--month", MONTH]) == 0
    cap = capsys.readouterr()
    assert cap.out.splitlines()[3].split()[:5] == ["interactive", "1", "0.01", "unknown", "0.01"]
    assert "0.01 GPU-hours unpriced" in cap.out
    assert "warning: slurm acct: no price for partition interactive" in cap.err


def test_sacct_failing_is_an_error_and_no_table(tmp_path, capsys, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Problem talking to the database: "
                                   "Connection refused' >&2\nexit 1\n")
    (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert main(["--config", str(config(tmp_path, **PRICES)), "costs", "--by", "slurm-account",
                 "--month", MONTH]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    # the first window of the month failed (how many windows: up to now, when the month is this one)
    err, = cap.err.strip().splitlines()
    assert err.startswith("error: slurm acct: sacct --json failed (exit 1): sacct: error: Problem talking to the "
                          "database: Connection refused, in window 1 of ")
    assert err.endswith(" (2026-12-01 00:00:00 to 2026-12-02 00:00:00 UTC) (its GPU-hours are unknown, not zero)")


def test_no_slurm_section_is_a_usage_error(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("{}\n")
    assert main(["--config", str(cfg), "costs", "--by", "partition"]) == 2
    assert "add a `slurm:` section" in capsys.readouterr().err


# --------------------------------------------------------------------------- idle, joined by subject id (pure)


def test_idle_by_job_joins_the_stored_verdicts_to_accounting(tmp_path):
    db = f"sqlite:///{tmp_path / 'g.db'}"
    at = datetime(2026, 12, 3, 10, tzinfo=timezone.utc)
    record_idle_hour(db, at)
    store = Store(db)
    # a job the accounting does not show (yet): its idle hours are kept, priced at the $/h stored with the verdict
    store.record_decisions("run-2", [Decision("slurm:acct/99", "slurm-idle", Verdict.IDLE,
                                              ReasonCode.IDLE_STAYS_BELOW, "test", at + timedelta(minutes=m),
                                              hourly_cost=6.0) for m in range(31)], dry_run=True)
    store.record_decisions("run-3", [Decision("i-0abc", "idle", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "test",
                                              at + timedelta(minutes=m), hourly_cost=4.0) for m in range(31)],
                           dry_run=True)  # an EC2 instance: not Slurm
    s = load_settings(None, slurm={"cluster": "acct", **PRICES}).slurm.clusters[0]
    runs, _ = parse_sacct(json.loads(CAPTURE.read_text()), "acct")
    usage = usage_table(c.row() for c in charge(runs, START, START + timedelta(days=31), START + timedelta(days=20),
                                                 SlurmPrices.of(s, load_catalog())))
    end = at + timedelta(hours=3)
    vc = verdict_costs(store.verdict_hours_frame(START, end, grain="period"), START, end, max_gap_s=120)
    idle = idle_by_job(vc, usage)
    assert idle[["subject_id", "user", "account", "gpus", "idle_hours", "idle_gpu_hours", "idle_usd"]] \
        .to_dict("records") == [
        {"subject_id": "slurm:acct/1", "user": "alice", "account": "ml", "gpus": 2, "idle_hours": pytest.approx(1.0),
         "idle_gpu_hours": pytest.approx(2.0), "idle_usd": pytest.approx(1800.0)},
        {"subject_id": "slurm:acct/99", "user": "", "account": "", "gpus": pytest.approx(float("nan"), nan_ok=True),
         "idle_hours": pytest.approx(32 / 60), "idle_gpu_hours": 0.0, "idle_usd": pytest.approx(6.0 * 32 / 60)}]
    per_user = slurm_totals(usage, "user", idle)
    assert per_user[["user", "idle_gpu_hours", "idle_usd", "idle_share"]].to_dict("records") == [
        {"user": "alice", "idle_gpu_hours": 2.0, "idle_usd": 1800.0, "idle_share": round(1800 / 37, 3)},
        {"user": "bob", "idle_gpu_hours": 0.0, "idle_usd": 0.0, "idle_share": 0.0}]
    assert slurm_totals(usage, "user", None)["idle_usd"].isna().all()  # verdicts unread: unknown, not 0


# --------------------------------------------------------------------------- the live cluster


def test_live_costs_by_slurm_account_match_sacct(tmp_path, capsys, slurm_acct, slurm_acct_jobs):
    a = slurm_acct_jobs.submit("alice", gpus=2, name="cli_a", script="sleep 2")
    b = slurm_acct_jobs.submit("bob", gpus=1, name="cli_b", script="sleep 1")
    for j in (a, b):
        slurm_acct_jobs.wait_state(j, "COMPLETED", timeout=60)
    cfg = tmp_path / "g.yaml"
    cfg.write_text(json.dumps({"database_url": f"sqlite:///{tmp_path / 'g.db'}",
                               "slurm": {"cluster": slurm_acct.name, "conf": str(slurm_acct.conf),
                                         "usd_per_gpu_hour": {"*": 900.0}}}))
    month = f"{datetime.now(timezone.utc):%Y-%m}"
    for _ in range(100):  # accounting is written asynchronously (pitfall 15): wait until both show
        out = slurm_acct.run("sacct", "-X", "-n", "-P", "-j", f"{a},{b}", "-o", "state").stdout.split()
        if out.count("COMPLETED") == 2:
            break
        time.sleep(0.2)
    assert main(["--config", str(cfg), "costs", "--by", "slurm-account", "--month", month, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # What sacct's own text says of every run this month (other tests' jobs on the shared cluster included).
    text = slurm_acct.run("sacct", "-X", "-D", "-a", "-n", "-P", f"--starttime={month}-01T00:00:00", "-o",
                          "account,state,elapsedraw,alloctres").stdout
    expected: dict[str, int] = {}
    for line in text.splitlines():  # lines, not words: a state reads "CANCELLED by 1000"
        account, state, elapsed, tres = line.split("|")
        gpus = int(dict(kv.split("=") for kv in tres.split(",")).get("gres/gpu", 0)) if tres else 0
        if gpus and state != "RUNNING":
            expected[account] = expected.get(account, 0) + gpus * int(elapsed)
    got = {r["slurm-account"]: r["usd"] for r in doc["rows"]}
    assert got == {acc: round(sec * 0.25, 2) for acc, sec in expected.items()} and "ml" in got and "vision" in got


# --------------------------------------------------------------------------- budgets of Slurm accounts


def budgets_config(tmp_path, budgets: str, **slurm) -> Path:
    path = tmp_path / "budgets.yaml"
    path.write_text(budgets)
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(json.dumps({"database_url": f"sqlite:///{tmp_path / 'g.db'}",
                               "billing": {"budgets_path": str(path)},
                               "slurm": {"cluster": "acct", "conf": str(tmp_path / "slurm.conf"), **slurm}}))
    return cfg


ML_BUDGET = "budgets:\n  - name: ml-gpu\n    scope: {kind: slurm_account, value: ml}\n    amount: 40\n"


def test_budget_of_a_slurm_account_crosses_90_percent_without_billing(tmp_path, capsys, replayed_sacct):
    cfg = budgets_config(tmp_path, ML_BUDGET + "  - name: vision-gpu\n    scope: {kind: slurm_account, value: "
                         "acct/vision}\n    amount: 100\n", **PRICES)
    assert main(["--config", str(cfg), "budgets", "check", "--month", MONTH, "--dry-run", "-o", "table"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[2].split()[:9] == ["ml-gpu", "slurm_account=ml", "2026-12", "40.00", "USD", "37.00", "37.00",
                                    "92.50", "92.50"]
    assert lines[3].split()[:9] == ["vision-gpu", "slurm_account=acct/vision", "2026-12", "100.00", "USD", "10.25",
                                    "10.25", "10.20", "10.20"]
    # one alert per kind, the highest threshold crossed (90 % of 75/90/100), said not sent under --dry-run
    assert "dry-run: would send:" in out
    assert ("[CRITICAL] GPU budget 'ml-gpu' (slurm_account=ml) has spent 92% of $40.00 for 2026-12 (threshold "
            "90%): spent $37.00, month-end forecast $37.00") in out
    assert "is forecast to spend 92% of $40.00" in out and "vision-gpu' (" not in out


def test_budget_of_a_slurm_account_with_sacct_failing_is_an_error_not_zero(tmp_path, capsys, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text("#!/bin/sh\necho 'sacct: error: slurmdbd: Connection refused' >&2\nexit 1\n")
    (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    cfg = budgets_config(tmp_path, ML_BUDGET, **PRICES)
    assert main(["--config", str(cfg), "budgets", "check", "--month", MONTH, "-o", "json"]) == 1
    (row,) = json.loads(capsys.readouterr().out)
    assert row["spent"] == 0.0 and row["error"].startswith(
        "budget 'ml-gpu': slurm acct: sacct --json failed (exit 1): sacct: error: slurmdbd: Connection refused, in "
        "window 1 of ") and row["error"].endswith(" UTC) (its GPU-hours are unknown, not zero)")
    assert row["alerts_sent"] == ""


def test_slurm_budget_forecast_adds_the_running_jobs_rate():
    from gpufinops.cost.budgets import Budget, alert_messages, evaluate_slurm_budget
    from gpufinops.cost.slurm import SlurmUsage

    runs, _ = parse_sacct(json.loads(CAPTURE.read_text()), "acct")
    job1 = next(r for r in runs if r.job_id == "1")
    running = type(job1)(**{**job1.__dict__, "end": None})  # job 1 (2 GPUs) still going
    now = job1.start + timedelta(hours=1)
    end = START + timedelta(days=31)
    s = load_settings(None, slurm={"cluster": "acct", **PRICES}).slurm.clusters[0]
    usage = SlurmUsage(usage_table(c.row() for c in charge([running, *(r for r in runs if r.job_id != "1")], START,
                                                            end, now, SlurmPrices.of(s, None))), ("acct",))
    b = Budget.model_validate({"name": "ml", "scope": {"kind": "slurm_account", "value": "ml"}, "amount": 50000})
    st = evaluate_slurm_budget(b, usage, START, end, now)
    hours_left = (end - now).total_seconds() / 3600
    # spent: job 1's hour x 2 GPUs x $900 + job 3's 68 GPU-s x $0.25; running: 2 GPUs x $900/h
    assert round(st.spent, 2) == 1800 + 17.00 and st.running_rate == 1800.0
    assert st.forecast == pytest.approx(st.spent + 1800.0 * hours_left)
    assert st.top_instances[0] == ("slurm:acct/1", pytest.approx(1800.0)) and st.top_teams[0][0] == "alice"
    assert st.crossed == {"actual": None, "forecast": b.thresholds[-1]}  # forecast far above 100 %
    (msg,) = alert_messages(st, b)
    facts = dict(msg.facts)
    assert msg.key == "budget:ml:slurm_account=ml:2026-12:forecast:100" and "is forecast to spend" in msg.lead
    assert facts["Top jobs"].startswith("slurm:acct/1 $1,800.00, slurm:acct/3 $17.00")
    assert facts["Top users"] == "alice $1,817.00" and facts["Forecast"].endswith("h left")


def test_a_slurm_budget_refuses_idle_escalation_and_other_currencies(tmp_path):
    from gpufinops.config import ConfigError
    from gpufinops.cost.budgets import load_budgets

    path = tmp_path / "budgets.yaml"
    for extra, said in (("    escalate_idle_to_stop_at: 90\n", "does not apply to a slurm_account budget"),
                        ("    currency: EUR\n", "a slurm_account budget is in USD")):
        path.write_text(ML_BUDGET + extra)
        with pytest.raises(ConfigError, match=said):
            load_budgets(path)


def test_budget_job_alerts_once_for_a_slurm_account_on_the_live_cluster(tmp_path, slurm_acct, slurm_acct_jobs):
    from gpufinops.demo.sim import ConsoleNotifier
    from gpufinops.run.jobs import budget_check
    from gpufinops.run.pipeline import Peers

    job = slurm_acct_jobs.submit("alice", gpus=1, name="budget_a", script="sleep 2")
    slurm_acct_jobs.wait_state(job, "COMPLETED", timeout=60)
    for _ in range(100):  # accounting is written asynchronously (pitfall 15)
        if slurm_acct.run("sacct", "-X", "-n", "-P", "-j", str(job), "-o", "state").stdout.strip() == "COMPLETED":
            break
        time.sleep(0.2)
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(f"budgets:\n  - name: ml-gpu\n    scope: {{kind: slurm_account, value: {slurm_acct.name}/ml}}\n"
                       "    amount: 0.25\n    kinds: [actual]\n")
    settings = load_settings(None, billing={"budgets_path": str(budgets)},
                             slurm={"cluster": slurm_acct.name, "conf": str(slurm_acct.conf),
                                    "usd_per_gpu_hour": {"*": 900.0}})
    now = datetime.now(timezone.utc)
    store = Store(f"sqlite:///{tmp_path / 'jobs.db'}")
    lines: list[str] = []
    peers = Peers(None, None, store, ConsoleNotifier(store, lambda: now, lines.append))
    (status,) = budget_check(settings, peers, now)  # no billing source is read: a Slurm account's budget alone
    assert status.error is None and status.spent >= 0.25 and status.alerts_sent == [
        f"budget:ml-gpu:slurm_account={slurm_acct.name}/ml:{now:%Y-%m}:actual:100"]
    assert len(lines) == 1 and "[EMERGENCY] GPU budget 'ml-gpu'" in lines[0]
    budget_check(settings, peers, now)  # again, same month: nothing new
    assert len(lines) == 1
