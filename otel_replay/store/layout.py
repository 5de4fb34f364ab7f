"""Where things live in a store directory, and how a segment gets there atomically.

<root>/<table>/day=YYYY-MM-DD/<time>-<host>-<pid>-<seq>.parquet  (hive-partitioned by day)

A segment is written under a temporary name that the read glob does not match, fsynced, then
renamed into place, so a reader never sees a partial file and a crash leaves at most a
`*.parquet.tmp` that `cleanup_temp` removes.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import socket
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DEFAULT_STORE = "otel-replay-store"
STORE_ENV = "OTEL_REPLAY_STORE"
DIR_MODE = 0o700
FILE_MODE = 0o600
_seq = itertools.count()


def default_root() -> Path:
    """`$OTEL_REPLAY_STORE`, else `./otel-replay-store`."""
    return Path(os.environ.get(STORE_ENV) or DEFAULT_STORE)


_NS_PER_DAY = 86_400 * 10**9
_days: dict[int, str] = {}


def day_of(time_ns: int | None) -> str:
    """The UTC day (YYYY-MM-DD) of a time; now for None or a time out of range."""
    day = (time_ns if time_ns else time.time_ns()) // _NS_PER_DAY
    text = _days.get(day)
    if text is None:
        try:
            text = (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()
        except (OverflowError, ValueError):
            return day_of(None)
        if len(_days) > 4096:
            _days.clear()
        _days[day] = text
    return text


def table_glob(root: Path, table: str) -> str:
    return str(root / table / "*" / "*.parquet")


def has_segments(root: Path, table: str) -> bool:
    return any((root / table).glob("*/*.parquet"))


def segment_name() -> str:
    host = socket.gethostname().replace("-", "_")[:32] or "host"
    return f"{time.time_ns()}-{host}-{os.getpid()}-{next(_seq)}.parquet"


def ensure_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)


def write_segment(
    root: Path,
    table: str,
    day: str,
    data: pa.Table,
    *,
    row_group_size: int = 8192,
    sorting_columns: list[pq.SortingColumn] | None = None,
    name: str | None = None,
) -> Path:
    """Write `data` as one zstd Parquet segment: temp name, fsync, rename. Returns the path."""
    directory = root / table / f"day={day}"
    ensure_dir(directory)
    final = directory / (name or segment_name())
    temp = directory / f".{final.stem}.parquet.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as handle:
            pq.write_table(
                data, handle, compression="zstd", row_group_size=row_group_size,
                sorting_columns=sorting_columns, write_statistics=True,
            )
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return final


def cleanup_temp(root: Path, older_than_s: float = 3600.0) -> int:
    """Remove temp files a crashed writer left behind; returns how many."""
    removed = 0
    cutoff = time.time() - older_than_s
    for path in root.glob("*/*/.*.parquet.tmp"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except OSError:
            continue
    return removed
