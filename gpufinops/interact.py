"""People acting on a warning: a verified Slack button click becomes a snooze request; the leader applies it.

A click reaches `POST /slack/actions` on whichever replica Slack's request lands. There it is
1. verified: Slack's signature over the raw body with the signing secret (slack-sdk `SignatureVerifier`), a
   timestamp within 5 minutes of this clock, and a signature seen only once (a replayed request is refused);
2. parsed: a `block_actions` payload whose button is one of `messages.SNOOZE_ACTIONS`;
3. allowed or not: the instance is read from the cloud (its tags now, not the message's), and the clicking user
   must be its owner (owner tag = their Slack id, name or email), one of its team's members
   (`slack.team_members`), or an admin (`slack.snooze_admins`);
4. stored as a request (kv `snooze_request:<instance>`): the act stage of the replica holding the scheduler lease
   sets the snooze tag through the one chokepoint (`Actuator.apply_snooze_requests`) before it plans, so the
   snooze holds on that very tick, and updates the message in place ("Snoozed by @ana until 14:00").
Forged, stale, replayed and refused clicks change nothing and are logged; a refused click that names an instance
is written to the audit log with the Slack user. A click can only ever keep an instance running.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping
from urllib.parse import parse_qs
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .config import Settings
from .messages import SNOOZE_ACTIONS
from .model import ActionKind, ActionResult, Cloud, GpuInstance
from .store import Store

log = logging.getLogger("gpufinops.interact")

REQUEST_PREFIX = "snooze_request:"
SEEN_PREFIX = "slack_click_seen:"
MAX_AGE_S = 5 * 60  # Slack's own window for a request's timestamp; a signature is remembered this long
TOMORROW_AT_HOUR = 9

UserLookup = Callable[[str], Mapping[str, Any]]  # Slack user id -> users.info "user" (name, tz, profile.email)


@dataclass(frozen=True)
class Click:
    user_id: str
    user_name: str
    action_id: str
    instance_id: str
    channel_id: str
    message_ts: str
    blocks: tuple[dict, ...]


@dataclass(frozen=True)
class SnoozeRequest:
    instance_id: str
    until: str  # the snooze tag's value, ISO-8601 UTC
    user_id: str
    user_name: str
    action_id: str
    channel_id: str
    message_ts: str
    requested_at: str
    blocks: tuple[dict, ...] = ()
    recorded: bool = False  # dry-run: the request was audited and the message updated once already

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> "SnoozeRequest":
        data = json.loads(text)
        data["blocks"] = tuple(data.get("blocks") or ())
        return SnoozeRequest(**data)


@dataclass(frozen=True)
class Answer:
    """What the endpoint answers Slack: HTTP status and a short text (Slack shows non-2xx as a failed click)."""

    status: int
    text: str


class _FixedClock:
    def __init__(self, now: datetime):
        self._now = now

    def now(self) -> float:
        return self._now.timestamp()


def verify(headers: Mapping[str, str], body: bytes, secret: str, now: datetime) -> str | None:
    """None when the request is Slack's, signed with this secret within 5 minutes of now; else why not."""
    from slack_sdk.signature import SignatureVerifier

    lowered = {k.lower(): v for k, v in headers.items()}
    if not lowered.get("x-slack-signature") or not lowered.get("x-slack-request-timestamp"):
        return "no Slack signature"
    if not SignatureVerifier(secret, clock=_FixedClock(now)).is_valid_request(body, lowered):
        return "bad signature or a timestamp more than 5 minutes off"
    return None


def parse_click(body: bytes) -> Click | str:
    """The button click in a form-encoded `payload=`; a string saying what is wrong otherwise."""
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=True)
        payload = json.loads(form["payload"][0])
    except (UnicodeDecodeError, ValueError, KeyError, IndexError):
        return "not a Slack interaction payload"
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        return "not a button click"
    actions = payload.get("actions") or []
    action = actions[0] if actions and isinstance(actions[0], dict) else {}
    if action.get("action_id") not in SNOOZE_ACTIONS:
        return f"unknown action {str(action.get('action_id'))[:40]!r}"
    user = payload.get("user") or {}
    container = payload.get("container") or {}
    channel = (payload.get("channel") or {}).get("id") or container.get("channel_id") or ""
    message = payload.get("message") or {}
    iid = str(action.get("value") or "")
    if not user.get("id") or not iid.startswith("i-") or len(iid) > 40:
        return "click without a user or an instance"
    return Click(str(user["id"]), str(user.get("username") or user.get("name") or user["id"]),
                 str(action["action_id"]), iid, str(channel), str(container.get("message_ts") or message.get("ts") or ""),
                 tuple(b for b in message.get("blocks") or () if isinstance(b, dict)))


def may_snooze(click: Click, user: Mapping[str, Any], inst: GpuInstance, settings: Settings) -> tuple[bool, str]:
    """Whether this Slack user may snooze this instance, and why (the reason goes to the audit log)."""
    slack = settings.slack
    if click.user_id in slack.snooze_admins:
        return True, "an admin (slack.snooze_admins)"
    owner = inst.owner().strip().lower()
    email = str((user.get("profile") or {}).get("email") or "").lower()
    names = {click.user_id.lower(), click.user_name.lower(), str(user.get("name") or "").lower(), email} - {""}
    if owner and owner in names:
        return True, "its owner (owner tag)"
    team = inst.team()
    if team and click.user_id in slack.team_members.get(team, ()):
        return True, f"a member of team {team} (slack.team_members)"
    who = f"owner tag {inst.owner()!r}" if owner else "no owner tag"
    return False, f"not its owner ({who}), not in team {team or '(none)'}'s members, not an admin"


def snooze_until(action_id: str, now: datetime, tz_name: str | None, max_snooze_s: int) -> datetime:
    """When the snooze asked for ends: 2 h, tomorrow 09:00 in the user's time zone (UTC if unknown), or the
    7 days of "keep running"; never past the act stage's snooze cap."""
    if action_id == "gpufinops_snooze_2h":
        until = now + timedelta(hours=2)
    elif action_id == "gpufinops_snooze_tomorrow":
        try:
            zone = ZoneInfo(tz_name) if tz_name else timezone.utc
        except (ZoneInfoNotFoundError, ValueError):
            zone = timezone.utc
        local = now.astimezone(zone) + timedelta(days=1)
        until = local.replace(hour=TOMORROW_AT_HOUR, minute=0, second=0, microsecond=0).astimezone(timezone.utc)
    else:
        until = now + timedelta(days=7)
    return min(until, now + timedelta(seconds=max_snooze_s))


def handle_click(headers: Mapping[str, str], body: bytes, *, settings: Settings, store: Store, cloud: Cloud,
                 users: UserLookup, now: datetime) -> Answer:
    """One POST /slack/actions: verify, parse, check, store the request. Never changes the cloud."""
    secret = settings.slack.signing_secret.resolve()
    if not secret:
        return Answer(404, "interactivity is not configured (slack.signing_secret)")
    problem = verify(headers, body, secret, now)
    if problem:
        log.warning("refused a Slack click: %s", problem)
        return Answer(401, problem)
    signature = {k.lower(): v for k, v in headers.items()}["x-slack-signature"]
    seen_key = SEEN_PREFIX + hashlib.sha256(signature.encode()).hexdigest()[:32]
    if store.get_kv(seen_key) is not None:
        log.warning("refused a replayed Slack click")
        return Answer(409, "this request was already handled")
    store.set_kv(seen_key, now.isoformat())
    forget_old_signatures(store, now)
    click = parse_click(body)
    if isinstance(click, str):
        log.warning("refused a Slack click: %s", click)
        return Answer(400, click)
    try:
        found = cloud.describe([click.instance_id])
    except Exception as exc:  # noqa: BLE001 - unknown stays unknown: nothing is stored, the user clicks again
        log.error("Slack click on %s: the instance cannot be read: %s", click.instance_id, exc)
        return Answer(503, "the instance cannot be read right now; nothing changed, try again")
    if not found:
        return Answer(404, f"{click.instance_id} not found")
    inst = found[0]
    try:
        user = users(click.user_id) or {}
    except Exception as exc:  # noqa: BLE001 - without users.info only the id and name can match
        log.warning("users.info for %s failed: %s", click.user_id, exc)
        user = {}
    allowed, why = may_snooze(click, user, inst, settings)
    label = SNOOZE_ACTIONS[click.action_id]
    if not allowed:
        log.warning("refused %r on %s by %s (%s): %s", label, click.instance_id, click.user_name, click.user_id, why)
        store.record_action("slack", ActionResult(click.instance_id, ActionKind.SNOOZE, settings.act.dry_run, False,
                                                  f"refused {label!r} by {click.user_name} ({click.user_id}): {why}",
                                                  "", now, error="not allowed"))
        return Answer(403, f"not allowed: {why}")
    until = snooze_until(click.action_id, now, user.get("tz"), settings.act.max_snooze_s)
    request = SnoozeRequest(click.instance_id, until.strftime("%Y-%m-%dT%H:%M:%SZ"), click.user_id, click.user_name,
                            click.action_id, click.channel_id, click.message_ts, now.isoformat(), click.blocks)
    store.set_kv(REQUEST_PREFIX + click.instance_id, request.to_json())
    log.info("%r on %s by %s (%s, %s): snooze until %s requested", label, click.instance_id, click.user_name,
             click.user_id, why, request.until)
    return Answer(200, f"snooze until {request.until} requested")


def forget_old_signatures(store: Store, now: datetime) -> None:
    """A signature older than Slack's 5-minute window fails verification anyway: no need to remember it."""
    for key, value in store.kv_items(SEEN_PREFIX):
        try:
            old = datetime.fromisoformat(value) < now - timedelta(seconds=2 * MAX_AGE_S)
        except ValueError:
            old = True
        if old:
            store.set_kv(key, None)


def pending_requests(store: Store) -> list[SnoozeRequest]:
    out = []
    for key, value in store.kv_items(REQUEST_PREFIX):
        try:
            out.append(SnoozeRequest.from_json(value))
        except (ValueError, TypeError):
            log.error("unreadable snooze request %s dropped", key)
            store.set_kv(key, None)
    return out


def forget_request(store: Store, instance_id: str) -> None:
    store.set_kv(REQUEST_PREFIX + instance_id, None)


def keep_request(store: Store, request: SnoozeRequest) -> None:
    store.set_kv(REQUEST_PREFIX + request.instance_id, request.to_json())
