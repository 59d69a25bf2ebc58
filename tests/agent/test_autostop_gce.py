"""The agent's GCE self-stop (agent/autostop/gce_stopper.py): who it is from a metadata-server stand-in on 127.0.0.1
(never the real one), the stop sent with that server's token to the GCE stand-in (tests/gcestub.py), one request,
its operation polled, a lost answer read back."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufinops.agent.autostop.gce_stopper import GceStopper, gce_identity
from tests.gcestub import Fault

TOKEN = "ya29.from-metadata"


class Metadata:
    """GCE's metadata server, the paths the agent reads: answered only with `Metadata-Flavor: Google`."""

    def __init__(self, zone="us-central1-a", name="l4-box", project="ml-prod"):
        self.values = {
            "/computeMetadata/v1/project/project-id": project,
            "/computeMetadata/v1/instance/zone": f"projects/123456789/zones/{zone}",
            "/computeMetadata/v1/instance/name": name,
            "/computeMetadata/v1/instance/machine-type": "projects/123456789/machineTypes/g2-standard-8",
            "/computeMetadata/v1/instance/service-accounts/default/token": json.dumps(
                {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}),
        }
        self.asked: list[str] = []
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_GET(self):  # noqa: N802
                meta.asked.append(self.path)
                body = meta.values.get(self.path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    status, body = 403, "Missing Metadata-Flavor:Google header."
                elif body is None:
                    status, body = 404, "not found"
                else:
                    status = 200
                data = body.encode()
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def metadata():
    m = Metadata()
    yield m
    m.server.shutdown()
    m.server.server_close()


def test_identity_from_the_metadata_server(metadata):
    ident = gce_identity(metadata.url)
    assert (ident.project, ident.zone, ident.name, ident.machine_type) == ("ml-prod", "us-central1-a", "l4-box",
                                                                           "g2-standard-8")
    assert ident.instance_id == "gce:ml-prod/us-central1-a/l4-box" and ident.region == "us-central1"
    assert gce_identity("http://127.0.0.1:9", timeout_s=0.5) is None  # nothing listens: not on GCE


def test_stops_itself_once_with_the_metadata_token(metadata, gce):
    gce.token = TOKEN
    gce.add("l4-box")
    stopper = GceStopper(gce_identity(metadata.url), metadata_url=metadata.url, api_endpoint=gce.url, poll_s=0.01)
    outcome = stopper.stop()
    assert outcome.ok is True and gce.status("l4-box") == "TERMINATED"
    assert len(gce.calls("instances.stop")) == 1
    assert all(r.authorization == f"Bearer {TOKEN}" for r in gce.requests)
    assert "/computeMetadata/v1/instance/service-accounts/default/token" in metadata.asked


def test_a_lost_answer_is_read_back_and_a_refusal_is_a_failure(metadata, gce):
    gce.token = TOKEN
    gce.add("l4-box")
    stopper = GceStopper(gce_identity(metadata.url), metadata_url=metadata.url, api_endpoint=gce.url, poll_s=0.01)
    gce.fault("instances.stop", Fault("429"))
    refused = stopper.stop()
    assert refused.ok is False and gce.status("l4-box") == "RUNNING"
    gce.fault("instances.stop", Fault("drop-after"))
    lost = stopper.stop()
    assert lost.ok is True and "read back: stopping" in lost.reason
    assert len(gce.calls("instances.stop")) == 2  # one per intent: the refused one, then the lost one


def test_no_token_no_request(metadata, gce):
    del metadata.values["/computeMetadata/v1/instance/service-accounts/default/token"]
    gce.add("l4-box")
    stopper = GceStopper(gce_identity(metadata.url), metadata_url=metadata.url, api_endpoint=gce.url)
    outcome = stopper.stop()
    assert outcome.ok is False and "not sent" in outcome.reason and gce.requests == []
