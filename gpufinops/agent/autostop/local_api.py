"""How a command on the host reaches the agent running there: its GET /v1/verdict path, its bearer token, and the
snooze file it reads (`gpufinops agent snooze` asks it when no --snooze-file is named). The agent's API itself is
agent/verdict_api.py, which takes these names from here."""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from pathlib import Path

log = logging.getLogger("gpufinops.agent")

VERDICT_PATH = "/v1/verdict"
TOKEN_ENV = "GPUFINOPS_AGENT_API_TOKEN"
TOKEN_FILE_ENV = "GPUFINOPS_AGENT_API_TOKEN_FILE"


def agent_token() -> str | None:
    """The bearer token: $GPUFINOPS_AGENT_API_TOKEN, else the file $GPUFINOPS_AGENT_API_TOKEN_FILE names, else None."""
    value = os.environ.get(TOKEN_ENV, "").strip()
    if value:
        return value
    path = os.environ.get(TOKEN_FILE_ENV, "").strip()
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:  # "": a token that cannot be read never opens the API (503 for everyone)
            log.error("%s: cannot read %s: %s", TOKEN_FILE_ENV, path, exc.strerror or exc)
            return ""
    return None


def running_agent_snooze_file(address: str, port: int, timeout_s: float = 2.0) -> str | None:
    """The snooze file the agent running on this host reads, as its GET /v1/verdict says (`snooze_file`); None when
    no agent with autostop answers there. Loopback unless the agent listens on one address only."""
    host = "127.0.0.1" if address in ("", "0.0.0.0", "::", "localhost") else address
    token = agent_token()
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}{VERDICT_PATH}"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as answer:
            path = json.loads(answer.read(65536)).get("snooze_file")
    except (OSError, ValueError, AttributeError):  # no agent, no autostop (404), not JSON: the caller's default
        return None
    return path if isinstance(path, str) and path.strip() else None
