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


def snooze_buttons(instance_id: str, actions: Sequence[str] | None = None) -> dict:
    """The actions block of a warning; each button's value is the instance id (checked again on click)."""
    from .messages import SNOOZE_ACTIONS
    value = " ".join(str(instance_id).split())[:100]
    elements = [{"type": "button", "action_id": action_id, "text": {"type": "plain_text", "text": label},
                 "value": value} for action_id, label in SNOOZE_ACTIONS.items()
                if actions is None or action_id in actions]
    if elements:
        elements[0]["style"] = "primary"
    return {"type": "actions", "block_id": SNOOZE_BLOCK_ID, "elements": elements}


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
        blocks.append(snooze_buttons(notice.subject, notice.actions))
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


def _utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
