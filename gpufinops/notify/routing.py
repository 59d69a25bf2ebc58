"""Who gets a notice: its audience turned into destinations, and the one Notifier the stages send through.

- team (and owner): the channel the configuration names for the subject (a rule's or budget's channel), else
  the team's (`slack.team_channels`), else `slack.default_channel`.
- owner: every notice about an instance (its audience names "owner": the warning, "Stop cancelled", "Stopped",
  a stop given up, "not stopped: not opted in", a notify-only idle notice, a Restore click's result) reaches its
  owner through the same routes, computed once in `Deliveries.send`: in the channel the owner is mentioned (the
  owner tag a Slack user id, or an email Slack knows); with `slack.dm_owners` a Slack DM too; when Slack cannot
  reach the owner (no Slack token, or no Slack user with that email) and the owner tag is an email address, the
  owner gets it by email (`email:` settings). So an owner who got a warning by email also gets its "Stop
  cancelled" or "Stopped". Without a Slack token, an owner with an address gets every notice about their instance
  by email *instead* of the outbox, and that email is the delivery a stop waits for (the SMTP server accepted it).
- default: `slack.default_channel` (metrics alerts, the daily summary, the weekly digest, a budget without a
  channel). finance: `email.finance` (the monthly report; see notify/__init__.py). No stage outside notify/ names a
  channel for an audience: they send the audience, and this module picks the channel.
- `to` (a rule's `notify_to`, a budget's or the report's channel): destinations with their transport, in order.
  `slack:<channel>` is a chat channel, `email:<address>` an email, `team` the team's channel (else the default),
  `default` the default channel, `owner` the owner's routes (always taken for a notice about an instance with an
  owner: a warning must reach its owner, so naming `owner` only says so). The first chat channel (else the first
  address) is the notice's delivery; every other destination gets a copy. Without a chat channel or address in
  `to`, the notice goes to its channel as above (the team's, else the default).

`Deliveries.send()` answers for the notice's first destination (its key is the notice's own, so
`Store.delivered_at(notice.key)` is that delivery); copies (a DM, an owner's email, a rule's further destinations)
are best effort, each exactly once under its own key (`dm:`, `email:`, `to:<destination>:` before the notice's
key), a follow-up's copy threaded under its warning's copy. A warning's copy goes once the channel has it (its
words say a stop time counted from that delivery); any other notice's copy goes whether or not the channel took
it this time (the channel's retry resends the channel message alone, so a copy that waited for it would never go).
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from ..config import EMAIL_ADDRESS, SLACK_USER_ID, Settings, SlackSettings
from ..model import Notice, Notifier
from .chat import ChatDelivery
from .messages import SLACK_ID_ANSWERED, mention_owner

if TYPE_CHECKING:
    from .email import EmailDelivery
    from .interact import RestoreRequest, SnoozeRequest

log = logging.getLogger("gpufinops.notify")

_DM_CONVERSATION = re.compile(r"D[A-Z0-9]{6,}")  # Slack's id of a direct-message conversation


def email_address(owner: str) -> str | None:
    """The owner tag as an email address, or None when it is not one."""
    owner = (owner or "").strip()
    return owner if EMAIL_ADDRESS.fullmatch(owner) else None


def chat_channel(notice: Notice, slack: SlackSettings) -> str:
    """The chat channel of a notice: as configured for its subject, else its team's, else the default."""
    if notice.channel:
        return notice.channel
    if notice.team and slack.team_channels.get(notice.team):
        return slack.team_channels[notice.team]
    return slack.default_channel


def destinations(notice: Notice, slack: SlackSettings) -> tuple[list[str], list[str]]:
    """(chat channels, email addresses) a notice's `to` names, in order, each once (pure; see the module's doc).
    `owner` adds none here: the owner's routes are taken for every notice about an owned instance."""
    channels: list[str] = []
    addresses: list[str] = []
    for where in notice.to:
        transport, _, target = where.partition(":")
        if transport == "slack":
            channels.append(target)
        elif transport == "email":
            addresses.append(target)
        elif where == "team":
            channels.append(chat_channel(replace(notice, channel=""), slack))
        elif where == "default":
            channels.append(slack.default_channel)
    return list(dict.fromkeys(channels)), list(dict.fromkeys(addresses))


class Deliveries:
    """The Notifier of every stage: routes each notice (above) to chat (Slack or the outbox) and email."""

    def __init__(self, chat: ChatDelivery, settings: Settings, email: "EmailDelivery | None" = None):
        self.chat = chat
        self.settings = settings
        self.email = email

    def user_info(self, user_id: str) -> dict:
        """users.info of a clicking user (Slack only; {} without a Slack delivery): what authorises an email owner."""
        lookup = getattr(self.chat, "user_info", None)
        return lookup(user_id) if lookup is not None else {}

    def tell_privately(self, channel_id: str, user_id: str, text: str) -> bool:
        """A line only the clicking user reads (Slack only)."""
        tell = getattr(self.chat, "tell_privately", None)
        return bool(tell(channel_id, user_id, text)) if tell is not None else False

    def offers_buttons(self) -> bool:
        """Whether a click on a notice's buttons reaches the service (verified): else none is offered."""
        return self.settings.slack.interactive()

    def _chat_reaches_people(self) -> bool:
        return bool(self.settings.slack.token.resolve())

    def send(self, notice: Notice) -> bool:
        if notice.actions and not self.offers_buttons():
            notice = replace(notice, actions=())  # a button nobody's click can reach would promise nothing true
        address = email_address(notice.owner) if _about_owner(notice) else None
        channels, addresses = destinations(notice, self.settings.slack)
        if self.email is None and addresses:
            log.warning("%s: email destinations %s need the email delivery (email.enabled): not sent",
                        notice.key, ", ".join(addresses))
            addresses = []
        if address and self.email is not None and not self._chat_reaches_people():
            delivered = self.email.send(notice, to=address)
            self._copy_to(notice, notice, [], [a for a in addresses if a != address], delivered)
            return delivered
        if "finance" in notice.audience and self.email is not None and self.settings.email.finance:
            return self.email.send(notice, to=self.settings.email.finance)
        owner_id = self.owner_slack_id(notice, address) if _about_owner(notice) else None
        chat_notice = mention_owner(notice, owner_id) if owner_id else notice
        if address and not owner_id and self.email is not None:
            addresses = [a for a in addresses if a != address]  # the owner's own email route (below) has it
        if not channels and not addresses:
            channels = [chat_channel(notice, self.settings.slack)]
        if channels:
            delivered = self.chat.send(replace(chat_notice, channel=channels[0]))
        else:
            delivered = self.email.send(notice, to=addresses[0])  # type: ignore[union-attr]  # addresses need email
        self._copy_to(notice, chat_notice, channels[1:], addresses[0 if channels else 1:], delivered)
        if _about_owner(notice) and (delivered or notice.kind != "warning"):
            self._copy_to_owner(notice, chat_notice, owner_id, address)
        return delivered

    def _copy_to(self, notice: Notice, chat_notice: Notice, channels: list[str], addresses: list[str],
                 delivered: bool) -> None:
        """The further destinations of a notice's `to`, each a copy under its own key (`to:<destination>:`), a
        follow-up's under its warning's copy; a warning's once it is delivered (its words count the lead from
        then), as the owner's copies."""
        if not delivered and notice.kind == "warning":
            return
        for channel in channels:
            route = f"to:slack:{channel}"
            self.chat.send(replace(chat_notice, key=f"{route}:{notice.key}", channel=channel,
                                   thread_key=_copy_key(route, notice.thread_key)))
        for to in addresses:
            route = f"to:email:{to}"
            copy = replace(notice, key=f"{route}:{notice.key}", thread_key=_copy_key(route, notice.thread_key))
            self.email.send(copy, to=to)  # type: ignore[union-attr]  # send() keeps addresses only with email on

    def owner_slack_id(self, notice: Notice, address: str | None) -> str | None:
        """The owner's Slack user id: the owner tag when it is one, else the user Slack finds by the tag's email
        (users.lookupByEmail, remembered in the store); None when the owner is not an audience or not known."""
        owner = notice.owner.strip() if "owner" in notice.audience else ""
        if SLACK_USER_ID.fullmatch(owner):
            return owner
        lookup = getattr(self.chat, "user_id_for_email", None)
        found = lookup(owner) if address and lookup is not None else None
        return found if isinstance(found, str) and SLACK_ID_ANSWERED.fullmatch(found) else None

    def _copy_to_owner(self, notice: Notice, chat_notice: Notice, owner_id: str | None, address: str | None) -> None:
        """A notice about an instance to its owner too: a Slack DM when Slack knows them and `dm_owners` is on,
        else an email to the tag's address (when only an address is known). Each copy under its own key, and a
        follow-up (a cancel, a stop) under its warning's copy, never in the channel's thread."""
        if owner_id and self.settings.slack.dm_owners:
            if _in_a_dm(notice.channel, owner_id):
                return  # a reply in the owner's own DM (a click on the DM copy) reached them already
            self.chat.send(replace(chat_notice, key=f"dm:{notice.key}", channel=owner_id, audience=("person",),
                                   thread_key=_copy_key("dm", notice.thread_key)))
        elif address and not owner_id and self.email is not None:
            self.email.send(replace(notice, key=f"email:{notice.key}",
                                    thread_key=_copy_key("email", notice.thread_key)), to=address)

    def retry_due(self, now: datetime) -> int:
        done = self.chat.retry_due(now)
        if self.email is not None:
            done += self.email.retry_due(now)
        return done

    def show_snoozed(self, req: "SnoozeRequest", until: datetime, dry_run: bool) -> bool:
        """The warning a button was on, edited in place: who snoozed it until when (Slack only)."""
        from .slack_blocks import snoozed_in_place
        if not (req.channel_id and req.message_ts):
            return False
        text, blocks = snoozed_in_place(req.blocks, user=req.user_id or req.user_name, until=until, dry_run=dry_run)
        return self.chat.update(req.channel_id, req.message_ts, text, blocks)


    def show_restored(self, req: "RestoreRequest", said: str, keep_button: bool) -> bool:
        """The stop notice a Restore button was on, edited in place: what the click came to (Slack only)."""
        from .slack_blocks import restored_in_place
        if not (req.channel_id and req.message_ts):
            return False
        text, blocks = restored_in_place(req.blocks, said, keep_button=keep_button)
        return self.chat.update(req.channel_id, req.message_ts, text, blocks)


def _about_owner(notice: Notice) -> bool:
    """A notice about an instance with an owner: every such notice takes the owner's routes (mention, DM, email)."""
    return "owner" in notice.audience and bool(notice.owner.strip())


def _in_a_dm(channel: str, owner_id: str) -> bool:
    """Whether a notice's own channel is the owner's direct messages (their user id, or a `D…` conversation id)."""
    return channel == owner_id or bool(_DM_CONVERSATION.fullmatch(channel or ""))


def _copy_key(route: str, key: str) -> str:
    """The key of a copy (`dm:`, `email:`) of the notice `key` names; "" stays "" (no parent)."""
    return f"{route}:{key}" if key else ""


def deliveries(notifier: Notifier, settings: Settings) -> Deliveries:
    """`notifier` as a Deliveries (routing added to a bare chat delivery, as tests and the agent pass one)."""
    return notifier if isinstance(notifier, Deliveries) else Deliveries(notifier, settings)
