"""Jaeger JSON: the query API / UI download format (`{"data": [{"traceID", "spans", "processes"}]}`).

Times are microseconds; attributes are typed `tags`; span events are `logs` whose `event` field
names them; status and kind travel as the `otel.status_code` / `span.kind` tags the OTLP
translation writes.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from typing import Any

from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.normalize.sources.ids import hex_id

KINDS = {"client": "CLIENT", "server": "SERVER", "internal": "INTERNAL", "producer": "PRODUCER", "consumer": "CONSUMER"}
CONSUMED_TAGS = frozenset({"otel.status_code", "otel.status_description", "span.kind", "otel.scope.name",
                           "otel.scope.version", "otel.library.name", "otel.library.version", "error"})


class JaegerFormatError(ValueError):
    """The document is not Jaeger JSON."""


def tag_value(tag: Mapping[str, Any]) -> Any:
    value = tag.get("value")
    kind = str(tag.get("type") or "string").lower()
    if kind in ("int64", "int"):
        return int(value)
    if kind in ("float64", "float"):
        return float(value)
    if kind == "bool":
        return value if isinstance(value, bool) else str(value).lower() == "true"
    if kind == "binary":
        return base64.b64decode(value).hex() if isinstance(value, str) else value
    return value


def tags(items: Any) -> dict[str, Any]:
    return {str(t["key"]): tag_value(t) for t in items or [] if isinstance(t, Mapping) and "key" in t}


def _hex(value: Any, width: int, field: str) -> str:
    text = str(value or "").lower()
    return hex_id(text.zfill(width) if len(text) < width and text else text, width, field)


def span_from_jaeger(span: Mapping[str, Any], processes: Mapping[str, Any]) -> SpanRecord:
    attributes = tags(span.get("tags"))
    process = processes.get(span.get("processID"), {}) if isinstance(processes, Mapping) else {}
    resource = tags(process.get("tags"))
    if process.get("serviceName"):
        resource["service.name"] = process["serviceName"]
    parent = next((r for r in span.get("references") or []
                   if isinstance(r, Mapping) and r.get("refType", "CHILD_OF") == "CHILD_OF"), None)
    status = str(attributes.get("otel.status_code") or "").lower()
    if attributes.get("error") is True and not status:
        status = "error"
    start_us = int(span.get("startTime") or 0)
    events = []
    for log in span.get("logs") or []:
        fields = tags(log.get("fields"))
        events.append(SpanEvent(str(fields.pop("event", "log")), int(log.get("timestamp") or 0) * 1000, fields))
    return SpanRecord(
        trace_id=_hex(span.get("traceID"), 32, "traceID"),
        span_id=_hex(span.get("spanID"), 16, "spanID"),
        parent_span_id=_hex(parent.get("spanID"), 16, "references.spanID") if parent else None,
        name=str(span.get("operationName") or ""),
        kind=KINDS.get(str(attributes.get("span.kind") or "").lower(), "INTERNAL"),
        start_ns=start_us * 1000 if start_us else None,
        end_ns=(start_us + int(span.get("duration") or 0)) * 1000 if start_us else None,
        status_code=status if status in ("ok", "error") else "unset",
        status_message=attributes.get("otel.status_description"),
        attributes={k: v for k, v in attributes.items() if k not in CONSUMED_TAGS},
        events=events,
        resource=resource,
        scope_name=attributes.get("otel.scope.name") or attributes.get("otel.library.name"),
        scope_version=attributes.get("otel.scope.version") or attributes.get("otel.library.version"),
    )


def spans_from_jaeger(doc: Any) -> Iterator[SpanRecord]:
    traces = doc.get("data") if isinstance(doc, Mapping) else None
    if not isinstance(traces, list):
        raise JaegerFormatError("not Jaeger JSON: expected an object with a 'data' list of traces")
    for trace in traces:
        if not isinstance(trace, Mapping) or not isinstance(trace.get("spans"), list):
            raise JaegerFormatError("not Jaeger JSON: a trace without a 'spans' list")
        for span in trace["spans"]:
            yield span_from_jaeger(span, trace.get("processes") or {})
