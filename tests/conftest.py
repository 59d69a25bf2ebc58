"""Shared fixtures: real peers on 127.0.0.1 (Prometheus, moto server, Slack stub)."""

pytest_plugins = ["tests.promserver", "tests.motoserver", "tests.slackstub"]
