"""The capture writer thread: everything the service's threads must not do.

Converts queued SDK objects to records, joins log events to their spans, normalizes, content-
addresses payloads and writes one set of Parquet segments per flush. Every failure is counted
and reported once; nothing propagates.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_replay.capture.queue import SpanQueue  # noqa: I001
from otel_replay.normalize.content_settings import content_setting_hint
from otel_replay.normalize.pipeline import join_logs, normalize_span
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.sources.sdk import log_from_sdk, span_from_sdk
from otel_replay.store.rows import RowBatch, RowBuilder
from otel_replay.store.writer import write_batch, write_stats

logger = logging.getLogger("otel_replay")

LOG_WAIT_S = 30.0  # how long a log event waits for its span before it is dropped
MAX_PENDING_LOGS = 50_000
RECENT_TRACES = 100_000
# Sharing the GIL: after WORK_SLICE_S of CPU time the writer checks whether it had the CPU to
# itself. If it got less than CONTENDED of the wall time, a service thread wants the GIL, so the
# writer sleeps PAUSE_S; that thread then keeps the GIL for a whole switch interval (5 ms). While
# the GIL comes back later than YIELDING_S after such a pause, the writer pauses after every slice.
WORK_SLICE_S = 0.0005
CONTENDED = 0.8
PAUSE_S = 0.0001
YIELDING_S = 0.001


class WarnOnce:
    """Log each distinct message once per process."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            logger.warning(message)


class CaptureWriter:
    """Owns the queue's consumer side and the store's writer for this process."""

    def __init__(self, root: Path, queue: SpanQueue, *, flush_interval_s: float, flush_rows: int,
                 markers: frozenset[str]) -> None:
        self.root = root
        self.queue = queue
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        self._markers = markers
        self.wake = threading.Event()
        self._flush_waiters: list[threading.Event] = []
        self._waiters_lock = threading.Lock()
        self._stop = False
        self._builder = RowBuilder(source="capture")
        self._batch = RowBatch()
        self._pending_logs: collections.OrderedDict[int, tuple[float, LogEvent]] = collections.OrderedDict()
        self._genai_traces: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._last_write = time.monotonic()
        self._warn = WarnOnce()
        self.accepted = 0
        self.written_spans = 0
        self.skipped: collections.Counter[str] = collections.Counter()
        self._stats_written: tuple[int, int, int] = (0, 0, 0)
        self._slice_wall = self._slice_cpu = 0.0
        self._yielding = False
        self.thread = threading.Thread(target=self._run, name="otel-replay-writer", daemon=True)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def request_flush(self) -> threading.Event:
        done = threading.Event()
        with self._waiters_lock:
            self._flush_waiters.append(done)
        self.wake.set()
        return done

    def stop(self) -> None:
        self._stop = True
        self.wake.set()

    # -- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self.wake.wait(self.flush_interval_s)
            self.wake.clear()
            with self._waiters_lock:
                waiters, self._flush_waiters = self._flush_waiters, []
            stopping = self._stop
            try:
                self._drain(force=bool(waiters) or stopping)
            except Exception as exc:  # noqa: BLE001 - the writer must survive anything
                self._count(f"writer error: {type(exc).__name__}")
                self._warn(f"otel-replay capture writer error (capture continues): {exc!r}")
            for done in waiters:
                done.set()
            if stopping:
                return

    def _new_slice(self) -> None:
        self._slice_wall, self._slice_cpu = time.perf_counter(), time.thread_time()

    def _pace(self) -> None:
        """Between units of work: pause briefly when a service thread is waiting for the GIL."""
        now = time.perf_counter()
        if now - self._slice_wall < WORK_SLICE_S:
            return
        cpu = time.thread_time() - self._slice_cpu
        if cpu < WORK_SLICE_S:
            return
        if self._yielding or cpu < CONTENDED * (now - self._slice_wall):
            time.sleep(PAUSE_S)  # returns once this thread has the GIL again
            self._yielding = time.perf_counter() - now > YIELDING_S
        self._new_slice()

    def _drain(self, force: bool) -> None:
        self._new_slice()
        while True:
            items = self.queue.take(2000)
            if items:
                self._process(items)
            due = time.monotonic() - self._last_write >= self.flush_interval_s
            if len(self._batch) >= self.flush_rows or (not items and (force or due)):
                self._write()
            if not items:
                return

    def _process(self, items: list[Any]) -> None:
        spans: list[SpanRecord] = []
        now = time.monotonic()
        for item in items:
            self._pace()
            try:
                if isinstance(item, ReadableSpan):
                    item = span_from_sdk(item)
                if isinstance(item, SpanRecord):  # from the SDK, or decoded by the OTLP receiver
                    if self._keep(item):
                        spans.append(item)
                    continue
                log = item if isinstance(item, LogEvent) else log_from_sdk(item)
                self._pending_logs[id(log)] = (now, log)
            except Exception as exc:  # noqa: BLE001 - a bad span is skipped, not fatal
                self._count(f"unreadable span: {type(exc).__name__}")
        if not spans:
            return
        traces = {s.trace_id for s in spans}
        logs = [log for _, log in self._pending_logs.values() if log.trace_id in traces]
        grouped, unmatched = join_logs(spans, logs)  # normalize_spans, with a pace between spans
        normalized = []
        for span in spans:
            self._pace()
            normalized.append(normalize_span(span, grouped.get(span.span_id, ())))
        consumed = {id(x) for x in logs} - {id(x) for x in unmatched}
        for key in consumed:
            self._pending_logs.pop(key, None)
        self._expire_logs(now)
        for item in normalized:
            for problem in item.problems:
                self._count(problem.split(":")[0])
                self._warn(f"otel-replay: span {item.span.span_id} of trace {item.span.trace_id}: {problem}")
            step = item.step
            if step is not None and step.kind == "llm" and not step.has_payload:
                self._warn(
                    f"otel-replay: GenAI spans from {item.span.scope_name or 'an instrumentation'} arrive without "
                    f"message content, so their steps are stored observation-only (they can be held, never "
                    f"resampled). To capture content: {content_setting_hint(item.span.scope_name)}."
                )
        now_ns = time.time_ns()
        for item in normalized:
            self._pace()
            self._builder.add(self._batch, item, now_ns)
        self.accepted += len(normalized)

    def _keep(self, record: SpanRecord) -> bool:
        """GenAI spans always; another span (a root, an ancestor) only if its trace had GenAI spans."""
        if not self._markers.isdisjoint(record.attributes):
            self._genai_traces[record.trace_id] = None
            if len(self._genai_traces) > RECENT_TRACES:
                self._genai_traces.popitem(last=False)
            return True
        return record.trace_id in self._genai_traces

    def _expire_logs(self, now: float) -> None:
        while self._pending_logs:
            key, (arrived, _) = next(iter(self._pending_logs.items()))
            if now - arrived < LOG_WAIT_S and len(self._pending_logs) <= MAX_PENDING_LOGS:
                break
            self._pending_logs.pop(key)
            self._count("log event without its span")

    def _write(self) -> None:
        self._last_write = time.monotonic()
        batch, self._batch = self._batch, RowBatch()
        try:
            if len(batch):
                write_batch(self.root, batch)
                self.written_spans += len(batch)
            self._write_stats()
        except OSError as exc:
            self._count("store not writable")
            self.skipped["spans lost: store not writable"] += len(batch)
            self._warn(f"otel-replay cannot write to the store at {self.root} ({exc}); spans are dropped and counted")

    def _write_stats(self) -> None:
        """Record the counters when drops or skips changed, and when the writer stops."""
        current = (self.accepted, self.queue.dropped, sum(self.skipped.values()))
        changed = current[1:] != self._stats_written[1:] or (self._stop and current != self._stats_written)
        if not changed:
            return
        write_stats(self.root, {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "accepted": current[0],
            "dropped_queue_full": current[1],
            "skipped": current[2],
            "skip_reasons": json.dumps(dict(self.skipped)),
        })
        self._stats_written = current

    def _count(self, reason: str) -> None:
        self.skipped[reason] += 1
