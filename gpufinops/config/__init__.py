"""One typed settings object, loaded once from gpufinops.yaml.

Errors name the file and the dotted key (and the line where YAML knows it).
Secrets are never in the file: the file names the environment variable or the
mounted file that holds them.

Owns: `settings` (`Settings` and `load_settings`: the whole file, its paths made relative to it), `loading` (bounded
reads of config, rule and budget files, YAML, ConfigError with file, line and key; the shipped rules/ and reports/
folders), `values` (StrictModel and the validated value types: regions, labels, channels, addresses, destinations,
URLs, prices, GPU names), `secrets` (SecretRef, the blank-secret rule, bounded secret files), `sections` (the
service's and the places' sections), `capabilities` (billing, recommend, report, store).
Every name callers use is handed on from here: `from gpufinops.config import X` is the one way in. A name is
imported from its module when first asked for (`_HOME`, PEP 562's module `__getattr__`): a caller that needs
only `loading` and `values` (rules.py: ConfigError, StrictModel, the shipped rules folder) loads neither the
sections' models nor Settings (`rules check` without a config file: tests/cli/test_start.py).
May import: model, and break_even (a leaf: capabilities takes the false-stop figure from it, so that a command that
needs no model type, `costs`, loads none); prices.catalog inside `values.known_gpu` only (the catalog's GPU name
rules, a leaf that imports nothing of ours). Within the package, one way down: loading imports none of them; values
imports loading; secrets: loading, values; sections: loading, values, secrets; capabilities: loading, values;
settings: all of those; this file any of them, on demand, and none of them imports this file.
Never imports anything else of gpufinops (every floor above reads the settings; the settings read none of it).
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each name of the package lives: the one list of what `from gpufinops.config import X` hands on.
_HOME = {
    "loading": ("DEFAULT_RULES_DIR", "MAX_TEXT_FILE_BYTES", "PACKAGE_DIR", "REPORTS_DIR", "ConfigError", "compose_yaml",
                "decode_text", "format_validation_error", "line_of", "load_yaml", "not_a_regular_file",
                "not_utf8_error", "parse_yaml", "parse_yaml_tree", "printable", "read_text", "shipped_dir",
                "text_problem", "unsafe_text_locations"),
    "values": ("AWS_REGION", "EMAIL_ADDRESS", "MAX_USD_PER_GPU_HOUR", "MAX_USD_PER_HOST_HOUR", "RULE_AUDIENCES",
               "SLACK_USER_ID", "TRANSPORTS", "AwsRegion", "Name", "PrometheusLabel", "SlackChannel", "StrictModel",
               "aws_region", "backoff_in_order", "defaults_of", "destination", "http_url", "known_gpu",
               "prometheus_label", "slack_channel", "usd_only", "usd_price"),
    "secrets": ("MAX_SECRET_BYTES", "SecretRef", "blank_secrets", "secret_refs"),
    "sections": ("ActSettings", "ApiSettings", "ApiTlsSettings", "AssumeRole", "AwsSettings", "AzureSettings",
                 "EmailSettings", "GcpSettings", "HostsSettings", "KubernetesSettings", "LeaseSettings",
                 "PrometheusSettings", "RentedHost", "ScheduleSettings", "ServiceSettings", "SlackSettings",
                 "SlurmClusterSettings", "SlurmSettings"),
    "capabilities": ("AthenaSettings", "BillingSettings", "CeSettings", "CommitmentPolicy", "InterruptionOverride",
                     "RecommendSettings", "ReportDeliverySettings", "ReportSettings", "SpotPolicy", "StoreSettings",
                     "TagKeys"),
    "settings": ("Settings", "load_settings", "settings_validator", "validated_settings"),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """A name of `__all__`, imported from its module on first use and kept here (the next use is a plain lookup)."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | _MODULE_OF.keys())
