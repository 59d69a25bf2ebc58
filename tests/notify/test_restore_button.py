"""The Restore button, as notices carry it and as a click names it: only on the notice that gpufinops scaled a
Kubernetes workload to zero, suspended a Kueue job or cordoned a node (never on an EC2 stop, never in dry-run,
never where no click can reach the service), its result line true for each outcome, untrusted text escaped.
End to end (clicks, the tick, the cluster): tests/run/test_k8s_restore_button_e2e.py."""

from __future__ import annotations

import json
import re

import pytest

from gpufinops.config import load_settings
from gpufinops.k8s.model import TAG_KUEUE_WORKLOAD
from gpufinops.model import Action
from gpufinops.notify import messages as m
from gpufinops.notify import slack_blocks as sb
from gpufinops.notify.interact import parse_click
from gpufinops.notify.routing import Deliveries
from tests.notify.test_interact import click_body
from tests.notify.test_messages import EVIL, T0, assert_within_slack_limits, decision, inst

DEPLOYMENT = "k8s:ml/Deployment/idle-infer"
NODE = "k8s:node/gpu-empty"
JOB = "k8s:research/Job/batch-eval"


def k8s(instance_id: str, **tags):
    return inst(instance_id=instance_id, provider="kubernetes", private_dns=instance_id.rsplit("/", 1)[-1],
                tags={"owner": "alice@example.com", "team": "ml", **tags})


SUBJECTS = {
    "ec2_stop": (inst(), Action.STOP, False),
    "ec2_terminate": (inst(), Action.TERMINATE, False),
    "deployment_scaled_to_zero": (k8s(DEPLOYMENT), Action.STOP, True),
    "kueue_job_suspended": (k8s(JOB, **{TAG_KUEUE_WORKLOAD: "research/job-batch-eval-5b8c1"}), Action.SUSPEND, True),
    "node_cordoned": (k8s(NODE), Action.DRAIN, True),
}


@pytest.mark.parametrize("case", sorted(SUBJECTS))
def test_the_restore_button_is_on_live_kubernetes_stop_notices_only(case):
    subject, action, has_button = SUBJECTS[case]
    live = m.stopped(subject, decision(subject.instance_id, action=action), at=T0, channel="#c", dry_run=False,
                     action=action)
    dry = m.stopped(subject, decision(subject.instance_id, action=action), at=T0, channel="#c", dry_run=True,
                    action=action)
    assert live.actions == ((m.RESTORE_ACTION,) if has_button else ())
    assert dry.actions == ()  # nothing was changed, so there is nothing to restore
    blocks = sb.render(live)[1]
    actions = [b for b in blocks if b["type"] == "actions"]
    if has_button:
        [block] = actions
        [button] = block["elements"]
        assert (button["action_id"], button["value"], button["text"]["text"]) == (
            m.RESTORE_ACTION, subject.instance_id, "Restore")
        assert sb.notice_key_of(block["block_id"]) == live.key == m.stop_key(subject.instance_id, T0)
        assert "gpufinops k8s restore" in live.notes[0]  # the command stays, for email readers
        assert_within_slack_limits(live)
    else:
        assert actions == []
    assert [b for b in sb.render(dry)[1] if b["type"] == "actions"] == []


class Chat:
    def __init__(self):
        self.sent = []

    def send(self, notice):
        self.sent.append(notice)
        return True


@pytest.mark.parametrize("interactive", [True, False])
def test_a_button_is_sent_only_where_a_click_can_reach_the_service(interactive, monkeypatch):
    monkeypatch.setenv("GPUFINOPS_TEST_RESTORE_SECRET", "s3cret")
    settings = load_settings(slack={"signing_secret": {"env": "GPUFINOPS_TEST_RESTORE_SECRET" if interactive
                                                       else "GPUFINOPS_TEST_NO_SUCH_SECRET"}})
    subject, action, _ = SUBJECTS["deployment_scaled_to_zero"]
    chat = Chat()
    Deliveries(chat, settings).send(m.stopped(subject, decision(subject.instance_id), at=T0, channel="#c",
                                              dry_run=False, action=action))
    [sent] = chat.sent
    assert sent.actions == ((m.RESTORE_ACTION,) if interactive else ())


def result(status, target="ml/Deployment/idle-infer", **kw):
    base = dict(replicas=3, who="U0ALICE001", detail="", dry_run=status == "would_restore",
                key="restore:k", thread_key="stop:k")
    base.update(kw)
    return m.restore_result(DEPLOYMENT, target, status, **base).text


def test_each_outcome_says_what_happened_and_nothing_more():
    assert result("restored") == f"`{DEPLOYMENT}` restored to 3 replicas by <@U0ALICE001>."
    assert "uncordoned by <@U0ALICE001>" in result("restored", "node/gpu-empty")
    job = result("restored", "research/Job/batch-eval")
    assert "resumed by <@U0ALICE001>" in job and "Kueue queues the job again" in job
    assert "it resumes from its last checkpoint if it wrote one" in job  # never "from where it stopped"
    dry = result("would_restore")
    assert dry.startswith("[DRY-RUN]") and f"would restore `{DEPLOYMENT}` to 3 replicas" in dry and "nothing was changed" in dry
    unknown = result("unknown", detail="HTTP 500")
    assert "not known yet whether it was done" in unknown and "restored" not in unknown.split("audit")[0]
    # Settled later from the state: what it is now, never who did it (a person may have restored it by hand).
    for target, now_is in (("ml/Deployment/idle-infer", "scaled back up"), ("node/gpu-empty", "uncordoned"),
                           ("research/JobSet/pretrain", "resumed (its Kueue Workload is active)")):
        settled = result("settled_restored", target)
        assert settled.endswith(f"it is {now_is} now.") and not re.search(r"(restored|uncordoned|resumed) by", settled)
        assert settled.startswith(f"Restore of `{DEPLOYMENT}` clicked by <@U0ALICE001>: read back")
    failed = result("failed", detail="403 Forbidden")
    assert "was not done: 403 Forbidden" in failed and "restored" not in failed
    assert "was not done" in result("nothing_to_restore", detail="not scaled down by gpufinops")
    notice = m.restore_result(DEPLOYMENT, "ml/Deployment/idle-infer", "restored", replicas=3, who="U0A1",
                              detail="", dry_run=False, key="restore:k", thread_key="stop:k", channel="C1")
    assert (notice.key, notice.thread_key, notice.channel, notice.subject) == ("restore:k", "stop:k", "C1", DEPLOYMENT)


def test_untrusted_text_in_a_result_is_escaped():
    text = result("failed", detail=EVIL, who=EVIL)
    assert "<!channel>" not in text and "<https://" not in text and "&lt;!channel&gt;" in text


def _click(action, subject, block_id=None):
    return parse_click(click_body("U0ALICE001", action, subject, block_id=block_id))


def test_a_click_names_its_notice_only_when_the_block_is_that_subjects_stop_notice():
    key = m.stop_key(DEPLOYMENT, T0)
    assert _click(m.RESTORE_ACTION, DEPLOYMENT, f"{sb.RESTORE_BLOCK_ID}:{key}").notice_key == key
    # Another subject's notice, or any other block, is no place to reply: the result is posted on its own.
    assert _click(m.RESTORE_ACTION, DEPLOYMENT, f"{sb.RESTORE_BLOCK_ID}:{m.stop_key(NODE, T0)}").notice_key == ""
    assert _click(m.RESTORE_ACTION, DEPLOYMENT, "gpufinops_snooze").notice_key == ""
    assert _click(m.RESTORE_ACTION, NODE).instance_id == NODE
    assert _click(m.RESTORE_ACTION, "i-0abc") == "click without a Slack user id or an instance"
    assert _click("gpufinops_snooze_2h", DEPLOYMENT).instance_id == DEPLOYMENT  # a workload's warning is snoozed
    assert _click("gpufinops_snooze_2h", "vol-0abc") == "click without a Slack user id or an instance"


def test_the_notice_edited_in_place_keeps_its_button_only_when_another_click_may_be_needed():
    subject, action, _ = SUBJECTS["deployment_scaled_to_zero"]
    _, blocks = sb.render(m.stopped(subject, decision(subject.instance_id), at=T0, channel="#c", dry_run=False,
                                    action=action))
    text, done = sb.restored_in_place(blocks, "restored", keep_button=False)
    assert text == "restored" and not [b for b in done if b["type"] == "actions"]
    assert done[-1] == {"type": "context", "elements": [{"type": "mrkdwn", "text": "restored"}]}
    _, again = sb.restored_in_place(blocks, "not known yet", keep_button=True)
    assert [b for b in again if b["type"] == "actions"] and len(again) == len(blocks) + 1
    json.dumps(again)


@pytest.mark.parametrize("detail, words", [
    ("kubernetes API at 10.0.0.1:6443: patch deployments ml/idle-infer: 403 Forbidden [not done]",
     "the Kubernetes API: patch deployments ml/idle-infer: 403 Forbidden"),
    ("kubernetes API at kubernetes.default.svc:443: get deployments ml/x: NewConnectionError (no answer or refused)",
     "the Kubernetes API: get deployments ml/x: NewConnectionError (no answer or refused)"),
    ('kubernetes API at k:443: patch deployments ml/x: 500 InternalError: failed calling webhook "v.kyverno.svc": '
     'Post "https://kyverno-svc.kyverno.svc:443/validate?timeout=10s": dial tcp 10.96.0.1:443: connect: refused',
     'failed calling webhook "v.kyverno.svc": Post "[address withheld]": dial tcp [address withheld]: connect'),
    ("HTTPSConnectionPool(host='api.corp.internal', port=6443): Max retries exceeded",
     "HTTPSConnectionPool(host='[address withheld]'): Max retries exceeded"),
    ('Could not connect to the endpoint URL: "https://ec2.eu-west-1.amazonaws.com/"',
     'Could not connect to the endpoint URL: "[address withheld]"'),
    ("api.corp.internal:6443 and [fd00::1]:6443 and 192.168.7.9 refused",
     "[address withheld] and [address withheld] and [address withheld] refused"),
    ("no route to 10.96.0.1. Retried.", "no route to [address withheld]. Retried."),
])
def test_a_results_error_text_reaches_chat_without_any_address(detail, words):
    """The Restore reply says what failed in words; the API server's (or a webhook's) address and port stay in the
    log (issue 35). Times, versions and file paths are left as they are."""
    for status in ("failed", "unknown", "nothing_to_restore"):
        text = result(status, detail=detail)
        assert words in text, text
        assert not re.search(r"\b\d{1,3}(\.\d{1,3}){3}\b|https?://|\.svc:|\.internal|:6443\b|:443\b", text), text
    kept = "at 2026-12-07 06:27 UTC (version 1.29): see deploy/kubernetes/workloads/rbac-clusterrole.yaml"
    assert kept in result("failed", detail=kept)


def test_a_snooze_tag_write_error_reaches_chat_without_any_address():
    notice = m.snooze_not_applied("i-0abc", user_id="U0ALICE001", until=T0, key="k",
                                  error='Could not connect to the endpoint URL: "https://ec2.internal.corp:8443/"')
    assert "[address withheld]" in notice.text and "internal.corp" not in notice.text and "8443" not in notice.text
