"""`gpufinops agent --autostop RULES` and `gpufinops agent snooze 2h|--clear`: flags, wiring, the snooze command.

Flags default to environment variables (GPUFINOPS_AGENT_AUTOSTOP_*), like the agent's own; under systemd the
database and the snooze file default into $STATE_DIRECTORY and $RUNTIME_DIRECTORY (StateDirectory=gpufinops,
RuntimeDirectory=gpufinops in deploy/systemd/gpufinops-agent.service).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from typing import TYPE_CHECKING

# pydantic, yaml and the rules loader are imported where used: `gpufinops --help` builds this parser.
from .defaults import DEFAULT_DB_PATH, DEFAULT_MAX_SNOOZE_S, DEFAULT_SNOOZE_PATH
from .snooze import clear_snooze, snooze_until, write_snooze

if TYPE_CHECKING:
    from .settings import AutostopSettings

log = logging.getLogger("gpufinops.autostop")

_TRUE = ("1", "true", "yes", "on")


def _under_env_dir(var: str, name: str, fallback: str) -> str:
    base = os.environ.get(var, "").split(":")[0]
    return str(Path(base, name)) if base else fallback


def default_db_path() -> str:
    return os.environ.get("GPUFINOPS_AGENT_AUTOSTOP_DB") or _under_env_dir("STATE_DIRECTORY", "agent.db",
                                                                            DEFAULT_DB_PATH)


def default_snooze_path() -> str:
    return os.environ.get("GPUFINOPS_AGENT_SNOOZE_FILE") or _under_env_dir("RUNTIME_DIRECTORY", "snooze-until",
                                                                           DEFAULT_SNOOZE_PATH)


def _duration(text: str) -> int:
    from ...rules import parse_duration

    try:
        return parse_duration(text, max_s=366 * 86400)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_autostop_arguments(p: argparse.ArgumentParser) -> None:
    """The --autostop* flags on `gpufinops agent`, and its `snooze` sub-command."""
    env = os.environ.get
    rules_env = [x for x in env("GPUFINOPS_AGENT_AUTOSTOP", "").split(os.pathsep) if x]
    g = p.add_argument_group("local autostop (stop this host when idle; dry-run unless --autostop-live)")
    g.add_argument("--autostop", action="append", metavar="RULES", default=None,
                   help="rule file or directory, the same rules/ as the service; repeatable. Turns on local autostop "
                        f"(env GPUFINOPS_AGENT_AUTOSTOP, {os.pathsep}-separated; default: off)")
    g.add_argument("--autostop-config", metavar="FILE", default=env("GPUFINOPS_AGENT_AUTOSTOP_CONFIG") or None,
                   help="autostop settings YAML: stop_command, pre_stop_hook, block_processes, block_if_input_within, "
                        "host_tags, slack ... (docs/agent.md; env GPUFINOPS_AGENT_AUTOSTOP_CONFIG)")
    g.add_argument("--autostop-live", action="store_true",
                   default=env("GPUFINOPS_AGENT_AUTOSTOP_LIVE", "").strip().lower() in _TRUE,
                   help="really run the pre-stop hook and stop the host, as dry_run: false in the settings file (env "
                        "GPUFINOPS_AGENT_AUTOSTOP_LIVE=1; default: dry-run, it warns and says what it would do)")
    g.add_argument("--autostop-db", metavar="PATH", default=default_db_path(),
                   help="SQLite ring buffer of this host's samples and the autostop state (env "
                        f"GPUFINOPS_AGENT_AUTOSTOP_DB; default $STATE_DIRECTORY/agent.db or {DEFAULT_DB_PATH})")
    # None: default_snooze_path(), resolved where used, so that `agent snooze` knows no file was named.
    g.add_argument("--snooze-file", metavar="PATH", default=None,
                   help="snooze file: an ISO time before which nothing is stopped (env GPUFINOPS_AGENT_SNOOZE_FILE; "
                        f"default $RUNTIME_DIRECTORY/snooze-until or {DEFAULT_SNOOZE_PATH})")
    p.set_defaults(autostop_rules_env=rules_env)

    sub = p.add_subparsers(dest="agent_command", metavar="{snooze}")
    s = sub.add_parser("snooze", help="keep this host running: no autostop warning or stop until then",
                       description="Write the snooze file: no autostop warning or stop before now + DURATION "
                                   "(capped at --max). A pending warning is cancelled at the next sample.")
    s.add_argument("duration", nargs="?", type=_duration, help="how long, e.g. 2h, 90m, 1d")
    s.add_argument("--clear", action="store_true", help="remove the snooze")
    s.add_argument("--max", type=_duration, default=DEFAULT_MAX_SNOOZE_S, metavar="DURATION",
                   help="cap on a snooze (default 7d; keep it equal to the agent's max_snooze)")
    # SUPPRESS: without the flag here, the agent's --snooze-file (flag or env) stays in force.
    s.add_argument("--snooze-file", metavar="PATH", default=argparse.SUPPRESS, help="snooze file to write")
    s.set_defaults(func=cmd_snooze)


def snooze_path(args: argparse.Namespace) -> tuple[str, str]:
    """(the snooze file to write, how it was found): the one named (flag or env), else the one the running agent
    reads (asked on its port), else the default."""
    if args.snooze_file is not None:
        return args.snooze_file, ""
    if os.environ.get("GPUFINOPS_AGENT_SNOOZE_FILE"):
        return os.environ["GPUFINOPS_AGENT_SNOOZE_FILE"], ""
    from .local_api import running_agent_snooze_file

    port = getattr(args, "port", None)
    running = running_agent_snooze_file(getattr(args, "address", ""), port) if port else None
    if running is not None:
        return running, f"the file the agent on port {port} reads"
    return default_snooze_path(), ""


def cmd_snooze(args: argparse.Namespace) -> int:
    from ...config import not_a_regular_file, printable

    path, found = snooze_path(args)
    where = f"{path}: {found}" if found else str(path)
    if not str(path).strip():
        print("error: --snooze-file is empty: name the snooze file", file=sys.stderr)
        return 2
    why = not_a_regular_file(path)
    if why and why != "does not exist":
        # Clearing removes the file and writing replaces it: never a device (run as root, `--snooze-file
        # /dev/null --clear` would delete /dev/null) or a folder.
        print(f"error: --snooze-file {printable(str(path))}: {why}, not a snooze file", file=sys.stderr)
        return 2
    if args.clear:
        if args.duration is not None:
            print("error: give a duration or --clear, not both", file=sys.stderr)
            return 2
        removed = clear_snooze(path)
        print(f"snooze cleared ({where})" if removed else f"no snooze was set ({where})")
        return 0
    if args.duration is None:
        print("error: give a duration (e.g. 2h) or --clear", file=sys.stderr)
        return 2
    until, note = snooze_until(args.duration, datetime.now(timezone.utc), args.max)
    try:
        write_snooze(path, until)
    except OSError as exc:
        print(f"error: cannot write {path}: {exc.strerror or exc} (run as the agent's user, e.g. "
              f"sudo -u gpufinops gpufinops agent snooze ...)", file=sys.stderr)
        return 2
    print(f"snoozed until {until.strftime('%Y-%m-%d %H:%M UTC')}" + (f" ({note})" if note else "") + f" ({where})")
    return 0


# ---------------------------------------------------------------------- wiring the loop into the agent


@dataclass
class RunningAutostop:
    loop: object
    thread: threading.Thread

    def close(self) -> None:
        self.loop.stop()
        self.thread.join(timeout=30)


def rule_paths(args: argparse.Namespace) -> list[str]:
    return list(args.autostop or []) or list(getattr(args, "autostop_rules_env", []) or [])


def build_loop(args: argparse.Namespace, agent, *, settings: AutostopSettings | None = None, paths=None,
               clock=time.time):
    """Every peer of the loop, built once from the flags and the settings file. ConfigError on bad input."""
    from ...config import ConfigError
    from ...rules import load_rules
    from .buffer import RingBuffer
    from .guards import boot_time
    from .loop import Announcer, AutostopLoop, HostPaths, LocalHost
    from .settings import load_autostop_settings
    from .stopper import (AzureStopper, CommandStopper, Ec2Stopper, ImdsManagedIdentity, azure_imds_identity,
                          imds_identity)

    settings = settings or load_autostop_settings(args.autostop_config)
    rules = load_rules(rule_paths(args))
    dry_run = settings.dry_run and not args.autostop_live
    gce_stopper = None
    azure = None
    if settings.stop_method == "gce":
        from .gce_stopper import GceStopper, gce_identity

        log.info("autostop: stop_method gce: asking the GCE metadata server at %s who this VM is",
                 settings.gce_metadata_url)
        gce = gce_identity(settings.gce_metadata_url)
        if gce is None:
            raise ConfigError(f"{args.autostop_config}: key 'stop_method': 'gce', but no GCE metadata server "
                              f"answered at {settings.gce_metadata_url}")
        gce_stopper = GceStopper(gce, metadata_url=settings.gce_metadata_url,
                                 api_endpoint=settings.gce_api_endpoint)
        identity = None
    elif settings.stop_method == "command":
        log.info("autostop: stop_method command: the EC2 instance metadata address is not contacted (set "
                 "stop_method: ec2 for EC2 self-stop)")
        identity = None
    elif settings.stop_method == "azure":
        log.info("autostop: stop_method azure: asking the Azure instance metadata at %s who this VM is",
                 settings.imds_url)
        identity = None
        azure = azure_imds_identity(settings.imds_url)
        if azure is None:
            raise ConfigError(f"{args.autostop_config}: key 'stop_method': 'azure', but no Azure instance metadata "
                              f"answered at {settings.imds_url}")
    else:
        log.info("autostop: stop_method %s: asking the EC2 instance metadata at %s who this host is",
                 settings.stop_method, settings.imds_url)
        identity = imds_identity(settings.imds_url)
    if settings.stop_method == "ec2" and identity is None:
        raise ConfigError(f"{args.autostop_config}: key 'stop_method': 'ec2', but no EC2 instance metadata answered at "
                          f"{settings.imds_url}")
    if settings.stop_method == "auto" and identity is None:
        azure = azure_imds_identity(settings.imds_url)
    if gce_stopper is not None:
        stopper = gce_stopper
    elif identity is not None:
        stopper = Ec2Stopper(identity, endpoint_url=settings.ec2_endpoint_url)
    elif azure is not None:
        # Never the stop command on Azure: a guest shutdown leaves the VM "Stopped (allocated)", still billed.
        stopper = AzureStopper(azure, ImdsManagedIdentity(settings.imds_url,
                                                         client_id=settings.managed_identity_client_id),
                               endpoint_url=settings.arm_endpoint_url, ca_file=settings.arm_ca_file)
    elif settings.stop_command:
        stopper = CommandStopper(settings.stop_command, settings.stop_timeout)
    else:
        stopper = None
    if not dry_run and stopper is None:
        how = ("stop_method is command (the default)" if settings.stop_method == "command"
               else "no EC2 instance metadata answered")
        raise ConfigError(f"{args.autostop_config or '--autostop-config'}: key 'stop_command': live autostop needs a way "
                          f"to stop this host: {how}, so set stop_command, e.g. [systemctl, poweroff], or "
                          f"stop_method: ec2 on EC2")
    hostname = agent.host.hostname
    if azure is not None:
        from ...model import azure_vm_id

        host = LocalHost(instance_id=azure_vm_id(azure.arm_id), hostname=hostname, region=azure.location,
                         instance_type=azure.vm_size, on_ec2=False, tags=settings.host_tags)
    elif gce_stopper is not None:
        gce_id = gce_stopper.identity
        host = LocalHost(instance_id=gce_id.instance_id, hostname=hostname, region=gce_id.region,
                         instance_type=gce_id.machine_type, on_ec2=False, tags=settings.host_tags)
    else:
        host = LocalHost(
            instance_id=identity.instance_id if identity else (agent.host.instance_id or hostname),
            hostname=hostname, region=identity.region if identity else "",
            instance_type=identity.instance_type if identity else "", on_ec2=identity is not None,
            tags=settings.host_tags)
    catalog, catalog_problem = estimate_catalog(settings)
    from ...config import not_a_regular_file

    why = not_a_regular_file(args.autostop_db) if str(args.autostop_db).strip() else "empty"
    if why and why != "does not exist":  # SQLite on a device would write its journal beside it (/dev/null-journal)
        raise ValueError(f"--autostop-db {args.autostop_db!r}: {why}, not a database file")
    buffer = RingBuffer(args.autostop_db)
    host_paths = paths or HostPaths(snooze=args.snooze_file or default_snooze_path())
    if isinstance(stopper, Ec2Stopper) and settings.unmark_at_boot:
        withdraw_service_mark_at_boot(stopper, buffer, boot_time(host_paths.proc), dry_run=dry_run)
    slack = _slack_notifier(settings, Path(args.autostop_db).with_name("agent-slack.db"))
    loop = AutostopLoop(rules=rules, settings=settings, buffer=buffer, host=host, stopper=stopper,
                        announcer=Announcer(settings.wall_command, slack), interval_s=agent.interval_s, dry_run=dry_run,
                        paths=host_paths, clock=clock, catalog=catalog,
                        catalog_problem=catalog_problem)
    return loop


UNMARKED_BOOT_KEY = "service_mark_withdrawn_at_boot"


def withdraw_service_mark_at_boot(stopper, buffer, booted_at: float | None, *, dry_run: bool) -> None:
    """Once per boot of this host (its /proc/stat boot time, remembered in the ring buffer's state; an agent restart
    on the same boot does nothing), remove the central service's stop mark from this instance: a machine that
    booted was started by a person or its provisioning, which cancels the stop announced before. The agent's
    first start on a host counts as a boot (it cannot know when the mark was set): a cancel, never a stop.
    Not done (logged) when it cannot be read or refused: the next start of the agent on this boot tries again.
    In dry-run (the agent's own, as for its stop) nothing is removed: the log says what would be."""
    from .loop import BOOT_TIME_JITTER_S

    booted = booted_at or 0.0
    done = buffer.load_state(UNMARKED_BOOT_KEY)
    if done is not None and abs(float(done.get("boot_time", -1e18)) - booted) <= BOOT_TIME_JITTER_S:
        return
    outcome = stopper.withdraw_service_mark(dry_run=dry_run)
    if outcome.ok is True:
        buffer.save_state(UNMARKED_BOOT_KEY, {"boot_time": booted})
        log.info("autostop: at boot: %s (a restart cancels a stop gpufinops announced before it; with the mark gone "
                 "AWS refuses such a stop still in flight)", outcome.reason)
    else:
        log.error("autostop: at boot, the gpufinops stop mark could not be withdrawn: %s (tried again at the "
                  "agent's next start on this boot)", outcome.reason)


def estimate_catalog(settings: AutostopSettings):
    """The bundled GPU catalog for the price estimate, only when the settings give no price: (catalog, "") or
    (None, why it could not be read)."""
    if settings.price is not None:
        return None, ""
    from ...prices.catalog import CatalogError, load_catalog

    try:
        return load_catalog(), ""
    except CatalogError as exc:
        return None, f"the GPU catalog could not be read: {exc}"


def _slack_notifier(settings: AutostopSettings, db: Path):
    if settings.slack is None or not settings.slack.token.resolve():
        return None
    from ...model import utcnow
    from ...notify.delivery import SlackNotifier
    from ...store.store import Store

    # The notifier's delivery records (exactly once per key, across agent restarts) in their own file.
    return SlackNotifier(settings.slack, Store(f"sqlite:///{db}"), utcnow)


def maybe_start_autostop(args: argparse.Namespace, agent) -> RunningAutostop | None:
    """With --autostop (or its env): build the loop, hook it on the agent's samples, tick it in a thread."""
    if not rule_paths(args):
        return None
    loop = build_loop(args, agent)
    agent.on_sample = loop.on_sample
    agent.autostop = loop  # the agent's GET /v1/verdict answers from it
    registry = getattr(agent, "registry", None)
    if registry is not None:
        from .loop import AutostopCollector

        registry.register(AutostopCollector(loop))
    thread = threading.Thread(target=loop.run_forever, name="agent-autostop", daemon=True)
    thread.start()
    rules = [r.name for r in loop.rules if r.action.value in ("stop", "terminate")]
    if not rules:
        log.warning("autostop: none of the rules in %s has action stop: this host is never stopped",
                    ", ".join(rule_paths(args)))
    log.warning("autostop %s for %s: stop rules %s; stop by %s; snooze file %s; samples in %s",
                "LIVE" if loop.live else "in dry-run", loop.host.instance_id, ", ".join(rules) or "(none)",
                loop.stopper.describe if loop.stopper else "nothing (no stop method)", loop.paths.snooze,
                loop.buffer.path)
    return RunningAutostop(loop, thread)
