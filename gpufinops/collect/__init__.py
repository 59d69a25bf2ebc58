"""Collect: read the world, change nothing. EC2 inventory (one or several accounts), DCGM usage from Prometheus
(`prometheus.PromReader` is the one Prometheus client: the tick, the backtest and right-sizing read through it),
nvidia-smi/NVML on a host (`gpu_snapshot`), Kubernetes (`kubernetes`, `k8s_usage`; `kubernetes_cloud` for the
act stage's changes), rented hosts listed in the config (`static_hosts`), and billing (`billing/`: Cost Explorer,
CUR 2.0, Athena, FOCUS 1.0-1.4).

May import: model, config, prices (catalog, prices, host_prices, costs_k8s), metric_ranges, k8s.model;
decide.workloads for `fleet.WorkloadMetrics`. Never imports decide, act, notify, store (billing
tables excepted), report or cli. Every failure is an error value or `errors.QueryFailed`, never a guess: missing
data stays missing, so the decide stage can say UNKNOWN.
"""
