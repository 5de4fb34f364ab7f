"""The flat span/log dump used by the shared fixtures (`{"spans": [...], "logs": [...]}`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_replay.normalize.records import LogEvent, SpanEvent, SpanRecord
from otel_replay.normalize.sources.ids import hex_id, optional_hex_id


def span_from_flat(span: Mapping[str, Any]) -> SpanRecord:
    status = span.get("status") or {}
    scope = span.get("instrumentation_scope") or {}
    return SpanRecord(
        trace_id=hex_id(span.get("trace_id"), 32, "trace_id"),
        span_id=hex_id(span.get("span_id"), 16, "span_id"),
        parent_span_id=optional_hex_id(span.get("parent_span_id"), 16, "parent_span_id"),
        name=str(span.get("name") or ""),
        kind=str(span.get("kind") or "INTERNAL"),
        start_ns=span.get("start_time_unix_nano"),
        end_ns=span.get("end_time_unix_nano"),
        status_code=str(status.get("code") or "UNSET").lower(),
        status_message=status.get("description"),
        attributes=dict(span.get("attributes") or {}),
        events=[
            SpanEvent(str(e.get("name")), e.get("time_unix_nano") or e.get("timestamp"), dict(e.get("attributes") or {}))
            for e in span.get("events") or []
        ],
        links=list(span.get("links") or []),
        resource=dict((span.get("resource") or {}).get("attributes") or {}),
        scope_name=scope.get("name"),
        scope_version=scope.get("version"),
    )


def log_from_flat(log: Mapping[str, Any]) -> LogEvent:
    return LogEvent(
        event_name=log.get("event_name"),
        trace_id=optional_hex_id(log.get("trace_id"), 32, "trace_id"),
        span_id=optional_hex_id(log.get("span_id"), 16, "span_id"),
        time_ns=log.get("time_unix_nano") or log.get("observed_time_unix_nano"),
        body=log.get("body"),
        attributes=dict(log.get("attributes") or {}),
    )


def read_flat(doc: Mapping[str, Any]) -> tuple[list[SpanRecord], list[LogEvent]]:
    return [span_from_flat(s) for s in doc.get("spans") or []], [log_from_flat(g) for g in doc.get("logs") or []]
