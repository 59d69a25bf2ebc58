"""The EC2 side of acting safely, against a real moto server (and a fault proxy in front of it):
one HTTP request per mutating call and an honest answer about its fate, read retries that are
logged at once, managed instances (Auto Scaling groups, EKS, Karpenter, Batch...) and spot requests."""

from __future__ import annotations

import logging
from collections import Counter

import boto3
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ParamValidationError,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError

from gpufinops.places.ec2.cloud import (
    ADVICE_ASG,
    ADVICE_BATCH,
    ADVICE_KARPENTER,
    ADVICE_NODE,
    ADVICE_NODEGROUP,
    MANAGED_UNKNOWN,
    CloudError,
    Ec2Cloud,
    TypeInfoCache,
    fate_is_certain,
    manager_from_tags,
    spot_request_type,
)
from gpufinops.config import AwsSettings
from gpufinops.model import TAG_MARKED
from tests.motoserver import Fault

pytestmark = pytest.mark.integration


def make_cloud(endpoint_url: str, **kwargs) -> Ec2Cloud:
    kwargs.setdefault("type_cache", TypeInfoCache())
    kwargs.setdefault("max_attempts", 2)
    kwargs.setdefault("spot_prices", False)
    settings = AwsSettings(regions=("us-east-1",), endpoint_url=endpoint_url)
    return Ec2Cloud(settings, session=boto3.session.Session(region_name="us-east-1"), **kwargs)


def listed(cloud: Ec2Cloud) -> dict:
    return {i.instance_id: i for i in cloud.list_gpu_instances()}


class ApiCalls:
    """API calls (not HTTP attempts) per operation, with their parameters, from botocore's hooks."""

    def __init__(self, session: boto3.session.Session) -> None:
        self.params: list[tuple[str, dict]] = []
        session.events.register("provide-client-params", self._record)

    def _record(self, params, model, **_):
        self.params.append((model.name, dict(params)))

    def of(self, operation: str) -> list[dict]:
        return [p for op, p in self.params if op == operation]


# ---------------------------------------------------------------------- one request per mutating call

# (fault on the wire, EC2 certainly did not do it, the state EC2 really is in afterwards)
STOP_FAULTS = [
    pytest.param(Fault.error(400, "UnsupportedOperation"), True, "running", id="400-unsupported-one-time-spot"),
    pytest.param(Fault.error(400, "IncorrectInstanceState"), True, "running", id="400-incorrect-state"),
    pytest.param(Fault.error(403, "UnauthorizedOperation"), True, "running", id="403-unauthorized"),
    pytest.param(Fault.error(503, "RequestLimitExceeded"), True, "running", id="503-throttled"),
    pytest.param(Fault.error(500, "InternalError", forward=True), False, "stopped", id="500-after-doing-it"),
    pytest.param(Fault.error(503, "Unavailable", forward=True), False, "stopped", id="503-unavailable"),
    pytest.param(Fault.reset(), False, "stopped", id="connection-reset-after-sending"),
    pytest.param(Fault.garbage(), False, "stopped", id="unparsable-answer"),
    pytest.param(Fault.hang(2.5), False, "stopped", id="read-timeout"),
]


@pytest.mark.parametrize("fault, definite, real_state", STOP_FAULTS)
def test_a_failed_stop_is_one_request_and_says_whether_ec2_did_it(aws, fault_proxy, fault, definite, real_state):
    iid = aws.launch("g5.xlarge", tags={"team": "ml"})[0]
    cloud = make_cloud(fault_proxy.endpoint_url, max_attempts=5, read_timeout_s=1.0)
    inst = listed(cloud)[iid]
    fault_proxy.fail("StopInstances", fault, times=10)  # every answer fails: botocore must not try again

    with pytest.raises(CloudError) as err:
        cloud.stop(inst)

    assert fault_proxy.requests["StopInstances"] == 1  # was 6 with the read client's retries
    assert err.value.definite is definite, err.value.fate
    assert err.value.operation == "StopInstances" and iid in str(err.value)
    # The read-back the act stage does after an unknown fate sees what EC2 really did, tags included.
    (fresh,) = cloud.describe([iid])
    assert aws.state(iid) == real_state
    assert fresh.state in ({"stopping", "stopped"} if real_state == "stopped" else {"running"})
    assert fresh.tags == {"team": "ml"}


@pytest.mark.parametrize("operation", ["CreateTags", "DeleteTags", "TerminateInstances"])
def test_every_mutating_call_is_sent_once(aws, fault_proxy, operation):
    iid = aws.launch("g5.xlarge", tags={TAG_MARKED: "2026-01-01T00:00:00Z"})[0]
    cloud = make_cloud(fault_proxy.endpoint_url, max_attempts=5)
    inst = listed(cloud)[iid]
    fault_proxy.fail(operation, Fault.error(500, "InternalError", forward=True), times=10)
    call = {"CreateTags": lambda: cloud.set_tags(inst, {TAG_MARKED: "2026-02-02T00:00:00Z"}),
            "DeleteTags": lambda: cloud.remove_tags(inst, [TAG_MARKED]),
            "TerminateInstances": lambda: cloud.terminate(inst)}[operation]

    with pytest.raises(CloudError) as err:
        call()

    assert fault_proxy.requests[operation] == 1
    assert err.value.definite is False and err.value.code == "InternalError"
    (fresh,) = cloud.describe([iid])
    if operation == "CreateTags":
        assert fresh.tags[TAG_MARKED] == "2026-02-02T00:00:00Z"
    elif operation == "DeleteTags":
        assert TAG_MARKED not in fresh.tags
    else:
        assert fresh.state in ("shutting-down", "terminated")


def test_successful_mutating_calls_are_one_request_each(aws, fault_proxy):
    iid = aws.launch("g5.xlarge")[0]
    cloud = make_cloud(fault_proxy.endpoint_url)
    inst = listed(cloud)[iid]

    cloud.set_tags(inst, {TAG_MARKED: "2026-01-01T00:00:00Z"})
    cloud.remove_tags(inst, [TAG_MARKED])
    cloud.stop(inst)

    assert [fault_proxy.requests[op] for op in ("CreateTags", "DeleteTags", "StopInstances")] == [1, 1, 1]
    assert aws.state(iid) == "stopped"


# ---------------------------------------------------------------------- read retries are visible


def test_throttled_reads_are_logged_at_each_attempt_and_counted_per_run(aws, fault_proxy, caplog):
    iid = aws.launch("g5.xlarge")[0]
    cloud = make_cloud(fault_proxy.endpoint_url, max_attempts=3)
    fault_proxy.fail("DescribeInstances", Fault.error(503, "RequestLimitExceeded"), times=2)

    with caplog.at_level(logging.WARNING, logger="gpufinops.places.ec2.cloud"):
        assert list(listed(cloud)) == [iid]

    assert fault_proxy.requests["DescribeInstances"] == 3  # reads keep their retries
    assert (cloud.last_retries, cloud.last_throttles) == (2, 2)
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert retries == [f"AWS DescribeInstances in us-east-1: attempt {n} of 4 failed: throttled "
                       "(RequestLimitExceeded, HTTP 503); retrying" for n in (1, 2)]
    # The counters are per run: the next listing starts from zero.
    listed(cloud)
    assert (cloud.last_retries, cloud.last_throttles, cloud.total_retries) == (0, 0, 2)


# ---------------------------------------------------------------------- managed instances


def test_auto_scaling_group_members_are_managed_even_without_their_tag(aws, moto_server):
    members = aws.launch_asg("ml-asg", "g5.xlarge", count=2)
    # Tags can be missing or edited: the group is also asked through DescribeAutoScalingInstances.
    aws.client("ec2").delete_tags(Resources=[members[0]], Tags=[{"Key": "aws:autoscaling:groupName"}])
    assert "aws:autoscaling:groupName" not in aws.tags(members[0])
    alone = aws.launch("g5.xlarge")[0]
    session = boto3.session.Session(region_name="us-east-1")
    calls = ApiCalls(session)
    cloud = Ec2Cloud(AwsSettings(regions=("us-east-1",), endpoint_url=moto_server), session=session,
                     type_cache=TypeInfoCache(), spot_prices=False)

    by_id = listed(cloud)

    for iid in members:
        assert by_id[iid].managed_by == "Auto Scaling group 'ml-asg'" and by_id[iid].managed_advice == ADVICE_ASG
    assert (by_id[alone].managed_by, by_id[alone].managed_advice) == ("", "")
    # Only instances no tag names a manager for are asked about.
    (asked,) = calls.of("DescribeAutoScalingInstances")
    assert sorted(asked["InstanceIds"]) == sorted([members[0], alone])
    # describe(), the act stage's read-back, says the same.
    assert [i.managed_by for i in cloud.describe(members + [alone])] == ["Auto Scaling group 'ml-asg'"] * 2 + [""]


def test_auto_scaling_lookup_is_batched_50_ids_a_call(aws, moto_server):
    ids = aws.launch("g5.xlarge", count=51)
    session = boto3.session.Session(region_name="us-east-1")
    calls = ApiCalls(session)
    cloud = Ec2Cloud(AwsSettings(regions=("us-east-1",), endpoint_url=moto_server), session=session,
                     type_cache=TypeInfoCache(), spot_prices=False)

    assert sorted(listed(cloud)) == sorted(ids)
    assert sorted(len(p["InstanceIds"]) for p in calls.of("DescribeAutoScalingInstances")) == [1, 50]


def test_tags_of_other_managers_name_them(aws, moto_server):
    tagged = {
        "eks": ({"eks:nodegroup-name": "gpu-ng", "eks:cluster-name": "prod", "aws:autoscaling:groupName": "eks-gpu-ng-1",
                 "kubernetes.io/cluster/prod": "owned"}, "EKS node group 'gpu-ng' of cluster 'prod'", ADVICE_NODEGROUP),
        "karpenter": ({"karpenter.sh/nodepool": "gpu", "karpenter.k8s.aws/ec2nodeclass": "default",
                       "eks:eks-cluster-name": "prod"}, "Karpenter NodePool 'gpu' of cluster 'prod'", ADVICE_KARPENTER),
        "batch": ({"aws:batch:compute-environment": "x"}, "AWS Batch compute environment 'x'", ADVICE_BATCH),
        "k8s": ({"kubernetes.io/cluster/c": "owned"}, "Kubernetes cluster 'c'", ADVICE_NODE),
    }
    # moto refuses aws:* keys at launch, so those are added as tags afterwards (it allows it, EC2 does not).
    ids = {}
    for name, (tags, _, _) in tagged.items():
        ids[name] = aws.launch("g5.xlarge", tags={k: v for k, v in tags.items() if not k.startswith("aws:")})[0]
        aws_tags = [{"Key": k, "Value": v} for k, v in tags.items() if k.startswith("aws:")]
        if aws_tags:
            aws.client("ec2").create_tags(Resources=[ids[name]], Tags=aws_tags)

    by_id = listed(make_cloud(moto_server))

    for name, (_, by, advice) in tagged.items():
        assert (by_id[ids[name]].managed_by, by_id[ids[name]].managed_advice) == (by, advice), name


def test_a_failing_auto_scaling_api_makes_untagged_instances_managed_unknown_and_logs_once(aws, fault_proxy, caplog):
    plain = aws.launch("g5.xlarge")[0]
    node = aws.launch("g5.xlarge", tags={"kubernetes.io/cluster/c": "owned"})[0]
    cloud = make_cloud(fault_proxy.endpoint_url)
    fault_proxy.fail("DescribeAutoScalingInstances", Fault.error(403, "AccessDenied"), times=2)

    with caplog.at_level(logging.ERROR, logger="gpufinops.places.ec2.cloud"):
        first, second = listed(cloud), listed(cloud)

    for by_id in (first, second):  # the inventory itself did not fail
        assert by_id[plain].managed_by == MANAGED_UNKNOWN and "DescribeAutoScalingInstances" in by_id[plain].managed_advice
        assert by_id[node].managed_by == "Kubernetes cluster 'c'"
    assert cloud.complete
    assert len([r for r in caplog.records if "DescribeAutoScalingInstances" in r.getMessage()]) == 1
    assert listed(cloud)[plain].managed_by == ""  # the API answers again


# ---------------------------------------------------------------------- spot instances


def test_spot_request_type_one_time_persistent_and_unknown(aws, moto_server):
    _, one_time = aws.request_spot("g5.xlarge", request_type="one-time")
    _, persistent = aws.request_spot("g5.xlarge", request_type="persistent")
    # Launched with InstanceMarketOptions: moto keeps no spot request for it, so its type is unknown.
    market = aws.launch("g5.xlarge", spot=True)[0]
    on_demand = aws.launch("g5.xlarge")[0]
    cloud = make_cloud(moto_server)

    by_id = listed(cloud)

    assert {i: (by_id[i].lifecycle, by_id[i].spot_request_type) for i in (one_time, persistent, market, on_demand)} == {
        one_time: ("spot", "one-time"), persistent: ("spot", "persistent"),
        market: ("spot", ""), on_demand: ("on-demand", "")}
    assert {i.instance_id: i.spot_request_type for i in cloud.describe([one_time, persistent])} == {
        one_time: "one-time", persistent: "persistent"}


def test_a_failing_spot_request_lookup_leaves_the_type_unknown(aws, fault_proxy, caplog):
    _, persistent = aws.request_spot("g5.xlarge", request_type="persistent")
    cloud = make_cloud(fault_proxy.endpoint_url)
    fault_proxy.fail("DescribeSpotInstanceRequests", Fault.error(403, "UnauthorizedOperation"))

    with caplog.at_level(logging.ERROR, logger="gpufinops.places.ec2.cloud"):
        inst = listed(cloud)[persistent]

    assert (inst.lifecycle, inst.spot_request_type) == ("spot", "")
    assert any("DescribeSpotInstanceRequests" in r.getMessage() for r in caplog.records)
    assert listed(cloud)[persistent].spot_request_type == "persistent"


# ---------------------------------------------------------------------- pure parts


def _client_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


@pytest.mark.parametrize("exc, definite", [
    (_client_error(400, "UnsupportedOperation"), True),
    (_client_error(400, "IncorrectInstanceState"), True),
    (_client_error(403, "UnauthorizedOperation"), True),
    (_client_error(503, "RequestLimitExceeded"), True),
    (_client_error(400, "Throttling"), True),
    (_client_error(500, "InternalError"), False),
    (_client_error(503, "Unavailable"), False),
    (EndpointConnectionError(endpoint_url="http://x"), True),
    (ConnectTimeoutError(endpoint_url="http://x"), True),
    (ParamValidationError(report="bad"), True),
    (ReadTimeoutError(endpoint_url="http://x"), False),
    (ConnectionClosedError(endpoint_url="http://x"), False),
    (ResponseParserError("bad xml"), False),
    (RuntimeError("something else"), False),
])
def test_fate_is_certain_only_for_refusals_and_requests_never_sent(exc, definite):
    assert fate_is_certain(exc)[0] is definite
    assert CloudError("StopInstances", "i-1", "us-east-1", exc).definite is definite


def test_manager_from_tags_prefers_the_most_specific_manager():
    assert manager_from_tags({}) is None
    assert manager_from_tags({"team": "ml", "Name": "x"}) is None
    cases = {
        "Auto Scaling group 'a'": {"aws:autoscaling:groupName": "a"},
        "EKS node group 'ng' of cluster 'prod'": {"eks:nodegroup-name": "ng", "eks:cluster-name": "prod",
                                                  "aws:autoscaling:groupName": "eks-ng"},
        "Karpenter Provisioner 'old'": {"karpenter.sh/provisioner-name": "old"},
        "Karpenter of cluster 'c'": {"karpenter.k8s.aws/ec2nodeclass": "d", "kubernetes.io/cluster/c": "owned"},
        "AWS ParallelCluster 'hpc'": {"parallelcluster:cluster-name": "hpc", "parallelcluster:node-type": "Compute"},
        "AWS ParallelCluster 'old'": {"aws-parallelcluster-node-type": "Compute", "ClusterName": "old"},
        "SageMaker": {"sagemaker:cluster-name": "h"},
        "EMR cluster 'j-1'": {"aws:elasticmapreduce:job-flow-id": "j-1"},
        "Spot Fleet request 'sfr-1'": {"aws:ec2spot:fleet-request-id": "sfr-1"},
        "EC2 Fleet 'fleet-1'": {"aws:ec2:fleet-id": "fleet-1"},
    }
    assert {by: manager_from_tags(tags).by for by, tags in cases.items()} == {by: by for by in cases}


def test_spot_request_type_of_a_request():
    assert spot_request_type({"Type": "persistent", "State": "active"}) == "persistent"
    assert spot_request_type({"Type": "persistent", "State": "disabled"}) == "persistent"  # its instance is stopped
    assert spot_request_type({"Type": "one-time", "State": "active"}) == "one-time"
    assert spot_request_type({"Type": "persistent", "State": "cancelled"}) == ""
    assert spot_request_type({"State": "active"}) == ""
    assert Counter(spot_request_type({"Type": t}) for t in ("one-time", "weird")) == Counter({"one-time": 1, "": 1})
