"""Tests of gpufinops.report."""
