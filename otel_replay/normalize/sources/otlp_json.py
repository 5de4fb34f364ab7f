"""OTLP/JSON: `ExportTraceServiceRequest` and `ExportLogsServiceRequest` documents.

Follows the OTLP JSON mapping: lowerCamelCase keys, hex ids (base64 tolerated, as protobuf's own
JSON printer writes them), int64 values as strings, enums as integers.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from typing import Any

from otel_replay.normalize.records import LogEvent, SpanEvent, SpanRecord
from otel_replay.normalize.sources.ids import hex_id, optional_hex_id

SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES = {0: "unset", 1: "ok", 2: "error"}
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_KIND_NAMES = {f"SPAN_KIND_{v}": k for k, v in SPAN_KINDS.items()}


class OtlpFormatError(ValueError):
    """The document is not OTLP/JSON of the expected shape."""


def any_value(value: Any) -> Any:
    """Decode an OTLP `AnyValue` into a plain Python value."""
    if not isinstance(value, Mapping) or not value:
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in (value["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in value:
        return key_values((value["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"]).hex()
    return None


def key_values(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        raise OtlpFormatError(f"attributes must be a list of key/value objects, got {type(items).__name__}")
    return {str(kv["key"]): any_value(kv.get("value")) for kv in items if isinstance(kv, Mapping) and "key" in kv}


def _int(value: Any) -> int | None:
    return None if value in (None, "", "0", 0) else int(value)


def _enum(value: Any, names: Mapping[str, int]) -> int:
    if isinstance(value, str):
        return names.get(value, 0) if not value.isdigit() else int(value)
    return int(value or 0)


def span_from_otlp(span: Mapping[str, Any], resource: Mapping[str, Any], scope: Mapping[str, Any]) -> SpanRecord:
    status = span.get("status") or {}
    return SpanRecord(
        trace_id=hex_id(span.get("traceId"), 32, "traceId"),
        span_id=hex_id(span.get("spanId"), 16, "spanId"),
        parent_span_id=optional_hex_id(span.get("parentSpanId"), 16, "parentSpanId"),
        name=str(span.get("name") or ""),
        kind=SPAN_KINDS.get(_enum(span.get("kind"), _KIND_NAMES), "UNSPECIFIED"),
        start_ns=_int(span.get("startTimeUnixNano")),
        end_ns=_int(span.get("endTimeUnixNano")),
        status_code=STATUS_CODES.get(_enum(status.get("code"), _STATUS_NAMES), "unset"),
        status_message=status.get("message") or None,
        attributes=key_values(span.get("attributes") or []),
        events=[
            SpanEvent(str(e.get("name") or ""), _int(e.get("timeUnixNano")), key_values(e.get("attributes") or []))
            for e in span.get("events") or []
        ],
        links=[
            {
                "trace_id": optional_hex_id(link.get("traceId"), 32, "links.traceId"),
                "span_id": optional_hex_id(link.get("spanId"), 16, "links.spanId"),
                "attributes": key_values(link.get("attributes") or []),
            }
            for link in span.get("links") or []
        ],
        resource=resource,
        scope_name=scope.get("name") or None,
        scope_version=scope.get("version") or None,
    )


def spans_from_request(doc: Mapping[str, Any], errors: list[tuple[str, str]] | None = None) -> Iterator[SpanRecord]:
    """Every span in an `ExportTraceServiceRequest` (raises OtlpFormatError on a wrong shape).

    With `errors`, a malformed span is skipped and recorded as (its path in the document, reason).
    """
    if not isinstance(doc, Mapping) or "resourceSpans" not in doc:
        raise OtlpFormatError("not an OTLP/JSON trace request: no 'resourceSpans' key")
    for i, rs in enumerate(_list(doc["resourceSpans"], "resourceSpans")):
        resource = key_values((rs.get("resource") or {}).get("attributes") or [])
        for j, ss in enumerate(_list(rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans"), "scopeSpans")):
            scope = ss.get("scope") or ss.get("instrumentationLibrary") or {}
            for k, span in enumerate(_list(ss.get("spans"), "spans")):
                try:
                    yield span_from_otlp(span, resource, scope)
                except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
                    if errors is None:
                        raise
                    errors.append((f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]", str(exc) or type(exc).__name__))


def _list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpFormatError(f"'{field}' must be a list, got {type(value).__name__}")
    return [v for v in value if isinstance(v, Mapping)]


def logs_from_request(doc: Mapping[str, Any]) -> Iterator[LogEvent]:
    """Every log record in an `ExportLogsServiceRequest`."""
    if not isinstance(doc, Mapping) or "resourceLogs" not in doc:
        raise OtlpFormatError("not an OTLP/JSON logs request: no 'resourceLogs' key")
    for rl in _list(doc["resourceLogs"], "resourceLogs"):
        for sl in _list(rl.get("scopeLogs"), "scopeLogs"):
            for rec in _list(sl.get("logRecords"), "logRecords"):
                yield LogEvent(
                    event_name=rec.get("eventName") or None,
                    trace_id=optional_hex_id(rec.get("traceId"), 32, "traceId"),
                    span_id=optional_hex_id(rec.get("spanId"), 16, "spanId"),
                    time_ns=_int(rec.get("timeUnixNano")) or _int(rec.get("observedTimeUnixNano")),
                    body=any_value(rec.get("body")),
                    attributes=key_values(rec.get("attributes") or []),
                )
