"""The `report:` section of gpufinops.yaml: the monthly audit's rules of thumb, each a knob with a default.

    report:
      underutilized_below_pct: 60   # an instance averaging under this activity is flagged
      false_stop_s: 1800            # a stop followed by a restart within this long was a false stop
      top_n: 10                     # rows in the "top" tables and charts
      price_max_age_days: 90        # catalog prices older than this are flagged as stale
      evaluate_every_s: null        # null: the spacing seen in the stored evaluations

Its model lives in gpufinops.config, so the section is checked when the file is loaded, with the rest.
"""

from __future__ import annotations

from ..config import ReportSettings, Settings

__all__ = ["ReportSettings", "report_settings"]


def report_settings(settings: Settings | None) -> ReportSettings:
    """The report section, validated by load_settings; defaults when there are no settings at hand."""
    if settings is None or not hasattr(settings, "report"):
        return ReportSettings()
    return settings.report
