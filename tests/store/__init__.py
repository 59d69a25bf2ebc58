"""Tests of gpufinops.store."""
