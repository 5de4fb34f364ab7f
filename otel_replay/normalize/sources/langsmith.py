"""LangSmith exports: `client.list_runs` dumps (JSON array or JSON lines), v1 `/runs/query` and
v2 `runs.query` pages, and raw ingest ops (`{"op": "post"|"patch", "payload": ...}`).

Each run becomes a `SpanRecord` carrying the run as `langsmith.*` attributes; the `langsmith`
convention adapter turns those into steps. Run UUIDs map deterministically to OTel ids (the
trace UUID's 32 hex digits; a 64-bit hash of the run UUID for the span id), and the original
ids are kept as attributes. Sibling order comes from `dotted_order`, not from the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import xxhash

from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.normalize.sources.checks import INT64, check_span
from otel_replay.normalize.sources.errors import SourceError, guarded
from otel_replay.normalize.sources.shapes import mapping, sequence, text
from otel_replay.normalize.sources.times import iso_to_ns

STATUS = {"success": "ok", "error": "error", "pending": "unset"}


class LangSmithFormatError(SourceError):
    """The document is not one of the LangSmith export shapes."""


def span_id_of(run_id: str) -> str:
    return xxhash.xxh3_64_hexdigest(str(run_id).lower().encode("utf-8", "surrogatepass"))


def trace_id_of(trace_uuid: str) -> str:
    text = str(trace_uuid).replace("-", "").lower()
    if len(text) == 32 and all(c in "0123456789abcdef" for c in text):
        return text
    return xxhash.xxh3_128_hexdigest(str(trace_uuid).encode("utf-8", "surrogatepass"))


def runs_in(doc: Any) -> list[Mapping[str, Any]]:
    """The runs of any one document shape (array, v1 or v2 page, single run)."""
    if isinstance(doc, list):
        return [r for r in doc if isinstance(r, Mapping)]
    if isinstance(doc, Mapping):
        for key in ("runs", "items"):
            if isinstance(doc.get(key), list):
                return [r for r in doc[key] if isinstance(r, Mapping)]
        if "run_type" in doc and "id" in doc:
            return [doc]
    raise LangSmithFormatError("not a LangSmith export: expected runs (a list, or a page with 'runs'/'items')")


def merge_ingest_ops(ops: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Fold post/patch operations into whole runs, by run id, in emission order."""
    runs: dict[str, dict[str, Any]] = {}
    for op in ops:
        payload = op.get("payload")
        if not isinstance(payload, Mapping) or "id" not in payload:
            raise LangSmithFormatError("ingest op without a payload id", field="payload.id")
        runs.setdefault(text(payload["id"], "payload.id"), {}).update({k: v for k, v in payload.items() if v is not None})
    return list(runs.values())


def _parent_id(run: Mapping[str, Any]) -> str | None:
    parent = text(run.get("parent_run_id"), "parent_run_id")
    if parent:
        return parent
    ancestors = sequence(run.get("parent_run_ids"), "parent_run_ids")
    return text(ancestors[-1], "parent_run_ids") or None if ancestors else None


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


@guarded
def span_from_run(run: Mapping[str, Any]) -> SpanRecord:
    """One run as a span."""
    run = mapping(run, "run")
    run_id = text(run.get("id"), "id")
    if not run_id:
        raise LangSmithFormatError("a run needs an id", field="id")
    trace_uuid = text(run.get("trace_id"), "trace_id") or run_id
    parent = _parent_id(run)
    start = iso_to_ns(run.get("start_time"), "start_time")
    status = str(run.get("status") or "").lower()
    error = run.get("error") or run.get("error_preview")
    metadata = mapping(run.get("metadata") or mapping(run.get("extra"), "extra").get("metadata"), "metadata")
    attributes: dict[str, Any] = {
        "langsmith.run_id": run_id,
        "langsmith.trace_id": trace_uuid,
        "langsmith.run_type": str(run.get("run_type") or "chain").lower(),
        "langsmith.inputs": _json(run.get("inputs")),
        "langsmith.outputs": _json(run.get("outputs")),
        "langsmith.extra": _json(run.get("extra") or {}),
        "langsmith.metadata": _json(metadata),
    }
    for key in ("dotted_order", "session_id", "project_id", "parent_run_id"):
        if run.get(key):
            attributes[f"langsmith.{key}"] = str(run[key])
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if isinstance(run.get(key), int) and INT64[0] <= run[key] <= INT64[1]:
            attributes[f"langsmith.{key}"] = run[key]
    if run.get("tags"):
        attributes["langsmith.tags"] = [text(t, "tags") for t in sequence(run["tags"], "tags")]
    if run.get("feedback_stats"):
        attributes["langsmith.feedback_stats"] = _json(run["feedback_stats"])
    if error:
        attributes["langsmith.error"] = str(error)
    events = [SpanEvent(text(e.get("name"), "events.name"), iso_to_ns(e.get("time"), "events.time"), {})
              for e in sequence(run.get("events"), "events") if isinstance(e, Mapping)]
    return check_span(SpanRecord(
        trace_id=trace_id_of(trace_uuid),
        span_id=span_id_of(run_id),
        parent_span_id=span_id_of(parent) if parent else None,
        name=str(run.get("name") or run.get("run_type") or "run"),
        start_ns=start,
        end_ns=iso_to_ns(run.get("end_time"), "end_time"),
        status_code="error" if error else STATUS.get(status, "ok" if run.get("end_time") else "unset"),
        status_message=str(error).split("\n", 1)[0][:1000] if error else None,
        attributes=attributes,
        events=events,
        resource={"service.name": text(metadata.get("ls_project") or run.get("session_name"), "session_name", "langsmith")},
        scope_name="langsmith",
    ))


def span_from_run_checked(run: Mapping[str, Any]) -> SpanRecord:
    if not isinstance(run, Mapping):
        raise LangSmithFormatError(f"a run must be an object, got {type(run).__name__}")
    return span_from_run(run)


def order_by_dotted(spans: list[SpanRecord]) -> list[SpanRecord]:
    """Break start-time ties (same microsecond) in `dotted_order`, which is depth-first execution order.

    Adds the rank (< 1000 ns) inside the trace to the start time: never reorders distinct
    microsecond starts, always orders ties.
    """
    ordered = sorted(spans, key=lambda s: (s.trace_id, str(s.attributes.get("langsmith.dotted_order") or "")))
    rank: dict[str, int] = {}
    for span in ordered:
        rank[span.trace_id] = rank.get(span.trace_id, -1) + 1
        if span.start_ns is not None and span.attributes.get("langsmith.dotted_order"):
            span.start_ns += min(rank[span.trace_id], 999)
    return ordered


def spans_from_runs(runs: Iterable[Mapping[str, Any]]) -> list[SpanRecord]:
    return order_by_dotted([span_from_run(r) for r in runs])
