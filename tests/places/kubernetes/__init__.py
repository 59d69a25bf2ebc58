"""Tests of gpufinops.places.kubernetes (the Kubernetes API stand-in: tests/kubestub.py)."""
