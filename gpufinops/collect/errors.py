"""The error a data source raises when it cannot answer. Light on purpose: the CLI imports it to print a
failed source as one line (exit 1) without loading any client library."""


class QueryFailed(Exception):
    """A query could not be answered; the message is short and holds no secret."""


def answer_excerpt(answer: object, limit: int = 160) -> str:
    """A peer's answer (or an error quoting it) as one short line for a person: bytes decoded (never a b'...'
    repr), an HTML page reduced to its text, whitespace collapsed, clipped to `limit` characters."""
    import re

    text = answer.decode("utf-8", "replace") if isinstance(answer, (bytes, bytearray)) else str(answer)
    text = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", text)
    text = re.sub(r"<[^>]*>", " ", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"
