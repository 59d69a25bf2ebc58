"""Who a Slurm job's user is to the notifiers: an email address (a domain rule, a map file) and a Slack user id.

Slurm knows a user by their login name only. The cluster's settings say how to reach them: `email_domain`
(alice -> alice@<domain>), `email_map` (a file of `user address` lines, overriding the domain) and `slack_users`
(a file of `user U0123ABCD` lines). The listing puts the result in the job's `owner` tag, which notify/routing.py
reads as it does any owner: a Slack id is mentioned (and DM'd with slack.dm_owners), an address gets email when
Slack cannot reach it (and Slack finds the person by that address when it can). A bad line is an error naming the
file and the line, at start, never a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ...config import ConfigError

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_SLACK_ID = re.compile(r"^[UW][A-Z0-9]{8,20}$")


class PeopleMapError(ConfigError):
    """A user map file that cannot be read: names the file and line (a config error: one line, exit 2)."""


def read_map(path: str | Path, what: str, valid: re.Pattern) -> dict[str, str]:
    out: dict[str, str] = {}
    first_line: dict[str, int] = {}
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise PeopleMapError(f"{path}: cannot read the Slurm {what} map: {exc.strerror}") from None
    for n, raw in enumerate(lines, 1):
        try:  # a comment is not read: only the line's body must be UTF-8
            body = raw.split(b"#", 1)[0].decode("utf-8").strip()
        except UnicodeDecodeError:
            raise PeopleMapError(f"{path}:{n}: not UTF-8 text (the Slurm {what} map is read as UTF-8)") from None
        if not body:
            continue
        parts = body.split()
        if len(parts) != 2 or not valid.fullmatch(parts[1]):
            raise PeopleMapError(f"{path}:{n}: expected `<slurm user> <{what}>`, got {body[:80]!r}")
        if parts[0] in out and out[parts[0]] != parts[1]:
            # Two answers for one user: which one the warning went to would depend on line order.
            raise PeopleMapError(f"{path}:{n}: user {parts[0][:40]!r} is already given {out[parts[0]]!r} on line "
                                 f"{first_line[parts[0]]}")
        out[parts[0]] = parts[1]
        first_line.setdefault(parts[0], n)
    return out


@dataclass(frozen=True)
class People:
    email_domain: str | None = None
    emails: Mapping[str, str] = field(default_factory=dict)
    slack_ids: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings) -> "People":
        """From a SlurmClusterSettings (its email_domain, email_map, slack_users)."""
        emails = read_map(settings.email_map, "email address", _EMAIL) if settings.email_map else {}
        slack = read_map(settings.slack_users, "Slack user id", _SLACK_ID) if settings.slack_users else {}
        return cls(settings.email_domain, emails, slack)

    def email(self, user: str) -> str:
        if not user:
            return ""
        return self.emails.get(user) or (f"{user}@{self.email_domain}" if self.email_domain else "")

    def owner(self, user: str) -> str:
        """The owner tag: the Slack id where the map has one (it is explicit), else the email address, else ""."""
        return self.slack_ids.get(user) or self.email(user)
