"""Day one (issue 26): what `recommend` can honestly say before the 14-day window is full, and stop advice (never
a smaller GPU, never a schedule) for GPUs that do no work, within protect, exclusions and the opt-in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.model import Action, GpuInstance, Rule, Selector
from gpufinops.prices.catalog import load_catalog
from gpufinops.recommend.engine import recommend_instance
from gpufinops.recommend.idle import confidence, history
from gpufinops.recommend.policy import RecommendPolicy
from gpufinops.recommend.usage import FleetUsage, GpuLongStats, LongUsage

NOW = datetime(2026, 11, 29, 9, 0, tzinfo=timezone.utc)
POLICY = RecommendPolicy()
WINDOW = 14 * 86400
EXPECTED = 4032  # 14 days at 300 s
STOP = Rule("idle-1h", 5, 3600, action=Action.STOP)
EXCLUDING = Rule("idle-1h", 5, 3600, action=Action.STOP, selector=Selector(exclude_tags={"env": ("prod",)}))


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def inst(tags=None, **kw):
    return GpuInstance("i-new", "g5.xlarge", "us-east-1", "running", NOW - timedelta(hours=6), tags=tags or {}, **kw)


def fleet(hours: float, activity_max: float, p95: float | None = None) -> FleetUsage:
    samples = int(hours * 3600 / 300)
    g = GpuLongStats("0", "", 2048.0, 2000.0, activity_max if p95 is None else p95, activity_max, samples)
    return FleetUsage({"i-new": LongUsage("i-new", WINDOW, EXPECTED, (g,))}, {})


@pytest.mark.parametrize("hours,expected", [(5, "low"), (30, "medium"), (8 * 24, "high")])
def test_confidence_grows_with_the_history(hours, expected):
    assert confidence(hours) == expected
    assert history(fleet(hours, 0).instances["i-new"]).hours == pytest.approx(hours)


def test_an_idle_machine_on_day_one_is_advised_to_stop_when_idle_not_a_smaller_gpu(catalog):
    r = recommend_instance(inst(), fleet(5, 0.0), catalog, POLICY, NOW, rules=[STOP])
    assert r.action == "stop_when_idle" and r.recommended == "stop when idle: opt it in with gpufinops:allow-stop=true"
    assert r.history_h == 5 and r.confidence == "low" and r.risk == "high"
    assert "5 h of history" in r.reason and "confidence low" in r.reason and "rule idle-1h" in r.reason
    assert r.monthly_savings == pytest.approx(r.current_monthly) and r.recommended_monthly == 0
    assert "schedule" not in (r.reason + r.recommended).lower()


def test_an_opted_in_idle_machine_is_already_covered(catalog):
    r = recommend_instance(inst({"gpufinops:allow-stop": "true"}), fleet(5, 0.0), catalog, POLICY, NOW, rules=[STOP])
    assert r.action == "stop_when_idle" and r.recommended == "stop when idle (opted in)"


def test_the_opt_in_tag_is_the_configured_one(catalog):
    r = recommend_instance(inst(), fleet(5, 0.0), catalog, POLICY, NOW, rules=[STOP], opt_in=("owner-ok", "yes"))
    assert r.recommended == "stop when idle: opt it in with owner-ok=yes"


@pytest.mark.parametrize("tags,kw,why", [
    ({"gpufinops:protect": "true"}, {}, "protected by tag gpufinops:protect"),
    ({"env": "prod"}, {}, "no stop rule selects it"),
    ({}, {"managed_by": "autoscaling group ml-asg"}, "managed by autoscaling group ml-asg"),
])
def test_idle_but_protected_excluded_or_managed_gets_no_stop_advice(catalog, tags, kw, why):
    r = recommend_instance(inst(tags, **kw), fleet(5, 0.0), catalog, POLICY, NOW, rules=[EXCLUDING])
    assert r.action == "idle_kept" and r.recommended == "-" and r.monthly_savings == 0 and why in r.reason


def test_a_working_machine_on_day_one_is_insufficient_data_with_what_was_seen(catalog):
    r = recommend_instance(inst(), fleet(5, 60.0, p95=40.0), catalog, POLICY, NOW, rules=[STOP])
    assert r.action == "insufficient_data" and r.recommended == "-" and r.monthly_savings == 0
    assert "5 h of history of the 14 d" in r.reason and "confidence low" in r.reason
    assert "peak memory 2.0 GiB" in r.reason and "p95 activity 40%" in r.reason and "no smaller GPU" in r.reason


def test_under_an_hour_of_history_says_nothing_about_idleness(catalog):
    r = recommend_instance(inst(), fleet(0.5, 0.0), catalog, POLICY, NOW, rules=[STOP])
    assert r.action == "insufficient_data"


def test_stale_prices_are_one_warning_not_one_per_row(catalog):
    from gpufinops.recommend.engine import stale_prices_warning

    recs = [recommend_instance(inst(), fleet(5, 0.0), catalog, POLICY, NOW + timedelta(days=400), rules=[STOP])] * 3
    assert all("STALE" not in r.reason and "days old" in r.reason for r in recs)
    warning = stale_prices_warning(recs, NOW + timedelta(days=400), POLICY)
    assert warning.startswith("3 recommendation(s) rest on prices older than 90 days") and "--refresh-prices" in warning
    assert stale_prices_warning(recs, NOW + timedelta(days=400), POLICY.model_copy(update={"price_max_age_days": 3000})) == ""


def test_a_peers_error_page_is_one_short_line_never_html_or_a_bytes_repr():
    from gpufinops.collect.errors import answer_excerpt

    page = ("An error occurred (500) when calling the GetProducts operation (reached max retries: 4): <html><head>"
            "<title>500 Internal Server Error</title><style>body{color:red}</style></head><body>\n<h1>Internal "
            "Server Error</h1>\n<p>The server encountered an internal error.</p></body></html>")
    assert answer_excerpt(page) == ("An error occurred (500) when calling the GetProducts operation (reached max "
                                    "retries: 4): 500 Internal Server Error Internal Server Error The server "
                                    "encountered an internal error.")[:159] + "…"
    assert answer_excerpt(b"404 page not found\n") == "404 page not found"
