"""The capabilities' sections: billing (read by collect.billing), recommend (right-sizing and purchase advice),
report (the monthly audit and its delivery), store (what a tick keeps). Typed like the rest, so a typo in any of
them fails `load_settings`, not the weekly digest days later.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from ..break_even import FALSE_STOP_WITHIN_S
from .loading import DEFAULT_RULES_DIR, printable
from .values import _FAMILY, _S3_URI, AwsRegion, Name, SlackChannel, StrictModel, defaults_of, slack_channel

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
    # gcp-detailed: Google Cloud's detailed usage cost export as files (collect/billing/gcp_detailed.py)
    source: Literal["ce", "cur", "focus", "athena", "gcp-detailed"] = "ce"
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
    tag_keys: TagKeys = Field(default_factory=defaults_of(TagKeys))
    ce: CeSettings = Field(default_factory=defaults_of(CeSettings))
    athena: AthenaSettings = Field(default_factory=defaults_of(AthenaSettings))
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
    spot: SpotPolicy = Field(default_factory=defaults_of(SpotPolicy))
    commitment: CommitmentPolicy = Field(default_factory=defaults_of(CommitmentPolicy))
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
    delivery: ReportDeliverySettings = Field(default_factory=defaults_of(ReportDeliverySettings))


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
