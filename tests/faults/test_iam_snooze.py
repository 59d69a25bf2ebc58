"""Only a person ends a snooze (issue 35, item 4): under the shipped IAM policy the service can create the snooze
tag where none is set (the first Snooze click) but never rewrite or delete it, so neither a bug nor a crafted
request through the service's own credentials ends a person's snooze with a past time and then stops the machine.

The EC2 proxy evaluates deploy/iam-policy*.json with the instance's tags as moto holds them when the request
arrives (harness.World). Standard timeline as in test_matrix: +2 min IDLE -> tag + warning, stop due at +7.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufinops.model import TAG_MARKED, TAG_SNOOZE
from tests.faults.harness import check_invariants, log_line
from tests.faults.test_last_second import CLICKER, click_snooze, creates_tag, removes_tag
from tests.faults.test_matrix import state_of

pytestmark = pytest.mark.integration


def _stamp(w, minutes: float) -> str:
    return (w.now + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_services_own_client_cannot_end_a_persons_snooze_with_a_past_time(world):
    # A person snoozes the idle instance in the console for 2 h. Then a request through the service's own EC2
    # client (what a bug or a stolen credential would send) writes a past snooze-until, and another removes it:
    # both refused by AWS, the person's value stays, the service keeps the instance running past the lead.
    w = world()
    iid = w.ids["idle"]
    person_set = _stamp(w, 120)
    w.aws.client("ec2").create_tags(Resources=[iid], Tags=[{"Key": TAG_SNOOZE, "Value": person_set}])
    w.run(1)
    service_cloud = w.service.peers.cloud
    [inst] = service_cloud.describe([iid])
    with pytest.raises(Exception, match="UnauthorizedOperation"):
        service_cloud.set_tags(inst, {TAG_SNOOZE: _stamp(w, -60)})
    with pytest.raises(Exception, match="UnauthorizedOperation"):
        service_cloud.remove_tags(inst, [TAG_SNOOZE])
    [write] = w.ec2.iam_denials(creates_tag(TAG_SNOOZE))
    assert write.decision.statements == ("NeverRewriteASnooze",) and write.resource_tags[TAG_SNOOZE] == person_set
    assert [d.decision.statements for d in w.ec2.iam_denials(removes_tag(TAG_SNOOZE))] == [("NeverRemoveASnooze",)]
    assert w.cloud_state()[iid][1][TAG_SNOOZE] == person_set
    w.run(2, 5, 8, 9, 10, 12, 15)
    assert state_of(w, "idle") == "running" and w.ec2.stops_reached() == {}
    assert TAG_MARKED not in w.cloud_state()[iid][1]
    assert w.cloud_state()[iid][1][TAG_SNOOZE] == person_set
    check_invariants(w)


def test_a_second_snooze_click_holds_from_the_record_and_never_tries_the_tag(world):
    # The first click writes the tag (none was set: allowed). The second, asking for longer, is not a tag write
    # that AWS would refuse every tick: the service holds it from its own record; the tag keeps the first value.
    w = world()
    iid = w.ids["idle"]
    w.run(2)  # marked, warned
    first = click_snooze(w, "idle", minutes_from_now=10)
    w.run(3)
    assert w.cloud_state()[iid][1][TAG_SNOOZE] == first and TAG_MARKED not in w.cloud_state()[iid][1]
    writes = len([r for r in w.ec2.seen if creates_tag(TAG_SNOOZE)(r)])
    assert writes == 1
    click_snooze(w, "idle", minutes_from_now=120)
    w.run(5, 8, 12, 15, 20, 25, 30, 40)  # past the first snooze's end and a full lead after it
    assert state_of(w, "idle") == "running" and w.ec2.stops_reached() == {}
    assert w.cloud_state()[iid][1][TAG_SNOOZE] == first  # a person's to change: the service never rewrites it
    assert len([r for r in w.ec2.seen if creates_tag(TAG_SNOOZE)(r)]) == writes
    assert w.ec2.iam_denials() == []  # nothing was tried that AWS had to refuse
    rows = [r for r in w.store.action_rows() if r.kind.value == "snooze"]
    assert len(rows) == 2 and "own record" in rows[-1].reason and CLICKER in rows[-1].reason
    check_invariants(w, log_line("own record", level=20))
