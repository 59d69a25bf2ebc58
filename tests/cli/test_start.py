"""What a command loads to start (issue 41, item 1): each command imports its own module of gpufinops.cli and the
libraries its work needs, nothing of the other commands; the parser it builds answers as the whole one does.
Structure, not timing (the timings are bench/bench_cli_start.py's): each process is a real `gpufinops` run in
a subprocess, and what it imported is read from its sys.modules."""

import contextlib
import io
import json
import math
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from gpufinops.cli.app import CAPABILITIES, COMMAND_MODULES, build_parser, modules_for

REPO = Path(__file__).resolve().parents[2]
CLI_MODULES = {f"gpufinops.cli.{m}" for m in CAPABILITIES}
# Libraries no command below needs to start: data frames, cloud SDKs, the database, templates, DuckDB.
HEAVY = {"pandas", "numpy", "pyarrow", "boto3", "botocore", "kubernetes", "sqlalchemy", "jinja2", "duckdb",
         "requests", "apscheduler"}


def imported_by(argv: list[str], env: dict | None = None) -> tuple[int, set[str], str]:
    """`gpufinops ARGV` in a fresh interpreter: its exit code, the modules it had imported at the end, its stdout."""
    code = ("import contextlib, io, json, sys\nfrom gpufinops.cli import main\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    try:\n"
            f"        rc = main({argv!r})\n"
            "    except SystemExit as exc:\n"
            "        rc = exc.code\n"
            "print(json.dumps([rc, sorted(sys.modules), out.getvalue()]))")
    run_env = {k: v for k, v in os.environ.items() if k != "GPUFINOPS_CONFIG"} | (env or {})
    run_env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=run_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rc, modules, out = json.loads(proc.stdout.strip().splitlines()[-1])
    return rc, set(modules), out


def test_rules_check_loads_its_own_command_only():
    rc, modules, out = imported_by(["rules", "check"])
    assert rc == 0 and "rule(s) valid" in out
    assert not HEAVY & modules, sorted(HEAVY & modules)
    assert modules & CLI_MODULES == {"gpufinops.cli.core"}
    assert "gpufinops.agent.autostop.cli" not in modules  # the agent's flags: `agent`'s parser only
    # What a rule must select is read from places.registry, which needs k8s.tags' names, not k8s.model's types.
    assert "gpufinops.k8s.tags" in modules and "gpufinops.k8s.model" not in modules


# The settings' models: what a command that reads no config file has no need of (gpufinops.config's _HOME).
SETTINGS_MODULES = {"gpufinops.config.settings", "gpufinops.config.sections", "gpufinops.config.capabilities",
                    "gpufinops.config.secrets"}


def test_rules_check_without_a_config_loads_no_settings():
    rc, modules, out = imported_by(["rules", "check"])
    assert rc == 0 and out.endswith(f"2 rule(s) valid (the shipped rules: {REPO / 'rules'})\n")
    assert not SETTINGS_MODULES & modules, sorted(SETTINGS_MODULES & modules)
    assert {"gpufinops.config.loading", "gpufinops.config.values"} <= modules  # what the rule files need
    # Nor model's records: a rule's types come from its leaf, rule_types (model hands them on).
    assert "gpufinops.model" not in modules and "gpufinops.rule_types" in modules


@pytest.mark.parametrize("given", ["--config", "$GPUFINOPS_CONFIG"])
def test_rules_check_with_a_config_validates_the_whole_config(tmp_path, given):
    rules = tmp_path / "mine"
    rules.mkdir()
    (rules / "r.yaml").write_text("rules:\n  - name: mine\n    threshold_pct: 5\n    window: 1h\n")
    config = tmp_path / "g.yaml"
    config.write_text("rules_paths: [mine]\n")
    argv, env = (["--config", str(config)], {}) if given == "--config" else ([], {"GPUFINOPS_CONFIG": str(config)})
    rc, modules, out = imported_by([*argv, "rules", "check"], env)
    assert rc == 0 and out.endswith(f"1 rule(s) valid (rules_paths of {config}: {rules.resolve()})\n")
    assert SETTINGS_MODULES <= modules
    # A key of the config that is not a setting: refused with its file, line and key, the rules never read.
    config.write_text("rules_paths: [mine]\nslack:\n  tokn: x\n")
    proc = subprocess.run([sys.executable, "-m", "gpufinops.cli", *argv, "rules", "check"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: {config}:3: key 'slack.tokn': "), proc.stderr


def test_rules_check_without_a_config_still_refuses_a_blank_default_secret(tmp_path):
    """The defaults name their secrets' environment variables: one set but blank is refused, config or not
    (cli.common.defaults_hold: with a variable blank, the settings are loaded to say whether it is theirs)."""
    env = {k: v for k, v in os.environ.items() if k != "GPUFINOPS_CONFIG"} | {"PYTHONPATH": str(REPO)}
    for blank, refused in (("SLACK_BOT_TOKEN", True), ("NOT_A_SECRET_OF_OURS", False)):
        proc = subprocess.run([sys.executable, "-m", "gpufinops.cli", "rules", "check"], cwd=tmp_path,
                              env={**env, blank: " "}, capture_output=True, text=True, timeout=120)
        if refused:
            assert proc.returncode == 2 and proc.stderr == (
                "error: <defaults>: key 'slack.token': the environment variable SLACK_BOT_TOKEN is set but blank: "
                "give the secret, or unset it\n")
        else:
            assert proc.returncode == 0 and "2 rule(s) valid (the shipped rules: " in proc.stdout, proc.stderr


def test_model_hands_on_its_leaves_names_as_they_are():
    """model is the one place callers import from: every name its leaves rule_types and subject_ids define (and
    words' format_duration) is the same object there."""
    import inspect

    from gpufinops import model, rule_types, subject_ids, words

    for leaf in (rule_types, subject_ids):
        defined = [n for n, v in vars(leaf).items() if not n.startswith("_") and not inspect.ismodule(v)
                   and getattr(v, "__module__", leaf.__name__) == leaf.__name__]
        assert len(defined) >= 7 and all(getattr(model, n) is getattr(leaf, n) for n in defined), defined
    assert model.format_duration is words.format_duration


def test_the_defaults_are_what_rules_check_reads_without_them():
    """What cli.common.defaults_hold takes for granted: the defaults' secrets are environment variables only (so
    a blank one is a blank variable), and their rules_paths is the shipped rules folder (core.cmd_rules_check)."""
    from gpufinops.config import DEFAULT_RULES_DIR, load_settings, secret_refs

    defaults = load_settings()
    refs = secret_refs(defaults)
    assert refs and all(ref.env and ref.file is None for _, ref in refs)
    assert defaults.rules_paths == (str(DEFAULT_RULES_DIR),) and defaults.source_path == ""


@pytest.mark.parametrize("argv, own", [
    (["--version"], set()),
    (["evaluate", "--help"], {"gpufinops.cli.core"}),
    (["costs", "--help"], {"gpufinops.cli.billing"}),
    (["report", "--help"], {"gpufinops.cli.report"}),
])
def test_version_and_help_load_no_settings_and_no_other_command(argv, own):
    rc, modules, out = imported_by(argv)
    assert rc == 0 and out.strip()
    assert not HEAVY & modules, sorted(HEAVY & modules)
    assert modules & CLI_MODULES == own
    assert "pydantic" not in modules and "yaml" not in modules and "gpufinops.config" not in modules


def test_a_file_total_loads_duckdb_and_nothing_of_the_other_commands(tmp_path):
    from gpufinops.collect.billing.synth import generate_cur

    path = generate_cur(tmp_path / "cur.parquet", 2_000, n_resources=20)
    rc, modules, out = imported_by(["costs", "--month", "2024-09", "--source", "cur", "--path", str(path),
                                    "--by", "instance", "-o", "json"])
    assert rc == 0 and json.loads(out)
    assert "duckdb" in modules and not (HEAVY - {"duckdb"}) & modules, sorted((HEAVY - {"duckdb"}) & modules)
    # cli.k8s holds `costs --by namespace|workload|nodepool` (K8S_GROUPINGS, read to choose the path), not its model.
    assert modules & CLI_MODULES == {"gpufinops.cli.billing", "gpufinops.cli.k8s"}
    # No config file: no YAML read, so none imported; the cluster's cost model is `--by namespace`'s only.
    assert "yaml" not in modules and "gpufinops.k8s.model" not in modules
    # Nor any validator built: the defaults are valid as written (pydantic's plugin lookup loads with the first);
    # nor model's types: the settings take the false-stop figure from break_even, a leaf.
    assert "pydantic.plugin._loader" not in modules and "gpufinops.model" not in modules


SETTINGS_BUILT = """
import json, sys
import gpufinops.config as c

def built():  # the settings models whose own validator was built
    return sorted(n for n in dir(c) if getattr(getattr(c, n), "__pydantic_complete__", False))

def sections_in(schema, found=None):  # the models a validator's core schema validates
    found = set() if found is None else found
    if isinstance(schema, dict):
        if schema.get("type") == "model":
            found.add(schema["cls"].__name__)
        for v in schema.values():
            sections_in(v, found)
    elif isinstance(schema, (list, tuple)):
        for v in schema:
            sections_in(v, found)
    return found

out = {"at import": built()}
defaults = c.load_settings()
out["no file"] = built()
out["plugin lookup"] = "pydantic.plugin._loader" in sys.modules
given = c.load_settings(sys.argv[1])
out["a file"] = built()
out["its validator"] = sorted(sections_in(c.settings_validator(frozenset({"prometheus", "source_path"})).__pydantic_core_schema__))
out["read"] = [given.prometheus.timeout_s, given.aws == defaults.aws]
out["defaults as validated"] = defaults == c.Settings.model_validate({"source_path": ""})  # builds them all
print(json.dumps(out))
"""


def test_settings_build_only_what_the_file_holds(tmp_path):
    """Importing the settings builds no validator (defer_build); no config file builds none at all (the defaults
    are valid as written, so pydantic's plugin lookup is never loaded), and a file builds the validator of what it
    holds: its `prometheus:` section, not the others."""
    config = tmp_path / "gpufinops.yaml"
    config.write_text("prometheus:\n  timeout_s: 5\n")
    proc = subprocess.run([sys.executable, "-c", SETTINGS_BUILT, str(config)], cwd=REPO, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, text=True, check=True, timeout=60)
    assert json.loads(proc.stdout) == {
        "at import": [], "no file": [], "plugin lookup": False, "defaults as validated": True, "a file": [],
        "its validator": ["PrometheusSettings", "SecretRef", "Settings"], "read": [5.0, True]}


# --------------------------------------------------------------------------- the parser of one command


def registered_by_module() -> dict[str, str]:
    """Each command of the whole parser and the module whose register() adds it."""
    import argparse
    import importlib

    found = {}
    for name in CAPABILITIES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"gpufinops.cli.{name}").register(sub)
        found.update({command: name for command in sub.choices})
    return found


def test_the_command_table_is_what_the_modules_register():
    assert COMMAND_MODULES == registered_by_module()
    assert list(dict.fromkeys(COMMAND_MODULES.values())) == list(CAPABILITIES)


@pytest.mark.parametrize("argv, modules", [
    ([], CAPABILITIES),
    (["costs", "--by", "team"], ("billing",)),
    (["--config", "rules", "costs"], ("billing",)),  # "rules" is the config file's name here
    (["-cx.yaml", "rules", "check"], ("core",)),
    (["--conf=x.yaml", "evaluate"], ("core",)),  # an abbreviated option, as argparse reads it
    (["--log-level", "DEBUG", "agent"], ("agent",)),
    (["costs", "-h"], ("billing",)),
    (["-h", "costs"], CAPABILITIES),  # the whole help
    (["--version"], ()),
    (["--version", "size"], ("recommend",)),
    (["--config"], CAPABILITIES),  # a command line argparse refuses: the whole parser says why
    (["no-such-command"], CAPABILITIES),
    (["--", "costs"], CAPABILITIES),
])
def test_modules_for_a_command_line(argv, modules):
    assert modules_for(argv) == modules


def test_shell_completion_builds_the_whole_parser(monkeypatch):
    monkeypatch.setenv("_ARGCOMPLETE", "1")
    assert modules_for(["costs"]) == CAPABILITIES


def parsed_or_exit(parser, argv: list[str]):
    """What parse_args gives (a handler by its name: each parser makes its own lambdas), or the exit code, stdout
    and stderr it ends with."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            return {k: getattr(v, "__qualname__", v) for k, v in vars(parser.parse_args(argv)).items()}
        except SystemExit as exc:
            return exc.code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv", [
    ["costs", "--month", "2024-09", "--source", "cur", "--path", "x.parquet", "--by", "instance", "-o", "json"],
    ["--config", "g.yaml", "--log-level", "DEBUG", "rules", "check", "a.yaml"],
    ["costs", "--help"], ["evaluate", "--help"], ["report", "--help"], ["agent", "--help"], ["k8s", "restore", "-h"],
    ["costs", "--by", "nonsense"], ["costs", "--bogus"], ["--bogus", "costs"], ["audit", "--kind", "nonsense"],
    ["budgets"], ["size", "--params", "7B", "--mode", "inference"], ["backtest", "--trace", "t.csv"],
    ["--version", "costs"],
])
def test_one_commands_parser_answers_as_the_whole_parser(argv):
    assert parsed_or_exit(build_parser(modules_for(argv)), argv) == parsed_or_exit(build_parser(), argv)


@pytest.mark.parametrize("argv", [["rules"], []])
def test_a_command_line_without_an_action_prints_the_whole_help(argv, capsys):
    from gpufinops.cli import main

    assert main(argv) == 2
    assert capsys.readouterr().out == build_parser().format_help()


# --------------------------------------------------------------------------- costs -o json without json's Python encoder


def test_json_records_is_json_dumps_text():
    from gpufinops.collect.billing.totals import json_records

    class Price(float):
        pass

    names = ["instance", "currency", "cost", "usage_hours", "cost_per_hour"]
    rows = [("i-1", "USD", 1.5, 2, math.nan), ('\u00e9"x\\\n\u202e', "EUR", math.inf, -math.inf, None),
            ("a", "b", True, False, date(2024, 1, 1)), ("", "", 0.1 + 0.2, 1e300, -0.0),
            ("x", "y", Price(1.5), 10**30, -1), ("x", "y", Price("inf"), Price("nan"), 5e-324)]
    for case in ([], rows[:1], rows):
        assert json_records(names, case) == json.dumps([dict(zip(names, r)) for r in case], default=str, indent=2)
