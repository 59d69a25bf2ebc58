"""Tests of gpufinops.decide."""
