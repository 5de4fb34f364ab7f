"""Langfuse read-API exports: `api.trace.get` (trace with observations), Observations v2 pages
(`{"data": [...], "meta": ...}`, input/output as JSON strings) and bare observation lists.

Each observation becomes a span with the same `langfuse.observation.*` attributes the Langfuse
OTel SDK writes, so one adapter (`conventions/langfuse.py`) reads both. Trace scores become
`langfuse.score.<name>` attributes of the root span.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import xxhash

from otel_replay.normalize.records import SpanRecord
from otel_replay.normalize.sources.ids import HEX
from otel_replay.normalize.sources.times import iso_to_ns


class LangfuseFormatError(ValueError):
    """The document is not one of the Langfuse export shapes."""


def _id(value: Any, width: int) -> str:
    text = str(value).lower()
    if len(text) == width and set(text) <= HEX:
        return text
    if width == 32 and len(text.replace("-", "")) == 32 and set(text.replace("-", "")) <= HEX:
        return text.replace("-", "")
    return xxhash.xxh3_128_hexdigest(text.encode())[:width] if width == 32 else xxhash.xxh3_64_hexdigest(text.encode())


def _as_json_text(value: Any) -> str | None:
    """v2 pages already carry JSON text; read-API objects carry parsed values."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def observations_in(doc: Any) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None]:
    """(observations, the trace object if the document has one)."""
    if isinstance(doc, Mapping) and isinstance(doc.get("observations"), list) and "id" in doc:
        observations = [o for o in doc["observations"] if isinstance(o, Mapping)]
        return observations, doc
    if isinstance(doc, Mapping) and isinstance(doc.get("data"), list):
        return [o for o in doc["data"] if isinstance(o, Mapping) and "traceId" in o], None
    if isinstance(doc, list) and all(isinstance(o, Mapping) and "traceId" in o for o in doc):
        return list(doc), None
    raise LangfuseFormatError("not a Langfuse export: expected a trace with 'observations' or a page with 'data'")


def span_from_observation(obs: Mapping[str, Any], trace: Mapping[str, Any] | None = None,
                          order_ns: int = 0) -> SpanRecord:
    if "id" not in obs or "traceId" not in obs:
        raise LangfuseFormatError("observation without 'id' or 'traceId'")
    attrs: dict[str, Any] = {
        "langfuse.observation.type": str(obs.get("type") or "span").lower(),
        "langfuse.observation.id": str(obs["id"]),
        "langfuse.trace.id": str(obs["traceId"]),
    }
    optional = {
        "langfuse.observation.input": _as_json_text(obs.get("input")),
        "langfuse.observation.output": _as_json_text(obs.get("output")),
        "langfuse.observation.model.name": obs.get("model"),
        "langfuse.observation.model.parameters": _as_json_text(obs.get("modelParameters")),
        "langfuse.observation.usage_details": _as_json_text(obs.get("usageDetails") or None),
        "langfuse.observation.level": obs.get("level"),
        "langfuse.observation.status_message": obs.get("statusMessage"),
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    metadata = obs.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            metadata = {"raw": metadata}
    for key, value in (metadata or {}).items():
        attrs[f"langfuse.observation.metadata.{key}"] = json.dumps(value, ensure_ascii=False)
    parent = obs.get("parentObservationId")
    if trace is not None and parent is None:
        attrs.update(_trace_attributes(trace))
    start = iso_to_ns(obs.get("startTime"), "startTime")
    error = str(obs.get("level") or "").upper() == "ERROR"
    return SpanRecord(
        trace_id=_id(obs["traceId"], 32),
        span_id=_id(obs["id"], 16),
        parent_span_id=_id(parent, 16) if parent else None,
        name=str(obs.get("name") or obs.get("type") or "observation"),
        start_ns=start + order_ns if start is not None else None,
        end_ns=iso_to_ns(obs.get("endTime"), "endTime"),
        status_code="error" if error else "unset",
        status_message=obs.get("statusMessage") if error else None,
        attributes=attrs,
        resource={"service.name": str((trace or {}).get("name") or obs.get("traceName") or "langfuse")},
        scope_name="langfuse-api",
    )


def _trace_attributes(trace: Mapping[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for score in trace.get("scores") or []:
        if isinstance(score, Mapping) and score.get("name") is not None and score.get("observationId") is None:
            attrs[f"langfuse.score.{score['name']}"] = score.get("value")
    if trace.get("tags"):
        attrs["langfuse.trace.tags"] = [str(t) for t in trace["tags"]]
    return attrs


def spans_from_observations(observations: Iterable[Mapping[str, Any]], trace: Mapping[str, Any] | None = None
                            ) -> list[SpanRecord]:
    """Millisecond start times tie between siblings: ties break by end time, then id."""
    ordered = sorted(observations, key=lambda o: (str(o.get("traceId")), str(o.get("startTime") or ""),
                                                  str(o.get("endTime") or ""), str(o.get("id"))))
    spans, last_start, rank = [], None, 0
    for obs in ordered:
        key = (obs.get("traceId"), obs.get("startTime"))
        rank = rank + 1 if key == last_start else 0
        last_start = key
        spans.append(span_from_observation(obs, trace, order_ns=min(rank, 999)))
    return spans
