"""PrometheusMetrics against a real Prometheus filled by promtool backfill, and the same tests against a real
VictoriaMetrics filled through its import API (tests/vmserver.py): the collector must answer alike on both."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufinops.collect.prometheus import (
    FB_USED, GPU_UTIL, GR_ENGINE_ACTIVE, POWER_USAGE, SM_ACTIVE, InstanceMatcher, PrometheusMetrics, PromQL,
    plan_detail,
)
from gpufinops.collect.gpu_snapshot import PROCESSES_METRIC
from gpufinops.config import PrometheusSettings, SecretRef
from gpufinops.model import GpuInstance
from tests.promserver import Series, binaries_missing, dcgm_labels, start_prometheus
from tests.vmserver import binary_missing as vm_missing
from tests.vmserver import start_victoria_metrics

pytestmark = pytest.mark.integration

SCRAPE = 30
WINDOW = 600  # 10 minutes: 20 expected samples
# Real now (rounded to the scrape grid) so the backfill lands in the last hours.
NOW = datetime.fromtimestamp(int(time.time()) // SCRAPE * SCRAPE, timezone.utc)
SENTINEL = 9.223372036854775e18
N_QUERIES = 5  # one per signal (the profiling ratios one), whatever the fleet
ENGINES = ["prometheus", "victoriametrics"]


def grid(n: int = WINDOW // SCRAPE, *, end: datetime = NOW, first: int = 0) -> list[float]:
    """Timestamps of the last n scrapes of the window ending at `end` (the oldest first)."""
    stop = end.timestamp()
    return [stop - WINDOW + SCRAPE * (i + 1) for i in range(first, n)]


def inst(instance_id: str, dns: str = "", ip: str = "") -> GpuInstance:
    return GpuInstance(instance_id, "p4d.24xlarge", "us-east-1", "running",
                       NOW - timedelta(days=3), private_dns=dns, private_ip=ip, gpu_count=8)


def const(metric: str, labels: dict[str, str], value: float, times: list[float]) -> Series:
    return Series(metric, labels, [(t, value) for t in times])


# ------------------------------------------------------------------------ the shared fleet

I_LABEL = inst("i-0aaa00000000000a1", "ip-10-0-1-1.ec2.internal", "10.0.1.1")  # instance_id label
I_HOST_SHORT = inst("i-0aaa00000000000a2", "ip-10-0-1-2.us-west-2.compute.internal", "10.0.1.2")
I_HOST_LOWER = inst("i-0aaa00000000000a3", "ip-10-0-1-3.ec2.internal", "10.0.1.3")
I_HOST_IP = inst("i-0aaa00000000000a4", "ip-10-0-1-4.ec2.internal", "10.0.1.4")
I_HOST_ID = inst("i-030791dc5a37cd257", "ip-10-0-1-5.ec2.internal", "10.0.1.5")  # kops names nodes by id
I_MIG = inst("i-0aaa00000000000a6", "ip-10-0-1-6.ec2.internal", "10.0.1.6")
I_SENTINEL = inst("i-0aaa00000000000a7", "ip-10-0-1-7.ec2.internal", "10.0.1.7")
I_NOTHING = inst("i-0aaa00000000000a8", "ip-10-0-1-8.ec2.internal", "10.0.1.8")
I_STOPPED = inst("i-0aaa00000000000a9", "ip-10-0-1-9.ec2.internal", "10.0.1.9")
I_PODS = inst("i-0aaa00000000000b0", "ip-10-0-2-0.ec2.internal", "10.0.2.0")
I_AGENT_MIG = inst("i-0aaa00000000000b1", "ip-10-0-2-1.ec2.internal", "10.0.2.1")  # gpufinops agent, MIG
FLEET = [I_LABEL, I_HOST_SHORT, I_HOST_LOWER, I_HOST_IP, I_HOST_ID, I_MIG, I_SENTINEL, I_NOTHING, I_STOPPED, I_PODS,
         I_AGENT_MIG]


def fleet_series() -> list[Series]:
    s: list[Series] = []
    full = grid()
    # instance_id label (ec2_sd relabelling), 2 GPUs, with memory and power.
    for g, util in ((0, 5.0), (1, 85.0)):
        labels = dcgm_labels("ip-10-0-1-1", g, instance_id=I_LABEL.instance_id)
        s.append(const(GPU_UTIL, labels, util, full))
        s.append(const(FB_USED, labels, 1000.0 * (g + 1), full))
        s.append(const(POWER_USAGE, labels, 100.0 + g, full))
    # A series claiming another instance id while its Hostname matches I_LABEL's
    # DNS: the instance label wins, so it must not land on I_LABEL.
    s.append(const(GPU_UTIL, dcgm_labels("ip-10-0-1-1", 7, instance_id="i-0ffffffffffffffff"), 99.0, full))
    # Old exporter `Hostname` = short DNS name; new exporter `hostname` = full DNS name.
    s.append(const(GPU_UTIL, dcgm_labels("ip-10-0-1-2", 0), 12.0, full))
    s.append(const(GPU_UTIL, dcgm_labels("ip-10-0-1-3.ec2.internal", 0, hostname_label="hostname"), 13.0, full))
    s.append(const(GPU_UTIL, dcgm_labels("10.0.1.4", 0), 14.0, full))
    s.append(const(GPU_UTIL, dcgm_labels("i-030791dc5a37cd257", 0, model="NVIDIA L4"), 15.0, full))
    # MIG: two slices, GR_ENGINE_ACTIVE only (no GPU_UTIL), ratio 0..1.
    for gi, ratio in (("1", 0.25), ("2", 0.0)):
        labels = dcgm_labels("ip-10-0-1-6", 0, GPU_I_ID=gi, GPU_I_PROFILE="3g.40gb")
        s.append(const(GR_ENGINE_ACTIVE, labels, ratio, full))
        s.append(const(FB_USED, labels, 500.0, full))
    # Sentinels: every 4th activity sample is DCGM's int64 blank, one negative;
    # memory has a 2^47 blank, power a 2147483632 (int32 blank).
    labels = dcgm_labels("ip-10-0-1-7", 0)
    s.append(Series(GPU_UTIL, labels, [(t, SENTINEL if i % 4 == 0 else (-3.0 if i == 5 else 40.0 + i))
                                       for i, t in enumerate(full)]))
    s.append(Series(FB_USED, labels, [(t, 140737488355328.0 if i == 7 else 2048.0) for i, t in enumerate(full)]))
    s.append(Series(POWER_USAGE, labels, [(t, 2147483632.0 if i == 3 else 60.0) for i, t in enumerate(full)]))
    # GPU 1 of the same host reports only sentinels: present, but no valid sample.
    s.append(const(GPU_UTIL, dcgm_labels("ip-10-0-1-7", 1), SENTINEL, full))
    # GPU 2: sentinels AND it stops halfway: the subquery path must not re-count
    # the last sample through the 5-minute lookback.
    s.append(Series(GPU_UTIL, dcgm_labels("ip-10-0-1-7", 2),
                    [(t, SENTINEL if i == 0 else 70.0) for i, t in enumerate(grid(10))]))
    # GPU 3: split in two series by pod labels, a sentinel in the first only:
    # the whole GPU takes the dirty path, both series count.
    pod = dcgm_labels("ip-10-0-1-7", 3)
    s.append(Series(GPU_UTIL, {**pod, "exported_pod": "a"}, [(t, SENTINEL if i == 0 else 20.0)
                                                              for i, t in enumerate(full[:8])]))
    s.append(const(GPU_UTIL, {**pod, "exported_pod": "b"}, 80.0, full[8:]))
    # Exporter went away halfway through the window (clean series).
    s.append(const(GPU_UTIL, dcgm_labels("ip-10-0-1-9", 0), 3.0, grid(10)))
    # Kubernetes: the same GPU seen as two series while pods change.
    base = dcgm_labels("ip-10-0-2-0", 0)
    first, second = full[:12], full[12:]
    s.append(const(GPU_UTIL, {**base, "exported_pod": "train-a", "exported_namespace": "ml"}, 90.0, first))
    s.append(const(GPU_UTIL, {**base, "exported_pod": "train-b", "exported_namespace": "ml"}, 10.0, second))
    # gpufinops agent on a MIG host: memory and process counts per GPU instance, no activity series at all;
    # the second instance's agent came up halfway through the window.
    for gi, processes, times in (("2", 3.0, full), ("3", 0.0, full[10:])):
        labels = {**dcgm_labels("ip-10-0-2-1", 0, GPU_I_ID=gi, GPU_I_PROFILE="3g.40gb", job="gpufinops-agent"),
                  "hostname": "ip-10-0-2-1.ec2.internal"}  # the agent writes both spellings
        s.append(const(FB_USED, labels, 11091.0 if processes else 9.0, times))
        s.append(const(PROCESSES_METRIC, labels, processes, times))
    return s


def start_engine(engine: str, workdir, series: list[Series]):
    """A real Prometheus (promtool backfill) or VictoriaMetrics (import API) holding `series`."""
    missing = binaries_missing() if engine == "prometheus" else vm_missing()
    if missing:
        pytest.skip(missing)
    start = start_prometheus if engine == "prometheus" else start_victoria_metrics
    return start(workdir, series)


@pytest.fixture(scope="module", params=ENGINES)
def fleet_prom(request, tmp_path_factory):
    server = start_engine(request.param, tmp_path_factory.mktemp(f"fleet-{request.param}"), fleet_series())
    yield server
    server.stop()


@pytest.fixture
def engine_factory(request, tmp_path_factory):
    """start(engine, series) -> a server of that engine; all stopped at teardown."""
    servers = []

    def start(engine: str, series: list[Series]):
        servers.append(start_engine(engine, tmp_path_factory.mktemp(engine), series))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def usage(fleet_prom):
    source = PrometheusMetrics(PrometheusSettings(url=fleet_prom.url, scrape_interval_s=SCRAPE))
    result = source.window_usage(FLEET, WINDOW, NOW)
    # The GPUs with sentinels take one more query per signal that has them (activity, memory, power).
    assert source.queries_made == N_QUERIES + 3
    return result


def by_gpu(usage, instance: GpuInstance):
    u = usage[instance.instance_id]
    assert u.error is None
    return {g.gpu: g for g in u.gpus}


def test_every_requested_instance_is_answered(usage):
    assert set(usage) == {i.instance_id for i in FLEET}
    for u in usage.values():
        assert u.window_s == WINDOW and u.expected_samples == 20 and u.error is None


def test_instance_label_maps_and_wins_over_hostname(usage):
    gpus = by_gpu(usage, I_LABEL)
    assert sorted(gpus) == ["0", "1"]  # not the GPU 7 of i-0fff... despite the same Hostname
    g0, g1 = gpus["0"], gpus["1"]
    assert (g0.samples, g0.activity_mean, g0.activity_max) == (20, 5.0, 5.0)
    assert g1.activity_min == 85.0 and g1.activity_signal == GPU_UTIL
    assert g0.fb_used_max_mib == 1000.0 and g1.fb_used_max_mib == 2000.0
    assert g0.power_mean_w == 100.0 and g1.power_mean_w == 101.0
    assert g0.uuid.startswith("GPU-") and g0.model_name == "NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize("instance, util", [
    (I_HOST_SHORT, 12.0),  # Hostname = short DNS name
    (I_HOST_LOWER, 13.0),  # hostname (renamed label) = full DNS name
    (I_HOST_IP, 14.0),  # Hostname = private IP
    (I_HOST_ID, 15.0),  # Hostname = instance id
])
def test_hostname_labels_map_to_instances(usage, instance, util):
    gpus = by_gpu(usage, instance)
    assert list(gpus) == ["0"]
    assert gpus["0"].samples == 20 and gpus["0"].activity_mean == util


def test_mig_slices_use_gr_engine_active_as_percent(usage):
    gpus = by_gpu(usage, I_MIG)
    assert sorted(gpus) == ["0/1", "0/2"]
    busy, idle = gpus["0/1"], gpus["0/2"]
    assert busy.activity_signal == GR_ENGINE_ACTIVE and idle.activity_signal == GR_ENGINE_ACTIVE
    assert busy.activity_mean == pytest.approx(25.0) and busy.samples == 20
    assert idle.activity_max == 0.0 and idle.fb_used_max_mib == 500.0


def test_agent_process_counts_per_mig_instance(usage):
    # Read in the memory query (the tick stays N_QUERIES): max over the window and the number of samples.
    gpus = by_gpu(usage, I_AGENT_MIG)
    assert sorted(gpus) == ["0/2", "0/3"]
    busy, idle = gpus["0/2"], gpus["0/3"]
    assert (busy.samples, busy.processes_max, busy.process_samples, busy.fb_used_max_mib) == (0, 3, 20, 11091.0)
    assert (idle.samples, idle.processes_max, idle.process_samples, idle.fb_used_max_mib) == (0, 0, 10, 9.0)
    assert busy.mig_profile == "3g.40gb" and not busy.invalid and not idle.invalid
    # GPUs of dcgm-exporter have no process count: not read, never zero.
    assert all(g.processes_max is None and g.process_samples == 0 for g in by_gpu(usage, I_LABEL).values())


def test_sentinel_and_negative_samples_are_not_measurements(usage):
    gpus = by_gpu(usage, I_SENTINEL)
    g0 = gpus["0"]
    valid = [40.0 + i for i in range(20) if i % 4 != 0 and i != 5]
    assert g0.samples == len(valid) == 14
    assert g0.activity_max == max(valid) and g0.activity_min == min(valid)
    assert g0.activity_mean == pytest.approx(sum(valid) / len(valid))
    assert g0.fb_used_max_mib == 2048.0 and g0.power_mean_w == pytest.approx(60.0)
    # Only sentinels: the GPU is there but has no data, never zero.
    g1 = gpus["1"]
    assert g1.samples == 0 and g1.activity_mean is None and g1.activity_max is None
    # Sentinel series that stopped halfway: 9 valid samples, not 9 + lookback re-counts.
    assert gpus["2"].samples == 9 and gpus["2"].activity_mean == 70.0
    g3 = gpus["3"]
    assert g3.samples == 7 + 12 and (g3.activity_min, g3.activity_max) == (20.0, 80.0)
    assert g3.activity_mean == pytest.approx((7 * 20.0 + 12 * 80.0) / 19)


def test_too_many_gpus_with_sentinels_are_filtered_server_side(fleet_prom, usage, monkeypatch):
    # A field blank on most of the fleet: the whole-fleet subquery filters the samples instead of reading
    # them all back. It works at scrape-interval steps: never more samples than the raw ones, same figures.
    monkeypatch.setattr("gpufinops.collect.prometheus.detail.MAX_DETAIL_POINTS", 1)
    source = PrometheusMetrics(PrometheusSettings(url=fleet_prom.url, scrape_interval_s=SCRAPE))
    server_side = by_gpu(source.window_usage(FLEET, WINDOW, NOW), I_SENTINEL)
    assert source.queries_made == N_QUERIES + 3
    exact = by_gpu(usage, I_SENTINEL)
    assert sorted(server_side) == sorted(exact)
    for gpu, g in server_side.items():
        assert not g.invalid and (g.dropped_invalid or g.samples == 0), gpu
        assert exact[gpu].samples - 1 <= g.samples <= exact[gpu].samples, gpu
        if g.samples == exact[gpu].samples:
            assert (g.activity_max, g.activity_mean) == (exact[gpu].activity_max, exact[gpu].activity_mean)


def test_instance_without_series_has_no_gpus(usage):
    assert usage[I_NOTHING.instance_id].gpus == ()
    assert usage[I_NOTHING.instance_id].error is None


def test_series_that_stops_halfway_has_half_the_samples(usage):
    g = by_gpu(usage, I_STOPPED)["0"]
    assert g.samples == 10 and usage[I_STOPPED.instance_id].expected_samples == 20


def test_series_split_by_pod_labels_are_one_gpu(usage):
    gpus = by_gpu(usage, I_PODS)
    assert list(gpus) == ["0"]
    g = gpus["0"]
    assert g.samples == 20 and g.activity_max == 90.0 and g.activity_min == 10.0
    assert g.activity_mean == pytest.approx((12 * 90.0 + 8 * 10.0) / 20)


def test_window_ending_later_sees_fewer_samples(fleet_prom):
    # Five minutes after NOW only the last half of the data is in the window.
    # (A fractional timeout must reach Prometheus as a duration it accepts.)
    source = PrometheusMetrics(PrometheusSettings(url=fleet_prom.url, timeout_s=2.5))
    later = source.window_usage([I_LABEL], WINDOW, NOW + timedelta(minutes=5))
    assert {g.gpu: g.samples for g in later[I_LABEL.instance_id].gpus} == {"0": 10, "1": 10}


@pytest.mark.parametrize("engine", ENGINES)
def test_query_count_does_not_grow_with_fleet(engine_factory, engine):
    hosts = [inst(f"i-{n:017x}", f"ip-10-9-{n // 200}-{n % 200}.ec2.internal") for n in range(50)]
    series = [const(GPU_UTIL, dcgm_labels(h.private_dns.split(".")[0], g), 20.0, grid())
              for h in hosts for g in range(2)]
    server = engine_factory(engine, series)
    small = PrometheusMetrics(PrometheusSettings(url=server.url))
    large = PrometheusMetrics(PrometheusSettings(url=server.url))
    small_usage = small.window_usage(hosts[:2], WINDOW, NOW)
    large_usage = large.window_usage(hosts, WINDOW, NOW)
    assert small.queries_made == large.queries_made == N_QUERIES
    assert all(len(u.gpus) == 2 and u.gpus[0].samples == 20 for u in large_usage.values())
    assert len(small_usage) == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_backfill_thirty_days_old_is_queryable(engine_factory, engine):
    old = NOW - timedelta(days=30)
    labels = dcgm_labels("ip-10-0-1-1", 0, instance_id=I_LABEL.instance_id)
    server = engine_factory(engine, [const(GPU_UTIL, labels, 33.0, grid(end=old)),
                                     const(GPU_UTIL, labels, 66.0, grid())])
    source = PrometheusMetrics(PrometheusSettings(url=server.url))
    then = source.window_usage([I_LABEL], WINDOW, old)[I_LABEL.instance_id].gpus
    recent = source.window_usage([I_LABEL], WINDOW, NOW)[I_LABEL.instance_id].gpus
    assert (then[0].samples, then[0].activity_mean) == (20, 33.0)
    assert (recent[0].samples, recent[0].activity_mean) == (20, 66.0)


# ------------------------------------------------------------------------ failures


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again on exit: nothing listens


def test_prometheus_down_gives_an_error_for_every_instance():
    source = PrometheusMetrics(PrometheusSettings(url=f"http://127.0.0.1:{_closed_port()}", timeout_s=2))
    usage = source.window_usage(FLEET, WINDOW, NOW)
    assert set(usage) == {i.instance_id for i in FLEET}
    for u in usage.values():
        assert u.gpus == () and "cannot connect" in u.error


@pytest.fixture
def silent_server():
    """Accepts TCP connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_query_timeout_gives_an_error(silent_server):
    source = PrometheusMetrics(PrometheusSettings(url=silent_server, timeout_s=0.3))
    usage = source.window_usage([I_LABEL, I_MIG], WINDOW, NOW)
    assert all("timed out" in u.error and u.gpus == () for u in usage.values())
    assert source.queries_made == N_QUERIES  # sent concurrently; one error is enough


def test_http_error_from_prometheus_gives_an_error(fleet_prom):
    # A broken selector in the settings: Prometheus answers 400 (parse error), VictoriaMetrics 422.
    source = PrometheusMetrics(PrometheusSettings(url=fleet_prom.url, selector='job="dcgm'))
    usage = source.window_usage([I_LABEL], WINDOW, NOW)
    assert "HTTP 400" in usage[I_LABEL.instance_id].error or \
        "HTTP 422" in usage[I_LABEL.instance_id].error


class _Recorder(BaseHTTPRequestHandler):
    body = b""
    seen: list[dict[str, str]] = []

    def do_GET(self):  # noqa: N802 - http.server API
        type(self).seen.append(dict(self.headers))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture
def fake_api():
    """A local HTTP server answering every query with `body`, recording headers."""
    handler = type("Handler", (_Recorder,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("body", [
    b"<html>proxy error</html>",
    json.dumps({"status": "success", "data": {"resultType": "vector",
                                              "result": [{"metric": {"agg": "max"}, "value": "oops"}]}}).encode(),
    json.dumps({"status": "success", "data": {"resultType": "matrix", "result": {"x": 1}}}).encode(),
])
def test_malformed_answer_gives_an_error(fake_api, body):
    handler, url = fake_api
    handler.body = body
    usage = PrometheusMetrics(PrometheusSettings(url=url)).window_usage([I_LABEL], WINDOW, NOW)
    error = usage[I_LABEL.instance_id].error
    if body.startswith(b"<"):  # not the API's JSON at all: the URL points at another server (issue 40)
        assert "this is not a Prometheus API" in error and "(proxy error)" in error
    else:
        assert "malformed" in error


def test_bearer_token_is_sent_and_never_in_errors(fake_api, monkeypatch):
    handler, url = fake_api
    handler.body = b"not json"
    monkeypatch.setenv("TEST_PROM_TOKEN", "s3cr3t-token")
    settings = PrometheusSettings(url=url, bearer_token=SecretRef(env="TEST_PROM_TOKEN"))
    usage = PrometheusMetrics(settings).window_usage([I_LABEL], WINDOW, NOW)
    assert handler.seen[0]["Authorization"] == "Bearer s3cr3t-token"
    assert "s3cr3t" not in usage[I_LABEL.instance_id].error


# ------------------------------------------------------------------------ pure parts


def test_matcher_ignores_pod_labels_and_unknown_hosts():
    m = InstanceMatcher.build([I_HOST_SHORT], "instance_id", ("Hostname", "hostname"))
    assert m.match({"hostname": "IP-10-0-1-2", "exported_pod": "x"}) == I_HOST_SHORT.instance_id
    assert m.match({"Hostname": "ip-10-0-1-2.us-west-2.compute.internal"}) == I_HOST_SHORT.instance_id
    assert m.match({"Hostname": "ip-10-0-1-99", "exported_pod": "ip-10-0-1-2"}) is None


def test_matcher_refuses_hostnames_shared_by_two_instances():
    twin = inst("i-0bbb00000000000b2", "ip-10-0-1-2.eu-west-1.compute.internal", "10.0.1.2")
    m = InstanceMatcher.build([I_HOST_SHORT, twin], "instance_id", ("Hostname", "hostname"))
    assert m.match({"Hostname": "ip-10-0-1-2"}) is None and m.match({"Hostname": "10.0.1.2"}) is None
    # The full DNS names differ, so they still decide.
    assert m.match({"hostname": "ip-10-0-1-2.eu-west-1.compute.internal"}) == twin.instance_id
    assert m.match({"instance_id": twin.instance_id, "Hostname": "ip-10-0-1-2"}) == twin.instance_id


def test_query_text_does_not_depend_on_fleet_and_uses_selector():
    q = PromQL(selector='job="dcgm"').queries(WINDOW)
    assert len(q) == N_QUERIES
    assert {metric for metric, _ in q} == {GPU_UTIL, GR_ENGINE_ACTIVE, FB_USED, POWER_USAGE, SM_ACTIVE}
    assert all('{job="dcgm"}[599999ms]' in text for text in q.values())
    assert "i-" not in "".join(q.values())


def test_detail_is_planned_only_for_requested_gpus_with_invalid_samples():
    promql = PromQL()
    matcher = InstanceMatcher.build([I_LABEL], "instance_id", ("Hostname", "hostname"))

    def row(gpu: int, agg: str, value: float, uuid: bool = True, iid: str = I_LABEL.instance_id):
        labels = {"instance_id": iid, "gpu": str(gpu), "agg": agg, **({"UUID": f"GPU-{gpu}.x"} if uuid else {})}
        return labels, agg, value

    clean = {GPU_UTIL: [row(0, "max", 50.0), row(0, "count", 20.0), row(1, "min", 0.0)]}
    assert plan_detail(promql, clean, matcher, WINDOW, 20).queries == {}
    dirty = {GPU_UTIL: [row(0, "max", SENTINEL), row(1, "sum", float("nan")), row(2, "min", -1.0, uuid=False),
                        row(3, "max", SENTINEL, iid="i-0fffffffffffffff0")],  # not requested: not read
             FB_USED: [row(0, "max", 512.0)]}
    plan = plan_detail(promql, dirty, matcher, WINDOW, 20)
    assert {(m, ident[3]) for m, ident in plan.pairs} == {(GPU_UTIL, "0"), (GPU_UTIL, "1"), (GPU_UTIL, "2")}
    assert sorted(plan.queries.values()) == [
        'DCGM_FI_DEV_GPU_UTIL{UUID=~"GPU-0\\\\.x|GPU-1\\\\.x"}[599999ms]',  # RE2 metacharacters escaped
        'DCGM_FI_DEV_GPU_UTIL{instance_id=~"i-0aaa00000000000a1"}[599999ms]',  # no UUID: its host label
    ]
    many = {GPU_UTIL: [row(g, "max", SENTINEL) for g in range(250)]}
    assert len(plan_detail(promql, many, matcher, WINDOW, 20).queries) == 3  # 100 GPUs per query (URL size)
    assert [k[1] for k in plan_detail(promql, many, matcher, WINDOW, 20, max_points=4999).queries] == ["dirty"]


def test_fold_gives_plain_figures_whatever_order_the_answers_land_in():
    """UsageFold fed one answer at a time, in every order they may land in, gives the figures a plain computation
    over the same numbers gives: a GPU whose series changed identity mid-window (dcgm-exporter renamed Hostname to
    hostname) is one GPU, its counts and sums added; a GPU with a sentinel counts only its valid raw samples; an
    implausible count makes its GPU invalid; a GPU missing from one answer has no figure for it (None, never 0);
    a GPU of another instance is left out."""
    from itertools import permutations

    from gpufinops.collect.prometheus import CLEAN, RAW, UsageFold

    iid = I_LABEL.instance_id

    def labels(gpu: str, host_label: str = "Hostname", iid: str = iid) -> dict[str, str]:
        return {"instance_id": iid, host_label: "ip-10-0-1-1", "gpu": gpu, "UUID": f"GPU-{gpu}",
                "modelName": "NVIDIA A100-SXM4-80GB"}

    def rows(gpu_labels: dict[str, str], **aggs: float) -> list:
        return [({**gpu_labels, "agg": agg}, agg, value) for agg, value in aggs.items()]

    split_before, split_after = labels("1"), labels("1", host_label="hostname")
    answers = {
        (GPU_UTIL, CLEAN): [
            *rows(labels("0"), count=20.0, sum=1000.0, max=90.0, min=10.0),
            *rows(split_before, count=8.0, sum=400.0, max=60.0, min=40.0),
            *rows(split_after, count=12.0, sum=960.0, max=95.0, min=70.0),
            *rows(labels("2"), count=20.0, sum=SENTINEL, max=SENTINEL, min=50.0),  # a sentinel among its samples
            *rows(labels("3"), count=20.5, sum=100.0, max=5.0, min=5.0),  # no query answers half a sample
            *rows(labels("4"), count=20.0, sum=0.0, max=0.0, min=0.0),
            *rows(labels("7", iid="i-0fffffffffffffff0"), count=20.0, sum=0.0, max=0.0, min=0.0),
        ],
        (FB_USED, CLEAN): [*rows(labels("0"), max=1000.0), *rows(split_before, max=500.0),
                           *rows(split_after, max=700.0), *rows(labels("2"), max=100.0),
                           *rows(labels("3"), max=1.0), *rows(labels("4"), max=0.0)],
        (POWER_USAGE, CLEAN): [*rows(labels("0"), count=20.0, sum=2000.0, min=90.0),
                               *rows(split_before, count=8.0, sum=800.0, min=100.0),
                               *rows(labels("2"), count=20.0, sum=1000.0, min=40.0),
                               *rows(labels("3"), count=20.0, sum=1000.0, min=40.0)],  # not "4": no power read
        (GPU_UTIL, RAW): [({**labels("2"), "pod": "p"}, "sample", v) for v in (50.0, 70.0, 60.0)],
    }
    matcher = InstanceMatcher.build([I_LABEL], "instance_id", ("Hostname", "hostname"))
    detailed = plan_detail(PromQL(), {m: r for (m, kind), r in answers.items() if kind == CLEAN}, matcher, WINDOW,
                           20).pairs
    assert {(m, ident[3]) for m, ident in detailed} == {(GPU_UTIL, "2")}

    results = []
    for order in permutations(answers):
        fold = UsageFold([I_LABEL], WINDOW, 20)
        for key in order:
            fold.add(key, answers[key], detailed)
        results.append(fold.usage())
    assert all(r == results[0] for r in results)

    gpus = {g.gpu: g for g in results[0][iid].gpus}
    assert list(gpus) == ["0", "1", "2", "3", "4"]  # not "7": another instance's
    figures = {k: (g.samples, g.activity_mean, g.activity_max, g.activity_min, g.fb_used_max_mib, g.power_mean_w,
                   g.dropped_invalid) for k, g in gpus.items() if k != "3"}
    assert figures == {
        "0": (20, 50.0, 90.0, 10.0, 1000.0, 100.0, False),
        "1": (20, (400.0 + 960.0) / 20, 95.0, 40.0, 700.0, 100.0, False),
        "2": (3, 60.0, 70.0, 50.0, 100.0, 50.0, True),  # its valid raw samples only
        "4": (20, 0.0, 0.0, 0.0, 0.0, None, False),
    }
    assert gpus["3"].invalid == ("the activity sample count read from Prometheus is out of range "
                                 "(not a whole number)")
    assert gpus["3"].samples == 0 and gpus["3"].activity_mean is None and gpus["3"].power_mean_w is None
