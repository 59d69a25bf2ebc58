"""Tests of gpufinops.collect."""
