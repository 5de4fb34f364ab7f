"""Where things live in a store, and how a segment gets there atomically.

<root>/<table>/day=YYYY-MM-DD/<time>-<host>-<pid>-<tag>-<seq>.parquet  (hive-partitioned by day)

The root is a local directory or a URL (`otel_replay.store.location`). Locally a segment is
written under a temporary name that the read glob does not match, fsynced, then renamed into
place, so a reader never sees a partial file and a crash leaves at most a `*.parquet.tmp` that
`cleanup_temp` removes. On object storage it is one PUT of the whole object under its final name.

Many processes on many hosts write into one store without coordinating: a segment's name holds
the writer's clock, host, pid, a random tag drawn once per process (two containers may share a
hostname and a pid, and a PUT silently replaces an object of the same name) and a sequence number.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # pyarrow loads where a segment is written, not where a name is made (capture's import)
    import pyarrow as pa
    import pyarrow.parquet as pq

from otel_replay.store.location import (
    DEFAULT_STORE,
    DIR_MODE,
    FILE_MODE,
    STORE_ENV,
    StoreLike,
    StoreLocation,
    cleanup_local_temp,
    default_location,
)

__all__ = ["DEFAULT_STORE", "DIR_MODE", "FILE_MODE", "STORE_ENV", "StoreLike", "StoreLocation", "cleanup_temp",
           "day_of", "default_root", "segment_name", "write_segment"]

_seq = itertools.count()
_tag: tuple[int, str] = (-1, "")


def default_root() -> StoreLocation:
    """`$OTEL_REPLAY_STORE`, else `./otel-replay-store`."""
    return default_location()


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


def _process_tag() -> str:
    global _tag
    pid = os.getpid()
    if _tag[0] != pid:  # a forked child draws its own
        _tag = (pid, os.urandom(3).hex())  # what secrets.token_hex(3) is, without loading hmac and hashlib
    return _tag[1]


def segment_name() -> str:
    host = socket.gethostname().replace("-", "_")[:32] or "host"
    return f"{time.time_ns()}-{host}-{os.getpid()}-{_process_tag()}-{next(_seq)}.parquet"


# Parquet encodes this many rows before it checks the page size: the default (1024) buffers a
# whole column of large payloads at once (3x the table in memory for 32 KB bodies; 0.8x with 64).
WRITE_BATCH_ROWS = 64
SMALL_ROW_BYTES = 1024  # ... while tables of smaller rows (spans, steps) take the default: fewer, cheaper batches
# Columns whose values are distinct by construction (content addresses, the payloads they address): a
# dictionary of them only grows to its limit and is then thrown away, so they are written plain.
DISTINCT_COLUMNS = frozenset({"hash", "body"})


def write_segment(
    root: StoreLike,
    table: str,
    day: str,
    data: pa.Table,
    *,
    row_group_size: int = 8192,
    sorting_columns: list[pq.SortingColumn] | None = None,
    name: str | None = None,
) -> Path | str:
    """Write `data` as one zstd Parquet segment, atomically. Returns the local path or the URL."""
    produce = parquet_producer(data, row_group_size=row_group_size, sorting_columns=sorting_columns)
    return StoreLocation.of(root).write(segment_rel(table, day, name), produce)


def segment_rel(table: str, day: str, name: str | None = None) -> str:
    """Where a new segment of `table` for `day` goes, relative to the store root."""
    return f"{table}/day={day}/{name or segment_name()}"


def parquet_producer(data: pa.Table, *, row_group_size: int = 8192,
                     sorting_columns: list[pq.SortingColumn] | None = None) -> Callable[[IO[bytes]], None]:
    """A function that writes `data` as the store's Parquet into a binary file object."""

    def produce(handle: IO[bytes]) -> None:
        write_parquet(data, handle, row_group_size=row_group_size, sorting_columns=sorting_columns)

    return produce


def write_pool() -> pa.MemoryPool:
    """The Arrow memory pool that conversions and Parquet writes allocate from: the C allocator's.

    pyarrow's default (mimalloc) hands the pages of a freed batch back to the kernel within
    milliseconds, so every batch the capture writer converts and writes faults them in again, zeroed
    (2 MB huge pages): about 7 % of the writer's CPU under `perf`. glibc's malloc keeps freed memory
    for the next batch. Only this pool is chosen: the process's default pool is left alone.
    """
    import pyarrow as pa

    return pa.system_memory_pool()


def write_parquet(data: pa.Table, handle: Any, *, row_group_size: int = 8192,
                  sorting_columns: list[pq.SortingColumn] | None = None) -> None:
    """`data` as the store's Parquet (zstd, statistics, page checksums) into a binary file object."""
    import pyarrow.parquet as pq

    names = data.column_names
    dictionary = [n for n in names if n not in DISTINCT_COLUMNS] if DISTINCT_COLUMNS.intersection(names) else True
    # the buffers' sizes: `nbytes` (which discounts what slices leave unused) walks every value offset of
    # every chunk, ~10x dearer on a capture batch of many chunks; its tables are never slices
    small = data.get_total_buffer_size() <= SMALL_ROW_BYTES * data.num_rows
    pq.write_table(data, handle, compression="zstd", row_group_size=row_group_size, memory_pool=write_pool(),
                   sorting_columns=sorting_columns, write_statistics=True, use_dictionary=dictionary,  # type: ignore[arg-type]  # a column list works; the stubs say bool
                   write_page_checksum=True,  # lets `otel-replay doctor` catch flipped bits
                   write_batch_size=1024 if small else WRITE_BATCH_ROWS)


def cleanup_temp(root: StoreLike, older_than_s: float = 3600.0) -> int:
    """Remove temp files a crashed local writer left behind; returns how many (remote: none exist)."""
    location = StoreLocation.of(root)
    return cleanup_local_temp(location.local, older_than_s) if location.local is not None else 0
