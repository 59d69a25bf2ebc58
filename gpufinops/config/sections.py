"""The sections of the service and of the places it reads: prometheus, aws, slack, email, act, schedule,
service, api, lease, kubernetes, hosts, slurm. Each a StrictModel of validated values with its defaults.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .loading import printable
from .secrets import SecretRef, env_secret
from .values import (_CRON_DAYS, _DOMAIN, _FAMILY, MAX_USD_PER_GPU_HOUR, MAX_USD_PER_HOST_HOUR, SLACK_USER_ID,
                     AwsRegion, Name, PrometheusLabel, ReadableFile, SlackChannel, StrictModel, backoff_in_order,
                     http_url, known_gpu, usd_only, usd_price)

class PrometheusSettings(StrictModel):
    url: str = "http://127.0.0.1:9090"
    # Seconds one query may take; past it the usage is UNKNOWN (never idle). Bounded: a tick is a minute.
    timeout_s: float = Field(10.0, gt=0, le=600)
    bearer_token: SecretRef = env_secret("GPUFINOPS_PROMETHEUS_TOKEN")
    basic_auth_user: str | None = None
    basic_auth_password: SecretRef = env_secret("GPUFINOPS_PROMETHEUS_PASSWORD")
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
    token: SecretRef = env_secret("SLACK_BOT_TOKEN")
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
    signing_secret: SecretRef = env_secret("SLACK_SIGNING_SECRET")
    # The same buttons without a public URL (a VPC with no inbound HTTPS): Slack Socket Mode. Each replica opens a
    # WebSocket with the app-level token (xapp-…, scope connections:write; never the token itself here: where to
    # read it) and receives clicks over it; same authorisation and audit as POST /slack/actions.
    socket_mode: bool = False
    app_token: SecretRef = env_secret("SLACK_APP_TOKEN")
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
    password: SecretRef = env_secret("GPUFINOPS_SMTP_PASSWORD")
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
    bearer_token: SecretRef = env_secret("GPUFINOPS_API_TOKEN")
    tls: ApiTlsSettings | None = None


class LeaseSettings(StrictModel):
    """The scheduler lease in the database (gpufinops/lease.py): of several `serve` processes on one
    database only the holder acts. A leader that dies is replaced by a standby after ttl_s; the leader
    renews every ttl_s/3, so a renewal may fail twice before the lease is lost."""

    ttl_s: int = Field(90, ge=3, le=3600)


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

_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252}[A-Za-z0-9_])?$")

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


# --------------------------------------------------------------------------- slurm:
# Read by gpufinops.places.slurm (the jobs that hold GPUs, judged, warned about and requeued / held / cancelled
# through the actuator) and gpufinops.cost's Slurm accounting (sacct: GPU-hours per account, user, partition);
# docs/slurm.md. One mapping for one cluster, a list for several.

_SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# A cluster's name is in every subject id, `slurm:<cluster>/<jobid>`, which the store keeps in 64 characters
# (PostgreSQL refuses a longer one: every tick would fail): 7 for "slurm:" and "/", 16 for the longest job id Slurm
# gives (MaxJobId's 8 digits, "_", an array task's 7), 41 left.
SLURM_CLUSTER_MAX = 41


class SlurmClusterSettings(StrictModel):
    """One Slurm cluster: reached through its client commands (`conf`: the slurm.conf they read, as SLURM_CONF).
    slurmrestd is not a way in yet (docs/slurm.md): no key for it is taken, so none is accepted and ignored."""

    cluster: str  # its ClusterName: in every subject id, `slurm:<cluster>/<jobid>`
    enabled: bool = True
    conf: str | None = None  # a slurm.conf path; None: the commands' own default (/etc/slurm/slurm.conf)
    timeout_s: float = Field(30.0, gt=0, le=600)  # one command or request; a timeout is UNKNOWN, never idle
    # The month's accounting is asked of sacct in windows of this many hours, one answer in memory at a time
    # (places.slurm.accounting.read_charges): smaller for a cluster that runs more jobs. Each window is one sacct
    # call under timeout_s.
    sacct_window_hours: float = Field(24.0, ge=1 / 3600, le=24 * 31)  # one second to a month

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, v: str) -> str:
        if not _SLURM_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not a Slurm ClusterName (letters, digits, '_', '.', '-'; 63 at most)")
        if len(v) > SLURM_CLUSTER_MAX:
            raise ValueError(f"{v[:20]!r}... is {len(v)} characters: at most {SLURM_CLUSTER_MAX}, as it is part of "
                             f"every job's id `slurm:<cluster>/<jobid>` the store keeps in 64")
        return v

    @field_validator("conf", "email_map", "slack_users")
    @classmethod
    def _a_path(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and (not v.strip() or "\x00" in v):
            what = "the cluster's slurm.conf" if info.field_name == "conf" else "a map file"
            raise ValueError(f"expected the path of {what} (leave the key out for none)")
        return v

    # --- Cost (gpufinops.places.slurm.accounting; docs/slurm.md "Cost"): what one GPU-hour of a partition costs.
    # partition -> USD per GPU-hour ("*": every partition not named); first, before any GPU model.
    usd_per_gpu_hour: dict[str, float] = Field(default_factory=dict)
    # partition -> its GPU model (H100, A100-80GB, ...; "*": every partition not named), priced at the catalog's
    # lowest on-demand $/GPU-h of that model (an estimate) when no usd_per_gpu_hour prices the partition.
    gpu_model: dict[str, str] = Field(default_factory=dict)

    @field_validator("usd_per_gpu_hour", mode="before")
    @classmethod
    def _gpu_hour_prices(cls, v: Any) -> dict[str, float]:
        if not isinstance(v, dict):
            raise ValueError("expected a mapping partition -> USD per GPU-hour, e.g. {gpu: 2.49, '*': 1.8}")
        out: dict[str, float] = {}
        for partition, price in v.items():
            try:
                out[str(partition)] = usd_price(price, MAX_USD_PER_GPU_HOUR)
            except ValueError as exc:
                raise ValueError(f"{partition}: {exc}") from None
        return out

    @field_validator("gpu_model", mode="before")
    @classmethod
    def _partition_models(cls, v: Any) -> dict[str, str]:
        if not isinstance(v, dict):
            raise ValueError("expected a mapping partition -> GPU model, e.g. {gpu: H100, a100: A100-80GB}")
        out: dict[str, str] = {}
        for partition, model in v.items():
            try:
                known_gpu(str(model))
            except ValueError as exc:
                raise ValueError(f"{partition}: {exc}") from None
            out[str(partition)] = str(model).strip()
        return out
    # --- governance of the cluster's GPU jobs (docs/slurm.md; helper "slurm", issue 38): what marks a job, who is
    # never acted on, how a job's GPUs are found in DCGM's series, who is told, and how a job is ended.
    # Where the mark lives: `comment` (users may edit it, so they see it and can write the snooze keyword beside
    # it) or `admin_comment` (only operators write it; the snooze keyword is still read from the Comment).
    mark_field: Literal["comment", "admin_comment"] = "comment"
    # A word a user writes into the job's Comment (`scontrol update jobid=N Comment="... gpufinops:keep"`): the
    # job is snoozed for act.max_snooze_s from when gpufinops first saw it.
    snooze_keyword: str = Field("gpufinops:keep", min_length=3, max_length=64, pattern=r"^\S+$")
    # Protect lists: jobs of these users / accounts / QOS / partitions are judged, never marked or ended.
    protect_users: tuple[Name, ...] = ()
    protect_accounts: tuple[Name, ...] = ()
    protect_qos: tuple[Name, ...] = ()
    protect_partitions: tuple[Name, ...] = ()
    # salloc / srun --pty / an interactive app's allocation: notify-only unless this is true for the cluster.
    act_on_interactive: bool = False
    # The signal sent to the batch shell before a cancel or a requeue (`scancel --signal=SIG --batch`), and how
    # long the job then has to checkpoint before the change. "" (the default) sends none: a batch script that does
    # not trap the signal dies of it (USR1's default action), which would end a job that was to be requeued.
    grace_signal: str = Field("", pattern=r"^([A-Z][A-Z0-9]{0,9})?$")
    grace_s: float = Field(60.0, ge=0, le=600)
    # Slurm's GPU index (IDX, the device minor) -> what DCGM's series say for that GPU, per node host name (or "*"
    # for every node): a `gpu` label value (NVML index, digits) or a `GPU-...` UUID. Without an entry the index is
    # taken to be the same as DCGM's `gpu` label (docs/slurm.md, "The index caveat").
    gpu_index_map: dict[str, dict[int, str]] = Field(default_factory=dict)
    # The job's user -> email address: `email_domain` gives user@domain, `email_map` (a file, `user address` per
    # line, # comments) overrides it; `slack_users` (a file, `user U0123ABCD` per line) reaches them in Slack.
    email_domain: str | None = None
    email_map: str | None = None
    slack_users: str | None = None

    @field_validator("email_domain")
    @classmethod
    def _email_domain(cls, v: str | None) -> str | None:
        if v is not None and not _DOMAIN.fullmatch(v):
            raise ValueError(f"{v!r} is not a mail domain")
        return v

    @field_validator("gpu_index_map")
    @classmethod
    def _gpu_index_map(cls, v: dict[str, dict[int, str]]) -> dict[str, dict[int, str]]:
        for node, entries in v.items():
            for idx, target in entries.items():
                if not (target.isdigit() or target.startswith("GPU-") or target.startswith("MIG-")):
                    raise ValueError(f"node {node!r}, index {idx}: {target!r} is neither a DCGM gpu index (digits) "
                                     "nor a GPU UUID (GPU-...)")
        return v


class SlurmSettings(StrictModel):
    clusters: tuple[SlurmClusterSettings, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        # `slurm: {cluster: ci, conf: ...}` is one cluster; `slurm: [{...}, {...}]` several;
        # `slurm: {clusters: [...]}` as stored.
        if isinstance(v, list):
            return {"clusters": v}
        if isinstance(v, dict) and "clusters" not in v:
            return {"clusters": [v]}
        return v

    @field_validator("clusters")
    @classmethod
    def _unique(cls, v: tuple[SlurmClusterSettings, ...]) -> tuple[SlurmClusterSettings, ...]:
        seen: set[str] = set()
        for c in v:
            if c.cluster in seen:
                raise ValueError(f"cluster {c.cluster!r} is listed twice")
            seen.add(c.cluster)
        return v

    @property
    def enabled(self) -> tuple[SlurmClusterSettings, ...]:
        return tuple(c for c in self.clusters if c.enabled)


# --------------------------------------------------------------------------- gcp:
# A GCP project id: 6 to 30 lowercase letters, digits or hyphens, starting with a letter, not ending with a hyphen.
GCP_PROJECT = r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$"


class GcpSettings(StrictModel):
    """Compute Engine GPU VMs (places/gcp/, docs/deploy.md "GCP"). No `gcp:` section: no Google API is called.
    Credentials from the environment: `access_token` when it resolves (a short-lived OAuth token, e.g. from
    `gcloud auth print-access-token` or a workload-identity sidecar), else Application Default Credentials
    (GOOGLE_APPLICATION_CREDENTIALS, the metadata server of a GCE/GKE host)."""

    projects: tuple[Annotated[str, Field(pattern=GCP_PROJECT)], ...] = Field(min_length=1)
    access_token: SecretRef = env_secret("GPUFINOPS_GCP_ACCESS_TOKEN")
    # Another Compute API endpoint (Private Service Connect, a test's stand-in); None = compute.googleapis.com.
    api_endpoint: str | None = None
    # A stop's zone operation is polled until DONE for at most this long; past it the stop is read back like a
    # lost answer (a VM found STOPPING or TERMINATED is stopped) and settled on a later tick.
    operation_timeout_s: float = Field(120.0, gt=0, le=3600)
    # Failed attempts of a read (429, 5xx, a dropped connection) tried again, waiting Retry-After when given.
    read_attempts: int = Field(4, ge=1, le=10)
    page_size: int = Field(500, ge=1, le=500)  # aggregatedList maxResults (GCE's cap is 500)
    # `recommend --refresh-prices` reads the Cloud Billing Catalog here and keeps its GPU VM prices in this file
    # (the bundled prices otherwise; prices/gcp_refresh.py).
    billing_catalog_endpoint: str = "https://cloudbilling.googleapis.com"
    price_cache_path: Name = "gpufinops-gcp-prices.json"

    @field_validator("api_endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        return None if v is None else http_url(v)

    _billing = field_validator("billing_catalog_endpoint")(http_url)
# --------------------------------------------------------------------------- azure:
# Read by gpufinops.places.azure (Azure VMs with GPU sizes, deallocated through ARM); docs/deploy.md, "Azure".

_SUBSCRIPTION = re.compile(r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$")


class AzureSettings(StrictModel):
    # The subscriptions whose VMs are listed (each needs the role of deploy/azure/ assigned to gpufinops).
    subscriptions: tuple[str, ...] = Field(min_length=1)
    # ARM's endpoint; None: Azure's public cloud (https://management.azure.com). Must be https: ARM's bearer token
    # is never sent in the clear.
    endpoint_url: str | None = None
    # The CA bundle that signs endpoint_url's (and authority_host's) certificate; None: the system's.
    ca_file: ReadableFile | None = None
    # Microsoft Entra ID's login endpoint for the service principal of AZURE_CLIENT_ID / AZURE_TENANT_ID /
    # AZURE_CLIENT_SECRET; None: the public cloud's. Set, its instance discovery is off: no call goes to
    # login.microsoftonline.com to validate it (a sovereign cloud, a private stand-in).
    authority_host: str | None = None
    # The size table with prices `tools/refresh_azure_prices.py` wrote from the Azure Retail Prices API; None: the
    # bundled one (gpufinops/data/azure_gpu_vms.csv, prices of 2026-05-20).
    price_file: ReadableFile | None = None
    # VM sizes listed as GPU VMs: the NC, ND and NV families (the bundled size table names the GPU of each).
    gpu_size_prefixes: tuple[Name, ...] = ("Standard_NC", "Standard_ND", "Standard_NV")
    # How long a deallocate is followed (its long-running operation polled) before the tick moves on; the VM is
    # read back either way, and "deallocating" already counts as done.
    deallocate_wait_s: float = Field(30.0, ge=0, le=600)
    connect_timeout_s: float = Field(5.0, gt=0, le=120)
    read_timeout_s: float = Field(30.0, gt=0, le=600)

    @field_validator("subscriptions")
    @classmethod
    def _subscription_ids(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for s in v:
            if not _SUBSCRIPTION.fullmatch(s):
                raise ValueError(f"{printable(s)[:60]!r} is not a subscription id (a GUID such as "
                                 f"00000000-0000-0000-0000-000000000000)")
        if len({s.lower() for s in v}) != len(v):
            raise ValueError("a subscription is listed twice")
        return v

    @field_validator("endpoint_url", "authority_host")
    @classmethod
    def _https_endpoint(cls, v: str | None) -> str | None:
        if v is None:
            return None
        url = http_url(v)
        if not url.startswith("https://"):
            raise ValueError("https only: ARM's bearer token and the service principal's secret are never sent in "
                             "the clear")
        return url.rstrip("/")
