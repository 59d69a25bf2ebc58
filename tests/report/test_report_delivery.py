"""Issue 26: what finance and owners receive. The demo month (through the real pipeline) and a live store (labels
written by Store.record_instances, the pipeline's own call) rendered as HTML and as a PDF by headless Chromium; the
PDF's pages read back as images (pdftoppm) and as text (pdftotext): the finance page first, names beside ids, no
stop advised for a protected / excluded / snoozed / not-opted-in instance, no example budget unless configured.
Delivery: S3 through moto, Slack through the local stub, and `report --deliver --dry-run` sends nothing."""

from __future__ import annotations

import io
import json
import re
import shutil
import sqlite3
import subprocess
from datetime import datetime, timedelta, timezone

import pytest

from gpufinops.demo.run import run_demo
from gpufinops.model import GpuInstance
from gpufinops.report.monthly import monthly_audit, write_and_deliver
from gpufinops.report.render import write_report
from gpufinops.store.store import Store
from tests.notify.test_email import smtp  # noqa: F401 - the real SMTP server fixture (aiosmtpd on 127.0.0.1)
from tests.report.test_report import MONTH, NOW

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
POPPLER = shutil.which("pdftoppm") and shutil.which("pdftotext")
needs_tools = pytest.mark.skipif(CHROMIUM is None or not POPPLER,
                                 reason="needs Debian's chromium and poppler-utils (.ci/run installs them)")

# Policy cases added to the live store beside the demo's own (demo-5 protected, demo-6 workload=inference).
SNOOZED, NOT_OPTED, OPTED = "i-demo0008", "i-demo0010", "i-demo0012"


@pytest.fixture(scope="module")
def month(tmp_path_factory):
    """The demo month, with the live store's labels changed for three instances as the pipeline records them:
    one snoozed by its owner, one without the opt-in tag, one with a hostile Name tag."""
    out = tmp_path_factory.mktemp("deliver")
    db = out / "demo.db"
    run_demo(out=io.StringIO(), hours=3, db_path=str(db), quiet=True)
    store = Store(f"sqlite:///{db}")
    labels = store.instance_labels()
    seen = max(lab["last_seen"] for lab in labels.values())
    until = (seen + timedelta(days=2)).isoformat()

    def inst(iid: str, **tags: str) -> GpuInstance:
        pol = json.loads(labels[iid]["policy"])
        return GpuInstance(iid, labels[iid]["instance_type"], labels[iid]["region"], "running", seen,
                           account=labels[iid]["account"], tags={**pol["tags"], **tags})

    snoozed = inst(SNOOZED, **{"gpufinops:snooze-until": until})
    not_opted = GpuInstance(NOT_OPTED, "g6.xlarge", "us-east-1", "running", seen,
                            tags={k: v for k, v in json.loads(labels[NOT_OPTED]["policy"])["tags"].items()
                                  if k != "gpufinops:allow-stop"})
    hostile = inst(OPTED, Name="<script>alert(1)</script>")
    store.record_instances([snoozed, not_opted, hostile], seen)
    yield store, out
    store.close()


def advice_of(audit) -> dict[str, tuple[str, str]]:
    return {r.instance_id: (r.advice, r.advice_reason) for r in audit.instances.itertuples(index=False)}


def test_advice_follows_the_act_stage_rules_and_tags(month):
    store, _ = month
    audit = monthly_audit(store, MONTH, NOW)
    adv = advice_of(audit)
    assert adv["i-demo0005"] == ("none", "protected by tag gpufinops:protect=true: never stopped")
    assert adv["i-demo0006"][0] == "none" and "excluded from stop rule gpu-util-below-10pct-2h by tag " \
        "workload=inference" in adv["i-demo0006"][1]
    assert adv[SNOOZED][0] == "none" and adv[SNOOZED][1].startswith("its owner snoozed it: snoozed until ")
    assert adv[NOT_OPTED] == ("opt in to stopping",
                              "not opted in: gpufinops stops only instances tagged gpufinops:allow-stop=true")
    assert adv[OPTED][0] == "stop when idle"
    # The top actions never advise stopping what the act stage would not stop.
    for o in audit.summary["idle_offenders"]:
        assert o["advice"] == adv[o["instance_id"]][0]
        if o["instance_id"] in ("i-demo0005", "i-demo0006", SNOOZED, NOT_OPTED):
            assert o["advice"] != "stop when idle"
    assert not any("schedule" in a.lower() for a, _ in adv.values())


@needs_tools
def test_the_pdf_and_page_put_finance_first_with_names_and_no_example_budget(month, tmp_path):
    store, _ = month
    audit = monthly_audit(store, MONTH, NOW)
    paths = write_report(audit, tmp_path, ["html", "pdf"])
    html = (tmp_path / f"gpu-audit-{MONTH}.html").read_text()
    pdf = tmp_path / f"gpu-audit-{MONTH}.pdf"
    assert pdf in paths and pdf.read_bytes().startswith(b"%PDF")
    # HTML: the finance section comes before everything else, says the basis once, names beside ids, escaped.
    assert html.index('id="finance"') < html.index('id="coverage"') < html.index('id="summary"')
    assert html.count("Spend on this page is estimated") == 1 and "no budget configured" in html
    assert "all-gpu" not in html and "untagged-gpu" not in html  # the example budgets are not live
    assert "<strong>demo-6</strong> <span class=\"iid\">i-demo0006</span>" in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Stop or schedule" not in html and "schedule it" not in html
    assert "Could be cheaper" in html and "Underutilized cost" not in html
    # PDF text, page by page: page 1 is the finance page and holds nothing of the engineering sections.
    pages = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True,
                           check=True).stdout.split("\f")
    assert len([p for p in pages if p.strip()]) >= 3
    first = pages[0]
    assert "For finance: GPU spend in 2022-09" in first and "Idle spend" in first
    assert "What stopping saved (net)" in first and "Forecast for the month" in first and "In plain words" in first
    assert "Executive summary" not in first and "Headline" not in first
    # Page 1 says how little of the month the figures saw (issue 35: it said "the whole month").
    flat = " ".join(first.split())
    assert "Observed: 3.0 h of 720 h (0.4%) of September 2022" in flat and "whole month" not in flat
    assert "only the 3.0 h observed" in flat and "Forecast for the month (a projection," in flat
    assert "idle: " not in first.lower() or "rule's window" in first
    rest = "".join(pages[1:])
    assert "demo-6" in rest and "i-demo0006" in rest
    # PDF pages as images: each page rendered, page 1 has ink (not a blank page) at A4/Letter proportions.
    subprocess.run(["pdftoppm", "-r", "40", "-png", str(pdf), str(tmp_path / "page")], check=True)
    from PIL import Image

    images = sorted(tmp_path.glob("page-*.png"))
    assert len(images) == len(pages) - (1 if not pages[-1].strip() else 0)
    with Image.open(images[0]) as img:
        w, h = img.size
        assert 1.2 < h / w < 1.5
        grey = img.convert("L")
        dark = sum(grey.histogram()[:128])
        assert dark > 0.005 * w * h  # text on it


@needs_tools
def test_deliver_to_s3_and_slack_and_the_dry_run_sends_nothing(month, tmp_path, aws, slack_stub, monkeypatch,
                                                             capsys):
    from gpufinops.cli import main

    store, out = month
    db = out / "demo.db"
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="finance-reports")
    monkeypatch.setenv("GPUFINOPS_TEST_SLACK", "xoxb-report-test")
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{db}\naws:\n  endpoint_url: {aws.endpoint_url}\n"
                   f"slack:\n  token: {{env: GPUFINOPS_TEST_SLACK}}\n  base_url: {slack_stub.base_url}\n"
                   f"  max_retries: 0\n  outbox_path: {tmp_path / 'outbox.jsonl'}\n"
                   "report:\n  delivery:\n    s3_uri: s3://finance-reports/gpu\n    slack_channel: '#finance'\n")
    rc = main(["-c", str(cfg), "report", "--month", MONTH, "--out-dir", str(tmp_path / "dry"), "--formats", "html",
               "--deliver", "--dry-run"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert f"would send to s3 s3://finance-reports/gpu/{MONTH}/gpu-audit-{MONTH}.pdf" in printed
    assert "would send to slack #finance: one message: Spend: $" in printed
    assert s3.list_objects_v2(Bucket="finance-reports").get("KeyCount", 0) == 0 and slack_stub.posted() == []

    rc = main(["-c", str(cfg), "report", "--month", MONTH, "--out-dir", str(tmp_path / "real"), "--formats",
               "html,json", "--deliver"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="finance-reports")["Contents"])
    assert keys == [f"gpu/{MONTH}/gpu-audit-{MONTH}.{ext}" for ext in ("html", "json", "pdf")]
    obj = s3.get_object(Bucket="finance-reports", Key=f"gpu/{MONTH}/gpu-audit-{MONTH}.pdf")
    assert obj["ContentType"] == "application/pdf" and obj["Body"].read().startswith(b"%PDF")
    (msg,) = slack_stub.posted("#finance")
    assert msg["text"].startswith(f"GPU spend report {MONTH}")
    assert "estimated (no bill stored" in msg["text"] and "no budget configured" in msg["text"]
    # The month's caveat (issue 35): the demo's 3 simulated hours of September, never "the whole month".
    assert "Observed: 3.0 h of 720 h (0.4%) of September 2022\n" in msg["text"]
    assert "whole month" not in msg["text"] and "Forecast for the month (a projection, not spend): $" in msg["text"]
    assert f"Full report: s3://finance-reports/gpu/{MONTH}/" in msg["text"]
    # Once per month and channel: a second delivery re-uploads the files, posts nothing again and says so.
    assert main(["-c", str(cfg), "report", "--month", MONTH, "--out-dir", str(tmp_path / "real"), "--deliver"]) == 0
    assert len(slack_stub.posted("#finance")) == 1
    assert re.search(r"not sent to slack #finance: already delivered on \d{4}-\d\d-\d\d \d\d:\d\d UTC to "
                     r"#finance; `--again` to send it again", capsys.readouterr().out)
    # --again: one more message, under a key of its own.
    assert main(["-c", str(cfg), "report", "--month", MONTH, "--out-dir", str(tmp_path / "real"), "--deliver",
                 "--again"]) == 0
    assert len(slack_stub.posted("#finance")) == 2 and "sent to slack #finance" in capsys.readouterr().out


def test_deliver_without_a_destination_is_a_usage_error(month, tmp_path, capsys):
    from gpufinops.cli import main

    _, out = month
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{out / 'demo.db'}\n")
    assert main(["-c", str(cfg), "report", "--month", MONTH, "--out-dir", str(tmp_path), "--deliver"]) == 2
    assert "no destination configured (report.delivery.s3_uri" in capsys.readouterr().err
    assert main(["-c", str(cfg), "report", "--month", MONTH, "--out-dir", str(tmp_path), "--dry-run"]) == 2
    assert "--dry-run goes with --deliver" in capsys.readouterr().err
    assert main(["-c", str(cfg), "report", "--month", MONTH, "--out-dir", str(tmp_path), "--again"]) == 2
    assert "--again goes with --deliver" in capsys.readouterr().err


@needs_tools
def test_deliver_by_email_to_finance_with_the_pdf_attached_once(month, tmp_path, smtp, capsys):
    # A real SMTP server on 127.0.0.1 (aiosmtpd): one email to the finance list, the PDF first, then the page.
    from gpufinops.cli import main

    store, out = month
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{out / 'demo.db'}\n"
                   f"email:\n  enabled: true\n  host: 127.0.0.1\n  port: {smtp.port}\n  security: none\n"
                   "  sender: gpufinops@example.com\n  finance: [cfo@example.com, fpa@example.com]\n"
                   "report:\n  delivery:\n    email_finance: true\n")
    args = ["-c", str(cfg), "report", "--month", MONTH, "--out-dir", str(tmp_path / "r"), "--formats", "html",
            "--deliver"]
    assert main([*args, "--dry-run"]) == 0
    assert "would send to email cfo@example.com, fpa@example.com: one email with " \
           f"gpu-audit-{MONTH}.pdf, gpu-audit-{MONTH}.html" in capsys.readouterr().out
    assert smtp.messages == []
    assert main(args) == 0, capsys.readouterr()
    (msg,) = smtp.messages
    assert msg["To"] == "cfo@example.com, fpa@example.com"
    assert f"GPU spend report {MONTH}" in msg["Subject"]
    names = [p.get_filename() for p in msg.iter_attachments()]
    assert names == [f"gpu-audit-{MONTH}.pdf", f"gpu-audit-{MONTH}.html"]
    pdf = next(msg.iter_attachments()).get_content()
    assert pdf.startswith(b"%PDF")
    body = msg.get_body(("plain",)).get_content()
    assert "Spend: $" in body and "no budget configured" in body
    assert "Observed: 3.0 h of 720 h (0.4%) of September 2022" in body and "whole month" not in body
    assert main(args) == 0  # a second delivery of the month sends no second email
    assert len(smtp.messages) == 1


def test_email_delivery_of_the_report_needs_the_email_section(tmp_path):
    from gpufinops.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match="email_finance: true needs the email delivery on"):
        load_settings(report={"delivery": {"email_finance": True}})


# --------------------------------------------------------------------------- issue 35: once, with its PDF, and said


def _own_copy(out, tmp_path):
    """The demo month's database copied (SQLite's backup) without the report deliveries the other tests of this
    module made, so this test's deliveries are its own."""
    db = tmp_path / "demo.db"
    with sqlite3.connect(out / "demo.db") as src, sqlite3.connect(db) as dst:
        src.backup(dst)
        dst.execute("DELETE FROM notifications WHERE key LIKE 'report%'")
    return db


def _email_config(tmp_path, db, port: int):
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{db}\n"
                   f"email:\n  enabled: true\n  host: 127.0.0.1\n  port: {port}\n  security: none\n  timeout_s: 5\n"
                   "  sender: gpufinops@example.com\n  finance: [cfo@example.com, fpa@example.com]\n"
                   "report:\n  delivery:\n    email_finance: true\n")
    return cfg


ALREADY = re.compile(r"not sent to email cfo@example.com, fpa@example.com: already delivered on "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d UTC to cfo@example.com, fpa@example.com; `--again` to send it again")


@needs_tools
def test_a_report_email_the_server_refused_goes_with_its_pdf_on_the_next_deliver(month, tmp_path, smtp, capsys):
    """Issue 35 item 2: SMTP down, then `report --deliver` again sends the email with the PDF attached (it used
    to wait out the retry backoff and print nothing sent); run once more it says it was delivered, and when,
    and sends nothing; `--again` sends one more copy (its own key, its own Message-ID)."""
    from gpufinops.cli import main
    from tests.notify.test_email import _free_port

    _, out = month
    db = _own_copy(out, tmp_path)
    args = ["report", "--month", MONTH, "--out-dir", str(tmp_path / "r"), "--formats", "html", "--deliver"]

    down = _email_config(tmp_path, db, _free_port())  # nothing listens there: the server is down
    assert main(["-c", str(down), *args]) == 1
    printed = capsys.readouterr().out
    assert "FAILED email cfo@example.com, fpa@example.com: not accepted by the mail server (see the log); " \
           f"`gpufinops report --deliver --month {MONTH}` sends it again, with its attachments" in printed
    assert smtp.messages == []
    store = Store(f"sqlite:///{db}")
    try:
        assert store.get_notification(f"report-email:{MONTH}").status == "failed"
    finally:
        store.close()

    up = _email_config(tmp_path, db, smtp.port)
    assert main(["-c", str(up), *args]) == 0, capsys.readouterr()
    assert "sent to email cfo@example.com, fpa@example.com: one email with " in capsys.readouterr().out
    (msg,) = smtp.messages
    assert [p.get_filename() for p in msg.iter_attachments()] == [f"gpu-audit-{MONTH}.pdf", f"gpu-audit-{MONTH}.html"]
    assert next(msg.iter_attachments()).get_content().startswith(b"%PDF")

    assert main(["-c", str(up), *args]) == 0
    assert ALREADY.search(capsys.readouterr().out)
    assert len(smtp.messages) == 1

    assert main(["-c", str(up), *args, "--again"]) == 0
    assert "sent to email" in capsys.readouterr().out
    first, again = smtp.messages
    assert [p.get_filename() for p in again.iter_attachments()][0] == f"gpu-audit-{MONTH}.pdf"
    assert again["Message-ID"] != first["Message-ID"]
    # Run again without --again: delivered, said, nothing sent.
    assert main(["-c", str(up), *args]) == 0
    assert ALREADY.search(capsys.readouterr().out) and len(smtp.messages) == 2
    store = Store(f"sqlite:///{db}")
    try:
        rows = {r["key"]: r["status"] for r in store.notification_rows() if r["key"].startswith("report-email:")}
    finally:
        store.close()
    assert rows == {f"report-email:{MONTH}": "sent", f"report-email:{MONTH}:again-2": "sent"}


@needs_tools
def test_a_mid_month_delivery_does_not_stand_in_for_the_month_end_one(month, tmp_path, smtp, slack_stub,
                                                                        monkeypatch):
    """Issue 35: `--deliver` on a day of a month in progress, then the month's end: two emails and two Slack
    messages, each saying how much of the month it saw (the first that the month is in progress)."""
    from gpufinops.config import load_settings
    from gpufinops.notify.email import EmailDelivery
    from gpufinops.run.compose import live_notifier

    _, out = month
    db = _own_copy(out, tmp_path)
    monkeypatch.setenv("GPUFINOPS_TEST_SLACK", "xoxb-report-test")
    settings = load_settings(
        database_url=f"sqlite:///{db}",
        slack={"token": {"env": "GPUFINOPS_TEST_SLACK"}, "base_url": slack_stub.base_url, "max_retries": 0,
               "outbox_path": str(tmp_path / "outbox.jsonl")},
        email={"enabled": True, "host": "127.0.0.1", "port": smtp.port, "security": "none",
               "sender": "gpufinops@example.com", "finance": ["cfo@example.com"]},
        report={"delivery": {"email_finance": True, "slack_channel": "#finance"}})
    mid = datetime(2022, 9, 11, 7, 0, tzinfo=timezone.utc)  # the demo's hours are 03:12 to 06:12 that day
    store = Store(settings.database_url)
    try:
        def deliver(now):
            email = EmailDelivery(settings.email, store, lambda: now)
            return write_and_deliver(store, MONTH, tmp_path / now.strftime("%d"), now, settings, ["html"],
                                     notifier=live_notifier(settings, store), email=email)[1]

        assert [d.sent for d in deliver(mid)] == [True, True]
        again_that_day = deliver(mid + timedelta(hours=2))
        assert [d.sent for d in again_that_day] == [False, False]
        slack, email = again_that_day
        assert slack.already.startswith("already delivered on ") and slack.already.endswith(
            " to #finance; `--again` to send it again")
        assert email.already == ("already delivered on 2022-09-11 07:00 UTC to cfo@example.com; "
                                 "`--again` to send it again")
        assert [d.sent for d in deliver(NOW)] == [True, True]
    finally:
        store.close()
    partial, whole = smtp.messages
    assert partial["Subject"] == f"GPU spend report {MONTH} (month in progress)"
    assert whole["Subject"] == f"GPU spend report {MONTH}"
    for msg in (partial, whole):
        assert [p.get_filename() for p in msg.iter_attachments()][0] == f"gpu-audit-{MONTH}.pdf"
    partial_text, whole_text = (m.get_body(("plain",)).get_content().replace("\r\n", "\n")
                                for m in (partial, whole))
    assert ("Observed: 3.0 h of 720 h (0.4%) of September 2022; the month is in progress (247 h so far, to "
            "2022-09-11 07:00 UTC)") in partial_text
    assert "Observed: 3.0 h of 720 h (0.4%) of September 2022\n" in whole_text
    for text in (partial_text, whole_text):
        assert "whole month" not in text and "Forecast for the month (a projection, not spend): $" in text
        assert "only the 3.0 h observed" in text
    posted = [m["text"] for m in slack_stub.posted("#finance")]
    assert len(posted) == 2
    assert "(month in progress)" in posted[0] and "the month is in progress (247 h so far" in posted[0]
    assert "(month in progress)" not in posted[1] and "Observed: 3.0 h of 720 h (0.4%)" in posted[1]


def _row(key: str, status: str, channel: str = "mailto:cfo@example.com,fpa@example.com"):
    from gpufinops.store.schema import NotificationRow

    return NotificationRow(key, channel, "text", status, datetime(2026, 12, 1, 6, 0), None, 1, None, ())


K = ["report-email:2026-11", "report-email:2026-11:again-2", "report-email:2026-11:again-3"]
DELIVERED = ("already delivered on 2026-12-01 06:00 UTC to cfo@example.com, fpa@example.com; "
             "`--again` to send it again")


@pytest.mark.parametrize("statuses, again, lookup, key, already, error", [
    ([], False, False, K[0], "", False),  # never tried: sent
    (["failed"], False, False, K[0], "", False),  # refused before: sent again, under its key
    (["failed"], True, False, K[0], "", False),  # --again on a report never delivered: the same
    (["sent"], False, False, "", DELIVERED, False),
    (["sent"], True, False, K[1], "", False),  # a copy, under a key of its own
    (["sent", "sent"], False, False, "", DELIVERED, False),
    (["sent", "failed"], True, False, K[1], "", False),  # a copy refused: that copy again, not a third
    (["sent", "sent"], True, False, K[2], "", False),
    (["pending"], False, True, K[0], "", False),  # Slack looks up a try whose answer was lost
    (["pending"], True, False, K[1], "", False),  # email cannot: --again is a person's choice
    (["abandoned"], True, False, K[1], "", False),
])
def test_plan_send(statuses, again, lookup, key, already, error):
    from gpufinops.report.deliver import copy_keys, plan_send

    keys = copy_keys(K[0])[:len(statuses) + 1]
    rows = [_row(k, s) for k, s in zip(keys, statuses)] + [None]
    plan = plan_send(rows, keys, again, looks_up_unknown=lookup)
    assert (plan.key, plan.already, plan.error) == (key, already, error)
    if key and key in keys[:len(statuses)]:
        assert plan.earlier is rows[keys.index(key)]  # a failed try: its backoff is set aside (tried now)


def test_plan_send_says_what_it_cannot_know():
    from gpufinops.report.deliver import plan_send

    lost = plan_send([_row(K[0], "pending"), None], K[:2], False, looks_up_unknown=False)
    assert (lost.key, lost.error) == ("", True)
    assert lost.already == ("an earlier try on 2026-12-01 06:00 UTC went unanswered, so the server may have it; "
                            "not sent again so nobody gets it twice; `--again` to send it anyway")
    outbox = plan_send([_row("report:2026-11:#finance", "outbox", "#finance"), None], ["report:2026-11:#finance",
                       "report:2026-11:#finance:again-2"], False, looks_up_unknown=True)
    assert outbox.already == ("already written to the outbox (no Slack token) on 2026-12-01 06:00 UTC to #finance; "
                              "`--again` to send it again")


def test_a_month_in_progress_has_a_key_of_its_own():
    from gpufinops.report.deliver import email_key, slack_key
    from gpufinops.report.period import report_period

    mid = report_period("2026-12", datetime(2026, 12, 10, 9, tzinfo=timezone.utc))
    later_that_day = report_period("2026-12", datetime(2026, 12, 10, 17, tzinfo=timezone.utc))
    done = report_period("2026-12", datetime(2027, 1, 2, tzinfo=timezone.utc))
    assert email_key(mid) == "report-email:2026-12:partial-to-2026-12-10" == email_key(later_that_day)
    assert email_key(done) == "report-email:2026-12"
    assert slack_key(mid, "#finance") == "report:2026-12:partial-to-2026-12-10:#finance"
    assert slack_key(done, "#finance") == "report:2026-12:#finance"


# --------------------------------------------------------------------------- issue 40, item 7: report details


def test_page_one_names_teams_plainly_and_the_budgets_file_without_the_servers_folders(month, tmp_path):
    from gpufinops.config import load_settings

    store, _ = month
    folder = tmp_path / "srv" / "etc" / "gpufinops"
    folder.mkdir(parents=True)
    (folder / "budgets.yaml").write_text("budgets:\n  - name: ml-gpu\n    scope: {kind: team, value: genai}\n"
                                         "    amount: 100\n")
    settings = load_settings(billing={"budgets_path": str(folder / "budgets.yaml")})
    write_report(monthly_audit(store, MONTH, NOW, settings), tmp_path / "out", ["html"])
    html = (tmp_path / "out" / f"gpu-audit-{MONTH}.html").read_text()
    assert str(folder) not in html and "<code>budgets.yaml</code>, billing.budgets_path in the config" in html
    finance = html[html.index('id="finance"'):html.index("</section>", html.index('id="finance"'))]
    assert "<h3>Spend by team</h3>" in finance  # four teams, all shown: no "Top 4 team(s)"
    assert "team(s)" not in finance and "Rows in a fixed order" not in finance


def test_report_on_a_month_without_data_says_why_and_exits_1(tmp_path, capsys):
    from gpufinops.cli import main

    Store(f"sqlite:///{tmp_path / 'empty.db'}").close()
    code = main(["report", "--db", str(tmp_path / "empty.db"), "--month", "2026-10", "--out-dir",
                 str(tmp_path / "r"), "--formats", "html"])
    out, err = capsys.readouterr()
    assert code == 1 and out.splitlines() == [str(tmp_path / "r" / "gpu-audit-2026-10.html")]
    assert err.strip().splitlines()[-1] == (
        "note: no data for 2026-10: no evaluation and no billing row is stored for that month in this database "
        "(was the service running and writing to it? --month picks another month, --db another database)")


def test_report_help_names_pdf_and_the_deliveries(capsys):
    from gpufinops.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "(HTML/CSV/JSON/PDF; --deliver sends it by S3, Slack, email)" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a PDF with --formats pdf (needs Chromium)" in text
    assert "an email to email.finance with the PDF attached" in text


def test_report_deliver_prints_its_lines_without_the_services_info_log(month, tmp_path, smtp, capsys,  # noqa: F811
                                                                       caplog):
    import logging

    from gpufinops.cli import main

    store, out = month
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{out / 'demo.db'}\n"
                   f"email:\n  enabled: true\n  host: 127.0.0.1\n  port: {smtp.port}\n  security: none\n"
                   "  sender: gpufinops@example.com\n  finance: [cfo@example.com]\n"
                   "report:\n  delivery:\n    email_finance: true\n")
    caplog.set_level(logging.INFO)
    assert main(["-c", str(cfg), "report", "--month", MONTH, "--out-dir", str(tmp_path / "r"), "--formats", "html",
                 "--deliver", "--again"]) == 0
    said = [r for r in caplog.records if r.name.startswith("gpufinops") and r.levelno < logging.WARNING]
    assert said == [], [r.getMessage() for r in said]
    assert capsys.readouterr().out.splitlines()[-1].startswith("sent to email cfo@example.com: one email with ")
    # The email's text part says the title and each figure once.
    body = smtp.messages[-1].get_body(("plain",)).get_content()
    for line in (f"GPU spend report {MONTH}", "Spend: $", "Idle spend: $", "What stopping saved (net): $"):
        assert body.count(line) == 1, body
