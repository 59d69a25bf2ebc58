"""Collect: read the world, change nothing. DCGM usage from Prometheus (`prometheus.PromReader` is the one
Prometheus client: the tick, the backtest, right-sizing and places.kubernetes.usage read through it), nvidia-smi/NVML
on a host (`gpu_snapshot`), billing (`billing/`: Cost Explorer, CUR 2.0, Athena, FOCUS 1.0-1.4, Google Cloud's
detailed usage cost export) and the AWS client settings every AWS reader shares (`aws_config`). Where GPUs live (EC2, rented hosts, Kubernetes), and every client
that changes them, is gpufinops.places, one floor up.

May import: model, config, prices (catalog, prices), metric_ranges, procs; store (billing tables only).
Never imports places, decide, act, notify, report or cli. Every failure is an error value or
`errors.QueryFailed`, never a guess: missing data stays missing, so the decide stage can say UNKNOWN.
"""
