"""Counters that many threads update without losing updates, with or without the GIL.

`x += n` on a shared attribute is a load, an add and a store: two threads can both load the old
value, and one update is lost. Free-threaded CPython does this routinely; with the GIL it needs a
thread switch between the load and the store. Two answers here, by how often a counter moves:

- `Ticker`, for counters bumped by one per span on the service's threads: `next()` of an
  `itertools.count`, one C call that is atomic with the GIL and, in the free-threaded build, from
  CPython 3.13 on (gh-117657: a compare-and-swap). About 18 ns over an empty call, against ~53 ns
  for a per-thread cell in a `threading.local` and ~100 ns for a lock (timeit, CPython 3.11).
- `SharedCount`, for counters on rare paths (errors, refused batches): one lock around the add.
"""

from __future__ import annotations

import itertools
import threading


class Ticker:
    """A count that any thread advances by one with `next(ticker.counter)`; `value` reads it."""

    __slots__ = ("counter",)

    def __init__(self) -> None:
        self.counter = itertools.count()

    @property
    def value(self) -> int:
        # a count's repr is "count(N)", N the value `next` returns next: the ticks so far. No other
        # public read exists (its pickling is gone from 3.14), and `next` would change it.
        return int(repr(self.counter)[6:-1])


class SharedCount:
    """An integer that threads add to under one lock, for counters that move rarely.

    `count += n` is exact too (`__iadd__` adds in place and hands back the same object), so code that
    treats the counter as a number keeps working; `int(count)` or `count.value` reads it.
    """

    __slots__ = ("_lock", "_value")

    def __init__(self, value: int = 0) -> None:
        self._lock = threading.Lock()
        self._value = value

    def add(self, n: int = 1) -> None:
        with self._lock:
            self._value += n

    def __iadd__(self, n: int) -> SharedCount:
        self.add(n)
        return self

    @property
    def value(self) -> int:
        return self._value  # one load: no update can be half done in it

    def __int__(self) -> int:
        return self._value

    __index__ = __int__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SharedCount):
            return self._value == other._value
        if isinstance(other, int):
            return self._value == other
        return NotImplemented

    def __hash__(self) -> int:
        raise TypeError("a SharedCount changes and equals ints: it cannot be a set member or a dict key")

    def __repr__(self) -> str:
        return f"SharedCount({self._value})"

    def after_fork(self) -> SharedCount:
        """A copy for a forked child, with a new lock (a thread of the parent may have held this one)."""
        return SharedCount(self._value)
