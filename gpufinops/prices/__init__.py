"""Prices: lookups that collect and config use. `catalog` (instance types, GPUs, prices shipped in
gpufinops/data/catalog), `prices` (on-demand prices per type and region), `host_prices` (rented hosts),
`costs_k8s` (a Kubernetes node's cost split over its pods), `mig` (MIG profiles: slices, memory, SMs per GPU model).

May import: model, config, k8s.model. Never imports collect, decide, act, notify, store, run or anything above.
"""
