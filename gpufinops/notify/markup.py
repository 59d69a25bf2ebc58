"""The small markup of a Notice's text (model.Notice) and what every delivery needs to read it.

Values are entity-escaped (&amp; &lt; &gt;), `*bold*`, `` `code` ``, `<t:EPOCH>` a time. `spans()` splits a text
into (kind, plain text) pieces, entities decoded, for a delivery that escapes on its own (email's autoescaping
templates); `plain()` is the same text for a person reading plain text.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

_TOKEN = re.compile(r"<t:(\d+)>|\*([^*\n]+)\*|`([^`\n]+)`")


def escape(value: object) -> str:
    """Escape the three characters Slack (and the markup) treats as control characters in text."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def when(dt: datetime) -> str:
    """'2024-05-01 12:00 UTC' (naive datetimes are UTC, as in the store)."""
    dt = dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
    return f"{dt:%Y-%m-%d %H:%M} UTC"


def time_token(dt: datetime) -> str:
    dt = dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
    return f"<t:{int(dt.timestamp())}>"


def spans(text: str) -> list[tuple[str, str]]:
    """[(kind, text)] with kind in text/bold/code/time; every piece plain (entities decoded)."""
    out: list[tuple[str, str]] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        if m.start() > pos:
            out.append(("text", unescape(text[pos:m.start()])))
        if m.group(1):
            out.append(("time", when(datetime.fromtimestamp(int(m.group(1)), timezone.utc))))
        elif m.group(2):
            out.append(("bold", unescape(m.group(2))))
        else:
            out.append(("code", unescape(m.group(3))))
        pos = m.end()
    if pos < len(text):
        out.append(("text", unescape(text[pos:])))
    return out


def plain(text: str) -> str:
    """The text as plain text: times in UTC, no markup, entities decoded."""
    return "".join(t for _k, t in spans(text))


def clip(text: str, limit: int) -> str:
    """Clip escaped text to `limit` characters without leaving half an entity (&am…) or half a <token>."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    amp = cut.rfind("&")
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    lt = cut.rfind("<")
    if lt != -1 and ">" not in cut[lt:]:
        cut = cut[:lt]
    return cut + "…"


# A Slack bot/user token (xox?-…) or app-level token (xapp-…) anywhere in a text about to be logged or stored.
_TOKEN_RE = re.compile(r"\b(xox[a-z]|xapp)-[A-Za-z0-9-]+")


def redact(text: str, token: str | None = None) -> str:
    """Remove anything that looks like a Slack token (and the configured token itself)."""
    if token:
        text = text.replace(token, "[redacted]")
    return _TOKEN_RE.sub(lambda m: f"{m.group(1)}-[redacted]", text)


# Where a peer lives (an API server, an admission webhook, a proxy), as exception texts name it. Chat is read by
# more people than the log, and an address inside a cluster or a VPC is a map for an attacker: replies say what
# failed in words, the log keeps the full text.
_KUBE_API_AT = re.compile(r"\bkubernetes API at \S+: ", re.IGNORECASE)
_PROMETHEUS_AT = re.compile(r"\bprometheus at \S+: ", re.IGNORECASE)  # collect/prometheus.py's QueryFailed
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s\"'<>]+", re.IGNORECASE)
_HOST_ARG = re.compile(r"\bhost='[^']*'(?:, port=\d+)?")  # urllib3's HTTPConnectionPool(host='…', port=…)
_HOST_PORT = re.compile(r"(?<![\w.-])(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-f:.]+\]|localhost"
                        r"|(?:[a-z0-9-]+\.)+[a-z][a-z0-9-]*):\d{1,5}(?!\w|\.\d)", re.IGNORECASE)
_IPV4 = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?!\w|\.\d)")  # a sentence's full stop may follow
ADDRESS_WITHHELD = "[address withheld]"


def without_endpoints(text: str) -> str:
    """An error text bound for chat without the addresses it names: "kubernetes API at HOST:PORT: " becomes "the
    Kubernetes API: ", "prometheus at HOST:PORT: " "Prometheus: ", any other URL, host:port or IP address ADDRESS_WITHHELD. Log the full text alongside."""
    text = _KUBE_API_AT.sub("the Kubernetes API: ", text)
    text = _PROMETHEUS_AT.sub("Prometheus: ", text)
    text = _URL.sub(ADDRESS_WITHHELD, text)
    text = _HOST_ARG.sub(f"host='{ADDRESS_WITHHELD}'", text)
    text = _HOST_PORT.sub(ADDRESS_WITHHELD, text)
    return _IPV4.sub(ADDRESS_WITHHELD, text)
