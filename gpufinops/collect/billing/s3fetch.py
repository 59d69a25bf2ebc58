"""CUR and FOCUS objects on S3 made local for DuckDB, reading only the bytes the totals need (no pandas, no
pyarrow: boto3 only).

DuckDB reads S3 itself only through its httpfs extension, a download at run time, so the totals of an s3://
path (duck.py) run on local files made here, one object at a time:

- Parquet: a sparse file the object's size, with its footer and, for the columns the statements read, each
  column chunk, page index and bloom filter written at their own offsets (ranged GETs, several at once). The
  rest stays a hole that DuckDB never reads, as it reads only the projected columns (reading one would fail
  loudly: a page header of zeros does not parse). At 5 M generated CUR rows 35-40 MiB of the 85 MiB object are
  fetched; a real CUR 2.0 export has several times more columns, all of them left on S3.
- CSV and CSV.gz: the whole object (every byte of a CSV is read anyway), in parallel ranges.

Every GET is conditional on the ETag the object's HEAD gave (If-Match), and every answer's ETag and Content-Range
(the object's total size) must be the HEAD's, for a store or proxy that ignores If-Match: an object replaced while it
is read is an error naming it, never a file stitched from two versions. The copy is deleted once its file is
summed; at most one object's needed bytes are on disk at a time (the temporary folder: $TMPDIR).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from .errors import BillingDataError
from .sources import ParquetSource, s3_base, s3_keys

# One GET asks at most this much; larger ranges are split and fetched side by side.
PART_BYTES = 32 * 1024 * 1024
# Ranges closer than this are fetched as one (a request costs more than this many bytes at S3's latency).
MERGE_GAP_BYTES = 1024 * 1024
PARALLEL_GETS = 8
FOOTER_GUESS_BYTES = 64 * 1024  # the first read of a Parquet object: its tail, most footers fit
_CHUNK = 1024 * 1024  # streamed from a GET's body to disk at a time
REPLACED = "{name}: the S3 object was replaced while it was read; run again"


@dataclass(frozen=True)
class S3Client:
    """A boto3 S3 client (thread-safe) as a ParquetSource's filesystem: marks an object duck.py makes local."""
    client: Any


def s3_client(settings) -> S3Client:
    from ..aws_config import read_client

    return S3Client(read_client(settings, "s3", settings.aws.regions[0]))


def s3_client_for(settings, path: str) -> S3Client | None:
    """The S3 client an s3:// path is read with; None for a local path (no AWS SDK imported)."""
    return s3_client(settings) if path.startswith("s3://") else None


def list_objects(path: str, s3: S3Client, suffixes: Sequence[str], kind: str) -> list[ParquetSource]:
    """The objects of an s3:// path (one object, a prefix as a folder, or a glob), as sources.list_files names
    local ones."""
    from botocore.exceptions import BotoCoreError, ClientError

    base, _ = s3_base(path)
    bucket, _, prefix = base.partition("/")
    keys: list[str] = []
    try:
        for page in s3.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [f"{bucket}/{o['Key']}" for o in page.get("Contents", ())]
    except (BotoCoreError, ClientError) as exc:
        raise BillingDataError(f"{path}: cannot list the S3 objects: {exc}") from None
    exact = bool(prefix) and base in keys
    under = [k for k in keys if not prefix or k.startswith(base + "/")]
    return [ParquetSource(f"s3://{k}", k, s3) for k in s3_keys(path, exact, under, tuple(suffixes), kind)]


def local_copies(files: Sequence[ParquetSource], columns: Sequence[str]) -> Iterator[ParquetSource]:
    """Each of `files` readable on the local disk, in order, under its own name (messages still say s3://...):
    local files as they are, S3 objects copied (Parquet: the footer and `columns` only; `fetch_columns` adds
    more) and deleted when the caller asks for the next or stops."""
    for src in files:
        if not isinstance(src.filesystem, S3Client):
            yield src
            continue
        with _local_copy(src, columns) as local:
            yield local


@contextlib.contextmanager
def _local_copy(src: ParquetSource, columns: Sequence[str]) -> Iterator[ParquetSource]:
    folder = tempfile.mkdtemp(prefix="gpufinops-s3-")
    try:
        # A fixed name (a key is any text), with the suffix DuckDB reads the compression from.
        suffix = next((x for x in (".parquet", ".csv.gz", ".csv") if src.name.lower().endswith(x)), "")
        obj = _Object(src, os.path.join(folder, "object" + suffix))
        obj.copy(columns)
        yield ParquetSource(src.name, obj.local, fetch_columns=obj.add_columns if obj.parquet else None)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class _Object:
    """One S3 object read by ranges, every range pinned to the ETag of its HEAD."""

    def __init__(self, src: ParquetSource, local: str) -> None:
        self.name, self.local = src.name, local
        self.client = src.filesystem.client
        self.bucket, _, self.key = src.path.partition("/")
        self.parquet = src.name.lower().endswith(".parquet")
        self.etag: str | None = None
        self.size = 0
        self.tail_start = 0  # a Parquet object's bytes from here on are in the copy (the footer and before it)
        self.columns: set[str] = set()

    def copy(self, columns: Sequence[str]) -> None:
        """The local copy: a `.parquet` object's footer and `columns`, any other object whole (one named
        directly whatever its name is read whole, Parquet or not)."""
        with self._open(os.O_CREAT | os.O_TRUNC) as fd:
            if self.parquet:
                self._parquet(fd, columns)
            else:
                self._whole(fd)

    def add_columns(self, columns: Sequence[str]) -> None:
        """More columns of a Parquet object into its copy (those not fetched yet)."""
        wanted = [c for c in columns if c.lower() not in self.columns]
        if wanted:
            with self._open(0) as fd:
                self._fetch_columns(fd, wanted)

    @contextlib.contextmanager
    def _open(self, flags: int) -> Iterator[int]:
        try:
            fd = os.open(self.local, os.O_WRONLY | flags, 0o600)
        except OSError as exc:
            raise BillingDataError(f"{self.name}: cannot copy it to {self.local}: {exc.strerror}") from None
        try:
            yield fd
        except OSError as exc:  # the temporary folder full or unwritable
            raise BillingDataError(f"{self.name}: cannot copy it to {self.local}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ what to fetch

    def _whole(self, fd: int) -> None:
        self._head()
        os.ftruncate(fd, self.size)
        self._fetch(fd, [(0, self.size)] if self.size else [])

    def _parquet(self, fd: int, columns: Sequence[str]) -> None:
        self._head()
        if self.size < 12:
            raise BillingDataError(f"{self.name}: not a readable Parquet file (truncated or not Parquet?): "
                                   f"{self.size} bytes")
        os.ftruncate(fd, self.size)
        tail_start = max(0, self.size - FOOTER_GUESS_BYTES)
        tail = self._get(tail_start, self.size)
        if tail[-4:] != b"PAR1":
            raise BillingDataError(f"{self.name}: not a readable Parquet file (truncated or not Parquet?): "
                                   "no Parquet footer")
        footer_len = struct.unpack("<I", tail[-8:-4])[0]
        footer_start = self.size - 8 - footer_len
        if footer_start < 4:
            raise BillingDataError(f"{self.name}: not a readable Parquet file (truncated or not Parquet?): "
                                   "footer longer than the file")
        if footer_start < tail_start:
            tail = self._get(footer_start, tail_start) + tail
            tail_start = footer_start
        os.pwrite(fd, tail, tail_start)
        self.tail_start = tail_start
        self._fetch_columns(fd, columns)

    def _fetch_columns(self, fd: int, columns: Sequence[str]) -> None:
        try:
            needed = _column_ranges(self.local, columns)
        except BillingDataError as exc:
            raise BillingDataError(f"{self.name}: not a readable Parquet file (truncated or not Parquet?): "
                                   f"{exc}") from None
        # What lies in the tail already read is not asked again.
        self._fetch(fd, _merged((lo, min(hi, self.tail_start)) for lo, hi in needed if lo < self.tail_start))
        self.columns |= {c.lower() for c in columns}

    def _head(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key)
        except (BotoCoreError, ClientError) as exc:
            raise BillingDataError(f"{self.name}: cannot read the S3 object: {exc}") from None
        if not head.get("ETag"):  # every range is pinned to it: without one, versions cannot be told apart
            raise BillingDataError(f"{self.name}: the S3 object's HEAD gave no ETag: cannot tell it is read as one "
                                   "version")
        self.etag, self.size = head["ETag"], int(head["ContentLength"])

    # ------------------------------------------------------------------ GETs

    def _get(self, start: int, end: int, fd: int | None = None) -> bytes:
        """Bytes [start, end) of the object, as its first-read version: returned, or with `fd` written at
        their offsets as they arrive (1 MiB held at a time)."""
        from botocore.exceptions import BotoCoreError, ClientError

        got, kept = 0, []
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes={start}-{end - 1}",
                                            IfMatch=self.etag)
            body = answer["Body"]
            with contextlib.closing(body):
                self._check_answer(answer, start, end)
                while chunk := body.read(_CHUNK):
                    if fd is None:
                        kept.append(chunk)
                    else:
                        os.pwrite(fd, chunk, start + got)
                    got += len(chunk)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                raise BillingDataError(REPLACED.format(name=self.name)) from None
            raise BillingDataError(f"{self.name}: cannot read the S3 object: {exc}") from None
        except BotoCoreError as exc:
            raise BillingDataError(f"{self.name}: cannot read the S3 object: {exc}") from None
        if got != end - start:
            raise BillingDataError(f"{self.name}: the S3 object answered {got} bytes for a range of {end - start}")
        return b"".join(kept)

    def _check_answer(self, answer: dict, start: int, end: int) -> None:
        """A ranged GET's answer is the version the HEAD gave (its ETag, its total size in Content-Range) and
        the bytes asked for: a store or proxy that ignores If-Match answers a newer version without a 412."""
        if not answer.get("ETag"):
            raise BillingDataError(f"{self.name}: the S3 object answered a range without its ETag: cannot tell it "
                                   "is the version its HEAD gave")
        content_range = (answer.get("ContentRange") or "").strip()
        m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", content_range)
        if answer.get("ETag") != self.etag or (m and m[3] not in ("*", str(self.size))):
            raise BillingDataError(REPLACED.format(name=self.name))
        if content_range and not (m and (int(m[1]), int(m[2]) + 1) == (start, end)):
            raise BillingDataError(f"{self.name}: the S3 object answered {content_range!r} for the bytes "
                                   f"{start}-{end - 1}")

    def _fetch(self, fd: int, ranges: Sequence[tuple[int, int]]) -> None:
        """The byte ranges into `fd`, split into parts of at most PART_BYTES, PARALLEL_GETS at a time."""
        parts = [(lo, min(hi, lo + PART_BYTES)) for lo0, hi in ranges for lo in range(lo0, hi, PART_BYTES)]
        if len(parts) <= 1:
            for lo, hi in parts:
                self._get(lo, hi, fd)
            return
        from concurrent.futures import ThreadPoolExecutor  # here: a local path's totals never fetch

        with ThreadPoolExecutor(min(PARALLEL_GETS, len(parts)), thread_name_prefix="s3-range") as pool:
            try:
                for f in [pool.submit(self._get, lo, hi, fd) for lo, hi in parts]:
                    f.result()
            except BaseException:
                pool.shutdown(cancel_futures=True)  # the first failure ends the copy: no more GETs
                raise


def _column_ranges(local: str, columns: Sequence[str]) -> list[tuple[int, int]]:
    """[start, end) of every byte DuckDB reads for `columns` of the Parquet file whose footer is in place at
    `local`: each column chunk (dictionary and data pages), its bloom filter, column index and offset index."""
    import duckdb  # its own connection: the footer's metadata needs no settings (and duck.py imports this module)

    wanted = {c.lower() for c in columns}  # DuckDB binds column names without regard to case
    con = duckdb.connect()
    try:
        rows = con.execute(
            "SELECT path_in_schema, dictionary_page_offset, data_page_offset, total_compressed_size, "
            "bloom_filter_offset, bloom_filter_length, column_index_offset, column_index_length, "
            "offset_index_offset, offset_index_length FROM parquet_metadata(?)", [local]).fetchall()
    except Exception as exc:  # duckdb.Error: a footer DuckDB cannot parse
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BillingDataError(f"its footer: {text}") from None
    finally:
        con.close()
    ranges = []
    for path, dict_off, data_off, size, *extras in rows:
        top = path.split(", ", 1)[0]  # a nested column (resource_tags' key and value) under its top name
        if top.lower() not in wanted:
            continue
        start = min(o for o in (dict_off, data_off) if o is not None)
        ranges.append((start, start + size))
        for off, length in zip(extras[::2], extras[1::2]):
            if off is not None and length:
                ranges.append((off, off + length))
    return ranges


def _merged(ranges) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + MERGE_GAP_BYTES:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]
