"""The Azure place's test world: the stand-in ARM (tests/armstub.py) under the shipped custom role, a real
Prometheus holding DCGM series keyed by each VM's hostname (its osProfile.computerName, as dcgm-exporter labels
them), and the real tick (`pipeline.run_once`) over AzureCloud on a clock the test moves.

The Prometheus data spans REAL_NOW - 2 h to REAL_NOW + 1 h; the ticks run inside it (from REAL_NOW - 60 min on).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from gpufinops.config import AzureSettings, PrometheusSettings, Settings, load_settings
from gpufinops.model import Action, Rule, RunContext
from gpufinops.places.azure.cloud import AzureCloud
from tests.armstub import ArmStub, StaticToken, Vm

ROOT = Path(__file__).resolve().parents[3]
ROLE = json.loads((ROOT / "deploy" / "azure" / "gpufinops-role.json").read_text())
# The optional role an operator assigns beside ROLE only where a rule says action: power_off.
POWER_OFF_ROLE = json.loads((ROOT / "deploy" / "azure" / "gpufinops-power-off-role.json").read_text())
SUB = "11111111-2222-3333-4444-555555555555"
SUB2 = "66666666-7777-8888-9999-000000000000"
OPT_IN = {"gpufinops:allow-stop": "true"}
SCRAPE = 30
SPAN_S = 2 * 3600
AHEAD_S = 3600
REAL_NOW = datetime.fromtimestamp(int(time.time()) // SCRAPE * SCRAPE, timezone.utc)
START = REAL_NOW - timedelta(minutes=60)
WINDOW_S = 600
LEAD_S = 600

# hostname -> (GPU count, activity %) of the series in the Prometheus.
HOSTS = {"idle-a100": (1, 0.0), "busy-h100": (8, 91.0), "flex-h100": (8, 0.0),
         # An AKS GPU node pool's node: an instance of a Uniform scale set, by its computer name.
         "aks-gpupool-12345678-vmss000000": (1, 0.0)}


def prometheus_series():
    from tests.promserver import Series, dcgm_labels

    # From 2 h before REAL_NOW to an hour after it: `evaluate` judges at the wall clock's now, however long after
    # this module's import the test runs (a loaded machine), and still finds a full window.
    stop = REAL_NOW.timestamp() + AHEAD_S
    ts = [stop - SPAN_S - AHEAD_S + SCRAPE * (i + 1) for i in range((SPAN_S + AHEAD_S) // SCRAPE)]
    series = []
    for host, (gpus, util) in HOSTS.items():
        for gpu in range(gpus):
            labels = dcgm_labels(host, gpu, model="NVIDIA A100 80GB PCIe")
            series.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, util) for t in ts]))
    return series


def fleet(stub: ArmStub) -> None:
    """An idle opted-in VM, a busy one, an idle Flexible scale set member, a VM left "Stopped (allocated)", a
    deallocated one and a CPU VM (not listed)."""
    stub.add(Vm(SUB, "ml", "idle-a100", "Standard_NC24ads_A100_v4", tags={**OPT_IN, "owner": "ana", "team": "nlp"}))
    stub.add(Vm(SUB, "ml", "busy-h100", "Standard_ND96isr_H100_v5", tags={**OPT_IN, "owner": "bo"}))
    stub.add(Vm(SUB, "train", "flex-h100", "Standard_ND96isr_H100_v5", tags=dict(OPT_IN), scale_set="train-pool"))
    stub.add(Vm(SUB, "ml", "forgotten-a10", "Standard_NV36ads_A10_v5", power="stopped",
                tags={**OPT_IN, "owner": "cy"}))
    stub.add(Vm(SUB, "ml", "parked-t4", "Standard_NC4as_T4_v3", power="deallocated", tags=dict(OPT_IN)))
    stub.add(Vm(SUB, "web", "frontend", "Standard_D4s_v5"))


def vm_id(name: str) -> str:
    group = {"flex-h100": "train", "frontend": "web"}.get(name, "ml")
    return f"azure:{SUB}/{group}/{name}"


def azure_settings(stub: ArmStub, **kw: Any) -> AzureSettings:
    return AzureSettings(subscriptions=kw.pop("subscriptions", (SUB,)), endpoint_url=stub.url, ca_file=stub.ca_file,
                         deallocate_wait_s=kw.pop("deallocate_wait_s", 5.0), **kw)


def azure_cloud(stub: ArmStub, **kw: Any) -> AzureCloud:
    return AzureCloud(azure_settings(stub, **kw), StaticToken(), polling_interval_s=0.05)


RULE = Rule(name="idle-10m", threshold_pct=10, window_s=WINDOW_S, min_coverage=0.8, action=Action.STOP,
            warning_lead_s=LEAD_S)
# The operator keeps the VMs' hardware: powered off, not deallocated (still billed).
POWER_OFF_RULE = Rule(name="idle-10m-power-off", threshold_pct=10, window_s=WINDOW_S, min_coverage=0.8,
                      action=Action.POWER_OFF, warning_lead_s=LEAD_S)


@dataclass
class World:
    stub: ArmStub
    prom_url: str
    tmp: Path
    now: datetime = START
    reports: list = field(default_factory=list)
    rules: list = field(default_factory=lambda: [RULE])

    def __post_init__(self) -> None:
        from gpufinops.demo.sim import ConsoleNotifier
        from gpufinops.store.store import Store

        self.settings: Settings = load_settings(None, act={"dry_run": False, "max_stops_fraction": 1.0},
                                                azure={"subscriptions": [SUB], "endpoint_url": self.stub.url,
                                                       "ca_file": self.stub.ca_file})
        self.cloud = azure_cloud(self.stub)
        self.store = Store(f"sqlite:///{self.tmp / 'db.sqlite'}")
        self.notifier = ConsoleNotifier(self.store, lambda: self.now, printer=lambda _line: None)

    def tick(self, minutes_from_start: float):
        from gpufinops.collect.prometheus import PrometheusMetrics
        from gpufinops.run.pipeline import Peers, run_once

        self.now = START + timedelta(minutes=minutes_from_start)
        metrics = PrometheusMetrics(PrometheusSettings(url=self.prom_url, scrape_interval_s=SCRAPE))
        report = run_once(RunContext(now=self.now, dry_run=False), self.settings, list(self.rules),
                          Peers(self.cloud, metrics, self.store, self.notifier))
        self.reports.append(report)
        return report

    def messages_about(self, name: str) -> list[str]:
        return [m.text for m in self.notifier.sent if name in m.text]

    def deallocates(self, name: str | None = None) -> list:
        return [s for s in self.stub.seen("Microsoft.Compute/virtualMachines/deallocate/action")
                if name is None or s.path.endswith(f"/{name}/deallocate")]

    def power_offs(self, name: str | None = None) -> list:
        return [s for s in self.stub.seen("Microsoft.Compute/virtualMachines/powerOff/action")
                if name is None or s.path.endswith(f"/{name}/powerOff")]

    def settle(self, name: str) -> str:
        """The VM's power state once a transition under way has ended."""
        deadline = time.monotonic() + 5
        while self.stub.vm(name).pending and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.stub.vm(name).power


# ---------------------------------------------------------------------- the peers, for the fixtures


def start_arm(tmp: Path) -> ArmStub:
    return ArmStub(tmp, role=ROLE)


def stop_arm(stub: ArmStub) -> None:
    stub.close()
    # Every request a test made was one the shipped role grants (a refused one is answered 403 and counted here).
    assert stub.denied() == [], [(s.method, s.path, s.action) for s in stub.denied()]


def start_prom(tmp: Path):
    from tests.promserver import binaries_missing, start_prometheus

    if binaries_missing():
        pytest.skip(binaries_missing())
    return start_prometheus(tmp, prometheus_series())
