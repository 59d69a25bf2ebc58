"""The command line: `gpufinops <command>`, on top of everything else.

Owns: argument parsing (`app`), the options and exit codes every command shares (`common`), and one module per
capability (`core`: serve, evaluate, rules, audit, demo; `billing`; `recommend`; `backtest`; `report`;
`agent`). May import any part of gpufinops; nothing in gpufinops imports it. Live peers (cloud, Prometheus,
database, Slack) come from `gpufinops.compose`, the one place that builds them.
"""

from .app import build_parser, main

__all__ = ["build_parser", "main"]
