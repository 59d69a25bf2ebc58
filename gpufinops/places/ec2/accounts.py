"""Several AWS accounts behind one `Cloud`: gpufinops assumes a role in each (AWS Organizations).

Each account gets its own Ec2Cloud over a session whose credentials are the assumed
role's, refreshed by botocore before they expire. Listing goes account by account; an
account that cannot be listed is reported in `last_errors` and the others still are.
Every mutating call goes to the account the instance was listed in, never to another.
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

import boto3
import botocore.session
from botocore.credentials import DeferredRefreshableCredentials

from ...collect.aws_config import read_config
from ...config import AwsSettings
from ...model import GpuInstance
from ..fleet import Listing, RoutedCloud, merge_listings
from .cloud import Ec2Cloud, InventoryError, RegionError

log = logging.getLogger(__name__)

SESSION_NAME = "gpufinops"


def assume_role_request(role_arn: str, external_id: str | None, duration_s: int) -> dict:
    """The AssumeRole parameters: ExternalId only when the role's trust policy asks for one."""
    request = {"RoleArn": role_arn, "RoleSessionName": SESSION_NAME, "DurationSeconds": duration_s}
    if external_id:
        request["ExternalId"] = external_id
    return request


def assumed_role_session(base: boto3.session.Session, role_arn: str, *, region: str,
                         endpoint_url: str | None = None, duration_s: int = 3600,
                         external_id: str | None = None) -> boto3.session.Session:
    """A boto3 session acting as `role_arn`. The role is assumed on first use (so an account whose role
    cannot be assumed fails its own listing, not the service's start) and again before expiry."""
    sts = base.client("sts", region_name=region, endpoint_url=endpoint_url, config=read_config())
    request = assume_role_request(role_arn, external_id, duration_s)

    def fetch() -> dict:
        creds = sts.assume_role(**request)
        c = creds["Credentials"]
        return {"access_key": c["AccessKeyId"], "secret_key": c["SecretAccessKey"], "token": c["SessionToken"],
                "expiry_time": c["Expiration"].isoformat()}

    core = botocore.session.get_session()
    core._credentials = DeferredRefreshableCredentials(  # noqa: SLF001 - botocore's usual pattern for this
        refresh_using=fetch, method="sts-assume-role")
    return boto3.session.Session(botocore_session=core, region_name=region)


class MultiAccountCloud(RoutedCloud):
    """The `Cloud` protocol over several accounts, each an Ec2Cloud labelled by its role or "own"."""

    def __init__(self, clouds: Mapping[str, Ec2Cloud]):
        if not clouds:
            raise ValueError("no accounts to govern")
        self._clouds = dict(clouds)
        self._owner: dict[str, Ec2Cloud] = {}  # instance id -> the account's cloud it was listed in
        self.last_errors: list[RegionError] = []

    def member_clouds(self):
        return list(self._clouds.values())

    def list_gpu_instances(self) -> list[GpuInstance]:
        """Account by account (fleet.merge_listings): an account whose role cannot be assumed must not hide the
        others; every account failing raises InventoryError."""

        def account(label: str, cloud: Ec2Cloud) -> Listing:
            def listed(_before: list[GpuInstance]) -> list[GpuInstance]:
                instances = cloud.list_gpu_instances()
                for inst in instances:
                    self._owner[inst.instance_id] = cloud
                return instances

            def failed(exc: Exception) -> RegionError:
                log.error("EC2 inventory of account %s failed: %s", label, exc)
                return RegionError(f"account {label}", "DescribeInstances", str(exc))

            return Listing(listed, failed=failed, partial=lambda: [
                RegionError(f"account {label}: {e.region}", e.operation, e.message) for e in cloud.last_errors])

        def every_failed(errors: list[RegionError], _last: Exception) -> InventoryError:
            self.last_errors = errors
            return InventoryError("EC2 inventory failed in every account: " + "; ".join(e.message for e in errors))

        found, self.last_errors = merge_listings([account(label, cloud) for label, cloud in self._clouds.items()],
                                                 every_failed=every_failed)
        return found

    @property
    def last_retries(self) -> int:
        """Failed read attempts botocore retried in the last run, over every account."""
        return sum(c.last_retries for c in self._clouds.values())

    @property
    def last_throttles(self) -> int:
        return sum(c.last_throttles for c in self._clouds.values())

    def describe(self, instance_ids: Sequence[str]) -> list[GpuInstance]:
        """Asks every account (after a restart nothing is known yet); any failure raises, as Ec2Cloud does."""
        found: dict[str, GpuInstance] = {}
        for cloud in self._clouds.values():
            for inst in cloud.describe([i for i in instance_ids if i not in found]):
                found[inst.instance_id] = inst
                self._owner[inst.instance_id] = cloud
        return [found[i] for i in instance_ids if i in found]

    def cloud_of(self, inst: GpuInstance) -> Ec2Cloud:
        cloud = self._owner.get(inst.instance_id)
        if cloud is None:
            # Never guess an account for a mutating call.
            raise InventoryError(f"{inst.instance_id} was not listed in any governed account")
        return cloud


def build_cloud(settings: AwsSettings, **ec2_kwargs) -> Ec2Cloud | MultiAccountCloud:
    """One Ec2Cloud for the own account, or a MultiAccountCloud when roles to assume are configured."""
    if not settings.assume_roles:
        return Ec2Cloud(settings, **ec2_kwargs)
    base = boto3.session.Session(profile_name=settings.profile)
    region = settings.regions[0]
    clouds: dict[str, Ec2Cloud] = {}
    if settings.include_own_account:
        clouds["own"] = Ec2Cloud(settings, session=base, **ec2_kwargs)
    for role in settings.assume_roles:
        session = assumed_role_session(base, role.arn, region=region, endpoint_url=settings.endpoint_url,
                                       external_id=role.external_id)
        clouds[role.arn] = Ec2Cloud(settings, session=session, **ec2_kwargs)
    return MultiAccountCloud(clouds)
