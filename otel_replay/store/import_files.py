"""Files into the store: what `otel-replay import` runs and `bench import` times.

A file that cannot be read at all stores nothing. Large imports run on several cores, each worker
taking whole traces (`partition_of`). OTLP/JSON files go further: each forked worker reads the
files itself, parses only the lines that can hold its traces (`trace_parts_named`; lines of log
records, every worker) and decodes only its spans. Which lines those are, the workers find out
between them: each screens every n-th line (`screen_otlp_lines`) and gets every share through the
parent (screening every line was ~7 % of a worker's time with one trace per line). Then the
parent, seeing every part, tells each worker which log events are its own (those naming one of
its spans, else those of its traces, as `split` assigns them) and merges the records skipped, in
file order. Other inputs are read here, then split (`ingest_parallel`). Either way the rows and
the summary are those of one process.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_replay.normalize.pipeline import NormalizedSpan
from otel_replay.normalize.privacy import DEFAULT_PRIVACY
from otel_replay.normalize.records import LogEvent, SpanRecord, TracePart, partition_of
from otel_replay.normalize.sources.files import (
    ScreenedLines,
    SourceBatch,
    in_file_order,
    no_valid_line,
    otlp_json_bytes,
    read,
    read_otlp_part,
    screen_otlp_lines,
)
from otel_replay.store.ingest import IngestResult
from otel_replay.store.ingest_parallel import (
    MAX_AUTO_JOBS,
    can_fork,
    ingest_decoded,
    ingest_parallel,
)
from otel_replay.store.location import StoreLike

Privacy = Callable[[NormalizedSpan], NormalizedSpan] | None
MIN_BYTES_PER_JOB = 4 << 20  # about 4,000 GenAI spans of OTLP/JSON: less, and a worker costs more than it saves


def import_files(root: StoreLike, fmt: str, paths: Sequence[Path], *, jobs: int | None = 0,
                 privacy: Privacy = DEFAULT_PRIVACY) -> tuple[list[SourceBatch], IngestResult]:
    """Read and store `paths` in format `fmt` (`jobs`: worker processes, 0 or None for one per core);
    returns what each file held (its skipped records; spans only when read here) and the result.
    Raises `UnreadableFile` before anything is stored."""
    if fmt == "otlp" and jobs != 1 and can_fork():
        files = [(path, otlp_json_bytes(path)) for path in paths]
        workers = jobs_for_bytes(sum(len(data or b"") for _, data in files), jobs)
        if workers > 1 and all(data is not None for _, data in files):
            return _import_split_otlp_json(root, [(p, d) for p, d in files if d is not None], workers, privacy)
        del files
    batches = [read(fmt, path) for path in paths]
    spans = [s for b in batches for s in b.spans]
    logs = [g for b in batches for g in b.logs]
    source = "import:" + ",".join(sorted({b.format for b in batches}))
    return batches, ingest_parallel(root, spans, logs, source=source, skip_existing=True, privacy=privacy,
                                    jobs=jobs)


def jobs_for_bytes(size: int, requested: int | None = None) -> int:
    """Workers for `size` bytes of OTLP/JSON: `requested`, else one per core (at most `MAX_AUTO_JOBS`)
    and one per `MIN_BYTES_PER_JOB`."""
    if not can_fork():
        return 1
    if requested:
        return requested
    return max(1, min(os.cpu_count() or 1, MAX_AUTO_JOBS, size // MIN_BYTES_PER_JOB))


@dataclass(slots=True)
class _PartRead:
    files: list[tuple[list[tuple[str, str]], int]]  # per file: records skipped, documents parsed
    claimed: set[str]  # span ids of this part's spans that some log event names


def _screen_part(files: list[tuple[Path, bytes]], part: TracePart) -> list[ScreenedLines | None]:
    """This worker's share of screening each file's lines (`screen_otlp_lines`)."""
    return [screen_otlp_lines(data, part) for _, data in files]


def _read_part(files: list[tuple[Path, bytes]], part: TracePart,
               shares: list[list[ScreenedLines | None]]) -> tuple[list[SpanRecord], list[LogEvent], Any]:
    """One worker's spans and every log event of every file, and what the parent needs to see;
    or the error of the first file that cannot be read (every part finds it alike). `shares`:
    every part's `_screen_part`, in part order."""
    spans: list[SpanRecord] = []
    logs: list[LogEvent] = []
    seen = []
    for i, (path, data) in enumerate(files):
        try:
            batch, parsed = read_otlp_part(path, data, part, [share[i] for share in shares])
        except Exception as exc:  # an UnreadableFile, re-raised by the parent as it came  # noqa: BLE001
            return [], [], exc
        spans += batch.spans
        logs += batch.logs
        seen.append((batch.skipped, parsed))
    named = {log.span_id for log in logs if log.span_id}
    return spans, logs, _PartRead(seen, {s.span_id for s in spans if s.span_id in named})


def _own_logs(spans: list[SpanRecord], logs: list[LogEvent], owner: dict[str, int],
              part: TracePart) -> tuple[list[SpanRecord], list[LogEvent]]:
    """The log events of this part: those naming one of its spans, else those of its traces (`split`)."""
    index, parts = part
    return spans, [log for log in logs if owner.get(log.span_id or "", -1) == index
                   or (log.span_id or "") not in owner and partition_of(log.trace_id, parts) == index]


def _import_split_otlp_json(root: StoreLike, files: list[tuple[Path, bytes]], workers: int,
                            privacy: Privacy) -> tuple[list[SourceBatch], IngestResult]:
    batches: list[SourceBatch] = []

    def check(extras: list[Any]) -> dict[str, int]:
        failed = next((extra for extra in extras if isinstance(extra, Exception)), None)
        if failed is not None:
            raise failed
        for i, (path, _) in enumerate(files):  # a request's error came from each part that parsed it
            skipped = sorted({entry for extra in extras for entry in extra.files[i][0]}, key=in_file_order)
            if not any(extra.files[i][1] for extra in extras):
                raise no_valid_line(path, skipped)
            batches.append(SourceBatch(path, "otlp", skipped=skipped))
        return {span_id: part for part, extra in enumerate(extras) for span_id in extra.claimed}

    _, result = ingest_decoded(root, functools.partial(_read_part, files), workers, check, finish=_own_logs,
                               screen=functools.partial(_screen_part, files),
                               source="import:otlp", skip_existing=True, privacy=privacy)
    return batches, result
