"""OTLP protobuf: `ExportTraceServiceRequest` / `ExportLogsServiceRequest` bytes (files or the wire)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from otel_replay.normalize.records import LogEvent, SpanEvent, SpanRecord
from otel_replay.normalize.sources.ids import hex_id, optional_hex_id
from otel_replay.normalize.sources.otlp_json import SPAN_KINDS, STATUS_CODES

MAX_DEPTH = 64


class OtlpDecodeError(ValueError):
    """Bytes that are not a valid OTLP protobuf request."""


def any_value(value: AnyValue, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise OtlpDecodeError(f"attribute value nested deeper than {MAX_DEPTH} levels")
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(v, depth + 1) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value, depth + 1) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def key_values(items: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in items}


def _parse(request: Any, data: bytes, what: str) -> Any:
    try:
        request.ParseFromString(data)
    except (DecodeError, RecursionError) as exc:
        raise OtlpDecodeError(f"not an OTLP protobuf {what} request: {exc}") from None
    return request


def parse_traces(data: bytes) -> ExportTraceServiceRequest:
    return _parse(ExportTraceServiceRequest(), data, "trace")


def parse_logs(data: bytes) -> ExportLogsServiceRequest:
    return _parse(ExportLogsServiceRequest(), data, "logs")


def spans_from_proto(request: ExportTraceServiceRequest) -> Iterator[SpanRecord]:
    for rs in request.resource_spans:
        resource = key_values(rs.resource.attributes)
        for ss in rs.scope_spans:
            scope = ss.scope
            for span in ss.spans:
                yield SpanRecord(
                    trace_id=hex_id(span.trace_id, 32, "traceId"),
                    span_id=hex_id(span.span_id, 16, "spanId"),
                    parent_span_id=optional_hex_id(span.parent_span_id, 16, "parentSpanId"),
                    name=span.name,
                    kind=SPAN_KINDS.get(span.kind, "UNSPECIFIED"),
                    start_ns=span.start_time_unix_nano or None,
                    end_ns=span.end_time_unix_nano or None,
                    status_code=STATUS_CODES.get(span.status.code, "unset"),
                    status_message=span.status.message or None,
                    attributes=key_values(span.attributes),
                    events=[SpanEvent(e.name, e.time_unix_nano or None, key_values(e.attributes)) for e in span.events],
                    links=[{"trace_id": optional_hex_id(link.trace_id, 32, "links.traceId"),
                            "span_id": optional_hex_id(link.span_id, 16, "links.spanId"),
                            "attributes": key_values(link.attributes)} for link in span.links],
                    resource=resource,
                    scope_name=scope.name or None,
                    scope_version=scope.version or None,
                )


def logs_from_proto(request: ExportLogsServiceRequest) -> Iterator[LogEvent]:
    for rl in request.resource_logs:
        for sl in rl.scope_logs:
            for rec in sl.log_records:
                yield LogEvent(
                    event_name=rec.event_name or None,
                    trace_id=optional_hex_id(rec.trace_id, 32, "traceId"),
                    span_id=optional_hex_id(rec.span_id, 16, "spanId"),
                    time_ns=rec.time_unix_nano or rec.observed_time_unix_nano or None,
                    body=any_value(rec.body),
                    attributes=key_values(rec.attributes),
                )
