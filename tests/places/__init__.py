"""Tests of gpufinops.places: where GPUs live (EC2, rented hosts, Kubernetes) and the fleet over them."""
