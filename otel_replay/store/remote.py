"""What DuckDB reads a remote store through: one snapshot, served with as few requests as it can.

Left to itself, DuckDB asks an fsspec filesystem for `glob`, `info` and `modified` of every file
on every bind and opens each file several times per query: about ten metadata requests per
segment and connection, each a round trip to the object store, and it reads the same footer
again on every open. Segments are immutable and their names unique, so what the snapshot's
listing already says about a segment (it exists, its size) is answered from memory, and its
bytes are fetched in blocks, each at most once per connection (a compacted day read for one
trace still fetches only the footer and the row groups the trace id's statistics select).

Why caching bytes for one connection keeps compaction's guarantee (`snapshot`): a reader must
fail to read an input that a compaction deleted before the reader listed the manifests. Bytes
are fetched after the connection's snapshot was taken (so after that listing); a fetch that
succeeds proves the segment still existed then, which is all the argument needs.
"""

from __future__ import annotations

import datetime as dt
import io
import threading
from collections.abc import Iterable
from typing import Any

from fsspec import AbstractFileSystem

BLOCK_BYTES = 2 * 1024 * 1024  # one ranged GET; a small segment is one block
CACHE_BYTES = 256 * 1024 * 1024  # bytes one connection keeps
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MAGIC = frozenset("*?[")


class SnapshotFS(AbstractFileSystem):
    """An fsspec filesystem over another one, knowing the sizes of one snapshot's segments."""

    cachable = False  # one per connection: never shared through fsspec's instance cache

    def __init__(self, fs: Any) -> None:
        super().__init__()
        self.fs = fs
        self.protocol = fs.protocol
        self._sizes: dict[str, int] = {}  # path as the filesystem names it -> bytes
        self._blocks: dict[tuple[str, int], bytes] = {}
        self._cached = 0
        self._lock = threading.Lock()

    @classmethod
    def over(cls, fs: Any, paths_and_sizes: Iterable[tuple[str, int]]) -> SnapshotFS:
        snapshot = cls(fs)  # (fsspec tokenizes constructor arguments: keep the listing out of them)
        snapshot._sizes = dict(paths_and_sizes)
        return snapshot

    def _key(self, path: str) -> str:
        return self.fs._strip_protocol(path)  # noqa: SLF001 - the wrapped filesystem's own rule

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        key = self._key(path)
        size = self._sizes.get(key)
        if size is not None:
            return {"name": key, "size": size, "type": "file"}
        return self.fs.info(path, **kwargs)

    def size(self, path: str) -> int:
        return int(self.info(path)["size"])

    def modified(self, path: str) -> dt.datetime:
        """Segments never change, so a known one needs no request."""
        return _EPOCH if self._key(path) in self._sizes else self.fs.modified(path)

    def exists(self, path: str, **kwargs: Any) -> bool:
        return self._key(path) in self._sizes or self.fs.exists(path, **kwargs)

    def glob(self, path: str, **kwargs: Any) -> Any:
        key = self._key(path)
        if key in self._sizes and not _MAGIC & set(key):
            return [key]
        return self.fs.glob(path, **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self.fs.ls(path, detail=detail, **kwargs)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        key = self._key(path)
        size = self._sizes.get(key)
        if mode != "rb" or size is None:
            return self.fs.open(path, mode, **kwargs)
        return _BlockFile(self, path, size)

    def prefetch(self, *, whole: bool = False) -> None:
        """Fetch blocks ahead, concurrently where the filesystem can (s3fs, gcsfs): every segment
        that fits one block (its footer is in it) or, with `whole`, every block of every segment.
        A segment gone meanwhile is skipped here and fails when read (the reader retries)."""
        wanted = [(key, i, size) for key, size in self._sizes.items() if whole or size <= BLOCK_BYTES
                  for i in range(max(1, -(-size // BLOCK_BYTES)))]
        budget, chosen = CACHE_BYTES - self._cached, []
        for key, i, size in wanted:
            length = min(size, (i + 1) * BLOCK_BYTES) - i * BLOCK_BYTES
            if (key, i) in self._blocks or length > budget:
                continue
            budget -= length
            chosen.append((key, i, size))
        if not chosen:
            return
        datas = self.fs.cat_ranges([k for k, _, _ in chosen], [i * BLOCK_BYTES for _, i, _ in chosen],
                                   [min(size, (i + 1) * BLOCK_BYTES) for _, i, size in chosen], on_error="return")
        with self._lock:
            for (key, i, _), data in zip(chosen, datas, strict=True):
                if isinstance(data, bytes) and self._cached + len(data) <= CACHE_BYTES:
                    self._blocks[key, i] = data
                    self._cached += len(data)

    def block(self, path: str, size: int, index: int) -> bytes:
        """Block `index` of a segment: from this connection's cache, else one ranged read."""
        key = (self._key(path), index)
        with self._lock:
            data = self._blocks.get(key)
        if data is None:
            data = self._fetch(path, index * BLOCK_BYTES, min(size, (index + 1) * BLOCK_BYTES))
            with self._lock:
                if self._cached + len(data) <= CACHE_BYTES:
                    self._blocks[key] = data
                    self._cached += len(data)
        return data

    def _fetch(self, path: str, start: int, end: int) -> bytes:
        """One ranged read (FileNotFoundError if a compaction removed the segment: the reader retries)."""
        try:
            return self.fs.cat_file(path, start=start, end=end)
        except FileNotFoundError:
            raise
        except OSError:  # a filesystem whose ranged cat cannot seek (fsspec's ArrowFSWrapper): open, seek, read
            with self.fs.open(path, "rb") as handle:
                handle.seek(start)
                return handle.read(end - start)


class _BlockFile(io.RawIOBase):
    """A read-only, seekable view of one segment, served in blocks by its `SnapshotFS`."""

    def __init__(self, owner: SnapshotFS, path: str, size: int) -> None:
        super().__init__()
        self.owner, self.path, self.size, self.pos = owner, path, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self.size, self.pos + len(view))
        done = 0
        while self.pos < end:
            index, offset = divmod(self.pos, BLOCK_BYTES)
            data = self.owner.block(self.path, self.size, index)[offset:offset + end - self.pos]
            if not data:
                break
            view[done:done + len(data)] = data
            done += len(data)
            self.pos += len(data)
        return done
