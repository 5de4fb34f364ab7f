"""OTLP requests for the receiver: records out of a body or a parsed request, and the responses.

Shared by OTLP/HTTP and OTLP/gRPC. A malformed record (a `SourceError` from the decoders) is
skipped and reported (`partial_success`); a body that cannot be read at all is a `RequestError`.
Decoding is linear in the body: each resource is decoded once, whatever the number of bad records.
A protobuf body the runtime cannot parse whole (one record nested past its recursion limit) is
read record by record (`otlp_proto.read_request`), so only that record is lost, as in JSON.
"""

from __future__ import annotations

from typing import Any, cast

import grpc
import orjson
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_replay.normalize.records import TracePart
from otel_replay.normalize.sources.errors import SourceError
from otel_replay.normalize.sources.otlp_json import logs_from_request, spans_from_request
from otel_replay.normalize.sources.otlp_proto import (
    Unreadable,
    logs_from_proto,
    read_request,
    spans_from_proto,
)

TRACES, LOGS = "traces", "logs"
NOUNS = {TRACES: "span", LOGS: "log record"}
MAX_RECORDS = 50_000  # per request; more would not fit the writer's queue (and costs memory to decode)
_PROTO_LEVELS = {TRACES: ("resource_spans", "scope_spans", "spans"), LOGS: ("resource_logs", "scope_logs", "log_records")}
_JSON_LEVELS = {TRACES: ("resourceSpans", "scopeSpans", "spans"), LOGS: ("resourceLogs", "scopeLogs", "logRecords")}


STORE_RETRY_AFTER_S = 5  # a store that failed a write is retried every flush interval (2 s by default)


class RequestError(Exception):
    """A request the receiver refuses, with its HTTP status and gRPC code."""

    def __init__(self, status: int, code: grpc.StatusCode, message: str, retry: bool = False,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry = status, code, message, retry
        self.retry_after = retry_after  # seconds, when the refusal says when to come back


class StoreUnwritable(RequestError):
    """The store failed its last write (read-only, full, gone): 503 / UNAVAILABLE with a retry delay,
    so the exporter keeps the request and sends it again, rather than an acknowledgement for spans
    the writer would drop."""

    def __init__(self, reason: str) -> None:
        super().__init__(503, grpc.StatusCode.UNAVAILABLE, f"the store cannot be written now ({reason}); nothing "
                         f"of this request was kept; retry later", retry=True, retry_after=STORE_RETRY_AFTER_S)

    @staticmethod
    def check(store_error: object) -> None:
        """Raise when the writer reports a store error (`CaptureWriter.store_error`: "reason: detail")."""
        if store_error:
            raise StoreUnwritable(str(store_error).split(":", 1)[0])


def decode_body(signal: str, body: bytes | memoryview, json: bool, part: TracePart | None = None) -> tuple[list[Any], list[str]]:
    """Records in an OTLP request body (those of `part`'s traces only, when given: a receiver
    worker's share), and one message per malformed record (skipped).

    Raises only `RequestError`: 400 for a body that is not an OTLP request at all (not JSON,
    not protobuf, the wrong shape), 413 for too many records. Every record returned passed
    `checks.check_span` / `check_log`, so the writer can store it.
    """
    try:
        if not json:
            return records_from_proto(signal, *read_request(signal, body), part=part)
        doc = orjson.loads(body)
        top, mid, leaf = _JSON_LEVELS[signal]
        if isinstance(doc, dict):
            _check_count(signal, sum(len(_dicts(m.get(leaf))) for o in _dicts(doc.get(top)) for m in _dicts(o.get(mid))))
        errors: list[tuple[str, str]] = []
        decode = spans_from_request if signal == TRACES else logs_from_request
        records = list(decode(doc, errors, part))
        return records, [f"{path}: {reason}" for path, reason in errors]
    except SourceError as exc:
        raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"body is not JSON: {exc}") from None


def records_from_proto(signal: str, request: Message, unreadable: Unreadable | None = None,
                       part: TracePart | None = None) -> tuple[list[Any], list[str]]:
    """Records of a parsed request; a malformed record (or one `unreadable` names) is skipped and described."""
    top, mid, leaf = _PROTO_LEVELS[signal]
    _check_count(signal, sum(len(getattr(m, leaf)) for o in getattr(request, top) for m in getattr(o, mid)))
    errors: list[tuple[str, str]] = []
    records: list[Any]
    if signal == TRACES:
        records = list(spans_from_proto(cast(ExportTraceServiceRequest, request), errors, part, unreadable))
    else:
        records = list(logs_from_proto(cast(ExportLogsServiceRequest, request), errors, part, unreadable))
    return records, [f"{path}: {reason}" for path, reason in errors]


def _check_count(signal: str, count: int) -> None:
    if count > MAX_RECORDS:
        raise RequestError(413, grpc.StatusCode.INVALID_ARGUMENT,
                           f"{count} {NOUNS[signal]}s in one request; send at most {MAX_RECORDS} per request")


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def export_response(signal: str, rejected: int, message: str) -> Message:
    """`Export*ServiceResponse`, with `partial_success` set when something was not kept."""
    if signal == TRACES:
        traces = ExportTraceServiceResponse()
        if rejected or message:
            traces.partial_success.rejected_spans = rejected
            traces.partial_success.error_message = message
        return traces
    logs = ExportLogsServiceResponse()
    if rejected or message:
        logs.partial_success.rejected_log_records = rejected
        logs.partial_success.error_message = message
    return logs


def summary(errors: list[str], shown: int = 3) -> str:
    more = f" (and {len(errors) - shown} more)" if len(errors) > shown else ""
    return "; ".join(errors[:shown]) + more
