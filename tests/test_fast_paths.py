"""The import fast paths give exactly what the general paths give.

`otlp_json._fast_span` reads the common OTLP/JSON span shape with `check_span`'s checks inline and
must return either None (the general path then reads the span, or names the field at fault) or the
very record `span_from_otlp` returns. `pipeline.adapter_for` skips adapters whose marker keys a span
lacks, `_without_payloads` tests set membership instead of calling `is_payload_key`, and `base_step`
spells out `first`/`as_str` inline: each is checked here against the plain definition, on generated
edge cases and on every span of the shared fixtures.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from benchmarks.imports import _trace, otlp_request
from otel_replay.normalize.conventions import ADAPTERS
from otel_replay.normalize.conventions.base import (
    as_int,
    as_str,
    base_step,
    clean_error_type,
    error_of,
    first,
)
from otel_replay.normalize.pipeline import _without_payloads, adapter_for
from otel_replay.normalize.records import SpanRecord
from otel_replay.normalize.sources import otlp_json
from otel_replay.normalize.sources.errors import SourceError
from otel_replay.normalize.sources.otlp_json import (
    _fast_span,
    _scope_fields,
    span_from_otlp,
    spans_from_request,
)
from tests.helpers import FIXTURES

MANY = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
T, S, P = "ab" * 16, "cd" * 8, "ef" * 8
RESOURCE = {"service.name": "bench"}
SCOPE = {"name": "bench", "version": "1"}

IDS32 = st.sampled_from([T, "0" * 32, T.upper(), T[:-1], T + "a", base64.b64encode(bytes(16)).decode(),
                         base64.b64encode(b"\x01" * 16).decode(), "", None, 5, [], " " + T[1:], "ab" * 15 + "xz"])
IDS16 = st.sampled_from([S, P, "0" * 16, S.upper(), S[:-1], base64.b64encode(b"\x02" * 8).decode(), "", None, 0,
                         "0", "g" * 16, True])
NUMBERS = ["1767225600000000000", "0", "", "00", " 1", "1 ", "+1", "-1", "1e3", "١٢", "9" * 19, "9" * 20,
           "9223372036854775807", "9223372036854775808", "0001", 1767225600000000000, 0, -1, 1.5, 1e18, 2**63,
           True, False, None, [], {}, "x"]
TIMES = st.sampled_from(NUMBERS) | st.integers(-(2**64), 2**64) | st.integers(-(2**64), 2**64).map(str)
ENUMS = st.sampled_from([0, 1, 2, 3, 5, 6, -1, 99, True, "1", "2", "SPAN_KIND_CLIENT", "STATUS_CODE_ERROR", None, 1.0,
                         1.5, "x", []])
TEXTS = st.sampled_from(["chat m", "", None, 5, 1.5, True, [], {}, "x" * 300]) | st.text(max_size=8)
VALUES = st.one_of(
    st.text(max_size=8).map(lambda s: {"stringValue": s}),
    st.sampled_from(NUMBERS).map(lambda v: {"intValue": v}),
    st.integers(-(2**70), 2**70).map(lambda v: {"intValue": v}),
    st.sampled_from(NUMBERS + [1e308, -0.0, "NaN", "Infinity"]).map(lambda v: {"doubleValue": v}),
    st.floats(allow_nan=False).map(lambda v: {"doubleValue": v}),
    st.sampled_from([True, False, 1, 0, "true", None]).map(lambda v: {"boolValue": v}),
    st.sampled_from([{}, None, "x", 5, [], {"stringValue": "a", "intValue": "1"}, {"stringValue": None},
                     {"arrayValue": {"values": [{"stringValue": "x"}, {"intValue": "2"}]}},
                     {"kvlistValue": {"values": [{"key": "k", "value": {"boolValue": True}}]}},
                     {"bytesValue": "AAEC"}, {"bytesValue": "!!"}, {"unknownValue": 1}]),
)
KEYS = st.sampled_from(["gen_ai.operation.name", "gen_ai.request.model", "k", ""]) | st.text(max_size=6)
KEY_VALUES = st.one_of(
    st.builds(lambda k, v: {"key": k, "value": v}, KEYS, VALUES),
    st.sampled_from([{"value": {"stringValue": "x"}}, {"key": 5, "value": {"stringValue": "x"}}, "x", None, 3,
                     {"key": "k"}, {"key": None, "value": {"stringValue": "x"}}]),
)
ATTRIBUTES = st.lists(KEY_VALUES, max_size=5) | st.sampled_from([None, {}, "", "x", 0, [], {"k": "v"}])
STATUS = st.one_of(
    st.fixed_dictionaries({}, optional={"code": ENUMS, "message": TEXTS}),
    st.sampled_from([None, [], "x", 0, {"code": True}]),
)
EVENTS = st.sampled_from([None, [], {}, "", 0, False, [{"name": "exception", "timeUnixNano": "5"}], ["x"]])


@st.composite
def spans(draw: st.DrawFn) -> Any:
    """A span dict near the common shape: each field valid or an edge case, or absent."""
    fields = {"traceId": IDS32, "spanId": IDS16, "parentSpanId": IDS16, "name": TEXTS, "kind": ENUMS,
              "startTimeUnixNano": TIMES, "endTimeUnixNano": TIMES, "status": STATUS, "attributes": ATTRIBUTES,
              "events": EVENTS, "links": EVENTS}
    good = {"traceId": T, "spanId": S, "parentSpanId": P, "name": "chat m", "kind": 3,
            "startTimeUnixNano": "1767225600000000000", "endTimeUnixNano": "1767225600000001000", "status": {},
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]}
    span: dict[str, Any] = {}
    single = draw(st.sampled_from([None, *fields]))  # one field off the common shape, or any number
    for key, strategy in fields.items():
        choice = ("edge" if key == single else "good") if single else draw(
            st.sampled_from(("good", "good", "good", "edge", "absent")))
        if choice == "edge":
            span[key] = draw(strategy)
        elif choice == "good" and key in good:
            span[key] = good[key]
    return span if draw(st.integers(0, 20)) else draw(st.sampled_from([None, [], "x", 5]))


def general(span: Any, resource: dict[str, Any] = RESOURCE, scope: dict[str, Any] = SCOPE) -> SpanRecord | str:
    try:
        return span_from_otlp(span, resource, scope)
    except SourceError as exc:
        return f"error: {exc}"


@MANY
@given(spans())
@example({"traceId": T, "spanId": S, "events": {}})  # a falsy non-list is an error, not "no events"
@example({"traceId": T, "spanId": S, "name": "n", "startTimeUnixNano": "1", "endTimeUnixNano": "2",
          "attributes": [{"key": "d", "value": {"doubleValue": 10**400}}]})
@example({"traceId": T, "spanId": S, "name": "n", "startTimeUnixNano": "1", "endTimeUnixNano": "2",
          "attributes": [{"key": "i", "value": {"intValue": "9223372036854775808"}}]})  # past int64
@example({"traceId": T, "spanId": S, "name": "n", "startTimeUnixNano": "9" * 19, "endTimeUnixNano": "2"})
@example({"traceId": T, "spanId": S, "parentSpanId": "0" * 16, "name": "n", "startTimeUnixNano": "1",
          "endTimeUnixNano": "2", "kind": True, "status": {"code": True}})
def test_the_otlp_fast_path_reads_a_span_exactly_as_the_general_path_or_defers(span):
    fast = _fast_span(span, RESOURCE, *_scope_fields(SCOPE, RESOURCE))
    if fast is not None:
        assert general(span) == fast


def test_the_fast_path_takes_the_bench_spans_and_every_fixture_span_reads_the_same(tmp_path):
    docs = [otlp_request(_trace(i)) for i in range(3)]
    docs += [json.loads(p.read_text()) for p in sorted(FIXTURES.rglob("*.otlp.json")) if ".logs." not in p.name]
    taken = 0
    for doc in docs:
        expected = []
        for rs in doc["resourceSpans"]:
            resource = otlp_json._resource(rs)
            for ss in rs.get("scopeSpans") or []:
                for span in ss.get("spans") or []:
                    expected.append(general(span, resource, ss.get("scope") or {}))
                    fields = _scope_fields(ss.get("scope") or {}, resource)
                    taken += fields is not None and _fast_span(span, resource, *fields) is not None
        assert list(spans_from_request(doc)) == expected
    assert taken >= 12  # the bench's spans, at least, take the fast path


def test_a_scope_or_resource_the_checks_refuse_sends_its_spans_down_the_general_path():
    deep: Any = "x"
    for _ in range(70):
        deep = [deep]
    assert _scope_fields(SCOPE, {"k": deep}) is None
    assert _scope_fields({"name": ["x"]}, RESOURCE) is None
    assert _scope_fields({"name": 5}, RESOURCE) == ("5", None)
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "k", "value": {"intValue": "5"}}]},
                              "scopeSpans": [{"scope": {"name": ["x"]}, "spans": [otlp_request(_trace(0))[
                                  "resourceSpans"][0]["scopeSpans"][0]["spans"][1]]}]}]}
    errors: list[tuple[str, str]] = []
    assert list(spans_from_request(doc, errors)) == []
    assert errors == [("resourceSpans[0].scopeSpans[0].spans[0]", "scope.name: expected text, got list")]


# --- normalization ----------------------------------------------------------------------------------

def fixture_spans() -> list[SpanRecord]:
    out: list[SpanRecord] = []
    for path in sorted(FIXTURES.rglob("*.otlp.json")):
        if ".logs." not in path.name:
            out += spans_from_request(json.loads(path.read_text()))
    out += [s for i in range(3) for s in spans_from_request(otlp_request(_trace(i)))]
    return out


def marked(attributes: dict[str, Any], scope: str | None = None) -> SpanRecord:
    return SpanRecord(T, S, None, "n", attributes=attributes, scope_name=scope)


EXTRA = [marked({"langsmith.run_type": "llm"}), marked({"langfuse.observation.type": "generation"}),
         marked({"openinference.span.kind": "LLM"}), marked({}, "com.anthropic.sdk.python"),
         marked({"anthropic.message.stop_reason": "end_turn", "gen_ai.operation.name": "chat"}),
         marked({"gen_ai.prompt.0.role": "user"}), marked({"llm.request.type": "chat"}),
         marked({"llm.request.type": "chat", "gen_ai.operation.name": "chat"}),
         marked({"gen_ai.operation.name": "execute_tool"}), marked({"gen_ai.operation.name": "nothing"}), marked({})]


def test_adapter_choice_and_payload_stripping_match_the_plain_definitions():
    for span in fixture_spans() + EXTRA:
        plain = next((a for a in ADAPTERS if a.matches(span)), None)
        assert adapter_for(span) is plain
        for adapter in ADAPTERS:
            assert _without_payloads(span.attributes, adapter) == {
                k: v for k, v in span.attributes.items() if not adapter.is_payload_key(k)}


def reference_base_step_fields(span: SpanRecord) -> dict[str, Any]:
    """What `base_step` fills, written with `first`/`as_str` as the conventions define them."""
    attrs = span.attributes
    error_type, error_message = error_of(span)
    status = "error" if error_type is not None and span.status_code == "unset" else span.status_code
    return {
        "status": status, "error_type": clean_error_type(error_type), "error_message": error_message,
        "provider": as_str(first(attrs, "gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")),
        "request_model": as_str(first(attrs, "gen_ai.request.model", "llm.model_name")),
        "response_model": as_str(first(attrs, "gen_ai.response.model", "llm.model_name")),
        "input_tokens": as_int(first(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens",
                                     "llm.token_count.prompt")),
        "output_tokens": as_int(first(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
                                      "llm.token_count.completion")),
        "agent_name": as_str(attrs.get("gen_ai.agent.name")),
        "conversation_id": as_str(first(attrs, "gen_ai.conversation.id", "session.id")),
        "service_name": span.service_name, "tool_name": None, "tool_call_id": None, "finish_reasons": [],
        "redacted": [],
    }


def test_base_step_fills_the_shared_fields_as_first_and_as_str_define_them():
    swapped = {"gen_ai.system": 7, "llm.model_name": "lm", "gen_ai.usage.prompt_tokens": "12", "session.id": 3,
               "llm.token_count.completion": 2.0, "error.type": "<class 'x.Err'>", "gen_ai.provider.name": None}
    for span in fixture_spans() + EXTRA + [marked(swapped)]:
        step = base_step(span, convention="c", kind="llm", operation="chat", name="n")
        for name, value in reference_base_step_fields(span).items():
            assert getattr(step, name) == value, name
        assert (step.trace_id, step.span_id, step.start_ns, step.end_ns) == (
            span.trace_id, span.span_id, span.start_ns, span.end_ns)
        assert step.content.is_empty() and step.content.tools == []


def test_bench_spans_written_to_a_file_import_with_nothing_skipped(tmp_path: Path):
    from benchmarks.imports import write_otlp_json
    from otel_replay.normalize.sources.files import read

    path = tmp_path / "input.json"
    write_otlp_json([s for i in range(5) for s in _trace(i)], path)
    batch = read("otlp", path)
    assert len(batch.spans) == 20 and batch.skipped == []
    assert [s.attributes.get("gen_ai.usage.input_tokens") for s in batch.spans[:4]] == [None, 90, None, 140]


def test_a_live_sdk_span_becomes_the_record_its_fields_name():
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from otel_replay.normalize.sources.sdk import span_from_sdk

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scope.x", "1.2")
    with tracer.start_as_current_span("parent"):
        with tracer.start_as_current_span("chat m", kind=SpanKind.CLIENT, attributes={"a": 1, "b": ("x", "y")}) as span:
            span.add_event("exception", {"exception.type": "E"})
            span.set_status(Status(StatusCode.ERROR, "boom"))
    child, parent = exporter.get_finished_spans()
    record = span_from_sdk(child)
    assert (record.trace_id, record.span_id, record.parent_span_id) == (
        format(child.context.trace_id, "032x"), format(child.context.span_id, "016x"),
        format(parent.context.span_id, "016x"))
    assert (record.name, record.kind, record.start_ns, record.end_ns) == ("chat m", "CLIENT", child.start_time,
                                                                          child.end_time)
    assert (record.status_code, record.status_message) == ("error", "boom")
    assert record.attributes == {"a": 1, "b": ["x", "y"]} and record.links == []
    assert [(e.name, e.attributes) for e in record.events] == [("exception", {"exception.type": "E"})]
    assert (record.scope_name, record.scope_version, record.service_name) == ("scope.x", "1.2", "svc")
    assert span_from_sdk(parent).parent_span_id is None
