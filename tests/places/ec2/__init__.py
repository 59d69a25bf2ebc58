"""Tests of gpufinops.places.ec2."""
