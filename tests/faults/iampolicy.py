"""A small evaluator of IAM identity-policy JSON, for the EC2 requests the fault matrix fences.

moto does not evaluate IAM conditions, so the fault proxy (`faultproxy.FaultProxy.enforce_iam`) asks this
module whether AWS would let a StopInstances / TerminateInstances / CreateTags / DeleteTags through, given
the instance's tags as moto holds them at the moment the request arrives. `tests/test_deploy.py` table-tests
the shipped policies with it as well, so both read the policy users deploy.

AWS semantics, for what the shipped policies use (IAM User Guide, "Policy evaluation logic",
"Condition operators", "Single-valued vs. multivalued context keys"):

- default deny; an explicit `Deny` wins over any `Allow`; `Action` / `NotAction` match case-insensitively
  with `*` and `?`; `Resource` / `NotResource` ARN patterns with `*` and `?`, case-sensitively;
- in a `Condition`, operators are ANDed, keys within an operator are ANDed, the values listed for one key
  are ORed; a negated operator (`StringNot...`) holds when the value matches none of them;
- a missing key: a positive operator is false, a negated one is true, `...IfExists` is true, `Null: true`
  is true; `ForAllValues:` is true for a missing or empty key (hence the `Null: false` the policies add),
  `ForAnyValue:` is false;
- keys: `aws:TagKeys` (multivalued: the request's tag keys), `aws:RequestTag/K` (the value the request
  writes), `aws:ResourceTag/K` and `ec2:ResourceTag/K` (the instance's tag K when the request arrives).
  Key names are case-insensitive, the tag key after the slash is compared as written.

Anything else (an unknown operator, key, element or a policy variable) raises `PolicyError`: a test must
never pass because the evaluator silently allowed what it did not understand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ALLOW = "Allow"
DENY = "Deny"  # an explicit deny
IMPLICIT_DENY = "implicit deny"  # no statement allowed it

_STRING_OPS = {"StringEquals", "StringNotEquals", "StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase",
               "StringLike", "StringNotLike", "Bool"}
_STATEMENT_KEYS = {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition"}


class PolicyError(ValueError):
    """The policy uses something this evaluator does not implement (or is malformed)."""


@dataclass(frozen=True)
class Decision:
    effect: str  # ALLOW, DENY or IMPLICIT_DENY
    statements: tuple[str, ...]  # Sids of the statements that matched with the deciding effect

    @property
    def allowed(self) -> bool:
        return self.effect == ALLOW


def load(*paths: str | Path) -> list[dict]:
    """The statements of one or more policy files, in order (several policies attached to one role)."""
    out: list[dict] = []
    for path in paths:
        out.extend(statements(json.loads(Path(path).read_text())))
    return out


def statements(document: Mapping | Sequence) -> list[dict]:
    """The statements of a policy document (or a list of statements, returned as is)."""
    if isinstance(document, Mapping):
        if document.get("Version") not in (None, "2012-10-17"):
            raise PolicyError(f"policy Version {document.get('Version')!r} (policy variables differ before 2012-10-17)")
        stmts = document.get("Statement", [])
        return [stmts] if isinstance(stmts, Mapping) else list(stmts)
    return list(document)


def evaluate(policy: Mapping | Sequence, action: str, resource: str, *,
             resource_tags: Mapping[str, str] | None = None,
             request_tags: Mapping[str, str | None] | None = None) -> Decision:
    """AWS's decision for one request on one resource.

    `action` is "ec2:StopInstances"; `resource` the ARN; `resource_tags` the resource's current tags;
    `request_tags` the tags the request writes (CreateTags: key -> value) or removes (DeleteTags:
    key -> value or None), None when the request carries no tags (then `aws:TagKeys` is absent).
    """
    context = _Context(dict(resource_tags or {}), None if request_tags is None else dict(request_tags))
    matched: dict[str, list[str]] = {ALLOW: [], DENY: []}
    for i, stmt in enumerate(statements(policy)):
        unknown = set(stmt) - _STATEMENT_KEYS
        if unknown:
            raise PolicyError(f"statement {stmt.get('Sid', i)}: unsupported element(s) {sorted(unknown)}")
        effect = stmt.get("Effect")
        if effect not in (ALLOW, DENY):
            raise PolicyError(f"statement {stmt.get('Sid', i)}: Effect {effect!r}")
        if not _applies(stmt, "Action", action, _action_matches):
            continue
        if not _applies(stmt, "Resource", resource, _resource_matches):
            continue
        if _condition_holds(stmt.get("Condition", {}), context):
            matched[effect].append(str(stmt.get("Sid", i)))
    if matched[DENY]:
        return Decision(DENY, tuple(matched[DENY]))
    if matched[ALLOW]:
        return Decision(ALLOW, tuple(matched[ALLOW]))
    return Decision(IMPLICIT_DENY, ())


def instance_arn(instance_id: str, region: str = "us-east-1", account: str = "123456789012") -> str:
    return f"arn:aws:ec2:{region}:{account}:instance/{instance_id}"


# ---------------------------------------------------------------------- internals

@dataclass(frozen=True)
class _Context:
    resource_tags: dict[str, str]
    request_tags: dict[str, str | None] | None

    def values(self, key: str) -> list[str] | None:
        """The key's values (one for a single-valued key), None when the request has no such key."""
        lowered = key.lower()
        if lowered == "aws:tagkeys":
            return None if self.request_tags is None else list(self.request_tags)
        for prefix in ("aws:resourcetag/", "ec2:resourcetag/"):
            if lowered.startswith(prefix):
                value = self.resource_tags.get(key[len(prefix):])
                return None if value is None else [value]
        if lowered.startswith("aws:requesttag/"):
            value = (self.request_tags or {}).get(key[len("aws:requesttag/"):])
            return None if value is None else [value]
        raise PolicyError(f"the evaluator does not know condition key {key!r}")


def _as_list(value: object, what: str) -> list[str]:
    items = [value] if isinstance(value, (str, bool)) else value
    if not isinstance(items, list) or not all(isinstance(v, (str, bool)) for v in items):
        raise PolicyError(f"{what}: expected a string or a list of strings, got {value!r}")
    out = [str(v).lower() if isinstance(v, bool) else v for v in items]
    for v in out:
        if "${" in v:
            raise PolicyError(f"{what}: policy variables are not implemented ({v!r})")
    return out


def _wildcard(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(regex, re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def _action_matches(pattern: str, action: str) -> bool:
    return _wildcard(pattern, ignore_case=True).fullmatch(action) is not None


def _resource_matches(pattern: str, resource: str) -> bool:
    return _wildcard(pattern, ignore_case=False).fullmatch(resource) is not None


def _applies(stmt: Mapping, element: str, value: str, match) -> bool:
    positive, negative = stmt.get(element), stmt.get(f"Not{element}")
    if (positive is None) == (negative is None):
        raise PolicyError(f"statement {stmt.get('Sid', '?')}: exactly one of {element} / Not{element} is required")
    patterns = _as_list(positive if positive is not None else negative, element)
    hit = any(match(p, value) for p in patterns)
    return hit if positive is not None else not hit


def _string_matches(op: str, actual: str, wanted: str) -> bool:
    if op == "StringEquals":
        return actual == wanted
    if op == "StringEqualsIgnoreCase":
        return actual.lower() == wanted.lower()
    if op == "StringLike":
        return _wildcard(wanted, ignore_case=False).fullmatch(actual) is not None
    if op == "Bool":
        return actual.lower() == wanted.lower()
    raise PolicyError(f"the evaluator does not know operator {op!r}")  # pragma: no cover - filtered before


def _condition_holds(condition: Mapping, context: _Context) -> bool:
    if not isinstance(condition, Mapping):
        raise PolicyError(f"Condition must be an object, got {condition!r}")
    for operator, keys in condition.items():
        qualifier, _, op = operator.rpartition(":")
        if qualifier not in ("", "ForAllValues", "ForAnyValue"):
            raise PolicyError(f"the evaluator does not know qualifier {qualifier!r} in {operator!r}")
        if_exists = op.endswith("IfExists") and op != "Null"
        base = op.removesuffix("IfExists")
        if base != "Null" and base not in _STRING_OPS:
            raise PolicyError(f"the evaluator does not know operator {operator!r}")
        if base == "Null" and (qualifier or if_exists):
            raise PolicyError(f"{operator!r}: Null takes no set qualifier")
        if not isinstance(keys, Mapping) or not keys:
            raise PolicyError(f"{operator!r}: expected an object of condition keys")
        for key, wanted_raw in keys.items():
            wanted = _as_list(wanted_raw, f"{operator}/{key}")
            values = context.values(key)
            if not _operator_holds(qualifier, base, if_exists, values, wanted, f"{operator}/{key}"):
                return False
    return True


def _operator_holds(qualifier: str, op: str, if_exists: bool, values: list[str] | None,
                    wanted: list[str], where: str) -> bool:
    if op == "Null":
        if wanted not in (["true"], ["false"]):
            raise PolicyError(f"{where}: Null takes 'true' or 'false', got {wanted!r}")
        absent = not values
        return absent if wanted == ["true"] else not absent
    negated = op.startswith("StringNot")
    positive = op.replace("StringNot", "String", 1) if negated else op

    def one(value: str) -> bool:  # the operator on one context value
        hit = any(_string_matches(positive, value, w) for w in wanted)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(one(v) for v in values or [])
    if qualifier == "ForAnyValue":
        return any(one(v) for v in values or [])
    if not values:
        return if_exists or negated
    if len(values) > 1:  # a multivalued key without a set qualifier: not what the shipped policies do
        raise PolicyError(f"{where}: a multivalued key needs ForAllValues: or ForAnyValue:")
    return one(values[0])


def request_tag_keys(tags: Iterable[str]) -> dict[str, None]:
    """The tag keys of a DeleteTags request, as `request_tags` (no values)."""
    return {k: None for k in tags}
