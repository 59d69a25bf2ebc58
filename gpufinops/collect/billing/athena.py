"""The CUR aggregation as SQL on Amazon Athena, for CURs too large for one machine.

The statement is `cur.cur_sql()` — the same selection, cost rule and grouping
as the pyarrow path — run with start_query_execution, polled with
get_query_execution until it ends, and read back with the get_query_results
paginator (every value a string, the first row of the first page the header).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Sequence

import pandas as pd

from .cur import cur_sql, table_from_sql_rows
from .schema import BillingDataError, single_currency
from .settings import AthenaSettings, TagKeys

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass
class AthenaResult:
    table: pd.DataFrame
    query_execution_id: str
    sql: str


def run_query(client, sql: str, a: AthenaSettings, sleep: Callable[[float], None] = time.sleep,
              monotonic: Callable[[], float] = time.monotonic) -> tuple[str, list[dict]]:
    """Run one statement; rows as dicts of strings (None for SQL NULL)."""
    kwargs = {"QueryString": sql, "QueryExecutionContext": {"Database": a.database}, "WorkGroup": a.workgroup}
    if a.output_location:
        kwargs["ResultConfiguration"] = {"OutputLocation": a.output_location}
    qid = client.start_query_execution(**kwargs)["QueryExecutionId"]
    deadline = monotonic() + a.timeout_s
    while True:
        status = client.get_query_execution(QueryExecutionId=qid)["QueryExecution"]["Status"]
        state = status.get("State")
        if state in TERMINAL:
            break
        if monotonic() > deadline:
            client.stop_query_execution(QueryExecutionId=qid)
            raise BillingDataError(f"athena query {qid}: still {state} after {a.timeout_s:g} s; stopped")
        sleep(a.poll_interval_s)
    if state != "SUCCEEDED":
        reason = status.get("StateChangeReason", "")
        raise BillingDataError(f"athena query {qid} on {a.database}.{a.table}: {state}: {reason}")
    header: list[str] | None = None
    rows: list[dict] = []
    for page in client.get_paginator("get_query_results").paginate(QueryExecutionId=qid):
        for r in page["ResultSet"]["Rows"]:
            values = [d.get("VarCharValue") for d in r.get("Data", [])]
            if header is None:
                header = values
                continue
            rows.append(dict(zip(header, values)))
    return qid, rows


def fetch_athena(client, start: datetime, end: datetime, families: Sequence[str], a: AthenaSettings,
                 tag_keys: TagKeys = TagKeys(), max_line_cost: float = 100_000.0, **kw) -> AthenaResult:
    sql = cur_sql(f'"{a.database}"."{a.table}"', start, end, families, tag_keys, max_line_cost)
    qid, rows = run_query(client, sql, a, **kw)
    where = f"athena {a.database}.{a.table} (query {qid})"
    table = table_from_sql_rows(rows, "athena", where=where)
    single_currency(table, where)
    return AthenaResult(table, qid, sql)
