"""GPU nodes whose GPU work is gone, judged once per tick after the act stage's main pass (docs/kubernetes.md,
"GPU nodes without GPU work").

The cluster's GPU nodes come from the listing this tick already made (places.kubernetes.cloud.WorkloadCloud);
the watch of GPU-pod-free time (decide.workloads.watch_gpu_free) is kept in the store's key-value table and
stepped only by a tick that read the cluster (a failed read steps nothing, and every node is then UNKNOWN, never
empty). Rules that select nodes (`select.tags` naming `k8s:node`) judge them; the Actuator then notifies, or under
`action: drain` marks, warns and cordons, through its one chokepoint. Node decisions are not written to the
decisions table: the same machine's EC2 row is judged there already, and its cost must not count twice.
"""

from __future__ import annotations

import logging
from typing import Sequence

from ..act.actuator import CHANGE_KINDS, Actuator
from ..places.kubernetes.cluster import ClusterReadFailed
from ..places.kubernetes.cloud import WorkloadCloud
from ..decide.workloads import (
    empty_gpu_nodes, node_decision, still_free, watch_from_json, watch_gpu_free, watch_to_json,
)
from ..k8s.model import NODE_CORDONED_BY_OTHERS, TAG_NODE
from ..model import ActionResult, Rule, RunContext

log = logging.getLogger("gpufinops.kubernetes")

WATCH_KEY = "k8s:node-watch"
# Reads further apart than this many ticks (plus a minute) leave the time between unseen: the free time restarts.
MAX_GAP_TICKS = 2


def workload_cloud_of(cloud) -> WorkloadCloud | None:
    """The cluster side of the tick's cloud (FleetCloud.workloads, or the WorkloadCloud itself), None without one."""
    if isinstance(cloud, WorkloadCloud):
        return cloud
    workloads = getattr(cloud, "workloads", None)
    return workloads if isinstance(workloads, WorkloadCloud) else None


def node_rules(rules: Sequence[Rule]) -> list[Rule]:
    return [r for r in rules if TAG_NODE in r.selector.tags]


def judge_and_act_on_nodes(ctx: RunContext, settings, rules: Sequence[Rule], peers,
                           earlier: Sequence[ActionResult] = ()) -> list[ActionResult]:
    """Step the watch from this tick's listing, judge the GPU nodes under the rules that select them, and hand
    them to the Actuator. Nothing at all without a cluster; the watch is stepped even without such rules, so that
    a rule added later judges on history. `earlier`: this tick's actions so far; their stops count against the one
    stop cap of the run (the node pass never gets a cap of its own)."""
    cloud = workload_cloud_of(peers.cloud)
    if cloud is None:
        return []
    snapshot = cloud.last_snapshot if cloud.listed_ok else None
    watch = watch_from_json(peers.store.get_kv(WATCH_KEY))
    if snapshot is not None:
        max_gap_s = MAX_GAP_TICKS * settings.schedule.evaluate_every_s + 60
        try:
            ended = cloud.cluster.gpu_work_ended_on(still_free(watch, snapshot, max_gap_s))
        except ClusterReadFailed as exc:
            # The free time cannot be believed without the finished pods: nothing stepped, nothing judged.
            log.warning("kubernetes: GPU node watch not stepped this tick (finished pods not read): %s", exc)
            snapshot = None
        else:
            watch = watch_gpu_free(watch, snapshot, max_gap_s, ended)
            peers.store.set_kv(WATCH_KEY, watch_to_json(watch))
    chosen = node_rules(rules)
    if not chosen or snapshot is None:
        if chosen and not cloud.listed_ok:
            log.warning("kubernetes: GPU nodes not judged this tick: the cluster was not listed")
        return []
    # A node someone else cordoned is theirs and not judged; one that still carries a mark of gpufinops' goes to the
    # Actuator all the same, which withdraws the mark and tells its warning's readers (act.plan).
    nodes = [i for i in cloud.list_nodes() if i.is_running or (
        i.state == NODE_CORDONED_BY_OTHERS and peers.store.get_mark(i.instance_id) is not None)]
    decisions = []
    for rule in chosen:
        verdicts = {v.node: v for v in empty_gpu_nodes(snapshot, watch, rule.window_s, cloud.node_costs)}
        decisions += [node_decision(verdicts[i.private_dns], i.instance_id, rule, ctx.now)
                      for i in nodes if i.private_dns in verdicts and rule.selector.matches(i)]
    stops = sum(1 for a in earlier if a.kind in CHANGE_KINDS and a.ok)  # a power-off counts toward the cap too
    return Actuator(peers.cloud, peers.store, peers.notifier, settings).apply(ctx, nodes, decisions, chosen,
                                                                               stops_already=stops)
