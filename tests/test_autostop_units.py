"""Local autostop, the pure parts: ring-buffer window, state machine, settings, snooze, guards, hook."""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufinops.autostop.buffer import GAP, RingBuffer, SampleRow, rows_from_snapshot, window_usage
from gpufinops.autostop.guards import parse_utmp, recent_input_sessions, running_allowlisted, utmp_record
from gpufinops.autostop.hook import run_command
from gpufinops.autostop.machine import AutostopState, MoveKind, Observation, Phase, after_stop, next_move
from gpufinops.autostop.settings import argv_problem, load_autostop_settings
from gpufinops.autostop.snooze import parse_snooze, read_snooze, snooze_until, write_snooze
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
    return Observation((decision(verdict),), leads={"r": 60}, **kw)


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


def test_unknown_during_the_lead_cancels_at_once_and_blocks_cancel_at_the_deadline():
    """What happened during a gap in the data is not known: the warning is withdrawn at once, and a stop after
    the gap needs a new warning and its full lead (as the service renews its warnings after missing data)."""
    pending = next_move(AutostopState(), obs(Verdict.IDLE), T0).next_state
    early = next_move(pending, obs(Verdict.UNKNOWN), T0 + 10)
    assert early.kind is MoveKind.CANCEL and "unknown" in early.reason and "new warning" in early.reason
    assert early.next_state.phase is Phase.WATCHING
    again = next_move(early.next_state, obs(Verdict.IDLE), T0 + 20)
    assert again.kind is MoveKind.WARN and again.next_state.deadline == T0 + 20 + 60  # a full lead again
    blocked = next_move(pending, obs(Verdict.IDLE, blocks=("user ann on pts/0 typed 1 min ago",)), T0 + 60)
    assert blocked.kind is MoveKind.CANCEL and "ann" in blocked.reason


def test_snooze_and_blocks_prevent_a_new_warning():
    assert next_move(AutostopState(), obs(Verdict.IDLE, snooze="snoozed"), T0).kind is MoveKind.NONE
    move = next_move(AutostopState(), obs(Verdict.IDLE, blocks=("process tmux is running (1 process)",)), T0)
    assert move.kind is MoveKind.NONE and "tmux" in move.reason


def test_state_round_trips_and_garbage_is_a_fresh_start():
    state = next_move(AutostopState(boot_time=5.0), obs(Verdict.IDLE), T0).next_state
    assert AutostopState.from_json(state.to_json()) == state
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
    f.write_text("live: false\npre_stop_hook:\n  argv: save-checkpoint --all\n  timeout: 2m\n")
    with pytest.raises(ConfigError) as err:
        load_autostop_settings(f)
    assert f"{f}:3: key 'pre_stop_hook.argv'" in str(err.value)
    f.write_text("block_processes: [jupyter-lab]\nstop_comand: [systemctl, poweroff]\n")
    with pytest.raises(ConfigError, match=r":2: key 'stop_comand'"):
        load_autostop_settings(f)
    f.write_text("pre_stop_hook: {argv: [/usr/local/bin/save], timeout: 2m}\nmax_snooze: 2d\n"
                 "block_if_input_within: 0\n")
    s = load_autostop_settings(f)
    assert (s.pre_stop_hook.timeout, s.max_snooze, s.block_if_input_within, s.live) == (120, 2 * 86400, 0, False)


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


DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "systemd"


def test_shipped_autostop_settings_load_and_the_unit_runs_unprivileged():
    settings = load_autostop_settings(DEPLOY / "autostop.yaml")
    assert settings.live is False and settings.stop_command == ("systemctl", "poweroff")
    unit = dict(line.split("=", 1) for line in (DEPLOY / "gpufinops-agent.service").read_text().splitlines()
                if "=" in line and not line.startswith("#"))
    assert unit["User"] == "gpufinops" and unit["StateDirectory"] == "gpufinops"
    assert unit["RuntimeDirectory"] == "gpufinops" and unit["RuntimeDirectoryPreserve"] == "yes"
    assert unit["Restart"] == "on-failure" and unit["PrivateDevices"] == "no"  # nvidia-smi needs /dev/nvidia*
    assert "ProtectProc" not in unit  # the process allowlist reads every /proc/PID/comm
    env = dict(line.split("=", 1) for line in (DEPLOY / "agent.env").read_text().splitlines()
               if "=" in line and not line.startswith("#"))
    assert env["GPUFINOPS_AGENT_AUTOSTOP_LIVE"] == "0"
