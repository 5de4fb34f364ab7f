"""Receiver faults found by an adversarial run, each over real sockets on 127.0.0.1 with real clients.

- gRPC checks the token before it reads (or decodes) a call's message.
- Connections that never show the token cannot keep out an exporter that has it.
- One record nested past the protobuf runtime's recursion limit costs only that record.
- While the store cannot be written, `collect` answers 503 / UNAVAILABLE instead of acknowledging.
"""

from __future__ import annotations

import http.client
import json
import socket
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_replay import Store
from otel_replay.capture.receiver import OtlpReceiver
from otel_replay.capture.receiver_decode import LOGS, TRACES, decode_body
from otel_replay.capture.receiver_http import MAX_CONNECTIONS, MAX_CONNECTIONS_PER_CLIENT
from tests.harness.receiver_faults import (
    AUTH,
    LOGS_METHOD,
    TOKEN,
    TRACE_METHOD,
    Collect,
    Recording,
    grpc_call,
    mechanism_for,
    post,
    retry_delay_s,
    span_body,
    stored_traces,
    trace_hex,
    wait_until,
)
from tests.helpers import chat_attributes, needs_log_record_event_name
from tests.test_receiver import assert_stored_run, json_trace, send_agent_run


# -- 1. gRPC: the token before the message -----------------------------------------------------------
def test_grpc_refuses_a_call_without_the_token_before_decoding_its_message(tmp_path):
    """Bytes that are not protobuf at all: decoded first, they would fail to parse (INTERNAL or
    INVALID_ARGUMENT); refused first, the call gets UNAUTHENTICATED whatever its message holds."""
    garbage = b"\xff" * (15 * 1024 * 1024)  # 15 MB that no protobuf parser accepts
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, token=TOKEN) as rx, \
            grpc.insecure_channel(rx.grpc_endpoint) as channel:
        for method in (TRACE_METHOD, LOGS_METHOD):
            for metadata in ((), (("authorization", "Bearer wrong"),)):
                with pytest.raises(grpc.RpcError) as caught:
                    channel.unary_unary(method)(garbage, metadata=metadata, timeout=30)
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, (method, caught.value.details())
        with pytest.raises(grpc.RpcError) as caught:  # with the token the same bytes are read, and refused as such
            channel.unary_unary(TRACE_METHOD)(garbage[:1000], metadata=tuple(AUTH.items()), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        exporter = Recording(GrpcSpanExporter(endpoint=rx.grpc_endpoint, insecure=True, headers=AUTH))
        trace_id = send_agent_run(exporter)
        assert rx.counts["malformed_traces"] == 0
    assert exporter.results == [SpanExportResult.SUCCESS] * 3
    assert_stored_run(tmp_path, trace_id, with_logs=False)


# -- 2. connections without the token cannot keep one with it out ----------------------------------
class Trickler:
    """Connections from `source` that send a request's first line, then a header byte now and then."""

    def __init__(self, port: int, count: int, source: str, every_s: float = 1.0) -> None:
        self.socks = [socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
                      for _ in range(count)]
        for sock in self.socks:
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nX-Slow: ")
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        alive = list(self.socks)
        while alive and not self._stop.wait(self.every_s):
            for sock in list(alive):
                try:
                    sock.sendall(b"X")
                except OSError:  # closed by the server
                    alive.remove(sock)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self.socks:
            sock.close()


def test_trickling_connections_without_the_token_cannot_keep_an_exporter_with_it_out(tmp_path):
    """Every connection slot taken by slow-loris connections from the exporter's own address (its
    per-address cap) and from three others (the global cap): the exporter still gets through."""
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, token=TOKEN, read_timeout_s=30.0,
                      request_timeout_s=120.0) as rx:
        kept = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=30)  # keep-alive, as exporters do
        statuses = [send(kept, 1)]  # this connection has shown the token
        sources = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
        assert len(sources) * MAX_CONNECTIONS_PER_CLIENT >= MAX_CONNECTIONS
        loris = [Trickler(rx.http_port, MAX_CONNECTIONS_PER_CLIENT, source) for source in sources]
        try:
            assert wait_until(lambda: rx._http.slots.open >= MAX_CONNECTIONS, 30), rx._http.slots.open
            exporter = Recording(OTLPSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces", headers=AUTH, timeout=20))
            trace_id = send_agent_run(exporter)  # a new connection, from 127.0.0.1 like a quarter of the flood
            statuses.append(send(kept, 2))  # the connection it already had
            statuses.append(post(rx.http_port, json.dumps(json_trace()).encode(), AUTH, source="127.0.0.2")[0])
            assert exporter.results == [SpanExportResult.SUCCESS] * 3 and statuses == [200, 200, 200]
            assert rx._http.slots.evicted >= 2  # room was made: the flood's oldest connections were closed
            assert rx._http.slots.waiting <= MAX_CONNECTIONS  # and the flood holds no more than its cap
        finally:
            kept.close()
            for trickler in loris:
                trickler.close()
    assert_stored_run(tmp_path, trace_id, with_logs=False)


def send(conn: http.client.HTTPConnection, n: int) -> int:
    conn.request("POST", "/v1/traces", body=span_body(n), headers={"Content-Type": "application/json", **AUTH})
    response = conn.getresponse()
    response.read()
    return response.status


def test_requests_without_the_token_do_not_spend_the_rate_of_a_client_with_it(tmp_path):
    body = json.dumps(json_trace()).encode()
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, token=TOKEN, max_requests_per_s=2) as rx:
        statuses = [post(rx.http_port, body)[0] for _ in range(20)]  # same address as the exporter
        assert statuses == [401] * 20
        exporter = Recording(OTLPSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces", headers=AUTH, timeout=20))
        trace_id = send_agent_run(exporter)
        assert rx.throttled == 0
    assert exporter.results == [SpanExportResult.SUCCESS] * 3
    assert_stored_run(tmp_path, trace_id, with_logs=False)


def test_without_a_token_the_connection_caps_still_refuse(tmp_path):
    """No token, nothing to tell clients apart by: the caps hold as before (503 and closed)."""
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, read_timeout_s=30.0) as rx:
        loris = Trickler(rx.http_port, MAX_CONNECTIONS_PER_CLIENT, "127.0.0.1")
        try:
            assert wait_until(lambda: rx._http.slots.open == MAX_CONNECTIONS_PER_CLIENT, 30)
            with socket.create_connection(("127.0.0.1", rx.http_port), timeout=10) as extra:
                assert extra.recv(4096).startswith(b"HTTP/1.1 503")
            assert getattr(rx._http.slots, "evicted", 0) == 0  # no one was closed to make room
            assert post(rx.http_port, json.dumps(json_trace()).encode(), source="127.0.0.2")[0] == 200
        finally:
            loris.close()


# -- 3. one deep record in a protobuf request --------------------------------------------------------
def nested(levels: int, kind: str) -> AnyValue:
    """A value `levels` deep: kvlists ({"k": {"k": ...}}) or arrays ([[...]])."""
    value = AnyValue(string_value="leaf")
    for _ in range(levels):
        outer = AnyValue()
        if kind == "kvlist":
            outer.kvlist_value.values.add(key="k").value.CopyFrom(value)
        else:
            outer.array_value.values.add().CopyFrom(value)
        value = outer
    return value


def chat_request(deep: dict[int, tuple[int, str]]) -> ExportTraceServiceRequest:
    """Four GenAI chat spans of one trace; span i gets an attribute nested `deep[i]` = (levels, kind)."""
    request = ExportTraceServiceRequest()
    request.resource_spans.add().resource.attributes.add(key="service.name").value.string_value = "deep"
    scope = request.resource_spans[0].scope_spans.add()
    for i in range(4):
        span = scope.spans.add(trace_id=bytes.fromhex("d" * 32), span_id=(i + 1).to_bytes(8, "big"),
                               name=f"chat {i}", start_time_unix_nano=1_700_000_000_000_000_000 + i,
                               end_time_unix_nano=1_700_000_001_000_000_000 + i)
        for key, value in chat_attributes(f"question {i}").items():
            span.attributes.add(key=key).value.string_value = value
        if i in deep:
            span.attributes.add(key="deep").value.CopyFrom(nested(*deep[i]))
    return request


# kvlist 60 and array 64 are past what the protobuf runtime parses even in one span (100 messages);
# kvlist 32 fails the whole request's parse but not its span's, so it is kept
DEEP = {1: (60, "kvlist"), 2: (32, "kvlist"), 3: (64, "array")}


def stored_names(store_dir: Path) -> list[str]:
    return sorted(Store(store_dir).sql("select name from spans").column("name").to_pylist())


@pytest.mark.parametrize("workers", [1, 2])
def test_a_record_nested_past_the_protobuf_limit_costs_only_itself_over_http_and_grpc(tmp_path, workers):
    body = chat_request(DEEP).SerializeToString()
    with pytest.raises(Exception, match="Error parsing"):  # what used to fail the whole request
        ExportTraceServiceRequest.FromString(body)
    with OtlpReceiver(tmp_path / "http", http_port=0, grpc_port=0, workers=workers) as rx:
        status, _, reply = post(rx.http_port, body, content_type="application/x-protobuf")
        assert status == 200, reply
        partial = ExportTraceServiceResponse.FromString(reply).partial_success
        assert rx.flush(30)
    with OtlpReceiver(tmp_path / "grpc", http_port=0, grpc_port=0, workers=workers) as rx, \
            grpc.insecure_channel(rx.grpc_endpoint) as channel:
        grpc_partial = trace_service_pb2_grpc.TraceServiceStub(channel).Export(
            chat_request(DEEP), timeout=30).partial_success
        assert rx.flush(30)
    for got in (partial, grpc_partial):
        assert got.rejected_spans == 2
        assert "spans[1]: cannot be parsed" in got.error_message and "spans[3]: cannot be parsed" in got.error_message
        assert ".spans[2]" not in got.error_message and ".spans[0]" not in got.error_message
    for store in ("http", "grpc"):
        assert stored_names(tmp_path / store) == ["chat 0", "chat 2"]


@needs_log_record_event_name
def test_a_deep_log_record_or_resource_costs_only_itself():
    logs = ExportLogsServiceRequest()
    records = logs.resource_logs.add().scope_logs.add().log_records
    for i in range(3):
        records.add(time_unix_nano=1_700_000_000_000_000_000, event_name=f"e{i}").body.CopyFrom(
            nested(60 if i == 1 else 1, "kvlist"))
    kept, errors = decode_body(LOGS, logs.SerializeToString(), False)
    assert [r.event_name for r in kept] == ["e0", "e2"]
    assert [e.split(":")[0] for e in errors] == ["resource_logs[0].scope_logs[0].log_records[1]"]
    traces = chat_request({})
    bad = traces.resource_spans.add()  # a second resource, whose own attribute is too deep
    bad.resource.attributes.add(key="deep").value.CopyFrom(nested(60, "kvlist"))
    bad.scope_spans.add().spans.add().CopyFrom(traces.resource_spans[0].scope_spans[0].spans[0])
    kept, errors = decode_body(TRACES, traces.SerializeToString(), False)
    assert [r.name for r in kept] == ["chat 0", "chat 1", "chat 2", "chat 3"]
    assert [e.split(":")[0] for e in errors] == ["resource_spans[1]"]


def test_a_body_that_is_not_otlp_is_still_refused_whole():
    for body in (b"\xff" * 100, b"\x0a\x05abc", ExportTraceServiceRequest().SerializeToString() + b"\x08"):
        with pytest.raises(Exception) as caught:
            decode_body(TRACES, body, False)
        assert getattr(caught.value, "status", None) == 400, body


# -- 4. a store that cannot be written ---------------------------------------------------------------
# `Collect` (tests.harness.receiver_faults) runs the real `otel-replay collect --token` in a child
# that makes its store read-only or full and mends it on command: best on a private tmpfs
# (`unshare -rm`: EROFS, ENOSPC), else chmod (read-only, not as root) or RLIMIT_FSIZE (full: EFBIG).
@pytest.mark.parametrize(("fault", "mend", "workers", "mechanism"), [
    ("ro", "rw", 1, None), ("ro", "rw", 2, None), ("fill", "unfill", 1, None), ("fill", "unfill", 1, "rlimit")],
    ids=["read-only", "read-only-2-workers", "disk-full", "disk-full-rlimit"])  # rlimit: the fallback, run anyway
def test_collect_refuses_with_503_while_the_store_cannot_be_written_and_resumes_after(tmp_path, fault, mend, workers,
                                                                                      mechanism):
    mechanism = mechanism or mechanism_for("full" if fault == "fill" else "read_only")
    if mechanism is None:
        pytest.skip("no user namespaces here, and chmod does not stop root from writing")
    scratch = Path(tempfile.mkdtemp(prefix="otel-replay-unwritable-", dir=tmp_path))
    collect = Collect(scratch, workers, mechanism)
    try:
        acknowledged = [0] if post(collect.http_port, span_body(0), AUTH)[0] == 200 else []
        acknowledged += [1] if grpc_call(collect.grpc_endpoint, 1) is None else []
        assert acknowledged == [0, 1]
        written = f"written {trace_hex(0)} {trace_hex(1)}"  # the writer flushes every 2 s; these are on disk before the fault
        assert wait_until(lambda: collect.tell(written) == "yes", 60)
        assert collect.tell(fault) == "ok"
        statuses: list[int] = []
        n = 10
        while len(statuses) < 400 and 503 not in statuses:  # until the writer's next write fails
            n += 1
            status, headers, reply = post(collect.http_port, span_body(n), AUTH)
            statuses.append(status)
            time.sleep(0.1)
        assert statuses[-1] == 503, statuses
        assert int(headers["Retry-After"]) >= 1 and "store cannot be written" in json.loads(reply)["message"]
        refused = grpc_call(collect.grpc_endpoint, 1000)
        assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE, refused
        assert retry_delay_s(refused) >= 1
        assert collect.tell(mend) == "ok"
        assert wait_until(lambda: post(collect.http_port, span_body(2000), AUTH)[0] == 200, 60)
        assert grpc_call(collect.grpc_endpoint, 2001) is None
        assert post(collect.http_port, span_body(2002), AUTH)[0] == 200
    finally:
        stopped = collect.close()
    assert stopped.startswith("stopped 0"), stopped
    stored = stored_traces(collect.store)
    for n in (0, 1, 2000, 2001, 2002):  # acknowledged before the fault and after it
        assert trace_hex(n) in stored, (n, stopped)
