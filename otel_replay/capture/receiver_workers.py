"""Receiver worker processes (`collect --workers N`): decoding and storing spread over N cores.

One Python process decodes, normalizes, redacts and writes at most ~8k spans/s of 4 KB GenAI
spans (`bench capture`'s writer stages); the parent's GIL is the limit, not the cores. So the
parent keeps what is cheap and shared (the HTTP and gRPC servers, authentication, rate and body
limits, decompression) and hands every request body to every worker. Each worker decodes only
the spans and log records of its own traces (`partition_of` on the trace id) and queues them on
its own `ReplayProcessor`, so a trace's spans and its content log events meet in one writer, and
a malformed record is reported once, at its path in the request as sent.

Workers are spawned, not forked (the parent runs gRPC's threads), and ignore SIGINT and SIGTERM:
the parent stops them in order, and a worker whose parent vanished writes what it accepted and
exits. A worker that dies is replaced; the request it was answering gets 503 (retry), and what it
had accepted but not written is lost, as with a `kill -9` of a single-process receiver. With
`durable`, each worker logs every request body it stores records of in its own write-ahead log
(`receiver_durable`) before it answers, and a worker that replaced a dead one replays its log.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import grpc

from otel_replay.capture.processor import ReplayProcessor
from otel_replay.capture.receiver_decode import TRACES, RequestError, StoreUnwritable, decode_body
from otel_replay.capture.receiver_durable import DurableIngest
from otel_replay.store.writer import warm_up

ProcessorFactory = Callable[[], ReplayProcessor]
"""Builds a worker's processor, in the worker; must pickle (a module-level function or a partial)."""
MAX_AUTO_WORKERS = 8
WORKER_GC_THRESHOLD = 50_000  # allocations between collections of the youngest generation (default 700)
START_TIMEOUT_S = 60.0  # a spawned worker imports otel_replay and opens the store in ~1 s
logger = logging.getLogger("otel_replay")
_INDEX = re.compile(r"\[(\d+)\]")


@dataclass
class Received:
    """What the workers made of one request, together."""

    records: int = 0  # decoded and offered to a queue
    refused: int = 0  # of those, refused because a worker's queue was full
    errors: list[str] = field(default_factory=list)  # one per malformed record (or resource)


def auto_workers() -> int:
    """One worker per core, at most MAX_AUTO_WORKERS (one core: the receiver's own process, no workers)."""
    return max(1, min(os.cpu_count() or 1, MAX_AUTO_WORKERS))


# -- the worker process --------------------------------------------------------------------------
def worker_main(conn: Connection, index: int, count: int, factory: ProcessorFactory, durable: bool = False) -> None:
    """A worker: answers `receive`, `flush`, `stats` and `stop` from the parent until `stop` or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group;
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent decides when and how a worker stops
    processor = factory()
    ingest = DurableIngest(processor.store, processor, part=(index, count)) if durable else None
    warm_up()  # what the first write costs once (~0.1 s), before "ready", not in the first request's time
    # What a worker allocates dies young (a request's records, a batch's rows) and holds no cycles
    # worth chasing often: the start-up objects are frozen out of every collection and the youngest
    # generation is collected 70x less often than by default.
    gc.freeze()
    gc.set_threshold(WORKER_GC_THRESHOLD, 20, 100)
    body = BodyReader(conn)
    conn.send(("ready",))
    while True:
        try:
            request = conn.recv()
            if request[0] == "receive":
                with body.read(request[3]) as data:
                    conn.send(_receive(processor, request[1], data, request[2], (index, count), ingest, request[4]))
                continue
        except (EOFError, OSError):  # the parent is gone: keep what was accepted
            _stop(processor, ingest, 30.0)
            return
        op = request[0]
        if op == "flush":
            conn.send(("ok", processor.force_flush(int(request[1] * 1000))))
        elif op == "stats":
            conn.send(("ok", {**processor.stats, **(ingest.counters() if ingest else {}), "worker_cpu_s": time.process_time()}))
        elif op == "stop":
            _stop(processor, ingest, request[1])
            conn.send(("ok", {**processor.stats, **(ingest.counters() if ingest else {})}))
            return


def _stop(processor: ReplayProcessor, ingest: DurableIngest | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    if ingest is not None:  # writes what was queued, then removes the log it covers
        ingest.close(timeout_s)
    processor.shutdown(int(max(deadline - time.monotonic(), 0) * 1000))


class BodyReader:
    """Request bodies read straight off the worker's connection into one reused buffer.

    The parent writes each body raw (`socket.sendall`) right after the "receive" message that gives
    its length, on the same connection (a socket pair; `Connection` reads exactly what it frames,
    never ahead). `Connection.recv_bytes` would read a 2 MB body in ~40 reads, each allocating the
    whole remainder, then copy it twice: ~4 ms of the worker's CPU a 2.4 MB body against under 1 here.
    """

    def __init__(self, conn: Connection) -> None:
        self._stream = socket.socket(fileno=os.dup(conn.fileno()))
        self._buffer = bytearray()

    @contextlib.contextmanager
    def read(self, size: int) -> Iterator[memoryview]:
        """The next `size` bytes, valid inside the block (the buffer is reused); EOFError if the parent is gone."""
        if size > len(self._buffer):
            self._buffer = bytearray(size)
        with memoryview(self._buffer) as whole, whole[:size] as view:
            got = 0
            while got < size:
                n = self._stream.recv_into(view[got:])
                if n == 0:
                    raise EOFError("the receiver's process closed the connection")
                got += n
            yield view


def _receive(processor: ReplayProcessor, signal_name: str, body: bytes | memoryview, as_json: bool,
             part: tuple[int, int], ingest: DurableIngest | None = None, replay: bool = False) -> tuple[Any, ...]:
    try:
        StoreUnwritable.check(processor.stats.get("store_error"))  # before decoding: nothing of it is kept
        with ingest.log_body(signal_name, body, as_json) if ingest else contextlib.nullcontext() as logged:
            records, errors = decode_body(signal_name, body, as_json, part)  # while the log writes and syncs
            if replay and ingest is not None:  # a dead receiver's log: what the store holds already is skipped
                records = ingest.unstored(signal_name, records)
            spans, logs = (records, ()) if signal_name == TRACES else ((), records)
            if records and logged is not None:
                logged()  # 503 if the log could not be written
            refused = processor.accept_records(spans, logs) if records else 0
        return ("ok", len(records), refused, errors)
    except RequestError as exc:
        return ("error", exc.status, exc.code.name, exc.message, exc.retry, exc.retry_after)
    except Exception as exc:  # noqa: BLE001 - a bug in a decoder must not end the worker
        return ("error", 500, "INTERNAL", f"internal error: {exc!r}", False, None)


# -- the parent's side -----------------------------------------------------------------------------
class _Worker:
    def __init__(self, index: int, count: int, factory: ProcessorFactory, durable: bool = False) -> None:
        self.index = index
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()  # a socket pair: bodies go raw on its stream (`BodyReader`)
        self.stream = socket.socket(fileno=os.dup(self.conn.fileno()))
        self.process = context.Process(target=worker_main, args=(child, index, count, factory, durable),
                                       name=f"otel-replay-collect-worker-{index}", daemon=True)
        self.process.start()
        child.close()

    def wait_ready(self) -> None:
        if not self.conn.poll(START_TIMEOUT_S):
            raise RuntimeError(f"receiver worker {self.index} did not start within {START_TIMEOUT_S:g} s")
        try:
            self.conn.recv()
        except EOFError:  # its processor could not be made: the worker printed why on stderr
            self.process.join(5)
            raise RuntimeError(f"receiver worker {self.index} exited while starting (exit code "
                               f"{self.process.exitcode}; its error is on stderr)") from None

    def ask(self, *request: Any, timeout_s: float | None = None) -> Any:
        """Send a request and return the worker's answer (its second field on "ok")."""
        self.conn.send(request)
        return self.answer(timeout_s)

    def answer(self, timeout_s: float | None = None) -> Any:
        if timeout_s is not None and not self.conn.poll(timeout_s):
            raise TimeoutError(f"receiver worker {self.index} did not answer within {timeout_s:g} s")
        reply = self.conn.recv()
        return reply[1] if reply[0] == "ok" and len(reply) == 2 else reply

    def end(self, timeout_s: float) -> None:
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()
        self.stream.close()


class ReceiverWorkers:
    """N spawned worker processes, each storing its share of every request's traces.

    :param count: how many workers (each has its own processor, queue and memory budget).
    :param factory: builds each worker's `ReplayProcessor`, in the worker.
    :param durable: each worker logs what it stores in its own write-ahead log (`receiver_durable`).
    """

    def __init__(self, count: int, factory: ProcessorFactory, durable: bool = False) -> None:
        if count < 1:
            raise ValueError(f"receiver workers must be at least 1, got {count}")
        self.count, self.factory, self.durable = count, factory, durable
        self._lock = threading.Lock()  # one request at a time: each pipe carries one exchange at once
        self._workers: list[_Worker] = []
        self.replaced = 0
        """Workers that died and were replaced."""
        self.final_stats: dict[str, Any] | None = None
        try:
            self._workers = [_Worker(i, count, factory, durable) for i in range(count)]
            for worker in self._workers:
                worker.wait_ready()
        except BaseException:
            self.stop(5)
            raise

    def receive(self, signal_name: str, body: bytes, as_json: bool, replay: bool = False) -> Received:
        """Hand one request body to every worker; raises the request's RequestError, if any.
        `replay`: a body from a dead receiver's log (the workers skip what the store holds)."""
        with self._lock:
            dead: list[_Worker] = []
            replies: list[tuple[Any, ...]] = []
            for worker in self._workers:
                try:
                    worker.conn.send(("receive", signal_name, as_json, len(body), replay))
                    worker.stream.sendall(body)
                except OSError:
                    dead.append(worker)
            for worker in self._workers:
                if worker in dead:
                    continue
                try:
                    replies.append(worker.answer())
                except (EOFError, OSError):
                    dead.append(worker)
            if dead:
                self._replace(dead)
                raise RequestError(503, grpc.StatusCode.UNAVAILABLE,
                                   "a receiver worker exited while storing this request; retry", retry=True)
        return _combine(replies)

    def _replace(self, dead: list[_Worker]) -> None:
        for worker in dead:
            code = worker.process.exitcode
            worker.end(1)
            logger.error("otel-replay collect: receiver worker %d exited (exit code %s); starting another. "
                         "Spans it had accepted but not yet written are lost.", worker.index, code)
            fresh = _Worker(worker.index, self.count, self.factory, self.durable)
            fresh.wait_ready()
            self._workers[worker.index] = fresh
            self.replaced += 1

    def flush(self, timeout_s: float) -> bool:
        """Every worker writes what it accepted; False if one took longer than the timeout."""
        with self._lock:
            for worker in self._workers:
                worker.conn.send(("flush", timeout_s))
            done = True
            for worker in self._workers:
                try:
                    done = worker.answer(timeout_s + 5) is True and done
                except (TimeoutError, EOFError, OSError):
                    done = False
            return done

    def stats(self) -> dict[str, Any]:
        """The workers' processor counters, added up (after `stop`, their final ones); while they
        run, `worker_cpu_s` is the CPU time their processes have used so far."""
        if self.final_stats is not None:
            return self.final_stats
        with self._lock:
            parts = []
            for worker in self._workers:
                with contextlib.suppress(TimeoutError, EOFError, OSError):  # a dead worker is replaced at the next request
                    parts.append(worker.ask("stats", timeout_s=30))
            return add_stats(parts)

    def stop(self, timeout_s: float) -> None:
        """Each worker writes what it accepted (within the timeout) and exits."""
        with self._lock:
            finals: list[dict[str, Any]] = []
            for worker in self._workers:
                try:
                    worker.conn.send(("stop", timeout_s))
                except OSError:
                    continue
            for worker in self._workers:
                with contextlib.suppress(TimeoutError, EOFError, OSError):  # a dead worker has no counters left
                    finals.append(worker.answer(timeout_s + 5))
                worker.end(5)
            self.final_stats = add_stats(finals)


def _combine(replies: list[tuple[Any, ...]]) -> Received:
    failed = [reply for reply in replies if reply[0] == "error"]
    if failed:  # a request-level error (not OTLP, too many records) is the same in every worker
        _, status, code, message, retry, retry_after = failed[0]
        raise RequestError(status, grpc.StatusCode[code], message, retry=retry, retry_after=retry_after)
    received = Received()
    errors: set[str] = set()  # a bad resource is seen by every worker; report it once
    for _, records, refused, found in replies:
        received.records += records
        received.refused += refused
        errors.update(found)
    received.errors = sorted(errors, key=_request_order)  # as one process would list them
    return received


def _request_order(error: str) -> tuple[int, ...]:
    """An error's place in the request: the indices of its path (`resourceSpans[0].scopeSpans[1].spans[7]`)."""
    return tuple(int(i) for i in _INDEX.findall(error.partition(": ")[0]))


def add_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Processor counters of several workers as one: numbers and per-reason counts added up."""
    total: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict):
                counts = total.setdefault(key, {})
                for reason, n in value.items():
                    counts[reason] = counts.get(reason, 0) + n
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
            elif total.get(key) is None:  # e.g. `store_error`: the first worker's that has one
                total[key] = value
    return total
