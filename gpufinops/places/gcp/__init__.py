"""Google Compute Engine as a place: `cloud` (GceCloud: GPU VMs of every zone of the configured projects listed with
the official client, their labels read and written as gpufinops's tags with the label fingerprint, the stop sent once
and its zone operation polled), `labels` (the one encoding of tags as GCE labels: keys, times, text), `machines` (the
GPUs of a machine type or of attached accelerators: a small bundled table with its source), `fleet` (WithGce: GCE VMs
beside the other places, a change routed by the `gce:` id), `billing_catalog` (the Cloud Billing Catalog's page reader
for prices.gcp_refresh, used only by `recommend --refresh-prices`). Prices: the bundled catalog's GCP rows (VM and GPUs,
on-demand and spot, with their source and date: gpufinops/data/catalog/SOURCES.md); an N1 VM with attached GPUs in
parts, as GCE bills it (its machine type + each GPU: the catalog's gcp_parts.csv).

May import: model, config, prices, places.fleet and places.registry. Never imports ec2, kubernetes or anything
above places.
"""
