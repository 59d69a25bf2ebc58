"""Purchase mix: interruptible or not, spot vs on-demand break-even, commitments, output and storage."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.prices.catalog import load_catalog
from gpufinops.config import ConfigError, load_settings
from gpufinops.model import GpuInstance
from gpufinops.recommend.engine import (
    latest_recommendations, recommend_fleet, recommend_instance, store_recommendations, weekly_digest_message,
)
from gpufinops.recommend.policy import CommitmentPolicy, RecommendPolicy, SpotPolicy, policy_from_settings
from gpufinops.recommend.purchase import (
    classify, commitment, percentile, spot_expected_cost, spot_vs_on_demand,
)
from gpufinops.recommend.table import COLUMNS, render
from gpufinops.recommend.usage import FleetUsage, GpuLongStats, LongUsage
from gpufinops.store.store import Store

NOW = datetime(2026, 11, 29, 9, 0, tzinfo=timezone.utc)
POLICY = RecommendPolicy()


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def inst(iid, itype, tags=None, provider="aws", region="us-east-1", lifecycle="on-demand"):
    return GpuInstance(iid, itype, region, "running", NOW - timedelta(days=40), provider=provider,
                       tags=tags or {}, lifecycle=lifecycle)


@pytest.mark.parametrize("tags,interruptible", [
    ({"workload": "batch"}, True), ({"workload": "Training"}, True), ({"workload": "inference"}, False),
    ({"workload": "interactive"}, False), ({"workload": "mystery"}, False), ({}, False),
])
def test_classify_from_tags(tags, interruptible):
    assert classify(inst("i-1", "g5.xlarge", tags), POLICY).interruptible is interruptible


def test_classify_tag_key_and_values_are_configurable():
    policy = RecommendPolicy(workload_tag="kind", interruptible_values=("nightly",))
    assert classify(inst("i-1", "g5.xlarge", {"kind": "nightly"}), policy).interruptible
    assert not classify(inst("i-1", "g5.xlarge", {"workload": "batch"}), policy).interruptible


def test_spot_expected_cost_counts_rework():
    spot = SpotPolicy(interruption_rate_per_hour=0.1, checkpoint_interval_h=2.0, restart_overhead_h=0.5)
    expected, rework = spot_expected_cost(1.0, 0.1, spot)
    assert rework == pytest.approx(0.1 * (1.0 + 0.5))
    assert expected == pytest.approx(1.0 * (1 + rework))


@pytest.mark.parametrize("factor,wins", [(0.9, True), (1.1, False)])
def test_spot_vs_on_demand_flips_at_the_break_even(factor, wins):
    od, sp = 1.0, 0.4
    break_even = od / sp - 1  # 150% rework
    ckpt, restart = 2.0, 0.5
    rate = break_even * factor / (ckpt / 2 + restart)
    policy = SpotPolicy(interruption_rate_per_hour=rate, checkpoint_interval_h=ckpt, restart_overhead_h=restart,
                        min_saving_fraction=0.0)
    v = spot_vs_on_demand(od, sp, "g5.xlarge", "us-east-1", policy)
    assert v.break_even_rework == pytest.approx(break_even)
    assert v.use_spot is wins
    assert "break-even rework 150%" in v.reason


def test_no_spot_price_means_no_spot():
    v = spot_vs_on_demand(1.0, None, "p5.48xlarge", "us-east-1", SpotPolicy())
    assert not v.use_spot and "no spot price" in v.reason


def test_interruption_rate_overrides_by_type_and_region():
    spot = SpotPolicy.model_validate({"overrides": [{"instance_type": "p5.*", "region": "us-*",
                                                      "interruption_rate_per_hour": 0.5}]})
    assert spot.rate_for("p5.48xlarge", "us-east-1") == 0.5
    assert spot.rate_for("p5.48xlarge", "eu-west-1") == spot.interruption_rate_per_hour
    assert spot.rate_for("g5.xlarge", "us-east-1") == spot.interruption_rate_per_hour


def test_commitment_for_the_steady_baseline():
    # 30 days: 3 instances always, a 4th and 5th on weekdays' working hours.
    counts = [3 + (2 if (h // 24) % 7 < 5 and 9 <= h % 24 < 18 else 0) for h in range(30 * 24)]
    policy = CommitmentPolicy()
    c = commitment("p4d.24xlarge", "us-east-1", counts, 20.0, 13.0, policy, 730)
    assert c.baseline == int(percentile(counts, 10)) == 3
    assert c.break_even_utilisation == pytest.approx(13.0 / 20.0)
    assert c.monthly_savings == pytest.approx(3 * 7.0 * 730)
    assert "65%" in c.reason
    assert commitment("x", "r", [0] * 720, 20.0, 13.0, policy, 730) is None  # no steady baseline
    assert commitment("x", "r", [3] * 48, 20.0, 13.0, policy, 730) is None  # 2 days: too little history
    assumed = commitment("x", "r", [1] * 720, 10.0, None, policy, 730)
    assert assumed.commit_hourly == pytest.approx(10.0 * (1 - policy.default_discount))


def _busy(iid, n, samples=4032):
    return LongUsage(iid, 14 * 86400, 4032, tuple(GpuLongStats(str(k), "", 20000, 19000, 80, 100, samples)
                                                  for k in range(n)))


def test_training_on_gcp_goes_to_spot_with_on_demand_fallback(catalog):
    i = inst("i-train", "g2-standard-4", {"workload": "training", "team": "ml"}, "gcp", "us-central1")
    fleet = FleetUsage({"i-train": _busy("i-train", 1)}, {})
    r = recommend_instance(i, fleet, catalog, POLICY, NOW)
    offer = catalog.offer("gcp", "g2-standard-4", "us-central1")
    assert r.action == "spot" and "on-demand fallback" in r.recommended
    assert r.current_monthly == pytest.approx(offer.on_demand_usd_h * 730)
    assert r.recommended_monthly == pytest.approx(spot_expected_cost(offer.spot_usd_h, 0.02, POLICY.spot)[0] * 730)
    assert r.monthly_savings == pytest.approx(r.current_monthly - r.recommended_monthly)
    assert "prices as of 2026-05-20" in r.reason and r.team == "ml"


def test_inference_stays_on_demand(catalog):
    i = inst("i-serve", "g2-standard-4", {"workload": "inference"}, "gcp", "us-central1")
    r = recommend_instance(i, FleetUsage({"i-serve": _busy("i-serve", 1)}, {}), catalog, POLICY, NOW)
    assert r.action == "keep" and r.monthly_savings == 0 and "on-demand" in r.reason


def test_fleet_rows_commitment_storage_digest_and_formats(catalog, tmp_path):
    a = inst("i-a", "p5.48xlarge", {"team": "llm"})
    b = inst("i-b", "p5.48xlarge", {"team": "llm"})
    young = inst("i-young", "g5.xlarge")
    hourly = {"i-a": [8] * 720, "i-b": [8 if h % 24 < 12 else 0 for h in range(720)], "i-young": [0] * 720}
    fleet = FleetUsage({"i-a": _busy("i-a", 8), "i-b": _busy("i-b", 8)}, hourly)
    recs = recommend_fleet([a, b, young], fleet, catalog, POLICY, NOW)
    by_action = {r.action: r for r in recs}
    assert by_action["insufficient_data"].instance_id == "i-young"
    commit = by_action["commit"]
    assert commit.instance_type == "p5.48xlarge" and commit.recommended.startswith("commit 1x")
    assert commit.monthly_savings > 0 and commit.team == "llm"

    store = Store(f"sqlite:///{tmp_path}/recs.db")
    store_recommendations(store, "run1", recs)
    later = [r.__class__(**{**r.__dict__, "created_at": NOW + timedelta(days=7)}) for r in recs[:1]]
    store_recommendations(store, "run2", later)
    assert [r.instance_id for r in latest_recommendations(store)] == [later[0].instance_id]
    assert len(latest_recommendations(store, since=NOW - timedelta(days=1))) == 1
    store.close()

    msg = weekly_digest_message(recs, NOW, channel="#finops")
    assert msg.key == "recommend-digest:2026-W48:#finops" and msg.channel == "#finops"
    assert "p5.48xlarge" in msg.text and "insufficient data" in msg.text
    assert weekly_digest_message(recs, NOW - timedelta(days=2), "#finops").key == msg.key  # same ISO week (NOW is a Sunday)
    assert weekly_digest_message(recs, NOW + timedelta(days=1), "#finops").key != msg.key

    parsed = json.loads(render(recs, "json"))
    assert {p["action"] for p in parsed} == {r.action for r in recs}
    rows = list(csv.DictReader(io.StringIO(render(recs, "csv"))))
    assert tuple(rows[0].keys()) == COLUMNS and len(rows) == len(recs)
    table = render(recs, "table")
    assert table.splitlines()[0].split()[:3] == ["instance_id", "team", "instance_type"] and "monthly_savings" in table and "i-young" in table


def test_recommend_section_errors_name_file_and_key(tmp_path):
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text("database_url: sqlite:///x.db\nrecommend:\n  window_days: 14\n  spot:\n    checkpoint_interval_h: -1\n")
    with pytest.raises(ConfigError, match=r"gpufinops.yaml:5: key 'recommend.spot.checkpoint_interval_h'"):
        policy_from_settings(load_settings(cfg))


def test_the_config_example_in_the_docs_is_valid():
    import re
    import yaml
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "recommend.md").read_text()
    block = re.search(r"```yaml\n(recommend:.*?)```", text, re.S).group(1)
    policy = RecommendPolicy.model_validate(yaml.safe_load(block)["recommend"])
    assert policy.spot.rate_for("p5.48xlarge", "us-east-1") == 0.05
