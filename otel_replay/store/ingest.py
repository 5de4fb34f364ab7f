"""Write already-read records (imports, the OTLP receiver, tests) into a store in one go."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from otel_replay.normalize.pipeline import normalize_spans
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.store.rows import RowBatch, RowBuilder
from otel_replay.store.writer import write_batch


@dataclass(slots=True)
class IngestResult:
    spans: int = 0
    steps: int = 0
    traces: int = 0
    problems: list[str] = field(default_factory=list)
    unmatched_logs: int = 0
    segments: list[Path] = field(default_factory=list)


def ingest(root: Path, spans: Sequence[SpanRecord], logs: Iterable[LogEvent] = (), *, source: str) -> IngestResult:
    """Normalize and store spans (with their log events) as one atomic set of segments per table."""
    normalized, unmatched = normalize_spans(spans, logs)
    batch = RowBatch()
    RowBuilder(source=source).add_all(batch, normalized)
    result = IngestResult(
        spans=len(normalized),
        steps=sum(1 for n in normalized if n.step is not None),
        traces=len({s.trace_id for s in spans}),
        problems=[f"span {n.span.span_id}: {p}" for n in normalized for p in n.problems],
        unmatched_logs=len(unmatched),
    )
    if normalized:
        result.segments = write_batch(root, batch)
    return result
