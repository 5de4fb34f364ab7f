"""`span_from_sdk` reads an SDK span's own fields; the record equals one built from its public API."""

from __future__ import annotations

from types import SimpleNamespace

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from benchmarks.spans import SpanCollector
from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.normalize.sources.sdk import plain, span_from_sdk


def reference(span: ReadableSpan) -> SpanRecord:
    """The record from public properties only, the plain way."""
    ctx, parent = span.context, span.parent

    def attributes(values: object) -> dict[str, object]:
        return {k: plain(v) for k, v in (values or {}).items()}

    return SpanRecord(
        format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"),
        format(parent.span_id, "016x") if parent is not None else None, span.name, span.kind.name,
        span.start_time, span.end_time, {StatusCode.UNSET: "unset", StatusCode.OK: "ok"}.get(
            span.status.status_code, "error"), span.status.description, attributes(span.attributes),
        [SpanEvent(e.name, e.timestamp, attributes(e.attributes)) for e in span.events],
        [{"trace_id": format(link.context.trace_id, "032x"), "span_id": format(link.context.span_id, "016x"),
          "attributes": attributes(link.attributes)} for link in span.links],
        attributes(span.resource.attributes) if span.resource else {},
        span.instrumentation_scope.name if span.instrumentation_scope else None,
        span.instrumentation_scope.version if span.instrumentation_scope else None,
    )


def sdk_spans() -> list[ReadableSpan]:
    collector = SpanCollector()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "deploy": ("a", "b")}))
    provider.add_span_processor(collector)
    tracer = provider.get_tracer("t", "1.2")
    other = SpanContext(trace_id=2**127 + 5, span_id=1, is_remote=True, trace_flags=TraceFlags(1))
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER):
        with tracer.start_as_current_span("chat m", kind=SpanKind.CLIENT, links=[Link(other, {"k": 1})],
                                          attributes={"gen_ai.operation.name": "chat", "n": 3, "f": 0.5,
                                                      "b": True, "tags": ("x", "y"), "nums": [1, 2]}) as span:
            span.add_event("exception", {"exception.type": "ValueError", "exception.message": "bad"})
            span.set_status(Status(StatusCode.ERROR, "failed"))
    provider.shutdown()
    return collector.take()


def test_sdk_spans_read_as_the_public_api_says():
    spans = sdk_spans()
    assert len(spans) == 2
    for span in spans:
        assert span_from_sdk(span) == reference(span)
    chat = span_from_sdk(spans[0])
    assert chat.attributes["tags"] == ["x", "y"] and chat.events[0].attributes["exception.type"] == "ValueError"
    assert chat.links[0]["trace_id"] == format(2**127 + 5, "032x") and chat.kind == "CLIENT"


def test_a_bare_readable_span_and_a_duck_typed_one_read_the_same():
    context = SpanContext(trace_id=7, span_id=9, is_remote=False)
    bare = ReadableSpan(name="n", context=context, attributes=None, kind=SpanKind.INTERNAL, start_time=1, end_time=2)
    assert span_from_sdk(bare) == reference(bare)
    assert span_from_sdk(bare).attributes == {}
    duck = SimpleNamespace(context=context, parent=None, name="n", kind=SpanKind.PRODUCER, start_time=1, end_time=2,
                           status=Status(StatusCode.OK), attributes={"a": (1, 2)}, events=(), links=(),
                           resource=None, instrumentation_scope=None)
    record = span_from_sdk(duck)  # no private fields: the public ones are read
    assert record.attributes == {"a": [1, 2]} and record.kind == "PRODUCER" and record.status_code == "ok"
    assert record.trace_id == "0" * 31 + "7" and record.span_id == "0" * 15 + "9"
