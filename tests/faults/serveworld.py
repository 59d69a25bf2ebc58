"""Process cases of the fault matrix: real `gpufinops serve` subprocesses, killed -9 by the proxy.

Each scenario gets its own AWS region in a dedicated moto server (so its fleet, launched once when
the scenarios start, is already older than the rule window when its serve starts), its own database,
Slack stub and proxies. A rule's warning lead is at least 60 s (gpufinops/rules.py), so the scenarios
run concurrently in background threads, started when the session starts (tests/faults/conftest.py);
each test then waits for its scenario and checks the same invariants as the in-process cases.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from gpufinops.act.lease import read_lease
from gpufinops.store.store import Store
from tests.faults.faultproxy import FaultProxy
from tests.faults.harness import IAM_POLICIES, IPS, OPT_IN_TAG, STEP_S, Delivered, Signal, message_key
from tests.motoserver import FAKE_CREDENTIALS, AwsTestEnv

GPUFINOPS = str(Path(sys.executable).with_name("gpufinops"))
SERVE_WINDOW_S = 30
SERVE_LEAD_S = 60  # the shortest lead a rule may have
LEASE_TTL_S = 3
RUN_LINE = re.compile(r"\brun [0-9a-f]+\b.*instances")


class ServeWorld:
    """One process scenario: fleet, proxies, config, and the serve processes it started."""

    def __init__(self, *, name: str, aws: AwsTestEnv, region: str, prom_url: str, stub, folder: Path,
                 rules_dir: Path) -> None:
        self.name = name
        self.aws = aws
        self.region = region
        self.stub = stub
        self.folder = folder
        self.lead_s = SERVE_LEAD_S
        self.base = time.monotonic()
        self.ids = {
            "idle": aws.launch("g5.xlarge", region=region, tags={"team": "ml", OPT_IN_TAG: "true"},
                               private_ip=IPS["idle"])[0],
            "busy": aws.launch("g5.xlarge", region=region, tags={"team": "ml", OPT_IN_TAG: "true"},
                               private_ip=IPS["busy"])[0],
        }
        self.stoppable = {self.ids["idle"]}
        stub_root = stub.base_url.rstrip("/").rsplit("/api", 1)[0]
        self.ec2 = FaultProxy(aws.endpoint_url, f"moto-{name}").start()
        self.ec2.enforce_iam(*IAM_POLICIES)  # the policies users deploy, evaluated when a request reaches AWS
        self.slack = FaultProxy(stub_root, f"slack-{name}").start()
        self.db_url = f"sqlite:///{folder / 'gpufinops.db'}"
        self.config = folder / "gpufinops.yaml"
        self.config.write_text(yaml.safe_dump({
            "database_url": self.db_url,
            "rules_paths": [str(rules_dir)],
            "prometheus": {"url": prom_url, "scrape_interval_s": STEP_S, "timeout_s": 3},
            "aws": {"regions": [region], "endpoint_url": self.ec2.url},
            "slack": {"base_url": self.slack.url + "/api/", "default_channel": "#gpu-finops", "max_retries": 1,
                      "outbox_path": str(folder / "outbox.jsonl")},
            "act": {"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 1.0},
            "schedule": {"evaluate_every_s": 2, "budget_check_every_s": 0, "recommend_digest_day": ""},
            "service": {"host": "127.0.0.1", "port": 9108},  # each replica binds any free port: serve --port 0
            "lease": {"ttl_s": LEASE_TTL_S},
        }))
        self.procs: list[subprocess.Popen] = []
        self.killed: set[int] = set()
        self.store = Store(self.db_url)
        self.error: str | None = None  # the scenario's own failure (a timeout), reported by the test

    # ------------------------------------------------------------------ processes
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("AWS_")}
        env.update(FAKE_CREDENTIALS, AWS_DEFAULT_REGION=self.region, AWS_CONFIG_FILE="/dev/null",
                   AWS_SHARED_CREDENTIALS_FILE="/dev/null", SLACK_BOT_TOKEN="xoxb-fault-matrix",
                   GPUFINOPS_LOG_LEVEL="INFO")
        return env

    def start_serve(self) -> subprocess.Popen:
        with open(self.folder / f"serve-{len(self.procs)}.log", "wb") as log:
            proc = subprocess.Popen([GPUFINOPS, "--config", str(self.config), "serve", "--port", "0"], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(),
                                    cwd=self.folder)
        self.procs.append(proc)
        return proc

    def log_text(self, k: int | None = None) -> str:
        paths = [self.folder / f"serve-{k}.log"] if k is not None else sorted(self.folder.glob("serve-*.log"))
        return "".join(p.read_text(errors="replace") for p in paths if p.exists())

    def runs_done(self, k: int) -> int:
        return len(RUN_LINE.findall(self.log_text(k)))

    def kill(self, pid: int) -> None:
        """kill -9, as the OOM killer or a node failure would."""
        self.killed.add(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def kill_newest(self, _req=None) -> None:
        self.kill(self.procs[-1].pid)

    def kill_leader(self, _req=None) -> None:
        row = read_lease(self.store)
        pid = int(row.holder.split(":")[1]) if row is not None else self.procs[0].pid
        self.kill(pid)

    def alive(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def wait_for(self, what: str, pred: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.25)
        self.error = f"{self.name}: timed out after {timeout_s:.0f}s waiting for {what}"
        return False

    def wait_killed(self, timeout_s: float = 150) -> bool:
        return self.wait_for("the proxy to kill -9 the serve process",
                             lambda: bool(self.killed) and all(p.poll() is not None for p in self.procs
                                                                if p.pid in self.killed), timeout_s)

    def stop_all(self) -> None:
        for p in self.alive():
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def close(self) -> None:
        self.stop_all()
        self.ec2.stop()
        self.slack.stop()

    # ------------------------------------------------------------------ what the checker reads
    def cloud_state(self) -> dict[str, tuple[str, dict[str, str]]]:
        res = self.aws.client("ec2", self.region).describe_instances(InstanceIds=list(self.ids.values()))
        return {i["InstanceId"]: (i["State"]["Name"], {t["Key"]: t["Value"] for t in i.get("Tags", [])})
                for r in res["Reservations"] for i in r["Instances"]}

    def delivered(self) -> list[Delivered]:
        return [Delivered(c.received_at - self.base, c.body.get("text", ""), message_key(c.body))
                for c in list(self.stub.calls) if c.method == "chat.postMessage" and c.ok]

    def stop_time(self, iid: str) -> float | None:
        hits = [f.request.at for f in self.ec2.forwarded
                if f.request.aws_action in ("StopInstances", "TerminateInstances") and iid in f.request.instance_ids]
        return min(hits) - self.base if hits else None

    def signal_seen(self, sig: Signal) -> bool:
        if sig.kind == "alert":
            return sum(sig.pattern in m.text for m in self.delivered()) == sig.count
        if sig.kind == "log":
            return re.search(sig.pattern, self.log_text(), re.IGNORECASE) is not None
        raise ValueError(f"{sig.kind} is not observable from a serve process here")

    def settled(self) -> bool:
        return not [r for r in self.store.action_rows() if r.status in ("pending", "unconfirmed")]

    def recover(self) -> list[str]:
        """Heal the proxies, keep (or start) one serve and let it run twice more; then stop them all cleanly."""
        problems = [self.error] if self.error else []
        self.ec2.clear()
        self.slack.clear()
        died = [p.pid for p in self.procs if p.poll() is not None and p.pid not in self.killed]
        if died:
            problems.append(f"serve process(es) {died} died without being killed:\n{self.log_text()[-2000:]}")
        live = self.alive() or [self.start_serve()]
        k = self.procs.index(live[-1])
        start = self.runs_done(k)
        self.wait_for("two runs after healing", lambda: self.runs_done(k) >= start + 2 or live[-1].poll() is not None,
                      60)
        if live[-1].poll() is not None:
            problems.append(f"the serve process exited after healing (rc {live[-1].returncode}):\n"
                            f"{self.log_text(k)[-2000:]}")
        self.stop_all()
        return problems


def start_scenario(world: ServeWorld, body: Callable[[ServeWorld], None]) -> threading.Thread:
    def run():
        try:
            body(world)
        except Exception as exc:  # noqa: BLE001 - reported by the test that waits for it
            world.error = f"{world.name}: scenario raised {type(exc).__name__}: {exc}"

    t = threading.Thread(target=run, name=f"scenario-{world.name}", daemon=True)
    t.start()
    return t
