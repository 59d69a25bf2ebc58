"""The agent's NVML GPM series on a real GPU: busy / memory held / 50 % duty / idle, against pynvml's own GPM reading.

Issue 25's device check (one command, about 3 minutes on an H200; `--dry` runs the same code in seconds against
tests/fake_nvml.py, no GPU, for checking the script before spending device time):

    python3 bench/gpu_check_gpm.py            # on the GPU machine, from the checkout's root; writes to $OUT
    python3 bench/gpu_check_gpm.py --dry      # here

What it does: starts the agent in this process (NVML reader with GPM, /metrics on 127.0.0.1), drives the GPU with
bench/gpu_load.py (busy bf16 matmul 30 s, hold 20 GiB 40 s, 50 % duty 30 s, idle 30 s), and every second scrapes
the agent and takes its own GPM reading with plain pynvml calls (independent of gpufinops' reader). Meanwhile two
child processes read the GPU with NvmlReader every second, one with GPM and one without, for CPU ms and RSS per
sample. Per phase (the first WARMUP_S seconds of each left out: CUDA start-up) it writes the means, and the verdict
`evaluate()` gives under the shipped default rule (rules/idle-shutdown.yaml, its window shortened to the phase's
steady part: a 2 h window cannot be seen in 30 s), judged by GPU_UTIL (how a whole GPU is judged) and by
GR_ENGINE_ACTIVE (how a MIG instance with GPM is judged). Output: $OUT/summary.json, $OUT/samples.csv.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from datetime import datetime, timedelta, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PHASES = (("busy", 30, ["busy", "30"]), ("hold", 40, ["hold", "20", "40"]), ("duty50", 30, ["duty", "0.5", "30"]),
          ("idle", 30, None))
WARMUP_S = 10  # left out of each phase: a load's CUDA start-up and the previous load's end
GPM_NAMES = {  # pynvml constant -> dcgm-exporter name, written out here so the check does not read the code checked
    "NVML_GPM_METRIC_GRAPHICS_UTIL": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "NVML_GPM_METRIC_SM_UTIL": "DCGM_FI_PROF_SM_ACTIVE",
    "NVML_GPM_METRIC_SM_OCCUPANCY": "DCGM_FI_PROF_SM_OCCUPANCY",
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "NVML_GPM_METRIC_DRAM_BW_UTIL": "DCGM_FI_PROF_DRAM_ACTIVE",
    "NVML_GPM_METRIC_HMMA_TENSOR_UTIL": "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
    "NVML_GPM_METRIC_FP32_UTIL": "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
}
SERIES = re.compile(r"^(DCGM_FI_\w+)(\{[^}]*\})? (\S+)$", re.M)


def fake_nvml(phase: str):
    from tests.fake_nvml import FakeNvml
    capture = os.path.join(ROOT, "tests", "data", "nvidia_smi", "captures_raw",
                           "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    return FakeNvml(capture, "load", gpm_phase=phase)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def reader_cost(gpm: bool, seconds: float, dry: bool) -> None:
    """Child process: NvmlReader.read() once a second; prints CPU ms and wall ms per read, RSS at the end."""
    from gpufinops.collect.nvml import NvmlReader
    reader = NvmlReader(fake_nvml("busy") if dry else None, gpm=gpm).open()
    reader.read()  # the first read allocates; measured from the second
    cpu, wall, n, with_gpm = [], [], 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        c0, w0 = time.process_time(), time.perf_counter()
        snap = reader.read()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        n += 1
        with_gpm += bool(snap.gpus[0].gpm)
        time.sleep(max(0.0, 1.0 - (time.perf_counter() - w0)))
    reader.close()
    print(json.dumps({"gpm": gpm, "reads": n, "reads_with_gpm_figures": with_gpm,
                      "cpu_ms_per_read": round(1000 * sum(cpu) / n, 2), "wall_ms_per_read": round(1000 * sum(wall) / n, 2),
                      "rss_mib": round(rss_mib(), 1)}))


class OwnGpm:
    """pynvml's own GPM reading, one interval per call (plain calls, as NVIDIA's samples do)."""

    def __init__(self, n):
        self.n, self.handle = n, n.nvmlDeviceGetHandleByIndex(0)
        self.ids = [(GPM_NAMES[c], getattr(n, c)) for c in GPM_NAMES if hasattr(n, c)]
        self.prev, self.cur = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
        n.nvmlGpmSampleGet(self.handle, self.prev)

    def read(self) -> dict[str, float]:
        n = self.n
        n.nvmlGpmSampleGet(self.handle, self.cur)
        mg = n.c_nvmlGpmMetricsGet_t()
        mg.version, mg.numMetrics, mg.sample1, mg.sample2 = n.NVML_GPM_METRICS_GET_VERSION, len(self.ids), self.prev, self.cur
        for i, (_name, mid) in enumerate(self.ids):
            mg.metrics[i].metricId = mid
        n.nvmlGpmMetricsGet(mg)
        self.prev, self.cur = self.cur, self.prev
        return {name: round(mg.metrics[i].value, 2) for i, (name, _) in enumerate(self.ids)
                if mg.metrics[i].nvmlReturn == 0}

    def close(self):
        self.n.nvmlGpmSampleFree(self.prev)
        self.n.nvmlGpmSampleFree(self.cur)


def own_readings(seconds: float, dry: bool) -> None:
    """Child process: pynvml's own GPM reading once a second, one JSON line each with its CLOCK_MONOTONIC time
    (the same clock in every process). Its own process: two GPM users in one process crashed (SIGSEGV) on the H200."""
    if dry:
        n = fake_nvml("busy")
    else:
        import pynvml as n
    n.nvmlInit()
    own = OwnGpm(n)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tick = time.monotonic()
        time.sleep(1.0)
        try:
            print(json.dumps({"t": time.monotonic(), "figures": own.read()}), flush=True)
        except Exception as exc:  # noqa: BLE001
            print(json.dumps({"t": time.monotonic(), "error": repr(exc)[:200]}), flush=True)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick) - 1.0))
    own.close()


def scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read().decode()
    return {m.group(1): float(m.group(3)) for m in SERIES.finditer(body)}  # one GPU, no MIG: one series each


def mean(values):
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 3) if values else None


def verdicts(rows: list[dict], phase_s: int) -> dict:
    """evaluate() over the phase's steady rows, under the shipped default rule with the window shortened."""
    from gpufinops.config import DEFAULT_RULES_DIR
    from gpufinops.decide.evaluate import evaluate
    from gpufinops.model import GpuInstance, GpuWindowStats, InstanceUsage
    from gpufinops.rules import load_rule_file
    rule = next(r for r in load_rule_file(DEFAULT_RULES_DIR / "idle-shutdown.yaml") if r.action.value == "stop")
    window = phase_s - WARMUP_S
    rule = replace(rule, window_s=window)
    now = datetime.now(timezone.utc)
    inst = GpuInstance("i-device", "h200", "local", "running", now - timedelta(days=1), gpu_count=1)
    out = {"rule": f"{rule.name} (window {window} s instead of 2 h)"}
    for signal, key, scale in (("DCGM_FI_DEV_GPU_UTIL", "util", 1.0), ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gract", 100.0)):
        act = [r[key] * scale for r in rows if r.get(key) is not None]
        mem = [r["fb"] for r in rows if r.get("fb") is not None]
        power = [r["power"] for r in rows if r.get("power") is not None]
        stats = GpuWindowStats(gpu="0", samples=len(act), activity_max=max(act) if act else None,
                               activity_mean=sum(act) / len(act) if act else None, activity_min=min(act) if act else None,
                               activity_signal=signal, fb_used_max_mib=max(mem) if mem else None,
                               power_mean_w=sum(power) / len(power) if power else None)
        d = evaluate(inst, InstanceUsage("i-device", window, window, gpus=(stats,)), rule, now)
        out[f"by_{signal}"] = {"verdict": d.verdict.value, "code": d.code.value, "reason": d.reason}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry", action="store_true", help="against tests/fake_nvml.py, phases of a few seconds, no GPU")
    ap.add_argument("--cost", choices=("gpm", "nogpm"), help=argparse.SUPPRESS)
    ap.add_argument("--own", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=100, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cost:
        return reader_cost(args.cost == "gpm", args.seconds, args.dry)
    if args.own:
        return own_readings(args.seconds, args.dry)
    out = os.environ.get("OUT", "/tmp/gpu_check_gpm")
    os.makedirs(out, exist_ok=True)
    global WARMUP_S
    phases = PHASES if not args.dry else tuple((name, 4, None) for name, _s, _a in PHASES)
    if args.dry:
        WARMUP_S = 1
    from gpufinops.agent.exporter import Agent, HostIdentity, start
    from gpufinops.collect.nvml import NvmlReader
    if args.dry:
        nvml = fake_nvml("idle")
    else:
        import pynvml as nvml
        nvml.nvmlInit()
    total_s = sum(s for _n, s, _a in phases)
    children = {tag: subprocess.Popen([sys.executable, __file__, *argv, "--seconds", str(total_s - 5)]
                                      + (["--dry"] if args.dry else []), stdout=subprocess.PIPE, text=True)
                for tag, argv in (("gpm", ["--cost", "gpm"]), ("nogpm", ["--cost", "nogpm"]), ("own", ["--own"]))}
    agent = start(Agent(HostIdentity("gpu-check"), reader=NvmlReader(nvml).open(), interval_s=1.0, timeout_s=5.0),
                  "127.0.0.1", 0)
    steady_windows = {}  # phase -> (from, to) in CLOCK_MONOTONIC
    info = {"python": sys.version.split()[0], "dry": args.dry}
    if not args.dry:
        h = nvml.nvmlDeviceGetHandleByIndex(0)
        info.update(gpu=str(nvml.nvmlDeviceGetName(h)), driver=str(nvml.nvmlSystemGetDriverVersion()),
                    bindings=getattr(nvml, "__version__", ""))
    print(json.dumps(info), flush=True)
    rows: list[dict] = []
    t0 = time.monotonic()
    for name, secs, load_args in phases:
        if args.dry:
            nvml.gpm_phase = name
        load = (subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "gpu_load.py"), *load_args])
                if load_args and not args.dry else None)
        start_s = time.monotonic()
        while time.monotonic() - start_s < secs:
            tick = time.monotonic()
            try:
                got, error = scrape(agent.port), ""
            except Exception as exc:  # noqa: BLE001 - recorded in the row, the check goes on
                got, error = {}, repr(exc)[:120]
            rows.append({"t": round(tick - t0, 1), "phase": name, "steady": tick - start_s >= WARMUP_S,
                         "util": got.get("DCGM_FI_DEV_GPU_UTIL"), "fb": got.get("DCGM_FI_DEV_FB_USED"),
                         "power": got.get("DCGM_FI_DEV_POWER_USAGE"),
                         **{f"agent:{k}": v for k, v in got.items() if k.startswith("DCGM_FI_PROF_")},
                         "gract": got.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE"), "error": error})
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        steady_windows[name] = (start_s + WARMUP_S, time.monotonic())
        if load is not None:
            try:
                load.wait(timeout=20)
            except subprocess.TimeoutExpired:
                load.kill()
        print(f"[{time.monotonic() - t0:6.1f}] phase {name} done", flush=True)
    agent.close()
    costs, own_lines = {}, []
    for tag, p in children.items():
        try:
            text, _ = p.communicate(timeout=30)
            lines = [json.loads(line) for line in text.strip().splitlines() if line.startswith("{")]
            if tag == "own":
                own_lines = lines
            else:
                costs[tag] = lines[-1]
        except Exception as exc:  # noqa: BLE001
            p.kill()
            costs[tag] = {"error": repr(exc)[:200]}
    own_errors = [line["error"] for line in own_lines if "error" in line]
    keys = sorted({k for r in rows for k in r})
    with open(os.path.join(out, "samples.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    per_phase = {}
    for name, secs, _a in phases:
        steady = [r for r in rows if r["phase"] == name and r["steady"]]
        figures = {k: mean(r.get(k) for r in steady) for k in keys if k.startswith("agent:")}
        lo, hi = steady_windows[name]
        mine = [line["figures"] for line in own_lines if "figures" in line and lo <= line["t"] <= hi]
        for k in sorted({k for m in mine for k in m}):
            figures[f"pynvml:{k}"] = mean(m.get(k) for m in mine)
        per_phase[name] = {"steady_samples": len(steady), "util_pct": mean(r["util"] for r in steady),
                           "fb_mib": mean(r["fb"] for r in steady), "power_w": mean(r["power"] for r in steady),
                           "agent_series_missing": sum(1 for r in steady if r.get("gract") is None),
                           "agent_ratio_vs_pynvml_pct": figures}
        try:
            per_phase[name]["verdict"] = verdicts(steady, secs)
        except Exception as exc:  # noqa: BLE001 - the figures are still written
            per_phase[name]["verdict"] = {"error": repr(exc)[:300]}
    summary = {"info": info, "phases": per_phase, "reader_cost": costs,
               "errors": [r["error"] for r in rows if r["error"]][:10], "own_gpm_errors": own_errors[:5]}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
