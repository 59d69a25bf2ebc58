"""Issue 35, "true messages": page 1 of the report (HTML, so the PDF), the finance email and the Slack line say
how much of the month the figures saw, and call the forecast a projection. On months recorded hour by hour
(tests/report/test_report_sections.py's `recorded`): September 2026 watched all month (estimated), October watched
and billed every day, November up to NOW (in progress, the instance still running at $1/h). The email goes to a
real SMTP server (aiosmtpd) and the Slack line to the Slack stub, through the report's own delivery."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from gpufinops.report.deliver import deliver_report, slack_text
from gpufinops.report.monthly import monthly_audit
from gpufinops.report.observed import hours, observed_period, observed_words
from gpufinops.report.period import report_period
from gpufinops.report.render import report_document, write_report
from gpufinops.store.store import Store
from tests.notify.test_email import smtp  # noqa: F401 - the real SMTP server fixture (aiosmtpd on 127.0.0.1)
from tests.report.test_report import NOW
from tests.report.test_report_sections import recorded  # noqa: F401 - the months recorded hour by hour


def _finance(html: str) -> str:
    """Page 1 as text: the finance section, tags dropped, spaces folded."""
    section = html[html.index('<section id="finance">'):html.index("</section>")]
    return " ".join(re.sub(r"<[^>]+>", " ", section).replace("&#39;", "'").split())


def _audit(db, month, settings):
    store = Store(f"sqlite:///{db}")
    try:
        return monthly_audit(store, month, NOW, settings)
    finally:
        store.close()


def test_a_month_watched_throughout_says_the_whole_month(recorded, tmp_path):
    db, settings = recorded
    a = _audit(db, "2026-09", settings)
    page = _finance(write_report(a, tmp_path, ["html"])[0].read_text())
    assert "Observed: the whole of September 2026 (720 h)." in page
    assert "Spend this month $720.00 the whole month" in page
    # The month is over and was seen to its end: the "forecast" is its spend, and says so.
    assert "Forecast for the month (a projection, not spend) $720.00 the month's spend ($720.00), seen to its " \
           "end: nothing left to project" in page
    text = slack_text(a, "/reports/")
    assert "\nObserved: the whole of September 2026 (720 h)\n" in text
    assert "\nSpend: $720.00, estimated (no bill stored: running time x hourly price), the whole month\n" in text
    # Billed every day of October: the whole month, billed.
    billed = _finance(write_report(_audit(db, "2026-10", settings), tmp_path / "oct", ["html"])[0].read_text())
    assert "Observed: the whole of October 2026 (744 h)." in billed and "$744.00 the whole month, billed" in billed


def test_a_month_in_progress_says_so_far_and_what_the_forecast_adds_up(recorded, tmp_path):
    db, settings = recorded
    a = _audit(db, "2026-11", settings)
    doc = report_document(a)
    assert doc["finance"]["observed"]["observed_hours"] == pytest.approx(57.0)
    assert doc["finance"]["observed"]["share"] == pytest.approx(57 / 720)
    page = _finance(write_report(a, tmp_path, ["html"])[0].read_text())
    said = ("Observed: 57 h of 720 h (7.9%) of November 2026; the month is in progress (57 h so far, to "
            "2026-11-03 09:00 UTC)")
    assert said + ": idle spend and what stopping saved count only those hours, and so does the spend" in page
    assert "Spend this month $57.00 the month so far (to 2026-11-03 09:00 UTC)" in page
    # $57 spent beside a $720 forecast: the forecast is labelled and its sum given.
    assert ("Forecast for the month (a projection, not spend) $720.00 $57.00 so far + $1.00/h (what was running "
            "at 2026-11-03 09:00 UTC) x 663 h to the month's end") in page
    text = slack_text(a, "/reports/")
    assert text.splitlines()[:2] == ["GPU spend report 2026-11 (month in progress)", said]
    assert ("Forecast for the month (a projection, not spend): $720.00: $57.00 so far + $1.00/h (what was "
            "running at 2026-11-03 09:00 UTC) x 663 h to the month's end; budgets: fleet $1,000; ml $500") in text


def test_the_email_and_the_slack_line_carry_the_caveat(recorded, tmp_path, smtp, slack_stub, monkeypatch):
    """Through the report's own delivery: a month watched throughout and one in progress, each to a real SMTP
    server and the Slack stub."""
    from gpufinops.config import load_settings
    from gpufinops.notify.email import EmailDelivery
    from gpufinops.run.compose import live_notifier

    db, base = recorded
    monkeypatch.setenv("GPUFINOPS_TEST_SLACK", "xoxb-report-test")
    settings = load_settings(
        slack={"token": {"env": "GPUFINOPS_TEST_SLACK"}, "base_url": slack_stub.base_url, "max_retries": 0,
               "outbox_path": str(tmp_path / "outbox.jsonl")},
        email={"enabled": True, "host": "127.0.0.1", "port": smtp.port, "security": "none",
               "sender": "gpufinops@example.com", "finance": ["cfo@example.com"]},
        report={"evaluate_every_s": 3600, "delivery": {"email_finance": True, "slack_channel": "#finance"}},
        billing={"budgets_path": base.billing.budgets_path})
    deliveries = Store(f"sqlite:///{tmp_path / 'deliveries.db'}")  # the report's own rows, apart from the months
    try:
        for month in ("2026-09", "2026-11"):
            a = _audit(db, month, settings)
            paths = write_report(a, tmp_path / month, ["html"])
            sent = deliver_report(a, paths, settings.report.delivery, dry_run=False,
                                  notifier=live_notifier(settings, deliveries),
                                  email=EmailDelivery(settings.email, deliveries, lambda: NOW),
                                  email_to=settings.email.finance, store=deliveries)
            assert [d.sent for d in sent] == [True, True], [d.line(False) for d in sent]
    finally:
        deliveries.close()
    whole, partial = (m.get_body(("plain",)).get_content().replace("\r\n", "\n") for m in smtp.messages)
    assert "Observed: the whole of September 2026 (720 h)\n" in whole and ", the whole month\n" in whole
    assert ("Observed: 57 h of 720 h (7.9%) of November 2026; the month is in progress (57 h so far, to "
            "2026-11-03 09:00 UTC)\n") in partial
    assert "Forecast for the month (a projection, not spend): $720.00: $57.00 so far + $1.00/h" in partial
    assert "whole month" not in partial
    slack_whole, slack_partial = (m["text"] for m in slack_stub.posted("#finance"))
    assert "Observed: the whole of September 2026 (720 h)" in slack_whole
    assert "Observed: 57 h of 720 h (7.9%) of November 2026; the month is in progress" in slack_partial
    assert "Forecast for the month (a projection, not spend): $720.00: $57.00 so far" in slack_partial


@pytest.mark.parametrize("observed_h, now, said", [
    (21.0, datetime(2026, 12, 31, 21, tzinfo=timezone.utc),
     "21 h of 744 h (2.8%) of December 2026; the month is in progress (741 h so far, to 2026-12-31 21:00 UTC)"),
    (21.0, datetime(2027, 1, 2, tzinfo=timezone.utc), "21 h of 744 h (2.8%) of December 2026"),
    (740.0, datetime(2027, 1, 2, tzinfo=timezone.utc), "the whole of December 2026 (744 h)"),  # a tick's rounding
    (0.5, datetime(2027, 1, 2, tzinfo=timezone.utc), "30 min of 744 h (0.1%) of December 2026"),
])
def test_observed_words(observed_h, now, said):
    assert observed_words(observed_period(report_period("2026-12", now), observed_h)) == said


def test_hours_are_written_for_people():
    assert [hours(h) for h in (0.25, 3.04, 21.4, 744.0, 1500.0)] == ["15 min", "3.0 h", "21 h", "744 h", "1,500 h"]
