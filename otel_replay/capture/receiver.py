"""`OtlpReceiver`: OTLP/HTTP and OTLP/gRPC endpoints for traces and logs (`otel-replay collect`).

A request is decoded on its own thread and handed to one `ReplayProcessor`, whose writer stores
it exactly like live capture. Every request is bounded (body size, decompressed size, read
time); a bad one gets an error status and the servers keep serving. The servers listen on
loopback unless told otherwise, can require a bearer token (compared in constant time, and on
gRPC from the call's metadata before its message is read), and limit each client's request rate
(429 / RESOURCE_EXHAUSTED with a retry delay). While the store cannot be written, requests get
503 / UNAVAILABLE instead of an acknowledgement for spans that would be lost. With `durable`, a
request is acknowledged only once its body is in a fsynced write-ahead log (`receiver_durable`).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import logging
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message
from google.rpc.error_details_pb2 import RetryInfo

from otel_replay.capture.processor import ReplayProcessor
from otel_replay.capture.receiver_decode import (
    LOGS,
    NOUNS,
    TRACES,
    RequestError,
    StoreUnwritable,
    decode_body,
    export_response,
    summary,
)
from otel_replay.capture.receiver_durable import (
    DurableIngest,
    DurableStats,
    durable_counters,
    replay_orphans,
    retrying,
)
from otel_replay.capture.receiver_http import RETRY_AFTER_S, HttpServer
from otel_replay.capture.receiver_limits import DEFAULT_RATE, RateLimiter, Throttled
from otel_replay.capture.receiver_workers import ProcessorFactory, ReceiverWorkers
from otel_replay.capture.wal import WalRecord, check_writable
from otel_replay.errors import OtelReplayError
from otel_replay.store.location import StoreLocation
from otel_replay.store.writer import warm_up

TOKEN_ENV = "OTEL_REPLAY_COLLECT_TOKEN"
"""Bearer token clients must send (`Authorization: Bearer <token>`); default: none required."""
DEFAULT_MAX_BODY_MB = 16.0
READ_TIMEOUT_S = 10.0  # a client that sends nothing for this long loses its connection
REQUEST_TIMEOUT_S = 30.0  # a request must arrive whole this soon after its first byte
MAX_CONCURRENT_RPCS = 64  # more gRPC calls at once get RESOURCE_EXHAUSTED instead of a queue
MAX_STREAMS_PER_CONNECTION = 16
GRPC_WINDOW_BYTES = 1 << 20  # per stream: what the gRPC core buffers of a call before its handler reads it
GRPC_METHODS = {"/opentelemetry.proto.collector.trace.v1.TraceService/Export": TRACES,
                "/opentelemetry.proto.collector.logs.v1.LogsService/Export": LOGS}
logger = logging.getLogger("otel_replay")


class ReceiverError(OtelReplayError):
    """The receiver could not start: a port in use or an option out of range."""


# -- the receiver --------------------------------------------------------------------------------
class OtlpReceiver:
    """OTLP/HTTP and OTLP/gRPC receiver for traces and logs, writing to an otel-replay store.

    :param store: store directory (what `ReplayProcessor` writes to).
    :param host: address both servers bind; 127.0.0.1 unless you mean to expose them.
    :param http_port: OTLP/HTTP port (4318); 0 picks a free one (see `http_port` after `start`).
    :param grpc_port: OTLP/gRPC port (4317); 0 picks a free one.
    :param token: bearer token every request must carry; None accepts any request.
    :param max_body_mb: largest request body, compressed or not, in MB.
    :param read_timeout_s: a client that sends nothing for this long is disconnected.
    :param request_timeout_s: an HTTP request must arrive whole within this time of its first byte
        (a client that trickles bytes is cut off); gRPC handshakes get `read_timeout_s`.
    :param max_requests_per_s: requests per second one client address may send (a token bucket
        with bursts of twice that); more get 429 / RESOURCE_EXHAUSTED and a retry delay. None: no limit.
    :param processor: the `ReplayProcessor` to feed instead of a new one on `store` (to size its
        queue, or to share it); `stop` shuts it down either way.
    :param workers: processes that decode and store (`receiver_workers`); 1: this process does.
        Workers are spawned, so a script that starts them needs the usual `if __name__ == "__main__":`.
    :param processor_factory: with `workers` > 1, builds each worker's processor in the worker
        (picklable; default: `ReplayProcessor(store, yield_gil=False)`).
    :param durable: acknowledge a request only once its body is in a fsynced write-ahead log under
        `<store>/_wal/` (one per worker); `start` first replays what a receiver that died left there.
        Needs a local store.
    """

    def __init__(self, store: str | Path | StoreLocation, *, host: str = "127.0.0.1", http_port: int = 4318,
                 grpc_port: int = 4317, token: str | None = None, max_body_mb: float = DEFAULT_MAX_BODY_MB,
                 read_timeout_s: float = READ_TIMEOUT_S, processor: ReplayProcessor | None = None,
                 request_timeout_s: float = REQUEST_TIMEOUT_S, max_requests_per_s: float | None = DEFAULT_RATE,
                 workers: int = 1, processor_factory: ProcessorFactory | None = None, durable: bool = False) -> None:
        if not 0 < max_body_mb <= 2047:
            raise ReceiverError(f"--max-body-mb must be between 0 and 2047, got {max_body_mb}")
        for name, port in (("--http-port", http_port), ("--grpc-port", grpc_port)):
            if not 0 <= port <= 65535:
                raise ReceiverError(f"{name} must be between 0 and 65535, got {port}")
        if workers < 1:
            raise ReceiverError(f"--workers must be at least 1, got {workers}")
        if workers > 1 and processor is not None:
            raise ReceiverError("give a processor_factory, not a processor, for several workers")
        self.store = StoreLocation.of(store)
        if durable and self.store.local is None:
            raise ReceiverError(f"--durable needs a local store directory (its write-ahead log is a local file); "
                                f"{self.store.url} is not one")
        self.durable_mode = durable
        self.durable: DurableIngest | None = None
        """This process's write-ahead log, while it runs (`durable` with one worker)."""
        self.replayed = DurableStats()
        """What `start` replayed through the workers (`durable` with several)."""
        self.worker_count = workers
        self.processor_factory = processor_factory or functools.partial(ReplayProcessor, self.store, yield_gil=False)
        self.workers: ReceiverWorkers | None = None
        """The worker processes, while they run (`workers` > 1)."""
        self.host, self.http_port, self.grpc_port = host, http_port, grpc_port
        self.max_body = int(max_body_mb * 1024 * 1024)
        self.read_timeout_s = read_timeout_s
        self.request_timeout_s = max(request_timeout_s, read_timeout_s)
        self.limiter = RateLimiter(max_requests_per_s) if max_requests_per_s else None
        self.throttled = 0
        """Requests refused because their client was over its rate."""
        self._token = _digest(token.encode("utf-8")) if token else None
        self.counts = {f"{what}_{signal}": 0 for what in ("accepted", "refused", "malformed") for signal in (TRACES, LOGS)}
        """Records accepted, refused because the queue was full, and malformed, per signal."""
        self.processor = processor
        self._lock = threading.Lock()  # one producer at a time: the queue's counters are not atomic
        self._closing = False
        self._http: HttpServer | None = None
        self._http_thread: threading.Thread | None = None
        self._grpc: grpc.Server | None = None

    @property
    def http_endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"{f'[{self.host}]' if ':' in self.host else self.host}:{self.grpc_port}"

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> OtlpReceiver:
        """Open the store's writer and both servers; returns once both listen."""
        if self.durable_mode:
            try:  # before any worker starts: a store that cannot hold the log is one line, not a worker's traceback
                check_writable(self.store.local)  # type: ignore[arg-type]
            except OSError as exc:
                raise ReceiverError(f"cannot write the write-ahead log under {self.store.display()}/_wal "
                                    f"({exc.strerror or exc}); --durable needs a writable store") from exc
        if self.worker_count == 1:
            if self.processor is None:
                self.processor = ReplayProcessor(self.store)
            warm_up()  # the first write's one-off cost (~0.1 s), here rather than in the first request's time
        try:
            self._http = HttpServer(self)
        except OSError as exc:
            self._cannot_listen("OTLP/HTTP", self.http_endpoint, exc.strerror or str(exc), "--http-port")
        self.http_port = self._http.server_address[1]
        try:
            self._grpc = self._make_grpc_server()
        except RuntimeError:  # grpc says only "Failed to bind" (and logs why)
            self._cannot_listen("OTLP/gRPC", self.grpc_endpoint, "address in use or not available", "--grpc-port")
        if self.worker_count > 1:  # after both ports are bound: a port in use fails at once
            try:
                self.workers = ReceiverWorkers(self.worker_count, self.processor_factory, durable=self.durable_mode)
            except Exception as exc:  # e.g. a processor factory that does not pickle, a worker that cannot start
                self.stop(5)
                raise ReceiverError(f"cannot start the receiver's {self.worker_count} workers: {exc}") from exc
        if self.durable_mode:
            self._start_durable()
        self._http_thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.1},
                                             name="otel-replay-collect-http", daemon=True)
        self._http_thread.start()
        self._grpc.start()
        if self._token is None and not is_loopback(self.host):
            logger.warning("otel-replay collect listens on %s without a token: anyone who can reach it can write "
                           "to the store (set a token, or listen on 127.0.0.1)", self.host)
        return self

    def _start_durable(self) -> None:
        """Open this process's write-ahead log (one worker), then replay what dead receivers left,
        before the servers accept: into the store, through the log of whoever stores it now."""
        local = self.store.local
        assert local is not None
        try:
            if self.workers is None:
                assert self.processor is not None
                self.durable = DurableIngest(self.store, self.processor)
                replay_orphans(local, retrying(self.durable.replay), self.durable.stats)
            else:
                replay_orphans(local, retrying(self._replay_through_workers), self.replayed)
        except OSError as exc:
            self.stop(5)
            raise ReceiverError(f"cannot open the write-ahead log under {local / '_wal'}: {exc.strerror or exc}") from exc
        self.flush()

    def _replay_through_workers(self, record: WalRecord) -> None:
        got = self.workers.receive(record.signal, record.body, record.as_json, replay=True)  # type: ignore[union-attr]
        if got.refused:  # all or none, as for a request: `retrying` sends it again
            raise RequestError(503, grpc.StatusCode.RESOURCE_EXHAUSTED, "a worker's queue is full", retry=True)
        self.replayed.replayed_requests += 1
        self.replayed.replayed_records += got.records

    def _cannot_listen(self, what: str, where: str, why: str, flag: str) -> NoReturn:
        self.stop(5)
        raise ReceiverError(f"cannot listen for {what} on {where} ({why}); is another collector running? "
                            f"Pick another port with {flag} (0: any free port) or --host") from None

    def _make_grpc_server(self) -> grpc.Server:
        options = [("grpc.max_receive_message_length", self.max_body), ("grpc.so_reuseport", 0),
                   ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
                   # A fixed 1 MB flow-control window per stream instead of one that BDP probing grows:
                   # a refused call's message is never read, so the window is all the core buffers of it
                   # (bench reliability's flood of 3 x 64 unauthenticated 15 MB calls: +133 MB of VmRSS
                   # with BDP probing, +5 MB with this). Senders far away get at most 1 MB per round trip.
                   ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", GRPC_WINDOW_BYTES),
                   ("grpc.server_handshake_timeout_ms", int(self.read_timeout_s * 1000)),
                   ("grpc.max_connection_idle_ms", int(max(self.request_timeout_s, 60) * 1000))]
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="otel-replay-collect-grpc"),
                             options=options, maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
        server.add_generic_rpc_handlers((_OtlpGrpcHandler(self),))
        self.grpc_port = server.add_insecure_port(f"{self.grpc_endpoint}")
        return server

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Write everything accepted so far; False if that took longer than the timeout."""
        if self.workers is not None:
            return self.workers.flush(timeout_s)
        return self.processor is not None and self.processor.force_flush(int(timeout_s * 1000))

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stop both servers, then write everything accepted, within the timeout (generous: what is
        still queued when it runs out is lost, and each of those spans was acknowledged)."""
        deadline = time.monotonic() + timeout_s
        if self._grpc is not None:
            self._grpc.stop(min(2.0, timeout_s / 4)).wait(max(deadline - time.monotonic(), 0))
        if self._http is not None:
            if self._http_thread is not None:  # shutdown() waits for serve_forever, so only if it runs
                self._http.shutdown()
            self._http.server_close()
        with self._lock:  # a request still in flight now gets 503 / UNAVAILABLE
            self._closing = True
        if self.workers is not None:
            self.workers.stop(max(deadline - time.monotonic(), 0))
        if self.durable is not None:  # writes what was queued, then removes the log it covers
            self.durable.close(max(deadline - time.monotonic(), 0))
        if self.processor is not None:
            self.processor.shutdown(int(max(deadline - time.monotonic(), 0) * 1000))

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- shared by both transports -------------------------------------------------------------
    @property
    def requires_token(self) -> bool:
        return self._token is not None

    def authorized(self, header: str | None) -> bool:
        """Whether an `Authorization` header carries the token (always, when none is configured)."""
        if self._token is None:
            return True
        scheme, _, credentials = (header or "").strip().partition(" ")
        given = _digest(credentials.strip().encode("latin-1", "replace"))  # HTTP headers arrive as latin-1
        return hmac.compare_digest(given, self._token) and scheme.lower() == "bearer"

    def admit(self, client: str) -> None:
        """Take one request from `client`'s rate; raises Throttled (429) when it is over."""
        if self.limiter is None:
            return
        wait = self.limiter.take(client)
        if wait:
            with self._lock:
                self.throttled += 1
            raise Throttled(client, self.limiter.rate, wait)

    def check_store(self) -> None:
        """Raise `StoreUnwritable` (503 / UNAVAILABLE, retry later) while the store cannot be written.

        The writer sets `store_error` when a write fails and clears it when one succeeds; while it is
        set the writer retries every flush interval (its counters record), so accepting resumes about
        that long after the store is writable again. Workers check their own writer (`receiver_workers`).
        """
        if self.processor is not None:
            StoreUnwritable.check(self.processor.stats.get("store_error"))

    def receive(self, signal: str, body: bytes, as_json: bool) -> tuple[int, str]:
        """Decode and queue one request body (here, or in the workers); returns (rejected, message)
        for `partial_success`. Raises RequestError as `ingest` does, and 400 for a body that is not
        an OTLP request."""
        if self.workers is None:
            self.check_store()
            if self.durable is None:
                return self.ingest(signal, *decode_body(signal, body, as_json))
            with self.durable.log_body(signal, body, as_json) as logged:  # written and fsynced while decoding
                records, errors = decode_body(signal, body, as_json)
                if records:
                    logged()  # 503 if the log could not be written
                return self.ingest(signal, records, errors)
        with self._lock:
            if self._closing:
                raise RequestError(503, grpc.StatusCode.UNAVAILABLE, "the receiver is shutting down", retry=True)
        got = self.workers.receive(signal, body, as_json)
        _refuse_if_all_malformed(signal, got.records, got.errors)
        # All or none, as in one process: a worker with no room for its share makes the whole request
        # a retry; the shares other workers took are stored twice, and read once (the views keep one
        # row per span).
        return self._account(signal, got.records, got.refused, got.errors, whole=got.refused > 0)

    def ingest(self, signal: str, records: list[Any], errors: list[str]) -> tuple[int, str]:
        """Queue decoded records; returns (rejected, message) for `partial_success`.

        Raises RequestError when nothing could be taken: every record malformed (400), the queue
        full (503) or the receiver stopping (503).
        """
        _refuse_if_all_malformed(signal, len(records), errors)
        with self._lock:
            if self._closing or self.processor is None:
                raise RequestError(503, grpc.StatusCode.UNAVAILABLE, "the receiver is shutting down", retry=True)
            spans, logs = (records, ()) if signal == TRACES else ((), records)
            refused = self.processor.accept_records(spans, logs) if records else 0
        return self._account(signal, len(records), refused, errors, whole=bool(records) and refused == len(records))

    def _account(self, signal: str, records: int, refused: int, errors: list[str], whole: bool) -> tuple[int, str]:
        noun = NOUNS[signal]
        with self._lock:
            self.counts[f"accepted_{signal}"] += records - refused
            self.counts[f"refused_{signal}"] += refused
            self.counts[f"malformed_{signal}"] += len(errors)
        if whole:
            raise RequestError(503, grpc.StatusCode.RESOURCE_EXHAUSTED,
                               "the receiver's queue is full (the store is not keeping up); retry later", retry=True)
        parts = [f"{len(errors)} malformed {noun}(s) skipped: {summary(errors)}"] if errors else []
        if refused:
            parts.append(f"{refused} {noun}(s) refused: the receiver's queue is full")
        return len(errors) + refused, "; ".join(parts)

    def stats(self) -> dict[str, Any]:
        """The writer counters (`ReplayProcessor.stats`; with workers, theirs added up); with
        `durable`, the write-ahead log's too (`wal_*`)."""
        if self.workers is not None:
            stats = self.workers.stats()
            if self.durable_mode:
                for key, value in durable_counters(self.replayed).items():
                    stats[key] = stats.get(key, 0) + value
            return stats
        stats = dict(self.processor.stats) if self.processor is not None else {}
        if self.durable is not None:
            stats.update(self.durable.counters())
        return stats


def _refuse_if_all_malformed(signal: str, records: int, errors: list[str]) -> None:
    if errors and not records:
        raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT,
                           f"every {NOUNS[signal]} is malformed: {summary(errors)}")


# -- gRPC --------------------------------------------------------------------------------------
class _OtlpGrpcHandler(grpc.GenericRpcHandler):
    """`TraceService/Export` and `LogsService/Export`, chosen before the call's message is read.

    A call without the token gets a handler that refuses it (UNAUTHENTICATED) without reading its
    message; a call with it gets the message as raw bytes, decoded as an OTLP/HTTP body is (so a
    record the protobuf runtime cannot parse costs only that record).
    """

    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver
        # never reads the stream
        self._refuse: grpc.RpcMethodHandler[Any, Any] = grpc.stream_unary_rpc_method_handler(_unauthenticated)
        self._export: dict[str, grpc.RpcMethodHandler[Any, Any]] = {signal: grpc.unary_unary_rpc_method_handler(
            functools.partial(_grpc_export, receiver, signal), response_serializer=_serialize)
            for signal in (TRACES, LOGS)}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        signal = GRPC_METHODS.get(handler_call_details.method)
        if signal is None:
            return None
        if self.receiver.requires_token:
            header = next((v for k, v in handler_call_details.invocation_metadata if k == "authorization"), None)
            if not isinstance(header, str) or not self.receiver.authorized(header):
                return self._refuse
        return self._export[signal]


def _unauthenticated(requests: Any, context: grpc.ServicerContext) -> NoReturn:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (authorization metadata)")


def _serialize(response: Message) -> bytes:
    return response.SerializeToString()


def _grpc_export(receiver: OtlpReceiver, signal: str, body: bytes, context: grpc.ServicerContext) -> Message:
    """One authorized Export call: its message, still serialized, decoded and queued like an HTTP body."""
    try:
        receiver.admit(peer_address(context.peer()))
        return export_response(signal, *receiver.receive(signal, body, as_json=False))
    except RequestError as exc:
        if exc.retry:
            info = RetryInfo()
            info.retry_delay.seconds = RETRY_AFTER_S if exc.retry_after is None else exc.retry_after
            context.set_trailing_metadata((("google.rpc.retryinfo-bin", info.SerializeToString()),))
        context.abort(exc.code, exc.message)


def peer_address(peer: str) -> str:
    """The client address of a gRPC peer string (`ipv4:1.2.3.4:5678`, `ipv6:[::1]:5678`)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _digest(secret: bytes) -> bytes:
    """Tokens are compared as digests: equal lengths, so the constant-time compare leaks nothing."""
    return hashlib.sha256(secret).digest()
