"""Every YAML example in the README and docs/ is validated by the code that would read it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufinops.cost.budgets import load_budgets
from gpufinops.collect.billing.settings import billing_settings
from gpufinops.config import load_settings
from gpufinops.recommend.policy import policy_from_settings
from gpufinops.report.options import report_settings
from gpufinops.rules import load_rules

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def examples():
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for n, m in enumerate(BLOCK.finditer(md.read_text()), 1):
            yield pytest.param(md, m.group(1), id=f"{md.name}#{n}")


@pytest.mark.parametrize("md,text", list(examples()))
def test_yaml_example_is_valid(md, text, tmp_path):
    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"{md.name}: example is not a mapping"
    path = tmp_path / "example.yaml"
    path.write_text(text)
    if "scrape_configs" in data or "relabel_configs" in data:
        if "scrape_configs" not in data:  # a relabel_configs fragment: check it inside a minimal scrape config
            path.write_text(yaml.safe_dump({"scrape_configs": [{
                "job_name": "x", "static_configs": [{"targets": ["127.0.0.1:9400"]}],
                "relabel_configs": data["relabel_configs"]}]}))
        if shutil.which("promtool") is None:
            pytest.skip("promtool not installed")
        proc = subprocess.run(["promtool", "check", "config", "--syntax-only", str(path)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    elif "rules" in data:
        assert load_rules([path])
    elif "budgets" in data:
        assert load_budgets(path)
    else:
        tls = (data.get("api") or {}).get("tls")
        if tls:  # mounted PEM files exist only on the real host (checked at load): placeholders stand in here
            for key in ("cert_file", "key_file", "client_ca_file"):
                stand_in = tmp_path / key
                stand_in.write_text("placeholder\n")
                tls[key] = str(stand_in)
            path.write_text(yaml.safe_dump(data))
        settings = load_settings(path)
        billing_settings(settings)
        policy_from_settings(settings)
        report_settings(settings)


def code_blocks(text: str):
    """The bodies of fenced blocks without a language or marked bash/sh (fences paired in order)."""
    body, lang = None, ""
    for line in text.splitlines():
        if line.strip().startswith("```"):
            if body is None:
                body, lang = [], line.strip()[3:].strip()
            else:
                if lang in ("", "bash", "sh"):
                    yield "\n".join(body)
                body = None
        elif body is not None:
            body.append(line)


def command_lines():
    """Every `gpufinops ...` command in the README's and docs' code blocks, continuation lines joined, shell
    comments, redirections and pipes cut off; usage synopses with [optional] or a|b placeholders are skipped."""
    import shlex

    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in code_blocks(md.read_text()):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                for part in re.split(r"&&|;", line.split(" #")[0]):
                    part = re.split(r" [|>] ", part)[0].strip()
                    if not part.startswith("gpufinops "):
                        continue
                    words = shlex.split(part)
                    if words[0] != "gpufinops" or any(c in " ".join(words) for c in "[|{<"):
                        continue
                    yield pytest.param(words[1:], id=f"{md.name}: {' '.join(words)[:60]}")


@pytest.mark.parametrize("argv", list(command_lines()))
def test_documented_commands_parse(argv, capsys):
    """Every documented command line is accepted by the real parser (flags renamed in code are renamed in docs)."""
    from gpufinops.cli import build_parser

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help / --version exit 0; a bad flag exits 2
        assert exc.code == 0, f"gpufinops {' '.join(argv)}: {capsys.readouterr().err}"
        return
    assert getattr(args, "func", None), f"gpufinops {' '.join(argv)}: no such command"
