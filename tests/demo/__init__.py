"""Tests of gpufinops.demo."""
