"""Collect: read the world, change nothing. EC2 inventory (one or several accounts), DCGM usage from Prometheus
(`prometheus.PromReader` is the one Prometheus client: the tick, the backtest and right-sizing read through it),
nvidia-smi/NVML on a host, and billing (`billing/`: Cost Explorer, CUR 2.0, Athena, FOCUS).

May import: model, config, catalog, prices, metric_ranges. Never imports decide, act, notify, store (billing
tables excepted), report or cli. Every failure is an error value or `errors.QueryFailed`, never a guess: missing
data stays missing, so the decide stage can say UNKNOWN.
"""
