"""Tests of gpufinops.act."""
