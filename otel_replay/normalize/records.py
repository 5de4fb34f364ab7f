"""Source-independent span and log records: what every adapter reads.

Live spans, OTLP payloads, fixture dumps and imported exports all become these two shapes, so a
convention adapter is written once and works for every source.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int | None
    attributes: Mapping[str, Any]


@dataclass(slots=True)
class SpanRecord:
    """One span, with attributes as plain Python values (lists for arrays)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str = "INTERNAL"
    start_ns: int | None = None
    end_ns: int | None = None
    status_code: str = "unset"
    status_message: str | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    resource: Mapping[str, Any] = field(default_factory=dict)
    scope_name: str | None = None
    scope_version: str | None = None

    @property
    def service_name(self) -> str | None:
        value = self.resource.get("service.name")
        return value if isinstance(value, str) else None


@dataclass(slots=True)
class LogEvent:
    """A log record that belongs to a span (content carried in GenAI events)."""

    event_name: str | None
    trace_id: str | None
    span_id: str | None
    time_ns: int | None
    body: Any
    attributes: Mapping[str, Any] = field(default_factory=dict)


TracePart = tuple[int, int]
"""(index, count): the traces of one worker among `count`, as `partition_of` assigns them."""


def partition_of(trace_id: str | None, parts: int) -> int:
    """The part of a trace (by its hex id) among `parts`: stable across runs and processes (crc32,
    not the salted `hash`), so import workers and receiver workers split traces alike, each whole."""
    return zlib.crc32((trace_id or "").encode("utf-8", "surrogatepass")) % parts
