"""The capability sections of gpufinops.yaml (billing, recommend, report) are typed settings, checked when
the file is loaded: a typo fails at start, naming the file, the line and the dotted key, not on the Monday
the weekly digest first reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufinops.backtest.engine import BacktestSettings
from gpufinops.cost.budgets import BudgetFile
from gpufinops.cli import build_parser
from gpufinops.collect.billing.settings import billing_settings
from gpufinops.config import (
    BillingSettings,
    ConfigError,
    RecommendSettings,
    ReportSettings,
    SecretRef,
    Settings,
    StrictModel,
    defaults_of,
    load_settings,
    secret_refs,
)
from gpufinops.run.jobs import scheduled_jobs
from gpufinops.model import FALSE_STOP_WITHIN_S
from gpufinops.recommend.policy import policy_from_settings
from gpufinops.report.options import report_settings


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gpufinops.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("doc,line,key,says", [
    ("recommend:\n  windw_days: 3\n", 2, "recommend.windw_days", "Extra inputs are not permitted"),
    ("recommend:\n  spot:\n    rate: 0.1\n", 3, "recommend.spot.rate", "Extra inputs are not permitted"),
    ("recommend:\n  window_days: 0\n", 2, "recommend.window_days", "greater than or equal to 1"),
    ("report:\n  top_m: 5\n", 2, "report.top_m", "Extra inputs are not permitted"),
    ("report:\n  false_stop_s: .inf\n", 2, "report.false_stop_s", ""),
    ("billing:\n  source: cur\n  budget_path: b.yaml\n", 3, "billing.budget_path", "Extra inputs are not permitted"),
    ("billing:\n  athena:\n    timout_s: 5\n", 3, "billing.athena.timout_s", "Extra inputs are not permitted"),
    ("billing:\n  source: csv\n", 2, "billing.source", "'ce', 'cur', 'focus', 'athena' or 'gcp-detailed'"),
    ("billing: 7\n", 1, "billing", ""),
])
def test_a_bad_key_in_a_capability_section_fails_at_load_naming_file_line_and_key(tmp_path, doc, line, key, says):
    p = write(tmp_path, "prometheus: {url: 'http://127.0.0.1:9090'}\n" + doc)
    msg = str(pytest.raises(ConfigError, load_settings, p).value)
    assert f"{p}:{line + 1}: key '{key}'" in msg and says in msg
    assert "Traceback" not in msg


def test_every_error_of_every_section_is_reported_at_once(tmp_path):
    p = write(tmp_path, "recommend: {windw_days: 3}\nreport: {top_n: 0}\nbilling: {bogus: 1}\n")
    lines = str(pytest.raises(ConfigError, load_settings, p).value).splitlines()
    assert [ln.split(": key ")[0] for ln in lines] == [f"{p}:3", f"{p}:1", f"{p}:2"]
    assert {ln.split("'")[1] for ln in lines} == {"recommend.windw_days", "report.top_n", "billing.bogus"}


def test_overrides_are_checked_like_the_file():
    with pytest.raises(ConfigError, match="key 'recommend.windw_days'"):
        load_settings(recommend={"windw_days": 3})


@pytest.mark.parametrize("doc", ["", "billing:\n", "billing: {}\n"])
def test_no_billing_section_is_none_and_turns_the_budget_job_off(tmp_path, doc):
    s = load_settings(write(tmp_path, doc or "{}\n"))
    assert s.billing is None
    assert "budgets" not in [job for job, _, _ in scheduled_jobs(s, None, None)]
    assert billing_settings(s) == BillingSettings(gpu_families=s.aws.gpu_families)  # the commands use CE defaults


def test_a_billing_section_turns_the_budget_job_on_and_its_paths_follow_the_config_file(tmp_path, monkeypatch):
    p = write(tmp_path, "billing:\n  source: focus\n  path: costs/focus.csv\n  price_catalog: prices.csv\n"
                        "aws: {gpu_families: [g5]}\n")
    monkeypatch.chdir("/")
    s = load_settings(p)
    assert isinstance(s.billing, BillingSettings)
    assert "budgets" in [job for job, _, _ in scheduled_jobs(s, None, None)]
    base = tmp_path.resolve()
    bs = billing_settings(s)
    assert (bs.path, bs.price_catalog, bs.gpu_families) == (str(base / "costs/focus.csv"), str(base / "prices.csv"),
                                                             ("g5",))
    s3 = load_settings(write(tmp_path, "billing: {source: cur, path: 's3://cur/data/'}\n"))
    assert s3.billing.path == "s3://cur/data/"


def test_recommend_paths_follow_the_config_file_defaults_included(tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    base = tmp_path.resolve()
    s = load_settings(write(tmp_path, "recommend: {catalog_dir: cat}\n"))
    assert (s.recommend.catalog_dir, s.recommend.price_cache_path) == (str(base / "cat"),
                                                                       str(base / "gpufinops-aws-prices.json"))


def test_the_accessors_hand_back_the_typed_sections(tmp_path):
    s = load_settings(write(tmp_path, "recommend: {window_days: 3}\nreport: {top_n: 4}\n"))
    assert policy_from_settings(s) is s.recommend and s.recommend.window_days == 3
    assert report_settings(s) is s.report and s.report.top_n == 4
    assert report_settings(None) == ReportSettings()
    defaults = Settings()
    assert (defaults.billing, defaults.recommend, defaults.report) == (None, RecommendSettings(), ReportSettings())


def test_one_strict_base_for_every_settings_and_budget_model():
    for model in (Settings, BillingSettings, RecommendSettings, ReportSettings, BudgetFile):
        assert issubclass(model, StrictModel), model
        assert model.model_config["extra"] == "forbid" and model.model_config["allow_inf_nan"] is False


def settings_models(model: type = Settings, seen: set | None = None) -> set[type]:
    """Every model of the settings tree: Settings, its sections and theirs (optional, listed and mapped ones too)."""
    import typing

    seen = set() if seen is None else seen
    seen.add(model)
    for f in model.model_fields.values():
        todo = [f.annotation]
        while todo:
            t = todo.pop()
            if isinstance(t, type) and issubclass(t, StrictModel) and t not in seen:
                settings_models(t, seen)
            todo.extend(typing.get_args(t))
    return seen


def test_every_default_set_without_its_validator_is_what_validating_it_gives():
    """A section's default is set without its validator (defaults_of, env_secret: no validator is built for a
    section the file leaves out); each is the value and the keys set that validating it gives, its checks
    passed."""
    models = settings_models()
    assert {BillingSettings, RecommendSettings, ReportSettings, SecretRef} <= models and len(models) > 25
    checked = 0
    for model in models:
        for name, f in model.model_fields.items():
            value = f.default_factory() if f.default_factory else f.default
            if isinstance(value, StrictModel):
                validated = type(value).model_validate(value.model_dump(exclude_unset=True))
                assert (value, value.model_fields_set) == (validated, validated.model_fields_set), (model, name)
                checked += 1
    assert checked >= 25
    assert defaults_of(BillingSettings)() == BillingSettings.model_validate({})


def test_no_file_is_the_defaults_as_settings_validator_gives_them(monkeypatch):
    for _, ref in secret_refs(Settings()):
        monkeypatch.delenv(ref.env, raising=False)
    plain = load_settings()
    assert (plain, plain.model_fields_set) == (Settings.model_validate({"source_path": ""}), {"source_path"})


def test_every_false_stop_threshold_defaults_to_the_one_constant():
    args = build_parser().parse_args(["backtest", "--trace", "trace.csv"])
    assert FALSE_STOP_WITHIN_S == 1800
    assert (ReportSettings().false_stop_s, BacktestSettings().break_even_s) == (FALSE_STOP_WITHIN_S,) * 2
    assert args.break_even is None  # the CLI resolves it to the same constant when the replay starts


# --------------------------------------------------------------------------- secrets: unset is off, blank is an error

@pytest.mark.parametrize("loc", [".".join(map(str, loc)) for loc, _ in secret_refs(Settings())])
def test_every_secret_set_but_blank_in_its_variable_is_a_load_error_naming_its_key(loc, monkeypatch):
    ref = dict(secret_refs(Settings()))[tuple(loc.split("."))]
    for var in {r.env for _, r in secret_refs(Settings()) if r.env}:
        monkeypatch.delenv(var, raising=False)
    assert load_settings() is not None  # unset: the feature is off, as before
    monkeypatch.setenv(ref.env, " \t")
    msg = str(pytest.raises(ConfigError, load_settings).value)
    assert msg == f"<defaults>: key '{loc}': the environment variable {ref.env} is set but blank: give the secret, " \
                  f"or unset it"


def test_every_secret_section_is_covered():
    # A new secret is checked without a new line of code; this list says which ones exist today.
    assert {".".join(map(str, loc)) for loc, _ in secret_refs(Settings())} == {
        "prometheus.bearer_token", "prometheus.basic_auth_password", "slack.token", "slack.signing_secret",
        "slack.app_token", "email.password", "api.bearer_token"}


@pytest.mark.parametrize("content", ["\n", "", "  \r\n\t"])
def test_a_secret_file_holding_only_blanks_is_a_load_error_naming_file_line_and_key(tmp_path, content):
    secret = tmp_path / "slack-token"
    secret.write_text(content)
    p = write(tmp_path, f"slack:\n  default_channel: '#x'\n  token: {{file: {secret}}}\n")
    msg = str(pytest.raises(ConfigError, load_settings, p).value)
    assert msg == f"{p}:3: key 'slack.token': the file {secret} is blank: give the secret, or remove file:"
    secret.write_text("xoxb-real\n")
    assert load_settings(p).slack.token.resolve() == "xoxb-real"
    (tmp_path / "gone").mkdir()
    p = write(tmp_path, f"email: {{password: {{file: {tmp_path / 'gone' / 'missing'}}}}}\n")
    assert load_settings(p).email.password.resolve() is None  # not mounted: not configured, as before


def test_a_blank_slack_token_in_the_agents_autostop_settings_is_refused_too(tmp_path, monkeypatch):
    from gpufinops.agent.autostop.settings import load_autostop_settings

    monkeypatch.setenv("GPUFINOPS_TEST_AGENT_SLACK", "  ")
    p = write(tmp_path, "slack:\n  token: {env: GPUFINOPS_TEST_AGENT_SLACK}\n")
    msg = str(pytest.raises(ConfigError, load_autostop_settings, p).value)
    assert f"{p}:2: key 'slack.token': the environment variable GPUFINOPS_TEST_AGENT_SLACK is set but blank" in msg


@pytest.mark.parametrize("data,says", [(b"\xff\xfetoken", "cannot be read: 'utf-8' codec"),
                                       (b"x" * (64 * 1024 + 1), "cannot be read: longer than 64 KiB")])
def test_a_secret_file_that_is_no_text_or_far_too_long_is_a_load_error_and_resolves_to_nothing_usable(
        tmp_path, data, says):
    secret = tmp_path / "token"
    secret.write_bytes(data)
    p = write(tmp_path, f"api: {{bearer_token: {{file: {secret}}}}}\n")
    assert f"{p}:1: key 'api.bearer_token': the file {secret} {says}" in str(pytest.raises(ConfigError, load_settings,
                                                                                           p).value)
    assert SecretRef(file=str(secret)).resolve() == ""  # blank: refused by every bearer check (httpd.authorize)


def test_every_name_of_the_config_package_is_its_modules_own_and_unknown_names_fail():
    """`from gpufinops.config import X` is the one way in, and each name is handed on from its module when first
    asked for (config/__init__.py `_HOME`): every name of `__all__` resolves, to the very object its module
    defines (no copy), and a name that is not there is an AttributeError, not None."""
    import importlib

    import gpufinops.config as config

    for name in config.__all__:
        home = importlib.import_module(f"gpufinops.config.{config._MODULE_OF[name]}")
        assert getattr(config, name) is getattr(home, name), name
    with pytest.raises(AttributeError):
        config.NoSuchSetting  # noqa: B018
