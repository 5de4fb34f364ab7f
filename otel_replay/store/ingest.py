"""Write already-read records (imports, tests) into a store in one go.

Idempotent when asked: spans already in the store (same trace and span id) are not stored again,
so importing a file twice, or two overlapping exports, stores each span once.

Redaction and the payload switches are passed in as `privacy`, a callable applied to each
normalized span before its rows are built (the store knows no detector or convention); the
default is `normalize.privacy.DEFAULT_PRIVACY`, the built-in detectors. `privacy=None` stores
content as it came.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from otel_replay.normalize.bulk import paused_gc
from otel_replay.normalize.pipeline import NormalizedSpan, join_logs, normalize_span
from otel_replay.normalize.privacy import DEFAULT_PRIVACY
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.store.catalog import Catalog
from otel_replay.store.location import StoreLike, StoreLocation
from otel_replay.store.rows import RowBatch, RowBuilder
from otel_replay.store.writer import ArrowParts

CHUNK_SPANS = 2048  # spans taken to rows and on to Arrow at a time: their dicts and records die young, their pages reused


@dataclass(slots=True)
class IngestResult:
    spans: int = 0
    steps: int = 0
    traces: int = 0
    already_stored: int = 0
    problems: list[str] = field(default_factory=list)
    unmatched_logs: int = 0
    redacted_steps: int = 0  # steps whose content had something redacted before storage
    segments: list[Path | str] = field(default_factory=list)


def existing_span_ids(root: StoreLike, trace_ids: Sequence[str]) -> set[tuple[str, str]]:
    if not trace_ids or not StoreLocation.of(root).exists():
        return set()
    catalog = Catalog(root)
    if not catalog.snapshot().uris("span_rows"):  # no span stored yet: no DuckDB over the store (~45 ms)
        return set()
    return set(catalog.named("existing_span_ids", [list(trace_ids)]))


def ingest(root: StoreLike, spans: Sequence[SpanRecord], logs: Iterable[LogEvent] = (), *, source: str,
           skip_existing: bool = False,
           privacy: Callable[[NormalizedSpan], NormalizedSpan] | None = DEFAULT_PRIVACY) -> IngestResult:
    """Normalize, redact and store spans (with their log events) as one atomic set of segments per table."""
    with paused_gc():
        return _ingest(root, spans, logs, source=source, skip_existing=skip_existing, privacy=privacy)


def _ingest(root: StoreLike, spans: Sequence[SpanRecord], logs: Iterable[LogEvent], *, source: str,
            skip_existing: bool, privacy: Callable[[NormalizedSpan], NormalizedSpan] | None) -> IngestResult:
    spans = list({(s.trace_id, s.span_id): s for s in spans}.values())  # a span twice in the input: the last copy
    result = IngestResult(traces=len({s.trace_id for s in spans}))
    if skip_existing:
        known = existing_span_ids(root, sorted({s.trace_id for s in spans}))
        fresh = [s for s in spans if (s.trace_id, s.span_id) not in known]
        result.already_stored = len(spans) - len(fresh)
        spans = fresh
    grouped, unmatched = join_logs(spans, logs)
    builder, parts, now = RowBuilder(source=source), ArrowParts(), time.time_ns()
    for start in range(0, len(spans), CHUNK_SPANS):
        batch = RowBatch()
        for span in spans[start:start + CHUNK_SPANS]:
            item = normalize_span(span, grouped.get(span.span_id, ()))
            if privacy is not None:
                item = privacy(item)
            builder.add(batch, item, now)
            if item.step is not None:
                result.steps += 1
                result.redacted_steps += bool(item.step.redacted)
            result.problems += [f"span {span.span_id}: {p}" for p in item.problems]
        parts.take(batch)
    result.spans = len(spans)
    result.unmatched_logs = len(unmatched)
    if spans:
        result.segments = parts.write(root)
    return result
