"""Exporting a job's stored attribution results: nothing is recomputed, only read and sent."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from otel_replay.attribution.result import Report, as_result
from otel_replay.export import files
from otel_replay.export.blame import DEFAULT_SERVICE, blame_spans
from otel_replay.export.otlp import ExportError, send
from otel_replay.export.private import write_private
from otel_replay.trajectory import Store

TARGETS = ("otlp", "jaeger-json", "otlp-json")


def stored_reports(store: Store, job_id: str, trace_id: str | None = None) -> list[dict[str, Any]]:
    """The job's report documents as stored (`AttributionResult.from_report` reads one as a result)."""
    if trace_id:
        rows = [(trace_id, r[0]) for r in store.named("job_report", [job_id, trace_id])]
    else:
        rows = store.named("job_reports", [job_id])
    if not rows:
        what = f"trace {trace_id}" if trace_id else "any trace"
        raise ExportError(f"job {job_id!r} has no attribution results for {what} (see `otel-replay jobs`)")
    return [json.loads(report) for _, report in rows]


def _root_and_rows(store: Store, trace_id: str) -> tuple[str, list[dict[str, Any]]]:
    with store.session() as s:
        root = s.named("trace_root_span", [trace_id])
        rows = s.named_arrow("trace_span_rows", [trace_id]).to_pylist()
    if not root:
        raise ExportError(f"trace {trace_id} is not in the store at {store.root}")
    return root[0][0], rows


def export_reports(store: Store, reports: Sequence[Report], to: str, *, out: Path | None = None,
                   protocol: str | None = None, endpoint: str | None = None, headers: dict[str, str] | None = None,
                   service_name: str = DEFAULT_SERVICE, payloads: bool = False) -> int:
    """Send (otlp) or write (jaeger-json, otlp-json) the blame of each report; returns spans exported."""
    if to not in TARGETS:
        raise ExportError(f"unknown export target {to!r}; use one of {', '.join(TARGETS)}")
    everything, blame_total = [], 0
    for result in map(as_result, reports):
        root, rows = _root_and_rows(store, result.trace_id)
        spans = blame_spans(result, root, service_name, payloads)
        blame_total += len(spans)
        if to == "otlp":
            send(spans, protocol, endpoint, headers, job_id=result.job_id)
        else:
            everything += files.records(rows, spans)
    if to != "otlp":
        document = files.to_jaeger(everything) if to == "jaeger-json" else files.to_otlp_json(everything)
        text = json.dumps(document, indent=1, ensure_ascii=False)
        if out is None:
            raise ExportError(f"--to {to} writes a file: give --out FILE")
        try:
            write_private(out, text)  # 0600: the original trace's spans, as private as the store
        except OSError as exc:
            raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from exc
    return blame_total
