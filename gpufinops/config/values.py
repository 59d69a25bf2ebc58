"""The validated value types of the settings, each refusing nonsense with a message that says what was expected:
AWS regions, Prometheus labels, Slack channels and user ids, email addresses, rule destinations, http(s) URLs,
prices in USD, GPU model names; and `StrictModel`, the base of every settings model (unknown keys refused).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Callable
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo

from .loading import printable

class StrictModel(BaseModel):
    """The base of every settings and budget-file model: an unknown key is an error (a typo never passes as a
    default), values are frozen once loaded."""

    # inf and nan are never a setting: `timeout_s: .inf` would wait forever, nan compares false everywhere.
    # defer_build: a model's validator is built when it first validates, not at import, so a command pays for
    # the models it uses, once (Settings' validator holds its sections'), and `--help` or a command that never
    # loads settings pays for none. A default is a Field(default_factory=...), never an instance made at
    # import (making one would build its validator there).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


def defaults_of(model: type[StrictModel]) -> Callable[[], StrictModel]:
    """The default_factory of a section (`Field(default_factory=defaults_of(AwsSettings))`): the section with its
    class's defaults, set without running its validator. Pydantic never validates a default (validate_default is
    off) and each section's defaults pass its own checks (tests/test_config_sections.py: every default equals the
    section validated from nothing), so the value is the same as `AwsSettings()`; but a file that leaves the section
    out (or no file) builds no validator for it (config.validated_settings)."""
    return lambda: model.model_construct()


# An AWS region name: us-east-1, us-gov-west-1, ap-southeast-2, eusc-de-east-1. Anything else (a typo, an RTL
# override pasted from a chat) would be a region no API call can reach, every instance of it silently never read.
AWS_REGION = re.compile(r"[a-z]{2,4}(-[a-z]+)+-[0-9]{1,2}")
# A DNS name (RFC 1123 labels): the right-hand side of a Message-ID, a mail server's name.
_DOMAIN = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def aws_region(v: str) -> str:
    if not AWS_REGION.fullmatch(v):
        raise ValueError(f"{printable(v)!r} is not an AWS region name (like us-east-1 or eu-central-1)")
    return v


AwsRegion = Annotated[str, AfterValidator(aws_region)]
# A name that must say something (a label, a tag key, a path, a workgroup): empty is never "off" for these; the
# keys where empty means off say so where they are declared.
Name = Annotated[str, Field(min_length=1)]


def readable_file(v: str) -> str:
    """A path the service reads at start: it must name a file now (blank, a folder or nothing there is refused at
    load, not when the file is first needed)."""
    if not v.strip() or "\x00" in v or not Path(v).is_file():
        raise ValueError(f"{printable(v)!r} is not a file the service can read")
    return v


ReadableFile = Annotated[str, AfterValidator(readable_file)]
_PROMETHEUS_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# A channel as chat.postMessage takes it: #name (lower-case, as Slack makes every name) or an id (C…, G…, D…).
_SLACK_CHANNEL = re.compile(r"#?[a-z0-9][a-z0-9._-]{0,79}|[CDGUW][A-Z0-9]{1,20}")
_DAY = r"(?:mon|tue|wed|thu|fri|sat|sun|[0-6])"
_CRON_DAYS = re.compile(rf"{_DAY}(?:-{_DAY})?(?:,{_DAY}(?:-{_DAY})?)*")
_S3_URI = re.compile(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?")
_FAMILY = re.compile(r"^[a-z][a-z0-9-]*$")  # an instance family: g5, p6-b200


def prometheus_label(v: str) -> str:
    if not _PROMETHEUS_LABEL.fullmatch(v):
        raise ValueError(f"{printable(v)!r} is not a Prometheus label name (letters, digits and _, not first a digit)")
    return v


def slack_channel(v: str) -> str:
    if not _SLACK_CHANNEL.fullmatch(v):
        raise ValueError(f"{printable(v)!r} is not a Slack channel (#name in lower case, or a channel id like C0123ABCD)")
    return v


PrometheusLabel = Annotated[str, AfterValidator(prometheus_label)]
SlackChannel = Annotated[str, AfterValidator(slack_channel)]

# An email address a notice can be sent to (an owner tag that is one, a rule's `email:` destination).
EMAIL_ADDRESS = re.compile(r"^[^@\s<>\"',;]+@[^@\s<>\"',;]+\.[^@\s<>\"',;]+$")
# The audiences a rule's `notify_to` may name (notify/routing.py turns each into destinations): the subject's owner
# (a mention, a DM, an email), its team's channel (else the default), the default channel.
RULE_AUDIENCES = ("owner", "team", "default")
# The transports a destination may name, each with what it is sent to: `slack:#ml-gpus`, `email:finance@example.com`.
TRANSPORTS = ("slack", "email")


def destination(v: str) -> str:
    """A rule's destination, as written: an audience (RULE_AUDIENCES) or `transport:target` (a Slack channel, an
    email address); anything else is refused (a typo would silently send a warning nowhere)."""
    v = v.strip()
    if v in RULE_AUDIENCES:
        return v
    transport, sep, target = v.partition(":")
    if not sep or transport not in TRANSPORTS:
        raise ValueError(f"{printable(v)!r} is not a destination: write one of {', '.join(RULE_AUDIENCES)}, "
                         f"'slack:#channel' or 'email:name@example.com'")
    if transport == "slack":
        return f"slack:{slack_channel(target.strip())}"
    if not EMAIL_ADDRESS.fullmatch(target.strip()):
        raise ValueError(f"{printable(target)!r} is not an email address (email:name@example.com)")
    return f"email:{target.strip()}"


def http_url(v: str) -> str:
    """An http(s) URL with a host: anything else is a peer no request can reach."""
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 - raises ValueError on a port out of range or not a number
    except ValueError as exc:
        raise ValueError(f"{printable(v)!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in v):
        raise ValueError(f"{printable(v)!r} is not an http:// or https:// URL with a host")
    return v


def backoff_in_order(v: int, info: ValidationInfo) -> int:
    """retry_max_backoff_s (`v`) is where the doubling of retry_backoff_s stops: below it, it would mean nothing."""
    first = info.data.get("retry_backoff_s")  # absent when it failed itself (reported under its own key)
    if first is not None and v < first:
        raise ValueError(f"{v} is below retry_backoff_s ({first}): the longest wait between two tries cannot be "
                         f"shorter than the first")
    return v


# A Slack user id ("U012AB3CD", "W0123ABCDE"): mentioned as <@id> in messages, a DM channel for the owner.
SLACK_USER_ID = re.compile(r"[UW][A-Z0-9]{8,20}")



# Above these a price is a typo (a 72-GPU rack rents for a few hundred $/h).
MAX_USD_PER_GPU_HOUR = 1_000.0
MAX_USD_PER_HOST_HOUR = 10_000.0



def usd_price(v: Any, most: float) -> float:
    """A price in USD/h: a positive number (not a string, not true/false) no higher than `most`."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a price in USD per hour (a number such as 2.49), got {v!r}")
    if not 0 < v <= most or v != v:
        raise ValueError(f"a price must be above 0 and at most {most:,.0f} USD/h, got {v!r}")
    return float(v)


def usd_only(v: Any) -> str:
    if v != "USD":
        raise ValueError(f"only USD ({v!r} given): bills, the catalog and every message are in USD and no conversion "
                         f"is done; convert the price to USD")
    return v


def known_gpu(name: str) -> str:
    """The catalog's key for a GPU model name ("NVIDIA H100 80GB HBM3" -> "H100"), or a ValueError naming it."""
    from ..prices.catalog import UnknownGpuError, canonical_gpu  # the catalog's name rules; it imports nothing of ours

    try:
        return canonical_gpu(name)
    except UnknownGpuError:
        raise ValueError(f"unknown GPU model {name!r}: use a name such as H100, H200, A100-80GB, L40S, RTX-4090 "
                         f"(gpufinops/data/catalog/gpus.csv)") from None
