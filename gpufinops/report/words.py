"""Words for people in the report. The one table from stored codes to words is gpufinops/words.py (Slack and
email read it too); here only what the report alone says (the month's action summary lines).
"""

from __future__ import annotations

from ..words import WORDS, readable, words  # the one table (Slack, email and the report)


# An action's status (the store's actions table), where it differs from a message's status of the same name.
ACTION_STATUS_WORDS = {"failed": "failed", "pending": "not finished (intent recorded)",
                       "unconfirmed": "not confirmed by the cloud", "abandoned": "called off (not sent)"}


def action_words(kind: str, status: str, dry_run: bool, count: int) -> str:
    """One line of the month's action summary: "scheduled stop called off ×70", "stopped (dry-run) ×3"."""
    text = words(kind)
    if dry_run:
        text += " (dry-run)"
    if status != "done":
        text += f", {ACTION_STATUS_WORDS.get(status) or readable(status).lower()}"
    return f"{text} ×{count}"


__all__ = ["WORDS", "action_words", "readable", "words"]
