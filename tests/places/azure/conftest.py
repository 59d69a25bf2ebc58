"""The Azure place's fixtures: the stand-in ARM under the shipped role, a real Prometheus, the tick's world."""

from __future__ import annotations

import pytest

from tests.places.azure.world import World, fleet, start_arm, start_prom, stop_arm


@pytest.fixture()
def arm(tmp_path):
    stub = start_arm(tmp_path)
    yield stub
    stop_arm(stub)


@pytest.fixture(scope="module")
def azure_prom(tmp_path_factory):
    server = start_prom(tmp_path_factory.mktemp("azure-prom"))
    yield server
    server.stop()


@pytest.fixture()
def world(arm, azure_prom, tmp_path):
    fleet(arm)
    return World(arm, azure_prom.url, tmp_path)
