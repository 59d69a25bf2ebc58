"""Tests of gpufinops.cost."""
