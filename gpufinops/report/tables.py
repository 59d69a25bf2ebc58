"""The tables of the monthly audit, one builder each (per instance, per team, under-used, unknown time,
recommendations, per day, actions, snoozes, managed instances), and the columns of every table the report writes
(STOP_COLUMNS too: report.audit's stop_audit builds that one). Pure: frames in, frames out, no I/O."""

from __future__ import annotations

import pandas as pd

from ..model import TAG_SNOOZE, UNTAGGED, ReasonCode
from ..words import REPORT_HINTS
from ..cost.costs import VERDICTS, idle_cost_report, summarize
from .inputs import AuditInputs


MISSING_DATA_CODES = tuple(c.value for c in ReasonCode if c.is_missing_data)

HINTS = REPORT_HINTS  # the one table of reason-code words: gpufinops/words.py

TEAM_COLUMNS = ["team", "instances", "hours", "gpu_hours", "cost", "billed_cost", "idle_hours", "idle_cost",
                "idle_share", "underutilized_cost", "unknown_hours", "active_pct", "underutilized_pct", "idle_pct",
                "unknown_pct", "stops", "dry_run_stops", "unpriced_hours"]
INSTANCE_COLUMNS = ["instance_id", "name", "team", "owner", "account", "region", "gpu_model", "instance_type", "gpus", "hourly_rate", "hours", "gpu_hours", "cost",
                    "billed_cost", "idle_hours", "idle_cost", "idle_share", "underutilized_cost", "unknown_hours",
                    "active_pct", "underutilized_pct", "idle_pct", "unknown_pct", "mean_activity_pct",
                    "max_activity_pct", "max_memory_gib", "stops", "dry_run_stops", "unpriced_hours", "price_source",
                    "advice", "advice_reason"]
UNDERUTILIZED_COLUMNS = ["instance_id", "name", "team", "instance_type", "mean_activity_pct", "max_activity_pct",
                         "max_memory_gib", "measured_hours", "cost", "idle_cost", "main_code", "hint"]
STOP_COLUMNS = ["at", "instance_id", "team", "instance_type", "kind", "rule", "dry_run", "status", "reason", "error",
                "back_at", "back_after_min", "false_stop", "saved_hours", "saved_gpu_hours", "saved_cost", "savings",
                "restarted", "restart_cost", "false_stop_cost", "net_gpu_hours", "net_cost"]
UNKNOWN_COLUMNS = ["instance_id", "team", "instance_type", "hours", "unknown_hours", "unknown_share",
                   "missing_data_hours", *[f"{c}_hours" for c in MISSING_DATA_CODES], "other_unknown_hours",
                   "unknown_cost", "missing_data_cost"]
RECOMMENDATION_COLUMNS = ["instance_id", "team", "instance_type", "region", "action", "current_monthly",
                          "recommended", "recommended_monthly", "monthly_savings", "risk", "reason", "prices_as_of",
                          "created_at"]
DAILY_COLUMNS = ["date", *[f"{v.lower()}_cost" for v in VERDICTS], "evaluated_cost", "billed_cost", "hours",
                 "idle_hours"]
ACTION_COLUMNS = ["kind", "dry_run", "status", "count"]
SNOOZE_COLUMNS = ["team", "instance_id", "snoozes", "capped", "unreadable"]
MANAGED_COLUMNS = ["team", "instance_id", "idle_episodes", "managed_by", "instead"]
# The words act.stop_blocker puts in the reason of an instance that is judged but never stopped.
_MANAGED = " managed by "
_MANAGED_END = ": never stopped by gpufinops"
_INSTEAD = "; instead: "


def _verdict_hours(iv: pd.DataFrame, key: str) -> pd.DataFrame:
    p = iv.pivot_table(index=key, columns="verdict", values="hours", aggfunc="sum", fill_value=0.0)
    out = pd.DataFrame(index=p.index)
    for v in VERDICTS:
        out[f"{v.lower()}_hours"] = p[v] if v in p.columns else 0.0
    total = out.sum(axis=1)
    for v in VERDICTS:
        out[f"{v.lower()}_pct"] = 100.0 * out[f"{v.lower()}_hours"] / total.where(total > 0)
    return out


def _weighted_mean(values: pd.Series, weights: pd.Series) -> float:
    ok = values.notna() & weights.notna()
    w = weights[ok].sum()
    return float((values[ok] * weights[ok]).sum() / w) if w > 0 else float("nan")


def instance_table(iv: pd.DataFrame, stops: pd.DataFrame, cost_table: pd.DataFrame) -> pd.DataFrame:
    if iv.empty:
        return pd.DataFrame({c: [] for c in INSTANCE_COLUMNS})
    money = idle_cost_report(iv, by="instance").set_index("instance")
    vh = _verdict_hours(iv, "instance_id")
    g = iv.groupby("instance_id", sort=True)
    rows = []
    for inst, grp in g:
        priced = grp["rate"].dropna()
        rows.append({
            "instance_id": inst, "team": grp["team"].iloc[-1], "instance_type": grp["instance_type"].iloc[-1],
            "gpus": grp["gpus"].iloc[-1], "hourly_rate": float(priced.iloc[-1]) if len(priced) else float("nan"),
            "hours": grp["hours"].sum(), "gpu_hours": grp["gpu_hours"].sum(min_count=1),
            "mean_activity_pct": _weighted_mean(grp["activity_mean"].astype(float), grp["hours"]),
            "max_activity_pct": grp["activity_max"].astype(float).max(),
            "max_memory_gib": grp["memory_max_mib"].astype(float).max() / 1024.0,
            "idle_gpu_hours": grp.loc[grp["verdict"] == "IDLE", "gpu_hours"].sum(min_count=1),
        })
    out = pd.DataFrame(rows).set_index("instance_id")
    out["cost"] = money["total_cost"]
    out["idle_cost"] = money["idle_cost"]
    out["idle_share"] = money["idle_share"]
    out["underutilized_cost"] = money["underutilized_cost"]
    out["unpriced_hours"] = money["unpriced_hours"]
    out["idle_hours"] = vh["idle_hours"]
    out["unknown_hours"] = vh["unknown_hours"]
    for v in VERDICTS:
        out[f"{v.lower()}_pct"] = vh[f"{v.lower()}_pct"]
    real = stops[(~stops["dry_run"]) & (stops["status"] == "done")] if len(stops) else stops
    dry = stops[stops["dry_run"] & (stops["status"] == "done")] if len(stops) else stops
    out["stops"] = real.groupby("instance_id").size().reindex(out.index).fillna(0).astype(int) if len(real) else 0
    out["dry_run_stops"] = dry.groupby("instance_id").size().reindex(out.index).fillna(0).astype(int) if len(dry) else 0
    billed = (summarize(cost_table, "instance").groupby("instance")["cost"].sum() if len(cost_table)
              else pd.Series(dtype=float))
    out["billed_cost"] = billed.reindex(out.index)
    out = out.reset_index()
    return out.sort_values(["idle_cost", "cost", "instance_id"], ascending=[False, False, True],
                           kind="stable").reset_index(drop=True).reindex(columns=INSTANCE_COLUMNS)


def team_table(iv: pd.DataFrame, instances: pd.DataFrame, cost_table: pd.DataFrame) -> pd.DataFrame:
    """One row per team; instances without a team tag are the '(untagged)' row. Billing-only teams appear too."""
    billed = summarize(cost_table, "team").groupby("team")["cost"].sum() if len(cost_table) else pd.Series(dtype=float)
    if iv.empty and billed.empty:
        return pd.DataFrame({c: [] for c in TEAM_COLUMNS})
    if iv.empty:
        out = pd.DataFrame({"team": billed.index, "billed_cost": billed.values})
        return out.reindex(columns=TEAM_COLUMNS).assign(instances=0, stops=0, dry_run_stops=0)
    money = idle_cost_report(iv, by="team").set_index("team")
    vh = _verdict_hours(iv, "team")
    inst = instances.groupby("team")
    out = pd.DataFrame(index=sorted(set(money.index) | set(billed.index)))
    out["instances"] = inst.size().reindex(out.index).fillna(0).astype(int)
    out["hours"] = iv.groupby("team")["hours"].sum().reindex(out.index)
    out["gpu_hours"] = iv.groupby("team")["gpu_hours"].sum(min_count=1).reindex(out.index)
    out["cost"] = money["total_cost"].reindex(out.index)
    out["billed_cost"] = billed.reindex(out.index)
    out["idle_hours"] = vh["idle_hours"].reindex(out.index)
    out["idle_cost"] = money["idle_cost"].reindex(out.index)
    out["idle_share"] = money["idle_share"].reindex(out.index)
    out["underutilized_cost"] = money["underutilized_cost"].reindex(out.index)
    out["unknown_hours"] = vh["unknown_hours"].reindex(out.index)
    for v in VERDICTS:
        out[f"{v.lower()}_pct"] = vh[f"{v.lower()}_pct"].reindex(out.index)
    out["stops"] = inst["stops"].sum().reindex(out.index).fillna(0).astype(int)
    out["dry_run_stops"] = inst["dry_run_stops"].sum().reindex(out.index).fillna(0).astype(int)
    out["unpriced_hours"] = money["unpriced_hours"].reindex(out.index)
    out = out.rename_axis("team").reset_index()
    return out.sort_values(["idle_cost", "cost", "team"], ascending=[False, False, True], kind="stable",
                           na_position="last").reset_index(drop=True)[TEAM_COLUMNS]


def underutilized_table(iv: pd.DataFrame, instances: pd.DataFrame, below_pct: float) -> pd.DataFrame:
    """Instances whose time-weighted mean activity over the month is under `below_pct`."""
    if instances.empty:
        return pd.DataFrame({c: [] for c in UNDERUTILIZED_COLUMNS})
    low = instances[instances["mean_activity_pct"] < below_pct]
    measured = iv[iv["activity_mean"].notna()]
    main = (measured[measured["verdict"] != "UNKNOWN"].groupby(["instance_id", "code"])["hours"].sum()
            .reset_index().sort_values(["instance_id", "hours"], ascending=[True, False], kind="stable")
            .drop_duplicates("instance_id").set_index("instance_id")["code"])
    out = low.assign(
        measured_hours=measured.groupby("instance_id")["hours"].sum().reindex(low["instance_id"]).values,
        main_code=main.reindex(low["instance_id"]).fillna("").values,
    )
    out["hint"] = out["main_code"].map(lambda c: HINTS.get(c, ""))
    return out.sort_values(["cost", "instance_id"], ascending=[False, True], kind="stable",
                           na_position="last").reset_index(drop=True)[UNDERUTILIZED_COLUMNS]


def unknown_table(iv: pd.DataFrame) -> pd.DataFrame:
    """Per instance: time with an UNKNOWN verdict, split into missing data (by cause) and other reasons."""
    unk = iv[iv["verdict"] == "UNKNOWN"]
    if unk.empty:
        return pd.DataFrame({c: [] for c in UNKNOWN_COLUMNS})
    by = unk.pivot_table(index="instance_id", columns="code", values="hours", aggfunc="sum", fill_value=0.0)
    g = iv.groupby("instance_id")
    out = pd.DataFrame(index=by.index)
    out["team"] = g["team"].last().reindex(out.index)
    out["instance_type"] = g["instance_type"].last().reindex(out.index)
    out["hours"] = g["hours"].sum().reindex(out.index)
    out["unknown_hours"] = by.sum(axis=1)
    out["unknown_share"] = out["unknown_hours"] / out["hours"].where(out["hours"] > 0)
    for c in MISSING_DATA_CODES:
        out[f"{c}_hours"] = by[c] if c in by.columns else 0.0
    out["missing_data_hours"] = out[[f"{c}_hours" for c in MISSING_DATA_CODES]].sum(axis=1)
    out["other_unknown_hours"] = out["unknown_hours"] - out["missing_data_hours"]
    out["unknown_cost"] = unk.groupby("instance_id")["cost"].sum(min_count=1).reindex(out.index)
    missing = unk[unk["code"].isin(MISSING_DATA_CODES)]
    out["missing_data_cost"] = missing.groupby("instance_id")["cost"].sum(min_count=1).reindex(out.index)
    out = out.rename_axis("instance_id").reset_index()
    return out.sort_values(["missing_data_hours", "unknown_hours", "instance_id"], ascending=[False, False, True],
                           kind="stable").reset_index(drop=True)[UNKNOWN_COLUMNS]


def recommendation_table(recs: list) -> pd.DataFrame:
    rows = [r.to_dict() for r in recs if (r.monthly_savings or 0) > 0]
    if not rows:
        return pd.DataFrame({c: [] for c in RECOMMENDATION_COLUMNS})
    out = pd.DataFrame(rows)
    out["instance_id"] = out["instance_id"].replace("", "(fleet)")
    out["team"] = out["team"].fillna("").replace("", UNTAGGED)
    return out.sort_values(["monthly_savings", "instance_id"], ascending=[False, True],
                           kind="stable").reset_index(drop=True)[RECOMMENDATION_COLUMNS]


def daily_table(iv: pd.DataFrame, cost_table: pd.DataFrame) -> pd.DataFrame:
    frames = []
    if not iv.empty:
        day = iv["at"].dt.tz_convert("UTC").dt.tz_localize(None).dt.floor("D")
        p = iv.assign(date=day).pivot_table(index="date", columns="verdict", values="cost", aggfunc="sum",
                                            fill_value=0.0)
        d = pd.DataFrame(index=p.index)
        for v in VERDICTS:
            d[f"{v.lower()}_cost"] = p[v] if v in p.columns else 0.0
        d["evaluated_cost"] = d.sum(axis=1)
        d["hours"] = iv.assign(date=day).groupby("date")["hours"].sum()
        d["idle_hours"] = iv[iv["verdict"] == "IDLE"].assign(date=day).groupby("date")["hours"].sum()
        frames.append(d)
    if len(cost_table):
        billed = cost_table.groupby(cost_table["date"].dt.floor("D"))["cost"].sum()
        frames.append(billed.rename("billed_cost").to_frame())
    if not frames:
        return pd.DataFrame({c: [] for c in DAILY_COLUMNS})
    out = pd.concat(frames, axis=1, sort=True).sort_index().rename_axis("date").reset_index().reindex(columns=DAILY_COLUMNS)
    out["date"] = pd.to_datetime(out["date"]).dt.date
    out["idle_hours"] = out["idle_hours"].where(out["hours"].isna(), out["idle_hours"].fillna(0.0))
    return out


def action_summary(inp: AuditInputs) -> pd.DataFrame:
    if not inp.actions:
        return pd.DataFrame({c: [] for c in ACTION_COLUMNS})
    d = pd.DataFrame([{"kind": a.kind.value, "dry_run": bool(a.dry_run), "status": a.status} for a in inp.actions])
    return d.groupby(["kind", "dry_run", "status"]).size().rename("count").reset_index()[ACTION_COLUMNS]


def snooze_table(inp: AuditInputs) -> pd.DataFrame:
    """Idle episodes a snooze tag held back from a stop, per team and instance, with how many of them asked
    for longer than the cap (`act.max_snooze_s`) or could not be read: a snooze renewed every week, or one
    set to 2099, is a stop someone keeps avoiding."""
    rows = [a for a in inp.actions
            if a.kind.value in ("skip", "unmark") and TAG_SNOOZE in (a.reason or "")]
    if not rows:
        return pd.DataFrame({c: [] for c in SNOOZE_COLUMNS})
    teams = instance_teams(inp)
    d = pd.DataFrame([{"team": teams.get(a.instance_id) or "", "instance_id": a.instance_id,
                       "capped": "capped" in a.reason or "not an ISO time" in a.reason,
                       "unreadable": "not an ISO time" in a.reason} for a in rows])
    out = (d.groupby(["team", "instance_id"])
           .agg(snoozes=("capped", "size"), capped=("capped", "sum"), unreadable=("unreadable", "sum"))
           .reset_index().sort_values(["snoozes", "team", "instance_id"], ascending=[False, True, True]))
    return out.astype({"snoozes": int, "capped": int, "unreadable": int})[SNOOZE_COLUMNS]


def managed_table(inp: AuditInputs) -> pd.DataFrame:
    """Idle instances that something else manages (an Auto Scaling group, a node group, Karpenter...): never
    stopped, their owners told what to do instead. Per instance: idle episodes, who manages it, the advice."""
    rows = []
    for a in inp.actions:
        reason = a.reason or ""
        if a.kind.value != "notify" or _MANAGED not in reason or _MANAGED_END not in reason:
            continue
        who = reason.split(_MANAGED, 1)[1].split(_MANAGED_END, 1)[0]
        instead = reason.split(_INSTEAD, 1)[1] if _INSTEAD in reason else ""
        rows.append({"instance_id": a.instance_id, "managed_by": who, "instead": instead})
    if not rows:
        return pd.DataFrame({c: [] for c in MANAGED_COLUMNS})
    teams = instance_teams(inp)
    d = pd.DataFrame(rows)
    out = (d.groupby("instance_id").agg(idle_episodes=("managed_by", "size"), managed_by=("managed_by", "last"),
                                        instead=("instead", "last")).reset_index())
    out["team"] = out["instance_id"].map(lambda i: teams.get(i) or "")
    return out.sort_values(["idle_episodes", "instance_id"], ascending=[False, True])[MANAGED_COLUMNS]


def instance_teams(inp: AuditInputs) -> dict[str, str]:
    """The latest team tag seen per instance in the month's stored verdicts."""
    v = inp.verdicts
    if v.empty:
        return {}
    return v.sort_values("at", kind="stable").groupby("instance_id")["team"].last().fillna("").to_dict()
