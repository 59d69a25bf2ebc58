"""Tests of gpufinops.prices."""
