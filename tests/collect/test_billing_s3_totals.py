"""Billing totals of s3:// paths (a plain `costs --by` on CUR or FOCUS objects): DuckDB over s3fetch's partial
copies, against a real moto S3 server. The same totals and warnings as the same files on the local disk, at every
grain and in every FOCUS format; an object replaced, truncated or not Parquet is a clear error naming it; nothing
is left in the temporary folder; no pandas or pyarrow imported."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from gpufinops.cli import main
from gpufinops.collect.billing.cur import cur_totals
from gpufinops.collect.billing.duck import focus_files, focus_total_rows
from gpufinops.collect.billing.s3fetch import s3_client
from gpufinops.collect.billing.schema import BillingDataError
from gpufinops.collect.billing.synth import line, write_cur_rows
from gpufinops.collect.billing.totals import GRAINS
from gpufinops.config import AwsSettings, Settings

from tests.collect.test_billing_cur import FAMILIES, OCT, SEP, fixture_rows, h
from tests.collect.test_billing_cur_totals import assert_same_totals
from tests.collect.test_billing_duck import assert_same, totals_dict
from tests.collect.test_billing_focus import BS
from tests.collect.test_billing_focus_versions import split_files

pytestmark = pytest.mark.integration


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    """$TMPDIR for the copies, to see that none is left behind."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read $TMPDIR again
    return folder


def _put_folder(aws, bucket: str, prefix: str, paths) -> None:
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=bucket)
    for p in paths:
        s3.put_object(Bucket=bucket, Key=f"{prefix}{p.name}", Body=p.read_bytes())


def test_focus_csv_gzip_and_parquet_objects_give_the_local_totals_at_every_grain(aws, tmp_path, tmpdir_env):
    paths = split_files(tmp_path / "export")
    _put_folder(aws, "focus-bucket", "focus/gpu/data/BILLING_PERIOD=2024-09/",
                [*paths, tmp_path / "export" / "manifest.json"])
    client = s3_client(Settings(aws=AwsSettings(endpoint_url=aws.endpoint_url)))
    local_files = focus_files(str(tmp_path / "export"))
    s3_files = focus_files("s3://focus-bucket/focus/gpu/", client)
    assert [f.name.rsplit("/", 1)[1] for f in s3_files] == ["part-0.csv", "part-1.csv.gz", "part-2.parquet"]
    for by in GRAINS:
        got = focus_total_rows(s3_files, "s3://focus-bucket/focus/gpu/", SEP, OCT, BS, by)
        want = focus_total_rows(local_files, str(tmp_path / "export"), SEP, OCT, BS, by)
        assert got.rows and (by != "instance" or len(got.rows) > 1)
        assert_same(totals_dict(got.rows), totals_dict(want.rows))
        assert got.files == [f"s3://focus-bucket/focus/gpu/data/BILLING_PERIOD=2024-09/{p.name}" for p in paths]
    assert list(tmpdir_env.iterdir()) == []  # every copy deleted


def test_the_command_prints_the_same_totals_for_s3_and_local_and_imports_no_pandas(aws, tmp_path, tmpdir_env):
    paths = split_files(tmp_path / "export")
    _put_folder(aws, "focus-bucket", "exports/", paths)
    config = tmp_path / "gpufinops.yaml"
    config.write_text(f"aws:\n  endpoint_url: {aws.endpoint_url}\n")

    def printed(path: str) -> list:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["--config", str(config), "costs", "--month", "2024-09", "--source", "focus", "--path",
                         path, "--by", "team", "-o", "json"]) == 0
        return json.loads(out.getvalue())

    s3_rows, local_rows = printed("s3://focus-bucket/exports/part-[12]*"), printed(str(tmp_path / "export" / "part-[12]*"))
    assert s3_rows == local_rows and s3_rows
    code = ("import sys, contextlib, io\nfrom gpufinops.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['--config', {str(config)!r}, 'costs', '--month', '2024-09', '--source', 'focus', "
            "'--path', 's3://focus-bucket/exports/']) == 0\n"
            "print(sorted(m for m in ('pandas', 'pyarrow', 'numpy') if m in sys.modules))")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_excluded_cur_lines_on_s3_are_named_as_on_the_local_disk(aws, tmp_path, tmpdir_env):
    rows = fixture_rows() + [
        line(h(4, 0), "p5.48xlarge", resource="i-neg", cost=-10.0, line_id="neg-1"),
        line(h(4, 1), "p5.48xlarge", resource="i-nan", cost=float("nan"), line_id="nan-1"),
    ]
    local = write_cur_rows(tmp_path / "bad.parquet", rows, row_group_size=4)
    aws.client("s3").create_bucket(Bucket="cur")
    aws.client("s3").put_object(Bucket="cur", Key="data/bad.parquet", Body=local.read_bytes())
    client = s3_client(Settings(aws=AwsSettings(endpoint_url=aws.endpoint_url)))
    for by in GRAINS:
        got = cur_totals("s3://cur/data/", SEP, OCT, FAMILIES, by, s3=client)
        want = cur_totals(str(local), SEP, OCT, FAMILIES, by)
        assert_same_totals(got.table, want.table)
        # The line ids are fetched only now, to name the first excluded line.
        assert got.warnings == [w.replace(str(local), "s3://cur/data/bad.parquet") for w in want.warnings]
        assert "identity_line_item_id=neg-1" in got.warnings[0]
    assert list(tmpdir_env.iterdir()) == []


def test_an_object_replaced_while_it_is_read_is_an_error_not_a_mix_of_two_versions(aws, tmp_path, tmpdir_env):
    local = write_cur_rows(tmp_path / "a.parquet", fixture_rows(), row_group_size=4)
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="cur")
    s3.put_object(Bucket="cur", Key="data/a.parquet", Body=local.read_bytes())
    client = s3_client(Settings(aws=AwsSettings(endpoint_url=aws.endpoint_url)))

    def replace_it(**_):  # the export rewritten between our HEAD and our first GET
        s3.put_object(Bucket="cur", Key="data/a.parquet", Body=write_cur_rows(
            tmp_path / "b.parquet", fixture_rows()[:3]).read_bytes())

    client.client.meta.events.register("after-call.s3.HeadObject", replace_it)
    with pytest.raises(BillingDataError, match=r"s3://cur/data/a\.parquet: the S3 object was replaced while it was "
                                               r"read; run again"):
        cur_totals("s3://cur/data/a.parquet", SEP, OCT, FAMILIES, "instance", s3=client)
    assert list(tmpdir_env.iterdir()) == []


@pytest.mark.parametrize("body, why", [
    (b"line_item_usage_type,cost\nBoxUsage:p5.48xlarge,1\n", "no Parquet footer"),
    (b"PAR1" + b"\0" * 20, "no Parquet footer"),
    (b"xx", "2 bytes"),
])
def test_an_object_that_is_not_parquet_is_named(aws, tmpdir_env, body, why):
    aws.client("s3").create_bucket(Bucket="cur")
    aws.client("s3").put_object(Bucket="cur", Key="data/x.parquet", Body=body)
    client = s3_client(Settings(aws=AwsSettings(endpoint_url=aws.endpoint_url)))
    with pytest.raises(BillingDataError, match=rf"s3://cur/data/x\.parquet: not a readable Parquet file .*{why}"):
        cur_totals("s3://cur/data/", SEP, OCT, FAMILIES, "instance", s3=client)
    assert list(tmpdir_env.iterdir()) == []


def test_a_truncated_parquet_object_is_named(aws, tmp_path, tmpdir_env):
    local = write_cur_rows(tmp_path / "a.parquet", fixture_rows(), row_group_size=4)
    body = local.read_bytes()
    aws.client("s3").create_bucket(Bucket="cur")
    # The footer intact, the front cut: the footer points before the object's start.
    aws.client("s3").put_object(Bucket="cur", Key="data/a.parquet", Body=b"PAR1" + body[len(body) // 2:])
    client = s3_client(Settings(aws=AwsSettings(endpoint_url=aws.endpoint_url)))
    with pytest.raises(BillingDataError, match=r"s3://cur/data/a\.parquet: (not a readable Parquet file|cannot read "
                                               r"the GPU line items)"):
        cur_totals("s3://cur/data/", SEP, OCT, FAMILIES, "instance", s3=client)
    assert list(tmpdir_env.iterdir()) == []
