"""Which files a billing path names: a file, a folder, a glob or an s3:// prefix (no pandas, no pyarrow
unless the path is on S3)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .errors import BillingDataError


@dataclass(frozen=True)
class ParquetSource:
    name: str  # what messages call it: the local path or s3://bucket/key
    path: str  # its path in `filesystem`
    filesystem: Any = None  # a pyarrow.fs.FileSystem or an s3fetch.S3Client; None: the local disk
    # A partial local copy of an S3 object (s3fetch): fetches more columns into it.
    fetch_columns: Callable[[Sequence[str]], None] | None = None


GLOB_CHARS = "*?["


def list_parquet(path: str, filesystem: Any = None) -> list[ParquetSource]:
    """The Parquet files of a file, a folder or an s3:// prefix (a folder-like prefix or one object)."""
    return list_files(path, filesystem, (".parquet",), ".parquet")


def list_files(path: str, filesystem: Any, suffixes: Sequence[str],
               kind: str) -> list[ParquetSource]:
    """The files ending in one of `suffixes` of a file, a folder, a glob (`*`, `?`, `[...]`) or an s3:// prefix,
    sorted by name. One file named directly is taken whatever its name ends with."""
    if path.startswith("s3://"):
        if filesystem is None:
            raise BillingDataError(f"{path}: an S3 filesystem is needed to read s3:// paths")
        return _list_s3(path, filesystem, tuple(suffixes), kind)
    if any(ch in path for ch in GLOB_CHARS):
        import glob

        files = sorted(Path(f) for f in glob.glob(path, recursive=True) if Path(f).is_file())
        if not files:
            raise BillingDataError(f"{path}: no file matches this pattern")
        return [ParquetSource(str(f), str(f)) for f in files]
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.lower().endswith(tuple(suffixes)))
        if not files:
            raise BillingDataError(f"{path}: no {' / '.join(suffixes)} files in this folder")
        return [ParquetSource(str(f), str(f)) for f in files]
    if not p.exists():
        raise BillingDataError(f"{path}: no such file")
    return [ParquetSource(str(p), str(p))]


def _list_s3(path: str, fs: Any, suffixes: tuple[str, ...], kind: str) -> list[ParquetSource]:
    """Through pyarrow's S3 filesystem (the cost-table readers)."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    base, _ = s3_base(path)
    try:
        info = fs.get_file_info(base)
        exact = info.type == pafs.FileType.File
        under = ([i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
                  if i.type == pafs.FileType.File] if info.type == pafs.FileType.Directory else [])
    except (OSError, pa.ArrowException) as exc:
        raise BillingDataError(f"{path}: cannot list the S3 objects: {exc}") from None
    return [ParquetSource(f"s3://{k}", k, fs) for k in s3_keys(path, exact, under, suffixes, kind)]


def s3_base(path: str) -> tuple[str, str | None]:
    """(the `bucket/prefix` to list, the `bucket/key` glob pattern or None) of an s3:// path: a pattern is
    listed from the folder before its first wildcard."""
    base = path[len("s3://"):].rstrip("/")
    if not any(ch in base for ch in GLOB_CHARS):
        return base, None
    cut = min(base.find(ch) for ch in GLOB_CHARS if ch in base)
    return base[:cut].rsplit("/", 1)[0], base


def s3_keys(path: str, exact: bool, under: Sequence[str], suffixes: tuple[str, ...], kind: str) -> list[str]:
    """The `bucket/key`s an s3:// path names, sorted: `exact` when an object is named by the path's base
    itself, `under`: the objects below it as a folder. One object named directly is taken whatever its name
    ends with; a pattern matches whole keys; a folder keeps the objects ending in one of `suffixes`."""
    import fnmatch

    _, pattern = s3_base(path)
    if pattern is not None:
        keys = sorted(k for k in under if fnmatch.fnmatchcase(k, pattern))
    elif exact:
        keys = [s3_base(path)[0]]
    else:
        keys = sorted(k for k in under if k.lower().endswith(suffixes))
    if not keys:
        raise BillingDataError(f"{path}: no {kind} objects under this prefix")
    return keys
