"""S3 billing totals against a store that ignores If-Match (issue 35, item 5): a real moto S3 server behind the
fault proxy, which strips If-Match from every GET, and the CUR object replaced mid-read by one of the same byte
layout (same size, same footer, other costs). Without a 412 to tell, only each ranged answer's ETag and
Content-Range can: the command is an error naming the object, and prints no totals (neither version's, nor a
mix of both)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from gpufinops.cli import main
from gpufinops.collect.billing.s3fetch import FOOTER_GUESS_BYTES
from gpufinops.collect.billing.synth import line, write_cur_rows

from tests.collect.test_billing_cur import h
from tests.collect.test_billing_s3_totals import tmpdir_env  # noqa: F401 - a fixture: $TMPDIR of the copies
from tests.faults.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

BUCKET, KEY = "cur-exports", "cur/data/2024-09.parquet"
S3_PATH = f"s3://{BUCKET}/{KEY}"
LINES = 2000


def _export(path: Path, cost: float) -> bytes:
    """LINES GPU line items of `cost` each. Uncompressed, plain, without statistics: two exports that differ only
    in their costs lie at the same byte offsets, footer included (a rate's text keeps its length)."""
    rows = [line(h(2 + i % 20, i % 24), "p4d.24xlarge", resource=f"i-{i % 7:04d}", cost=cost, tags={"user_team": "ml"},
                 line_id=f"line-{i:06d}") for i in range(LINES)]
    write_cur_rows(path, rows, compression="none", use_dictionary=False, write_statistics=False)
    return path.read_bytes()


def _is_get(req) -> bool:
    return req.method == "GET" and req.route == f"/{BUCKET}/{KEY}"


def _is_head(req) -> bool:
    return req.method == "HEAD" and req.route == f"/{BUCKET}/{KEY}"


@pytest.fixture
def s3_behind_proxy(aws):
    proxy = FaultProxy(aws.endpoint_url, "s3").start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.mark.parametrize("replaced_after", ["head", "footer_get"])
def test_an_object_replaced_mid_read_behind_a_store_that_ignores_if_match_is_an_error(
        aws, s3_behind_proxy, tmp_path, tmpdir_env, replaced_after):
    proxy = s3_behind_proxy
    before, after = _export(tmp_path / "before.parquet", 1.25), _export(tmp_path / "after.parquet", 2.25)
    # The case itself: the same layout, other bytes, and large enough that the columns lie before the first read
    # (the footer's tail), so they are fetched by later ranged GETs.
    assert len(before) == len(after) and before != after and len(before) > 2 * FOOTER_GUESS_BYTES
    footer = 8 + int.from_bytes(before[-8:-4], "little")
    assert before[-footer:] == after[-footer:]
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=before)

    def replace(_req) -> None:
        s3.put_object(Bucket=BUCKET, Key=KEY, Body=after)

    # The replacement once the HEAD (or the footer's GET) has been answered; every GET reaches moto without If-Match.
    proxy.arm("hook", _is_head if replaced_after == "head" else _is_get, times=1, hook=replace, after=True,
              forward=True)
    proxy.arm("strip", _is_get, drop=("If-Match",))
    config = tmp_path / "gpufinops.yaml"
    config.write_text(f"aws:\n  endpoint_url: {proxy.url}\n")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--config", str(config), "costs", "--month", "2024-09", "--source", "cur", "--path", S3_PATH,
                     "--by", "team", "-o", "json"])

    assert code != 0
    assert f"{S3_PATH}: the S3 object was replaced while it was read; run again" in err.getvalue()
    assert out.getvalue() == ""  # no totals: not the old version's, not the new one's, not a mix
    # The fault was real: the client asked If-Match, moto never saw it, and a ranged GET met the new version.
    stripped = [f for f in proxy.reached(_is_get) if f.fault == "strip"]
    assert stripped and all("if-match" not in {k.lower() for k in f.request.headers} for f in stripped)
    assert all(any(k.lower() == "if-match" for k in r.headers) for r in proxy.seen if _is_get(r))
    assert s3.get_object(Bucket=BUCKET, Key=KEY)["Body"].read() == after
    assert list(tmpdir_env.iterdir()) == []  # the partial copy deleted


def test_the_same_store_gives_the_totals_when_nothing_changes(aws, s3_behind_proxy, tmp_path):
    """The check refuses only another version: through the same If-Match-stripping proxy, an object left alone
    is summed (LINES lines of $1.25 for team ml)."""
    proxy = s3_behind_proxy
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=_export(tmp_path / "before.parquet", 1.25))
    proxy.arm("strip", _is_get, drop=("If-Match",))
    config = tmp_path / "gpufinops.yaml"
    config.write_text(f"aws:\n  endpoint_url: {proxy.url}\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--config", str(config), "costs", "--month", "2024-09", "--source", "cur", "--path", S3_PATH,
                     "--by", "team", "-o", "json"]) == 0
    import json

    rows = json.loads(out.getvalue())
    assert len(proxy.reached(_is_get)) > 1  # the footer's tail, then the columns
    assert [(r["team"], round(r["cost"], 2)) for r in rows] == [("ml", LINES * 1.25)]
