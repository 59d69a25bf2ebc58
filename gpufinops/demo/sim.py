"""Simulated peers for the demo: an in-memory EC2 and a trace-replaying metrics source.

They implement the same `Cloud` and `MetricsSource` protocols as the real
EC2 inventory and Prometheus collector, so the demo drives the unchanged
pipeline (evaluate, act, notify, store) on a simulated clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ..model import GpuInstance, GpuWindowStats, InstanceUsage, Message, SENTINEL_THRESHOLD
from ..store.store import Store


class SimCloud:
    """An in-memory fleet. `stop()` really changes state; `start()` resets launch_time like EC2."""

    def __init__(self, instances: Sequence[GpuInstance], clock: Callable[[], datetime]):
        self._instances = {i.instance_id: i for i in instances}
        self.clock = clock
        self.calls: list[tuple[str, str]] = []  # (operation, instance id): what act did
        self.last_retries = self.last_throttles = 0  # as Ec2Cloud: the simulated EC2 never throttles

    def list_gpu_instances(self) -> list[GpuInstance]:
        return list(self._instances.values())

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        return [self._instances[i] for i in instance_ids if i in self._instances]

    def get(self, instance_id: str) -> GpuInstance:
        return self._instances[instance_id]

    def _replace(self, inst_id: str, **changes) -> None:
        self._instances[inst_id] = dataclasses.replace(self._instances[inst_id], **changes)

    def set_tags(self, inst: GpuInstance, tags: Mapping[str, str]) -> None:
        self.calls.append(("set_tags", inst.instance_id))
        cur = dict(self._instances[inst.instance_id].tags)
        cur.update(tags)
        self._replace(inst.instance_id, tags=cur)

    def remove_tags(self, inst: GpuInstance, keys: Sequence[str]) -> None:
        self.calls.append(("remove_tags", inst.instance_id))
        cur = {k: v for k, v in self._instances[inst.instance_id].tags.items() if k not in keys}
        self._replace(inst.instance_id, tags=cur)

    def stop(self, inst: GpuInstance) -> None:
        self.calls.append(("stop", inst.instance_id))
        current = self._instances[inst.instance_id]
        if current.lifecycle == "spot" and current.spot_request_type == "one-time":
            # As EC2: a one-time spot instance cannot be stopped (400 UnsupportedOperation, nothing done).
            from ..places.ec2.cloud import CloudError  # boto3 only when this happens

            raise CloudError("StopInstances", inst.instance_id, inst.region,
                             "You can't stop a Spot Instance associated with a one-time Spot Instance request",
                             definite=True, code="UnsupportedOperation")
        self._replace(inst.instance_id, state="stopped")

    def terminate(self, inst: GpuInstance) -> None:
        self.calls.append(("terminate", inst.instance_id))
        self._replace(inst.instance_id, state="terminated")

    # Not part of the Cloud protocol: what a person (or the trace's demand) does.
    def start(self, instance_id: str) -> None:
        self._replace(instance_id, state="running", launch_time=self.clock())


class TraceMetrics:
    """Window aggregates computed from a per-GPU utilisation trace, like the PromQL would.

    `trace` columns: instance_id, gpu, ts (unix seconds), util (%), mem_mib (optional).
    Sentinel or negative values are invalid samples, as in the Prometheus collector.
    """

    def __init__(self, trace: pd.DataFrame, scrape_interval_s: int):
        self.scrape_interval_s = scrape_interval_s
        self._series: dict[str, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]] = {}
        for (inst, gpu), g in trace.sort_values("ts").groupby(["instance_id", "gpu"], sort=False):
            mem = g["mem_mib"].to_numpy(float) if "mem_mib" in g else np.full(len(g), np.nan)
            self._series.setdefault(inst, []).append((str(gpu), g["ts"].to_numpy(float), g["util"].to_numpy(float), mem))
        self.queries_made = 0

    def window_usage(self, instances: Sequence[GpuInstance], window_s: int, now: datetime) -> dict[str, InstanceUsage]:
        self.queries_made += 1
        t1 = now.timestamp()
        t0 = t1 - window_s
        out = {}
        for inst in instances:
            gpus = []
            for gpu, ts, util, mem in self._series.get(inst.instance_id, []):
                lo, hi = np.searchsorted(ts, t0, side="right"), np.searchsorted(ts, t1, side="right")
                u = util[lo:hi]
                u = u[~np.isnan(u) & (u >= 0) & (u < SENTINEL_THRESHOLD)]
                m = mem[lo:hi]
                m = m[~np.isnan(m)]
                if len(u) == 0 and len(m) == 0:
                    continue
                gpus.append(GpuWindowStats(
                    gpu=gpu, samples=int(len(u)),
                    activity_max=float(u.max()) if len(u) else None,
                    activity_mean=float(u.mean()) if len(u) else None,
                    activity_min=float(u.min()) if len(u) else None,
                    fb_used_max_mib=float(m.max()) if len(m) else None,
                ))
            out[inst.instance_id] = InstanceUsage(inst.instance_id, window_s, window_s // self.scrape_interval_s, tuple(gpus))
        return out


@dataclass
class ConsoleNotifier:
    """Prints Slack messages instead of sending them; dedups by key through the store like Slack."""

    store: Store
    clock: Callable[[], datetime]
    printer: Callable[[str], None] = print
    sent: list[Message] = field(default_factory=list)

    def send(self, msg: Message) -> bool:
        if self.store.notification_sent(msg.key):
            return True
        self.store.record_notification(msg.key, msg.channel, msg.text, "outbox", self.clock())
        self.sent.append(msg)
        self.printer(f"  [slack {msg.channel}] {msg.text.splitlines()[0] if msg.text else msg.key}")
        return True

    def retry_due(self, now: datetime) -> int:
        return 0  # the console never fails a delivery

    def update(self, channel_id: str, ts: str, text: str, blocks) -> bool:
        self.printer(f"  [slack {channel_id} edit of {ts}] {text.splitlines()[0] if text else ''}")
        return True

    def user_id_for_email(self, email: str) -> str | None:
        return None  # no Slack workspace behind the console


class SimClock:
    def __init__(self, start: datetime):
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now = datetime.fromtimestamp(self.now.timestamp() + seconds, tz=timezone.utc)
