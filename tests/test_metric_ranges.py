"""Every number read from the metrics source is range-checked where it enters (issue 11).

Found by a tester: a 90%-busy GPU under a mean rule was marked and stopped when the query
layer answered the DCGM sentinel inside the aggregates: sum/count = sentinel/sentinel = 1%.
The unit tables feed answers, shaped as Prometheus sends them, through the collector's pure
combining step and then `evaluate`; the integration test backfills bad raw samples into a
real Prometheus.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.collect.prometheus import (
    CLEAN, DIRTY, FB_USED, GPU_UTIL, GR_ENGINE_ACTIVE, POWER_USAGE, PrometheusMetrics, parse_answer,
    usage_from_answers,
)
from gpufinops.config import PrometheusSettings, load_settings
from gpufinops.decide.evaluate import evaluate
from gpufinops.metric_ranges import (
    ACTIVITY_PCT, Limit, aggregate_problem, max_samples, memory_limit, number_problem, power_limit,
    validate_stats,
)
from gpufinops.model import (
    Aggregation, Decision, GpuInstance, GpuWindowStats, InstanceUsage, ReasonCode, Rule, RunContext, Verdict,
)
from gpufinops.notify.delivery import OutboxNotifier, read_outbox
from gpufinops.run.pipeline import alert_missing_data, metrics_alert_key
from gpufinops.store.store import Store
from tests.promserver import Series, binaries_missing, dcgm_labels, start_prometheus

SENTINEL = "9223372036854775794"  # as the query layer wrote it (int64 max - 13, a DCGM blank)
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
EXPECTED = 20  # a 10-minute window at a 30 s scrape interval
MEAN_RULE = Rule(name="mean40", threshold_pct=40, window_s=600, aggregation=Aggregation.MEAN, min_coverage=0.8)
STAYS_RULE = Rule(name="stays40", threshold_pct=40, window_s=600, min_coverage=0.8)
IID = "i-0123456789abcdef0"


def p4d(instance_id: str = IID, **kw) -> GpuInstance:
    """An 8 x A100 80 GB instance, as the inventory describes it (GpuInfo: model and memory)."""
    fields = dict(gpu_count=1, gpu_model="A100", gpu_memory_gib=80.0, hourly_cost=21.96)
    fields.update(kw)
    return GpuInstance(instance_id, "p4d.24xlarge", "us-east-1", "running", NOW - timedelta(days=2), **fields)


def labels(gpu: int = 0, instance_id: str = IID) -> dict[str, str]:
    return dcgm_labels("ip-10-0-0-1", gpu, instance_id=instance_id)


def clean(metric: str, **aggs: str) -> tuple[tuple[str, str], list[dict]]:
    """One clean answer as Prometheus sends it: a vector of `agg`-labelled samples, values as strings."""
    items = [{"metric": {**labels(), "agg": "present"}, "value": [NOW.timestamp(), "1"]}]
    items += [{"metric": {**labels(), "agg": agg}, "value": [NOW.timestamp(), value]} for agg, value in aggs.items()]
    return (metric, CLEAN), items


def busy_util(**override: str) -> dict[str, str]:
    """A 90%-busy GPU, 20 samples in 85..95%: what the tester's instance really did."""
    return {"count": "20", "sum": "1800", "max": "95", "min": "85", **override}


def usage_of(*answers, instance: GpuInstance | None = None) -> InstanceUsage:
    inst = instance or p4d()
    parsed = {key: parse_answer(key, items) for key, items in answers}
    return usage_from_answers(parsed, [inst], 600, EXPECTED)[inst.instance_id]


def judged(use: InstanceUsage, rule: Rule = MEAN_RULE, instance: GpuInstance | None = None) -> Decision:
    return evaluate(instance or p4d(), use, rule, NOW)


def assert_no_number(reason: str, *numbers: str) -> None:
    for n in ("9223372036854775", "e+18", "e18", "inf%", "nan%", *numbers):
        assert n not in reason.lower(), reason


# --------------------------------------------------------------------------- the tester's case


def test_sentinel_sum_over_sentinel_count_is_not_one_percent_and_never_idle():
    # sum/count = sentinel/sentinel = 1%: a mean rule called this busy GPU idle and stopped it.
    use = usage_of(clean(GPU_UTIL, **busy_util(count=SENTINEL, sum=SENTINEL)))
    g = use.gpus[0]
    assert g.invalid and g.activity_mean is None and g.samples == 0  # no figure survives
    d = judged(use)
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.INVALID_DATA), d.reason
    assert d.reason == ("GPU 0: the activity sample count read from Prometheus is out of range "
                        "(a DCGM sentinel, i.e. no data): not judged")
    assert d.code.is_missing_data
    assert_no_number(d.reason)


def test_the_same_gpu_with_sane_aggregates_is_busy():
    d = judged(usage_of(clean(GPU_UTIL, **busy_util())))
    assert (d.verdict, d.code) == (Verdict.ACTIVE, ReasonCode.BUSY), d.reason
    assert d.reason == "busy: mean 90%, max 95% over 10 min"


# --------------------------------------------------------------------------- table: every figure read

@pytest.mark.parametrize("answers, words, numbers", [
    pytest.param([clean(GPU_UTIL, **busy_util(sum=SENTINEL))],
                 "the activity sum read from Prometheus is out of range (a DCGM sentinel, i.e. no data)", (),
                 id="sentinel-in-sum"),
    pytest.param([clean(GPU_UTIL, **busy_util(max=SENTINEL))],
                 "the activity maximum read from Prometheus is out of range (a DCGM sentinel", (),
                 id="sentinel-in-max"),
    pytest.param([clean(GPU_UTIL, **busy_util(count=SENTINEL))],
                 "the activity sample count read from Prometheus is out of range (a DCGM sentinel", (),
                 id="sentinel-in-count"),
    pytest.param([clean(GPU_UTIL, **busy_util(min="-3"))],
                 "the activity minimum read from Prometheus is out of range (negative)", ("-3",),
                 id="negative-min"),
    pytest.param([clean(GPU_UTIL, **busy_util(count="-20"))],
                 "the activity sample count read from Prometheus is out of range (negative)", ("-20",),
                 id="negative-count"),
    pytest.param([clean(GPU_UTIL, **busy_util(sum="NaN"))],
                 "the activity sum read from Prometheus is out of range (not a number (NaN))", (),
                 id="nan-sum"),
    pytest.param([clean(GPU_UTIL, **busy_util(max="+Inf"))],
                 "the activity maximum read from Prometheus is out of range (infinite)", (),
                 id="inf-max"),
    pytest.param([clean(GPU_UTIL, **busy_util(max="101"))],
                 "the activity maximum read from Prometheus is out of range (above 100%)", ("101",),
                 id="util-101"),
    pytest.param([clean(GR_ENGINE_ACTIVE, count="20", sum="10", max="1.5", min="0.2")],
                 "the GR engine activity maximum read from Prometheus is out of range (above 1, the most a ratio",
                 ("1.5", "150"), id="gr-1.5"),
    pytest.param([clean(GPU_UTIL, **busy_util()), clean(FB_USED, max="90000")],
                 "the memory used maximum read from Prometheus is out of range (above the GPU's 80 GiB)",
                 ("90000", "87"), id="memory-above-the-gpus"),
    pytest.param([clean(GPU_UTIL, **busy_util()), clean(POWER_USAGE, count="20", sum="1000000")],
                 "the power draw sum read from Prometheus is out of range (above 800 W, 2x the GPU's 400 W TDP "
                 "on average over its 20 samples)", ("50000", "1000000"), id="power-50kW"),
    pytest.param([clean(GPU_UTIL, **busy_util(count="40", sum="3600"))],
                 "the activity sample count read from Prometheus is out of range (more than the 22 samples",
                 ("40", "3600"), id="count-over-expected"),
    pytest.param([clean(GPU_UTIL, **busy_util(count="19.5"))],
                 "the activity sample count read from Prometheus is out of range (not a whole number)", ("19.5",),
                 id="count-not-whole"),
    pytest.param([clean(GPU_UTIL, **busy_util(sum="1950"))],
                 "the activity sum read from Prometheus is out of range (above 20 samples x the maximum", ("1950",),
                 id="sum-over-count-x-max"),
    pytest.param([clean(GPU_UTIL, **busy_util(min="96"))],
                 "the activity minimum read from Prometheus is out of range (above the maximum", ("96",),
                 id="min-over-max"),
    pytest.param([clean(GPU_UTIL), ((GPU_UTIL, DIRTY), [
        {"metric": labels(), "values": [[NOW.timestamp() - 30 * k, "150" if k == 3 else "90"] for k in range(20)]}])],
                 "the activity maximum read from Prometheus is out of range (above 100%)", ("150",),
                 id="dirty-sample-150"),
    pytest.param([clean(GPU_UTIL, **busy_util()), ((POWER_USAGE, DIRTY), [
        {"metric": labels(), "values": [[NOW.timestamp() - 30 * k, "-Inf" if k == 3 else "90"] for k in range(9)]}])],
                 "the power draw sample read from Prometheus is out of range (infinite)", (),
                 id="dirty-sample-inf"),
    pytest.param([((GPU_UTIL, CLEAN), [{"metric": {**labels(), "agg": "present"}, "value": [0, SENTINEL]}])],
                 "the activity presence marker read from Prometheus is out of range", (),
                 id="sentinel-presence"),
])
@pytest.mark.parametrize("rule", [MEAN_RULE, STAYS_RULE], ids=["mean", "stays_below"])
def test_out_of_range_figures_make_the_instance_unknown(answers, words, numbers, rule):
    use = usage_of(*answers)
    assert use.gpus[0].invalid.startswith(words), use.gpus[0].invalid
    d = judged(use, rule)
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.INVALID_DATA), d.reason
    assert d.reason.startswith(f"GPU 0: {words}") and d.reason.endswith(": not judged")
    assert_no_number(d.reason, *numbers)


def test_one_bad_gpu_of_eight_makes_the_instance_unknown_and_names_it():
    inst = p4d(gpu_count=8)
    items = []
    for gpu in range(8):
        count, total = (SENTINEL, SENTINEL) if gpu == 3 else ("20", "1800")
        for agg, value in (("present", "1"), ("count", count), ("sum", total), ("max", "95"), ("min", "85")):
            items.append({"metric": {**labels(gpu), "agg": agg}, "value": [0, value]})
    use = usage_of(((GPU_UTIL, CLEAN), items), instance=inst)
    assert [g.gpu for g in use.gpus if g.invalid] == ["3"]
    d = judged(use, instance=inst)
    assert d.code == ReasonCode.INVALID_DATA and d.reason.startswith("GPU 3: the activity sample count")


def test_power_ceiling_comes_from_the_catalog_tdp_else_2000_w():
    # 900 W mean: implausible on an A100 (400 W TDP), not on a GPU whose TDP is unknown.
    power = clean(POWER_USAGE, count="20", sum="18000")
    assert usage_of(clean(GPU_UTIL, **busy_util()), power).gpus[0].invalid
    unknown = p4d(gpu_model="", gpu_memory_gib=0.0)
    items = [{**i, "metric": {**i["metric"], "modelName": "Some Future GPU"}} for i in power[1]]
    util = [{**i, "metric": {**i["metric"], "modelName": "Some Future GPU"}} for i in clean(GPU_UTIL, **busy_util())[1]]
    use = usage_of(((GPU_UTIL, CLEAN), util), ((POWER_USAGE, CLEAN), items), instance=unknown)
    assert not use.gpus[0].invalid and use.gpus[0].power_mean_w == 900.0


def test_sane_answers_pass_unchanged():
    use = usage_of(clean(GPU_UTIL, **busy_util()), clean(FB_USED, max="81000"),
                   clean(POWER_USAGE, count="21", sum="6300"),
                   clean(GR_ENGINE_ACTIVE, count="20", sum="20", max="1", min="1"))
    g = use.gpus[0]
    assert not g.invalid
    # The GR engine's ratio is the activity figure where a GPU has it; GPU_UTIL is the second one IDLE needs.
    assert (g.samples, g.activity_mean, g.activity_max, g.fb_used_max_mib, g.power_mean_w) == (20, 100, 100, 81000, 300)
    assert (g.activity_signal, g.second_activity_signal) == (GR_ENGINE_ACTIVE, GPU_UTIL)
    assert (g.second_activity_mean, g.second_activity_max) == (90, 95)


# --------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize("value, limit, whole, problem", [
    (50.0, ACTIVITY_PCT, False, ""),
    (100.0, ACTIVITY_PCT, False, ""),
    (100.0000001, ACTIVITY_PCT, False, ""),  # float slack, not a measurement tolerance
    (100.5, ACTIVITY_PCT, False, "above 100%"),
    (9.223372036854775e18, None, False, "a DCGM sentinel, i.e. no data"),
    (2.0 ** 47, None, False, "a DCGM sentinel, i.e. no data"),
    (2147483632.0, None, False, "a DCGM sentinel, i.e. no data"),
    (-0.5, None, False, "negative"),
    (math.nan, None, False, "not a number (NaN)"),
    (-math.inf, None, False, "infinite"),
    (3.0, None, True, ""),
    (3.5, None, True, "not a whole number"),
    ("x", None, False, "not a number"),
])
def test_number_problem(value, limit, whole, problem):
    assert number_problem(value, limit, whole=whole) == problem


def test_limits():
    assert max_samples(20) == 22 and max_samples(0) == 1 and max_samples(600) == 660
    assert memory_limit(80.0).ceiling == pytest.approx(80 * 1024 * 1.05)
    assert memory_limit(0.0).ceiling == 512 * 1024
    assert power_limit(400.0).ceiling == 800.0 and power_limit(1500.0).ceiling == 2000.0
    assert power_limit(None).ceiling == 2000.0


def test_aggregate_problem_checks_each_and_together():
    samples = Limit(22, "more than 22")
    assert aggregate_problem(20, 1800, 95, 85, ACTIVITY_PCT, samples) is None
    assert aggregate_problem(0, 0, None, None, ACTIVITY_PCT, samples) is None
    assert aggregate_problem(0, 5, None, None, ACTIVITY_PCT, samples) == ("sum", "a sum without samples")
    assert aggregate_problem(20, 1901, 95, 85, ACTIVITY_PCT, samples)[0] == "sum"  # above count x max
    assert aggregate_problem(20, 2001, None, None, ACTIVITY_PCT, samples)[0] == "sum"
    assert aggregate_problem(20, 1699, 95, 85, ACTIVITY_PCT, samples)[0] == "sum"  # below count x min
    assert aggregate_problem(23, 1800, None, None, ACTIVITY_PCT, samples) == ("sample count", "more than 22")


def stats(**kw) -> GpuWindowStats:
    base = dict(gpu="0", samples=20, activity_max=95.0, activity_mean=90.0, activity_min=85.0,
                fb_used_max_mib=1000.0, power_mean_w=300.0)
    base.update(kw)
    return GpuWindowStats(**base)


@pytest.mark.parametrize("kw, words", [
    (dict(samples=9223372036854775807, activity_mean=1.0), "activity sample count"),
    (dict(samples=25), "activity sample count"),
    (dict(samples=-1), "activity sample count"),
    (dict(activity_max=9.223372036854775808e18), "activity maximum"),
    (dict(activity_max=101.0), "activity maximum"),
    (dict(activity_mean=math.nan), "activity mean"),
    (dict(activity_min=-1.0), "activity minimum"),
    (dict(activity_mean=99.0), "activity mean"),  # outside min..max
    (dict(activity_min=96.0, activity_mean=None), "activity minimum"),
    (dict(fb_used_max_mib=2.0 ** 47), "memory used"),
    (dict(fb_used_max_mib=600 * 1024.0), "memory used"),
    (dict(power_mean_w=50_000.0), "power draw"),
    (dict(power_mean_w=math.inf), "power draw"),
])
def test_validate_stats_flags_any_source(kw, words):
    out = validate_stats(stats(**kw), EXPECTED)
    assert out.invalid.startswith(f"the {words} read from the metrics source is out of range ("), out.invalid
    assert out.activity_max is None and out.activity_mean is None and out.samples == 0
    assert_no_number(out.invalid, "50000", "101", "25")


def test_validate_stats_keeps_plausible_stats_and_earlier_verdicts():
    good = stats()
    assert validate_stats(good, EXPECTED) is good
    assert validate_stats(stats(activity_max=None, activity_mean=None, activity_min=None, samples=0), EXPECTED).invalid == ""
    already = GpuWindowStats(gpu="0", samples=0, invalid="the activity sum read from Prometheus is out of range (x)")
    assert validate_stats(already, EXPECTED) is already


@pytest.mark.parametrize("gpu", [
    GpuWindowStats("0", 9223372036854775807, activity_max=95.0, activity_mean=1.0, activity_min=0.0),
    GpuWindowStats("0", 20, activity_max=9.223372036854775808e18, activity_mean=1.0),
    GpuWindowStats("0", 20, activity_max=5.0, activity_mean=math.nan),
    GpuWindowStats("0", 20, activity_max=0.0, activity_mean=0.0, fb_used_max_mib=1e15),
])
def test_evaluate_rejects_implausible_stats_from_any_source(gpu):
    # A MetricsSource other than Prometheus (the demo's trace, the agent) is checked all the same.
    d = evaluate(p4d(), InstanceUsage(IID, 600, EXPECTED, (gpu,)), MEAN_RULE, NOW)
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.INVALID_DATA), d.reason
    assert "metrics source is out of range" in d.reason and "%" not in d.reason
    assert_no_number(d.reason, "1e+15", "1000000000000000")
    assert d.activity_max is None and d.activity_mean is None and d.memory_max_mib is None


# --------------------------------------------------------------------------- real Prometheus

SCRAPE = 30
WINDOW = 600
REAL_NOW = datetime.fromtimestamp(int(datetime.now(timezone.utc).timestamp()) // SCRAPE * SCRAPE, timezone.utc)


def grid(n: int = WINDOW // SCRAPE) -> list[float]:
    stop = REAL_NOW.timestamp()
    return [stop - WINDOW + SCRAPE * (i + 1) for i in range(n)]


def host(n: int) -> GpuInstance:
    return GpuInstance(f"i-0ccc0000000000{n:03d}", "p4d.24xlarge", "us-east-1", "running",
                       REAL_NOW - timedelta(days=3), private_dns=f"ip-10-7-0-{n}.ec2.internal", gpu_count=1,
                       gpu_model="A100", gpu_memory_gib=80.0)


BLANK_HOST, DIRTY_HOST, UTIL_150, GR_150, MEM_HOST, POWER_HOST = (host(n) for n in range(1, 7))


def bad_raw_series() -> list[Series]:
    full = grid()

    def series(metric, inst, values, **extra):
        return Series(metric, dcgm_labels(inst.private_dns.split(".")[0], 0, **extra), list(zip(full, values)))

    out = [
        # 90% busy, but every sample a DCGM blank: no data, never 1%.
        series(GPU_UTIL, BLANK_HOST, [float(SENTINEL)] * 20),
        # 90% busy with a blank, a negative, NaN and infinity: judged from its 16 valid samples.
        series(GPU_UTIL, DIRTY_HOST, [float(SENTINEL) if i == 0 else -3.0 if i == 7 else math.nan if i == 13
                                      else math.inf if i == 17 else 90.0 for i in range(20)]),
        # Out of range but below the sentinel threshold: not filtered, so the GPU is not judged.
        series(GPU_UTIL, UTIL_150, [150.0 if i == 4 else 20.0 for i in range(20)]),
        series(GR_ENGINE_ACTIVE, GR_150, [1.5 if i == 4 else 0.05 for i in range(20)], GPU_I_ID="1"),
        series(GPU_UTIL, MEM_HOST, [2.0] * 20),
        series(FB_USED, MEM_HOST, [200_000.0 if i == 4 else 1000.0 for i in range(20)]),  # over 80 GiB
        series(GPU_UTIL, POWER_HOST, [2.0] * 20),
        series(POWER_USAGE, POWER_HOST, [50_000.0 if i == 4 else 60.0 for i in range(20)]),  # 50 kW
    ]
    out.append(series(FB_USED, DIRTY_HOST, [140737488355328.0 if i == 2 else 4000.0 for i in range(20)]))
    out.append(series(POWER_USAGE, DIRTY_HOST, [2147483632.0 if i == 3 else -1.0 if i == 4 else 300.0
                                                for i in range(20)]))
    return out


@pytest.fixture(scope="module")
def bad_prom(tmp_path_factory):
    if binaries_missing():
        pytest.skip(binaries_missing())
    server = start_prometheus(tmp_path_factory.mktemp("ranges"), bad_raw_series())
    yield server
    server.stop()


@pytest.mark.integration
def test_bad_raw_samples_in_a_real_prometheus(bad_prom):
    fleet = [BLANK_HOST, DIRTY_HOST, UTIL_150, GR_150, MEM_HOST, POWER_HOST]
    source = PrometheusMetrics(PrometheusSettings(url=bad_prom.url, scrape_interval_s=SCRAPE))
    usage = source.window_usage(fleet, WINDOW, REAL_NOW)
    verdicts = {i.instance_id: evaluate(i, usage[i.instance_id], MEAN_RULE, REAL_NOW) for i in fleet}

    blank = verdicts[BLANK_HOST.instance_id]
    assert (blank.verdict, blank.code) == (Verdict.UNKNOWN, ReasonCode.NO_SERIES), blank.reason

    dirty = usage[DIRTY_HOST.instance_id].gpus[0]
    assert not dirty.invalid and dirty.samples == 16 and dirty.activity_mean == 90.0
    assert dirty.fb_used_max_mib == 4000.0 and dirty.power_mean_w == pytest.approx(300.0)
    assert verdicts[DIRTY_HOST.instance_id].verdict == Verdict.ACTIVE

    expected_words = [
        (UTIL_150, "the activity maximum read from Prometheus is out of range (above 100%)"),
        (GR_150, "the GR engine activity maximum read from Prometheus is out of range (above 1"),
        (MEM_HOST, "the memory used maximum read from Prometheus is out of range (above the GPU's 80 GiB)"),
        (POWER_HOST, "the power draw sum read from Prometheus is out of range (above 800 W"),
    ]
    for inst, words in expected_words:
        d = verdicts[inst.instance_id]
        assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.INVALID_DATA), (inst.instance_id, d.reason)
        assert words in d.reason, d.reason
        assert_no_number(d.reason, "150", "200000", "50000")


# --------------------------------------------------------------------------- per-instance outage alerts


class Service:
    """A Store on one sqlite file and the outbox notifier: `restart()` builds both anew on the same file."""

    def __init__(self, tmp_path):
        self.url = f"sqlite:///{tmp_path / 'gpufinops.db'}"
        self.outbox = tmp_path / "outbox.jsonl"  # where the alerts are read back from
        self.settings = load_settings(slack={"outbox_path": str(self.outbox)})
        self.now = NOW
        self.restart()

    def restart(self):
        self.store = Store(self.url)
        self.notifier = OutboxNotifier(self.settings.slack, self.store, lambda: self.now)

    def tick(self, missing: dict[str, ReasonCode], fine: tuple[str, ...] = ()) -> list[dict]:
        """One tick: the instances in `missing` have no usable metrics, those in `fine` were judged.
        Returns the alerts this tick sent."""
        before = len(read_outbox(self.outbox))
        decisions = [decision(i, code) for i, code in missing.items()] + [decision(i, ReasonCode.BUSY) for i in fine]
        by_id = {d.instance_id: p4d(d.instance_id) for d in decisions}
        alert_missing_data(RunContext(now=self.now), self.settings, decisions, by_id, self.store, self.notifier)
        self.now += timedelta(minutes=1)
        return read_outbox(self.outbox)[before:]


def decision(instance_id: str, code: ReasonCode) -> Decision:
    verdict = Verdict.ACTIVE if code == ReasonCode.BUSY else Verdict.UNKNOWN
    reason = {ReasonCode.NO_SERIES: "no DCGM series for this instance",
              ReasonCode.INVALID_DATA: "GPU 0: the activity sum read from Prometheus is out of range",
              ReasonCode.QUERY_ERROR: "metrics unavailable: timed out"}.get(code, "busy")
    return Decision(instance_id, "r", verdict, code, reason, NOW)


A, B, C = "i-0aaaaaaaaaaaaaaa1", "i-0bbbbbbbbbbbbbbb2", "i-0ccccccccccccccc3"


def named(alert: dict) -> set[str]:
    return {i for i in (A, B, C) if i in alert["text"]}


def test_each_new_outage_is_alerted_once_per_instance(tmp_path):
    s = Service(tmp_path)
    first = s.tick({A: ReasonCode.NO_SERIES}, fine=(B, C))
    assert len(first) == 1 and named(first[0]) == {A}
    assert "No usable GPU metrics for 1 instance" in first[0]["text"] and "no DCGM series" in first[0]["text"]
    assert s.tick({A: ReasonCode.NO_SERIES}, fine=(B, C)) == []  # the same outage: nothing
    second = s.tick({A: ReasonCode.NO_SERIES, B: ReasonCode.INVALID_DATA}, fine=(C,))
    assert len(second) == 1 and named(second[0]) == {B}  # only the newly missing one
    assert "out of range" in second[0]["text"]
    assert second[0]["key"] != first[0]["key"]

    s.restart()  # new Store and notifier, same database
    assert s.tick({A: ReasonCode.NO_SERIES, B: ReasonCode.INVALID_DATA}, fine=(C,)) == []

    # A recovers; its episode closes after slack.metrics_recovered_after_s (30 min) of usable data.
    for _ in range(31):
        assert s.tick({B: ReasonCode.INVALID_DATA}, fine=(A, C)) == []
    assert A + ":" not in str(s.store.kv_items("metrics_unavailable:"))  # closed
    # A new outage of A within a day of its alert goes into the daily summary, not a message.
    assert s.tick({A: ReasonCode.QUERY_ERROR, B: ReasonCode.INVALID_DATA}, fine=(C,)) == []
    assert len(s.store.kv_items("metrics_folded:" + A)) == 1
    for _ in range(31):
        s.tick({B: ReasonCode.INVALID_DATA}, fine=(A, C))
    s.now += timedelta(days=1)  # a day after its alert: a new outage of A is alerted again
    again = s.tick({A: ReasonCode.QUERY_ERROR, B: ReasonCode.INVALID_DATA}, fine=(C,))
    assert len(again) == 1 and named(again[0]) == {A}
    s.restart()
    assert s.tick({A: ReasonCode.QUERY_ERROR, B: ReasonCode.INVALID_DATA}, fine=(C,)) == []


def test_instances_missing_together_share_one_message(tmp_path):
    s = Service(tmp_path)
    sent = s.tick({A: ReasonCode.NO_SERIES, B: ReasonCode.QUERY_ERROR, C: ReasonCode.NO_SERIES})
    assert len(sent) == 1 and named(sent[0]) == {A, B, C}
    assert "for 3 instances" in sent[0]["text"]


def test_an_instance_not_judged_keeps_its_episode(tmp_path):
    # Stopped, or its region not listed this tick: no evidence it recovered, so no second alert.
    s = Service(tmp_path)
    assert len(s.tick({A: ReasonCode.NO_SERIES})) == 1
    assert s.tick({}, fine=(B,)) == []
    assert s.tick({A: ReasonCode.NO_SERIES}) == []


def test_a_send_that_failed_is_retried_with_the_same_key(tmp_path):
    s = Service(tmp_path)
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    s.settings = load_settings(slack={"outbox_path": str(blocked)})  # a directory: the write fails
    s.restart()
    s.tick({A: ReasonCode.NO_SERIES})
    failed = s.store.kv_items("metrics_unavailable:")
    assert len(failed) == 1 and json.loads(failed[0][1])["alerted"] is False
    s.settings = load_settings(slack={"outbox_path": str(s.outbox)})
    s.restart()
    retried = s.tick({A: ReasonCode.NO_SERIES})
    assert len(retried) == 1 and named(retried[0]) == {A}
    assert retried[0]["key"] == json.loads(failed[0][1])["key"]
    assert s.tick({A: ReasonCode.NO_SERIES}) == []


def test_alert_keys_are_deterministic():
    k1 = metrics_alert_key(NOW, [B, A])
    assert k1 == metrics_alert_key(NOW, [A, B]) and k1.startswith("metrics-unavailable:20261129T120000Z:")
    assert k1 != metrics_alert_key(NOW, [A]) and k1 != metrics_alert_key(NOW + timedelta(minutes=1), [A, B])
