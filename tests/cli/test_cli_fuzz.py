"""Every command's argument parsing, fuzzed (issue 35, item 7): no argument list, however hostile, gets a
traceback out of `gpufinops.cli.main`. It returns an int exit code or exits through argparse (SystemExit with an
int), and stderr (the log included) holds no traceback.

The commands are found by walking the argparse parser, so a new command is fuzzed without editing this file.
Each command's argument lists are drawn from its own options: valid flags with hostile values (empty, NUL, inf,
nan, negative, huge, /dev/zero, a folder, a file that is not a database, a path that does not exist, unicode)
mixed with a few valid ones, so that the commands get past their first check.

Everything runs in-process against local things only: the config points Prometheus and AWS at a closed port of
127.0.0.1, the database and outbox into a temporary folder, AWS credentials are fake and the instance metadata
lookup is off, and a socket guard refuses (and records) any connection or name lookup that is not loopback, so
no example can reach the network, 169.254.169.254 included.

Derandomized, no example database: CI runs the same examples every time. A longer hunt, by hand:
GPUFINOPS_CLI_FUZZ_EXAMPLES=400 python -m pytest tests/cli/test_cli_fuzz.py
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufinops.cli import build_parser, main
from tests.promserver import free_port

EXAMPLES = int(os.environ.get("GPUFINOPS_CLI_FUZZ_EXAMPLES", "50"))  # per command; scales SLOW_COMMANDS too

# Commands that reach a (closed) network port, write a report or replay a simulation take up to a second an
# example: fewer examples, so the whole file stays well under a minute.
SLOW_COMMANDS = {("evaluate",): 4, ("recommend",): 4, ("costs",): 8, ("budgets", "check"): 12, ("demo",): 3,
                 ("backtest",): 20, ("report",): 6, ("serve",): 15}

# Options never generated, and why.
NEVER = {
    "--help", "-h", "--version",  # they print and exit 0: nothing to find
    # Really stops this host (the agent's autostop, live): never in a test, whatever the other values are.
    "--autostop-live",
}

# Appended to every argument list of a command, and why.
ALWAYS = {
    # The demo replays a simulated fleet: only its quick 3-hour span, once, printing the summary only (seconds,
    # not minutes). Its own flags are still fuzzed on top.
    ("demo",): ["--quick", "--no-compare", "--quiet"],
}

# No value names a place outside the test's folder: this runs as whatever user runs the tests (root in a
# container), and some commands remove or replace the file they are given (`agent snooze --clear` unlinks it).
HOSTILE_TEXT = ["", " ", "\x00", "a\x00b", "inf", "-inf", "nan", "-1", "0", "-0", "1e308", "-1e308",
                "99999999999999999999", "-99999999999999999999", "0x10", "1,2,x", "now-", "now-99999999999d",
                "2024-13", "0000-00", "9999-99", "é☃\u202egpu", "\ud7ff", "-", "--", "=", "*",
                "s3://", "http://127.0.0.1:1", "sqlite://", "sqlite:///\x00", "%s%n", "{}", "a" * 300]


def hostile_paths(root: Path) -> list[str]:
    """Paths inside the test's folder. The devices are links to /dev/zero (never ends) and /dev/null: reading
    follows them, while removing or replacing one changes only the link, never the device."""
    return [str(root / "missing" / "x.db"), str(root / "a-folder"), str(root / "not-a-database.db"),
            str(root / "not-yaml.yaml"), str(root / "dev-zero"), str(root / "dev-null"),
            str(root / "unicode-é☃.yaml"), str(root / "a-folder") + "/"]


def inside_the_test_folder(text: str) -> bool:
    return not text.startswith(("/", "~")) and ".." not in text


def valid_values(root: Path) -> dict[str, list[str]]:
    """A few values each option accepts, by its argparse dest, so examples get past the first check."""
    return {
        "month": ["2026-11", "2026-12", "1999-01"],
        "params": ["70B", "7e9", "1"], "context": ["4096"], "batch": ["1", "8"], "layers": ["80"],
        "hidden": ["8192"], "limit": ["1", "10"], "provider": ["aws"],
        "since": ["24h", "7d"], "instance": ["i-0abc"],
        "tick": ["600", "3600", "2h"], "hours": ["1", "0.5"], "step": ["60"], "trace_step": ["60"],
        "port": ["9400", "18000"], "interval": ["10"], "timeout": ["5"], "hostname": ["gpu-1"],
        "duration": ["2h"], "max": ["7d"], "target": ["ml/trainer", "ml/Deployment/x"],
        "trace": [str(root / "trace.csv")], "rules": [str(root / "rules")], "paths": [str(root / "rules")],
        "autostop": [str(root / "rules")],
        "db": [str(root / "fuzz.db")], "out_dir": [str(root / "out")], "formats": ["csv", "json,csv"],
        "start": ["now-1d", "0"], "end": ["now"], "thresholds": ["5,10"], "windows": ["10m,1h"],
        "aggregations": ["mean"], "demand_pct": ["5"], "price": ["2.5"], "false_stop_cost": ["2"],
        "restart_cost": ["10m"], "break_even": ["30m"], "max_false_stop_rate": ["0.1"],
        "suggest_out": [str(root / "out" / "rule.yaml")], "chart": [str(root / "out" / "chart.png")],
        "json_out": [str(root / "out" / "bt.json")],
        "prometheus": ["", "http://127.0.0.1:1"],  # closed ports only: never a real address
    }


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of every command and subcommand, parents included (`gpufinops rules` prints its help)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from commands(sub, (*path, name))


COMMANDS = {path: p for path, p in commands(build_parser())}


def value_strategy(action: argparse.Action, root: Path) -> st.SearchStrategy[str]:
    """A hostile path, a hostile text or number, any short text, or a valid value: a quarter each."""
    good = list(action.choices or []) + valid_values(root).get(action.dest, [])
    return st.one_of(st.sampled_from(hostile_paths(root)), st.sampled_from(HOSTILE_TEXT),
                     st.text(max_size=8).filter(inside_the_test_folder),
                     st.sampled_from(good or [*HOSTILE_TEXT, *hostile_paths(root)]))


def option_args(action: argparse.Action, root: Path) -> st.SearchStrategy[list[str]]:
    flag = st.sampled_from(action.option_strings)
    if action.nargs == 0:  # store_true, store_const, count
        return flag.map(lambda f: [f])
    value = value_strategy(action, root)
    if action.nargs in ("*", "+"):
        values = st.lists(value, min_size=0 if action.nargs == "*" else 1, max_size=3)
    elif action.nargs == "?":
        values = st.lists(value, max_size=1)
    else:
        values = st.lists(value, min_size=1, max_size=1)
    # --flag=value as well as --flag value: the value may start with "-".
    return st.tuples(flag, values).map(
        lambda fv: [f"{fv[0]}={fv[1][0]}"] if len(fv[1]) == 1 and fv[0].startswith("--") and fv[1][0].startswith("-")
        else [fv[0], *fv[1]])


def argv_strategy(path: tuple[str, ...], root: Path) -> st.SearchStrategy[list[str]]:
    top = [a for a in build_parser()._actions if a.option_strings and not set(a.option_strings) & NEVER]
    own = COMMANDS[path]
    options = [a for a in own._actions if a.option_strings and not set(a.option_strings) & NEVER]
    # Required options (`size --params --mode`) and required groups (`backtest --trace | --prometheus`) are in
    # most examples, so that they get past argparse to the command.
    required = [[a] for a in options if a.required]
    required += [list(g._group_actions) for g in own._mutually_exclusive_groups if g.required]
    positionals = [a for a in own._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]

    def positional_args(action):
        value = value_strategy(action, root)
        if action.nargs in ("*", "?"):
            return st.lists(value, max_size=2 if action.nargs == "*" else 1)
        return st.lists(value, min_size=1, max_size=1)

    chosen_top = st.lists(st.sampled_from(top), max_size=1, unique=True) if top else st.just([])
    chosen = st.lists(st.sampled_from(options), max_size=4, unique=True) if options else st.just([])

    @st.composite
    def build(draw):
        argv: list[str] = []
        for action in draw(chosen_top):
            argv += draw(option_args(action, root))
        argv += list(path)
        picked = draw(chosen)
        if draw(st.integers(0, 9)):  # nine in ten examples carry the required options
            picked += [draw(st.sampled_from(group)) for group in required]
        for action in dict.fromkeys(picked):
            argv += draw(option_args(action, root))
        argv += ALWAYS.get(path, [])
        for action in positionals:
            pos = draw(positional_args(action))
            if pos and pos[0].startswith("-"):
                argv.append("--")  # a positional that looks like a flag, as a person would type it
            argv += pos
        return argv

    return build()


# --------------------------------------------------------------------------- the local world


class NetworkGuard:
    """Refuses every connection and name lookup that is not loopback, and remembers them."""

    LOCAL = ("127.0.0.1", "localhost", "::1", None, "")

    def __init__(self) -> None:
        self.refused: list[str] = []
        self._connect = socket.socket.connect
        self._connect_ex = socket.socket.connect_ex
        self._getaddrinfo = socket.getaddrinfo

    def install(self, mp: pytest.MonkeyPatch) -> None:
        guard = self

        def host_of(address) -> str | None:
            return address[0] if isinstance(address, tuple) else None  # AF_UNIX: a path, local

        def connect(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6) and host_of(address) not in guard.LOCAL:
                guard.refused.append(f"connect {address}")
                raise ConnectionRefusedError(f"test: no network ({address})")
            return guard._connect(sock, address)

        def connect_ex(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6) and host_of(address) not in guard.LOCAL:
                guard.refused.append(f"connect_ex {address}")
                return 111
            return guard._connect_ex(sock, address)

        def getaddrinfo(host, *a, **k):
            if (host.decode() if isinstance(host, bytes) else host) not in guard.LOCAL:
                guard.refused.append(f"getaddrinfo {host!r}")
                raise socket.gaierror(socket.EAI_NONAME, f"test: no name lookups ({host!r})")
            return guard._getaddrinfo(host, *a, **k)

        mp.setattr(socket.socket, "connect", connect)
        mp.setattr(socket.socket, "connect_ex", connect_ex)
        mp.setattr(socket, "getaddrinfo", getaddrinfo)


class NotServing(OSError):
    """What the agent's `start` raises here: the agent got as far as serving (it would run until a signal)."""


SQLITE_BESIDE_DEVICES = [f"/dev/{d}-{s}" for d in ("null", "zero") for s in ("journal", "wal", "shm")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    existed = {p for p in SQLITE_BESIDE_DEVICES if os.path.lexists(p)}
    root = tmp_path_factory.mktemp("cli-fuzz")
    closed = f"http://127.0.0.1:{free_port()}"
    (root / "a-folder").mkdir()
    (root / "dev-zero").symlink_to("/dev/zero")
    (root / "dev-null").symlink_to("/dev/null")
    (root / "out").mkdir()
    (root / "not-a-database.db").write_bytes(b"this is not a SQLite database\n" * 40)
    (root / "not-yaml.yaml").write_text("rules: [\n  - {unclosed\n")
    (root / "unicode-é☃.yaml").write_text("rules: []\n")
    (root / "rules").mkdir()
    (root / "rules" / "idle.yaml").write_text(
        "rules:\n  - name: idle-10pct-1h\n    threshold_pct: 10\n    window: 1h\n    action: stop\n")
    # A small valid history: 4 instances, 6 h at 5 min, two of them idle after 3 h.
    lines = ["instance_id,timestamp,gpu_util"]
    for i in range(4):
        for step in range(72):
            lines.append(f"i-{i},{1_700_000_000 + 300 * step},{0 if i < 2 and step > 36 else 50}")
    (root / "trace.csv").write_text("\n".join(lines) + "\n")
    agent_settings = root / "autostop.yaml"
    # The agent's metadata lookups go to a closed port of 127.0.0.1, never 169.254.169.254.
    agent_settings.write_text(yaml.safe_dump({"imds_url": closed}))
    cfg = root / "gpufinops.yaml"
    cfg.write_text(yaml.safe_dump({
        "prometheus": {"url": closed, "timeout_s": 1},
        "aws": {"regions": ["us-east-1"], "endpoint_url": closed},
        "database_url": f"sqlite:///{root / 'g.db'}",
        "rules_paths": [str(root / "rules")],
        "recommend": {"price_cache_path": str(root / "prices.json"), "price_max_age_days": 3660},
    }))
    env = {
        "GPUFINOPS_CONFIG": str(cfg), "XDG_STATE_HOME": str(root / "state"), "HOME": str(root / "home"),
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(root / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(root / "none"),
        "GPUFINOPS_AGENT_AUTOSTOP_CONFIG": str(agent_settings), "GPUFINOPS_AGENT_AUTOSTOP_DB": str(root / "agent.db"),
        "GPUFINOPS_AGENT_SNOOZE_FILE": str(root / "snooze-until"), "GPUFINOPS_AGENT_HOSTNAME": "gpu-fuzz",
        "GPUFINOPS_AGENT_PORT": str(free_port()), "GPUFINOPS_AGENT_ADDRESS": "127.0.0.1",
        "GPUFINOPS_AGENT_NVIDIA_SMI": str(root / "no-nvidia-smi"),
        "HTTPS_PROXY": "", "HTTP_PROXY": "", "NO_PROXY": "*",
    }
    for name in ("GPUFINOPS_LOG_LEVEL", "_ARGCOMPLETE", "GPUFINOPS_AGENT_AUTOSTOP", "GPUFINOPS_AGENT_AUTOSTOP_LIVE",
                 "KUBECONFIG", "AWS_PROFILE", "SLACK_BOT_TOKEN"):
        env.setdefault(name, None)
    guard = NetworkGuard()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            if value is None:
                mp.delenv(name, raising=False)
            else:
                mp.setenv(name, value)
        mp.chdir(root)
        guard.install(mp)
        # `serve` and `agent` run until a signal: here they stop where they would start serving. Everything
        # before that (settings, rules, flags, peers, the agent's reader and autostop) is exercised.
        from gpufinops.agent import exporter
        from gpufinops.run.service import Service

        mp.setattr(Service, "serve_forever", lambda self: None)

        def not_serving(*_a, **_k):
            raise NotServing("test: the agent does not serve here")

        mp.setattr(exporter, "start", not_serving)
        # The agent's autostop loop, when the flags start it, is stopped at once: its setup is exercised, and no
        # thread ticks on into the next examples.
        from gpufinops.agent.autostop import cli as autostop_cli

        real_start = autostop_cli.maybe_start_autostop

        def started_then_stopped(args, agent):
            running = real_start(args, agent)
            if running is not None:
                running.close()
            return running

        mp.setattr(autostop_cli, "maybe_start_autostop", started_then_stopped)
        yield root, guard
    # What the values stand for is still there: no command removed or replaced the devices behind the links, and
    # none opened one as a SQLite database (SQLite writes its journal beside the device: /dev/null-journal).
    assert Path("/dev/zero").is_char_device() and Path("/dev/null").is_char_device()
    beside = [p for p in SQLITE_BESIDE_DEVICES if os.path.lexists(p) and p not in existed]
    for p in beside:
        os.unlink(p)  # this test's own mess, removed before it is reported
    assert not beside, beside


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: " ".join(p))
def test_no_argument_list_gets_a_traceback_out_of_main(path, world, capsys, caplog):
    root, guard = world
    caplog.set_level(logging.INFO)

    @settings(max_examples=max(1, SLOW_COMMANDS.get(path, 50) * EXAMPLES // 50), deadline=None, derandomize=True,
              database=None,
              suppress_health_check=list(HealthCheck))
    @given(argv=argv_strategy(path, root))
    def run(argv):
        capsys.readouterr()
        caplog.clear()
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: a usage error (2), or --help (0)
            code = exc.code
        err = capsys.readouterr().err
        assert isinstance(code, int) and not isinstance(code, bool), (argv, code)
        assert "Traceback" not in err, (argv, err[-2000:])
        logged = [r for r in caplog.records if r.exc_info]
        assert not logged, (argv, [r.getMessage() for r in logged])
        assert not guard.refused, (argv, guard.refused)

    run()


def test_every_command_is_fuzzed():
    """The walk finds the commands: a new one is fuzzed without editing this file."""
    names = {" ".join(p) for p in COMMANDS}
    assert {"serve", "evaluate", "rules check", "audit", "demo", "costs", "budgets check", "recommend", "size",
            "backtest", "report", "agent", "agent snooze", "k8s restore"} <= names
