"""OTLP requests for the receiver: records out of a body or a parsed request, and the responses.

Shared by OTLP/HTTP and OTLP/gRPC. A malformed record (a `SourceError` from the decoders) is
skipped and reported (`partial_success`); a body that cannot be read at all is a `RequestError`.
Decoding is linear in the body: each resource is decoded once, whatever the number of bad records.
"""

from __future__ import annotations

from typing import Any

import grpc
import orjson
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_replay.normalize.records import TracePart
from otel_replay.normalize.sources.errors import SourceError
from otel_replay.normalize.sources.otlp_json import logs_from_request, spans_from_request
from otel_replay.normalize.sources.otlp_proto import (
    logs_from_proto,
    parse_logs,
    parse_traces,
    spans_from_proto,
)

TRACES, LOGS = "traces", "logs"
NOUNS = {TRACES: "span", LOGS: "log record"}
MAX_RECORDS = 50_000  # per request; more would not fit the writer's queue (and costs memory to decode)
_PROTO_LEVELS = {TRACES: ("resource_spans", "scope_spans", "spans"), LOGS: ("resource_logs", "scope_logs", "log_records")}
_JSON_LEVELS = {TRACES: ("resourceSpans", "scopeSpans", "spans"), LOGS: ("resourceLogs", "scopeLogs", "logRecords")}


class RequestError(Exception):
    """A request the receiver refuses, with its HTTP status and gRPC code."""

    def __init__(self, status: int, code: grpc.StatusCode, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry = status, code, message, retry


def decode_body(signal: str, body: bytes, json: bool, part: TracePart | None = None) -> tuple[list[Any], list[str]]:
    """Records in an OTLP request body (those of `part`'s traces only, when given: a receiver
    worker's share), and one message per malformed record (skipped).

    Raises only `RequestError`: 400 for a body that is not an OTLP request at all (not JSON,
    not protobuf, the wrong shape), 413 for too many records. Every record returned passed
    `checks.check_span` / `check_log`, so the writer can store it.
    """
    try:
        if not json:
            return records_from_proto(signal, (parse_traces if signal == TRACES else parse_logs)(body), part)
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


def records_from_proto(signal: str, request: Message, part: TracePart | None = None) -> tuple[list[Any], list[str]]:
    """Records of a parsed request (HTTP or gRPC); a malformed record is skipped and described."""
    top, mid, leaf = _PROTO_LEVELS[signal]
    _check_count(signal, sum(len(getattr(m, leaf)) for o in getattr(request, top) for m in getattr(o, mid)))
    errors: list[tuple[str, str]] = []
    decode = spans_from_proto if signal == TRACES else logs_from_proto
    records = list(decode(request, errors, part))
    return records, [f"{path}: {reason}" for path, reason in errors]


def _check_count(signal: str, count: int) -> None:
    if count > MAX_RECORDS:
        raise RequestError(413, grpc.StatusCode.INVALID_ARGUMENT,
                           f"{count} {NOUNS[signal]}s in one request; send at most {MAX_RECORDS} per request")


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def export_response(signal: str, rejected: int, message: str) -> Message:
    """`Export*ServiceResponse`, with `partial_success` set when something was not kept."""
    response = ExportTraceServiceResponse() if signal == TRACES else ExportLogsServiceResponse()
    if rejected or message:
        partial = response.partial_success
        if signal == TRACES:
            partial.rejected_spans = rejected
        else:
            partial.rejected_log_records = rejected
        partial.error_message = message
    return response


def summary(errors: list[str], shown: int = 3) -> str:
    more = f" (and {len(errors) - shown} more)" if len(errors) > shown else ""
    return "; ".join(errors[:shown]) + more
