"""Tests of gpufinops.agent."""
