"""`OtlpReceiver` and `otel-replay collect`: real OTLP exporters in, the store out, bad input refused.

Every server binds 127.0.0.1 on a free port; every client is a real exporter or a raw socket.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tracemalloc
import urllib.request
import zlib

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_replay import ReplayProcessor, Store
from otel_replay.capture.receiver import OtlpReceiver
from otel_replay.normalize.content import DETAILS_EVENT
from tests.helpers import REPO, chat_attributes, needs_emit_keywords

TRACE_ID = "5b8efff798038103d269b633813fc60c"


@pytest.fixture
def receiver(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, read_timeout_s=1.0) as rx:
        yield rx


# -- what the clients send ------------------------------------------------------------------------
def send_agent_run(span_exporter, log_exporter=None) -> str:
    """An agent run through a real TracerProvider: invoke_agent > chat (payload on the span),
    chat (payload only in a details log event, when there is a log exporter) and execute_tool."""
    provider = TracerProvider(resource=Resource.create({"service.name": "any-language-service"}))
    provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    tracer = provider.get_tracer("agent")
    logs = LoggerProvider() if log_exporter else None
    if logs:
        logs.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    with tracer.start_as_current_span("invoke_agent weather", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather"}) as root:
        with tracer.start_as_current_span("chat m", attributes=chat_attributes("weather in Paris?", "let me look")):
            pass
        with tracer.start_as_current_span("execute_tool get_weather", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
                "gen_ai.tool.call.id": "call_1", "gen_ai.tool.call.arguments": '{"city": "Paris"}',
                "gen_ai.tool.call.result": "sunny, 21C"}):
            pass
        if logs:
            with tracer.start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat",
                                                                    "gen_ai.request.model": "m"}):
                logs.get_logger("agent").emit(event_name=DETAILS_EVENT, attributes={
                    "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "and tomorrow?"}]}],
                    "gen_ai.output.messages": [{"role": "assistant", "finish_reason": "stop",
                                                "parts": [{"type": "text", "content": "rain"}]}],
                })
            logs.shutdown()  # the SDK emits the event before the span ends; send it first too
    provider.shutdown()
    return format(root.get_span_context().trace_id, "032x")


def assert_stored_run(store_dir, trace_id: str, with_logs: bool) -> None:
    trajectory = Store(store_dir).trajectory(trace_id)
    assert [a.name for a in trajectory.agents] == ["weather"]
    kinds = [(s.kind, s.name) for s in trajectory.steps]
    expected = [("llm", "chat m"), ("tool", "get_weather")] + ([("llm", "chat m")] if with_logs else [])
    assert kinds == expected
    assert trajectory.steps[0].inputs[0]["parts"][0]["content"] == "weather in Paris?"
    assert trajectory.steps[0].output_text == "let me look"
    if with_logs:  # the content arrived as a log record and was joined to its span
        assert trajectory.steps[2].inputs[0]["parts"][0]["content"] == "and tomorrow?"
        assert trajectory.steps[2].output_text == "rain" and not trajectory.steps[2].observation_only
    assert trajectory.service_name == "any-language-service"


def json_trace(span_id: str = "eee19b7ec3c1b174", trace_id: str = TRACE_ID) -> dict:
    return {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "js"}}]},
                               "scopeSpans": [{"scope": {"name": "js-agent"}, "spans": [{
                                   "traceId": trace_id, "spanId": span_id, "name": "chat m", "kind": 3,
                                   "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
                                   "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in chat_attributes().items()],
                               }]}]}]}


def post(rx: OtlpReceiver, path: str, body: bytes, headers: dict[str, str] | None = None,
         method: str = "POST") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()


def assert_still_serving(rx: OtlpReceiver) -> None:
    status, _, body = post(rx, "/v1/traces", json.dumps(json_trace()).encode())
    assert (status, json.loads(body)) == (200, {})


# -- real exporters -------------------------------------------------------------------------------
@needs_emit_keywords
def test_http_exporters_spans_and_log_events_land_in_the_store(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0) as rx:
        trace_id = send_agent_run(OTLPSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces"),
                                  OTLPLogExporter(endpoint=f"{rx.http_endpoint}/v1/logs"))
    assert_stored_run(tmp_path, trace_id, with_logs=True)
    assert rx.counts["accepted_traces"] == 4 and rx.counts["accepted_logs"] == 1


@pytest.mark.parametrize("compression", [Compression.Gzip, Compression.Deflate])
@needs_emit_keywords
def test_http_exporter_with_compression(tmp_path, compression):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0) as rx:
        trace_id = send_agent_run(OTLPSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces", compression=compression),
                                  OTLPLogExporter(endpoint=f"{rx.http_endpoint}/v1/logs", compression=compression))
    assert_stored_run(tmp_path, trace_id, with_logs=True)


@needs_emit_keywords
def test_grpc_exporters_spans_and_log_events_land_in_the_store(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0) as rx:
        trace_id = send_agent_run(GrpcSpanExporter(endpoint=rx.grpc_endpoint, insecure=True),
                                  GrpcLogExporter(endpoint=rx.grpc_endpoint, insecure=True))
    assert_stored_run(tmp_path, trace_id, with_logs=True)


def test_flush_makes_spans_visible_while_the_receiver_runs(tmp_path, receiver):
    trace_id = send_agent_run(OTLPSpanExporter(endpoint=f"{receiver.http_endpoint}/v1/traces"))
    assert receiver.flush(10)
    assert_stored_run(tmp_path, trace_id, with_logs=False)


def test_json_bodies_from_urllib(tmp_path, receiver):
    request = urllib.request.Request(f"{receiver.http_endpoint}/v1/traces", data=json.dumps(json_trace()).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200 and response.headers["Content-Type"] == "application/json"
        assert json.loads(response.read()) == {}
    logs = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{
        "eventName": DETAILS_EVENT, "traceId": TRACE_ID, "spanId": "eee19b7ec3c1b174", "timeUnixNano": "1700000000500000000",
        "attributes": [{"key": "gen_ai.output.messages", "value": {"stringValue": "[]"}}]}]}]}]}
    gz = urllib.request.Request(f"{receiver.http_endpoint}/v1/logs", data=gzip.compress(json.dumps(logs).encode()),
                                headers={"Content-Type": "application/json; charset=utf-8", "Content-Encoding": "gzip"})
    with urllib.request.urlopen(gz, timeout=10) as response:
        assert response.status == 200 and json.loads(response.read()) == {}
    receiver.stop()
    (step,) = Store(tmp_path).trajectory(TRACE_ID).steps
    assert step.inputs[0]["parts"][0]["content"] == "hi" and step.output_text == "hello"
    assert receiver.counts["accepted_traces"] == 1 and receiver.counts["accepted_logs"] == 1


def test_a_span_with_a_bad_id_is_skipped_and_reported_the_rest_is_stored(tmp_path, receiver):
    doc = json_trace()
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans.append({**spans[0], "spanId": "not-an-id", "name": "chat broken"})
    spans.append({**spans[0], "spanId": "aaa19b7ec3c1b174", "name": "chat second"})
    status, _, body = post(receiver, "/v1/traces", json.dumps(doc).encode())
    assert status == 200
    partial = json.loads(body)["partialSuccess"]
    assert partial["rejectedSpans"] == "1"  # int64 is a string in OTLP/JSON
    assert "spans[1]" in partial["errorMessage"] and "spanId" in partial["errorMessage"]
    receiver.stop()
    stored = {s.span_id for s in Store(tmp_path).trajectory(TRACE_ID).steps}
    assert stored == {"eee19b7ec3c1b174", "aaa19b7ec3c1b174"}
    assert receiver.counts["malformed_traces"] == 1 and receiver.counts["accepted_traces"] == 2


def test_a_protobuf_span_with_a_bad_id_is_reported_too(receiver):
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    good = scope.spans.add(trace_id=bytes.fromhex(TRACE_ID), span_id=bytes(range(1, 9)), name="chat m")
    good.attributes.add(key="gen_ai.operation.name").value.string_value = "chat"
    scope.spans.add(trace_id=b"\x01\x02", span_id=bytes(range(1, 9)), name="short trace id")
    status, headers, body = post(receiver, "/v1/traces", request.SerializeToString(),
                                 {"Content-Type": "application/x-protobuf"})
    assert status == 200 and headers["Content-Type"] == "application/x-protobuf"
    response = ExportTraceServiceResponse.FromString(body)
    assert response.partial_success.rejected_spans == 1
    assert "spans[1]" in response.partial_success.error_message


# -- the token ------------------------------------------------------------------------------------
def test_token_over_http_and_grpc(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, token="s3cret") as rx:
        auth = {"authorization": "Bearer s3cret"}
        trace_id = send_agent_run(OTLPSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces", headers=auth))
        body = json.dumps(json_trace()).encode()
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            status, response_headers, text = post(rx, "/v1/traces", body, headers)
            assert status == 401 and response_headers["WWW-Authenticate"] == "Bearer", headers
            assert "token" in json.loads(text)["message"]
        assert post(rx, "/v1/traces", body, {"Authorization": "Bearer s3cret"})[0] == 200
        with grpc.insecure_channel(rx.grpc_endpoint) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            for metadata in ((), (("authorization", "Bearer wrong"),)):
                with pytest.raises(grpc.RpcError) as caught:
                    stub.Export(ExportTraceServiceRequest(), metadata=metadata, timeout=10)
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stub.Export(ExportTraceServiceRequest(), metadata=(("authorization", "Bearer s3cret"),), timeout=10)
        grpc_trace = send_agent_run(GrpcSpanExporter(endpoint=rx.grpc_endpoint, insecure=True, headers=auth))
    assert_stored_run(tmp_path, trace_id, with_logs=False)
    assert_stored_run(tmp_path, grpc_trace, with_logs=False)


# -- bad input over HTTP --------------------------------------------------------------------------
def test_bad_requests_get_their_status_and_the_receiver_keeps_serving(receiver):
    body = json.dumps(json_trace()).encode()
    cases = [
        ("/v1/traces", b"\xff\xff\xff\xff garbage", {"Content-Type": "application/x-protobuf"}, "POST", 400),
        ("/v1/traces", b'{"resourceSpans": [', {}, "POST", 400),
        ("/v1/traces", b'{"spans": []}', {}, "POST", 400),
        ("/v1/logs", b"[1, 2]", {}, "POST", 400),
        ("/v1/traces", b"\x1f\x8b not gzip", {"Content-Encoding": "gzip"}, "POST", 400),
        ("/v1/traces", body, {"Content-Type": "text/plain"}, "POST", 415),
        ("/v1/traces", body, {"Content-Encoding": "br"}, "POST", 415),
        ("/v1/metrics", body, {}, "POST", 404),
        ("/", b"", {}, "GET", 404),
        ("/v1/traces", b"", {}, "GET", 405),
        ("/v1/logs", body, {}, "PUT", 405),
    ]
    for path, data, headers, method, expected in cases:
        status, response_headers, text = post(receiver, path, data, headers, method)
        assert status == expected, (path, headers, method, text)
        assert text.strip(), "every error says why"
        if expected == 405:
            assert response_headers["Allow"] == "POST"
        assert_still_serving(receiver)


def test_an_oversized_content_length_is_refused_before_the_body_is_sent(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, max_body_mb=1) as rx:
        conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=10)
        conn.putrequest("POST", "/v1/traces")
        conn.putheader("Content-Type", "application/x-protobuf")
        conn.putheader("Content-Length", str(1024 * 1024 * 1024))
        conn.endheaders()  # and no body
        response = conn.getresponse()
        assert response.status == 413 and b"--max-body-mb" in response.read()
        conn.close()
        assert_still_serving(rx)


def test_a_gzip_bomb_is_refused_with_memory_bounded(tmp_path):
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1024 * 1024)
    bomb = b"".join(packer.compress(zeros) for _ in range(256)) + packer.flush()  # 256 MB inflated
    assert len(bomb) < 512 * 1024
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, max_body_mb=1) as rx:
        tracemalloc.start()
        try:
            status, _, text = post(rx, "/v1/traces", bomb, {"Content-Type": "application/x-protobuf",
                                                           "Content-Encoding": "gzip"})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert status == 413 and b"decompressed" in text
        assert peak < 8 * 1024 * 1024, peak  # the 1 MB limit and a copy or two, not 256 MB
        assert_still_serving(rx)


def test_a_stalled_client_does_not_block_others_and_is_cut_off(receiver):
    stalled = socket.create_connection(("127.0.0.1", receiver.http_port), timeout=10)
    stalled.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n{\"resourceSpans\"")
    half = socket.create_connection(("127.0.0.1", receiver.http_port), timeout=10)
    half.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # headers never finish
    started = time.monotonic()
    for _ in range(3):
        assert_still_serving(receiver)
    assert time.monotonic() - started < receiver.read_timeout_s
    reply = stalled.recv(4096)  # after read_timeout_s (1 s here) the server gives up on it
    assert reply.startswith(b"HTTP/1.1 408")
    assert half.recv(4096) == b""  # unfinished headers: the connection is closed
    stalled.close()
    half.close()


# -- a full queue ---------------------------------------------------------------------------------
def test_a_full_queue_is_503_over_http_and_resource_exhausted_over_grpc(tmp_path):
    tiny = ReplayProcessor(tmp_path, max_queue_bytes=1)  # every record is refused
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, processor=tiny) as rx:
        status, headers, body = post(rx, "/v1/traces", json.dumps(json_trace()).encode())
        assert status == 503 and headers["Retry-After"] == "2" and "queue is full" in json.loads(body)["message"]
        request = ExportTraceServiceRequest()
        request.resource_spans.add().scope_spans.add().spans.add(
            trace_id=bytes.fromhex(TRACE_ID), span_id=bytes(range(1, 9)), name="chat m")
        with grpc.insecure_channel(rx.grpc_endpoint) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "google.rpc.retryinfo-bin" in dict(caught.value.trailing_metadata())
    assert rx.counts["refused_traces"] == 2 and rx.counts["accepted_traces"] == 0


def test_a_batch_that_does_not_fit_is_refused_whole_for_a_retry(tmp_path):
    room_for_two = ReplayProcessor(tmp_path, max_queue_bytes=2 * (512 + 64 * 4) + 10, flush_interval_s=60)
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, processor=room_for_two) as rx:
        doc = json_trace()
        spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
        spans += [{**spans[0], "spanId": f"{i:016x}"} for i in range(1, 5)]
        status, headers, body = post(rx, "/v1/traces", json.dumps(doc).encode())
        assert room_for_two.refused_records == 5 and room_for_two.dropped == 0
    assert status == 503 and headers.get("Retry-After")  # the exporter retries the whole batch
    assert b"queue is full" in body
    assert not list(tmp_path.glob("step_rows/*/*.parquet"))  # nothing half-accepted


# -- the command ----------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", ["1", "2"])
def test_collect_command_serves_until_sigterm_and_reports(tmp_path, workers):
    command = [sys.executable, "-c", "from otel_replay.cli import main; main()", "--store", str(tmp_path),
               "collect", "--http-port", "0", "--grpc-port", "0", "--workers", workers]
    env = {**os.environ, "OTEL_REPLAY_COLLECT_TOKEN": "tok"}
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("OTLP/HTTP  http://127.0.0.1:") and lines[1].startswith("OTLP/gRPC  127.0.0.1:")
        assert lines[2].strip() == f"store      {tmp_path.resolve()}"
        assert lines[3].split() == ["workers", workers, "process" if workers == "1" else "processes"]
        url = lines[0].split()[1] + "/v1/traces"
        request = urllib.request.Request(url, data=json.dumps(json_trace()).encode(),
                                         headers={"Content-Type": "application/json", "Authorization": "Bearer tok"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "spans: 1 accepted, 0 refused (queue full), 0 malformed" in out
    assert len(Store(tmp_path).trajectory(TRACE_ID).steps) == 1


@pytest.mark.parametrize(("taken", "what"), [("http", "OTLP/HTTP on http://"), ("grpc", "OTLP/gRPC on ")])
def test_collect_command_names_the_flag_when_a_port_is_taken(tmp_path, taken, what):
    from click.testing import CliRunner

    from otel_replay.cli import main as cli

    with OtlpReceiver(tmp_path / "a", http_port=0, grpc_port=0) as rx:
        ports = {"http": "0", "grpc": "0", taken: str(getattr(rx, f"{taken}_port"))}
        started = time.monotonic()
        result = CliRunner().invoke(cli, ["--store", str(tmp_path / "b"), "collect", "--http-port", ports["http"],
                                          "--grpc-port", ports["grpc"]])
        assert time.monotonic() - started < 10
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: cannot listen for {what}127.0.0.1:"), result.output
    assert f"--{taken}-port" in result.output


def test_a_request_with_too_many_spans_is_refused_before_decoding(receiver):
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for _ in range(50_001):
        spans.add()
    status, _, body = post(receiver, "/v1/traces", request.SerializeToString(), {"Content-Type": "application/x-protobuf"})
    assert status == 413 and b"at most 50000" in body
