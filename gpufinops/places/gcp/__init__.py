"""Google Compute Engine as a place: `cloud` (GceCloud: GPU VMs of every zone of the configured projects listed with
the official client, their labels read and written as gpufinops's tags with the label fingerprint, the stop sent once
and its zone operation polled), `labels` (the one encoding of tags as GCE labels: keys, times, text), `machines` (the
GPUs of a machine type or of attached accelerators: a small bundled table with its source).

May import: model, config, prices. Never imports ec2, kubernetes or anything above places.
"""
