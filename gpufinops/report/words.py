"""Words for people: the one mapping from the codes the service stores (reason codes, action kinds, message
statuses) to what the report prints. A FinOps lead forwards the report to finance, who never saw `bursty_low`.

Codes are added by other parts of the service over time; one that is not in the mapping is still readable:
underscores and dashes become spaces and the first letter is a capital ("gpu_fell_off_the_bus" -> "Gpu fell off the bus").
"""

from __future__ import annotations

import math

WORDS: dict[str, str] = {
    # ReasonCode (gpufinops.model): why a verdict was given
    "idle_stays_below": "idle: stayed under the threshold",
    "idle_mean_below": "idle: low average",
    "memory_held_idle": "memory held, no compute",
    "bursty_low": "bursty, low average",
    "low_steady": "steadily low",
    "busy": "busy",
    "some_gpus_busy": "some GPUs busy, others idle",
    "no_series": "no metrics reported",
    "query_error": "metrics query failed",
    "low_coverage": "too few metric samples",
    "invalid_data": "metric values out of range",
    "too_young": "too new to judge",
    "not_running": "not running",
    "evidence_of_work": "working: processes or memory seen (no activity counter)",
    "no_activity_counter": "no activity counter, no sign of work",
    "idle_no_processes": "idle: no processes, memory freed",
    # DCGM profiling counters (docs/metrics.md, "Profiling counters")
    "few_sms_busy": "kernels keep few SMs busy (small batches or kernels)",
    "tensor_idle": "tensor cores unused (FP32 math)",
    "counters_disagree": "activity counters disagree",
    "power_without_activity": "draws power with no activity reported",
    "learned_wait": "learned policy waiting (retired)",
    "learned_idle": "idle under the learned policy (retired)",
    # ActionKind: what the service did
    "mark": "warned, stop scheduled",
    "stop": "stopped",
    "terminate": "terminated",
    "unmark": "scheduled stop called off",
    "skip": "stop held back",
    "notify": "owner told (notify-only rule)",
    "snooze": "snoozed by a person",
    "restore": "scaled back up by a person",
    # action status
    "done": "done",
    # notification status
    "outbox": "written to the outbox file (no Slack token)",
    "sent": "sent to Slack",
    "failed": "failed to send",
    # verdicts
    "ACTIVE": "active",
    "IDLE": "idle",
    "UNDERUTILIZED": "underutilized",
    "UNKNOWN": "not judged (unknown)",
}


def readable(code: str) -> str:
    """Any code as words: underscores and dashes as spaces, the first letter a capital."""
    text = " ".join(str(code).replace("_", " ").replace("-", " ").split())
    return text[:1].upper() + text[1:] if text else "–"


def words(code) -> str:
    """What a person reads for a stored code; "–" for none."""
    if code is None or code == "" or (isinstance(code, float) and math.isnan(code)):
        return "–"
    return WORDS.get(str(code)) or readable(str(code))


# An action's status (the store's actions table), where it differs from a message's status of the same name.
ACTION_STATUS_WORDS = {"failed": "failed", "pending": "not finished (intent recorded)",
                       "unconfirmed": "not confirmed by the cloud", "abandoned": "abandoned"}


def action_words(kind: str, status: str, dry_run: bool, count: int) -> str:
    """One line of the month's action summary: "scheduled stop called off ×70", "stopped (dry-run) ×3"."""
    text = words(kind)
    if dry_run:
        text += " (dry-run)"
    if status != "done":
        text += f", {ACTION_STATUS_WORDS.get(status) or readable(status).lower()}"
    return f"{text} ×{count}"


__all__ = ["WORDS", "action_words", "readable", "words"]
