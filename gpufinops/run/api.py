"""The idleness API, read-only, on the service's port (issue 27): what gpufinops thinks of an instance now.

    GET /v1/verdicts?instance=i-0abc   (repeatable)
    GET /v1/verdicts?host=ip-10-0-1-5.ec2.internal   (private DNS name, private IP or a rented host's name)
    GET /v1/verdicts?namespace=ml   (Kubernetes workloads of a namespace)
    GET /v1/verdicts                (the whole fleet of the last tick, by instance id, MAX_INSTANCES_PER_QUERY a
                                     page; `page=2` for the next: the answer's `page`, `pages` and `total` say how many)

Each instance: the verdict that drives action (act.plan.primary_decision) with its rule, code, reason and
figures, since when it holds (the stored state of that rule), whether a stop is pending and when (the mark),
and every rule's decision. The decisions are the last tick's, the same `evaluate -o json` prints for that tick.
An IDLE instance that nothing will stop says why in `stop.not_stopped` ({code, reason}; null otherwise):
`not_opted_in` (it lacks `act.opt_in_tag`), `not_stoppable` (something else manages it, or EC2 cannot stop it)
or `notify_only` (its rule only notifies), so `pending: false` is never left unexplained.

Never "idle" by default: an instance the last tick did not judge, no tick yet, or a last tick older than the
liveness limit is UNKNOWN with the reason (`not_evaluated`, `no_evaluation_yet`, `stale`).

Access: with `api.bearer_token` set (env GPUFINOPS_API_TOKEN by default, or a file) every request needs
`Authorization: Bearer <token>` (compared in constant time, never logged); without one, only loopback clients
are answered. A blank token (set but empty) is refused at load; one that turns blank later answers nobody (503).
At most MAX_INSTANCES_PER_QUERY values per query and instances per answer (400 beyond). With `api.tls` the same answers are also served over mutual TLS on `api.tls.port` (httpd.mutual_tls_server):
a client certificate signed by `api.tls.client_ca_file` is required, plus the bearer token when one is set.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Callable, Mapping
from urllib.parse import parse_qs

from sqlalchemy.exc import SQLAlchemyError

from ..act.plan import opt_in_gap, primary_decision, stop_blocker
from ..model import Action, Decision, GpuInstance, Verdict
from ..httpd import Answer, authorize, figures

if TYPE_CHECKING:
    from ..config import ApiSettings
    from ..store.store import Store
    from .pipeline import RunReport

log = logging.getLogger("gpufinops.api")

VERDICTS_PATH = "/v1/verdicts"
NAMESPACE_TAG = "k8s:namespace"  # places.kubernetes.names.TAG_NAMESPACE
# One query answers at most this many instances, and asks by at most this many values (ids, hosts, namespaces):
# 3,000 unknown ids would otherwise be a 1 MB answer of UNKNOWN entries.
MAX_INSTANCES_PER_QUERY = 500


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt is not None else None


class VerdictApi:
    """Answers /v1/verdicts from the last tick (`last()` -> (RunReport or None, tick end)) and the store."""

    def __init__(self, settings: "ApiSettings", store: "Store", last: Callable[[], "tuple[RunReport | None, datetime | None]"],
                 clock: Callable[[], datetime], stale_after_s: float, opt_in: tuple[str, str] | None = None):
        self.settings, self.store, self.last, self.clock, self.stale_after_s = settings, store, last, clock, stale_after_s
        self.opt_in = opt_in  # (act.opt_in_tag, act.opt_in_value): None tells no opt-in gap

    def handle(self, headers: Mapping[str, str], query: str, client: str) -> tuple[int, str, bytes]:
        refused = authorize(headers, client, self.settings.bearer_token.resolve())
        if refused is not None:
            log.info("api: refused %s (%d)", client, refused.status)
            return refused.encoded()
        return self.answer(parse_qs(query)).encoded()

    def handle_mutual_tls(self, headers: Mapping[str, str], query: str, client: str) -> tuple[int, str, bytes]:
        """The same answer over the mutual-TLS listener (`api.tls`): the handshake has verified the client's
        certificate against `api.tls.client_ca_file`, which is the access; a bearer token, when one is set, is
        required as well (a stolen certificate alone is not enough)."""
        token = self.settings.bearer_token.resolve()
        refused = authorize(headers, client, token) if token is not None else None
        if refused is not None:
            log.info("api: refused %s (%d)", client, refused.status)
            return refused.encoded()
        log.debug("api: answered %s", client)
        return self.answer(parse_qs(query)).encoded()

    def answer(self, params: Mapping[str, list[str]]) -> Answer:
        unknown_keys = sorted(set(params) - {"instance", "host", "namespace", "page"})
        wanted = {k: [v for v in params.get(k, []) if v] for k in ("instance", "host", "namespace")}
        if unknown_keys:
            return Answer(400, {"error": "ask by instance=, host= or namespace= (repeatable), or nothing for the "
                                         "whole fleet (page= for its next pages)", "unknown_parameters": unknown_keys})
        if "page" in params:
            if any(wanted.values()):
                return Answer(400, {"error": "page= pages the whole fleet: give it without instance=, host= or "
                                             "namespace="})
            page = params["page"][-1]
            if not page.isdigit() or int(page) < 1 or len(page) > 9:
                return Answer(400, {"error": f"page= is a page number from 1, got {page[:20]!r}"})
        if not any(wanted.values()):
            return self.fleet_page(int(params.get("page", ["1"])[-1]))
        asked_count = sum(len(values) for values in wanted.values())
        if asked_count > MAX_INSTANCES_PER_QUERY:  # each unknown id is an entry too: bound the answer by the ask
            return Answer(400, {"error": f"{asked_count} values asked; at most {MAX_INSTANCES_PER_QUERY} instance=, "
                                         f"host= and namespace= values per query"})
        report, why_unknown, decisions = self.last_tick()
        instances = report.instances if report is not None else []
        found: dict[str, GpuInstance] = {}
        missing: list[tuple[str, str]] = []  # (asked by, value) that matched nothing
        asked = [("instance", v, lambda i, v=v: i.instance_id == v) for v in wanted["instance"]]
        asked += [("host", v, lambda i, h=v.lower(): h in (i.instance_id.lower(), i.private_dns.lower(), i.private_ip))
                  for v in wanted["host"]]
        for by, value, matches in asked:
            match = [i for i in instances if matches(i)]
            if not match:
                missing.append((by, value))
            found.update((i.instance_id, i) for i in match)
        for ns in wanted["namespace"]:
            found.update((i.instance_id, i) for i in instances if i.tags.get(NAMESPACE_TAG) == ns)
        if len(found) > MAX_INSTANCES_PER_QUERY:
            return Answer(400, {"error": f"{len(found)} instances match; at most {MAX_INSTANCES_PER_QUERY} per query"})
        try:
            out = [self.instance_entry(inst, decisions.get(inst.instance_id, []), why_unknown)
                   for inst in sorted(found.values(), key=lambda i: i.instance_id)]
        except SQLAlchemyError as exc:
            log.error("api: database read failed: %s", exc)
            return Answer(503, {"error": "database unavailable"})
        for by, value in missing:
            out.append(self.unknown_entry({by if by == "instance" else "host": value}, why_unknown or (
                "not_evaluated", f"no {'instance' if by == 'instance' else 'host'} {value!r} was judged in the last tick "
                                 "(not in the inventory, not running, or not a GPU instance)")))
        return Answer(200, {"evaluated_at": _iso(report.now) if report is not None else None,
                            "dry_run": report.dry_run if report is not None else None, "instances": out})

    def last_tick(self) -> "tuple[RunReport | None, tuple[str, str] | None, dict[str, list[Decision]]]":
        """The last tick's report, why every verdict is UNKNOWN (no tick yet, or a stale one; None when it is
        fresh), and its decisions by instance."""
        report, tick_end = self.last()
        now = self.clock()
        why_unknown = None
        if report is None:
            why_unknown = ("no_evaluation_yet", "the service has not finished an evaluation tick yet")
        elif tick_end is not None and (now - tick_end).total_seconds() > self.stale_after_s:
            why_unknown = ("stale", f"the last evaluation finished at {tick_end.isoformat()}, "
                                    f"more than {self.stale_after_s:.0f} s ago")
        decisions: dict[str, list[Decision]] = {}
        for d in report.decisions if report is not None else []:
            decisions.setdefault(d.instance_id, []).append(d)
        return report, why_unknown, decisions

    def fleet_page(self, page: int) -> Answer:
        """Every instance of the last tick, by instance id, one page of MAX_INSTANCES_PER_QUERY."""
        report, why_unknown, decisions = self.last_tick()
        fleet = sorted(report.instances if report is not None else [], key=lambda i: i.instance_id)
        pages = max(1, -(-len(fleet) // MAX_INSTANCES_PER_QUERY))
        if page > pages:
            return Answer(400, {"error": f"page {page} of {pages}: the fleet has {len(fleet)} instance(s)"})
        chunk = fleet[(page - 1) * MAX_INSTANCES_PER_QUERY:page * MAX_INSTANCES_PER_QUERY]
        try:
            out = [self.instance_entry(inst, decisions.get(inst.instance_id, []), why_unknown) for inst in chunk]
        except SQLAlchemyError as exc:
            log.error("api: database read failed: %s", exc)
            return Answer(503, {"error": "database unavailable"})
        return Answer(200, {"evaluated_at": _iso(report.now) if report is not None else None,
                            "dry_run": report.dry_run if report is not None else None, "page": page, "pages": pages,
                            "total": len(fleet), "instances": out})

    @staticmethod
    def unknown_entry(ident: dict, why: tuple[str, str]) -> dict:
        return {"instance_id": ident.get("instance"), **({"host": ident["host"]} if "host" in ident else {}),
                "verdict": Verdict.UNKNOWN.value, "code": why[0], "reason": why[1], "rule": None, "since": None,
                "figures": None, "stop": {"pending": False, "at": None, "not_stopped": None}, "rules": []}

    def not_stopped(self, inst: GpuInstance, primary: Decision | None) -> dict | None:
        """Why an IDLE instance will not be stopped ({code, reason}, the same tests act.plan makes), None when
        it may be, or it is not idle."""
        if primary is None or primary.verdict is not Verdict.IDLE:
            return None
        if primary.action == Action.NOTIFY:
            return {"code": "notify_only", "reason": f"rule {primary.rule_name} only notifies"}
        blocker = stop_blocker(inst, primary.action)
        if blocker:
            return {"code": "not_stoppable", "reason": blocker}
        gap = opt_in_gap(inst, *self.opt_in) if self.opt_in else ""
        return {"code": "not_opted_in", "reason": gap} if gap else None

    def instance_entry(self, inst: GpuInstance, decisions: list[Decision], why_unknown: tuple[str, str] | None) -> dict:
        primary = primary_decision(decisions)
        if why_unknown is not None or primary is None:
            why = why_unknown or ("not_evaluated", f"instance is {inst.state}, not judged in the last tick")
            entry = self.unknown_entry({"instance": inst.instance_id}, why)
        else:
            states = {d.rule_name: self.store.get_state(inst.instance_id, d.rule_name) for d in decisions}

            def since(d: Decision) -> str | None:
                s = states.get(d.rule_name)
                return _iso(s.since) if s is not None and s.verdict is d.verdict else None

            entry = {"instance_id": inst.instance_id, "verdict": primary.verdict.value, "code": primary.code.value,
                     "reason": primary.reason, "rule": primary.rule_name, "since": since(primary),
                     "figures": figures(primary),
                     "rules": [{"rule": d.rule_name, "verdict": d.verdict.value, "code": d.code.value,
                                "reason": d.reason, "action": d.action.value, "since": since(d),
                                "evaluated_at": _iso(d.evaluated_at), "figures": figures(d)} for d in decisions]}
        mark = self.store.get_mark(inst.instance_id)
        entry["stop"] = {"pending": mark is not None, "at": _iso(mark.stop_at) if mark else None,
                         "warned_at": _iso(mark.warned_at) if mark else None,
                         "dry_run": mark.dry_run if mark else None, "rule": mark.rule if mark else None,
                         "not_stopped": None if why_unknown is not None else self.not_stopped(inst, primary)}
        entry.update(team=inst.team() or None, gpu_count=inst.gpu_count, gpu_model=inst.gpu_model or None,
                     instance_type=inst.instance_type, hourly_cost=inst.hourly_cost, state=inst.state)
        return entry
