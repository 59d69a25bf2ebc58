"""Bad input never gives a traceback: every loader returns a valid object or raises its one error type
(ConfigError; BillingDataError for billing files) with a message that names the file.

Property-based (hypothesis, derandomized, no example database, so CI runs the same examples every time)
over generated YAML and CSV documents: known and random keys, numbers that are huge, negative, inf or
nan, and bytes that are not UTF-8. Then one targeted test per case a tester found.
"""

from __future__ import annotations

import csv
import io
import math
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufinops.backtest.traces import MAX_GRID_CELLS, load_trace
from gpufinops.cost.budgets import load_budgets
from gpufinops.cli import main
from gpufinops.collect.billing.focus import REQUIRED as FOCUS_REQUIRED
from gpufinops.collect.billing.focus import read_focus
from gpufinops.collect.billing.schema import BillingDataError
from gpufinops.collect.billing.settings import BillingSettings, billing_settings
from gpufinops.config import AwsSettings, ConfigError, Settings, load_settings
from gpufinops.recommend.policy import RecommendPolicy, policy_from_settings
from gpufinops.report.options import ReportSettings, report_settings
from gpufinops.rules import load_rule_file, load_rules, parse_duration

# Small and repeatable: the whole file runs in seconds on a shared CI core. A longer hunt, by hand:
# GPUFINOPS_BAD_INPUT_EXAMPLES=2000 python -m pytest tests/test_bad_input.py
FAST = settings(max_examples=int(os.environ.get("GPUFINOPS_BAD_INPUT_EXAMPLES", "60")), deadline=None,
                derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# --------------------------------------------------------------------------- generated documents

NASTY_NUMBERS = st.sampled_from([
    0, -1, 1, 59, 60, 65535, 65536, -(10**18), 10**18, 2**63, 10**30, 9.2e18, -1e18, 1e62, 1e308, -0.0, 0.5,
    float("inf"), float("-inf"), float("nan"), 1e-300,
])
NUMBERS = st.one_of(NASTY_NUMBERS, st.integers(), st.floats(allow_nan=True, allow_infinity=True))
STRINGS = st.one_of(st.sampled_from(["", "10m", "1h30m", "0s", "-5m", "99999999999999999999d", "soon", ".inf",
                                     "-1e18", "USD", "stop", "2024-13-45", "s3://x/", "http://127.0.0.1:1",
                                     "a\x00b.db", "sqlite:///x\x00.db"]),
                    st.text(max_size=12))
SCALARS = st.one_of(NUMBERS, STRINGS, st.booleans(), st.none())
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=6), SCALARS, max_size=3))


def fields(model) -> list[str]:
    return list(model.model_fields)


def mapping(keys: list[str], values=VALUES, max_size: int = 6):
    """A mapping whose keys are mostly the model's own (so values reach validation) and sometimes random."""
    key = st.one_of(st.sampled_from(keys), st.text(max_size=8)) if keys else st.text(max_size=8)
    return st.dictionaries(key, values, max_size=max_size)


def section(model):
    nested = {}
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            nested[name] = mapping(fields(ann))
    plain = mapping(fields(model))
    if not nested:
        return plain
    return st.builds(lambda a, b: {**a, **b}, plain, st.fixed_dictionaries({}, optional=nested))


CONFIG_DOC = st.fixed_dictionaries({}, optional={
    **{name: section(f.annotation) for name, f in Settings.model_fields.items()
       if isinstance(f.annotation, type) and hasattr(f.annotation, "model_fields")},
    "billing": section(BillingSettings),
    "recommend": section(RecommendPolicy),
    "report": section(ReportSettings),
    "database_url": STRINGS,
    "rules_paths": st.lists(STRINGS, max_size=2),
}).flatmap(lambda d: mapping([], max_size=2).map(lambda extra: {**extra, **d}))

RULE = st.builds(lambda base, noise: {**base, **noise},
                 st.fixed_dictionaries({"name": st.sampled_from(["r1", "r-2", "bad name", ""]),
                                        "threshold_pct": NUMBERS, "window": st.one_of(NUMBERS, STRINGS)}),
                 mapping(["warning_lead", "window", "min_coverage", "action", "aggregation", "max_memory_mib",
                          "underutilized_below_pct", "select", "confirm_terminate", "learned"], max_size=4))
RULES_DOC = st.one_of(st.fixed_dictionaries({"rules": st.lists(RULE, max_size=3)}), VALUES)

BUDGET = st.builds(lambda base, noise: {**base, **noise},
                   st.fixed_dictionaries({"name": st.sampled_from(["b1", "team-ml", "x y"]), "amount": NUMBERS}),
                   mapping(["scope", "currency", "thresholds", "kinds", "escalate_idle_to_stop_at", "channel"],
                           values=st.one_of(VALUES, st.lists(NUMBERS, max_size=4)), max_size=3))
BUDGETS_DOC = st.one_of(st.fixed_dictionaries({"budgets": st.lists(BUDGET, max_size=3)}), VALUES)


@st.composite
def corrupted(draw, text: str) -> bytes:
    """The document's bytes, sometimes with a byte that is not UTF-8 or a control character inserted."""
    data = text.encode()
    kind = draw(st.sampled_from(["clean", "clean", "byte", "random"]))
    if kind == "byte":
        at = draw(st.integers(0, len(data)))
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\x80", b"\x00", b"\x07", b"\xed\xa0\x80"]))
        data = data[:at] + bad + data[at:]
    elif kind == "random":
        data = draw(st.binary(max_size=80))
    return data


def yaml_bytes(doc_strategy):
    return doc_strategy.map(lambda d: yaml.safe_dump(d, allow_unicode=True)).flatmap(corrupted)


def assert_names_file(exc: Exception, path: Path) -> None:
    msg = str(exc)
    assert msg, "an error must say something"
    for line in msg.splitlines():
        assert str(path) in line, f"an error line does not name the file: {line!r}"
    assert "Traceback" not in msg


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bad-input")


# --------------------------------------------------------------------------- properties: YAML loaders


@FAST
@given(data=yaml_bytes(CONFIG_DOC))
def test_config_and_its_sections_load_or_raise_config_error_naming_the_file(folder, data):
    path = folder / "gpufinops.yaml"
    path.write_bytes(data)
    try:
        s = load_settings(path)
        billing_settings(s)
        policy_from_settings(s)
        report_settings(s)
    except ConfigError as exc:
        assert_names_file(exc, path)
        return
    assert 1 <= s.service.port <= 65535 and 0 < s.prometheus.timeout_s <= 600
    assert 1 <= s.prometheus.scrape_interval_s <= 3600


@FAST
@given(data=yaml_bytes(RULES_DOC))
def test_rule_files_load_or_raise_config_error_naming_the_file(folder, data):
    path = folder / "rules.yaml"
    path.write_bytes(data)
    try:
        rules = load_rule_file(path)
    except ConfigError as exc:
        assert_names_file(exc, path)
        return
    for r in rules:
        assert 1 <= r.window_s <= 7 * 86400 and 60 <= r.warning_lead_s <= 7 * 86400
        assert 0 < r.threshold_pct <= 100 and math.isfinite(r.min_coverage)


@FAST
@given(data=yaml_bytes(BUDGETS_DOC))
def test_budget_files_load_or_raise_config_error_naming_the_file(folder, data):
    path = folder / "budgets.yaml"
    path.write_bytes(data)
    try:
        budgets = load_budgets(path)
    except ConfigError as exc:
        assert_names_file(exc, path)
        return
    assert all(0 < b.amount <= 1e12 for b in budgets)


# --------------------------------------------------------------------------- properties: CSV loaders

CELL = st.one_of(NUMBERS.map(repr), STRINGS, st.sampled_from(["", "NULL", "nan", "inf", "1e400"]))
TIMESTAMP = st.one_of(
    st.integers(1_600_000_000, 1_600_100_000).map(str),  # plausible epoch seconds
    st.integers(1_600_000_000_000, 1_700_000_000_000).map(str),  # milliseconds
    st.sampled_from(["", "2026-01-01T00:00:00Z", "2999-01-01", "1000-01-01", "-1e18", "1e62", "inf", "nan",
                     "9.2e18", "0", "-5", "yesterday", "2024-02-30"]),
    NUMBERS.map(repr),
)


def csv_text(header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(header)
    w.writerows(rows)
    return out.getvalue()


@st.composite
def trace_csv(draw) -> bytes:
    header = draw(st.sampled_from([["instance_id", "timestamp", "util"], ["instance_id", "gpu", "timestamp", "util",
                                                                           "memory_mib"], ["value", "timestamp_anon",
                                                                                           "container_ip"]]))
    # Most rows share one plausible timestamp shape so some examples load; the rest are nasty.
    good = st.integers(0, 20).map(lambda i: str(1_600_000_000 + 60 * i))
    cell = {"instance_id": st.sampled_from(["i-1", "i-2", "", " "]), "container_ip": st.sampled_from(["a", "b", ""]),
            "gpu": st.sampled_from(["0", "1", ""]), "timestamp": st.one_of(good, good, TIMESTAMP),
            "timestamp_anon": st.one_of(good, TIMESTAMP), "util": st.one_of(CELL, st.sampled_from(["0", "5", "90"])),
            "value": CELL, "memory_mib": CELL}
    rows = draw(st.lists(st.tuples(*[cell[h] for h in header]).map(list), max_size=6))
    return draw(corrupted(csv_text(header, rows)))


@FAST
@given(data=trace_csv())
def test_trace_csv_loads_or_raises_config_error_naming_the_file_without_a_huge_grid(folder, data):
    path = folder / "trace.csv"
    path.write_bytes(data)
    try:
        trace = load_trace(path)
    except ConfigError as exc:
        assert_names_file(exc, path)
        return
    assert trace.util.size <= MAX_GRID_CELLS and trace.n_steps >= 1


SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)
BS = BillingSettings(gpu_families=AwsSettings().gpu_families)


@st.composite
def focus_csv(draw) -> bytes:
    header = [*FOCUS_REQUIRED, "ServiceProviderName", "BilledCost", "Tags"]
    header = draw(st.permutations(header).flatmap(lambda h: st.integers(len(h) - 2, len(h)).map(lambda n: h[:n])))
    cell = {"ChargePeriodStart": st.one_of(st.just("2024-09-02 00:00:00"), TIMESTAMP),
            "BillingCurrency": st.sampled_from(["USD", "EUR", ""]), "ChargeCategory": st.sampled_from(["Usage", "Tax"]),
            "ConsumedUnit": st.sampled_from(["Hours", "GB"]), "ServiceProviderName": st.sampled_from(["AWS", "Microsoft", ""]),
            "ChargeDescription": st.sampled_from(["g5.4xlarge Instance Hour", "Standard_NC24ads_A100_v4", "x"]),
            "Tags": st.sampled_from(['{"team": "ml"}', "{", "[1]", "", '{"team": {"a": 1}}'])}
    rows = draw(st.lists(st.tuples(*[cell.get(h, CELL) for h in header]).map(list), max_size=5))
    return draw(corrupted(csv_text(header, rows)))


@FAST
@given(data=focus_csv())
def test_focus_csv_loads_or_raises_billing_data_error_naming_the_file(folder, data):
    path = folder / "focus.csv"
    path.write_bytes(data)
    try:
        res = read_focus(str(path), SEP, OCT, BS)
    except BillingDataError as exc:
        assert_names_file(exc, path)
        return
    t = res.table
    assert np.isfinite(t["cost"]).all() and np.isfinite(t["usage_hours"]).all()
    assert (t["cost"] >= 0).all() and (t["cost"] <= BS.max_line_cost).all()


@FAST
@given(value=st.one_of(SCALARS, st.lists(SCALARS, max_size=2)))
def test_parse_duration_returns_bounded_seconds_or_value_error(value):
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        assert str(exc)
        return
    assert isinstance(seconds, int) and 1 <= seconds <= 10 * 366 * 86400


# --------------------------------------------------------------------------- the cases the tester found


def write(folder: Path, name: str, data: str | bytes) -> Path:
    p = folder / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


RULE_TEXT = "rules:\n  - name: x\n    threshold_pct: 40\n    window: {window}\n    warning_lead: {lead}\n"


def test_non_utf8_byte_in_a_rule_file_is_named_by_rules_check_without_a_traceback(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    bad = write(rules, "x.yaml", b"rules:\n  - name: x\n    threshold_pct: 40\n    window: 10m \xff\n")
    proc = subprocess.run([sys.executable, "-m", "gpufinops.cli", "rules", "check", str(rules)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert f"{bad}:4: not UTF-8 text (byte 0xff at offset 57)" in proc.stderr


@pytest.mark.parametrize("name", ["gpufinops.yaml", "budgets.yaml"])
def test_non_utf8_byte_in_config_or_budgets_is_a_config_error(tmp_path, name):
    p = write(tmp_path, name, b"budgets:\n  - name: b\n    amount: 10\xfe\n")
    loader = load_settings if name == "gpufinops.yaml" else load_budgets
    with pytest.raises(ConfigError, match=rf"{name}:3: not UTF-8 text \(byte 0xfe at offset 35\)"):
        loader(p)


def test_cli_turns_a_bad_config_into_one_error_line_per_key_and_exit_2(tmp_path, capsys):
    cfg = write(tmp_path, "gpufinops.yaml", "service:\n  port: -1.0e+18\nprometheus:\n  timeout_s: .inf\n"
                                            "  scrape_interval_s: -1\n")
    assert main(["-c", str(cfg), "rules", "check"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": key ")[1].split("'")[1] for line in err] == [
        "prometheus.timeout_s", "prometheus.scrape_interval_s", "service.port"]
    assert all(line.startswith(f"error: {cfg}:") for line in err)


@pytest.mark.parametrize("key,value,expected", [
    ("window", "1.0e+62", "rules.0.window"),
    ("window", ".inf", "rules.0.window"),
    ("window", "8d", "rules.0.window"),
    ("lead", "9.2e+18", "rules.0.warning_lead"),
    ("lead", "true", "rules.0.warning_lead"),
    ("lead", "-60", "rules.0.warning_lead"),
    ("lead", "30s", "rules.0.warning_lead"),
])
def test_absurd_durations_name_the_rule_key(tmp_path, key, value, expected):
    text = RULE_TEXT.format(window=value if key == "window" else "10m", lead=value if key == "lead" else "15m")
    p = write(tmp_path, "r.yaml", text)
    msg = str(pytest.raises(ConfigError, load_rules, [p]).value)
    assert f"key '{expected}'" in msg and f"{p}:" in msg


def test_window_and_lead_at_their_bounds_are_accepted(tmp_path):
    (r,) = load_rules([write(tmp_path, "r.yaml", RULE_TEXT.format(window="7d", lead="1m"))])
    assert (r.window_s, r.warning_lead_s) == (7 * 86400, 60)


@pytest.mark.parametrize("doc,key", [
    ("prometheus: {timeout_s: 0}", "prometheus.timeout_s"),
    ("prometheus: {timeout_s: .inf}", "prometheus.timeout_s"),
    ("prometheus: {timeout_s: .nan}", "prometheus.timeout_s"),
    ("prometheus: {scrape_interval_s: -1}", "prometheus.scrape_interval_s"),
    ("service: {port: -1.0e+18}", "service.port"),
    ("service: {port: 65536}", "service.port"),
    ("act: {max_stops_fraction: 1.5}", "act.max_stops_fraction"),
    ("slack: {max_retries: 1000000}", "slack.max_retries"),
    ("schedule: {evaluate_every_s: 9.2e+18}", "schedule.evaluate_every_s"),
    ("aws: {regions: []}", "aws.regions"),
])
def test_nonsense_settings_name_their_key(tmp_path, doc, key):
    p = write(tmp_path, "gpufinops.yaml", doc + "\n")
    msg = str(pytest.raises(ConfigError, load_settings, p).value)
    assert f"{p}:1: key '{key}'" in msg


def test_nul_character_in_a_path_names_its_key(tmp_path):
    p = write(tmp_path, "gpufinops.yaml", 'slack:\n  outbox_path: "out\\0.jsonl"\nrecommend: {catalog_dir: "c\\0"}\n')
    msg = str(pytest.raises(ConfigError, load_settings, p).value)
    assert msg.splitlines() == [f"{p}:2: key 'slack.outbox_path': holds a NUL character",
                                f"{p}:3: key 'recommend.catalog_dir': holds a NUL character"]


def test_port_zero_is_refused_in_the_file_and_serve_port_0_still_binds_any_free_port(tmp_path):
    # In a file, 0 is a random port no scrape config can name; `serve --port 0` (tests) sets it after the load.
    p = write(tmp_path, "gpufinops.yaml", "service: {port: 0}\n")
    assert f"{p}:1: key 'service.port'" in str(pytest.raises(ConfigError, load_settings, p).value)


@pytest.mark.parametrize("doc,line,key,says", [
    ("aws:\n  regions: [us-east-1, \"\\u202e\\u202e\"]", 2, "aws.regions.1", "holds a bidirectional control character"),
    ("aws: {regions: [us-east-1, Frankfurt]}", 1, "aws.regions.1", "not an AWS region name"),
    ("billing: {athena: {region: us_east_1}}", 1, "billing.athena.region", "not an AWS region name"),
    ("email:\n  retry_backoff_s: 600\n  retry_max_backoff_s: 60", 3, "email.retry_max_backoff_s",
     "below retry_backoff_s (600)"),
    ("slack: {retry_backoff_s: 600, retry_max_backoff_s: 60}", 1, "slack.retry_max_backoff_s", "below retry_backoff_s"),
    ("email: {message_id_domain: \"gpufinops.invalid\\r\\nBcc: x@y.z\"}", 1, "email.message_id_domain",
     "holds a control character (U+000D)"),
    ("email: {message_id_domain: ''}", 1, "email.message_id_domain", "not a domain name"),
    ("email: {message_id_domain: 'a b.example'}", 1, "email.message_id_domain", "not a domain name"),
    ("prometheus: {url: 'prometheus:9090'}", 1, "prometheus.url", "not an http:// or https:// URL"),
    ("service: {host: ''}", 1, "service.host", "at least 1 character"),
    ("slack: {default_channel: \"#gpu\\tfinops\"}", 1, "slack.default_channel", "holds a control character (U+0009)"),
])
def test_values_that_mean_nothing_are_refused_naming_file_line_and_key(tmp_path, doc, line, key, says):
    p = write(tmp_path, "gpufinops.yaml", doc + "\n")
    msg = str(pytest.raises(ConfigError, load_settings, p).value)
    assert f"{p}:{line}: key '{key}'" in msg and says in msg, msg


@pytest.mark.parametrize("section,doc,key", [
    ("billing", "billing: {max_line_cost: .inf}", "billing.max_line_cost"),
    ("billing", "billing: {athena: {timeout_s: 0}}", "billing.athena.timeout_s"),
    ("recommend", "recommend: {hours_per_month: 9.2e+18}", "recommend.hours_per_month"),
    ("recommend", "recommend: {spot: {interruption_rate_per_hour: .nan}}", "recommend.spot.interruption_rate_per_hour"),
    ("report", "report: {top_n: 1.0e+12}", "report.top_n"),
])
def test_nonsense_in_capability_sections_names_the_key(tmp_path, section, doc, key):
    p = write(tmp_path, "gpufinops.yaml", doc + "\n")
    msg = str(pytest.raises(ConfigError, load_settings, p).value)  # the sections are checked at load
    assert f"{p}:1: key '{key}'" in msg


@pytest.mark.parametrize("amount", ["9.2e+18", ".inf", ".nan", "-1", "0"])
def test_absurd_budget_amounts_name_the_key(tmp_path, amount):
    p = write(tmp_path, "budgets.yaml", f"budgets:\n  - name: b\n    amount: {amount}\n")
    msg = str(pytest.raises(ConfigError, load_budgets, p).value)
    assert f"{p}:3: key 'budgets.0.amount'" in msg


def test_trace_with_an_empty_id_cell_names_row_and_column(tmp_path):
    p = write(tmp_path, "t.csv", "instance_id,timestamp,util\ni-1,1700000000,5\n,1700000060,5\n")
    with pytest.raises(ConfigError, match=r"t\.csv: row 3: column 'instance_id': empty id"):
        load_trace(p)


def test_trace_in_milliseconds_is_refused_before_any_allocation(tmp_path):
    p = write(tmp_path, "t.csv", "instance_id,timestamp,util\ni-1,1700000000000,5\ni-1,1700000060000,5\n")
    with pytest.raises(ConfigError, match=r"t\.csv: row 2: column 'timestamp': .*milliseconds"):
        load_trace(p)


def test_trace_mixing_seconds_and_far_future_dates_is_refused(tmp_path):
    far = write(tmp_path, "far.csv", "instance_id,timestamp,util\ni-1,2026-01-01T00:00:00Z,5\n"
                                     "i-1,2999-01-01T00:00:00Z,5\n")
    with pytest.raises(ConfigError, match=r"far\.csv: row 3: column 'timestamp': .*after 2200"):
        load_trace(far)
    span = write(tmp_path, "span.csv", "instance_id,timestamp,util\ni-1,1600000000,5\ni-1,1700000000,5\n")
    with pytest.raises(ConfigError, match=r"span\.csv: column 'timestamp': the trace spans 1,157 days"):
        load_trace(span)


def test_trace_grid_too_large_is_refused(tmp_path):
    # 400 days at a 1 s step given on the command line would be 34.6 million samples per GPU.
    p = write(tmp_path, "t.csv", "instance_id,timestamp,util\n" + "".join(
        f"i-{g},{1_700_000_000 + t},5\n" for g in range(3) for t in (0, 399 * 86400)))
    with pytest.raises(ConfigError, match=r"t\.csv: 3 GPU series x 34,473,601 steps"):
        load_trace(p, step_s=1)


def test_cli_backtest_on_a_millisecond_trace_exits_2_without_a_traceback(tmp_path, capsys):
    p = write(tmp_path, "t.csv", "instance_id,timestamp,util\ni-1,1700000000000,5\ni-1,1700000060000,5\n")
    assert main(["backtest", "--trace", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"error: {p}: row 2: column 'timestamp'" in err and "Traceback" not in err


def test_focus_csv_with_a_non_utf8_byte_names_line_and_offset(tmp_path):
    p = write(tmp_path, "focus.csv", ",".join([*FOCUS_REQUIRED, "BilledCost"]).encode() + b"\n2024-09-02,US\xffD\n")
    with pytest.raises(BillingDataError, match=r"focus\.csv:2: not UTF-8 text \(byte 0xff"):
        read_focus(str(p), SEP, OCT, BS)


def test_cur_file_that_is_not_parquet_is_named(tmp_path):
    from gpufinops.collect.billing.cur import read_cur

    p = write(tmp_path, "cur.parquet", b"PAR1\xff\xfe not really")
    with pytest.raises(BillingDataError, match=r"cur\.parquet: not a readable Parquet file"):
        read_cur(str(p), SEP, OCT, AwsSettings().gpu_families)
