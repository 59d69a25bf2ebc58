"""CUR 2.0 per-key totals (`costs --by` in one pass): equal to the cost table summed, at every grain, on a
fixture, the shared real samples turned into CUR 2.0 and a generated file; S3 read by ranged GETs of the needed
columns; bad input."""

from __future__ import annotations

import csv
import json
import re
import threading
import urllib.error
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpufinops.cli import main
from gpufinops.collect.billing.cur import cur_totals, read_cur
from gpufinops.collect.billing import s3fetch
from gpufinops.collect.billing.duck import CUR_KEY, CUR_READ
from gpufinops.collect.billing.s3fetch import s3_client
from gpufinops.collect.billing.schema import BillingDataError
from gpufinops.collect.billing.synth import SCHEMA, generate_cur, line, write_cur_rows
from gpufinops.collect.billing.totals import GRAINS, table_totals
from gpufinops.config import AwsSettings, Settings, TagKeys
from gpufinops.cost.costs import summarize, summarize_totals

from tests.collect.test_billing_cur import FAMILIES, OCT, SEP, fixture_rows, h

SHARED = Path(__file__).parents[1] / ".." / ".." / "shared" / "data" / "billing"
LEGACY_CUR = SHARED / "aws_cur_legacy_sample_anonymized.csv"
FOCUS = SHARED / "focus_1.0_sample_1000.csv"
CUR2_COLUMNS = SHARED / "aws_cur2_columns_tailpipe.csv"


def assert_same_totals(got, expected) -> None:
    """Same (key, currency) rows; cost and hours equal to the cent."""
    g = {(k, c): (x, y) for k, c, x, y in got[["key", "currency", "cost", "usage_hours"]].itertuples(index=False)}
    e = {(k, c): (x, y) for k, c, x, y in expected[["key", "currency", "cost", "usage_hours"]].itertuples(index=False)}
    assert set(g) == set(e)
    for key in e:
        assert abs(g[key][0] - e[key][0]) < 0.005, key
        assert abs(g[key][1] - e[key][1]) < 0.005, key


def check_every_grain(path, start=SEP, end=OCT, tag_keys=TagKeys(), min_rows=1) -> None:
    full = read_cur(str(path), start, end, FAMILIES, tag_keys)
    assert len(full.table) >= min_rows
    for by in GRAINS:
        totals = cur_totals(str(path), start, end, FAMILIES, by, tag_keys)
        assert_same_totals(totals.table, table_totals(full.table, by))
        assert totals.warnings == full.warnings and totals.rows_read == full.rows_read
        # What `costs --by` prints is the same from either path.
        assert summarize_totals(totals.table, by).round(6).equals(summarize(full.table, by).round(6))


# --------------------------------------------------------------------------- equal to the table, every grain


def tag_edge_rows() -> list[dict]:
    """Tag sets where the first configured key is empty, given twice, or absent; a null resource id."""
    return fixture_rows() + [
        line(h(6, 0), "g6.xlarge", resource="i-e1", cost=2.0, tags={"team": "", "user_team": "fallback"}),
        line(h(6, 1), "g6.xlarge", resource="i-e2", cost=3.0, tags={"Team": "cap", "team": "low"}),
        line(h(6, 2), "g6.xlarge", resource="i-e3", cost=4.0, tags={"user_Team": "last", "other": "x"}),
        line(h(6, 3), "g6.xlarge", resource=None, cost=5.0, tags={}),
        line(h(6, 4), "g6.xlarge", resource="i-e4", cost=6.0, tags={"project": "p", "owner": "o"}),
    ]


def test_every_grain_equals_the_table_summed_on_the_fixture(tmp_path):
    check_every_grain(write_cur_rows(tmp_path / "f.parquet", tag_edge_rows()), min_rows=8)
    team = cur_totals(str(tmp_path / "f.parquet"), SEP, OCT, FAMILIES, "team").table.set_index("key")["cost"]
    assert team["fallback"] == 2.0 and team["low"] == 3.0 and team["last"] == 4.0
    assert team[""] == pytest.approx(0.72 + 5.0 + 6.0)  # untagged: spot, no tags, only project/owner


def test_every_grain_equals_the_table_summed_on_a_generated_file(tmp_path):
    # Small row groups and batches of several sizes: sums cross row groups and batches.
    p = generate_cur(tmp_path / "gen.parquet", 60_000, row_group_size=7_000, n_resources=300)
    check_every_grain(p, min_rows=1000)


def test_a_row_group_partly_outside_the_period_is_filtered_and_one_wholly_outside_is_skipped(tmp_path):
    rows = [line(datetime(2024, 8, 31, h_), "p5.48xlarge", resource="i-aug", cost=1.0) for h_ in range(4)]
    rows += [line(datetime(2024, 8, 31, 23), "p5.48xlarge", resource="i-edge", cost=7.0),
             line(h(1, 0), "p5.48xlarge", resource="i-edge", cost=9.0)]
    rows += [line(h(2, h_), "p5.48xlarge", resource="i-sep", cost=2.0) for h_ in range(4)]
    p = write_cur_rows(tmp_path / "edge.parquet", rows, row_group_size=2)
    assert pq.ParquetFile(p).num_row_groups == 5
    t = cur_totals(str(p), SEP, OCT, FAMILIES, "instance").table.set_index("key")["cost"]
    assert dict(t) == {"i-edge": 9.0, "i-sep": 8.0}
    check_every_grain(p)


def cur2_rows_from_shared_samples() -> list[dict]:
    """Real line items: the legacy CUR sample (1,281 non-GPU lines: S3, Glue, KMS, tax, ...) renamed to CUR 2.0
    columns, plus the FOCUS sample's EC2 Linux instance-hours (8 of them g5.4xlarge) as CUR 2.0 BoxUsage lines."""
    def cur2_name(legacy: str) -> str:
        group, _, name = legacy.partition("/")
        snake = lambda s: re.sub(r"(?<!^)(?=[A-Z])", "_", s).lower()
        return f"{snake(group)}_{snake(name)}"

    def ts(s: str) -> datetime:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).replace(tzinfo=None)

    def num(s: str) -> float | None:
        return float(s) if s not in ("", "NULL") else None

    rows = []
    with LEGACY_CUR.open(newline="") as f:
        for r in csv.DictReader(f):
            row = {cur2_name(k): v for k, v in r.items() if not k.startswith("resourceTags/")}
            tags = {f"user_{k.split(':', 1)[1]}": v for k, v in r.items() if k.startswith("resourceTags/user:") and v}
            d = {c.name: row.get(c.name) or None for c in SCHEMA}
            for c in ("line_item_usage_start_date", "line_item_usage_end_date", "bill_billing_period_start_date"):
                d[c] = ts(d[c]) if d[c] else None
            for c in ("line_item_usage_amount", "line_item_unblended_cost", "reservation_effective_cost",
                      "savings_plan_savings_plan_effective_cost"):
                d[c] = num(d[c] or "")
            d["resource_tags"] = tags or None
            rows.append(d)
    with FOCUS.open(newline="") as f:
        for r in csv.DictReader(f):
            m = re.search(r"On Demand Linux (\S+) Instance Hour", r["ChargeDescription"])
            if not m:
                continue
            tags = {f"user_{k}": v for k, v in json.loads(r["Tags"]).items()} if r["Tags"] != "NULL" else None
            rows.append(line(ts(r["ChargePeriodStart"]), m.group(1), resource=r["ResourceId"],
                             region=r["RegionId"], account=r["SubAccountId"], cost=float(r["EffectiveCost"]),
                             hours=float(r["ConsumedQuantity"]), tags=tags, line_id=r["Id"] or None))
    return rows


@pytest.mark.skipif(not (LEGACY_CUR.exists() and FOCUS.exists()), reason="../shared/data/billing not present")
def test_every_grain_equals_the_table_summed_on_the_shared_real_samples(tmp_path):
    cur2 = {r["cur2_column"] for r in csv.DictReader(CUR2_COLUMNS.open())}
    assert {c.name for c in SCHEMA} <= cur2  # the fixture's columns are real CUR 2.0 columns
    rows = cur2_rows_from_shared_samples()
    assert len(rows) > 1281 + 8
    p = write_cur_rows(tmp_path / "shared.parquet", rows, row_group_size=300)
    start, end = datetime(2023, 11, 1, tzinfo=timezone.utc), OCT
    keys = TagKeys(team=("user_business_unit",), project=("user_application",))
    check_every_grain(p, start, end, keys, min_rows=8)
    t = cur_totals(str(p), start, end, FAMILIES, "instance_type", keys).table
    g5 = [r for r in rows[1281:] if r["product_instance_type"] == "g5.4xlarge"]
    assert len(g5) == 8  # SOURCES.md: the sample's GPU instance rows; its other instance-hours are not GPU
    assert list(t["key"]) == ["g5.4xlarge"]
    assert t["usage_hours"].item() == pytest.approx(sum(r["line_item_usage_amount"] for r in g5))
    assert t["cost"].item() == pytest.approx(sum(r["line_item_unblended_cost"] for r in g5))


# --------------------------------------------------------------------------- bad input, same as the table


def test_bad_lines_are_excluded_with_the_same_warning_naming_the_first(tmp_path):
    rows = fixture_rows() + [
        line(h(4, 0), "p5.48xlarge", resource="i-neg", cost=-10.0, line_id="neg-1"),
        line(h(4, 1), "p5.48xlarge", resource="i-nan", cost=float("nan"), line_id="nan-1"),
        line(h(4, 2), "g5.xlarge", resource="i-ri", cost=0.0, line_type="DiscountedUsage", ri_cost=None,
             line_id="ri-no-effective-cost"),
    ]
    p = write_cur_rows(tmp_path / "bad.parquet", rows, row_group_size=4)
    res = cur_totals(str(p), SEP, OCT, FAMILIES, "instance")
    assert not {"i-neg", "i-nan"} & set(res.table["key"])
    assert len(res.warnings) == 1 and "3 GPU line item(s) excluded" in res.warnings[0]
    assert "identity_line_item_id=neg-1" in res.warnings[0] and str(p) in res.warnings[0]
    check_every_grain(p)


@pytest.mark.parametrize("by", ["instance", "team"])
def test_bad_files_are_clear_errors_at_every_grain(tmp_path, by):
    good = write_cur_rows(tmp_path / "a.parquet", fixture_rows())
    (tmp_path / "broken.parquet").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(BillingDataError, match=r"broken\.parquet: not a readable Parquet file"):
        cur_totals(str(tmp_path / "broken.parquet"), SEP, OCT, FAMILIES, by)
    pq.write_table(pq.read_table(good).drop_columns(["line_item_usage_amount"]), tmp_path / "m.parquet")
    with pytest.raises(BillingDataError, match=r"m\.parquet: missing CUR 2\.0 column\(s\) \['line_item_usage_amount'\]"):
        cur_totals(str(tmp_path / "m.parquet"), SEP, OCT, FAMILIES, by)
    eur = write_cur_rows(tmp_path / "eur.parquet", fixture_rows() + [line(h(5, 0), "g5.xlarge", cost=1, currency="EUR")])
    with pytest.raises(BillingDataError, match=r"eur\.parquet: column 'currency' mixes currencies \['EUR', 'USD'\]"):
        cur_totals(str(eur), SEP, OCT, FAMILIES, by)


def test_empty_period_gives_no_rows_and_the_same_warning(tmp_path):
    p = write_cur_rows(tmp_path / "c.parquet", fixture_rows())
    nov, dec = datetime(2024, 11, 1, tzinfo=timezone.utc), datetime(2024, 12, 1, tzinfo=timezone.utc)
    res = cur_totals(str(p), nov, dec, FAMILIES, "team")
    assert res.table.empty and list(res.table.columns) == ["key", "currency", "cost", "usage_hours"]
    assert res.warnings == read_cur(str(p), nov, dec, FAMILIES).warnings


def test_cli_plain_total_and_save_print_the_same_and_a_bad_file_exits_1(tmp_path, capsys):
    cur = write_cur_rows(tmp_path / "cur.parquet", tag_edge_rows())
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{tmp_path / 'g.db'}\nbilling:\n  source: cur\n  path: {cur}\n")
    for by in ("instance", "team", "instance_type", "account"):
        # The table format prints cents: float sums in another order may differ in the 15th digit.
        assert main(["-c", str(cfg), "costs", "--month", "2024-09", "--by", by]) == 0
        plain = capsys.readouterr().out
        assert main(["-c", str(cfg), "costs", "--month", "2024-09", "--by", by, "--save"]) == 0
        assert capsys.readouterr().out == plain and len(plain.splitlines()) >= 2
    bad = tmp_path / "nope.parquet"
    bad.write_bytes(b"PAR1 not parquet")
    assert main(["-c", str(cfg), "costs", "--month", "2024-09", "--by", "instance", "--path", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "nope.parquet: not a readable Parquet file" in err and "Traceback" not in err


# --------------------------------------------------------------------------- S3: ranged reads through moto


class RecordingProxy:
    """HTTP proxy in front of the moto server that records each request's method, path and Range header."""

    def __init__(self, upstream: str) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.requests.append((self.command, self.path, self.headers.get("Range")))
                req = urllib.request.Request(upstream + self.path, data=body or None, method=self.command,
                                             headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        status, headers, answer = resp.status, resp.headers, resp.read()
                except urllib.error.HTTPError as err:
                    status, headers, answer = err.code, err.headers, err.read()
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer) if self.command != "HEAD"
                                                       else headers.get("Content-Length", "0")))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer)

            do_GET = do_HEAD = do_PUT = do_POST = _relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _ranges(requests) -> list[tuple[int, int]]:
    """[start, end) of each ranged GET of a Parquet object the proxy saw."""
    got = [rng for method, path, rng in requests if method == "GET" and path.endswith(".parquet")]
    assert got and all(rng and rng.startswith("bytes=") for rng in got)  # never the whole object
    return [(int(a), int(b) + 1) for rng in got for a, b in [rng[len("bytes="):].split("-")]]


@pytest.mark.integration
def test_s3_objects_give_the_local_totals_at_every_grain_from_ranged_gets(aws, tmp_path, monkeypatch):
    local = generate_cur(tmp_path / "gen.parquet", 40_000, row_group_size=10_000, n_resources=200)
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="cur-bucket")
    key = "exports/gpu/data/BILLING_PERIOD=2024-09/part-0.parquet"
    s3.put_object(Bucket="cur-bucket", Key=key, Body=local.read_bytes())
    s3.put_object(Bucket="cur-bucket", Key="exports/gpu/metadata/manifest.json", Body=b"{}")
    proxy = RecordingProxy(aws.endpoint_url)
    try:
        client = s3_client(Settings(aws=AwsSettings(endpoint_url=proxy.url)))
        for by in GRAINS:
            res = cur_totals("s3://cur-bucket/exports/gpu/", SEP, OCT, FAMILIES, by, s3=client)
            assert res.files == [f"s3://cur-bucket/{key}"]
            assert_same_totals(res.table, cur_totals(str(local), SEP, OCT, FAMILIES, by).table)
        _ranges(proxy.requests)
        # Without merging nearby ranges (a small file is otherwise one GET): only the footer and the chunks of
        # the columns the statements read, not one byte of another column.
        monkeypatch.setattr(s3fetch, "MERGE_GAP_BYTES", 0)
        monkeypatch.setattr(s3fetch, "FOOTER_GUESS_BYTES", 1024)
        proxy.requests.clear()
        res = cur_totals("s3://cur-bucket/exports/gpu/", SEP, OCT, FAMILIES, "team", s3=client)
        assert_same_totals(res.table, cur_totals(str(local), SEP, OCT, FAMILIES, "team").table)
    finally:
        proxy.close()
    meta = pq.ParquetFile(local).metadata
    unread = []
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            col = meta.row_group(g).column(c)
            if col.path_in_schema.split(".")[0] not in (*CUR_READ, CUR_KEY["team"]):
                start = min(o for o in (col.dictionary_page_offset, col.data_page_offset) if o is not None)
                unread.append((start, start + col.total_compressed_size))
    assert len(unread) >= 8 * meta.num_row_groups  # the line ids, the resource ids, ... (no line excluded here)
    fetched = _ranges(proxy.requests)
    assert not [(a, b) for a, b in fetched for lo, hi in unread if a < hi and lo < b]
    assert sum(b - a for a, b in fetched) < 0.6 * local.stat().st_size


@pytest.mark.integration
def test_s3_missing_bucket_or_no_parquet_is_a_clear_error(aws):
    client = s3_client(Settings(aws=AwsSettings(endpoint_url=aws.endpoint_url)))
    with pytest.raises(BillingDataError, match=r"s3://nope/x/: cannot list the S3 objects: .*NoSuchBucket"):
        cur_totals("s3://nope/x/", SEP, OCT, FAMILIES, "instance", s3=client)
    aws.client("s3").create_bucket(Bucket="empty")
    with pytest.raises(BillingDataError, match=r"s3://empty/: no \.parquet objects under this prefix"):
        cur_totals("s3://empty/", SEP, OCT, FAMILIES, "team", s3=client)
