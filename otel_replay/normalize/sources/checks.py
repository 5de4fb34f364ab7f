"""What every reader guarantees about the records it returns, checked in one place.

A record that passes `check_span` / `check_log` can be normalized and stored: ids are lowercase
hex of the right width, times are `times.unix_ns` values, text fields are str, and attribute
values are JSON-like (str, int within int64, float, bool, None, lists, str-keyed dicts) nested at
most `MAX_DEPTH` levels, with no string longer than `MAX_STRING` characters. A record that does not pass raises `BadValue` / `BadId` / `BadTime`
naming the field, and the caller skips it: one bad value never costs the rest of a file or a
request (in the receiver it would otherwise fail the writer's whole batch of accepted spans).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from otel_replay.normalize.records import LogEvent, SpanEvent, SpanRecord
from otel_replay.normalize.sources.errors import BadValue, shown
from otel_replay.normalize.sources.ids import BadId
from otel_replay.normalize.sources.times import MAX_NS, BadTime

MAX_DEPTH = 64  # levels of lists/maps inside one attribute value (OTLP nests AnyValue without limit)
# Characters in one string (an attribute value, a name). A 1M-token context is ~4M characters;
# storing a value costs ~10x its size in memory while a batch is written, so longer is refused.
MAX_STRING = 32 * 1024 * 1024
INT64 = (-(2**63), 2**63 - 1)
_HEX = {16: re.compile(r"[0-9a-f]{16}"), 32: re.compile(r"[0-9a-f]{32}")}
_SCALARS = (float, bool, type(None))


def _id(value: Any, width: int, field: str) -> None:
    if not isinstance(value, str) or not _HEX[width].fullmatch(value):
        raise BadId(f"{shown(value)} is not a {width}-hex-digit id", field=field)


def _time(value: Any, field: str) -> None:
    if value is not None and (type(value) is not int or not 0 < value <= MAX_NS):
        raise BadTime(f"{shown(value)} is not a time in nanoseconds since 1970", field=field)


def _text(value: Any, field: str, optional: bool = True) -> None:
    if not isinstance(value, str) and not (optional and value is None):
        raise BadValue(f"expected text, got {type(value).__name__}", field=field)
    if value is not None and len(value) > MAX_STRING:
        _too_long(value, field)


def _too_long(value: str, field: str) -> None:
    raise BadValue(f"a string of {len(value) >> 20} M characters is longer than the limit of "
                   f"{MAX_STRING >> 20} M", field=field)


def check_value(value: Any, field: str, depth: int = 0) -> None:
    """An attribute value the store can serialize: JSON-like, ints in int64, `MAX_DEPTH` deep."""
    cls = value.__class__
    if cls is str:
        if len(value) > MAX_STRING:
            _too_long(value, field)
        return
    if cls in _SCALARS:
        return
    if cls is int:
        if not INT64[0] <= value <= INT64[1]:
            raise BadValue(f"integer {shown(value)} is outside the int64 range", field=field)
        return
    if depth >= MAX_DEPTH:
        raise BadValue(f"nested deeper than {MAX_DEPTH} levels", field=field)
    if cls is list or cls is tuple:
        for item in value:
            if item.__class__ not in _SCALARS:
                check_value(item, field, depth + 1)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadValue(f"map key {shown(key)} is not text", field=field)
            if item.__class__ not in _SCALARS:
                check_value(item, field, depth + 1)
        return
    if isinstance(value, (int, float, str)):  # bool is handled above; subclasses (IntEnum, ...) are fine
        if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
            raise BadValue(f"integer {shown(value)} is outside the int64 range", field=field)
        if isinstance(value, str) and len(value) > MAX_STRING:
            _too_long(value, field)
        return
    raise BadValue(f"a {cls.__name__} is not an attribute value", field=field)


def check_attributes(attributes: Any, field: str) -> None:
    if attributes.__class__ is not dict and not isinstance(attributes, Mapping):
        raise BadValue(f"expected a map of attributes, got {type(attributes).__name__}", field=field)
    for key, value in attributes.items():
        if key.__class__ is not str and not isinstance(key, str) or len(key) > MAX_STRING:
            raise BadValue(f"attribute key {shown(key)} is not text (or too long)", field=field)
        if value.__class__ is str and len(value) <= MAX_STRING:
            continue  # the common case
        if value.__class__ not in _SCALARS:
            check_value(value, f"{field}.{key}" if len(key) < 200 else f"{field}.{key[:200]}...")


def _event(event: Any, i: int) -> None:
    if not isinstance(event, SpanEvent):
        raise BadValue(f"expected a span event, got {type(event).__name__}", field=f"events[{i}]")
    _text(event.name, f"events[{i}].name", optional=False)
    _time(event.time_ns, f"events[{i}].time")
    check_attributes(event.attributes, f"events[{i}].attributes")


def check_span(span: SpanRecord) -> SpanRecord:
    """`span` itself if it can be stored; a `SourceError` naming the first bad field otherwise."""
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    if trace_id.__class__ is not str or not _HEX[32].fullmatch(trace_id):
        _id(trace_id, 32, "traceId")
    if span_id.__class__ is not str or not _HEX[16].fullmatch(span_id):
        _id(span_id, 16, "spanId")
    if parent is not None and (parent.__class__ is not str or not _HEX[16].fullmatch(parent)):
        _id(parent, 16, "parentSpanId")
    # (each check spelled out: a loop over a tuple of (value, field) tuples cost more than the checks)
    name, kind, code, message = span.name, span.kind, span.status_code, span.status_message
    if name.__class__ is not str or len(name) > MAX_STRING:
        _text(name, "name", False)
    if kind.__class__ is not str or len(kind) > MAX_STRING:
        _text(kind, "kind", False)
    if code.__class__ is not str or len(code) > MAX_STRING:
        _text(code, "status.code", False)
    if message is not None and (message.__class__ is not str or len(message) > MAX_STRING):
        _text(message, "status.message")
    scope_name, scope_version = span.scope_name, span.scope_version
    if scope_name is not None and (scope_name.__class__ is not str or len(scope_name) > MAX_STRING):
        _text(scope_name, "scope.name")
    if scope_version is not None and (scope_version.__class__ is not str or len(scope_version) > MAX_STRING):
        _text(scope_version, "scope.version")
    start, end = span.start_ns, span.end_ns
    if start is not None and (start.__class__ is not int or not 0 < start <= MAX_NS):
        _time(start, "startTime")
    if end is not None and (end.__class__ is not int or not 0 < end <= MAX_NS):
        _time(end, "endTime")
    check_attributes(span.attributes, "attributes")
    check_attributes(span.resource, "resource")
    if span.events.__class__ is not list or span.links.__class__ is not list:
        raise BadValue("events and links must be lists", field="events" if span.events.__class__ is not list else "links")
    for i, event in enumerate(span.events):
        _event(event, i)
    for i, link in enumerate(span.links):
        check_attributes(link, f"links[{i}]")
    return span


def check_log(log: LogEvent) -> LogEvent:
    """`log` itself if it can be stored and joined to its span; a `SourceError` otherwise."""
    if log.trace_id is not None:
        _id(log.trace_id, 32, "traceId")
    if log.span_id is not None:
        _id(log.span_id, 16, "spanId")
    _text(log.event_name, "eventName")
    _time(log.time_ns, "time")
    if log.body.__class__ not in _SCALARS:
        check_value(log.body, "body")
    check_attributes(log.attributes, "attributes")
    return log
