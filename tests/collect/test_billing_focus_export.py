"""`costs --idle --format focus`: GPU cost by verdict as FOCUS rows, checked against the FOCUS 1.2 and 1.3
column lists (mandatory columns present, types, nulls) of gpufinops/collect/billing/focus_spec.py."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from gpufinops.cli import main
from gpufinops.collect.billing import focus_spec
from gpufinops.store.store import Store

from tests.cost.test_billing_costs import _decisions


def check_conformance(df: pd.DataFrame, version: str) -> list[str]:
    """Every problem of `df` against FOCUS `version`: a mandatory column missing, a null where none is
    allowed, a value not of the column's type; x_ columns are extensions and always allowed."""
    problems = []
    spec = focus_spec.columns(version)
    for c in focus_spec.mandatory(version):
        if c not in df.columns:
            problems.append(f"{c}: missing")
    for c in df.columns:
        if c.startswith("x_"):
            continue
        if c not in spec:
            problems.append(f"{c}: not a FOCUS {version} column")
            continue
        kind, _level, nullable = spec[c]
        values = df[c]
        if not nullable and values.isna().any():
            problems.append(f"{c}: null in a column that allows none")
        present = values.dropna()
        if kind == "Decimal" and pd.to_numeric(present, errors="coerce").isna().any():
            problems.append(f"{c}: not a number")
        if kind == "Date/Time" and not present.astype(str).str.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ").all():
            problems.append(f"{c}: not ISO 8601 UTC (YYYY-MM-DDTHH:MM:SSZ)")
        if kind == "JSON":
            for v in present:
                try:
                    json.loads(v)
                except ValueError:
                    problems.append(f"{c}: not JSON: {v!r}")
                    break
    return problems


@pytest.fixture
def exported(tmp_path, capsys) -> pd.DataFrame:
    db = tmp_path / "g.db"
    _decisions(Store(f"sqlite:///{db}"))
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{db}\n")
    rc = main(["-c", str(cfg), "costs", "--month", "2024-09", "--idle", "--format", "focus"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "instance-hours have no price" in out.err  # i-x: zz.huge is priced nowhere
    return pd.read_csv(io.StringIO(out.out), dtype=str, keep_default_na=False, na_values=[""])


def test_rows_are_focus_1_2_and_1_3_conformant(exported):
    assert check_conformance(exported.drop(columns=["ServiceProviderName", "HostProviderName"]), "1.2") == []
    assert check_conformance(exported, "1.3") == []
    # A 1.4 reader drops the two deprecated columns and finds everything else conformant.
    assert check_conformance(exported.drop(columns=list(focus_spec.DEPRECATED_1_3)), "1.4") == []
    assert set(exported["x_gpufinops_verdict"]) <= {"ACTIVE", "UNDERUTILIZED", "UNKNOWN", "IDLE"}
    assert pd.to_numeric(exported["x_gpufinops_gpu_hours"]).dropna().ge(0).all()


def test_cost_split_by_verdict_and_rule(exported):
    rows = {(r.ResourceId, r.x_gpufinops_verdict): r for r in exported.itertuples()}
    # i-a at $10/h (the stored decision price), i-u unpriced in the stored decisions and in the bundled catalog
    # only if its type is there; i-x never priced: not a row.
    assert ("i-x", "UNKNOWN") not in rows
    idle = rows[("i-a", "IDLE")]
    assert float(idle.BilledCost) == pytest.approx(10.0 * float(idle.ConsumedQuantity))
    assert idle.x_gpufinops_rule == "idle" and idle.ChargeCategory == "Usage" and idle.ConsumedUnit == "Hours"
    assert json.loads(idle.Tags) == {"team": "ml"}
    # p4d.24xlarge has 8 GPUs (bundled catalog): GPU-hours are 8 x the instance-hours.
    assert float(idle.x_gpufinops_gpu_hours) == pytest.approx(8 * float(idle.ConsumedQuantity))


def test_check_conformance_catches_what_it_should():
    bad = pd.DataFrame({"BilledCost": ["x"], "ChargePeriodStart": ["2024-09-01 00:00"], "Tags": ["{"],
                        "BillingAccountId": [None], "Bogus": ["1"]})
    problems = check_conformance(bad, "1.2")
    for expected in ("BilledCost: not a number", "ChargePeriodStart: not ISO 8601", "Tags: not JSON",
                     "BillingAccountId: null", "Bogus: not a FOCUS 1.2 column", "ProviderName: missing"):
        assert any(p.startswith(expected) for p in problems), expected


def test_focus_output_needs_idle(tmp_path, capsys):
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{tmp_path / 'g.db'}\n")
    assert main(["-c", str(cfg), "costs", "--month", "2024-09", "--format", "focus"]) == 2
    assert "--output focus needs --idle" in capsys.readouterr().err
