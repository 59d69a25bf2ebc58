"""Tests of gpufinops.recommend."""
