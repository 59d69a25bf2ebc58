"""Kubernetes GPU workloads: the types every stage shares (`k8s.model`: nodes, pods, workloads, a cluster snapshot;
`k8s.tags`: the names rules select Kubernetes subjects by, a leaf).

A floor like gpufinops.model: no I/O, imports nothing of gpufinops but model. The cluster is read by
places.kubernetes.cluster, per-pod GPU usage by places.kubernetes.usage, cost shares by places.kubernetes.costs,
verdicts by decide.workloads; places.fleet puts workloads beside EC2 for the tick. See docs/kubernetes.md.
It stays out of places/kubernetes/ because decide/ and rules.py read it, and they stand below places/.
"""
