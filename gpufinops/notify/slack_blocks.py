"""A Notice as Slack shows it: Block Kit (header, section, fields, list sections, context, buttons).

Inside Slack's limits whatever the notice holds: 50 blocks a message, 3000 characters a text object, 2000 a
field, 10 fields a section, 150 characters a header. The notice's markup is Slack mrkdwn already (values
escaped &, <, >; *bold*, `code`) except its times, `<t:EPOCH>`, shown here in each reader's own time zone.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Iterable, Mapping, Sequence

from ..config import SLACK_USER_ID
from ..model import TAG_SNOOZE, Notice
from .markup import clip, escape, when

MAX_BLOCKS = 50
MAX_TEXT = 3000
MAX_FIELD = 2000
MAX_FIELDS = 10
MAX_HEADER = 150
MAX_FALLBACK = 3000

SNOOZE_BLOCK_ID = "gpufinops_snooze"
# The Restore button's block id is this, ":" and the key of the notice it is on: a click names the notice, so
# that the result is a reply to it (Slack gives a click the block id it was drawn with; 255 characters at most).
RESTORE_BLOCK_ID = "gpufinops_restore"
MAX_BLOCK_ID = 255

# The icon before each kind's title.
_ICONS = {"warning": ":hourglass:", "stopped": ":octagonal_sign:", "cancelled": ":white_check_mark:",
          "idle": ":zzz:", "metrics_unavailable": ":warning:", "summary": ":bar_chart:"}
_TIME = re.compile(r"<t:(\d+)>")


def slack_time(text: str) -> str:
    """The notice's `<t:EPOCH>` as Slack's date token (the reader's zone; UTC as the fallback)."""
    def sub(m: re.Match) -> str:
        dt = datetime.fromtimestamp(int(m.group(1)), timezone.utc)
        return f"<!date^{m.group(1)}^{{date_short_pretty}} {{time}}|{when(dt)}>"
    return _TIME.sub(sub, text)


def clip_mrkdwn(text: str, limit: int = MAX_TEXT) -> str:
    return clip(text, limit)


def _header(text: str) -> dict:
    text = text if len(text) <= MAX_HEADER else text[: MAX_HEADER - 1] + "…"
    return {"type": "header", "text": {"type": "plain_text", "text": text, "emoji": True}}


def _section(text: str) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip_mrkdwn(slack_time(text), MAX_TEXT)}}


def _fields(pairs: Iterable[tuple[str, str]]) -> dict:
    fields = [
        {"type": "mrkdwn", "text": clip_mrkdwn(slack_time(f"*{label}*\n{value}"), MAX_FIELD)}
        for label, value in list(pairs)[:MAX_FIELDS]
    ]
    return {"type": "section", "fields": fields}


def _context(*texts: str) -> dict:
    return {"type": "context",
            "elements": [{"type": "mrkdwn", "text": clip_mrkdwn(slack_time(t), MAX_TEXT)} for t in texts[:10]]}


def _list_sections(lines: Sequence[str]) -> list[dict]:
    """Pack list lines into as few sections as fit MAX_TEXT each."""
    sections: list[dict] = []
    chunk: list[str] = []
    size = 0
    for line in (slack_time(x) for x in lines):
        if chunk and size + len(line) + 1 > MAX_TEXT - 10:
            sections.append(_section("\n".join(chunk)))
            chunk, size = [], 0
        chunk.append(line)
        size += len(line) + 1
    if chunk:
        sections.append(_section("\n".join(chunk)))
    return sections


def buttons(instance_id: str, actions: Sequence[str], notice_key: str = "") -> dict:
    """The actions block of a notice; each button's value is the instance id (checked again on click). Snooze
    buttons share one block; the Restore button's block names the notice (`RESTORE_BLOCK_ID:<key>`)."""
    from .messages import BUTTON_LABELS, RESTORE_ACTION
    value = " ".join(str(instance_id).split())[:100]
    elements = [{"type": "button", "action_id": action_id, "text": {"type": "plain_text", "text": label},
                 "value": value} for action_id, label in BUTTON_LABELS.items() if action_id in actions]
    if elements:
        elements[0]["style"] = "primary"
    block_id = f"{RESTORE_BLOCK_ID}:{notice_key}"[:MAX_BLOCK_ID] if RESTORE_ACTION in actions else SNOOZE_BLOCK_ID
    return {"type": "actions", "block_id": block_id, "elements": elements}


def notice_key_of(block_id: str) -> str:
    """The notice key a Restore button's block id carries ("" for any other block)."""
    head = RESTORE_BLOCK_ID + ":"
    return block_id[len(head):] if isinstance(block_id, str) and block_id.startswith(head) else ""


def title_of(notice: Notice) -> str:
    icon = ":test_tube:" if notice.kind == "stopped" and notice.dry_run else _ICONS.get(notice.kind, "")
    return f"{icon} {notice.title}" if icon else notice.title


def render(notice: Notice) -> tuple[str, tuple[dict, ...]]:
    """(fallback text, blocks) as chat.postMessage takes them."""
    text = clip_mrkdwn(slack_time(notice.text), MAX_FALLBACK)
    if notice.blocks or not (notice.title or notice.lead):
        return text, tuple(notice.blocks)
    blocks: list[dict] = [_header(title_of(notice))]
    if notice.dry_run:
        blocks.append(_context(":test_tube: *DRY-RUN*: nothing is changed on any instance; this shows what "
                               "*would* happen."))
    if notice.lead:
        blocks.append(_section(notice.lead))
    if notice.facts:
        blocks.append(_fields(notice.facts))
    blocks += _list_sections(notice.lines)
    if notice.actions:
        blocks.append(buttons(notice.subject, notice.actions, notice.key))
    for note in notice.notes:
        blocks.append(_context(note))
    return text, tuple(blocks[:MAX_BLOCKS])


def snoozed_in_place(blocks: Sequence[Mapping], *, user: str, until: datetime, dry_run: bool) -> tuple[str, list[dict]]:
    """The warning as it reads after a click: its buttons replaced by who snoozed it until when."""
    who = f"<@{escape(user[:40])}>" if SLACK_USER_ID.fullmatch(user or "") else escape(" ".join(str(user).split())[:60])
    said = f":zzz: Snoozed by {who} until <t:{int(_utc(until).timestamp())}>" + (
        " (dry-run: recorded by gpufinops, no tag set on the instance)" if dry_run else
        f": `{TAG_SNOOZE}` is set, no stop before then.")
    kept = [dict(b) for b in blocks if b.get("block_id") != SNOOZE_BLOCK_ID]
    kept.append(_context(said))
    return clip_mrkdwn(slack_time(said), MAX_FALLBACK), kept[:MAX_BLOCKS]


def restored_in_place(blocks: Sequence[Mapping], said: str, *, keep_button: bool) -> tuple[str, list[dict]]:
    """The stop notice as it reads after a Restore click: `said` (what the click came to) added under it, and its
    button removed unless it may be clicked again (a restore that failed or whose outcome is not known)."""
    kept = [dict(b) for b in blocks
            if keep_button or not str(b.get("block_id") or "").startswith(RESTORE_BLOCK_ID)]
    kept = kept[:MAX_BLOCKS - 1] + [_context(said)]
    return clip_mrkdwn(slack_time(said), MAX_FALLBACK), kept


def _utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
