"""Which files a billing path names: a file, a folder, a glob or an s3:// prefix (no pandas, no pyarrow
unless the path is on S3)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .errors import BillingDataError


@dataclass(frozen=True)
class ParquetSource:
    name: str  # what messages call it: the local path or s3://bucket/key
    path: str  # its path in `filesystem`
    filesystem: Any = None  # a pyarrow.fs.FileSystem; None: the local disk


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
    import pyarrow as pa
    import pyarrow.fs as pafs

    base = path[len("s3://"):].rstrip("/")
    pattern = None
    if any(ch in base for ch in GLOB_CHARS):  # list the prefix before the first wildcard, then match
        import fnmatch

        pattern = base
        cut = min(base.find(ch) for ch in GLOB_CHARS if ch in base)
        base = base[:cut].rsplit("/", 1)[0]
    try:
        info = fs.get_file_info(base)
        if info.type == pafs.FileType.File and pattern is None:
            infos = [info]
        elif info.type == pafs.FileType.Directory:
            infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
        else:
            infos = []
    except (OSError, pa.ArrowException) as exc:
        raise BillingDataError(f"{path}: cannot list the S3 objects: {exc}") from None
    if pattern is not None:
        keys = sorted(i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatchcase(i.path, pattern))
    elif len(infos) == 1 and infos[0].path == base:  # one object named directly
        keys = [base]
    else:
        keys = sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.lower().endswith(suffixes))
    if not keys:
        raise BillingDataError(f"{path}: no {kind} objects under this prefix")
    return [ParquetSource(f"s3://{k}", k, fs) for k in keys]
