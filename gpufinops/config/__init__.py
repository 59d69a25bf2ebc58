"""One typed settings object, loaded once from gpufinops.yaml.

Errors name the file and the dotted key (and the line where YAML knows it).
Secrets are never in the file: the file names the environment variable or the
mounted file that holds them.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import re
import sys
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .model import FALSE_STOP_WITHIN_S

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


class StrictModel(BaseModel):
    """The base of every settings and budget-file model: an unknown key is an error (a typo never passes as a
    default), values are frozen once loaded."""

    # inf and nan are never a setting: `timeout_s: .inf` would wait forever, nan compares false everywhere.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SecretRef(StrictModel):
    """Where a secret lives: an environment variable or a mounted file.

    Unset (no such variable, no such file) is "not configured": an optional secret's feature is off. Set but blank
    (a variable holding only whitespace, a mounted file holding only a newline, as an empty Kubernetes Secret key
    mounts) is never a secret: `load_settings` refuses it naming the key (`blank_secrets`), and `resolve()` hands
    back "" for it, which no bearer check accepts (httpd.authorize)."""

    env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None  # a variable's name
    file: Annotated[str, Field(min_length=1)] | None = None

    def resolve(self) -> str | None:
        """The secret, stripped; None when not configured; "" when set but blank or unreadable."""
        if self.env and (value := os.environ.get(self.env)) is not None:
            return value.strip()
        if self.file and Path(self.file).is_file():
            try:
                return _secret_file_text(self.file).strip()
            except (OSError, ValueError):  # unreadable, not text, too long: never a secret, never an open door
                return ""
        return None

    def blank(self) -> str | None:
        """Why this secret is set but unusable (blank, unreadable), or None when it is usable or not configured."""
        if self.env and (value := os.environ.get(self.env)) is not None and not value.strip():
            return f"the environment variable {self.env} is set but blank: give the secret, or unset it"
        if self.file and Path(self.file).is_file():
            try:
                if not _secret_file_text(self.file).strip():
                    return f"the file {self.file} is blank: give the secret, or remove file:"
            except (OSError, ValueError) as exc:
                return f"the file {self.file} cannot be read: {getattr(exc, 'strerror', None) or exc}"
        return None


MAX_SECRET_BYTES = 64 * 1024  # a token, a password, a key: far less; more is the wrong file, never read whole


def _secret_file_text(path: str) -> str:
    """A secret file's text (UTF-8); ValueError when it is longer than MAX_SECRET_BYTES or not UTF-8."""
    with open(path, "rb") as f:
        data = f.read(MAX_SECRET_BYTES + 1)
    if len(data) > MAX_SECRET_BYTES:
        raise ValueError(f"longer than {MAX_SECRET_BYTES // 1024} KiB: not a secret")
    return data.decode("utf-8")


def secret_refs(model: BaseModel, loc: tuple = ()) -> list[tuple[tuple, SecretRef]]:
    """Every SecretRef of a settings tree with its dotted location, sections nested at any depth."""
    if isinstance(model, SecretRef):
        return [(loc, model)]
    out: list[tuple[tuple, SecretRef]] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out.extend(secret_refs(value, (*loc, name)))
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    out.extend(secret_refs(item, (*loc, name, i)))
    return out


def blank_secrets(settings: BaseModel, where: str, text: str) -> None:
    """A ConfigError naming each secret of `settings` that is set but blank or unreadable (file, line, key)."""
    root = compose_yaml(text) if text else None
    errors = []
    for loc, ref in secret_refs(settings):
        why = ref.blank()
        if why is not None:
            line = line_of(where, loc, text, root) if root is not None else None
            key = ".".join(str(p) for p in loc)
            errors.append(f"{where}:{line}: key '{key}': {why}" if line else f"{where}: key '{key}': {why}")
    if errors:
        raise ConfigError("\n".join(errors))


# An AWS region name: us-east-1, us-gov-west-1, ap-southeast-2, eusc-de-east-1. Anything else (a typo, an RTL
# override pasted from a chat) would be a region no API call can reach, every instance of it silently never read.
AWS_REGION = re.compile(r"[a-z]{2,4}(-[a-z]+)+-[0-9]{1,2}")
# A DNS name (RFC 1123 labels): the right-hand side of a Message-ID, a mail server's name.
_DOMAIN = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def aws_region(v: str) -> str:
    if not AWS_REGION.fullmatch(v):
        raise ValueError(f"{printable(v)!r} is not an AWS region name (like us-east-1 or eu-central-1)")
    return v


AwsRegion = Annotated[str, AfterValidator(aws_region)]
# A name that must say something (a label, a tag key, a path, a workgroup): empty is never "off" for these; the
# keys where empty means off say so where they are declared.
Name = Annotated[str, Field(min_length=1)]
_PROMETHEUS_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# A channel as chat.postMessage takes it: #name (lower-case, as Slack makes every name) or an id (C…, G…, D…).
_SLACK_CHANNEL = re.compile(r"#?[a-z0-9][a-z0-9._-]{0,79}|[CDGUW][A-Z0-9]{1,20}")
_DAY = r"(?:mon|tue|wed|thu|fri|sat|sun|[0-6])"
_CRON_DAYS = re.compile(rf"{_DAY}(?:-{_DAY})?(?:,{_DAY}(?:-{_DAY})?)*")
_S3_URI = re.compile(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?")
_FAMILY = re.compile(r"^[a-z][a-z0-9-]*$")  # an instance family: g5, p6-b200


def prometheus_label(v: str) -> str:
    if not _PROMETHEUS_LABEL.fullmatch(v):
        raise ValueError(f"{printable(v)!r} is not a Prometheus label name (letters, digits and _, not first a digit)")
    return v


def slack_channel(v: str) -> str:
    if not _SLACK_CHANNEL.fullmatch(v):
        raise ValueError(f"{printable(v)!r} is not a Slack channel (#name in lower case, or a channel id like C0123ABCD)")
    return v


PrometheusLabel = Annotated[str, AfterValidator(prometheus_label)]
SlackChannel = Annotated[str, AfterValidator(slack_channel)]

# An email address a notice can be sent to (an owner tag that is one, a rule's `email:` destination).
EMAIL_ADDRESS = re.compile(r"^[^@\s<>\"',;]+@[^@\s<>\"',;]+\.[^@\s<>\"',;]+$")
# The audiences a rule's `notify_to` may name (notify/routing.py turns each into destinations): the subject's owner
# (a mention, a DM, an email), its team's channel (else the default), the default channel.
RULE_AUDIENCES = ("owner", "team", "default")
# The transports a destination may name, each with what it is sent to: `slack:#ml-gpus`, `email:finance@example.com`.
TRANSPORTS = ("slack", "email")


def destination(v: str) -> str:
    """A rule's destination, as written: an audience (RULE_AUDIENCES) or `transport:target` (a Slack channel, an
    email address); anything else is refused (a typo would silently send a warning nowhere)."""
    v = v.strip()
    if v in RULE_AUDIENCES:
        return v
    transport, sep, target = v.partition(":")
    if not sep or transport not in TRANSPORTS:
        raise ValueError(f"{printable(v)!r} is not a destination: write one of {', '.join(RULE_AUDIENCES)}, "
                         f"'slack:#channel' or 'email:name@example.com'")
    if transport == "slack":
        return f"slack:{slack_channel(target.strip())}"
    if not EMAIL_ADDRESS.fullmatch(target.strip()):
        raise ValueError(f"{printable(target)!r} is not an email address (email:name@example.com)")
    return f"email:{target.strip()}"


def http_url(v: str) -> str:
    """An http(s) URL with a host: anything else is a peer no request can reach."""
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 - raises ValueError on a port out of range or not a number
    except ValueError as exc:
        raise ValueError(f"{printable(v)!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in v):
        raise ValueError(f"{printable(v)!r} is not an http:// or https:// URL with a host")
    return v


def backoff_in_order(v: int, info: ValidationInfo) -> int:
    """retry_max_backoff_s (`v`) is where the doubling of retry_backoff_s stops: below it, it would mean nothing."""
    first = info.data.get("retry_backoff_s")  # absent when it failed itself (reported under its own key)
    if first is not None and v < first:
        raise ValueError(f"{v} is below retry_backoff_s ({first}): the longest wait between two tries cannot be "
                         f"shorter than the first")
    return v


class PrometheusSettings(StrictModel):
    url: str = "http://127.0.0.1:9090"
    # Seconds one query may take; past it the usage is UNKNOWN (never idle). Bounded: a tick is a minute.
    timeout_s: float = Field(10.0, gt=0, le=600)
    bearer_token: SecretRef = SecretRef(env="GPUFINOPS_PROMETHEUS_TOKEN")
    basic_auth_user: str | None = None
    basic_auth_password: SecretRef = SecretRef(env="GPUFINOPS_PROMETHEUS_PASSWORD")
    verify_tls: bool = True
    # Label that carries the EC2 instance id (set by ec2_sd_configs relabelling).
    instance_label: PrometheusLabel = "instance_id"
    # Fallback: hostname labels matched to the instance's private DNS name or IP.
    hostname_labels: tuple[PrometheusLabel, ...] = ("Hostname", "hostname")
    scrape_interval_s: int = Field(30, ge=1, le=3600)
    # Extra PromQL label matchers added to every selector, e.g. 'job="dcgm"'.
    selector: str = ""
    # Seconds between two reads of each GPU's profiling ratios that only say why use is low (SM occupancy,
    # tensor and FP pipes): a fifth of the instances is read per tick, the others keep their last figures, their
    # age stated. SM activity and every figure a verdict uses are read every tick. 0 = all of them every tick.
    # It saves the engine 0.5-0.9 CPU-s per 10k profiled GPUs and tick (BENCHMARKS.md, "Occupancy, tensor and
    # FP pipes read in turns").
    profiling_reasons_every_s: int = Field(300, ge=0, le=3600)
    # The tick split by instance into shards, each its own query set, run `shard_parallelism` at a time and
    # folded into usage as it lands: client memory follows the shard, not the fleet (docs/scale.md). 1 = one
    # query set for the whole fleet; "auto" = one shard per ~10k GPUs (1, 2, 4, 8 or 16). A shard is picked
    # by the last character of the instance label's value, so series must carry `instance_label`.
    shards: int | Literal["auto"] = Field(1)
    shard_parallelism: int = Field(2, ge=1, le=16)
    # The shards this process owns (0-based), for replicas on disjoint shards; empty = all of them. Each
    # replica needs its own database (`database_url`): the one-scheduler lease lives there (docs/scale.md).
    owned_shards: tuple[int, ...] = ()

    _url = field_validator("url")(http_url)

    @field_validator("shards")
    @classmethod
    def _shards(cls, v):
        if v != "auto" and not 1 <= v <= 16:  # one shard per last character of a hex instance id, at most
            raise ValueError("shards must be 1 to 16, or auto")
        return v

    @model_validator(mode="after")
    def _owned(self):
        if self.owned_shards and (self.shards == "auto" or any(not 0 <= s < self.shards for s in self.owned_shards)):
            raise ValueError("owned_shards needs a number of shards, and each between 0 and shards - 1")
        return self


class AssumeRole(StrictModel):
    """A role gpufinops assumes in another account; external_id when the role's trust policy requires one
    (sts:ExternalId, AWS's guard against the confused deputy)."""
    arn: str = Field(min_length=1)
    external_id: str | None = Field(None, min_length=2, max_length=1224)


class AwsSettings(StrictModel):
    # At least one: the first is the default region of S3, pricing and unpriced instances.
    regions: tuple[AwsRegion, ...] = Field(("us-east-1",), min_length=1)
    # Other accounts to govern: the IAM role gpufinops assumes in each (see deploy/iam-policy.json), as an
    # ARN string or {arn: ..., external_id: ...}.
    assume_roles: tuple[AssumeRole, ...] = ()

    @field_validator("assume_roles", mode="before")
    @classmethod
    def _roles(cls, v):
        return tuple({"arn": r} if isinstance(r, str) else r for r in v) if isinstance(v, (list, tuple)) else v

    # Govern the account of gpufinops' own credentials too (with assume_roles).
    include_own_account: bool = True
    endpoint_url: str | None = None  # moto / VPC endpoint
    profile: Name | None = None
    # Instance families treated as GPU instances (describe_instance_types GpuInfo also counts).
    gpu_families: tuple[Annotated[str, Field(pattern=_FAMILY.pattern)], ...] = (
        "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200",
        "g4dn", "g4ad", "g5", "g5g", "g6", "g6e", "g6f", "gr6", "g7e",
    )

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        return None if v is None else http_url(v)


class SlackSettings(StrictModel):
    token: SecretRef = SecretRef(env="SLACK_BOT_TOKEN")
    default_channel: SlackChannel = "#gpu-finops"
    base_url: str | None = None  # slack-sdk default when None
    max_retries: int = Field(3, ge=0, le=20)
    outbox_path: Name = "gpufinops-outbox.jsonl"
    # A message Slack did not accept is sent again on later ticks, waiting this long after the first
    # failure and doubling up to retry_max_backoff_s. Until a warning is delivered, no stop happens.
    retry_backoff_s: int = Field(60, ge=1, le=86400)
    retry_max_backoff_s: int = Field(3600, ge=1, le=7 * 86400)
    # Buttons on warnings (Snooze 2 h / until tomorrow 09:00 / Keep running 7 days), handled at POST
    # /slack/actions. Shown only when this secret resolves: every click is checked against it (docs/notifications.md).
    signing_secret: SecretRef = SecretRef(env="SLACK_SIGNING_SECRET")
    # The same buttons without a public URL (a VPC with no inbound HTTPS): Slack Socket Mode. Each replica opens a
    # WebSocket with the app-level token (xapp-…, scope connections:write; never the token itself here: where to
    # read it) and receives clicks over it; same authorisation and audit as POST /slack/actions.
    socket_mode: bool = False
    app_token: SecretRef = SecretRef(env="SLACK_APP_TOKEN")
    # Who may snooze: the instance's owner (its owner tag: a Slack user id, or an email), the people of its team
    # here (team tag value -> people), and these admins, anything. A person is a Slack user id or an email (matched
    # against the email users.info gives for the clicking id); never a name, which anyone can choose.
    snooze_admins: tuple[str, ...] = ()
    team_members: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    # Routing: an instance's messages go to its team's channel (team tag value -> channel) unless its rule names
    # one; `default_channel` gets the rest and the daily summary. dm_owners: the owner (owner tag = a Slack user id,
    # or an email looked up with users.lookupByEmail) also gets each warning as a direct message.
    team_channels: dict[Name, SlackChannel] = Field(default_factory=dict)
    dm_owners: bool = False
    # Hysteresis of the "No usable GPU metrics" alert: an instance's outage episode closes only after its metrics
    # have been usable this long without a break; a relapse before that is the same episode (no second alert).
    metrics_recovered_after_s: int = Field(1800, ge=0, le=7 * 86400)

    _backoff = field_validator("retry_max_backoff_s")(backoff_in_order)

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        return None if v is None else http_url(v)

    def interactive(self) -> bool:
        """Whether clicks can reach the service (a signing secret for POST /slack/actions, or Socket Mode with its
        app-level token): buttons are offered only then."""
        return bool(self.signing_secret.resolve() or (self.socket_mode and self.app_token.resolve()))

    @field_validator("snooze_admins")
    @classmethod
    def _admins_are_people(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_slack_person(entry) for entry in v)

    @field_validator("team_members")
    @classmethod
    def _members_are_people(cls, v: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        out = {}
        for team, people in v.items():
            try:
                out[team] = tuple(_slack_person(entry) for entry in people)
            except ValueError as exc:
                raise ValueError(f"team {team!r}: {exc}") from None
        return out


_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def _is_ip(v: str) -> bool:
    try:
        ipaddress.ip_address(v)
        return True
    except ValueError:
        return False


def _slack_person(entry: str) -> str:
    """A Slack user id or an email, as written; a name is refused because a click's user name is not proof of
    who clicked (anyone can take any display name)."""

    entry = entry.strip()
    if SLACK_USER_ID.fullmatch(entry) or _EMAIL.fullmatch(entry):
        return entry
    raise ValueError(f"{entry!r} must be a Slack user id (U… or W…, e.g. U012AB3CDE) or an email; "
                     f"names are not accepted: a button click is authorised by the clicking user's id only")


class EmailSettings(StrictModel):
    """The email delivery (notify/email.py): off unless `enabled`. Owners whose owner tag is an address get
    their notices by email when Slack cannot reach them; `finance` gets the monthly report. The password comes
    from the environment or a mounted file, never from this file."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(587, ge=1, le=65535)
    # starttls: plain connect then STARTTLS (port 587); ssl: TLS from the first byte (465); none: no TLS,
    # refused with a username unless the server is on this machine (a password is never sent in the clear).
    security: Literal["starttls", "ssl", "none"] = "starttls"
    username: str | None = None
    password: SecretRef = SecretRef(env="GPUFINOPS_SMTP_PASSWORD")
    # A CA bundle to verify the server with (a private CA); default: the system's.
    ca_file: str | None = None
    sender: str = "gpufinops@localhost.localdomain"
    finance: tuple[str, ...] = ()
    timeout_s: float = Field(10.0, gt=0, le=300)
    # The right-hand side of every Message-ID (<key hash@message_id_domain>).
    message_id_domain: str = "gpufinops.invalid"
    retry_backoff_s: int = Field(60, ge=1, le=86400)
    retry_max_backoff_s: int = Field(3600, ge=1, le=7 * 86400)

    _backoff = field_validator("retry_max_backoff_s")(backoff_in_order)

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"{printable(v)!r} is not a file (a PEM bundle the service can read)")
        return v

    @field_validator("message_id_domain", "host")
    @classmethod
    def _a_domain(cls, v: str) -> str:
        # A CR/LF or an empty name would make every message's headers invalid: every email would fail.
        if not _DOMAIN.fullmatch(v) and not _is_ip(v):
            raise ValueError(f"{printable(v)!r} is not a domain name (letters, digits, '-' and '.', e.g. gpufinops.invalid)")
        return v

    @field_validator("sender")
    @classmethod
    def _sender_is_an_address(cls, v: str) -> str:
        if not _EMAIL.fullmatch(v.strip()):
            raise ValueError(f"{v!r} is not an email address")
        return v.strip()

    @field_validator("finance")
    @classmethod
    def _finance_are_addresses(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [a for a in v if not _EMAIL.fullmatch(a.strip())]
        if bad:
            raise ValueError(f"not email addresses: {bad}")
        return tuple(a.strip() for a in v)

    def model_post_init(self, _context: Any) -> None:
        if self.username and self.security == "none" and self.host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError(f"email.security: none with a username would send the password in the clear to "
                             f"{self.host}; use starttls or ssl")
        if self.username and not (self.password.env or self.password.file):
            raise ValueError("email.password: say where the password lives (env: or file:)")


class ActSettings(StrictModel):
    dry_run: bool = True
    max_stops_per_run: int = Field(5, ge=0, le=100_000)
    max_stops_fraction: float = Field(0.1, ge=0.0, le=1.0)
    actor: str = Field("gpufinops", min_length=1, max_length=256)
    # A snooze tag further ahead than this is capped to it (and reported); unreadable ones count as this long.
    max_snooze_s: int = Field(7 * 86400, ge=60, le=366 * 86400)
    # The opt-in: only an instance carrying this tag with this value is ever warned "will be stopped" or
    # stopped. The shipped IAM policy (deploy/iam-policy.json) allows StopInstances on exactly this tag and
    # value, so code and policy say the same; change both together.
    opt_in_tag: str = Field("gpufinops:allow-stop", min_length=1, max_length=128)
    opt_in_value: str = Field("true", min_length=1, max_length=256)


class ScheduleSettings(StrictModel):
    evaluate_every_s: int = Field(60, ge=1, le=86400)
    misfire_grace_s: int = Field(30, ge=0, le=86400)
    # Budget alerts, when a `billing:` section is configured; 0 turns the job off.
    budget_check_every_s: int = Field(3600, ge=0, le=7 * 86400)
    # Right-sizing run + Slack digest, weekly (UTC); empty day turns it off.
    recommend_digest_day: str = "mon"
    recommend_digest_hour: int = Field(9, ge=0, le=23)
    # The platform channel's daily summary (stops, marks, snoozes, budget alerts) at this UTC hour; null = off.
    daily_summary_hour: int | None = Field(8, ge=0, le=23)
    # Monthly audit report for the month just ended, written here on the 1st at 06:00 UTC; empty = off.
    monthly_report_dir: str = ""
    # What stopping saved this month, net, by team (the monthly report's own count, month to date) for /metrics
    # (`gpufinops_net_saving_month_to_date`); recounted this often, 0 turns it off.
    savings_every_s: int = Field(3600, ge=0, le=7 * 86400)

    @field_validator("recommend_digest_day")
    @classmethod
    def _digest_day(cls, v: str) -> str:
        if v and not _CRON_DAYS.fullmatch(v.lower()):
            raise ValueError(f"{printable(v)!r} is not a day of the week (mon ... sun, a range mon-fri, a list mon,thu); "
                             f"empty turns the digest off")
        return v


class ServiceSettings(StrictModel):
    # The address to listen on; 0.0.0.0 for every interface (an empty one would mean that too, unsaid: refused).
    host: str = Field("127.0.0.1", min_length=1)
    # Where Prometheus scrapes /metrics: a fixed port (0, "any free port", is nothing a scrape config can name;
    # `serve --port 0` still asks for one, for tests).
    port: int = Field(9108, ge=1, le=65535)

    @field_validator("port", mode="before")
    @classmethod
    def _not_any_port(cls, v: Any) -> Any:
        if v == 0 and not isinstance(v, bool):
            raise ValueError("0 would be a random port that no scrape config can name: give a fixed one (e.g. 9108)")
        return v


class ApiTlsSettings(StrictModel):
    """The idleness API over mutual TLS on a port of its own: the client must present a certificate signed by
    `client_ca_file` (no certificate, or another CA's: the handshake fails, nothing is answered). Files are PEM,
    mounted (a Kubernetes Secret, cert-manager); they are read at start. /metrics and /slack/actions stay on the
    plain port: Prometheus and Slack do not present client certificates."""

    port: int = Field(ge=1, le=65535)
    cert_file: str  # the server's certificate chain
    key_file: str  # its private key (never logged)
    client_ca_file: str  # the CA(s) whose client certificates are accepted

    @field_validator("cert_file", "key_file", "client_ca_file")
    @classmethod
    def _readable_file(cls, v: str) -> str:
        if not Path(v).is_file():
            raise ValueError(f"{v!r} is not a file (a PEM file the service can read)")
        return v


class ApiSettings(StrictModel):
    """The read-only idleness API on the service's port (GET /v1/verdicts, gpufinops/run/api.py). With a bearer
    token every request must carry it; without one only loopback clients are answered. With `tls:` it is also
    served over mutual TLS on its own port, where a verified client certificate is the access (and the bearer
    token too, when one is set)."""

    enabled: bool = True
    bearer_token: SecretRef = SecretRef(env="GPUFINOPS_API_TOKEN")
    tls: ApiTlsSettings | None = None


class LeaseSettings(StrictModel):
    """The scheduler lease in the database (gpufinops/lease.py): of several `serve` processes on one
    database only the holder acts. A leader that dies is replaced by a standby after ttl_s; the leader
    renews every ttl_s/3, so a renewal may fail twice before the lease is lost."""

    ttl_s: int = Field(90, ge=3, le=3600)


# --------------------------------------------------------------------------- billing:
# Read by gpufinops.collect.billing (settings.billing_settings fills in what depends on other sections).

# Tag keys end up inside JSON paths in the Athena SQL: keep them to safe characters.
_TAG_KEY = re.compile(r"^[A-Za-z0-9_]+$")


class TagKeys(StrictModel):
    """Tag keys tried in order; CUR 2.0 prefixes user tags with `user_`."""

    team: tuple[str, ...] = ("team", "Team", "user_team", "user_Team")
    project: tuple[str, ...] = ("project", "Project", "user_project", "user_Project")
    owner: tuple[str, ...] = ("owner", "Owner", "user_owner", "user_Owner", "created-by")

    @field_validator("team", "project", "owner")
    @classmethod
    def _keys(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("needs at least one tag key")
        for key in v:
            if not _TAG_KEY.match(key.replace("-", "_")):
                raise ValueError(f"tag key {printable(key)!r}: letters, digits, _ and - only")
        return v


class CeSettings(StrictModel):
    region: AwsRegion = "us-east-1"  # Cost Explorer has one endpoint, in us-east-1
    metric: Literal["UnblendedCost", "AmortizedCost", "NetUnblendedCost", "BlendedCost"] = "UnblendedCost"
    group_tag: Name = "team"  # second GroupBy of the query (the first is INSTANCE_TYPE)
    service: Name = "Amazon Elastic Compute Cloud - Compute"
    # One query per CE PURCHASE_TYPE value, so every row knows its pricing model.
    purchase_types: dict[str, Literal["on-demand", "spot", "reserved", "savings-plan"]] = {
        "On Demand Instances": "on-demand",
        "Spot Instances": "spot",
        "Standard Reserved Instances": "reserved",
        "Convertible Reserved Instances": "reserved",
        "Savings Plans": "savings-plan",
    }
    account: str = ""  # written into the account column (CE rows are not per account here)


class AthenaSettings(StrictModel):
    database: str = "cur"
    table: str = "cur2"
    workgroup: Name = "primary"
    output_location: Annotated[str, Field(pattern=_S3_URI.pattern)] | None = None  # s3://bucket/prefix/ for results
    region: AwsRegion = "us-east-1"
    poll_interval_s: float = Field(1.0, gt=0, le=60)
    timeout_s: float = Field(600.0, gt=0, le=3600)  # Athena queries over a month of CUR take minutes

    @field_validator("database", "table")
    @classmethod
    def _ident(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_]+", v):
            raise ValueError("letters, digits and _ only (it is quoted into SQL)")
        return v


class BillingSettings(StrictModel):
    source: Literal["ce", "cur", "focus", "athena"] = "ce"
    path: str | None = None
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")  # ISO 4217, as the budgets file
    gpu_families: tuple[str, ...] | None = None  # None: settings.aws.gpu_families
    # Other providers' GPU instance names (FOCUS): regexes matched on the charge text.
    gpu_patterns: tuple[Name, ...] = (  # an empty one would match every charge
        r"Standard_N[CDV][A-Za-z0-9_]*",  # Azure N-series
        r"\b(?:a2|a3|a4|g2|g4)-(?:highgpu|megagpu|ultragpu|edgegpu|standard)-[0-9a-z]+\b",  # GCP
        r"\bVM\.GPU[0-9A-Za-z.]*\b|\bBM\.GPU[0-9A-Za-z.]*\b",  # OCI
    )
    focus_cost_column: Literal["BilledCost", "EffectiveCost", "ListCost", "ContractedCost"] = "BilledCost"
    # A single line item above this many currency units is refused as absurd.
    max_line_cost: float = Field(100_000.0, gt=0, le=1e12)
    budgets_path: Name = str(DEFAULT_RULES_DIR / "budgets.yaml")
    price_catalog: str | None = None  # CSV instance_type,region,on_demand_usd_per_hour; None = bundled
    tag_keys: TagKeys = TagKeys()
    ce: CeSettings = CeSettings()
    athena: AthenaSettings = AthenaSettings()
    # An instance counts as running now if it was evaluated this recently.
    running_fresh_s: int = Field(900, gt=0, le=7 * 86400)

    @field_validator("gpu_families")
    @classmethod
    def _families(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None:
            bad = [f for f in v if not _FAMILY.match(f)]
            if bad or not v:
                raise ValueError(f"instance families are lower-case like 'g5' or 'p6-b200', got {list(bad) or v}")
        return v

    @field_validator("gpu_patterns")
    @classmethod
    def _patterns(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            try:
                re.compile(p)
            except (re.error, OverflowError, RecursionError) as exc:
                raise ValueError(f"bad regex {p!r}: {exc}") from None
        return v



# --------------------------------------------------------------------------- recommend:
# Read by gpufinops.recommend: every rule of thumb of right-sizing and purchase advice as a knob with a default.


class InterruptionOverride(StrictModel):
    instance_type: Name = "*"  # glob, e.g. "p5.*"
    region: Name = "*"
    interruption_rate_per_hour: float = Field(ge=0, le=100)


class SpotPolicy(StrictModel):
    # Expected interruptions per instance-hour. GPU spot capacity is scarce; one
    # interruption every ~2 days is a cautious default (AWS Spot Advisor shows
    # many GPU types in its ">20%/month" bucket). Override per type/region.
    interruption_rate_per_hour: float = Field(0.02, ge=0, le=100)
    overrides: tuple[InterruptionOverride, ...] = ()
    checkpoint_interval_h: float = Field(1.0, gt=0, le=24 * 366)  # work lost per interruption: half of this on average
    restart_overhead_h: float = Field(0.25, ge=0, le=24 * 366)  # re-provision, reload data/model, warm up
    min_saving_fraction: float = Field(0.05, ge=0, lt=1)  # spot must beat on-demand by this much

    def rate_for(self, instance_type: str, region: str) -> float:
        for o in self.overrides:  # first match wins, like the rules files
            if fnmatch.fnmatch(instance_type, o.instance_type) and fnmatch.fnmatch(region, o.region):
                return o.interruption_rate_per_hour
        return self.interruption_rate_per_hour


class CommitmentPolicy(StrictModel):
    window_days: int = Field(30, ge=1, le=400)
    baseline_percentile: float = Field(10.0, ge=0, le=100)
    # Used when the catalog has no reserved/committed price for the type
    # (1-year no-upfront savings plans on GPU families are roughly 30-40% off).
    default_discount: float = Field(0.30, ge=0, lt=1)
    term: str = "1-year savings plan / reserved"


class RecommendSettings(StrictModel):
    window_days: int = Field(14, ge=1, le=400)
    min_coverage: float = Field(0.8, gt=0, le=1)  # fraction of expected samples per GPU
    scrape_interval_s: int | None = Field(None, ge=1, le=3600)  # default: prometheus.scrape_interval_s
    memory_headroom: float = Field(0.20, ge=0, le=100)  # candidate GPU memory >= peak x (1 + this)
    compute_headroom: float = Field(0.10, ge=0, le=100)  # candidate TFLOPS >= demand x (1 + this)
    usable_memory_fraction: float = Field(0.93, gt=0, le=1)  # nominal GB a process really gets
    worked_activity_pct: float = Field(5.0, ge=0, le=100)  # a GPU "did work" if its max activity reached this
    hours_per_month: float = Field(730.0, gt=0, le=745)  # 745: a 31-day month plus the DST hour
    providers: tuple[Name, ...] = ()  # candidates from these providers; empty = the instance's own
    same_region: bool = True
    workload_tag: Name = "workload"
    interruptible_values: tuple[Name, ...] = ("batch", "training", "train", "etl")
    non_interruptible_values: tuple[Name, ...] = ("inference", "interactive", "serving", "notebook")
    spot: SpotPolicy = SpotPolicy()
    commitment: CommitmentPolicy = CommitmentPolicy()
    catalog_dir: str | None = None  # default: the bundled catalog
    price_cache_path: Name = "gpufinops-aws-prices.json"
    price_max_age_days: int = Field(90, ge=1, le=3660)  # older prices are flagged in the reason
    digest_channel: SlackChannel | None = None  # default: slack.default_channel
    digest_top: int = Field(10, ge=1, le=1000)


# --------------------------------------------------------------------------- report:
# Read by gpufinops.report: the monthly audit's rules of thumb, each a knob with a default.


class ReportDeliverySettings(StrictModel):
    """Where `gpufinops report --deliver` (and the service's monthly report job) sends the month's report. One
    setting per destination, each off by default; `report --deliver --dry-run` prints what would be sent where."""

    # Slack channel (e.g. "#finops"): one message with the finance page's figures and where the files are.
    slack_channel: str = Field("", max_length=80)

    @field_validator("slack_channel")
    @classmethod
    def _channel(cls, v: str) -> str:
        return v and slack_channel(v)  # empty: no Slack delivery
    # "s3://bucket/prefix": the HTML, its PDF rendition, the JSON and the CSVs are uploaded under prefix/YYYY-MM/.
    s3_uri: str = Field("", pattern=r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?)?$")
    # Email the report (its PDF attached) to `email.finance` through the email delivery (`email:` section).
    email_finance: bool = False


class ReportSettings(StrictModel):
    # The field's monthly-audit rule of thumb: under 60% average utilization is paying for unused capacity.
    underutilized_below_pct: float = Field(60.0, ge=0, le=100)
    false_stop_s: int = Field(FALSE_STOP_WITHIN_S, ge=0, le=7 * 86400)
    top_n: int = Field(10, ge=1, le=1000)
    price_max_age_days: int = Field(90, ge=1, le=3660)
    # Seconds between evaluations. None: measured from the stored decisions (the mean spacing within service runs), so a
    # report on a database written by a service with another schedule still counts time right.
    evaluate_every_s: int | None = Field(None, ge=1, le=86400)
    delivery: ReportDeliverySettings = ReportDeliverySettings()


# --------------------------------------------------------------------------- store:
# Read by gpufinops.pipeline when it records a tick (gpufinops.store.Store.record_decisions).


class StoreSettings(StrictModel):
    # Raw decision rows are kept this many days for forensics (each with its tick's reason and window stats);
    # older time is in the verdict episodes and hourly rollups, which reports, idle costs, budgets and
    # `audit --decisions` read. Pruned at most once an hour.
    raw_decisions_days: float = Field(7, ge=0, le=3660)
    # A raw row is stored when an (instance, rule)'s verdict or reason code changes, and otherwise once per
    # this many seconds (clock-aligned) while it holds; 0 stores every tick's (~6 MiB per instance-week at
    # one tick a minute and 2 rules, against ~0.1 MiB: BENCHMARKS.md, issue 29). Every tick is counted in
    # the episodes and rollups either way.
    raw_decisions_every_s: float = Field(3600, ge=0, le=86400)


# --------------------------------------------------------------------------- kubernetes:
# Read by gpufinops.places.kubernetes.cluster (the cluster reader) and `costs --by namespace|workload`;
# docs/kubernetes.md.


class KubernetesSettings(StrictModel):
    in_cluster: bool = False  # the pod's service account (deploy/kubernetes/workloads/); else the kubeconfig
    kubeconfig: Name | None = None  # None: $KUBECONFIG or ~/.kube/config
    context: Name | None = None  # None: the kubeconfig's current context
    timeout_s: float = Field(10.0, gt=0, le=600)
    namespaces: tuple[Name, ...] = ()  # empty: every namespace
    exclude_namespaces: tuple[Name, ...] = ("kube-system",)
    namespace_selector: dict[str, str] = Field(default_factory=dict)  # namespace labels that must all match
    # A workload (annotation) or namespace (label) carrying this key, any value but "false", is never scaled.
    protect_key: Name = "gpufinops.io/protect"
    # Off: workloads are judged, warned about and reported, never scaled (stop rules written for EC2 instances
    # must not start scaling Deployments when a cluster is added). On: idle Deployments/StatefulSets are scaled
    # to zero through the act stage (dry-run, cap, audit as for instances).
    scale_to_zero: bool = False
    # Off: Kueue-managed jobs are judged, warned about and reported, never suspended. On: a rule with
    # `action: suspend` suspends an idle one through Kueue (its Workload's spec.active: false, after the warning and
    # its lead; `gpufinops k8s restore` resumes it). Needs RBAC get/list/patch on workloads.kueue.x-k8s.io.
    suspend_kueue: bool = False
    # Off: GPU nodes without GPU work are reported (and warned about by rules selecting them), never cordoned. On:
    # a rule with `action: drain` cordons one after the warning and its lead, so that Karpenter / cluster-autoscaler
    # removes it (never a node with karpenter.sh/do-not-disrupt=true or in an EKS managed node group; gpufinops
    # never evicts a pod). Needs RBAC patch on nodes.
    drain_nodes: bool = False


# --------------------------------------------------------------------------- hosts:
# Read by gpufinops.places.hosts (rented hosts watched by `gpufinops agent`, no cloud API, no bill) and
# priced by gpufinops.host_prices; docs/billing.md, "Hosts without a cloud bill".

# Above these a price is a typo (a 72-GPU rack rents for a few hundred $/h).
MAX_USD_PER_GPU_HOUR = 1_000.0
MAX_USD_PER_HOST_HOUR = 10_000.0
_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252}[A-Za-z0-9_])?$")


def usd_price(v: Any, most: float) -> float:
    """A price in USD/h: a positive number (not a string, not true/false) no higher than `most`."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a price in USD per hour (a number such as 2.49), got {v!r}")
    if not 0 < v <= most or v != v:
        raise ValueError(f"a price must be above 0 and at most {most:,.0f} USD/h, got {v!r}")
    return float(v)


def usd_only(v: Any) -> str:
    if v != "USD":
        raise ValueError(f"only USD ({v!r} given): bills, the catalog and every message are in USD and no conversion "
                         f"is done; convert the price to USD")
    return v


def known_gpu(name: str) -> str:
    """The catalog's key for a GPU model name ("NVIDIA H100 80GB HBM3" -> "H100"), or a ValueError naming it."""
    from .prices.catalog import UnknownGpuError, canonical_gpu  # the catalog's name rules; it imports nothing of ours

    try:
        return canonical_gpu(name)
    except UnknownGpuError:
        raise ValueError(f"unknown GPU model {name!r}: use a name such as H100, H200, A100-80GB, L40S, RTX-4090 "
                         f"(gpufinops/data/catalog/gpus.csv)") from None


class RentedHost(StrictModel):
    """One rented GPU host: judged from its agent's metrics (matched on its hostname label), never stopped
    centrally (`gpufinops agent --autostop` stops it from the host)."""

    hostname: str  # as the agent's Hostname/hostname label says it
    gpu_count: int = Field(ge=1, le=1024)
    # The whole host, USD/h (what the rental contract says); none: the GPU model's price below, else an estimate.
    # Before gpu_model, so that gpu_model's check sees it.
    usd_per_hour: float | None = None
    gpu_model: str = Field(min_length=1)  # any spelling: "H100", "NVIDIA H100 80GB HBM3"
    region: str = ""  # where it is, in words ("hetzner fsn1"): shown in messages
    tags: dict[str, str] = Field(default_factory=dict)  # owner, team, workload...: what rules and messages see

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, v: str) -> str:
        if not _HOSTNAME.fullmatch(v):
            raise ValueError(f"{v!r} is not a hostname (letters, digits, '.', '-', '_')")
        return v

    @field_validator("usd_per_hour", mode="before")
    @classmethod
    def _host_price(cls, v: Any) -> float | None:
        return None if v is None else usd_price(v, MAX_USD_PER_HOST_HOUR)

    @field_validator("gpu_model")
    @classmethod
    def _model(cls, v: str, info) -> str:
        # A model gpufinops cannot name has no price but the host's own: refuse it only when none is given.
        if "usd_per_hour" in info.data and info.data["usd_per_hour"] is None:  # absent: it failed, said above
            try:
                known_gpu(v)
            except ValueError as exc:
                raise ValueError(f"{exc}; or give the host's usd_per_hour") from None
        return v.strip()


class HostsSettings(StrictModel):
    currency: str = "USD"
    # GPU model -> USD/h of ONE GPU of it; a host listed without usd_per_hour costs this x its gpu_count.
    usd_per_gpu_hour: dict[str, float] = Field(default_factory=dict)
    inventory: tuple[RentedHost, ...] = ()

    @field_validator("currency")
    @classmethod
    def _currency(cls, v: str) -> str:
        return usd_only(v)

    @field_validator("usd_per_gpu_hour", mode="before")
    @classmethod
    def _per_gpu(cls, v: Any) -> dict[str, float]:
        if not isinstance(v, dict):
            raise ValueError("expected a mapping GPU model -> USD per GPU-hour, e.g. {H100: 2.49, A100-80GB: 1.6}")
        out: dict[str, float] = {}
        for name, price in v.items():
            key = known_gpu(str(name))
            if key in out:
                raise ValueError(f"{name!r} is {key}, which is priced twice")
            try:
                out[key] = usd_price(price, MAX_USD_PER_GPU_HOUR)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return out

    @field_validator("inventory")
    @classmethod
    def _unique(cls, v: tuple[RentedHost, ...]) -> tuple[RentedHost, ...]:
        seen: set[str] = set()
        for h in v:
            if h.hostname.lower() in seen:
                raise ValueError(f"host {h.hostname!r} is listed twice")
            seen.add(h.hostname.lower())
        return v


class Settings(StrictModel):
    # No `hosts:` section: no rented host is listed (hosts with an AWS API come from the EC2 inventory).
    hosts: HostsSettings | None = None
    # No `kubernetes:` section: no cluster is read.
    kubernetes: KubernetesSettings | None = None
    prometheus: PrometheusSettings = PrometheusSettings()
    aws: AwsSettings = AwsSettings()
    slack: SlackSettings = SlackSettings()
    email: EmailSettings = EmailSettings()
    act: ActSettings = ActSettings()
    schedule: ScheduleSettings = ScheduleSettings()
    service: ServiceSettings = ServiceSettings()
    api: ApiSettings = ApiSettings()
    lease: LeaseSettings = LeaseSettings()
    database_url: str = "sqlite:///gpufinops.db"
    rules_paths: tuple[str, ...] = (str(DEFAULT_RULES_DIR),)
    # The capabilities' sections, typed like the rest and so checked at load: a typo in any of them fails
    # `load_settings`, not the weekly digest days later. No `billing:` section (or an empty one) is None:
    # the budget job is off and reports price from the catalog.
    billing: BillingSettings | None = None
    recommend: RecommendSettings = RecommendSettings()
    report: ReportSettings = ReportSettings()
    store: StoreSettings = StoreSettings()
    source_path: str = ""

    @field_validator("billing", mode="before")
    @classmethod
    def _no_billing(cls, v: Any) -> Any:
        return None if v == {} else v

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

    @model_validator(mode="after")
    def _api_tls_port_is_its_own(self) -> "Settings":
        if self.api.tls is not None and self.api.tls.port == self.service.port:
            raise ValueError(f"api.tls.port {self.api.tls.port} is service.port too: the mutual-TLS listener needs a "
                             "port of its own (/metrics and /slack/actions stay on service.port, without TLS)")
        return self

    @model_validator(mode="after")
    def _report_email_has_a_mailer(self) -> "Settings":
        if self.report.delivery.email_finance and not (self.email.enabled and self.email.finance):
            raise ValueError("report.delivery.email_finance: true needs the email delivery on (email.enabled: true) "
                             "and at least one address in email.finance")
        return self


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


# A config, rule or budget file is a few KiB. A bigger one is the wrong file (a log, a dump, /dev/zero, which
# never ends): refused before it is read into memory.
MAX_TEXT_FILE_BYTES = 4 * 2**20


def not_a_regular_file(path: str | Path) -> str:
    """Why `path` is not a regular file to read ("does not exist", "a folder", "not a regular file", the OS's
    words for a name too long...), or "" when it is one. Never raises."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return exc.strerror or str(exc)
    except ValueError:  # a NUL byte in the path
        return "not a valid path (NUL character)"
    if stat.S_ISREG(mode):
        return ""
    return "a folder" if stat.S_ISDIR(mode) else "not a regular file"


def read_text(path: str | Path) -> str:
    """A config, rule or budget file's text; every failure is a ConfigError naming the file. Only a regular file
    is read (a device or a pipe may never end), and at most MAX_TEXT_FILE_BYTES of it."""
    p = Path(path)
    why = not_a_regular_file(p)  # stat first: opening a pipe would wait for a writer
    if why:
        raise ConfigError(f"{printable(str(path))}: cannot read: {why}")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_TEXT_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{printable(str(p))}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL byte in the path
        raise ConfigError(f"{path!r}: cannot read: {exc}") from None
    if len(data) > MAX_TEXT_FILE_BYTES:
        raise ConfigError(f"{printable(str(p))}: larger than {MAX_TEXT_FILE_BYTES // 2**20} MiB: not a config, "
                          "rule or budget file")
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


# Bidirectional controls (U+061C, U+200E/F, U+202A-E, U+2066-9): they make a value read differently from what it
# holds ("Trojan Source"); no setting needs one.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def text_problem(s: str) -> str | None:
    """Why a string cannot be a setting (a NUL, a control character, a bidirectional override), or None.
    No setting is free text: names, paths, URLs, channels, domains are all one printable line."""
    if "\x00" in s:
        return "holds a NUL character"
    if s and not s.strip():
        return "is only blanks (write nothing, or a value)"
    for c in s:
        if c in _BIDI:
            return f"holds a bidirectional control character (U+{ord(c):04X})"
        if unicodedata.category(c) == "Cc":
            return f"holds a control character (U+{ord(c):04X})"
    return None


def unsafe_text_locations(node: Any, loc: tuple = ()) -> list[tuple[tuple, str]]:
    """Where a YAML document holds a string (key or value) that `text_problem` refuses, and why."""
    out: list[tuple[tuple, str]] = []
    if isinstance(node, str):
        why = text_problem(node)
        return [(loc, why)] if why else []
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(k, str) and (why := text_problem(k)):
                out.append(((*loc, k), why))
            out.extend(unsafe_text_locations(v, (*loc, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(unsafe_text_locations(v, (*loc, i)))
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
            unsafe = unsafe_text_locations(raw)
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply") from None
        if unsafe:  # a NUL in a path would fail deep in os.path, an RTL override reads as another name
            raise ConfigError("\n".join(
                f"{path}:{line_of(str(path), loc, text) or 1}: key '{'.'.join(printable(str(p)) for p in loc)}': "
                f"{why}" for loc, why in unsafe[:20]))
        data = raw
    data = {**data, **overrides, "source_path": source}
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source or "<defaults>", text, exc)) from None
    blank_secrets(settings, source or "<defaults>", text)
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

        def file_near_config(p: str | None) -> str | None:  # billing paths may be s3:// prefixes
            return p if not p or "://" in p else near_config(p)

        rec, bill = settings.recommend, settings.billing
        settings = settings.model_copy(update={
            "rules_paths": tuple(near_config(p) for p in settings.rules_paths),
            "database_url": sqlite_near_config(settings.database_url),
            "slack": settings.slack.model_copy(update={"outbox_path": near_config(settings.slack.outbox_path)}),
            "schedule": settings.schedule.model_copy(
                update={"monthly_report_dir": near_config(settings.schedule.monthly_report_dir)}),
            "recommend": rec.model_copy(update={"catalog_dir": file_near_config(rec.catalog_dir),
                                                "price_cache_path": near_config(rec.price_cache_path)}),
            "billing": bill and bill.model_copy(update={
                name: file_near_config(getattr(bill, name)) for name in ("path", "budgets_path", "price_catalog")}),
        })
    return settings


# A Slack user id ("U012AB3CD", "W0123ABCDE"): mentioned as <@id> in messages, a DM channel for the owner.
SLACK_USER_ID = re.compile(r"[UW][A-Z0-9]{8,20}")
