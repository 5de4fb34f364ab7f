"""Large imports on several cores: the traces split between forked worker processes.

Every trace goes whole to one worker (chosen by a hash of its id), with the log events of its
spans, so each worker normalizes, deduplicates and joins exactly as a single `ingest` would and
writes its own segments (segment names are unique per process). The records were read before the
fork and are shared copy-on-write, so nothing is serialized on the way in; each worker sends back
only its `IngestResult`. A worker's failure fails the import, as it would alone: the workers that
finished keep their traces, and a rerun (idempotent) stores the rest.

Needs the `fork` start method (Linux); elsewhere, and for small inputs, `ingest` runs in-process.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from otel_replay.normalize.pipeline import NormalizedSpan
from otel_replay.normalize.privacy import DEFAULT_PRIVACY
from otel_replay.normalize.records import LogEvent, SpanRecord, TracePart, partition_of
from otel_replay.store.ingest import IngestResult, ingest
from otel_replay.store.location import StoreLike
from otel_replay.store.writer import warm_up

MIN_SPANS_PER_JOB = 5_000  # below this a worker costs more (fork, its own DuckDB) than it saves
MAX_AUTO_JOBS = 8


def can_fork() -> bool:
    """Whether worker processes can share the parent's records (fork start method, not macOS)."""
    return sys.platform != "darwin" and "fork" in multiprocessing.get_all_start_methods()


def jobs_for(spans: int, traces: int, requested: int | None = None) -> int:
    """Worker processes for an import: `requested`, at most one per trace; 0 or None: one per
    core (at most `MAX_AUTO_JOBS`) and one per `MIN_SPANS_PER_JOB` spans. 1 where fork is missing."""
    if not can_fork():
        return 1
    if requested:
        return max(1, min(requested, traces))
    return max(1, min(os.cpu_count() or 1, MAX_AUTO_JOBS, spans // MIN_SPANS_PER_JOB))


@dataclass(slots=True)
class _Work:
    root: StoreLike
    spans: list[list[SpanRecord]]
    logs: list[list[LogEvent]]
    source: str
    skip_existing: bool
    privacy: Callable[[NormalizedSpan], NormalizedSpan] | None


_WORK: _Work | None = None  # set in the parent just before the fork; the workers inherit it


def _run_part(index: int) -> IngestResult:
    work = _WORK
    assert work is not None  # noqa: S101 - set before the pool forked this process
    return ingest(work.root, work.spans[index], work.logs[index], source=work.source,
                  skip_existing=work.skip_existing, privacy=work.privacy)


def split(spans: Sequence[SpanRecord], logs: Iterable[LogEvent], jobs: int) -> tuple[list[list[SpanRecord]],
                                                                                     list[list[LogEvent]]]:
    """Spans by trace; each log event with the span it names (as `join_logs` matches), else by its trace."""
    span_parts: list[list[SpanRecord]] = [[] for _ in range(jobs)]
    owner: dict[str, int] = {}
    for span in spans:
        part = partition_of(span.trace_id, jobs)
        span_parts[part].append(span)
        owner[span.span_id] = part
    log_parts: list[list[LogEvent]] = [[] for _ in range(jobs)]
    for log in logs:
        known = owner.get(log.span_id or "")
        log_parts[partition_of(log.trace_id, jobs) if known is None else known].append(log)
    return span_parts, log_parts


Decode = Callable[[TracePart], tuple[list[SpanRecord], list[LogEvent], Any]]
"""One part's records of the input, read by the worker itself, and what the caller wants to see of
it (e.g. the records it skipped) before anything is stored."""


Finish = Callable[[list[SpanRecord], list[LogEvent], Any, TracePart], tuple[list[SpanRecord], list[LogEvent]]]
"""A worker's records as it stores them, given what `check` answered (e.g. which log events are its own)."""


def _as_decoded(spans: list[SpanRecord], logs: list[LogEvent], answer: Any,
                part: TracePart) -> tuple[list[SpanRecord], list[LogEvent]]:
    return spans, logs


Screen = Callable[[TracePart], Any]
"""A part's share of some work on the input that every part needs the whole of (e.g. which lines hold
whose traces); each worker gets every part's share, in part order, as `decode`'s second argument."""


def ingest_decoded(root: StoreLike, decode: Decode, jobs: int, check: Callable[[list[Any]], Any], *, source: str,
                   finish: Finish = _as_decoded, screen: Screen | None = None, skip_existing: bool = False,
                   privacy: Callable[[NormalizedSpan], NormalizedSpan] | None = DEFAULT_PRIVACY,
                   ) -> tuple[list[Any], IngestResult]:
    """`ingest` on `jobs` forked workers, each of which also reads its own part of the input
    (`decode((index, jobs))`, or with `screen`, `decode((index, jobs), shares)`), so reading runs on
    every core and each worker's records are its own (no copy-on-write faults on the parent's). Two
    phases: when every part is decoded, `check` sees their extras and may raise, and then nothing is
    stored; else its answer goes to every worker, which stores `finish(spans, logs, answer, part)`.
    Returns the extras, in part order, and the merged result."""
    warm_up()  # once here rather than in every worker
    ctx = multiprocessing.get_context("fork")
    links = [ctx.Pipe() for _ in range(jobs)]
    ends = [end for link in links for end in link]
    workers = [ctx.Process(target=_decode_then_ingest, daemon=True,
                           args=(child, [end for end in ends if end is not child], (i, jobs), screen, decode, finish,
                                 root, source, skip_existing, privacy))
               for i, (_, child) in enumerate(links)]
    for worker in workers:
        worker.start()
    for _, child in links:
        child.close()
    try:
        if screen is not None:
            shares = [_answer(conn, i, "screened") for i, (conn, _) in enumerate(links)]
            for conn, _ in links:
                conn.send(("shares", shares))
        extras = [_answer(conn, i, "decoded") for i, (conn, _) in enumerate(links)]
        answer = check(extras)
        for conn, _ in links:
            conn.send(("store", answer))
        results = [_answer(conn, i, "stored") for i, (conn, _) in enumerate(links)]
    finally:
        for conn, _ in links:
            with contextlib.suppress(OSError):
                conn.close()  # a worker still waiting for its go-ahead ends without storing
        for worker in workers:
            worker.join()
    return extras, merge(results)


def _answer(conn: Connection, index: int, expected: str) -> Any:
    try:
        kind, value = conn.recv()
    except EOFError:
        raise RuntimeError(f"import worker {index} ended without an answer (killed, or out of memory?)") from None
    if kind != expected:
        raise RuntimeError(f"import worker {index} failed:\n{value}")
    return value


def _decode_then_ingest(conn: Connection, inherited: list[Connection], part: TracePart, screen: Screen | None,
                        decode: Decode, finish: Finish, root: StoreLike, source: str, skip_existing: bool,
                        privacy: Callable[[NormalizedSpan], NormalizedSpan] | None) -> None:
    for end in inherited:  # other workers' pipe ends, forked with this one: holding them would keep a dead
        end.close()  # worker's pipe open (the parent would wait for ever) and hide the parent's close from others
    gc.disable()  # for good: the worker ends after its store, and a collection would only walk every record it read
    try:
        if screen is None:
            spans, logs, extra = decode(part)
        else:
            conn.send(("screened", screen(part)))
            _, shares = conn.recv()
            spans, logs, extra = decode(part, shares)  # type: ignore[call-arg]
        conn.send(("decoded", extra))
        go, answer = conn.recv()
        if go != "store":
            return
        spans, logs = finish(spans, logs, answer, part)
        conn.send(("stored", ingest(root, spans, logs, source=source, skip_existing=skip_existing, privacy=privacy)))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # rather than return, which frees every record read, one by one, while the parent waits to join
    except EOFError:
        return  # the parent stopped the import (a check failed, or another part did)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        with contextlib.suppress(OSError):
            conn.send(("failed", traceback.format_exc()))


def merge(results: Sequence[IngestResult]) -> IngestResult:
    merged = IngestResult()
    for result in results:
        merged.spans += result.spans
        merged.steps += result.steps
        merged.traces += result.traces
        merged.already_stored += result.already_stored
        merged.problems.extend(result.problems)
        merged.unmatched_logs += result.unmatched_logs
        merged.redacted_steps += result.redacted_steps
        merged.segments.extend(result.segments)
    return merged


def ingest_parallel(root: StoreLike, spans: Sequence[SpanRecord], logs: Iterable[LogEvent] = (), *, source: str,
                    skip_existing: bool = False, jobs: int | None = None,
                    privacy: Callable[[NormalizedSpan], NormalizedSpan] | None = DEFAULT_PRIVACY) -> IngestResult:
    """`ingest` on `jobs_for(...)` worker processes (`jobs`: 0 or None for one per core); the same rows
    as one `ingest`, in several segments."""
    global _WORK
    workers = jobs_for(len(spans), len({s.trace_id for s in spans}), jobs)
    if workers <= 1:
        return ingest(root, spans, logs, source=source, skip_existing=skip_existing, privacy=privacy)
    span_parts, log_parts = split(spans, logs, workers)
    _WORK = _Work(root, span_parts, log_parts, source, skip_existing, privacy)
    warm_up()  # once here rather than in every worker
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            results: list[Any] = list(pool.map(_run_part, range(workers)))
    finally:
        _WORK = None
    return merge(results)
