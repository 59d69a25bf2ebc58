"""Get the cost table of a period from the configured source (the one I/O edge of billing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

import boto3
import pandas as pd

from ...config import Settings
from .schema import BillingDataError
from .settings import BillingSettings, billing_settings


@dataclass
class LoadedCosts:
    table: pd.DataFrame
    source: str
    # Billing is complete up to here; after it the forecast uses the running rate.
    data_through: datetime
    warnings: list[str] = field(default_factory=list)


def aws_client(settings: Settings, service: str, region: str):
    session = boto3.session.Session(profile_name=settings.aws.profile) if settings.aws.profile else boto3.session.Session()
    return session.client(service, region_name=region, endpoint_url=settings.aws.endpoint_url)


def _complete_through(table: pd.DataFrame, start: datetime, end: datetime, now: datetime) -> datetime:
    """File sources: the end of the last day that has any cost, never past now or the period end."""
    if table.empty:
        return start
    last = table["date"].max().to_pydatetime().replace(tzinfo=timezone.utc)
    return min(end, now, last + pd.Timedelta(days=1))


def load_cost_table(settings: Settings, start: datetime, end: datetime, now: datetime,
                    source: str | None = None, path: str | None = None,
                    bs: BillingSettings | None = None) -> LoadedCosts:
    bs = bs or billing_settings(settings)
    source = source or bs.source
    path = path or bs.path
    families = tuple(bs.gpu_families or settings.aws.gpu_families)
    if source == "ce":
        from .ce import fetch_ce

        r = fetch_ce(aws_client(settings, "ce", bs.ce.region), start, end, now, families, bs.ce)
        return LoadedCosts(r.table, "ce", r.data_through, r.warnings)
    if source == "athena":
        from .athena import fetch_athena

        client = aws_client(settings, "athena", bs.athena.region)
        r = fetch_athena(client, start, end, families, bs.athena, bs.tag_keys, bs.max_line_cost)
        return LoadedCosts(r.table, "athena", _complete_through(r.table, start, end, now))
    if not path:
        raise BillingDataError(f"billing source {source!r} needs a path (billing.path or --path)")
    if source == "cur":
        from .cur import read_cur

        s3 = aws_client(settings, "s3", settings.aws.regions[0]) if path.startswith("s3://") else None
        r = read_cur(path, start, end, families, bs.tag_keys, bs.max_line_cost, s3_client=s3)
        return LoadedCosts(r.table, "cur", _complete_through(r.table, start, end, now), r.warnings)
    if source == "focus":
        from .focus import read_focus

        r = read_focus(path, start, end, bs)
        return LoadedCosts(r.table, "focus", _complete_through(r.table, start, end, now), r.warnings)
    raise BillingDataError(f"unknown billing source {source!r}; expected ce, cur, focus or athena")
