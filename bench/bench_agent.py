"""CPU per sample of `gpufinops agent` on a machine without a GPU (issue 41, item 5: the agent ≤ 5 ms per sample).

    python bench/bench_agent.py [--samples 2000] [--repeat 5] [--gpus 1,8] [--smi-samples 40]

The agent's own sampling path, as `gpufinops agent` runs it each interval: `Agent.sample_once()` (the reader's
read, `gpu_samples`, the counters), with and without the local autostop's hook (`AutostopLoop.on_sample`'s
work: `rows_from_snapshot` written to the SQLite ring buffer), and one Prometheus scrape (`metrics_text`)
per sample. The GPUs are the repo's recorded captures answered by the tests' stand-ins:

- NVML: tests/fake_nvml.FakeNvml on the H200 capture (load phase, GPM figures of the real H200), and the H100
  MIG capture (GPM per GPU instance); `--gpus 8` copies the capture's GPU eight times (an 8-GPU host, each
  copy its own index, UUID and bus id). The stand-in is Python that parses and looks up per call (its
  nvmlGpmMetricsGet reads a JSON file each call), so its own time is measured (each of its nvml* calls timed
  with time.thread_time on the thread that makes it) and taken out: "agent" = process CPU − stand-in CPU.
  What a real driver spends inside its calls is not in that figure (the H200 run in BENCHMARKS.md, "Agent NVML
  GPM on a real H200": the reader alone 2.83 ms a read with GPM, 0.96 ms without, Python included).
- nvidia-smi: tests/fake_nvidia_smi.py on PATH (a Python child per call): the agent's process CPU only
  (time.process_time, children excluded); the children's CPU is the stand-in's, not nvidia-smi's, and is shown
  apart.

CPU is time.process_time() over `--samples` samples (every thread of this process: the NVML worker thread
included), median of `--repeat` runs; the first 20 samples of each run are left out (GPM needs two samples;
caches warm).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufinops.agent.autostop.buffer import RingBuffer, rows_from_snapshot  # noqa: E402
from gpufinops.agent.exporter import Agent, HostIdentity  # noqa: E402
from gpufinops.collect.nvidia_smi import NvidiaSmiReader  # noqa: E402
from gpufinops.collect.nvml import NvmlReader  # noqa: E402
from tests.fake_nvidia_smi import install  # noqa: E402
from tests.fake_nvml import FakeNvml  # noqa: E402

CAPTURES = ROOT / "tests" / "data" / "nvidia_smi" / "captures_raw"
SHARED = ROOT.parent / "shared" / "data" / "nvidia_smi" / "captures_raw"
H200 = SHARED / "linux-x86_64__nvidia-h200__590.48.01.txt"
H100 = CAPTURES / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
MIG = CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
WARMUP = 20
HOST = HostIdentity("gpu-host-1.internal", "i-0123456789abcdef0")


class TimedFake:
    """The stand-in with each nvml* call's thread CPU added to `spent` (the agent's share is the rest)."""

    def __init__(self, fake: FakeNvml):
        self._fake = fake
        self.spent = 0.0

    def __getattr__(self, name):
        value = getattr(self._fake, name)
        if not (name.startswith("nvml") and callable(value)):
            return value

        def timed(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return value(*args, **kwargs)
            finally:
                self.spent += time.thread_time() - t0
                self._fake.calls.clear()  # the stand-in logs every call; a long run must not grow it

        return timed


def fake_nvml(capture: Path, phase: str, gpus: int) -> FakeNvml:
    fake = FakeNvml(capture, phase)
    if gpus > 1:  # an 8-GPU host: the capture's GPU again at other indexes, UUIDs and bus ids
        first = fake.gpus[0]
        fake.gpus = [first] + [
            replace(first, row={**first.row, "index": str(i), "uuid": first.row["uuid"][:-2] + f"{i:02d}",
                                "pci.bus_id": first.row["pci.bus_id"][:-7] + f"{i + 0x10:02X}:00.0"})
            for i in range(1, gpus)]
    return fake


def one_run(make_reader, samples: int, *, autostop: bool, scrape: bool) -> tuple[float, float, float]:
    """(process CPU ms, stand-in CPU ms, children CPU ms) per sample over `samples` samples after the warm-up."""
    reader, fake = make_reader()
    buffer = RingBuffer(Path(tempfile.mkdtemp(prefix="bench-agent-")) / "autostop.db") if autostop else None

    def on_sample(snapshot, reason):  # AutostopLoop.on_sample's per-sample work (its prune: every 100th)
        buffer.add(rows_from_snapshot(snapshot, reason, time.time()))

    agent = Agent(HOST, reader=reader, interval_s=1.0, timeout_s=5.0, on_sample=on_sample if autostop else None)
    for _ in range(WARMUP):
        assert agent.sample_once(), "a sample failed"
        if scrape:
            agent.metrics_text()
    spent0 = fake.spent if fake else 0.0
    kids0 = os.times()
    t0 = time.process_time()
    for _ in range(samples):
        agent.sample_once()
        if scrape:
            agent.metrics_text()
    cpu = time.process_time() - t0
    kids1 = os.times()
    stand_in = (fake.spent - spent0) if fake else 0.0
    children = (kids1.children_user - kids0.children_user) + (kids1.children_system - kids0.children_system)
    agent.close()
    if buffer is not None:
        buffer.close()
    return 1000 * cpu / samples, 1000 * stand_in / samples, 1000 * children / samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2000, help="samples per run (NVML)")
    ap.add_argument("--smi-samples", type=int, default=40, help="samples per run (nvidia-smi; 0 = skip)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gpus", default="1,8", help="GPUs per host for the whole-GPU captures")
    args = ap.parse_args()

    cases = []
    for gpus in (int(g) for g in args.gpus.split(",")):
        for capture, label in ((H200 if H200.exists() else H100, "H200" if H200.exists() else "H100"),):
            cases.append((f"NVML, {label} + GPM, {gpus} GPU", capture, gpus, True))
            cases.append((f"NVML, {label} no GPM, {gpus} GPU", capture, gpus, False))
    cases.append(("NVML, H100 MIG (GPM per GI), 1 GPU", MIG, 1, True))

    print(f"{'case':<38} {'path':<22} {'agent ms/sample':>15} {'process ms':>11} {'stand-in ms':>11}  "
          f"runs={args.repeat}, samples={args.samples}, load {os.getloadavg()[0]:.2f}")
    for name, capture, gpus, gpm in cases:
        def make_reader(capture=capture, gpus=gpus, gpm=gpm):
            fake = TimedFake(fake_nvml(capture, "load", gpus))
            return NvmlReader(fake, timeout_s=5.0, gpm=gpm).open(), fake

        for path, autostop, scrape in (("sample", False, False), ("sample + scrape", False, True),
                                       ("sample+autostop+scrape", True, True)):
            runs = [one_run(make_reader, args.samples, autostop=autostop, scrape=scrape) for _ in range(args.repeat)]
            own = statistics.median(c - s for c, s, _ in runs)
            print(f"{name:<38} {path:<22} {own:>15.3f} {statistics.median(c for c, _, _ in runs):>11.3f} "
                  f"{statistics.median(s for _, s, _ in runs):>11.3f}")

    if args.smi_samples:
        folder = Path(tempfile.mkdtemp(prefix="bench-agent-smi-"))
        smi = install(folder)
        os.environ.update(FAKE_NVIDIA_SMI_CAPTURE=str(H200 if H200.exists() else H100), FAKE_NVIDIA_SMI_PHASE="load")
        print(f"\n{'nvidia-smi reader, 1 GPU':<38} {'path':<22} {'agent ms/sample':>15} {'children ms':>11}  "
              f"(children: the Python stand-in for nvidia-smi, not its real cost)")
        for path, autostop, scrape in (("sample + scrape", False, True), ("sample+autostop+scrape", True, True)):
            runs = [one_run(lambda: (NvidiaSmiReader(str(smi), timeout_s=20), None), args.smi_samples,
                            autostop=autostop, scrape=scrape) for _ in range(args.repeat)]
            print(f"{'nvidia-smi (fake on PATH)':<38} {path:<22} {statistics.median(c for c, _, _ in runs):>15.3f} "
                  f"{statistics.median(k for _, _, k in runs):>11.3f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
