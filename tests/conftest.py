"""Shared fixtures: real peers on 127.0.0.1 (Prometheus, VictoriaMetrics, moto server, Slack stub, PostgreSQL, kube-apiserver,
Slurm)."""

import pytest

pytest_plugins = ["tests.promserver", "tests.vmserver", "tests.motoserver", "tests.slackstub", "tests.pgserver",
                  "tests.slurm", "tests.kubestub", "tests.kapi", "tests.gcestub"]


@pytest.fixture(autouse=True)
def _state_dir_in_tmp(tmp_path_factory, monkeypatch):
    """A command run without a config keeps its database in the user's state folder: never the real one."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-state"))
