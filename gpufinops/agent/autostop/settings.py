"""The autostop settings file (`--autostop-config FILE`): typed, validated at load, errors name file, line and key.

Every command the agent runs is an argv list, never a shell line: the first element an absolute path or a bare
command name looked up on PATH, the rest plain strings. Nothing read from a GPU, a tag or a user ever goes into
an argv; only this file does.

    dry_run: true                    # the service's name (act.dry_run); false (or --autostop-live) acts
    stop_method: command             # ec2: StopInstances on its own id (IMDS); auto: ec2 when IMDS answers;
                                     # gce: instances.stop on itself (the metadata server's token)
    stop_command: [systemctl, poweroff]
    pre_stop_hook: {argv: [/usr/local/bin/save-checkpoint], timeout: 2m}
    block_if_input_within: 30m       # a logged-in session with input this recent blocks a stop
    block_processes: [jupyter-lab, tmux]
    host_tags: {workload: training}  # what the rules' select/exclude_tags see for this host
    max_snooze: 7d
    unknown_grace: 2m                # GPU state unknown this long withdraws a pending stop; shorter: it waits
    slack: {default_channel: "#gpu-finops"}   # token from SLACK_BOT_TOKEN, as for the service
    price: {usd_per_hour: 19.9}      # what this host rents for; none: a catalog estimate for its GPUs
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from ...config import (
    MAX_USD_PER_HOST_HOUR,
    ConfigError,
    SlackSettings,
    StrictModel,
    blank_secrets,
    format_validation_error,
    load_yaml,
    usd_only,
    usd_price,
)
from ...rules import parse_duration

from .defaults import (  # noqa: F401
    DEFAULT_DB_PATH,
    DEFAULT_GCE_METADATA_URL,
    DEFAULT_IMDS_URL,
    DEFAULT_MAX_SNOOZE_S,
    DEFAULT_SNOOZE_PATH,
    DEFAULT_UNKNOWN_GRACE_S,
)

log = logging.getLogger("gpufinops.autostop")

# A bare command name (looked up on PATH): letters, digits and . _ + - only, so it can be neither a path
# relative to the working directory nor an option.
_BARE_COMMAND = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")


def argv_problem(argv: Any) -> str | None:
    """Why `argv` is not a safe command (None when it is): a non-empty list of strings whose first element is an
    absolute path or a bare command name; no NUL, no newline."""
    if not isinstance(argv, (list, tuple)) or not argv:
        return "expected a non-empty list of strings, e.g. [/usr/local/bin/save-checkpoint] (never a shell line)"
    for i, part in enumerate(argv):
        if not isinstance(part, str):
            return f"element {i} is {type(part).__name__}, expected a string"
        if "\x00" in part or "\n" in part:
            return f"element {i} holds a NUL or newline character"
    first = argv[0]
    if not (Path(first).is_absolute() or _BARE_COMMAND.fullmatch(first)):
        return (f"the command {first!r} must be an absolute path or a bare command name on PATH "
                f"(a shell line such as 'a && b' is not run by a shell)")
    return None


def _argv(v: Any) -> tuple[str, ...]:
    problem = argv_problem(v)
    if problem:
        raise ValueError(problem)
    return tuple(v)


def _duration(v: Any, max_s: int = 366 * 86400) -> int:
    return parse_duration(v, max_s=max_s)


class HookSettings(StrictModel):
    argv: tuple[str, ...]
    # Past this the hook is killed (with everything it started) and the stop is cancelled.
    timeout: int = 120  # seconds

    @field_validator("argv", mode="before")
    @classmethod
    def _check_argv(cls, v: Any) -> tuple[str, ...]:
        return _argv(v)

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, v: Any) -> int:
        return _duration(v, max_s=3600)


class PriceSettings(StrictModel):
    """What this host costs an hour (the rental contract), in USD: shown in its warnings and exported as
    gpufinops_host_hourly_cost. Without it the price is an estimate from the GPU catalog (gpufinops.host_prices)."""

    usd_per_hour: float
    currency: str = "USD"

    @field_validator("usd_per_hour", mode="before")
    @classmethod
    def _price(cls, v: Any) -> float:
        return usd_price(v, MAX_USD_PER_HOST_HOUR)

    @field_validator("currency")
    @classmethod
    def _currency(cls, v: str) -> str:
        return usd_only(v)


class AutostopSettings(StrictModel):
    # The service's flag and name (act.dry_run): dry-run unless false. `live:` is its deprecated old name, read by
    # load_autostop_settings (`live: true` is `dry_run: false`), with a warning.
    dry_run: bool = True
    # The instance metadata address (imds_url) is contacted only when EC2 self-stop is asked for (ec2, or auto:
    # ec2 when it answers): by default the agent sends nothing to 169.254.169.254.
    # gce: the Compute API's stop of this VM with its service account's token from the metadata server.
    # azure: ARM's deallocate of this VM with its managed identity (token from IMDS), never a guest shutdown.
    stop_method: Literal["auto", "ec2", "gce", "azure", "command"] = "command"
    stop_command: tuple[str, ...] | None = None
    stop_timeout: int = 60  # seconds a stop command may take
    pre_stop_hook: HookSettings | None = None
    # 0 = logged-in sessions never block.
    block_if_input_within: int = 30 * 60  # seconds
    block_processes: tuple[str, ...] = ()
    host_tags: dict[str, str] = Field(default_factory=dict)
    max_snooze: int = DEFAULT_MAX_SNOOZE_S  # seconds
    # An UNKNOWN shorter than this holds a pending stop silently (the unknown time does not count towards the lead);
    # one this long withdraws it, said once (docs/agent.md, "Missing data and a pending stop").
    unknown_grace: int = DEFAULT_UNKNOWN_GRACE_S  # seconds
    wall_command: tuple[str, ...] = ("wall",)  # argv before the message
    imds_url: str = DEFAULT_IMDS_URL
    # With EC2 self-stop (stop_method ec2, or auto on EC2), live: remove the central service's stop mark
    # (gpufinops:marked-for-stop) from this instance once per boot, so a person's stop+start cancels its stop
    # at the cloud (docs/deploy.md). Needs DeleteTags of that one key (deploy/systemd/iam-self-stop.json).
    unmark_at_boot: bool = True
    # Extra endpoint for EC2 (a VPC endpoint; moto in tests).
    ec2_endpoint_url: str | None = None
    # stop_method gce: the metadata server (who this VM is, its service account's token) and the Compute API
    # endpoint (None: compute.googleapis.com); contacted only with stop_method gce.
    gce_metadata_url: str = DEFAULT_GCE_METADATA_URL
    gce_api_endpoint: str | None = None
    # Azure self-deallocate: ARM's endpoint (None: Azure's public cloud) and the CA that signs it (None: the
    # system's); the managed identity's client id when the VM has several user-assigned ones.
    arm_endpoint_url: str | None = None
    arm_ca_file: str | None = None
    managed_identity_client_id: str | None = None
    slack: SlackSettings | None = None
    price: PriceSettings | None = None
    # Samples older than the longest rule window plus this are deleted from the ring buffer.
    keep_margin: int = 3600  # seconds

    @field_validator("stop_command", "wall_command", mode="before")
    @classmethod
    def _check_command(cls, v: Any) -> tuple[str, ...] | None:
        return None if v is None else _argv(v)

    @field_validator("stop_timeout", mode="before")
    @classmethod
    def _stop_timeout(cls, v: Any) -> int:
        return _duration(v, max_s=3600)

    @field_validator("block_if_input_within", mode="before")
    @classmethod
    def _input_within(cls, v: Any) -> int:
        return 0 if v in (0, "0") else _duration(v, max_s=7 * 86400)

    @field_validator("max_snooze", mode="before")
    @classmethod
    def _max_snooze(cls, v: Any) -> int:
        return _duration(v, max_s=366 * 86400)

    @field_validator("unknown_grace", mode="before")
    @classmethod
    def _unknown_grace(cls, v: Any) -> int:
        return _duration(v, max_s=86400)

    @field_validator("keep_margin", mode="before")
    @classmethod
    def _margin(cls, v: Any) -> int:
        return _duration(v, max_s=7 * 86400)

    @field_validator("block_processes", mode="before")
    @classmethod
    def _process_names(cls, v: Any) -> tuple[str, ...]:
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) and x.strip() for x in v):
            raise ValueError("expected a list of process names as /proc/PID/comm shows them, e.g. [jupyter-lab, tmux]")
        return tuple(x.strip() for x in v)


def load_autostop_settings(path: str | Path | None) -> AutostopSettings:
    """The settings file, or the defaults when `path` is None. Bad input is a ConfigError naming file, line, key."""
    if path is None:
        return AutostopSettings()
    raw, text = load_yaml(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level (dry_run:, stop_command:, pre_stop_hook: ...)")
    raw = _deprecated_live(raw, path, text)
    try:
        settings = AutostopSettings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), text, exc)) from None
    blank_secrets(settings, str(path), text)  # a blank Slack token is an error, as in the service's config
    return settings


def _deprecated_live(raw: dict, path, text: str) -> dict:
    """`live: true|false`, the old name of the dry-run flag, read as `dry_run: false|true` with a warning; given with
    `dry_run` too, or not a boolean, it is a load error naming the key and its line."""
    if "live" not in raw:
        return raw
    line = next((n for n, row in enumerate(text.splitlines(), 1) if row.lstrip().startswith("live:")), None)
    where = f"{path}:{line}" if line else str(path)
    value = raw["live"]
    if "dry_run" in raw:
        raise ConfigError(f"{where}: key 'live': the deprecated name of dry_run (live: true is dry_run: false); "
                          f"give only dry_run")
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: key 'live': expected true or false; it is deprecated: write "
                          f"dry_run: false (act) or dry_run: true")
    log.warning("%s: key 'live' is deprecated: write dry_run: %s (the service's name for the same flag)", where,
                str(not value).lower())
    out = {k: v for k, v in raw.items() if k != "live"}
    out["dry_run"] = not value
    return out
