"""The last-second window left on EC2 (issue 35): a person stops and starts the machine while gpufinops's
StopInstances is still in flight. The mark survives a stop/start, so under the shipped IAM policy alone the late
request is allowed and stops a machine a person just started. With the optional EventBridge rule's function
(deploy/eventbridge/unmark_on_running.py), or the agent's withdrawal at boot (stop_method: ec2), the mark is
removed when the instance runs again, and AWS refuses the late request.

The EC2 proxy evaluates deploy/iam-policy*.json when the held request finally reaches moto (harness.World).
Standard timeline as in test_matrix: +2 min IDLE -> tag + warning, stop due at +7.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpufinops.agent.autostop.stopper import Ec2Identity, Ec2Stopper
from gpufinops.model import TAG_MARKED
from tests.faults.faultproxy import aws_action
from tests.faults.harness import check_invariants, log_line
from tests.faults.test_matrix import STOP_FAILED, state_of, wait_until
from tests.test_deploy_eventbridge import state_change

pytestmark = pytest.mark.integration

EVENTBRIDGE = Path(__file__).resolve().parents[2] / "deploy" / "eventbridge"


def _eventbridge_function(w, iid: str) -> None:
    spec = importlib.util.spec_from_file_location("unmark_on_running", EVENTBRIDGE / "unmark_on_running.py")
    fn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fn)
    assert fn.handler(state_change(iid), ec2=w.aws.client("ec2"))["removed"]


def _agent_at_boot(w, iid: str) -> None:
    # The agent on the instance, EC2 self-stop configured: its own EC2 client (the instance role), not the service's.
    outcome = Ec2Stopper(Ec2Identity(iid, "us-east-1"), endpoint_url=w.aws.endpoint_url).withdraw_service_mark()
    assert outcome.ok is True and outcome.reason.startswith("removed"), outcome.reason


@pytest.mark.parametrize("withdraw", [_eventbridge_function, _agent_at_boot], ids=["eventbridge", "agent"])
def test_a_stop_landing_after_a_persons_restart_is_refused_once_the_start_withdrew_the_mark(world, withdraw):
    w = world()
    iid = w.ids["idle"]
    w.run(2)
    w.ec2.arm("hold", aws_action("StopInstances"), times=1, seconds=120)
    w.tick(8)  # StopInstances held on the way; the client times out: outcome unconfirmed
    assert w.ec2.stops_reached() == {}
    ec2 = w.aws.client("ec2")
    ec2.stop_instances(InstanceIds=[iid])  # a person stops and starts the machine in the meantime
    ec2.start_instances(InstanceIds=[iid])
    assert TAG_MARKED in w.cloud_state()[iid][1]  # the stop/start kept the mark: IAM alone would allow the stop
    withdraw(w, iid)  # `running`: the mark is withdrawn
    w.ec2.release_held()
    assert wait_until(lambda: w.ec2.iam_denials(aws_action("StopInstances")))
    assert state_of(w, "idle") == "running" and w.ec2.stops_reached() == {}
    w.run(9, 10, 12)
    assert state_of(w, "idle") == "running"
    check_invariants(w, *STOP_FAILED, log_line("unconfirmed|in flight|timed out|timeout|restarted|removed"))


def test_without_either_the_late_stop_lands_what_remains(world):
    # The window docs/deploy.md keeps open without the rule or the agent: the mark survived the restart, so the
    # late request is allowed (the service's re-read ran before it sent the request, not after).
    w = world()
    iid = w.ids["idle"]
    w.run(2)
    w.ec2.arm("hold", aws_action("StopInstances"), times=1, seconds=120)
    w.tick(8)
    ec2 = w.aws.client("ec2")
    ec2.stop_instances(InstanceIds=[iid])
    ec2.start_instances(InstanceIds=[iid])
    w.ec2.release_held()
    assert wait_until(lambda: w.ec2.stops_reached())
    assert w.ec2.iam_denials() == [] and w.ec2.stops_reached() == {iid: 1}
