"""One typed settings object, loaded once from gpufinops.yaml.

Errors name the file and the dotted key (and the line where YAML knows it).
Secrets are never in the file: the file names the environment variable or the
mounted file that holds them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PACKAGE_DIR = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """A folder shipped beside the package: the checkout's rules/ or reports/ (editable install),
    else the copy a wheel installs under <prefix>/share/gpufinops/ (see pyproject data-files)."""
    for base in (PACKAGE_DIR.parent, Path(sys.prefix) / "share" / "gpufinops"):
        if (base / name).is_dir():
            return base / name
    return PACKAGE_DIR.parent / name


# The shipped default policies (rules/*.yaml) and report templates (reports/).
DEFAULT_RULES_DIR = shipped_dir("rules")
REPORTS_DIR = shipped_dir("reports")


class ConfigError(ValueError):
    """Bad configuration or rule file; the message names file, key and line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretRef(_Strict):
    """Where a secret lives: an environment variable or a mounted file."""

    env: str | None = None
    file: str | None = None

    def resolve(self) -> str | None:
        if self.env and os.environ.get(self.env):
            return os.environ[self.env].strip()
        if self.file and Path(self.file).is_file():
            return Path(self.file).read_text().strip()
        return None


class PrometheusSettings(_Strict):
    url: str = "http://127.0.0.1:9090"
    timeout_s: float = 10.0
    bearer_token: SecretRef = SecretRef(env="GPUFINOPS_PROMETHEUS_TOKEN")
    basic_auth_user: str | None = None
    basic_auth_password: SecretRef = SecretRef(env="GPUFINOPS_PROMETHEUS_PASSWORD")
    verify_tls: bool = True
    # Label that carries the EC2 instance id (set by ec2_sd_configs relabelling).
    instance_label: str = "instance_id"
    # Fallback: hostname labels matched to the instance's private DNS name or IP.
    hostname_labels: tuple[str, ...] = ("Hostname", "hostname")
    scrape_interval_s: int = 30
    # Extra PromQL label matchers added to every selector, e.g. 'job="dcgm"'.
    selector: str = ""


class AwsSettings(_Strict):
    regions: tuple[str, ...] = ("us-east-1",)
    # Other accounts to govern: the IAM role gpufinops assumes in each (see deploy/iam-policy.json).
    assume_roles: tuple[str, ...] = ()
    # Govern the account of gpufinops' own credentials too (with assume_roles).
    include_own_account: bool = True
    endpoint_url: str | None = None  # moto / VPC endpoint
    profile: str | None = None
    # Instance families treated as GPU instances (describe_instance_types GpuInfo also counts).
    gpu_families: tuple[str, ...] = (
        "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200",
        "g4dn", "g4ad", "g5", "g5g", "g6", "g6e", "g6f", "gr6", "g7e",
    )


class SlackSettings(_Strict):
    token: SecretRef = SecretRef(env="SLACK_BOT_TOKEN")
    default_channel: str = "#gpu-finops"
    base_url: str | None = None  # slack-sdk default when None
    max_retries: int = 3
    outbox_path: str = "gpufinops-outbox.jsonl"


class ActSettings(_Strict):
    dry_run: bool = True
    max_stops_per_run: int = Field(5, ge=0)
    max_stops_fraction: float = Field(0.1, ge=0.0, le=1.0)
    actor: str = "gpufinops"


class ScheduleSettings(_Strict):
    evaluate_every_s: int = Field(60, ge=1)
    misfire_grace_s: int = 30
    # Budget alerts, when a `billing:` section is configured; 0 turns the job off.
    budget_check_every_s: int = Field(3600, ge=0)
    # Right-sizing run + Slack digest, weekly (UTC); empty day turns it off.
    recommend_digest_day: str = "mon"
    recommend_digest_hour: int = Field(9, ge=0, le=23)
    # Monthly audit report for the month just ended, written here on the 1st at 06:00 UTC; empty = off.
    monthly_report_dir: str = ""


class ServiceSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = 9108


class Settings(_Strict):
    prometheus: PrometheusSettings = PrometheusSettings()
    aws: AwsSettings = AwsSettings()
    slack: SlackSettings = SlackSettings()
    act: ActSettings = ActSettings()
    schedule: ScheduleSettings = ScheduleSettings()
    service: ServiceSettings = ServiceSettings()
    database_url: str = "sqlite:///gpufinops.db"
    rules_paths: tuple[str, ...] = (str(DEFAULT_RULES_DIR),)
    # Free-form sections owned by capabilities (billing, recommend, report):
    # each validates its own section with its own model.
    billing: dict[str, Any] = Field(default_factory=dict)
    recommend: dict[str, Any] = Field(default_factory=dict)
    report: dict[str, Any] = Field(default_factory=dict)
    source_path: str = ""

    @field_validator("database_url")
    @classmethod
    def _db_url(cls, v: str) -> str:
        if "://" not in v:
            raise ValueError("expected a SQLAlchemy URL such as sqlite:///gpufinops.db or postgresql://...")
        return v


def line_of(path: str, loc: tuple, text: str) -> int | None:
    """Best-effort line number of a dotted key in a YAML document."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if node is None:
            break
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == str(part):
                    line = k.start_mark.line + 1
                    nxt = v
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def format_validation_error(path: str, text: str, err: ValidationError, prefix: tuple = ()) -> str:
    """One line per error: `file:line: key 'a.b.c': message`. `prefix` is where the validated
    data sits in the file (e.g. ("recommend",) for a capability's section)."""
    lines = []
    for e in err.errors():
        loc = (*prefix, *e["loc"])
        key = ".".join(str(p) for p in loc) or "<root>"
        line = line_of(path, loc, text)
        where = f"{path}:{line}" if line else path
        lines.append(f"{where}: key '{key}': {e['msg']}")
    return "\n".join(lines)


def load_yaml(path: str | Path) -> tuple[Any, str]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    try:
        return yaml.safe_load(text), text
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc


def validate_section(settings: "Settings", key: str, model: type[BaseModel]):
    """Validate a capability's free-form section (settings.billing, settings.recommend) with its
    own model; errors name the config file, the line and `key.sub.key`, like the core settings."""
    try:
        return model.model_validate(getattr(settings, key) or {})
    except ValidationError as exc:
        text = ""
        if settings.source_path:
            try:
                _, text = load_yaml(settings.source_path)
            except ConfigError:
                text = ""
        raise ConfigError(
            format_validation_error(settings.source_path or "<defaults>", text, exc, prefix=(key,))
        ) from None


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load gpufinops.yaml (or defaults when path is None). Overrides win."""
    data: dict[str, Any] = {}
    text = ""
    source = ""
    if path is not None:
        raw, text = load_yaml(path)
        source = str(path)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = raw
    data = {**data, **overrides, "source_path": source}
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source or "<defaults>", text, exc)) from None
    if path is not None:
        # Relative rule paths are relative to the config file, not the cwd.
        base = Path(path).resolve().parent
        resolved = tuple(str((base / p).resolve()) if not Path(p).is_absolute() else p for p in settings.rules_paths)
        settings = settings.model_copy(update={"rules_paths": resolved})
    return settings
