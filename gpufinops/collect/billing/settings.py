"""The `billing:` section of gpufinops.yaml. Its models live in gpufinops.config (checked when the file is
loaded, with the rest); this module hands the collectors the section with what depends on other sections.

    billing:
      source: cur                 # ce | cur | focus | athena | gcp-detailed
      path: s3://my-cur/data/     # cur/focus/gcp-detailed: a file, a folder or an s3:// prefix
      currency: USD
      budgets_path: rules/budgets.yaml
      tag_keys: {team: [team, user_team], project: [project, user_project], owner: [owner, user_owner]}
      athena: {database: cur, table: cur2, output_location: s3://athena-results/}
"""

from __future__ import annotations

from ...config import AthenaSettings, BillingSettings, CeSettings, Settings, TagKeys, defaults_of

__all__ = ["AthenaSettings", "BillingSettings", "CeSettings", "TagKeys", "billing_settings"]


def billing_settings(settings: Settings) -> BillingSettings:
    """The billing section (defaults when the file has none: Cost Explorer), its GPU families defaulting to
    aws.gpu_families. Validated, and its relative paths made relative to the config file, by load_settings."""
    bs = settings.billing or defaults_of(BillingSettings)()  # the defaults, without building a validator for them
    if bs.gpu_families is None:
        bs = bs.model_copy(update={"gpu_families": tuple(settings.aws.gpu_families)})
    return bs
