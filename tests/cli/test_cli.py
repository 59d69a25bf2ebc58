"""The command line a new user meets first (issue 18, issue 11 point 12): one output convention, one set of
exit codes, paths relative to the config file, `rules check` of the config's rules, what will happen to a
verdict, and `--dry-run` forced from the command line."""

import logging
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from gpufinops.cli import main
from gpufinops.cli.core import decision_outcome, decision_row, format_decision_table
from gpufinops.config import Settings, load_settings
from gpufinops.model import TAG_PROTECT, TAG_SNOOZE, Action, Decision, GpuInstance, ReasonCode, Rule, Verdict

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc)

BROKEN_RULE = "rules:\n  - name: broken\n    threshold_pct: 400\n    window: 10m\n"
GOOD_RULE = "rules:\n  - name: mine-5pct-1h\n    threshold_pct: 5\n    window: 1h\n    action: stop\n"


def instance(tags=None, managed_by=""):
    return GpuInstance(instance_id="i-0abc", instance_type="g5.xlarge", region="us-east-1", state="running",
                       launch_time=NOW - timedelta(days=1), tags=tags or {"team": "ml"}, managed_by=managed_by)


def idle(action=Action.STOP):
    return Decision("i-0abc", "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "every sample under 10% for 2 h", NOW,
                    action=action, window_s=7200, hourly_cost=1.0)


RULE = Rule(name="r", threshold_pct=10, window_s=7200, warning_lead_s=900, action=Action.STOP)


# --------------------------------------------------------------------------- what will happen (point 12)


def test_a_protected_idle_instance_says_it_is_never_stopped():
    assert decision_outcome(idle(), instance({TAG_PROTECT: "true"}), RULE, NOW, False) == "protected, never stopped"
    row = decision_row(idle(), instance({TAG_PROTECT: "yes"}), RULE, NOW, False)
    assert row["protected"] is True and row["outcome"] == "protected, never stopped"


def test_managed_snoozed_notify_and_plain_idle_say_what_happens():
    managed = instance(managed_by="Auto Scaling group 'ml-asg'")
    assert decision_outcome(idle(), managed, RULE, NOW, False) == "managed by Auto Scaling group 'ml-asg', never stopped"
    snoozed = instance({TAG_SNOOZE: (NOW + timedelta(hours=3)).isoformat()})
    assert decision_outcome(idle(), snoozed, RULE, NOW, False).endswith("not stopped")
    assert "never stopped" in decision_outcome(idle(Action.NOTIFY), instance(), RULE, NOW, False)
    assert decision_outcome(idle(), instance(), RULE, NOW, False) == "warn, then stop 15 min later"
    assert decision_outcome(idle(), instance(), RULE, NOW, True).startswith("dry-run: would warn, then stop")
    active = Decision("i-0abc", "r", Verdict.ACTIVE, ReasonCode.BUSY, "busy", NOW, action=Action.STOP)
    assert decision_outcome(active, instance({TAG_PROTECT: "true"}), RULE, NOW, False) == ""


def test_evaluate_says_a_power_off_leaves_the_vm_billed_and_is_refused_off_azure():
    vm = GpuInstance(instance_id="azure:11111111-2222-3333-4444-555555555555/ml/a100",
                     instance_type="Standard_NC24ads_A100_v4",
                     region="eastus", state="running", launch_time=NOW - timedelta(days=1), provider="azure")
    off = Decision(vm.instance_id, "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", NOW, action=Action.POWER_OFF)
    assert decision_outcome(off, vm, RULE, NOW, False) == \
        "warn, then power_off 15 min later (still billed: not deallocated)"
    assert decision_outcome(idle(Action.POWER_OFF), instance(), RULE, NOW, False).startswith(
        "action power_off applies to Azure VMs only")  # an EC2 instance: notify only
    spent = Decision(vm.instance_id, "r", Verdict.IDLE, ReasonCode.BILLED_WHILE_STOPPED, "billed", NOW,
                     action=Action.POWER_OFF)
    assert decision_outcome(spent, vm, RULE, NOW, False).startswith("already powered off")


def test_table_shows_the_outcome_and_counts_instances_and_verdicts_apart():
    rows = [decision_row(idle(), instance({TAG_PROTECT: "true"}), RULE, NOW, False),
            decision_row(idle(Action.NOTIFY), instance({TAG_PROTECT: "true"}), RULE, NOW, False)]
    text = format_decision_table(rows, n_instances=1, n_rules=2, wide=True)
    assert "IDLE — protected, never stopped" in text
    narrow = format_decision_table(rows, n_instances=1, n_rules=2)
    assert "then: protected, never stopped" in " ".join(narrow.split()) and max(map(len, narrow.splitlines())) <= 120
    assert text.splitlines()[-1].startswith("1 instance(s) judged under 2 rule(s): 2 verdict(s), one per instance and rule")


# --------------------------------------------------------------------------- paths (point 9), example (point 10)


def test_every_relative_path_in_a_config_is_relative_to_the_config_file(tmp_path, monkeypatch):
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    cfg = conf_dir / "gpufinops.yaml"
    cfg.write_text(yaml.safe_dump({
        "database_url": "sqlite:///state/gpufinops.db", "rules_paths": ["rules"],
        "slack": {"outbox_path": "outbox.jsonl"}, "schedule": {"monthly_report_dir": "reports"},
        "recommend": {"price_cache_path": "prices.json"},
    }))
    monkeypatch.chdir(tmp_path)  # anywhere but the config's folder
    s = load_settings(cfg)
    base = conf_dir.resolve()
    assert s.database_url == f"sqlite:///{base / 'state' / 'gpufinops.db'}"
    assert s.rules_paths == (str(base / "rules"),)
    assert s.slack.outbox_path == str(base / "outbox.jsonl")
    assert s.schedule.monthly_report_dir == str(base / "reports")
    assert s.recommend.price_cache_path == str(base / "prices.json")
    # Defaults not written in the file follow the same rule.
    (conf_dir / "empty.yaml").write_text("{}\n")
    assert load_settings(conf_dir / "empty.yaml").database_url == f"sqlite:///{base / 'gpufinops.db'}"


@pytest.mark.parametrize("url", ["sqlite:////var/lib/g.db", "sqlite:///:memory:", "postgresql+psycopg://u@h/db",
                                 "sqlite:///C.db?mode=ro"])
def test_absolute_memory_and_server_urls_are_kept(tmp_path, url):
    cfg = tmp_path / "g.yaml"
    cfg.write_text(yaml.safe_dump({"database_url": url}))
    got = load_settings(cfg).database_url
    assert got == (f"sqlite:///{tmp_path.resolve() / 'C.db'}?mode=ro" if url.endswith("?mode=ro") else url)


def test_without_a_config_file_paths_stay_as_given():
    assert load_settings().database_url == Settings().database_url == "sqlite:///gpufinops.db"


def test_example_config_shows_the_real_defaults():
    example = load_settings(REPO / "gpufinops.example.yaml")
    defaults = Settings()
    assert example.service == defaults.service and example.service.host == "127.0.0.1"
    assert example.act == defaults.act and example.schedule == defaults.schedule


def test_local_config_and_outbox_are_git_ignored():
    ignored = subprocess.run(["git", "check-ignore", "gpufinops.yaml", "gpufinops-outbox.jsonl"], cwd=REPO,
                             capture_output=True, text=True)
    assert ignored.stdout.split() == ["gpufinops.yaml", "gpufinops-outbox.jsonl"]
    tracked = subprocess.run(["git", "check-ignore", "gpufinops.example.yaml"], cwd=REPO, capture_output=True)
    assert tracked.returncode == 1  # the example stays tracked


# --------------------------------------------------------------------------- rules check with a config (point 8)


def test_rules_check_with_a_config_checks_the_configs_rules(tmp_path, capsys):
    rules = tmp_path / "myrules"
    rules.mkdir()
    (rules / "mine.yaml").write_text(GOOD_RULE)
    cfg = tmp_path / "g.yaml"
    cfg.write_text("rules_paths: [myrules]\n")
    assert main(["--config", str(cfg), "rules", "check"]) == 0
    out = capsys.readouterr().out
    assert "mine-5pct-1h" in out and "gpu-util-below-10pct-2h" not in out and "1 rule(s) valid" in out

    (rules / "broken.yaml").write_text(BROKEN_RULE)
    assert main(["--config", str(cfg), "rules", "check"]) == 1
    err = capsys.readouterr().err
    assert "broken.yaml" in err and "threshold_pct" in err


def test_the_example_config_copied_out_of_the_clone_still_finds_the_shipped_rules(tmp_path, capsys, monkeypatch):
    """docs/deploy.md copies the example to /etc/gpufinops/: its relative paths resolve against that folder, so it
    must not name a `rules` folder that only the clone has (it used to: `rules_paths: [rules]`)."""
    from gpufinops.config import DEFAULT_RULES_DIR

    etc = tmp_path / "etc" / "gpufinops"
    etc.mkdir(parents=True)
    (etc / "gpufinops.yaml").write_text((REPO / "gpufinops.example.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["--config", str(etc / "gpufinops.yaml"), "rules", "check"]) == 0
    out = capsys.readouterr().out
    assert "gpu-util-below-10pct-2h" in out
    assert load_settings(etc / "gpufinops.yaml").database_url == f"sqlite:///{etc.resolve() / 'gpufinops.db'}"
    # A relative rules folder that is not there says where it was looked for and where the shipped rules are.
    (etc / "gpufinops.yaml").write_text("rules_paths: [rules]\n")
    assert main(["--config", str(etc / "gpufinops.yaml"), "rules", "check"]) == 1
    err = capsys.readouterr().err
    assert (f"{etc.resolve() / 'rules'}: rule path does not exist (a relative path in a config file is relative to "
            f"that file's folder; the shipped rules are {DEFAULT_RULES_DIR}, used when rules_paths is not set)") in err


def test_rules_check_without_a_config_checks_the_shipped_rules(capsys, monkeypatch):
    monkeypatch.delenv("GPUFINOPS_CONFIG", raising=False)
    assert main(["rules", "check"]) == 0
    assert "gpu-util-below-10pct-2h" in capsys.readouterr().out


# --------------------------------------------------------------------------- conventions (point 14)


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("gpufinops ")


@pytest.mark.parametrize("argv", [["costs", "--month", "2024-13"], ["budgets", "check", "--month", "24-01"],
                                  ["report", "--month", "2024-13", "--db", "DB"]])
def test_a_bad_month_exits_2_everywhere(argv, tmp_path, capsys):
    db = tmp_path / "g.db"
    db.touch()
    cfg = tmp_path / "g.yaml"
    cfg.write_text(f"database_url: sqlite:///{db}\n")
    assert main(["--config", str(cfg)] + [str(db) if a == "DB" else a for a in argv]) == 2
    assert "error:" in capsys.readouterr().err


def test_output_option_everywhere_and_the_old_format_flag_still_works(tmp_path, capsys):
    db = tmp_path / "g.db"
    from gpufinops.store.store import Store

    Store(f"sqlite:///{db}").close()
    for flag in (["-o", "json"], ["--output", "json"], ["--format", "json"]):
        assert main(["audit", "--db", str(db)] + flag) == 0
        assert capsys.readouterr().out.strip() == "[]"
    for command in (["evaluate"], ["audit"], ["costs"], ["budgets", "check"], ["recommend"], ["size"], ["backtest"]):
        with pytest.raises(SystemExit):
            main(command + ["--help"])
        assert "-o {table,json" in capsys.readouterr().out.replace("\n", " ").replace("  ", " ")


def test_shell_completion_completes_subcommands(tmp_path):
    out = tmp_path / "completions"
    env = dict(os.environ, _ARGCOMPLETE="3", COMP_LINE="python -m gpufinops.cli eva", COMP_POINT="27",
               _ARGCOMPLETE_STDOUT_FILENAME=str(out), _ARGCOMPLETE_IFS="\n")
    subprocess.run([sys.executable, "-m", "gpufinops.cli"], cwd=REPO, env=env, timeout=60, check=False,
                   capture_output=True)
    assert "evaluate" in out.read_text().split()


# --------------------------------------------------------------------------- evaluate and serve (points 11, 12)


def config_for(aws, tmp_path, **extra) -> Path:
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(yaml.safe_dump({
        # Nothing listens on port 9: every query fails fast, so every instance is UNKNOWN (never idle).
        "prometheus": {"url": "http://127.0.0.1:9", "timeout_s": 2},
        "aws": {"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url},
        "database_url": "sqlite:///cli.db", **extra,
    }))
    return cfg


@pytest.mark.integration
def test_evaluate_prints_each_decision_once_and_dry_run_is_forced(aws, tmp_path, capsys, caplog):
    import json

    aws.launch("g5.xlarge", tags={"team": "ml", TAG_PROTECT: "true"})
    aws.launch("g5.xlarge", tags={"team": "ml"})
    cfg = config_for(aws, tmp_path, act={"dry_run": False})
    caplog.set_level(logging.INFO)
    main(["--config", str(cfg), "evaluate", "--once", "--dry-run", "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    assert data["dry_run"] is True and data["instances"] == 2 and len(data["decisions"]) == 2 * data["rules"]
    assert any(r["protected"] for r in data["decisions"])
    assert any("dry-run forced by --dry-run" in r.getMessage() for r in caplog.records)
    decision_logs = [r for r in caplog.records if r.name == "gpufinops.pipeline" and " decision " in r.getMessage()]
    assert decision_logs == []  # the table/JSON holds them; the log lines are the service's

    caplog.clear()
    main(["--config", str(cfg), "evaluate", "--once", "-v"])
    assert "one per instance and rule" in capsys.readouterr().out
    assert [r for r in caplog.records if r.name == "gpufinops.pipeline" and " decision " in r.getMessage()]
    assert (tmp_path / "cli.db").is_file()  # next to the config, wherever the test runs from


def test_dry_run_flag_overrides_the_config_and_says_so(tmp_path, caplog):
    """serve --dry-run and evaluate --dry-run hand on settings with act.dry_run true, whatever the file says."""
    import argparse

    from gpufinops.cli import build_parser
    from gpufinops.cli.core import force_dry_run

    cfg = tmp_path / "g.yaml"
    cfg.write_text("act: {dry_run: false}\n")
    live = load_settings(cfg)
    caplog.set_level(logging.INFO)
    assert force_dry_run(live, argparse.Namespace(dry_run=True)).act.dry_run is True
    assert any("dry-run forced by --dry-run" in r.getMessage() for r in caplog.records)
    assert force_dry_run(live, argparse.Namespace(dry_run=False)).act.dry_run is False
    for command in ("serve", "evaluate"):
        assert build_parser().parse_args([command, "--dry-run"]).dry_run is True


def test_help_imports_no_heavy_library():
    """`gpufinops --help` and shell completion build the whole parser: no subcommand may import pandas, numpy,
    pydantic, SQLAlchemy, boto3 or requests to register itself (they cost start-up time; issue 13)."""
    code = ("import sys; from gpufinops.cli import build_parser; build_parser(); "
            "heavy = {'pandas', 'numpy', 'pydantic', 'sqlalchemy', 'boto3', 'requests', 'yaml', 'pyarrow'}; "
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- one look (issue 26, items 9 and 10)


def test_without_a_config_the_database_is_in_the_state_folder_and_said(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("GPUFINOPS_CONFIG", raising=False)
    assert main(["audit"]) == 0
    err = capsys.readouterr().err
    db = tmp_path / "state" / "gpufinops" / "gpufinops.db"
    assert f"using the database {db}" in err and db.is_file()
    assert not (tmp_path / "gpufinops.db").exists()
    # Asked for: --db is used as given, and nothing is said about the state folder.
    assert main(["audit", "--db", str(tmp_path / "mine.db")]) == 0
    assert (tmp_path / "mine.db").is_file() and "state folder" not in capsys.readouterr().err
    # A command that never opens the database says nothing about one.
    assert main(["size", "--params", "7B", "--mode", "inference", "--limit", "1"]) == 0
    assert "database" not in capsys.readouterr().err


def test_tables_have_snake_case_headers_and_size_writes_csv(capsys):
    from gpufinops.cli.common import format_share, format_window, render_table

    table = render_table([{"instance_id": "i-1", "usd_per_hour": "1.50"}], right=("usd_per_hour",)).splitlines()
    assert table[0].split() == ["instance_id", "usd_per_hour"] and set(table[1]) <= {"-", " "}
    assert table[2].endswith("1.50") and len(table[2]) == len(table[0])
    assert (format_window(7200), format_window(600), format_window(90)) == ("2 h", "10 min", "1 min 30 s")
    assert format_share(0.375) == "37.5 %"
    assert main(["size", "--params", "7B", "--mode", "inference", "--limit", "2", "-o", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("total_gb,provider,instance_type") and len(lines) == 3
    assert main(["size", "--params", "7B", "--mode", "inference", "--limit", "2"]) == 0
    head = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("provider"))
    assert head.split() == ["provider", "instance_type", "gpus", "region", "usd_per_hour", "note", "prices_as_of"]


def test_a_normal_start_hides_library_info_lines(capsys):
    import logging

    assert main(["--log-level", "INFO", "size", "--params", "7B", "--mode", "inference", "--limit", "1"]) == 0
    assert logging.getLogger("apscheduler").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("botocore.credentials").getEffectiveLevel() == logging.WARNING
    assert main(["--log-level", "DEBUG", "size", "--params", "7B", "--mode", "inference", "--limit", "1"]) == 0
    assert logging.getLogger("apscheduler").level == logging.NOTSET  # the root's level again: everything
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


# --------------------------------------------------------------------------- rough edges (issue 40, item 10)


def test_an_unknown_flag_is_refused_by_its_subcommand_with_the_nearest_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--onse"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("usage: gpufinops evaluate ")
    assert err.splitlines()[-1] == "gpufinops evaluate: error: unrecognized arguments: --onse (did you mean --once?)"


def test_evaluate_help_says_it_judges_once_and_has_no_other_mode(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--once" not in text and "the only mode" not in text
    assert "Judge every GPU instance once, print the verdicts and exit: evaluate has no other mode" in text
    assert "{table,json,csv,wide}" in text


def test_rules_check_says_windows_and_leads_as_everything_else_does(capsys):
    assert main(["rules", "check", str(REPO / "rules")]) == 0
    out = capsys.readouterr().out
    assert "stays_below < 10% for 2 h (lead 15 min)" in out and "7200s" not in out


def test_the_evaluate_table_fits_120_columns_and_wide_has_every_column(tmp_path, capsys):
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{tmp_path / 'g.db'}\nprometheus: {{url: 'http://127.0.0.1:9', "
                   f"timeout_s: 1}}\nhosts:\n  inventory:\n    - {{hostname: gpu-box-1, gpu_count: 1, gpu_model: A10G, "
                   f"tags: {{owner: alice, team: ml}}}}\n")
    assert main(["--config", str(cfg), "--log-level", "ERROR", "evaluate"]) == 1
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120, out
    assert out.splitlines()[0].split() == ["instance_id", "rule", "verdict", "usd_per_hour", "reason"]
    assert "metrics unavailable: prometheus at 127.0.0.1:9: cannot connect" in " ".join(out.split())
    assert main(["--config", str(cfg), "--log-level", "ERROR", "evaluate", "-o", "wide"]) == 1
    wide = capsys.readouterr().out
    assert wide.splitlines()[0].split() == ["instance_id", "name", "instance_type", "owner", "team", "rule",
                                            "verdict", "usd_per_hour", "reason"]
    assert "alice" in wide and "metrics unavailable: prometheus at 127.0.0.1:9: cannot connect" in wide


def test_a_too_long_duration_is_said_as_written(capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--since", "5000d"])
    err = capsys.readouterr().err
    assert "argument --since: duration 5000d is longer than the maximum 3660d" in err and "432000000" not in err


def test_backtest_help_states_its_defaults_without_naming_code(capsys):
    from gpufinops.model import FALSE_STOP_COST_H, FALSE_STOP_WITHIN_S, format_duration

    with pytest.raises(SystemExit):
        main(["backtest", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "model." not in text
    assert f"(default {FALSE_STOP_WITHIN_S // 60}m: the break-even of a stop" in text
    assert f"on top of the restart (default {FALSE_STOP_COST_H:g})" in text
    assert format_duration(FALSE_STOP_WITHIN_S) == "30 min"
