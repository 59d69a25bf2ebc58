"""Stop this host: on EC2 one StopInstances on its own id, else the configured command (systemctl poweroff).

Who am I: IMDSv2 (PUT /latest/api/token with a TTL header, then GET instance-id, placement/region and
instance-type with that token), short timeouts, base URL injectable. No answer means "not on EC2" (a rented
bare-metal server, another cloud): the host is named by its hostname and stopped by the command.

The EC2 stop is the service's own client, `places.ec2.cloud.Ec2Cloud` (one EC2 stop client): retries off, one
HTTP request per intent (a retried StopInstances whose first answer was lost would be a second stop), never Force
(the OS shuts down cleanly, jobs get their chance to checkpoint), never hibernate; after an error whose outcome is
unknown (a 5xx, a timeout, a lost connection) the instance is read back (`Ec2Cloud.describe`) before anything is
said: stopping/stopped is a stop that went through, running after a refusal is a failure, anything else unknown.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Sequence

from .hook import CommandResult, run_command

log = logging.getLogger("gpufinops.autostop.stopper")

IMDS_TOKEN_TTL_S = 60
IMDS_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Ec2Identity:
    instance_id: str
    region: str
    instance_type: str = ""


def _no_proxy_opener() -> urllib.request.OpenerDirector:
    # IMDS is link-local: an HTTP(S)_PROXY in the environment must never see (or answer) these requests.
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def imds_identity(base_url: str, timeout_s: float = IMDS_TIMEOUT_S) -> Ec2Identity | None:
    """This instance's id, region and type from IMDSv2; None when there is no IMDS (not on EC2) or it refuses."""
    base = base_url.rstrip("/")
    opener = _no_proxy_opener()
    try:
        put = urllib.request.Request(f"{base}/latest/api/token", method="PUT", data=b"",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_S)})
        with opener.open(put, timeout=timeout_s) as resp:
            token = resp.read().decode().strip()

        def get(path: str) -> str:
            req = urllib.request.Request(f"{base}/latest/meta-data/{path}",
                                         headers={"X-aws-ec2-metadata-token": token})
            with opener.open(req, timeout=timeout_s) as resp:
                return resp.read().decode().strip()

        instance_id = get("instance-id")
        region = get("placement/region")
        try:
            instance_type = get("instance-type")
        except (urllib.error.URLError, OSError):
            instance_type = ""
    except (urllib.error.URLError, OSError, UnicodeDecodeError, ValueError) as exc:
        log.info("no EC2 instance metadata at %s (%s): not on EC2", base, exc)
        return None
    if not instance_id.startswith("i-") or not region:
        log.warning("instance metadata at %s gave no usable instance id/region (%r, %r)", base, instance_id, region)
        return None
    return Ec2Identity(instance_id, region, instance_type)


@dataclass(frozen=True)
class StopOutcome:
    ok: bool | None  # None: the outcome is unknown (an ambiguous error, and the read-back could not tell)
    reason: str


class Ec2Stopper:
    """StopInstances on this instance's own id, with the instance role's credentials, through the service's EC2
    client (`Ec2Cloud`: one request, no retries, read back with describe after an ambiguous error)."""

    def __init__(self, identity: Ec2Identity, *, endpoint_url: str | None = None, session=None,
                 timeout_s: float = 10.0):
        from ...config import AwsSettings
        from ...places.ec2.cloud import Ec2Cloud

        self.identity = identity
        self.cloud = Ec2Cloud(AwsSettings(regions=(identity.region,), endpoint_url=endpoint_url), session=session,
                              spot_prices=False, connect_timeout_s=timeout_s, read_timeout_s=timeout_s)

    @property
    def describe(self) -> str:
        return f"EC2 StopInstances on {self.identity.instance_id} ({self.identity.region})"

    def _self(self):
        from datetime import datetime, timezone

        from ...model import GpuInstance

        ident = self.identity
        return GpuInstance(ident.instance_id, ident.instance_type, ident.region, "running",
                           datetime.now(timezone.utc))

    def read_back(self) -> str | None:
        """This instance's EC2 state now ("gone" when EC2 no longer lists it); None when it cannot be read."""
        try:
            found = self.cloud.describe([self.identity.instance_id])
        except Exception as exc:  # noqa: BLE001 - unknown stays unknown
            log.error("read-back of %s failed: %s", self.identity.instance_id, exc)
            return None
        return found[0].state if found else "gone"

    def withdraw_service_mark(self, dry_run: bool = False) -> StopOutcome:
        """Remove the central service's mark (`gpufinops:marked-for-stop`) from this instance, read first: one
        DeleteTags, only when the mark is there. Run once per boot (cli.withdraw_service_mark_at_boot): a person
        who stopped and started the machine cancelled the stop it announced, and with the mark gone the shipped
        IAM policy refuses a StopInstances of the service still in flight (docs/deploy.md)."""
        from ...model import TAG_MARKED

        iid = self.identity.instance_id
        try:
            found = self.cloud.describe([iid])
        except Exception as exc:  # noqa: BLE001 - reported, never raised into the agent's start
            return StopOutcome(None, f"{iid} could not be read: {str(exc)[:200]}")
        if not found or TAG_MARKED not in found[0].tags:
            return StopOutcome(True, f"{iid} carries no {TAG_MARKED}")
        value = found[0].tags[TAG_MARKED]
        if dry_run:  # the agent's dry-run changes nothing, this tag included: it says what it would do
            return StopOutcome(True, f"dry-run: would remove {TAG_MARKED}={value[:64]!r} from {iid}")
        try:
            self.cloud.remove_tags(found[0], [TAG_MARKED])
        except Exception as exc:  # noqa: BLE001 - as above; Ec2Cloud sent it once and says whether it was refused
            return StopOutcome(False if getattr(exc, "definite", False) else None,
                               f"DeleteTags {TAG_MARKED} on {iid} failed: {str(exc)[:300]}")
        return StopOutcome(True, f"removed {TAG_MARKED}={value[:64]!r} from {iid}")

    def stop(self) -> StopOutcome:
        from ...act.plan import STOPPED_STATES, TERMINATED_STATES

        iid = self.identity.instance_id
        try:
            self.cloud.stop(self._self())
        except Exception as exc:  # noqa: BLE001 - any failure is reported, never raised into the loop
            state = self.read_back()
            if state is not None and (state in STOPPED_STATES or state in TERMINATED_STATES or state == "gone"):
                return StopOutcome(True, f"StopInstances {iid}: {str(exc)[:200]}; read back: {state}, so it went "
                                         f"through")
            if state is not None and getattr(exc, "definite", False):
                return StopOutcome(False, f"StopInstances {iid} failed: {str(exc)[:300]}")
            seen = "the read-back failed" if state is None else f"read back: still {state}, the request may be in flight"
            return StopOutcome(None, f"StopInstances {iid}: outcome unknown ({seen}): {str(exc)[:300]}")
        return StopOutcome(True, f"StopInstances {iid} accepted")


class CommandStopper:
    """The configured command, e.g. [systemctl, poweroff] (a polkit rule or sudoers line lets the agent's user)."""

    def __init__(self, argv: Sequence[str], timeout_s: float = 60.0):
        self.argv = tuple(argv)
        self.timeout_s = timeout_s

    @property
    def describe(self) -> str:
        return "command " + " ".join(self.argv)

    def stop(self) -> StopOutcome:
        result: CommandResult = run_command(self.argv, self.timeout_s, what="stop command")
        return StopOutcome(result.ok, result.reason)


# ---------------------------------------------------------------------- Azure: deallocate this VM through ARM

AZURE_IMDS_API = "2021-02-01"
ARM_RESOURCE = "https://management.azure.com/"
# A managed identity token is asked for again this long before it expires.
TOKEN_MARGIN_S = 300


@dataclass(frozen=True)
class AzureIdentity:
    subscription: str
    resource_group: str
    name: str
    location: str
    vm_size: str = ""

    @property
    def arm_id(self) -> str:
        return (f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}/providers/"
                f"Microsoft.Compute/virtualMachines/{self.name}")


def _azure_imds_get(base_url: str, path_and_query: str, timeout_s: float) -> dict:
    import json

    # Azure's IMDS answers only a request with `Metadata: true` and no X-Forwarded-For (no proxy, never forwarded).
    req = urllib.request.Request(f"{base_url.rstrip('/')}{path_and_query}", headers={"Metadata": "true"})
    with _no_proxy_opener().open(req, timeout=timeout_s) as resp:
        return json.loads(resp.read(1024 * 1024).decode())


def azure_imds_identity(base_url: str, timeout_s: float = IMDS_TIMEOUT_S) -> AzureIdentity | None:
    """This VM's subscription, resource group, name, location and size from Azure's IMDS; None when there is none
    (not on Azure) or its answer is not usable."""
    try:
        compute = _azure_imds_get(base_url, f"/metadata/instance/compute?api-version={AZURE_IMDS_API}", timeout_s)
    except (urllib.error.URLError, OSError, UnicodeDecodeError, ValueError) as exc:
        log.info("no Azure instance metadata at %s (%s): not on Azure", base_url, exc)
        return None
    fields = [str(compute.get(k) or "") for k in ("subscriptionId", "resourceGroupName", "name", "location",
                                                    "vmSize")] if isinstance(compute, dict) else []
    if len(fields) != 5 or not all(fields[:3]):
        log.warning("Azure instance metadata at %s gave no usable subscription/group/name", base_url)
        return None
    return AzureIdentity(*fields)


class ImdsManagedIdentity:
    """A TokenCredential: this VM's managed identity token for ARM, from IMDS (`/metadata/identity/oauth2/token`),
    kept until shortly before it expires. The token is never logged."""

    def __init__(self, base_url: str, timeout_s: float = 5.0, client_id: str | None = None):
        self.base_url, self.timeout_s, self.client_id = base_url, timeout_s, client_id
        self._token = None

    def get_token(self, *scopes: str, **_kw):
        import time
        import urllib.parse

        from azure.core.credentials import AccessToken
        from azure.core.exceptions import ClientAuthenticationError

        if self._token is not None and self._token.expires_on - TOKEN_MARGIN_S > time.time():
            return self._token
        query = {"api-version": "2018-02-01", "resource": ARM_RESOURCE}
        if self.client_id:
            query["client_id"] = self.client_id
        try:
            answer = _azure_imds_get(self.base_url, "/metadata/identity/oauth2/token?" +
                                     urllib.parse.urlencode(query), self.timeout_s)
            token = AccessToken(str(answer["access_token"]), int(answer["expires_on"]))
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
            raise ClientAuthenticationError(f"no managed identity token from IMDS: {type(exc).__name__}") from exc
        if not token.token.strip():
            raise ClientAuthenticationError("IMDS answered a blank managed identity token")
        self._token = token
        return token


class AzureStopper:
    """ARM's deallocate of this VM, with its managed identity, through the service's Azure client
    (`places.azure.cloud.AzureCloud`: one request, no retries, the operation followed, read back after an ambiguous
    error). Never a guest shutdown: a VM shut down from inside is "Stopped (allocated)" and still billed, so when
    the deallocate fails the host is left running and the failure said."""

    def __init__(self, identity: AzureIdentity, credential, *, endpoint_url: str | None = None,
                 ca_file: str | None = None, timeout_s: float = 10.0, wait_s: float = 60.0):
        from ...config import AzureSettings
        from ...places.azure.cloud import AzureCloud

        self.identity = identity
        settings = AzureSettings(subscriptions=(identity.subscription,), endpoint_url=endpoint_url, ca_file=ca_file,
                                 connect_timeout_s=timeout_s, read_timeout_s=timeout_s, deallocate_wait_s=wait_s)
        self.cloud = AzureCloud(settings, credential, polling_interval_s=1.0)

    @property
    def describe(self) -> str:
        return f"Azure deallocate of {self.identity.name} ({self.identity.resource_group}, {self.identity.location})"

    def _self(self):
        from datetime import datetime, timezone

        from ...model import GpuInstance, azure_vm_id

        ident = self.identity
        return GpuInstance(azure_vm_id(ident.arm_id), ident.vm_size, ident.location, "running",
                           datetime.now(timezone.utc), provider="azure")

    def read_back(self) -> str | None:
        try:
            found = self.cloud.describe([self._self().instance_id])
        except Exception as exc:  # noqa: BLE001 - unknown stays unknown
            log.error("read-back of %s failed: %s", self.identity.name, exc)
            return None
        return found[0].state if found else "gone"

    def stop(self) -> StopOutcome:
        from ...act.plan import STOPPED_STATES

        name = self.identity.name
        try:
            self.cloud.stop(self._self())
        except Exception as exc:  # noqa: BLE001 - any failure is reported, never raised into the loop
            state = self.read_back()
            if state is not None and (state in STOPPED_STATES or state == "gone"):
                return StopOutcome(True, f"deallocate {name}: {str(exc)[:200]}; read back: {state}, so it went "
                                         f"through")
            if state is not None and getattr(exc, "definite", False):
                return StopOutcome(False, f"deallocate {name} failed: {str(exc)[:300]}; the VM keeps running "
                                          f"(never shut down from inside: it would stay billed)")
            seen = ("the read-back failed" if state is None
                    else f"read back: still {state}, the request may be in flight")
            return StopOutcome(None, f"deallocate {name}: outcome unknown ({seen}): {str(exc)[:300]}")
        return StopOutcome(True, f"deallocate {name} accepted (compute billing ends once it is deallocated)")
