"""OTLP/HTTP for `OtlpReceiver`: POST /v1/traces and /v1/logs, protobuf or JSON, gzip or deflate.

Stdlib `ThreadingHTTPServer`, one daemon thread per connection, keep-alive. Everything that can
be refused from the headers is refused before the body is read; bodies are read and
decompressed against the size limit, so a gzip bomb costs at most the limit in memory.
Connections are bounded in number (in all and per client address; with a token, those that have
not shown it are counted apart and the oldest make room for new ones, so they cannot keep out a
client that has it), each request must arrive whole within the request timeout (slow-loris),
bodies in memory are bounded in total, and a few requests at a time are decoded
(`receiver_limits`). The token is checked before the request rate, the store's state and the body.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, BinaryIO

import grpc
import orjson
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc.status_pb2 import Status

from otel_replay.capture.receiver_decode import (
    LOGS,
    TRACES,
    RequestError,
    export_response,
)
from otel_replay.capture.receiver_limits import ByteBudget, ConnectionSlots, DeadlineReader, Slot

if TYPE_CHECKING:
    from otel_replay.capture.receiver import OtlpReceiver

logger = logging.getLogger("otel_replay")

RETRY_AFTER_S = 2  # how long a client told "queue full" waits before it sends again
PATHS = {"/v1/traces": TRACES, "/v1/logs": LOGS}
CONTENT_TYPES = {"application/x-protobuf": False, "application/protobuf": False, "application/json": True}
ENCODINGS = {"gzip": 31, "x-gzip": 31, "deflate": 15}  # zlib wbits: gzip header, zlib header
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_CLIENT = 64  # one address cannot take every connection
BODIES_IN_FLIGHT = 8  # request bodies held at once, in units of the largest body (--max-body-mb)
DECODERS = 4  # requests decoded at once (decoding is CPU-bound: more would only queue on the GIL)
_WAIT_FOR_ROOM_S = 5.0  # how long a request waits for body room or a decoder before a 503
_DISCARD_MAX = 1024 * 1024  # an unread body up to this size is read and dropped to keep the connection
_PIECE = 256 * 1024  # bodies are read (and their memory reserved) this much at a time
_LINGER_S = 1.0
_BUSY = (f"HTTP/1.1 503 Service Unavailable\r\nRetry-After: {RETRY_AFTER_S}\r\nContent-Length: 0\r\n"
         "Connection: close\r\n\r\n").encode()


class HttpServer(ThreadingHTTPServer):
    """One daemon thread per connection, at most `MAX_CONNECTIONS` at once (and per client address
    `MAX_CONNECTIONS_PER_CLIENT`); a connection over either limit gets a 503 and is closed.

    With a token, those limits hold twice over, apart: for connections that have not shown it (a new
    one over a limit closes the oldest of them instead of being refused) and for those that have.
    """

    daemon_threads = True
    block_on_close = False  # stop() must not wait for idle keep-alive connections
    request_queue_size = 128  # listen backlog (the stdlib's 5 makes a burst of connects wait seconds)

    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver
        self.slots = ConnectionSlots(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_CLIENT,
                                     reserve_for_token=receiver.requires_token)
        self._slot_of: dict[Any, Slot] = {}  # connection socket -> its slot
        self.bodies = ByteBudget(BODIES_IN_FLIGHT * receiver.max_body)
        self.decoders = threading.BoundedSemaphore(DECODERS)
        self.address_family = socket.AF_INET6 if ":" in receiver.host else socket.AF_INET
        super().__init__((receiver.host, receiver.http_port), _OtlpHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        slot = self.slots.acquire(client_address[0], request)
        if slot is None:  # too many connections: no thread for this one
            with contextlib.suppress(OSError):
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        self._slot_of[request] = slot
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release(self._slot_of.pop(request))
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release(self._slot_of.pop(request))

    def verify(self, request: Any) -> bool:
        """Count this connection among those that showed the token; False if there is no room."""
        slot = self._slot_of.get(request)
        return slot is not None and self.slots.verify(slot)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("otel-replay collect: error while serving %s", client_address, exc_info=True)


class _OtlpHandler(BaseHTTPRequestHandler):
    """OTLP/HTTP: POST /v1/traces and /v1/logs, protobuf or JSON, optionally gzip or deflate."""

    protocol_version = "HTTP/1.1"  # keep-alive: exporters send batch after batch on one connection
    server: HttpServer

    def setup(self) -> None:
        receiver = self.server.receiver
        self.timeout = receiver.read_timeout_s  # type: ignore[misc]  # per connection: every read and write on it
        super().setup()
        self.rfile.close()  # reads go through the deadline reader instead
        self._reader = DeadlineReader(self.connection, receiver.read_timeout_s, receiver.request_timeout_s)
        self.rfile = io.BufferedReader(self._reader, 65536)

    def handle_one_request(self) -> None:
        self._reader.start_request()  # the request timeout runs from the next request's first byte
        self._admitted = False
        self._body_started = False  # part of the body was read: an error must close the connection
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return None

    def version_string(self) -> str:
        return "otel-replay"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        receiver = self.server.receiver
        self._body_read = False
        try:
            signal, as_json, encoding, length = self._check()
            held = _Held(self.server.bodies, self.client_address[0])
            self._body_started = True
            try:
                body = read_body(self.rfile, length, receiver.max_body, held.reserve)
                self._body_read = True
                if not self.server.decoders.acquire(timeout=_WAIT_FOR_ROOM_S):
                    raise RequestError(503, grpc.StatusCode.UNAVAILABLE, "the receiver is busy; retry later", retry=True)
                try:
                    plain = decompress(body, encoding, receiver.max_body)
                    del body
                    response = export_response(signal, *receiver.receive(signal, plain, as_json))
                finally:
                    self.server.decoders.release()
            finally:
                held.release()
            self._send(200, *self._encode(response, as_json))
        except RequestError as exc:
            self._refuse(exc)
        except TimeoutError:  # the client stopped sending: free this thread
            self._refuse(RequestError(408, grpc.StatusCode.DEADLINE_EXCEEDED, "the body did not arrive in time"),
                         linger=False)
        except ConnectionError:
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - a bug in a decoder must not cost the connection
            logger.warning("otel-replay collect: request failed: %r", exc)
            self._refuse(RequestError(500, grpc.StatusCode.INTERNAL, f"internal error: {exc!r}"))

    def _other_method(self) -> None:
        self._body_read = False
        path = self.path.split("?", 1)[0]
        if path not in PATHS:
            self._refuse(RequestError(404, grpc.StatusCode.NOT_FOUND, f"no endpoint {path}; use /v1/traces or /v1/logs"))
        else:
            self._refuse(RequestError(405, grpc.StatusCode.UNIMPLEMENTED, f"{self.command} is not allowed; use POST"))

    do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _other_method  # noqa: N815

    def handle_expect_100(self) -> bool:
        """Refuse before the client sends the body (curl asks first for bodies over 1 MB)."""
        if self.command == "POST":
            self._body_read = False
            try:
                self._check()
            except RequestError as exc:
                self._refuse(exc)
                return False
        return super().handle_expect_100()

    def _check(self) -> tuple[str, bool, str, int | None]:
        """What can be refused from the headers alone: path, token, content type, size."""
        receiver = self.server.receiver
        path = self.path.split("?", 1)[0]
        signal = PATHS.get(path)
        if signal is None:
            raise RequestError(404, grpc.StatusCode.NOT_FOUND, f"no endpoint {path}; use /v1/traces or /v1/logs")
        if not receiver.authorized(self.headers.get("Authorization")):  # first: a flood without it costs no one else
            raise RequestError(401, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token: send 'Authorization: Bearer <token>'")
        if receiver.requires_token and not self.server.verify(self.request):
            self.close_connection = True
            raise RequestError(503, grpc.StatusCode.UNAVAILABLE, "too many connections with the token are open; "
                               "retry later", retry=True)
        if not self._admitted:  # once per request (also asked before a 100 Continue)
            receiver.admit(self.client_address[0])  # Throttled (429) when over its rate
            self._admitted = True
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        as_json = CONTENT_TYPES.get(content_type)
        if as_json is None:
            raise RequestError(415, grpc.StatusCode.INVALID_ARGUMENT,
                               f"Content-Type {content_type or '(none)'!r} is not supported; send application/x-protobuf or application/json")
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        if encoding not in ("", "identity", *ENCODINGS):
            raise RequestError(415, grpc.StatusCode.INVALID_ARGUMENT,
                               f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or no encoding")
        length = self._length()
        receiver.check_store()  # 503 before the body is read, while the store cannot be written
        return signal, as_json, encoding, length

    def _length(self) -> int | None:
        """Content-Length (None: chunked); 411, 400 or 413 when it is missing, bad or too large."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return None
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise RequestError(411, grpc.StatusCode.INVALID_ARGUMENT, "send Content-Length or a chunked body")
        text = raw.strip(" \t")  # str.isdigit() admits '²' and str.strip() '\x1d', which int() refuses
        if not (text.isascii() and text.isdigit()):
            raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"bad Content-Length {raw[:40]!r}")
        length, limit = int(text), self.server.receiver.max_body
        if length > limit:
            raise RequestError(413, grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"body of {length} bytes is larger than {limit / 1024 / 1024:g} MB (--max-body-mb)")
        return length

    def _refuse(self, exc: RequestError, linger: bool = True) -> None:
        """An error response; an unread body is discarded if small, else the connection closes."""
        unread = not self._body_read and self._has_body()
        if unread and linger and exc.status not in (411, 413) and not self._body_started:
            try:
                length = self._length()
                if length is not None and length <= _DISCARD_MAX:
                    while length > 0:  # read and drop, in pieces: no copy of the body is kept
                        piece = self.rfile.read(min(length, 65536))
                        if not piece:
                            break
                        length -= len(piece)
                    unread = length > 0
            except (RequestError, OSError):
                pass
        headers = [("Retry-After", str(RETRY_AFTER_S if exc.retry_after is None else exc.retry_after))] if exc.retry else []
        if exc.status == 401:
            headers.append(("WWW-Authenticate", "Bearer"))
        if exc.status == 405:
            headers.append(("Allow", "POST"))
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        as_json = CONTENT_TYPES.get(content_type)
        status = Status(code=exc.code.value[0], message=exc.message)
        body, ctype = self._encode(status, as_json) if as_json is not None else (exc.message.encode() + b"\n", "text/plain; charset=utf-8")
        try:
            self._send(exc.status, body, ctype, headers, close=unread)
            if unread and linger:
                self._linger()
        except OSError:
            self.close_connection = True

    def _has_body(self) -> bool:
        return (self.headers.get("Content-Length") or "0").strip() != "0" or "Transfer-Encoding" in self.headers

    def _linger(self) -> None:
        """Read what the client still sends for a moment, so closing does not reset the response."""
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_WR)
        self.connection.settimeout(_LINGER_S)
        deadline = time.monotonic() + _LINGER_S
        while time.monotonic() < deadline and self.connection.recv(65536):
            pass

    @staticmethod
    def _encode(message: Message, as_json: bool) -> tuple[bytes, str]:
        if as_json:
            return orjson.dumps(json_format.MessageToDict(message)), "application/json"
        return message.SerializeToString(), "application/x-protobuf"

    def _send(self, status: int, body: bytes, content_type: str, headers: list[tuple[str, str]] | None = None,
              close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers or ():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _Held:
    """Bytes of one request's body reserved in the server's `ByteBudget`, as they arrive."""

    def __init__(self, budget: ByteBudget, client: str) -> None:
        self.budget, self.client, self.size = budget, client, 0

    def reserve(self, size: int) -> None:
        if not self.budget.reserve(self.client, size, _WAIT_FOR_ROOM_S):
            raise RequestError(503, grpc.StatusCode.UNAVAILABLE,
                               "the receiver holds too many request bodies at once; retry later", retry=True)
        self.size += size

    def release(self) -> None:
        self.budget.release(self.client, self.size)
        self.size = 0


def read_body(rfile: io.BufferedIOBase | BinaryIO, length: int | None, limit: int,
              reserve: Callable[[int], None] | None = None) -> bytes:
    """The request body: `length` bytes, or chunked transfer coding when None; at most `limit`.

    Read in pieces, each `reserve`d first: a client that sends slowly holds only what it sent.
    """
    reserve = reserve or _no_budget
    if length is None:
        return _read_chunked(rfile, limit, reserve)
    pieces, left = [], length  # the caller checked length <= limit
    while left > 0:
        size = min(left, _PIECE)
        reserve(size)
        piece = rfile.read(size)
        if not piece:
            raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT,
                               f"body ended after {length - left} of {length} bytes (Content-Length)")
        pieces.append(piece)
        left -= len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _no_budget(size: int) -> None:
    return None


def _read_chunked(rfile: io.BufferedIOBase | BinaryIO, limit: int, reserve: Callable[[int], None]) -> bytes:
    body = bytearray()
    while True:
        line = rfile.readline(1024)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"bad chunk size line {line[:40]!r}") from None
        if size <= 0:
            break
        if len(body) + size > limit:
            raise RequestError(413, grpc.StatusCode.RESOURCE_EXHAUSTED, f"body is larger than {_mb(limit)}")
        reserve(size)
        chunk = rfile.read(size)
        if len(chunk) < size:
            raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, "chunked body ended early")
        body += chunk
        rfile.readline(1024)  # the CRLF after each chunk
    for _ in range(64):  # trailer fields, up to the empty line
        if rfile.readline(8192) in (b"\r\n", b"\n", b""):
            break
    return bytes(body)


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo `Content-Encoding` (gzip, deflate), stopping as soon as the output passes `limit`."""
    if encoding in ("", "identity"):
        return body
    wbits = ENCODINGS.get(encoding)
    if wbits is None:
        raise RequestError(415, grpc.StatusCode.INVALID_ARGUMENT,
                           f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or no encoding")
    out = bytearray()
    pos, view, members = 0, memoryview(body), 0
    try:
        while pos < len(body):  # one pass per gzip member
            members += 1
            if members > 64:  # exporters send one; thousands of empty members only burn CPU
                raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"{encoding} body of more than 64 members")
            stream = zlib.decompressobj(wbits)
            while not stream.eof:  # fed 8 KB at a time: the rest of the body is never copied per member
                if pos >= len(body):
                    raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"{encoding} body is truncated")
                piece = view[pos:pos + 8192]
                pos += len(piece)
                out += stream.decompress(piece, limit + 1 - len(out))
                if len(out) > limit:
                    raise RequestError(413, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                       f"body is larger than {_mb(limit)} once decompressed")
            pos -= len(stream.unused_data)
    except zlib.error as exc:
        raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"body is not valid {encoding}: {exc}") from None
    return bytes(out)


def _mb(limit: int) -> str:
    return f"{limit / 1024 / 1024:g} MB (--max-body-mb)"
