"""People acting on a notice: a verified Slack button click becomes a snooze or restore request; the leader applies it.

A click reaches `POST /slack/actions` on whichever replica Slack's request lands, or, with Slack Socket Mode
(`slack.socket_mode`, no public URL needed), one replica's WebSocket as an `interactive` envelope
(notify/socket_mode.py: the socket is opened with the app-level token, so steps 1 and 2 are that; step 3 claims
the envelope id). Both transports then call `handle_verified`: one authorisation, one audit. Over HTTP it is
1. verified: `X-Slack-Request-Timestamp` must be a Unix time in seconds within 5 minutes of this clock and
   `X-Slack-Signature` a `v0=<64 hex>` signature, Slack's, over the raw body with the signing secret (slack-sdk
   `SignatureVerifier`). A missing, non-numeric or absurd header is refused like a forged one: 401, logged;
2. parsed: a form-encoded `payload=` holding a JSON `block_actions` click by a Slack user id (`messages.SLACK_USER_ID`)
   on one of `messages.BUTTON_LABELS` (a Snooze button names an EC2 instance or a Kubernetes subject, Restore a
   Kubernetes subject);
   anything else is 400, logged;
3. claimed once: the signature is written with one INSERT that the database refuses a second time
   (`Store.claim_kv`), so of any number of copies of a request, even sent at the same instant, one goes on and
   the others get 409;
4. allowed or not, by Slack user id only: the instance is read from the cloud (its tags now, not the message's),
   and the clicking user id must be its owner (owner tag = that id, or an email equal to the `profile.email`
   users.info gives for that id), one of its team's people (`slack.team_members`) or an admin
   (`slack.snooze_admins`), both lists of ids or emails matched the same way. The payload's user name or display
   name never authorises anyone: anyone can take any name. users.info failing refuses an email match, with the
   reason; it is never a 500;
5. stored as a request (kv `snooze_request:<instance>`): the act stage of the replica holding the scheduler lease
   sets the snooze tag through the one chokepoint (`Actuator.apply_snooze_requests`) before it plans, so the
   snooze holds on that very tick, and updates the message in place ("Snoozed by @ana until 14:00").
   Restore (on the notice that gpufinops scaled a workload to zero, suspended a Kueue job or cordoned a node): the
   subject must still be in that state; the request is claimed once per subject (kv `restore_request:<id>`, one
   INSERT: a double click, or two people at once, is one request); the leader's next tick restores it through
   the function `gpufinops k8s restore` uses (act/restore.py), then edits the notice and replies with the result.
Forged, stale, malformed, replayed and refused clicks change nothing and are logged (a line, no traceback); only the
signature of a verified, well-formed click is remembered; a refused click that names an instance is written to
the audit log with the Slack user id. A click can only ever keep an instance running, or bring back what gpufinops
itself stopped.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping
from urllib.parse import parse_qs
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.exc import SQLAlchemyError

from ..config import Settings
from ..config import SLACK_USER_ID
from ..places.kubernetes.names import ID_PREFIX, MAX_ID_LEN
from ..places.registry import SLURM_ID_PREFIX
from .messages import BUTTON_LABELS, RESTORE_ACTION, is_stop_key_of
from .slack_blocks import notice_key_of
from ..model import TAG_SNOOZE, ActionKind, ActionResult, Cloud, GpuInstance, is_azure_vm_id
from .markup import redact, without_endpoints
from ..store.store import Store

log = logging.getLogger("gpufinops.interact")

# The chat the buttons are clicked in, as the audit's reasons and the replies name it ("with a Slack button"): the
# one place outside the Slack modules that says which chat it is, so act/ words a click without naming it.
CHAT = "Slack"
REQUEST_PREFIX = "snooze_request:"
# The action id of a snooze asked on the command line (`gpufinops slurm snooze`), not with a chat button.
CLI_SNOOZE_ACTION = "cli-snooze"
RESTORE_PREFIX = "restore_request:"
# A click whose restore got no clear answer: told again once reconcile settles its row (act/restore.py).
UNSETTLED_RESTORE_PREFIX = "restore_unsettled:"
SEEN_PREFIX = "slack_click_seen:"
MAX_AGE_S = 5 * 60  # Slack's own window for a request's timestamp; a signature is remembered this long
TOMORROW_AT_HOUR = 9
# Slack's headers as Slack sends them; anything else is refused before slack-sdk sees it (it would raise on
# "abc" or on a timestamp too large for a float, and compare_digest raises on non-ASCII).
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")

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
    notice_key: str = ""  # the notice a Restore button was on (its block id): the result replies to it


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
class RestoreRequest:
    """A person's verified, allowed Restore click, waiting for the leader's tick (act/restore.py)."""

    instance_id: str
    user_id: str
    user_name: str
    channel_id: str
    message_ts: str
    notice_key: str
    requested_at: str
    blocks: tuple[dict, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> "RestoreRequest":
        data = json.loads(text)
        data["blocks"] = tuple(data.get("blocks") or ())
        return RestoreRequest(**data)


@dataclass(frozen=True)
class Answer:
    """What the endpoint answers Slack: HTTP status and a short text (Slack shows non-2xx as a failed click).
    `tell`: (channel id, Slack user id) of a clicker who should read `text` privately (chat.postEphemeral): a
    refused or failed click, or one that adds nothing (a Restore already requested, nothing to restore), where
    Slack itself shows only a warning sign over HTTP and nothing at all over Socket Mode (the ack carries no
    answer). A replayed click tells nobody: its first copy did."""

    status: int
    text: str
    tell: tuple[str, str] | None = None


class _FixedClock:
    def __init__(self, now: datetime):
        self._now = now

    def now(self) -> float:
        return self._now.timestamp()


def verify(headers: Mapping[str, str], body: bytes, secret: str, now: datetime) -> str | None:
    """None when the request is Slack's, signed with this secret within 5 minutes of now; else why not."""
    from slack_sdk.signature import SignatureVerifier

    lowered = {k.lower(): v for k, v in headers.items()}
    timestamp = (lowered.get("x-slack-request-timestamp") or "").strip()
    signature = (lowered.get("x-slack-signature") or "").strip()
    if not signature or not timestamp:
        return "no Slack signature"
    if not _TIMESTAMP.fullmatch(timestamp):
        return "X-Slack-Request-Timestamp is not a Unix time in seconds"
    if not _SIGNATURE.fullmatch(signature):
        return "X-Slack-Signature is not a v0 signature"
    if abs(now.timestamp() - int(timestamp)) > MAX_AGE_S:
        return "the timestamp is more than 5 minutes off"
    checked = {"x-slack-request-timestamp": timestamp, "x-slack-signature": signature}
    if not SignatureVerifier(secret, clock=_FixedClock(now)).is_valid_request(body, checked):
        return "bad signature"
    return None


def _obj(value: Any) -> dict:
    """A JSON object of the payload, or {} when Slack's field is not one (never an AttributeError)."""
    return value if isinstance(value, dict) else {}


def parse_click(body: bytes) -> Click | str:
    """The button click in a form-encoded `payload=` (POST /slack/actions); a string saying what is wrong otherwise."""
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=True)
        payload = json.loads(form["payload"][0])
    except (UnicodeDecodeError, ValueError, KeyError, IndexError):
        return "not a Slack interaction payload"
    return parse_payload(payload)


def parse_payload(payload: Any) -> Click | str:
    """The button click in an interaction payload (the JSON of either transport); a string saying what is wrong."""
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        return "not a button click"
    actions = payload.get("actions")
    action = _obj(actions[0]) if isinstance(actions, list) and actions else {}
    if not isinstance(action.get("action_id"), str) or action["action_id"] not in BUTTON_LABELS:
        return f"unknown action {str(action.get('action_id'))[:40]!r}"
    user, container, message = _obj(payload.get("user")), _obj(payload.get("container")), _obj(payload.get("message"))
    channel = _obj(payload.get("channel")).get("id") or container.get("channel_id") or ""
    user_id, iid = str(user.get("id") or ""), str(action.get("value") or "")
    if not SLACK_USER_ID.fullmatch(user_id) or not _names_its_subject(action["action_id"], iid):
        return "click without a Slack user id or an instance"
    blocks = message.get("blocks") if isinstance(message.get("blocks"), list) else ()
    message_ts = str(container.get("message_ts") or message.get("ts") or "")
    # The notice a Restore button was on, only as a key to reply under: never trusted for anything else.
    notice_key = notice_key_of(action.get("block_id")) if action["action_id"] == RESTORE_ACTION else ""
    return Click(user_id, str(user.get("username") or user.get("name") or user_id)[:80], str(action["action_id"]),
                 iid, str(channel), message_ts, tuple(b for b in blocks if isinstance(b, dict)),
                 notice_key if is_stop_key_of(notice_key, iid) else "")


def _names_its_subject(action_id: str, iid: str) -> bool:
    """Restore names a Kubernetes workload's or node's id (collect's); Snooze that, an EC2 instance id or an Azure VM's
    (a warning of any kind carries the Snooze buttons, and the snooze is the same tag, `gpufinops:snooze-until`, or
    annotation, `gpufinops.io/snooze-until`, a person could write)."""
    k8s = iid.startswith(ID_PREFIX) and len(iid) <= MAX_ID_LEN
    if action_id == RESTORE_ACTION:
        return k8s
    # A Slurm job's warning carries them too: the snooze is written into its Comment (places.slurm).
    slurm = iid.startswith(SLURM_ID_PREFIX) and len(iid) <= MAX_ID_LEN
    return k8s or slurm or (iid.startswith("i-") and len(iid) <= 40) or is_azure_vm_id(iid)


def _is_person(entry: str, user_id: str, email: str) -> bool:
    """Whether a configured person or an owner tag is the clicking user: their Slack id, or an email equal to the
    one users.info gives for that id. A name is never anyone: the payload's user name is not proof."""
    entry = entry.strip()
    if SLACK_USER_ID.fullmatch(entry.upper()):
        return entry.upper() == user_id
    return "@" in entry and bool(email) and entry.lower() == email


def may_act(click: Click, user: Mapping[str, Any], inst: GpuInstance, settings: Settings,
            users_info_error: str = "") -> tuple[bool, str]:
    """Whether this Slack user id may click a button of this instance (snooze it, restore it), and why (the reason
    goes to the audit log). `user` is users.info's answer for `click.user_id` ({} when it failed, and
    `users_info_error` says why)."""
    slack = settings.slack
    email = str(_obj(user.get("profile")).get("email") or "").strip().lower()
    if any(_is_person(p, click.user_id, email) for p in slack.snooze_admins):
        return True, "an admin (slack.snooze_admins)"
    owner = inst.owner().strip()
    if owner and _is_person(owner, click.user_id, email):
        return True, "its owner (owner tag)"
    team = inst.team()
    if team and any(_is_person(p, click.user_id, email) for p in slack.team_members.get(team, ())):
        return True, f"a member of team {team} (slack.team_members)"
    if not owner:
        who = "no owner tag"
    elif SLACK_USER_ID.fullmatch(owner.upper()):
        who = f"owner tag {owner!r} is another Slack user"
    elif "@" in owner:
        who = f"owner tag {owner!r} is an email, " + (
            f"and users.info for {click.user_id} failed ({users_info_error})" if users_info_error else
            f"and users.info gives no email for {click.user_id} (scope users:read.email)" if not email else
            f"not the email of {click.user_id}")
    else:
        who = f"owner tag {owner!r} is neither a Slack user id nor an email, so no click matches it"
    return False, f"not its owner ({who}), not in team {team or '(none)'}'s members, not an admin"


def _lookup_failed(exc: Exception) -> str:
    """users.info's error code when Slack answered one, else the exception, short and without a token."""
    answer = getattr(exc, "response", None)  # slack_sdk's SlackApiError carries Slack's answer
    data = getattr(answer, "data", None)
    if isinstance(getattr(answer, "status_code", None), int) and answer.status_code != 200:
        return f"HTTP {answer.status_code}"  # Slack's edge: its body is an HTML page, not a reason
    if isinstance(data, dict) and data.get("error"):
        return str(data["error"])[:80]
    return redact(f"{type(exc).__name__}: {exc}")[:200]


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
    """One POST /slack/actions: verify the signature, then `handle_verified` (parse, claim, check, store the
    request) with the signature as what is claimed. Never changes the cloud; never raises for anything a request
    can carry."""
    secret = settings.slack.signing_secret.resolve()
    if not secret:
        return Answer(404, "interactivity is not configured (slack.signing_secret)")
    problem = verify(headers, body, secret, now)
    if problem:
        log.warning("refused a Slack click: %s", problem)
        return Answer(401, problem)
    click = parse_click(body)
    if isinstance(click, str):
        log.warning("refused a Slack click: %s", click)
        return Answer(400, click)
    signature = {k.lower(): v for k, v in headers.items()}["x-slack-signature"].strip()
    return handle_verified(click, signature, settings=settings, store=store, cloud=cloud, users=users, now=now)


def handle_socket_envelope(envelope_id: Any, payload: Any, *, settings: Settings, store: Store, cloud: Cloud,
                           users: UserLookup, now: datetime) -> Answer:
    """One `interactive` envelope of Slack Socket Mode (notify/socket_mode.py). The socket was opened with the
    app-level token, so what comes through it is Slack's; the envelope id is claimed once, like a signature,
    so a redelivered envelope changes nothing. The same parse, claim, check and store as POST /slack/actions."""
    if not isinstance(envelope_id, str) or not envelope_id.strip() or len(envelope_id) > 200:
        log.warning("refused a Slack Socket Mode envelope: no envelope id")
        return Answer(400, "no envelope id")
    click = parse_payload(payload)
    if isinstance(click, str):
        log.warning("refused a Slack click (Socket Mode): %s", click)
        return Answer(400, click)
    return handle_verified(click, "socket-mode:" + envelope_id, settings=settings, store=store, cloud=cloud,
                           users=users, now=now)


def handle_verified(click: Click, claim: str, *, settings: Settings, store: Store, cloud: Cloud, users: UserLookup,
                    now: datetime) -> Answer:
    """A click its transport has verified as Slack's: claimed once (`claim`: the request's signature, or the Socket
    Mode envelope id), then allowed or refused by Slack user id, and stored as a request or audited as a refusal.
    Both transports end here: one authorisation, one audit."""
    seen_key = SEEN_PREFIX + hashlib.sha256(claim.encode()).hexdigest()[:32]
    try:
        if not store.claim_kv(seen_key, now.isoformat()):
            log.warning("refused a replayed Slack click by %s on %s", click.user_id, click.instance_id)
            return Answer(409, "this request was already handled")
        forget_old_signatures(store, now)
        return _allowed_click(click, settings=settings, store=store, cloud=cloud, users=users, now=now)
    except SQLAlchemyError as exc:  # the database is down: say so, keep nothing half-done, the user clicks again
        log.error("Slack click on %s: the database cannot be written: %s", click.instance_id, type(exc).__name__)
        return Answer(503, "the click cannot be recorded right now; nothing changed, try again",
                      (click.channel_id, click.user_id))


def _allowed_click(click: Click, *, settings: Settings, store: Store, cloud: Cloud, users: UserLookup,
                   now: datetime) -> Answer:
    """A verified, claimed click: read the instance and the user, decide, store the request or the refusal."""
    try:
        found = cloud.describe([click.instance_id])
    except Exception as exc:  # noqa: BLE001 - unknown stays unknown: nothing is stored, the user clicks again
        log.error("Slack click on %s: the instance cannot be read: %s", click.instance_id, exc)
        return Answer(503, "the instance cannot be read right now; nothing changed, try again",
                      (click.channel_id, click.user_id))
    if not found:
        nothing = "nothing to restore" if click.action_id == RESTORE_ACTION else "nothing to keep running"
        return Answer(404, f"{click.instance_id} not found: {nothing}", (click.channel_id, click.user_id))
    inst = found[0]
    lookup_error = ""
    try:
        user = _obj(users(click.user_id))
    except Exception as exc:  # noqa: BLE001 - without users.info only the id can match; the reason says so
        lookup_error = _lookup_failed(exc)
        log.warning("users.info for %s failed: %s", click.user_id, lookup_error)
        user = {}
    allowed, why = may_act(click, user, inst, settings, lookup_error)
    label = BUTTON_LABELS[click.action_id]
    kind = ActionKind.RESTORE if click.action_id == RESTORE_ACTION else ActionKind.SNOOZE
    if not allowed:
        log.warning("refused %r on %s by %s (%s): %s", label, click.instance_id, click.user_id, click.user_name, why)
        store.record_action("slack", ActionResult(click.instance_id, kind, settings.act.dry_run, False,
                                                  f"refused {label!r} by {click.user_id} ({click.user_name}): {why}",
                                                  "", now, error="not allowed"))
        return Answer(403, f"{label!r} on {click.instance_id} not allowed: {without_endpoints(why)}",
                      (click.channel_id, click.user_id))
    if kind == ActionKind.RESTORE:
        return _restore_requested(click, inst, why, store=store, now=now)
    tz = user.get("tz") if isinstance(user.get("tz"), str) else None
    until = snooze_until(click.action_id, now, tz, settings.act.max_snooze_s)
    request = SnoozeRequest(click.instance_id, until.strftime("%Y-%m-%dT%H:%M:%SZ"), click.user_id, click.user_name,
                            click.action_id, click.channel_id, click.message_ts, now.isoformat(), click.blocks)
    store.set_kv(REQUEST_PREFIX + click.instance_id, request.to_json())
    log.info("%r on %s by %s (%s, %s): snooze until %s requested", label, click.instance_id, click.user_id,
             click.user_name, why, request.until)
    if inst.snooze_tag_is_a_persons:
        # What the tick will do (act: apply_snooze_requests), said to the clicker now: the tag is not rewritten.
        return Answer(200, f"snooze of {click.instance_id} until {request.until} requested. It already carries "
                           f"{TAG_SNOOZE}={inst.tags[TAG_SNOOZE][:64]!r}: gpufinops leaves that tag as it is (on EC2 "
                           f"only a person changes or ends a snooze tag) and, unless the tag's snooze already lasts "
                           f"that long, keeps the instance running until {request.until} by its own record (no "
                           f"warning, no stop before then); other tools see only the tag",
                      (click.channel_id, click.user_id))
    return Answer(200, f"snooze until {request.until} requested")


def _restore_requested(click: Click, inst: GpuInstance, why: str, *, store: Store, now: datetime) -> Answer:
    """An allowed Restore click: stored as the one request of its subject, or told why not (privately)."""
    tell = (click.channel_id, click.user_id)
    if inst.state != "stopped":  # what the read-back of a restore looks for, the other way round
        return Answer(409, f"{click.instance_id} is {inst.state} now, not scaled down, suspended or cordoned by "
                           f"gpufinops: nothing to restore", tell)
    request = RestoreRequest(click.instance_id, click.user_id, click.user_name, click.channel_id, click.message_ts,
                             click.notice_key, now.isoformat(), click.blocks)
    if not store.claim_kv(RESTORE_PREFIX + click.instance_id, request.to_json()):
        earlier = store.get_kv(RESTORE_PREFIX + click.instance_id)
        try:
            who = f"<@{RestoreRequest.from_json(earlier).user_id}>" if earlier else "someone"
        except (ValueError, TypeError):  # unreadable: the tick drops it (pending_restores) and this click is told
            who = "someone"
        log.info("'Restore' on %s by %s: already requested by %s", click.instance_id, click.user_id, who)
        return Answer(200, f"a restore of {click.instance_id} is already requested (by {who}); gpufinops does it "
                           f"once, on its next tick", tell)
    log.info("'Restore' on %s by %s (%s, %s): requested", click.instance_id, click.user_id, click.user_name, why)
    return Answer(200, f"restore of {click.instance_id} requested: gpufinops does it on its next tick")


def forget_old_signatures(store: Store, now: datetime) -> None:
    """A signature older than Slack's 5-minute window fails verification anyway: no need to remember it."""
    for key, value in store.kv_items(SEEN_PREFIX):
        try:
            old = datetime.fromisoformat(value) < now - timedelta(seconds=2 * MAX_AGE_S)
        except ValueError:
            old = True
        if old:
            store.set_kv(key, None)


def _pending(store: Store, prefix: str, parse: Callable[[str], Any], what: str) -> list:
    """The requests stored under `prefix`, parsed; an unreadable one is dropped, logged."""
    out = []
    for key, value in store.kv_items(prefix):
        try:
            out.append(parse(value))
        except (ValueError, TypeError, KeyError):
            log.error("unreadable %s request %s dropped", what, key)
            store.set_kv(key, None)
    return out


def pending_requests(store: Store) -> list[SnoozeRequest]:
    """The Snooze clicks waiting for the leader's tick."""
    return _pending(store, REQUEST_PREFIX, SnoozeRequest.from_json, "snooze")


def forget_request(store: Store, instance_id: str) -> None:
    store.set_kv(REQUEST_PREFIX + instance_id, None)


def keep_request(store: Store, request: SnoozeRequest) -> None:
    store.set_kv(REQUEST_PREFIX + request.instance_id, request.to_json())


def pending_restores(store: Store) -> list[RestoreRequest]:
    """The Restore clicks waiting for the leader's tick."""
    return _pending(store, RESTORE_PREFIX, RestoreRequest.from_json, "restore")


def forget_restore(store: Store, instance_id: str) -> None:
    store.set_kv(RESTORE_PREFIX + instance_id, None)


def keep_restore(store: Store, request: RestoreRequest) -> None:
    store.set_kv(RESTORE_PREFIX + request.instance_id, request.to_json())


def remember_unsettled_restore(store: Store, request: RestoreRequest, target: str) -> None:
    """A click whose restore's outcome is not known yet, with what it restores (`NS/Kind/NAME`, `node/NAME`)."""
    store.set_kv(UNSETTLED_RESTORE_PREFIX + request.instance_id, json.dumps({"target": target,
                                                                           "request": request.to_json()}))


def unsettled_restores(store: Store) -> list[tuple[RestoreRequest, str]]:
    """The clicks remember_unsettled_restore kept: (request, target)."""
    def parse(text: str) -> tuple[RestoreRequest, str]:
        data = json.loads(text)
        return RestoreRequest.from_json(data["request"]), str(data["target"])

    return _pending(store, UNSETTLED_RESTORE_PREFIX, parse, "unsettled restore")


def forget_unsettled_restore(store: Store, instance_id: str) -> None:
    store.set_kv(UNSETTLED_RESTORE_PREFIX + instance_id, None)
