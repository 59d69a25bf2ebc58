"""Render recommendations as an aligned text table, JSON or CSV."""

from __future__ import annotations

import csv
import io
import json
from typing import Sequence

from gpufinops.recommend.engine import Recommendation

COLUMNS = ("instance_id", "team", "instance_type", "region", "action", "current_monthly", "recommended",
           "recommended_monthly", "monthly_savings", "risk", "reason", "prices_as_of")


def _money(v: float | None) -> str:
    return "unknown" if v is None else f"${v:,.0f}"


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
    head = ("INSTANCE", "TEAM", "TYPE", "NOW/MO", "RECOMMENDED", "REC/MO", "SAVES/MO", "RISK", "REASON")
    rows = [(r.instance_id or "(fleet)", r.team or "-", r.instance_type, _money(r.current_monthly), r.recommended,
             _money(r.recommended_monthly), _money(r.monthly_savings), r.risk, r.reason) for r in recs]
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head) - 1)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row[:-1], widths)) + "  " + str(row[-1]) for row in [head, *rows]]
    total = sum(r.monthly_savings for r in recs)
    lines.append(f"\n{len(recs)} recommendation(s), ${total:,.0f}/month potential savings")
    return "\n".join(lines)
