"""Optional budget escalation: an over-budget scope's idle, notify-only instances take the safe stop path."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.config import load_settings
from gpufinops.decide.escalation import Escalation, promote
from gpufinops.run.jobs import budget_check
from gpufinops.model import (TAG_PROTECT, Action, ActionKind, Decision, GpuInstance, GpuWindowStats, InstanceUsage,
                             ReasonCode, Rule, RunContext, Verdict)
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.demo.sim import ConsoleNotifier, SimCloud
from gpufinops.store.store import Store

FOCUS = Path(__file__).resolve().parents[3] / "shared/data/billing/focus_1.0_sample_1000.csv"
NOW = datetime(2024, 9, 30, 12, tzinfo=timezone.utc)
KEYS = {"team": ("team",), "project": ("project",)}


def inst(iid, **tags):
    return GpuInstance(iid, "g5.xlarge", "us-east-1", "running", NOW - timedelta(days=3), account="123",
                       gpu_count=1, tags=tags)


def idle(iid, verdict=Verdict.IDLE, action=Action.NOTIFY):
    return Decision(iid, "zero", verdict, ReasonCode.IDLE_STAYS_BELOW, "idle 1 h", NOW, action=action)


@pytest.mark.parametrize("scope,value,expect", [
    ("team", "ml", {"a"}), ("team", "(untagged)", {"c"}), ("all", None, {"a", "b", "c"}),
    ("instance_family", "g5", {"a", "b", "c"}), ("account", "999", set()),
])
def test_promote_only_idle_notify_decisions_in_scope(scope, value, expect):
    by_id = {"a": inst("a", team="ml"), "b": inst("b", team="web"), "c": inst("c")}
    decisions = [idle("a"), idle("b"), idle("c"), idle("a", verdict=Verdict.ACTIVE)]
    out = promote(decisions, by_id, [Escalation("b1", "2024-09", scope, value, 93.0)], KEYS)
    promoted = {d.instance_id for d in out if d.action == Action.STOP}
    assert promoted == expect
    assert all("budget 'b1'" in d.reason and "93%" in d.reason for d in out if d.action == Action.STOP)
    assert out[3].action == Action.NOTIFY  # not idle: never touched


class IdleMetrics:
    def window_usage(self, instances, window_s, now):
        return {i.instance_id: InstanceUsage(i.instance_id, window_s, 20, (GpuWindowStats("0", 20, 0.0, 0.0),))
                for i in instances}


@pytest.mark.skipif(not FOCUS.exists(), reason="shared FOCUS sample not present")
def test_over_budget_scope_is_marked_then_stopped_through_the_safe_path(tmp_path):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("budgets:\n  - name: gpu\n    scope: {kind: all}\n    amount: 5\n    thresholds: [50]\n"
                       "    escalate_idle_to_stop_at: 50\n")
    settings = load_settings(billing={"source": "focus", "path": str(FOCUS), "budgets_path": str(budgets)},
                             act={"dry_run": False, "max_stops_fraction": 1.0})
    clock = [NOW]
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    opted_in = {"gpufinops:allow-stop": "true"}  # act.opt_in_tag: only an opted-in instance is ever stopped
    cloud = SimCloud([inst("i-a", team="ml", **opted_in), inst("i-p", team="ml", **{TAG_PROTECT: "true"}, **opted_in)],
                     lambda: clock[0])
    peers = Peers(cloud, IdleMetrics(), store, ConsoleNotifier(store, lambda: clock[0], lambda s: None))
    notify_only = Rule(name="zero", threshold_pct=1, window_s=600, action=Action.NOTIFY, warning_lead_s=600)

    def tick():
        r = run_once(RunContext(now=clock[0], dry_run=False), settings, [notify_only], peers)
        clock[0] += timedelta(minutes=11)
        return r

    assert not [a for a in tick().actions if a.kind == ActionKind.MARK]  # within budget: notify only
    budget_check(settings, peers, clock[0])  # FOCUS GPU spend > 50% of $5: escalation recorded
    r = tick()
    assert [(a.instance_id, a.kind) for a in r.actions if a.kind == ActionKind.MARK] == [("i-a", ActionKind.MARK)]
    assert "budget 'gpu'" in r.decisions[0].reason
    tick()
    assert cloud.get("i-a").state == "stopped" and cloud.get("i-p").state == "running"


def test_the_tick_matches_a_budget_scope_on_the_tag_keys_the_composition_root_hands_it(tmp_path):
    """`billing.tag_keys` reach the tick through compose.live_peers (issue 36: the tick reads no billing settings
    itself): an instance whose team is in a `squad` tag is escalated under a team budget, and the tick's own
    settings (here without a billing section) play no part in it."""
    from dataclasses import replace

    from gpufinops.config import TagKeys
    from gpufinops.cost.escalations import record
    from gpufinops.run.compose import live_peers

    settings = load_settings(database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                             hosts={"inventory": [{"hostname": "gpu-box-1", "gpu_model": "H100", "gpu_count": 8,
                                                   "usd_per_hour": 19.9}]},
                             billing={"tag_keys": {"team": ["squad"], "project": ["project"], "owner": ["owner"]}})
    composed = live_peers(settings)
    assert composed.scope_tag_keys == TagKeys(team=("squad",), project=("project",), owner=("owner",))
    clock = [NOW]
    cloud = SimCloud([inst("i-s", squad="ml"), inst("i-t", team="ml")], lambda: clock[0])
    peers = replace(composed, cloud=cloud, metrics=IdleMetrics(),
                    notifier=ConsoleNotifier(composed.store, lambda: clock[0], lambda s: None))
    record(peers.store, Escalation("gpu", f"{NOW:%Y-%m}", "team", "ml", 93.0))
    notify_only = Rule(name="zero", threshold_pct=1, window_s=600, action=Action.NOTIFY, warning_lead_s=600)
    report = run_once(RunContext(now=NOW, dry_run=True), load_settings(), [notify_only], peers, act=False)
    promoted = {d.instance_id for d in report.decisions if d.action == Action.STOP}
    assert promoted == {"i-s"}  # the `team` tag is not one of the configured keys: i-t stays notify-only
