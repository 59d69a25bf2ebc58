"""The `recommend:` section of gpufinops.yaml: every rule of thumb as a knob with a default."""

from __future__ import annotations

import fnmatch

from pydantic import BaseModel, ConfigDict, Field

from gpufinops.config import Settings, validate_section


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class InterruptionOverride(_Strict):
    instance_type: str = "*"  # glob, e.g. "p5.*"
    region: str = "*"
    interruption_rate_per_hour: float = Field(ge=0, le=100)


class SpotPolicy(_Strict):
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


class CommitmentPolicy(_Strict):
    window_days: int = Field(30, ge=1, le=400)
    baseline_percentile: float = Field(10.0, ge=0, le=100)
    # Used when the catalog has no reserved/committed price for the type
    # (1-year no-upfront savings plans on GPU families are roughly 30-40% off).
    default_discount: float = Field(0.30, ge=0, lt=1)
    term: str = "1-year savings plan / reserved"


class RecommendPolicy(_Strict):
    window_days: int = Field(14, ge=1, le=400)
    min_coverage: float = Field(0.8, gt=0, le=1)  # fraction of expected samples per GPU
    scrape_interval_s: int | None = Field(None, ge=1, le=3600)  # default: prometheus.scrape_interval_s
    memory_headroom: float = Field(0.20, ge=0, le=100)  # candidate GPU memory >= peak x (1 + this)
    compute_headroom: float = Field(0.10, ge=0, le=100)  # candidate TFLOPS >= demand x (1 + this)
    usable_memory_fraction: float = Field(0.93, gt=0, le=1)  # nominal GB a process really gets
    worked_activity_pct: float = Field(5.0, ge=0, le=100)  # a GPU "did work" if its max activity reached this
    hours_per_month: float = Field(730.0, gt=0, le=745)  # 745: a 31-day month plus the DST hour
    providers: tuple[str, ...] = ()  # candidates from these providers; empty = the instance's own
    same_region: bool = True
    workload_tag: str = "workload"
    interruptible_values: tuple[str, ...] = ("batch", "training", "train", "etl")
    non_interruptible_values: tuple[str, ...] = ("inference", "interactive", "serving", "notebook")
    spot: SpotPolicy = SpotPolicy()
    commitment: CommitmentPolicy = CommitmentPolicy()
    catalog_dir: str | None = None  # default: the bundled catalog
    price_cache_path: str = "gpufinops-aws-prices.json"
    price_max_age_days: int = Field(90, ge=1, le=3660)  # older prices are flagged in the reason
    digest_channel: str | None = None  # default: slack.default_channel
    digest_top: int = Field(10, ge=1, le=1000)


def policy_from_settings(settings: Settings) -> RecommendPolicy:
    """Validate settings.recommend; errors name file, line and `recommend.<key>`."""
    return validate_section(settings, "recommend", RecommendPolicy)
