"""Rule files: the shipped defaults are valid; bad rules fail with file, line and key."""

from pathlib import Path

import pytest

from gpufinops.cli import main
from gpufinops.config import ConfigError, load_settings
from gpufinops.model import Action, Aggregation, GpuInstance
from gpufinops.rules import load_rules, parse_duration

REPO = Path(__file__).resolve().parent.parent


def test_shipped_rules_are_valid_and_the_common_rule_is_an_example():
    rules = load_rules([REPO / "rules"])
    by_name = {r.name: r for r in rules}
    default = by_name["gpu-util-below-10pct-2h"]  # chosen by the backtest (BENCHMARKS.md, issue 18)
    assert (default.threshold_pct, default.window_s, default.aggregation, default.action) == (
        10, 7200, Aggregation.STAYS_BELOW, Action.STOP)
    assert "zero-activity-1h" in by_name and "gpu-util-below-40pct-10m" not in by_name
    (seed,) = load_rules([REPO / "rules" / "examples" / "common-40pct-10min.yaml"])
    assert (seed.threshold_pct, seed.window_s, seed.aggregation, seed.action) == (40, 600, Aggregation.STAYS_BELOW, Action.STOP)
    assert "90%" in seed.description  # its measured false-stop rate on the bundled trace


def test_default_settings_point_at_shipped_rules():
    assert load_rules(load_settings().rules_paths)


@pytest.mark.parametrize("value,seconds", [("10m", 600), ("1h30m", 5400), (600, 600), ("2d", 172800), ("45s", 45)])
def test_durations(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("bad", ["ten minutes", 0, -5, "", True, False, float("inf"), float("nan"), -1e18, 9.2e18,
                                 10**30, "99999999999999999999d", None, [600], "0s"])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def write(tmp_path, text, name="r.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_bad_threshold_names_file_line_and_key(tmp_path):
    p = write(tmp_path, "rules:\n  - name: ok\n    threshold_pct: 40\n    window: 10m\n  - name: bad\n    threshold_pct: 140\n    window: 10m\n")
    with pytest.raises(ConfigError) as e:
        load_rules([p])
    msg = str(e.value)
    assert f"{p}:6" in msg and "rules.1.threshold_pct" in msg


def test_unknown_key_and_bad_window(tmp_path):
    p = write(tmp_path, "rules:\n  - name: x\n    threshold_pct: 40\n    window: soon\n    treshold: 3\n")
    msg = str(pytest.raises(ConfigError, load_rules, [p]).value)
    assert "rules.0.window" in msg and "rules.0.treshold" in msg and f"{p}:4" in msg


def test_terminate_needs_explicit_confirmation(tmp_path):
    p = write(tmp_path, "rules:\n  - name: x\n    threshold_pct: 40\n    window: 10m\n    action: terminate\n")
    assert "confirm_terminate" in str(pytest.raises(ConfigError, load_rules, [p]).value)
    p.write_text(p.read_text() + "    confirm_terminate: true\n")
    assert load_rules([p])[0].action == Action.TERMINATE


def test_invalid_yaml_names_line(tmp_path):
    p = write(tmp_path, "rules:\n  - name: x\n    threshold_pct: [40\n")
    assert f"{p}:" in str(pytest.raises(ConfigError, load_rules, [p]).value)


def test_duplicate_names(tmp_path):
    write(tmp_path, "rules:\n  - {name: a, threshold_pct: 40, window: 10m}\n", "a.yaml")
    write(tmp_path, "rules:\n  - {name: a, threshold_pct: 30, window: 5m}\n", "b.yaml")
    assert "duplicate rule name" in str(pytest.raises(ConfigError, load_rules, [tmp_path]).value)


def test_selector(tmp_path):
    p = write(tmp_path, """rules:
  - name: dev-only
    threshold_pct: 40
    window: 10m
    select:
      tags: {env: [dev, research]}
      exclude_tags: {workload: inference}
      instance_families: [p4d, g5]
""")
    sel = load_rules([p])[0].selector

    def mk(itype, tags):
        return GpuInstance("i", itype, "us-east-1", "running", None, tags=tags)  # type: ignore[arg-type]

    assert sel.matches(mk("g5.xlarge", {"env": "dev"}))
    assert not sel.matches(mk("g5.xlarge", {"env": "prod"}))
    assert not sel.matches(mk("g5.xlarge", {"env": "dev", "workload": "inference"}))
    assert not sel.matches(mk("p5.48xlarge", {"env": "dev"}))


def test_cli_rules_check_exit_codes(tmp_path, capsys):
    assert main(["rules", "check", str(REPO / "rules")]) == 0
    bad = write(tmp_path, "rules:\n  - name: x\n    threshold_pct: 40\n    window: 10m\n    action: explode\n")
    assert main(["rules", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:5" in err and "rules.0.action" in err


def test_config_errors_name_file_and_key(tmp_path):
    p = write(tmp_path, "act:\n  dry_run: true\n  max_stops_per_run: -1\nprometheus:\n  urll: x\n", "gpufinops.yaml")
    msg = str(pytest.raises(ConfigError, load_settings, p).value)
    assert f"{p}:3: key 'act.max_stops_per_run'" in msg and "prometheus.urll" in msg


def test_example_config_is_valid():
    settings = load_settings(REPO / "gpufinops.example.yaml")
    assert settings.act.dry_run is True
    load_rules(settings.rules_paths)


@pytest.mark.parametrize("field,value,why", [
    ("window", "8d", "longer than the maximum 7d"),
    ("window", "1.0e+62", "longer than the maximum 7d"),
    ("warning_lead", "30s", "shorter than the minimum 60 s"),
    ("warning_lead", "9.2e+18", "longer than the maximum 7d"),
])
def test_window_and_warning_lead_are_bounded(tmp_path, field, value, why):
    body = {"window": "10m", "warning_lead": "15m", field: value}
    p = write(tmp_path, "rules:\n  - name: x\n    threshold_pct: 40\n"
                        f"    window: {body['window']}\n    warning_lead: {body['warning_lead']}\n")
    msg = str(pytest.raises(ConfigError, load_rules, [p]).value)
    assert f"key 'rules.0.{field}'" in msg and why in msg


def test_every_shipped_and_example_rule_is_within_the_bounds():
    rules = load_rules([REPO / "rules", REPO / "rules" / "examples"])
    assert rules and all(60 <= r.warning_lead_s <= 7 * 86400 and 1 <= r.window_s <= 7 * 86400 for r in rules)


def test_idle_without_activity_counter_is_off_by_default_and_validated(tmp_path):
    from gpufinops.model import IDLE_MEMORY_FLOOR_MIB, NoCounterPolicy

    default = load_rules([REPO / "rules"])
    assert {r.idle_without_activity_counter for r in default} == {NoCounterPolicy.NEVER}
    assert {r.idle_memory_floor_mib for r in default} == {IDLE_MEMORY_FLOOR_MIB}
    p = write(tmp_path, "rules:\n  - name: mig\n    threshold_pct: 10\n    window: 2h\n"
                        "    idle_without_activity_counter: no_processes_and_idle_memory\n"
                        "    idle_memory_floor_mib: 256\n")
    (rule,) = load_rules([p])
    assert rule.idle_without_activity_counter == NoCounterPolicy.NO_PROCESSES_AND_IDLE_MEMORY
    assert rule.idle_memory_floor_mib == 256


@pytest.mark.parametrize("line, key", [
    ("idle_without_activity_counter: yes", "rules.0.idle_without_activity_counter"),  # YAML's yes is a boolean
    ("idle_without_activity_counter: no_processes", "rules.0.idle_without_activity_counter"),
    ("idle_memory_floor_mib: -1", "rules.0.idle_memory_floor_mib"),
    ("idle_memory_floor_mib: lots", "rules.0.idle_memory_floor_mib"),
])
def test_bad_no_counter_options_name_file_line_and_key(tmp_path, line, key):
    p = write(tmp_path, f"rules:\n  - name: mig\n    threshold_pct: 10\n    window: 2h\n    {line}\n")
    msg = str(pytest.raises(ConfigError, load_rules, [p]).value)
    assert f"{p}:5" in msg and key in msg, msg


def test_rules_check_shows_the_no_counter_option_when_on(tmp_path, capsys):
    p = write(tmp_path, "rules:\n  - name: mig\n    threshold_pct: 10\n    window: 2h\n"
                        "    idle_without_activity_counter: no_processes_and_idle_memory\n"
                        "  - name: plain\n    threshold_pct: 10\n    window: 2h\n")
    assert main(["rules", "check", str(p)]) == 0
    mig, plain = capsys.readouterr().out.splitlines()[:2]
    assert "no counter: idle if no_processes_and_idle_memory (floor 1024 MiB)" in mig
    assert "no counter" not in plain


def test_notify_to_names_destinations_with_their_transport_and_rules_check_shows_them(tmp_path, capsys):
    p = write(tmp_path, "rules:\n  - name: ml\n    threshold_pct: 10\n    window: 2h\n"
                        "    notify_to: ['slack:#ml-gpus', 'email:finance@example.com', owner, team, 'slack:#ml-gpus']\n"
                        "  - name: plain\n    threshold_pct: 10\n    window: 2h\n")
    ml, plain = load_rules([p])
    assert ml.notify_to == ("slack:#ml-gpus", "email:finance@example.com", "owner", "team")  # each once, in order
    assert plain.notify_to == ()
    assert main(["rules", "check", str(p)]) == 0
    shown_ml, shown_plain = capsys.readouterr().out.splitlines()[:2]
    assert "to slack:#ml-gpus, email:finance@example.com, owner, team" in shown_ml
    assert "to by audience (team channel, else default)" in shown_plain


@pytest.mark.parametrize("bad,why", [
    ("['slack:ML GPUs']", "is not a Slack channel"),
    ("['email:finance']", "is not an email address"),
    ("['teams:#ml']", "is not a destination"),
    ("[owners]", "is not a destination"),
    ("['#ml-gpus']", "is not a destination"),  # the transport must be said
    ("'slack:#ml-gpus'", "valid list"),
])
def test_bad_destinations_name_file_line_and_key(tmp_path, bad, why):
    p = write(tmp_path, f"rules:\n  - name: ml\n    threshold_pct: 10\n    window: 2h\n    notify_to: {bad}\n")
    msg = str(pytest.raises(ConfigError, load_rules, [p]).value)
    assert f"{p}:5" in msg and "rules.0.notify_to" in msg and why in msg, msg


def test_slack_channel_is_a_deprecated_alias_of_notify_to(tmp_path, caplog):
    p = write(tmp_path, "rules:\n  - name: old\n    threshold_pct: 10\n    window: 2h\n    slack_channel: '#ml-gpus'\n")
    with caplog.at_level("WARNING", logger="gpufinops.rules"):
        (rule,) = load_rules([p])
    assert rule.notify_to == ("slack:#ml-gpus",)
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert f"{p}:5" in warning.getMessage() and "rules.0.slack_channel" in warning.getMessage()
    assert "notify_to: [slack:#ml-gpus]" in warning.getMessage()
    caplog.clear()  # the service reads its rules every tick: the warning is said once, not every tick
    with caplog.at_level("WARNING", logger="gpufinops.rules"):
        assert load_rules([p])[0].notify_to == ("slack:#ml-gpus",)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_slack_channel_and_notify_to_both_given_is_an_error_and_a_bad_old_channel_is_refused(tmp_path):
    p = write(tmp_path, "rules:\n  - name: both\n    threshold_pct: 10\n    window: 2h\n    slack_channel: '#a'\n"
                        "    notify_to: ['slack:#b']\n")
    msg = str(pytest.raises(ConfigError, load_rules, [p]).value)
    assert f"{p}:2" in msg and "rules.0" in msg and "both given" in msg, msg
    p = write(tmp_path, "rules:\n  - name: bad\n    threshold_pct: 10\n    window: 2h\n    slack_channel: 'ML GPUs'\n")
    msg = str(pytest.raises(ConfigError, load_rules, [p]).value)
    assert f"{p}:5" in msg and "rules.0.slack_channel" in msg and "is not a Slack channel" in msg, msg


def test_rules_check_says_a_power_off_rule_leaves_the_vm_billed(tmp_path, capsys):
    from gpufinops.words import POWER_OFF_BILLING

    p = write(tmp_path, "rules:\n  - name: keep-hardware\n    threshold_pct: 5\n    window: 2h\n    action: power_off\n"
                        "  - name: plain\n    threshold_pct: 10\n    window: 2h\n    action: stop\n")
    assert main(["rules", "check", str(p)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ok  keep-hardware") and "power_off" in lines[0]
    assert lines[1].strip().startswith("note: keep-hardware: power_off applies to Azure VMs only")
    assert POWER_OFF_BILLING in lines[1] and "gpufinops-power-off-role.json" in lines[1]
    assert lines[2].startswith("ok  plain") and not any("note: plain" in line for line in lines)


def test_every_notice_of_a_power_off_says_billing_continues_and_names_no_saving():
    from datetime import datetime, timezone

    from gpufinops.model import Decision, ReasonCode, Verdict
    from gpufinops.notify import messages
    from gpufinops.words import POWER_OFF_BILLING, words

    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    vm = GpuInstance(instance_id="azure:11111111-2222-3333-4444-555555555555/ml/a100",
                     instance_type="Standard_NC24ads_A100_v4", region="eastus", state="running", launch_time=t0,
                     gpu_count=1, provider="azure", hourly_cost=3.67)
    d = Decision(vm.instance_id, "keep-hardware", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", t0,
                 Action.POWER_OFF, hourly_cost=3.67)
    said = POWER_OFF_BILLING[1:]  # after its capital
    for dry_run in (False, True):
        warning = messages.idle_warning(vm, d, marked_at=t0, stop_at=t0, dry_run=dry_run, action=Action.POWER_OFF)
        assert "powered off" in warning.text and said in warning.text and said in warning.lead
        done = messages.stopped(vm, d, at=t0, dry_run=dry_run, action=Action.POWER_OFF)
        assert said in done.text and "save" not in done.text.lower() and said in done.lead
        assert "Still billed" in dict(done.facts) and not any("save" in label.lower() for label, _ in done.facts)
    assert "still billed until deallocated" in words("power_off")  # the audit's and the report's word for the row
    # A deallocate's notices stay as they were: a saving, no billing sentence.
    stop = messages.stopped(vm, Decision(vm.instance_id, "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", t0,
                                         Action.STOP, hourly_cost=3.67), at=t0, dry_run=False, action=Action.STOP)
    assert "Deallocated" in stop.text and "Saves" in stop.text and said not in stop.text


# --------------------------------------------------------------------------- one reading of a file: data and lines

def node_lines(node, seen=None) -> tuple:
    """A YAML node tree as (kind, tag, line, value...): what line_of and a rule's source read from it."""
    import yaml

    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias: the anchored node again
        return ("alias", node.start_mark.line)
    seen.add(id(node))
    head = (type(node).__name__, node.tag, node.start_mark.line, node.start_mark.column)
    if isinstance(node, yaml.ScalarNode):
        return (*head, node.value)
    if isinstance(node, yaml.SequenceNode):
        return (*head, *(node_lines(n, seen) for n in node.value))
    return (*head, *((node_lines(k, seen), node_lines(v, seen)) for k, v in node.value))


@pytest.mark.parametrize("text", [
    "rules:\n  - name: a\n    threshold_pct: 10\n",
    "base: &b {threshold_pct: 10, window: 2h}\nrules:\n  - <<: *b\n    name: a\n  - {<<: *b, name: b}\n",
    "<<: {rules: [{name: merged}]}\nother: 1\n",
    "a: &x [1, *x]\n",  # a recursive list
    "when: 2024-09-01\nn: 0x1F\nf: .nan\nnull: ~\n",
    "# only a comment\n", "", "---\n...\n",
])
def test_a_file_is_read_once_for_its_data_and_its_lines_as_two_readings_give_them(text):
    """parse_yaml_tree reads a document once for its data and its node tree (a rule's line, line_of's lines): the
    data yaml.safe_load gives and the lines of yaml.compose, merge keys (which the constructor rewrites) too."""
    import yaml

    from gpufinops.config import parse_yaml_tree

    data, root = parse_yaml_tree("f.yaml", text)
    assert repr(data) == repr(yaml.safe_load(text))
    fresh = yaml.compose(text)
    assert (root is None) == (fresh is None)
    if fresh is not None:
        assert node_lines(root) == node_lines(fresh)


def test_a_rule_begins_on_its_line_with_merge_keys_and_anchors(tmp_path):
    p = write(tmp_path, "base: &b {threshold_pct: 10, window: 2h}\nrules:\n  - <<: *b\n    name: a\n\n"
                        "  - {<<: *b, name: b}\n")
    with pytest.raises(ConfigError, match=r"key 'base': Extra inputs"):
        load_rules([p])
    p = write(tmp_path, "rules:\n  - &one\n    name: a\n    threshold_pct: 10\n    window: 2h\n"
                        "  - <<: *one\n    name: b\n")
    assert [r.source for r in load_rules([p])] == [f"{p}:2", f"{p}:6"]


def test_a_rule_without_select_selects_what_an_empty_select_validated_selects(tmp_path):
    from gpufinops.rules import _RuleModel, _SelectorModel

    default = _RuleModel.model_fields["select"].default_factory()  # set without building a validator
    assert (default, default.model_fields_set) == (_SelectorModel.model_validate({}), set())
    (rule,) = load_rules([write(tmp_path, "rules:\n  - {name: a, threshold_pct: 10, window: 2h}\n")])
    assert rule.selector == _SelectorModel.model_validate({}).to_selector()
