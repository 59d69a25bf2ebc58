"""Stop this host when it is a GCE VM: one instances.stop on itself, with the token of its own service account from
the metadata server; the stop ends vCPU and GPU billing as a guest poweroff does (docs/agent.md, "On GCE").

Who am I: the metadata server (GET /computeMetadata/v1/... with `Metadata-Flavor: Google`, short timeouts, base URL
injectable, never through a proxy): the project id, the zone, the VM's name and machine type; the access token of
the default service account is asked for right before each stop (it lives about an hour). No answer means "not on
GCE": the host is stopped by the command.

The stop is the service's own client (`places.gcp.cloud.GceCloud`): one request, no retry, its zone operation
polled to DONE; after an error whose outcome is unknown the VM is read back (STOPPING or TERMINATED: it went
through). The VM's service account needs compute.instances.stop and get on itself (and compute.zoneOperations.get).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass

from .defaults import DEFAULT_GCE_METADATA_URL
from .stopper import StopOutcome, _no_proxy_opener

log = logging.getLogger("gpufinops.autostop.stopper")

METADATA_TIMEOUT_S = 1.0
_FLAVOR = {"Metadata-Flavor": "Google"}


@dataclass(frozen=True)
class GceIdentity:
    project: str
    zone: str
    name: str
    machine_type: str = ""

    @property
    def instance_id(self) -> str:
        from ...places.gcp.cloud import subject_id

        return subject_id(self.project, self.zone, self.name)

    @property
    def region(self) -> str:
        from ...places.gcp.cloud import region_of

        return region_of(self.zone)


def _get(base: str, path: str, timeout_s: float) -> str:
    req = urllib.request.Request(f"{base}/computeMetadata/v1/{path}", headers=_FLAVOR)
    with _no_proxy_opener().open(req, timeout=timeout_s) as resp:
        if resp.headers.get("Metadata-Flavor") != "Google":  # anything else answering there is not GCE's server
            raise ValueError("the answer lacks Metadata-Flavor: Google")
        return resp.read().decode().strip()


def gce_identity(base_url: str = DEFAULT_GCE_METADATA_URL, timeout_s: float = METADATA_TIMEOUT_S) -> GceIdentity | None:
    """This VM's project, zone, name and machine type from the metadata server; None when it does not answer."""
    base = base_url.rstrip("/")
    try:
        project = _get(base, "project/project-id", timeout_s)
        zone = _get(base, "instance/zone", timeout_s).rsplit("/", 1)[-1]  # "projects/123/zones/us-central1-a"
        name = _get(base, "instance/name", timeout_s)
        machine_type = _get(base, "instance/machine-type", timeout_s).rsplit("/", 1)[-1]
    except (urllib.error.URLError, OSError, UnicodeDecodeError, ValueError) as exc:
        log.info("no GCE metadata server at %s (%s): not on GCE", base, exc)
        return None
    if not (project and zone and name):
        log.warning("the metadata server at %s gave no usable project/zone/name", base)
        return None
    return GceIdentity(project, zone, name, machine_type)


def metadata_token(base_url: str, timeout_s: float = METADATA_TIMEOUT_S) -> str:
    """The default service account's access token (raises when there is none: nothing is sent without one)."""
    body = json.loads(_get(base_url.rstrip("/"), "instance/service-accounts/default/token", timeout_s))
    token = str(body.get("access_token") or "").strip()
    if not token:
        raise ValueError("the metadata server gave no access token")
    return token


class GceStopper:
    """instances.stop on this VM, with its own service account's token, through GceCloud."""

    def __init__(self, identity: GceIdentity, *, metadata_url: str, api_endpoint: str | None = None,
                 operation_timeout_s: float = 120.0, poll_s: float = 2.0):
        self.identity = identity
        self.metadata_url = metadata_url
        self.api_endpoint = api_endpoint
        self.operation_timeout_s = operation_timeout_s
        self.poll_s = poll_s

    @property
    def describe(self) -> str:
        return f"GCE instances.stop on {self.identity.instance_id}"

    def _cloud(self):
        from google.oauth2.credentials import Credentials

        from ...config import GcpSettings
        from ...places.gcp.cloud import GceCloud

        settings = GcpSettings(projects=(self.identity.project,), api_endpoint=self.api_endpoint,
                               operation_timeout_s=self.operation_timeout_s)
        return GceCloud(settings, credentials=Credentials(token=metadata_token(self.metadata_url)),
                        poll_s=self.poll_s)

    def stop(self) -> StopOutcome:
        from datetime import datetime, timezone

        from ...act.plan import STOPPED_STATES
        from ...model import GpuInstance

        ident = self.identity
        try:
            cloud = self._cloud()
        except Exception as exc:  # noqa: BLE001 - no token, no client: nothing was sent
            return StopOutcome(False, f"instances.stop {ident.instance_id} not sent: {str(exc)[:300]}")
        me = GpuInstance(ident.instance_id, ident.machine_type, ident.region, "running", datetime.now(timezone.utc),
                         account=ident.project, provider="gcp")
        try:
            cloud.stop(me)
        except Exception as exc:  # noqa: BLE001 - any failure is reported, never raised into the loop
            try:
                found = cloud.describe([ident.instance_id])
                state = found[0].state if found else "gone"
            except Exception:  # noqa: BLE001 - unknown stays unknown
                state = None
            if state is not None and (state in STOPPED_STATES or state == "gone"):
                return StopOutcome(True, f"instances.stop {ident.instance_id}: {str(exc)[:200]}; read back: {state}, "
                                         f"so it went through")
            if state is not None and getattr(exc, "definite", False):
                return StopOutcome(False, f"instances.stop {ident.instance_id} failed: {str(exc)[:300]}")
            seen = "the read-back failed" if state is None else f"read back: still {state}"
            return StopOutcome(None, f"instances.stop {ident.instance_id}: outcome unknown ({seen}): {str(exc)[:300]}")
        return StopOutcome(True, f"instances.stop {ident.instance_id} done")
