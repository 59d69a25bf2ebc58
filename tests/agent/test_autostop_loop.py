"""Local autostop end to end: a fake nvidia-smi replaying a real H100 capture, stub `wall`, hook and stop
commands that record their argv, a utmp file, a snooze file, a SQLite ring buffer, and a clock the test moves.

Each sample is the real agent's `sample_once()` (gpufinops.agent.Agent with NvidiaSmiReader running the fake),
which hands the snapshot (or None and the reason) to the loop's `on_sample`, then one `tick()`: a 5-minute rule window at a 60 s interval is 5
samples, its 1-minute warning lead 1 more, so no test sleeps.
"""

from __future__ import annotations

import argparse
import os
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpufinops.agent.exporter import Agent, HostIdentity
from gpufinops.agent.autostop.cli import build_loop
from gpufinops.agent.autostop.guards import utmp_record
from gpufinops.agent.autostop.loop import HostPaths
from gpufinops.agent.autostop.machine import MoveKind, Phase
from gpufinops.agent.autostop.settings import load_autostop_settings
from gpufinops.cli.app import main as gpufinops_main
from gpufinops.collect.nvidia_smi import NvidiaSmiReader
from tests.fake_nvidia_smi import install

CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "data" / "nvidia_smi" / "captures_raw"
H100 = CAPTURES / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
INTERVAL = 60.0

RULES = """\
rules:
  - name: idle-5m
    threshold_pct: 10
    window: 5m
    min_coverage: 0.8
    warning_lead: 1m
    action: stop
  - name: notify-only
    threshold_pct: 1
    window: 5m
    warning_lead: 1m
    action: notify
"""

RECORDER = """#!/bin/sh
# Records its argv (one per line, then a blank line) and exits with the code in {rc} (default 0).
for a in "$0" "$@"; do printf '%s\\n' "$a"; done >> {log}
printf '\\n' >> {log}
exit "$(cat {rc} 2>/dev/null || echo 0)"
"""


class Clock:
    def __init__(self) -> None:
        self.t = time.time()  # real "now", so the snooze file's mtime and a tty's atime mean what they say

    def __call__(self) -> float:
        return self.t


class Host:
    """A host in tmp_path: bin/ with the stubs, proc/, dev/, utmp, snooze file, rules, settings, database."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        self.root = tmp_path
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.nvidia_smi = install(self.bin)
        self.script = tmp_path / "nvidia-smi.script"
        self.script.write_text("idle*200\n")
        monkeypatch.setenv("FAKE_NVIDIA_SMI_CAPTURE", str(H100))
        monkeypatch.setenv("FAKE_NVIDIA_SMI_SCRIPT", str(self.script))
        for name in ("wall", "hook", "stop"):
            path = self.bin / name
            path.write_text(RECORDER.format(log=tmp_path / f"{name}.log", rc=tmp_path / f"{name}.rc"))
            path.chmod(0o755)
        self.clock = Clock()
        self.proc = tmp_path / "proc"
        (self.proc / str(os.getpid())).mkdir(parents=True)
        (self.proc / "stat").write_text(f"cpu 1 2 3\nbtime {int(self.clock.t - 86400)}\n")
        self.dev = tmp_path / "dev"
        (self.dev / "pts").mkdir(parents=True)
        self.utmp = tmp_path / "utmp"
        self.snooze = tmp_path / "run" / "snooze-until"
        self.rules = tmp_path / "rules.yaml"
        self.rules.write_text(RULES)
        self.db = tmp_path / "state" / "agent.db"
        self.settings_file = tmp_path / "autostop.yaml"
        self.write_settings()
        self.reader = NvidiaSmiReader(str(self.nvidia_smi), timeout_s=20.0)  # 2 shared cores: be patient
        self.loop = None
        self.interval = INTERVAL  # the agent's --interval; tests/faults/test_agent_noise.py runs at the default 10 s

    def write_settings(self, extra: str = "stop_method: command\n") -> None:
        self.settings_file.write_text(textwrap.dedent(f"""\
            dry_run: false
            stop_command: [{self.bin / 'stop'}, poweroff]
            pre_stop_hook: {{argv: [{self.bin / 'hook'}, --save], timeout: 10s}}
            wall_command: [{self.bin / 'wall'}]
            block_processes: [jupyter-lab]
            """) + extra)

    def start(self, **overrides):
        """A loop as `gpufinops agent --autostop rules.yaml --autostop-config autostop.yaml` builds it."""
        args = argparse.Namespace(autostop=[str(self.rules)], autostop_config=str(self.settings_file),
                                  autostop_live=False, autostop_db=str(self.db), snooze_file=str(self.snooze))
        self.agent = agent = Agent(HostIdentity("gpu-box-1"), reader=self.reader, interval_s=self.interval,
                                   timeout_s=20.0)
        settings = load_autostop_settings(self.settings_file)
        if overrides:
            settings = settings.model_copy(update=overrides)
        self.loop = build_loop(args, agent, settings=settings, clock=self.clock,
                               paths=HostPaths(snooze=str(self.snooze), utmp=str(self.utmp), dev=str(self.dev),
                                               proc=str(self.proc)))
        agent.on_sample = self.loop.on_sample  # as maybe_start_autostop wires it
        return self.loop

    def sample(self, n: int = 1):
        """n samples, an interval apart: the agent reads nvidia-smi, calls on_sample, then one tick. The last move."""
        move = None
        for _ in range(n):
            self.clock.t += self.interval
            self.agent.sample_once()
            move = self.loop.tick()
        return move

    def until(self, kind: MoveKind, limit: int = 20):
        for i in range(limit):
            move = self.sample()
            if move.kind is kind:
                return move, i + 1
        raise AssertionError(f"no {kind} in {limit} samples; last: {move.kind} {move.reason}")

    def calls(self, name: str) -> list[list[str]]:
        log = self.root / f"{name}.log"
        if not log.exists():
            return []
        return [block.splitlines() for block in log.read_text().split("\n\n") if block.strip()]

    def walls(self) -> list[str]:
        return [argv[1] for argv in self.calls("wall")]

    def fail(self, name: str, rc: int = 1) -> None:
        (self.root / f"{name}.rc").write_text(str(rc))


@pytest.fixture
def host(tmp_path, monkeypatch):
    h = Host(tmp_path, monkeypatch)
    yield h
    if h.loop is not None:
        h.loop.buffer.close()


def test_idle_host_is_warned_then_hook_then_stop_command(host):
    host.start()
    _warn, n = host.until(MoveKind.WARN)
    assert n == 4  # 4 of 5 samples (min_coverage 0.8) of a 5-minute window, every one at 0%
    (warning,) = host.walls()
    assert "will be stopped" in warning and "gpu-box-1" in warning and "gpufinops agent snooze 2h" in warning
    assert host.calls("stop") == []
    stop = host.sample()  # the 1-minute lead is over
    assert stop.kind is MoveKind.STOP
    assert host.calls("hook") == [[str(host.bin / "hook"), "--save"]]
    assert host.calls("stop") == [[str(host.bin / "stop"), "poweroff"]]
    assert "stopped by command" in host.walls()[-1]
    assert host.loop.buffer.load_state("autostop")["phase"] == Phase.HELD.value
    host.sample(3)  # held: no second warning, no second stop
    assert len(host.calls("stop")) == 1 and len(host.walls()) == 2


def test_dry_run_warns_and_says_what_it_would_do_but_runs_nothing(host):
    host.start(dry_run=True)
    host.until(MoveKind.WARN)
    host.until(MoveKind.STOP)
    assert host.calls("hook") == [] and host.calls("stop") == []
    warning, would = host.walls()
    assert "[DRY-RUN]" in warning and "would be stopped" in warning
    assert "would run" in would and "NOT stopped" in would


def test_activity_resuming_cancels_the_pending_stop(host):
    host.script.write_text("idle*4\nload*50\n")
    host.start()
    host.until(MoveKind.WARN)
    cancel = host.sample()
    assert cancel.kind is MoveKind.CANCEL and "activity resumed" in cancel.reason
    assert "stop cancelled: activity resumed" in host.walls()[-1]
    host.sample(2)
    assert host.calls("hook") == [] and host.calls("stop") == []


def test_a_failing_hook_cancels_the_stop_and_alerts(host):
    host.fail("hook", 3)
    host.start()
    host.until(MoveKind.WARN)
    host.until(MoveKind.STOP)
    assert len(host.calls("hook")) == 1 and host.calls("stop") == []
    alert = host.walls()[-1]
    assert "pre-stop hook" in alert and "exited 3" in alert and "keeps running" in alert
    assert host.loop.buffer.load_state("autostop")["phase"] == Phase.HELD.value
    host.sample(3)
    assert len(host.calls("hook")) == 1  # not retried every sample


def test_a_hung_nvidia_smi_holds_the_stop_then_withdraws_it_once_after_the_grace(host):
    host.script.write_text("idle*4\nhang*10\n")
    host.start(unknown_grace=120)
    host.until(MoveKind.WARN)
    host.reader.timeout_s = 1.0
    hold = host.sample()  # nvidia-smi hangs at the stop time: killed after 1 s
    assert hold.kind is MoveKind.HOLD and "could not be read" in hold.decision.reason
    assert "timeout" in hold.decision.reason
    assert host.sample().kind is MoveKind.HOLD  # unknown for 60 s, less than the grace: held, nobody told
    assert len(host.walls()) == 1
    withdrawn = host.sample()  # unknown for 120 s: the grace
    assert withdrawn.kind is MoveKind.CANCEL and "stop held: GPU state unknown since" in withdrawn.reason
    assert "stop held: GPU state unknown since" in host.walls()[-1] and len(host.walls()) == 2
    assert host.sample().kind is MoveKind.NONE  # said once, and no new warning while it stays unreadable
    assert len(host.walls()) == 2 and host.calls("hook") == [] and host.calls("stop") == []


def test_a_stop_moved_much_later_by_unknown_time_is_announced_once(host):
    """Six failed reads (and the window UNKNOWN by coverage until four good ones are back): 9 min unknown, under
    a 10 min grace. The stop moves 9 min later than announced, which is said once; then the stop."""
    host.rules.write_text(RULES.replace("warning_lead: 1m", "warning_lead: 10m", 1))
    host.script.write_text("idle*4\nfail*6\nidle*40\n")
    host.start(unknown_grace=600)
    host.until(MoveKind.WARN)
    moved, n = host.until(MoveKind.MOVED)
    assert n == 10 and "stop moved to" in moved.reason and len(host.walls()) == 2
    assert "stop moved to" in host.walls()[-1] and "gpu-box-1" in host.walls()[-1]
    _stop, n = host.until(MoveKind.STOP)
    assert n == 9  # 10 min lead + 9 min unknown after the warning, 19 samples in all
    assert len(host.walls()) == 3 and len(host.calls("stop")) == 1


def test_an_agent_restart_keeps_the_window_and_the_pending_warning(host):
    host.start()
    host.sample(2)
    host.loop.buffer.close()
    host.start()  # a new process: new loop, same SQLite file
    _move, n = host.until(MoveKind.WARN)
    assert n == 2  # the 2 samples before the restart count: 4 in all
    host.loop.buffer.close()
    host.start()
    assert host.sample().kind is MoveKind.STOP  # the deadline survived; no second warning
    assert len([w for w in host.walls() if "will be stopped" in w]) == 1
    assert len(host.calls("stop")) == 1


def test_a_reboot_starts_the_window_again(host):
    host.start()
    host.until(MoveKind.WARN)
    (host.proc / "stat").write_text(f"btime {int(host.clock.t)}\n")  # the host was started again just now
    move = host.sample()
    assert move.kind is MoveKind.NONE and "not judged before a full 5 min window" in move.reason
    assert host.loop.buffer.load_state("autostop")["phase"] == Phase.WATCHING.value


def test_the_snooze_file_blocks_a_warning_and_cancels_a_pending_one(host, capsys):
    host.start()
    assert gpufinops_main(["agent", "snooze", "2h", "--snooze-file", str(host.snooze)]) == 0
    assert "snoozed until" in capsys.readouterr().out
    move = host.sample(5)
    assert move.kind is MoveKind.NONE and "snoozed until" in move.reason and host.walls() == []
    assert gpufinops_main(["agent", "snooze", "--clear", "--snooze-file", str(host.snooze)]) == 0
    host.until(MoveKind.WARN)
    assert gpufinops_main(["agent", "snooze", "30m", "--snooze-file", str(host.snooze)]) == 0
    cancel = host.sample()
    assert cancel.kind is MoveKind.CANCEL and "snoozed until" in cancel.reason
    host.sample(2)
    assert host.calls("stop") == []


def test_an_ssh_session_with_recent_input_blocks(host, caplog):
    caplog.set_level("INFO", logger="gpufinops.autostop")
    tty = host.dev / "pts" / "3"
    tty.touch()
    host.utmp.write_bytes(utmp_record("ann", "pts/3", "10.1.2.3", os.getpid()))
    host.start()
    os.utime(tty, (host.clock.t, host.clock.t))
    move = host.sample(5)
    assert move.kind is MoveKind.NONE and "user ann on pts/3 from 10.1.2.3 typed" in move.reason
    assert host.walls() == []
    said = [r.getMessage() for r in caplog.records if "not stopped: user ann" in r.getMessage()]
    assert len(said) == 1  # said in the log when it starts, not every sample
    os.utime(tty, (host.clock.t - 3600, host.clock.t - 3600))  # she stopped typing an hour ago
    host.until(MoveKind.WARN)


def test_an_allowlisted_process_blocks(host):
    (host.proc / "4242").mkdir()
    (host.proc / "4242" / "comm").write_text("jupyter-lab\n")
    host.start()
    move = host.sample(5)
    assert move.kind is MoveKind.NONE and "process jupyter-lab is running" in move.reason


def test_an_undelivered_warning_does_not_start_the_lead(host):
    host.fail("wall")  # no Slack configured either: nobody can be told
    host.start()
    host.sample(6)
    assert host.loop.buffer.load_state("autostop")["phase"] == "watching"  # never PENDING
    assert host.calls("stop") == []
    host.fail("wall", 0)
    host.sample()
    state = host.loop.buffer.load_state("autostop")
    assert state["phase"] == "pending" and state["deadline"] == host.clock.t + 60


def test_the_ring_buffer_keeps_only_the_longest_window_and_margin(host):
    host.write_settings("stop_method: command\nkeep_margin: 1m\n")
    host.start()
    snapshot = host.reader.read()  # one real read, replayed: an hour of samples without an hour of nvidia-smi runs
    for _ in range(120):  # kept: 5 min window + 1 min margin, pruned every 100 samples
        host.clock.t += INTERVAL
        host.loop.on_sample(snapshot, "")
    oldest = host.loop.buffer.rows_since(0)[0].t
    assert host.clock.t - oldest <= 300 + 60 + 100 * INTERVAL
    assert host.loop.buffer.count() < 120


def test_mig_slices_without_an_activity_counter_need_the_rules_opt_in(host, monkeypatch):
    """Idle H100 MIG capture: four GPU instances, no utilization figure, no processes, a few MiB each."""
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CAPTURE", str(CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"))
    host.start()
    move = host.sample(5)
    assert move.kind is MoveKind.NONE and "no activity counter (MIG)" in move.reason  # default: never idle
    host.rules.write_text(RULES.replace("    action: stop\n", "    action: stop\n"
                                        "    idle_without_activity_counter: no_processes_and_idle_memory\n", 1))
    host.loop.buffer.close()
    host.start()
    host.until(MoveKind.WARN, limit=2)
    assert host.sample().kind is MoveKind.STOP


def test_a_dry_run_warning_never_counts_for_a_live_stop(host):
    host.start(dry_run=True)
    host.until(MoveKind.WARN)
    assert "[DRY-RUN]" in host.walls()[0]
    host.loop.buffer.close()
    host.start(dry_run=False)  # restarted with --autostop-live while the dry-run stop was pending
    move = host.sample()
    assert move.kind is MoveKind.WARN and "will be stopped" in host.walls()[-1]
    assert host.calls("stop") == []
    assert host.sample().kind is MoveKind.STOP and len(host.calls("stop")) == 1


class KeyRecordingSlack:
    """A notifier that records the keys it is asked to send and answers as told (False = not delivered)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.keys: list[str] = []

    def send(self, msg) -> bool:
        self.keys.append(msg.key)
        return self.answers.pop(0) if self.answers else True


def test_a_warning_retried_after_a_failed_delivery_keeps_its_key(host):
    """A lost answer may hide a post that went through: the retry must carry the same idempotency key, so the
    notifier (exactly once per key) does not post it twice."""
    host.fail("wall")
    host.start()
    slack = KeyRecordingSlack([False, False, True])
    host.loop.announcer.slack = slack
    host.until(MoveKind.WARN)
    host.sample(2)
    warnings = [k for k in slack.keys if k.startswith("warn:")]
    assert len(warnings) == 3 and len(set(warnings)) == 1
    assert host.loop.buffer.load_state("autostop")["phase"] == "pending"


def test_a_snooze_written_while_the_hook_runs_wins_at_the_last_look(host):
    # The person snoozes in the seconds the pre-stop hook takes: the last look right before the stop sees it.
    until = datetime.fromtimestamp(host.clock.t + 86400, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    host.snooze.parent.mkdir(parents=True, exist_ok=True)
    hook = host.bin / "hook"
    hook.write_text(f"#!/bin/sh\necho \"$@\" >> {host.root / 'hook.log'}\necho {until} > {host.snooze}\n")
    hook.chmod(0o755)
    host.start()
    host.until(MoveKind.WARN)
    host.until(MoveKind.STOP)
    assert (host.root / "hook.log").read_text().strip() == "--save"  # the hook ran
    assert host.calls("stop") == []  # the stop did not
    alert = host.walls()[-1]
    assert "cancelled at the last look" in alert and "snooze" in alert and "keeps running" in alert


def test_each_stop_is_an_intent_row_written_before_the_call_and_settled_after(host):
    """The agent's own audit trail (its SQLite `actions`): the row exists, pending, while the stop command runs,
    and says done (or failed) afterwards."""
    host.start()
    host.until(MoveKind.WARN)
    seen_while_running = []
    stopper = host.loop.stopper
    real_stop = stopper.stop

    def stop_and_look():
        seen_while_running.extend((r.status, r.kind) for r in host.loop.buffer.actions())
        seen_while_running.append(host.loop.buffer.load_state("autostop")["phase"])
        return real_stop()

    stopper.stop = stop_and_look
    assert host.sample().kind is MoveKind.STOP
    assert seen_while_running == [("pending", "stop"), Phase.STOPPING.value]  # intent and state saved first
    [row] = host.loop.buffer.actions()
    assert (row.status, row.how) == ("done", f"command {host.bin / 'stop'} poweroff")
    assert "still idle at the stop time" in row.reason and row.settled_at is not None
    assert len(host.calls("stop")) == 1


def test_a_crash_between_the_stop_request_and_its_answer_never_sends_it_again(host):
    """The agent dies after sending the stop (the request is out, its answer never recorded) and starts again on
    the same boot: one mutating call per intent, so the next run settles the intent as unknown, says so once,
    and holds; the stop command is not run a second time."""
    host.start()
    host.until(MoveKind.WARN)
    stopper = host.loop.stopper
    real_stop = stopper.stop

    def stop_then_die():
        real_stop()  # the command ran...
        raise KeyboardInterrupt  # ...and the process died before the answer was written

    stopper.stop = stop_then_die
    with pytest.raises(KeyboardInterrupt):
        host.sample()
    assert [r.status for r in host.loop.buffer.actions()] == ["pending"]
    host.loop.buffer.close()
    host.start()  # a new process, same boot, same SQLite file
    settle = host.sample()
    assert settle.kind is MoveKind.SETTLE and "not sent again" in settle.reason
    [row] = host.loop.buffer.actions()
    assert row.status == "unknown" and "before this request's answer was recorded" in row.detail
    assert "no recorded answer" in host.walls()[-1] and "intent was written at" in host.walls()[-1]
    host.sample(3)  # held: no new warning, no second stop
    assert len(host.calls("stop")) == 1
    assert host.loop.buffer.load_state("autostop")["phase"] == Phase.HELD.value


def test_a_restart_with_autostop_live_after_a_dry_run_would_stop_warns_for_real_at_once(host, caplog):
    """Dry-run said "would stop ... NOT stopped" (HELD for a window); restarted with --autostop-live, the agent says
    once that it switched to live and warns for real with the full lead at its first judgement: it neither replays
    the dry-run line nor waits out the dry-run hold."""
    import logging

    host.start(dry_run=True)
    host.until(MoveKind.WARN)
    host.until(MoveKind.STOP)
    assert "NOT stopped" in host.walls()[-1]
    host.loop.buffer.close()
    walls_before = len(host.walls())
    caplog.clear()
    caplog.set_level(logging.INFO, logger="gpufinops.autostop")
    host.start(dry_run=False)  # restarted with --autostop-live
    move = host.sample()
    assert move.kind is MoveKind.WARN
    (warning,) = host.walls()[walls_before:]
    assert "will be stopped" in warning and "[DRY-RUN]" not in warning and "in 1 min" in warning
    switched = [r.getMessage() for r in caplog.records if "switched from dry-run to live" in r.getMessage()]
    assert switched == ["autostop: switched from dry-run to live: the dry-run would-stop does not count; a real "
                        "warning with its full lead comes before any stop"]
    assert not any("NOT stopped" in r.getMessage() or "would stop" in r.getMessage().replace("would-stop", "")
                   for r in caplog.records)
    assert host.sample().kind is MoveKind.STOP and len(host.calls("stop")) == 1  # after the 1-minute lead
