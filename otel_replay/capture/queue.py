"""The bounded hand-off between the service's threads and the capture writer.

Bounded by count and by an estimate of bytes. Producer and consumer each own one counter
(`bytes_in`, `bytes_out`), so neither takes a lock; the difference is the bytes held. An item's
bytes stay held after `take` until the writer `release`s them (its rows were written or given
up). The queue admits only its share of the byte cap (`sizing.MemoryBudget`): the rest is
reserved for writing a batch and for the writer's caches, so the cap bounds everything capture
holds in memory, not only what waits in the deque.
"""

from __future__ import annotations

import collections
from typing import Any

from otel_replay.capture.sizing import MemoryBudget


class SpanQueue:
    __slots__ = ("_items", "length", "append", "max_items", "max_bytes", "budget", "bytes_in", "bytes_out", "dropped")

    def __init__(self, max_items: int, max_bytes: int) -> None:
        """`max_bytes` is capture's whole byte cap; the queue admits `budget.queue_bytes` of it."""
        self._items: collections.deque[tuple[Any, int]] = collections.deque()
        # `len()` as a C call: the producer's hot path reads it without a Python frame
        self.length = self._items.__len__
        self.append = self._items.append  # the producer's inlined `put` (ReplayProcessor.on_end)
        self.max_items = max_items
        self.budget = MemoryBudget.of(max_bytes)
        self.max_bytes = self.budget.queue_bytes  # what `put` and `offer_all` admit
        self.bytes_in = 0
        self.bytes_out = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, item: Any, size: int) -> bool:
        """Append unless full; a refused item is counted, never logged."""
        return self.put(item, size) > 0

    def put(self, item: Any, size: int) -> int:
        """Like `offer`, but returns the number of items queued after the append (0: refused)."""
        items = self._items
        if len(items) >= self.max_items or self.bytes_in - self.bytes_out + size > self.max_bytes:
            self.dropped += 1
            return 0
        items.append((item, size))
        self.bytes_in += size
        return len(items)

    def offer_all(self, items: list[tuple[Any, int]]) -> bool:
        """Append every item or none (a batch a sender can retry whole); a refusal is not a drop."""
        total = sum(size for _, size in items)
        if len(self._items) + len(items) > self.max_items or self.bytes_in - self.bytes_out + total > self.max_bytes:
            return False
        self._items.extend(items)
        self.bytes_in += total
        return True

    def take(self, limit: int, max_bytes: int | None = None) -> list[tuple[Any, int]]:
        """Pop up to `limit` (item, size) pairs, and past `max_bytes` no more (at least one); consumer
        side only. Their bytes stay held until `release`."""
        popleft = self._items.popleft
        count = min(limit, len(self._items))
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
        """The consumer is done with `size` bytes of taken items (written, skipped or lost)."""
        self.bytes_out += size

    @property
    def queued_bytes(self) -> int:
        """Estimated bytes held: waiting in the queue or taken and not yet written."""
        return self.bytes_in - self.bytes_out
