"""Prices: lookups that collect, places and config use. `catalog` (instance types, GPUs, prices shipped in
gpufinops/data/catalog), `prices` (on-demand prices per type and region), `host_prices` (rented hosts),
`mig` (MIG profiles: slices, memory, SMs per GPU model), `gcp_refresh` (GCP GPU VM prices from the Cloud Billing
Catalog's SKUs, only when asked, overlaid on the bundled ones). A Kubernetes node's cost split over its pods is
places.kubernetes.costs.

May import: model, config. Never imports collect, places, decide, act, notify, store, run or anything above.
"""
