"""The "No usable GPU metrics" alert: hysteresis per instance, and repeated outages folded into the daily
summary instead of new messages (issue 26, item 5)."""

from __future__ import annotations

from datetime import timedelta

from gpufinops.config import load_settings
from gpufinops.notify.delivery import read_outbox
from gpufinops.model import ReasonCode
from gpufinops.run.jobs import daily_summary
from gpufinops.run.pipeline import Peers, folded_outages
from tests.test_metric_ranges import A, B, Service, named


def flap(s: Service, minutes_missing: int, minutes_fine: int) -> list[dict]:
    sent = []
    for _ in range(minutes_missing):
        sent += s.tick({A: ReasonCode.LOW_COVERAGE}, fine=(B,))
    for _ in range(minutes_fine):
        sent += s.tick({}, fine=(A, B))
    return sent


def test_coverage_flapping_inside_the_hysteresis_is_one_episode_one_alert(tmp_path):
    s = Service(tmp_path)
    sent = []
    for _ in range(12):  # 4 h: missing 5 min, usable 15 min, again and again (never the 30 min that close it)
        sent += flap(s, 5, 15)
    assert len(sent) == 1 and named(sent[0]) == {A}
    assert len(s.store.kv_items("metrics_unavailable:" + A)) == 1  # still the one open episode
    assert folded_outages(s.store, s.now - timedelta(days=1)) == []  # a relapse is no new outage


def test_the_episode_closes_only_after_the_minimum_usable_time(tmp_path):
    s = Service(tmp_path)
    s.settings = load_settings(slack={"outbox_path": str(s.outbox), "metrics_recovered_after_s": 600},
                               schedule={"daily_summary_hour": None})
    s.restart()
    assert len(flap(s, 1, 9)) == 1  # 9 min usable: not closed yet
    assert s.store.kv_items("metrics_unavailable:" + A)
    assert flap(s, 1, 11) == []  # the relapse belongs to the same episode; then 11 min usable close it
    assert s.store.kv_items("metrics_unavailable:" + A) == []
    # Without a daily summary nothing is folded: a new outage after the close is alerted again.
    again = flap(s, 1, 0)
    assert len(again) == 1 and named(again[0]) == {A}


def test_a_repeated_outage_within_a_day_goes_into_the_daily_summary(tmp_path):
    s = Service(tmp_path)
    assert len(flap(s, 2, 31)) == 1  # alerted, then closed
    assert flap(s, 2, 31) == []  # a new outage of A the same day: no message
    assert flap(s, 2, 0) == []
    outages = folded_outages(s.store, s.now - timedelta(days=1))
    assert [o["instance_id"] for o in outages] == [A, A] and all(o["reason"] for o in outages)

    peers = Peers(cloud=_NoCloud(), metrics=None, store=s.store, notifier=s.notifier)
    msg = daily_summary(s.settings, peers, s.now)
    line = next(x for x in msg.text.splitlines() if x.startswith("*Metrics lost again"))
    assert f"{A} 2×" in line
    assert read_outbox(s.outbox)[-1]["key"] == msg.key
    # A day later the folded entries are gone from the next summary.
    assert folded_outages(s.store, s.now + timedelta(days=1)) == []
    assert s.store.kv_items("metrics_folded:") == []


class _NoCloud:
    def list_gpu_instances(self):
        return []
