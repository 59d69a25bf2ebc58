"""Local autostop on an Azure VM (issue 39): the VM deallocates itself through ARM with its managed identity (the
token from IMDS), never a guest shutdown (which would leave it "Stopped (allocated)", still billed). A stand-in of
Azure's IMDS on 127.0.0.1 (instance metadata and the identity token, each only with `Metadata: true`) and the
stand-in ARM (tests/armstub.py, under the shipped custom role)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from gpufinops.agent.autostop.machine import MoveKind
from gpufinops.agent.autostop.stopper import AzureStopper, ImdsManagedIdentity, azure_imds_identity
from tests.agent.test_autostop_loop import Host
from tests.armstub import TOKEN, Vm
from tests.places.azure.world import ROOT, SUB, start_arm, stop_arm

pytestmark = pytest.mark.integration
DEALLOCATE = "Microsoft.Compute/virtualMachines/deallocate/action"


class AzureImds:
    def __init__(self, name: str = "gpu-vm-1"):
        self.name = name
        self.requests: list[tuple[str, bool]] = []  # (path, had Metadata: true)
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                ok = self.headers.get("Metadata") == "true" and not self.headers.get("X-Forwarded-For")
                parts = urlsplit(self.path)
                imds.requests.append((parts.path, ok))
                if not ok:
                    return self._answer(400, {"error": "Bad request. Required metadata header not specified"})
                if parts.path == "/metadata/instance/compute":
                    return self._answer(200, {"subscriptionId": SUB, "resourceGroupName": "ml", "name": imds.name,
                                              "location": "eastus", "vmSize": "Standard_NC24ads_A100_v4",
                                              "azEnvironment": "AzurePublicCloud"})
                if parts.path == "/metadata/identity/oauth2/token":
                    if parse_qs(parts.query).get("resource") != ["https://management.azure.com/"]:
                        return self._answer(400, {"error": "invalid_resource"})
                    return self._answer(200, {"access_token": TOKEN, "expires_on": str(int(time.time()) + 3600),
                                              "resource": "https://management.azure.com/", "token_type": "Bearer"})
                self._answer(404, {"error": "not found"})

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def imds():
    stub = AzureImds()
    yield stub
    stub.close()


@pytest.fixture
def arm(tmp_path):
    # Under the VM's own role (deploy/azure/gpufinops-self-deallocate-role.json): every request must be in it.
    stub = start_arm(tmp_path)
    stub.role = json.loads((ROOT / "deploy" / "azure" / "gpufinops-self-deallocate-role.json").read_text())
    stub.add(Vm(SUB, "ml", "gpu-vm-1", "Standard_NC24ads_A100_v4"))
    yield stub
    stop_arm(stub)


@pytest.fixture
def host(tmp_path, monkeypatch):
    h = Host(tmp_path, monkeypatch)
    yield h
    if h.loop is not None:
        h.loop.buffer.close()


def test_azure_identity_and_token_come_from_imds_with_the_metadata_header(imds):
    ident = azure_imds_identity(imds.url)
    assert (ident.subscription, ident.resource_group, ident.name, ident.location) == (SUB, "ml", "gpu-vm-1", "eastus")
    token = ImdsManagedIdentity(imds.url).get_token("https://management.azure.com/.default")
    assert token.token == TOKEN
    assert all(ok for _path, ok in imds.requests)
    assert azure_imds_identity("http://127.0.0.1:9", timeout_s=0.5) is None  # nothing listens: not on Azure


def settings_for(imds, arm) -> str:
    return f"stop_method: azure\nimds_url: {imds.url}\narm_endpoint_url: {arm.url}\narm_ca_file: {arm.ca_file}\n"


def test_an_idle_azure_vm_deallocates_itself_once_never_a_guest_shutdown(host, imds, arm):
    host.write_settings(settings_for(imds, arm))
    loop = host.start()
    assert loop.host.instance_id == f"azure:{SUB}/ml/gpu-vm-1" and not loop.host.on_ec2
    host.until(MoveKind.WARN)
    assert host.sample().kind is MoveKind.STOP
    assert host.calls("hook") == [[str(host.bin / "hook"), "--save"]]
    assert host.calls("stop") == []  # never the configured poweroff: it would stay billed
    assert len(arm.seen(DEALLOCATE)) == 1 and arm.seen("Microsoft.Compute/virtualMachines/powerOff/action") == []
    assert arm.vm("gpu-vm-1").power in ("deallocating", "deallocated")
    assert "deallocate" in host.walls()[-1]
    assert ("/metadata/identity/oauth2/token", True) in imds.requests


def test_a_refused_deallocate_leaves_the_vm_running_and_never_falls_back_to_a_shutdown(host, imds, arm):
    arm.arm(lambda s: s.action == DEALLOCATE, "status", status=409)
    host.write_settings(settings_for(imds, arm))
    host.start()
    host.until(MoveKind.WARN)
    host.sample()
    assert len(arm.seen(DEALLOCATE)) == 1 and host.calls("stop") == []
    assert arm.vm("gpu-vm-1").power == "running"
    assert "stop failed" in host.walls()[-1]


def test_a_lost_deallocate_answer_is_read_back(arm, imds):
    arm.arm(lambda s: s.action == DEALLOCATE, "after_effect")
    stopper = AzureStopper(azure_imds_identity(imds.url), ImdsManagedIdentity(imds.url), endpoint_url=arm.url,
                           ca_file=arm.ca_file, wait_s=2.0)
    outcome = stopper.stop()
    assert outcome.ok is True and "read back" in outcome.reason
    assert len(arm.seen(DEALLOCATE)) == 1
