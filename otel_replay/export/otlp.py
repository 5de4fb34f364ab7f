"""Sending blame spans with the standard OTLP exporters (gRPC or HTTP/protobuf).

With no endpoint given, the exporters read the standard `OTEL_EXPORTER_OTLP_*` environment
variables as they do for any OpenTelemetry service.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from urllib.parse import urlparse

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_replay.errors import OtelReplayError

PROTOCOLS = ("grpc", "http/protobuf")


class ExportError(OtelReplayError):
    """The spans could not be delivered; the results stay in the store for a later export."""


def exporter_for(protocol: str | None, endpoint: str | None, headers: dict[str, str] | None,
                 timeout_s: float = 5.0) -> SpanExporter:
    protocol = _protocol(protocol)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        insecure = None if endpoint is None else urlparse(endpoint).scheme != "https"
        return GrpcExporter(endpoint=endpoint, headers=headers or None, insecure=insecure, timeout=timeout_s)
    if protocol != "http/protobuf":
        raise ExportError(f"unknown OTLP protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    if endpoint is not None and urlparse(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return HttpExporter(endpoint=endpoint, headers=headers or None, timeout=timeout_s)


def _protocol(protocol: str | None) -> str:
    return protocol or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or \
        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"


def endpoint_url(protocol: str | None, endpoint: str | None) -> str:
    """The URL the exporter sends to, resolved as the OTLP exporters resolve it: the endpoint given,
    else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/traces over
    HTTP), else the default (http://localhost:4318/v1/traces, or localhost:4317 for gRPC)."""
    grpc = _protocol(protocol) == "grpc"
    if endpoint is not None:
        if not grpc and urlparse(endpoint).path in ("", "/"):
            return endpoint.rstrip("/") + "/v1/traces"
        return endpoint
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if base:
        return base if grpc else base.rstrip("/") + "/v1/traces"
    return "http://localhost:4317" if grpc else "http://localhost:4318/v1/traces"


def send(spans: Sequence[ReadableSpan], protocol: str | None = None, endpoint: str | None = None,
         headers: dict[str, str] | None = None, job_id: str | None = None) -> None:
    """Deliver the spans; ExportError names the URL and how to send the job's blame again."""
    exporter = exporter_for(protocol, endpoint, headers)
    quiet = logging.getLogger("opentelemetry.exporter")
    level, quiet.level = quiet.level, logging.CRITICAL  # retries are the exporter's business; the outcome is ours
    try:
        result = exporter.export(list(spans))
    finally:
        quiet.setLevel(level)
        exporter.shutdown()
    if result is not SpanExportResult.SUCCESS:
        where = f"{endpoint_url(protocol, endpoint)} (OTLP {_protocol(protocol)})"
        again = f"otel-replay export --job {job_id} --to otlp" if job_id else "otel-replay export --job JOB_ID --to otlp"
        raise ExportError(f"could not deliver {len(spans)} blame spans to {where}; the results stay in the store "
                          f"(send them later with `{again}`)")
