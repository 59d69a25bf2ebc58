"""gpufinops' marks in a Slurm job's Comment (or AdminComment): pure, the one place they are read and written.

A job has no tags; its Comment is free text that its user may edit too. gpufinops keeps its own facts there as
`key=value` words (`gpufinops:marked-for-stop=2026-12-07T10:00:00Z`), beside whatever the user wrote, which is
kept word for word. A user snoozes a job by writing the cluster's snooze keyword (default `gpufinops:keep`) or
`gpufinops:snooze-until=<ISO time>` into the Comment.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from ...model import TAG_MARKED, TAG_SNOOZE, TAG_STOPPED_BY

# The start (epoch seconds) of the run a mark was written on: a job requeued and started again is a new run, and
# the mark of its earlier one is not its own.
TAG_MARK_RUN = "gpufinops:mark-run"
# The tags gpufinops writes into a job's comment. The stop reason (TAG_STOPPED_REASON) is not written: a Comment is
# one short line people read in squeue; the reason is in the audit and the "ended" notice.
WRITTEN = (TAG_MARKED, TAG_MARK_RUN, TAG_SNOOZE, TAG_STOPPED_BY)
_WORD = re.compile(r"(?:^|\s)(gpufinops:[a-z-]+)=(\S+)")
# What the snooze keyword stands for: not an ISO time, so act.plan's snooze reads it as "snoozed for the cap from
# when it was first seen" (act.max_snooze_s).
KEYWORD_SNOOZE = "(the snooze keyword, in the job's Comment)"


def read_tags(text: str) -> dict[str, str]:
    """The `gpufinops:<key>=<value>` words of a comment (the last of a key wins)."""
    return {k: v for k, v in _WORD.findall(text or "")}


def keyword_in(text: str, keyword: str) -> bool:
    return keyword in (text or "").split()


def with_tags(text: str, tags: Mapping[str, str]) -> str:
    """`text` with each of `tags` written as a word (replacing the same key's word), the rest unchanged."""
    out = without_tags(text, list(tags))
    words = [f"{k}={_one_word(v)}" for k, v in tags.items() if k in WRITTEN]
    return " ".join(p for p in (out, *words) if p)


def without_tags(text: str, keys: Sequence[str]) -> str:
    kept = [w for w in (text or "").split() if not any(w.startswith(f"{k}=") for k in keys)]
    return " ".join(kept)


def _one_word(value: str) -> str:
    return "_".join(str(value).split())
