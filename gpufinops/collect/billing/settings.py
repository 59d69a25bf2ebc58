"""The `billing:` section of gpufinops.yaml, validated here (Settings.billing is a free dict).

    billing:
      source: cur                 # ce | cur | focus | athena
      path: s3://my-cur/data/     # cur/focus: a file, a folder or an s3:// prefix
      currency: USD
      budgets_path: rules/budgets.yaml
      tag_keys: {team: [team, user_team], project: [project, user_project], owner: [owner, user_owner]}
      athena: {database: cur, table: cur2, output_location: s3://athena-results/}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ...config import DEFAULT_RULES_DIR, Settings, validate_section

_FAMILY = re.compile(r"^[a-z][a-z0-9-]*$")
# Tag keys end up inside JSON paths in the Athena SQL: keep them to safe characters.
_TAG_KEY = re.compile(r"^[A-Za-z0-9_]+$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TagKeys(_Strict):
    """Tag keys tried in order; CUR 2.0 prefixes user tags with `user_`."""

    team: tuple[str, ...] = ("team", "Team", "user_team", "user_Team")
    project: tuple[str, ...] = ("project", "Project", "user_project", "user_Project")
    owner: tuple[str, ...] = ("owner", "Owner", "user_owner", "user_Owner", "created-by")

    @field_validator("team", "project", "owner")
    @classmethod
    def _keys(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("needs at least one tag key")
        return v


class CeSettings(_Strict):
    region: str = "us-east-1"  # Cost Explorer has one endpoint, in us-east-1
    metric: Literal["UnblendedCost", "AmortizedCost", "NetUnblendedCost", "BlendedCost"] = "UnblendedCost"
    group_tag: str = "team"  # second GroupBy of the query (the first is INSTANCE_TYPE)
    service: str = "Amazon Elastic Compute Cloud - Compute"
    # One query per CE PURCHASE_TYPE value, so every row knows its pricing model.
    purchase_types: dict[str, Literal["on-demand", "spot", "reserved", "savings-plan"]] = {
        "On Demand Instances": "on-demand",
        "Spot Instances": "spot",
        "Standard Reserved Instances": "reserved",
        "Convertible Reserved Instances": "reserved",
        "Savings Plans": "savings-plan",
    }
    account: str = ""  # written into the account column (CE rows are not per account here)


class AthenaSettings(_Strict):
    database: str = "cur"
    table: str = "cur2"
    workgroup: str = "primary"
    output_location: str | None = None  # s3://bucket/prefix/ for query results
    region: str = "us-east-1"
    poll_interval_s: float = Field(1.0, gt=0, le=60)
    timeout_s: float = Field(600.0, gt=0, le=3600)  # Athena queries over a month of CUR take minutes

    @field_validator("database", "table")
    @classmethod
    def _ident(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_]+", v):
            raise ValueError("letters, digits and _ only (it is quoted into SQL)")
        return v


class BillingSettings(_Strict):
    source: Literal["ce", "cur", "focus", "athena"] = "ce"
    path: str | None = None
    currency: str = "USD"
    gpu_families: tuple[str, ...] | None = None  # None: settings.aws.gpu_families
    # Other providers' GPU instance names (FOCUS): regexes matched on the charge text.
    gpu_patterns: tuple[str, ...] = (
        r"Standard_N[CDV][A-Za-z0-9_]*",  # Azure N-series
        r"\b(?:a2|a3|a4|g2|g4)-(?:highgpu|megagpu|ultragpu|edgegpu|standard)-[0-9a-z]+\b",  # GCP
        r"\bVM\.GPU[0-9A-Za-z.]*\b|\bBM\.GPU[0-9A-Za-z.]*\b",  # OCI
    )
    focus_cost_column: Literal["BilledCost", "EffectiveCost", "ListCost", "ContractedCost"] = "BilledCost"
    # A single line item above this many currency units is refused as absurd.
    max_line_cost: float = Field(100_000.0, gt=0, le=1e12)
    budgets_path: str = str(DEFAULT_RULES_DIR / "budgets.yaml")
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

    @field_validator("tag_keys")
    @classmethod
    def _tag_keys(cls, v: TagKeys) -> TagKeys:
        for key in (*v.team, *v.project, *v.owner):
            if not _TAG_KEY.match(key.replace("-", "_")):
                raise ValueError(f"tag key {key!r}: letters, digits, _ and - only")
        return v


def billing_settings(settings: Settings) -> BillingSettings:
    """Validate settings.billing; errors name the config file, line and key."""
    raw = dict(settings.billing)
    bs = validate_section(settings, "billing", BillingSettings)
    if bs.gpu_families is None:
        bs = bs.model_copy(update={"gpu_families": tuple(settings.aws.gpu_families)})
    if settings.source_path:
        # Relative paths are relative to the config file, like rules_paths.
        base = Path(settings.source_path).resolve().parent
        update = {}
        for name in ("path", "budgets_path", "price_catalog"):
            value = getattr(bs, name)
            if value and "://" not in value and not Path(value).is_absolute() and name in raw:
                update[name] = str((base / value).resolve())
        if update:
            bs = bs.model_copy(update=update)
    return bs
