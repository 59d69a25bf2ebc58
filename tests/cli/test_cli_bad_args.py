"""The command-line arguments a tester found to end in a traceback (issue 35, item 7): each is now one `error:`
line naming the argument or file, and the exit code of a command that could not run as asked (2; `rules check`
keeps 1 for a rule path it cannot use, as for a broken rule)."""

from __future__ import annotations

import json
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpufinops.cli import main
from gpufinops.config import MAX_TEXT_FILE_BYTES

REPO = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return code, out.out, out.err


@pytest.fixture
def state(tmp_path, monkeypatch):
    """No config: the default database lives in a temporary state folder, never the user's."""
    monkeypatch.delenv("GPUFINOPS_CONFIG", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


# --------------------------------------------------------------------------- audit --db


def test_audit_db_that_is_not_a_database_is_one_error_naming_it(state, capsys):
    not_db = state / "notes.txt"
    not_db.write_text("not a database, only text\n" * 50)
    code, _, err = run(capsys, "audit", "--db", str(not_db))
    assert code == 2
    assert error_lines(err) == [f"error: --db {not_db}: cannot open the database: file is not a database"]


@pytest.mark.parametrize("db, says", [
    ("a\x00b.db", "not a database file or URL"),
    ("", "not a database file or URL"),
    ("{tmp}", "not a database file (a folder)"),
    ("{tmp}/null", "not a database file (not a regular file)"),  # a link to /dev/null: SQLite never opens it
    ("{tmp}/no-such-folder/x.db", "cannot open the database: unable to open database file"),
    ("sqlite:///{tmp}/no-such-folder/x.db", "cannot open the database: unable to open database file"),
    ("nosuchdialect://x", "cannot open the database"),
])
def test_audit_db_that_cannot_be_opened_is_one_error_naming_it(state, capsys, db, says):
    (state / "null").symlink_to("/dev/null")
    code, _, err = run(capsys, "audit", "--db", db.replace("{tmp}", str(state)))
    [line] = error_lines(err)
    assert code == 2 and line.startswith("error: --db ") and says in line, err
    assert not (state / "state").exists() or not list((state / "state").rglob("*.db"))  # nothing created


def test_audit_of_a_database_url_in_the_config_that_is_not_a_database(state, capsys):
    (state / "notes.txt").write_text("not a database\n" * 50)
    cfg = state / "gpufinops.yaml"
    cfg.write_text("database_url: sqlite:///notes.txt\n")
    code, _, err = run(capsys, "--config", str(cfg), "audit")
    [line] = error_lines(err)
    assert code == 2 and line.endswith("notes.txt: cannot open the database: file is not a database"), err


def test_a_command_whose_configured_database_cannot_be_opened_names_the_database(state, capsys):
    """Commands that open the store through the service's composition (here `costs --idle`): one line, the
    database named as the source that failed (exit 1, as for Prometheus down)."""
    (state / "notes.txt").write_text("not a database\n" * 50)
    cfg = state / "gpufinops.yaml"
    cfg.write_text("database_url: sqlite:///notes.txt\n")
    code, _, err = run(capsys, "--config", str(cfg), "costs", "--idle", "--month", "2026-11")
    assert code == 1 and error_lines(err) == ["error: database: file is not a database"], err


# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("argv, flag", [
    (["size", "--params", "inf", "--mode", "inference"], "--params"),
    (["size", "--params", "nan", "--mode", "inference"], "--params"),
    (["size", "--params", "1e400", "--mode", "inference"], "--params"),
    (["size", "--params", "1e30", "--mode", "inference"], "--params"),
    (["size", "--params", "7B", "--mode", "inference", "--layers", "-3"], "--layers"),
    (["size", "--params", "7B", "--mode", "inference", "--context", "0"], "--context"),
    (["size", "--params", "7B", "--mode", "inference", "--limit", "-1"], "--limit"),
    (["demo", "--tick", "0"], "--tick"),
    (["demo", "--tick", "-5"], "--tick"),
    (["demo", "--hours", "nan"], "--hours"),
    (["demo", "--hours", "inf"], "--hours"),
    (["audit", "--limit", "-3"], "--limit"),
    (["serve", "--port", "99999"], "--port"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_nonsense_numbers_are_usage_errors_naming_the_flag(state, capsys, argv, flag):
    code, _, err = run(capsys, *argv)
    assert code == 2 and f"argument {flag}" in err.splitlines()[-1], err


def test_size_still_reads_a_sensible_model(state, capsys):
    code, out, _ = run(capsys, "size", "--params", "7B", "--mode", "inference", "-o", "json")
    assert code == 0 and json.loads(out)["estimate"]["total_gb"] > 0


# --------------------------------------------------------------------------- rules and config files


def test_rules_check_of_dev_zero_is_refused_without_reading_it(state, capsys):
    started = time.monotonic()
    code, out, err = run(capsys, "rules", "check", "/dev/zero")
    assert code == 1 and "/dev/zero: cannot read: not a regular file" in err and "valid" not in out
    assert time.monotonic() - started < 10  # refused, not read for ever


def test_config_of_dev_zero_is_refused_without_reading_it(state, capsys):
    code, _, err = run(capsys, "--config", "/dev/zero", "rules", "check")
    assert code == 2 and error_lines(err) == ["error: /dev/zero: cannot read: not a regular file"]


def test_a_rule_file_larger_than_the_bound_is_refused_naming_it(state, capsys):
    big = state / "huge.yaml"
    big.write_bytes(b"# padding\n" * (MAX_TEXT_FILE_BYTES // 10 + 1))
    code, _, err = run(capsys, "rules", "check", str(big))
    assert code == 1 and f"{big}: larger than {MAX_TEXT_FILE_BYTES // 2**20} MiB" in err, err
    code, _, err = run(capsys, "--config", str(big), "audit")
    assert code == 2 and error_lines(err) == [f"error: {big}: larger than {MAX_TEXT_FILE_BYTES // 2**20} MiB: "
                                              "not a config, rule or budget file"]


def test_rules_check_of_an_empty_path_is_refused_not_read_as_the_current_folder(state, capsys):
    # The current folder holds the example config, which `rules check ''` used to read as a rule file.
    shutil.copy(REPO / "gpufinops.example.yaml", state / "gpufinops.example.yaml")
    code, out, err = run(capsys, "rules", "check", "")
    assert code == 2 and "valid" not in out
    assert error_lines(err) == ["error: rules check: an empty path: name a rule file or folder"]


def test_data_paths_that_are_devices_are_refused_naming_the_flag(state, capsys):
    for argv, flag in ((["costs", "--source", "focus", "--path", "/dev/zero", "--month", "2026-11"], "--path"),
                       (["backtest", "--trace", "/dev/zero"], "--trace")):
        code, _, err = run(capsys, *argv)
        assert code == 2 and error_lines(err) == [f"error: {flag} /dev/zero: cannot read: not a regular file"], err


# --------------------------------------------------------------------------- costs --by namespace (docs/kubernetes.md)


def test_costs_by_namespace_without_month_reads_this_month_as_docs_kubernetes_says(kapi_cluster, state, capsys):
    from tests.kubestub import node_obj, pod_obj

    kube = kapi_cluster  # the real kube-apiserver, the service's token bound to the shipped ClusterRole
    kube.add("nodes", node_obj(kube.name("gpu-a"), "i-0aaa0000000000001"))
    kube.add("pods", pod_obj(kube.ns("ml"), "train-0", kube.name("gpu-a")))
    kubeconfig = kube.write_kubeconfig(state / "kubeconfig")
    cfg = state / "gpufinops.yaml"
    cfg.write_text(f"kubernetes:\n  kubeconfig: {kubeconfig}\ndatabase_url: sqlite:///{state}/db.sqlite\n")
    code, out, err = run(capsys, "--config", str(cfg), "costs", "--by", "namespace", "-o", "json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["namespace"] for r in rows] == [kube.ns("ml"), "(idle capacity)"] and rows[0]["usd_per_hour"] > 0
    # The same as naming this month; any other month is refused, as the docs say.
    month = f"{datetime.now(timezone.utc):%Y-%m}"
    code, out, _ = run(capsys, "--config", str(cfg), "costs", "--by", "namespace", "--month", month, "-o", "json")
    assert code == 0 and json.loads(out)["rows"] == rows
    code, _, err = run(capsys, "--config", str(cfg), "costs", "--by", "namespace", "--month", "2020-01")
    assert code == 2 and error_lines(err) and "--month" in error_lines(err)[0]
    doc = (REPO / "docs" / "kubernetes.md").read_text()
    assert "gpufinops costs --by namespace\n" in doc


# --------------------------------------------------------------------------- agent snooze


def test_agent_snooze_never_removes_or_replaces_a_device(state, capsys):
    """`agent snooze --clear` removes its file and a snooze replaces it: given a device (here a link to /dev/null;
    as root, /dev/null itself would have been deleted) it refuses, exit 2, and the path is untouched."""
    link = state / "null"
    link.symlink_to("/dev/null")
    for argv in (["--clear"], ["2h"]):
        code, _, err = run(capsys, "agent", "snooze", *argv, "--snooze-file", str(link))
        assert code == 2 and error_lines(err) == [f"error: --snooze-file {link}: not a regular file, not a snooze "
                                                  "file"], err
        assert link.is_symlink() and link.resolve() == Path("/dev/null")
    folder = state / "a-folder"
    folder.mkdir()
    code, _, err = run(capsys, "agent", "snooze", "2h", "--snooze-file", str(folder))
    assert code == 2 and "a folder" in err and folder.is_dir()
    code, out, _ = run(capsys, "agent", "snooze", "2h", "--snooze-file", str(state / "snooze-until"))
    assert code == 0 and "snoozed until" in out and (state / "snooze-until").is_file()


# --------------------------------------------------------------------------- found by tests/cli/test_cli_fuzz.py


@pytest.mark.parametrize("argv, flag", [
    (["audit", "--db=--"], "--db"),  # argparse (3.11) made this an empty list, and audit failed on it
    (["agent", "--interval=--"], "--interval"),
    (["size", "--mode", "inference", "--params=--"], "--params"),
    (["agent", "--autostop=--"], "--autostop"),  # an append option: [[]]
])
def test_an_option_whose_value_is_lost_is_a_usage_error(state, capsys, argv, flag):
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.splitlines()[-1].endswith(f"error: argument {flag}: expected one argument"), err


def test_report_out_dir_that_is_a_file_or_empty_is_a_usage_error(state, capsys):
    taken = state / "taken"
    taken.write_text("a file, not a folder\n")
    code, _, err = run(capsys, "report", "--out-dir", str(taken))
    assert code == 2 and error_lines(err) == [f"error: --out-dir '{taken}': cannot create the folder: File exists"]
    code, _, err = run(capsys, "report", "--out-dir", "")
    assert code == 2 and error_lines(err) == ["error: --out-dir is empty: name the folder to write into"]
    assert not list(state.glob("gpu-audit-*"))  # nothing written into the current folder


def test_agent_snooze_of_an_empty_path_is_a_usage_error(state, capsys):
    code, _, err = run(capsys, "agent", "snooze", "--clear", "--snooze-file", "")
    assert code == 2 and error_lines(err) == ["error: --snooze-file is empty: name the snooze file"]


def test_database_paths_that_are_devices_are_refused_before_sqlite_opens_them(state, capsys, monkeypatch):
    """SQLite opening a device writes its journal beside it (as root: /dev/null-journal). Here links to /dev/null
    stand for the device: the link's target is what SQLite would have used."""
    link = state / "null"
    link.symlink_to("/dev/null")
    for argv in (["costs", "--idle", "--month", "2026-11", "--db", str(link)], ["demo", "--quick", "--db", str(link)]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and error_lines(err) == [f"error: --db {link}: not a database file (not a regular file)"]
    # The agent's sample buffer (`--autostop-db`), with rules that turn autostop on; it never gets to serving.
    from gpufinops.agent import exporter

    def not_serving(*_a, **_k):
        raise OSError("test: not serving")

    monkeypatch.setattr(exporter, "start", not_serving)
    rules = state / "rules.yaml"
    rules.write_text("rules:\n  - name: idle-10pct-1h\n    threshold_pct: 10\n    window: 1h\n    action: stop\n")
    (state / "autostop.yaml").write_text("imds_url: http://127.0.0.1:9\nstop_method: command\n"
                                         "stop_command: [/bin/false]\n")
    code, _, err = run(capsys, "agent", "--address", "127.0.0.1", "--hostname", "gpu-1", "--nvidia-smi",
                       str(state / "no-nvidia-smi"), "--autostop", str(rules), "--autostop-config",
                       str(state / "autostop.yaml"), "--autostop-db", str(link), "--snooze-file",
                       str(state / "snooze-until"))
    assert code == 2 and error_lines(err) == [f"error: --autostop-db '{link}': not a regular file, not a database "
                                              "file"], err


def test_backtest_output_paths_that_cannot_be_written_are_refused_before_the_replay(state, capsys):
    trace = state / "trace.csv"
    trace.write_text("instance_id,timestamp,gpu_util\n" + "".join(
        f"i-{i},{1_700_000_000 + 300 * s},{50}\n" for i in range(2) for s in range(24)))
    folder = state / "a-folder"
    folder.mkdir()
    for flag, value, says in (("--json", "\x00", "not a file path"), ("--json", str(folder), "cannot write: a folder"),
                              ("--suggest-out", str(state / "missing" / "r.yaml"), "the folder"),
                              ("--chart", "", "not a file path")):
        code, _, err = run(capsys, "backtest", "--trace", str(trace), flag, value)
        [line] = error_lines(err)
        assert code == 2 and line.startswith(f"error: {flag} ") and says in line, err
        assert "replaying" not in err  # refused before the work
