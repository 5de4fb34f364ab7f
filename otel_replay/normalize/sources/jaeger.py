"""Jaeger JSON: the query API / UI download format (`{"data": [{"traceID", "spans", "processes"}]}`).

Times are microseconds; attributes are typed `tags`; span events are `logs` whose `event` field
names them; status and kind travel as the `otel.status_code` / `span.kind` tags the OTLP
translation writes.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterator, Mapping
from typing import Any

from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.normalize.sources.checks import INT64, check_span
from otel_replay.normalize.sources.errors import BadValue, SourceError, guarded, shown
from otel_replay.normalize.sources.ids import hex_id
from otel_replay.normalize.sources.shapes import mapping, optional_text, sequence, text
from otel_replay.normalize.sources.times import BadTime, in_range, scaled_ns

KINDS = {"client": "CLIENT", "server": "SERVER", "internal": "INTERNAL", "producer": "PRODUCER", "consumer": "CONSUMER"}
CONSUMED_TAGS = frozenset({"otel.status_code", "otel.status_description", "span.kind", "otel.scope.name",
                           "otel.scope.version", "otel.library.name", "otel.library.version", "error"})


class JaegerFormatError(SourceError):
    """The document is not Jaeger JSON."""


def _number(value: Any, kind: str, field: str) -> int | float:
    try:
        if isinstance(value, str) and len(value) > 64:
            raise ValueError
        number = int(value) if kind.startswith("int") else float(value)
    except (TypeError, ValueError, OverflowError):
        raise BadValue(f"{shown(value)} is not a {kind}", field=field) from None
    if isinstance(number, int) and not INT64[0] <= number <= INT64[1]:
        raise BadValue(f"{shown(value)} is outside the int64 range", field=field)
    return number


def tag_value(tag: Mapping[str, Any], field: str = "tags") -> Any:
    value = tag.get("value")
    kind = text(tag.get("type"), f"{field}.type", "string").lower()
    if kind in ("int64", "int", "float64", "float"):
        return _number(value, kind, field)
    if kind == "bool":
        return value if isinstance(value, bool) else str(value).lower() == "true"
    if kind == "binary":
        if not isinstance(value, str):
            return value
        try:
            return base64.b64decode(value).hex()
        except (binascii.Error, ValueError):
            raise BadValue(f"{shown(value)} is not base64", field=field) from None
    return value


def tags(items: Any, field: str = "tags") -> dict[str, Any]:
    out = {}
    for t in sequence(items, field):
        if isinstance(t, Mapping) and "key" in t:
            key = text(t["key"], f"{field}.key")
            out[key] = tag_value(t, f"{field}.{key[:200]}")
    return out


def _hex(value: Any, width: int, field: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) or value is None:
        value = "" if value is None or isinstance(value, float) and not math.isfinite(value) else str(value)
    if not isinstance(value, str):
        return hex_id(value, width, field)  # its error names the type
    text_ = value.lower()
    return hex_id(text_.zfill(width) if 0 < len(text_) < width else text_, width, field)


def _time(value: Any, field: str) -> int | None:
    """Microseconds since 1970 as nanoseconds (None when unset)."""
    ns = scaled_ns(value, 1000, field)
    return in_range(ns, field, value) if ns is not None else None


@guarded
def span_from_jaeger(span: Mapping[str, Any], processes: Mapping[str, Any]) -> SpanRecord:
    span = mapping(span, "span")
    attributes = tags(span.get("tags"))
    process_id = span.get("processID")
    process = processes.get(process_id, {}) if isinstance(processes, Mapping) and isinstance(process_id, str) else {}
    process = mapping(process, "processes")
    resource = tags(process.get("tags"), "processes.tags")
    if process.get("serviceName"):
        resource["service.name"] = text(process["serviceName"], "processes.serviceName")
    parent = next((r for r in sequence(span.get("references"), "references")
                   if isinstance(r, Mapping) and r.get("refType", "CHILD_OF") == "CHILD_OF"), None)
    status = str(attributes.get("otel.status_code") or "").lower()
    if attributes.get("error") is True and not status:
        status = "error"
    start = _time(span.get("startTime"), "startTime")
    duration = scaled_ns(span.get("duration"), 1000, "duration") or 0
    if duration < 0:
        raise BadTime(f"{shown(span.get('duration'))} is a negative duration", field="duration")
    events = []
    for i, log in enumerate(sequence(span.get("logs"), "logs")):
        fields = tags(mapping(log, f"logs[{i}]").get("fields"), f"logs[{i}].fields")
        events.append(SpanEvent(str(fields.pop("event", "log")), _time(log.get("timestamp"), f"logs[{i}].timestamp"),
                                fields))
    return check_span(SpanRecord(
        trace_id=_hex(span.get("traceID"), 32, "traceID"),
        span_id=_hex(span.get("spanID"), 16, "spanID"),
        parent_span_id=_hex(parent.get("spanID"), 16, "references.spanID") if parent else None,
        name=text(span.get("operationName"), "operationName"),
        kind=KINDS.get(str(attributes.get("span.kind") or "").lower(), "INTERNAL"),
        start_ns=start,
        end_ns=in_range(start + duration, "duration") if start else None,
        status_code=status if status in ("ok", "error") else "unset",
        status_message=optional_text(attributes.get("otel.status_description"), "otel.status_description"),
        attributes={k: v for k, v in attributes.items() if k not in CONSUMED_TAGS},
        events=events,
        resource=resource,
        scope_name=optional_text(attributes.get("otel.scope.name") or attributes.get("otel.library.name"),
                                 "otel.scope.name"),
        scope_version=optional_text(attributes.get("otel.scope.version") or attributes.get("otel.library.version"),
                                    "otel.scope.version"),
    ))


def spans_from_jaeger(doc: Any) -> Iterator[SpanRecord]:
    traces = doc.get("data") if isinstance(doc, Mapping) else None
    if not isinstance(traces, list):
        raise JaegerFormatError("not Jaeger JSON: expected an object with a 'data' list of traces")
    for trace in traces:
        if not isinstance(trace, Mapping) or not isinstance(trace.get("spans"), list):
            raise JaegerFormatError("not Jaeger JSON: a trace without a 'spans' list")
        for span in trace["spans"]:
            yield span_from_jaeger(span, trace.get("processes") or {})
