"""The IAM evaluator the fault proxy enforces: AWS semantics, and the shipped policies decided request by request."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufinops import model
from tests.faults import iampolicy
from tests.faults.iampolicy import ALLOW, DENY, IMPLICIT_DENY, PolicyError, evaluate, instance_arn

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
POLICY = iampolicy.load(DEPLOY / "iam-policy.json")
WITH_TERMINATE = iampolicy.load(DEPLOY / "iam-policy.json", DEPLOY / "iam-policy-terminate.json")
TERMINATE_ONLY = iampolicy.load(DEPLOY / "iam-policy-terminate.json")
OPT_IN = "gpufinops:allow-stop"
ARN = instance_arn("i-0abc", "eu-west-1", "111111111111")
MARK = {model.TAG_MARKED: "2026-01-01T00:00:00Z"}


def _stmt(effect="Allow", action="ec2:StopInstances", resource="*", condition=None, **extra) -> dict:
    s = {"Sid": "T", "Effect": effect, "Action": action, "Resource": resource, **extra}
    if condition is not None:
        s["Condition"] = condition
    return s


# ---------------------------------------------------------------------- the shipped policies

@pytest.mark.parametrize("tags, stop, terminate", [
    ({OPT_IN: "true", **MARK}, ALLOW, ALLOW),
    ({OPT_IN: "true", model.TAG_MARKED: ""}, ALLOW, ALLOW),  # present, even empty: Null is false
    ({OPT_IN: "true"}, IMPLICIT_DENY, IMPLICIT_DENY),  # the mark was removed: the stop in flight is fenced
    ({**MARK}, IMPLICIT_DENY, IMPLICIT_DENY),  # not opted in
    ({OPT_IN: "false", **MARK}, IMPLICIT_DENY, IMPLICIT_DENY),
    ({OPT_IN: "True", **MARK}, IMPLICIT_DENY, IMPLICIT_DENY),  # StringEquals is case-sensitive
    ({"GPUFINOPS:ALLOW-STOP": "true", **MARK}, IMPLICIT_DENY, IMPLICIT_DENY),  # the tag key as written
    ({"gpufinops:Marked-For-Stop": "x", OPT_IN: "true"}, IMPLICIT_DENY, IMPLICIT_DENY),
    ({}, IMPLICIT_DENY, IMPLICIT_DENY),
    ({OPT_IN: "true", **MARK, model.TAG_PROTECT: "yes"}, DENY, DENY),
    ({OPT_IN: "true", **MARK, model.TAG_PROTECT: ""}, DENY, DENY),  # any value but false protects
    ({OPT_IN: "true", **MARK, model.TAG_PROTECT: "FALSE"}, ALLOW, ALLOW),
    ({OPT_IN: "true", model.TAG_PROTECT: "true"}, DENY, DENY),  # explicit deny, with or without the allow
])
def test_stop_and_terminate_need_opt_in_and_the_mark_and_no_protect(tags, stop, terminate):
    assert evaluate(POLICY, "ec2:StopInstances", ARN, resource_tags=tags).effect == stop
    assert evaluate(WITH_TERMINATE, "ec2:TerminateInstances", ARN, resource_tags=tags).effect == terminate
    assert evaluate(TERMINATE_ONLY, "ec2:TerminateInstances", ARN, resource_tags=tags).effect == terminate
    # The default policy never terminates; the terminate file never stops.
    assert evaluate(POLICY, "ec2:TerminateInstances", ARN, resource_tags=tags).effect != ALLOW
    assert evaluate(TERMINATE_ONLY, "ec2:StopInstances", ARN, resource_tags=tags).effect != ALLOW


@pytest.mark.parametrize("keys, create, delete", [
    ([model.TAG_MARKED], ALLOW, ALLOW),
    ([model.TAG_STOPPED_BY, model.TAG_STOPPED_REASON], ALLOW, ALLOW),
    ([model.TAG_STOP_REQUESTED], ALLOW, ALLOW),
    ([model.TAG_SNOOZE], ALLOW, DENY),  # the Snooze button writes it where none is set; only a person removes it
    (["GPUFINOPS:SNOOZE-UNTIL"], IMPLICIT_DENY, DENY),
    ([model.TAG_MARKED, model.TAG_SNOOZE], IMPLICIT_DENY, DENY),  # a snooze is written alone, by its own statement
    ([model.TAG_PROTECT], DENY, DENY),
    (["GPUFINOPS:Protect"], DENY, DENY),
    ([model.TAG_MARKED, model.TAG_PROTECT], DENY, DENY),
    ([OPT_IN], DENY, DENY),  # the service cannot opt an instance in (or out)
    (["Gpufinops:Allow-Stop"], DENY, DENY),
    (["gpufinops:other"], IMPLICIT_DENY, IMPLICIT_DENY),
    (["team"], IMPLICIT_DENY, IMPLICIT_DENY),
    ([model.TAG_MARKED, "team"], IMPLICIT_DENY, IMPLICIT_DENY),
    ([], IMPLICIT_DENY, IMPLICIT_DENY),  # Null: false, no vacuous "for all values of none"
])
def test_tag_writes_of_each_key(keys, create, delete):
    tags = {OPT_IN: "true", **MARK}
    assert evaluate(POLICY, "ec2:CreateTags", ARN, resource_tags=tags,
                    request_tags={k: "v" for k in keys}).effect == create, keys
    assert evaluate(POLICY, "ec2:DeleteTags", ARN, resource_tags=tags,
                    request_tags=iampolicy.request_tag_keys(keys)).effect == delete, keys
    # The terminate file grants no tag writes of its own.
    assert evaluate(TERMINATE_ONLY, "ec2:CreateTags", ARN, request_tags={k: "v" for k in keys}).effect == IMPLICIT_DENY


SNOOZED = {OPT_IN: "true", **MARK, model.TAG_SNOOZE: "2026-01-01T12:00:00Z"}


@pytest.mark.parametrize("tags, create", [
    ({OPT_IN: "true", **MARK}, ALLOW),  # the first click: no snooze on the instance yet
    ({OPT_IN: "true"}, ALLOW),
    ({}, ALLOW),  # a snooze only keeps an instance running: no opt-in needed to write one
    (SNOOZED, DENY),  # a second click, or an attempt to end a person's snooze with a past time: refused
    ({**SNOOZED, model.TAG_SNOOZE: "2000-01-01T00:00:00Z"}, DENY),  # an expired one is a person's to change too
    ({**SNOOZED, model.TAG_SNOOZE: ""}, DENY),  # present with an empty value: Null is false
])
def test_a_snooze_is_written_only_where_none_is_set(tags, create):
    for value in ("2000-01-01T00:00:00Z", "2099-01-01T00:00:00Z"):  # the value written does not matter
        decision = evaluate(POLICY, "ec2:CreateTags", ARN, resource_tags=tags, request_tags={model.TAG_SNOOZE: value})
        assert decision.effect == create, (tags, value)
        if create == DENY:
            assert decision.statements == ("NeverRewriteASnooze",)
        # In any letter case of the key the request names, never over an existing snooze.
        assert evaluate(POLICY, "ec2:CreateTags", ARN, resource_tags=tags,
                        request_tags={"GPUFINOPS:Snooze-Until": value}).effect != ALLOW
    # ... and never removed, set or not.
    assert evaluate(POLICY, "ec2:DeleteTags", ARN, resource_tags=tags,
                    request_tags=iampolicy.request_tag_keys([model.TAG_SNOOZE])).effect == DENY


def test_the_snooze_fence_does_not_touch_the_other_tag_writes():
    # An instance with a snooze still gets its mark removed, and its stop record written.
    for keys in ([model.TAG_MARKED], [model.TAG_STOPPED_BY, model.TAG_STOPPED_REASON]):
        assert evaluate(POLICY, "ec2:CreateTags", ARN, resource_tags=SNOOZED,
                        request_tags={k: "v" for k in keys}).effect == ALLOW
        assert evaluate(POLICY, "ec2:DeleteTags", ARN, resource_tags=SNOOZED,
                        request_tags=iampolicy.request_tag_keys(keys)).effect == ALLOW


def test_reads_and_what_the_policy_never_grants():
    assert evaluate(POLICY, "ec2:DescribeInstances", "*").effect == ALLOW
    assert evaluate(POLICY, "EC2:describeinstances", "*").effect == ALLOW  # actions are case-insensitive
    for action in ("ec2:StartInstances", "ec2:RunInstances", "ec2:ModifyInstanceAttribute", "iam:PassRole"):
        assert evaluate(WITH_TERMINATE, action, ARN, resource_tags={OPT_IN: "true", **MARK}).effect == IMPLICIT_DENY
    # A volume is not an instance: the instance-scoped tag statement does not match it.
    vol = "arn:aws:ec2:eu-west-1:111111111111:volume/vol-1"
    assert evaluate(POLICY, "ec2:CreateTags", vol, request_tags={model.TAG_MARKED: "x"}).effect == IMPLICIT_DENY


# ---------------------------------------------------------------------- AWS semantics

@pytest.mark.parametrize("condition, tags, request_tags, allowed", [
    ({"StringEquals": {"aws:ResourceTag/a": ["x", "y"]}}, {"a": "y"}, None, True),  # values ORed
    ({"StringEquals": {"aws:ResourceTag/a": "x", "aws:ResourceTag/b": "x"}}, {"a": "x"}, None, False),  # keys ANDed
    ({"StringEquals": {"aws:ResourceTag/a": "x"}, "Null": {"aws:ResourceTag/b": "true"}}, {"a": "x"}, None, True),
    ({"StringNotEquals": {"ec2:ResourceTag/a": "x"}}, {}, None, True),  # negated: absent key holds
    ({"StringNotEquals": {"ec2:ResourceTag/a": ["x", "y"]}}, {"a": "y"}, None, False),
    ({"StringEqualsIgnoreCase": {"aws:ResourceTag/a": "X"}}, {"a": "x"}, None, True),
    ({"StringNotEqualsIgnoreCase": {"aws:ResourceTag/a": "X"}}, {"a": "x"}, None, False),
    ({"StringLike": {"aws:ResourceTag/a": "ab*c?"}}, {"a": "abzzcd"}, None, True),
    ({"StringLike": {"aws:ResourceTag/a": "ab*"}}, {"a": "Abc"}, None, False),
    ({"StringEqualsIfExists": {"aws:ResourceTag/a": "x"}}, {}, None, True),
    ({"StringEqualsIfExists": {"aws:ResourceTag/a": "x"}}, {"a": "y"}, None, False),
    ({"Bool": {"aws:ResourceTag/a": True}}, {"a": "TRUE"}, None, True),
    ({"Bool": {"aws:ResourceTag/a": "true"}}, {"a": "no"}, None, False),
    ({"ForAllValues:StringEquals": {"aws:TagKeys": ["a", "b"]}}, {}, {"a": "1", "b": "2"}, True),
    ({"ForAllValues:StringEquals": {"aws:TagKeys": ["a"]}}, {}, {"a": "1", "c": "2"}, False),
    ({"ForAllValues:StringEquals": {"aws:TagKeys": ["a"]}}, {}, None, True),  # vacuous: no tag keys
    ({"ForAnyValue:StringEquals": {"aws:TagKeys": ["a"]}}, {}, None, False),
    ({"ForAnyValue:StringLike": {"aws:TagKeys": ["x*"]}}, {}, {"q": "", "xy": ""}, True),
    ({"ForAnyValue:StringNotEquals": {"aws:TagKeys": ["a"]}}, {}, {"a": "", "b": ""}, True),
    ({"ForAllValues:StringNotEquals": {"aws:TagKeys": ["a"]}}, {}, {"a": "", "b": ""}, False),
    ({"Null": {"aws:TagKeys": "false"}}, {}, {}, False),  # an empty tag list is an absent key
    ({"StringEquals": {"aws:RequestTag/k": "v"}}, {}, {"k": "v"}, True),
    ({"StringEquals": {"aws:RequestTag/k": "v"}}, {}, {"k": None}, False),  # DeleteTags carries no value
    ({"StringEquals": {"AWS:RESOURCETAG/a": "x"}}, {"a": "x"}, None, True),  # key names: any case
    ({"Null": {"aws:ResourceTag/a": "true"}}, {}, None, True),  # Null on a resource tag: is it absent?
    ({"Null": {"aws:ResourceTag/a": "true"}}, {"a": "x"}, None, False),
    ({"Null": {"aws:ResourceTag/a": "true"}}, {"a": ""}, None, False),  # an empty value is a present key
    ({"Null": {"aws:ResourceTag/a": "false"}}, {"a": ""}, None, True),
    ({"Null": {"ec2:ResourceTag/a": "false"}}, {}, None, False),
    ({"Null": {"aws:ResourceTag/a": "true", "aws:TagKeys": "false"}}, {}, {"k": "v"}, True),  # keys ANDed
    ({"Null": {"aws:ResourceTag/a": "true", "aws:TagKeys": "false"}}, {"a": "x"}, {"k": "v"}, False),
    ({"Null": {"aws:ResourceTag/a": "true", "aws:TagKeys": "false"}}, {}, None, False),
    ({"Null": {"aws:RequestTag/k": "false"}}, {}, {"k": "v"}, True),
    ({"Null": {"aws:ResourceTag/a": ["true"]}}, {}, None, True),  # a one-element list is the same value
    ({"Null": {"aws:ResourceTag/a": True}}, {}, None, True),  # JSON true: the string "true"
])
def test_condition_semantics(condition, tags, request_tags, allowed):
    policy = {"Version": "2012-10-17", "Statement": [_stmt(condition=condition)]}
    effect = evaluate(policy, "ec2:StopInstances", ARN, resource_tags=tags, request_tags=request_tags).effect
    assert effect == (ALLOW if allowed else IMPLICIT_DENY)


def test_explicit_deny_wins_and_default_deny():
    allow, deny = _stmt(), _stmt("Deny", condition={"StringEquals": {"aws:ResourceTag/p": "1"}})
    assert evaluate([allow, deny], "ec2:StopInstances", ARN, resource_tags={"p": "1"}).effect == DENY
    assert evaluate([deny, allow], "ec2:StopInstances", ARN, resource_tags={"p": "2"}).effect == ALLOW
    assert evaluate([deny], "ec2:StopInstances", ARN, resource_tags={"p": "2"}).effect == IMPLICIT_DENY
    assert evaluate([], "ec2:StopInstances", ARN).effect == IMPLICIT_DENY


def test_action_and_resource_patterns():
    s = _stmt(action=["ec2:Describe*", "ec2:Stop?nstances"], resource="arn:aws:ec2:*:*:instance/i-0*")
    assert evaluate([s], "ec2:DescribeTags", ARN).allowed
    assert evaluate([s], "ec2:stopinstances", ARN).allowed
    assert not evaluate([s], "ec2:StartInstances", ARN).allowed
    assert not evaluate([s], "ec2:DescribeTags", instance_arn("i-1abc")).allowed
    assert not evaluate([s], "ec2:DescribeTags", ARN.replace("instance/", "Instance/")).allowed  # ARNs: case
    assert evaluate([_stmt(action="*")], "s3:GetObject", "arn:aws:s3:::b/k").allowed
    assert evaluate([_stmt(NotAction="ec2:Start*", action=None)], "ec2:StopInstances", ARN).allowed is True
    assert not evaluate([_stmt(NotResource="arn:aws:ec2:*:*:instance/*", resource=None)],
                        "ec2:StopInstances", ARN).allowed


@pytest.mark.parametrize("stmt", [
    _stmt(condition={"NumericLessThan": {"aws:ResourceTag/a": "1"}}),  # an operator it does not implement
    _stmt(condition={"DateGreaterThan": {"aws:CurrentTime": "2020-01-01"}}),
    _stmt(condition={"StringEquals": {"aws:PrincipalTag/team": "ml"}}),  # a key it does not know
    _stmt(condition={"StringEquals": {"aws:ResourceTag/a": "${aws:PrincipalTag/a}"}}),  # a policy variable
    _stmt(condition={"ForEveryValue:StringEquals": {"aws:TagKeys": "a"}}),
    _stmt(condition={"ForAllValues:Null": {"aws:TagKeys": "true"}}),
    _stmt(condition={"Null": {"aws:TagKeys": "maybe"}}),
    _stmt(Principal="*"),
    _stmt(effect="allow"),
    _stmt(condition={"StringEquals": {"aws:TagKeys": "a"}}),  # multivalued key without a set qualifier
])
def test_what_it_does_not_understand_raises_never_allows(stmt):
    with pytest.raises(PolicyError):
        evaluate([_stmt(), stmt], "ec2:StopInstances", ARN, resource_tags={"a": "x"},
                 request_tags={"a": "1", "b": "2"})
