"""The one Prometheus client (`PromReader`): auth and TLS from the settings (`connect`, `auth_of`), every failure
one short QueryFailed naming host:port (`translated_errors`), the count of HTTP queries sent. The collector, the
backtest, right-sizing and places.kubernetes.usage read through it."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Mapping
from urllib.parse import urlparse

import msgspec
import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from gpufinops.collect.errors import QueryFailed, answer_excerpt
from gpufinops.config import PrometheusSettings

MAX_POINTS = 10_000  # steps per range query: under Prometheus' 11,000 points per series


@contextmanager
def translated_errors(where: str, timeout_s: float):
    """Whatever a Prometheus HTTP call raises becomes one short QueryFailed (no secrets, no stack)."""
    try:
        yield
    except requests.exceptions.JSONDecodeError:  # a proxy's HTML page, a truncated body
        raise QueryFailed(f"prometheus at {where}: malformed answer (not JSON)") from None
    except requests.Timeout:
        raise QueryFailed(f"prometheus at {where}: timed out after {timeout_s:g}s") from None
    except requests.ConnectionError:
        raise QueryFailed(f"prometheus at {where}: cannot connect") from None
    except requests.RequestException as exc:
        raise QueryFailed(f"prometheus at {where}: {type(exc).__name__}") from None
    except PrometheusApiClientException as exc:
        raise QueryFailed(f"prometheus at {where}: {str(exc)[:200]}") from None
    except (ValueError, KeyError, TypeError):  # body not JSON or not the API's shape
        raise QueryFailed(f"prometheus at {where}: malformed answer") from None


def refusal(path: str, status: int, body: bytes) -> str:
    """Pure: what is wrong with one answer of the API, in words for the person who set `prometheus.url`; "" when it
    is a 200 with the API's JSON ({"status": ...}). Never the body's bytes repr: its text, one short line."""
    head = body[:200].lstrip()
    looks_like_api = head.startswith(b"{") and b'"status"' in head
    if status == 200:
        if looks_like_api:
            return ""
        return (f"this is not a Prometheus API: {path} answered 200 with "
                f"{'an HTML page' if head[:1] == b'<' else 'something other than its JSON'} "
                f"({answer_excerpt(body, 80)}): check prometheus.url")
    if looks_like_api:  # Prometheus' own refusal (a bad query, an overloaded server): its error says why
        try:
            answer = msgspec.json.decode(body)
            return f"HTTP {status}: {answer.get('errorType', 'error')}: {answer_excerpt(answer.get('error', ''))}"
        except (msgspec.DecodeError, AttributeError):
            pass
    if status == 404:
        return (f"HTTP 404 for {path}: no Prometheus API there; prometheus.url is the server's base URL "
                f"(e.g. http://prometheus:9090, or the path prefix it is served under)")
    return f"HTTP {status}: {answer_excerpt(body) or 'empty answer'}"


def auth_of(settings: PrometheusSettings) -> tuple[dict[str, str], tuple[str, str] | None]:
    """HTTP headers and basic auth for the Prometheus API, from the env vars / files the settings name."""
    headers = {}
    token = settings.bearer_token.resolve()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    auth = None
    if settings.basic_auth_user:
        auth = (settings.basic_auth_user, settings.basic_auth_password.resolve() or "")
    return headers, auth


def connect(settings: PrometheusSettings, session: requests.Session | None = None) -> PrometheusConnect:
    """The one way gpufinops opens the Prometheus API: auth from settings, TLS as configured, no retries
    (a failed query is reported and the next run tries again; a read timeout stays a ReadTimeout)."""
    headers, auth = auth_of(settings)
    return PrometheusConnect(url=settings.url.rstrip("/"), headers=headers or None,
                             disable_ssl=not settings.verify_tls, retry=Retry(0, read=False), auth=auth,
                             session=session, timeout=settings.timeout_s)


def endpoint_of(url: str) -> str:
    """host[:port] of a Prometheus URL: how errors name it (never the credentials a URL may hold)."""
    parsed = urlparse(url)
    where = parsed.hostname or "prometheus"
    return f"{where}:{parsed.port}" if parsed.port else where


class PromReader:
    """The one way gpufinops reads Prometheus (collector, backtest, right-sizing, learned policy): the client
    from `connect` (bearer or basic auth, TLS, timeout), every failure one short QueryFailed naming host:port,
    and the count of HTTP queries sent. Answers are the API's `result` lists, shape-checked."""

    def __init__(self, settings: PrometheusSettings, session: requests.Session | None = None):
        self.settings = settings
        self.where = endpoint_of(settings.url)
        self.queries_made = 0
        self._lock = threading.Lock()  # the collector sends its queries from several threads
        if session is None:
            session = requests.Session()
            session.verify = settings.verify_tls
        connect(settings, session)  # mounts its adapter without retries on the session
        self._session = session
        self._url = settings.url.rstrip("/")
        self._headers, self._auth = auth_of(settings)

    def _get(self, path: str, params: Mapping[str, str], timeout: float) -> bytes:
        """The body of one GET of the API (as prometheus_api_client sends it: same session, auth, TLS), unparsed:
        the caller decodes it with the shape it expects. A status other than 200, or an answer that is not the
        Prometheus API's JSON, is one short QueryFailed saying which (`refusal`)."""
        response = self._session.get(f"{self._url}{path}", params=params, headers=self._headers or None,
                                     auth=self._auth, verify=self._session.verify, cert=self._session.cert,
                                     timeout=timeout)
        problem = refusal(path, response.status_code, response.content)
        if problem:
            raise QueryFailed(f"prometheus at {self.where}: {problem}")
        return response.content

    def instant_body(self, promql: str, at: float, timeout_s: float | None = None) -> bytes:
        """/api/v1/query at `at` (epoch s), the answer's bytes (the collector decodes them typed: `parse_body`)."""
        timeout, params = self._timeouts(timeout_s)
        with translated_errors(self.where, timeout):
            return self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}", **params}, timeout)

    def _timeouts(self, timeout_s: float | None) -> tuple[float, dict[str, str]]:
        timeout = self.settings.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self.queries_made += 1
        # Server-side timeout as float seconds: Prometheus rejects "2.5s" (400).
        return timeout, {"timeout": f"{max(timeout, 0.001):.3f}"}

    def instant(self, promql: str, at: float, timeout_s: float | None = None) -> list[dict]:
        """/api/v1/query at `at` (epoch s)."""
        timeout, params = self._timeouts(timeout_s)
        with translated_errors(self.where, timeout):
            body = self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}", **params}, timeout)
            answer = msgspec.json.decode(body)["data"]["result"]
        return self._series(answer, ("value", "values"))  # a subquery answers a range vector

    def range(self, promql: str, start: float, end: float, step_s: float, *, max_points: int = MAX_POINTS,
              timeout_s: float | None = None) -> list[dict]:
        """/api/v1/query_range over [start, end] (epoch s) every `step_s`, in pages of at most `max_points` steps
        (Prometheus refuses more than 11,000 points per series). The series of every page, in page order: a
        series spanning pages appears once per page, each with its own steps."""
        if max_points < 1 or step_s <= 0:
            raise ValueError(f"range read needs max_points >= 1 and step_s > 0, got {max_points}, {step_s}")
        out: list[dict] = []
        t = start
        while t <= end:
            t1 = min(end, t + (max_points - 1) * step_s)
            timeout, params = self._timeouts(timeout_s)
            # start/end as params: to the millisecond (the client's own arguments round them to seconds).
            params.update(query=promql, start=f"{t:.3f}", end=f"{t1:.3f}", step=f"{step_s:g}")
            with translated_errors(self.where, timeout):
                body = self._get("/api/v1/query_range", params, timeout)
                answer = msgspec.json.decode(body)["data"]["result"]
            out.extend(self._series(answer, ("values",)))
            t = t1 + step_s
        return out

    def _series(self, answer: Any, points: tuple[str, ...]) -> list[dict]:
        ok = isinstance(answer, list) and all(
            isinstance(s, dict) and isinstance(s.get("metric"), dict)
            and any(isinstance(s.get(p), list) for p in points)
            for s in answer)
        if not ok:
            raise QueryFailed(f"prometheus at {self.where}: malformed answer")
        return answer
