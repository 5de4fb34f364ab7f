"""What a queued item costs in memory: the estimate the queue's byte cap is enforced with.

The estimates are calibrated with tracemalloc on SDK spans (opentelemetry-sdk 1.45, CPython
3.11): a span with its context and attribute dict holds about 2.8 KB before its values, each
attribute about 130 bytes beside its value, each event about 600 bytes. String values count
what they really occupy (`str.__sizeof__`: 1, 2 or 4 bytes a character plus the header), so
non-ASCII payloads are not undercounted. Values of other types count as their attribute's fixed
overhead (arrays of strings are the exception, and are rare on GenAI spans).
"""

from __future__ import annotations

from collections.abc import Mapping
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
