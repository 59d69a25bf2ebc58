"""Decide: from one window of usage to a verdict with a reason. Pure functions, no I/O.

Owns: `evaluate` (instance, usage, rule, now) -> Decision(verdict, code, reason): IDLE / UNDERUTILIZED / ACTIVE,
or UNKNOWN with the reason the data cannot be trusted (missing, partial, out of range); `escalation`: an
over-budget scope's IDLE verdicts of notify-only rules promoted to the safe stop path (the escalations
themselves are stored by cost.escalations).
`workloads`: the same evaluate over a Kubernetes workload's GPUs (all replicas).
May import: model, rules, metric_ranges, k8s.model. Never imports store, collect, places, notify or act.
Never imports act, notify, pipeline, backtest, cli. The backtest (gpufinops.backtest) sits above and replays the
same predicates (`window_is_idle`, `coverage_ok`), so a backtest verdict is the live verdict.
"""
