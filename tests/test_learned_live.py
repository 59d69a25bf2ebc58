"""The learned idle policy in the live service (gpufinops/learned.py), against a real backfilled Prometheus.

Rules opt in with a `learned:` block; until `Rule.learned` is wired into model.py these tests carry the block
on a Rule subclass with the same field, which is all `apply_learned` reads.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from functools import partial

import numpy as np
import pytest
from pydantic import ValidationError

from gpufinops.backtest import adaptive
from gpufinops.collect.prometheus import PrometheusMetrics
from gpufinops.config import PrometheusSettings
from gpufinops.evaluate import evaluate, evaluate_all
from gpufinops.learned import (
    DEMAND_STEP,
    IDLE_STEP,
    UNKNOWN_STEP,
    IdleHistory,
    LearnedParams,
    Stretches,
    apply_learned,
    decide_learned,
    step_states,
    stretches,
)
from gpufinops.model import (
    Action,
    Decision,
    GpuInstance,
    GpuWindowStats,
    InstanceUsage,
    ReasonCode,
    Rule,
    Verdict,
)
from tests.promserver import Series, dcgm_labels, start_prometheus

MIN = 60
# Hours in the past, so that "the future" (after NOW) is also stored and a peek would show.
NOW_S = int(time.time()) // 3600 * 3600 - 6 * 3600
NOW = datetime.fromtimestamp(NOW_S, UTC)
T_A = NOW_S - 15 * 86400  # first sample of the long series (minute samples from T_A + 1 min)
SENTINEL = 9.223372036854775e18
SERVE_DNS = "ip-10-0-0-7.ec2.internal"


@dataclass(frozen=True)
class LearnedRule(Rule):
    """A Rule with the `learned` field that the wiring adds to model.Rule."""

    learned: LearnedParams | None = None


FIXED = Rule("idle-5pct-10m", threshold_pct=5.0, window_s=600, warning_lead_s=900, action=Action.STOP)
LEARNED = LearnedRule("learned-5pct-10m", threshold_pct=5.0, window_s=600, warning_lead_s=900, action=Action.STOP,
                      learned=LearnedParams())


def minutes(t_from: int, t_to: int) -> np.ndarray:
    """Sample times every minute in (t_from, t_to]."""
    return np.arange(t_from + MIN, t_to + 1, MIN)


def night_values(t: np.ndarray, gpu: int) -> np.ndarray:
    """Busy days, a 10 h idle night starting 30 min before NOW every day, a 10 min lull at midday.

    Tonight's stretch ends 40 min after NOW (stored, so reading past NOW would show it)."""
    idle = (t > NOW_S - 30 * MIN) & (t <= NOW_S + 40 * MIN)
    for d in range(1, 16):
        night = NOW_S - 30 * MIN - d * 86400
        idle |= (t > night) & (t <= night + 600 * MIN)
        idle |= (t > night + 14 * 3600) & (t <= night + 14 * 3600 + 10 * MIN)
    return np.where(idle, 0.0, 70.0 - 10 * gpu)


def serve_values(t: np.ndarray) -> np.ndarray:
    """Serving: 20 min bursts, lulls of 15 to 45 min; the current lull began 20 min before NOW."""
    out = np.empty(len(t))
    k, lulls, i = 0, (15, 25, 40, 45), 0
    while k < len(t):
        out[k:k + 20] = 35.0
        k += 20
        out[k:k + lulls[i % 4]] = 0.0
        k += lulls[i % 4]
        i += 1
    out[(t > NOW_S - 60 * MIN) & (t <= NOW_S - 20 * MIN)] = 35.0
    out[(t > NOW_S - 20 * MIN) & (t <= NOW_S + 10 * MIN)] = 0.0
    out[t > NOW_S + 10 * MIN] = 35.0
    return out


def segments(*parts: tuple[int, float]) -> np.ndarray:
    return np.concatenate([np.full(n, v) for n, v in parts])


H0 = NOW_S - 360 * MIN  # the hand-made history: minutes 1..360 before NOW
HAND = segments((60, 50.0), (120, 0.0), (30, 50.0), (25, 1.0), (10, 50.0), (10, SENTINEL), (60, 0.0), (20, 50.0),
                (25, 0.0))
MIG_START = NOW_S - 120 * MIN
MIG_SLICE_2 = segments((30, 0.5), (60, 0.04), (30, 0.06))  # 0.04 = 4% (idle), 0.06 = 6% (demand)


def series() -> list[Series]:
    out = []
    t = minutes(T_A, NOW_S + 2 * 3600)
    for gpu in (0, 1):
        out.append(Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels("ip-10-0-0-5", gpu, instance_id="i-night"),
                          list(zip(t.tolist(), night_values(t, gpu).tolist()))))
    out.append(Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels(SERVE_DNS, 0, hostname_label="hostname"),
                      list(zip(t.tolist(), serve_values(t).tolist()))))
    th = minutes(H0, NOW_S)
    out.append(Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels("ip-10-0-0-9", 0, instance_id="i-hand"),
                      list(zip(th.tolist(), HAND.tolist()))))
    tm = minutes(MIG_START, NOW_S)
    for slice_id, values in (("1", np.full(120, 0.04)), ("2", MIG_SLICE_2)):
        out.append(Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                          dcgm_labels("ip-10-0-0-11", 0, instance_id="i-mig", GPU_I_ID=slice_id,
                                      GPU_I_PROFILE="3g.40gb"),
                          list(zip(tm.tolist(), values.tolist()))))
    tf = np.arange(NOW_S - 2 * 86400 + 300, NOW_S + 1, 300)
    for f in range(40):
        out.append(Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels(f"ip-10-1-0-{f}", 0, instance_id=f"f-{f:02d}"),
                          [(float(x), 50.0) for x in tf]))
    return out


def gpu_instance(iid: str, gpus: int = 1, dns: str = "", launched_days: float = 30) -> GpuInstance:
    return GpuInstance(iid, "g5.12xlarge", "us-east-1", "running", NOW - timedelta(days=launched_days),
                       private_dns=dns, gpu_count=gpus)


MAIN = [gpu_instance("i-night", 2), gpu_instance("i-serve", dns=SERVE_DNS), gpu_instance("i-hand"),
        gpu_instance("i-mig")]
FILLERS = [gpu_instance(f"f-{f:02d}") for f in range(40)]


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    server = start_prometheus(tmp_path_factory.mktemp("prom-learned"), series())
    yield PrometheusSettings(url=server.url, scrape_interval_s=60, timeout_s=20)
    server.stop()


@pytest.fixture(scope="module")
def history(prom):
    h = IdleHistory(prom)
    h.refresh([FIXED, LEARNED], NOW)
    assert not h.errors
    return h


def fixed_decisions(prom, rules, at=NOW, instances=MAIN):
    usage = {600: PrometheusMetrics(prom).window_usage(instances, 600, at)}
    return evaluate_all(instances, usage, rules, at)


# --------------------------------------------------------------------------- history from Prometheus


@pytest.mark.integration
def test_a_fixed_number_of_range_queries_whatever_the_fleet(prom, history):
    assert history.queries_made == 1  # 14 days at 5 min = 4,033 steps: one chunk
    small = history.view(LEARNED.learned, MAIN[:2])
    large = history.view(LEARNED.learned, MAIN[:2] + FILLERS)
    assert set(small.rows_by_instance) == {"i-night", "i-serve"}
    assert set(large.rows_by_instance) == {"i-night", "i-serve", *(f.instance_id for f in FILLERS)}
    for f in FILLERS:  # busy for their two days: history, and no idle stretch
        st = large.instance(f.instance_id)
        assert st is not None and st.completed_s == () and st.open_since is None
    # Chunked under the points limit: same history, more queries, still independent of the fleet.
    chunked = IdleHistory(prom, max_points=1000)
    chunked.refresh([LEARNED], NOW)
    assert chunked.queries_made == 5
    a, b = history._grids, chunked._grids
    (ga,), (gb,) = a.values(), b.values()
    assert ga.t0 == gb.t0 and ga.n == gb.n == 4033
    for key in ga.keys:
        np.testing.assert_array_equal(ga.data[ga.index[key]], gb.data[gb.index[key]])
    # Between full refreshes, one query for the steps completed since the last call.
    chunked.refresh([LEARNED], NOW + timedelta(minutes=10))
    assert chunked.queries_made == 6
    chunked.refresh([LEARNED], NOW + timedelta(minutes=11))  # no new complete step: no query
    assert chunked.queries_made == 6


@pytest.mark.integration
def test_stretches_of_a_hand_made_history(history):
    view = history.view(LEARNED.learned, MAIN)
    hand = view.instance("i-hand")
    # busy 60, idle 120, busy 30, idle 25 (at 1%), busy 10, sentinels 10, idle 60, busy 20, idle 25 (now)
    assert hand.completed_s == (7200.0, 1500.0)
    assert hand.censored_s == (3600.0, 1500.0)  # after a gap (a lower bound), and the open one
    assert hand.open_since == NOW_S - 25 * MIN and hand.open_exact and hand.end_t == NOW_S
    # MIG: GR_ENGINE_ACTIVE x 100; 4% is idle, 6% is demand; the busy slice decides for the instance.
    mig = view.instance("i-mig")
    assert mig.completed_s == (3600.0,) and mig.open_since is None
    night = view.instance("i-night")
    assert sorted(night.completed_s) == [600.0] * 14 + [36000.0] * 13  # midday lulls, nights
    assert night.open_since == NOW_S - 30 * MIN
    serve = view.instance("i-serve")  # matched by its hostname label to the private DNS name
    assert set(serve.completed_s) == {900.0, 1500.0, 2400.0, 2700.0}
    assert serve.open_since == NOW_S - 20 * MIN


@pytest.mark.integration
def test_history_ends_at_now(prom, history):
    # Tonight's stretch ends 40 min after NOW; the data is stored but is not read before its time.
    night = history.view(LEARNED.learned, MAIN).instance("i-night")
    assert night.end_t <= NOW_S and 4200.0 not in night.completed_s and night.open_since is not None
    later = NOW + timedelta(minutes=45)
    fresh = IdleHistory(prom)
    fresh.refresh([LEARNED], later)
    seen = fresh.view(LEARNED.learned, MAIN).instance("i-night")
    assert 4200.0 in seen.completed_s and seen.open_since is None
    # Appending the steps since the last read gives the same history as reading it all again.
    tail = IdleHistory(prom)
    tail.refresh([LEARNED], NOW)
    tail.refresh([LEARNED], later)
    assert tail.queries_made == 2
    for inst in MAIN:
        assert tail.view(LEARNED.learned, MAIN).instance(inst.instance_id).completed_s[-10:] == \
            fresh.view(LEARNED.learned, MAIN).instance(inst.instance_id).completed_s[-10:]


# --------------------------------------------------------------------------- live decisions


@pytest.mark.integration
def test_bursty_serving_is_held_back_and_a_long_idle_night_let_through(prom, history):
    fixed = fixed_decisions(prom, [FIXED, LEARNED])
    by = {(d.instance_id, d.rule_name): d for d in fixed}
    for iid in ("i-serve", "i-night"):
        assert by[(iid, LEARNED.name)].verdict == Verdict.IDLE  # the fixed rule alone would stop both
    out = {(d.instance_id, d.rule_name): d for d in apply_learned(fixed, MAIN, [FIXED, LEARNED], history, NOW)}
    serve = out[("i-serve", LEARNED.name)]
    assert serve.verdict == Verdict.UNDERUTILIZED and serve.code == ReasonCode.LEARNED_WAIT
    assert serve.reason.startswith("idle 20 min; 0% of this instance's ")
    # Only the lulls begun within 3 h of this one's time of day weigh fully, and the reason says which.
    assert re.search(r"past idle stretches longer than 35 min \(begun \d\d:\d\d-\d\d:\d\d UTC\) lasted over 65 min "
                     r"\(fleet: ", serve.reason), serve.reason
    assert serve.reason.endswith("waiting: a later stop is worth more (a false stop counts 2 GPU-h)")
    night = out[("i-night", LEARNED.name)]
    assert night.verdict == Verdict.IDLE and night.code == ReasonCode.LEARNED_IDLE
    assert re.match(r"idle 30 min; 100% of this instance's 13 past idle stretches longer than 45 min "
                    r"\(begun \S+ UTC\) lasted over 75 min \(fleet: ", night.reason), night.reason
    assert night.reason.endswith("stopping now is worth more than waiting")
    # The rule without a learned block is untouched, decision for decision.
    assert [d for d in out.values() if d.rule_name == FIXED.name] == [d for d in fixed if d.rule_name == FIXED.name]


@pytest.mark.integration
def test_prometheus_down_leaves_the_fixed_rule_deciding(prom):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = IdleHistory(PrometheusSettings(url=f"http://127.0.0.1:{port}", timeout_s=2))
    down.refresh([LEARNED], NOW)
    assert list(down.errors.values()) == [f"prometheus at 127.0.0.1:{port}: cannot connect"]  # as the collector names it
    fixed = fixed_decisions(prom, [LEARNED])
    assert any(d.verdict == Verdict.IDLE for d in fixed)
    assert apply_learned(fixed, MAIN, [LEARNED], down, NOW) == fixed


@pytest.mark.integration
def test_unknown_underutilized_and_active_never_become_idle(prom, history):
    young = [gpu_instance("i-night", 2, launched_days=0.003)]  # 4 min old: too young for a 10 min window
    base = fixed_decisions(prom, [LEARNED], instances=young)[0]
    assert base.verdict == Verdict.UNKNOWN
    view = history.view(LEARNED.learned, MAIN)
    night, prior = view.instance("i-night"), view.prior(LEARNED.warning_lead_s)
    assert decide_learned(base, LEARNED, night, prior, LEARNED.learned, NOW) == base
    idle = next(d for d in fixed_decisions(prom, [LEARNED]) if d.instance_id == "i-night")
    for verdict, code in ((Verdict.UNKNOWN, ReasonCode.LOW_COVERAGE), (Verdict.UNDERUTILIZED, ReasonCode.LOW_STEADY),
                          (Verdict.ACTIVE, ReasonCode.BUSY)):
        other = replace(idle, verdict=verdict, code=code)  # all-idle evidence, e.g. a memory veto: still not IDLE
        assert decide_learned(other, LEARNED, night, prior, LEARNED.learned, NOW) == other
        assert apply_learned([other], MAIN, [LEARNED], history, NOW) == [other]


# --------------------------------------------------------------------------- pure parts


def _base(activity_max: float | None = 0.0, window_s: int = 600) -> Decision:
    inst = gpu_instance("i-1")
    usage = InstanceUsage("i-1", window_s, window_s // 60,
                          (GpuWindowStats("0", window_s // 60, activity_max=activity_max, activity_mean=activity_max),))
    rule = replace(LEARNED, window_s=window_s, threshold_pct=40.0)
    return evaluate(inst, usage, rule, NOW)


def test_step_states_and_stretches():
    act = np.array([50, 0, 0, np.nan, 0, 50, 0, 0, 50, 3, SENTINEL, 0])
    gpus = np.array([2, 2, 2, 0, 2, 2, 2, 1, 2, 2, 2, 2])
    st = step_states(act, gpus, 5.0)
    U, I, D = UNKNOWN_STEP, IDLE_STEP, DEMAND_STEP
    assert st.tolist() == [D, I, I, U, I, D, I, U, D, I, U, I]  # a missing GPU makes a step unknown
    s = stretches(np.array([D, I, I, D, I, U, I, D, I, I]), t0=1000.0, step_s=300.0)
    assert s == Stretches(completed_s=(600.0,), censored_s=(300.0, 300.0, 600.0), open_since=1000.0 + 7 * 300.0,
                          open_exact=True, end_t=1000.0 + 9 * 300.0,
                          # a stretch begins where the step before it ends (or at its earliest known idle step)
                          completed_start_t=(1000.0,), censored_start_t=(1900.0, 2500.0, 3100.0))


def test_demand_in_the_window_holds_an_idle_of_a_looser_rule_back():
    base = _base(activity_max=30.0)  # under the rule's 40%, over the 5% demand level
    assert base.verdict == Verdict.IDLE
    hist = Stretches((36000.0,) * 13, (), NOW_S - 3600.0, True, NOW_S)
    d = decide_learned(base, LEARNED, hist, adaptive.EMPTY_PRIOR, LEARNED.learned, NOW)
    assert d.verdict == Verdict.UNDERUTILIZED and d.code == ReasonCode.LEARNED_WAIT
    assert d.reason == ("activity up to 30% in the last 10 min, over the 5% demand level: no idle stretch yet; "
                        "learned policy waits")


def test_an_idle_stretch_the_history_does_not_reach_counts_as_the_window_only():
    hist = Stretches((36000.0,) * 13, (), None, False, NOW_S - 7200.0)  # history two hours old, no open stretch
    d = decide_learned(_base(window_s=1800), LEARNED, hist, adaptive.EMPTY_PRIOR, LEARNED.learned, NOW)
    assert d.code == ReasonCode.LEARNED_IDLE
    assert d.reason.startswith("idle at least 30 min; 100% of this instance's 13 past idle stretches")


def test_once_idle_the_policy_holds_until_demand_returns():
    """adaptive.decide() alone flips IDLE -> wait -> IDLE along one lull; the live policy keeps the first IDLE."""
    params = LearnedParams(fleet_prior=0)
    rule = replace(LEARNED, learned=params)
    past = (8 * 3600.0,) * 10 + (50 * 60.0,) * 10
    base = _base()
    at5 = adaptive.decide(base, list(past), 5 * 60, rule, params.adaptive(), 1800, NOW)
    at20 = adaptive.decide(base, list(past), 20 * 60, rule, params.adaptive(), 1800, NOW)
    assert (at5.verdict, at20.verdict) == (Verdict.IDLE, Verdict.UNDERUTILIZED)
    hist = Stretches(past, (), NOW_S - 20 * 60.0, True, NOW_S)
    d = decide_learned(replace(base, window_s=600), rule, hist, adaptive.EMPTY_PRIOR, params, NOW)
    assert d.verdict == Verdict.IDLE and d.code == ReasonCode.LEARNED_IDLE
    assert d.reason.startswith("idle 20 min; stop decided at 5 min idle, until demand returns: 100% of this "
                               "instance's 20 past idle stretches longer than 20 min lasted over 50 min")


def test_params_validate_with_the_key_named():
    p = LearnedParams.model_validate({"history_days": 7, "step": "1m", "refresh": "30m", "break_even": "1h",
                                      "false_stop_cost_h": 4})
    assert (p.step_s, p.refresh_s, p.break_even_s, p.adaptive().false_stop_cost_h) == (60, 1800, 3600, 4.0)
    with pytest.raises(ValidationError) as err:
        LearnedParams.model_validate({"step": "5 minutes"})
    assert err.value.errors()[0]["loc"] == ("step",)
    with pytest.raises(ValidationError, match="refresh .* must be at least one step"):
        LearnedParams.model_validate({"step": "10m", "refresh": "5m"})
    with pytest.raises(ValidationError) as err:
        LearnedParams.model_validate({"fleet": 3})
    assert err.value.errors()[0]["loc"] == ("fleet",)
    trusting = LearnedParams.model_validate({"trust_wait": "1h", "trust_margin_h": 0.5})
    assert (trusting.adaptive().trust_wait_s, trusting.adaptive().trust_margin_h) == (3600.0, 0.5)
    assert LearnedParams().adaptive().trust_wait_s is None  # off unless asked for
    with pytest.raises(ValidationError) as err:
        LearnedParams.model_validate({"trust_wait": "1h", "trust_margin_h": -1})
    assert err.value.errors()[0]["loc"] == ("trust_margin_h",)


# --------------------------------------------------------------------------- once wired (skipped before)

WIRED = "learned" in {f.name for f in fields(Rule)}
needs_wiring = pytest.mark.skipif(not WIRED, reason="Rule.learned, the rules.py `learned:` block and "
                                  "Peers.learned are not wired in yet (see docs/backtest.md)")

RULE_FILE = """\
rules:
  - name: learned-5pct-10m
    threshold_pct: 5
    window: 10m
    warning_lead: 15m
    action: stop
    learned:
      history_days: 14
      step: 5m
      false_stop_cost_h: 2
"""


@needs_wiring
def test_rule_files_carry_a_learned_block(tmp_path):
    from gpufinops.config import ConfigError
    from gpufinops.rules import load_rules

    path = tmp_path / "learned.yaml"
    path.write_text(RULE_FILE)
    (rule,) = load_rules([path])
    assert rule.learned == LearnedParams(step="5m")
    path.write_text(RULE_FILE.replace("step: 5m", "step: 5 minutes"))
    with pytest.raises(ConfigError, match=rf"{path}:9: key 'rules.0.learned.step': .*expected a duration"):
        load_rules([path])
    path.write_text(RULE_FILE.replace("step: 5m", "refresh: 1m\n      step: 5m"))
    with pytest.raises(ConfigError, match=rf"{path}:7: key 'rules.0.learned': .*refresh \(60s\) must be at least"):
        load_rules([path])


@needs_wiring
@pytest.mark.integration
def test_run_once_applies_the_learned_policy(prom, tmp_path):
    from gpufinops.config import Settings
    from gpufinops.model import RunContext
    from gpufinops.pipeline import Peers, run_once
    from gpufinops.rules import load_rules
    from gpufinops.store import Store

    class Inventory:  # the inventory only: act=False never calls the cloud's other methods
        last_errors = ()

        def list_gpu_instances(self):
            return MAIN

    path = tmp_path / "learned.yaml"
    path.write_text(RULE_FILE)
    rules = load_rules([path])
    settings = Settings(prometheus=prom)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    ctx = RunContext(now=NOW)
    plain = run_once(ctx, settings, rules, Peers(Inventory(), PrometheusMetrics(prom), store, None), act=False)
    learned = run_once(ctx, settings, rules, Peers(Inventory(), PrometheusMetrics(prom), store, None,
                                                   learned=IdleHistory(prom)), act=False)
    fixed = {d.instance_id: d for d in plain.decisions}
    got = {d.instance_id: d for d in learned.decisions}
    assert fixed["i-serve"].verdict == fixed["i-night"].verdict == Verdict.IDLE
    assert got["i-serve"].code == ReasonCode.LEARNED_WAIT and got["i-night"].code == ReasonCode.LEARNED_IDLE
    assert {k: v for k, v in got.items() if k not in ("i-serve", "i-night", "i-hand")} == \
        {k: v for k, v in fixed.items() if k not in ("i-serve", "i-night", "i-hand")}


def test_time_of_day_judges_a_lull_by_the_lulls_begun_near_its_hour():
    """Live, as in the backtest: 45-min lunches and 14-h nights; a lull begun at the nights' hour stops at once."""
    began = NOW_S - 20 * MIN  # the current lull, 20 min old, begins at the nights' time of day
    nights = [(began - k * 86400.0, 14 * 3600.0) for k in range(14, 0, -1)]
    lunches = [(began - 6 * 3600.0 - k * 86400.0, 45 * 60.0) for k in range(14, 0, -1)]
    past = sorted(nights + lunches)
    hist = Stretches(tuple(d for _, d in past), (), began, True, NOW_S, completed_start_t=tuple(t for t, _ in past))
    by_hour = LearnedParams(fleet_prior=0)
    d = decide_learned(_base(), replace(LEARNED, learned=by_hour), hist, adaptive.EMPTY_PRIOR, by_hour, NOW)
    assert d.verdict == Verdict.IDLE and d.code == ReasonCode.LEARNED_IDLE, d.reason
    window = f"{datetime.fromtimestamp(began - 3 * 3600, UTC):%H:%M}-{datetime.fromtimestamp(began + 3 * 3600, UTC):%H:%M}"
    assert f"100% of this instance's 14 past idle stretches longer than 20 min (begun {window} UTC)" in d.reason
    # Every lull alike: it might be a lunch, so the policy waits until lunch would be over.
    flat = LearnedParams(fleet_prior=0, time_of_day=0)
    d = decide_learned(_base(), replace(LEARNED, learned=flat), hist, adaptive.EMPTY_PRIOR, flat, NOW)
    assert d.verdict == Verdict.UNDERUTILIZED and d.code == ReasonCode.LEARNED_WAIT, d.reason
    assert "of this instance's 28 past idle stretches longer than 35 min lasted over 65 min" in d.reason


def test_no_stop_within_the_restart_grace_of_a_launch():
    past = (8 * 3600.0,) * 20  # every lull a long one: the history says stop now
    hist = Stretches(past, (), NOW_S - 20 * MIN, True, NOW_S)
    params = LearnedParams(fleet_prior=0)
    rule = replace(LEARNED, learned=params)
    d = decide_learned(_base(), rule, hist, adaptive.EMPTY_PRIOR, params, NOW, launched_at=NOW - timedelta(minutes=50))
    assert d.verdict == Verdict.UNDERUTILIZED and d.code == ReasonCode.LEARNED_WAIT
    assert d.reason.startswith("started 50 min ago: no stop within 2.0 h of a start (idle 20 min; ")
    d = decide_learned(_base(), rule, hist, adaptive.EMPTY_PRIOR, params, NOW, launched_at=NOW - timedelta(hours=3))
    assert d.verdict == Verdict.IDLE and d.code == ReasonCode.LEARNED_IDLE
    no_grace = LearnedParams(fleet_prior=0, restart_grace=0)
    d = decide_learned(_base(), replace(LEARNED, learned=no_grace), hist, adaptive.EMPTY_PRIOR, no_grace, NOW,
                       launched_at=NOW - timedelta(minutes=50))
    assert d.verdict == Verdict.IDLE


@pytest.mark.integration
def test_earned_trust_from_the_prometheus_history(prom, history):
    """A `trust_wait` block on the same history: each instance's past lulls are replayed against a fixed wait."""
    fixed = fixed_decisions(prom, [FIXED, LEARNED])
    trusting = replace(LEARNED, learned=LearnedParams(trust_wait="10m"))
    out = {(d.instance_id, d.rule_name): d for d in apply_learned(fixed, MAIN, [FIXED, trusting], history, NOW)}
    # Serving: a fixed 10-min wait would have stopped lull after lull falsely; the learned wait, holding back,
    # is ahead, and still decides.
    serve = out[("i-serve", LEARNED.name)]
    assert serve.code == ReasonCode.LEARNED_WAIT and "a later stop is worth more" in serve.reason
    assert re.search(r"; the learned wait is \d+\.\d GPU-h per GPU ahead of a fixed 10 min wait over this "
                     r"instance's \d+ past idle stretches$", serve.reason), serve.reason
    # Nights: the learned wait's thin-history start made it wait longer than 10 min on nights that lasted
    # hours, so the fixed wait decides: the 30-minute-old lull is stopped.
    night = out[("i-night", LEARNED.name)]
    assert night.verdict == Verdict.IDLE and night.code == ReasonCode.LEARNED_IDLE
    assert re.fullmatch(r"idle 30 min; the learned wait is \d+\.\d GPU-h per GPU behind a fixed 10 min wait over "
                        r"this instance's \d+ past idle stretches: the fixed wait decides", night.reason), night.reason
    # The replay is kept with the history: asked again, the same answer without replaying.
    view = history.view(trusting.learned, MAIN)
    hist = view.instance("i-night")
    assert view.trust("i-night", hist, trusting) is view.trust("i-night", hist, trusting)
    assert view.trust("i-night", hist, trusting).edge_s < 0 < view.trust("i-serve", view.instance("i-serve"),
                                                                         trusting).edge_s
    # As stretches complete, only the new ones are replayed, with the same result as replaying them all.
    earlier = replace(hist, completed_s=hist.completed_s[:-3], completed_start_t=hist.completed_start_t[:-3])
    assert view.trust("i-night", earlier, trusting).stretches == len(hist.completed_s) - 3
    resumed = view.trust("i-night", hist, trusting)
    assert resumed == adaptive.trust_of(hist.completed_s, hist.completed_start_t,
                                        partial(view.prior, float(trusting.warning_lead_s)), trusting,
                                        trusting.learned.adaptive(), 1800.0, 600.0, float(trusting.window_s))
