"""The chat delivery's protocol: what a chat transport offers beyond model.Notifier's send/retry.

Slack (notify/delivery.SlackNotifier) and its outbox (notify/delivery.Outbox) are the chat deliveries today;
notify/routing.Deliveries holds one and is the only caller of what is below, so no stage outside notify/ knows
which chat it is: the snooze shown in place on its warning (`Deliveries.show_snoozed`), the owner found by email
(`Deliveries.owner_slack_id`), the clicking person's profile and a private answer (`run/service.py` asks
`Deliveries.user_info` / `tell_privately`). A second chat (a Teams webhook) implements this protocol; where it
cannot edit or look up, it answers False / None / {} and the notice itself still goes.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from ..model import Notifier


class ChatDelivery(Notifier, Protocol):
    def update(self, channel_id: str, ts: str, text: str, blocks: Sequence[dict]) -> bool:
        """Edit a delivered chat message in place (a snooze shown on its warning); False when it was not edited."""
        ...

    def user_id_for_email(self, email: str) -> str | None:
        """The chat's user id of the person with this email, None when unknown (or the chat cannot look up)."""
        ...
