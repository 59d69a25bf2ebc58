"""The Athena SQL gives the same table as the pyarrow path (checked on DuckDB), and the
Athena client (start, poll, paginated results) works against a moto server."""

from __future__ import annotations

import json
import urllib.request

import duckdb
import pandas as pd
import pytest

from gpufinops.collect.billing.athena import fetch_athena
from gpufinops.collect.billing.cur import cur_sql, read_cur, table_from_sql_rows
from gpufinops.collect.billing.settings import AthenaSettings
from gpufinops.collect.billing.synth import generate_cur, write_cur_rows

from tests.collect.test_billing_cur import FAMILIES, OCT, SEP, fixture_rows

# Trino functions DuckDB spells differently: the SQL text itself is not changed.
TRINO_COMPAT = (
    "CREATE MACRO json_format(j) AS CAST(j AS VARCHAR)",
    "CREATE MACRO json_extract_scalar(j, p) AS json_extract_string(j, p)",
    "CREATE MACRO regexp_like(s, p) AS regexp_matches(s, p)",
)


def duckdb_rows(sql: str) -> list[dict]:
    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    for m in TRINO_COMPAT:
        con.execute(m)
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


@pytest.mark.parametrize("kind", ["fixture", "generated"])
def test_sql_on_duckdb_equals_pyarrow_path(tmp_path, kind):
    if kind == "fixture":
        path = write_cur_rows(tmp_path / "cur.parquet", fixture_rows())
    else:
        path = generate_cur(tmp_path / "gen.parquet", 60_000, row_group_size=20_000, n_resources=300)
    expected = read_cur(str(path), SEP, OCT, FAMILIES).table
    sql = cur_sql(f"read_parquet('{path}')", SEP, OCT, FAMILIES)
    got = table_from_sql_rows(duckdb_rows(sql), "cur")
    assert len(expected) > (3 if kind == "fixture" else 1000)
    pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=1e-9)


def test_sql_keeps_the_configured_families_only(tmp_path):
    path = write_cur_rows(tmp_path / "cur.parquet", fixture_rows())
    rows = duckdb_rows(cur_sql(f"read_parquet('{path}')", SEP, OCT, ("g5",)))
    assert {r["instance_type"] for r in rows} == {"g5.2xlarge", "g5.xlarge"}


def _seed_athena(endpoint: str, rows: list[dict], names: list[str], page_rows: int | None = None) -> None:
    def cell(v):
        return {} if v is None else {"VarCharValue": str(v)}

    body = {"results": [{
        "rows": [{"Data": [{"VarCharValue": n} for n in names]}] + [{"Data": [cell(r[n]) for n in names]} for r in rows],
        "column_info": [{"Name": n, "Type": "varchar"} for n in names],
    }]}
    req = urllib.request.Request(f"{endpoint}/moto-api/static/athena/query-results", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 201


@pytest.mark.integration
def test_athena_client_reads_results_into_the_same_table(aws, tmp_path):
    path = write_cur_rows(tmp_path / "cur.parquet", fixture_rows())
    expected = read_cur(str(path), SEP, OCT, FAMILIES).table
    # What Athena would answer for this SQL on this data: DuckDB's answer, as strings.
    a = AthenaSettings(database="cur", table="cur2", output_location="s3://athena-out/q/", poll_interval_s=0.01)
    sql = cur_sql('"cur"."cur2"', SEP, OCT, FAMILIES)
    rows = duckdb_rows(sql.replace('"cur"."cur2"', f"read_parquet('{path}')"))
    names = list(rows[0])
    aws.client("s3").create_bucket(Bucket="athena-out")
    _seed_athena(aws.endpoint_url, rows, names)
    res = fetch_athena(aws.client("athena"), SEP, OCT, FAMILIES, a)
    assert res.sql == sql
    execution = aws.client("athena").get_query_execution(QueryExecutionId=res.query_execution_id)["QueryExecution"]
    assert execution["Query"] == sql and execution["QueryExecutionContext"]["Database"] == "cur"
    pd.testing.assert_frame_equal(res.table.drop(columns="source"), expected.drop(columns="source"),
                                  check_exact=False, rtol=1e-9)
    assert set(res.table["source"]) == {"athena"}


@pytest.mark.integration
def test_athena_result_that_is_not_a_number_names_the_column(aws, tmp_path):
    path = write_cur_rows(tmp_path / "cur.parquet", fixture_rows())
    rows = duckdb_rows(cur_sql(f"read_parquet('{path}')", SEP, OCT, FAMILIES))
    rows[1]["cost"] = "n/a"
    aws.client("s3").create_bucket(Bucket="athena-out")
    _seed_athena(aws.endpoint_url, rows, list(rows[0]))
    a = AthenaSettings(output_location="s3://athena-out/q/", poll_interval_s=0.01)
    with pytest.raises(ValueError, match=r"athena cur\.cur2 \(query .*\): column 'cost' is not a number in row 2"):
        fetch_athena(aws.client("athena"), SEP, OCT, FAMILIES, a)
