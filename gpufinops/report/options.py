"""The `report:` section of gpufinops.yaml: the monthly audit's rules of thumb, each a knob with a default.

    report:
      underutilized_below_pct: 60   # an instance averaging under this activity is flagged
      false_stop_s: 1800            # a stop followed by a restart within this long was a false stop
      top_n: 10                     # rows in the "top" tables and charts
      price_max_age_days: 90        # catalog prices older than this are flagged as stale
      evaluate_every_s: null        # null: the spacing seen in the stored evaluations
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..config import Settings, validate_section


class ReportSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # The field's monthly-audit rule of thumb: under 60% average utilization is paying for unused capacity.
    underutilized_below_pct: float = Field(60.0, ge=0, le=100)
    false_stop_s: int = Field(1800, ge=0, le=7 * 86400)
    top_n: int = Field(10, ge=1, le=1000)
    price_max_age_days: int = Field(90, ge=1, le=3660)
    # Seconds between evaluations. None: measured from the stored decisions (the median spacing), so a
    # report on a database written by a service with another schedule still counts time right.
    evaluate_every_s: int | None = Field(None, ge=1, le=86400)


def report_settings(settings: Settings | None) -> ReportSettings:
    """Validate settings.report when the core Settings has that section; defaults otherwise."""
    if settings is None or not hasattr(settings, "report"):
        return ReportSettings()
    return validate_section(settings, "report", ReportSettings)
