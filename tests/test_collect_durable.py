"""`collect --durable`: a request is answered 200 only once its body is in a fsynced write-ahead log.

- kill -9 of `collect --durable` (with its workers) while raw OTLP/HTTP and gRPC requests arrive:
  after a restart, which replays the log, every span answered 200 is in the store;
- a replayed log stores each span once (spans already stored are skipped), keeps the roots of
  traces whose GenAI spans are stored, and joins replayed content log events to their spans;
- a full disk (a filled tmpfs in a private mount namespace) gets 503, never 200 for spans that are
  not on disk; every span answered 200 is stored once the disk has room again; a read-only store
  stops `collect --durable` at start with one line.

The log's own format (group commit, torn and damaged records, dead owners) is in tests/test_wal.py.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay import Store
from otel_replay.capture.receiver import OtlpReceiver
from otel_replay.capture.wal import WAL_DIR, SegmentReader, WriteAheadLog, new_owner_dir
from otel_replay.normalize.content import DETAILS_EVENT
from tests.harness.workload import user_namespaces
from tests.helpers import REPO, chat_attributes

SPANS_PER_REQUEST = 4


# -- requests ------------------------------------------------------------------------------------
def chat_request(n: int, text_bytes: int = 600) -> ExportTraceServiceRequest:
    """Trace n: SPANS_PER_REQUEST GenAI chat spans with distinct content (ids derived from n)."""
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.add(key="service.name").value.string_value = "durable"
    scope = resource.scope_spans.add()
    scope.scope.name = "durable-test"
    filler = "x" * text_bytes
    for i in range(SPANS_PER_REQUEST):
        span = scope.spans.add(trace_id=trace_bytes(n), span_id=span_bytes(n, i), name="chat m",
                               start_time_unix_nano=1_700_000_000_000_000_000 + i,
                               end_time_unix_nano=1_700_000_001_000_000_000 + i)
        for key, value in chat_attributes(f"question {n}-{i} {filler}", f"answer {n}-{i}").items():
            span.attributes.add(key=key).value.string_value = value
    return request


def trace_bytes(n: int) -> bytes:
    return (n + 1).to_bytes(16, "big")


def span_bytes(n: int, i: int) -> bytes:
    return (n * SPANS_PER_REQUEST + i + 1).to_bytes(8, "big")


def span_ids(n: int) -> set[tuple[str, str]]:
    return {(trace_bytes(n).hex(), span_bytes(n, i).hex()) for i in range(SPANS_PER_REQUEST)}


def post(port: int, body: bytes, conn: http.client.HTTPConnection | None = None) -> tuple[int, dict[str, str], bytes]:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        if own:
            conn.close()


def stored_span_ids(store: Path) -> set[tuple[str, str]]:
    rows = Store(store).sql("select trace_id, span_id from spans").to_pylist()
    return {(r["trace_id"], r["span_id"]) for r in rows}


def raw_span_copies(store: Path) -> dict[tuple[str, str], int]:
    rows = Store(store).sql("select trace_id, span_id, count(*) as n from span_rows group by 1, 2").to_pylist()
    return {(r["trace_id"], r["span_id"]): r["n"] for r in rows}


def wal_segments(store: Path) -> list[Path]:
    return sorted((store / WAL_DIR).glob("*/*.wal"))


# -- collect --durable in a child process, and senders ------------------------------------------
class Collect:
    """`otel-replay collect --durable` in a session of its own, so a kill -9 takes its workers too."""

    def __init__(self, store: Path, workers: int, log: Path) -> None:
        command = [sys.executable, "-c", "from otel_replay.cli import main; main()", "--store", str(store), "collect",
                   "--http-port", "0", "--grpc-port", "0", "--durable", "--workers", str(workers)]
        env = {k: v for k, v in os.environ.items() if k != "OTEL_REPLAY_COLLECT_TOKEN"}
        self.stderr = open(log, "a")  # noqa: SIM115 - closed in `kill` / `stop`
        self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, start_new_session=True)
        self.banner = [self.proc.stdout.readline().strip() for _ in range(5)]
        assert self.banner[0].startswith("OTLP/HTTP  http://127.0.0.1:"), (self.banner, log.read_text())
        self.http_port = int(self.banner[0].split()[1].rsplit(":", 1)[1])
        self.grpc_endpoint = self.banner[1].split()[1]
        assert self.banner[4].startswith("durable    yes"), self.banner

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.stderr.close()

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=120)
        self.stderr.close()
        assert self.proc.returncode == 0, out
        return out


class Senders:
    """Two keep-alive OTLP/HTTP senders and one OTLP/gRPC sender, each request a new trace; a
    trace is in `acked` once its request was answered 200 (gRPC: OK). They stop at the first
    connection error (the receiver was killed)."""

    def __init__(self, collect: Collect, numbers: itertools.count) -> None:
        self.acked: list[int] = []
        self.refused = 0
        self._numbers, self._lock = numbers, threading.Lock()
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._http, args=(collect.http_port,), daemon=True) for _ in range(2)]
        self.threads.append(threading.Thread(target=self._grpc, args=(collect.grpc_endpoint,), daemon=True))
        for thread in self.threads:
            thread.start()

    def _next(self) -> int:
        with self._lock:
            return next(self._numbers)

    def _http(self, port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            while not self._stop.is_set():
                n = self._next()
                status, _, _ = post(port, chat_request(n).SerializeToString(), conn)
                self._done(n, status == 200)
        except (OSError, http.client.HTTPException):
            return
        finally:
            conn.close()

    def _grpc(self, endpoint: str) -> None:
        with grpc.insecure_channel(endpoint) as channel:
            export = trace_service_pb2_grpc.TraceServiceStub(channel).Export
            while not self._stop.is_set():
                n = self._next()
                try:
                    export(chat_request(n), timeout=30)
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.UNAVAILABLE and "retry later" not in (exc.details() or ""):
                        return  # the receiver is gone
                    self._done(n, False)
                    continue
                self._done(n, True)

    def _done(self, n: int, ok: bool) -> None:
        with self._lock:
            if ok:
                self.acked.append(n)
            else:
                self.refused += 1

    def wait_for(self, acked: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < acked and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        for thread in self.threads:
            thread.join(60)


def kill_cycles(tmp_path: Path, kills: int, seed: int) -> None:
    """`kills` times: start collect --durable (replaying the last one's log), send from three
    senders, kill -9 it at a random moment; then start it once more and stop it cleanly. Every
    span answered 200 must be in the store, each once."""
    rng = random.Random(seed)
    store, log = tmp_path / "store", tmp_path / "collect.log"
    numbers = itertools.count()
    acked: list[int] = []
    replayed = 0
    for kill in range(kills):
        collect = Collect(store, workers=2 if kill % 3 == 2 else 1, log=log)
        replayed += "replayed" in collect.banner[4]
        senders = Senders(collect, numbers)
        senders.wait_for(rng.randint(1, 40))  # at least one acknowledged, then at a random moment:
        time.sleep(rng.uniform(0.0, 0.4))
        collect.kill()
        senders.stop()
        assert senders.acked, (kill, senders.refused, log.read_text()[-2000:])
        acked += senders.acked
    final = Collect(store, workers=1, log=log)
    replayed += "replayed" in final.banner[4]
    final.stop()
    assert wal_segments(store) == []  # the clean stop removed the log it had replayed and stored
    stored = stored_span_ids(store)
    missing = [n for n in acked if not span_ids(n) <= stored]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged requests lost, e.g. {missing[:5]}"
    assert replayed >= 1  # a kill left a log that a start replayed (else this test shows nothing)


def test_kill_9_of_collect_durable_three_times_loses_no_acknowledged_span(tmp_path):
    kill_cycles(tmp_path, kills=3, seed=3)


@pytest.mark.slow
def test_kill_9_of_collect_durable_twenty_times_loses_no_acknowledged_span(tmp_path):
    kill_cycles(tmp_path, kills=20, seed=20)


# -- replay is idempotent --------------------------------------------------------------------------
def dead_owner_log(store: Path, bodies: list[tuple[str, bytes, bool]]) -> Path:
    """A write-ahead log left as a receiver that was killed leaves it: segments, lock not held."""
    wal = WriteAheadLog(new_owner_dir(store, "p"))
    for signal_name, body, as_json in bodies:
        wal.append(signal_name, as_json, body)
    wal.close()
    wal.release_lock()
    return wal.directory


@pytest.mark.parametrize("workers", [1, 2])
def test_a_replayed_log_stores_each_span_once(tmp_path, workers):
    """Requests 0-9 were stored before the kill, 10-19 not; the log holds all twenty (the kill came
    between the writer's commit and the log's removal), twice over (a copy kept to replay again)."""
    store = tmp_path / "store"
    with OtlpReceiver(store, http_port=0, grpc_port=0) as rx:
        assert [post(rx.http_port, chat_request(n).SerializeToString())[0] for n in range(10)] == [200] * 10
    bodies = [("traces", chat_request(n).SerializeToString(), False) for n in range(20)]
    kept = tmp_path / "kept"
    shutil.copytree(dead_owner_log(store, bodies), kept)
    for attempt in range(2):
        with OtlpReceiver(store, http_port=0, grpc_port=0, durable=True, workers=workers) as rx:
            stats = rx.stats()
        assert stats["wal_replayed_requests"] == 20, stats
        expected_skips = 10 if attempt == 0 else 20
        assert stats["wal_skipped_stored"] == expected_skips * SPANS_PER_REQUEST, stats
        assert wal_segments(store) == []
        copies = raw_span_copies(store)
        assert set(copies) == set().union(*(span_ids(n) for n in range(20)))
        assert set(copies.values()) == {1}  # not a view's dedup: each span is in one row
        steps = Store(store).sql("select count(*) as n, count(distinct span_id) as d from steps").to_pylist()[0]
        assert steps == {"n": 20 * SPANS_PER_REQUEST, "d": 20 * SPANS_PER_REQUEST}
        shutil.copytree(kept, store / WAL_DIR / kept.name)  # the same log again


def test_a_replay_keeps_roots_of_stored_genai_traces_and_joins_content_events(tmp_path):
    """Stored before the kill: a trace's chat span. In the log, in this order: the content of a
    second chat span (a log event), that first chat span again with the trace's root (no GenAI
    attribute: kept only in a trace known to have GenAI spans), then the second chat span."""
    store, trace_id = tmp_path / "store", "ab" * 16
    chat = span_json(trace_id, "01" * 8, "chat m", chat_attributes("first question", "first answer"), parent="0f" * 8)
    with OtlpReceiver(store, http_port=0, grpc_port=0) as rx:
        assert post_json(rx.http_port, "/v1/traces", traces_json([chat])) == 200
    root = span_json(trace_id, "0f" * 8, "handle request", {"http.route": "/ask"})
    second = span_json(trace_id, "02" * 8, "chat m", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"},
                       parent="0f" * 8, start_s=1)
    event = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{
        "traceId": trace_id, "spanId": "02" * 8, "timeUnixNano": "1700000000500000000", "eventName": DETAILS_EVENT,
        "attributes": [json_attr("gen_ai.input.messages", [{"role": "user", "parts": [{"type": "text", "content": "second question"}]}]),
                       json_attr("gen_ai.output.messages", [{"role": "assistant", "parts": [{"type": "text", "content": "second answer"}]}])],
    }]}]}]}
    dead_owner_log(store, [("logs", json.dumps(event).encode(), True),
                           ("traces", json.dumps(traces_json([chat, root])).encode(), True),
                           ("traces", json.dumps(traces_json([second])).encode(), True)])
    with OtlpReceiver(store, http_port=0, grpc_port=0, durable=True) as rx:
        stats = rx.stats()
    assert stats["wal_skipped_stored"] == 1 and stats["wal_replayed_records"] == 3, stats
    assert raw_span_copies(store) == {(trace_id, "01" * 8): 1, (trace_id, "02" * 8): 1, (trace_id, "0f" * 8): 1}
    steps = Store(store).trajectory(trace_id).steps
    assert [s.inputs[0]["parts"][0]["content"] for s in steps] == ["first question", "second question"]
    assert steps[1].output_text == "second answer"


def span_json(trace_id: str, span_id: str, name: str, attributes: dict, parent: str | None = None,
              start_s: int = 0) -> dict:
    span = {"traceId": trace_id, "spanId": span_id, "name": name, "startTimeUnixNano": f"{1_700_000_000 + start_s}000000000",
            "endTimeUnixNano": f"{1_700_000_001 + start_s if parent else 1_700_000_003}000000000",
            "attributes": [{"key": k, "value": {"stringValue": str(v)}} for k, v in attributes.items()]}
    if parent:
        span["parentSpanId"] = parent
    return span


def json_attr(key: str, value: object) -> dict:
    return {"key": key, "value": {"stringValue": json.dumps(value)}}


def traces_json(spans: list[dict]) -> dict:
    return {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
                               "scopeSpans": [{"scope": {"name": "agent"}, "spans": spans}]}]}


def post_json(port: int, path: str, doc: dict) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_durable_logs_before_answering_and_removes_the_log_once_stored(tmp_path):
    store = tmp_path / "store"
    with OtlpReceiver(store, http_port=0, grpc_port=0, durable=True) as rx:
        bodies = [chat_request(n).SerializeToString() for n in range(5)]
        assert [post(rx.http_port, body)[0] for body in bodies] == [200] * 5
        (segment,) = wal_segments(store)  # on disk before the answers, in order
        assert [r.body for r in SegmentReader(segment)] == bodies
        assert post(rx.http_port, b"not protobuf")[0] == 400  # refused before the log: not in it
        assert rx.flush(30)
        deadline = time.monotonic() + 30
        while wal_segments(store) and time.monotonic() < deadline:  # sealed, flushed, removed
            time.sleep(0.05)
        assert wal_segments(store) == []
        assert rx.stats()["wal_removed_segments"] == 1
    assert stored_span_ids(store) == set().union(*(span_ids(n) for n in range(5)))
    assert not list((store / WAL_DIR).iterdir())  # a clean stop leaves no owner directory


def test_spans_the_writer_lost_are_logged_again_once_the_store_can_be_written(tmp_path):
    """The log could be written, the store's span table not (a file where its directory goes):
    the request was acknowledged, the writer dropped its batch; once the store is writable the
    log's segment is sent through the log again and its spans stored (without --durable: lost)."""
    store = tmp_path / "store"
    with OtlpReceiver(store, http_port=0, grpc_port=0, durable=True) as rx:
        assert post(rx.http_port, chat_request(0).SerializeToString())[0] == 200
        assert rx.flush(30)
        blocker = store / "span_rows"
        shutil.move(store / "span_rows", tmp_path / "span_rows")
        blocker.write_text("not a directory")
        assert post(rx.http_port, chat_request(1).SerializeToString())[0] == 200
        assert not rx.flush(30) and rx.stats()["lost_store_unwritable"] == SPANS_PER_REQUEST
        assert post(rx.http_port, chat_request(2).SerializeToString())[0] == 503  # the store failed: refused
        blocker.unlink()
        shutil.move(tmp_path / "span_rows", store / "span_rows")
        deadline = time.monotonic() + 60
        while not span_ids(1) <= stored_span_ids(store) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert span_ids(1) <= stored_span_ids(store)
        assert rx.stats()["wal_lost_segments"] == 1
    assert stored_span_ids(store) == span_ids(0) | span_ids(1)
    assert wal_segments(store) == []


def test_a_remote_store_is_refused_with_durable():
    with pytest.raises(Exception, match="--durable needs a local store directory"):
        OtlpReceiver("memory://bucket/store", durable=True)


# -- a full disk ---------------------------------------------------------------------------------
def fault_child() -> None:
    """In a private user and mount namespace: a tmpfs, `collect --durable` on a store in it, and
    "fill", "unfill", "stop" on stdin (the minimal part of tests/test_receiver_faults.py's child)."""
    scratch, workers = Path(sys.argv[1]), sys.argv[2]
    mount = scratch / "mnt"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0755", "tmpfs", str(mount)], check=True)
    store = mount / "store"
    command = [sys.executable, "-c", "from otel_replay.cli import main; main()", "--store", str(store), "collect",
               "--http-port", "0", "--grpc-port", "0", "--durable", "--workers", workers]
    collect = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    for _ in range(2):
        print(collect.stdout.readline().rstrip(), flush=True)
    filler = mount / "filler"
    for line in sys.stdin:
        what = line.strip()
        if what == "fill":
            with open(filler, "wb", buffering=0) as handle, contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * 65536)
        elif what == "unfill":
            filler.unlink()
        elif what == "stop":
            collect.send_signal(signal.SIGTERM)
            out, _ = collect.communicate(timeout=120)
            shutil.copytree(store, scratch / "out")
            print(f"stopped {collect.returncode}: {' / '.join(out.splitlines())}", flush=True)
            return
        print("ok", flush=True)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_read_only_store_stops_collect_durable_at_start_with_one_line(tmp_path, workers):
    """A read-only volume cannot hold the log: said at once, before a worker starts (while collect
    --durable runs, a read-only remount is refused by the kernel: its log segment is open for writing)."""
    if not user_namespaces():
        pytest.skip("a read-only mount needs a private mount namespace (user namespaces)")
    mount = tmp_path / "mnt"
    mount.mkdir()
    script = (f"mount -t tmpfs tmpfs {mount} && mkdir {mount}/store && mount -o remount,ro {mount} && "
              f"exec {sys.executable} -c 'from otel_replay.cli import main; main()' --store {mount}/store collect "
              f"--http-port 0 --grpc-port 0 --durable --workers {workers}")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [
        f"Error: cannot write the write-ahead log under {mount}/store/_wal (Read-only file system); "
        "--durable needs a writable store"]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_full_disk_gets_503_in_durable_mode_and_every_200_is_stored(tmp_path, workers):
    if not user_namespaces():
        pytest.skip("filling a disk needs a private tmpfs (user namespaces)")
    scratch = Path(tempfile.mkdtemp(prefix="otel-replay-durable-full-", dir=tmp_path))
    child = subprocess.Popen(["unshare", "-rm", sys.executable, "-c",
                              "from tests.test_collect_durable import fault_child; fault_child()", str(scratch),
                              str(workers)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def tell(command: str) -> str:
        child.stdin.write(command + "\n")
        child.stdin.flush()
        return child.stdout.readline().strip()

    acked: list[int] = []
    statuses: list[int] = []
    try:
        http_line, grpc_line = child.stdout.readline(), child.stdout.readline()
        port, endpoint = int(http_line.split()[1].rsplit(":", 1)[1]), grpc_line.split()[1]
        for n in range(3):
            assert post(port, chat_request(n).SerializeToString())[0] == 200
            acked.append(n)
        assert tell("fill") == "ok"
        n = 100
        while len(statuses) < 200 and 503 not in statuses:
            n += 1
            status, headers, reply = post(port, chat_request(n).SerializeToString())
            statuses.append(status)
            if status == 200:  # room left in the log's last page: then it is on disk
                acked.append(n)
        assert statuses[-1] == 503 and set(statuses) <= {200, 503}, statuses
        assert int(headers["Retry-After"]) >= 1 and b"cannot be written" in reply
        # The disk is full, but not still: a write that failed removes its temp file and frees its
        # pages, so a request may fit again. What is accepted must be stored; one is soon refused.
        refused: grpc.RpcError | None = None
        with grpc.insecure_channel(endpoint) as channel:
            export = trace_service_pb2_grpc.TraceServiceStub(channel).Export
            for grpc_n in range(1000, 1200):
                try:
                    export(chat_request(grpc_n), timeout=30)
                except grpc.RpcError as exc:
                    refused = exc
                    break
                acked.append(grpc_n)
        assert refused is not None, "every gRPC export was accepted while the disk was full"
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
        retry = RetryInfo.FromString(dict(refused.trailing_metadata())["google.rpc.retryinfo-bin"])
        assert retry.retry_delay.seconds >= 1
        assert tell("unfill") == "ok"
        deadline = time.monotonic() + 60
        status = 0
        while status != 200 and time.monotonic() < deadline:
            status = post(port, chat_request(2000).SerializeToString())[0]
            time.sleep(0.1)
        assert status == 200
        acked.append(2000)
    finally:
        stopped = tell("stop") if child.poll() is None else f"exited {child.returncode}"
        child.wait(120)
    assert stopped.startswith("stopped 0"), stopped
    stored = stored_span_ids(scratch / "out")
    missing = [n for n in acked if not span_ids(n) <= stored]
    assert not missing, (missing, statuses, stopped)
    assert not stored & span_ids(grpc_n)  # refused over gRPC: nothing of it kept
    print(f"statuses while full: {statuses}; {stopped}")
