"""Several AWS accounts: gpufinops assumes a role in each; moto keeps the accounts apart over real HTTP."""

from __future__ import annotations

import boto3
import pytest

from gpufinops.places.ec2.accounts import MultiAccountCloud, assumed_role_session, build_cloud
from gpufinops.places.ec2.cloud import InventoryError
from gpufinops.config import load_settings
from gpufinops.model import TAG_MARKED

OTHER = "222222222222"
ROLE = f"arn:aws:iam::{OTHER}:role/gpufinops"


def other_account_ec2(aws):
    base = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    return assumed_role_session(base, ROLE, region="us-east-1", endpoint_url=aws.endpoint_url).client(
        "ec2", endpoint_url=aws.endpoint_url)


def test_lists_and_acts_in_each_account(aws):
    own = aws.launch("g5.xlarge", tags={"team": "ml"})[0]
    ec2b = other_account_ec2(aws)
    other = ec2b.run_instances(ImageId=aws.ami(), InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1,
                               TagSpecifications=[{"ResourceType": "instance",
                                                   "Tags": [{"Key": "team", "Value": "llm"}]}])["Instances"][0]["InstanceId"]
    settings = load_settings(aws={"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url, "assume_roles": [ROLE]})
    cloud = build_cloud(settings.aws, spot_prices=False)
    assert isinstance(cloud, MultiAccountCloud)
    by_id = {i.instance_id: i for i in cloud.list_gpu_instances()}
    assert by_id[other].account == OTHER and by_id[own].account != OTHER
    assert cloud.last_errors == []
    # mutating calls go to the account the instance lives in
    cloud.set_tags(by_id[other], {TAG_MARKED: "2026-11-29T12:00:00Z"})
    cloud.stop(by_id[other])
    state = ec2b.describe_instances(InstanceIds=[other])["Reservations"][0]["Instances"][0]
    assert state["State"]["Name"] in ("stopping", "stopped")
    assert {t["Key"] for t in state["Tags"]} >= {TAG_MARKED}
    assert aws.state(own) == "running"
    # reconciliation after a restart: a fresh cloud finds the instance in its account
    fresh = build_cloud(settings.aws, spot_prices=False)
    assert [i.account for i in fresh.describe([other, own])] == [OTHER, by_id[own].account]


def test_an_account_whose_role_fails_does_not_hide_the_others(aws, monkeypatch):
    own = aws.launch("g5.xlarge")[0]
    settings = load_settings(aws={"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url,
                                  "assume_roles": ["not-an-arn"]})
    cloud = build_cloud(settings.aws, spot_prices=False)
    ids = [i.instance_id for i in cloud.list_gpu_instances()]
    assert own in ids
    assert len(cloud.last_errors) == 1 and "not-an-arn" in cloud.last_errors[0].region
    only_bad = load_settings(aws={"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url,
                                  "assume_roles": ["not-an-arn"], "include_own_account": False})
    with pytest.raises(InventoryError):
        build_cloud(only_bad.aws, spot_prices=False).list_gpu_instances()


def test_never_acts_on_an_instance_no_account_listed(aws):
    settings = load_settings(aws={"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url, "assume_roles": [ROLE]})
    cloud = build_cloud(settings.aws, spot_prices=False)
    own = aws.launch("g5.xlarge")[0]
    from dataclasses import replace

    stranger = replace(next(i for i in build_cloud(load_settings(
        aws={"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url}).aws, spot_prices=False).list_gpu_instances()
        if i.instance_id == own))
    with pytest.raises(InventoryError):
        cloud.stop(stranger)  # not listed by this cloud yet: no guessing which account it is in
    assert aws.state(own) == "running"


def test_managed_and_spot_facts_come_from_the_instances_own_account(aws):
    base = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    other = assumed_role_session(base, ROLE, region="us-east-1", endpoint_url=aws.endpoint_url)
    ec2b = other.client("ec2", endpoint_url=aws.endpoint_url)
    ec2b.create_launch_template(LaunchTemplateName="gpu", LaunchTemplateData={"ImageId": aws.ami(), "InstanceType": "g5.xlarge"})
    other.client("autoscaling", endpoint_url=aws.endpoint_url).create_auto_scaling_group(
        AutoScalingGroupName="their-asg", LaunchTemplate={"LaunchTemplateName": "gpu", "Version": "$Latest"},
        MinSize=1, MaxSize=1, DesiredCapacity=1, AvailabilityZones=["us-east-1a"])
    (member,) = [i["InstanceId"] for r in ec2b.describe_instances()["Reservations"] for i in r["Instances"]]
    # Its group tag removed: only the other account's DescribeAutoScalingInstances can tell.
    ec2b.delete_tags(Resources=[member], Tags=[{"Key": "aws:autoscaling:groupName"}])
    _, spot = aws.request_spot("g5.xlarge", request_type="persistent")
    settings = load_settings(aws={"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url, "assume_roles": [ROLE]})
    cloud = build_cloud(settings.aws, spot_prices=False)

    by_id = {i.instance_id: i for i in cloud.list_gpu_instances()}

    assert by_id[member].account == OTHER and by_id[member].managed_by == "Auto Scaling group 'their-asg'"
    assert by_id[spot].spot_request_type == "persistent" and by_id[spot].managed_by == ""
    assert (cloud.last_retries, cloud.last_throttles) == (0, 0)


def test_assume_roles_take_an_external_id_or_a_plain_arn(aws):
    ec2b = other_account_ec2(aws)
    other = ec2b.run_instances(ImageId=aws.ami(), InstanceType="g5.xlarge", MinCount=1,
                               MaxCount=1)["Instances"][0]["InstanceId"]
    settings = load_settings(aws={"regions": ["us-east-1"], "endpoint_url": aws.endpoint_url,
                                  "include_own_account": False,
                                  "assume_roles": [{"arn": ROLE, "external_id": "gpufinops-ext-7731"},
                                                   f"arn:aws:iam::{OTHER}:role/plain"]})
    assert [(r.arn, r.external_id) for r in settings.aws.assume_roles] == [
        (ROLE, "gpufinops-ext-7731"), (f"arn:aws:iam::{OTHER}:role/plain", None)]
    cloud = build_cloud(settings.aws, spot_prices=False)
    assert other in {i.instance_id for i in cloud.list_gpu_instances()} and cloud.last_errors == []


def test_the_external_id_goes_to_sts_assume_role(aws):
    base = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    sent: list[dict] = []
    base.events.register("provide-client-params.sts.AssumeRole", lambda params, **_: sent.append(dict(params)))
    session = assumed_role_session(base, ROLE, region="us-east-1", endpoint_url=aws.endpoint_url,
                                   external_id="gpufinops-ext-7731")
    identity = session.client("sts", endpoint_url=aws.endpoint_url).get_caller_identity()
    assert identity["Account"] == OTHER  # moto answered the AssumeRole; its credentials act in the other account
    assert [(p["RoleArn"], p.get("ExternalId")) for p in sent] == [(ROLE, "gpufinops-ext-7731")]


def test_assume_role_request_sends_external_id_only_when_set():
    from gpufinops.places.ec2.accounts import assume_role_request

    assert assume_role_request(ROLE, "ext-1", 900) == {"RoleArn": ROLE, "RoleSessionName": "gpufinops",
                                                       "DurationSeconds": 900, "ExternalId": "ext-1"}
    assert "ExternalId" not in assume_role_request(ROLE, None, 900)


def test_a_bad_assume_roles_entry_names_the_key(tmp_path):
    from gpufinops.config import ConfigError

    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"aws:\n  assume_roles:\n    - arn: {ROLE}\n      externalid: x\n")
    with pytest.raises(ConfigError, match=r"assume_roles\.0\.externalid"):
        load_settings(cfg)


def test_billing_read_clients_get_the_botocore_config_of_ec2_reads():
    from gpufinops.collect.aws_config import CONNECT_TIMEOUT_S, MAX_ATTEMPTS, READ_TIMEOUT_S, read_client

    settings = load_settings(aws={"regions": ["us-east-1"], "endpoint_url": "http://127.0.0.1:1"})
    for service in ("ce", "athena", "s3", "pricing"):
        config = read_client(settings, service, "us-east-1").meta.config
        # botocore keeps max_attempts (retries) as total_max_attempts (retries + the first attempt).
        assert config.retries == {"mode": "standard", "total_max_attempts": MAX_ATTEMPTS + 1}, service
        assert (config.connect_timeout, config.read_timeout) == (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
