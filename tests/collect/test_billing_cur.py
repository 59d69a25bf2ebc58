"""CUR 2.0 Parquet -> cost table: selection, cost rule, tags, bad input, S3, storage."""

from __future__ import annotations

import json
from datetime import date, datetime, timezone

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpufinops.collect.billing.cur import read_cur
from gpufinops.collect.billing.schema import COLUMNS, BillingDataError, DTYPES, load_costs, save_costs
from gpufinops.collect.billing.synth import line, write_cur_rows
from gpufinops.collect.billing.load import s3_filesystem
from gpufinops.config import AwsSettings, Settings
from gpufinops.store.store import Store

SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)
FAMILIES = AwsSettings().gpu_families


def h(day: int, hour: int) -> datetime:
    return datetime(2024, 9, day, hour)


def fixture_rows() -> list[dict]:
    ml = {"user_team": "ml", "user_project": "llm", "user_owner": "ana"}
    return [
        # GPU on-demand, tagged, two hours on the 2nd, one on the 3rd
        line(h(2, 0), "p4d.24xlarge", resource="i-p4d", cost=32.77, tags=ml),
        line(h(2, 1), "p4d.24xlarge", resource="i-p4d", cost=32.77, tags=ml),
        line(h(3, 5), "p4d.24xlarge", resource="i-p4d", cost=32.77, tags=ml),
        # GPU spot in another region (prefixed usage type), untagged
        line(h(2, 3), "g5.2xlarge", kind="SpotUsage", region="us-east-2", resource="i-spot", cost=0.48),
        line(h(2, 4), "g5.2xlarge", kind="SpotUsage", region="us-east-2", resource="i-spot", cost=0.24, hours=0.5),
        # reserved: unblended 0, the effective cost counts
        line(h(2, 0), "g6e.2xlarge", resource="i-ri", cost=0.0, line_type="DiscountedUsage", ri_cost=1.40,
             tags={"team": "vision"}),
        # savings plan: unblended is the on-demand price, the SP effective cost counts
        line(h(2, 0), "g5.xlarge", resource="i-sp", cost=1.006, line_type="SavingsPlanCoveredUsage", sp_cost=0.70,
             tags={"user_team": "ml"}),
        # not GPU / not usage / not this month: all ignored
        line(h(2, 0), "m5.xlarge", resource="i-cpu", cost=0.192, tags=ml),
        line(h(2, 0), "", kind="EBS:VolumeUsage.gp3", resource="vol-1", cost=0.01),
        line(h(2, 0), "p4d.24xlarge", resource="i-p4d", cost=5.0, line_type="Tax", line_id="tax-1"),
        line(h(2, 0), "p4d.24xlarge", resource="i-p4d", cost=-3.0, line_type="Credit", line_id="credit-1"),
        line(datetime(2024, 8, 31, 23), "p4d.24xlarge", resource="i-p4d", cost=32.77, tags=ml),
    ]


@pytest.fixture
def cur_file(tmp_path):
    return write_cur_rows(tmp_path / "cur" / "part-0.parquet", fixture_rows())


def test_gpu_usage_is_selected_and_costed(cur_file):
    res = read_cur(str(cur_file), SEP, OCT, FAMILIES)
    t = res.table
    assert list(t.columns) == list(COLUMNS)
    assert {c: str(t[c].dtype) for c in COLUMNS} == DTYPES
    assert res.warnings == []
    rows = {(r.resource_id, r.date.day): r for r in t.itertuples()}
    assert set(rows) == {("i-p4d", 2), ("i-p4d", 3), ("i-spot", 2), ("i-ri", 2), ("i-sp", 2)}
    p4d = rows[("i-p4d", 2)]
    assert p4d.cost == pytest.approx(65.54) and p4d.usage_hours == 2.0
    assert (p4d.instance_type, p4d.pricing_model, p4d.team, p4d.project, p4d.owner) == (
        "p4d.24xlarge", "on-demand", "ml", "llm", "ana")
    assert json.loads(p4d.tags) == {"user_owner": "ana", "user_project": "llm", "user_team": "ml"}
    spot = rows[("i-spot", 2)]
    assert (spot.pricing_model, spot.region, spot.team, spot.tags) == ("spot", "us-east-2", "", "{}")
    assert spot.cost == pytest.approx(0.72) and spot.usage_hours == 1.5
    assert rows[("i-ri", 2)].pricing_model == "reserved" and rows[("i-ri", 2)].cost == pytest.approx(1.40)
    assert rows[("i-ri", 2)].team == "vision"
    assert rows[("i-sp", 2)].pricing_model == "savings-plan" and rows[("i-sp", 2)].cost == pytest.approx(0.70)
    assert t["cost"].sum() == pytest.approx(3 * 32.77 + 0.72 + 1.40 + 0.70)


def test_family_list_is_configurable(cur_file):
    t = read_cur(str(cur_file), SEP, OCT, ("g5",)).table
    assert set(t["instance_type"]) == {"g5.2xlarge", "g5.xlarge"}


def test_folder_of_parts_is_read(tmp_path):
    rows = fixture_rows()
    write_cur_rows(tmp_path / "d" / "a.parquet", rows[:3])
    write_cur_rows(tmp_path / "d" / "sub" / "b.parquet", rows[3:])
    t = read_cur(str(tmp_path / "d"), SEP, OCT, FAMILIES).table
    assert t["cost"].sum() == pytest.approx(3 * 32.77 + 0.72 + 1.40 + 0.70)


def test_several_row_groups_sum_across_groups(tmp_path):
    p = write_cur_rows(tmp_path / "rg.parquet", fixture_rows(), row_group_size=2)
    assert pq.ParquetFile(p).num_row_groups > 3
    t = read_cur(str(p), SEP, OCT, FAMILIES).table
    assert t.loc[(t.resource_id == "i-p4d") & (t.date.dt.day == 2), "cost"].item() == pytest.approx(65.54)


def test_negative_and_absurd_costs_are_excluded_with_a_warning(tmp_path):
    rows = fixture_rows() + [
        line(h(4, 0), "p5.48xlarge", resource="i-neg", cost=-10.0, line_id="neg-1"),
        line(h(4, 1), "p5.48xlarge", resource="i-big", cost=5e6, line_id="big-1"),
    ]
    p = write_cur_rows(tmp_path / "bad.parquet", rows)
    res = read_cur(str(p), SEP, OCT, FAMILIES)
    assert "i-neg" not in set(res.table.resource_id) and "i-big" not in set(res.table.resource_id)
    assert len(res.warnings) == 1
    assert str(p) in res.warnings[0] and "2 GPU line item(s) excluded" in res.warnings[0]
    assert "line_item_unblended_cost" in res.warnings[0] and "neg-1" in res.warnings[0]


def test_missing_column_names_file_and_column(tmp_path):
    t = pq.read_table(write_cur_rows(tmp_path / "a.parquet", fixture_rows())).drop_columns(["line_item_unblended_cost"])
    pq.write_table(t, tmp_path / "b.parquet")
    with pytest.raises(BillingDataError, match=r"b\.parquet: missing CUR 2\.0 column\(s\) \['line_item_unblended_cost'\]"):
        read_cur(str(tmp_path / "b.parquet"), SEP, OCT, FAMILIES)


def test_wrong_type_names_file_column_and_type(tmp_path):
    t = pq.read_table(write_cur_rows(tmp_path / "a.parquet", fixture_rows()))
    i = t.schema.get_field_index("line_item_unblended_cost")
    t = t.set_column(i, "line_item_unblended_cost", pa.array([str(x) for x in t.column(i).to_pylist()]))
    pq.write_table(t, tmp_path / "s.parquet")
    with pytest.raises(BillingDataError, match=r"s\.parquet: column 'line_item_unblended_cost' has type string"):
        read_cur(str(tmp_path / "s.parquet"), SEP, OCT, FAMILIES)


def test_mixed_currencies_are_an_error(tmp_path):
    rows = fixture_rows() + [line(h(5, 0), "g5.xlarge", resource="i-eur", cost=0.9, currency="EUR")]
    p = write_cur_rows(tmp_path / "mixed.parquet", rows)
    with pytest.raises(BillingDataError, match=r"mixed\.parquet: column 'currency' mixes currencies \['EUR', 'USD'\]"):
        read_cur(str(p), SEP, OCT, FAMILIES)


def test_truncated_parquet_is_an_error_naming_the_file(tmp_path, cur_file):
    data = cur_file.read_bytes()
    bad = tmp_path / "truncated.parquet"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(BillingDataError, match=r"truncated\.parquet: not a readable Parquet file"):
        read_cur(str(bad), SEP, OCT, FAMILIES)


def test_empty_month_gives_an_empty_table_and_a_warning(cur_file):
    res = read_cur(str(cur_file), datetime(2024, 11, 1, tzinfo=timezone.utc),
                   datetime(2024, 12, 1, tzinfo=timezone.utc), FAMILIES)
    assert res.table.empty and list(res.table.columns) == list(COLUMNS)
    assert "no GPU instance usage between 2024-11-01 and 2024-12-01" in res.warnings[0]


@pytest.mark.integration
def test_cur_from_s3_through_moto(aws, cur_file):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="cur-bucket")
    s3.put_object(Bucket="cur-bucket", Key="exports/gpu/data/BILLING_PERIOD=2024-09/part-0.parquet",
                  Body=cur_file.read_bytes())
    s3.put_object(Bucket="cur-bucket", Key="exports/gpu/metadata/manifest.json", Body=b"{}")
    fs = s3_filesystem(Settings(aws=AwsSettings(endpoint_url=aws.endpoint_url)), "s3://cur-bucket/exports/gpu/")
    res = read_cur("s3://cur-bucket/exports/gpu/", SEP, OCT, FAMILIES, filesystem=fs)
    local = read_cur(str(cur_file), SEP, OCT, FAMILIES)
    assert res.files == ["s3://cur-bucket/exports/gpu/data/BILLING_PERIOD=2024-09/part-0.parquet"]
    pd.testing.assert_frame_equal(res.table, local.table)


def test_store_replaces_a_period_atomically(tmp_path, cur_file):
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    now = datetime(2024, 10, 2, tzinfo=timezone.utc)
    t = read_cur(str(cur_file), SEP, OCT, FAMILIES).table
    assert save_costs(store, t, "cur", date(2024, 9, 1), date(2024, 10, 1), now) == 5
    back = load_costs(store, date(2024, 9, 1), date(2024, 10, 1))
    pd.testing.assert_frame_equal(back, t.sort_values(["date"], kind="stable").reset_index(drop=True), check_like=False)
    # A bad file fails before the transaction: nothing stored is lost.
    bad = t.copy()
    bad.loc[0, "pricing_model"] = "weird"
    with pytest.raises(BillingDataError, match="pricing_model"):
        save_costs(store, bad, "cur", date(2024, 9, 1), date(2024, 10, 1), now)
    assert len(load_costs(store, date(2024, 9, 1), date(2024, 10, 1))) == 5
    # Re-import of the same period replaces; another source is untouched.
    other = t.head(1).assign(source="focus")
    save_costs(store, other, "focus", date(2024, 9, 1), date(2024, 10, 1), now)
    save_costs(store, t.head(2), "cur", date(2024, 9, 1), date(2024, 10, 1), now)
    assert len(load_costs(store, date(2024, 9, 1), date(2024, 10, 1), "cur")) == 2
    assert len(load_costs(store, date(2024, 9, 1), date(2024, 10, 1), "focus")) == 1
