"""Tests of gpufinops.run."""
