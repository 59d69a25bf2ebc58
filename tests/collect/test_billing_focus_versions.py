"""FOCUS 1.0-1.4, many files (folder, glob, .csv.gz, Parquet, s3://) and Google's / Azure's export shapes:
each comes out as the same GPU cost as the real 1.0 sample's rows."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from gpufinops.collect.billing import focus_spec
from gpufinops.collect.billing.focus import read_focus
from gpufinops.collect.billing.load import load_cost_table
from gpufinops.collect.billing.schema import BillingDataError
from gpufinops.collect.billing.settings import BillingSettings
from gpufinops.config import AwsSettings, load_settings

DATA = Path(__file__).parents[1] / "data" / "focus"
SUBSET = DATA / "aws_focus_1.0_subset.csv"
SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)
BS = BillingSettings(gpu_families=AwsSettings().gpu_families)


def subset() -> pd.DataFrame:
    return pd.read_csv(SUBSET, dtype=str, keep_default_na=False)


def as_version(df: pd.DataFrame, version: str) -> pd.DataFrame:
    """The 1.0 rows with the column set of `version`: added columns empty, 1.3's provider columns filled
    from ProviderName, 1.4 without ProviderName and PublisherName."""
    out = df.copy()
    for c in focus_spec.columns(version):
        if c not in out.columns:
            out[c] = out["ProviderName"] if c in ("ServiceProviderName", "HostProviderName") else ""
    if version >= "1.4":
        out = out.drop(columns=list(focus_spec.DEPRECATED_1_3))
    return out


@pytest.fixture(scope="module")
def expected() -> pd.DataFrame:
    t = read_focus(str(SUBSET), SEP, OCT, BS).table
    assert len(t) == 8 and set(t["instance_type"]) == {"g5.4xlarge"}  # the sample's GPU rows
    return t


@pytest.mark.parametrize("version", ["1.1", "1.2", "1.3", "1.4"])
def test_each_version_reads_as_the_same_cost(tmp_path, expected, version):
    path = tmp_path / f"focus_{version}.csv"
    df = as_version(subset(), version)
    assert set(focus_spec.mandatory(version)) <= set(df.columns)
    df.to_csv(path, index=False)
    res = read_focus(str(path), SEP, OCT, BS)
    assert res.versions == {str(path): version}
    pd.testing.assert_frame_equal(res.table, expected)


def test_a_1_4_file_without_a_provider_column_names_file_and_column(tmp_path):
    path = tmp_path / "focus_1.4.csv"
    as_version(subset(), "1.4").drop(columns=["ServiceProviderName", "HostProviderName"]).to_csv(path, index=False)
    # Still a 1.4 file by its other columns (InvoiceDetailId, CommitmentProgramEligibilityDetails).
    with pytest.raises(BillingDataError, match=r"focus_1\.4\.csv: missing FOCUS 1\.4 column\(s\) "
                                               r"\['ServiceProviderName'\] \(FOCUS 1\.3\+ names the provider"):
        read_focus(str(path), SEP, OCT, BS)


def test_a_missing_required_column_of_a_1_3_file_is_named(tmp_path):
    path = tmp_path / "focus_1.3.csv"
    as_version(subset(), "1.3").drop(columns=["ConsumedUnit"]).to_csv(path, index=False)
    with pytest.raises(BillingDataError, match=r"focus_1\.3\.csv: missing FOCUS 1\.3 column\(s\) \['ConsumedUnit'\]"):
        read_focus(str(path), SEP, OCT, BS)


def split_files(folder: Path) -> list[Path]:
    """The subset in three files, one per format: .csv, .csv.gz and Parquet (1.3 columns in the last)."""
    df = subset()
    parts = [df.iloc[0:16], df.iloc[16:32], as_version(df.iloc[32:], "1.3")]
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "part-0.csv", folder / "part-1.csv.gz", folder / "part-2.parquet"]
    parts[0].to_csv(paths[0], index=False)
    parts[1].to_csv(paths[1], index=False, compression="gzip")
    parts[2].to_parquet(paths[2], index=False)
    (folder / "manifest.json").write_text("{}")  # not a FOCUS file: skipped
    return paths


def test_a_folder_and_a_glob_of_csv_gzip_and_parquet(tmp_path, expected):
    paths = split_files(tmp_path / "export")
    for path in (tmp_path / "export", tmp_path / "export" / "part-*"):
        res = read_focus(str(path), SEP, OCT, BS)
        assert res.files == [str(p) for p in paths]
        assert sorted(res.versions.values()) == ["1.0", "1.0", "1.3"]
        pd.testing.assert_frame_equal(res.table, expected)


def test_an_empty_folder_and_a_glob_matching_nothing_are_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BillingDataError, match=r"empty: no \.csv / \.csv\.gz / \.parquet files"):
        read_focus(str(tmp_path / "empty"), SEP, OCT, BS)
    with pytest.raises(BillingDataError, match=r"nothing-\*\.csv: no file matches"):
        read_focus(str(tmp_path / "nothing-*.csv"), SEP, OCT, BS)


def test_s3_prefix_through_moto(aws, tmp_path, expected):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="focus-bucket")
    for p in split_files(tmp_path / "export"):
        s3.put_object(Bucket="focus-bucket", Key=f"focus/gpu/data/BILLING_PERIOD=2024-09/{p.name}", Body=p.read_bytes())
    s3.put_object(Bucket="focus-bucket", Key="focus/gpu/metadata/manifest.json", Body=b"{}")
    settings = load_settings(aws={"endpoint_url": aws.endpoint_url},
                             billing={"source": "focus", "path": "s3://focus-bucket/focus/gpu/"})
    now = datetime(2024, 10, 5, tzinfo=timezone.utc)
    loaded = load_cost_table(settings, SEP, OCT, now)
    pd.testing.assert_frame_equal(loaded.table, expected)
    globbed = load_cost_table(settings, SEP, OCT, now, path="s3://focus-bucket/focus/gpu/data/*/part-[01].csv*")
    assert len(globbed.table) < len(expected) and set(globbed.table["resource_id"]) < set(expected["resource_id"])


def test_google_cloud_export_seconds_lowercase_and_machine_label():
    res = read_focus(str(DATA / "gcp_focus_view_gpu.csv"), SEP, OCT, BS)
    t = res.table
    assert list(t["instance_type"]) == ["a2-highgpu-1g"] and list(t["provider"]) == ["gcp"]
    # GPU + cores + RAM of two hours; the n2 VM is not a GPU instance.
    assert t["cost"].iloc[0] == pytest.approx(2 * (2.93391 + 0.379188 + 0.360292))
    # One instance-hour per hour, not 1 GPU-hour + 12 vCPU-hours.
    assert t["usage_hours"].iloc[0] == pytest.approx(2.0)
    assert list(t["team"]) == ["vision"] and list(t["region"]) == ["us-central1"]


def test_azure_export_1_2_vm_size_from_sku_details():
    res = read_focus(str(DATA / "azure_focus_1.2_gpu.csv"), SEP, OCT, BS)
    t = res.table
    assert res.versions == {str(DATA / "azure_focus_1.2_gpu.csv"): "1.2"}
    assert list(t["instance_type"]) == ["Standard_NC24ads_A100_v4"] and list(t["provider"]) == ["azure"]
    assert t["cost"].iloc[0] == pytest.approx(3 * 3.673) and t["usage_hours"].iloc[0] == pytest.approx(3.0)
    assert (t["team"].iloc[0], t["project"].iloc[0]) == ("vision", "detector")


def test_parquet_tags_as_a_map_are_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = as_version(subset(), "1.2")
    df = df[df["ChargeDescription"].str.contains("g5.4xlarge")].head(2)
    table = pa.Table.from_pandas(df.drop(columns=["Tags"]), preserve_index=False).append_column(
        "Tags", pa.array([[("team", "ml")], [("team", "cv")]], type=pa.map_(pa.string(), pa.string())))
    pq.write_table(table, tmp_path / "tags.parquet")
    t = read_focus(str(tmp_path / "tags.parquet"), SEP, OCT, BS).table
    assert sorted(t["team"]) == ["cv", "ml"]


@pytest.mark.parametrize("rows", [1, 7])
def test_reading_in_small_chunks_gives_the_same_table(tmp_path, monkeypatch, expected, rows):
    from gpufinops.collect.billing import focus

    monkeypatch.setattr(focus, "CHUNK_ROWS", rows)
    paths = split_files(tmp_path / "export")
    pd.testing.assert_frame_equal(read_focus(str(paths[0].parent), SEP, OCT, BS).table, expected)
    # Google's rows of one instance-hour fall in different chunks: still one instance-hour per hour.
    t = read_focus(str(DATA / "gcp_focus_view_gpu.csv"), SEP, OCT, BS).table
    assert t["usage_hours"].sum() == pytest.approx(2.0)
    # A bad value is still named by its data row in the file, not in the chunk.
    bad = subset()
    bad.loc[bad["ChargeDescription"].str.contains("g5.4xlarge").idxmax(), "BilledCost"] = "lots"
    row = int(bad.index[bad["BilledCost"] == "lots"][0]) + 2
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(BillingDataError, match=rf"bad\.csv: column 'BilledCost' is not a number on data row {row} "):
        read_focus(str(tmp_path / "bad.csv"), SEP, OCT, BS)
