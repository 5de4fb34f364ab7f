"""Live OpenTelemetry SDK objects (`ReadableSpan`, `ReadWriteLogRecord`) as records.

Runs on the capture writer thread, never on the service's thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

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
    inner = getattr(attrs, "_dict", None)  # the SDK's BoundedAttributes: its dict copies in C, not item by item
    out = dict(inner if inner.__class__ is dict else attrs)
    fixed = [(key, value) for key, value in out.items() if value.__class__ not in _SCALARS]
    for key, value in fixed:
        if value.__class__ is tuple or value.__class__ is list:
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


_KINDS = {kind: kind.name for kind in SpanKind}


def _hex(value: int, width: int) -> str:
    return value.to_bytes(width, "big").hex()  # format(value, "032x"), at half the cost


def span_from_sdk(span: ReadableSpan) -> SpanRecord:
    try:  # an SDK span's own fields: its public properties copy events and links into new tuples
        attributes, events, links = span._attributes, span._events, span._links  # noqa: SLF001
    except AttributeError:
        attributes, events, links = span.attributes, span.events, span.links
    ctx = span.context
    parent = span.parent
    scope = span.instrumentation_scope
    status = span.status
    kind = span.kind
    # by position (the order of `otlp_json.SPAN_FIELDS`, checked there): runs on the capture writer per span
    return SpanRecord(
        _hex(ctx.trace_id, 16),
        _hex(ctx.span_id, 8),
        _hex(parent.span_id, 8) if parent is not None else None,
        span.name,
        _KINDS.get(kind) or kind.name,
        span.start_time,
        span.end_time,
        _STATUS.get(status.status_code, "unset"),
        status.description,
        plain_attributes(attributes),
        [SpanEvent(e.name, e.timestamp, plain_attributes(e.attributes)) for e in events] if events else [],
        [
            {
                "trace_id": _hex(link.context.trace_id, 16),
                "span_id": _hex(link.context.span_id, 8),
                "attributes": plain_attributes(link.attributes),
            }
            for link in links
        ] if links else [],
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
