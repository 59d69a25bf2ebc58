"""Budgets: the shipped file, validation errors, evaluation, and a simulated month of alerts
through the real Slack notifier and a local Slack stub, deduplicated across a restart."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from gpufinops.cost.budgets import (
    Budget, Scope, alert_messages, configured_budgets, evaluate_budget, load_budgets, run_budget_check,
)
from gpufinops.collect.billing.schema import conform
from gpufinops.config import DEFAULT_RULES_DIR, BillingSettings, ConfigError, SecretRef, Settings, SlackSettings
from gpufinops.model import Decision, ReasonCode, Verdict
from gpufinops.notify.delivery import build_notifier
from gpufinops.store.store import Store

SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)
RATE = 4.0  # $/h of every simulated instance


def test_no_budget_is_live_on_a_fresh_install_the_example_is_valid():
    # Issue 26: the default budgets_path holds no file, so a fresh install has no budget; the example parses.
    assert not (DEFAULT_RULES_DIR / "budgets.yaml").exists()
    assert configured_budgets(DEFAULT_RULES_DIR / "budgets.yaml") == []
    budgets = load_budgets(DEFAULT_RULES_DIR / "examples" / "budgets.yaml")
    assert [b.name for b in budgets] == ["all-gpu", "untagged-gpu"]
    assert [(t.pct, t.level) for t in budgets[0].thresholds] == [(75, "warning"), (90, "critical"), (100, "emergency")]
    # Plain numbers get levels by position from the top.
    assert [(t.pct, t.level) for t in budgets[1].thresholds] == [(75, "warning"), (90, "critical"), (100, "emergency")]
    assert budgets[1].scope == Scope(kind="team", value="(untagged)")


@pytest.mark.parametrize("body,where", [
    ("budgets:\n  - name: a\n    amount: -5\n", r"b\.yaml:3: key 'budgets\.0\.amount'"),
    ("budgets:\n  - name: a\n    amount: 5\n    scope: {kind: team}\n", r"b\.yaml:4: key 'budgets\.0\.scope'.*needs a value"),
    ("budgets:\n  - name: a\n    amount: 5\n    currency: usd\n", r"b\.yaml:4: key 'budgets\.0\.currency'"),
    ("budgets:\n  - name: a\n    amount: 5\n  - name: a\n    amount: 6\n", r"b\.yaml:1: key 'budgets'.*repeated: \['a'\]"),
    # Nonsense amounts: a DCGM-like sentinel, infinity, nan, over the 1e12 bound.
    ("budgets:\n  - name: a\n    amount: 9.2e+18\n", r"b\.yaml:3: key 'budgets\.0\.amount'.*less than or equal to 1000000000000"),
    ("budgets:\n  - name: a\n    amount: .inf\n", r"b\.yaml:3: key 'budgets\.0\.amount'.*finite"),
    ("budgets:\n  - name: a\n    amount: .nan\n", r"b\.yaml:3: key 'budgets\.0\.amount'.*finite"),
    ("budgets:\n  - name: a\n    amount: 5\n    thresholds: [50, .inf]\n", r"b\.yaml:4: key 'budgets\.0\.thresholds"),
    ("budgets:\n  - name: a\n    amount: 5\n    escalate_idle_to_stop_at: .nan\n",
     r"b\.yaml:4: key 'budgets\.0\.escalate_idle_to_stop_at'.*finite"),
    (b"budgets:\n  - name: a\xff\n    amount: 5\n", r"b\.yaml:2: not UTF-8 text \(byte 0xff at offset 20\)"),
])
def test_bad_budget_file_names_file_line_and_key(tmp_path, body, where):
    p = tmp_path / "b.yaml"
    p.write_bytes(body if isinstance(body, bytes) else body.encode())
    with pytest.raises(ConfigError, match=where):
        load_budgets(p)


def _table(rows: list[dict]) -> pd.DataFrame:
    base = {"provider": "aws", "account": "111", "region": "us-east-1", "pricing_model": "on-demand", "project": "",
            "owner": "", "tags": "{}", "currency": "USD", "source": "cur", "usage_hours": 24.0}
    return conform(pd.DataFrame([{**base, **r} for r in rows]))


def test_evaluate_scopes_forecast_and_drivers():
    t = _table([
        {"date": "2024-09-01", "resource_id": "i-a", "instance_type": "p4d.24xlarge", "team": "ml", "cost": 500.0},
        {"date": "2024-09-02", "resource_id": "i-b", "instance_type": "g5.xlarge", "team": "", "cost": 100.0},
        {"date": "2024-09-02", "resource_id": "i-c", "instance_type": "g5.2xlarge", "team": "vision", "cost": 50.0},
    ])
    running = pd.DataFrame([{"instance_id": "i-b", "team": "", "project": "", "account": "111",
                             "instance_type": "g5.xlarge", "rate": 1.0},
                            {"instance_id": "i-x", "team": "ml", "project": "", "account": "111",
                             "instance_type": "p5.48xlarge", "rate": float("nan")}])
    through = datetime(2024, 9, 3, tzinfo=timezone.utc)
    empty = pd.DataFrame(columns=["instance_id", "team", "project", "account", "instance_type", "verdict", "cost"])
    all_ = evaluate_budget(Budget(name="all", amount=1400), t, SEP, OCT, through, running, empty)
    assert all_.spent == 650.0
    assert all_.hours_left == 28 * 24 and all_.forecast == 650.0 + 1.0 * 28 * 24
    assert all_.unpriced_running == 1  # i-x has no known rate: reported, not counted as $0
    assert all_.top_instances[0] == ("i-a", 500.0)
    assert all_.top_teams == [("ml", 500.0), ("(untagged)", 100.0), ("vision", 50.0)]
    assert all_.crossed["actual"] is None and all_.crossed["forecast"].level == "critical"  # 1322 of 1400
    untagged = evaluate_budget(Budget(name="u", scope=Scope(kind="team", value="(untagged)"), amount=100),
                               t, SEP, OCT, through, running, empty)
    assert untagged.spent == 100.0 and untagged.crossed["actual"].level == "emergency"
    fam = evaluate_budget(Budget(name="g5", scope=Scope(kind="instance_family", value="g5"), amount=1000),
                          t, SEP, OCT, through, running, empty)
    assert fam.spent == 150.0
    msgs = alert_messages(untagged, Budget(name="u", scope=Scope(kind="team", value="(untagged)"), amount=100))
    assert [m.key for m in msgs] == ["budget:u:team=(untagged):2024-09:actual:100",
                                     "budget:u:team=(untagged):2024-09:forecast:100"]


# --------------------------------------------------------------------------- simulated month


def n_running(day: int) -> int:
    return 1 + (day - 1) // 3  # one more $4/h instance every third day


def month_table(day: int) -> pd.DataFrame:
    """Billing through the end of day-1: each running instance 24 h x $4."""
    rows = []
    for d in range(1, day):
        for k in range(n_running(d)):
            rows.append({"date": f"2024-09-{d:02d}", "resource_id": f"i-{k}", "instance_type": "g5.12xlarge",
                         "team": "ml" if k % 2 == 0 else "", "cost": 24 * RATE})
    if not rows:
        return conform(pd.DataFrame({c: [] for c in ("date", "provider", "account", "region", "resource_id",
                                                       "instance_type", "pricing_model", "team", "project", "owner",
                                                       "tags", "cost", "currency", "usage_hours", "source")}))
    return _table(rows)


def record_evaluations(store: Store, now: datetime, day: int) -> None:
    at = now - timedelta(minutes=1)
    ds = [Decision(f"i-{k}", "idle", Verdict.IDLE if k == 0 else Verdict.ACTIVE,
                   ReasonCode.IDLE_STAYS_BELOW if k == 0 else ReasonCode.BUSY, "sim", at, hourly_cost=RATE)
          for k in range(n_running(day))]
    store.record_decisions(f"run-{day}", ds, dry_run=True,
                           teams={d.instance_id: "ml" if int(d.instance_id[2:]) % 2 == 0 else "" for d in ds},
                           types={d.instance_id: "g5.12xlarge" for d in ds})


@pytest.fixture
def sim(tmp_path, slack_stub, monkeypatch):
    monkeypatch.setenv("GPUFINOPS_TEST_SLACK", "xoxb-budget-test")
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("budgets:\n  - name: gpu\n    amount: 15000\n    channel: '#finops-budgets'\n")
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'g.db'}",
        slack=SlackSettings(token=SecretRef(env="GPUFINOPS_TEST_SLACK"), base_url=slack_stub.base_url, max_retries=0,
                            outbox_path=str(tmp_path / "outbox.jsonl")),
        billing={"budgets_path": str(budgets)},
    )
    return settings


def check(settings, store, now, day):
    notifier = build_notifier(settings.slack, store, lambda: now)
    return run_budget_check(settings, store, notifier, now, month_table(day), catalog=lambda t, r: None)


def test_simulated_month_alerts_once_per_threshold_forecast_first(sim, slack_stub):
    store = Store(sim.database_url)
    sent_on: dict[str, int] = {}
    for day in range(1, 31):
        now = datetime(2024, 9, day, 12, tzinfo=timezone.utc)
        record_evaluations(store, now, day)
        (status,) = check(sim, store, now, day)
        assert status.error is None
        for key in status.alerts_sent:
            assert key not in sent_on
            sent_on[key] = day
    key = "budget:gpu:all:2024-09:{}:{}".format
    assert sent_on == {key("forecast", 75): 13, key("forecast", 90): 19, key("forecast", 100): 25,
                       key("actual", 75): 27, key("actual", 90): 29}
    posted = slack_stub.posted("#finops-budgets")
    assert len(posted) == 5
    assert posted[0]["text"].startswith("[WARNING] GPU budget 'gpu' (all) is forecast to spend 77% of $15,000.00")
    # Day 29: actual 90% message carries spent, forecast, drivers and the idle share from the verdicts.
    last = posted[-1]["text"]
    spent29 = sum(24 * RATE * n_running(d) for d in range(1, 29))
    assert f"spent ${spent29:,.2f}" in last and "[CRITICAL]" in last
    assert "*Top teams* ml " in last and "(untagged)" in last and "*Top instances* i-0 " in last
    # i-0 is the idle one: each past evaluation covers 2 min (the gap cap), today's 1 min up to now.
    idle = sum(2 for _ in range(1, 29)) + 1
    total = sum(2 * n_running(d) for d in range(1, 29)) + n_running(29)
    assert f"*Idle share* {100 * idle / total:.0f}%" in last

    # Restart: a new Store and notifier on the same database send nothing again.
    store.close()
    store2 = Store(sim.database_url)
    now = datetime(2024, 9, 30, 18, tzinfo=timezone.utc)
    (status,) = check(sim, store2, now, 30)
    assert status.alerts_sent == [] and status.crossed["actual"].pct == 90
    assert len(slack_stub.posted()) == 5


def test_budget_in_another_currency_is_skipped_with_an_error(sim, slack_stub, tmp_path):
    (tmp_path / "eur.yaml").write_text("budgets:\n  - name: eur\n    amount: 10\n    currency: EUR\n")
    s = sim.model_copy(update={"billing": BillingSettings(budgets_path=str(tmp_path / "eur.yaml"))})
    store = Store(s.database_url)
    now = datetime(2024, 9, 10, 12, tzinfo=timezone.utc)
    (status,) = check(s, store, now, 10)
    assert "is in EUR but the cost table is in USD" in status.error and status.alerts_sent == []
    assert slack_stub.posted() == []


def test_cli_budgets_check_sends_to_outbox_once(tmp_path, capsys, monkeypatch):
    import json

    from gpufinops.cli import main
    from gpufinops.collect.billing.synth import write_cur_rows
    from gpufinops.notify.delivery import read_outbox

    from tests.collect.test_billing_cur import fixture_rows

    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    cur = write_cur_rows(tmp_path / "cur.parquet", fixture_rows())
    (tmp_path / "b.yaml").write_text("budgets:\n  - name: ml\n    scope: {kind: team, value: ml}\n    amount: 120\n")
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{tmp_path / 'g.db'}\nslack:\n  outbox_path: {tmp_path / 'out.jsonl'}\n"
                   f"billing:\n  source: cur\n  path: {cur}\n  budgets_path: b.yaml\n")
    # Without --notify it checks and prints; --notify --dry-run prints what would be sent; neither sends.
    assert main(["-c", str(cfg), "budgets", "check", "--month", "2024-09"]) == 0
    printed = capsys.readouterr().out
    assert "alerts due, not sent (add --notify to send):" in printed
    assert "[WARNING] GPU budget 'ml' (team=ml) has spent 83%" in printed
    # No evaluation stored: the idle share is unknown, said so, never "NaN".
    assert "unknown (no priced evaluation)" in printed and "NaN" not in printed
    assert main(["-c", str(cfg), "budgets", "check", "--month", "2024-09", "--notify", "--dry-run"]) == 0
    assert "dry-run: would send:" in capsys.readouterr().out
    assert read_outbox(tmp_path / "out.jsonl") == []
    outs = []
    for _ in range(2):  # the second run (a restart) sends nothing new
        assert main(["-c", str(cfg), "budgets", "check", "--month", "2024-09", "--notify", "-o", "json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    # ml spent 3 x 32.77 + 0.70 = 99.01 of 120 = 83%: the 75% warning, once.
    assert outs[0][0]["spent"] == 99.01 and outs[0][0]["pct_actual"] == 82.5
    assert outs[0][0]["alerts_sent"] == "budget:ml:team=ml:2024-09:actual:75, budget:ml:team=ml:2024-09:forecast:75"
    assert outs[1][0]["alerts_sent"] == ""
    sent = read_outbox(tmp_path / "out.jsonl")
    assert [m["key"] for m in sent] == ["budget:ml:team=ml:2024-09:actual:75", "budget:ml:team=ml:2024-09:forecast:75"]
    assert sent[0]["text"].startswith("[WARNING] GPU budget 'ml' (team=ml) has spent 83% of $120.00 for 2024-09")


def test_budgets_check_without_budgets_says_so_and_a_missing_set_path_is_an_error(tmp_path, capsys):
    from gpufinops.cli import main

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{tmp_path / 'g.db'}\nbilling:\n  source: cur\n  path: x.parquet\n")
    assert main(["-c", str(cfg), "budgets", "check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no budgets configured: billing.budgets_path") and "rules/examples/budgets.yaml" in out
    cfg.write_text(cfg.read_text() + "  budgets_path: mine.yaml\n")
    assert main(["-c", str(cfg), "budgets", "check"]) == 1
    err = capsys.readouterr().err
    assert "billing.budgets_path:" in err and "mine.yaml does not exist" in err


def test_a_failed_aws_forecast_is_one_clear_line_not_an_html_page():
    from botocore.exceptions import ClientError

    from gpufinops.cli.billing import forecast_error_line

    page = "<html><head><title>500</title></head><body><h1>Internal Server Error</h1>\n<p>x</p></body></html>"
    line = forecast_error_line(ClientError({"Error": {"Code": "500", "Message": page},
                                            "ResponseMetadata": {"HTTPStatusCode": 500}}, "GetCostForecast"))
    assert line == "GetCostForecast failed (500, HTTP 500): the endpoint answered with an HTML page, not an AWS error"
    line = forecast_error_line(ClientError({"Error": {"Code": "DataUnavailableException", "Message": "not enough"},
                                            "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetCostForecast"))
    assert line == "GetCostForecast failed (DataUnavailableException, HTTP 400): not enough"


def test_a_budget_alert_is_a_notice_every_delivery_renders_with_tag_values_escaped():
    """No hand-made Slack blocks: the alert is title, lead and facts like every notice, so Slack gets a header
    and fields, email and the outbox the same words; a team named like a Slack command stays text."""
    from gpufinops.cost.budgets import BudgetStatus, Threshold
    from gpufinops.notify.slack_blocks import render

    status = BudgetStatus("ml-gpu", "team=ml", "2024-09", 1000.0, "USD", 950.0, 1300.0, SEP + timedelta(days=20),
                          2.0, 240.0, top_instances=[("i-a", 900.0)], top_teams=[("<!channel>", 950.0)],
                          idle_share=0.25, crossed={"actual": Threshold(pct=90, level="critical"), "forecast": None})
    [notice] = alert_messages(status, Budget(name="ml-gpu", scope=Scope(kind="team", value="ml"), amount=1000))
    assert (notice.kind, notice.team, notice.audience, notice.channel) == ("budget", "ml", ("team",), "")
    assert notice.key == "budget:ml-gpu:team=ml:2024-09:actual:90" and notice.blocks == ()
    text, blocks = render(notice)
    assert blocks[0]["type"] == "header" and "ml-gpu 95% (actual)" in blocks[0]["text"]["text"]
    fields = {f["text"].split("\n")[0]: f["text"].split("\n", 1)[1] for b in blocks if "fields" in b
              for f in b["fields"]}
    assert fields["*Idle share*"] == "25%" and fields["*Budget*"] == "$1,000.00"
    assert fields["*Top teams*"] == "&lt;!channel&gt; $950.00"  # never a live @channel
    assert "<!channel>" not in text and "<!channel>" not in str(blocks)
    assert text.splitlines()[0].startswith("[CRITICAL] GPU budget 'ml-gpu'")  # the daily summary quotes it
