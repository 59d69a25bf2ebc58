"""deploy/eventbridge/: the optional rule on EC2 state `running` and its target, a small Lambda function that removes
gpufinops's stop mark from a started instance (issue 35: a person's stop+start cancels the stop at the cloud).

The function runs against the moto server (through a counting proxy: one DescribeTags, one DeleteTags only when
the mark is there); the rule's pattern is matched against the event AWS sends by `event_matches` (EventBridge's
rules for exact-value patterns); the function's role policy is decided by the same IAM evaluator as the service's
(tests/faults/iampolicy.py).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import boto3
import pytest

from gpufinops import model
from tests.faults import iampolicy

EVENTBRIDGE = Path(__file__).resolve().parents[1] / "deploy" / "eventbridge"


def _function():
    spec = importlib.util.spec_from_file_location("unmark_on_running", EVENTBRIDGE / "unmark_on_running.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def state_change(iid: str, state: str = "running") -> dict:
    """An "EC2 Instance State-change Notification" as EventBridge delivers it."""
    return {"version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1602", "detail-type":
            "EC2 Instance State-change Notification", "source": "aws.ec2", "account": "123456789012",
            "time": "2026-12-07T10:00:00Z", "region": "us-east-1",
            "resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{iid}"],
            "detail": {"instance-id": iid, "state": state}}


def _client(url: str):
    return boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                 region_name="us-east-1").client("ec2", endpoint_url=url)


def test_the_function_removes_only_the_mark_of_a_started_instance(aws, fault_proxy):
    fn = _function()
    assert fn.MARK == model.TAG_MARKED  # the one name, as the service writes it
    ec2 = _client(fault_proxy.endpoint_url)
    (marked,) = aws.launch("g5.xlarge", tags={model.TAG_MARKED: "2026-12-07T10:05:00Z", "gpufinops:allow-stop": "true",
                                              model.TAG_SNOOZE: "2026-12-08T00:00:00Z"})
    (plain,) = aws.launch("g5.xlarge", tags={"team": "ml"})
    assert fn.handler(state_change(marked), ec2=ec2) == {"instance": marked, "removed": "2026-12-07T10:05:00Z"}
    assert aws.tags(marked) == {"gpufinops:allow-stop": "true", model.TAG_SNOOZE: "2026-12-08T00:00:00Z"}
    assert fault_proxy.requests["DeleteTags"] == 1
    # No mark: nothing to remove, no write. A redelivered event: the same.
    assert fn.handler(state_change(plain), ec2=ec2) == {"instance": plain, "removed": None}
    assert fn.handler(state_change(marked), ec2=ec2)["removed"] is None
    assert fault_proxy.requests["DeleteTags"] == 1 and fault_proxy.requests["DescribeTags"] == 3
    # Anything but a running-state event of an instance id is ignored without a call.
    for event in (state_change(marked, "stopped"), state_change("i-; rm -rf"), {"detail": "x"}, {}):
        assert fn.handler(event, ec2=ec2) == {"instance": None, "removed": None}
    assert fault_proxy.requests["DescribeTags"] == 3
    assert aws.state(marked) == "running"


def event_matches(pattern: dict, event: dict) -> bool:
    """EventBridge's matching for the patterns of exact values deploy/ ships (moto's TestEventPattern answers no
    Result): every field of the pattern must be in the event; a list is the values allowed (ORed), an object
    matches the event's object field by field. Anything else (content filters, prefix, numeric) raises."""
    for key, want in pattern.items():
        if key not in event:
            return False
        if isinstance(want, dict):
            if not isinstance(event[key], dict) or not event_matches(want, event[key]):
                return False
        elif isinstance(want, list) and all(isinstance(v, (str, int, bool)) for v in want):
            if event[key] not in want:
                return False
        else:
            raise ValueError(f"pattern field {key!r}: {want!r} is not implemented here")
    return True


def test_the_rule_matches_a_start_and_nothing_else():
    pattern = json.loads((EVENTBRIDGE / "unmark-on-running.rule.json").read_text())
    assert event_matches(pattern, state_change("i-0abc12345678"))
    for state in ("pending", "stopping", "stopped", "shutting-down", "terminated"):
        assert not event_matches(pattern, state_change("i-0abc12345678", state))
    assert not event_matches(pattern, {**state_change("i-0abc12345678"), "source": "my.app"})
    assert not event_matches(pattern, {**state_change("i-0abc12345678"), "detail-type": "EC2 Spot Instance "
                                                                                          "Interruption Warning"})


@pytest.mark.parametrize("keys, allowed", [
    ([model.TAG_MARKED], True),
    ([model.TAG_SNOOZE], False),
    ([model.TAG_PROTECT], False),
    (["gpufinops:allow-stop"], False),
    ([model.TAG_MARKED, "team"], False),
    ([], False),
])
def test_the_functions_role_may_remove_the_mark_and_nothing_else(keys, allowed):
    policy = iampolicy.load(EVENTBRIDGE / "iam-unmark-on-running.json")
    arn = iampolicy.instance_arn("i-0abc")
    tags = {model.TAG_MARKED: "x", "gpufinops:allow-stop": "true"}
    delete = iampolicy.evaluate(policy, "ec2:DeleteTags", arn, resource_tags=tags,
                                request_tags=iampolicy.request_tag_keys(keys))
    assert delete.allowed is allowed
    assert not iampolicy.evaluate(policy, "ec2:CreateTags", arn, resource_tags=tags,
                                  request_tags={k: "v" for k in keys}).allowed
    for action in ("ec2:StopInstances", "ec2:StartInstances", "ec2:TerminateInstances"):
        assert not iampolicy.evaluate(policy, action, arn, resource_tags=tags).allowed
