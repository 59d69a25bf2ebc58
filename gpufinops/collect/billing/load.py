"""Get the cost table of a period from the configured source (the one I/O edge of billing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlsplit

import pandas as pd

from ...config import Settings
from ..aws_config import read_client, session
from .schema import BillingDataError
from .settings import BillingSettings, billing_settings
from .totals import TOTAL_COLUMNS, empty_totals, table_totals


@dataclass
class LoadedCosts:
    table: pd.DataFrame
    source: str
    # Billing is complete up to here; after it the forecast uses the running rate.
    data_through: datetime
    warnings: list[str] = field(default_factory=list)


@dataclass
class LoadedTotals:
    table: pd.DataFrame  # totals.TOTAL_COLUMNS: key, currency, cost, usage_hours
    source: str
    warnings: list[str] = field(default_factory=list)


def s3_filesystem(settings: Settings, path: str):
    """pyarrow's S3 filesystem with the credentials, endpoint (moto in tests) and region boto3 uses, so CUR and
    FOCUS objects are read by ranged GETs or streamed as the reader needs them, never downloaded whole into
    memory. Standard retries as every read client; connect 10 s, request 60 s."""
    from pyarrow import fs

    from ..aws_config import MAX_ATTEMPTS

    credentials = session(settings).get_credentials()
    # The retries of every AWS read (aws_config); longer timeouts than the API clients', for object reads.
    options: dict = {"region": settings.aws.regions[0], "connect_timeout": 10, "request_timeout": 60,
                     "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=MAX_ATTEMPTS + 1)}
    if credentials is not None:
        frozen = credentials.get_frozen_credentials()
        options.update(access_key=frozen.access_key, secret_key=frozen.secret_key, session_token=frozen.token)
    if settings.aws.endpoint_url:
        url = urlsplit(settings.aws.endpoint_url)
        options.update(endpoint_override=url.netloc + url.path.rstrip("/"), scheme=url.scheme or "https")
    else:
        # boto3 follows a bucket's region redirect by itself; the C++ SDK needs the region up front.
        try:
            options["region"] = fs.resolve_s3_region(path[len("s3://"):].split("/", 1)[0])
        except (OSError, ValueError):
            pass
    try:
        return fs.S3FileSystem(**options)
    except (OSError, ValueError) as exc:
        raise BillingDataError(f"{path}: cannot set up S3 access: {exc}") from None


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

        r = fetch_ce(read_client(settings, "ce", bs.ce.region), start, end, now, families, bs.ce)
        return LoadedCosts(r.table, "ce", r.data_through, r.warnings)
    if source == "athena":
        from .athena import fetch_athena

        client = read_client(settings, "athena", bs.athena.region)
        r = fetch_athena(client, start, end, families, bs.athena, bs.tag_keys, bs.max_line_cost)
        return LoadedCosts(r.table, "athena", _complete_through(r.table, start, end, now))
    if not path:
        raise BillingDataError(f"billing source {source!r} needs a path (billing.path or --path)")
    if source == "cur":
        from .cur import read_cur

        s3 = s3_filesystem(settings, path) if path.startswith("s3://") else None
        r = read_cur(path, start, end, families, bs.tag_keys, bs.max_line_cost, filesystem=s3)
        return LoadedCosts(r.table, "cur", _complete_through(r.table, start, end, now), r.warnings)
    if source == "focus":
        from .focus import read_focus

        s3 = s3_filesystem(settings, path) if path.startswith("s3://") else None
        r = read_focus(path, start, end, bs, filesystem=s3)
        return LoadedCosts(r.table, "focus", _complete_through(r.table, start, end, now), r.warnings)
    if source == "gcp-detailed":
        from .gcp_detailed import SOURCE, detailed_files, detailed_lines
        from .s3fetch import s3_client_for

        d = detailed_lines(detailed_files(path, s3_client_for(settings, path)), path, start, end, bs)
        table = detailed_table(d.lines, SOURCE)
        return LoadedCosts(table, SOURCE, _complete_through(table, start, end, now), d.warnings)
    raise BillingDataError(f"unknown billing source {source!r}; expected ce, cur, focus, athena or gcp-detailed")


def detailed_table(lines: dict, source: str) -> pd.DataFrame:
    """The cost table of gcp_detailed.detailed_lines(): one row per day, VM, type, pricing model and labels."""
    from .gcp_detailed import LINE_FIELDS
    from .schema import canonical_tags, conform, empty_table

    if not lines:
        return empty_table()
    rows = [{**dict(zip(LINE_FIELDS, key)), "cost": cost, "usage_hours": hours} for key, (cost, hours) in lines.items()]
    df = pd.DataFrame(rows)
    df["tags"] = [canonical_tags(dict(pairs)) for pairs in df["tags"]]
    df = df.assign(provider="gcp", source=source)
    return conform(df.sort_values(["date", "resource_id", "pricing_model", "tags"], kind="stable"))


def load_cost_totals(settings: Settings, start: datetime, end: datetime, now: datetime, by: str,
                     source: str | None = None, path: str | None = None,
                     bs: BillingSettings | None = None) -> LoadedTotals:
    """Cost and usage hours per `by` key (totals.GRAINS) for the period. CUR and FOCUS files, local or on S3,
    are read in one pass at that grain on DuckDB (duck.py; no per-day, per-tag table); the other sources sum
    their cost table."""
    bs = bs or billing_settings(settings)
    source = source or bs.source
    path = path or bs.path
    if source == "cur" and path:
        from .cur import cur_totals
        from .s3fetch import s3_client_for

        r = cur_totals(path, start, end, tuple(bs.gpu_families or settings.aws.gpu_families), by, bs.tag_keys,
                       bs.max_line_cost, s3=s3_client_for(settings, path))
        return LoadedTotals(r.table, "cur", r.warnings)
    if source == "focus" and path:  # DuckDB (duck.py), S3 objects through s3fetch's copies
        from .duck import focus_files, focus_total_rows
        from .s3fetch import s3_client_for

        t = focus_total_rows(focus_files(path, s3_client_for(settings, path)), path, start, end, bs, by)
        table = pd.DataFrame(t.rows, columns=list(TOTAL_COLUMNS)) if t.rows else empty_totals()
        return LoadedTotals(table, "focus", t.warnings)
    if source == "gcp-detailed" and path:  # DuckDB (gcp_detailed.py), summed at the grain
        from .gcp_detailed import LABEL_GRAINS, SOURCE, detailed_files, detailed_lines, totals
        from .s3fetch import s3_client_for

        d = detailed_lines(detailed_files(path, s3_client_for(settings, path)), path, start, end, bs,
                           labels=by in LABEL_GRAINS)
        rows = totals(d, by)
        return LoadedTotals(pd.DataFrame(rows, columns=list(TOTAL_COLUMNS)) if rows else empty_totals(), SOURCE,
                            d.warnings)
    loaded = load_cost_table(settings, start, end, now, source=source, path=path, bs=bs)
    return LoadedTotals(table_totals(loaded.table, by), loaded.source, loaded.warnings)
