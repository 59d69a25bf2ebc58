"""Words for people: the one table from the codes the service stores (reason codes, action kinds, message
statuses, verdicts) to what Slack, email and the report say. A FinOps lead forwards the report to finance, who
never saw `bursty_low`; an owner reading a warning should not need to either.

`WORDS` (short: a table cell, a breakdown), `HINTS` (what an owner can check, by reason code: in messages),
`REPORT_HINTS` (the same advice as the monthly report's one-line hint column, pointing at its sections);
`format_duration`, the one spelling of a duration (model hands it on).
Codes are added by other parts of the service over time; one that is not in the mapping is still readable:
underscores and dashes become spaces and the first letter is a capital ("gpu_fell_off_the_bus" -> "Gpu fell off
the bus").
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

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
    "billed_while_stopped": "powered off but still allocated and billed (Azure)",
    "evidence_of_work": "working: processes or memory seen (no activity counter)",
    "no_activity_counter": "no activity counter, no sign of work",
    "idle_no_processes": "idle: no processes, memory freed",
    # Kubernetes GPU nodes (decide.workloads.empty_gpu_nodes)
    "node_without_gpu_pods": "GPU node without GPU pods",
    "node_has_gpu_pods": "GPU node with GPU pods",
    "node_not_watched_long_enough": "GPU node not watched free for the window yet",
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
    "power_off": "powered off, still billed until deallocated (Azure)",
    # A GCE VM's instances.suspend (an audit row "suspend: ..." of kind stop): what it keeps billing, in one phrase.
    "suspend": "its memory state and disks are kept, stored and billed; its vCPU and GPU billing ends",
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
    "sent": "sent (Slack, or accepted by the mail server)",
    "failed": "failed to send",
    # verdicts
    "ACTIVE": "active",
    "IDLE": "idle",
    "UNDERUTILIZED": "underutilized",
    "UNKNOWN": "not judged (unknown)",
}


# Said wherever a power-off is announced or reported (warning, done notice, audit row, rules check): a powered-off
# Azure VM keeps its hardware and its bill.
POWER_OFF_BILLING = ("powering off keeps the VM allocated: Azure bills its compute until the VM is deallocated "
                     "(a rule with action: stop deallocates it)")


def format_duration(seconds: float | None) -> str:
    """The one spelling of a duration for people (messages, reasons, reports, the CLI): '45 s', '1 min 30 s', '14 min',
    '2 h', '3 h 05 min', '7 d', '2 d 4 h'; negative counts as 0, None/NaN as unknown. (The one parser, of what a config
    says ('10m', '1h30m'), is rules.parse_duration; rules.duration_spec spells a duration back that way.)"""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "unknown"
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{int(s)} s"
    if s < 600 and int(s) % 60:
        return f"{int(s) // 60} min {int(s) % 60:02d} s"  # short spans exactly: a 90 s window is not "2 min"
    minutes = int(round(s / 60))
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 24 * 60:
        h, m = divmod(minutes, 60)
        return f"{h} h" if m == 0 else f"{h} h {m:02d} min"
    d, h = divmod(int(round(s / 3600)), 24)
    return f"{d} d" if h == 0 else f"{d} d {h} h"


def readable(code: str) -> str:
    """Any code as words: underscores and dashes as spaces, the first letter a capital."""
    text = " ".join(str(code).replace("_", " ").replace("-", " ").split())
    return text[:1].upper() + text[1:] if text else "–"


def words(code) -> str:
    """What a person reads for a stored code; "–" for none."""
    if code is None or code == "" or (isinstance(code, float) and math.isnan(code)):
        return "–"
    return WORDS.get(str(code)) or readable(str(code))


# What the owner can check, by why the instance was judged (DOMAIN: low use is not always waste).
HINTS: dict[str, str] = {
    "idle_stays_below": "Nothing ran on its GPUs for the whole window. Stop it when it is not needed.",
    "idle_mean_below": "Its GPUs were almost unused over the window. Stop it when it is not needed.",
    "memory_held_idle": (
        "It holds GPU memory but does no work: a loaded model or a notebook kernel waiting? "
        "Memory held is not work."
    ),
    "bursty_low": (
        "Activity comes in short bursts: likely input-, host- or latency-bound. Check the data pipeline, "
        "batch sizes and host-to-device copies before downsizing."
    ),
    "low_steady": "Low but steady use: a smaller or shared GPU may do the same work for less.",
    "few_sms_busy": (
        "Kernels run nearly all the time but keep few SMs busy: small batches or small kernels, or many tiny "
        "launches. Raise the batch size, fuse kernels or use CUDA graphs; else a MIG slice or a smaller GPU fits."
    ),
    "tensor_idle": (
        "The SMs are busy but the tensor cores are not: FP32 math. bf16, TF32 or mixed precision runs the same "
        "work several times faster on this GPU."
    ),
    "power_without_activity": (
        "Its activity counters read idle but it draws far more power than an idle GPU: the counters may be wrong "
        "(dcgm-exporter issue #662). Not stopped; check the exporter's profiling fields."
    ),
    "counters_disagree": (
        "One activity counter reads idle while another shows work: not judged idle until they agree."
    ),
    "idle_no_processes": (
        "No activity counter here (MIG): judged idle because no process ran and its memory stayed at the idle "
        "floor for the whole window, as the rule's idle_without_activity_counter option allows."
    ),
}


# What a low average most likely means, by the dominant reason code (DOMAIN: low is not always waste).
REPORT_HINTS: dict[str, str] = {
    "idle_stays_below": "idle for long stretches: stop it when unused (see the advice)",
    "idle_mean_below": "idle for long stretches: stop it when unused (see the advice)",
    "memory_held_idle": "memory held with no compute: a loaded model waiting; is it still needed?",
    "bursty_low": ("low but bursty: likely input-, host- or latency-bound; "
                   "check data loading, batch size, request batching"),
    "low_steady": "steadily low: a smaller or shared GPU may fit (see recommendations)",
    "busy": "busy at times, idle between jobs: pack jobs or scale down between them",
    "some_gpus_busy": "some GPUs busy, others idle: fewer GPUs may do",
    "few_sms_busy": ("kernels run all the time on few SMs: raise the batch size, fuse kernels, CUDA graphs; or a MIG "
                     "slice / smaller GPU (see recommendations)"),
    "tensor_idle": "SMs busy but tensor cores unused: bf16, TF32 or mixed precision",
}


def render_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str] | None = None,
                 right: Sequence[str] = (), *, width: int | None = None, wrap: str | None = None) -> str:
    """The one text table of every command: a header of lower-case snake_case column names (the keys of -o json
    and the csv header), a rule under it, one line per row; `right`: columns aligned right (numbers). Here, on
    the lowest floor, so that every part that prints a table (recommend, cli) shares it.

    `width` and `wrap`: the lines fit `width` characters by wrapping the text of column `wrap` (a reason) onto
    continuation lines, the other cells of those lines blank; the wrapped column keeps at least 24 characters."""
    import textwrap

    columns = list(columns if columns is not None else (rows[0].keys() if rows else ()))
    if not columns:
        return ""
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines_of = [[row] for row in cells]
    if width is not None and wrap in columns:
        k = columns.index(wrap)
        room = max(24, width - sum(w for i, w in enumerate(widths) if i != k) - 2 * (len(columns) - 1))
        if widths[k] > room:
            widths[k] = max(room, len(wrap))
            lines_of = []
            for row in cells:
                parts = textwrap.wrap(row[k], widths[k], break_long_words=True, break_on_hyphens=False) or [""]
                lines_of.append([row[:k] + [parts[0]] + row[k + 1:]]
                                + [[""] * k + [part] + [""] * (len(columns) - k - 1) for part in parts[1:]])

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if c in right else v.ljust(w)
                         for v, w, c in zip(values, widths, columns)).rstrip()

    return "\n".join([line(columns), line(["-" * w for w in widths])]
                     + [line(part) for row in lines_of for part in row])


__all__ = ["HINTS", "POWER_OFF_BILLING", "REPORT_HINTS", "WORDS", "format_duration", "readable", "render_table",
           "words"]
