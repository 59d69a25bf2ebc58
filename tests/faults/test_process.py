"""Process cases of the fault matrix: real `gpufinops serve` processes killed -9 at each step of a
stop, two schedulers on one database, the leader killed. The scenarios run concurrently in the
background (tests/faults/conftest.py `serve_scenarios`); each test waits for its own and checks the
matrix' invariants (tests/faults/harness.py `check_invariants`).
"""

from __future__ import annotations

import pytest

from tests.faults.faultproxy import aws_action
from tests.faults.harness import check_invariants, is_stopped_notice_for, log_line
from tests.faults.serveworld import ServeWorld

pytestmark = pytest.mark.integration

STOP_WAIT_S = 200  # serve start + the instance older than the window + the 60 s lead, on 2 busy cores
# A stop whose request may still be in flight is settled only after the EC2 client's connect + read timeout and a
# margin (5 + 30 + 30 s by default: act.reconcile), then made again: the restart waits that long on top.
SETTLE_WAIT_S = 160


def stop_announced(w: ServeWorld) -> bool:
    idle = w.ids["idle"]
    return w.stop_time(idle) is not None and any(is_stopped_notice_for(m.text, idle) for m in w.delivered())


def kill_then_restart(w: ServeWorld) -> None:
    w.start_serve()
    if w.wait_killed(STOP_WAIT_S):
        w.start_serve()  # the restart: reconcile, then carry on
        w.wait_for("the stop to be settled and announced after the restart", lambda: stop_announced(w),
                   SETTLE_WAIT_S)


def kill_before_stop_is_forwarded(w: ServeWorld) -> None:
    # (a) killed as its StopInstances reaches the proxy; moto never sees that request.
    w.ec2.arm("hook", aws_action("StopInstances"), times=1, hook=w.kill_newest)
    kill_then_restart(w)


def kill_after_stop_is_forwarded(w: ServeWorld) -> None:
    # (b) moto stopped the instance; the process dies before it reads the answer.
    w.ec2.arm("hook", aws_action("StopInstances"), times=1, hook=w.kill_newest, after=True)
    kill_then_restart(w)


def kill_at_stopped_by_tag(w: ServeWorld) -> None:
    # (c) the stop went through and was answered; killed on the next request (CreateTags stopped-by).
    w.ec2.arm("hook", lambda r: r.aws_action == "CreateTags" and b"stopped-by" in r.body, times=1,
              hook=w.kill_newest)
    kill_then_restart(w)


def two_schedulers_one_database(w: ServeWorld) -> None:
    w.start_serve()
    w.start_serve()
    w.wait_for("the stop to be made and announced", lambda: stop_announced(w), STOP_WAIT_S)


def leader_killed_after_the_warning(w: ServeWorld) -> None:
    # The leader is killed right after Slack accepted its warning: the standby takes the lease over
    # (ttl 3 s), stops after the full lead, and does not warn a second time.
    w.slack.arm("hook", lambda r: r.slack_method == "chat.postMessage" and b"will be stopped" in r.body, times=1,
                hook=w.kill_leader, after=True, forward=True)
    w.start_serve()
    w.start_serve()
    if w.wait_killed(STOP_WAIT_S):
        w.wait_for("the standby to stop and announce", lambda: stop_announced(w), STOP_WAIT_S)


SCENARIOS = {
    "kill9_before_stop_forwarded": (kill_before_stop_is_forwarded, (log_line("reconcil"),)),
    "kill9_after_stop_forwarded": (kill_after_stop_is_forwarded, (log_line("reconcil"),)),
    "kill9_at_stopped_by_tag": (kill_at_stopped_by_tag, (log_line("reconcil"),)),
    "two_schedulers_one_database": (two_schedulers_one_database, (log_line("standby|lease"),)),
    "leader_killed_after_the_warning": (leader_killed_after_the_warning, (log_line("became leader"),)),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_serve_process_fault(serve_scenarios, name):
    if not serve_scenarios:
        pytest.skip("prometheus not installed")
    world, thread = serve_scenarios[name]
    thread.join(timeout=STOP_WAIT_S * 2)
    check_invariants(world, *SCENARIOS[name][1])
