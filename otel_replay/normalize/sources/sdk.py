"""Live OpenTelemetry SDK objects (`ReadableSpan`, `ReadWriteLogRecord`) as records.

Runs on the capture writer thread, never on the service's thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from otel_replay.normalize.records import LogEvent, SpanEvent, SpanRecord

_STATUS = {StatusCode.UNSET: "unset", StatusCode.OK: "ok", StatusCode.ERROR: "error"}


def plain(value: Any) -> Any:
    """Attribute values as JSON-ready Python values (tuples become lists)."""
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


_SCALARS = (str, int, float, bool)


def plain_attributes(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    """OTel attribute values are scalars or flat sequences of scalars: a shallow copy suffices."""
    if not attrs:
        return {}
    out = {}
    for key, value in attrs.items():
        cls = value.__class__
        if cls in _SCALARS:
            out[key] = value
        elif cls is tuple or cls is list:
            out[key] = [v if v.__class__ in _SCALARS else plain(v) for v in value]
        else:
            out[key] = plain(value)
    return out


_resource_cache: list[Any] = [None, {}]


def _resource(resource: Any) -> dict[str, Any]:
    """A process's spans share one Resource: convert it once (the same dict is returned)."""
    if resource is None:
        return {}
    if _resource_cache[0] is not resource:
        _resource_cache[:] = [resource, plain_attributes(resource.attributes)]
    return _resource_cache[1]


def span_from_sdk(span: ReadableSpan) -> SpanRecord:
    ctx = span.context
    parent = span.parent
    scope = span.instrumentation_scope
    status = span.status
    # by position (the order of `otlp_json.SPAN_FIELDS`, checked there): runs on the capture writer per span
    return SpanRecord(
        format(ctx.trace_id, "032x"),
        format(ctx.span_id, "016x"),
        format(parent.span_id, "016x") if parent is not None else None,
        span.name,
        span.kind.name,
        span.start_time,
        span.end_time,
        _STATUS.get(status.status_code, "unset"),
        status.description,
        plain_attributes(span.attributes),
        [SpanEvent(e.name, e.timestamp, plain_attributes(e.attributes)) for e in span.events],
        [
            {
                "trace_id": format(link.context.trace_id, "032x"),
                "span_id": format(link.context.span_id, "016x"),
                "attributes": plain_attributes(link.attributes),
            }
            for link in span.links
        ],
        _resource(span.resource),
        scope.name if scope else None,
        scope.version if scope else None,
    )


def log_from_sdk(record: Any) -> LogEvent:
    """A `ReadWriteLogRecord` (SDK >= 1.39) or a bare API `LogRecord`."""
    log = getattr(record, "log_record", record)
    trace_id = getattr(log, "trace_id", None)
    span_id = getattr(log, "span_id", None)
    return LogEvent(
        event_name=getattr(log, "event_name", None) or (log.attributes or {}).get("event.name"),
        trace_id=format(trace_id, "032x") if trace_id else None,
        span_id=format(span_id, "016x") if span_id else None,
        time_ns=getattr(log, "timestamp", None) or getattr(log, "observed_timestamp", None),
        body=plain(log.body),
        attributes=plain_attributes(log.attributes),
    )
