"""Files a user writes out of the store (reports, exports): 0600, like the store, and whole.

A report quotes prompts, tool results and repaired outputs, so it is as private as the store it
came from: it is created 0600 whatever the umask, under a temporary name in the same directory,
fsynced and renamed over the target. A reader never sees half a file, and a file that was there
before (readable by others or not) is replaced, not rewritten in place with its old mode.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

FILE_MODE = 0o600


def write_private(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path`, mode 0600, atomically."""
    path = Path(path)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
