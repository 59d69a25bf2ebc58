"""Issue 35, items 3 and 7, as a person runs the commands: whole `gpufinops` processes (the installed console
script), their exit codes and stderr. A blank secret stops `serve` before it listens, naming the key; the arguments
a tester found to end in a traceback are one `error:` line each. Each case failed on the main of 2026-12-07 (the
serve started with a blank token and answered an empty Bearer from any peer; the commands printed tracebacks, and
`rules check /dev/zero` read without bound). The in-process variants, with more cases, are in
tests/test_config_sections.py, tests/run/test_fleet_api.py and tests/cli/test_cli_bad_args.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

GPUFINOPS = shutil.which("gpufinops", path=str(Path(sys.executable).parent)) or "gpufinops"


def gpufinops(tmp_path: Path, *argv: str, env: dict[str, str] | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFINOPS_", "SLACK_"))}
    clean["XDG_STATE_HOME"] = str(tmp_path / "state")  # never the user's database
    return subprocess.run([GPUFINOPS, *argv], cwd=tmp_path, env={**clean, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def serve_config(tmp_path: Path, **api: str) -> Path:
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(yaml.safe_dump({
        "database_url": f"sqlite:///{tmp_path}/g.db",
        "service": {"host": "127.0.0.1", "port": 9108},
        "api": {"bearer_token": api},
    }))
    return cfg


@pytest.mark.parametrize("how", ["env_blank", "file_newline"])
def test_serve_refuses_a_blank_api_token_naming_the_key_and_never_listens(tmp_path, how):
    if how == "env_blank":
        cfg, env = serve_config(tmp_path, env="GPUFINOPS_API_TOKEN"), {"GPUFINOPS_API_TOKEN": " "}
    else:  # an empty Kubernetes Secret key mounts as a file holding a newline
        (tmp_path / "token").write_text("\n")
        cfg, env = serve_config(tmp_path, file=str(tmp_path / "token")), {}
    done = gpufinops(tmp_path, "--config", str(cfg), "serve", "--port", "0", env=env, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "api.bearer_token" in done.stderr and "blank" in done.stderr
    assert "Traceback" not in done.stderr and "loopback clients only" not in done.stderr + done.stdout


@pytest.mark.parametrize("argv, names", [
    (["audit", "--db", "{tmp}/notes.txt"], "--db"),
    (["audit", "--db", "{tmp}/no-such-folder/x.db"], "--db"),
    (["size", "--params", "inf", "--mode", "inference"], "--params"),
    (["rules", "check", "/dev/zero"], "/dev/zero"),
    (["rules", "check", ""], "empty path"),
])
def test_bad_arguments_are_one_error_line_never_a_traceback(tmp_path, argv, names):
    (tmp_path / "notes.txt").write_text("not a database, only text\n" * 50)
    done = gpufinops(tmp_path, *(a.replace("{tmp}", str(tmp_path)) for a in argv), timeout=60)
    assert done.returncode in (1, 2), (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and names in done.stderr, done.stderr[-2000:]
    assert not list(Path("/dev").glob("*-journal"))  # SQLite was never pointed at a device
