"""The per-decision log line (issue 26, item 10): INFO when an (instance, rule)'s verdict or reason code changes,
DEBUG while a tick only repeats it."""

import logging
from datetime import datetime, timezone

from gpufinops.model import Decision, ReasonCode, Verdict
from gpufinops.run.pipeline import DecisionLog

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def decision(iid, verdict, code, reason="figures change every tick"):
    return Decision(iid, "idle-2h", verdict, code, reason, T0)


def levels(caplog):
    out = [(r.levelno, r.getMessage().split(" ")[2]) for r in caplog.records if r.name == "gpufinops.pipeline"]
    caplog.clear()
    return out


def test_a_repeated_verdict_is_logged_at_debug_and_a_change_at_info(caplog):
    caplog.set_level(logging.DEBUG, logger="gpufinops.pipeline")
    log = DecisionLog()
    idle, busy = (Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW), (Verdict.ACTIVE, ReasonCode.BUSY)
    log.write("r1", [decision("i-a", *idle), decision("i-b", *busy)])
    assert levels(caplog) == [(logging.INFO, "i-a"), (logging.INFO, "i-b")]  # first seen by this process
    log.write("r2", [decision("i-a", *idle, reason="other figures"), decision("i-b", *busy)])
    assert levels(caplog) == [(logging.DEBUG, "i-a"), (logging.DEBUG, "i-b")]  # the same verdict and code again
    log.write("r3", [decision("i-a", *busy), decision("i-b", *busy)])
    assert levels(caplog) == [(logging.INFO, "i-a"), (logging.DEBUG, "i-b")]  # i-a became busy
    log.write("r4", [decision("i-b", *busy)])
    log.write("r5", [decision("i-a", *busy), decision("i-b", *busy)])
    assert levels(caplog)[-2:] == [(logging.INFO, "i-a"), (logging.DEBUG, "i-b")]  # i-a was gone a tick: new again
