"""The detail read: the GPUs whose clean figures show invalid samples (`needs_detail`) read again sample by sample,
narrowed by label matchers (`DetailWanted`, `plan_detail`), or through the whole-fleet DIRTY subquery past
MAX_DETAIL_POINTS; and the rows of those reads that count (`detail_rows`, `with_detail`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .answers import Identity, Row, identity
from .instances import InstanceMatcher
from .promql import PromQL
from .signals import DETAILED_SIGNALS, DIRTY, RAW, needs_detail, signal_of

# Raw samples read back per tick for GPUs with invalid samples, at most; past it the whole-fleet subquery
# (the DIRTY query) filters them server-side instead (a fleet whose exporter blanks a field everywhere).
MAX_DETAIL_POINTS = 200_000
# GPUs named in one detail query: its URL stays under the 8 KiB a reverse proxy accepts (nginx's default).
DETAIL_GPUS_PER_QUERY = 100


@dataclass(frozen=True)
class Detail:
    """Which (signal, GPU) pairs had invalid samples in the window, and the raw-sample queries that read
    their valid samples back (or the whole-fleet DIRTY subquery when there are too many to read raw)."""

    pairs: frozenset[tuple[str, Identity]]
    queries: dict[tuple[str, str, str], str]  # (signal, kind, narrowing label#chunk) -> PromQL


class _DetailedRows(dict):
    """(signal, agg) of each agg label of one queried signal's answer, worked out once per label (`signal_of`);
    (None, agg) for a signal that never needs the detail read. A dict: a row finds its pair in one look-up."""

    def __init__(self, host_metric: str) -> None:
        super().__init__()
        self.host_metric = host_metric

    def __missing__(self, host_agg: str) -> tuple[str | None, str]:
        metric, agg = signal_of(self.host_metric, host_agg)
        found = self[host_agg] = (metric if metric in DETAILED_SIGNALS else None, agg)
        return found


def narrowing(labels: Mapping[str, str], by_labels: Sequence[str]) -> tuple[str, str] | None:
    """The one label that picks a GPU's series out of the fleet: its UUID, else its host label."""
    for name in ("UUID", *by_labels):
        if labels.get(name):
            return name, labels[name]
    return None


@dataclass
class DetailWanted:
    """What the clean answers read so far ask of the detail read (`plan_detail`, in steps): the (signal, GPU)
    pairs with invalid samples, the narrowing label values that pick them out, the signals that cannot be
    narrowed. Each answer adds its own (`add`): a signal comes from one query only (FOLDED), so the pairs one
    answer adds are final for its signals as soon as it lands."""

    pairs: set[tuple[str, Identity]] = field(default_factory=set)
    wanted: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # signal -> narrowing label -> values
    unnarrowable: set[str] = field(default_factory=set)

    def add(self, host_metric: str, rows: Sequence[Row], matcher: InstanceMatcher, by: Sequence[str]
            ) -> set[tuple[str, Identity]]:
        """Note the GPUs of requested instances whose figures in this answer show invalid samples
        (`needs_detail`); returns this answer's pairs."""
        added: set[tuple[str, Identity]] = set()
        detailed = _DetailedRows(host_metric)
        for labels, host_agg, value in rows:
            metric, agg = detailed[host_agg]
            if metric is None or not needs_detail(agg, value) or matcher.match(labels) is None:
                continue
            added.add((metric, identity(labels, by)))
            pick = narrowing(labels, by)
            if pick is None:
                self.unnarrowable.add(metric)
            else:
                self.wanted.setdefault(metric, {}).setdefault(pick[0], set()).add(pick[1])
        self.pairs |= added
        return added

    def plan(self, promql: PromQL, window_s: int, expected_samples: int, max_points: int | None = None) -> Detail:
        """The raw-sample queries for every pair noted, narrowed by label matchers; the whole-fleet DIRTY
        subquery instead for a signal that cannot be narrowed or when there are too many samples to read raw."""
        queries: dict[tuple[str, str, str], str] = {}
        too_many = len(self.pairs) * max(expected_samples, 1) > (
            MAX_DETAIL_POINTS if max_points is None else max_points)
        for metric in sorted({m for m, _ in self.pairs}):
            if too_many or metric in self.unnarrowable:
                queries[(metric, DIRTY, "")] = promql.dirty_query(metric, window_s)
                continue
            for label, values in sorted(self.wanted[metric].items()):
                ordered = sorted(values)
                for i in range(0, len(ordered), DETAIL_GPUS_PER_QUERY):
                    queries[(metric, RAW, f"{label}#{i}")] = promql.detail_query(
                        metric, window_s, label, ordered[i:i + DETAIL_GPUS_PER_QUERY])
        return Detail(frozenset(self.pairs), queries)


def plan_detail(promql: PromQL, rows_by_signal: Mapping[str, Sequence[Row]], matcher: InstanceMatcher,
                window_s: int, expected_samples: int, max_points: int | None = None) -> Detail:
    """Pure: the GPUs of requested instances whose clean figures show invalid samples (`needs_detail`),
    and the queries for their raw samples, narrowed by label matchers; none when no GPU needs them."""
    wanted = DetailWanted()
    for host_metric, rows in rows_by_signal.items():
        wanted.add(host_metric, rows, matcher, promql.by_labels)
    return wanted.plan(promql, window_s, expected_samples, max_points)


def detail_rows(metric: str, kind: str, found: Sequence[Row], by: Sequence[str], pairs) -> Sequence[Row]:
    """The rows of one detail answer that count: a raw read keeps only the GPUs that needed it, since the
    narrowing label may select more than were asked for."""
    if kind != RAW:
        return found
    kept: list[Row] = []
    series, wanted = None, False
    for row in found:
        if row[0] is not series:  # a series' samples come in a row and share its labels: one identity per series
            series, wanted = row[0], (metric, identity(row[0], by)) in pairs
        if wanted:
            kept.append(row)
    return kept


def with_detail(clean: Mapping[tuple[str, str], Sequence[Row]], extra: Mapping[tuple, Sequence[Row]],
                by: Sequence[str], pairs) -> dict[tuple[str, str], Sequence[Row]]:
    """The clean answers plus the detail read for the GPUs that needed it (`plan_detail`): the raw reads keep only
    those GPUs' series, since the narrowing label may select more than were asked for."""
    answers: dict[tuple[str, str], Sequence[Row]] = dict(clean)
    for (metric, kind, _label), found in extra.items():
        answers[(metric, kind)] = [*answers.get((metric, kind), ()), *detail_rows(metric, kind, found, by, pairs)]
    return answers
