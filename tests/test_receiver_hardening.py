"""The OTLP receiver under hostile or careless clients, over real sockets on 127.0.0.1.

Loopback by default; bearer token on both transports; body size bounded before and after
decompression; request rate bounded per client (429 / RESOURCE_EXHAUSTED with a retry delay);
clients that trickle bytes or stall mid-body are cut off without starving the others; and a
60 s load test at the receiver's capacity from a second process loses nothing it acknowledged.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_replay import ReplayProcessor, Store
from otel_replay.capture.receiver import OtlpReceiver, is_loopback
from otel_replay.capture.receiver_http import MAX_CONNECTIONS_PER_CLIENT
from tests.helpers import REPO, chat_attributes, needs_http_retry_on_429
from tests.test_receiver import assert_stored_run, json_trace, send_agent_run

OTHER_CLIENT = "127.0.0.2"  # a second client address on loopback (Linux routes all of 127/8 to lo)


def post(port: int, body: bytes, headers: dict[str, str] | None = None, source: str | None = None,
         path: str = "/v1/traces") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15,
                                      source_address=(source, 0) if source else None)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()


def good_body(span_id: str = "eee19b7ec3c1b174") -> bytes:
    return json.dumps(json_trace(span_id)).encode()


def grpc_export(rx: OtlpReceiver, request: ExportTraceServiceRequest, metadata=(), compression=None):
    with grpc.insecure_channel(rx.grpc_endpoint, compression=compression) as channel:
        return trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, metadata=metadata, timeout=15)


def one_span_request(name: str = "chat m") -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add(
        trace_id=bytes.fromhex("5b8efff798038103d269b633813fc60c"), span_id=os.urandom(8), name=name)
    span.attributes.add(key="gen_ai.operation.name").value.string_value = "chat"
    return request


def local_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (from the routing table, no traffic sent)."""
    found = set()
    for probe in ("192.0.2.1", "10.255.255.255", "8.8.8.8"):
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((probe, 9))
            found.add(s.getsockname()[0])
    return sorted(a for a in found if not is_loopback(a))


# -- where it listens ------------------------------------------------------------------------------
def test_it_listens_on_loopback_only_by_default(tmp_path):
    addresses = local_addresses()
    if not addresses:
        pytest.skip("this machine has no non-loopback address to probe")
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0) as rx:
        assert rx.host == "127.0.0.1" and rx.http_endpoint.startswith("http://127.0.0.1:")
        assert post(rx.http_port, good_body())[0] == 200
        for address in addresses:
            for port in (rx.http_port, rx.grpc_port):
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection((address, port), timeout=5).close()


def test_loopback_addresses_are_recognised():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.0.2.2", "example.com"))


@pytest.mark.parametrize(("host", "token", "warned"), [("0.0.0.0", None, True), ("0.0.0.0", "s3cret", False),
                                                       ("127.0.0.2", None, False)])
def test_collect_warns_when_it_listens_beyond_loopback_without_a_token(tmp_path, host, token, warned):
    command = [sys.executable, "-c", "from otel_replay.cli import main; main()", "--store", str(tmp_path),
               "collect", "--host", host, "--http-port", "0", "--grpc-port", "0"] + (["--token", token] if token else [])
    env = {k: v for k, v in os.environ.items() if k != "OTEL_REPLAY_COLLECT_TOKEN"}
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"OTLP/HTTP  http://{host}:")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert (f"warning: listening on {host} without a token" in err) == warned, err


# -- the token -------------------------------------------------------------------------------------
def test_the_bearer_token_is_required_on_both_transports(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, token="s3cret-token") as rx:
        body = good_body()
        refused = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer s3cret-toke"},
                   {"Authorization": "Bearer s3cret-token-and-more"}, {"Authorization": "Basic s3cret-token"},
                   {"Authorization": "s3cret-token"}, {"Authorization": "Bearer s3cret-tøken".encode().decode("latin-1")}]
        for headers in refused:
            status, response_headers, text = post(rx.http_port, body, headers)
            assert status == 401 and response_headers["WWW-Authenticate"] == "Bearer", headers
            assert "token" in json.loads(text)["message"]
        assert post(rx.http_port, body, {"Authorization": "bearer s3cret-token"})[0] == 200  # any case of "Bearer"
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as caught:
                grpc_export(rx, one_span_request(), metadata)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        grpc_export(rx, one_span_request(), (("authorization", "Bearer s3cret-token"),))
        trace_id = send_agent_run(GrpcSpanExporter(endpoint=rx.grpc_endpoint, insecure=True,
                                                   headers={"authorization": "Bearer s3cret-token"}))
    assert_stored_run(tmp_path, trace_id, with_logs=False)
    assert rx.counts["accepted_traces"] == 5  # 1 over HTTP, 1 raw gRPC, 3 from the exporter


# -- sizes -----------------------------------------------------------------------------------------
def bomb(wbits: int, inflated_mb: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    zeros = bytes(1024 * 1024)
    return b"".join(packer.compress(zeros) for _ in range(inflated_mb)) + packer.flush()


@pytest.mark.parametrize(("encoding", "wbits"), [("gzip", 31), ("deflate", 15)])
def test_a_compression_bomb_is_refused_without_inflating_it(tmp_path, encoding, wbits):
    payload = bomb(wbits, 256)  # 256 MB once inflated, ~260 KB on the wire
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, max_body_mb=2) as rx:
        tracemalloc.start()
        started = time.monotonic()
        try:
            status, _, text = post(rx.http_port, payload, {"Content-Type": "application/x-protobuf",
                                                           "Content-Encoding": encoding})
            elapsed = time.monotonic() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert status == 413 and b"once decompressed" in text
        assert peak < 16 * 1024 * 1024, peak  # the 2 MB limit, the body and a copy or two: not 256 MB
        assert elapsed < 2  # inflating 256 MB would take longer than stopping at 2 MB
        assert post(rx.http_port, gzip.compress(good_body()), {"Content-Encoding": "gzip"})[0] == 200


def test_bodies_over_the_limit_are_refused_on_both_transports(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, max_body_mb=1) as rx:
        conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=15)
        conn.putrequest("POST", "/v1/traces")
        conn.putheader("Content-Type", "application/x-protobuf")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        chunk = b"x" * 300_000
        with contextlib.suppress(OSError):  # the server may close before the last chunk
            for _ in range(5):
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        response = conn.getresponse()
        assert response.status == 413 and b"--max-body-mb" in response.read()
        conn.close()
        big = one_span_request("x" * (2 * 1024 * 1024))
        for compression in (None, grpc.Compression.Gzip):  # gRPC checks the decompressed size too
            with pytest.raises(grpc.RpcError) as caught:
                grpc_export(rx, big, compression=compression)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert post(rx.http_port, good_body())[0] == 200
        grpc_export(rx, one_span_request())


# -- rate --------------------------------------------------------------------------------------------
def test_a_client_over_its_rate_gets_429_with_retry_after_and_others_are_served(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, max_requests_per_s=5) as rx:
        conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=15)
        statuses, retry_after = [], []
        for i in range(25):  # one keep-alive connection, as an exporter sends
            conn.request("POST", "/v1/traces", body=good_body(f"{i + 1:016x}"),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            body = response.read()
            statuses.append(response.status)
            if response.status == 429:
                retry_after.append(int(response.headers["Retry-After"]))
                assert "too many requests from 127.0.0.1" in json.loads(body)["message"]
        conn.close()
        assert statuses[:10] == [200] * 10  # the burst
        assert statuses.count(429) >= 10 and all(1 <= r <= 2 for r in retry_after)
        assert post(rx.http_port, good_body(), source=OTHER_CLIENT)[0] == 200  # another client is not slowed
        throttled = 0
        for _ in range(15):
            try:
                grpc_export(rx, one_span_request())
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "too many requests" in exc.details()
                assert "google.rpc.retryinfo-bin" in dict(exc.trailing_metadata())
                throttled += 1
        assert throttled >= 10
    assert rx.throttled == statuses.count(429) + throttled


@needs_http_retry_on_429
def test_a_throttled_exporter_retries_and_every_span_it_was_told_succeeded_is_stored(tmp_path):
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "busy"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("busy")
    for i in range(40):
        tracer.start_span(f"chat {i}", attributes=chat_attributes(f"question {i}", f"answer {i}")).end()
    spans = memory.get_finished_spans()
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, max_requests_per_s=4) as rx:
        exporter = OTLPSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces", timeout=30)
        results = [exporter.export(spans[i:i + 2]) for i in range(0, len(spans), 2)]  # 20 requests, burst of 8
        exporter.shutdown()
        assert rx.throttled > 0
    assert results == [SpanExportResult.SUCCESS] * 20
    stored = Store(tmp_path).sql("select count(distinct span_id) n from spans").column("n")[0].as_py()
    assert stored == 40


# -- slow clients ----------------------------------------------------------------------------------
class Trickler:
    """Connections that send a byte at a time, each well within the idle timeout."""

    def __init__(self, port: int, count: int, prefix: bytes, every_s: float) -> None:
        self.socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]
        self.prefix, self.every_s = prefix, every_s
        self.closed_after: dict[int, float] = {}
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for sock in self.socks:
            sock.sendall(self.prefix)
        while not self._stop.wait(self.every_s):
            for n, sock in enumerate(self.socks):
                if n in self.closed_after:
                    continue
                try:
                    sock.sendall(b"X")
                except OSError:
                    self.closed_after[n] = time.monotonic() - self._started

    def replies(self, wait_s: float = 0.0) -> list[bytes | None]:
        """What each connection got from the server: None (nothing yet), b"" (closed) or a response."""
        out: list[bytes | None] = []
        for sock in self.socks:
            sock.settimeout(wait_s)
            try:
                out.append(sock.recv(4096))
            except (BlockingIOError, TimeoutError):
                out.append(None)
            except OSError:
                out.append(b"")
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.socks:
            sock.close()


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_clients_that_trickle_headers_or_bodies_are_cut_off_at_the_request_timeout(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, read_timeout_s=1.0, request_timeout_s=2.0) as rx:
        headers = Trickler(rx.http_port, 3, b"POST /v1/traces HTTP/1.1\r\nX-Slow: ", every_s=0.3)
        body = Trickler(rx.http_port, 3, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                         b"Content-Length: 100000\r\n\r\n{", every_s=0.3)
        try:
            time.sleep(1.5)  # past the idle timeout: the trickle keeps them alive so far
            assert post(rx.http_port, good_body())[0] == 200
            assert all(r is None for r in headers.replies() + body.replies())  # still open, nothing sent
            time.sleep(1.5)  # past the 2 s request timeout
            assert headers.replies(2.0) == [b""] * 3  # unfinished headers: closed
            assert all(r and r.startswith(b"HTTP/1.1 408") for r in body.replies(2.0)), body.replies()  # 408
        finally:
            headers.close()
            body.close()
        assert post(rx.http_port, good_body())[0] == 200


def test_50_slow_loris_connections_do_not_keep_an_exporter_out(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, read_timeout_s=5.0) as rx:
        loris = Trickler(rx.http_port, 50, b"POST /v1/traces HTTP/1.1\r\nX-Slow: ", every_s=1.0)
        grpc_loris = [socket.create_connection(("127.0.0.1", rx.grpc_port), timeout=10) for _ in range(50)]
        try:
            assert wait_until(lambda: rx._http.slots.open >= 50, 10)
            started = time.monotonic()
            http_trace = send_agent_run(OTLPSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces", timeout=10))
            grpc_trace = send_agent_run(GrpcSpanExporter(endpoint=rx.grpc_endpoint, insecure=True, timeout=10))
            assert time.monotonic() - started < 8
            assert all(r is None for r in loris.replies())  # the slow ones are still being waited for
        finally:
            loris.close()
            for sock in grpc_loris:
                sock.close()
    assert_stored_run(tmp_path, http_trace, with_logs=False)
    assert_stored_run(tmp_path, grpc_trace, with_logs=False)


def test_one_client_cannot_take_every_connection(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, read_timeout_s=10.0) as rx:
        idle = [socket.create_connection(("127.0.0.1", rx.http_port), timeout=10)
                for _ in range(MAX_CONNECTIONS_PER_CLIENT)]
        try:
            assert wait_until(lambda: rx._http.slots.open == MAX_CONNECTIONS_PER_CLIENT, 10)
            extra = socket.create_connection(("127.0.0.1", rx.http_port), timeout=10)
            reply = extra.recv(4096)
            extra.close()
            assert reply.startswith(b"HTTP/1.1 503") and b"Retry-After: " in reply
            assert post(rx.http_port, good_body(), source=OTHER_CLIENT)[0] == 200
        finally:
            for sock in idle:
                sock.close()
        assert wait_until(lambda: rx._http.slots.open == 0, 10)
        assert post(rx.http_port, good_body())[0] == 200


def test_bodies_stalled_mid_way_cannot_hold_all_the_memory_for_bodies(tmp_path):
    with OtlpReceiver(tmp_path, http_port=0, grpc_port=0, max_body_mb=1, read_timeout_s=10.0,
                      request_timeout_s=4.0) as rx:
        budget = rx._http.bodies
        stalled = []
        for _ in range(12):  # 12 x 700 KB sent of 1 MB bodies: more than this client's half of 8 MB
            sock = socket.create_connection(("127.0.0.1", rx.http_port), timeout=15)
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                         b"Content-Length: 1048576\r\n\r\n" + bytes(700_000))
            stalled.append(sock)
        try:
            assert wait_until(lambda: budget.used >= budget.per_client - 256 * 1024, 10)
            assert budget.used <= budget.per_client
            started = time.monotonic()
            assert post(rx.http_port, good_body(), source=OTHER_CLIENT)[0] == 200  # another client gets in
            assert time.monotonic() - started < 3
        finally:
            for sock in stalled:
                sock.close()
        assert wait_until(lambda: budget.used == 0, 15)
        assert post(rx.http_port, good_body())[0] == 200


# -- load --------------------------------------------------------------------------------------------
def sender_main() -> None:
    """A load client: `python -c '...sender_main()' ENDPOINT SECONDS THREADS BATCH OUT`.

    Each thread exports distinct GenAI chat spans with the real OTLP/HTTP exporter as fast as
    the receiver answers, and keeps the ids of the spans whose export succeeded (the exporter
    retries 429 / 503 itself); OUT gets those ids, one per line.
    """
    from benchmarks.spans import SeededText, SyntheticSpans

    endpoint, seconds, threads, batch, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    text = SeededText(seed=7, corpus_bytes=200_000)
    acked: list[list[str]] = [[] for _ in range(threads)]
    failed = [0] * threads
    deadline = time.monotonic() + seconds

    def send(n: int) -> None:
        spans_source = SyntheticSpans(text)
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=30)
        while time.monotonic() < deadline:
            spans = spans_source.chat_spans(batch, 1024, distinct=True)
            if exporter.export(spans) is SpanExportResult.SUCCESS:
                acked[n].extend(format(s.context.span_id, "016x") for s in spans)
            else:
                failed[n] += len(spans)
        exporter.shutdown()

    workers = [threading.Thread(target=send, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    with open(out, "w") as f:
        f.write("\n".join(span_id for ids in acked for span_id in ids))
    print(json.dumps({"acked": sum(map(len, acked)), "failed": sum(failed)}), flush=True)


@pytest.mark.slow
@pytest.mark.parametrize(("seconds", "queue_spans", "workers"), [(60, None, 1), (30, 3_000, 1), (30, 3_000, 2)],
                         ids=["capacity", "backpressure", "backpressure-2-workers"])
def test_load_at_capacity_from_another_process_loses_nothing_acknowledged(tmp_path, seconds, queue_spans, workers):
    """4 exporter threads in a second process, as fast as the receiver answers. With a small queue
    the writer falls behind now and then: refused batches (503) are retried by the exporter, and
    only what was queued is acknowledged. With workers, a request one worker had no room for is
    refused whole and resent (its other shares stored twice, read once)."""
    threads, batch = 4, 256
    out = tmp_path / "acked.txt"
    options = {"max_queue_spans": queue_spans} if queue_spans else {}
    pooled = {"processor_factory": functools.partial(ReplayProcessor, tmp_path / "store", yield_gil=False, **options)}
    own = {"processor": ReplayProcessor(tmp_path / "store", **options)} if workers == 1 else pooled
    with OtlpReceiver(tmp_path / "store", http_port=0, grpc_port=0, workers=workers, **own) as rx:
        code = "from tests.test_receiver_hardening import sender_main; sender_main()"
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", code, f"{rx.http_endpoint}/v1/traces", str(seconds),
                               str(threads), str(batch), str(out)], cwd=REPO, capture_output=True, text=True,
                              timeout=seconds + 240)
        sent_s = time.monotonic() - started
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.splitlines()[-1])
        counts = dict(rx.counts)
        stopping = time.monotonic()
        rx.stop(timeout_s=600)
        drained_s = time.monotonic() - stopping
    acked = set(out.read_text().split())
    assert len(acked) == report["acked"] > 0
    stored = set(Store(tmp_path / "store").sql("select span_id from spans").column("span_id").to_pylist())
    missing = acked - stored
    rate = len(acked) / sent_s
    print(f"\nreceiver load test: {len(acked):,} spans acknowledged in {sent_s:.1f} s ({rate:,.0f} spans/s), "
          f"{report['failed']:,} not acknowledged, {counts['refused_traces']:,} refused (queue full) and retried, "
          f"{rx.throttled} throttled; stored {len(stored):,} ({drained_s:.1f} s to write the rest at stop); "
          f"acknowledged but missing: {len(missing)}")
    assert not missing
