"""Kubernetes GPU workloads: the types every stage shares (`k8s.model`: nodes, pods, workloads, a cluster snapshot).

A floor like gpufinops.model: no I/O, imports nothing of gpufinops but model. The cluster is read by
collect.kubernetes, per-pod GPU usage by collect.k8s_usage, cost shares by costs_k8s, verdicts by
decide.workloads; gpufinops.fleet puts workloads beside EC2 for the tick. See docs/kubernetes.md.
"""
