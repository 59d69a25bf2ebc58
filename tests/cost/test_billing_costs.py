"""Cost x usage (hourly rates, idle cost from stored verdicts), billing settings, and the CLI."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from gpufinops.cli import main
from gpufinops.collect.billing.settings import billing_settings
from gpufinops.collect.billing.synth import write_cur_rows
from gpufinops.config import ConfigError, load_settings
from gpufinops.cost.costs import billing_rates, hourly_rate, idle_cost_report, summarize, verdict_costs
from gpufinops.model import Decision, ReasonCode, Verdict
from gpufinops.store.store import Store

from tests.collect.test_billing_cur import fixture_rows

SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)
T0 = datetime(2024, 9, 2, 10, tzinfo=timezone.utc)


def _decisions(store: Store) -> None:
    def d(iid, verdict, minutes, cost):
        code = ReasonCode.IDLE_STAYS_BELOW if verdict is Verdict.IDLE else ReasonCode.BUSY
        return Decision(iid, "idle", verdict, code, "t", T0 + timedelta(minutes=minutes), hourly_cost=cost)

    ds = [
        d("i-a", Verdict.IDLE, 0, 10.0), d("i-a", Verdict.IDLE, 30, 10.0), d("i-a", Verdict.ACTIVE, 60, 10.0),
        d("i-u", Verdict.IDLE, 0, None), d("i-u", Verdict.IDLE, 30, None),  # untagged, no stored price
        d("i-x", Verdict.UNKNOWN, 0, None),  # no price anywhere
    ]
    store.record_decisions("r1", ds, dry_run=True, teams={"i-a": "ml"},
                           types={"i-a": "p4d.24xlarge", "i-u": "g5.xlarge", "i-x": "zz.huge"})
    # Two rules judged i-a at minute 60: the less idle verdict wins.
    store.record_decisions("r2", [d("i-a", Verdict.IDLE, 60, 10.0)], dry_run=True, teams={"i-a": "ml"})


def test_idle_cost_per_instance_and_team_with_untagged_row(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    _decisions(store)
    catalog = {("g5.xlarge", "us-east-1"): 1.0}
    vc = verdict_costs(store.decision_rows(SEP, OCT), SEP, T0 + timedelta(minutes=90), max_gap_s=3600,
                       catalog=lambda t, r: catalog.get((t, r)), default_region="us-east-1")
    by_inst = idle_cost_report(vc, "instance").set_index("instance")
    # i-a: 60 min idle at $10/h, then 30 min active (up to the report end).
    assert by_inst.loc["i-a", "idle_cost"] == pytest.approx(10.0)
    assert by_inst.loc["i-a", "active_cost"] == pytest.approx(5.0)
    # i-u: priced from the catalog: 90 min idle at $1/h.
    assert by_inst.loc["i-u", "idle_cost"] == pytest.approx(1.5)
    # i-x: no price anywhere: hours reported as unpriced, cost not invented; its one
    # evaluation covers at most the 1 h gap cap, not the 90 min to the report end.
    assert by_inst.loc["i-x", "total_cost"] == 0 and by_inst.loc["i-x", "unpriced_hours"] == pytest.approx(1.0)
    by_team = idle_cost_report(vc, "team").set_index("team")
    assert set(by_team.index) == {"ml", "(untagged)"}
    assert by_team.loc["(untagged)", "idle_cost"] == pytest.approx(1.5)
    assert by_team.loc["ml", "idle_share"] == pytest.approx(10.0 / 15.0)


def test_gap_cap_stops_a_stale_verdict_from_running_on(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    _decisions(store)
    vc = verdict_costs(store.decision_rows(SEP, OCT), SEP, OCT, max_gap_s=120)
    a = vc[vc.instance_id == "i-a"]
    assert list(a["hours"]) == pytest.approx([2 / 60, 2 / 60, 2 / 60])


def test_hourly_rate_prefers_billing_then_decision_then_catalog():
    table = pd.DataFrame({"resource_id": ["i-a", "i-a"], "date": pd.to_datetime(["2024-09-01", "2024-09-02"]),
                          "cost": [100.0, 65.54], "usage_hours": [4.0, 2.0]})
    rates = billing_rates(table)
    assert rates == {"i-a": pytest.approx(32.77)}
    cat = lambda t, r: 5.0  # noqa: E731
    assert hourly_rate("i-a", "p4d.24xlarge", "us-east-1", rates, cat, 9.0).source == "billing"
    assert hourly_rate("i-b", "p4d.24xlarge", "us-east-1", rates, cat, 9.0).rate == 9.0
    assert hourly_rate("i-b", "p4d.24xlarge", "us-east-1", rates, cat, None).rate == 5.0
    assert hourly_rate("i-b", "p4d.24xlarge", "us-east-1", rates, None, None).rate is None


def test_billing_section_errors_name_file_line_and_key(tmp_path):
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text("database_url: sqlite:///x.db\nbilling:\n  source: cur\n  gpu_families: [G5]\n")
    with pytest.raises(ConfigError, match=r"gpufinops\.yaml:4: key 'billing\.gpu_families'"):
        billing_settings(load_settings(cfg))
    cfg.write_text("billing:\n  source: bogus\n")
    with pytest.raises(ConfigError, match=r"gpufinops\.yaml:2: key 'billing\.source'"):
        billing_settings(load_settings(cfg))
    cfg.write_text("billing:\n  path: cur/\n  budgets_path: b.yaml\n")
    bs = billing_settings(load_settings(cfg))
    assert bs.path == str(tmp_path / "cur") and bs.budgets_path == str(tmp_path / "b.yaml")
    assert "p4d" in bs.gpu_families  # default: settings.aws.gpu_families


def test_cli_costs_by_team_json_and_store(tmp_path, capsys):
    cur = write_cur_rows(tmp_path / "cur.parquet", fixture_rows())
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{tmp_path / 'g.db'}\nbilling:\n  source: cur\n  path: {cur}\n")
    rc = main(["-c", str(cfg), "costs", "--month", "2024-09", "--by", "team", "-o", "json", "--save"])
    assert rc == 0
    out = capsys.readouterr()
    rows = {r["team"]: r["cost"] for r in json.loads(out.out)}
    assert rows == {"ml": pytest.approx(3 * 32.77 + 0.70), "(untagged)": pytest.approx(0.72),
                    "vision": pytest.approx(1.40)}
    assert "stored 5 rows for 2024-09 from cur" in out.err
    rc = main(["-c", str(cfg), "costs", "--month", "2024-11", "-o", "csv"])
    assert rc == 0 and "no GPU instance cost in cur for 2024-11" in capsys.readouterr().err


def test_cli_costs_bad_file_exits_1_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 not really")
    rc = main(["costs", "--month", "2024-09", "--source", "cur", "--path", str(bad)])
    assert rc == 1 and "broken.parquet: not a readable Parquet file" in capsys.readouterr().err


def test_summarize_keeps_untagged_cost_as_its_own_row(tmp_path):
    from gpufinops.collect.billing.cur import read_cur
    from gpufinops.config import AwsSettings

    t = read_cur(str(write_cur_rows(tmp_path / "c.parquet", fixture_rows())),
                 SEP, OCT, AwsSettings().gpu_families).table
    s = summarize(t, "team").set_index("team")
    assert s.loc["(untagged)", "cost"] == pytest.approx(0.72)
    assert s["cost"].sum() == pytest.approx(t["cost"].sum())
