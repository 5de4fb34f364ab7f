"""What a queued item costs in memory: the estimate the queue's byte cap is enforced with.

The estimates are calibrated with tracemalloc on SDK spans (opentelemetry-sdk 1.45, CPython
3.11): a span with its context and attribute dict holds about 2.8 KB before its values, each
attribute about 130 bytes beside its value, each event about 600 bytes. String values count
what they really occupy (`str.__sizeof__`: 1, 2 or 4 bytes a character plus the header), so
non-ASCII payloads are not undercounted. Values of other types count as their attribute's fixed
overhead (arrays of strings are the exception, and are rare on GenAI spans).

`MemoryBudget` splits the byte cap (`max_queue_bytes`) between everything capture holds, so the
cap bounds all of it: the items queued or being written, what writing one batch needs besides
the batch (rows, Arrow, Parquet pages), and every cache, each bounded by bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SPAN_OVERHEAD = 3072
ATTRIBUTE_OVERHEAD = 128
EVENT_OVERHEAD = 640
STR_SIZE = str.__sizeof__
IS_STR = str.__instancecheck__
WALK_BUDGET = 4096  # containers and values visited in a decoded value before the rest is guessed
_UNVISITED = 4096  # bytes assumed for each value left unvisited past the budget


def attributes_size(attributes: Any) -> int:
    """Fixed cost per attribute plus the real size of its string values."""
    return ATTRIBUTE_OVERHEAD * len(attributes) + sum(map(STR_SIZE, filter(IS_STR, attributes.values())))


def events_size(events: Any) -> int:
    """SDK span events (`span._events`): content events of older conventions carry payloads."""
    size = 0
    for event in events:
        attributes = getattr(event, "attributes", None)
        size += EVENT_OVERHEAD + (value_size(attributes) if attributes else 0)
    return size


def value_size(value: Any, budget: int = WALK_BUDGET) -> int:
    """Bytes a decoded value (str, bytes, list, tuple, dict, scalars) holds, walking it iteratively.

    Past `budget` visited values the rest is estimated at a fixed size each, so a hostile,
    deeply nested value costs bounded time here.
    """
    size = 0
    stack = [value]
    while stack:
        if budget <= 0:
            return size + _UNVISITED * len(stack)
        budget -= 1
        item = stack.pop()
        cls = item.__class__
        if cls is str:
            size += STR_SIZE(item)
        elif cls is dict:
            size += 64 + ATTRIBUTE_OVERHEAD * len(item)
            stack.extend(item.values())
        elif cls is list or cls is tuple:
            size += 56 + 8 * len(item)
            stack.extend(item)
        elif cls is bytes or cls is bytearray:
            size += 33 + len(item)
        elif isinstance(item, str):
            size += STR_SIZE(item)
        elif isinstance(item, Mapping):
            size += 64 + ATTRIBUTE_OVERHEAD * len(item)
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            size += 56 + 8 * len(item)
            stack.extend(item)
        else:
            size += 32
    return size


def record_size(record: Any) -> int:
    """A decoded `SpanRecord` or `LogEvent` (the OTLP receiver's path)."""
    size = SPAN_OVERHEAD + value_size(record.attributes)
    for event in getattr(record, "events", ()):
        size += EVENT_OVERHEAD + value_size(event.attributes)
    body = getattr(record, "body", None)
    if body is not None:
        size += value_size(body)
    return size


def log_size(record: Any) -> int:
    """An SDK log record on its way to the queue (body and attributes)."""
    attributes = getattr(record, "attributes", None)
    size = SPAN_OVERHEAD + (value_size(attributes) if attributes else 0)
    body = getattr(record, "body", None)
    return size + (value_size(body) if body is not None else 0)


# -- the budget -------------------------------------------------------------------------------------
MB = 1024 * 1024
# normalize.redact keeps a memo of redacted messages of up to 16 MB of text per Redactor (fixed
# there; a test checks the two agree), and normalize.messages one of canonical messages keyed by
# their raw bytes (`_MEMO_MAX_BYTES`, keys, copies and objects counted) and the hashes of messages
# seen once (`SEEN_BYTES`).
REDACTOR_MEMO_BYTES = 16 * MB
MESSAGE_MEMO_BYTES = 8 * MB + 2 * MB
FLUSH_SHARE = 16  # the writer writes once it has taken 1/16 of the cap
# Writing a batch of B queued bytes also needs its rows (the payload bodies once more), the Arrow
# table (once more) and Parquet's page buffers (under once more, with `layout.write_segment`'s
# small write batches): measured at 2.3x B for 32 KB payloads, so 3x B is reserved.
WRITE_FACTOR = 3
CACHE_SHARE = 32  # each of the writer's own caches may hold 1/32 of the cap ...
CACHE_MIN, CACHE_MAX = 256 * 1024, 8 * MB  # ... within these bounds
HASH_ENTRY_BYTES = 128  # a stored payload's 32-hex-digit hash (str) in a set
TRACE_ENTRY_BYTES = 200  # a trace id (str) in an OrderedDict
QUEUE_FLOOR_SHARE = 4  # under a small cap the queue keeps 1/4 of it (the bound then holds only in estimate)


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """How the byte cap is shared: the queue admits `queue_bytes`; the rest is reserved for writing
    and for the caches, so what capture holds in all stays within `cap_bytes`."""

    cap_bytes: int
    flush_bytes: int  # taken from the queue before a write (held, and counted, until it is written)
    write_bytes: int  # reserved for writing one batch: rows, Arrow table, Parquet pages
    identity_bytes: int  # RowBuilder: payloads recognized by identity (kept alive by the cache)
    known_hashes: int  # RowBuilder: payload hashes already stored (entries)
    recent_traces: int  # writer: trace ids with GenAI spans, whose other spans are kept (entries)
    pending_log_bytes: int  # writer: log events waiting for their span
    fixed_bytes: int = REDACTOR_MEMO_BYTES + MESSAGE_MEMO_BYTES  # memos of normalize and redaction

    @classmethod
    def of(cls, cap_bytes: int) -> MemoryBudget:
        share = min(max(cap_bytes // CACHE_SHARE, CACHE_MIN), CACHE_MAX)
        flush = max(cap_bytes // FLUSH_SHARE, 1)
        return cls(cap_bytes=cap_bytes, flush_bytes=flush, write_bytes=WRITE_FACTOR * flush, identity_bytes=share,
                   known_hashes=share // HASH_ENTRY_BYTES, recent_traces=share // TRACE_ENTRY_BYTES,
                   pending_log_bytes=share)

    @property
    def cache_bytes(self) -> int:
        """Every cache at its bound (they share objects, so this overstates what they hold)."""
        return (self.fixed_bytes + self.identity_bytes + self.known_hashes * HASH_ENTRY_BYTES
                + self.recent_traces * TRACE_ENTRY_BYTES + self.pending_log_bytes)

    @property
    def reserved_bytes(self) -> int:
        return self.write_bytes + self.cache_bytes

    @property
    def queue_bytes(self) -> int:
        """What the queue admits: the cap less the reserve (never less than a quarter of the cap)."""
        return max(self.cap_bytes - self.reserved_bytes, self.cap_bytes // QUEUE_FLOOR_SHARE)

    @property
    def bounded(self) -> bool:
        """Whether the reserve fits in the cap (caps from about 60 MB up): then the cap bounds it all."""
        return self.cap_bytes - self.reserved_bytes >= self.cap_bytes // QUEUE_FLOOR_SHARE
