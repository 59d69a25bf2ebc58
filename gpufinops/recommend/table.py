"""Render recommendations as the one text table (headers = the JSON/CSV keys), JSON or CSV."""

from __future__ import annotations

import csv
import io
import json
from typing import Sequence

from gpufinops.model import format_money
from gpufinops.recommend.engine import Recommendation
from gpufinops.words import render_table

COLUMNS = ("instance_id", "team", "instance_type", "region", "action", "current_monthly", "recommended",
           "recommended_monthly", "monthly_savings", "risk", "reason", "prices_as_of")


def render(recs: Sequence[Recommendation], fmt: str = "table") -> str:
    if fmt == "json":
        return json.dumps([r.to_dict() for r in recs], indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in recs:
            w.writerow(r.to_dict())
        return buf.getvalue()
    if fmt != "table":
        raise ValueError(f"format must be table, json or csv, not {fmt!r}")
    rows = [{"instance_id": r.instance_id or "(fleet)", "team": r.team or "-", "instance_type": r.instance_type,
             "current_monthly": format_money(r.current_monthly, digits=0), "recommended": r.recommended,
             "recommended_monthly": format_money(r.recommended_monthly, digits=0),
             "monthly_savings": format_money(r.monthly_savings, digits=0),
             "risk": r.risk, "reason": r.reason} for r in recs]
    lines = [render_table(rows, ("instance_id", "team", "instance_type", "current_monthly", "recommended",
                                 "recommended_monthly", "monthly_savings", "risk", "reason"),
                          right=("current_monthly", "recommended_monthly", "monthly_savings"))]
    total = sum(r.monthly_savings for r in recs)
    lines.append(f"\n{len(recs)} recommendation(s), {format_money(total, digits=0, per='month')} potential savings")
    return "\n".join(lines)
