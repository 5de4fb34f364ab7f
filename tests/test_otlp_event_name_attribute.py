"""Log events named the way SDKs before 1.35 name them: an `event.name` attribute, no event_name field.

opentelemetry-proto before 1.35 has no `LogRecord.event_name`, and the Events API of those SDKs
puts the name in the `event.name` attribute. `otel-replay collect` (protobuf and JSON bodies) must
read such records on any installed opentelemetry-proto, and join their content to the span.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from otel_replay import Store
from otel_replay.capture.receiver import OtlpReceiver
from otel_replay.capture.receiver_decode import LOGS, decode_body

TRACE_ID, SPAN_ID = "6c0f2a9d1e3b4c5d6e7f8091a2b3c4d5", "1a2b3c4d5e6f7081"
START_NS = 1_700_000_000_000_000_000
# semconv 1.30 message events, as an instrumentation of that time emits them
EVENTS = [("gen_ai.user.message", {"content": "is my order late?"}),
          ("gen_ai.choice", {"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "yes, by two days"}})]


def _proto_value(value: Any, out: AnyValue) -> None:
    if isinstance(value, str):
        out.string_value = value
    elif isinstance(value, int):
        out.int_value = value
    else:
        for key, item in value.items():
            kv = out.kvlist_value.values.add()
            kv.key = key
            _proto_value(item, kv.value)


def _json_value(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    return {"kvlistValue": {"values": [{"key": k, "value": _json_value(v)} for k, v in value.items()]}}


def proto_logs() -> bytes:
    request = ExportLogsServiceRequest()
    records = request.resource_logs.add().scope_logs.add().log_records
    for i, (name, body) in enumerate(EVENTS):
        record = records.add(time_unix_nano=START_NS + (i + 1) * 1000, trace_id=bytes.fromhex(TRACE_ID),
                             span_id=bytes.fromhex(SPAN_ID))
        attribute = record.attributes.add()
        attribute.key, attribute.value.string_value = "event.name", name
        _proto_value(body, record.body)
    return request.SerializeToString()


def json_logs() -> bytes:
    records = [{"timeUnixNano": str(START_NS + (i + 1) * 1000), "traceId": TRACE_ID, "spanId": SPAN_ID,
                "attributes": [{"key": "event.name", "value": {"stringValue": name}}], "body": _json_value(body)}
               for i, (name, body) in enumerate(EVENTS)]
    return json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": records}]}]}).encode()


def json_trace() -> bytes:
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}  # content only in the events
    span = {"traceId": TRACE_ID, "spanId": SPAN_ID, "name": "chat m", "kind": 3,
            "startTimeUnixNano": str(START_NS), "endTimeUnixNano": str(START_NS + 10**9),
            "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "agent"}, "spans": [span]}]}]}).encode()


def post(rx: OtlpReceiver, path: str, body: bytes, content_type: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.parametrize(("body", "is_json"), [(proto_logs(), False), (json_logs(), True)], ids=["protobuf", "json"])
def test_the_event_name_attribute_names_the_record(body, is_json):
    kept, errors = decode_body(LOGS, body, is_json)
    assert errors == []
    assert [r.event_name for r in kept] == ["gen_ai.user.message", "gen_ai.choice"]


@pytest.mark.parametrize(("body", "content_type"), [(proto_logs(), "application/x-protobuf"),
                                                    (json_logs(), "application/json")], ids=["protobuf", "json"])
def test_collect_joins_their_content_to_the_span(tmp_path, body, content_type):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0) as rx:
        assert post(rx, "/v1/logs", body, content_type) == 200
        assert post(rx, "/v1/traces", json_trace(), "application/json") == 200
        assert rx.flush(30)
    [step] = Store(tmp_path).trajectory(TRACE_ID).steps
    assert not step.observation_only
    assert step.inputs[0]["role"] == "user" and step.inputs[0]["parts"][0]["content"] == "is my order late?"
    assert step.output_text == "yes, by two days"
