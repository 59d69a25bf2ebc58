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
    # inf and nan are never a setting: `timeout_s: .inf` would wait forever, nan compares false everywhere.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
    # Seconds one query may take; past it the usage is UNKNOWN (never idle). Bounded: a tick is a minute.
    timeout_s: float = Field(10.0, gt=0, le=600)
    bearer_token: SecretRef = SecretRef(env="GPUFINOPS_PROMETHEUS_TOKEN")
    basic_auth_user: str | None = None
    basic_auth_password: SecretRef = SecretRef(env="GPUFINOPS_PROMETHEUS_PASSWORD")
    verify_tls: bool = True
    # Label that carries the EC2 instance id (set by ec2_sd_configs relabelling).
    instance_label: str = "instance_id"
    # Fallback: hostname labels matched to the instance's private DNS name or IP.
    hostname_labels: tuple[str, ...] = ("Hostname", "hostname")
    scrape_interval_s: int = Field(30, ge=1, le=3600)
    # Extra PromQL label matchers added to every selector, e.g. 'job="dcgm"'.
    selector: str = ""


class AwsSettings(_Strict):
    # At least one: the first is the default region of S3, pricing and unpriced instances.
    regions: tuple[str, ...] = Field(("us-east-1",), min_length=1)
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
    max_retries: int = Field(3, ge=0, le=20)
    outbox_path: str = "gpufinops-outbox.jsonl"
    # A message Slack did not accept is sent again on later ticks, waiting this long after the first
    # failure and doubling up to retry_max_backoff_s. Until a warning is delivered, no stop happens.
    retry_backoff_s: int = Field(60, ge=1, le=86400)
    retry_max_backoff_s: int = Field(3600, ge=1, le=7 * 86400)


class ActSettings(_Strict):
    dry_run: bool = True
    max_stops_per_run: int = Field(5, ge=0, le=100_000)
    max_stops_fraction: float = Field(0.1, ge=0.0, le=1.0)
    actor: str = "gpufinops"
    # A snooze tag further ahead than this is capped to it (and reported); unreadable ones count as this long.
    max_snooze_s: int = Field(7 * 86400, ge=60, le=366 * 86400)


class ScheduleSettings(_Strict):
    evaluate_every_s: int = Field(60, ge=1, le=86400)
    misfire_grace_s: int = Field(30, ge=0, le=86400)
    # Budget alerts, when a `billing:` section is configured; 0 turns the job off.
    budget_check_every_s: int = Field(3600, ge=0, le=7 * 86400)
    # Right-sizing run + Slack digest, weekly (UTC); empty day turns it off.
    recommend_digest_day: str = "mon"
    recommend_digest_hour: int = Field(9, ge=0, le=23)
    # Monthly audit report for the month just ended, written here on the 1st at 06:00 UTC; empty = off.
    monthly_report_dir: str = ""


class ServiceSettings(_Strict):
    host: str = "127.0.0.1"
    # 0 = any free port (the tests bind one that way).
    port: int = Field(9108, ge=0, le=65535)


class LeaseSettings(_Strict):
    """The scheduler lease in the database (gpufinops/lease.py): of several `serve` processes on one
    database only the holder acts. A leader that dies is replaced by a standby after ttl_s; the leader
    renews every ttl_s/3, so a renewal may fail twice before the lease is lost."""

    ttl_s: int = Field(90, ge=3, le=3600)


class Settings(_Strict):
    prometheus: PrometheusSettings = PrometheusSettings()
    aws: AwsSettings = AwsSettings()
    slack: SlackSettings = SlackSettings()
    act: ActSettings = ActSettings()
    schedule: ScheduleSettings = ScheduleSettings()
    service: ServiceSettings = ServiceSettings()
    lease: LeaseSettings = LeaseSettings()
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

    @field_validator("rules_paths")
    @classmethod
    def _paths(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any("\x00" in p or not p.strip() for p in v):
            raise ValueError("a rule path is empty or holds a NUL character")
        return v


def compose_yaml(text: str) -> yaml.Node | None:
    """The YAML node tree (with line marks) of a document, or None when it has none."""
    try:
        return yaml.compose(text)
    except (yaml.YAMLError, RecursionError):
        return None


def line_of(path: str, loc: tuple, text: str, root: yaml.Node | None = None) -> int | None:
    """Best-effort line number of a dotted key in a YAML document (`root`: its compose_yaml(), if at hand)."""
    node = root if root is not None else compose_yaml(text)
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
    root = compose_yaml(text)
    for e in err.errors():
        loc = (*prefix, *e["loc"])
        key = ".".join(printable(str(p)) for p in loc) or "<root>"
        line = line_of(path, loc, text, root) if root is not None else None
        where = f"{path}:{line}" if line else path
        lines.append(f"{where}: key '{key}': {printable(e['msg'])}")
    return "\n".join(lines)


def printable(s: str) -> str:
    """A key or message on one line: a newline or control character in a YAML key is shown escaped."""
    return s if s.isprintable() else s.encode("unicode_escape").decode("ascii")


def decode_text(path: str | Path, data: bytes) -> str:
    """The UTF-8 text of a file's bytes, or a ConfigError naming the first bad byte, its offset and line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def not_utf8_error(path: str | Path, chunk_size: int = 1 << 20) -> ConfigError:
    """For a file a reader (pandas) could not decode: where its first non-UTF-8 byte is, read in chunks."""
    start, line, pending = 0, 1, b""  # start: file offset of `pending`, the bytes not yet decoded
    try:
        with open(path, "rb") as f:
            while chunk := f.read(chunk_size):
                data = pending + chunk
                try:
                    data.decode("utf-8")
                    good = len(data)
                except UnicodeDecodeError as exc:
                    if exc.end < len(data) or len(data) - exc.start > 3:  # a bad byte, not a cut sequence
                        line += data.count(b"\n", 0, exc.start)
                        return ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} "
                                           f"at offset {start + exc.start})")
                    good = exc.start  # a character cut by the chunk boundary: decode it with the next chunk
                line += data.count(b"\n", 0, good)
                start, pending = start + good, data[good:]
    except OSError as exc:
        return ConfigError(f"{path}: cannot read: {exc.strerror or exc}")
    if pending:
        return ConfigError(f"{path}:{line}: not UTF-8 text (truncated character at offset {start})")
    return ConfigError(f"{path}: not UTF-8 text")


def read_text(path: str | Path) -> str:
    """A config, rule or budget file's text; every failure is a ConfigError naming the file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL byte in the path
        raise ConfigError(f"{path!r}: cannot read: {exc}") from None
    return decode_text(p, data)


def parse_yaml(where: str | Path, text: str) -> Any:
    """yaml.safe_load, with every failure a ConfigError naming the file and, where YAML knows it, the line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is None and isinstance(exc, yaml.reader.ReaderError):  # a control character
            line = text.count("\n", 0, exc.position) + 1
            char = ord(exc.character) if isinstance(exc.character, str) else int(exc.character)
            raise ConfigError(f"{where}:{line}: invalid YAML: unacceptable character "
                              f"#x{char:04x} at offset {exc.position}") from None
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{where}{line}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML: nested too deeply") from None
    except (ValueError, OverflowError, TypeError) as exc:  # e.g. a date like 2024-13-45 that YAML types as a date
        raise ConfigError(f"{where}: invalid YAML value: {exc}") from None


def load_yaml(path: str | Path) -> tuple[Any, str]:
    p = Path(path)
    text = read_text(p)
    return parse_yaml(p, text), text


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


def nul_locations(node: Any, loc: tuple = ()) -> list[tuple]:
    """Where a YAML document holds a string (key or value) with a NUL character."""
    out: list[tuple] = []
    if isinstance(node, str):
        return [loc] if "\x00" in node else []
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(k, str) and "\x00" in k:
                out.append((*loc, k))
            out.extend(nul_locations(v, (*loc, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(nul_locations(v, (*loc, i)))
    return out


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
        try:
            nul = nul_locations(raw)
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply") from None
        if nul:  # a NUL in a path would fail deep in os.path, far from the key that holds it
            raise ConfigError("\n".join(
                f"{path}:{line_of(str(path), loc, text) or 1}: key '{'.'.join(printable(str(p)) for p in loc)}': "
                f"holds a NUL character" for loc in nul[:20]))
        data = raw
    data = {**data, **overrides, "source_path": source}
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source or "<defaults>", text, exc)) from None
    if path is not None:
        # One rule for every path in a config file, defaults included: a relative path is relative to the
        # config file, not the working directory, so running from another folder finds the same database,
        # outbox and rules instead of creating new ones there.
        base = Path(path).resolve().parent

        def near_config(p: str) -> str:
            return p if not p or Path(p).is_absolute() else str((base / p).resolve())

        def sqlite_near_config(url: str) -> str:
            scheme, sep, rest = url.partition(":///")  # sqlite:///rel.db; sqlite:////abs.db is absolute
            file, q, query = rest.partition("?")
            if not scheme.startswith("sqlite") or not sep or file in ("", ":memory:") or file.startswith("file:"):
                return url
            return f"{scheme}:///{near_config(file)}{q}{query}"

        recommend = dict(settings.recommend)
        for key in ("catalog_dir", "price_cache_path"):
            if isinstance(recommend.get(key), str):
                recommend[key] = near_config(recommend[key])
        settings = settings.model_copy(update={
            "rules_paths": tuple(near_config(p) for p in settings.rules_paths),
            "database_url": sqlite_near_config(settings.database_url),
            "slack": settings.slack.model_copy(update={"outbox_path": near_config(settings.slack.outbox_path)}),
            "schedule": settings.schedule.model_copy(
                update={"monthly_report_dir": near_config(settings.schedule.monthly_report_dir)}),
            "recommend": recommend,
        })
    return settings
