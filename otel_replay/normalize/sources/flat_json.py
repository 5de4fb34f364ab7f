"""The flat span/log dump used by the shared fixtures (`{"spans": [...], "logs": [...]}`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from otel_replay.normalize.records import LogEvent, SpanEvent, SpanRecord
from otel_replay.normalize.sources.checks import check_log, check_span
from otel_replay.normalize.sources.errors import BadRecord, SourceError, guarded, reading
from otel_replay.normalize.sources.ids import hex_id, optional_hex_id
from otel_replay.normalize.sources.shapes import mapping, optional_text, sequence, text
from otel_replay.normalize.sources.times import unix_ns

R = TypeVar("R")


def _event(event: Any, i: int) -> SpanEvent:
    e = mapping(event, f"events[{i}]")
    return SpanEvent(text(e.get("name"), f"events[{i}].name"),
                     unix_ns(e.get("time_unix_nano") or e.get("timestamp"), f"events[{i}].time_unix_nano"),
                     dict(mapping(e.get("attributes"), f"events[{i}].attributes")))


@guarded
def span_from_flat(span: Mapping[str, Any]) -> SpanRecord:
    span = mapping(span, "span")
    status = mapping(span.get("status"), "status")
    scope = mapping(span.get("instrumentation_scope"), "instrumentation_scope")
    return check_span(SpanRecord(
        trace_id=hex_id(span.get("trace_id"), 32, "trace_id"),
        span_id=hex_id(span.get("span_id"), 16, "span_id"),
        parent_span_id=optional_hex_id(span.get("parent_span_id"), 16, "parent_span_id"),
        name=text(span.get("name"), "name"),
        kind=text(span.get("kind"), "kind", "INTERNAL"),
        start_ns=unix_ns(span.get("start_time_unix_nano"), "start_time_unix_nano"),
        end_ns=unix_ns(span.get("end_time_unix_nano"), "end_time_unix_nano"),
        status_code=text(status.get("code"), "status.code", "UNSET").lower(),
        status_message=optional_text(status.get("description"), "status.description"),
        attributes=dict(mapping(span.get("attributes"), "attributes")),
        events=[_event(e, i) for i, e in enumerate(sequence(span.get("events"), "events"))],
        links=list(sequence(span.get("links"), "links")),
        resource=dict(mapping(mapping(span.get("resource"), "resource").get("attributes"), "resource.attributes")),
        scope_name=optional_text(scope.get("name"), "instrumentation_scope.name"),
        scope_version=optional_text(scope.get("version"), "instrumentation_scope.version"),
    ))


@guarded
def log_from_flat(log: Mapping[str, Any]) -> LogEvent:
    log = mapping(log, "log")
    return check_log(LogEvent(
        event_name=optional_text(log.get("event_name"), "event_name"),
        trace_id=optional_hex_id(log.get("trace_id"), 32, "trace_id"),
        span_id=optional_hex_id(log.get("span_id"), 16, "span_id"),
        time_ns=unix_ns(log.get("time_unix_nano") or log.get("observed_time_unix_nano"), "time_unix_nano"),
        body=log.get("body"),
        attributes=dict(mapping(log.get("attributes"), "attributes")),
    ))


def read_flat(doc: Mapping[str, Any], errors: list[SourceError] | None = None
              ) -> tuple[list[SpanRecord], list[LogEvent]]:
    """The spans and logs of a dump. With `errors`, a bad record is skipped and recorded there
    (located as `spans[i]` / `logs[i]`); without, the first one raises."""
    if not isinstance(doc, Mapping):
        raise BadRecord(f"not a span dump: expected an object with 'spans', got {type(doc).__name__}")
    with reading():
        spans_in, logs_in = sequence(doc.get("spans"), "spans"), sequence(doc.get("logs"), "logs")
    return (_convert_all("spans", spans_in, span_from_flat, errors),
            _convert_all("logs", logs_in, log_from_flat, errors))


def _convert_all(key: str, items: Sequence[Any], convert: Callable[[Any], R],
                 errors: list[SourceError] | None) -> list[R]:
    out: list[R] = []
    for i, item in enumerate(items):
        try:
            out.append(convert(item))
        except SourceError as exc:
            if errors is None:
                raise exc.located(record=f"{key}[{i}]") from None
            errors.append(exc.located(record=f"{key}[{i}]"))
    return out
