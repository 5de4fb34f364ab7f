"""OTLP/HTTP for `OtlpReceiver`: POST /v1/traces and /v1/logs, protobuf or JSON, gzip or deflate.

Stdlib `ThreadingHTTPServer`, one daemon thread per connection, keep-alive. Everything that can
be refused from the headers is refused before the body is read; bodies are read and
decompressed against the size limit, so a gzip bomb costs at most the limit in memory.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import zlib
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
    decode_body,
    export_response,
)

if TYPE_CHECKING:
    from otel_replay.capture.receiver import OtlpReceiver

logger = logging.getLogger("otel_replay")

RETRY_AFTER_S = 2  # how long a client told "queue full" waits before it sends again
PATHS = {"/v1/traces": TRACES, "/v1/logs": LOGS}
CONTENT_TYPES = {"application/x-protobuf": False, "application/protobuf": False, "application/json": True}
ENCODINGS = {"gzip": 31, "x-gzip": 31, "deflate": 15}  # zlib wbits: gzip header, zlib header
MAX_CONNECTIONS = 256
_LINGER_S = 1.0
_BUSY = (f"HTTP/1.1 503 Service Unavailable\r\nRetry-After: {RETRY_AFTER_S}\r\nContent-Length: 0\r\n"
         "Connection: close\r\n\r\n").encode()


class HttpServer(ThreadingHTTPServer):
    """One daemon thread per connection, at most `MAX_CONNECTIONS` at once."""

    daemon_threads = True
    block_on_close = False  # stop() must not wait for idle keep-alive connections

    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.address_family = socket.AF_INET6 if ":" in receiver.host else socket.AF_INET
        super().__init__((receiver.host, receiver.http_port), _OtlpHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # too many connections: no thread for this one
            with contextlib.suppress(OSError):
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("otel-replay collect: error while serving %s", client_address, exc_info=True)


class _OtlpHandler(BaseHTTPRequestHandler):
    """OTLP/HTTP: POST /v1/traces and /v1/logs, protobuf or JSON, optionally gzip or deflate."""

    protocol_version = "HTTP/1.1"  # keep-alive: exporters send batch after batch on one connection
    server: HttpServer

    def setup(self) -> None:
        self.timeout = self.server.receiver.read_timeout_s  # every read on this connection
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return None

    def version_string(self) -> str:
        return "otel-replay"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        receiver = self.server.receiver
        self._body_read = False
        try:
            signal, as_json, encoding, length = self._check()
            body = read_body(self.rfile, length, receiver.max_body)
            self._body_read = True
            records, errors = decode_body(signal, decompress(body, encoding, receiver.max_body), as_json)
            response = export_response(signal, *receiver.ingest(signal, records, errors))
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
        if not receiver.authorized(self.headers.get("Authorization")):
            raise RequestError(401, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token: send 'Authorization: Bearer <token>'")
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        as_json = CONTENT_TYPES.get(content_type)
        if as_json is None:
            raise RequestError(415, grpc.StatusCode.INVALID_ARGUMENT,
                               f"Content-Type {content_type or '(none)'!r} is not supported; send application/x-protobuf or application/json")
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        if encoding not in ("", "identity", *ENCODINGS):
            raise RequestError(415, grpc.StatusCode.INVALID_ARGUMENT,
                               f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or no encoding")
        return signal, as_json, encoding, self._length()

    def _length(self) -> int | None:
        """Content-Length (None: chunked); 411, 400 or 413 when it is missing, bad or too large."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return None
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise RequestError(411, grpc.StatusCode.INVALID_ARGUMENT, "send Content-Length or a chunked body")
        if not raw.strip().isdigit():
            raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"bad Content-Length {raw!r}")
        length, limit = int(raw), self.server.receiver.max_body
        if length > limit:
            raise RequestError(413, grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"body of {length} bytes is larger than {limit / 1024 / 1024:g} MB (--max-body-mb)")
        return length

    def _refuse(self, exc: RequestError, linger: bool = True) -> None:
        """An error response; an unread body is discarded if small, else the connection closes."""
        unread = not self._body_read and self._has_body()
        if unread and linger and exc.status not in (411, 413):
            try:
                length = self._length()
                if length is not None:
                    self.rfile.read(length)
                    unread = False
            except (RequestError, OSError):
                pass
        headers = [("Retry-After", str(RETRY_AFTER_S))] if exc.retry else []
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


def read_body(rfile: BinaryIO, length: int | None, limit: int) -> bytes:
    """The request body: `length` bytes, or chunked transfer coding when None; at most `limit`."""
    if length is None:
        return _read_chunked(rfile, limit)
    body = rfile.read(length)  # the caller checked length <= limit
    if len(body) < length:
        raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT,
                           f"body ended after {len(body)} of {length} bytes (Content-Length)")
    return body


def _read_chunked(rfile: BinaryIO, limit: int) -> bytes:
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
    data = body
    try:
        while data:  # one pass per gzip member
            stream = zlib.decompressobj(wbits)
            out += stream.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise RequestError(413, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"body is larger than {_mb(limit)} once decompressed")
            if not stream.eof:
                raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"{encoding} body is truncated")
            data = stream.unused_data
    except zlib.error as exc:
        raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"body is not valid {encoding}: {exc}") from None
    return bytes(out)


def _mb(limit: int) -> str:
    return f"{limit / 1024 / 1024:g} MB (--max-body-mb)"
