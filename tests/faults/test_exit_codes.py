"""Issue 23, item 9: exit codes that tell the truth. Every command that reads a data source exits 1 and names the
source when one failed (Prometheus on a closed port of 127.0.0.1, AWS on one, Cost Explorer refusing), in table
and JSON output alike, and 0 only when every source answered. Real peers only: a closed port, the moto server,
a real Prometheus (the fault matrix's, tests/faults/conftest.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from gpufinops.cli import main
from tests.promserver import free_port


def write_config(tmp_path, *, prometheus_url: str, aws_url: str) -> str:
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(yaml.safe_dump({
        "prometheus": {"url": prometheus_url, "timeout_s": 2},
        "aws": {"regions": ["us-east-1"], "endpoint_url": aws_url},
        "database_url": "sqlite:///g.db",
        # The bundled prices count as fresh: no automatic refresh from the Pricing API (moto has none).
        "recommend": {"price_cache_path": "prices.json", "price_max_age_days": 3660},
        # A budget is configured, so `budgets check` has something to check and reads the bill.
        "billing": {"source": "ce", "budgets_path": "budgets.yaml"},
    }))
    (tmp_path / "budgets.yaml").write_text("budgets:\n  - name: gpu\n    scope: {kind: all}\n    amount: 1000\n")
    return str(cfg)


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # bound and released: nothing listens, connections are refused


def run(capsys, cfg: str, *argv: str) -> tuple[int, str, str]:
    code = main(["--config", cfg, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.integration
def test_evaluate_exits_1_and_names_prometheus_when_it_is_down(aws, tmp_path, capsys):
    aws.launch("g5.xlarge", tags={"team": "ml"})
    cfg = write_config(tmp_path, prometheus_url=closed_port_url(), aws_url=aws.endpoint_url)

    code, out, _ = run(capsys, cfg, "evaluate", "--once", "-o", "json")
    data = json.loads(out)
    assert code == 1, (data["errors"], data["decisions"][:1])
    assert [e for e in data["errors"] if e.startswith("prometheus: ")], data["errors"]
    # The outage itself is judged correctly: nothing is idle, everything UNKNOWN.
    assert data["decisions"] and {d["verdict"] for d in data["decisions"]} == {"UNKNOWN"}

    code, out, err = run(capsys, cfg, "evaluate", "--once")
    # Said once, on stderr: the table on stdout carries no error line.
    assert code == 1 and "error: prometheus: " in err and "error:" not in out
    assert len([line for line in err.splitlines() if line.startswith("error: prometheus: ")]) == 1

    code, _, err = run(capsys, cfg, "evaluate", "--once", "-o", "csv")
    assert code == 1 and "error: prometheus: " in err


@pytest.mark.integration
def test_evaluate_exits_0_only_when_every_source_answered(aws, fault_prometheus, tmp_path, capsys):
    aws.launch("g5.xlarge", tags={"team": "ml"})
    cfg = write_config(tmp_path, prometheus_url=fault_prometheus.url, aws_url=aws.endpoint_url)
    code, out, _ = run(capsys, cfg, "evaluate", "--once", "-o", "json")
    data = json.loads(out)
    assert (code, data["errors"]) == (0, [])
    assert data["decisions"]


@pytest.mark.integration
def test_evaluate_exits_1_and_names_the_inventory_when_aws_is_down(fault_prometheus, tmp_path, capsys):
    cfg = write_config(tmp_path, prometheus_url=fault_prometheus.url, aws_url=closed_port_url())
    code, out, _ = run(capsys, cfg, "evaluate", "--once", "-o", "json")
    data = json.loads(out)
    assert code == 1 and [e for e in data["errors"] if e.startswith("inventory: ")]


@pytest.mark.integration
def test_recommend_exits_1_and_names_prometheus_when_it_is_down(aws, tmp_path, capsys):
    aws.launch("p4d.24xlarge", tags={"team": "research"})
    cfg = write_config(tmp_path, prometheus_url=closed_port_url(), aws_url=aws.endpoint_url)
    code, out, err = run(capsys, cfg, "recommend", "--no-store", "-o", "json")
    assert code == 1 and "error: prometheus: " in err
    assert isinstance(json.loads(out), list)  # the JSON stays the recommendation rows
    code, _, err = run(capsys, cfg, "recommend", "--no-store")
    assert code == 1 and "error: prometheus: " in err


@pytest.mark.integration
def test_recommend_exits_1_without_a_traceback_when_aws_is_down(fault_prometheus, tmp_path, capsys):
    cfg = write_config(tmp_path, prometheus_url=fault_prometheus.url, aws_url=closed_port_url())
    code, _, err = run(capsys, cfg, "recommend", "--no-store")
    assert code == 1 and "error: inventory: " in err and "Traceback" not in err


@pytest.mark.integration
@pytest.mark.parametrize("argv", [["costs", "--month", "2026-09"], ["costs", "--month", "2026-09", "--idle",
                                                                    "--source", "ce"],
                                  ["budgets", "check", "--month", "2026-09"]])
def test_billing_commands_exit_1_and_name_cost_explorer_when_aws_is_down(argv, tmp_path, capsys):
    cfg = write_config(tmp_path, prometheus_url=closed_port_url(), aws_url=closed_port_url())
    code, out, err = run(capsys, cfg, *argv, "-o", "json")
    assert code == 1 and "error: billing (ce): " in err and "Traceback" not in err
    assert out == ""  # no figures printed from a source that did not answer
