"""OTLP/JSON: `ExportTraceServiceRequest` and `ExportLogsServiceRequest` documents.

Follows the OTLP JSON mapping: lowerCamelCase keys, hex ids (base64 tolerated, as protobuf's own
JSON printer writes them), int64 values as strings, enums as integers.

Spans of the shape nearly every exporter writes take `_fast_span`, which makes `check_span`'s
checks inline as it reads; any other span takes `span_from_otlp`, which reads every shape the
mapping allows and names the field at fault (tests/test_fast_paths.py checks they agree).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any

from otel_replay.normalize.records import LogEvent, SpanEvent, SpanRecord, TracePart, partition_of
from otel_replay.normalize.sources.checks import (
    INT64,
    MAX_DEPTH,
    MAX_STRING,
    check_attributes,
    check_log,
    check_span,
)
from otel_replay.normalize.sources.errors import BadValue, SourceError, guarded, shown
from otel_replay.normalize.sources.ids import hex_id, optional_hex_id
from otel_replay.normalize.sources.shapes import mapping, optional_text, sequence, text
from otel_replay.normalize.sources.times import MAX_NS, unix_ns

SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES = {0: "unset", 1: "ok", 2: "error"}
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_KIND_NAMES = {f"SPAN_KIND_{v}": k for k, v in SPAN_KINDS.items()}
_FLOAT_WORDS = {"NaN", "Infinity", "-Infinity"}


class OtlpFormatError(SourceError):
    """The document is not OTLP/JSON of the expected shape."""


def _int64(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
        raise BadValue(f"expected an int64, got {type(value).__name__}", field=field)
    if isinstance(value, str) and (len(value) > 24 or not value.strip().lstrip("+-").isdigit()
                                   or not value.strip().isascii()):
        raise BadValue(f"{shown(value)} is not an int64", field=field)
    if isinstance(value, float) and not value.is_integer():  # also NaN and infinities
        raise BadValue(f"{value!r} is not an int64", field=field)
    number = int(value)
    if not INT64[0] <= number <= INT64[1]:
        raise BadValue(f"{shown(value)} is outside the int64 range", field=field)
    return number


def _double(value: Any, field: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and (value in _FLOAT_WORDS or len(value) <= 64):
        try:
            return float(value)
        except ValueError:
            pass
    raise BadValue(f"{shown(value)} is not a double", field=field)


def _bytes(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise BadValue(f"expected base64 text, got {type(value).__name__}", field=field)
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        raise BadValue(f"{shown(value)} is not base64", field=field) from None


def any_value(value: Any, field: str = "value", depth: int = 0, key: str | None = None) -> Any:
    """Decode an OTLP `AnyValue` into a plain Python value; errors name `field` (`.key`)."""
    if value.__class__ is not dict and not isinstance(value, Mapping) or not value:
        return None
    if "stringValue" in value and len(value) == 1 and value["stringValue"].__class__ is str:
        return value["stringValue"]  # the common case first
    if key is not None:  # the attribute's name, for errors (built only off the common path)
        field = f"{field}.{key[:200]}"
    if depth > MAX_DEPTH:
        raise BadValue(f"nested deeper than {MAX_DEPTH} levels", field=field)
    if "stringValue" in value:
        return text(value["stringValue"], field)
    if "intValue" in value:
        return _int64(value["intValue"], field)
    if "doubleValue" in value:
        return _double(value["doubleValue"], field)
    if "boolValue" in value:
        flag = value["boolValue"]
        if not isinstance(flag, bool):
            raise BadValue(f"{shown(flag)} is not a bool", field=field)
        return flag
    if "arrayValue" in value:
        items = sequence(mapping(value["arrayValue"], field).get("values"), f"{field}.arrayValue.values")
        return [any_value(v, field, depth + 1) for v in items]
    if "kvlistValue" in value:
        items = sequence(mapping(value["kvlistValue"], field).get("values"), f"{field}.kvlistValue.values")
        return {text(kv["key"], field): any_value(kv.get("value"), field, depth + 1)
                for kv in items if isinstance(kv, Mapping) and "key" in kv}
    if "bytesValue" in value:
        return _bytes(value["bytesValue"], field)
    return None


def key_values(items: Any, field: str = "attributes") -> dict[str, Any]:
    """A list of `KeyValue`s; an error names `field.<key>`."""
    if not isinstance(items, list):
        raise OtlpFormatError(f"must be a list of key/value objects, got {type(items).__name__}", field=field)
    out = {}
    for kv in items:
        if (kv.__class__ is dict or isinstance(kv, Mapping)) and "key" in kv:
            key = kv["key"]
            if key.__class__ is not str:
                key = text(key, f"{field}.key")
            out[key] = any_value(kv.get("value"), field, key=key)
    return out


def _enum(value: Any, names: Mapping[str, int], field: str) -> int:
    if isinstance(value, str):
        if value.isascii() and value.isdigit() and len(value) < 6:
            return int(value)
        return names.get(value, 0)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if value is None or isinstance(value, float) and value.is_integer() and abs(value) < 1e6:
        return int(value or 0)
    raise BadValue(f"{shown(value)} is not an enum value", field=field)


def _event(event: Any, i: int) -> SpanEvent:
    e = mapping(event, f"events[{i}]")
    return SpanEvent(text(e.get("name"), f"events[{i}].name"), unix_ns(e.get("timeUnixNano"), f"events[{i}].timeUnixNano"),
                     key_values(e.get("attributes") or [], f"events[{i}].attributes"))


def _link(link: Any, i: int) -> dict[str, Any]:
    link = mapping(link, f"links[{i}]")
    return {"trace_id": optional_hex_id(link.get("traceId"), 32, f"links[{i}].traceId"),
            "span_id": optional_hex_id(link.get("spanId"), 16, f"links[{i}].spanId"),
            "attributes": key_values(link.get("attributes") or [], f"links[{i}].attributes")}


@guarded
def span_from_otlp(span: Mapping[str, Any], resource: Mapping[str, Any], scope: Mapping[str, Any]) -> SpanRecord:
    span = mapping(span, "span")
    status = mapping(span.get("status"), "status")
    return check_span(SpanRecord(
        trace_id=hex_id(span.get("traceId"), 32, "traceId"),
        span_id=hex_id(span.get("spanId"), 16, "spanId"),
        parent_span_id=optional_hex_id(span.get("parentSpanId"), 16, "parentSpanId"),
        name=text(span.get("name"), "name"),
        kind=SPAN_KINDS.get(_enum(span.get("kind"), _KIND_NAMES, "kind"), "UNSPECIFIED"),
        start_ns=unix_ns(span.get("startTimeUnixNano"), "startTimeUnixNano"),
        end_ns=unix_ns(span.get("endTimeUnixNano"), "endTimeUnixNano"),
        status_code=STATUS_CODES.get(_enum(status.get("code"), _STATUS_NAMES, "status.code"), "unset"),
        status_message=optional_text(status.get("message"), "status.message"),
        attributes=key_values(span.get("attributes") or []),
        events=[_event(e, i) for i, e in enumerate(sequence(span.get("events"), "events"))],
        links=[_link(link, i) for i, link in enumerate(sequence(span.get("links"), "links"))],
        resource=resource,
        scope_name=optional_text(scope.get("name"), "scope.name"),
        scope_version=optional_text(scope.get("version"), "scope.version"),
    ))


SPAN_FIELDS = ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "status_code",
               "status_message", "attributes", "events", "links", "resource", "scope_name", "scope_version")
if tuple(f.name for f in dataclasses.fields(SpanRecord)) != SPAN_FIELDS:  # the fast paths pass them by position
    raise RuntimeError("SpanRecord's fields changed: update SPAN_FIELDS and the positional SpanRecord(...) calls")
_HEX16, _HEX32 = re.compile(r"[0-9a-f]{16}").fullmatch, re.compile(r"[0-9a-f]{32}").fullmatch
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_SLOW: Any = object()  # `_fast_value`'s "not a common shape"


def _fast_value(value: Any) -> Any:
    """An `AnyValue` of the common scalar shapes, already as `check_attributes` would accept it;
    `_SLOW` for anything else (the general path then decodes it, or names what is wrong)."""
    if value.__class__ is not dict or len(value) != 1:
        return _SLOW
    if "stringValue" in value:
        v = value["stringValue"]
        return v if v.__class__ is str and len(v) <= MAX_STRING else _SLOW
    if "intValue" in value:
        v = value["intValue"]
        if v.__class__ is str:  # int64 as a decimal string: at most 18 digits is always in range
            return int(v) if 0 < len(v) <= 18 and v.isdigit() and v.isascii() else _SLOW
        return v if v.__class__ is int and INT64[0] <= v <= INT64[1] else _SLOW
    if "boolValue" in value:
        v = value["boolValue"]
        return v if v.__class__ is bool else _SLOW
    if "doubleValue" in value:
        v = value["doubleValue"]
        return v if v.__class__ is float else _SLOW
    return _SLOW


def _fast_time(value: Any) -> int | None:
    """A set nanosecond time as a decimal string or int, in range; None for any other shape."""
    if value.__class__ is str:
        if not (0 < len(value) <= 19 and value.isdigit() and value.isascii()):
            return None
        value = int(value)
    elif value.__class__ is not int:
        return None
    return value if 0 < value <= MAX_NS else None


def _fast_span(span: Any, resource: Mapping[str, Any], scope_name: str | None,
               scope_version: str | None) -> SpanRecord | None:
    """The span, when it has the shape nearly every exporter writes (hex ids, decimal-string
    times, integer enums, scalar attributes, no events or links); None otherwise.

    Every check `check_span` makes is made here, inline, so the record is not checked twice.
    On None the caller takes the general path (`span_from_otlp`), which reads the uncommon
    shapes and raises the error naming the field for bad ones: this path never raises.
    """
    if span.__class__ is not dict:
        return None
    events, links = span.get("events"), span.get("links")
    if events is not None and (events.__class__ is not list or events) or \
            links is not None and (links.__class__ is not list or links):
        return None
    trace_id, span_id = span.get("traceId"), span.get("spanId")
    if (trace_id.__class__ is not str or not _HEX32(trace_id) or trace_id == _ZERO_TRACE
            or span_id.__class__ is not str or not _HEX16(span_id) or span_id == _ZERO_SPAN):
        return None
    parent = span.get("parentSpanId")
    if parent is not None:
        if parent == "":
            parent = None
        elif parent.__class__ is not str or not _HEX16(parent) or parent == _ZERO_SPAN:
            return None
    name = span.get("name")
    if name.__class__ is not str or not name or len(name) > MAX_STRING:
        return None
    kind = span.get("kind", 0)
    if kind is None:
        kind = 0
    elif kind.__class__ is not int:
        return None
    start, end = _fast_time(span.get("startTimeUnixNano")), _fast_time(span.get("endTimeUnixNano"))
    if start is None or end is None:
        return None
    status = span.get("status")
    if status is None:
        code, message = 0, None
    elif status.__class__ is dict:
        code, message = status.get("code", 0), status.get("message")
        if code is None:
            code = 0
        elif code.__class__ is not int:
            return None
        if message is not None and (message.__class__ is not str or len(message) > MAX_STRING):
            return None
    else:
        return None
    items = span.get("attributes")
    attributes: dict[str, Any] = {}
    if items:
        if items.__class__ is not list:
            return None
        for kv in items:
            if kv.__class__ is not dict:
                return None
            key = kv.get("key")
            if key.__class__ is not str or len(key) > MAX_STRING:
                return None
            value = kv.get("value")
            if value.__class__ is dict and len(value) == 1:
                text = value.get("stringValue")  # the common case inline
                if text.__class__ is str and len(text) <= MAX_STRING:
                    attributes[key] = text
                    continue
            value = _fast_value(value)
            if value is _SLOW:
                return None
            attributes[key] = value
    return SpanRecord(trace_id, span_id, parent, name, SPAN_KINDS.get(kind, "UNSPECIFIED"), start, end,  # SPAN_FIELDS
                      STATUS_CODES.get(code, "unset"), message or None, attributes, [], [], resource,
                      scope_name, scope_version)


def _scope_fields(scope: Mapping[str, Any], resource: Mapping[str, Any]) -> tuple[str | None, str | None] | None:
    """(name, version) of a scope whose fields and resource pass `check_span`; None if either
    does not (its spans then take the general path, which names the field at fault)."""
    try:
        check_attributes(resource, "resource")
        name = optional_text(scope.get("name"), "scope.name")
        version = optional_text(scope.get("version"), "scope.version")
    except SourceError:
        return None
    if name is not None and len(name) > MAX_STRING or version is not None and len(version) > MAX_STRING:
        return None
    return name, version


def _resource(outer: Mapping[str, Any]) -> dict[str, Any]:
    return key_values(mapping(outer.get("resource"), "resource").get("attributes") or [], "resource.attributes")


def spans_from_request(doc: Mapping[str, Any], errors: list[tuple[str, str]] | None = None,
                       part: TracePart | None = None) -> Iterator[SpanRecord]:
    """Every span in an `ExportTraceServiceRequest` (raises OtlpFormatError on a wrong shape).

    With `errors`, a malformed span (or resource, or scope) is skipped and recorded as (its path
    in the document, reason); without, the first one raises its `SourceError`. With `part`, only
    the spans of that part's traces (`partition_of`) are decoded, and a span without a trace id
    (always malformed) in every part: the caller reports each error once.
    """
    if not isinstance(doc, Mapping) or "resourceSpans" not in doc:
        raise OtlpFormatError("not an OTLP/JSON trace request: no 'resourceSpans' key")
    for i, rs in enumerate(_list(doc["resourceSpans"], "resourceSpans")):
        where = f"resourceSpans[{i}]"
        try:
            resource = _resource(rs)
            scopes = _list(rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans"), "scopeSpans")
        except SourceError as exc:
            _skip(errors, exc, where)
            continue
        for j, ss in enumerate(scopes):
            try:
                scope = mapping(ss.get("scope") or ss.get("instrumentationLibrary"), "scope")
                spans = _list(ss.get("spans"), "spans")
            except SourceError as exc:
                _skip(errors, exc, f"{where}.scopeSpans[{j}]")
                continue
            fields = _scope_fields(scope, resource)
            for k, span in enumerate(spans):
                if part is not None and "traceId" in span and partition_of(_trace_key(span), part[1]) != part[0]:
                    continue  # (a span with no trace id is only an error: every part reports it)
                if fields is not None:
                    record = _fast_span(span, resource, *fields)
                    if record is not None:
                        yield record
                        continue
                try:
                    yield span_from_otlp(span, resource, scope)
                except SourceError as exc:
                    _skip(errors, exc, f"{where}.scopeSpans[{j}].spans[{k}]")


_TRACE_ID_TEXT = re.compile(rb'"traceId"(\s*:\s*"([0-9A-Za-z+/=]*)")?')  # every "traceId"; group 1 when a plain string
_ESCAPED_KEY_LETTER = re.compile(rb"\\u00(?:74|72|61|63|65|49|64)")  # t r a c e I d (JSON escapes with a lower-case u)


def trace_parts_named(line: bytes, parts: int) -> set[int] | None:
    """The parts (`partition_of`) whose spans one JSON line of OTLP can hold, read from its text
    without parsing it, so an import worker parses only the lines that hold its traces.

    None when the text cannot tell, and every worker must parse the line: no trace id in it, a
    trace id that is not a plain string, a key written with escapes, or log records (which may
    name their span without a trace id). Extra parts (a link's trace, the word in some key) only
    cost a parse; a part left out would lose spans, hence every "traceId" must be a plain string.
    """
    if b'"resourceLogs"' in line:
        return None
    if _ESCAPED_KEY_LETTER.search(line):  # (faster alone than after a substring test for its prefix)
        return None
    found = _TRACE_ID_TEXT.findall(line)
    if not found or not all(string for string, _ in found):
        return None
    return {partition_of(_trace_id_key(trace_id.decode("ascii")), parts) for _, trace_id in set(found)}


def _trace_key(record: Mapping[str, Any]) -> str:
    """A record's trace id as the decoder will spell it (lower-case hex), for `partition_of`: a trace
    whose spans spell it differently (hex, upper case, base64, a number) stays whole in one part."""
    return _trace_id_key(record.get("traceId"))


def _trace_id_key(trace_id: Any) -> str:
    try:
        return hex_id(trace_id, 32, "traceId")
    except SourceError:  # not an id: the span is malformed, and reported by the part of its text
        return trace_id.lower() if isinstance(trace_id, str) else ""


def _skip(errors: list[tuple[str, str]] | None, exc: SourceError, record: str) -> None:
    """Record a skipped part of a request, or raise its error (located) when not collecting."""
    located = exc.located(within=record)
    if errors is None:
        raise located from None
    errors.append((located.record or record, located.problem))


def _list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpFormatError(f"must be a list, got {type(value).__name__}", field=field)
    return [v for v in value if v.__class__ is dict or isinstance(v, Mapping)]


@guarded
def log_from_otlp(rec: Mapping[str, Any]) -> LogEvent:
    rec = mapping(rec, "logRecord")
    attributes = key_values(rec.get("attributes") or [])
    name = attributes.get("event.name")  # where SDKs before 1.35 put it (no eventName field)
    return check_log(LogEvent(
        event_name=optional_text(rec.get("eventName"), "eventName") or (name if isinstance(name, str) else None),
        trace_id=optional_hex_id(rec.get("traceId"), 32, "traceId"),
        span_id=optional_hex_id(rec.get("spanId"), 16, "spanId"),
        time_ns=unix_ns(rec.get("timeUnixNano"), "timeUnixNano") or unix_ns(rec.get("observedTimeUnixNano"),
                                                                             "observedTimeUnixNano"),
        body=any_value(rec.get("body"), "body"),
        attributes=attributes,
    ))


def logs_from_request(doc: Mapping[str, Any], errors: list[tuple[str, str]] | None = None,
                      part: TracePart | None = None) -> Iterator[LogEvent]:
    """Every log record in an `ExportLogsServiceRequest` (`errors` and `part` as in `spans_from_request`)."""
    if not isinstance(doc, Mapping) or "resourceLogs" not in doc:
        raise OtlpFormatError("not an OTLP/JSON logs request: no 'resourceLogs' key")
    for i, rl in enumerate(_list(doc["resourceLogs"], "resourceLogs")):
        try:
            scopes = _list(rl.get("scopeLogs"), "scopeLogs")
        except SourceError as exc:
            _skip(errors, exc, f"resourceLogs[{i}]")
            continue
        for j, sl in enumerate(scopes):
            try:
                records = _list(sl.get("logRecords"), "logRecords")
            except SourceError as exc:
                _skip(errors, exc, f"resourceLogs[{i}].scopeLogs[{j}]")
                continue
            for k, rec in enumerate(records):
                if part is not None and partition_of(_trace_key(rec), part[1]) != part[0]:
                    continue
                try:
                    yield log_from_otlp(rec)
                except SourceError as exc:
                    _skip(errors, exc, f"resourceLogs[{i}].scopeLogs[{j}].logRecords[{k}]")
