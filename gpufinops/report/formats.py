"""How the report writes a value for people and for files: money, shares, hours, and plain JSON/CSV values. One
place, so the page, the CSVs, the finance email and the Slack line write the same figure the same way."""

from __future__ import annotations

import math
from datetime import date, datetime

import numpy as np
import pandas as pd

from ..model import format_money


def plain_value(v):
    """A JSON/CSV-ready Python value: NaN/NaT -> None, timestamps -> ISO 8601, numpy -> Python."""
    if v is None or v is pd.NaT:
        return None
    if isinstance(v, (pd.Timestamp, datetime)):
        return v.isoformat()
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return None if math.isnan(v) else float(v)
    if isinstance(v, dict):
        return {str(k): plain_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain_value(x) for x in v]
    return v


def num(v, digits: int = 1) -> str:
    v = plain_value(v)
    return "–" if v is None else f"{v:,.{digits}f}"


def money(v, currency: str = "USD", digits: int = 2) -> str:
    """A report value (numpy, NaN, NaT: plain_value) in the one money spelling (model.format_money), '–' when
    unknown: also the templates' `money` filter."""
    return format_money(plain_value(v), digits=digits, currency=currency, unknown="–")


def share(v) -> str:
    """A 0..1 share as a percentage."""
    v = plain_value(v)
    return "–" if v is None else f"{100 * v:.1f}%"


def pct(v) -> str:
    """A value already in percent."""
    v = plain_value(v)
    return "–" if v is None else f"{v:.0f}%"


__all__ = ["money", "num", "pct", "plain_value", "share"]
