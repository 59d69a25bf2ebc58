"""Azure as a place: `cloud` (AzureCloud: VMs with GPU sizes listed across the configured subscriptions with the
official ARM clients, and the instances of Uniform GPU scale sets (never changed), their power state, tags, scale
set or service that manages them; tags written with the Tags API, the stop a deallocate, each mutating call sent
once and read back; `WithAzure` puts them beside another inventory), `sizes` (the bundled size table: GPU model,
count, on-demand and spot price per region).

May import: model, config, places.ec2.cloud (CloudError, InventoryError), places.fleet (RoutedCloud, the listing
merge), places.registry. Never imports kubernetes or anything above places.
"""
