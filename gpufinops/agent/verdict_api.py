"""`GET /v1/verdict` on the agent's port: this host's verdict under its local autostop rules, read-only (issue 27).

The answer is the autostop loop's last judgement (agent/autostop/loop.py): the verdict that drives action
(act.plan.primary_decision over the stop rules that select this host) with its rule, code, reason and figures,
since when it holds (since the agent started at the earliest: past verdicts are not kept), what keeps the host
running (blocks, snooze), and the autostop state: whether a stop is pending and when.

Never "idle" by default: before the first judgement (`no_evaluation_yet`), when the last one is older than three
intervals plus a minute (`stale`), or when no stop rule selects this host (`no_rule`) the verdict is UNKNOWN; a
rule whose window lacks samples is UNKNOWN by `decide.evaluate` itself. Without --autostop the agent judges
nothing: 404 with a JSON error (the ring buffer and the rules only exist with autostop).

Access as the service's /v1/verdicts (gpufinops/httpd.authorize): with a token in $GPUFINOPS_AGENT_API_TOKEN (or in
the file named by $GPUFINOPS_AGENT_API_TOKEN_FILE) every request needs `Authorization: Bearer <token>`; without
one only loopback clients are answered. The token is read per request and never logged.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable, Mapping

from ..act.plan import primary_decision
from ..model import Verdict
from ..httpd import Answer, authorize, figures
from .autostop.local_api import TOKEN_ENV, TOKEN_FILE_ENV, agent_token
from .autostop.machine import Phase

if TYPE_CHECKING:
    from .autostop.loop import AutostopLoop

log = logging.getLogger("gpufinops.agent")

NO_AUTOSTOP = ("this agent runs without local autostop (--autostop RULES), so it judges nothing: ask the service's "
               "/v1/verdicts?host=<this host>, or start the agent with --autostop")


def _iso(t: float | None) -> str | None:
    return datetime.fromtimestamp(t, timezone.utc).isoformat() if t is not None else None


def local_verdict(loop: "AutostopLoop", now: float) -> dict:
    """What the autostop loop thinks of this host now, as JSON (a snapshot of the loop's last tick)."""
    state, decisions, since, tick_at = loop.state, loop.decisions, loop.verdict_since, loop.last_tick_at
    stale_after_s = 3 * loop.interval_s + 60
    primary = primary_decision(decisions)
    why_unknown = None
    if tick_at is None:
        why_unknown = ("no_evaluation_yet", "the local autostop has not judged this host yet (no sample yet)")
    elif now - tick_at > stale_after_s:
        why_unknown = ("stale", f"the last judgement was at {_iso(tick_at)}, more than {stale_after_s:.0f} s ago")
    elif primary is None:
        why_unknown = ("no_rule", "no stop rule of the autostop rules selects this host")
    entry: dict = {"instance_id": loop.host.instance_id, "host": loop.host.hostname, "evaluated_at": _iso(tick_at),
                   "dry_run": loop.dry_run}
    if why_unknown is not None:
        entry.update(verdict=Verdict.UNKNOWN.value, code=why_unknown[0], reason=why_unknown[1], rule=None, since=None,
                     figures=None, rules=[])
    else:
        def since_of(rule: str) -> str | None:
            held = since.get(rule)
            return _iso(held[1]) if held else None

        entry.update(verdict=primary.verdict.value, code=primary.code.value, reason=primary.reason,
                     rule=primary.rule_name, since=since_of(primary.rule_name), figures=figures(primary),
                     rules=[{"rule": d.rule_name, "verdict": d.verdict.value, "code": d.code.value, "reason": d.reason,
                             "since": since_of(d.rule_name), "figures": figures(d)} for d in decisions])
    pending = state.phase is Phase.PENDING
    entry["stop"] = {"pending": pending, "at": _iso(state.deadline) if pending else None,
                     "warned_at": _iso(state.warned_at) if pending else None,
                     "dry_run": (not state.live) if pending else None, "rule": state.rule or None,
                     "phase": state.phase.value, "held_until": _iso(state.held_until), "note": state.note or None}
    entry["kept_running_by"] = list(loop.keeping)  # blocks and snooze found by the last judgement
    # The file `gpufinops agent snooze` writes to reach this agent (it asks here when no --snooze-file is named).
    entry["snooze_file"] = str(loop.paths.snooze)
    return entry


Handler = Callable[[Mapping[str, str], str, str], "tuple[int, str, bytes]"]


def verdict_handler(loop: "AutostopLoop | None", token: Callable[[], str | None] = agent_token) -> Handler:
    """The GET handler for /v1/verdict: the loop's verdict, or 404 when the agent runs without autostop."""

    def handle(headers: Mapping[str, str], query: str, client: str) -> tuple[int, str, bytes]:
        refused = authorize(headers, client, token(), token_name=f"{TOKEN_ENV} / {TOKEN_FILE_ENV}")
        if refused is not None:
            log.info("verdict api: refused %s (%d)", client, refused.status)
            return refused.encoded()
        if query:
            return Answer(400, {"error": "/v1/verdict takes no parameters: it answers for this host only"}).encoded()
        if loop is None:
            return Answer(404, {"error": NO_AUTOSTOP}).encoded()
        return Answer(200, local_verdict(loop, loop.clock())).encoded()

    return handle
