"""The email delivery against a real SMTP server (aiosmtpd) on 127.0.0.1: parts, escaping, STARTTLS and AUTH,
exactly once across a restart, at most once when the server's answer is lost, and an owner's warning by email
when Slack is not configured (what a stop waits for)."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import ipaddress
import socket
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufinops.config import EmailSettings, SecretRef, Settings, SlackSettings
from gpufinops.model import Action, Decision, GpuInstance, ReasonCode, Verdict
from gpufinops.notify import messages
from gpufinops.notify.email import EmailDelivery, message_id
from gpufinops.notify.routing import Deliveries
from gpufinops.notify.delivery import OutboxNotifier, read_outbox
from gpufinops.store.store import Store

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
EVIL = "<script>alert(1)</script> & <b>bold</b>"
PASSWORD_ENV = "GPUFINOPS_TEST_SMTP_PASSWORD"


class Inbox:
    """The server's handler: keeps every message it accepted; `drop_answer` closes the connection instead of
    answering 250 (the message is in, the client never hears so)."""

    def __init__(self):
        self.messages: list[email.message.EmailMessage] = []
        self.drop_answer = False

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.original_content, policy=email.policy.default))
        if self.drop_answer:
            server.transport.close()
            return "250 OK"
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(dt.datetime(2020, 1, 1)).not_valid_after(dt.datetime(2100, 1, 1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def smtp():
    """A plain SMTP server on 127.0.0.1 (no TLS, no auth)."""
    inbox = Inbox()
    port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    inbox.port = port
    yield inbox
    controller.stop()


@pytest.fixture
def smtp_tls(tmp_path):
    """STARTTLS required, then AUTH (user gpufinops, password 's3cret'), a self-signed certificate."""
    import ssl

    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    inbox = Inbox()

    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = auth_data.login == b"gpufinops" and auth_data.password == b"s3cret"
        return AuthResult(success=ok, handled=False)

    port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, tls_context=context, require_starttls=True,
                            authenticator=authenticator, auth_require_tls=True)
    controller.start()
    inbox.port, inbox.ca_file = port, str(cert)
    yield inbox
    controller.stop()


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


class Clock:
    def __init__(self, now: datetime):
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def plain_settings(port: int, **kw) -> EmailSettings:
    return EmailSettings(enabled=True, host="127.0.0.1", port=port, security="none",
                         sender="gpufinops@example.com", **kw)


def inst(owner: str = "alice@example.com", iid: str = "i-0abc", **tags) -> GpuInstance:
    return GpuInstance(iid, "p4d.24xlarge", "us-east-1", "running", T0 - timedelta(days=1),
                       tags={"owner": owner, "team": "ml", **tags}, gpu_count=8, gpu_model="A100", hourly_cost=32.77)


def warning(i: GpuInstance, **kw):
    d = Decision(i.instance_id, "stop-idle", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW,
                 f"max activity 0% over 2 h; Name {i.tags.get('Name', '')}", T0, action=Action.STOP, window_s=7200,
                 hourly_cost=32.77)
    return messages.idle_warning(i, d, marked_at=T0, stop_at=T0 + timedelta(hours=1), channel="", dry_run=False,
                                 action=Action.STOP, **kw)


def parts(msg):
    return msg.get_body(("plain",)).get_content(), msg.get_body(("html",)).get_content()


def test_a_notice_arrives_with_text_and_html_parts_and_hostile_tags_stay_text(smtp, store):
    notice = warning(inst(Name=EVIL))
    assert EmailDelivery(plain_settings(smtp.port), store, Clock(T0)).send(notice, to="alice@example.com")
    [got] = smtp.messages
    text, html = parts(got)
    assert got["Message-ID"] == message_id(notice.key, "gpufinops.invalid")
    assert got["To"] == "alice@example.com" and got["Subject"].startswith("Idle GPU instance will be stopped: i-0abc")
    assert "will be stopped at 2026-05-01 13:00 UTC" in text and "Cost: $32.77/h" in text
    assert EVIL in text  # the text part says what the tag says
    assert "<script>" not in html and "<b>bold</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in html
    assert "2026-05-01 13:00 UTC" in html and "<th" in html  # times in UTC, facts as a table
    assert store.delivered_at(notice.key) == T0


def test_starttls_and_auth_from_settings_with_the_password_from_the_environment(smtp_tls, store, monkeypatch):
    settings = EmailSettings(enabled=True, host="127.0.0.1", port=smtp_tls.port, security="starttls",
                             username="gpufinops", password=SecretRef(env=PASSWORD_ENV), ca_file=smtp_tls.ca_file,
                             sender="gpufinops@example.com")
    clock = Clock(T0)
    notice = warning(inst())
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    assert not EmailDelivery(settings, store, clock).send(notice, to="alice@example.com")
    row = store.get_notification(notice.key)
    assert row.status == "failed" and "Authentication" in row.detail and "wrong" not in row.detail
    assert smtp_tls.messages == []
    monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    clock.now = T0 + timedelta(minutes=1)  # past the first backoff
    assert EmailDelivery(settings, store, clock).send(notice, to="alice@example.com")
    assert len(smtp_tls.messages) == 1


def test_a_password_is_never_sent_in_the_clear_to_another_host():
    with pytest.raises(ValueError, match="in the clear"):
        EmailSettings(enabled=True, host="mail.example.com", security="none", username="u",
                      password=SecretRef(env=PASSWORD_ENV))


def test_exactly_once_across_a_restart(smtp, tmp_path):
    url = f"sqlite:///{tmp_path}/restart.db"
    notice = warning(inst())
    first = Store(url)
    assert EmailDelivery(plain_settings(smtp.port), first, Clock(T0)).send(notice, to="alice@example.com")
    first.close()
    again = Store(url)  # the service restarted
    assert EmailDelivery(plain_settings(smtp.port), again, Clock(T0 + timedelta(hours=1))).send(
        notice, to="alice@example.com")
    again.close()
    assert len(smtp.messages) == 1


def test_a_lost_answer_is_never_sent_again_and_never_counts_as_delivered(smtp, store):
    smtp.drop_answer = True
    clock = Clock(T0)
    delivery = EmailDelivery(plain_settings(smtp.port), store, clock)
    notice = warning(inst())
    assert not delivery.send(notice, to="alice@example.com")
    assert len(smtp.messages) == 1  # the server has it; the client never heard
    smtp.drop_answer = False
    clock.now = T0 + timedelta(hours=2)
    assert not delivery.send(notice, to="alice@example.com")
    assert delivery.retry_due(clock.now) == 0
    assert len(smtp.messages) == 1 and store.delivered_at(notice.key) is None
    assert store.get_notification(notice.key).status == "pending"


def test_a_server_that_never_accepted_it_gets_it_again_after_the_backoff(store):
    port = _free_port()  # nothing listens yet: connection refused
    clock = Clock(T0)
    delivery = EmailDelivery(plain_settings(port), store, clock)
    notice = messages.stopped(inst(), Decision("i-0abc", "stop-idle", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW,
                                               "idle", T0, action=Action.STOP), at=T0, channel="", dry_run=False,
                              action=Action.STOP)
    assert not delivery.send(notice, to="alice@example.com")
    assert store.get_notification(notice.key).status == "failed"
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        assert delivery.retry_due(T0 + timedelta(seconds=30)) == 0  # backoff not over
        clock.now = T0 + timedelta(minutes=2)
        assert delivery.retry_due(clock.now) == 1
        assert delivery.retry_due(clock.now) == 0
    finally:
        controller.stop()
    [got] = inbox.messages
    assert got["Message-ID"] == message_id(notice.key, "gpufinops.invalid")


def test_an_owner_with_an_address_gets_the_warning_by_email_when_slack_is_not_configured(smtp, store, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    outbox = tmp_path / "outbox.jsonl"
    settings = Settings(slack=SlackSettings(token=SecretRef(env="GPUFINOPS_TEST_NO_SLACK"), outbox_path=str(outbox)),
                        email=plain_settings(smtp.port))
    clock = Clock(T0)
    router = Deliveries(OutboxNotifier(settings.slack, store, clock), settings,
                        EmailDelivery(settings.email, store, clock))
    notice = warning(inst("bob@example.com"))
    assert router.send(notice)
    [got] = smtp.messages
    assert got["To"] == "bob@example.com"
    # What the act stage reads before any stop: the warning's own key, delivered when the server accepted it.
    assert store.delivered_at(notice.key) == T0
    assert read_outbox(outbox) == []
    # Its follow-up replies in the same email thread.
    cancelled = messages.mark_cancelled(inst("bob@example.com"), reason="became active", marked_at=T0, channel="")
    from dataclasses import replace
    assert router.send(replace(cancelled, thread_key=notice.key))
    assert smtp.messages[1]["In-Reply-To"] == got["Message-ID"]
    # An owner tag that is not an address still goes to the outbox (the channel).
    other = warning(inst("U012AB3CDE", iid="i-0def"))
    assert router.send(other) and len(smtp.messages) == 2 and read_outbox(outbox)[0]["key"] == other.key


def test_a_refused_email_is_not_delivered_and_the_stop_waits(store, tmp_path, monkeypatch):
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    settings = Settings(slack=SlackSettings(token=SecretRef(env="GPUFINOPS_TEST_NO_SLACK"),
                                            outbox_path=str(tmp_path / "o.jsonl")),
                        email=plain_settings(_free_port()))
    router = Deliveries(OutboxNotifier(settings.slack, store, Clock(T0)), settings,
                        EmailDelivery(settings.email, store, Clock(T0)))
    notice = warning(inst("bob@example.com"))
    assert not router.send(notice)
    assert store.delivered_at(notice.key) is None


def test_the_email_section_is_checked_at_load(tmp_path):
    from gpufinops.config import ConfigError, load_settings

    example = (tmp_path / "example.yaml")
    text = (Path(__file__).resolve().parents[2] / "gpufinops.example.yaml").read_text(encoding="utf-8")
    block = text[text.index("# email:"):text.index("\nact:")]
    example.write_text(text.replace(block, "\n".join(line.replace("# ", "", 1) for line in block.splitlines())))
    settings = load_settings(example)  # the documented example, uncommented, is valid
    assert settings.email.enabled and settings.email.finance == ("finops@example.com",)
    bad = tmp_path / "bad.yaml"
    bad.write_text("email:\n  enabled: true\n  sender: not-an-address\n")
    with pytest.raises(ConfigError, match="email.sender"):
        load_settings(bad)
    bad.write_text("email:\n  securty: ssl\n")
    with pytest.raises(ConfigError, match="securty"):
        load_settings(bad)


def test_the_password_is_redacted_in_any_base64_framing_and_as_written():
    import base64

    from gpufinops.notify.email import REDACTED, redact_secret

    password = "Tr0ub4dor&3-correct-horse"
    for prefix in ("", "a", "ab", "\0gpufinops\0", "authz\0gpufinops\0"):  # every byte alignment, other framings
        quoted = base64.b64encode((prefix + password + "\0tail").encode()).decode()
        redacted = redact_secret(f"535 5.7.8 bad: {quoted}", "gpufinops", password)
        assert REDACTED in redacted and quoted not in redacted
        # What is left of the stream decodes to the framing and at most 2 password bytes on each side (those that
        # share a base64 group with the framing).
        head, tail = redacted.removeprefix("535 5.7.8 bad: ").split(REDACTED)
        assert quoted.startswith(head) and len(base64.b64decode(head)) <= len(prefix) + 2
        assert quoted.endswith(tail) and len(base64.b64decode(tail)) <= len("\0tail") + 2
    assert redact_secret(f"bad password '{password}'", "u", password) == f"bad password '{REDACTED}'"
    assert redact_secret("nothing secret here", "u", "") == "nothing secret here"


def test_a_persons_command_sends_a_failed_email_again_before_its_backoff_is_over(store):
    port = _free_port()  # nothing listens yet: connection refused
    clock = Clock(T0)
    delivery = EmailDelivery(plain_settings(port), store, clock)
    notice = warning(inst())
    assert not delivery.send(notice, to="alice@example.com")
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        clock.now = T0 + timedelta(seconds=10)  # the 60 s backoff is not over
        assert not delivery.send(notice, to="alice@example.com") and inbox.messages == []
        assert delivery.send(notice, to="alice@example.com", retry_now=True)
        assert delivery.send(notice, to="alice@example.com", retry_now=True)  # accepted once: not sent again
    finally:
        controller.stop()
    assert len(inbox.messages) == 1
