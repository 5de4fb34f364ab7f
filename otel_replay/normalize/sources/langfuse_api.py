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
from otel_replay.normalize.sources.checks import check_span
from otel_replay.normalize.sources.errors import SourceError, guarded, shown
from otel_replay.normalize.sources.ids import HEX
from otel_replay.normalize.sources.shapes import mapping, optional_text, sequence, text
from otel_replay.normalize.sources.times import iso_to_ns


class LangfuseFormatError(SourceError):
    """The document is not one of the Langfuse export shapes."""


def _id(value: Any, width: int, field: str) -> str:
    """A hex id as it is; any other id (a UUID, a name) hashed to `width` hex digits."""
    raw = text(value, field).lower()
    if len(raw) == width and set(raw) <= HEX and set(raw) != {"0"}:
        return raw
    uuid = raw.replace("-", "")
    if width == 32 and len(uuid) == 32 and set(uuid) <= HEX and set(uuid) != {"0"}:
        return uuid
    data = raw.encode("utf-8", "surrogatepass")
    return xxhash.xxh3_128_hexdigest(data) if width == 32 else xxhash.xxh3_64_hexdigest(data)


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


@guarded
def span_from_observation(obs: Mapping[str, Any], trace: Mapping[str, Any] | None = None,
                          order_ns: int = 0) -> SpanRecord:
    obs = mapping(obs, "observation")
    if "id" not in obs or "traceId" not in obs:
        raise LangfuseFormatError("observation without 'id' or 'traceId'", field="id" if "id" not in obs else "traceId")
    attrs: dict[str, Any] = {
        "langfuse.observation.type": str(obs.get("type") or "span").lower(),
        "langfuse.observation.id": text(obs["id"], "id"),
        "langfuse.trace.id": text(obs["traceId"], "traceId"),
    }
    optional = {
        "langfuse.observation.input": _as_json_text(obs.get("input")),
        "langfuse.observation.output": _as_json_text(obs.get("output")),
        "langfuse.observation.model.name": optional_text(obs.get("model"), "model"),
        "langfuse.observation.model.parameters": _as_json_text(obs.get("modelParameters")),
        "langfuse.observation.usage_details": _as_json_text(obs.get("usageDetails") or None),
        "langfuse.observation.level": optional_text(obs.get("level"), "level"),
        "langfuse.observation.status_message": optional_text(obs.get("statusMessage"), "statusMessage"),
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    metadata = obs.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            metadata = None
        metadata = metadata if isinstance(metadata, dict) else {"raw": obs["metadata"]}
    for key, value in mapping(metadata, "metadata").items():
        attrs[f"langfuse.observation.metadata.{key}"] = json.dumps(value, ensure_ascii=False)
    parent = optional_text(obs.get("parentObservationId"), "parentObservationId")
    if trace is not None and parent is None:
        attrs.update(_trace_attributes(trace))
    start = iso_to_ns(obs.get("startTime"), "startTime")
    error = str(obs.get("level") or "").upper() == "ERROR"
    return check_span(SpanRecord(
        trace_id=_id(obs["traceId"], 32, "traceId"),
        span_id=_id(obs["id"], 16, "id"),
        parent_span_id=_id(parent, 16, "parentObservationId") if parent else None,
        name=text(obs.get("name") or obs.get("type"), "name", "observation"),
        start_ns=start + order_ns if start is not None else None,
        end_ns=iso_to_ns(obs.get("endTime"), "endTime"),
        status_code="error" if error else "unset",
        status_message=optional_text(obs.get("statusMessage"), "statusMessage") if error else None,
        attributes=attrs,
        resource={"service.name": text((trace or {}).get("name") or obs.get("traceName"), "traceName", "langfuse")},
        scope_name="langfuse-api",
    ))


def _trace_attributes(trace: Mapping[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for score in sequence(trace.get("scores"), "scores"):
        if isinstance(score, Mapping) and score.get("name") is not None and score.get("observationId") is None:
            attrs[f"langfuse.score.{score['name']}"] = score.get("value")
    if trace.get("tags"):
        attrs["langfuse.trace.tags"] = [text(t, "tags") for t in sequence(trace["tags"], "tags")]
    return attrs


def _sort_text(value: Any) -> str:
    return str(value) if isinstance(value, (str, int, float)) else ""


def spans_from_observations(observations: Iterable[Mapping[str, Any]], trace: Mapping[str, Any] | None = None,
                            errors: list[SourceError] | None = None) -> list[SpanRecord]:
    """Millisecond start times tie between siblings: ties break by end time, then id.

    With `errors`, a bad observation is skipped and recorded there; without, it raises.
    """
    ordered = sorted(observations, key=lambda o: tuple(_sort_text(o.get(k)) for k in ("traceId", "startTime", "endTime", "id")))
    spans, last_start, rank = [], None, 0
    for obs in ordered:
        key = (obs.get("traceId"), obs.get("startTime"))
        rank = rank + 1 if key == last_start else 0
        last_start = key
        try:
            spans.append(span_from_observation(obs, trace, order_ns=min(rank, 999)))
        except SourceError as exc:
            if errors is None:
                raise
            errors.append(exc.located(record=f"observation {shown(obs.get('id'))}"))
    return spans
