"""The fleet's cost and verdict figures on the service's /metrics (issue 27), built once per tick.

`FleetFigures.from_report()` turns the last tick's RunReport (plus a few cheap store reads) into plain
numbers; `FleetCollector` hands them to prometheus_client at each scrape, so a scrape does no work beyond
formatting. Labels are bounded: `instance_id` (the fleet), `team` (the team allocation key's value),
`gpu_model`, `instance_type`, `verdict`, `rule` (configured rule names), `code` (ReasonCode), `budget`
(configured budget names), `dry_run`, and for Kubernetes GPU nodes `node`, `node_pool` (the cluster's nodes and
pools) and `allocation` (device-plugin, dra, unallocated). No other tag value becomes a label.

The instance label is `instance_id`, as on the DCGM series after the ec2_sd relabelling (docs/metrics.md), not
`instance`: Prometheus sets `instance` to the scrape target and would rename ours to `exported_instance`.

Series count per scrape: 3 per running judged instance (hourly cost, GPU count, verdict) + 2 per (verdict,
team) with instances + 1 per UNKNOWN code + up to 3 per team (idle $ this month, stops by dry_run) + 2 per
budget + the service's own health series: about 3 x instances (BENCHMARKS.md, "Service /metrics at 10,000 GPUs"),
+ 2 per (Kubernetes GPU node, allocation): at most 6 per node (device-plugin, dra, unallocated).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy.exc import SQLAlchemyError

from ..act.plan import primary_decision
from ..cost.costs import verdict_costs
from ..model import TAG_STOPPED_BY, ActionKind, Decision, GpuInstance, Verdict
from ..places.kubernetes.costs import allocation_split, node_pool_of

if TYPE_CHECKING:
    from ..store.store import Store
    from .pipeline import RunReport

log = logging.getLogger("gpufinops.fleet_metrics")

NO_TEAM = "none"  # the team label of an instance without a team tag (an empty label would vanish in PromQL)
VERDICTS = tuple(v.value for v in Verdict)


@dataclass(frozen=True)
class InstanceFigures:
    instance_id: str
    team: str
    gpu_model: str
    instance_type: str
    gpus: int
    hourly_cost: float | None
    decision: Decision  # the primary decision (act.plan.primary_decision): one verdict per instance


@dataclass
class FleetFigures:
    at: datetime | None = None
    instances: list[InstanceFigures] = field(default_factory=list)
    idle_cost_month: dict[str, float] = field(default_factory=dict)  # team -> USD of IDLE time this month
    stops_month: dict[tuple[str, str], int] = field(default_factory=dict)  # (team, dry_run) -> done stops
    stopped_cost: dict[str, float] = field(default_factory=dict)  # team -> USD/h of instances gpufinops stopped
    # (node, node pool, allocation) -> (physical GPUs, USD/h or None unpriced): each Kubernetes GPU node's cost split
    # by how its GPUs were allocated (device-plugin, dra, unallocated = idle capacity), as the cost rows split it.
    k8s_allocation: dict[tuple[str, str, str], tuple[float, float | None]] = field(default_factory=dict)

    @classmethod
    def from_report(cls, report: "RunReport", store: "Store | None" = None, max_gap_s: float = 120.0) -> "FleetFigures":
        by_instance: dict[str, list[Decision]] = defaultdict(list)
        for d in report.decisions:
            by_instance[d.instance_id].append(d)
        instances = []
        for inst in report.instances:
            primary = primary_decision(by_instance.get(inst.instance_id, ()))
            if primary is None:  # not running, or not judged: no verdict, no running cost
                continue
            instances.append(InstanceFigures(inst.instance_id, team_of(inst), inst.gpu_model or "unknown",
                                             inst.instance_type or "unknown", inst.gpu_count, inst.hourly_cost,
                                             primary))
        figures = cls(report.now, instances)
        for inst in report.instances:  # the spend avoided now: stopped by gpufinops and still stopped
            if inst.state == "stopped" and inst.tags.get(TAG_STOPPED_BY) and inst.hourly_cost is not None:
                team = team_of(inst)
                figures.stopped_cost[team] = figures.stopped_cost.get(team, 0.0) + inst.hourly_cost
        if store is not None:
            figures.read_store(store, report.now, {i.instance_id: team_of(i) for i in report.instances}, max_gap_s)
        return figures

    def note_cluster(self, snapshot, hourly_shares) -> None:
        """This tick's cluster listing (a ClusterSnapshot and its costs.attribute for one hour, as the listing
        computed it): per node, the GPUs and the hourly cost carried by device-plugin GPUs, by DRA GPUs and by no pod
        (places.kubernetes.costs.allocation_split: whole cents, adding up to the node's rate to the cent)."""
        pools = {n.name: node_pool_of(n) for n in snapshot.nodes}
        for node, parts in allocation_split(hourly_shares).items():
            for way, (gpus, cents) in parts.items():
                self.k8s_allocation[(node, pools[node], way)] = (float(gpus), None if cents is None else cents / 100)

    def read_store(self, store: "Store", now: datetime, teams: dict[str, str], max_gap_s: float) -> None:
        """Idle $ accrued this month (the hourly rollups, as reports and budgets read them) and this month's
        stops by team (the audit log). A database error leaves them out of this scrape and is logged."""
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        try:
            frame = store.verdict_hours_frame(start, now + timedelta(microseconds=1), grain="period")
            stops = store.action_rows(status="done", kinds=(ActionKind.STOP, ActionKind.TERMINATE), start=start)
        except SQLAlchemyError as exc:
            log.error("fleet metrics: database read failed, month figures left out: %s", exc)
            return
        costs = verdict_costs(frame, start, now, max_gap_s=max_gap_s)
        idle = costs[(costs["verdict"] == Verdict.IDLE.value) & costs["cost"].notna()]
        for team, cost in idle.groupby(idle["team"].fillna("").replace("", NO_TEAM))["cost"].sum().items():
            self.idle_cost_month[str(team)] = float(cost)
        labels = store.instance_labels({s.instance_id for s in stops} - set(teams)) if stops else {}
        for s in stops:
            team = teams.get(s.instance_id) or (labels.get(s.instance_id) or {}).get("team") or NO_TEAM
            key = (team, str(bool(s.dry_run)).lower())
            self.stops_month[key] = self.stops_month.get(key, 0) + 1

    # ------------------------------------------------------------------ exposition
    def families(self) -> list[GaugeMetricFamily]:
        if self.at is None:  # no tick yet: no figure rather than zeros
            return []
        ilabels = ["instance_id", "team", "gpu_model", "instance_type"]
        cost = GaugeMetricFamily("gpufinops_node_total_hourly_cost",
                                 "USD per hour of a running judged instance (OpenCost's name); absent when unpriced",
                                 labels=ilabels)
        gpus = GaugeMetricFamily("gpufinops_node_gpu_count", "GPUs of a running judged instance (OpenCost's name)",
                                 labels=ilabels)
        verdict = GaugeMetricFamily("gpufinops_instance_verdict",
                                    "1 for the instance's verdict in the last tick: the decision that drives action, "
                                    "one per instance (rule and code of that decision)",
                                    labels=["instance_id", "team", "gpu_model", "verdict", "rule", "code"])
        by_gpus: dict[tuple[str, str], float] = defaultdict(float)
        by_cost: dict[tuple[str, str], float] = defaultdict(float)
        by_count: dict[str, int] = dict.fromkeys(VERDICTS, 0)
        unknown: dict[str, int] = defaultdict(int)
        for f in self.instances:
            v = f.decision.verdict.value
            values = [f.instance_id, f.team, f.gpu_model, f.instance_type]
            gpus.add_metric(values, f.gpus)
            if f.hourly_cost is not None:
                cost.add_metric(values, f.hourly_cost)
                by_cost[(v, f.team)] += f.hourly_cost
            verdict.add_metric([f.instance_id, f.team, f.gpu_model, v, f.decision.rule_name, f.decision.code.value], 1)
            by_gpus[(v, f.team)] += f.gpus
            by_count[v] += 1
            if f.decision.verdict is Verdict.UNKNOWN:
                unknown[f.decision.code.value] += 1
        gpus_by = GaugeMetricFamily("gpufinops_gpus_by_verdict", "GPUs of running instances by their verdict",
                                    labels=["verdict", "team"])
        cost_by = GaugeMetricFamily("gpufinops_hourly_cost_by_verdict",
                                    "USD per hour of running priced instances by their verdict",
                                    labels=["verdict", "team"])
        for key, n in sorted(by_gpus.items()):
            gpus_by.add_metric(list(key), n)
            cost_by.add_metric(list(key), by_cost.get(key, 0.0))
        counts = GaugeMetricFamily("gpufinops_instances_by_verdict",
                                   "Running judged instances by their verdict (one per instance)", labels=["verdict"])
        for v, n in by_count.items():
            counts.add_metric([v], n)
        unknown_by = GaugeMetricFamily("gpufinops_unknown_instances",
                                       "Instances whose verdict is UNKNOWN, by reason code", labels=["code"])
        for code, n in sorted(unknown.items()):
            unknown_by.add_metric([code], n)
        idle_month = GaugeMetricFamily("gpufinops_idle_cost_month_to_date",
                                       "USD of IDLE time accrued this calendar month (UTC), from the hourly rollups",
                                       labels=["team"])
        for team, usd in sorted(self.idle_cost_month.items()):
            idle_month.add_metric([team], usd)
        stops = GaugeMetricFamily("gpufinops_stops_month_to_date",
                                  "Stops and terminations carried out this calendar month (UTC), from the audit log",
                                  labels=["team", "dry_run"])
        for (team, dry), n in sorted(self.stops_month.items()):
            stops.add_metric([team, dry], n)
        saved = GaugeMetricFamily("gpufinops_stopped_hourly_cost",
                                  "USD per hour not spent now: instances gpufinops stopped that are still stopped",
                                  labels=["team"])
        for team, usd in sorted(self.stopped_cost.items()):
            saved.add_metric([team], usd)
        k8s_labels = ["node", "node_pool", "allocation"]
        k8s_gpus = GaugeMetricFamily("gpufinops_k8s_node_gpus",
                                     "Physical GPUs of a Kubernetes GPU node by how they were allocated: "
                                     "device-plugin, "
                                     "dra (ResourceClaims) or unallocated (held by no pod); a MIG slice or a shared "
                                     "GPU counts its part", labels=k8s_labels)
        k8s_cost = GaugeMetricFamily("gpufinops_k8s_node_hourly_cost",
                                     "USD per hour of a Kubernetes GPU node carried by its device-plugin GPUs, its DRA "
                                     "GPUs and its unallocated ones (idle capacity); the allocations of a node add up "
                                     "to its cost to the cent; absent when unpriced", labels=k8s_labels)
        for (node, pool, way), (n, usd) in sorted(self.k8s_allocation.items()):
            k8s_gpus.add_metric([node, pool, way], n)
            if usd is not None:
                k8s_cost.add_metric([node, pool, way], usd)
        at = GaugeMetricFamily("gpufinops_fleet_figures_timestamp_seconds",
                               "Unix time of the tick these fleet figures come from", value=self.at.timestamp())
        return [cost, gpus, verdict, gpus_by, cost_by, counts, unknown_by, idle_month, stops, saved, k8s_gpus, k8s_cost,
                at]


def budget_families(budgets: dict[str, tuple[float, float]]) -> list[GaugeMetricFamily]:
    """budget name -> (spent %, forecast %), from the budgets job (cost.budgets.BudgetStatus)."""
    spent = GaugeMetricFamily("gpufinops_budget_spent_percent", "Budget spent so far this period, percent",
                              labels=["budget"])
    forecast = GaugeMetricFamily("gpufinops_budget_forecast_percent", "Budget forecast at period end, percent",
                                 labels=["budget"])
    for name, (pct, fc) in sorted(budgets.items()):
        spent.add_metric([name], pct)
        forecast.add_metric([name], fc)
    return [spent, forecast]


def team_of(inst: GpuInstance) -> str:
    return inst.team() or NO_TEAM


def _value(v: float) -> str:
    v = float(v)
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def savings_families(by_team: dict[str, tuple[float, int]], at: datetime) -> list[GaugeMetricFamily]:
    """Net saving of this month's real stops by team, as the monthly report counts it (its stops table)."""
    net = GaugeMetricFamily("gpufinops_net_saving_month_to_date",
                            "USD saved this calendar month (UTC) by gpufinops' real stops, net of restarts and false "
                            "stops, as the monthly report counts it; recounted by the savings job", labels=["team"])
    counted = GaugeMetricFamily("gpufinops_net_saving_stops_month_to_date",
                                "Real stops this month behind gpufinops_net_saving_month_to_date", labels=["team"])
    for team, (usd, n) in sorted(by_team.items()):
        net.add_metric([team or NO_TEAM], usd)
        counted.add_metric([team or NO_TEAM], n)
    at_family = GaugeMetricFamily("gpufinops_net_saving_timestamp_seconds",
                                  "Unix time the savings job last counted", value=at.timestamp())
    return [net, counted, at_family]


def render(families: Sequence[GaugeMetricFamily]) -> bytes:
    """The text exposition format (0.0.4) of gauge families, as generate_latest writes it. Called once per tick,
    so a scrape of a large fleet copies bytes instead of formatting 30,000 series (bench/bench_metrics.py)."""
    out: list[str] = []
    for fam in families:
        out.append(f"# HELP {fam.name} {fam.documentation.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n"
                   f"# TYPE {fam.name} gauge\n")
        for sample in fam.samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
            out.append(f"{sample.name}{{{labels}}} {_value(sample.value)}\n" if labels
                       else f"{sample.name} {_value(sample.value)}\n")
    return "".join(out).encode()


class FleetExposition:
    """The latest fleet figures and budget figures, rendered once when they change and appended to the service's
    /metrics at each scrape (a scrape then formats nothing per instance)."""

    def __init__(self) -> None:
        self.figures = FleetFigures()
        self.budgets: dict[str, tuple[float, float]] = {}  # budget -> (spent %, forecast %), leader only
        self._figures_text = b""
        self._budget_text = render(budget_families({}))
        self._savings_text = b""  # no figure until the savings job has counted once

    def set_figures(self, figures: FleetFigures) -> None:
        text = render(figures.families())
        self.figures, self._figures_text = figures, text  # swapped whole: a scrape never sees half a tick

    def note_budgets(self, statuses: Iterable) -> None:
        """The budgets job's BudgetStatus list (cost.budgets.run_budget_check); a budget in error is left out."""
        self.budgets = {s.budget: (s.pct_actual, s.pct_forecast) for s in statuses or () if s.error is None}
        self._budget_text = render(budget_families(self.budgets))

    def note_savings(self, by_team: dict[str, tuple[float, int]] | None, at: datetime) -> None:
        """The savings job's month-to-date net saving and stops by team (run/jobs.month_savings)."""
        self._savings_text = render(savings_families(by_team or {}, at))

    def standby(self) -> None:
        """This process does not hold the lease: it exports no fleet figure. Prometheus scrapes every replica (the
        two-replica recipe in docs/deploy.md), and a standby's copy of the same fleet would double every sum on
        the dashboard; the leader's series are the fleet's, and a new leader exports them from its first tick."""
        self.set_figures(FleetFigures())
        self.budgets, self._budget_text, self._savings_text = {}, render(budget_families({})), b""

    def text(self) -> bytes:
        return self._figures_text + self._budget_text + self._savings_text
