"""Process tuning for bulk loads (imports): many records held at once, no reference cycles made."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for a bulk load, then restore it as it was.

    An import holds every record it read until the write; each full collection would walk all of
    them again, which cost more than normalizing them (import ran ~1.6x faster without it). The
    load creates no reference cycles, so reference counting frees everything as usual.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
