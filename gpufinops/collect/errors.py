"""The error a data source raises when it cannot answer. Light on purpose: the CLI imports it to print a
failed source as one line (exit 1) without loading any client library."""


class QueryFailed(Exception):
    """A query could not be answered; the message is short and holds no secret."""
