"""Rented GPU hosts without a cloud API (issue 17 item 4): the `hosts:` inventory as a Cloud, priced and marked
as an estimate wherever its price is one, judged like any instance and never stopped centrally; and the agent's
local autostop pricing its own host.

The end-to-end tests run the real tick (`pipeline.run_once`) on a real Prometheus holding series shaped as
`gpufinops agent` exports them, and the real autostop loop on the fake nvidia-smi replaying an H100 capture.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client import generate_latest

from gpufinops.act.plan import plan, stop_blocker
from gpufinops.agent.autostop.loop import LocalHost, host_instance as autostop_host_instance, local_host_price
from gpufinops.agent.autostop.settings import PriceSettings
from gpufinops.prices.catalog import load_catalog
from gpufinops.places.ec2.cloud import CloudError
from gpufinops.collect.prometheus import PrometheusMetrics
from gpufinops.places.hosts import MANAGED_ADVICE, MANAGED_BY, StaticHostsCloud, static_hosts_cloud
from gpufinops.config import PrometheusSettings, load_settings
from gpufinops.prices.host_prices import KIND_ESTIMATE, KIND_HOST, host_price
from gpufinops.notify.messages import idle_notice, idle_warning, stopped
from gpufinops.model import (
    Action, ActionKind, Decision, GpuInstance, ReasonCode, Rule, RunContext, Verdict,
)

CATALOG = load_catalog()
H100_NAME = "NVIDIA H100 80GB HBM3"
ESTIMATED_H100_X8 = host_price("x", H100_NAME, 8, None, CATALOG).usd_per_hour

CONFIG = """\
hosts:
  usd_per_gpu_hour: {A100-80GB: 1.6}
  inventory:
    - {hostname: gpu-box-1, gpu_model: NVIDIA H100 80GB HBM3, gpu_count: 8, usd_per_hour: 19.9,
       tags: {owner: alice, team: ml}, region: hetzner fsn1}
    - {hostname: gpu-box-2, gpu_model: A100-80GB, gpu_count: 4}
    - {hostname: gpu-box-3, gpu_model: H100, gpu_count: 8, tags: {owner: bob}}
"""


@pytest.fixture()
def cloud(tmp_path) -> StaticHostsCloud:
    path = tmp_path / "gpufinops.yaml"
    path.write_text(CONFIG)
    built = static_hosts_cloud(load_settings(path))
    assert built is not None
    return built


def test_one_instance_per_listed_host_priced_in_order(cloud, tmp_path):
    one, two, three = cloud.list_gpu_instances()
    assert [i.instance_id for i in (one, two, three)] == ["host:gpu-box-1", "host:gpu-box-2", "host:gpu-box-3"]
    assert [i.private_dns for i in (one, two, three)] == ["gpu-box-1", "gpu-box-2", "gpu-box-3"]  # the agent's label
    assert {(i.provider, i.state, i.managed_by, i.managed_advice) for i in (one, two, three)} == {
        ("rented", "running", MANAGED_BY, MANAGED_ADVICE)}
    assert (one.gpu_count, one.gpu_model, one.region, one.owner(), one.team()) == (
        8, H100_NAME, "hetzner fsn1", "alice", "ml")
    assert (one.hourly_cost, one.price_source) == (19.9, f"the price of gpu-box-1 in the hosts: section of "
                                                         f"{tmp_path / 'gpufinops.yaml'}")
    assert two.hourly_cost == pytest.approx(6.4) and two.price_source.startswith("4 × A100-80GB at $1.60/GPU-h")
    assert three.hourly_cost == pytest.approx(ESTIMATED_H100_X8)
    assert three.price_source.startswith("estimate: 8 × H100 at $")
    assert cloud.describe(["host:gpu-box-3", "i-0nothere"]) == [three]


def test_no_hosts_section_or_an_empty_inventory_is_no_cloud():
    assert static_hosts_cloud(load_settings(None)) is None
    assert static_hosts_cloud(load_settings(None, hosts={"inventory": []})) is None


@pytest.mark.parametrize("call", ["set_tags", "remove_tags", "stop", "terminate"])
def test_every_mutating_call_is_refused_definitely(cloud, call):
    inst = cloud.instances[0]
    args = {"set_tags": ({"a": "b"},), "remove_tags": (["a"],)}.get(call, ())
    with pytest.raises(CloudError) as err:
        getattr(cloud, call)(inst, *args)
    assert err.value.definite is True and err.value.code == "NoCloudApi"  # nothing was called: certainly not done
    assert "host:gpu-box-1" in str(err.value) and "gpufinops agent --autostop" in str(err.value)


def idle(inst: GpuInstance, now: datetime, action: Action = Action.STOP) -> Decision:
    return Decision(inst.instance_id, "idle-2h", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "all 8 GPU(s) idle", now,
                    action=action, window_s=7200, activity_mean=0.0, activity_max=0.0, hourly_cost=inst.hourly_cost)


def test_the_act_stage_reports_a_rented_host_as_managed_and_never_plans_a_stop(cloud):
    now = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
    inst = cloud.instances[2]
    blocker = stop_blocker(inst, Action.STOP)
    assert blocker == (f"managed by {MANAGED_BY}: never stopped by gpufinops; instead: {MANAGED_ADVICE}")
    assert stop_blocker(inst, Action.TERMINATE) == blocker
    for dry_run in (True, False):
        intent = plan(inst, idle(inst, now), None, None, now, dry_run)
        assert intent.kind == ActionKind.NOTIFY and blocker in intent.reason  # told once, never marked
        assert plan(inst, idle(inst, now, Action.TERMINATE), None, None, now, dry_run).kind == ActionKind.NOTIFY


# --------------------------------------------------------------------------- messages

def test_messages_mark_an_estimated_price_and_only_that(cloud):
    now = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
    priced, estimated = cloud.instances[0], cloud.instances[2]
    money = f"${ESTIMATED_H100_X8:,.2f}/h"
    for inst, marked in ((estimated, True), (priced, False)):
        d = idle(inst, now)
        msgs = [idle_warning(inst, d, marked_at=now, stop_at=now + timedelta(minutes=15), channel="#c", dry_run=True,
                             action=Action.STOP),
                stopped(inst, d, at=now, channel="#c", dry_run=False, action=Action.STOP),
                idle_notice(inst, d, since=now, channel="#c")]
        for msg in msgs:
            shown = msg.text + repr(msg.facts)
            assert ("(estimate" in shown) is marked, msg.text
        if marked:
            assert f"Cost {money} (estimate)." in msgs[0].text
            fields = repr(msgs[0].facts)
            assert f"{money} (estimate, ≈ ${ESTIMATED_H100_X8 * 24:,.0f}/day)" in fields
            assert f"Saves {money} (estimate) for every hour" in msgs[1].text
    unpriced = GpuInstance("host:x", "rented", "", "running", now, price_source="estimate: nothing")
    assert "(estimate" not in idle_notice(unpriced, idle(unpriced, now), since=now, channel="#c").text  # unknown $/h


# --------------------------------------------------------------------------- the real tick on a real Prometheus

SCRAPE = 30
WINDOW = 600
REAL_NOW = datetime.fromtimestamp(int(time.time()) // SCRAPE * SCRAPE, timezone.utc)


@pytest.fixture(scope="module")
def agent_prom(tmp_path_factory):
    from tests.promserver import Series, binaries_missing, dcgm_labels, start_prometheus

    if binaries_missing():
        pytest.skip(binaries_missing())
    stop = REAL_NOW.timestamp()
    ts = [stop - 2 * WINDOW + SCRAPE * (i + 1) for i in range(2 * WINDOW // SCRAPE)]
    series = []
    for host, util in (("gpu-box-3", 0.0), ("gpu-box-1", 87.0)):  # the agent exports `hostname` (dcgm-exporter 2026)
        for gpu in range(8):
            labels = dcgm_labels(host, gpu, model=H100_NAME, hostname_label="hostname", job="gpufinops-agent")
            series.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, util) for t in ts]))
    server = start_prometheus(tmp_path_factory.mktemp("rented"), series)
    yield server
    server.stop()


class Recording(StaticHostsCloud):
    """The static cloud, recording any mutating call the tick tries (there must be none)."""

    calls: list[str]

    def stop(self, inst):
        self.calls.append("stop")
        return super().stop(inst)

    def set_tags(self, inst, tags):
        self.calls.append("set_tags")
        return super().set_tags(inst, tags)


@pytest.mark.integration
def test_the_tick_judges_rented_hosts_from_the_agents_series_and_tells_with_the_estimate(agent_prom, tmp_path):
    from gpufinops.run.pipeline import Peers, run_once
    from gpufinops.demo.sim import ConsoleNotifier
    from gpufinops.store.store import Store

    path = tmp_path / "gpufinops.yaml"
    path.write_text(CONFIG)
    settings = load_settings(path, act={"dry_run": False, "max_stops_fraction": 1.0})
    built = static_hosts_cloud(settings)
    cloud = Recording(settings.hosts, CATALOG)
    cloud.calls = []
    assert [i.hourly_cost for i in cloud.instances] == [i.hourly_cost for i in built.instances]
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    notifier = ConsoleNotifier(store, lambda: REAL_NOW, printer=lambda _line: None)
    metrics = PrometheusMetrics(PrometheusSettings(url=agent_prom.url, scrape_interval_s=SCRAPE))
    rule = Rule(name="idle-10m", threshold_pct=10, window_s=WINDOW, min_coverage=0.8, action=Action.STOP)
    report = run_once(RunContext(now=REAL_NOW, dry_run=False), settings, [rule],
                      Peers(cloud, metrics, store, notifier))
    verdicts = {d.instance_id: d.verdict for d in report.decisions}
    assert verdicts == {"host:gpu-box-1": Verdict.ACTIVE, "host:gpu-box-2": Verdict.UNKNOWN,  # no agent series
                        "host:gpu-box-3": Verdict.IDLE}
    assert [(a.instance_id, a.kind) for a in report.actions] == [("host:gpu-box-3", ActionKind.NOTIFY)]
    assert cloud.calls == []  # nothing central can stop a rented host: not even tried
    [msg] = [m for m in notifier.sent if "gpu-box-3" in m.text]
    assert f"${ESTIMATED_H100_X8:,.2f}/h (estimate)" in msg.text and "gpufinops agent --autostop" in msg.text


# --------------------------------------------------------------------------- the agent's local autostop


def test_autostop_host_instance_gets_the_settings_price_else_the_catalog_estimate():
    host = LocalHost("gpu-box-9", "gpu-box-9")
    mine = local_host_price("gpu-box-9", [H100_NAME] * 8, PriceSettings(usd_per_hour=21.5), CATALOG)
    assert (mine.usd_per_hour, mine.kind, mine.is_estimate) == (21.5, KIND_HOST, False)
    guess = local_host_price("gpu-box-9", [H100_NAME] * 8, None, CATALOG)
    assert (guess.usd_per_hour, guess.kind) == (pytest.approx(ESTIMATED_H100_X8), KIND_ESTIMATE)
    inst = autostop_host_instance(host, gpu_count=8, booted_at=0.0, gpu_model=H100_NAME, price=guess)
    assert (inst.hourly_cost, inst.price_source, inst.gpu_model) == (guess.usd_per_hour, guess.source, H100_NAME)
    mixed = local_host_price("gpu-box-9", [H100_NAME, "NVIDIA L4"], None, CATALOG)
    assert mixed.usd_per_hour is None and "several models" in mixed.why
    unread = local_host_price("gpu-box-9", [], None, CATALOG)
    assert unread.usd_per_hour is None and "not known (no GPU read yet)" in unread.why
    assert autostop_host_instance(host, gpu_count=0, booted_at=0.0).hourly_cost is None


def test_bad_autostop_price_names_file_line_and_key(tmp_path):
    from gpufinops.agent.autostop.settings import load_autostop_settings
    from gpufinops.config import ConfigError

    path = tmp_path / "autostop.yaml"
    path.write_text("live: false\nprice:\n  usd_per_hour: -3\n")
    with pytest.raises(ConfigError, match=rf"^{path}:3: key 'price.usd_per_hour': .*must be above 0"):
        load_autostop_settings(path)
    path.write_text("price: {usd_per_hour: 3, currency: EUR}\n")
    with pytest.raises(ConfigError, match=r"key 'price.currency': .*only USD"):
        load_autostop_settings(path)


@pytest.mark.integration
@pytest.mark.parametrize("price,source", [(None, KIND_ESTIMATE), (PriceSettings(usd_per_hour=21.5), KIND_HOST)])
def test_autostop_warns_with_the_price_and_exports_it(tmp_path, monkeypatch, price, source):
    from gpufinops.agent.autostop.loop import AutostopCollector
    from gpufinops.agent.autostop.machine import MoveKind
    from tests.agent.test_autostop_loop import Host

    host = Host(tmp_path, monkeypatch)
    loop = host.start(price=price)
    host.until(MoveKind.WARN)
    [wall] = host.calls("wall")
    assert loop.gpu_names == (H100_NAME,)  # the capture's one H100, as the driver names it
    value = 21.5 if price else host_price("x", H100_NAME, 1, None, CATALOG).usd_per_hour
    expected = "$21.50/h," if price else f"${value:,.2f}/h (estimate),"
    assert f"costs {expected}" in " ".join(wall)
    host.agent.registry.register(AutostopCollector(loop))
    text = generate_latest(host.agent.registry).decode()
    assert f'gpufinops_host_hourly_cost{{currency="USD",source="{source}"}} {value}' in text


# --------------------------------------------------------------------------- composition: EC2 and rented hosts


HOSTS_ONLY = {"inventory": [{"hostname": "gpu-box-1", "gpu_model": "H100", "gpu_count": 8, "usd_per_hour": 19.9}]}


def test_a_rented_only_fleet_makes_no_ec2_call():
    from gpufinops.run.compose import live_inventory

    cloud = live_inventory(load_settings(hosts=HOSTS_ONLY))
    assert cloud.cloud is None  # no `aws:` section: nothing to list there
    [host] = cloud.list_gpu_instances()
    assert host.instance_id == "host:gpu-box-1" and cloud.last_errors == []
    assert cloud.describe(["host:gpu-box-1", "i-0abc"]) == [host]
    with pytest.raises(CloudError):
        cloud.stop(host)


@pytest.mark.integration
def test_ec2_and_rented_hosts_are_listed_side_by_side_and_a_failing_ec2_leaves_the_hosts(aws):
    from gpufinops.run.compose import live_inventory

    [iid] = aws.launch("g5.xlarge", tags={"team": "ml"})
    settings = load_settings(aws={"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url}, hosts=HOSTS_ONLY)
    cloud = live_inventory(settings)
    listed = {i.instance_id for i in cloud.list_gpu_instances()}
    assert listed == {iid, "host:gpu-box-1"} and not cloud.last_errors
    assert [i.instance_id for i in cloud.describe([iid, "host:gpu-box-1"])] == [iid, "host:gpu-box-1"]
    # EC2 unreachable: the listing is partial, said so, and the rented hosts are still judged.
    down = load_settings(aws={"regions": ["us-east-1"], "endpoint_url": "http://127.0.0.1:9"}, hosts=HOSTS_ONLY)
    cloud = live_inventory(down)
    assert [i.instance_id for i in cloud.list_gpu_instances()] == ["host:gpu-box-1"]
    assert cloud.last_errors


def test_the_monthly_report_marks_an_estimated_price_as_one(tmp_path):
    """A rented host priced from the catalog is an estimate in the report too: the stored price_source travels
    from the tick's inventory (Store.record_instances) to the per-instance table and CSV."""
    import csv as csvlib

    from gpufinops.report import write_monthly_report
    from gpufinops.store.store import Store

    settings = load_settings(hosts={"inventory": [
        {"hostname": "gpu-box-1", "gpu_model": "H100", "gpu_count": 8},  # no price: the catalog estimate
        {"hostname": "gpu-box-2", "gpu_model": "H100", "gpu_count": 8, "usd_per_hour": 19.9}]},
        report={"evaluate_every_s": 3600})
    hosts = static_hosts_cloud(settings).list_gpu_instances()
    estimated, priced = hosts
    assert estimated.price_source.startswith("estimate") and not priced.price_source.startswith("estimate")
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    start = datetime(2026, 10, 5, tzinfo=timezone.utc)
    try:
        for n in range(6):
            at = start + timedelta(hours=n)
            store.record_decisions(f"run-{n}", [
                Decision(h.instance_id, "r", Verdict.ACTIVE, ReasonCode.BUSY, "busy", at, activity_mean=80.0,
                         hourly_cost=h.hourly_cost) for h in hosts], dry_run=True, max_gap_s=7200,
                teams={h.instance_id: "" for h in hosts}, types={h.instance_id: "rented" for h in hosts})
            store.record_instances(hosts, at)
        paths = write_monthly_report(store, "2026-10", tmp_path / "out", datetime(2026, 11, 2, tzinfo=timezone.utc),
                                     settings)
    finally:
        store.close()
    html = next(p for p in paths if p.suffix == ".html").read_text()
    assert html.count("(estimate)") >= 2  # $/h and cost of the estimated host
    table_rows = [r.split("<tr>")[-1] for r in html.split("</tr>")]
    [row_est] = [r for r in table_rows if "host:gpu-box-1" in r and "(estimate)" in r]
    assert not [r for r in table_rows if "host:gpu-box-2" in r and "(estimate)" in r]
    instances_csv = next(p for p in paths if p.name.endswith("-instances.csv"))
    rows = {r["instance_id"]: r for r in csvlib.DictReader(instances_csv.open())}
    assert rows["host:gpu-box-1"]["price_source"].startswith("estimate")
    assert not rows["host:gpu-box-2"]["price_source"].startswith("estimate")  # "the price of gpu-box-2 in the hosts: section"
    assert row_est
