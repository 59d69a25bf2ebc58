"""`Settings`, the whole gpufinops.yaml as one typed object, and `load_settings` (the file read, validated for the
sections it holds, its paths made relative to it). Imported when a caller first names one of them
(`from gpufinops.config import Settings`): a command that reads no config file (`rules check` without one) loads
none of the sections' models.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, create_model, field_validator, model_validator

from .capabilities import BillingSettings, RecommendSettings, ReportSettings, StoreSettings
from .loading import (DEFAULT_RULES_DIR, ConfigError, format_validation_error, line_of, load_yaml, printable,
                      unsafe_text_locations)
from .secrets import blank_secrets
from .sections import (ActSettings, ApiSettings, AwsSettings, AzureSettings, EmailSettings, GcpSettings,
                       HostsSettings, KubernetesSettings, LeaseSettings, PrometheusSettings, ScheduleSettings,
                       ServiceSettings, SlackSettings, SlurmSettings)
from .values import StrictModel, defaults_of


class Settings(StrictModel):
    # No `hosts:` section: no rented host is listed (hosts with an AWS API come from the EC2 inventory).
    hosts: HostsSettings | None = None
    # No `kubernetes:` section: no cluster is read.
    kubernetes: KubernetesSettings | None = None
    # No `slurm:` section: no Slurm cluster is read (docs/slurm.md).
    slurm: SlurmSettings | None = None
    # No `gcp:` section: no Compute Engine VM is listed.
    gcp: GcpSettings | None = None
    prometheus: PrometheusSettings = Field(default_factory=defaults_of(PrometheusSettings))
    aws: AwsSettings = Field(default_factory=defaults_of(AwsSettings))
    # No `azure:` section: no Azure VM is listed (gpufinops.places.azure).
    azure: AzureSettings | None = None
    slack: SlackSettings = Field(default_factory=defaults_of(SlackSettings))
    email: EmailSettings = Field(default_factory=defaults_of(EmailSettings))
    act: ActSettings = Field(default_factory=defaults_of(ActSettings))
    schedule: ScheduleSettings = Field(default_factory=defaults_of(ScheduleSettings))
    service: ServiceSettings = Field(default_factory=defaults_of(ServiceSettings))
    api: ApiSettings = Field(default_factory=defaults_of(ApiSettings))
    lease: LeaseSettings = Field(default_factory=defaults_of(LeaseSettings))
    database_url: str = "sqlite:///gpufinops.db"
    rules_paths: tuple[str, ...] = (str(DEFAULT_RULES_DIR),)
    # The capabilities' sections, typed like the rest and so checked at load: a typo in any of them fails
    # `load_settings`, not the weekly digest days later. No `billing:` section (or an empty one) is None:
    # the budget job is off and reports price from the catalog.
    billing: BillingSettings | None = None
    recommend: RecommendSettings = Field(default_factory=defaults_of(RecommendSettings))
    report: ReportSettings = Field(default_factory=defaults_of(ReportSettings))
    store: StoreSettings = Field(default_factory=defaults_of(StoreSettings))
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


@functools.lru_cache(maxsize=64)
def settings_validator(given: frozenset[str]) -> type[Settings]:
    """The model that validates a document holding the keys `given`: Settings, but each key the document leaves
    out typed Any with its default, so that no validator is built for a section the file does not have. A key the
    document holds is validated as Settings declares it (its checks, errors and their order), an unknown key is
    refused, and Settings' own checks run on the whole, defaults included."""
    left_out = {name: (Any, Field(default_factory=f.default_factory) if f.default_factory else Field(f.default))
                for name, f in Settings.model_fields.items() if name not in given}
    return create_model("Settings", __base__=Settings, __module__=__name__, **left_out)


def validated_settings(data: dict[str, Any]) -> Settings:
    """Settings.model_validate(data), paying only for what `data` holds: its sections' validators are built, the
    others' never (building all of them was about 20 ms of every command's start, BENCHMARKS.md), and a document with
    nothing in it is the defaults, valid as written (values.defaults_of), with no validator at all: building the
    first one loads pydantic's plugin lookup (importlib.metadata). tests/test_config_fuzz.py holds it equal to
    Settings' own validator on every document it draws: the same settings, or the same errors."""
    if data.keys() == {"source_path"} and isinstance(data["source_path"], str):
        return Settings.model_construct(source_path=data["source_path"])
    checked = settings_validator(frozenset(Settings.model_fields.keys() & data.keys())).model_validate(data)
    return Settings.model_construct(checked.model_fields_set, **dict(checked))  # validated: kept as they are


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
        settings = validated_settings(data)
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
