"""Backtest history from a real Prometheus (range queries, server-side step)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpufinops.backtest.engine import backtest
from gpufinops.backtest.prometheus import load_prometheus
from gpufinops.backtest.traces import from_arrays
from gpufinops.cli import main
from gpufinops.config import ConfigError
from gpufinops.rules import load_rules
from tests.promserver import Series, dcgm_labels

ROOT = Path(__file__).resolve().parents[2]
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def night(minutes: int) -> np.ndarray:
    return np.concatenate([np.full(60, 80.0), np.zeros(minutes - 120), np.full(60, 80.0)])


@pytest.mark.integration
def test_prometheus_history_backtests_like_the_same_trace_from_a_file(prometheus_factory, tmp_path, capsys):
    n = 300
    a, b = night(n), np.full(n, 70.0)
    b[100:110] = 9.2e18  # DCGM sentinel: not a measurement
    series = [
        Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels("host-a", 0, instance_id="i-a"),
               [(START + 60 * k, float(v)) for k, v in enumerate(a)]),
        Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels("host-b", 0, instance_id="i-b", hostname_label="hostname"),
               [(START + 60 * k, float(v)) for k, v in enumerate(b)]),
    ]
    server = prometheus_factory(series)
    trace = load_prometheus(server.url, START, START + 60 * (n - 1), 60)
    assert trace.instance_ids == ("i-a", "i-b") and trace.n_steps == n
    np.testing.assert_array_equal(trace.util[0], a)
    assert np.isnan(trace.util[1, 100:110]).all()

    rules = load_rules([ROOT / "rules" / "examples" / "common-40pct-10min.yaml", ROOT / "rules" / "zero-activity.yaml"])
    from_prom = backtest(trace, rules)
    from_file = backtest(from_arrays(np.vstack([a, np.where(b > 1e9, np.nan, b)]), step_s=60, t0=START), rules)
    assert [s.to_dict() for s in from_prom] == [s.to_dict() for s in from_file]
    assert from_prom[0].stops == 1

    rc = main(["backtest", "--prometheus", server.url, "--start", str(START), "--end", str(START + 60 * (n - 1)),
               "--step", "60s", "--rules", *map(str, [ROOT / "rules" / "examples" / "common-40pct-10min.yaml", ROOT / "rules" / "zero-activity.yaml"])])
    assert rc == 0
    assert "gpu-util-below-40pct-10m" in capsys.readouterr().out

    with pytest.raises(ConfigError, match="no DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL series"):
        load_prometheus(server.url, START - 86400 * 30, START - 86400 * 29, 60)


# --------------------------------------------------------------------------- one reader (issue 12)
#
# The backtest and right-sizing read Prometheus as the live collector does: the same
# signals (GR engine activity where there is no GPU_UTIL), labels (instance id, Hostname or hostname), auth,
# TLS and errors (QueryFailed). One real Prometheus for the module; a recording proxy in front of it checks
# what the readers send.

N_STEPS = 30
SPAN_END = START + 60 * (N_STEPS - 1)


def _steps(value: float) -> list[tuple[float, float]]:
    return [(START + 60 * k, value) for k in range(N_STEPS)]


@pytest.fixture(scope="module")
def fleet_prom(tmp_path_factory):
    from tests.promserver import binaries_missing, start_prometheus

    if binaries_missing():
        pytest.skip(binaries_missing())
    mig = {"GPU_I_PROFILE": "3g.40gb"}
    series = [
        # A MIG-only host: two slices of GPU 0, GR engine activity (a ratio) and no DCGM_FI_DEV_GPU_UTIL at all.
        Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dcgm_labels("mig-host", 0, instance_id="i-mig", GPU_I_ID="1", **mig),
               _steps(0.5)),
        Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dcgm_labels("mig-host", 0, instance_id="i-mig", GPU_I_ID="2", **mig),
               _steps(0.0)),
        # A GPU with both signals: the GR engine's is the one read (as the live collector prefers it, issue 25),
        # except where its sample is a DCGM sentinel: there GPU_UTIL's valid sample, per step.
        Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels("both-host", 0, instance_id="i-both"), _steps(40.0)),
        Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dcgm_labels("both-host", 0, instance_id="i-both"),
               [(t, 9.2e18 if 10 <= k < 13 else v) for k, (t, v) in enumerate(_steps(0.9))]),
        # No instance id label: named by the old dcgm-exporter's `Hostname`, and the new one's `hostname`.
        Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels("ip-10-0-0-7", 0), _steps(30.0)),
        Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels("ip-10-0-0-8", 0, hostname_label="hostname"), _steps(60.0)),
    ]
    series += [Series("DCGM_FI_DEV_FB_USED", s.labels, _steps(1024.0)) for s in series[:2]]
    server = start_prometheus(tmp_path_factory.mktemp("prom-one-reader"), series)
    yield server
    server.stop()


class AuthProxy:
    """A reverse proxy on 127.0.0.1 in front of a real Prometheus: records each request's Authorization
    header and answers 401 unless it is the expected one."""

    def __init__(self, upstream: str, expected_auth: str):
        import http.server
        import threading
        import urllib.error
        import urllib.request

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                got = self.headers.get("Authorization")
                seen.append(got)
                if got != expected_auth:
                    status, body = 401, b'{"status":"error","error":"unauthorized"}'
                else:
                    try:
                        with urllib.request.urlopen(upstream + self.path, timeout=30) as resp:
                            status, body = resp.status, resp.read()
                    except urllib.error.HTTPError as exc:
                        status, body = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def auth_proxy(fleet_prom):
    import base64

    proxy = AuthProxy(fleet_prom.url, "Basic " + base64.b64encode(b"gpufinops:s3cret").decode())
    yield proxy
    proxy.close()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_a_mig_only_fleet_replays_its_gr_engine_activity_and_both_hostname_labels_map(fleet_prom):
    trace = load_prometheus(fleet_prom.url, START, SPAN_END, 60)
    assert trace.instance_ids == ("i-both", "i-mig", "ip-10-0-0-7", "ip-10-0-0-8")
    by_gpu = {(trace.instance_ids[i], g): trace.util[k] for k, (i, g) in enumerate(zip(trace.gpu_instance,
                                                                                       trace.gpu_names))}
    assert set(by_gpu) == {("i-both", "0"), ("i-mig", "0/1"), ("i-mig", "0/2"), ("ip-10-0-0-7", "0"),
                           ("ip-10-0-0-8", "0")}
    np.testing.assert_array_equal(by_gpu[("i-mig", "0/1")], np.full(N_STEPS, 50.0))  # ratio 0.5 -> 50%
    np.testing.assert_array_equal(by_gpu[("i-mig", "0/2")], np.zeros(N_STEPS))
    # The GR engine's 90%, not GPU_UTIL's 40%: the backtest used to prefer GPU_UTIL while the live collector
    # (collect.prometheus `_Gpu.stats`) prefers the GR engine where a GPU has both, so a replay could call a GPU
    # idle that the service would not (or the reverse). Since issue 25 both read the same counter first ...
    both = np.full(N_STEPS, 90.0)
    both[10:13] = 40.0  # ... and where the GR engine holds a sentinel, GPU_UTIL's valid sample (per step)
    np.testing.assert_array_equal(by_gpu[("i-both", "0")], both)
    np.testing.assert_array_equal(by_gpu[("ip-10-0-0-7", "0")], np.full(N_STEPS, 30.0))
    np.testing.assert_array_equal(by_gpu[("ip-10-0-0-8", "0")], np.full(N_STEPS, 60.0))


@pytest.mark.integration
def test_every_reader_sends_the_basic_auth_of_the_settings(fleet_prom, auth_proxy, tmp_path, monkeypatch, capsys):
    from datetime import UTC, datetime, timedelta

    from gpufinops.collect.errors import QueryFailed
    from gpufinops.collect.prometheus import PrometheusMetrics
    from gpufinops.config import PrometheusSettings
    from gpufinops.model import GpuInstance
    from gpufinops.recommend.usage import PrometheusUsage

    monkeypatch.setenv("TEST_PROM_PASSWORD", "s3cret")
    settings = PrometheusSettings(url=auth_proxy.url, basic_auth_user="gpufinops",
                                  basic_auth_password={"env": "TEST_PROM_PASSWORD"}, scrape_interval_s=60)
    with pytest.raises(QueryFailed, match="401"):  # the proxy does refuse a reader without the password
        load_prometheus(auth_proxy.url, START, SPAN_END, 60)

    trace = load_prometheus(settings, START, SPAN_END, 60)
    assert trace.instance_ids == ("i-both", "i-mig", "ip-10-0-0-7", "ip-10-0-0-8")

    now = datetime.fromtimestamp(SPAN_END, UTC)
    mig = GpuInstance("i-mig", "p4d.24xlarge", "us-east-1", "running", now - timedelta(days=60))
    usage = PrometheusUsage(settings).fleet_usage([mig], 1800, now, 60, 86400)
    assert usage.instances["i-mig"].error is None
    assert [(g.gpu, g.signal, g.activity_max) for g in usage.instances["i-mig"].gpus] == [
        ("0/1", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 50.0), ("0/2", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.0)]

    live = PrometheusMetrics(settings).window_usage([mig], 600, now)
    assert live["i-mig"].error is None and len(live["i-mig"].gpus) == 2

    # The CLI: the config's basic auth reaches Prometheus through `gpufinops backtest`.
    config = tmp_path / "gpufinops.yaml"
    config.write_text(f"prometheus:\n  url: {auth_proxy.url}\n  basic_auth_user: gpufinops\n"
                      f"  basic_auth_password: {{env: TEST_PROM_PASSWORD}}\n")
    rc = main(["--config", str(config), "backtest", "--prometheus", "--start", str(START), "--end", str(SPAN_END),
               "--step", "60s", "--rules", str(ROOT / "rules" / "zero-activity.yaml")])
    assert rc == 0, capsys.readouterr().err
    assert auth_proxy.seen[0] is None and set(auth_proxy.seen[1:]) == {auth_proxy.seen[1]}
    assert "s3cret" not in capsys.readouterr().err


@pytest.mark.integration
def test_prometheus_down_is_a_failed_query_not_a_config_error(capsys):
    from gpufinops.collect.errors import QueryFailed

    port = _closed_port()
    with pytest.raises(QueryFailed, match=f"^prometheus at 127.0.0.1:{port}: cannot connect$"):
        load_prometheus(f"http://127.0.0.1:{port}", START, SPAN_END, 60)
    # The CLI: one line, exit 1 (a data source failed), not 2 (the command could not run as asked).
    rc = main(["backtest", "--prometheus", f"http://127.0.0.1:{port}", "--start", str(START), "--end", str(SPAN_END),
               "--step", "60s", "--rules", str(ROOT / "rules" / "zero-activity.yaml")])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[backtest]")]
    assert rc == 1
    assert err == [f"error: prometheus at 127.0.0.1:{port}: cannot connect"]


@pytest.mark.integration
def test_a_replay_carries_sm_activity_where_prometheus_has_it_and_a_file_trace_can_too(prometheus_factory,
                                                                                     tmp_path):
    """Profiling columns are optional (issue 25): read where the history has DCGM_FI_PROF_SM_ACTIVE, from a real
    Prometheus or a file column, and applied as the live evaluate() applies them."""
    n = 300
    quiet = np.zeros(n)  # activity says idle the whole time ...
    sm = np.full(n, 0.5)  # ... SM activity says half the SM cycles work (dcgm-exporter issue #662)
    labels = dcgm_labels("host-p", 0, instance_id="i-prof")
    server = prometheus_factory([
        Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, [(START + 60 * k, v / 100) for k, v in enumerate(quiet)]),
        Series("DCGM_FI_PROF_SM_ACTIVE", labels,
               [(START + 60 * k, 2.0 ** 47 if k == 5 else v) for k, v in enumerate(sm)]),  # one DCGM blank
        Series("DCGM_FI_DEV_GPU_UTIL", dcgm_labels("host-q", 0, instance_id="i-plain"),
               [(START + 60 * k, v) for k, v in enumerate(quiet)]),
    ])
    trace = load_prometheus(server.url, START, START + 60 * (n - 1), 60)
    assert trace.instance_ids == ("i-plain", "i-prof") and "DCGM_FI_PROF_SM_ACTIVE" in trace.source
    assert np.isnan(trace.sm_active[0]).all()  # i-plain: no SM series
    expected = sm.copy()
    expected[5] = np.nan
    np.testing.assert_array_equal(trace.sm_active[1], expected)

    rules = load_rules([ROOT / "rules" / "zero-activity.yaml"])
    from dataclasses import replace

    with_sm = backtest(trace, rules)
    without = backtest(replace(trace, sm_active=None), rules)
    assert without[0].stops == 2 and with_sm[0].stops == 1  # i-prof is never called idle: UNKNOWN

    # The same history as a file, SM activity in percent: the same replay.
    path = tmp_path / "trace.csv"
    rows = ["instance_id,gpu,timestamp,utilization,sm_active_pct"]
    rows += [f"i-plain,0,{START + 60 * k:.0f},{quiet[k]}," for k in range(n)]
    rows += [f"i-prof,0,{START + 60 * k:.0f},{quiet[k]},{'' if k == 5 else sm[k] * 100}" for k in range(n)]
    path.write_text("\n".join(rows) + "\n")
    from gpufinops.backtest.traces import load_trace

    from_file = load_trace(path)
    np.testing.assert_allclose(from_file.sm_active, trace.sm_active)
    assert [s.to_dict() for s in backtest(from_file, rules)] == [s.to_dict() for s in with_sm]
