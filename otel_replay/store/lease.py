"""One compactor at a time per store (two at once would each rewrite the same segments).

Local store: an advisory `flock` on `_compactions/.compactor.lock`, which the kernel releases
however its process dies. Remote store: a lease object `_compactions/compactor.lease` created
with an exclusive PUT (`If-None-Match: *`, honoured by S3 and by fsspec filesystems that support
`mode="create"`); a lease older than `stale_after_s` (its compactor died) is taken over.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from otel_replay.errors import OtelReplayError
from otel_replay.store.location import FILE_MODE, OBJECT_STORES, StoreLocation, make_dirs
from otel_replay.store.snapshot import MANIFEST_DIR

try:
    import fcntl
except ImportError:  # not POSIX: the local lock is skipped
    fcntl = None  # type: ignore[assignment]

LEASE = f"{MANIFEST_DIR}/compactor.lease"
STALE_AFTER_S = 6 * 3600.0


class CompactionRunning(OtelReplayError):  # noqa: N818 - the state it reports
    """Another compaction of this store is running."""


class CompactorLease:
    """`with CompactorLease(location): ...` holds the store's compaction for this process."""

    def __init__(self, location: StoreLocation, *, stale_after_s: float = STALE_AFTER_S) -> None:
        self.location = location
        self.stale_after_s = stale_after_s
        self._fd: int | None = None
        self._held = False

    def __enter__(self) -> CompactorLease:
        if self.location.local is not None:
            self._lock_local()
        else:
            self._lease_remote()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None
        if self._held:
            self.location.delete(LEASE)
            self._held = False

    def _lock_local(self) -> None:
        if fcntl is None or self.location.local is None:
            return
        directory = self.location.local / MANIFEST_DIR
        make_dirs(directory)
        fd = os.open(directory / ".compactor.lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "another process"
            os.close(fd)
            raise CompactionRunning(f"another compaction of {self.location} is running ({holder}); "
                                    "run one at a time") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()} pid {os.getpid()}".encode(), 0)
        self._fd = fd

    def _lease_remote(self) -> None:
        body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started_ns": time.time_ns()}).encode()
        for _ in range(2):
            try:
                self._create(body)
                self._held = True
                return
            except FileExistsError:
                holder = self._holder()
                if holder and time.time_ns() - int(holder.get("started_ns", 0)) < self.stale_after_s * 1e9:
                    raise CompactionRunning(
                        f"another compaction of {self.location} is running (host {holder.get('host')}, pid "
                        f"{holder.get('pid')}); run one at a time, or delete {self.location.uri(LEASE)} if it "
                        "died") from None
                self.location.delete(LEASE)  # stale (or unreadable): take it over
        raise CompactionRunning(f"cannot take the compaction lease {self.location.uri(LEASE)}")

    def _create(self, body: bytes) -> None:
        put_lease(self.location, LEASE, body, exclusive=True)

    def _holder(self) -> dict[str, Any] | None:
        return read_lease(self.location, LEASE)


def put_lease(location: StoreLocation, rel: str, body: bytes, *, exclusive: bool) -> None:
    """Write a lease object; `exclusive` creates it only if absent (FileExistsError otherwise).

    fsspec's `mode="create"` checks, then puts: truly exclusive on S3, nearly so elsewhere (the
    holder in the body tells who won). Any other failure is one OSError naming the object.
    """
    path = f"{location.path}/{rel}"
    try:
        if location.protocol not in OBJECT_STORES:  # a filesystem with directories
            location.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        location.fs.pipe_file(path, body, **({"mode": "create"} if exclusive else {}))
    except FileExistsError:
        raise
    except Exception as exc:  # noqa: BLE001 - one error type for the caller
        raise OSError(f"cannot write {location.uri(rel)}: {exc}") from exc


def read_lease(location: StoreLocation, rel: str) -> dict[str, Any] | None:
    """The holder a lease object names, or None if it is gone or unreadable."""
    try:
        holder = json.loads(location.read_bytes(rel))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None
