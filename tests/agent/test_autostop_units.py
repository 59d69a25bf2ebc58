"""Local autostop, the pure parts: ring-buffer window, state machine, settings, snooze, guards, hook."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.agent.autostop.buffer import GAP, RingBuffer, SampleRow, rows_from_snapshot, window_usage
from gpufinops.agent.autostop.guards import parse_utmp, recent_input_sessions, running_allowlisted, utmp_record
from gpufinops.agent.autostop.hook import run_command
from gpufinops.agent.autostop.machine import (
    STOP_MOVED_NOTICE_S,
    AutostopState,
    MoveKind,
    Observation,
    Phase,
    after_stop,
    next_move,
)
from gpufinops.agent.autostop.settings import argv_problem, load_autostop_settings
from gpufinops.agent.autostop.snooze import SNOOZE_READ_LIMIT, parse_snooze, read_snooze, snooze_until, write_snooze
from gpufinops.collect.gpu_snapshot import GpuProcess, GpuSnapshot, HostSnapshot, MigInstance
from gpufinops.config import ConfigError
from gpufinops.model import Decision, ReasonCode, Verdict

T0 = 1_780_000_000.0


def snap(*utils: float | None, processes: int = 0) -> HostSnapshot:
    procs = tuple(GpuProcess(100 + i, "python") for i in range(processes))
    return HostSnapshot(datetime.now(timezone.utc), "nvidia-smi", tuple(
        GpuSnapshot(i, f"GPU-{i}", "H100", utilization_pct=u, memory_used_mib=500.0, power_w=70.0, processes=procs)
        for i, u in enumerate(utils)))


# ---------------------------------------------------------------------- buffer


def test_rows_per_gpu_and_per_mig_instance_and_gap():
    mig = GpuSnapshot(0, "GPU-0", "H100", mig_enabled=True, power_w=90.0, mig_instances=(
        MigInstance(1, "3g.40gb", memory_used_mib=40.0, processes=()),
        MigInstance(2, "3g.40gb", memory_used_mib=9000.0, processes=(GpuProcess(7, "python"),))))
    rows = rows_from_snapshot(HostSnapshot(datetime.now(timezone.utc), "nvml", (mig,)), "", T0)
    assert [(r.gpu, r.activity_pct, r.memory_mib, r.processes) for r in rows] == [
        ("0/1", None, 40.0, 0), ("0/2", None, 9000.0, 1)]
    (gap,) = rows_from_snapshot(None, "timeout", T0)
    assert gap.gpu == GAP and gap.reason == "timeout"


def test_window_usage_full_window_and_figures():
    rows = [r for i in range(10) for r in rows_from_snapshot(snap(3.0, 5.0, processes=1), "", T0 + 30 * i)]
    usage = window_usage(rows, instance_id="h", window_s=300, interval_s=30, now=T0 + 270)
    assert usage.error is None and usage.expected_samples == 10
    g0, g1 = usage.gpus
    assert (g0.gpu, g0.samples, g0.activity_max, g1.activity_mean, g0.processes_max, g0.process_samples) == (
        "0", 10, 3.0, 5.0, 1, 10)


def test_gaps_lower_coverage_and_a_failed_latest_read_is_an_error():
    rows = []
    for i in range(10):
        rows += rows_from_snapshot(snap(0.0) if i % 2 else None, "exit 9", T0 + 30 * i)
    usage = window_usage(rows, instance_id="h", window_s=300, interval_s=30, now=T0 + 270)
    assert usage.error is None and usage.gpus[0].samples == 5  # 50% coverage: evaluate says LOW_COVERAGE
    rows += rows_from_snapshot(None, "did not answer within 5s; killed", T0 + 300)
    usage = window_usage(rows, instance_id="h", window_s=300, interval_s=30, now=T0 + 300)
    assert "could not be read" in usage.error and "killed" in usage.error


def test_stale_samples_and_rows_before_boot_do_not_count():
    rows = [r for i in range(10) for r in rows_from_snapshot(snap(0.0), "", T0 + 30 * i)]
    stale = window_usage(rows, instance_id="h", window_s=300, interval_s=30, now=T0 + 270 + 200)
    assert "no GPU sample for" in stale.error
    after_boot = window_usage(rows, instance_id="h", window_s=300, interval_s=30, now=T0 + 270, since=T0 + 150)
    assert after_boot.gpus[0].samples == 5  # 150, 180, ..., 270


def test_ring_buffer_survives_reopen_and_prunes(tmp_path):
    db = tmp_path / "agent.db"
    buf = RingBuffer(db)
    buf.add([SampleRow(T0, "0", 1.0), SampleRow(T0 + 10, "0", 2.0), SampleRow(T0 + 20, GAP, reason="x")])
    buf.save_state("autostop", {"phase": "pending"})
    buf.close()
    again = RingBuffer(db)
    assert [r.activity_pct for r in again.rows_since(0)] == [1.0, 2.0, None]
    assert again.load_state("autostop") == {"phase": "pending"}
    assert again.prune(T0 + 5) == 1 and again.count() == 2
    assert again._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# ---------------------------------------------------------------------- state machine


def decision(verdict: Verdict, rule: str = "r", reason: str = "why") -> Decision:
    code = {Verdict.IDLE: ReasonCode.IDLE_STAYS_BELOW, Verdict.ACTIVE: ReasonCode.BUSY,
            Verdict.UNKNOWN: ReasonCode.QUERY_ERROR, Verdict.UNDERUTILIZED: ReasonCode.LOW_STEADY}[verdict]
    return Decision("h", rule, verdict, code, reason, datetime.now(timezone.utc), window_s=300)


def obs(verdict: Verdict, **kw) -> Observation:
    return Observation((decision(verdict),), **{"leads": {"r": 60}, **kw})


@pytest.mark.parametrize("verdict", [Verdict.ACTIVE, Verdict.UNKNOWN, Verdict.UNDERUTILIZED])
def test_watching_does_nothing_unless_idle(verdict):
    move = next_move(AutostopState(), obs(verdict), T0)
    assert move.kind is MoveKind.NONE and move.next_state == AutostopState()


def test_idle_warns_with_the_rules_lead_then_stops_at_the_deadline():
    warn = next_move(AutostopState(), obs(Verdict.IDLE), T0)
    assert warn.kind is MoveKind.WARN and warn.next_state.phase is Phase.PENDING and warn.next_state.deadline == T0 + 60
    early = next_move(warn.next_state, obs(Verdict.IDLE), T0 + 59)
    assert early.kind is MoveKind.NONE
    stop = next_move(warn.next_state, obs(Verdict.IDLE), T0 + 60)
    assert stop.kind is MoveKind.STOP
    held = after_stop(warn.next_state, stop.decision, note="stopped", now=T0 + 60)
    assert held.phase is Phase.HELD and next_move(held, obs(Verdict.IDLE), T0 + 61).kind is MoveKind.NONE
    assert next_move(held, obs(Verdict.IDLE), T0 + 60 + 300).kind is MoveKind.RELEASE
    assert next_move(held, obs(Verdict.ACTIVE), T0 + 61).kind is MoveKind.RELEASE


@pytest.mark.parametrize("later, why", [
    (obs(Verdict.ACTIVE), "activity resumed"),
    (obs(Verdict.IDLE, snooze="snoozed until 10:00"), "snoozed"),
])
def test_pending_is_cancelled_at_once_by_activity_or_snooze(later, why):
    pending = next_move(AutostopState(), obs(Verdict.IDLE), T0).next_state
    move = next_move(pending, later, T0 + 10)
    assert move.kind is MoveKind.CANCEL and why in move.reason and move.next_state.phase is Phase.WATCHING


def test_an_unknown_blip_holds_the_stop_silently_and_moves_it_later_by_its_length():
    """A blip shorter than the grace (120 s) is neither a cancel nor a new warning: the stop waits, and the unknown
    time does not count towards the lead, so the stop comes after a full lead of known idle."""
    pending = next_move(AutostopState(), obs(Verdict.IDLE), T0).next_state  # stop at T0 + 60
    hold = next_move(pending, obs(Verdict.UNKNOWN), T0 + 10)
    assert hold.kind is MoveKind.HOLD and hold.next_state.phase is Phase.PENDING
    assert hold.next_state.unknown_since == T0 + 10
    still = next_move(hold.next_state, obs(Verdict.UNKNOWN), T0 + 20)
    assert still.kind is MoveKind.HOLD and still.next_state.unknown_since == T0 + 10  # the same blip
    back = next_move(still.next_state, obs(Verdict.IDLE), T0 + 30)
    assert back.kind is MoveKind.NONE and back.next_state.deadline == T0 + 60 + 20  # unknown 20 s: 20 s later
    assert back.next_state.unknown_since is None
    assert next_move(back.next_state, obs(Verdict.IDLE), T0 + 60).kind is MoveKind.NONE  # the old time: no stop
    assert next_move(back.next_state, obs(Verdict.IDLE), T0 + 80).kind is MoveKind.STOP
    at_deadline = next_move(pending, obs(Verdict.UNKNOWN), T0 + 60)
    assert at_deadline.kind is MoveKind.HOLD  # UNKNOWN never stops, even at the stop time


def test_unknown_for_the_grace_withdraws_the_warning_once_and_a_stop_needs_a_new_one():
    pending = next_move(AutostopState(), obs(Verdict.IDLE), T0).next_state
    hold = next_move(pending, obs(Verdict.UNKNOWN), T0 + 10)
    held = next_move(hold.next_state, obs(Verdict.UNKNOWN), T0 + 10 + 120)
    assert held.kind is MoveKind.CANCEL and held.next_state.phase is Phase.WATCHING
    assert held.reason.startswith("stop held: GPU state unknown since ") and "new warning" in held.reason
    quiet = next_move(held.next_state, obs(Verdict.UNKNOWN), T0 + 300)
    assert quiet.kind is MoveKind.NONE  # said once: nothing more while it stays unknown
    again = next_move(quiet.next_state, obs(Verdict.IDLE), T0 + 400)
    assert again.kind is MoveKind.WARN and again.next_state.deadline == T0 + 400 + 60  # a full lead again
    blocked = next_move(pending, obs(Verdict.IDLE, blocks=("user ann on pts/0 typed 1 min ago",)), T0 + 60)
    assert blocked.kind is MoveKind.CANCEL and "ann" in blocked.reason


def test_a_gap_as_long_as_the_grace_between_two_ticks_renews_the_warning():
    """Ticks further apart than the grace: the blip is found to have been long only when data returns. One new
    warning with a full lead, not a stop on the old deadline."""
    pending = next_move(AutostopState(), obs(Verdict.IDLE), T0).next_state
    hold = next_move(pending, obs(Verdict.UNKNOWN), T0 + 10)
    renewed = next_move(hold.next_state, obs(Verdict.IDLE), T0 + 10 + 300)
    assert renewed.kind is MoveKind.WARN and "unknown for 5 min" in renewed.reason
    assert renewed.next_state.deadline == T0 + 310 + 60 and renewed.next_state.unknown_since is None


def test_a_stop_moved_materially_later_is_announced_once_per_episode():
    lead = 3600
    state = next_move(AutostopState(), obs(Verdict.IDLE, leads={"r": lead}), T0).next_state
    t, kinds = T0, []
    for blip in (200, 150, 400):  # 200 s: not yet material; 350 s in all: said; 750 s: not said again
        t += 60
        state = next_move(state, obs(Verdict.UNKNOWN, leads={"r": lead}, unknown_grace_s=600), t).next_state
        t += blip
        move = next_move(state, obs(Verdict.IDLE, leads={"r": lead}, unknown_grace_s=600), t)
        kinds.append(move.kind)
        state = move.next_state
    assert kinds == [MoveKind.NONE, MoveKind.MOVED, MoveKind.NONE]
    assert state.deadline == T0 + lead + 750 and state.moved_told
    assert 350 >= STOP_MOVED_NOTICE_S and state.told_stop_at == T0 + lead + 350  # the time in the notice


def test_snooze_and_blocks_prevent_a_new_warning():
    assert next_move(AutostopState(), obs(Verdict.IDLE, snooze="snoozed"), T0).kind is MoveKind.NONE
    move = next_move(AutostopState(), obs(Verdict.IDLE, blocks=("process tmux is running (1 process)",)), T0)
    assert move.kind is MoveKind.NONE and "tmux" in move.reason


def test_state_round_trips_and_garbage_is_a_fresh_start():
    state = next_move(AutostopState(boot_time=5.0), obs(Verdict.IDLE), T0).next_state
    assert AutostopState.from_json(state.to_json()) == state
    held = next_move(state, obs(Verdict.UNKNOWN), T0 + 5).next_state
    assert held.unknown_since == T0 + 5 and AutostopState.from_json(held.to_json()) == held
    before_issue_23 = {k: v for k, v in state.to_json().items()
                       if k not in ("unknown_since", "told_stop_at", "moved_told")}
    assert AutostopState.from_json(before_issue_23).deadline == state.deadline  # a state saved by an older agent
    assert AutostopState.from_json({"phase": "bogus"}) == AutostopState()


# ---------------------------------------------------------------------- settings


@pytest.mark.parametrize("argv, ok", [
    (["/usr/local/bin/save-checkpoint"], True),
    (["docker", "stop", "-t", "60", "trainer"], True),
    (["systemctl", "poweroff"], True),
    ("systemctl poweroff", False),
    ([], False),
    (["./save.sh"], False),
    (["bin/save"], False),
    (["sh -c 'x'"], False),
    (["docker", 60], False),
    (["-rf"], False),
])
def test_argv_validation(argv, ok):
    assert (argv_problem(argv) is None) is ok


def test_settings_errors_name_file_line_and_key(tmp_path):
    f = tmp_path / "autostop.yaml"
    f.write_text("dry_run: true\npre_stop_hook:\n  argv: save-checkpoint --all\n  timeout: 2m\n")
    with pytest.raises(ConfigError) as err:
        load_autostop_settings(f)
    assert f"{f}:3: key 'pre_stop_hook.argv'" in str(err.value)
    f.write_text("block_processes: [jupyter-lab]\nstop_comand: [systemctl, poweroff]\n")
    with pytest.raises(ConfigError, match=r":2: key 'stop_comand'"):
        load_autostop_settings(f)
    f.write_text("pre_stop_hook: {argv: [/usr/local/bin/save], timeout: 2m}\nmax_snooze: 2d\n"
                 "block_if_input_within: 0\n")
    s = load_autostop_settings(f)
    assert (s.pre_stop_hook.timeout, s.max_snooze, s.block_if_input_within, s.dry_run) == (120, 2 * 86400, 0, True)
    assert s.unknown_grace == 120  # the default
    f.write_text("dry_run: true\nunknown_grace: 5m\n")
    assert load_autostop_settings(f).unknown_grace == 300
    f.write_text("dry_run: true\nunknown_grace: soon\n")
    with pytest.raises(ConfigError, match=rf"^{f}:2: key 'unknown_grace': .*expected a duration like 10m"):
        load_autostop_settings(f)
    f.write_text("unknown_grace: -1\n")
    with pytest.raises(ConfigError, match=r":1: key 'unknown_grace': .*must be positive"):
        load_autostop_settings(f)


# ---------------------------------------------------------------------- snooze


def test_snooze_parse_cap_and_garbage():
    now = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
    assert parse_snooze("2026-12-01T14:00:00+00:00", now, now, 7 * 86400).until == now + timedelta(hours=2)
    assert parse_snooze("2026-12-01T11:00:00Z", now, now, 7 * 86400).until is None  # over
    capped = parse_snooze("2099-01-01T00:00:00", now, now, 86400)
    assert capped.until == now + timedelta(days=1) and "capped" in capped.reason
    junk = parse_snooze("next tuesday", now, now, 86400)
    assert junk.until == now + timedelta(days=1) and "not an ISO time" in junk.reason
    until, note = snooze_until(30 * 86400, now, 7 * 86400)
    assert until == now + timedelta(days=7) and "capped" in note


def test_snooze_file_written_atomically_and_read(tmp_path):
    path = tmp_path / "run" / "snooze-until"
    now = datetime.now(timezone.utc)
    assert read_snooze(path, now, 86400).until is None
    write_snooze(path, now + timedelta(hours=2))
    assert read_snooze(path, now, 86400).until is not None
    assert [p.name for p in path.parent.iterdir()] == ["snooze-until"]


def test_a_snooze_file_that_is_not_a_small_regular_file_is_unreadable_not_read(tmp_path):
    """/dev/zero (directly or through a link) would be read until MemoryError, a FIFO with no writer would block
    the autostop thread forever, a huge file would be read whole: each is unreadable, snoozed for the cap."""
    now = datetime.now(timezone.utc)
    link = tmp_path / "snooze-until"
    link.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge"
    huge.write_text("2026-12-01T14:00:00+00:00" + " " * (SNOOZE_READ_LIMIT * 4))
    for path, why in (("/dev/zero", "not a regular file"), (link, "not a regular file"),
                      (fifo, "not a regular file"), (huge, f"longer than {SNOOZE_READ_LIMIT} bytes")):
        snooze = read_snooze(path, now, 86400)
        assert snooze.until == now + timedelta(days=1), path
        assert snooze.reason == f"snooze file {path} unreadable ({why}): treated as snoozed"
    small = tmp_path / "small"
    small.write_text("2026-12-01T14:00:00+00:00" + " " * (SNOOZE_READ_LIMIT - 30))  # at the limit: read
    assert read_snooze(small, datetime(2026, 12, 1, 12, tzinfo=timezone.utc), 86400).until is not None


# ---------------------------------------------------------------------- guards


def test_utmp_sessions_with_recent_input_block(tmp_path):
    dev, proc = tmp_path / "dev", tmp_path / "proc"
    (dev / "pts").mkdir(parents=True)
    (proc / str(os.getpid())).mkdir(parents=True)
    now = time.time()
    for tty, idle_s in (("pts/0", 60), ("pts/1", 3 * 3600)):
        (dev / tty).touch()
        os.utime(dev / tty, (now - idle_s, now - idle_s))
    utmp = tmp_path / "utmp"
    utmp.write_bytes(utmp_record("ann", "pts/0", "10.0.0.5", os.getpid())
                     + utmp_record("bob", "pts/1", "10.0.0.6", os.getpid())
                     + utmp_record("ghost", "pts/0", "", 999_999_999))  # a dead session's stale record
    assert [s.user for s in parse_utmp(utmp.read_bytes())] == ["ann", "bob", "ghost"]
    reasons = recent_input_sessions(utmp, dev, proc, now=now, within_s=1800)
    assert reasons == ["user ann on pts/0 from 10.0.0.5 typed 1 min ago (less than 30 min)"]
    assert recent_input_sessions(utmp, dev, proc, now=now, within_s=0) == []
    assert recent_input_sessions(tmp_path / "missing", dev, proc, now=now, within_s=1800) == []


def test_allowlisted_processes_block(tmp_path):
    for pid, comm in ((10, "jupyter-lab"), (11, "tmux: server"), (12, "python3"), (13, "jupyter-lab")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "comm").write_text(comm + "\n")
    assert running_allowlisted(tmp_path, ["jupyter-lab", "tmux", "sshd"]) == [
        "process jupyter-lab is running (2 processes)"]
    assert running_allowlisted(tmp_path, []) == []


# ---------------------------------------------------------------------- hook


def test_run_command_exit_timeout_and_no_shell(tmp_path):
    assert run_command([sys.executable, "-c", "pass"], 10).ok
    failed = run_command([sys.executable, "-c", "print('disk full'); raise SystemExit(3)"], 10, what="pre-stop hook")
    assert not failed.ok and "exited 3: disk full" in failed.reason
    hung = run_command([sys.executable, "-c", "import time; time.sleep(60)"], 0.5, what="pre-stop hook")
    assert not hung.ok and "killed" in hung.reason
    marker = tmp_path / "pwned"
    refused = run_command([f"touch {marker}"], 5)
    assert not refused.ok and not marker.exists()


# ---------------------------------------------------------------------- shipped deploy files


DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "systemd"


def test_shipped_autostop_settings_load_and_the_unit_runs_unprivileged():
    settings = load_autostop_settings(DEPLOY / "autostop.yaml")
    assert settings.dry_run is True and settings.stop_command == ("systemctl", "poweroff")
    assert settings.unknown_grace == 120
    unit = dict(line.split("=", 1) for line in (DEPLOY / "gpufinops-agent.service").read_text().splitlines()
                if "=" in line and not line.startswith("#"))
    assert unit["User"] == "gpufinops" and unit["StateDirectory"] == "gpufinops"
    assert unit["RuntimeDirectory"] == "gpufinops" and unit["RuntimeDirectoryPreserve"] == "yes"
    assert unit["Restart"] == "on-failure" and unit["PrivateDevices"] == "no"  # nvidia-smi needs /dev/nvidia*
    assert "ProtectProc" not in unit  # the process allowlist reads every /proc/PID/comm
    env = dict(line.split("=", 1) for line in (DEPLOY / "agent.env").read_text().splitlines()
               if "=" in line and not line.startswith("#"))
    assert env["GPUFINOPS_AGENT_AUTOSTOP_LIVE"] == "0"
    # Prometheus scrapes this host from another machine: the bind is said, the code's default is loopback.
    assert env["GPUFINOPS_AGENT_ADDRESS"] == "0.0.0.0"
    # EC2 self-stop (and so any request to the metadata address) is an explicit choice, not the shipped default.
    assert settings.stop_method == "command" and load_autostop_settings(None).stop_method == "command"


def test_dry_run_is_the_services_name_and_live_a_deprecated_alias(tmp_path, caplog):
    f = tmp_path / "autostop.yaml"
    assert load_autostop_settings(None).dry_run is True  # dry-run by default, as the service
    f.write_text("stop_method: command\nlive: true\n")
    with caplog.at_level("WARNING", logger="gpufinops.autostop"):
        assert load_autostop_settings(f).dry_run is False
    assert f"{f}:2: key 'live' is deprecated: write dry_run: false" in caplog.text
    f.write_text("live: false\ndry_run: false\n")
    with pytest.raises(ConfigError, match=rf"^{f}:1: key 'live': the deprecated name of dry_run"):
        load_autostop_settings(f)
    f.write_text("live: sometimes\n")
    with pytest.raises(ConfigError, match=rf"^{f}:1: key 'live': expected true or false"):
        load_autostop_settings(f)


def test_the_snooze_file_is_parsed_and_capped_by_the_services_snooze_parser():
    """One parser, one cap: a value means on a host what it means on the tag (act.plan.snooze_value)."""
    from gpufinops.act.plan import snooze_of
    from gpufinops.model import TAG_SNOOZE, GpuInstance

    now = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
    inst = GpuInstance("i-1", "g5.xlarge", "us-east-1", "running", now)
    for value in ("2026-12-01T14:00:00+00:00", "2099-01-01T00:00:00", "next tuesday", "2026-12-01T11:00:00Z"):
        on_host = parse_snooze(value + "\n", now, now, 86400)
        on_tag = snooze_of(replace(inst, tags={TAG_SNOOZE: value}), now, now, 86400)
        assert (on_host.active, on_host.until, on_host.capped) == (on_tag.active, on_tag.until, on_tag.capped), value
        assert on_host.reason == on_tag.reason.replace(f"tag {TAG_SNOOZE}", "snooze file")
    assert "capped at 1 d)" in parse_snooze("2099-01-01T00:00:00", now, now, 86400).reason
