"""OTLP requests for the receiver: records out of a body or a parsed request, and the responses.

Shared by OTLP/HTTP and OTLP/gRPC. A malformed record is skipped and
reported (`partial_success`); a body that cannot be read at all is a `RequestError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import orjson
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_replay.normalize.sources.otlp_json import (
    OtlpFormatError,
    logs_from_request,
    spans_from_request,
)
from otel_replay.normalize.sources.otlp_proto import (
    logs_from_proto,
    parse_logs,
    parse_traces,
    spans_from_proto,
)

TRACES, LOGS = "traces", "logs"
NOUNS = {TRACES: "span", LOGS: "log record"}
MAX_RECORDS = 50_000  # per request; more would not fit the writer's queue (and costs memory to decode)
_DECODE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError)
_PROTO_LEVELS = {TRACES: ("resource_spans", "scope_spans", "spans"), LOGS: ("resource_logs", "scope_logs", "log_records")}
_JSON_LEVELS = {TRACES: ("resourceSpans", "scopeSpans", "spans"), LOGS: ("resourceLogs", "scopeLogs", "logRecords")}


class RequestError(Exception):
    """A request the receiver refuses, with its HTTP status and gRPC code."""

    def __init__(self, status: int, code: grpc.StatusCode, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry = status, code, message, retry


def decode_body(signal: str, body: bytes, json: bool) -> tuple[list[Any], list[str]]:
    """Records in an OTLP request body, and one message per malformed record (skipped)."""
    try:
        if not json:
            return records_from_proto(signal, (parse_traces if signal == TRACES else parse_logs)(body))
        doc = orjson.loads(body)
        top, mid, leaf = _JSON_LEVELS[signal]
        if isinstance(doc, dict):
            _check_count(signal, sum(len(_dicts(m.get(leaf))) for o in _dicts(doc.get(top)) for m in _dicts(o.get(mid))))
        if signal == TRACES:
            errors: list[tuple[str, str]] = []
            spans = list(spans_from_request(doc, errors))
            return spans, [f"{path}: {reason}" for path, reason in errors]
        return _one_by_one(signal, doc, logs_from_request, _json_pieces)
    except OtlpFormatError as exc:
        raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"body is not JSON: {exc}") from None
    except _DECODE_ERRORS as exc:  # OtlpDecodeError, or a shape the JSON decoder did not expect
        raise RequestError(400, grpc.StatusCode.INVALID_ARGUMENT, f"not an OTLP {signal} request: {exc}") from None


def records_from_proto(signal: str, request: Message) -> tuple[list[Any], list[str]]:
    top, mid, leaf = _PROTO_LEVELS[signal]
    _check_count(signal, sum(len(getattr(m, leaf)) for o in getattr(request, top) for m in getattr(o, mid)))
    decode = spans_from_proto if signal == TRACES else logs_from_proto
    return _one_by_one(signal, request, decode, _proto_pieces)


def _check_count(signal: str, count: int) -> None:
    if count > MAX_RECORDS:
        raise RequestError(413, grpc.StatusCode.INVALID_ARGUMENT,
                           f"{count} {NOUNS[signal]}s in one request; send at most {MAX_RECORDS} per request")


def _one_by_one(signal: str, request: Any, decode: Callable[[Any], Iterator[Any]],
                pieces: Callable[[str, Any], Iterator[tuple[str, Any]]]) -> tuple[list[Any], list[str]]:
    """Decode the whole request; if a record is malformed, decode record by record to keep the rest."""
    try:
        return list(decode(request)), []
    except OtlpFormatError:
        raise
    except _DECODE_ERRORS:
        pass
    records: list[Any] = []
    errors: list[str] = []
    for path, piece in pieces(signal, request):
        try:
            records.extend(decode(piece))
        except _DECODE_ERRORS as exc:
            errors.append(f"{path}: {exc}")
    return records, errors


def _proto_pieces(signal: str, request: Message) -> Iterator[tuple[str, Message]]:
    """One single-record request per record, keeping its resource and scope."""
    top, mid, leaf = _PROTO_LEVELS[signal]
    for i, outer in enumerate(getattr(request, top)):
        for j, middle in enumerate(getattr(outer, mid)):
            for k, item in enumerate(getattr(middle, leaf)):
                piece = type(request)()
                resource = getattr(piece, top).add()
                resource.resource.CopyFrom(outer.resource)
                scope = getattr(resource, mid).add()
                scope.scope.CopyFrom(middle.scope)
                getattr(scope, leaf).add().CopyFrom(item)
                yield f"{top}[{i}].{mid}[{j}].{leaf}[{k}]", piece


def _json_pieces(signal: str, doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    top, mid, leaf = _JSON_LEVELS[signal]
    for i, outer in enumerate(_dicts(doc.get(top))):
        for j, middle in enumerate(_dicts(outer.get(mid))):
            for k, item in enumerate(_dicts(middle.get(leaf))):
                piece = {top: [{"resource": outer.get("resource") or {},
                                mid: [{"scope": middle.get("scope") or {}, leaf: [item]}]}]}
                yield f"{top}[{i}].{mid}[{j}].{leaf}[{k}]", piece


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
