"""The write-ahead log of `collect --durable`: request bodies on disk, fsynced, before the answer.

Layout: one directory per process that accepts requests (the receiver, or each of its workers),
`<store>/_wal/<owner>/`, holding `lock` (an flock its owner holds while it lives, released by the
kernel however it dies) and segments `00000001.wal`, `00000002.wal`, ... A segment is a run of
records, each a 20-byte header (magic `OWAL`, version, flags: logs / JSON, payload length, and an
xxh3-64 checksum of the header's first 12 bytes and the payload) and the request body as the
receiver read it (decompressed), written with one `writev`. The checksum is xxh3 rather than crc32:
~0.04 ms for a 2.4 MB body against 0.6, and it keeps the GIL, which a request thread would
otherwise have to win back from the writer thread. One thread per log writes and syncs: a request
hands it its record and decodes the request meanwhile, and the thread writes every record handed
to it since its last round, then syncs once for all of them (group commit). A sync that fails
fails the records it covered (their requests get an error, never an acknowledgement) and seals the
segment.

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
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

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
_CHECK = struct.Struct("<Q")  # xxh3-64 of the prefix and the payload
_HEADER_BYTES = _PREFIX.size + _CHECK.size
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
    return prefix + _CHECK.pack(_checksum(prefix, body))


def _checksum(prefix: bytes, body: bytes | memoryview) -> int:
    digest = xxhash.xxh3_64(prefix)
    digest.update(body)
    return digest.intdigest()


class Segment:
    """A segment file: being appended to, then sealed (fsynced and closed)."""

    __slots__ = ("fd", "has_logs", "note", "opened_at", "path", "pending", "records", "sealed_at", "size", "unsynced")

    def __init__(self, path: Path, fd: int, note: Any) -> None:
        self.path, self.fd, self.note = path, fd, note
        self.size = self.records = self.pending = 0  # pending: synced, not yet queued by their request
        self.has_logs = False
        self.opened_at = time.monotonic()
        self.sealed_at: float | None = None
        self.unsynced: list[Ticket] = []  # written, waiting for the next fdatasync


class Ticket:
    """One record handed to the log: done once it is fsynced (`segment` set) or failed (`error`)."""

    __slots__ = ("body", "done", "error", "header", "is_logs", "segment")

    def __init__(self, signal: str, as_json: bool, body: bytes | memoryview) -> None:
        self.header = _header(signal, as_json, body)  # hashed here, on the caller's thread
        self.body, self.is_logs = body, signal == LOGS
        self.done = threading.Event()
        self.error: OSError | None = None
        self.segment: Segment | None = None

    def wait(self) -> Segment:
        """The record's segment once it is on disk; raises OSError if it may not be."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.segment is not None
        return self.segment


class WriteAheadLog:
    """Appends with group commit into the segments of one locked directory, by one thread.

    A caller `submit`s a record and may do other work (decode the request) while the log's thread
    writes it; the thread writes everything submitted since its last round (one `writev` each),
    then syncs once for all of them. Only that thread touches the segments' descriptors.

    :param directory: this owner's directory (created and locked here; `claim_orphans` skips it).
    :param segment_bytes: a segment is sealed once it is this large.
    :param on_segment: called (on the log's thread) as each segment opens; its value is kept as
        `Segment.note` (the durable receiver notes the writer's loss counter there).
    """

    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES,
                 on_segment: Callable[[], Any] | None = None) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._on_segment = on_segment or (lambda: None)
        self._lock_fd = _make_locked_dir(directory)
        self._wake = threading.Condition()
        self._queue: list[Ticket] = []
        self._seal_age: float | None = None  # a seal asked for: of a segment at least this old
        self._closed = False
        self._current: Segment | None = None
        self._sealed: list[Segment] = []
        self._next = 1
        self.syncs = 0
        """fdatasync calls made (fewer than records: group commit)."""
        self.records = 0
        """Records appended and synced."""
        self._thread = threading.Thread(target=self._run, name="otel-replay-wal", daemon=True)
        self._thread.start()

    # -- the callers' side -----------------------------------------------------------------------
    def submit(self, signal: str, as_json: bool, body: bytes | memoryview) -> Ticket:
        """Hand one record to the log's thread; `Ticket.wait` returns once it is fsynced. `body`
        must stay unchanged until then."""
        ticket = Ticket(signal, as_json, body)
        with self._wake:
            if self._closed:
                _finish(ticket, OSError(errno.ESHUTDOWN, "the write-ahead log is closed"))
            else:
                self._queue.append(ticket)
                self._wake.notify()
        return ticket

    def append(self, signal: str, as_json: bool, body: bytes | memoryview) -> Segment:
        """`submit` and wait: the record's segment once it is on disk (OSError if it may not be).
        The caller `release`s the segment once the request's records are queued."""
        return self.submit(signal, as_json, body).wait()

    def release(self, segment: Segment) -> None:
        """The request of one synced record in `segment` has queued its records (or given up)."""
        with self._wake:
            segment.pending -= 1

    def seal(self, older_than_s: float = 0.0) -> None:
        """Ask for the current segment to be sealed if it holds a record and is `older_than_s` old
        (done by the log's thread; `take_sealed` returns it after that)."""
        with self._wake:
            self._seal_age = older_than_s if self._seal_age is None else min(self._seal_age, older_than_s)
            self._wake.notify()

    def take_sealed(self) -> list[Segment]:
        """Segments sealed since the last call, oldest first."""
        with self._wake:
            sealed, self._sealed = self._sealed, []
            return sealed

    def close(self) -> None:
        """Write what was submitted, seal the current segment and stop the log's thread; later
        submits fail (the directory stays locked: `remove` or `release_lock`)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    def remove(self) -> None:
        """Delete this directory (its segments must be gone) and release its lock."""
        _remove_dir(self.directory, self._lock_fd)

    def release_lock(self) -> None:
        """Leave the directory (with its segments, for the next start to replay) and release its lock."""
        os.close(self._lock_fd)

    # -- the log's thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and self._seal_age is None and not self._closed:
                    self._wake.wait()
                batch, self._queue = self._queue, []
                seal_age, self._seal_age = self._seal_age, None
                closing = self._closed and not batch
            try:
                self._write(batch)
                segment = self._current
                if segment is not None and (closing or segment.size >= self.segment_bytes or (
                        seal_age is not None and segment.records
                        and time.monotonic() - segment.opened_at >= seal_age)):
                    self._seal()
            except BaseException as exc:  # noqa: BLE001 - fail what is in hand, never leave a caller waiting
                if self._current is not None:
                    self._current.unsynced.clear()
                for ticket in batch:
                    if not ticket.done.is_set():
                        _finish(ticket, OSError(errno.EIO, f"write-ahead log: {exc!r}"))
                if closing:
                    raise
            if closing:
                return

    def _write(self, batch: list[Ticket]) -> None:
        """Write each record (a failed one is cut off and its segment sealed), then sync once."""
        for ticket in batch:
            segment = None
            try:
                segment = self._current or self._open()
                start = segment.size
                _write_all(segment.fd, ticket.header, ticket.body)
            except OSError as exc:
                if segment is not None:
                    with contextlib.suppress(OSError):  # else the reader stops at the bad record
                        os.ftruncate(segment.fd, start)
                    self._seal()
                _finish(ticket, exc)
                continue
            segment.size += len(ticket.header) + len(ticket.body)
            segment.records += 1
            segment.has_logs |= ticket.is_logs
            segment.unsynced.append(ticket)
        if self._current is not None:
            self._sync(self._current)

    def _sync(self, segment: Segment) -> None:
        """fdatasync `segment` and finish the records waiting for it: synced, or failed (then the
        segment is sealed: after a failed fdatasync its pages cannot be trusted)."""
        if not segment.unsynced:
            return
        try:
            os.fdatasync(segment.fd)
            error = None
        except OSError as exc:
            error = exc
        self.syncs += 1
        waiting, segment.unsynced = segment.unsynced, []
        with self._wake:
            for ticket in waiting:
                if error is None:
                    ticket.segment = segment
                    segment.pending += 1
                    self.records += 1
                _finish(ticket, error)
        if error is not None and segment is self._current:
            self._seal()

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

    def _seal(self) -> None:
        """Sync (finishing its records) and close the current segment; an empty one is deleted."""
        segment = self._current
        if segment is None:
            return
        self._current = None
        self._sync(segment)
        os.close(segment.fd)
        segment.sealed_at = time.monotonic()
        if segment.size == 0:
            _unlink(segment.path)
            return
        with self._wake:
            self._sealed.append(segment)


def _finish(ticket: Ticket, error: OSError | None) -> None:
    ticket.error = error
    ticket.body = b""  # the caller may reuse its buffer from now on
    ticket.done.set()


# -- owners' directories -----------------------------------------------------------------------------
def new_owner_dir(root: Path, prefix: str) -> Path:
    """A fresh directory name under `<root>/_wal/` for an owner (not created yet)."""
    return root / WAL_DIR / f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"


def check_writable(root: Path) -> None:
    """Raise OSError (EROFS, ENOSPC, EACCES, ...) unless an owner directory can be made under
    `<root>/_wal/` now (a probe, made and removed under a dot name that claims skip)."""
    base = root / WAL_DIR
    base.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=base))


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
        (check,) = _CHECK.unpack_from(header, _PREFIX.size)
        if len(body) < length or _checksum(header[:_PREFIX.size], body) != check:
            return None
        return WalRecord(LOGS if flags & _FLAG_LOGS else TRACES, bool(flags & _FLAG_JSON), body)


# -- small helpers -----------------------------------------------------------------------------
def _write_all(fd: int, header: bytes, body: bytes | memoryview) -> None:
    """Both, in one `writev` (each GIL release costs a request thread up to a switch interval)."""
    views = [memoryview(header), memoryview(body).cast("B")]
    while views:
        done = os.writev(fd, views)
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if views:
            views[0] = views[0][done:]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
