"""`gpufinops costs --by namespace|workload|nodepool`: the Kubernetes cluster's GPU cost as it stands, idle
capacity included, with how the GPUs are shared (docs/kubernetes.md). Reached from `gpufinops.cli.billing`'s
`costs` command."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone

from .common import EXIT_PROBLEM_FOUND, usage_error

K8S_GROUPINGS = ("namespace", "workload", "nodepool")
HOURS_PER_MONTH = 730.0  # as recommend.hours_per_month: a month at this hour's allocation


def cmd_k8s_costs(args: argparse.Namespace) -> int:
    from ..collect.billing.schema import BillingDataError, month_bounds
    from ..places.kubernetes.cluster import ClusterReadFailed
    from ..places.kubernetes.costs import cluster_cents, cost_by
    from ..run.compose import live_cluster_costs
    from ..prices.prices import PriceCatalogError
    from .common import load_settings_from_args

    settings = load_settings_from_args(args)
    if settings.kubernetes is None:
        return usage_error("costs --by namespace|workload reads a Kubernetes cluster: add a `kubernetes:` section "
                           f"to {settings.source_path or 'the config'} (docs/kubernetes.md)")
    if args.output not in ("table", "json", "csv"):
        return usage_error(f"--by {args.by} prints table, json or csv, not {args.output}")
    now = datetime.now(timezone.utc)
    month = args.month if args.month is not None else f"{now:%Y-%m}"  # the cluster is read as it is now
    try:
        start, end = month_bounds(month)
    except BillingDataError as exc:
        return usage_error(str(exc))
    if not start <= now < end:
        return usage_error(f"--by {args.by} reads the cluster as it is now: use --month {now:%Y-%m} "
                           "(past months: billing, --by team|instance)")
    try:
        live = live_cluster_costs(settings, now, hours=1.0)
    except (ClusterReadFailed, PriceCatalogError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM_FOUND
    rows = [{args.by: r[args.by], "usd_per_hour": r["usd"], "usd_per_month_at_this_rate":
             round(r["usd"] * HOURS_PER_MONTH, 2), "gpus": r["gpus"], "pods": r["pods"],
             "unpriced_pods": r["unpriced"], "sharing": r["sharing"], "idle_usd_per_hour": r["idle_cents"] / 100,
             "idle_gpus": r["idle_gpus"], "allocation": r["allocation"]} for r in cost_by(live.shares, args.by)]
    unpriced = sorted(n for n, c in live.node_costs.items() if c is None)
    if unpriced:
        print(f"warning: no price for node {', '.join(unpriced[:5])} (spot or not in the catalog): counted as 0",
              file=sys.stderr)
    total = cluster_cents(live.shares) / 100
    empty = nodes_without_gpu_pods(live.snapshot, live.node_costs) if args.by == "nodepool" else []
    if args.output == "json":
        extra = {"gpu_nodes_without_gpu_pods": empty} if args.by == "nodepool" else {}
        print(json.dumps({"rows": rows, "total_usd_per_hour": total, "read_at": now.isoformat(), **extra},
                         indent=2))
    elif args.output == "csv":
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]) if rows else [args.by])
        writer.writeheader()
        writer.writerows(rows)
    else:
        if not rows:
            print("(no GPU nodes)")
        from .common import render_table

        shown = [{args.by: r[args.by], "usd_per_hour": f"{r['usd_per_hour']:,.2f}",
                  "usd_per_month_at_this_rate": f"{r['usd_per_month_at_this_rate']:,.2f}", "gpus": f"{r['gpus']:g}",
                  "pods": r["pods"], "idle_usd_per_hour": f"{r['idle_usd_per_hour']:,.2f}", "sharing": r["sharing"],
                  "allocation": r["allocation"]} for r in rows]
        if shown:
            print(render_table(shown, list(shown[0]), right=list(shown[0])[1:-2]))
        print(f"total {total:,.2f} $/h across {len(live.snapshot.nodes)} GPU nodes (idle capacity included; "
              f"read {now:%Y-%m-%d %H:%M} UTC from {live.snapshot.server})")
        if empty:
            # One read cannot say for how long a node has had no GPU pod (one may have run and finished since
            # the last look): said so, never "empty for the window".
            print(f"\nGPU nodes with no GPU pod at this read ({len(empty)}; one read cannot say for how long: a rule "
                  "selecting tag k8s:node judges them over its window):")
            shown = [{"node": e["node"], "node_group": e["node_group"] or "-",
                      "usd_per_hour": "unknown" if e["usd_per_hour"] is None else f"{e['usd_per_hour']:,.2f}",
                      "what_to_do": e["what_to_do"]} for e in empty]
            print(render_table(shown, list(shown[0]), right=["usd_per_hour"]))
    return 0


def nodes_without_gpu_pods(snapshot, node_costs) -> list[dict]:
    """The GPU nodes no GPU pod holds at this read, costliest first, with their group and what would remove them
    (decide.workloads: the same advice the service's notices give)."""
    from ..decide.workloads import empty_gpu_nodes, node_advice
    from ..model import Verdict

    found = [v for v in empty_gpu_nodes(snapshot, {}, 0, node_costs) if v.verdict != Verdict.ACTIVE]
    by_name = {n.name: n for n in snapshot.nodes}
    rows = [{"node": v.node, "node_group": f"{v.group_kind} '{v.group}'" if v.group_kind else "",
             "instance_type": v.instance_type, "gpus": v.gpus, "usd_per_hour": v.usd_per_hour,
             "what_to_do": node_advice(by_name[v.node])} for v in found]
    return sorted(rows, key=lambda r: (-(r["usd_per_hour"] or 0), r["node"]))


# --------------------------------------------------------------------------- gpufinops k8s restore (scale to zero)


def register(subparsers) -> None:
    """`gpufinops k8s restore NS/NAME`: scale back a workload gpufinops scaled to zero (docs/kubernetes.md)."""
    from ..k8s.model import KUEUE_JOB_KINDS  # here, not at the top: `costs --by` reads K8S_GROUPINGS only

    k = subparsers.add_parser("k8s", help="Kubernetes GPU workloads: restore one gpufinops scaled to zero")
    ksub = k.add_subparsers(dest="k8s_command", metavar="ACTION")
    r = ksub.add_parser("restore", help="scale a Deployment/StatefulSet back to its replica count before gpufinops "
                                        "scaled it to zero, or resume a Kueue job gpufinops suspended (its Kueue "
                                        "Workload back to spec.active: true), and remove gpufinops' annotations")
    r.add_argument("target", metavar="NS/NAME", help="NAMESPACE/NAME (a Deployment, StatefulSet or Job), or NAMESPACE/KIND/NAME "
                                               f"(KIND also {', '.join(KUEUE_JOB_KINDS)})")
    r.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing "
                                                          "(also the default while act.dry_run is true)")
    r.add_argument("--by", default="", help="who asks, for the audit log and the Event (default: $USER)")
    r.set_defaults(func=cmd_k8s_restore)
    k.set_defaults(func=lambda args: (k.print_help(), 2)[1])


def cmd_k8s_restore(args: argparse.Namespace) -> int:
    import os

    from ..run.compose import live_store
    from ..run.compose import live_workload_cloud
    from ..act.restore import restore_workload
    from .common import load_settings_from_args

    settings = load_settings_from_args(args)
    if settings.kubernetes is None:
        return usage_error(f"k8s restore needs a `kubernetes:` section in {settings.source_path or 'the config'} "
                           "(docs/kubernetes.md)")
    dry_run = bool(args.dry_run or settings.act.dry_run)
    outcome = restore_workload(live_workload_cloud(settings), live_store(settings), args.target,
                               datetime.now(timezone.utc), dry_run=dry_run,
                               who=args.by or os.environ.get("USER", ""))
    print(outcome.message, file=sys.stdout if outcome.ok else sys.stderr)
    return 0 if outcome.ok else EXIT_PROBLEM_FOUND
