"""`OtlpReceiver(workers=N)` / `collect --workers N`: real spawned worker processes behind the servers.

Every request goes to every worker and each stores the traces `partition_of` gives it; these tests
hold the pooled receiver to what one process does (same rows, same errors, same answers) with
real exporters, raw HTTP and gRPC, and a worker killed mid-run.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time

import pytest
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay import ReplayProcessor, Store
from otel_replay.capture.receiver import OtlpReceiver, ReceiverError
from otel_replay.capture.receiver_decode import decode_body
from otel_replay.capture.receiver_workers import BodyReader, add_stats
from otel_replay.normalize.records import partition_of
from tests.helpers import chat_attributes, needs_emit_keywords
from tests.test_receiver import assert_stored_run, json_trace, post, send_agent_run

ROWS = "select * exclude (ingested_ns) from {view} order by trace_id, span_id"


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    with OtlpReceiver(tmp_path_factory.mktemp("pooled"), http_port=0, grpc_port=0, workers=2) as rx:
        yield rx


def runs_on_both_workers(send) -> list[str]:
    """Agent runs sent with `send` until both workers got at least one (trace ids are random)."""
    trace_ids: list[str] = []
    while len({partition_of(t, 2) for t in trace_ids}) < 2:
        assert len(trace_ids) < 40
        trace_ids.append(send())
    return trace_ids


def many_traces_request(traces: int = 24, bad_every: int = 7) -> dict:
    """An OTLP/JSON request with `traces` traces of two chat spans; every `bad_every`-th span has a bad id."""
    spans, n = [], 0
    for t in range(traces):
        for s in range(2):
            n += 1
            span_id = "not-an-id" if n % bad_every == 0 else f"{t + 1:08x}{s:08x}"
            spans.append({"traceId": f"{t + 1:032x}", "spanId": span_id, "name": f"chat {t}.{s}", "kind": 3,
                          "startTimeUnixNano": str(1_700_000_000_000_000_000 + n), "endTimeUnixNano":
                          str(1_700_000_001_000_000_000 + n), "attributes": [
                              {"key": k, "value": {"stringValue": v}} for k, v in chat_attributes(f"q{n}", f"a{n}").items()]})
    doc = json_trace()
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"] = spans
    return doc


# -- real exporters ---------------------------------------------------------------------------------
@needs_emit_keywords
def test_http_exporters_spans_and_their_log_events_land_whole_whichever_worker(pooled):
    endpoint = pooled.http_endpoint
    trace_ids = runs_on_both_workers(lambda: send_agent_run(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"),
                                                            OTLPLogExporter(endpoint=f"{endpoint}/v1/logs")))
    assert pooled.flush(30)
    for trace_id in trace_ids:  # the content log event met its span in the worker that owns the trace
        assert_stored_run(pooled.store.local, trace_id, with_logs=True)


@needs_emit_keywords
def test_grpc_exporters_land_whole_whichever_worker(pooled):
    endpoint = pooled.grpc_endpoint
    trace_ids = runs_on_both_workers(lambda: send_agent_run(GrpcSpanExporter(endpoint=endpoint, insecure=True),
                                                            GrpcLogExporter(endpoint=endpoint, insecure=True)))
    assert pooled.flush(30)
    for trace_id in trace_ids:
        assert_stored_run(pooled.store.local, trace_id, with_logs=True)


# -- the same as one process ------------------------------------------------------------------------
def test_workers_store_the_same_rows_and_answer_the_same_as_one_process(tmp_path):
    bodies = [("application/json", json.dumps(many_traces_request()).encode())]
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for t in range(30):
        span = scope.spans.add(trace_id=bytes.fromhex(f"{t + 100:032x}"), span_id=(t + 1).to_bytes(8, "big"),
                               name=f"chat p{t}", start_time_unix_nano=1_700_000_000_000_000_000 + t,
                               end_time_unix_nano=1_700_000_001_000_000_000 + t)
        for key, value in chat_attributes(f"proto q{t}", f"proto a{t}").items():
            span.attributes.add(key=key).value.string_value = value
    scope.spans.add(trace_id=b"\x01\x02", span_id=bytes(range(1, 9)), name="short trace id")
    bodies.append(("application/x-protobuf", request.SerializeToString()))
    answers, rows = {}, {}
    for workers in (1, 3):
        store = tmp_path / f"workers-{workers}"
        with OtlpReceiver(store, http_port=0, grpc_port=0, workers=workers) as rx:
            answers[workers] = [post(rx, "/v1/traces", body, {"Content-Type": kind})[::2] for kind, body in bodies]
        rows[workers] = [Store(store).sql(ROWS.format(view=view)).to_pylist() for view in ("spans", "steps")]
        assert rx.counts == {**rx.counts, "accepted_traces": 72, "malformed_traces": 7}
    assert answers[1] == answers[3]
    assert answers[3][0][0] == 200 and b"spans[6]" in answers[3][0][1]  # the request's own path, not a worker's share
    assert len(rows[3][0]) == len(rows[3][1]) == 72 and rows[1] == rows[3]


def test_a_bad_resource_is_reported_once_not_once_per_worker(pooled):
    doc = many_traces_request(traces=6, bad_every=1000)
    doc["resourceSpans"].append({"resource": {"attributes": "not a list"}, "scopeSpans": []})
    status, _, body = post(pooled, "/v1/traces", json.dumps(doc).encode())
    partial = json.loads(body)["partialSuccess"]
    assert status == 200 and partial["rejectedSpans"] == "1"
    assert partial["errorMessage"].count("resourceSpans[1]") == 1


def test_a_body_that_is_not_otlp_is_400_and_the_workers_keep_serving(pooled):
    status, _, body = post(pooled, "/v1/traces", b"\xff\x00 not protobuf", {"Content-Type": "application/x-protobuf"})
    assert status == 400
    status, _, _ = post(pooled, "/v1/traces", json.dumps(json_trace(span_id="0123456789abcdef")).encode())
    assert status == 200


def test_decoding_a_part_decodes_exactly_that_part_of_the_traces():
    body = json.dumps(many_traces_request(traces=40, bad_every=5)).encode()
    whole, whole_errors = decode_body("traces", body, True)
    for count in (1, 2, 3, 5):
        parts = [decode_body("traces", body, True, (i, count)) for i in range(count)]
        for i, (records, _) in enumerate(parts):
            assert all(partition_of(r.trace_id, count) == i for r in records)
        assert sorted(r.span_id for records, _ in parts for r in records) == sorted(r.span_id for r in whole)
        assert sorted(e for _, errors in parts for e in errors) == sorted(whole_errors)


# -- failures ---------------------------------------------------------------------------------------
def test_a_killed_worker_costs_one_retry_and_is_replaced(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, workers=2) as rx:
        victim = rx.workers._workers[1].process  # the test reaches in only to find a pid to kill
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        status, headers, body = post(rx, "/v1/traces", json.dumps(json_trace()).encode())
        assert status == 503 and headers.get("Retry-After") and b"retry" in body
        assert rx.workers.replaced == 1
        status, _, _ = post(rx, "/v1/traces", json.dumps(json_trace()).encode())  # the exporter's retry
        assert status == 200
    assert [s.span_id for s in Store(tmp_path).trajectory(json_trace()["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
                                                         ["traceId"]).steps] == ["eee19b7ec3c1b174"]


def test_a_full_worker_queue_is_503_for_the_whole_request(tmp_path):
    tiny = functools.partial(ReplayProcessor, tmp_path, max_queue_bytes=1)
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, workers=2, processor_factory=tiny) as rx:
        status, headers, body = post(rx, "/v1/traces", json.dumps(many_traces_request(bad_every=1000)).encode())
        assert status == 503 and headers["Retry-After"] and b"queue is full" in body
    assert rx.counts["refused_traces"] == 48 and rx.counts["accepted_traces"] == 0


def test_stop_writes_what_every_worker_accepted_and_keeps_their_counters(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, workers=2) as rx:
        status, _, _ = post(rx, "/v1/traces", json.dumps(many_traces_request(bad_every=1000)).encode())
        assert status == 200
    assert rx.stats()["written_spans"] == 48 and rx.stats()["queued"] == 0
    assert Store(tmp_path).sql("select count(*) as n from spans").to_pylist() == [{"n": 48}]
    assert not any(worker.process.is_alive() for worker in rx.workers._workers)


def test_a_processor_and_several_workers_is_a_clear_error(tmp_path):
    with pytest.raises(ReceiverError, match="processor_factory"):
        OtlpReceiver(tmp_path, workers=2, processor=ReplayProcessor(tmp_path / "p"))
    with pytest.raises(ReceiverError, match="at least 1"):
        OtlpReceiver(tmp_path, workers=0)


def test_a_factory_that_does_not_pickle_is_a_clear_error_and_frees_the_ports(tmp_path):
    rx = OtlpReceiver(tmp_path, http_port=0, grpc_port=0, workers=2,
                      processor_factory=lambda: ReplayProcessor(tmp_path))
    started = time.monotonic()
    with pytest.raises(ReceiverError, match="cannot start the receiver's 2 workers"):
        rx.start()
    assert time.monotonic() - started < 30
    assert rx.workers is None


def test_a_worker_that_cannot_make_its_processor_is_a_clear_error(tmp_path):
    broken = functools.partial(ReplayProcessor, tmp_path, max_queue_spans=0)  # raises in the worker
    rx = OtlpReceiver(tmp_path, http_port=0, grpc_port=0, workers=2, processor_factory=broken)
    with pytest.raises(ReceiverError, match="worker 0 exited while starting"):
        rx.start()


def test_worker_counters_add_up():
    parts = [{"written_spans": 3, "skipped": {"a": 1}, "store_error": None},
             {"written_spans": 4, "skipped": {"a": 2, "b": 1}, "store_error": "disk full"}]
    assert add_stats(parts) == {"written_spans": 7, "skipped": {"a": 3, "b": 1}, "store_error": "disk full"}


def test_running_workers_report_the_cpu_their_processes_used(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, workers=2) as rx:
        before = rx.stats()["worker_cpu_s"]  # two processes that imported otel_replay and opened the store
        assert before > 0
        status, _, _ = post(rx, "/v1/traces", json.dumps(many_traces_request(bad_every=1000)).encode())
        assert status == 200 and rx.flush(30)
        after = rx.stats()["worker_cpu_s"]
        assert after > before  # decoding and writing 48 spans in them took some
    assert rx.stats()["written_spans"] == 48


def test_bodies_go_raw_between_framed_messages_into_one_reused_buffer():
    import multiprocessing
    import socket
    import threading

    parent, child = multiprocessing.Pipe()
    stream = socket.socket(fileno=os.dup(parent.fileno()))
    bodies = [os.urandom(3_000_000), b"short", b"", os.urandom(70_000)]  # larger than a socket's buffer first

    def send() -> None:
        for body in bodies:
            parent.send(("receive", len(body)))
            stream.sendall(body)
        parent.send(("stop",))  # framed messages still read right after a raw body

    sender = threading.Thread(target=send)
    sender.start()
    reader = BodyReader(child)
    for body in bodies:
        op, size = child.recv()
        with reader.read(size) as view:
            assert op == "receive" and bytes(view) == body
    assert child.recv() == ("stop",)
    sender.join()
    assert len(reader._buffer) == 3_000_000  # noqa: SLF001 - grown once, reused by the smaller bodies

    parent.send(("receive", 10))
    stream.sendall(b"four")  # the receiver's process goes away mid-body
    stream.close()
    parent.close()
    op, size = child.recv()
    with pytest.raises(EOFError, match="closed the connection"), reader.read(size):
        pass
