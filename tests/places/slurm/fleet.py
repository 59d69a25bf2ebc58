"""A governed Slurm cluster for the tests: the real accounting cluster (tests/slurm.py `slurm_acct`, where the
service's identity `gpufinops` is a Slurm Operator), DCGM series in a real Prometheus (tests/promserver.py) for the
GPUs Slurm allocated, the Slack stub, and the service's peers from run/compose.live_slurm with every Slurm command
run as the Operator (runuser), never as root. The tick's clock is injected: the jobs start at real time T0 and the
service is evaluated at T0 + minutes, so a warning's lead passes without waiting.
"""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

from gpufinops.config import load_settings
from gpufinops.model import RunContext
from gpufinops.notify.delivery import build_notifier
from gpufinops.run.compose import live_slurm
from gpufinops.run.pipeline import Peers, run_once
from gpufinops.rules import load_rules
from gpufinops.store.store import Store
from tests.promserver import Series, dcgm_labels
from tests.slurm import OPERATOR

STEP = 30


def trapping(flag: Path) -> str:
    """A batch script that checkpoints on the grace signal (touches `flag`) and goes on."""
    return f"trap 'touch {flag}' USR1; while true; do sleep 1; done"


def as_operator(argv, env, timeout_s):
    """How the tests run the service's Slurm commands: as the Operator user `gpufinops` (AdminLevel=Operator)."""
    return subprocess.run(["runuser", "-u", OPERATOR, "--", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)


def dcgm(host: str, gpu: int, start: float, end: float, util: float, mem_mib: float = 2000.0,
         hostname_label: str = "Hostname") -> list[Series]:
    labels = dcgm_labels(host, gpu, model="NVIDIA A100-SXM4-80GB", hostname_label=hostname_label)
    ts = range(int(start), int(end), STEP)
    return [Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, util) for t in ts]),
            Series("DCGM_FI_DEV_FB_USED", labels, [(t, mem_mib) for t in ts])]


def rule_file(path: Path, action: str = "requeue", extra: str = "") -> Path:
    path.write_text(f"""rules:
  - name: slurm-idle
    select:
      tags:
        "slurm:partition": [gpu, interactive]
{extra}    threshold_pct: 5
    window: 10m
    aggregation: stays_below
    warning_lead: 15m
    action: {action}
""")
    return path


class GovernedSlurm:
    def __init__(self, cluster, slack_stub, tmp_path: Path, monkeypatch, *, action: str = "requeue",
                 grace_s: float = 1.0, dry_run: bool = False, runner=as_operator, extra_rule: str = "", **slurm):
        self.cluster, self.slack, self.tmp = cluster, slack_stub, tmp_path
        self.runner = runner
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
        self.slurm_settings = {"cluster": cluster.name, "conf": str(cluster.conf), "grace_s": grace_s,
                               "grace_signal": "USR1",
                               "email_domain": "lab.example", "timeout_s": 20, **slurm}
        self.action, self.dry_run, self.extra_rule = action, dry_run, extra_rule
        self.series: list[Series] = []
        self.t0 = datetime.now(timezone.utc).replace(microsecond=0)
        self.prom = None

    def add_series(self, job: dict, util: float, mem_mib: float = 2000.0) -> None:
        """DCGM series at `util` % for every GPU the job holds (by its node's host name and Slurm's IDX), an hour
        before T0 to three after (what ran on the GPU before the job is never its own: evaluate's window)."""
        import json
        import re
        import time
        found = re.search(r"IDX:([0-9,-]+)", " ".join(job["gres_detail"]))
        end = time.monotonic() + 15
        while not found and time.monotonic() < end:
            # Seen in 22.05: a job just RUNNING can show `gpu:fake:0(IDX:)` for a moment before its GPUs.
            time.sleep(0.3)
            out = self.cluster.run("squeue", "--json").stdout
            job = next(j for j in json.loads(out)["jobs"] if j["job_id"] == job["job_id"])
            found = re.search(r"IDX:([0-9,-]+)", " ".join(job["gres_detail"]))
        if not found:
            out = self.cluster.run("squeue", "--json").stdout
            others = [(j["job_id"], j["job_state"], j["gres_detail"], j["tres_per_node"], j["tres_alloc_str"])
                      for j in json.loads(out)["jobs"]]
            node = self.cluster.run("scontrol", "show", "node", "-d").stdout
        assert found, (f"job {job['job_id']} ({job['job_state']}): no GPU index in gres_detail {job['gres_detail']}"
                       f" {others} {node}")
        idx = found.group(1)
        for part in idx.split(","):
            lo, _, hi = part.partition("-")
            for gpu in range(int(lo), int(hi or lo) + 1):
                self.series += dcgm(self.cluster.node, gpu, self.t0.timestamp() - 3600,
                                    self.t0.timestamp() + 3 * 3600, util, mem_mib)

    def start(self, prometheus_factory, prom_url: str | None = None) -> "GovernedSlurm":
        self.prom = prometheus_factory(self.series) if prom_url is None else None
        self.settings = load_settings(
            prometheus={"url": prom_url or self.prom.url, "scrape_interval_s": STEP, "timeout_s": 10},
            slack={"base_url": self.slack.base_url, "default_channel": "#gpu-finops", "max_retries": 2},
            act={"dry_run": self.dry_run, "max_stops_per_run": 5, "max_stops_fraction": 1.0},
            database_url=f"sqlite:///{self.tmp / 'gpufinops.db'}",
            rules_paths=[str(rule_file(self.tmp / "slurm-rules.yaml", self.action, self.extra_rule))],
            slurm=self.slurm_settings,
        )
        self.rules = load_rules(self.settings.rules_paths)
        self.store = Store(self.settings.database_url)
        self.now = self.t0
        cloud, metrics = live_slurm(self.settings, None, None, clock=lambda: self.now, runner=self.runner)
        self.cloud = cloud
        self.peers = Peers(cloud, metrics, self.store,
                           build_notifier(self.settings.slack, self.store, lambda: self.now))
        return self

    def tick(self, minutes: float):
        self.now = self.t0 + timedelta(minutes=minutes)
        return run_once(RunContext(now=self.now, dry_run=self.settings.act.dry_run), self.settings, self.rules,
                        self.peers)

    def sid(self, job_id: int) -> str:
        return f"slurm:{self.cluster.name}/{job_id}"
