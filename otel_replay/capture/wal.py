"""The write-ahead log of `collect --durable`: request bodies on disk, fsynced, before the answer.

Layout: one directory per process that accepts requests (the receiver, or each of its workers),
`<store>/_wal/<owner>/`, holding `lock` (an flock its owner holds while it lives, released by the
kernel however it dies) and segments `00000001.wal`, `00000002.wal`, ... A segment is a run of
records, each a 16-byte header (magic `OWAL`, version, flags: logs / JSON, payload length, crc32
of the header's first 12 bytes and the payload) and the request body as the receiver read it
(decompressed). Appends are serialized by one lock; each appender then waits until an fdatasync
covers its record, and one thread at a time syncs everything written so far (group commit): the
requests that arrive while a sync runs share the next one. A sync that fails poisons the records
it covered (their requests get an error, never an acknowledgement, even if a later sync passes).

A write that fails is cut off again (ftruncate) and the segment sealed, so a segment never holds
a bad record before a good one; a reader stops at the first record that is short or fails its
checksum (the tail of a write that a kill cut short, never acknowledged). A directory whose lock
nobody holds was left by a process that died: `claim_orphans` takes its lock so its records can be
replayed. A new directory is made and locked under a dot name, then renamed: a claim never sees it
unlocked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_replay.capture.receiver_decode import LOGS, TRACES
from otel_replay.store.location import DIR_MODE, FILE_MODE

WAL_DIR = "_wal"
LOCK_NAME = "lock"
SUFFIX = ".wal"
MAGIC = b"OWAL"
VERSION = 1
SEGMENT_BYTES = 64 * 1024 * 1024  # a segment is sealed at this size (or by age, `receiver_durable`)
MAX_RECORD_BYTES = 2047 * 1024 * 1024  # the receiver's largest body (--max-body-mb 2047)
_PREFIX = struct.Struct("<4sBBHI")  # magic, version, flags, reserved, payload length
_HEADER_BYTES = _PREFIX.size + 4  # + crc32
_FLAG_LOGS, _FLAG_JSON = 1, 2
_MAX_POISONED = 1024  # failed syncs remembered (a waiter is never older than the last few)


@dataclass(frozen=True, slots=True)
class WalRecord:
    """One logged request: its signal, whether its body is JSON, and the body."""

    signal: str
    as_json: bool
    body: bytes


def _header(signal: str, as_json: bool, body: bytes | memoryview) -> bytes:
    flags = (_FLAG_LOGS if signal == LOGS else 0) | (_FLAG_JSON if as_json else 0)
    prefix = _PREFIX.pack(MAGIC, VERSION, flags, 0, len(body))
    return prefix + struct.pack("<I", zlib.crc32(body, zlib.crc32(prefix)))


class Segment:
    """A segment file: being appended to, then sealed (closed, every byte synced or poisoned)."""

    __slots__ = ("fd", "has_logs", "note", "opened_at", "path", "pending", "records", "sealed_at", "size")

    def __init__(self, path: Path, fd: int, note: Any) -> None:
        self.path, self.fd, self.note = path, fd, note
        self.size = self.records = self.pending = 0  # pending: appended, not yet queued by their request
        self.has_logs = False
        self.opened_at = time.monotonic()
        self.sealed_at: float | None = None


class WriteAheadLog:
    """Appends with group commit into the segments of one locked directory.

    :param directory: this owner's directory (created and locked here; `claim_orphans` skips it).
    :param segment_bytes: a segment is sealed once it is this large.
    :param on_segment: called (under the log's lock) as each segment opens; its value is kept as
        `Segment.note` (the durable receiver notes the writer's loss counter there).
    """

    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES,
                 on_segment: Callable[[], Any] | None = None) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._on_segment = on_segment or (lambda: None)
        self._lock_fd = _make_locked_dir(directory)
        self._cond = threading.Condition()
        self._current: Segment | None = None
        self._sealed: list[Segment] = []
        self._next = 1
        self._written = self._synced = 0  # bytes appended / covered by a sync that succeeded, across segments
        self._poisoned: list[tuple[int, int]] = []  # (after, upto]: bytes a failed sync covered
        self._syncing = False
        self._closed = False
        self.syncs = 0
        """fdatasync calls made (fewer than records: group commit)."""
        self.records = 0
        """Records appended and synced."""

    # -- appending -----------------------------------------------------------------------------
    def append(self, signal: str, as_json: bool, body: bytes | memoryview) -> Segment:
        """Write one record and return once an fdatasync covers it; raises OSError if it may not be
        on disk (the record's segment is then sealed). The caller `release`s the returned segment
        once the request's records are queued (a sealed segment is removed only after that)."""
        header = _header(signal, as_json, body)
        with self._cond:
            if self._closed:
                raise OSError(errno.ESHUTDOWN, "the write-ahead log is closed")
            segment = self._current or self._open()
            start = segment.size
            try:
                _write_all(segment.fd, header)
                _write_all(segment.fd, body)
            except OSError:
                self._cut(segment, start)
                raise
            size = len(header) + len(body)
            segment.size += size
            segment.records += 1
            segment.pending += 1
            segment.has_logs |= signal == LOGS
            self._written += size
            target = self._written
        try:
            self._wait_synced(target)
        except OSError:
            self.release(segment)
            raise
        with self._cond:
            self.records += 1
            if segment is self._current and segment.size >= self.segment_bytes:
                self._seal_locked()
        return segment

    def release(self, segment: Segment) -> None:
        """The request of one record in `segment` has queued its records (or given up)."""
        with self._cond:
            segment.pending -= 1

    def _open(self) -> Segment:
        path = self.directory / f"{self._next:08d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        self._next += 1
        try:
            _fsync_dir(self.directory)  # the new name survives a power loss too
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        self._current = Segment(path, fd, self._on_segment())
        return self._current

    def _cut(self, segment: Segment, start: int) -> None:
        """A write failed part way: drop its bytes and seal the segment (later records go to a new one)."""
        with contextlib.suppress(OSError):  # else the reader stops at the bad record: nothing good follows it here
            os.ftruncate(segment.fd, start)
        self._seal_locked()

    def _wait_synced(self, target: int) -> None:
        with self._cond:
            while True:
                if any(after < target <= upto for after, upto in self._poisoned):
                    raise OSError(errno.EIO, "fdatasync of the write-ahead log failed")
                if self._synced >= target:
                    return
                if self._syncing or self._current is None:  # a seal syncs what it closes
                    self._cond.wait(0.5)
                    continue
                segment, after, upto = self._current, self._synced, self._written
                self._syncing = True
                self._cond.release()
                try:
                    os.fdatasync(segment.fd)
                    failed = False
                except OSError:
                    failed = True
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    self.syncs += 1
                if failed:
                    self._poison(after, upto)
                    if segment is self._current:
                        self._seal_locked()
                else:
                    self._synced = max(self._synced, upto)
                self._cond.notify_all()

    def _poison(self, after: int, upto: int) -> None:
        self._poisoned.append((after, upto))
        del self._poisoned[:-_MAX_POISONED]

    # -- sealing -------------------------------------------------------------------------------
    def seal(self, older_than_s: float = 0.0) -> None:
        """Seal the current segment if it holds a record and is at least `older_than_s` old."""
        with self._cond:
            segment = self._current
            if segment is not None and segment.records and time.monotonic() - segment.opened_at >= older_than_s:
                self._seal_locked()

    def _seal_locked(self) -> None:
        segment = self._current
        if segment is None:
            return
        while self._syncing:  # the sync in flight uses this segment's descriptor
            self._cond.wait()
        self._current = None
        try:
            if self._written > self._synced:
                os.fdatasync(segment.fd)
            self._synced = self._written
        except OSError:
            self._poison(self._synced, self._written)
        finally:
            os.close(segment.fd)
            self._cond.notify_all()
        segment.sealed_at = time.monotonic()
        if segment.size == 0:
            _unlink(segment.path)
        else:
            self._sealed.append(segment)

    def take_sealed(self) -> list[Segment]:
        """Segments sealed since the last call, oldest first."""
        with self._cond:
            sealed, self._sealed = self._sealed, []
            return sealed

    @property
    def current_records(self) -> int:
        with self._cond:
            return self._current.records if self._current is not None else 0

    def close(self) -> None:
        """Seal the current segment; appends fail from now on (the directory stays locked)."""
        with self._cond:
            self._closed = True
            self._seal_locked()

    def remove(self) -> None:
        """Delete this directory (its segments must be gone) and release its lock."""
        _remove_dir(self.directory, self._lock_fd)

    def release_lock(self) -> None:
        """Leave the directory (with its segments, for the next start to replay) and release its lock."""
        os.close(self._lock_fd)


# -- owners' directories -----------------------------------------------------------------------------
def new_owner_dir(root: Path, prefix: str) -> Path:
    """A fresh directory name under `<root>/_wal/` for an owner (not created yet)."""
    return root / WAL_DIR / f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"


def _make_locked_dir(directory: Path) -> int:
    """Make `directory` with its lock file held, as one rename: a claim never sees it unlocked."""
    directory.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    staging = directory.parent / f".{directory.name}"
    staging.mkdir(mode=DIR_MODE)
    fd = os.open(staging / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.rename(staging, directory)
        _fsync_dir(directory.parent)
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass(slots=True)
class OrphanDir:
    """The directory of an owner that died, locked by this process until `remove` or `release`."""

    path: Path
    fd: int

    def segments(self) -> list[Path]:
        return sorted(p for p in self.path.iterdir() if p.name.endswith(SUFFIX))

    def remove(self) -> None:
        for segment in self.segments():
            _unlink(segment)
        _remove_dir(self.path, self.fd)

    def release(self) -> None:
        os.close(self.fd)


def claim_orphans(root: Path, prefix: str = "") -> list[OrphanDir]:
    """Lock the owner directories under `<root>/_wal/` (whose names start with `prefix`) that no
    live process holds: those of receivers or workers that died. Oldest segments first is up to
    the caller (`OrphanDir.segments` sorts them)."""
    base = root / WAL_DIR
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    claimed = []
    for name in names:
        if name.startswith(".") or not name.startswith(prefix):
            continue
        path = base / name
        try:
            fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError:  # removed meanwhile, or not a directory
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            same = os.fstat(fd).st_ino == os.stat(path / LOCK_NAME).st_ino  # not removed by its claimer meanwhile
        except OSError:
            same = False
        if same:
            claimed.append(OrphanDir(path, fd))
        else:
            os.close(fd)
    return claimed


def _remove_dir(directory: Path, lock_fd: int) -> None:
    try:
        _unlink(directory / LOCK_NAME)
        os.rmdir(directory)
    except OSError:
        pass  # something else is in it: leave it (the next claim replays what it can read)
    finally:
        os.close(lock_fd)


# -- reading -----------------------------------------------------------------------------------
class SegmentReader:
    """The records of one segment file, in order; stops at the first short or damaged record
    (`torn` then counts the bytes left unread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.torn = 0
        self.records = 0

    def __iter__(self) -> Iterator[WalRecord]:
        with open(self.path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            offset = 0
            while offset < size:
                record = self._read_one(handle, size - offset)
                if record is None:
                    self.torn = size - offset
                    return
                offset += _HEADER_BYTES + len(record.body)
                self.records += 1
                yield record

    @staticmethod
    def _read_one(handle: Any, left: int) -> WalRecord | None:
        header = handle.read(_HEADER_BYTES)
        if len(header) < _HEADER_BYTES:
            return None
        magic, version, flags, _, length = _PREFIX.unpack_from(header)
        if magic != MAGIC or version != VERSION or length > min(MAX_RECORD_BYTES, left - _HEADER_BYTES):
            return None
        body = handle.read(length)
        (crc,) = struct.unpack_from("<I", header, _PREFIX.size)
        if len(body) < length or zlib.crc32(body, zlib.crc32(header[:_PREFIX.size])) != crc:
            return None
        return WalRecord(LOGS if flags & _FLAG_LOGS else TRACES, bool(flags & _FLAG_JSON), body)


# -- small helpers -----------------------------------------------------------------------------
def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
