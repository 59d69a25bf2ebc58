"""Shared fixtures: real peers on 127.0.0.1 (Prometheus, VictoriaMetrics, moto server, Slack stub, PostgreSQL)."""

pytest_plugins = ["tests.promserver", "tests.vmserver", "tests.motoserver", "tests.slackstub", "tests.pgserver",
                  "tests.kubestub"]
