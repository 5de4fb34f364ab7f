"""One process per job id: a lock file under the store, `<store>/locks/job-<id>.lock`.

Two processes running the same job would both append its rollouts and interleave its state;
the second one is refused instead, naming the process that holds the job. The lock is an
advisory `flock` on the file, which the kernel releases when its process dies however it dies,
so a `kill -9` never leaves a stale lock: the file may remain, holding the dead pid, and the
next run takes it over. The pid written in the file is there for the message (and for humans).
Jobs with different ids never contend: their rows are keyed by job id.

On a remote store (object storage, any fsspec URL) the lock is a lease object
`locks/job-<id>.lease`, created with an exclusive PUT (`If-None-Match: *` on S3; fsspec's check
then put elsewhere) and renewed by a heartbeat thread every `heartbeat_s`. Nothing releases it
when its process dies, so a lease not renewed for `stale_after_s` is taken over: after a `kill -9`
a resume waits at most that long.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

from otel_replay.errors import OtelReplayError
from otel_replay.store.lease import put_lease, read_lease
from otel_replay.store.location import StoreLocation

try:
    import fcntl
except ImportError:  # not POSIX: no lock (one job per id is then up to the user)
    fcntl = None  # type: ignore[assignment]  # the module or None: acquire() checks which

LOCK_DIR = "locks"
_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
HEARTBEAT_S = 20.0  # a remote lease is renewed this often ...
STALE_AFTER_S = 90.0  # ... and taken over when it was not renewed for this long (its holder died)


class JobLocked(OtelReplayError):  # noqa: N818 - the state it reports
    """Another process is running this job."""


class JobLock:
    """Exclusive, non-blocking lock on one job id; `with JobLock(root, job_id): ...`."""

    def __init__(self, root: Path | StoreLocation, job_id: str, *, heartbeat_s: float = HEARTBEAT_S,
                 stale_after_s: float = STALE_AFTER_S) -> None:
        if not _SAFE_ID.fullmatch(job_id) or job_id.startswith("."):
            raise ValueError(f"job id {job_id!r} has characters a lock file name cannot hold")
        self.location = root if isinstance(root, StoreLocation) else StoreLocation(Path(root))
        local = self.location.local
        self.path = local / LOCK_DIR / f"job-{job_id}.lock" if local is not None else None
        self.lease = f"{LOCK_DIR}/job-{job_id}.lease"  # on a remote store
        self.job_id = job_id
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self._fd: int | None = None
        self._renewing: threading.Event | None = None
        self._beat = threading.Lock()  # a heartbeat's put and release's delete never overlap
        self.took_over: int | None = None  # the dead holder's pid, when a stale lock file was taken over

    def acquire(self) -> JobLock:
        if self.path is None:
            return self._take_lease()
        if fcntl is None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_pid(fd)
                os.close(fd)
                who = f"process {holder}" if holder else "another process"
                raise JobLocked(f"job {self.job_id} is already running in {who} (lock file {self.path}); wait for "
                                "it to finish or stop it, then resume with --resume " + self.job_id) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # else the holder released and removed it between our open and flock: retry
                break
            os.close(fd)
        previous = _read_pid(fd)
        if previous and previous != os.getpid():
            self.took_over = previous
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._renewing is not None:
            with self._beat:  # waits out a put in flight, so none lands after the delete below
                self._renewing.set()
            self._renewing = None
            with contextlib.suppress(OSError):  # else it goes stale and is taken over
                self.location.delete(self.lease)
            return
        if self._fd is None or self.path is None:  # never locked (a path is set whenever _fd is)
            return
        try:
            self.path.unlink(missing_ok=True)  # while still locked, so no one locks a file about to vanish
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> JobLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


    # -- a remote store: a lease object -------------------------------------------------------------
    def _take_lease(self) -> JobLock:
        for _ in range(2):
            try:
                self._put(exclusive=True)
            except FileExistsError:
                holder = self._holder()
                age_s = (time.time_ns() - int(holder.get("renewed_ns", 0))) / 1e9 if holder else None
                if holder is not None and age_s is not None and age_s < self.stale_after_s:
                    raise JobLocked(
                        f"job {self.job_id} is already running in process {holder.get('pid')} on host "
                        f"{holder.get('host')} (lease {self.location.uri(self.lease)}, renewed {age_s:.0f} s ago); "
                        f"wait for it to finish or stop it, then resume with --resume {self.job_id} (a lease "
                        f"not renewed for {self.stale_after_s:.0f} s is taken over)") from None
                self.took_over = int(holder["pid"]) if holder and str(holder.get("pid", "")).isdigit() else None
                self.location.delete(self.lease)  # stale, or unreadable: its holder died
                continue
            self._renewing = threading.Event()
            threading.Thread(target=self._renew, args=(self._renewing,), name=f"otel-replay-lease-{self.job_id}",
                             daemon=True).start()
            return self
        raise JobLocked(f"job {self.job_id}: another process took the lease {self.location.uri(self.lease)} "
                        "at the same moment; try again")

    def _put(self, *, exclusive: bool) -> None:
        body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "renewed_ns": time.time_ns()}).encode()
        put_lease(self.location, self.lease, body, exclusive=exclusive)

    def _holder(self) -> dict[str, Any] | None:
        return read_lease(self.location, self.lease)

    def _renew(self, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_s):
            with self._beat:
                if stop.is_set():  # released while this beat waited: a put now would revive the lease
                    return
                try:
                    self._put(exclusive=False)
                except OSError:
                    continue  # a passing failure: the next beat tries again (stale only after several)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
