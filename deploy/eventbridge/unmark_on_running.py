"""AWS Lambda target of deploy/eventbridge/unmark-on-running.rule.json: an EC2 instance entered `running`
(a person, or their provisioning, started it), so the stop gpufinops announced on it before is cancelled at the
cloud: its mark `gpufinops:marked-for-stop` is removed, and with the mark gone the shipped IAM policy refuses a
gpufinops StopInstances still in flight (docs/deploy.md, "What is not fenced by IAM").

Standalone (boto3 only, no gpufinops import): deploy it as one file, handler `unmark_on_running.handler`, with the
role policy deploy/eventbridge/iam-unmark-on-running.json. One DescribeTags, and one DeleteTags only when the mark
is there; an error is raised, so the invocation counts as failed (CloudWatch `Errors`) and Lambda retries the
asynchronous invocation EventBridge made (twice by default); a retry is harmless (no mark, no write).
"""

from __future__ import annotations

import logging
import re

MARK = "gpufinops:marked-for-stop"
_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,32}")

log = logging.getLogger("gpufinops.unmark_on_running")
log.setLevel(logging.INFO)


def instance_of(event: dict) -> str | None:
    """The instance id of an "EC2 Instance State-change Notification" for state running, else None."""
    detail = event.get("detail") if isinstance(event, dict) else None
    if not isinstance(detail, dict) or detail.get("state") != "running":
        return None
    iid = detail.get("instance-id")
    return iid if isinstance(iid, str) and _INSTANCE_ID.fullmatch(iid) else None


def handler(event: dict, context=None, ec2=None) -> dict:
    """Remove the gpufinops mark from the instance the event names. `ec2`: a boto3 EC2 client (tests pass one
    for moto); by default one for the event's region."""
    iid = instance_of(event)
    if iid is None:
        log.warning("not an EC2 running-state event: ignored")
        return {"instance": None, "removed": None}
    if ec2 is None:
        import boto3

        ec2 = boto3.client("ec2", region_name=event.get("region") or None)
    tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [iid]}, {"Name": "key", "Values": [MARK]}])
    found = [t["Value"] for t in tags.get("Tags", []) if t.get("Key") == MARK]
    if not found:
        return {"instance": iid, "removed": None}
    ec2.delete_tags(Resources=[iid], Tags=[{"Key": MARK}])
    log.info("%s started: removed %s=%r (a restart cancels the stop gpufinops announced)", iid, MARK, found[0])
    return {"instance": iid, "removed": found[0]}
