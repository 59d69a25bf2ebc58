"""Email faults (issue 35) against a real SMTP server (aiosmtpd) on 127.0.0.1: a server that accepts the message and
then answers QUIT 421 / 500, resets the connection or says nothing; a report email that failed and the generic
retry; a relay that quotes the AUTH exchange in its 535; an SMTP refusal seen in /readyz and /metrics as the
"email" source, never as "slack".

Each case failed on main at cf636f6: the message was sent again on every retry (7 identical warnings in 20 min),
the report went again without its PDF, the base64 password reached the ERROR line and notifications.detail, and
an SMTP refusal read "slack degraded"."""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
import struct
from datetime import timedelta

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from gpufinops.config import SecretRef, SlackSettings, load_settings
from gpufinops.model import ActionKind, Notice
from gpufinops.notify.delivery import OutboxNotifier
from gpufinops.notify.email import EmailDelivery
from gpufinops.notify.routing import Deliveries
from gpufinops.run.pipeline import SOURCES, Peers
from gpufinops.run.service import Service
from gpufinops.store.store import Store
from tests.act.test_act import RULE, World
from tests.notify.test_email import T0, Clock, Inbox, _free_port, inst, plain_settings, smtp, store, warning  # noqa: F401
from tests.run.test_service import REPO, IdleMetrics, get, samples, serve_http

PASSWORD_ENV = "GPUFINOPS_TEST_SMTP_PASSWORD"
SLACK_TOKEN_ENV = "GPUFINOPS_TEST_SLACK_TOKEN"
PASSWORD = "Tr0ub4dor&3-correct-horse"
USER = "gpufinops"
QUIT_FAULTS = ("quit_421", "quit_500", "quit_reset", "quit_unanswered")
CLIENT_TIMEOUT_S = 1.0  # email.timeout_s of these cases: an unanswered QUIT costs this long


class QuitFaultInbox(Inbox):
    """Accepts every message (250 to the end of DATA), then answers QUIT as `fault` says."""

    def __init__(self, fault: str):
        super().__init__()
        self.fault = fault

    async def handle_QUIT(self, server, session, envelope):
        if self.fault == "quit_421":
            return "421 4.3.2 Service shutting down"
        if self.fault == "quit_500":
            return "500 5.5.1 Command unrecognized"
        if self.fault == "quit_reset":  # an RST, not a FIN: the client's read fails with ECONNRESET
            server.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                                 struct.pack("ii", 1, 0))
            server.transport.abort()
            return "221 never sent"
        await asyncio.sleep(3 * CLIENT_TIMEOUT_S)  # quit_unanswered: silence past the client's timeout
        return "221 Bye"


@pytest.fixture
def serve_smtp():
    """start(handler, **controller kwargs) -> port; every server stopped at teardown."""
    started: list[Controller] = []

    def start(handler, **kwargs) -> int:
        port = _free_port()
        controller = Controller(handler, hostname="127.0.0.1", port=port, **kwargs)
        controller.start()
        started.append(controller)
        return port

    yield start
    for controller in started:
        controller.stop()


def report_notice(month: str = "2026-11") -> Notice:
    """The finance email of `report --deliver` (report/deliver.py builds it the same way)."""
    return Notice(key=f"report-email:{month}", kind="report", subject=month, audience=("finance",),
                  title=f"GPU spend {month}", text=f"GPU spend {month}: see the attached report")


ATTACHMENTS = [("gpufinops-2026-11.pdf", "application/pdf", b"%PDF-1.4 report"),
               ("gpufinops-2026-11.html", "text/html", b"<html>report</html>")]


def email_errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("gpufinops") and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("fault", QUIT_FAULTS)
def test_an_accepted_email_is_delivered_whatever_the_server_answers_to_quit(fault, serve_smtp, store, caplog):
    inbox = QuitFaultInbox(fault)
    clock = Clock(T0)
    delivery = EmailDelivery(plain_settings(serve_smtp(inbox), timeout_s=CLIENT_TIMEOUT_S), store, clock)
    notice = warning(inst())
    assert delivery.send(notice, to="alice@example.com")  # 250 to DATA: delivered
    assert delivery.send(report_notice(), to=["finops@example.com"], attachments=ATTACHMENTS)  # the same path
    row = store.get_notification(notice.key)
    assert row.status == "sent" and store.delivered_at(notice.key) == T0
    assert store.get_notification(report_notice().key).status == "sent"
    for minutes in (2, 10, 60, 240):  # the generic retry and the act stage's resend find nothing to send
        clock.now = T0 + timedelta(minutes=minutes)
        assert delivery.retry_due(clock.now) == 0
        assert delivery.send(notice, to="alice@example.com")
    assert [m["To"] for m in inbox.messages] == ["alice@example.com", "finops@example.com"]
    assert [a.get_filename() for a in inbox.messages[1].iter_attachments()] == [a[0] for a in ATTACHMENTS]
    assert email_errors(caplog) == []  # nothing says "not accepted"


def test_the_owner_gets_exactly_one_warning_and_the_stop_follows_its_full_lead(serve_smtp, tmp_path, monkeypatch):
    """The service's ticks (run_once, act stage) with the owner reachable by email only and QUIT answered 421."""
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    inbox = QuitFaultInbox("quit_421")
    w = World(tmp_path, **{"i-00": {"owner": "bob@example.com"}})
    w.settings = w.settings.model_copy(update={
        "slack": SlackSettings(token=SecretRef(env="GPUFINOPS_TEST_NO_SLACK"), outbox_path=str(tmp_path / "o.jsonl")),
        "email": plain_settings(serve_smtp(inbox), timeout_s=CLIENT_TIMEOUT_S)})
    w.notifier = Deliveries(OutboxNotifier(w.settings.slack, w.store, w.clock), w.settings,
                            EmailDelivery(w.settings.email, w.store, w.clock))
    for _ in range(30):  # 30 minutes: the 15-minute lead twice over
        w.tick()
    subjects = [m["Subject"] for m in inbox.messages if m["To"] == "bob@example.com"]
    warnings = [s for s in subjects if "will be stopped" in s]
    assert len(warnings) == 1, subjects
    warned_at = w.store.delivered_at(w.store.notification_rows()[0]["key"])  # the first row: the warning
    [stop] = w.store.action_rows(kinds=[ActionKind.STOP])
    assert stop.status == "done" and w.cloud.get("i-00").state == "stopped"
    assert stop.at >= warned_at + timedelta(seconds=RULE.warning_lead_s)
    assert sum("stopped" in s.lower() and "will be" not in s for s in subjects) == 1  # one "Stopped"
    assert len(subjects) == len(set(subjects)) == 2


def test_a_failed_report_email_is_never_sent_again_without_its_attachments(serve_smtp, store):
    port = _free_port()  # the mail server is down: connection refused
    clock = Clock(T0)
    delivery = EmailDelivery(plain_settings(port), store, clock)
    notice = report_notice()
    assert not delivery.send(notice, to=["finops@example.com"], attachments=ATTACHMENTS)
    assert store.get_notification(notice.key).status == "failed"
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()  # the server is back
    try:
        for minutes in (2, 30, 24 * 60):  # the running service's generic retry, tick after tick
            clock.now = T0 + timedelta(minutes=minutes)
            assert delivery.retry_due(clock.now) == 0
        assert inbox.messages == []
        row = store.get_notification(notice.key)
        assert row.status == "failed" and store.delivered_at(notice.key) is None  # left to `report --deliver`
        # What `report --deliver` does again: the same notice with its attachments, now (before the backoff).
        assert delivery.send(notice, to=["finops@example.com"], attachments=ATTACHMENTS, retry_now=True)
    finally:
        controller.stop()
    [got] = inbox.messages
    assert [a.get_filename() for a in got.iter_attachments()] == [a[0] for a in ATTACHMENTS]


class QuotingRelay(Inbox):
    """A relay that refuses AUTH with a 535 quoting what it received: the base64 AUTH PLAIN line, the LOGIN
    password line, or the decoded credentials."""

    def __init__(self, quote: str):
        super().__init__()
        self.quote = quote

    async def auth_PLAIN(self, server, args):
        if self.quote == "decoded":
            user, password = base64.b64decode(args[1]).split(b"\0")[1:]
            await server.push(f"535 5.7.8 Authentication failed for {user.decode()}:{password.decode()}")
        else:
            await server.push(f"535 5.7.8 Authentication failed: AUTH {' '.join(args)}")
        return AuthResult(success=False, handled=True)

    async def auth_LOGIN(self, server, args):
        password = await server.challenge_auth("Password:")  # smtplib sent the user with AUTH LOGIN
        line = base64.b64encode(password).decode()  # the line as the client sent it
        await server.push(f"535 5.7.8 Authentication failed: AUTH {' '.join(args)} / {line}")
        return AuthResult(success=False, handled=True)


def password_forms() -> list[str]:
    plain = f"\0{USER}\0{PASSWORD}"
    return [PASSWORD, base64.b64encode(plain.encode()).decode(), base64.b64encode(PASSWORD.encode()).decode(),
            base64.b64encode(f"{USER}\0{USER}\0{PASSWORD}".encode()).decode()]


@pytest.mark.parametrize("mechanism,quote", [("PLAIN", "line"), ("LOGIN", "line"), ("PLAIN", "decoded")])
def test_a_relay_quoting_the_auth_exchange_never_puts_the_password_in_the_log_or_the_store(
        mechanism, quote, serve_smtp, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="gpufinops")
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    relay = QuotingRelay(quote)
    port = serve_smtp(relay, auth_require_tls=False,
                      auth_exclude_mechanism=[m for m in ("PLAIN", "LOGIN") if m != mechanism])
    store = Store(f"sqlite:///{tmp_path}/auth.db")
    settings = plain_settings(port, username=USER, password=SecretRef(env=PASSWORD_ENV))
    notice = warning(inst())
    assert not EmailDelivery(settings, store, Clock(T0)).send(notice, to="alice@example.com")
    row = store.get_notification(notice.key)
    store.close()
    ours = "\n".join(f"{r.levelname} {r.getMessage()}" for r in caplog.records if r.name.startswith("gpufinops"))
    assert row.status == "failed" and "535" in row.detail and "[redacted]" in row.detail
    assert "535" in ours and "[redacted]" in ours  # the answer is still told, without the secret
    database = (tmp_path / "auth.db").read_bytes()
    for form in password_forms():
        assert form not in row.detail and form not in ours, form
        assert form.encode() not in database, form
    assert relay.messages == []


def service_with_email(tmp_path, email_port: int, slack_url: str, clock: Clock):
    """A service (SimCloud, the real store) whose deliveries are Slack (the stub) and email."""
    from gpufinops.demo.sim import SimCloud
    from gpufinops.model import GpuInstance
    from gpufinops.notify.delivery import SlackNotifier

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    settings = load_settings(
        schedule={"evaluate_every_s": 60}, rules_paths=[str(REPO / "rules")],
        service={"host": "127.0.0.1", "port": _free_port()},
        slack={"token": {"env": SLACK_TOKEN_ENV}, "base_url": slack_url, "max_retries": 0, "default_channel": "#gpu"},
        email=plain_settings(email_port, finance=("finops@example.com",)).model_dump())
    cloud = SimCloud([GpuInstance("i-1", "g5.xlarge", "us-east-1", "running", T0 - timedelta(days=1), gpu_count=1)],
                     clock)
    notifier = Deliveries(SlackNotifier(settings.slack, store, clock, timeout_s=2.0), settings,
                          EmailDelivery(settings.email, store, clock))
    return Service(settings, Peers(cloud, IdleMetrics(), store, notifier), clock=clock), settings


def test_an_smtp_refusal_degrades_email_not_slack_and_a_slack_failure_not_email(serve_smtp, slack_stub, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv(SLACK_TOKEN_ENV, "xoxb-test-token")

    class Refusing(Inbox):
        refuse = True

        async def handle_DATA(self, server, session, envelope):
            if self.refuse:
                return "554 5.7.1 Message rejected by policy"
            return await super().handle_DATA(server, session, envelope)

    relay = Refusing()
    clock = Clock(T0)
    service, settings = service_with_email(tmp_path, serve_smtp(relay), slack_stub.base_url, clock)
    finance = Notice(key="budget:ml:2026-05", kind="budget", audience=("finance",), title="Budget ml at 90%",
                     text="Budget ml at 90%")
    assert not service.peers.notifier.send(finance)  # the SMTP server refuses it
    assert service.peers.notifier.send(Notice(key="summary:1", kind="summary", audience=("default",), text="ok"))
    http, base = serve_http(service, settings)
    try:
        report = service.evaluate_job()
        assert report.degraded().keys() == {"email"}, report.degraded()
        status, text = get(f"{base}/readyz")
        assert status == 503 and "email: degraded since" in text and "slack" not in text, text
        assert "1 email(s) not accepted by the mail server" in text
        m = samples(base)
        assert m[("gpufinops_source_up", (("source", "email"),))] == 0
        assert m[("gpufinops_source_up", (("source", "slack"),))] == 1
        assert m[("gpufinops_source_errors_total", (("source", "slack"),))] == 0

        relay.refuse = False  # SMTP accepts again (the tick's retry sends it); now Slack refuses
        clock.now = T0 + timedelta(minutes=5)
        slack_stub.known_channels = {"#elsewhere"}
        assert not service.peers.notifier.send(Notice(key="summary:2", kind="summary", audience=("default",),
                                                      text="not posted"))
        report = service.evaluate_job()
        assert len(relay.messages) == 1 and report.degraded().keys() == {"slack"}, report.degraded()
        status, text = get(f"{base}/readyz")
        assert status == 503 and "slack: degraded since" in text and "email" not in text, text
        m = samples(base)
        assert m[("gpufinops_source_up", (("source", "email"),))] == 1
        assert m[("gpufinops_source_up", (("source", "slack"),))] == 0
    finally:
        http.shutdown()
    # Without email enabled there is no "email" source at all.
    plain = load_settings()
    assert not plain.email.enabled and "email" not in SOURCES
    assert Service(plain, service.peers).metrics.registry.get_sample_value(
        "gpufinops_source_errors_total", {"source": "email"}) is None


def test_a_report_row_saved_before_the_upgrade_is_not_sent_again_without_its_attachments(serve_smtp, store):
    """A failed report row written by the version before this one (no note of its attachments)."""
    from dataclasses import asdict

    notice = report_notice()
    store.record_notification(notice.key, "mailto:finops@example.com", notice.text, "failed", T0,
                              detail="SMTPServerDisconnected", blocks=[{"notice": asdict(notice),
                                                                        "to": ["finops@example.com"]}],
                              attempts=1, next_attempt_at=T0 + timedelta(minutes=1))
    inbox = Inbox()
    delivery = EmailDelivery(plain_settings(serve_smtp(inbox)), store, Clock(T0 + timedelta(hours=1)))
    assert delivery.retry_due(T0 + timedelta(hours=1)) == 0
    assert inbox.messages == [] and store.get_notification(notice.key).status == "failed"


# --------------------------------------------------------------------------- the report, end to end (item 2)


from tests.report.test_report_delivery import MONTH, _email_config, _own_copy, month, needs_tools  # noqa: E402,F401


@needs_tools
def test_a_report_the_mail_server_refused_is_never_sent_by_the_retry_and_goes_whole_on_the_next_deliver(
        month, tmp_path, smtp, capsys):  # noqa: F811 - month is the delivery tests' module fixture
    """SMTP down at `report --deliver`; the service's generic retry a day later (the path that used to send it
    with no attachment and mark it sent) sends nothing and leaves it failed; `report --deliver` again sends it
    once, with its PDF."""
    from gpufinops.cli import main

    _, out = month
    db = _own_copy(out, tmp_path)
    args = ["report", "--month", MONTH, "--out-dir", str(tmp_path / "r"), "--formats", "html", "--deliver"]
    assert main(["-c", str(_email_config(tmp_path, db, _free_port())), *args]) == 1
    capsys.readouterr()

    up = _email_config(tmp_path, db, smtp.port)
    settings = load_settings(up)
    store = Store(f"sqlite:///{db}")
    try:
        row = store.get_notification(f"report-email:{MONTH}")
        assert row.status == "failed"
        later = row.at + timedelta(days=1)
        assert EmailDelivery(settings.email, store, lambda: later).retry_due(later) == 0
        assert smtp.messages == []
        assert store.get_notification(f"report-email:{MONTH}").status == "failed"
    finally:
        store.close()

    assert main(["-c", str(up), *args]) == 0
    (msg,) = smtp.messages
    assert [p.get_filename() for p in msg.iter_attachments()][0] == f"gpu-audit-{MONTH}.pdf"
