"""The `recommend:` section of gpufinops.yaml: every rule of thumb as a knob with a default.

Its models live in gpufinops.config, so the section is checked when the file is loaded, with the rest.
The right-sizing and purchase code calls the section its policy.
"""

from __future__ import annotations

from gpufinops.config import (
    CommitmentPolicy,
    InterruptionOverride,
    RecommendSettings,
    Settings,
    SpotPolicy,
)

RecommendPolicy = RecommendSettings

__all__ = ["CommitmentPolicy", "InterruptionOverride", "RecommendPolicy", "RecommendSettings", "SpotPolicy",
           "policy_from_settings"]


def policy_from_settings(settings: Settings) -> RecommendPolicy:
    """The recommend section, validated by load_settings (errors name file, line and `recommend.<key>`)."""
    return settings.recommend
