"""Tests of gpufinops.backtest."""
