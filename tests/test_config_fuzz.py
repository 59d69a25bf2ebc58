"""A config fuzz over every section (issue 35): random gpufinops.yaml documents, each key of each section drawn
from its own pydantic type (so a key added tomorrow is fuzzed too) or from hostile values (control characters,
RTL overrides, NUL, huge numbers, inf/nan, negatives, wrong types), written to a file and loaded through the real
loader, `load_settings`, then through the capability accessors.

Either the document loads and what it loaded makes sense (ports a scrape config can name, finite durations that
are not negative, no control or bidirectional character in any name, path, URL or domain, regions AWS knows the
shape of, retries that back off upwards, URLs with a scheme and a host), or it raises ConfigError with each line
naming the file and a key: never another exception, never nonsense accepted.

Derandomized, no example database, a bounded number of examples: the same examples on every run, in seconds.
A longer hunt, by hand: GPUFINOPS_CONFIG_FUZZ_EXAMPLES=3000 python -m pytest tests/test_config_fuzz.py
"""

from __future__ import annotations

import math
import os
import re
import types
import typing
import unicodedata
from pathlib import Path
from unittest import mock
from urllib.parse import urlsplit

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from gpufinops.collect.billing.settings import billing_settings
from gpufinops.config import ConfigError, SecretRef, Settings, load_settings
from gpufinops.recommend.policy import policy_from_settings
from gpufinops.report.options import report_settings

FUZZ = settings(max_examples=int(os.environ.get("GPUFINOPS_CONFIG_FUZZ_EXAMPLES", "300")), deadline=None,
                derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

HOSTILE_STRINGS = st.sampled_from([
    "", " ", "\u202e", "\u202e\u202e", "us-\u202eeast-1", "\u2066x\u2069", "a\x00b", "\x00", "line\nbreak", "cr\rlf\n",
    "tab\there", "\x07bell", "\x1b[31mred", "\x7f", "\u0085", "gpufinops.invalid\r\nBcc: a@b.c", "x" * 300,
    "..", "-", "0", "-1", "1e309", ".inf", "nan", "true", "null", "~", "s3://", "http://", "http://:0",
    "http://127.0.0.1:99999", "https://[::1", "ftp://example.com", "example.com", "#", "@", "a@b", "U0",
])
PLAUSIBLE_STRINGS = st.sampled_from([
    "us-east-1", "eu-central-1", "us-gov-west-1", "http://127.0.0.1:9090", "https://slack.example/api/",
    "gpufinops.invalid", "mail.example.com", "127.0.0.1", "0.0.0.0", "#gpu-finops", "U012AB3CDE", "ops@example.com",
    "team", "g5", "p4d", "H100", "sqlite:///x.db", "rules", "mon", "10m", "USD", "primary", "cur", "GPUFINOPS_X",
])
STRINGS = st.one_of(PLAUSIBLE_STRINGS, HOSTILE_STRINGS, st.text(max_size=10))
HOSTILE_NUMBERS = st.sampled_from([
    0, -1, 1, 60, 65535, 65536, -(10**18), 10**18, 2**63, 10**30, 9.2e18, 1e308, -0.0, 0.5, -0.5,
    float("inf"), float("-inf"), float("nan"), 1e-300,
])
INTS = st.one_of(HOSTILE_NUMBERS, st.integers(-10, 100_000))
FLOATS = st.one_of(HOSTILE_NUMBERS, st.floats(allow_nan=True, allow_infinity=True))
SCALARS = st.one_of(INTS, FLOATS, STRINGS, st.booleans(), st.none())
ANYTHING = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(STRINGS, SCALARS, max_size=2))


def is_model(t) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def values_of(annotation, depth: int = 0) -> st.SearchStrategy:
    """Values for a field of this type: of the type (so they reach its checks) or, sometimes, of any type."""
    return st.one_of(typed(annotation, depth), typed(annotation, depth), typed(annotation, depth), ANYTHING)


def typed(t, depth: int) -> st.SearchStrategy:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Annotated:
        return typed(args[0], depth)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(typed(a, depth) for a in args))
    if origin is typing.Literal:
        return st.one_of(st.sampled_from(args), STRINGS)
    if origin in (tuple, list):
        return st.lists(typed(args[0], depth), max_size=3)
    if origin is dict:
        return st.dictionaries(typed(args[0], depth), typed(args[1], depth), max_size=3)
    if t is type(None):
        return st.none()
    if t is bool:
        return st.booleans()
    if t is int:
        return INTS
    if t is float:
        return FLOATS
    if t is str:
        return STRINGS
    if is_model(t):
        return section(t, depth + 1)
    return ANYTHING


def section(model: type[BaseModel], depth: int = 0) -> st.SearchStrategy:
    """A mapping of a few of the model's keys, each drawn from its type, now and then an unknown key. Few keys a
    document, so that most keys are valid and the one hostile value is what decides (a document with ten bad
    values is refused for the first one, and the other nine are never tried)."""
    if depth > 3:
        return st.just({})
    fields = {name: f for name, f in model.model_fields.items() if name != "source_path"}
    key = st.sampled_from(sorted(fields))
    entry = key.flatmap(lambda name: st.tuples(st.just(name), values_of(fields[name].annotation, depth)))
    unknown = st.tuples(st.sampled_from(["nonsense", "\u202ekey", "port "]), SCALARS)
    return st.lists(st.one_of(entry, entry, entry, entry, entry, entry, entry, unknown), max_size=2).map(dict)


CONFIG = section(Settings)


# --------------------------------------------------------------------------- what a loaded config must mean

BIDI = {"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"}
REGION = re.compile(r"[a-z]{2,4}(-[a-z]+)+-\d{1,2}")
URL_KEYS = {"url", "base_url", "endpoint_url"}
AWS_REGION_KEYS = {"aws.regions.*", "billing.ce.region", "billing.athena.region"}


def leaves(value, loc=()):
    """(location, value) of every scalar in a settings tree."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from leaves(getattr(value, name), (*loc, name))
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from leaves(v, (*loc, i))
    elif isinstance(value, dict):
        for k, v in value.items():  # a map's keys and values, by the map's own key: "a.b.*"
            yield (*loc, "*"), k
            yield from leaves(v, (*loc, "*"))
    else:
        yield loc, value


# The string keys where empty says something (off, none, the default); anywhere else an empty string means nothing.
EMPTY_MEANS_OFF = {
    "prometheus.selector", "prometheus.basic_auth_user", "email.username", "schedule.recommend_digest_day",
    "schedule.monthly_report_dir", "billing.path", "billing.price_catalog", "billing.ce.account",
    "recommend.catalog_dir", "recommend.commitment.term", "report.delivery.slack_channel", "report.delivery.s3_uri",
    "source_path", "kubernetes.namespace_selector.*", "hosts.inventory.*.region", "hosts.inventory.*.tags.*",
    "slurm.clusters.*.grace_signal",
}


def key_of(loc: tuple) -> str:
    """A settings location as a dotted key, list indexes and map keys folded ("a.b.*")."""
    parts = [p if isinstance(p, str) else "*" for p in loc]
    out = []
    for p in parts:
        if not (p == "*" and out and out[-1] == "*"):
            out.append(p)
    return ".".join(out)


def string_keys(model: type[BaseModel], loc: tuple = ()) -> list[tuple[str, ...]]:
    """Every key of the settings tree whose value is a string (alone, optional, in a list, in a map)."""
    out = []
    for name, f in model.model_fields.items():
        if name == "source_path":
            continue
        listed = typing.get_origin(unannotated(f.annotation)) in (tuple, list)
        for t in flat_types(f.annotation):
            if is_model(t) and t is not SecretRef:
                out.extend(string_keys(t, (*loc, name, 0) if listed else (*loc, name)))
                break
            if t is str:
                out.append((*loc, name))
                break
    return out


def unannotated(t):
    args = [a for a in typing.get_args(t) if a is not type(None)]
    if typing.get_origin(t) is typing.Annotated or typing.get_origin(t) in (typing.Union, types.UnionType) and len(args) == 1:
        return unannotated(args[0])
    return t


def flat_types(t) -> list:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Annotated:
        return flat_types(args[0])
    if origin in (typing.Union, types.UnionType):
        return [x for a in args for x in flat_types(a)]
    if origin in (tuple, list):
        return flat_types(args[0])
    if origin is dict:
        return flat_types(args[1])
    return [t]


def assert_makes_sense(s: Settings) -> None:
    for loc, v in leaves(s):
        where = ".".join(map(str, loc))
        name = next((p for p in reversed(loc) if isinstance(p, str) and p != "*"), "")
        if isinstance(v, str):
            bad = [c for c in v if unicodedata.category(c) == "Cc" or unicodedata.bidirectional(c) in BIDI]
            assert not bad, f"{where}: {v!r} holds {bad}"
            assert v.strip() or (not v and key_of(loc) in EMPTY_MEANS_OFF), f"{where}: {v!r} says nothing"
            if name in URL_KEYS:
                parts = urlsplit(v)
                assert parts.scheme in ("http", "https") and parts.hostname, f"{where}: {v!r} is no URL"
            if key_of(loc) in AWS_REGION_KEYS:
                assert REGION.fullmatch(v), f"{where}: {v!r} is no region"
        elif isinstance(v, float):
            assert math.isfinite(v), f"{where}: {v!r}"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if name == "port":
                assert 1 <= v <= 65535, f"{where}: {v!r}"
            if name.endswith("_s") or name.endswith("_days") or name.endswith("_h"):
                assert v >= 0, f"{where}: {v!r}"
            if "timeout" in name:
                assert v > 0, f"{where}: {v!r}"
    for sec in (s.slack, s.email):
        assert sec.retry_backoff_s <= sec.retry_max_backoff_s
    assert s.email.message_id_domain and s.email.host and s.service.host
    assert not any(c.isspace() for c in s.email.message_id_domain + s.email.host)
    assert s.aws.regions
    for _loc, ref in ((loc, v) for loc, v in leaves_models(s) if isinstance(v, SecretRef)):
        value = ref.resolve()
        assert value is None or value.strip(), f"{ref} resolved blank but loaded"


def leaves_models(value, loc=()):
    if isinstance(value, BaseModel):
        yield loc, value
        for name in type(value).model_fields:
            yield from leaves_models(getattr(value, name), (*loc, name))
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from leaves_models(v, (*loc, i))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("config-fuzz")


def loaded(path: Path) -> tuple | str:
    """What load_settings makes of a file: the settings with the keys each section was given, or the error."""
    try:
        s = load_settings(path)
    except ConfigError as exc:
        return str(exc)
    return s, s.model_dump(exclude_unset=True)


@FUZZ
@given(doc=CONFIG)
def test_every_section_loads_into_sense_or_names_the_key(folder, doc):
    path = folder / "gpufinops.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=False), encoding="utf-8")
    # The settings are validated from what the file holds (config.validated_settings): the same settings, or the
    # same errors, as Settings' own validator, every section built, gives.
    with mock.patch("gpufinops.config.settings.validated_settings", Settings.model_validate):
        whole = loaded(path)
    assert loaded(path) == whole
    try:
        s = load_settings(path)
        billing_settings(s)
        policy_from_settings(s)
        report_settings(s)
    except ConfigError as exc:
        msg = str(exc)
        assert msg and "Traceback" not in msg
        for line in msg.splitlines():
            assert line.startswith(str(path)) and " key '" in line, f"an error line names no file and key: {line!r}"
        return
    assert_makes_sense(s)


@pytest.mark.parametrize("doc", [
    {"aws": {"regions": ("\u202e\u202e",)}},
    {"email": {"retry_backoff_s": 600, "retry_max_backoff_s": 60}},
    {"email": {"message_id_domain": "a\r\nb"}},
    {"email": {"message_id_domain": ""}},
    {"service": {"port": 0}},
    {"prometheus": {"url": "localhost:9090"}},
])
def test_the_sense_checks_catch_what_the_issue_found(doc):
    """The checks above are not vacuous: each nonsense value of issue 35, built without the loader, fails them."""
    base = Settings()
    s = base.model_copy(update={k: getattr(base, k).model_copy(update=v) for k, v in doc.items()})  # not validated
    with pytest.raises(AssertionError):
        assert_makes_sense(s)


# --------------------------------------------------------------------------- every string key, one hostile value each

STRING_KEYS = string_keys(Settings)
HOSTILE_TEXT = ["\u202e\u202e", "us-east-1\u202e", "a\r\nb", "\x00", "\x07", " ", "\t"]


# The keys a section cannot do without, so that a document setting one other key of it reaches that key's check.
NEEDS = {("hosts", "inventory"): {"hostname": "gpu-1", "gpu_count": 1, "gpu_model": "H100"},
         ("aws", "assume_roles"): {"arn": "arn:aws:iam::123456789012:role/gpufinops"},
         ("recommend", "spot", "overrides"): {"interruption_rate_per_hour": 0.01},
         ("api", "tls"): {"port": 9443, **{k: __file__ for k in ("cert_file", "key_file", "client_ca_file")}},
         ("azure",): {"subscriptions": ["00000000-0000-0000-0000-000000000000"]},
         ("slurm", "clusters"): {"cluster": "ci"}}


def document(loc: tuple, value) -> dict:
    """The smallest document that sets `loc` to `value` (an int in `loc`: a list of one element)."""

    def at(i: int):
        if i == len(loc):
            return value
        if isinstance(loc[i], int):
            return [{**NEEDS.get(loc[:i], {}), **at(i + 1)}]
        inner = at(i + 1)
        if loc[:i + 1] in NEEDS and i + 1 < len(loc) and isinstance(loc[i + 1], str):
            inner = {**NEEDS[loc[:i + 1]], **inner}
        return {loc[i]: inner}

    return at(0)


@pytest.mark.parametrize("loc", STRING_KEYS, ids=lambda loc: ".".join(map(str, loc)))
def test_every_string_key_refuses_hostile_text_and_says_something(folder, loc):
    key = ".".join(str(p) for p in loc if not isinstance(p, int))
    path = folder / f"{key}.yaml"
    for value in HOSTILE_TEXT + [""]:
        plain = loc[-1] in ("regions", "gpu_families", "hostname_labels", "namespaces", "exclude_namespaces",
                            "finance", "snooze_admins", "rules_paths", "providers", "interruptible_values",
                            "non_interruptible_values", "gpu_patterns", "team", "project", "owner")
        mapped = loc[-1] in ("team_channels", "team_members", "namespace_selector", "purchase_types", "tags",
                             "usd_per_gpu_hour")
        shaped = [value] if plain else {"k": value} if mapped else value
        path.write_text(yaml.safe_dump(document(loc, shaped), allow_unicode=False), encoding="utf-8")
        try:
            s = load_settings(path)
        except ConfigError as exc:
            named = ".".join(map(str, loc))
            assert f"key '{named}" in str(exc), (value, str(exc))
            continue
        assert value == "", f"{key} = {value!r} accepted"
        assert_makes_sense(s)
