"""Sweep thresholds x windows x aggregations, find the Pareto front, suggest a rule.

The front: rules for which no other rule saves more net GPU-hours with a lower
or equal false-stop rate. The suggestion: the front rule with the highest net
saving whose false-stop rate is at most `max_false_stop_rate`; it is emitted as
a rule file that `rules.load_rules` accepts.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Sequence

import yaml

from ..model import Action, Aggregation, Rule
from ..rules import duration_spec
from .engine import Prepared, Summary, backtest_rule, oracle_net_seconds

DEFAULT_THRESHOLDS = (1.0, 5.0, 10.0, 20.0, 40.0)
DEFAULT_WINDOWS_S = (600, 1800, 3600, 7200)
DEFAULT_AGGREGATIONS = (Aggregation.STAYS_BELOW, Aggregation.MEAN)
# Below this much history no rule is chosen (issue 26): a rule picked on less than one day has not seen a whole
# daily cycle, i.e. both the overnight idle stretch it would stop and the return to work that makes a stop false;
# its false-stop rate rests on a handful of stops, so the "best" rule is chance, not a property of the fleet.
MIN_HISTORY_S = 86400


def history_too_short(span_s: float, min_history_s: float = MIN_HISTORY_S) -> str:
    """Why this history cannot choose a rule ("" when it is long enough)."""
    if span_s >= min_history_s:
        return ""
    return (f"history too short to choose a rule: {span_s / 3600:.1f} h, the minimum is {min_history_s / 3600:.0f} h "
            f"(a whole day: the night's idle stretch a rule would stop and the morning's return to work that makes a "
            f"stop false; on less, the false-stop rate rests on a handful of stops and the best rule is chance). "
            f"The figures above describe this history only; no rule file is suggested")


def candidates(base: Rule, thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
               windows_s: Sequence[int] = DEFAULT_WINDOWS_S,
               aggregations: Sequence[Aggregation] = DEFAULT_AGGREGATIONS) -> list[Rule]:
    out = []
    for thr, win, agg in itertools.product(thresholds, windows_s, aggregations):
        name = f"{'below' if agg == Aggregation.STAYS_BELOW else 'mean'}-{thr:g}pct-{duration_text(win)}"
        out.append(replace(base, name=name, threshold_pct=float(thr), window_s=int(win), aggregation=agg,
                           action=Action.STOP, source=f"sweep of {base.name}"))
    return out


duration_text = duration_spec  # rule names and exported rules spell durations as a rule file does


def run_sweep(prep: Prepared, rules: Sequence[Rule]) -> list[Summary]:
    oracle = oracle_net_seconds(prep)
    return [backtest_rule(prep, r, oracle)[0] for r in rules]


def pareto_front(results: Sequence[Summary]) -> list[Summary]:
    """Non-dominated results (max net GPU-hours, min false-stop rate), sorted by false-stop rate."""
    front = []
    for a in results:
        dominated = any(
            b is not a and b.net_gpu_hours >= a.net_gpu_hours and b.false_stop_rate <= a.false_stop_rate
            and (b.net_gpu_hours > a.net_gpu_hours or b.false_stop_rate < a.false_stop_rate)
            for b in results
        )
        if not dominated:
            front.append(a)
    return sorted(front, key=lambda s: (s.false_stop_rate, -s.net_gpu_hours))


def suggest(front: Sequence[Summary], max_false_stop_rate: float = 0.1) -> Summary | None:
    """Highest net saving within the false-stop budget; else the safest rule that saves anything."""
    saving = [s for s in front if s.net_gpu_hours > 0]
    ok = [s for s in saving if s.false_stop_rate <= max_false_stop_rate]
    if ok:
        return max(ok, key=lambda s: s.net_gpu_hours)
    return min(saving, key=lambda s: (s.false_stop_rate, -s.net_gpu_hours)) if saving else None


def best_by_score(results: Sequence[Summary]) -> Summary | None:
    """The rule with the highest score (net GPU-h - c x false stops, c = the settings' false-stop cost)."""
    return max(results, key=lambda s: s.score) if results else None


def rule_doc(rule: Rule, description: str) -> dict:
    """A rule as one entry of a rule file's `rules:` list."""
    return {
        "name": rule.name,
        "description": description,
        "threshold_pct": rule.threshold_pct,
        "window": duration_text(rule.window_s),
        "aggregation": rule.aggregation.value,
        "min_coverage": rule.min_coverage,
        "warning_lead": duration_text(rule.warning_lead_s),
        "action": "stop",
        "underutilized_below_pct": rule.underutilized_below_pct,
        **({"notify_to": list(rule.notify_to)} if rule.notify_to else {}),
    }


def rule_file_text(entries: list[dict], comment: str = "") -> str:
    head = "".join(f"# {line}\n" for line in comment.splitlines()) if comment else ""
    return head + yaml.safe_dump({"rules": entries}, sort_keys=False)


def rule_yaml(summary: Summary, comment: str = "") -> str:
    """The suggested rule as a rule file (rules: [...]) for rules/ and `gpufinops rules check`."""
    assert summary.rule is not None
    return rule_file_text([rule_doc(summary.rule, (
        f"Suggested by gpufinops backtest: net {summary.net_gpu_hours:.1f} GPU-h saved, "
        f"false-stop rate {summary.false_stop_rate:.0%}, score {summary.score:.1f} "
        f"({summary.pct_of_ceiling:.0f}% of the clairvoyant-with-lead ceiling)"))], comment)
