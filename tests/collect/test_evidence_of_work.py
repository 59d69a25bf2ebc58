"""GPUs without an activity counter (issue 15): MIG instances exported by `gpufinops agent`.

Under MIG, nvidia-smi and NVML give no utilization per GPU instance, so the agent exports memory used and the
number of compute processes per instance. Processes or memory held are evidence of work (ACTIVE); their absence
is evidence of idleness only under the rule's `idle_without_activity_counter: no_processes_and_idle_memory`,
and only for the whole window. The pure table comes first, then the collector and `evaluate` against a real
Prometheus holding series shaped as the agent exports them for an H100 with four GPU instances.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.collect.gpu_snapshot import PROCESSES_METRIC
from gpufinops.collect.prometheus import (
    CLEAN, FB_USED, POWER_USAGE, PrometheusMetrics, PromQL, parse_answer, usage_from_answers,
)
from gpufinops.config import PrometheusSettings
from gpufinops.decide.evaluate import evaluate, judge_without_counter
from gpufinops.model import (
    IDLE_MEMORY_FLOOR_MIB, GpuInstance, GpuWindowStats, InstanceUsage, NoCounterPolicy, ReasonCode, Rule, Verdict,
)
from tests.promserver import Series, binaries_missing, start_prometheus

OPTION = "idle_without_activity_counter: no_processes_and_idle_memory"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
EXPECTED = 20  # a 10-minute window at a 30 s scrape interval
RULE = Rule(name="r10", threshold_pct=10, window_s=600, min_coverage=0.8)
OPT_IN = replace(RULE, name="r10-mig", idle_without_activity_counter=NoCounterPolicy.NO_PROCESSES_AND_IDLE_MEMORY)


def h100(gpus: int = 1, instance_id: str = "i-1", **kw) -> GpuInstance:
    return GpuInstance(instance_id, "p5.4xlarge", "us-east-1", "running", NOW - timedelta(days=1), gpu_count=gpus,
                       gpu_model="H100", gpu_memory_gib=80.0, **kw)


def gi(k: int, profile: str = "1g.10gb", processes: int | None = 0, mem: float | None = 9.0,
       process_samples: int = EXPECTED, gpu: int = 0) -> GpuWindowStats:
    """One MIG GPU instance as the collector reads the agent's series: no activity samples."""
    return GpuWindowStats(gpu=f"{gpu}/{k}", samples=0, fb_used_max_mib=mem, processes_max=processes,
                          process_samples=process_samples if processes is not None else 0, mig_profile=profile)


def full_gpu(i: int = 0, mx: float = 0.0, mean: float = 0.0, samples: int = EXPECTED) -> GpuWindowStats:
    return GpuWindowStats(gpu=str(i), samples=samples, activity_max=mx, activity_mean=mean, activity_min=0.0,
                          fb_used_max_mib=300.0)


# The agent's parent-GPU series under MIG (no GPU_I_ID): whole-board power and the whole GPU's process count.
BOARD = GpuWindowStats(gpu="0", samples=0, power_mean_w=120.0, processes_max=0, process_samples=EXPECTED)


def usage(*gpus: GpuWindowStats) -> InstanceUsage:
    return InstanceUsage("i-1", 600, EXPECTED, gpus)


def judged(*gpus: GpuWindowStats, rule: Rule = RULE, instance: GpuInstance | None = None):
    return evaluate(instance or h100(), usage(*gpus), rule, NOW)


# --------------------------------------------------------------------------- pure: one branch each


def test_processes_are_work():
    board = replace(BOARD, processes_max=3)  # the board counts the instance's processes too
    d = judged(board, gi(2, "3g.40gb", processes=3, mem=11091), gi(3), gi(9), gi(10))
    assert (d.verdict, d.code) == (Verdict.ACTIVE, ReasonCode.EVIDENCE_OF_WORK), d.reason
    # The instance that worked is named, not its board.
    assert d.reason == ("GPU 0/2 (3g.40gb) has no activity counter (MIG); 3 processes and 10.8 GiB held: "
                        "counted as work; and 1 more GPU")
    # Processes the board saw while no instance's could be read are work too.
    d = judged(board, gi(2, processes=None, mem=9), gi(3))
    assert (d.verdict, d.code) == (Verdict.ACTIVE, ReasonCode.EVIDENCE_OF_WORK), d.reason
    assert d.reason == "GPU 0 has no activity counter (MIG); 3 processes: counted as work"


def test_memory_above_the_floor_is_work_even_without_a_process_count():
    d = judged(gi(2, "3g.40gb", processes=None, mem=4096))
    assert (d.verdict, d.code) == (Verdict.ACTIVE, ReasonCode.EVIDENCE_OF_WORK), d.reason
    assert "4.0 GiB held: counted as work" in d.reason
    # ... and under the opt-in rule too: the option reads only the absence of evidence.
    assert judged(gi(2, processes=0, mem=2048), rule=OPT_IN).verdict == Verdict.ACTIVE


def test_a_whole_gpu_without_activity_samples_is_missing_data_whatever_it_holds():
    """A whole GPU has an activity counter: its samples missing is an outage (UNKNOWN, alerted), and memory held is
    not work; evidence of work stands in only where no counter exists (MIG)."""
    whole = GpuWindowStats(gpu="0", samples=0, fb_used_max_mib=30_000.0, processes_max=None)
    d = judged(whole)
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.NO_SERIES), d.reason
    assert d.code.is_missing_data and "no valid activity samples" in d.reason
    assert judged(whole, rule=OPT_IN).verdict is Verdict.UNKNOWN


def test_one_process_in_a_short_window_of_samples_is_still_work():
    d = judged(gi(2, processes=1, mem=9, process_samples=3), rule=OPT_IN)
    assert (d.verdict, d.code) == (Verdict.ACTIVE, ReasonCode.EVIDENCE_OF_WORK)
    assert "1 process: counted as work" in d.reason


def test_no_evidence_and_option_off_is_unknown_saying_what_is_missing():
    d = judged(BOARD, gi(3, "2g.20gb", mem=17), gi(9), gi(10))
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.NO_ACTIVITY_COUNTER), d.reason
    assert d.reason == ("GPU 0/3 (2g.20gb) has no activity counter (MIG) and no processes in the last 10 min: "
                        f"not judged idle unless the rule accepts it ({OPTION}); and 2 more GPUs")
    assert not d.code.is_missing_data  # a known limit, not an outage: no "metrics unavailable" alert


def test_option_on_with_a_whole_window_of_no_processes_and_idle_memory_is_idle():
    d = judged(BOARD, gi(3, "2g.20gb", mem=17), gi(9), gi(10), rule=OPT_IN)
    assert (d.verdict, d.code) == (Verdict.IDLE, ReasonCode.IDLE_NO_PROCESSES), d.reason
    assert d.reason.startswith("all 3 GPU(s) idle: GPU 0/3 (2g.20gb), GPU 0/9 (1g.10gb), GPU 0/10 (1g.10gb): ")
    assert d.reason.endswith(f"0 processes and at most 17 MiB held (idle floor 1024 MiB) for 10 min: "
                             f"judged idle by the rule's {OPTION}")
    assert d.coverage == 1.0 and d.memory_max_mib == 17


def test_option_on_but_process_coverage_short_is_unknown():
    d = judged(gi(3, process_samples=15), gi(9), rule=OPT_IN)  # 75% < 80%: the agent was away a while
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.LOW_COVERAGE), d.reason
    assert "15 of 20 expected process-count samples" in d.reason and "not judged idle" in d.reason


def test_option_on_without_a_process_count_or_a_memory_figure_is_unknown():
    no_count = judged(gi(3, processes=None, mem=9), rule=OPT_IN)
    assert (no_count.verdict, no_count.code) == (Verdict.UNKNOWN, ReasonCode.NO_SERIES)
    assert "no process count" in no_count.reason
    no_memory = judged(gi(3, processes=0, mem=None), rule=OPT_IN)
    assert (no_memory.verdict, no_memory.code) == (Verdict.UNKNOWN, ReasonCode.NO_SERIES)
    assert "no memory figure" in no_memory.reason


def test_the_memory_floor_is_the_rules():
    assert IDLE_MEMORY_FLOOR_MIB == 1024 and OPT_IN.idle_memory_floor_mib == 1024
    strict = replace(OPT_IN, idle_memory_floor_mib=8)
    assert judged(gi(9, mem=9), rule=strict).verdict == Verdict.ACTIVE  # 9 MiB > 8 MiB: counted as work
    assert judged(gi(9, mem=9), rule=OPT_IN).verdict == Verdict.IDLE


# --------------------------------------------------------------------------- mixed instances


def test_mixed_any_working_gpu_is_active():
    # GPU 0 idle by its counter, GPU 1's MIG instance has a process: the instance works.
    d = judged(full_gpu(0), gi(2, gpu=1, processes=1, mem=600), instance=h100(gpus=2), rule=OPT_IN)
    assert (d.verdict, d.code) == (Verdict.ACTIVE, ReasonCode.EVIDENCE_OF_WORK), d.reason


def test_mixed_any_unknown_gpu_is_unknown():
    # GPU 0 idle by its counter, GPU 1's instance has no evidence and the rule does not opt in.
    d = judged(full_gpu(0), gi(2, gpu=1), instance=h100(gpus=2))
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.NO_ACTIVITY_COUNTER), d.reason


def test_mixed_idle_only_when_every_gpu_is_idle_by_its_own_evidence():
    d = judged(full_gpu(0, mx=2, mean=1), gi(2, gpu=1), instance=h100(gpus=2), rule=OPT_IN)
    assert (d.verdict, d.code) == (Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW), d.reason
    assert d.reason.startswith("all 1 GPU(s) idle: every sample under 10%") and OPTION in d.reason
    # A busy counter keeps its own verdict; the idle MIG instance does not make it idle.
    busy = judged(full_gpu(0, mx=95, mean=80), gi(2, gpu=1), instance=h100(gpus=2), rule=OPT_IN)
    assert (busy.verdict, busy.code) == (Verdict.ACTIVE, ReasonCode.BUSY), busy.reason
    # ... and a counter with too few samples is still UNKNOWN.
    short = judged(full_gpu(0, samples=5), gi(2, gpu=1), instance=h100(gpus=2), rule=OPT_IN)
    assert (short.verdict, short.code) == (Verdict.UNKNOWN, ReasonCode.LOW_COVERAGE), short.reason


def test_the_board_series_of_a_mig_gpu_is_not_a_gpu_to_judge():
    # Power has no GPU_I_ID: the board's entry has no figure to judge, its instances are judged instead.
    measured = [GpuWindowStats(gpu=f"0/{k}", samples=EXPECTED, activity_max=0.0, activity_mean=0.0,
                               activity_signal="DCGM_FI_PROF_GR_ENGINE_ACTIVE") for k in (1, 2)]
    assert judged(BOARD, *measured).verdict == Verdict.IDLE
    # A full GPU with no valid activity samples stays missing data, as before.
    d = judged(GpuWindowStats(gpu="0", samples=0))
    assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.NO_SERIES) and d.code.is_missing_data


@pytest.mark.parametrize("processes, samples, words, read", [
    (-1, EXPECTED, "negative", "-1"),
    (10_001, EXPECTED, "above 10000", "10001"),
    (2.5, EXPECTED, "not a whole number", "2.5"),
    (0, EXPECTED * 3, "more than the 22 samples", "60"),
])
def test_out_of_range_process_counts_are_unknown(processes, samples, words, read):
    bad = replace(gi(2, processes=0), processes_max=processes, process_samples=samples)
    for rule in (RULE, OPT_IN):
        d = judged(bad, gi(3, processes=5), rule=rule)  # even beside a working instance: not judged
        assert (d.verdict, d.code) == (Verdict.UNKNOWN, ReasonCode.INVALID_DATA), d.reason
        assert d.reason.startswith("GPU 0/2: the process") and words in d.reason
        assert read not in d.reason  # the number read is never printed


def test_per_gpu_judgement_names_the_evidence():
    assert judge_without_counter(gi(9), EXPECTED, OPT_IN).reason == (
        "GPU 0/9 (1g.10gb): 0 processes and at most 9 MiB held (idle floor 1024 MiB) for 10 min")


# --------------------------------------------------------------------------- collector, pure


def agent_labels(host: str, gpu: int, gi_id: int | None = None, profile: str = "") -> dict[str, str]:
    """Labels as `gpufinops agent` exports them (dcgm-exporter's, both hostname spellings), plus the
    job/instance Prometheus attaches at scrape time."""
    labels = {"gpu": str(gpu), "UUID": f"GPU-{host}-{gpu}", "modelName": "NVIDIA H100 80GB HBM3",
              "Hostname": host, "hostname": f"{host}.ec2.internal", "job": "gpufinops-agent",
              "instance": f"{host}:9400"}
    if gi_id is not None:
        labels.update(GPU_I_ID=str(gi_id), GPU_I_PROFILE=profile)
    return labels


def clean_row(labels: dict, agg: str, value: str) -> dict:
    return {"metric": {**labels, "agg": agg}, "value": [NOW.timestamp(), value]}


def test_process_rows_ride_in_the_memory_answer():
    inst = h100(private_dns="ip-10-0-3-1.ec2.internal")
    labels = agent_labels("ip-10-0-3-1", 0, 2, "3g.40gb")
    answer = [clean_row(labels, "max", "11091"), clean_row(labels, "processes_count", "20"),
              clean_row(labels, "processes_sum", "60"), clean_row(labels, "processes_max", "3"),
              clean_row(labels, "processes_min", "3")]
    key = (FB_USED, CLEAN)
    (g,) = usage_from_answers({key: parse_answer(key, answer)}, [inst], 600, EXPECTED)["i-1"].gpus
    assert (g.gpu, g.samples, g.processes_max, g.process_samples, g.fb_used_max_mib, g.mig_profile, g.invalid) == (
        "0/2", 0, 3, 20, 11091.0, "3g.40gb", "")
    # A fraction shows in the sum (1 + 1.5 + 1 ... is not whole): the GPU is invalid, never judged.
    answer[2] = clean_row(labels, "processes_sum", "60.5")
    (bad,) = usage_from_answers({key: parse_answer(key, answer)}, [inst], 600, EXPECTED)["i-1"].gpus
    assert bad.invalid == ("the process count sum read from Prometheus is out of range (not a whole number)")
    assert bad.processes_max is None and bad.process_samples == 0


def test_the_process_counts_add_no_query():
    queries = PromQL().queries(600)
    assert len(queries) == 5 and PROCESSES_METRIC in queries[(FB_USED, CLEAN)]
    assert sum(PROCESSES_METRIC in q for q in queries.values()) == 1


# --------------------------------------------------------------------------- real Prometheus

SCRAPE = 30
WINDOW = 600
REAL_NOW = datetime.fromtimestamp(int(time.time()) // SCRAPE * SCRAPE, timezone.utc)
# (GPU_I_ID, profile, processes, MiB): the H100 of the issue, as seen on a host with one busy instance.
BUSY_LAYOUT = ((2, "3g.40gb", 3, 11091.0), (3, "2g.20gb", 0, 17.0), (9, "1g.10gb", 0, 9.0), (10, "1g.10gb", 0, 9.0))
IDLE_LAYOUT = ((2, "3g.40gb", 0, 12.0),) + BUSY_LAYOUT[1:]


def real_inst(n: int) -> GpuInstance:
    return GpuInstance(f"i-0eee00000000000{n:02d}", "p5.4xlarge", "us-east-1", "running",
                       REAL_NOW - timedelta(days=1), private_dns=f"ip-10-0-3-{n}.ec2.internal",
                       private_ip=f"10.0.3.{n}", gpu_count=1, gpu_model="H100", gpu_memory_gib=80.0)


BUSY, IDLE, RESTARTED, NEGATIVE = (real_inst(n) for n in (1, 2, 3, 4))


def grid(first: int = 0) -> list[float]:
    stop = REAL_NOW.timestamp()
    return [stop - WINDOW + SCRAPE * (i + 1) for i in range(first, WINDOW // SCRAPE)]


def agent_series(inst: GpuInstance, layout, first: int = 0, bad_process_sample: float | None = None) -> list[Series]:
    host, ts = inst.private_dns.split(".")[0], grid(first)
    board = agent_labels(host, 0)  # whole board, no GPU_I_ID: power and the whole GPU's process count
    out = [Series(POWER_USAGE, board, [(t, 118.0) for t in ts]),
           Series(PROCESSES_METRIC, board, [(t, float(sum(row[2] for row in layout))) for t in ts])]
    for k, (gi_id, profile, processes, mib) in enumerate(layout):
        labels = agent_labels(host, 0, gi_id, profile)
        out.append(Series(FB_USED, labels, [(t, mib) for t in ts]))
        values = [float(processes)] * len(ts)
        if bad_process_sample is not None and k == 1:
            values[4] = bad_process_sample
        out.append(Series(PROCESSES_METRIC, labels, list(zip(ts, values))))
    return out


@pytest.fixture(scope="module")
def mig_prom(tmp_path_factory):
    if binaries_missing():
        pytest.skip(binaries_missing())
    series = (agent_series(BUSY, BUSY_LAYOUT) + agent_series(IDLE, IDLE_LAYOUT)
              + agent_series(RESTARTED, IDLE_LAYOUT, first=8)  # the agent came up 4 minutes into the window
              + agent_series(NEGATIVE, IDLE_LAYOUT, bad_process_sample=-1.0))
    server = start_prometheus(tmp_path_factory.mktemp("mig"), series)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mig_usage(mig_prom):
    source = PrometheusMetrics(PrometheusSettings(url=mig_prom.url, scrape_interval_s=SCRAPE))
    result = source.window_usage([BUSY, IDLE, RESTARTED, NEGATIVE], WINDOW, REAL_NOW)
    assert source.queries_made == 5  # the process counts ride in the memory query
    return result


@pytest.mark.integration
def test_collector_reads_the_agents_mig_series(mig_usage):
    gpus = {g.gpu: g for g in mig_usage[BUSY.instance_id].gpus}
    assert list(gpus) == ["0", "0/2", "0/3", "0/9", "0/10"]  # the collector orders MIG instances by number
    assert gpus["0"].power_mean_w == pytest.approx(118.0) and gpus["0"].processes_max == 3
    busy = gpus["0/2"]
    assert (busy.samples, busy.processes_max, busy.process_samples, busy.fb_used_max_mib, busy.mig_profile) == (
        0, 3, EXPECTED, 11091.0, "3g.40gb")
    assert [(gpus[k].processes_max, gpus[k].fb_used_max_mib) for k in ("0/3", "0/9", "0/10")] == [
        (0, 17.0), (0, 9.0), (0, 9.0)]
    assert {g.process_samples for g in mig_usage[RESTARTED.instance_id].gpus if "/" in g.gpu} == {12}


@pytest.mark.integration
def test_real_prometheus_busy_instance_is_active_idle_ones_unknown_by_default(mig_usage):
    gpus = {g.gpu: g for g in mig_usage[BUSY.instance_id].gpus}
    assert judge_without_counter(gpus["0/2"], EXPECTED, RULE).verdict == Verdict.ACTIVE
    assert {judge_without_counter(gpus[k], EXPECTED, RULE).code for k in ("0/3", "0/9", "0/10")} == {
        ReasonCode.NO_ACTIVITY_COUNTER}
    assert {judge_without_counter(gpus[k], EXPECTED, OPT_IN).verdict for k in ("0/3", "0/9", "0/10")} == {
        Verdict.IDLE}
    for rule in (RULE, OPT_IN):
        d = evaluate(BUSY, mig_usage[BUSY.instance_id], rule, REAL_NOW)
        assert (d.verdict, d.code) == (Verdict.ACTIVE, ReasonCode.EVIDENCE_OF_WORK), d.reason
        assert d.reason.startswith("GPU 0/2 (3g.40gb) has no activity counter (MIG); 3 processes and 10.8 GiB")
    default = evaluate(IDLE, mig_usage[IDLE.instance_id], RULE, REAL_NOW)
    assert (default.verdict, default.code) == (Verdict.UNKNOWN, ReasonCode.NO_ACTIVITY_COUNTER), default.reason


@pytest.mark.integration
def test_real_prometheus_idle_instance_is_idle_only_with_the_option(mig_usage):
    d = evaluate(IDLE, mig_usage[IDLE.instance_id], OPT_IN, REAL_NOW)
    assert (d.verdict, d.code) == (Verdict.IDLE, ReasonCode.IDLE_NO_PROCESSES), d.reason
    assert d.reason.startswith("all 4 GPU(s) idle: GPU 0/2 (3g.40gb), GPU 0/3 (2g.20gb)") and OPTION in d.reason
    restarted = evaluate(RESTARTED, mig_usage[RESTARTED.instance_id], OPT_IN, REAL_NOW)
    assert (restarted.verdict, restarted.code) == (Verdict.UNKNOWN, ReasonCode.LOW_COVERAGE), restarted.reason
    negative = evaluate(NEGATIVE, mig_usage[NEGATIVE.instance_id], OPT_IN, REAL_NOW)
    assert (negative.verdict, negative.code) == (Verdict.UNKNOWN, ReasonCode.INVALID_DATA), negative.reason
    assert negative.reason.startswith("GPU 0/3: the process count") and "out of range (negative)" in negative.reason
