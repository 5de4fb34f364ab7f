"""The OTLP protobuf fast path gives exactly what the general path gives, or defers to it.

`otlp_proto._fast_span` reads the common span shape (what the receiver gets from every SDK) with
`check_span`'s checks inline. For any span it must return None or the very record
`span_from_proto` returns; checked on generated edge cases (ids, times, names, every kind of
attribute value, events and links) and on every span of the shared fixtures.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from google.protobuf.json_format import ParseDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from benchmarks.spans import SeededText, SyntheticSpans
from otel_replay.capture.receiver_decode import decode_body
from otel_replay.normalize.sources import otlp_proto
from otel_replay.normalize.sources.errors import SourceError
from otel_replay.normalize.sources.otlp_proto import (
    _fast_span,
    _scope_fields,
    span_from_proto,
    spans_from_proto,
)
from tests.helpers import FIXTURES

MANY = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
RESOURCE = {"service.name": "bench"}
SCOPE = InstrumentationScope(name="bench", version="1")
SHORT = 40  # MAX_STRING in these tests (longer than any key used), so "too long" is cheap to generate

IDS16 = st.sampled_from([b"\xab" * 16, bytes(16), b"\xab" * 15, b"\xab" * 17, b"", b"\x00" * 15 + b"\x01"])
IDS8 = st.sampled_from([b"\xcd" * 8, bytes(8), b"\xcd" * 7, b"\xcd" * 9, b"", b"\x01" + bytes(7)])
TIMES = st.sampled_from([0, 1, 1_767_225_600_000_000_000, 2**63 - 1, 2**63, 2**64 - 1])
TEXTS = st.text(max_size=6) | st.sampled_from(["", "x" * SHORT, "x" * (SHORT + 1), "é" * (SHORT + 1)])


def scalar(draw: st.DrawFn) -> AnyValue:
    which = draw(st.sampled_from(["string", "int", "bool", "double", "empty", "bytes"]))
    if which == "string":
        return AnyValue(string_value=draw(TEXTS))
    if which == "int":
        return AnyValue(int_value=draw(st.integers(-(2**63), 2**63 - 1)))
    if which == "bool":
        return AnyValue(bool_value=draw(st.booleans()))
    if which == "double":
        return AnyValue(double_value=draw(st.floats()))
    if which == "bytes":
        return AnyValue(bytes_value=draw(st.binary(max_size=4)))
    return AnyValue()


@st.composite
def any_values(draw: st.DrawFn) -> AnyValue:
    shape = draw(st.sampled_from(["scalar", "scalar", "array", "kvlist"]))
    if shape == "scalar":
        return scalar(draw)
    value = AnyValue()
    if shape == "array":
        value.array_value.values.extend([scalar(draw) for _ in range(draw(st.integers(0, 3)))])
    else:
        for _ in range(draw(st.integers(0, 2))):
            kv = value.kvlist_value.values.add()
            kv.key, kv.value.CopyFrom(scalar(draw))
    return value


@st.composite
def spans(draw: st.DrawFn) -> Span:
    """A span of the common shape with one field (or, sometimes, any number) drawn from its edge cases."""
    fields = ["trace_id", "span_id", "parent", "name", "kind", "start", "end", "status", "attributes", "events",
              "links"]
    single = draw(st.sampled_from([None, *fields]))

    def edge(field: str) -> bool:
        return field == single if single else draw(st.integers(0, 3)) == 0

    span = Span(trace_id=b"\xab" * 16, span_id=b"\xcd" * 8, parent_span_id=b"\xef" * 8, name="chat m", kind=3,
                start_time_unix_nano=1_767_225_600_000_000_000, end_time_unix_nano=1_767_225_600_000_001_000)
    if edge("trace_id"):
        span.trace_id = draw(IDS16)
    if edge("span_id"):
        span.span_id = draw(IDS8)
    if edge("parent"):
        span.parent_span_id = draw(IDS8)
    if edge("name"):
        span.name = draw(TEXTS)
    if edge("kind"):
        span.kind = draw(st.integers(0, 7))
    if edge("start"):
        span.start_time_unix_nano = draw(TIMES)
    if edge("end"):
        span.end_time_unix_nano = draw(TIMES)
    if edge("status"):
        span.status.code = draw(st.integers(0, 3))
        span.status.message = draw(TEXTS)
    kv = span.attributes.add()
    kv.key, kv.value.string_value = "gen_ai.operation.name", "chat"
    if edge("attributes"):
        for _ in range(draw(st.integers(0, 4))):
            kv = span.attributes.add()
            kv.key = draw(st.sampled_from(["gen_ai.operation.name", "k", "", "x" * (SHORT + 1)]) | TEXTS)
            kv.value.CopyFrom(draw(any_values()))
    if edge("events"):
        span.events.add(name="exception", time_unix_nano=5)
    if edge("links"):
        span.links.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    return span


def as_proto_json(value: Any) -> Any:
    """OTLP/JSON (hex ids) as protobuf's JSON mapping reads it (base64 ids)."""
    if isinstance(value, list):
        return [as_proto_json(v) for v in value]
    if isinstance(value, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId") and v
                else as_proto_json(v) for k, v in value.items()}
    return value


def general(span: Span, resource: dict[str, Any] = RESOURCE, scope: Any = SCOPE) -> Any:
    try:
        return span_from_proto(span, resource, scope)
    except SourceError as exc:
        return f"error: {exc}"


@pytest.fixture
def short_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_replay.normalize.sources import checks

    monkeypatch.setattr(checks, "MAX_STRING", SHORT)
    monkeypatch.setattr(otlp_proto, "MAX_STRING", SHORT)


@MANY
@given(span=spans())
def test_the_proto_fast_path_reads_a_span_exactly_as_the_general_path_or_defers(short_strings, span):
    fields = _scope_fields(SCOPE, RESOURCE)
    assert fields == ("bench", "1")
    fast = _fast_span(span, RESOURCE, *fields)
    if fast is not None:
        slow = general(span)
        assert slow == fast or repr(slow) == repr(fast)  # (repr: a NaN attribute equals no float, itself included)


def test_the_fast_path_takes_sdk_spans_and_every_fixture_span_reads_the_same():
    synthetic = SyntheticSpans(SeededText(seed=3, corpus_bytes=20_000))
    requests = [encode_spans(synthetic.chat_spans(20, 2048, distinct=True) + synthetic.http_spans(5))]
    for path in sorted(FIXTURES.rglob("*.otlp.json")):
        if ".logs." not in path.name:
            requests.append(ParseDict(as_proto_json(json.loads(path.read_text())), ExportTraceServiceRequest()))
    taken = 0
    for request in requests:
        expected = []
        for rs in request.resource_spans:
            resource = otlp_proto.key_values(rs.resource.attributes)
            for ss in rs.scope_spans:
                fields = _scope_fields(ss.scope, resource)
                for span in ss.spans:
                    expected.append(general(span, resource, ss.scope))
                    taken += fields is not None and _fast_span(span, resource, *fields) is not None
        assert list(spans_from_proto(request)) == expected
    assert taken >= 25  # every SDK span above takes the fast path


def test_the_receiver_decodes_the_same_records_either_way(monkeypatch):
    synthetic = SyntheticSpans(SeededText(seed=5, corpus_bytes=20_000))
    body = encode_spans(synthetic.chat_spans(30, 1024, distinct=True)).SerializeToString()
    fast = decode_body("traces", body, json=False)
    monkeypatch.setattr(otlp_proto, "_fast_span", lambda *args: None)
    assert decode_body("traces", body, json=False) == fast
    assert len(fast[0]) == 30 and fast[1] == []


def test_a_resource_the_checks_refuse_sends_its_spans_down_the_general_path(short_strings):
    assert _scope_fields(SCOPE, {"k": "x" * (SHORT + 1)}) is None
    assert _scope_fields(InstrumentationScope(name="x" * (SHORT + 1)), RESOURCE) is None
    assert _scope_fields(InstrumentationScope(), RESOURCE) == (None, None)
