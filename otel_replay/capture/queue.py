"""The bounded hand-off between the service's threads and the capture writer.

Bounded by count and by an estimate of bytes. Producers (the service's threads, a receiver's)
admit items under one short lock, so the count and byte checks and the append are one step and
`bytes_in` loses no update; the consumer (the writer thread) takes items without it and alone
updates `bytes_out`. The difference is the bytes held. An item's bytes stay held after `take`
until the writer `release`s them (its rows were written or given up). Drops are counted by a
`Ticker` (no lock: the shedding path counts one per span). The queue admits only its
share of the byte cap (`sizing.MemoryBudget`): the rest is reserved for writing a batch and for
the writer's caches, so the cap bounds everything capture holds in memory, not only what waits.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from otel_replay.capture.sizing import MemoryBudget
from otel_replay.capture.tally import Ticker


class SpanQueue:
    __slots__ = ("items", "_lock", "acquire", "release_lock", "append", "max_items", "max_bytes", "budget", "bytes_in", "bytes_out", "drops")

    def __init__(self, max_items: int, max_bytes: int) -> None:
        """`max_bytes` is capture's whole byte cap; the queue admits `budget.queue_bytes` of it."""
        self.items: collections.deque[tuple[Any, int]] = collections.deque()  # the consumer pops; producers append under `_lock`
        self._lock = threading.Lock()  # producers only: admission is check, append and count at once
        # bound once: `with` costs twice as much, a bound method made per call ~30 ns (CPython 3.11)
        self.acquire, self.release_lock = self._lock.acquire, self._lock.release
        self.append = self.items.append  # bound once: `on_end` inlines `put`
        self.max_items = max_items
        self.budget = MemoryBudget.of(max_bytes)
        self.max_bytes = self.budget.queue_bytes  # what `put` and `offer_all` admit
        self.bytes_in = 0  # changed under `_lock` only
        self.bytes_out = 0  # changed by the consumer only
        self.drops = Ticker()  # items refused because the queue was full

    def __len__(self) -> int:
        return len(self.items)

    @property
    def dropped(self) -> int:
        """Items refused because the queue was full (by count or by bytes)."""
        return self.drops.value

    def offer(self, item: Any, size: int) -> bool:
        """Append unless full; a refused item is counted, never logged."""
        return self.put(item, size) > 0

    def put(self, item: Any, size: int) -> int:
        """Like `offer`, but returns the number of items queued after the append (0: refused).

        The lock costs about 0.1 µs a call. `ReplayProcessor.on_end` inlines this body (a call would
        cost half as much again): a change here is a change there.
        """
        items = self.items
        self.acquire()
        try:
            queued = len(items)
            if queued < self.max_items and self.bytes_in - self.bytes_out + size <= self.max_bytes:
                items.append((item, size))
                self.bytes_in += size
                queued += 1
            else:
                queued = 0
        finally:
            self.release_lock()
        if not queued:
            next(self.drops.counter)
        return queued

    def offer_all(self, items: list[tuple[Any, int]]) -> bool:
        """Append every item or none (a batch a sender can retry whole); a refusal is not a drop."""
        total = sum(size for _, size in items)
        with self._lock:
            if len(self.items) + len(items) > self.max_items or self.bytes_in - self.bytes_out + total > self.max_bytes:
                return False
            self.items.extend(items)
            self.bytes_in += total
        return True

    def take(self, limit: int, max_bytes: int | None = None) -> list[tuple[Any, int]]:
        """Pop up to `limit` (item, size) pairs, and past `max_bytes` no more (at least one); consumer
        side only. Their bytes stay held until `release`."""
        popleft = self.items.popleft
        count = min(limit, len(self.items))
        if max_bytes is None:
            return [popleft() for _ in range(count)]
        out = []
        taken = 0
        for _ in range(count):
            pair = popleft()
            out.append(pair)
            taken += pair[1]
            if taken >= max_bytes:
                break
        return out

    def release(self, size: int) -> None:
        """The consumer is done with `size` bytes of taken items (written, skipped or lost); the
        consumer's thread only, so its `+=` races with nothing."""
        self.bytes_out += size

    @property
    def queued_bytes(self) -> int:
        """Estimated bytes held: waiting in the queue or taken and not yet written."""
        return self.bytes_in - self.bytes_out
