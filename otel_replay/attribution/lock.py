"""One process per job id: a lock file under the store, `<store>/locks/job-<id>.lock`.

Two processes running the same job would both append its rollouts and interleave its state;
the second one is refused instead, naming the process that holds the job. The lock is an
advisory `flock` on the file, which the kernel releases when its process dies however it dies,
so a `kill -9` never leaves a stale lock: the file may remain, holding the dead pid, and the
next run takes it over. The pid written in the file is there for the message (and for humans).
Jobs with different ids never contend: their rows are keyed by job id.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from otel_replay.store.location import StoreLocation

try:
    import fcntl
except ImportError:  # not POSIX: no lock (one job per id is then up to the user)
    fcntl = None  # type: ignore[assignment]

LOCK_DIR = "locks"
_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class JobLocked(Exception):  # noqa: N818 - the state it reports
    """Another process is running this job."""


class JobLock:
    """Exclusive, non-blocking lock on one job id; `with JobLock(root, job_id): ...`."""

    def __init__(self, root: Path | StoreLocation, job_id: str) -> None:
        if not _SAFE_ID.fullmatch(job_id) or job_id.startswith("."):
            raise ValueError(f"job id {job_id!r} has characters a lock file name cannot hold")
        local = root.local if isinstance(root, StoreLocation) else Path(root)  # remote store: no flock, no lock
        self.path = local / LOCK_DIR / f"job-{job_id}.lock" if local is not None else None
        self.job_id = job_id
        self._fd: int | None = None
        self.took_over: int | None = None  # the dead holder's pid, when a stale lock file was taken over

    def acquire(self) -> JobLock:
        if fcntl is None or self.path is None:
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
        if self._fd is None:
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


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
