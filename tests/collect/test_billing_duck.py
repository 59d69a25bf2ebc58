"""Billing totals on DuckDB (duck.py, what a plain `costs --by` runs on local CUR and FOCUS files): the same
totals, warnings and errors as the cost-table readers at every grain; the same totals to the cent as the
benchmarks' DuckDB yardstick; printed as the pandas path prints them, without importing pandas."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gpufinops.cli import main
from gpufinops.collect.billing import cur, duck, focus
from gpufinops.collect.billing.duck import cur_total_rows, focus_total_rows
from gpufinops.collect.billing.focus import read_focus
from gpufinops.collect.billing.focus_rules import FILE_SUFFIXES
from gpufinops.collect.billing.schema import BillingDataError
from gpufinops.collect.billing.sources import list_files, list_parquet
from gpufinops.collect.billing.synth import generate_cur
from gpufinops.collect.billing.totals import GRAINS, print_rows, summarize_rows, table_totals
from gpufinops.config import AwsSettings, TagKeys

from tests.collect.test_billing_focus import BS, OCT, SAMPLE, SEP
from tests.collect.test_billing_focus_versions import DATA, SUBSET, as_version, split_files, subset

BENCH = Path(__file__).resolve().parents[2] / "bench"
FAMILIES = AwsSettings().gpu_families


def totals_dict(rows) -> dict:
    return {(k, c): (x, y) for k, c, x, y in rows}


def assert_same(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    for k in expected:
        assert abs(got[k][0] - expected[k][0]) < 0.005 and abs(got[k][1] - expected[k][1]) < 0.005, k


def check_focus(path: Path | str) -> None:
    """duck's totals equal read_focus's table summed, at every grain, with the same warnings."""
    ref = read_focus(str(path), SEP, OCT, BS)
    for by in GRAINS:
        got = focus_total_rows(list_files(str(path), None, FILE_SUFFIXES, "FOCUS"), str(path), SEP, OCT, BS, by)
        expected = table_totals(ref.table, by)
        assert_same(totals_dict(got.rows), totals_dict(expected.itertuples(index=False)))
        assert got.warnings == ref.warnings


def test_cur_constants_are_cur_py_s():
    assert duck.gpu_usage_pattern(FAMILIES) == cur.gpu_usage_pattern(FAMILIES)
    assert duck.CUR_REQUIRED == cur.REQUIRED and duck.MAX_LINE_HOURS == cur.MAX_LINE_HOURS
    assert duck.INSTANCE_TYPE_PATTERN == cur.INSTANCE_TYPE_PATTERN


# --------------------------------------------------------------------------- FOCUS: the table's answer


@pytest.mark.parametrize("name", ["aws_focus_1.0_subset.csv", "azure_focus_1.2_gpu.csv", "gcp_focus_view_gpu.csv",
                                  "gcp_focus_view_n1_t4.csv"])
def test_focus_fixtures_every_grain(name):
    check_focus(DATA / name)


@pytest.mark.skipif(not SAMPLE.exists(), reason="../shared FOCUS sample not beside the checkout")
def test_focus_real_sample_every_grain():
    check_focus(SAMPLE)


@pytest.mark.parametrize("version", ["1.1", "1.2", "1.3", "1.4"])
def test_focus_each_version(tmp_path, version):
    path = tmp_path / f"focus_{version}.csv"
    as_version(subset(), version).to_csv(path, index=False)
    check_focus(path)


def test_focus_folder_and_glob_of_csv_gzip_and_parquet_and_map_tags(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    split_files(tmp_path / "export")
    check_focus(tmp_path / "export")
    check_focus(tmp_path / "export" / "part-*")
    df = as_version(subset(), "1.2")
    df = df[df["ChargeDescription"].str.contains("g5.4xlarge")].head(2)
    table = pa.Table.from_pandas(df.drop(columns=["Tags"]), preserve_index=False).append_column(
        "Tags", pa.array([[("team", "ml")], [("team", "cv")]], type=pa.map_(pa.string(), pa.string())))
    pq.write_table(table, tmp_path / "tags.parquet")
    check_focus(tmp_path / "tags.parquet")


@pytest.fixture(scope="module")
def bench_modules():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_cur
        import bench_focus
    finally:
        sys.path.remove(str(BENCH))
    return bench_cur, bench_focus


@pytest.mark.skipif(not SAMPLE.exists(), reason="../shared FOCUS sample not beside the checkout")
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_focus_generated_with_excluded_rows(tmp_path, bench_modules, fmt):
    _, bench_focus = bench_modules
    path = tmp_path / f"gen.{fmt}"
    bench_focus.generate(30_000, fmt, path)
    check_focus(path)


def test_focus_bad_input_is_named_as_the_table_reader_names_it(tmp_path):
    files = lambda p: list_files(str(p), None, FILE_SUFFIXES, "FOCUS")  # noqa: E731
    cases = []
    missing = tmp_path / "focus_1.3.csv"
    as_version(subset(), "1.3").drop(columns=["ConsumedUnit"]).to_csv(missing, index=False)
    cases.append(missing)
    bad = subset()
    bad.loc[bad["ChargeDescription"].str.contains("g5.4xlarge").idxmax(), "BilledCost"] = "lots"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    cases.append(tmp_path / "bad.csv")
    date = subset()
    date.loc[date["ChargeDescription"].str.contains("g5.4xlarge").idxmax(), "ChargePeriodStart"] = "someday"
    date.to_csv(tmp_path / "date.csv", index=False)
    cases.append(tmp_path / "date.csv")
    eur = subset()
    eur.loc[eur["ChargeDescription"].str.contains("g5.4xlarge").idxmax(), "BillingCurrency"] = "EUR"
    eur.to_csv(tmp_path / "eur.csv", index=False)
    cases.append(tmp_path / "eur.csv")
    latin = tmp_path / "latin.csv"
    latin.write_bytes(SUBSET.read_bytes().replace(b"Hour", b"H\xe9ure", 1))
    cases.append(latin)
    (tmp_path / "empty.csv").write_bytes(b"")
    cases.append(tmp_path / "empty.csv")
    for path in cases:
        with pytest.raises(BillingDataError) as ref:
            read_focus(str(path), SEP, OCT, BS)
        with pytest.raises(BillingDataError) as got:
            focus_total_rows(files(path), str(path), SEP, OCT, BS, "instance")
        assert str(got.value) == str(ref.value), path.name


# --------------------------------------------------------------------------- the DuckDB yardstick, to the cent


def cli_totals(args: list[str], by: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["costs", "--month", "2024-09", "--by", by, "-o", "json", *args]) == 0
    label = "(untagged)" if by == "team" else "(none)"
    return {("" if r[by] == label else r[by]): (r["cost"], r["usage_hours"]) for r in json.loads(out.getvalue())}


def test_cur_cli_equals_the_duckdb_yardstick_to_the_cent(tmp_path, bench_modules):
    import duckdb

    bench_cur, _ = bench_modules
    path = generate_cur(tmp_path / "cur.parquet", 60_000, row_group_size=20_000, n_resources=300)
    params = bench_cur.parameters()
    for by in ("instance", "team"):
        con = duckdb.connect()
        con.execute("SET TimeZone='UTC'")
        rows = con.execute(bench_cur.duckdb_sql(path, by, params["families"], params["team_keys"],
                                                params["max_line_cost"], params["max_line_hours"])).fetchall()
        yardstick = {k: (c, h) for k, _, c, h in rows}
        got = cli_totals(["--source", "cur", "--path", str(path)], by)
        assert len(got) > (100 if by == "instance" else 2) and not bench_cur.differences(got, yardstick)
        # cur_totals (the library call) gives the same, and read_cur's table summed too.
        t = cur_total_rows(list_parquet(str(path)), str(path), SEP, OCT, FAMILIES, by, TagKeys())
        table = table_totals(cur.read_cur(str(path), SEP, OCT, FAMILIES).table, by)
        assert_same(totals_dict(t.rows), totals_dict(table.itertuples(index=False)))


@pytest.mark.skipif(not SAMPLE.exists(), reason="../shared FOCUS sample not beside the checkout")
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_focus_cli_equals_the_duckdb_yardstick_to_the_cent(tmp_path, bench_modules, fmt):
    import duckdb

    _, bench_focus = bench_modules
    path = tmp_path / f"gen.{fmt}"
    bench_focus.generate(30_000, fmt, path)
    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    source = (f"read_parquet('{path}')" if fmt == "parquet" else
              f"read_csv('{path}', all_varchar=true, header=true, nullstr=['NULL', ''])")
    columns = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
    yardstick = {k: (c, h) for k, c, h in con.execute(bench_focus.duckdb_sql(source, columns,
                                                                             bench_focus.parameters())).fetchall()}
    got = cli_totals(["--source", "focus", "--path", str(path)], "instance")
    assert len(got) > 50 and not bench_focus.differences(got, yardstick)


# --------------------------------------------------------------------------- printed as the pandas path prints


@pytest.mark.parametrize("rows", [
    [("", "USD", 1234.5, 10.0), ("i-1", "USD", 2.0, 0.0), ("i-2", "USD", 2.0, 3.0), ("a,b", "USD", 1e7 / 3, 7.0)],
    [("x", "USD", 0.5, 0.25)], [("averyveryverylongkey-000000", "USD", 1e9, 1e6)], []])
def test_printed_rows_are_the_pandas_path_s_bytes(rows):
    from gpufinops.cli.billing import _print
    from gpufinops.cli.common import render_table
    from gpufinops.cost.costs import summarize_totals

    for by in ("instance", "team"):
        for fmt in ("table", "json", "csv"):
            df = summarize_totals(pd.DataFrame(rows, columns=["key", "currency", "cost", "usage_hours"]), by)
            want = io.StringIO()
            with contextlib.redirect_stdout(want):
                _print(df, fmt)
            got = io.StringIO()
            print_rows(summarize_rows(rows, by), by, fmt, got, render=render_table)
            assert got.getvalue() == want.getvalue(), (by, fmt)


def test_a_plain_total_imports_neither_pandas_nor_pyarrow(tmp_path):
    path = generate_cur(tmp_path / "cur.parquet", 2_000, n_resources=20)
    code = ("import sys, contextlib, io\nfrom gpufinops.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['costs', '--month', '2024-09', '--source', 'cur', '--path', {str(path)!r}]) == 0\n"
            f"    assert main(['costs', '--month', '2024-09', '--source', 'focus', '--path', {str(SUBSET)!r}]) == 0\n"
            "print(sorted(m for m in ('pandas', 'pyarrow', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
