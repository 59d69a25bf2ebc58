"""The answers of Prometheus as rows: (series labels, agg, value), decoded typed from the bytes (`parse_body`) or
from an already-decoded answer (`parse_answer`), and a series' GPU identity (`identity`). A body of another shape
is one QueryFailed ("malformed answer"), never a guess."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import msgspec

from gpufinops.collect.errors import QueryFailed
from gpufinops.model import SENTINEL_THRESHOLD

from .signals import CLEAN, DIRTY, RAW, _ACCEPTED_AGGS, is_valid_sample

Row = tuple[dict[str, str], str, float]  # (series labels, agg, value) as parsed from one answer
Identity = tuple[str, ...]  # the values of a GPU's identity labels (gpu_identity_labels), "" when absent

_EMPTY = ("",) * 64  # more than any identity has labels


def identity(labels: Mapping[str, str], by: Sequence[str]) -> Identity:
    """The values of a series' GPU identity labels, "" when absent (what a GPU's figures are combined by)."""
    return tuple(map(labels.get, by, _EMPTY))


def parse_answer(key: tuple[str, str], answer: Any) -> list[tuple[dict[str, str], str, float]]:
    """(labels, agg, value) rows of one answer; QueryFailed if malformed.

    A clean answer is an instant vector with an `agg` label; a dirty answer is a range vector whose every
    point is one valid sample (agg "sample"); a raw answer is a range vector of raw samples, of which only
    the valid ones (`is_valid_sample`) become "sample" rows: the others are not measurements.
    """
    metric, kind = key
    if not isinstance(answer, list):
        raise QueryFailed(f"malformed answer for {metric}: expected a list of series")
    rows = []
    try:
        for item in answer:
            labels = item["metric"]
            if not isinstance(labels, dict):
                raise TypeError
            if kind == CLEAN:
                agg = labels["agg"]
                if agg not in _ACCEPTED_AGGS[metric]:
                    raise QueryFailed(f"malformed answer for {metric}: unexpected agg {agg[:20]!r}")
                points = [item["value"]]
            else:
                agg, points = "sample", item["values"]
            for point in points:
                # NaN and inf are kept: they are implausible numbers, checked where combined (row_problem).
                value = float(point[1])
                if kind != RAW or is_valid_sample(value):
                    rows.append((labels, agg, value))
    except (KeyError, IndexError, TypeError, ValueError):
        raise QueryFailed(f"malformed answer for {metric}") from None
    return rows


# The two shapes of answer the collector reads, decoded typed by msgspec straight from the bytes (BENCHMARKS.md,
# "Client time per tick"): no dict per series or list per point, and no object the cyclic GC tracks (gc=False).
# A body of another shape fails the decode: "malformed answer".
class _Point(msgspec.Struct, array_like=True, gc=False):
    at: float
    value: str  # Prometheus writes sample values as strings ("0.5", "NaN", "+Inf")


class _Instant(msgspec.Struct, gc=False):  # one series of an instant vector (the clean queries)
    metric: dict[str, str]
    value: _Point


class _Range(msgspec.Struct, gc=False):  # one series of a range vector (the raw and dirty reads)
    metric: dict[str, str]
    values: list[_Point]


class _VectorData(msgspec.Struct, gc=False):
    result: list[_Instant]


class _MatrixData(msgspec.Struct, gc=False):
    result: list[_Range]


class _VectorAnswer(msgspec.Struct, gc=False):
    data: _VectorData


class _MatrixAnswer(msgspec.Struct, gc=False):
    data: _MatrixData


_DECODERS = {CLEAN: msgspec.json.Decoder(_VectorAnswer), DIRTY: msgspec.json.Decoder(_MatrixAnswer),
             RAW: msgspec.json.Decoder(_MatrixAnswer)}
_ACCEPTED_SETS = {metric: frozenset(aggs) for metric, aggs in _ACCEPTED_AGGS.items()}


def parse_body(key: tuple[str, str], body: bytes) -> list[Row]:
    """`parse_answer` of an answer's bytes, decoded typed (the collector's path: the same rows, one pass)."""
    metric, kind = key
    try:
        result = _DECODERS[kind].decode(body).data.result
        if kind == CLEAN:
            accepted = _ACCEPTED_SETS[metric]
            rows = [(s.metric, s.metric.get("agg"), float(s.value.value)) for s in result]
            for _labels, agg, _value in rows:
                if agg not in accepted:
                    raise QueryFailed(f"malformed answer for {metric}: unexpected agg {str(agg)[:20]!r}")
            return rows
        if kind == RAW:  # only the valid samples are measurements (is_valid_sample)
            return [(s.metric, "sample", v) for s in result for p in s.values
                    if 0.0 <= (v := float(p.value)) < SENTINEL_THRESHOLD]
        return [(s.metric, "sample", float(p.value)) for s in result for p in s.values]
    except (msgspec.DecodeError, ValueError):
        raise QueryFailed(f"malformed answer for {metric}") from None
