"""Files into the store: what `otel-replay import` runs, and `bench import` times.

Each file is read whole (a file that cannot be read at all stores nothing), then its traces are
ingested, on several cores for large inputs (`ingest_parallel`). OTLP/JSON goes further: the
parent only parses it, and each forked worker decodes the spans of its own traces, so decoding
runs on every core too; log events (few) are decoded in the parent and sent with the span they
name, as `split` sends them. Either way the rows and the summary are those of one process.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from otel_replay.normalize.pipeline import NormalizedSpan
from otel_replay.normalize.privacy import DEFAULT_PRIVACY
from otel_replay.normalize.records import LogEvent, SpanRecord, TracePart, partition_of
from otel_replay.normalize.sources.files import (
    ParsedOtlpJson,
    SourceBatch,
    decode_otlp_json,
    read,
    read_otlp_parsed,
)
from otel_replay.store.ingest import IngestResult
from otel_replay.store.ingest_parallel import can_fork, ingest_decoded, ingest_parallel, jobs_for
from otel_replay.store.location import StoreLike

Privacy = Callable[[NormalizedSpan], NormalizedSpan] | None


def import_files(root: StoreLike, fmt: str, paths: Sequence[Path], *, jobs: int | None = 0,
                 privacy: Privacy = DEFAULT_PRIVACY) -> tuple[list[SourceBatch], IngestResult]:
    """Read and store `paths` in format `fmt`; returns what each file held (spans not kept for
    parsed-only OTLP/JSON) and the ingest result. Raises `UnreadableFile` before storing anything."""
    if fmt == "otlp" and jobs != 1 and can_fork():
        parsed = _parse_otlp(paths)
        if parsed is not None:
            return _import_parsed(root, parsed, jobs, privacy)
    batches = [read(fmt, path) for path in paths]
    spans = [s for b in batches for s in b.spans]
    logs = [g for b in batches for g in b.logs]
    source = "import:" + ",".join(sorted({b.format for b in batches}))
    return batches, ingest_parallel(root, spans, logs, source=source, skip_existing=True, privacy=privacy,
                                    jobs=jobs)


def _parse_otlp(paths: Sequence[Path]) -> list[ParsedOtlpJson] | None:
    """Every file parsed (OTLP/JSON), or None if one is protobuf (then all are read whole, as before)."""
    parsed = []
    for path in paths:
        item = read_otlp_parsed(path)
        if not isinstance(item, ParsedOtlpJson):
            return None
        parsed.append(item)
    return parsed


def _decode_part(traces: list[ParsedOtlpJson], logs: list[list[LogEvent]],
                 part: TracePart | None) -> tuple[list[SpanRecord], list[LogEvent], Any]:
    """One worker's spans (decoded here), its log events (decoded and assigned in the parent), and per
    file the records it skipped. A request-level error raises alike in every part."""
    batches = [decode_otlp_json(p, part) for p in traces]
    return [s for b in batches for s in b.spans], logs[part[0] if part else 0], [b.skipped for b in batches]


def _import_parsed(root: StoreLike, parsed: list[ParsedOtlpJson], jobs: int | None,
                   privacy: Privacy) -> tuple[list[SourceBatch], IngestResult]:
    traces = [p.of_signal(logs=False) for p in parsed]
    spans = sum(p.span_count() for p in traces)
    workers = jobs_for(spans, spans, jobs)
    log_batches = [decode_otlp_json(p.of_signal(logs=True)) for p in parsed]
    owner = {span: part for p in traces for span, part in p.span_owners(workers).items()}
    logs: list[list[LogEvent]] = [[] for _ in range(workers)]
    for log in (g for b in log_batches for g in b.logs):
        part = owner.get(log.span_id or "")
        logs[partition_of(log.trace_id, workers) if part is None else part].append(log)
    extras, result = ingest_decoded(root, functools.partial(_decode_part, traces, logs), spans,
                                    source="import:otlp", skip_existing=True, privacy=privacy, jobs=workers)
    batches = []
    for i, p in enumerate(parsed):  # a record's error came from one part, a request's from each
        found = {entry for extra in extras for entry in extra[i]} | set(log_batches[i].skipped)
        batches.append(SourceBatch(p.path, "otlp", skipped=p.skipped + sorted(found, key=_in_file_order)))
    return batches, result


def _in_file_order(entry: tuple[str, str]) -> tuple[int, ...]:
    """A skipped record's place in its file: its line, then the indices of its path in the request."""
    return tuple(int(n) for n in re.findall(r"(?::|\[)(\d+)", entry[0]))
