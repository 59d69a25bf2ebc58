"""Which requested instance, and which of its GPUs, a series' labels name (`InstanceMatcher`, `gpu_key`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from gpufinops.model import GpuInstance


def _short(name: str) -> str:
    return name.strip().lower().split(".", 1)[0]


@dataclass
class InstanceMatcher:
    """Maps a series' labels to a requested instance id.

    Order: the configured instance label (set by ec2_sd relabelling); else a
    hostname label matched to the private DNS name (full or short, e.g.
    ip-10-0-1-2), to the private IP, or to the instance id itself (some
    clusters name nodes after the instance id). Pod labels are ignored.
    """

    instance_label: str
    hostname_labels: tuple[str, ...]
    by_id: dict[str, str] = field(default_factory=dict)
    by_host: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, instances: Iterable[GpuInstance], instance_label: str, hostname_labels: tuple[str, ...]):
        m = cls(instance_label, hostname_labels)
        ambiguous: set[str] = set()
        for inst in instances:
            m.by_id[inst.instance_id] = inst.instance_id
            keys = {inst.instance_id.lower()}
            if inst.private_dns:
                keys |= {inst.private_dns.strip().lower(), _short(inst.private_dns)}
            if inst.private_ip:
                ip = inst.private_ip.strip()
                keys |= {ip, "ip-" + ip.replace(".", "-")}
            for key in keys:
                if m.by_host.setdefault(key, inst.instance_id) != inst.instance_id:
                    ambiguous.add(key)
        # The same private IP in two VPCs/regions: a hostname that could be either
        # instance maps to neither (no data beats another machine's data).
        for key in ambiguous:
            del m.by_host[key]
        return m

    def match(self, labels: Mapping[str, str]) -> str | None:
        value = labels.get(self.instance_label)
        if value:
            # The label is authoritative: a series of another instance is not ours.
            return self.by_id.get(value)
        for name in self.hostname_labels:
            host = (labels.get(name) or "").strip().lower()
            if not host:
                continue
            found = self.by_host.get(host) or self.by_host.get(_short(host))
            if found:
                return found
        return None


def gpu_key(labels: Mapping[str, str]) -> str:
    """gpu index, or "gpu/GPU_I_ID" for a MIG slice."""
    gpu = labels.get("gpu", "") or labels.get("UUID", "") or "?"
    mig = labels.get("GPU_I_ID")
    return f"{gpu}/{mig}" if mig else gpu
