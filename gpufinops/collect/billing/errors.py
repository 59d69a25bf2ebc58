"""What the billing readers share without pandas: the error type and the month bounds (so a plain
`costs --by` total can run on DuckDB without importing pandas, ~100 MiB resident)."""

from __future__ import annotations

from datetime import datetime, timezone


class BillingDataError(ValueError):
    """Bad billing input; the message names the file (or API) and the column."""


def month_bounds(month: str) -> tuple[datetime, datetime]:
    """'2024-09' -> (2024-09-01T00:00Z, 2024-10-01T00:00Z)."""
    try:
        start = datetime.strptime(month, "%Y-%m").replace(tzinfo=timezone.utc)
    except ValueError:
        raise BillingDataError(f"month {month!r}: expected YYYY-MM") from None
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def mixed_currencies(values, where: str, column: str = "currency") -> str | None:
    """The one currency among `values` ('' and None ignored); more than one is an error (no FX here)."""
    found = sorted({v for v in values if v is not None and v != ""})
    if len(found) > 1:
        raise BillingDataError(f"{where}: column '{column}' mixes currencies {found}; convert or split the file first")
    return found[0] if found else None
