"""Tests of gpufinops.notify."""
