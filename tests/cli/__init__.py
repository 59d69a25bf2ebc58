"""Tests of gpufinops.cli."""
