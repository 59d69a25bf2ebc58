"""`gpufinops agent`: serve DCGM-shaped /metrics from NVML or nvidia-smi on a GPU host without dcgm-exporter.

Flags default to environment variables (GPUFINOPS_AGENT_*), so `--help` is the manual and a
systemd unit or container can configure it without a command line.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading

log = logging.getLogger("gpufinops.agent")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 0-65535, got {text!r}")
    return value


def register(subparsers) -> None:
    env = os.environ.get
    p = subparsers.add_parser(
        "agent", help="serve dcgm-exporter-shaped GPU metrics from NVML or nvidia-smi (hosts without DCGM)",
        description="Read the GPUs (NVML, else nvidia-smi) every --interval seconds and serve /metrics in "
                    "Prometheus text format with dcgm-exporter's names and labels (DCGM_FI_DEV_GPU_UTIL, "
                    "DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_POWER_USAGE, DCGM_FI_DEV_GPU_TEMP; per MIG GPU instance "
                    "with GPU_I_ID / GPU_I_PROFILE) and gpufinops_gpu_processes. Scrape it like dcgm-exporter. "
                    "A figure the driver cannot measure has no series; when a read fails the GPU series "
                    "disappear and gpufinops_agent_read_errors_total goes up.")
    # The exporter's DEFAULT_ADDRESS, written here so that `gpufinops --help` does not import the exporter.
    p.add_argument("--address", default=env("GPUFINOPS_AGENT_ADDRESS", "127.0.0.1"),
                   help="listen address (env GPUFINOPS_AGENT_ADDRESS; default 127.0.0.1, this host only: for a "
                        "Prometheus on another machine give the address it scrapes, e.g. the private IP, or 0.0.0.0)")
    p.add_argument("--port", type=_port, default=env("GPUFINOPS_AGENT_PORT", "9400"),
                   help="listen port (env GPUFINOPS_AGENT_PORT; default 9400, dcgm-exporter's)")
    p.add_argument("--interval", type=_positive, default=env("GPUFINOPS_AGENT_INTERVAL", "10"),
                   help="seconds between nvidia-smi runs; keep it <= the Prometheus scrape interval "
                        "(env GPUFINOPS_AGENT_INTERVAL; default 10)")
    p.add_argument("--timeout", type=_positive, default=env("GPUFINOPS_AGENT_TIMEOUT", "5"),
                   help="seconds before a hung nvidia-smi is killed (env GPUFINOPS_AGENT_TIMEOUT; default 5)")
    p.add_argument("--hostname", default=env("GPUFINOPS_AGENT_HOSTNAME") or socket.gethostname(),
                   help="value of the host label; on EC2 the private DNS name, e.g. ip-10-0-1-2.ec2.internal "
                        "(env GPUFINOPS_AGENT_HOSTNAME; default: this host's name)")
    p.add_argument("--hostname-label", choices=("Hostname", "hostname", "both"),
                   default=env("GPUFINOPS_AGENT_HOSTNAME_LABEL", "both"),
                   help="name of the host label: dcgm-exporter's old `Hostname`, its new `hostname`, or both "
                        "(env GPUFINOPS_AGENT_HOSTNAME_LABEL; default both)")
    p.add_argument("--reader", choices=("auto", "nvml", "nvidia-smi"), default=env("GPUFINOPS_AGENT_READER", "auto"),
                   help="how to read the GPUs: nvml (nvidia-ml-py), nvidia-smi, or auto = NVML when the library "
                        "loads, else nvidia-smi (env GPUFINOPS_AGENT_READER; default auto)")
    p.add_argument("--instance-id", default=env("GPUFINOPS_AGENT_INSTANCE_ID") or None,
                   help="value of the instance_id label, e.g. i-0123456789abcdef0 "
                        "(env GPUFINOPS_AGENT_INSTANCE_ID; default: no such label)")
    p.add_argument("--nvidia-smi", default=env("GPUFINOPS_AGENT_NVIDIA_SMI", "nvidia-smi"), metavar="PATH",
                   help="nvidia-smi executable (env GPUFINOPS_AGENT_NVIDIA_SMI; default: nvidia-smi on PATH)")
    p.set_defaults(func=cmd_agent)
    from ..agent.autostop.cli import add_autostop_arguments  # --autostop* flags, `agent snooze` (gpufinops/autostop)
    add_autostop_arguments(p)


def build_agent(args: argparse.Namespace, **agent_kwargs):
    """The Agent the flags describe; `agent_kwargs` (e.g. on_sample) go to Agent unchanged."""
    from ..agent.exporter import HOSTNAME_LABELS, Agent, HostIdentity, open_reader

    hostname = (args.hostname or "").strip()
    if not hostname:
        raise ValueError("--hostname is empty: the hostname label is how gpufinops finds this host's instance")
    if args.hostname_label not in HOSTNAME_LABELS:  # from the environment, which argparse does not check
        raise ValueError(f"GPUFINOPS_AGENT_HOSTNAME_LABEL must be Hostname, hostname or both, "
                         f"got {args.hostname_label!r}")
    host = HostIdentity(hostname, (args.instance_id or "").strip() or None, HOSTNAME_LABELS[args.hostname_label])
    reader = open_reader(args.reader, nvidia_smi=args.nvidia_smi, timeout_s=args.timeout)
    return Agent(host, reader=reader, interval_s=args.interval, timeout_s=args.timeout, **agent_kwargs)


def cmd_agent(args: argparse.Namespace) -> int:
    from ..agent.exporter import start
    from ..collect.gpu_snapshot import GpuReadError

    try:
        agent = build_agent(args)
        from ..agent.autostop.cli import maybe_start_autostop  # with --autostop: judge and stop this host when idle
        autostop = maybe_start_autostop(args, agent)  # noqa: F841 - a daemon thread fed by agent.on_sample
        running = start(agent, args.address, args.port)
    except (ValueError, OSError, GpuReadError) as exc:  # empty hostname, port in use, --reader nvml without NVML
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log.info("serving /metrics on %s:%d for %s=%s%s, %s every %gs", args.address, running.port,
             "/".join(agent.host.hostname_labels), agent.host.hostname,
             f" instance_id={agent.host.instance_id}" if agent.host.instance_id else "", agent.reader.source,
             agent.interval_s)
    done = threading.Event()

    def on_signal(signum, _frame) -> None:
        log.info("signal %d: stopping", signum)
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    done.wait()
    running.close()
    return 0
