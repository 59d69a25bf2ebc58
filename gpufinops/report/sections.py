"""The sections a FinOps lead forwards to finance, computed from the audit's own tables (no I/O): what the figures
cover, stops per instance with net savings, breakdowns by account / region / GPU model, the trend against the
previous month, budgets against actual and forecast, and the executive summary's top actions in money.

Each table is returned already sorted, and SORTED_BY says how, so that the page can say it under the table.
"""

from __future__ import annotations

import math
from datetime import datetime

import pandas as pd

from ..cost.budgets import MAX_AMOUNT, Budget, evaluate_budget, evaluate_slurm_budget
from ..cost.slurm import SlurmUsage, slurm_totals
from ..k8s.model import ALLOCATED_BY_DEVICE_PLUGIN, KUEUE_SUSPEND_KINDS, allocations
from ..model import UNTAGGED
from ..places.kubernetes.names import parse_target, parse_workload_id
from ..places.kubernetes.nodes import node_id
from ..places.registry import KUBERNETES_ID_PREFIX
from .words import words

NO_OWNER = "no owner tag"
UNKNOWN_ATTR = "unknown (no billing row)"
COMPLETE_SHARE = 0.99  # a month watched this much of the time is covered; a tick's rounding is not a gap

GROUPED_STOP_COLUMNS = ["instance_id", "name", "team", "owner", "mode", "stops", "false_stops", "restarts", "saved_hours",
                        "saved_cost", "restart_cost", "false_stop_cost", "net_cost", "last_reason"]
BREAKDOWN_COLUMNS = ["instances", "hours", "gpu_hours", "cost", "idle_cost", "idle_share"]
TREND_COLUMNS = ["metric", "this_month", "previous_month", "change", "change_share"]
K8S_NAMESPACE_COLUMNS = ["namespace", "workloads", "hours", "gpu_hours", "cost", "idle_cost", "unknown_cost",
                         "idle_share", "unpriced_hours", "acted", "saved_cost"]
K8S_WORKLOAD_COLUMNS = ["instance_id", "namespace", "kind", "name", "owner", "team", "gpus", "allocation", "hours",
                        "gpu_hours", "cost", "idle_cost", "unknown_cost", "idle_share", "active_hours", "underutilized_hours",
                        "idle_hours", "unknown_hours", "unpriced_hours", "acted", "saved_cost"]
K8S_NODE_POOL_COLUMNS = ["node_pool", "nodes", "sharing", "allocation", "node_hours", "gpu_hours", "node_cost",
                         "pods_cost", "dra_pods_cost", "idle_capacity_cost", "idle_share", "unpriced_hours",
                         "empty_hours", "cordoned", "dry_run_cordons", "saved_hours", "saved_cost"]
CUT_NAME = "(cut: see the instance id)"
BUDGET_COLUMNS = ["budget", "scope", "amount", "basis", "actual", "actual_pct", "forecast", "forecast_pct",
                  "data_through", "status"]
SORTED_BY = {
    "teams": "idle cost, largest first",
    "instances": "idle cost, largest first",
    "underutilized": "cost, largest first",
    "stops_by_instance": "net saving, largest first",
    "stops": "time of the stop, oldest first",
    "unknown_time": "missing-data hours, most first",
    "recommendations": "monthly saving, largest first",
    "accounts": "cost, largest first",
    "regions": "cost, largest first",
    "gpu_models": "cost, largest first",
    "budgets": "as listed in the budgets file",
    "snoozes": "snoozed episodes, most first",
    "managed": "idle episodes, most first",
    "k8s_namespaces": "cost, largest first",
    "k8s_workloads": "idle cost, largest first",
    "k8s_node_pools": "node cost, largest first",
    "slurm_accounts": "cost, largest first",
    "slurm_users": "cost, largest first",
    "slurm_partitions": "cost, largest first",
    "slurm_qos": "cost, largest first",
    "underused_causes": "cost, largest first",
    "underused_by_team": "team's underutilized cost, largest first, then cost",
}


def _f(x) -> float | None:
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


# --------------------------------------------------------------------------- coverage


def coverage(period_hours: float, covered_hours: float, iv: pd.DataFrame, cost_table: pd.DataFrame,
             acted_on: set[str], billing_sources: list[str], billing_days: int, period_days: int) -> dict:
    """How much of the month, of the fleet and of billing the figures cover, and whether that is all of it.

    Month: hours the service evaluated / hours in the period. Fleet: instances with at least one verdict from
    metrics (not UNKNOWN) / instances seen at all (evaluated, billed or acted on). Billing: days with cost rows /
    days in the period, and from which source."""
    evaluated = set(iv["instance_id"]) if not iv.empty else set()
    judged = set(iv.loc[iv["verdict"] != "UNKNOWN", "instance_id"]) if not iv.empty else set()
    billed = (set(cost_table.loc[cost_table["resource_id"] != "", "resource_id"]) if len(cost_table) else set())
    seen = evaluated | billed | set(acted_on)
    month_share = covered_hours / period_hours if period_hours > 0 else None
    fleet_share = len(judged) / len(seen) if seen else None
    billing_share = billing_days / period_days if period_days > 0 else None
    gaps = []
    if month_share is None or month_share < COMPLETE_SHARE:
        gaps.append("month")
    if fleet_share is None or fleet_share < 1.0:
        gaps.append("fleet")
    if billing_share is None or billing_share < 1.0:
        gaps.append("billing")
    return {
        "month_hours": period_hours, "covered_hours": covered_hours, "month_share": month_share,
        "instances_seen": len(seen), "instances_judged": len(judged),
        "instances_not_judged": sorted(seen - judged), "fleet_share": fleet_share,
        "billing_rows": len(cost_table), "billing_sources": list(billing_sources), "billing_days": billing_days,
        "period_days": period_days, "billing_share": billing_share,
        "complete": not gaps, "partial_in": gaps,
    }


# --------------------------------------------------------------------------- per-instance attributes


def owners(cost_table: pd.DataFrame) -> dict[str, str]:
    """The latest owner tag per resource in billing (the service's own records keep team, not owner)."""
    if not len(cost_table) or "owner" not in cost_table:
        return {}
    t = cost_table[(cost_table["resource_id"] != "") & (cost_table["owner"].fillna("") != "")]
    return {} if t.empty else t.sort_values("date").groupby("resource_id")["owner"].last().to_dict()


def instance_attrs(instance_ids, attrs: dict[str, dict[str, str]], owner_of: dict[str, str],
                   types: dict[str, str], gpu_model, default_region: str) -> pd.DataFrame:
    """owner, account, region and GPU model per instance; account and region from billing (else the
    configured region, account unknown), GPU model from the price catalog's spec of its type."""
    rows = []
    for inst in instance_ids:
        a = attrs.get(inst, {})
        itype = types.get(inst) or a.get("instance_type") or ""
        rows.append({"instance_id": inst, "owner": owner_of.get(inst) or NO_OWNER,
                     "account": a.get("account") or UNKNOWN_ATTR,
                     "region": a.get("region") or (f"{default_region} (configured)" if default_region else UNKNOWN_ATTR),
                     "gpu_model": (gpu_model(itype) if itype else None) or "unknown type"})
    return pd.DataFrame(rows, columns=["instance_id", "owner", "account", "region", "gpu_model"])


def breakdown(iv: pd.DataFrame, attrs: pd.DataFrame, by: str) -> pd.DataFrame:
    """Evaluated hours, GPU-hours, cost and idle cost per account / region / GPU model, largest cost first."""
    if iv.empty or attrs.empty:
        return pd.DataFrame({c: [] for c in [by, *BREAKDOWN_COLUMNS]})
    d = iv.drop(columns=[by], errors="ignore").merge(attrs[["instance_id", by]], on="instance_id", how="left")
    d[by] = d[by].fillna(UNKNOWN_ATTR)
    d["idle_cost_part"] = d["cost"].where(d["verdict"] == "IDLE", 0.0)
    g = d.groupby(by)
    out = pd.DataFrame({
        "instances": g["instance_id"].nunique(), "hours": g["hours"].sum(),
        "gpu_hours": g["gpu_hours"].sum(min_count=1), "cost": g["cost"].sum(min_count=1),
        "idle_cost": g["idle_cost_part"].sum(min_count=1),
    })
    out["idle_share"] = out["idle_cost"] / out["cost"].where(out["cost"] > 0)
    out = out.rename_axis(by).reset_index()
    return out.sort_values(["cost", by], ascending=[False, True], kind="stable",
                           na_position="last").reset_index(drop=True)[[by, *BREAKDOWN_COLUMNS]]


# --------------------------------------------------------------------------- Kubernetes namespaces and workloads


def workload_parts(instance_id: str) -> tuple[str, str, str]:
    """(namespace, kind, name) of a workload id (places.kubernetes.names' own parsers). An id cut to the store's
    64 characters keeps what survived the cut: a cut name ends in `~` and its hash; a cut in the kind leaves the
    name unknown (CUT_NAME); a cut in the namespace leaves the cut text as the namespace, one group of its own."""
    ref = parse_workload_id(instance_id)
    if ref is not None:
        return ref.namespace, ref.kind, ref.name
    try:
        namespace, kind, name = parse_target(instance_id)
    except ValueError:
        return instance_id[len(KUBERNETES_ID_PREFIX):], "", CUT_NAME
    return (namespace, kind, name) if kind is not None else (namespace, "", CUT_NAME)


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in columns})


def workload_acts(stops: pd.DataFrame | None) -> dict[str, tuple[str, float]]:
    """Per workload id, what gpufinops did to it this month and what it saved, from the stop audit (audit.stop_audit:
    every stop row, its `saved_cost` measured from the stop until the workload was judged running again):
    ("suspended 1x", 812.40) for a Kueue job (its Workload deactivated), ("scaled to zero 2x", ...) for a Deployment /
    StatefulSet; a dry-run only month says "would have been ..." and saves nothing (its would-have figure is in the
    stops table). Stops not done (failed, unconfirmed) count neither."""
    if stops is None or stops.empty:
        return {}
    done = stops[(stops["status"] == "done") & stops["instance_id"].str.startswith(KUBERNETES_ID_PREFIX)]
    out: dict[str, tuple[str, float]] = {}
    for iid, g in done.groupby("instance_id", sort=True):
        verb = "suspended" if workload_parts(str(iid))[1] in KUEUE_SUSPEND_KINDS else "scaled to zero"
        real = g[~g["dry_run"].astype(bool)]
        if len(real):
            out[str(iid)] = (f"{verb} {len(real)}x", round(float(real["saved_cost"].sum(min_count=1)), 2)
                             if real["saved_cost"].notna().any() else float("nan"))
        else:
            out[str(iid)] = (f"would have been {verb} {len(g)}x (dry-run)", float("nan"))
    return out


def kubernetes_tables(iv: pd.DataFrame, owner_of: dict[str, str],
                      stops: pd.DataFrame | None = None,
                      allocation_of: dict[str, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(namespaces, workloads) from the report's own priced verdict rows (audit.intervals) of the `k8s:` ids:
    the same hours, rates and costs as every other table, so the workloads' cost is part of the month's evaluated
    spend. Money is rounded to the cent per workload and each namespace is the sum of its workloads' cents, so the
    two tables add up to the cent. Namespaces largest cost first; workloads largest idle cost first. `stops` (the
    month's stop audit) adds what was suspended or scaled to zero and what that saved (`workload_acts`).
    `allocation_of`: how each workload's GPUs were allocated, as the service last saw it (instance_labels); a
    workload seen before that was recorded reads "device-plugin", the only way gpufinops counted GPUs then."""
    wl = iv[iv["instance_id"].str.startswith(KUBERNETES_ID_PREFIX)] if not iv.empty else iv
    if wl.empty:
        return _empty(K8S_NAMESPACE_COLUMNS), _empty(K8S_WORKLOAD_COLUMNS)
    d = wl.assign(idle_part=wl["cost"].where(wl["verdict"] == "IDLE", 0.0),
                  unknown_part=wl["cost"].where(wl["verdict"] == "UNKNOWN", 0.0),
                  unpriced_part=wl["hours"].where(wl["cost"].isna(), 0.0))
    g = d.groupby("instance_id", sort=True)
    out = pd.DataFrame({
        "team": g["team"].last(), "gpus": g["gpus"].last(), "hours": g["hours"].sum(),
        "gpu_hours": g["gpu_hours"].sum(min_count=1), "cost": g["cost"].sum(min_count=1).round(2),
        "idle_cost": g["idle_part"].sum(min_count=1).round(2),
        "unknown_cost": g["unknown_part"].sum(min_count=1).round(2), "unpriced_hours": g["unpriced_part"].sum(),
    })
    hours = d.pivot_table(index="instance_id", columns="verdict", values="hours", aggfunc="sum", fill_value=0.0)
    for v in ("ACTIVE", "UNDERUTILIZED", "IDLE", "UNKNOWN"):
        out[f"{v.lower()}_hours"] = hours[v].reindex(out.index).fillna(0.0) if v in hours.columns else 0.0
    out["idle_share"] = out["idle_cost"] / out["cost"].where(out["cost"] > 0)
    parts = pd.DataFrame([workload_parts(i) for i in out.index], index=out.index,
                         columns=["namespace", "kind", "name"])  # one parse per workload, not per row
    out = out.join(parts)
    out["owner"] = [owner_of.get(i) or NO_OWNER for i in out.index]
    out["allocation"] = [(allocation_of or {}).get(i) or ALLOCATED_BY_DEVICE_PLUGIN for i in out.index]
    acts = workload_acts(stops)
    out["acted"] = [acts.get(i, ("", 0.0))[0] for i in out.index]
    out["saved_cost"] = [acts[i][1] if i in acts else float("nan") for i in out.index]
    workloads = (out.rename_axis("instance_id").reset_index()
                 .sort_values(["idle_cost", "cost", "instance_id"], ascending=[False, False, True], kind="stable",
                              na_position="last").reset_index(drop=True)[K8S_WORKLOAD_COLUMNS])
    n = workloads.groupby("namespace")
    ns = pd.DataFrame({
        "workloads": n.size(), "hours": n["hours"].sum(), "gpu_hours": n["gpu_hours"].sum(min_count=1),
        **{c: n[c].sum(min_count=1).round(2) for c in ("cost", "idle_cost", "unknown_cost")},
        "unpriced_hours": n["unpriced_hours"].sum(), "saved_cost": n["saved_cost"].sum(min_count=1).round(2),
        "acted": n["acted"].agg(lambda a: sum(1 for x in a if x and not x.startswith("would"))),
    })
    ns["acted"] = [f"{k} workload(s)" if k else "" for k in ns["acted"]]
    ns["idle_share"] = ns["idle_cost"] / ns["cost"].where(ns["cost"] > 0)
    namespaces = (ns.rename_axis("namespace").reset_index()
                  .sort_values(["cost", "namespace"], ascending=[False, True], kind="stable", na_position="last")
                  .reset_index(drop=True)[K8S_NAMESPACE_COLUMNS])
    return namespaces, workloads


# --------------------------------------------------------------------------- GPU node pools (issue 28)


def cordon_savings(node_hours: pd.DataFrame, cordons: list[tuple[str, pd.Timestamp]],
                   obs_end: pd.Timestamp) -> dict[str, tuple[int, float, float]]:
    """Per node name, (cordons, hours saved, cost saved) of gpufinops' completed real cordons (`cordons`: node name
    and time, oldest first). A cordon saved the time from it until the end of what the month observed (or the
    node's next cordon) that the node was no longer there to pay for (no tick saw it: Karpenter or the autoscaler
    removed it), priced at the node's mean rate of the month (node cents over its priced hours); NaN unpriced.
    A node seen again after its cordon (uncordoned, or not yet removed) saved nothing for that time."""
    out: dict[str, tuple[int, float, float]] = {}
    by_node = {name: g for name, g in node_hours.groupby("node")} if len(node_hours) else {}
    for n, (name, at) in enumerate(cordons):
        rows = by_node.get(name)
        if rows is None:
            continue
        until = next((t for other, t in cordons[n + 1:] if other == name), obs_end)
        if until <= at:
            continue
        later = rows[(rows["hour"] + pd.Timedelta(hours=1) > at) & (rows["hour"] < until)]
        # The node's time in the cordon's own hour counts from the cordon on (at most what that hour held).
        before = min((at - at.floor("h")).total_seconds() / 3600, float(later["hours"].iloc[0])) \
            if len(later) and later["hour"].iloc[0] <= at else 0.0
        hours = max(0.0, (until - at).total_seconds() / 3600 - (float(later["hours"].sum()) - before))
        priced = float((rows["hours"] - rows["unpriced_hours"]).sum())
        rate = float(rows["node_cents"].sum()) / 100 / priced if priced > 0 else float("nan")
        count, saved_h, saved = out.get(name, (0, 0.0, 0.0))
        out[name] = (count + 1, saved_h + hours, saved + hours * rate)
    return out


def node_pool_table(node_hours: pd.DataFrame, actions: list, obs_end) -> pd.DataFrame:
    """Per GPU node pool (Karpenter NodePool, EKS node group, ...; "(no node pool)"), from the month's hourly node
    rollup (Store.node_hours_frame): nodes seen, node-hours, GPU-hours, the sharing modes and the ways GPUs were
    allocated (device plugin, DRA) seen, the nodes' cost split into what the pods' shares carried (and of it, what
    their DRA GPUs carried: dra_pods_cost) and the idle capacity no pod held (places.kubernetes.costs.attribute's split,
    summed in whole cents, so pods + idle capacity == node cost to the cent in every pool), the hours a node had no GPU
    pod at all, and the nodes gpufinops cordoned (`action: drain`: stop audit rows of `k8s:node/<name>` ids) with
    what that saved (cordon_savings). A pool's node is counted in the pool it was last seen in. Largest node cost
    first; empty without cluster data."""
    if node_hours is None or node_hours.empty:
        return _empty(K8S_NODE_POOL_COLUMNS)
    nh = node_hours.sort_values(["hour", "node"], kind="stable")
    pool_of = nh.groupby("node")["node_pool"].last()
    ids = {node_id(str(name)): str(name) for name in pool_of.index}
    real, dry = [], {}
    for a in actions:
        name = ids.get(a.instance_id)
        if name is None or a.kind.value != "stop" or a.status != "done":
            continue
        if a.dry_run:
            dry[name] = dry.get(name, 0) + 1
        else:
            real.append((name, pd.Timestamp(a.at)))
    saved = cordon_savings(nh, sorted(real, key=lambda c: c[1]), pd.Timestamp(obs_end))
    g = nh.groupby("node_pool")
    cents = {c: g[c].sum() for c in ("node_cents", "pods_cents", "dra_cents", "idle_cents")}
    out = pd.DataFrame({
        "nodes": g["node"].nunique(), "sharing": g["sharing"].agg(lambda m: ", ".join(sorted(set(m)))),
        "allocation": g["allocation"].agg(lambda m: ", ".join(allocations(m).split(","))),
        "node_hours": g["hours"].sum(), "gpu_hours": g["gpu_hours"].sum(),
        "node_cost": cents["node_cents"] / 100, "pods_cost": cents["pods_cents"] / 100,
        "dra_pods_cost": cents["dra_cents"] / 100,
        "idle_capacity_cost": cents["idle_cents"] / 100, "unpriced_hours": g["unpriced_hours"].sum(),
        "empty_hours": g["empty_hours"].sum(),
    })
    out["idle_share"] = cents["idle_cents"] / cents["node_cents"].where(cents["node_cents"] > 0)
    for column, part in (("cordoned", 0), ("saved_hours", 1), ("saved_cost", 2)):
        per_pool: dict[str, float] = {}
        for name, figures in saved.items():
            per_pool[pool_of[name]] = per_pool.get(pool_of[name], 0) + figures[part]
        out[column] = [per_pool.get(pool, 0) for pool in out.index]
    out["dry_run_cordons"] = [sum(k for name, k in dry.items() if pool_of[name] == pool) for pool in out.index]
    out["cordoned"] = out["cordoned"].astype(int)
    # Nothing cordoned: no saving to show ("–"), as the namespaces table shows a namespace nothing was done to.
    out["saved_hours"] = out["saved_hours"].where(out["cordoned"] > 0)
    out["saved_cost"] = out["saved_cost"].round(2).where(out["cordoned"] > 0)
    return (out.rename_axis("node_pool").reset_index()
            .sort_values(["node_cost", "node_pool"], ascending=[False, True], kind="stable")
            .reset_index(drop=True)[K8S_NODE_POOL_COLUMNS])


# --------------------------------------------------------------------------- why underused (issue 25)

UNDERUSED_CAUSE_COLUMNS = ["code", "cause", "profiling", "instances", "hours", "cost", "share"]
UNDERUSED_TEAM_COLUMNS = ["team", "code", "cause", "instances", "hours", "cost", "team_share"]
# The causes only the DCGM profiling counters can name (decide.evaluate.low_use_causes): one of them in a month
# proves SM activity / tensor pipes were read for it.
PROFILING_CODES = ("few_sms_busy", "tensor_idle")


def underused_causes(iv: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(by cause, by team and cause) of the UNDERUTILIZED time: hours and cost per reason code, in words
    (report.words), from the report's own priced verdict rows (audit.intervals, the hourly rollups keep each
    verdict's code), so the causes add up to the headline's underutilized cost. Largest cost first."""
    under = iv[iv["verdict"] == "UNDERUTILIZED"] if not iv.empty else iv
    if under.empty:
        return _empty(UNDERUSED_CAUSE_COLUMNS), _empty(UNDERUSED_TEAM_COLUMNS)
    total = under["cost"].sum(min_count=1)
    g = under.groupby("code")
    causes = pd.DataFrame({"instances": g["instance_id"].nunique(), "hours": g["hours"].sum(),
                           "cost": g["cost"].sum(min_count=1)}).rename_axis("code").reset_index()
    causes["cause"] = causes["code"].map(words)
    causes["profiling"] = causes["code"].isin(PROFILING_CODES)
    causes["share"] = causes["cost"] / total if total and total > 0 else None
    causes = causes.sort_values(["cost", "code"], ascending=[False, True], kind="stable", na_position="last")
    t = under.groupby(["team", "code"])
    teams = pd.DataFrame({"instances": t["instance_id"].nunique(), "hours": t["hours"].sum(),
                          "cost": t["cost"].sum(min_count=1)}).reset_index()
    per_team = teams.groupby("team")["cost"].transform(lambda c: c.sum(min_count=1))
    teams["cause"] = teams["code"].map(words)
    teams["team_share"] = teams["cost"] / per_team.where(per_team > 0)
    teams = teams.assign(_team_cost=per_team.fillna(-1.0)).sort_values(
        ["_team_cost", "team", "cost", "code"], ascending=[False, True, False, True], kind="stable",
        na_position="last")
    return (causes.reset_index(drop=True)[UNDERUSED_CAUSE_COLUMNS],
            teams.reset_index(drop=True)[UNDERUSED_TEAM_COLUMNS])


# --------------------------------------------------------------------------- stops per instance


def stops_by_instance(stops: pd.DataFrame, owner_of: dict[str, str],
                      name_of: dict[str, str] | None = None) -> pd.DataFrame:
    """Completed stops grouped per instance (real and dry-run apart): stops, false stops, gross and net money,
    largest net saving first. The per-stop log stays in the stops table (CSV)."""
    done = stops[stops["status"] == "done"] if len(stops) else stops
    if done.empty:
        return pd.DataFrame({c: [] for c in GROUPED_STOP_COLUMNS})
    d = done.assign(mode=done["dry_run"].map({True: "dry-run (would have)", False: "stopped"}))
    g = d.groupby(["instance_id", "mode"])
    out = pd.DataFrame({
        "team": g["team"].last(), "stops": g.size(), "false_stops": g["false_stop"].sum(),
        "restarts": g["restarted"].sum(), "saved_hours": g["saved_hours"].sum(),
        "saved_cost": g["saved_cost"].sum(min_count=1), "restart_cost": g["restart_cost"].sum(min_count=1),
        "false_stop_cost": g["false_stop_cost"].sum(min_count=1), "net_cost": g["net_cost"].sum(min_count=1),
        "last_reason": g["reason"].last(),
    }).reset_index()
    out["owner"] = out["instance_id"].map(lambda i: owner_of.get(i) or NO_OWNER)
    out["name"] = out["instance_id"].map(lambda i: (name_of or {}).get(i) or "")
    out = out.astype({"stops": int, "false_stops": int, "restarts": int})
    return out.sort_values(["net_cost", "instance_id"], ascending=[False, True], kind="stable",
                           na_position="last").reset_index(drop=True)[GROUPED_STOP_COLUMNS]


# --------------------------------------------------------------------------- trend


TREND_METRICS = (("GPU spend", "gpu_spend"), ("Idle cost", "idle_cost"), ("Net saved by stops", "net_saved_cost"))


def trend_table(current: dict, previous: dict | None) -> pd.DataFrame:
    """Spend, idle cost and net saved this month against the previous month; None ("–") where the previous
    month has no data (nothing evaluated, no billing)."""
    rows = []
    for label, key in TREND_METRICS:
        now, before = _f(current.get(key)), _f(previous.get(key)) if previous else None
        change = now - before if now is not None and before is not None else None
        share = change / abs(before) if change is not None and before else None
        rows.append({"metric": label, "this_month": now, "previous_month": before, "change": change,
                     "change_share": share})
    return pd.DataFrame(rows, columns=TREND_COLUMNS)


# --------------------------------------------------------------------------- budgets


def budget_table(budgets: list, billed: pd.DataFrame, estimate: pd.DataFrame, period_start: datetime,
                 period_end: datetime, billed_through: datetime | None, estimate_through: datetime,
                 running: pd.DataFrame, verdicts: pd.DataFrame, currency: str,
                 slurm: SlurmUsage | None = None, as_of: datetime | None = None) -> pd.DataFrame:
    """Each budget of the month against actual spend and the month-end forecast, through
    gpufinops.budgets.evaluate_budget (the same sums as `gpufinops budgets check`). Actual is billing when the
    month has billing rows, else the estimate from evaluated time x hourly price (said in `basis`). A Slurm
    account's budget is its GPU-hours from sacct, priced (evaluate_slurm_budget, as `budgets check`)."""
    if not budgets:
        return pd.DataFrame({c: [] for c in BUDGET_COLUMNS})

    use_billing = len(billed) > 0
    table = billed if use_billing else estimate
    through = billed_through if use_billing and billed_through is not None else estimate_through
    rows = []
    for b in budgets:
        row = {"budget": b.name, "scope": b.scope.label(), "amount": float(b.amount),
               "basis": "billing" if use_billing else "estimate: evaluated time x hourly price",
               "actual": None, "actual_pct": None, "forecast": None, "forecast_pct": None, "data_through": None}
        if b.scope.slurm:
            row["basis"] = "Slurm accounting (sacct GPU-hours x price)"
            s = evaluate_slurm_budget(b, slurm or SlurmUsage(pd.DataFrame()), period_start, period_end,
                                      as_of or estimate_through)
            if s.error:
                rows.append({**row, "status": f"unknown: {s.error}"})
                continue
        elif b.currency != currency:
            rows.append({**row, "status": f"skipped: budget in {b.currency}, costs in {currency} (no conversion)"})
            continue
        else:
            s = evaluate_budget(b, table, period_start, period_end, through, running, verdicts)
        over = "over budget" if s.pct_actual >= 100 else ("forecast over budget" if s.pct_forecast >= 100
                                                           else "within budget")
        rows.append({**row, "actual": s.spent, "actual_pct": s.pct_actual, "forecast": s.forecast,
                     "forecast_pct": s.pct_forecast, "data_through": s.data_through, "status": over})
    return pd.DataFrame(rows, columns=BUDGET_COLUMNS)


def fleet_forecast(billed: pd.DataFrame, estimate: pd.DataFrame, period_start: datetime, period_end: datetime,
                   billed_through: datetime | None, estimate_through: datetime, running: pd.DataFrame,
                   verdicts: pd.DataFrame):
    """The whole fleet's month-end forecast, by the sums of every budget (budgets.evaluate_budget over scope
    `all`): spend so far + the $/h of what runs at the end of what was observed x hours left. A BudgetStatus
    (`forecast`, and the sums it adds: `spent`, `running_rate`, `hours_left`, `data_through`); None without data."""

    use_billing = len(billed) > 0
    table = billed if use_billing else estimate
    if not len(table):
        return None
    through = billed_through if use_billing and billed_through is not None else estimate_through
    fleet = Budget(name="fleet", amount=MAX_AMOUNT)  # the amount is not used: only the sums are
    return evaluate_budget(fleet, table, period_start, period_end, through, running, verdicts)


# --------------------------------------------------------------------------- Slurm clusters


SLURM_COLUMNS = ["jobs", "gpu_hours", "cost", "unpriced_gpu_hours", "idle_gpu_hours", "idle_cost", "idle_share"]
SLURM_GROUPS = {"slurm_accounts": "account", "slurm_users": "user", "slurm_partitions": "partition", "slurm_qos": "qos"}


def slurm_tables(usage: SlurmUsage | None) -> dict[str, pd.DataFrame]:
    """The month's Slurm GPU-hours and dollars per account, user, partition and QOS (cost.slurm.slurm_totals: the
    figures of `costs --by slurm-account|slurm-user|partition|slurm-qos`, a run without a QOS under its
    cost.slurm.NONE), idle from the stored verdicts; empty tables for a month without Slurm accounting."""
    out = {}
    for name, column in SLURM_GROUPS.items():
        if usage is None or usage.table.empty:
            out[name] = pd.DataFrame({c: [] for c in [column, *SLURM_COLUMNS]})
            continue
        t = slurm_totals(usage.table, column, usage.idle).rename(columns={"usd": "cost", "idle_usd": "idle_cost"})
        out[name] = t[[column, *SLURM_COLUMNS]]
    return out


def slurm_headline(usage: SlurmUsage | None) -> dict:
    """The Slurm figures of the headline and the finance page: None for a month without Slurm accounting; the
    idle figures None when the verdicts could not be read (unknown, never 0)."""
    if usage is None or usage.table.empty:  # none, or no cluster read: unknown (the errors say why), never 0
        return {"slurm_gpu_hours": None, "slurm_cost": None, "slurm_unpriced_gpu_hours": None,
                "slurm_idle_gpu_hours": None, "slurm_idle_cost": None, "slurm_idle_share": None,
                "slurm_jobs": 0, "slurm_errors": list(usage.errors) if usage else []}
    t, idle = usage.table, usage.idle
    cost = float(t["cost"].sum()) if len(t) else 0.0
    idle_cost = None if idle is None else float(idle["idle_usd"].sum()) if len(idle) else 0.0
    return {"slurm_gpu_hours": float(t["gpu_seconds"].sum()) / 3600.0, "slurm_cost": cost,
            "slurm_unpriced_gpu_hours": float(t.loc[t["cost"].isna(), "gpu_seconds"].sum()) / 3600.0,
            "slurm_idle_gpu_hours": None if idle is None else float(idle["idle_gpu_hours"].sum()) if len(idle) else 0.0,
            "slurm_idle_cost": idle_cost,
            "slurm_idle_share": idle_cost / cost if idle_cost is not None and cost > 0 else None,
            "slurm_jobs": int(t["subject_id"].nunique()), "slurm_errors": list(usage.errors)}


FINANCE_TEAMS = 5


def finance_page(headline: dict, teams: pd.DataFrame, budgets: pd.DataFrame, budgets_path: str,
                 forecast: float | None, rules: list | None, slurm_accounts: pd.DataFrame | None = None) -> dict:
    """The first page, for finance: spend (billed or estimated, said once), idle spend, what stopping saved (net),
    the forecast against each budget, the top five teams by spend and the words defined plainly."""
    billed = headline.get("billed_cost") is not None
    slurm_accounts = slurm_accounts if slurm_accounts is not None else pd.DataFrame()
    team_rows = []
    if len(teams):
        spend = teams["billed_cost"] if billed else teams["cost"]
        t = teams.assign(spend=spend).sort_values(["spend", "team"], ascending=[False, True], kind="stable",
                                                   na_position="last").head(FINANCE_TEAMS)
        team_rows = [{"team": r.team, "spend": _f(r.spend), "idle_cost": _f(r.idle_cost)}
                     for r in t.itertuples(index=False)]
    stop_rules = [r for r in (rules or []) if getattr(r.action, "value", r.action) != "notify"]
    if stop_rules:
        r = stop_rules[0]
        window = f"{r.window_s / 3600:g} h" if r.window_s >= 3600 else f"{r.window_s / 60:g} min"
        idle_words = (f"a GPU doing no work for the rule's window: every GPU of the machine under "
                      f"{r.threshold_pct:g}% busy for {window} (rule {r.name})")
    else:
        idle_words = "a GPU doing no work for the rule's window"
    return {
        "basis": "billed" if billed else "estimated",
        "forecast": forecast,
        "budgets": [{"budget": b.budget, "amount": _f(b.amount), "forecast": _f(b.forecast),
                     "forecast_pct": _f(b.forecast_pct), "status": b.status}
                    for b in budgets.itertuples(index=False)] if len(budgets) else [],
        "budgets_path": budgets_path,
        "teams": team_rows,
        "team_count": len(teams),  # all the month's teams: the page shows the first FINANCE_TEAMS
        "idle_words": idle_words,
        # The Slurm clusters' month (None without Slurm accounting): its own rows, apart from the cloud spend above.
        "slurm": ({"gpu_hours": headline["slurm_gpu_hours"], "cost": headline["slurm_cost"],
                   "idle_cost": headline["slurm_idle_cost"], "idle_share": headline["slurm_idle_share"],
                   "unpriced_gpu_hours": headline["slurm_unpriced_gpu_hours"],
                   "accounts": [{"account": r.account, "gpu_hours": _f(r.gpu_hours), "cost": _f(r.cost),
                                 "idle_cost": _f(r.idle_cost)}
                                for r in slurm_accounts.head(FINANCE_TEAMS).itertuples(index=False)]}
                  if headline.get("slurm_jobs") or headline.get("slurm_errors") else None),
        "slurm_errors": list(headline.get("slurm_errors") or []),
    }


def estimate_table(iv: pd.DataFrame, attrs: pd.DataFrame) -> pd.DataFrame:
    """The evaluated running time as a cost table (the columns a budget scope matches on)."""
    if iv.empty:
        return pd.DataFrame({c: [] for c in ("resource_id", "team", "project", "account", "instance_type",
                                             "cost", "verdict", "hours")})
    acct = attrs.set_index("instance_id")["account"].replace(UNKNOWN_ATTR, "") if len(attrs) else pd.Series(dtype=str)
    return pd.DataFrame({
        "resource_id": iv["instance_id"], "team": iv["team"].replace(UNTAGGED, ""), "project": "",
        "account": iv["instance_id"].map(acct).fillna(""), "instance_type": iv["instance_type"].fillna(""),
        "cost": iv["cost"].fillna(0.0), "verdict": iv["verdict"], "hours": iv["hours"],
    })


def running_at_end(iv: pd.DataFrame, attrs: pd.DataFrame, as_of: datetime, fresh_s: float) -> pd.DataFrame:
    """Instances still running when the report was made (latest tick within fresh_s of as_of), with their $/h:
    what the budget forecast projects over the rest of the month."""
    cols = ["instance_id", "team", "project", "account", "instance_type", "rate"]
    if iv.empty:
        return pd.DataFrame({c: [] for c in cols})
    last = iv.sort_values("at").groupby("instance_id").tail(1)
    last = last[last["at"] >= pd.Timestamp(as_of) - pd.Timedelta(seconds=fresh_s)]
    acct = attrs.set_index("instance_id")["account"].replace(UNKNOWN_ATTR, "") if len(attrs) else pd.Series(dtype=str)
    return pd.DataFrame({"instance_id": last["instance_id"], "team": last["team"].replace(UNTAGGED, ""),
                         "project": "", "account": last["instance_id"].map(acct).fillna(""),
                         "instance_type": last["instance_type"].fillna(""),
                         "rate": pd.to_numeric(last["rate"], errors="coerce")}, columns=cols)


# --------------------------------------------------------------------------- executive summary


def executive_summary(instances: pd.DataFrame, recommendations: pd.DataFrame, recommendation_run: bool,
                      top: int = 3) -> dict:
    """The top actions in money: the largest idle offenders by idle cost, and the largest right-sizing moves
    of the latest recommendation run (None when there was no run: "–", not "nothing to do")."""
    idle = instances[instances["idle_cost"].fillna(0) > 0] if len(instances) else instances
    # Each with the advice of report.advice (the act stage's own rules and tags): a protected, excluded or
    # snoozed instance is never advised a stop.
    offenders = [{"instance_id": r.instance_id, "name": getattr(r, "name", "") or "", "team": r.team,
                  "owner": getattr(r, "owner", NO_OWNER), "idle_cost": float(r.idle_cost),
                  "idle_hours": float(r.idle_hours), "advice": getattr(r, "advice", "") or "none",
                  "advice_reason": getattr(r, "advice_reason", "") or ""}
                 for r in idle.head(top).itertuples(index=False)]
    moves = None
    if recommendation_run:
        rs = (recommendations[recommendations["action"].str.startswith("rightsize")] if len(recommendations)
              else recommendations)
        moves = [{"instance_id": r.instance_id, "team": r.team, "from": r.instance_type, "to": r.recommended,
                  "monthly_savings": float(r.monthly_savings)} for r in rs.head(top).itertuples(index=False)]
    return {"idle_offenders": offenders, "rightsizing": moves}


__all__ = ["BUDGET_COLUMNS", "GROUPED_STOP_COLUMNS", "K8S_NAMESPACE_COLUMNS", "K8S_NODE_POOL_COLUMNS",
           "K8S_WORKLOAD_COLUMNS", "NO_OWNER",
           "SORTED_BY", "breakdown", "budget_table", "coverage", "estimate_table", "executive_summary",
           "finance_page", "fleet_forecast", "slurm_headline", "slurm_tables",
           "instance_attrs", "kubernetes_tables", "node_pool_table", "owners", "running_at_end", "stops_by_instance",
           "trend_table", "underused_causes", "workload_parts"]
