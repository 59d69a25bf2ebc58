"""The act chokepoint: two-phase stop, cancel, protect, snooze, cap, dry-run, restart safety.

The cloud is the in-memory SimCloud (same `Cloud` protocol as EC2) and the usage is
scripted per instance; the Prometheus/moto/Slack end-to-end runs are in test_e2e.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.act.actuator import Actuator
from gpufinops.act.plan import Intent, plan, stop_cap
from gpufinops.config import load_settings
from gpufinops.model import (
    TAG_MARKED,
    TAG_PROTECT,
    TAG_SNOOZE,
    TAG_STOPPED_BY,
    Action,
    ActionKind,
    Decision,
    GpuInstance,
    GpuWindowStats,
    InstanceUsage,
    ReasonCode,
    Rule,
    RunContext,
    Verdict,
)
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.demo.sim import ConsoleNotifier, SimClock, SimCloud
from gpufinops.store.schema import MarkRow, StateRow
from gpufinops.store.store import Store

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
OPT_IN = "gpufinops:allow-stop"  # act.opt_in_tag: the fleet is opted in unless a test says otherwise
RULE = Rule(name="idle40", threshold_pct=40, window_s=600, warning_lead_s=900, action=Action.STOP)


class ScriptedMetrics:
    """Usage per instance set by the test: 'idle', 'busy', 'none' (no series) or 'error'."""

    def __init__(self):
        self.mode: dict[str, str] = {}

    def window_usage(self, instances, window_s, now):
        out = {}
        for i in instances:
            mode = self.mode.get(i.instance_id, "idle")
            if mode == "error":
                out[i.instance_id] = InstanceUsage(i.instance_id, window_s, 20, error="timeout")
            elif mode == "none":
                out[i.instance_id] = InstanceUsage(i.instance_id, window_s, 20)
            else:
                mx, mean = (3.0, 1.0) if mode == "idle" else (100.0, 90.0)
                out[i.instance_id] = InstanceUsage(i.instance_id, window_s, 20, (
                    GpuWindowStats("0", 20, mx, mean, 0.0, fb_used_max_mib=500.0),))
        return out


def make_fleet(n, **tags_by_id):
    return [GpuInstance(f"i-{k:02d}", "g5.xlarge", "us-east-1", "running", T0 - timedelta(days=1), gpu_count=1,
                        hourly_cost=1.006, tags={OPT_IN: "true", **tags_by_id.get(f"i-{k:02d}", {}), "team": "ml"})
            for k in range(n)]


class World:
    def __init__(self, tmp_path, n=1, dry_run=False, db="s.db", url=None, **tags):
        self.clock = SimClock(T0)
        self.cloud = SimCloud(make_fleet(n, **tags), self.clock)
        self.metrics = ScriptedMetrics()
        self.url = url or f"sqlite:///{tmp_path / db}"
        self.dry_run = dry_run
        self.settings = load_settings(act={"dry_run": dry_run, "max_stops_per_run": 5, "max_stops_fraction": 1.0})
        self.open_store()

    def open_store(self):
        """A fresh Store and notifier on the same file: what a service restart looks like."""
        self.store = Store(self.url)
        self.lines: list[str] = []
        self.notifier = ConsoleNotifier(self.store, self.clock, self.lines.append)

    def tick(self, minutes=1, rules=(RULE,)):
        report = run_once(RunContext(now=self.clock.now, dry_run=self.dry_run), self.settings, list(rules),
                          Peers(self.cloud, self.metrics, self.store, self.notifier))
        self.clock.advance(minutes * 60)
        return report

    def kinds(self, report):
        return [(a.instance_id, a.kind) for a in report.actions]


def test_two_phase_mark_then_stop(tmp_path):
    w = World(tmp_path)
    r = w.tick()
    assert w.kinds(r) == [("i-00", ActionKind.MARK)]
    assert TAG_MARKED in w.cloud.get("i-00").tags
    assert any("will be stopped" in line for line in w.lines)
    for _ in range(14):  # within the 15-minute lead: nothing more
        assert w.tick().actions == []
    r = w.tick()
    assert w.kinds(r) == [("i-00", ActionKind.STOP)]
    inst = w.cloud.get("i-00")
    assert inst.state == "stopped" and inst.tags[TAG_STOPPED_BY] == "gpufinops" and TAG_MARKED not in inst.tags
    assert ("stop", "i-00") in w.cloud.calls and w.store.get_mark("i-00") is None
    done = w.store.action_rows(kinds=[ActionKind.STOP])
    assert [(a.status, a.dry_run) for a in done] == [("done", False)]
    assert w.tick().actions == []  # stopped instances are not judged


def test_becoming_active_cancels_the_mark(tmp_path):
    w = World(tmp_path)
    w.tick()
    w.metrics.mode["i-00"] = "busy"
    r = w.tick()
    assert w.kinds(r) == [("i-00", ActionKind.UNMARK)]
    assert TAG_MARKED not in w.cloud.get("i-00").tags and w.store.get_mark("i-00") is None
    assert any("cancelled" in line.lower() for line in w.lines)
    for _ in range(20):
        w.tick()
    assert w.cloud.get("i-00").state == "running"


def test_unknown_data_never_stops_and_keeps_the_mark(tmp_path):
    w = World(tmp_path)
    w.tick()
    w.metrics.mode["i-00"] = "error"
    for _ in range(30):
        r = w.tick()
        assert all(a.kind != ActionKind.STOP for a in r.actions)
    assert w.cloud.get("i-00").state == "running" and w.store.get_mark("i-00") is not None
    # One "metrics unavailable" alert for the whole outage, not one per tick.
    assert sum("metrics" in line.lower() for line in w.lines) == 1


def test_protected_instances_are_never_marked_or_stopped(tmp_path):
    w = World(tmp_path, n=2, **{"i-00": {TAG_PROTECT: "yes"}, "i-01": {TAG_PROTECT: "false"}})
    for _ in range(40):
        w.tick()
    assert w.cloud.get("i-00").state == "running" and ("set_tags", "i-00") not in w.cloud.calls
    assert w.cloud.get("i-01").state == "stopped"  # "false" does not protect
    skips = [a for a in w.store.action_rows(kinds=[ActionKind.SKIP]) if a.instance_id == "i-00"]
    assert len(skips) == 1 and "protected" in skips[0].reason  # logged once per idle episode


def test_snooze_cancels_and_blocks_until_it_expires(tmp_path):
    w = World(tmp_path)
    w.tick()
    until = (T0 + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    w.cloud.set_tags(w.cloud.get("i-00"), {TAG_SNOOZE: until})
    r = w.tick()
    assert w.kinds(r) == [("i-00", ActionKind.UNMARK)] and "snoozed" in r.actions[0].reason
    for _ in range(100):
        w.tick()
    assert w.cloud.get("i-00").state == "running"
    for _ in range(40):  # snooze over: marked again, then stopped
        w.tick()
    assert w.cloud.get("i-00").state == "stopped"


def test_unreadable_snooze_counts_as_snoozed(tmp_path):
    w = World(tmp_path, **{"i-00": {TAG_SNOOZE: "next tuesday"}})
    for _ in range(30):
        w.tick()
    assert w.cloud.get("i-00").state == "running"


def test_removing_the_mark_tag_cancels_the_stop(tmp_path):
    w = World(tmp_path)
    w.tick()
    w.cloud.remove_tags(w.cloud.get("i-00"), [TAG_MARKED])
    r = w.tick()
    assert w.kinds(r) == [("i-00", ActionKind.UNMARK)] and "removed" in r.actions[0].reason


def test_stop_cap_per_run(tmp_path):
    w = World(tmp_path, n=10)
    w.settings = load_settings(act={"dry_run": False, "max_stops_per_run": 3, "max_stops_fraction": 1.0})
    for _ in range(15):
        w.tick()
    r = w.tick()
    stops = [a for a in r.actions if a.kind == ActionKind.STOP]
    skips = [a for a in r.actions if a.kind == ActionKind.SKIP]
    assert len(stops) == 3 and len(skips) == 7 and all("cap" in a.reason for a in skips)
    assert sum(i.state == "stopped" for i in w.cloud.list_gpu_instances()) == 3
    w.tick()
    assert sum(i.state == "stopped" for i in w.cloud.list_gpu_instances()) == 6


def test_the_stop_cap_is_one_per_run_across_passes(tmp_path):
    """The GPU-node pass runs after the instances' pass in the same tick (run/nodes.py): the stops of the first
    pass count against the one cap of the run, so two passes never stop twice the cap."""
    from gpufinops.decide.evaluate import evaluate_all
    from gpufinops.run.pipeline import collect_usage

    w = World(tmp_path, n=4)
    w.settings = load_settings(act={"dry_run": False, "max_stops_per_run": 3, "max_stops_fraction": 1.0})
    for _ in range(15):
        w.tick()  # marked, warned; the four stops are due on the next tick
    instances = w.cloud.list_gpu_instances()
    decisions = evaluate_all(instances, collect_usage(w.metrics, instances, [RULE], w.clock.now), [RULE],
                             w.clock.now)
    actions = Actuator(w.cloud, w.store, w.notifier, w.settings).apply(
        RunContext(now=w.clock.now, dry_run=False), instances, decisions, [RULE], stops_already=2)
    stops = [a for a in actions if a.kind == ActionKind.STOP]
    assert len(stops) == 1 and sum(i.state == "stopped" for i in w.cloud.list_gpu_instances()) == 1
    assert sum(1 for a in actions if a.kind == ActionKind.SKIP and "cap" in a.reason) == 3


@pytest.mark.parametrize("fleet,frac,absolute,expected", [(100, 0.1, 5, 5), (20, 0.1, 5, 2), (3, 0.1, 5, 1), (10, 0.0, 5, 0)])
def test_stop_cap_formula(fleet, frac, absolute, expected):
    s = load_settings(act={"max_stops_per_run": absolute, "max_stops_fraction": frac})
    assert stop_cap(s, fleet) == expected


def test_dry_run_changes_nothing_and_says_what_it_would_do(tmp_path):
    w = World(tmp_path, n=2, dry_run=True)
    for _ in range(40):
        w.tick()
    assert w.cloud.calls == []  # not one mutating call
    assert all(i.state == "running" and TAG_MARKED not in i.tags for i in w.cloud.list_gpu_instances())
    would = w.store.action_rows(kinds=[ActionKind.STOP])
    assert len(would) == 2 and all(a.dry_run and a.reason.startswith("dry-run: would stop") for a in would)
    # one warning and one would-stop message each: continuously idle after the would-stop,
    # no second warning or stop in the same idle episode
    assert sum("would be stopped" in line for line in w.lines) == 2
    assert sum("Would stop" in line and "NOT stopped" in line for line in w.lines) == 2
    assert all("DRY-RUN" in line for line in w.lines)


def test_restart_mid_way_repeats_no_stop_and_no_message(tmp_path):
    w = World(tmp_path)
    w.tick()  # marked + warned
    n_lines = len(w.lines)
    w.open_store()  # service restarts
    for _ in range(5):
        w.tick()
    assert not any("will be stopped" in line for line in w.lines[n_lines:] + w.lines)
    for _ in range(15):
        w.tick()
    assert w.cloud.calls.count(("stop", "i-00")) == 1
    w.open_store()
    for _ in range(5):
        w.tick()
    assert w.cloud.calls.count(("stop", "i-00")) == 1


def test_crash_between_stop_and_record_is_reconciled_once(tmp_path):
    w = World(tmp_path)
    inst = w.cloud.get("i-00")
    # The previous process wrote its intent, the stop went through, then it died.
    aid = w.store.begin_action("r1", "i-00", ActionKind.STOP, RULE.name, False, "idle", T0)
    w.store.put_mark(MarkRow("i-00", RULE.name, T0 - timedelta(minutes=20), T0 - timedelta(minutes=5), "idle", False,
                             warned_at=T0 - timedelta(minutes=20)))
    w.cloud.stop(inst)
    notes = Actuator(w.cloud, w.store, w.notifier, w.settings).reconcile(T0)
    assert notes and w.store.action_rows(status="pending") == []
    assert [a.status for a in w.store.action_rows(kinds=[ActionKind.STOP])] == ["done"]
    assert w.store.get_mark("i-00") is None
    assert w.cloud.calls.count(("stop", "i-00")) == 1
    # an intent whose stop is not seen done stays open while the request may still be in flight ...
    aid2 = w.store.begin_action("r2", "i-00", ActionKind.STOP, RULE.name, False, "idle", T0)
    w.cloud.start("i-00")
    Actuator(w.cloud, w.store, w.notifier, w.settings).reconcile(T0 + timedelta(seconds=30))
    rows = {a.id: a for a in w.store.action_rows()}
    assert rows[aid].status == "done" and rows[aid2].status == "pending"
    # ... and is marked failed, not assumed done, once no request can be in flight any more
    Actuator(w.cloud, w.store, w.notifier, w.settings).reconcile(T0 + timedelta(seconds=121))
    rows = {a.id: a for a in w.store.action_rows()}
    assert rows[aid].status == "done" and rows[aid2].status == "failed"


def test_restarted_instance_is_left_alone_for_a_full_window(tmp_path):
    w = World(tmp_path)
    for _ in range(16):
        w.tick()
    assert w.cloud.get("i-00").state == "stopped"
    w.cloud.start("i-00")  # a person starts it again; EC2 resets launch_time
    for _ in range(9):
        r = w.tick()
        assert r.actions == [] and r.decisions[0].code == ReasonCode.TOO_YOUNG
    r = w.tick()
    r = w.tick()
    assert w.kinds(r) == [("i-00", ActionKind.MARK)]


def test_cloud_error_on_stop_is_recorded_and_does_not_block_others(tmp_path):
    w = World(tmp_path, n=2)

    class Unauthorized(RuntimeError):
        definite = True  # a 4xx: EC2 certainly did nothing (as CloudError says)

    def boom(inst):
        if inst.instance_id == "i-00":
            raise Unauthorized("UnauthorizedOperation")
        SimCloud.stop(w.cloud, inst)

    w.cloud.stop = boom
    for _ in range(16):
        w.tick()
    failed = w.store.action_rows(status="failed")
    assert [a.instance_id for a in failed] == ["i-00"] and "Unauthorized" in failed[0].error
    assert w.cloud.get("i-01").state == "stopped"


D_IDLE = Decision("i-1", "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", T0, action=Action.STOP)
D_BUSY = Decision("i-1", "r", Verdict.ACTIVE, ReasonCode.BUSY, "busy", T0, action=Action.STOP)
D_UNK = Decision("i-1", "r", Verdict.UNKNOWN, ReasonCode.QUERY_ERROR, "down", T0, action=Action.STOP)
MARK = MarkRow("i-1", "r", T0 - timedelta(minutes=20), T0 - timedelta(minutes=5), "idle", False,
               warned_at=T0 - timedelta(minutes=20))
MARK_LATER = MarkRow("i-1", "r", T0, T0 + timedelta(minutes=15), "idle", False, warned_at=T0)
# Marked 20 minutes ago, but the warning never reached anyone.
MARK_UNDELIVERED = MarkRow("i-1", "r", T0 - timedelta(minutes=20), T0 - timedelta(minutes=5), "idle", False)
INST = GpuInstance("i-1", "g5.xlarge", "us-east-1", "running", T0 - timedelta(days=1), tags={TAG_MARKED: "x"})


@pytest.mark.parametrize("decision,mark,state,kind", [
    (D_IDLE, None, None, ActionKind.MARK),
    (D_IDLE, MARK_LATER, None, None),
    (D_IDLE, MARK, None, ActionKind.STOP),
    (D_BUSY, MARK, None, ActionKind.UNMARK),
    (D_UNK, MARK, None, None),
    (D_UNK, None, None, None),
    (None, MARK, None, ActionKind.UNMARK),
    (D_IDLE, None, StateRow("i-1", "r", Verdict.IDLE, T0 - timedelta(hours=1), T0, T0 - timedelta(minutes=30), False),
     None),
    # a would-stop in dry-run does not block the first real mark after dry-run is switched off
    (D_IDLE, None, StateRow("i-1", "r", Verdict.IDLE, T0 - timedelta(hours=1), T0, T0 - timedelta(minutes=30), True),
     ActionKind.MARK),
    # a warning sent in dry-run is not a real warning: carried over as a real mark, a fresh full lead (issue 26)
    (D_IDLE, MarkRow("i-1", "r", T0 - timedelta(minutes=20), T0 - timedelta(minutes=5), "idle", True), None,
     ActionKind.MARK),
    # ... unless it is no longer idle: then it is cancelled as any mark
    (D_BUSY, MarkRow("i-1", "r", T0 - timedelta(minutes=20), T0 - timedelta(minutes=5), "idle", True), None,
     ActionKind.UNMARK),
])
def test_plan_table(decision, mark, state, kind):
    intent = plan(INST, decision, mark, state, T0, dry_run=False)
    assert isinstance(intent, Intent) and intent.kind == kind and intent.reason


def test_plan_a_metrics_gap_since_the_mark_means_a_new_warning_and_a_node_cordoned_by_others_is_left():
    """Issue 35: a mark whose instance lost metrics under any rule since is renewed, never stopped on; a marked
    GPU node someone else cordoned has its mark withdrawn (and an unmarked one is left alone)."""
    renewed = plan(INST, D_IDLE, MARK, None, T0, dry_run=False, metrics_missing_since_mark=True)
    assert renewed.kind == ActionKind.UNMARK and "warning again" in renewed.reason
    node = GpuInstance("k8s:node/gpu-1", "g5.xlarge", "us-east-1", "cordoned", T0 - timedelta(days=1),
                       tags={TAG_MARKED: "x"}, provider="kubernetes")
    node_mark = MarkRow(node.instance_id, "r", MARK.marked_at, MARK.stop_at, "idle", False, warned_at=MARK.warned_at)
    withdrawn = plan(node, D_IDLE, node_mark, None, T0, dry_run=False)
    assert withdrawn.kind == ActionKind.UNMARK and "cordoned by someone else" in withdrawn.reason
    assert plan(node, D_IDLE, None, None, T0, dry_run=False).kind is None  # never marked: theirs


def test_two_phase_stop_and_restart_on_postgres(tmp_path, fresh_postgres_db):
    w = World(tmp_path, url=fresh_postgres_db)
    w.tick()
    w.open_store()  # restart against the shared database
    for _ in range(15):
        w.tick()
    assert w.cloud.calls.count(("stop", "i-00")) == 1
    assert sum("will be stopped" in line for line in w.lines) == 0  # the warning was sent before the restart
    assert [a.status for a in w.store.action_rows(kinds=[ActionKind.STOP])] == ["done"]


def test_switching_dry_run_off_warns_for_real_before_stopping(tmp_path):
    w = World(tmp_path, dry_run=True)
    for _ in range(20):  # warned and "would stop" in dry-run, still idle
        w.tick()
    assert w.cloud.calls == []
    w.dry_run = False
    w.settings = load_settings(act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 1.0})
    r = w.tick()
    assert w.kinds(r) == [("i-00", ActionKind.MARK)]  # a real warning first, not an immediate stop
    assert TAG_MARKED in w.cloud.get("i-00").tags
    for _ in range(14):
        assert not [a for a in w.tick().actions if a.kind == ActionKind.STOP]
    w.tick()
    assert w.cloud.get("i-00").state == "stopped"


def test_a_dry_run_mark_is_carried_over_as_one_real_warning_when_dry_run_is_switched_off(tmp_path):
    """Issue 26 item 5: no "Stop cancelled ... dry-run is now False" then a new warning: the dry-run mark becomes a
    real one (the tag written through the chokepoint, its intent row first) and ONE real warning goes out, with a
    fresh full lead counted from its delivery."""
    w = World(tmp_path, dry_run=True)
    w.tick()  # dry-run mark
    assert len(w.lines) == 1 and "would be stopped" in w.lines[0] and TAG_MARKED not in w.cloud.get("i-00").tags
    w.clock.advance(5 * 60)  # five minutes into the dry-run lead
    w.dry_run = False
    w.settings = load_settings(act={"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 1.0})
    switched_at = w.clock.now
    assert w.kinds(w.tick()) == [("i-00", ActionKind.MARK)]
    new = w.lines[1:]
    assert len(new) == 1, new  # one message: the real warning, no cancel in between
    assert "will be stopped" in new[0] and "cancel" not in new[0].lower()
    assert TAG_MARKED in w.cloud.get("i-00").tags
    live = [(a.kind, a.status) for a in w.store.action_rows() if not a.dry_run]
    assert live == [(ActionKind.MARK, "done")]  # no UNMARK: the dry-run mark was carried over
    mark = w.store.get_mark("i-00")
    assert not mark.dry_run and mark.stop_at == switched_at + timedelta(seconds=RULE.warning_lead_s)
    for _ in range(14):
        w.tick()
    assert w.cloud.get("i-00").state == "running"  # the real warning's full 15 minutes have not passed
    w.tick()
    assert w.cloud.get("i-00").state == "stopped"
    assert sum("cancel" in line.lower() for line in w.lines) == 0


def test_switching_to_dry_run_withdraws_a_live_mark(tmp_path):
    """The other way round is unchanged: a real mark while dry-run is switched on is withdrawn (tag removed,
    "stop cancelled" under its warning); dry-run then marks anew, and nothing is ever stopped."""
    w = World(tmp_path)
    w.tick()
    assert TAG_MARKED in w.cloud.get("i-00").tags
    w.dry_run = True
    w.settings = load_settings(act={"dry_run": True, "max_stops_per_run": 5, "max_stops_fraction": 1.0})
    assert w.kinds(w.tick()) == [("i-00", ActionKind.UNMARK)]
    assert w.store.get_mark("i-00") is None and "cancelled" in w.lines[-1].lower()
    # Dry-run makes no cloud call, so the tag stays on the instance until gpufinops is live again (it then marks
    # anew and rewrites it); nothing is stopped meanwhile.
    assert TAG_MARKED in w.cloud.get("i-00").tags and [c for c in w.cloud.calls if c[0] != "set_tags"] == []
    for _ in range(30):
        w.tick()
    assert w.cloud.get("i-00").state == "running" and ("stop", "i-00") not in w.cloud.calls


def test_a_stale_warning_after_missing_data_is_renewed_not_acted_on(tmp_path):
    w = World(tmp_path)
    w.tick()  # marked, stop due in 15 min
    w.metrics.mode["i-00"] = "error"
    for _ in range(60):  # an hour without data: the stop time passes
        w.tick()
    w.metrics.mode["i-00"] = "idle"
    r = w.tick()
    assert w.kinds(r) == [("i-00", ActionKind.UNMARK)] and "warning again" in r.actions[0].reason
    r = w.tick()
    assert w.kinds(r) == [("i-00", ActionKind.MARK)]
    assert w.cloud.get("i-00").state == "running"
    for _ in range(16):
        w.tick()
    assert w.cloud.get("i-00").state == "stopped"


class OneWindowMissing(ScriptedMetrics):
    """Usage as scripted, except that windows of `missing_window_s` get no usable data while `gap` is on: one
    rule of the instance loses its metrics while another rule's verdict never breaks."""

    def __init__(self, missing_window_s: int):
        super().__init__()
        self.missing_window_s, self.gap = missing_window_s, False

    def window_usage(self, instances, window_s, now):
        if self.gap and window_s == self.missing_window_s:
            return {i.instance_id: InstanceUsage(i.instance_id, window_s, 20, error="timeout") for i in instances}
        return super().window_usage(instances, window_s, now)


def test_a_metrics_gap_under_another_rule_holds_the_stop_until_a_new_warning_as_the_alert_says(tmp_path):
    """Issue 35 (the demo's i-demo0008): warned under one rule, then another rule of the same instance has no
    usable metrics. The alert must not say "none of them is marked"; it says the stop is held and comes only after
    a new warning once metrics return, and the code does exactly that: warning, alert, cancel + new warning, then
    the stop after the new warning's full lead (never on the old warning)."""
    other = Rule(name="zero-20min", threshold_pct=5, window_s=1200, action=Action.NOTIFY)
    w = World(tmp_path)
    w.metrics = OneWindowMissing(other.window_s)
    rules = (RULE, other)
    w.tick(rules=rules)  # marked under idle40; the stop announced for +15 min
    assert TAG_MARKED in w.cloud.get("i-00").tags
    w.metrics.gap = True
    for _ in range(4):
        w.tick(rules=rules)
    w.metrics.gap = False
    stopped_at = None
    for minute in range(5, 60):
        w.tick(rules=rules)
        if stopped_at is None and w.cloud.get("i-00").state == "stopped":
            stopped_at = minute
    said = [line.split("] ", 1)[-1] for line in w.lines if "i-00" in line]  # "  [slack #channel] text"
    kinds = [("warning" if "will be stopped" in line else "alert" if line.startswith("No usable GPU metrics") else
              "cancelled" if line.startswith("Stop cancelled") else "stopped" if line.startswith("Stopped") else
              line[:30]) for line in said]
    assert kinds == ["warning", "alert", "cancelled", "warning", "stopped"], said
    [alert] = [line for line in said if line.startswith("No usable GPU metrics")]
    assert "none of them is marked" not in alert
    assert ("i-00 was already marked for a stop: its stop is held, and once metrics return a stop comes only after "
            "a new warning with a full lead.") in alert
    # Not at the first warning's time (+15 min): a full lead after the new warning, sent once data was back (+5).
    assert stopped_at is not None and stopped_at >= 5 + 15
    assert len([c for c in w.cloud.calls if c[0] == "stop"]) == 1


def test_an_instance_restarted_by_hand_while_marked_gets_a_fresh_warning(tmp_path):
    w = World(tmp_path)
    w.tick()  # marked
    w.cloud.stop(w.cloud.get("i-00"))  # a person stops it, and days later starts it again
    for _ in range(5):
        w.tick()
    w.clock.advance(3 * 86400)
    w.cloud.start("i-00")
    for _ in range(11):  # too young for 10 min, then idle: the old mark is not acted on
        r = w.tick()
        assert not [a for a in r.actions if a.kind == ActionKind.STOP]
    assert w.store.get_mark("i-00") is None or w.store.get_mark("i-00").marked_at > T0 + timedelta(days=3)


def test_the_warning_and_the_stop_notice_say_how_long_it_has_really_been_idle(tmp_path):
    w = World(tmp_path)
    w.tick()  # first IDLE tick: idle for the rule's 10-min window already
    for _ in range(16):
        w.tick()
    warning, stopped = [m for m in w.notifier.sent if m.key.startswith(("warn:", "stop:"))]
    # What the notice says (every delivery renders its facts).
    assert "10 min (since" in dict(warning.facts)["Idle for"]
    assert "25 min (since" in dict(stopped.facts)["Idle for"]  # the 10-min window + the 15-min lead


def test_a_restart_between_the_plan_and_the_stop_wins(tmp_path):
    # A person stops and starts the instance in the seconds between the run's listing and its StopInstances:
    # the mark tag survives a stop/start, so only the re-read (launch time) can tell. Nothing is stopped.
    w = World(tmp_path)
    for _ in range(15):
        w.tick()
    real_describe = w.cloud.describe

    def restarted_first(ids):
        w.cloud.stop(w.cloud.get("i-00"))
        w.cloud.start("i-00")  # SimCloud, like EC2: a new launch time
        w.cloud.describe = real_describe
        return real_describe(ids)

    w.cloud.describe = restarted_first
    r = w.tick()
    assert [(a.kind, a.reason.split(":")[0]) for a in r.actions] == [(ActionKind.SKIP, "not stopped")]
    assert "restarted" in r.actions[0].reason
    assert w.cloud.get("i-00").state == "running" and w.cloud.calls.count(("stop", "i-00")) == 1  # the person's


def test_an_instance_not_opted_in_gets_one_notice_saying_so_once_and_never_a_stop_warning(tmp_path):
    from gpufinops.notify.slack_blocks import render

    w = World(tmp_path)
    w.cloud.get("i-00").tags.pop(OPT_IN)
    assert w.kinds(w.tick()) == [("i-00", ActionKind.NOTIFY)]
    for _ in range(30):  # one notice per idle episode: nothing more, no mark, no stop
        assert w.tick().actions == []
    assert w.cloud.get("i-00").state == "running" and TAG_MARKED not in w.cloud.get("i-00").tags
    (notice,) = w.notifier.sent
    text, blocks = render(notice)
    shown = "\n".join(str(b) for b in blocks)
    for seen in (text, shown):
        assert seen.count("not opted in") == 1, seen  # one clear sentence, once
        assert "would be stopped" not in seen and seen.count("will be stopped") == seen.count("Nothing will be stopped")
        assert "Nothing will be stopped: not opted in: gpufinops stops only instances tagged " \
               "gpufinops:allow-stop=true" in seen
