"""Google's FOCUS view: an N1 VM with an attached GPU (its machine type, n1-standard-8, names no GPU; Google bills the
GPU on its own SKU row, "Nvidia Tesla T4 GPU running in Americas", under the VM's ResourceId) is a GPU VM on both FOCUS
readers (focus.read_focus, the pandas table; duck.focus_total_rows, the DuckDB totals): all its rows are its cost and
its hours count once per VM-hour, whichever file or chunk holds its GPU row. A CPU-only VM is never counted."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from gpufinops.cli import main
from gpufinops.collect.billing.duck import focus_files, focus_total_rows
from gpufinops.collect.billing.errors import BillingDataError
from gpufinops.collect.billing.focus import read_focus

from tests.collect.test_billing_focus import BS, OCT, SEP

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "focus" / "gcp_focus_view_n1_t4.csv"
N1 = "//compute.googleapis.com/projects/sunbird-ml/zones/us-central1-b/instances/5518204937716620"
A2 = "//compute.googleapis.com/projects/sunbird-ml/zones/us-central1-b/instances/6602918374410297"
N2 = "//compute.googleapis.com/projects/sunbird-ml/zones/us-central1-b/instances/3391047725108846"
SUBJECT = {N1: "gce:sunbird-ml/us-central1-b/asr-t4-1", A2: "gce:sunbird-ml/us-central1-b/train-a2",
           N2: "gce:sunbird-ml/us-central1-b/web-n2"}


def rows() -> tuple[list[str], list[dict]]:
    with open(FIXTURE, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames), list(reader)


def write(path: Path, header: list[str], lines: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, header)
        w.writeheader()
        w.writerows(lines)
    return path


def billed(resource_id: str) -> float:
    """Every row the fixture bills a VM, summed with the csv module (no reader of ours)."""
    return sum(float(r["BilledCost"]) for r in rows()[1] if r["ResourceId"] == resource_id)


def pandas_by_instance(path: Path) -> dict[str, tuple[float, float]]:
    t = read_focus(str(path), SEP, OCT, BS).table
    return {k: (g["cost"].sum(), g["usage_hours"].sum()) for k, g in t.groupby("resource_id")}


def duck_by(path: Path, by: str = "instance") -> dict[str, tuple[float, float]]:
    got = focus_total_rows(focus_files(str(path)), str(path), SEP, OCT, BS, by)
    return {k: (cost, hours) for k, _currency, cost, hours in got.rows}


def test_the_fixture_is_what_the_tests_say():
    """The N1 VM's rows: vCPU and RAM rows naming n1-standard-8 and a T4 GPU SKU row, each hour; the n2 VM none."""
    descriptions = {r["ResourceId"]: set() for r in rows()[1]}
    for r in rows()[1]:
        descriptions[r["ResourceId"]].add(r["ChargeDescription"])
    assert descriptions[N1] == {"N1 Predefined Instance Core running in Americas",
                                "N1 Predefined Instance Ram running in Americas",
                                "Nvidia Tesla T4 GPU running in Americas"}
    assert not any("GPU" in d for d in descriptions[N2])
    assert billed(N1) == pytest.approx(2 * (0.252888 + 0.12711 + 0.35))


@pytest.mark.parametrize("reader", ["pandas", "duckdb"])
def test_an_n1_vm_with_an_attached_gpu_costs_all_its_rows_to_the_cent(reader):
    got = pandas_by_instance(FIXTURE) if reader == "pandas" else duck_by(FIXTURE)
    assert set(got) == {SUBJECT[N1], SUBJECT[A2]}  # the CPU-only n2 VM is not a GPU VM
    for rid, hours in ((N1, 2.0), (A2, 1.0)):
        cost, h = got[SUBJECT[rid]]
        assert round(cost, 2) == round(billed(rid), 2) and cost == pytest.approx(billed(rid), abs=1e-9)
        assert h == pytest.approx(hours)  # once per VM-hour, not once per GPU, vCPU and RAM row


def test_both_readers_agree_at_every_grain_and_name_the_n1_s_machine_type():
    table = read_focus(str(FIXTURE), SEP, OCT, BS).table
    assert set(table.loc[table["resource_id"] == SUBJECT[N1], "instance_type"]) == {"n1-standard-8"}
    for by, column in (("instance", "resource_id"), ("team", "team"), ("instance_type", "instance_type"),
                       ("account", "account")):
        expected = {k: (g["cost"].sum(), g["usage_hours"].sum()) for k, g in table.groupby(column)}
        got = duck_by(FIXTURE, by)
        assert set(got) == set(expected), by
        for k in expected:
            assert got[k] == pytest.approx(expected[k], abs=1e-9), (by, k)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_the_gpu_row_in_another_file_still_makes_the_vm_a_gpu_vm(tmp_path, fmt):
    """Google may write a VM's GPU row and its vCPU rows in different files of one export."""
    header, lines = rows()
    folder = tmp_path / "export"
    folder.mkdir()
    gpu = [r for r in lines if "GPU" in r["ChargeDescription"] and r["ResourceId"] == N1]
    rest = [r for r in lines if r not in gpu]
    for name, part in (("part-0", rest), ("part-1", gpu)):  # the GPU rows read last
        if fmt == "csv":
            write(folder / f"{name}.csv", header, part)
        else:
            pd.DataFrame(part, columns=header).to_parquet(folder / f"{name}.parquet", index=False)
    for got in (pandas_by_instance(folder), duck_by(folder)):
        assert got[SUBJECT[N1]] == pytest.approx((billed(N1), 2.0), abs=1e-9)
        assert SUBJECT[N2] not in got


def test_costs_by_instance_and_team_through_the_cli(capsys):
    out = {}
    for by in ("instance", "team"):
        rc = main(["costs", "--source", "focus", "--path", str(FIXTURE), "--month", "2024-09", "--by", by,
                   "-o", "json"])
        captured = capsys.readouterr()
        assert rc == 0, captured.err
        out[by] = {r[by]: r for r in json.loads(captured.out)}
    assert set(out["instance"]) == {SUBJECT[N1], SUBJECT[A2]}
    assert out["instance"][SUBJECT[N1]]["cost"] == pytest.approx(billed(N1), abs=1e-9)
    assert out["instance"][SUBJECT[N1]]["usage_hours"] == pytest.approx(2.0)
    assert set(out["team"]) == {"speech", "vision"}  # "web" (the n2 VM's team) is never a GPU team
    assert out["team"]["speech"]["cost"] == pytest.approx(billed(N1), abs=1e-9)
    assert out["team"]["vision"]["cost"] == pytest.approx(billed(A2), abs=1e-9)


def test_a_cpu_vm_is_never_counted(tmp_path):
    """Neither a GPU billed to another VM, nor "GPU" in a charge of something that is not a GCE VM, makes a CPU-only
    VM's rows (or that other resource's) GPU cost."""
    header, lines = rows()
    disk = dict(lines[0], ResourceId="//compute.googleapis.com/projects/sunbird-ml/zones/us-central1-b/disks/scratch",
                ChargeDescription="Storage PD Capacity for a GPU workstation", BilledCost="9.5")
    other = dict(lines[0], ResourceId="i-0abc", ChargeDescription="GPU hours of something else", BilledCost="7.0",
                 Tags="[]")
    path = write(tmp_path / "mixed.csv", header, [*lines, disk, other])
    for got in (pandas_by_instance(path), duck_by(path)):
        assert set(got) == {SUBJECT[N1], SUBJECT[A2]}
    cpu_only = write(tmp_path / "cpu.csv", header, [r for r in lines if r["ResourceId"] == N2])
    assert read_focus(str(cpu_only), SEP, OCT, BS).table.empty
    assert duck_by(cpu_only) == {}


def test_a_gpu_sku_outside_the_period_does_not_pull_in_the_vm(tmp_path):
    header, lines = rows()
    moved = [dict(r, ChargePeriodStart="2024-08-31 01:00:00 UTC", ChargePeriodEnd="2024-08-31 02:00:00 UTC")
             if r["ResourceId"] == N1 and "GPU" in r["ChargeDescription"] else r for r in lines]
    path = write(tmp_path / "moved.csv", header, moved)
    for got in (pandas_by_instance(path), duck_by(path)):
        assert set(got) == {SUBJECT[A2]}


def test_a_bad_value_of_a_gpu_vm_s_cpu_row_is_an_error_a_cpu_vm_s_is_not(tmp_path):
    header, lines = rows()
    n1_core = next(i for i, r in enumerate(lines) if r["ResourceId"] == N1 and "Core" in r["ChargeDescription"])
    n2_core = next(i for i, r in enumerate(lines) if r["ResourceId"] == N2)
    bad = [dict(r, BilledCost="lots") if i == n1_core else r for i, r in enumerate(lines)]
    path = write(tmp_path / "bad.csv", header, bad)
    message = rf"bad\.csv: column 'BilledCost' is not a number on data row {n1_core + 2} \(value 'lots'\)"
    with pytest.raises(BillingDataError, match=message):
        read_focus(str(path), SEP, OCT, BS)
    with pytest.raises(BillingDataError, match=message):
        duck_by(path)
    # The same value on the CPU-only VM's row: not a GPU row, not read.
    fine = write(tmp_path / "fine.csv", header,
                 [dict(r, BilledCost="lots") if i == n2_core else r for i, r in enumerate(lines)])
    for read in (pandas_by_instance, duck_by):
        got, expected = read(fine), read(FIXTURE)
        assert set(got) == set(expected) and all(got[k] == pytest.approx(expected[k]) for k in expected)


def test_an_excluded_row_of_a_gpu_vm_is_counted_in_the_warning_a_cpu_vm_s_is_not(tmp_path):
    header, lines = rows()
    n1_ram = next(i for i, r in enumerate(lines) if r["ResourceId"] == N1 and "Ram" in r["ChargeDescription"])
    n2_core = next(i for i, r in enumerate(lines) if r["ResourceId"] == N2)
    path = write(tmp_path / "neg.csv", header, [dict(r, BilledCost="-1") if i in (n1_ram, n2_core) else r
                                                 for i, r in enumerate(lines)])
    warning = f"{path}: 1 GPU row(s) excluded: column 'BilledCost' missing, negative"
    res = read_focus(str(path), SEP, OCT, BS)
    got = focus_total_rows(focus_files(str(path)), str(path), SEP, OCT, BS, "instance")
    assert [w[:len(warning)] for w in res.warnings] == [warning] and got.warnings == res.warnings
    n1 = res.table[res.table["resource_id"] == SUBJECT[N1]]["cost"].sum()
    assert n1 == pytest.approx(billed(N1) - float(lines[n1_ram]["BilledCost"]), abs=1e-9)
