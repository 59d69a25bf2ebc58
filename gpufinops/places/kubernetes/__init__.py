"""Kubernetes as a place (docs/kubernetes.md): `cluster` (the reader: paged lists of nodes, pods and their owners,
one ClusterSnapshot; a failed call raises, never "no pods"), `dra` (DRA's ResourceSlices, ResourceClaims,
DeviceClasses and ResourceClaimTemplates: which devices each node publishes and each pod holds: pure), `usage`
(per-pod GPU usage from dcgm-exporter's Kubernetes labels, through collect.prometheus), `costs` (a node's cost split
over its pods by the GPUs they hold, the rest idle capacity), `cloud` (WorkloadCloud: each GPU workload and node as a GpuInstance; scale to zero,
Kueue suspend, cordon, and restore, each one preconditioned patch), and beneath it `names` (ids, annotations,
Events, patches, errors: pure), `owners` (who else owns a workload: HPA, KEDA, Argo CD, Flux, Kueue: pure) and
`nodes` (GPU nodes as subjects, cordon / uncordon: the cloud's node half, which never imports `cloud`). The types every stage shares stay in
gpufinops.k8s.model (a floor of its own: decide and rules read them, and they stand below places).

May import: model, config, k8s.model, prices (mig), collect (errors, prometheus), decide.workloads.
Never imports places.ec2, places.hosts, places.fleet or anything above places.
"""
