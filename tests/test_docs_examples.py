"""Every YAML example in the README and docs/ is validated by the code that would read it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufinops.budgets import load_budgets
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
        settings = load_settings(path)
        billing_settings(settings)
        policy_from_settings(settings)
        report_settings(settings)
