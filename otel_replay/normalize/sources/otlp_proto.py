"""OTLP protobuf: `ExportTraceServiceRequest` / `ExportLogsServiceRequest` bytes (files or the wire)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from otel_replay.normalize.records import LogEvent, SpanEvent, SpanRecord, TracePart, partition_of
from otel_replay.normalize.sources.checks import (
    MAX_DEPTH,
    MAX_STRING,
    check_attributes,
    check_log,
    check_span,
)
from otel_replay.normalize.sources.errors import SourceError, guarded
from otel_replay.normalize.sources.ids import hex_id, optional_hex_id
from otel_replay.normalize.sources.otlp_json import SPAN_KINDS, STATUS_CODES
from otel_replay.normalize.sources.times import MAX_NS, unix_ns


class OtlpDecodeError(SourceError):
    """Bytes that are not a valid OTLP protobuf request, or a value nested past the limit."""


def any_value(value: AnyValue, depth: int = 0, field: str = "value") -> Any:
    if depth > MAX_DEPTH:
        raise OtlpDecodeError(f"attribute value nested deeper than {MAX_DEPTH} levels", field=field)
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(v, depth + 1, field) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value, depth + 1, field) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def key_values(items: Any, field: str = "attributes") -> dict[str, Any]:
    out = {}
    for kv in items:
        value = kv.value
        if value.WhichOneof("value") == "string_value":  # the common case, without building a field name
            out[kv.key] = value.string_value
        else:
            out[kv.key] = any_value(value, 0, f"{field}.{kv.key[:200]}")
    return out


def _parse(request: Any, data: bytes | memoryview, what: str) -> Any:
    try:
        request.ParseFromString(data)
    except (DecodeError, RecursionError, ValueError, TypeError) as exc:
        raise OtlpDecodeError(f"not an OTLP protobuf {what} request: {exc}") from None
    return request


def parse_traces(data: bytes | memoryview) -> ExportTraceServiceRequest:
    return _parse(ExportTraceServiceRequest(), data, "trace")


def parse_logs(data: bytes | memoryview) -> ExportLogsServiceRequest:
    return _parse(ExportLogsServiceRequest(), data, "logs")


Unreadable = dict[tuple[int, ...], str]
"""Records a request could not be parsed into, by position: (resource,), (resource, scope) or
(resource, scope, record) -> why. Each is an empty placeholder in the request, so positions hold."""
MAX_SALVAGE_FIELDS = 200_000  # fields walked in Python when a request is read record by record
_LEVELS = {"traces": ((ExportTraceServiceRequest, "resource_spans"), (ResourceSpans, "scope_spans"),
                      (ScopeSpans, "spans"), (Span, "")),
           "logs": ((ExportLogsServiceRequest, "resource_logs"), (ResourceLogs, "scope_logs"),
                    (ScopeLogs, "log_records"), (LogRecord, ""))}
_UNREADABLE = ("cannot be parsed: malformed protobuf, or a value nested past the protobuf runtime's limit "
               "of 100 messages (in a record: 32 levels of kvlist, 49 of arrays)")


def read_request(signal: str, data: bytes | memoryview) -> tuple[Message, Unreadable]:
    """An `Export{Trace,Logs}ServiceRequest` ("traces" or "logs"), parsed whole when it can be.

    When it cannot (one record past the protobuf runtime's recursion limit, or one bad string, fails
    the whole parse), the request is split on the wire into its resources, scopes and records, and
    each is parsed alone: what parses is kept, what does not is an empty placeholder named in the
    second value. Raises `OtlpDecodeError` when the request itself is not OTLP.
    """
    levels = _LEVELS[signal]
    try:
        return (parse_traces(data) if signal == "traces" else parse_logs(data)), {}
    except OtlpDecodeError as whole:
        unreadable: Unreadable = {}
        budget = [MAX_SALVAGE_FIELDS]
        try:
            request = _split(memoryview(data), levels, 0, (), unreadable, budget)
        except _TooManyFields:
            raise OtlpDecodeError(f"{whole.reason}; and it has too many fields (over {MAX_SALVAGE_FIELDS}) "
                                  "to be read record by record") from None
        except (DecodeError, RecursionError, ValueError, TypeError):  # the request itself is not OTLP
            raise whole from None
        return request, unreadable  # possibly all of it: a record parsed alone is 3 messages less deep


class _TooManyFields(Exception):
    """Reading a request record by record would walk more than `MAX_SALVAGE_FIELDS` fields in Python."""


def _split(data: memoryview, levels: tuple[tuple[Any, str], ...], level: int, path: tuple[int, ...],
           unreadable: Unreadable, budget: list[int]) -> Message:
    """`data` as `levels[level]`, its repeated child field (number 1 in the request, 2 below) parsed
    item by item, and each item that does not parse split in turn, down to the records."""
    kind, child_field = levels[level]
    child_number = 1 if level == 0 else 2
    shell, children = bytearray(), []
    for number, start, payload, end in _wire_fields(data, budget):
        if number == child_number and payload >= 0:
            children.append(data[payload:end])
        else:
            shell += data[start:end]
    message = kind.FromString(bytes(shell))
    repeated = getattr(message, child_field)
    for index, child in enumerate(children):
        item, where = repeated.add(), (*path, index)
        try:
            item.ParseFromString(child)
            continue
        except (DecodeError, RecursionError, ValueError, TypeError):
            item.Clear()
        if level + 2 < len(levels):  # a resource or a scope: keep what of it parses
            try:
                item.CopyFrom(_split(child, levels, level + 1, where, unreadable, budget))
                continue
            except (DecodeError, RecursionError, ValueError, TypeError):
                item.Clear()
        unreadable[where] = _UNREADABLE
    return message


def _wire_fields(data: memoryview, budget: list[int]) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start, payload start or -1, end) of each field of a message's wire bytes."""
    pos, size = 0, len(data)
    while pos < size:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooManyFields
        start = pos
        key, pos = _varint(data, pos)
        number, wire, payload = key >> 3, key & 7, -1
        if wire == 0:
            pos = _varint(data, pos)[1]
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, payload = _varint(data, pos)
            pos = payload + length
        else:  # groups (3, 4) are not in OTLP; 6 and 7 are not wire types
            raise ValueError(f"wire type {wire} at byte {start}")
        if number == 0 or pos > size:
            raise ValueError(f"broken field at byte {start}")
        yield number, start, payload, pos


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(10):
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("varint longer than 10 bytes")


@guarded
def span_from_proto(span: Any, resource: dict[str, Any], scope: Any) -> SpanRecord:
    return check_span(SpanRecord(
        trace_id=hex_id(span.trace_id, 32, "traceId"),
        span_id=hex_id(span.span_id, 16, "spanId"),
        parent_span_id=optional_hex_id(span.parent_span_id, 16, "parentSpanId"),
        name=span.name,
        kind=SPAN_KINDS.get(span.kind, "UNSPECIFIED"),
        start_ns=unix_ns(span.start_time_unix_nano, "startTimeUnixNano"),
        end_ns=unix_ns(span.end_time_unix_nano, "endTimeUnixNano"),
        status_code=STATUS_CODES.get(span.status.code, "unset"),
        status_message=span.status.message or None,
        attributes=key_values(span.attributes),
        events=[SpanEvent(e.name, unix_ns(e.time_unix_nano, f"events[{i}].timeUnixNano"),
                          key_values(e.attributes, f"events[{i}].attributes")) for i, e in enumerate(span.events)],
        links=[{"trace_id": optional_hex_id(link.trace_id, 32, f"links[{i}].traceId"),
                "span_id": optional_hex_id(link.span_id, 16, f"links[{i}].spanId"),
                "attributes": key_values(link.attributes, f"links[{i}].attributes")} for i, link in enumerate(span.links)],
        resource=resource,
        scope_name=scope.name or None,
        scope_version=scope.version or None,
    ))


@guarded
def log_from_proto(rec: Any) -> LogEvent:
    attributes = key_values(rec.attributes)
    # LogRecord.event_name is in opentelemetry-proto 1.35 and later (reading it on an older one
    # raises); SDKs before 1.35 send the name as the `event.name` attribute
    name = getattr(rec, "event_name", "") or attributes.get("event.name")
    return check_log(LogEvent(
        event_name=name if name and isinstance(name, str) else None,
        trace_id=optional_hex_id(rec.trace_id, 32, "traceId"),
        span_id=optional_hex_id(rec.span_id, 16, "spanId"),
        time_ns=unix_ns(rec.time_unix_nano, "timeUnixNano") or unix_ns(rec.observed_time_unix_nano,
                                                                       "observedTimeUnixNano"),
        body=any_value(rec.body, 0, "body"),
        attributes=attributes,
    ))


_SCALAR_ONEOFS = frozenset({"string_value", "bool_value", "int_value", "double_value"})  # int64 always fits
_ZERO_TRACE, _ZERO_SPAN = bytes(16), bytes(8)


def _fast_span(span: Any, resource: dict[str, Any], scope_name: str | None,
               scope_version: str | None) -> SpanRecord | None:
    """The span, when it has the shape nearly every exporter sends (16/8-byte ids, set times in
    range, scalar attributes, no events or links); None otherwise.

    Makes every check `check_span` makes, inline. On None the caller takes the general path
    (`span_from_proto`), which reads the uncommon shapes and names the field at fault.
    """
    if span.events or span.links:
        return None
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    if (len(trace_id) != 16 or trace_id == _ZERO_TRACE or len(span_id) != 8 or span_id == _ZERO_SPAN
            or parent and (len(parent) != 8 or parent == _ZERO_SPAN)):
        return None
    name = span.name
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if len(name) > MAX_STRING or not 0 < start <= MAX_NS or not 0 < end <= MAX_NS:
        return None
    status = span.status
    message = status.message
    if len(message) > MAX_STRING:
        return None
    attributes: dict[str, Any] = {}
    for kv in span.attributes:
        key, value = kv.key, kv.value
        which = value.WhichOneof("value")
        if which == "string_value":
            item = value.string_value
            if len(item) > MAX_STRING:
                return None
        elif which in _SCALAR_ONEOFS:
            item = getattr(value, which)
        elif which == "array_value":  # gen_ai.response.finish_reasons and the like: scalars only
            item = _scalar_array(value.array_value.values)
            if item is None:
                return None
        else:
            return None
        if len(key) > MAX_STRING:
            return None
        attributes[key] = item
    return SpanRecord(trace_id.hex(), span_id.hex(), parent.hex() if parent else None, name,  # SPAN_FIELDS
                      SPAN_KINDS.get(span.kind, "UNSPECIFIED"), start, end, STATUS_CODES.get(status.code, "unset"),
                      message or None, attributes, [], [], resource, scope_name, scope_version)


def _scalar_array(values: Any) -> list[Any] | None:
    """An array of scalar values as `any_value` reads it; None when an item is not a short scalar."""
    out = []
    for value in values:
        which = value.WhichOneof("value")
        if which not in _SCALAR_ONEOFS:
            return None
        item = getattr(value, which)
        if which == "string_value" and len(item) > MAX_STRING:
            return None
        out.append(item)
    return out


def _scope_fields(scope: Any, resource: dict[str, Any]) -> tuple[str | None, str | None] | None:
    """(name, version) of a scope whose fields and resource pass `check_span`; None if either does not
    (its spans then take the general path, which names the field at fault)."""
    try:
        check_attributes(resource, "resource")
    except SourceError:
        return None
    name, version = scope.name or None, scope.version or None
    if name is not None and len(name) > MAX_STRING or version is not None and len(version) > MAX_STRING:
        return None
    return name, version


def _skip(errors: list[tuple[str, str]] | None, exc: SourceError, record: str) -> None:
    located = exc.located(within=record)
    if errors is None:
        raise located from None
    errors.append((located.record or record, located.problem))


def _unreadable(errors: list[tuple[str, str]] | None, unreadable: Unreadable, where: tuple[int, ...],
                record: str) -> bool:
    """Whether the resource, scope or record at `where` is a placeholder (reported, or raised without `errors`)."""
    reason = unreadable.get(where)
    if reason is None:
        return False
    _skip(errors, OtlpDecodeError(reason), record)
    return True


def spans_from_proto(request: ExportTraceServiceRequest, errors: list[tuple[str, str]] | None = None,
                     part: TracePart | None = None, unreadable: Unreadable | None = None) -> Iterator[SpanRecord]:
    """Every span of a request. With `errors`, a bad span (or resource) is skipped and recorded as
    (its path, reason); without, the first one raises. Each resource is decoded once. With `part`,
    only the spans of that part's traces (`partition_of`) are decoded; paths stay the request's.
    `unreadable` (from `read_request`) names placeholders, which are reported, whatever the part."""
    unreadable = unreadable or {}
    for i, rs in enumerate(request.resource_spans):
        if unreadable and _unreadable(errors, unreadable, (i,), f"resource_spans[{i}]"):
            continue
        try:
            resource = guarded(key_values)(rs.resource.attributes, "resource.attributes")
        except SourceError as exc:
            _skip(errors, exc, f"resource_spans[{i}]")
            continue
        for j, ss in enumerate(rs.scope_spans):
            if unreadable and _unreadable(errors, unreadable, (i, j), f"resource_spans[{i}].scope_spans[{j}]"):
                continue
            fields = _scope_fields(ss.scope, resource)
            for k, span in enumerate(ss.spans):
                if unreadable and _unreadable(errors, unreadable, (i, j, k),
                                              f"resource_spans[{i}].scope_spans[{j}].spans[{k}]"):
                    continue
                if part is not None and partition_of(span.trace_id.hex(), part[1]) != part[0]:
                    continue
                if fields is not None:
                    record = _fast_span(span, resource, *fields)
                    if record is not None:
                        yield record
                        continue
                try:
                    yield span_from_proto(span, resource, ss.scope)
                except SourceError as exc:
                    _skip(errors, exc, f"resource_spans[{i}].scope_spans[{j}].spans[{k}]")


def logs_from_proto(request: ExportLogsServiceRequest, errors: list[tuple[str, str]] | None = None,
                    part: TracePart | None = None, unreadable: Unreadable | None = None) -> Iterator[LogEvent]:
    """Every log record of a request (`errors`, `part` and `unreadable` as in `spans_from_proto`)."""
    unreadable = unreadable or {}
    for i, rl in enumerate(request.resource_logs):
        if unreadable and _unreadable(errors, unreadable, (i,), f"resource_logs[{i}]"):
            continue
        for j, sl in enumerate(rl.scope_logs):
            if unreadable and _unreadable(errors, unreadable, (i, j), f"resource_logs[{i}].scope_logs[{j}]"):
                continue
            for k, rec in enumerate(sl.log_records):
                if unreadable and _unreadable(errors, unreadable, (i, j, k),
                                              f"resource_logs[{i}].scope_logs[{j}].log_records[{k}]"):
                    continue
                if part is not None and partition_of(rec.trace_id.hex(), part[1]) != part[0]:
                    continue
                try:
                    yield log_from_proto(rec)
                except SourceError as exc:
                    _skip(errors, exc, f"resource_logs[{i}].scope_logs[{j}].log_records[{k}]")
