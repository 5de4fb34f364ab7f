"""The original trace with its blame spans merged in, as files: Jaeger JSON (the query API / UI
upload format) and OTLP/JSON (an ExportTraceServiceRequest, as Grafana's "Import trace" takes)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.normalize.sources.otlp_json import SPAN_KINDS
from otel_replay.normalize.sources.sdk import span_from_sdk

_KIND_NUMBERS = {v: k for k, v in SPAN_KINDS.items()}
_STATUS_NUMBERS = {"unset": 0, "ok": 1, "error": 2}


def record_from_row(row: dict[str, Any]) -> SpanRecord:
    """A stored span row (the `spans` view) as a record."""
    return SpanRecord(
        trace_id=row["trace_id"], span_id=row["span_id"], parent_span_id=row["parent_span_id"], name=row["name"],
        kind=row["span_kind"] or "INTERNAL", start_ns=row["start_ns"], end_ns=row["end_ns"],
        status_code=row["status_code"] or "unset", status_message=row["status_message"],
        attributes=json.loads(row["attributes"] or "{}"),
        events=[SpanEvent(e["name"], e.get("time_ns"), e.get("attributes") or {}) for e in json.loads(row["events"] or "[]")],
        links=json.loads(row["links"] or "[]"), resource=json.loads(row["resource"] or "{}"),
        scope_name=row["scope_name"], scope_version=row["scope_version"])


def records(original: Sequence[dict[str, Any]], blame: Sequence[ReadableSpan]) -> list[SpanRecord]:
    return [record_from_row(r) for r in original] + [span_from_sdk(s) for s in blame]


# -- Jaeger ----------------------------------------------------------------------------------------
def _tag(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return {"key": key, "type": "string", "value": text}


def to_jaeger(spans: Sequence[SpanRecord]) -> dict[str, Any]:
    traces: dict[str, dict[str, Any]] = {}
    for span in spans:
        trace = traces.setdefault(span.trace_id, {"traceID": span.trace_id, "spans": [], "processes": {}, "warnings": None})
        service = span.service_name or "unknown"
        process_id = next((p for p, proc in trace["processes"].items() if proc["serviceName"] == service), None)
        if process_id is None:
            process_id = f"p{len(trace['processes']) + 1}"
            trace["processes"][process_id] = {"serviceName": service, "tags": [
                _tag(k, v) for k, v in span.resource.items() if k != "service.name"]}
        tags = [_tag(k, v) for k, v in span.attributes.items()]
        tags.append(_tag("span.kind", span.kind.lower()))
        if span.scope_name:
            tags.append(_tag("otel.scope.name", span.scope_name))
        if span.status_code != "unset":
            tags.append(_tag("otel.status_code", span.status_code.upper()))
        if span.status_code == "error":
            tags.append(_tag("error", True))
        start_us = (span.start_ns or 0) // 1000
        references: list[dict[str, Any]] = [{"refType": "CHILD_OF", "traceID": span.trace_id, "spanID": span.parent_span_id}] \
            if span.parent_span_id else []
        references += [{"refType": "FOLLOWS_FROM", "traceID": link.get("trace_id"), "spanID": link.get("span_id")}
                       for link in span.links if link.get("span_id")]
        trace["spans"].append({
            "traceID": span.trace_id, "spanID": span.span_id, "operationName": span.name, "references": references,
            "startTime": start_us, "duration": max(0, ((span.end_ns or span.start_ns or 0) // 1000) - start_us),
            "tags": tags, "processID": process_id, "warnings": None,
            "logs": [{"timestamp": (e.time_ns or 0) // 1000,
                      "fields": [_tag("event", e.name)] + [_tag(k, v) for k, v in e.attributes.items()]}
                     for e in span.events]})
    return {"data": list(traces.values()), "total": 0, "limit": 0, "offset": 0, "errors": None}


# -- OTLP/JSON -------------------------------------------------------------------------------------
def any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": [{"key": str(k), "value": any_value(v)} for k, v in value.items()]}}
    return {"stringValue": "" if value is None else str(value)}


def _attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": any_value(v)} for k, v in values.items() if v is not None]


def to_otlp_json(spans: Sequence[SpanRecord]) -> dict[str, Any]:
    grouped: dict[str, dict[tuple[str | None, str | None], list[SpanRecord]]] = defaultdict(lambda: defaultdict(list))
    resources: dict[str, dict[str, Any]] = {}
    for span in spans:
        key = json.dumps(span.resource, sort_keys=True, default=str)
        resources[key] = dict(span.resource)
        grouped[key][(span.scope_name, span.scope_version)].append(span)
    return {"resourceSpans": [{
        "resource": {"attributes": _attributes(resources[key])},
        "scopeSpans": [{"scope": {k: v for k, v in (("name", name), ("version", version)) if v},
                        "spans": [_otlp_span(s) for s in members]}
                       for (name, version), members in scopes.items()]}
        for key, scopes in grouped.items()]}


def _otlp_span(span: SpanRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": span.trace_id, "spanId": span.span_id, "name": span.name,
        "kind": _KIND_NUMBERS.get(span.kind, 1), "startTimeUnixNano": str(span.start_ns or 0),
        "endTimeUnixNano": str(span.end_ns or span.start_ns or 0), "attributes": _attributes(dict(span.attributes)),
        "events": [{"name": e.name, "timeUnixNano": str(e.time_ns or 0), "attributes": _attributes(dict(e.attributes))}
                   for e in span.events],
        "links": [{"traceId": link["trace_id"], "spanId": link["span_id"],
                   "attributes": _attributes(link.get("attributes") or {})} for link in span.links if link.get("span_id")],
        "status": {"code": _STATUS_NUMBERS.get(span.status_code, 0), **({"message": span.status_message}
                                                                        if span.status_message else {})},
    }
    if span.parent_span_id:
        out["parentSpanId"] = span.parent_span_id
    return out
