"""The capture writer thread: everything the service's threads must not do.

Converts queued SDK objects to records, joins log events to their spans, normalizes, content-
addresses payloads and writes one set of Parquet segments per flush. Every failure is counted
and reported once; nothing propagates.

When the store refuses a write (disk full, read-only, permission denied, directory deleted or
unmounted), the batch is dropped and counted (`lost_spans`, `store_error`), one warning per
reason names the store and why, and every later flush tries again: capture resumes by itself
once the store is writable (a store directory that existed is never recreated, so an unmounted
volume does not fill the disk under it). Bytes of taken items stay held in the queue's byte
count until their batch is written or dropped; writing a batch and the caches kept here (recent
GenAI traces, log events waiting for their span, the row builder's) have their own shares of the
cap (`sizing.MemoryBudget`), so the cap bounds everything capture holds.
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, set_value
from opentelemetry.sdk.trace import ReadableSpan

from otel_replay.capture.queue import SpanQueue  # noqa: I001
from otel_replay.capture.sizing import record_size
from otel_replay.normalize.content_settings import content_setting_hint
from otel_replay.normalize.privacy_settings import PrivacySettings
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.sources.sdk import log_from_sdk, span_from_sdk
from otel_replay.store.location import StoreLocation
from otel_replay.store.rows import RowBatch, RowBuilder

if TYPE_CHECKING:  # these load on the writer thread (`load_for_writing`): the normalize pipeline and the
    # redaction detectors, pyarrow and the Parquet writer
    from otel_replay.normalize.pipeline import NormalizedSpan
    from otel_replay.store.writer import ArrowParts, Pace

Redaction = Callable[["NormalizedSpan"], "NormalizedSpan"]
DEFAULT_SETTINGS = PrivacySettings()  # the built-in detectors, every payload

logger = logging.getLogger("otel_replay")

TAKE = 256  # spans taken from the queue at a time: few in flight, so what they make dies young (cheap to collect)
LOG_WAIT_S = 30.0  # how long a log event waits for its span before it is dropped
MAX_PENDING_LOGS = 50_000  # and at most `MemoryBudget.pending_log_bytes` of them
MAX_WARNINGS = 1024  # distinct warnings remembered (each said once); past that, new ones are only counted
# Sharing the GIL: after WORK_SLICE_S of CPU time the writer checks whether it had the CPU to
# itself. If it got less than CONTENDED of the wall time, a service thread wants the GIL, so the
# writer sleeps PAUSE_S; that thread then keeps the GIL for a whole switch interval (5 ms). While
# the GIL comes back later than YIELDING_S after such a pause, the writer pauses after every slice.
# Each drain starts as if yielding, so a busy service never waits out a forced switch to get the GIL
# back (`otel-replay bench capture`: slowdown 1.2-1.3x with 0.5 ms slices and no such start, ~1.1x now).
WORK_SLICE_S = 0.00025
CONTENDED = 0.8
PAUSE_S = 0.0001
YIELDING_S = 0.001


def _run_on() -> None:
    return None


# A writer thread's first batch would import modules and load the schemas lazily (importlib,
# pyarrow's Parquet writer, the zstd codec). A fork() in that window (gunicorn --preload, celery
# prefork) would leave the child an import lock held by a thread it does not have. So each process
# loads all of it once, at the start of its first writer thread, under a lock that fork() waits for.
_loading = threading.Lock()
_loaded_in: int | None = None  # the pid that loaded it (a forked child inherits what its parent loaded)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_loading.acquire, after_in_parent=_loading.release,
                        after_in_child=_loading.release)


def load_for_writing(root: StoreLocation | None = None) -> None:
    """Import and build what writing a batch needs, once per process (and a remote store's
    filesystem client), where no fork can cut it short."""
    global _loaded_in
    remote = root is not None and root.local is None
    if _loaded_in is not None and not remote:
        return
    with _loading:
        if _loaded_in is None:
            import otel_replay.normalize.privacy  # noqa: F401 - and the pipeline it uses: for `_process`
            from otel_replay.store.writer import warm_up

            warm_up()
            _loaded_in = os.getpid()
        if remote and root is not None:
            _ = root.fs  # fsspec and the protocol's implementation, imported on first use


_REASONS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file size limit exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOENT: "store directory missing",
    errno.ENOTDIR: "not a directory",
    errno.EEXIST: "not a directory",
    errno.EIO: "I/O error",
}


def store_failure_reason(exc: BaseException) -> str:
    """A short, stable name for why a store write failed (one warning per reason)."""
    code = getattr(exc, "errno", None)
    known = _REASONS.get(code) if isinstance(code, int) else None
    return known or (f"{type(exc).__name__} (errno {code})" if code else type(exc).__name__)


class WarnOnce:
    """Log each distinct message (or key) once per process."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def __call__(self, message: str, key: str | None = None) -> None:
        key = message if key is None else key
        if key not in self._said and len(self._said) < MAX_WARNINGS:
            self._said.add(key)
            logger.warning(message)


class FlushRequest:
    """One `force_flush`: done when the writer wrote what was queued before it; ok unless a write failed."""

    __slots__ = ("done", "failures_before", "ok")

    def __init__(self, failures_before: int) -> None:
        self.done = threading.Event()
        self.failures_before = failures_before
        self.ok = False

    def wait(self, timeout_s: float) -> bool:
        return self.done.wait(timeout_s) and self.ok


def _local_dir(root: object) -> Path | None:
    """The local directory of a store root (a Path, or a location with `.local`), else None."""
    return root if isinstance(root, Path) else getattr(root, "local", None)


class CaptureWriter:
    """Owns the queue's consumer side and the store's writer for this process."""

    def __init__(self, root: StoreLocation, queue: SpanQueue, *, flush_interval_s: float, flush_rows: int,
                 markers: frozenset[str],
                 privacy: Redaction | PrivacySettings | None = DEFAULT_SETTINGS,
                 on_room: Callable[[], None] | None = None, yield_gil: bool = True) -> None:
        self.root = root
        self._write_pace: Pace = self._pace
        if not yield_gil:  # nothing in this process waits for the GIL: no pauses
            self._pace = _run_on  # type: ignore[method-assign]
            self._write_pace = None
        self._on_room = on_room  # told each time spans were taken: the producer may have stopped accepting
        # redaction and payload switches, applied here, never on the service's thread; settings are
        # built into a `Privacy` by the writer thread (`_privacy_now`)
        self._settings = privacy if isinstance(privacy, PrivacySettings) else None
        self._privacy: Redaction | None = None if isinstance(privacy, PrivacySettings) else privacy
        self.queue = queue
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        self._markers = markers
        self.wake = threading.Event()
        self._flush_waiters: list[FlushRequest] = []
        self._waiters_lock = threading.Lock()
        self._stop = False
        self.budget = queue.budget
        self._builder = self._new_builder()
        self._batch = RowBatch()  # the rows of the spans taken last, until `_convert` turns them into ...
        self._parts: ArrowParts | None = None  # ... Arrow, held until the write (`store.writer.ArrowParts`)
        self._converted = 0  # spans in `_parts`
        self._pending_logs: collections.OrderedDict[int, tuple[float, LogEvent, int]] = collections.OrderedDict()
        self._pending_log_bytes = 0
        self._genai_traces: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._last_write = time.monotonic()
        self._warn = WarnOnce()
        self.accepted = 0
        self.written_spans = 0
        self.skipped: collections.Counter[str] = collections.Counter()
        self._stats_written: tuple[int, int, int] = (0, 0, 0)
        self._slice_wall = self._slice_cpu = self._check_at = 0.0
        self._yielding = False
        # Store failures: the service never sees them; spans are dropped, counted, and the reason said once.
        # write early: held bytes leave room in the queue, and writing needs ~3x a batch (reserved in the budget)
        self.flush_bytes = self.budget.flush_bytes
        self._held = 0  # bytes of items taken since the last write (released when it is done)
        self.lost_spans = 0
        self.write_failures = 0
        self.store_error: str | None = None
        self._root_seen = False  # once the store directory exists, it is never recreated
        self.died: str | None = None  # what killed the last writer thread, if one died
        self.restarts = 0
        self._finished = False  # the loop returned after `stop`: no thread is wanted any more
        self._revive_lock = threading.Lock()
        self.thread = self._new_thread()

    # -- lifecycle -----------------------------------------------------------------------------
    def _new_thread(self) -> threading.Thread:
        return threading.Thread(target=self._run, name="otel-replay-writer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def revive(self) -> bool:
        """Start a new writer thread if the last one died (something got past every handler, e.g. an
        exception raised into it from outside); True if one was started. Queued spans and the batch
        in progress carry over; what the dead thread held in hand is counted as lost."""
        if self.thread.is_alive() or self._finished:
            return False
        with self._revive_lock:
            if self.thread.is_alive() or self._finished or not self.thread.ident:
                return False
            self.restarts += 1
            self._count("writer thread restarted")
            self._warn(f"otel-replay: the capture writer thread died ({self.died or 'unknown cause'}); a new one was "
                       f"started and capture continues (restarts so far are counted in stats)", key="writer died")
            self.thread = self._new_thread()
            self.thread.start()
            return True

    def request_flush(self) -> FlushRequest:
        request = FlushRequest(self.write_failures)
        with self._waiters_lock:
            self._flush_waiters.append(request)
        self.wake.set()
        return request

    def stop(self) -> None:
        self._stop = True
        self.wake.set()

    # -- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        # what the writer does must not be traced: an instrumented HTTP or S3 client writing the store
        # would otherwise make spans of its own, which come back here (as BatchSpanProcessor does)
        attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - recorded; `revive` starts a new thread
            self.died = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self._count("writer thread died")

    def _loop(self) -> None:
        try:
            load_for_writing(self.root if isinstance(self.root, StoreLocation) else None)
        except Exception as exc:  # noqa: BLE001 - then the first write says what is wrong
            self._count(f"writer error: {type(exc).__name__}")
        if not self._root_seen:
            try:  # on this thread: a stat of a hung mount must not hold the service's thread
                local = _local_dir(self.root)
                self._root_seen = local is not None and local.is_dir()
            except OSError:
                pass
        while True:
            self.wake.wait(self.flush_interval_s)
            self.wake.clear()
            with self._waiters_lock:
                waiters, self._flush_waiters = self._flush_waiters, []
            stopping = self._stop
            try:
                self._drain(force=bool(waiters) or stopping)
            except BaseException as exc:  # noqa: BLE001 - the writer must survive anything, even SystemExit
                self.write_failures += 1  # what a waiting force_flush asked for may not be written
                self._count(f"writer error: {type(exc).__name__}")
                self._warn(f"otel-replay capture writer error (capture continues): {exc!r}")
            finally:
                for request in waiters:
                    request.ok = self.write_failures == request.failures_before
                    request.done.set()
            if stopping:
                self._finished = True
                return

    def unwritten(self) -> int:
        """Spans accepted but not on disk yet: queued, or in the batch being built."""
        return len(self.queue) + self._converted + len(self._batch)

    def _new_slice(self) -> None:
        self._slice_wall, self._slice_cpu = time.perf_counter(), time.thread_time()
        self._check_at = self._slice_wall + WORK_SLICE_S

    def _pace(self) -> None:  # replaced by `_run_on` when not yielding the GIL
        """Between units of work: pause briefly when a service thread is waiting for the GIL."""
        now = time.perf_counter()
        if now < self._check_at:
            return
        cpu = time.thread_time() - self._slice_cpu  # a system call (~0.5 µs): not asked again before it can change
        if cpu < WORK_SLICE_S:  # the slice's CPU time cannot reach WORK_SLICE_S sooner than this
            self._check_at = now + (WORK_SLICE_S - cpu)
            return
        if self._yielding or cpu < CONTENDED * (now - self._slice_wall):
            time.sleep(PAUSE_S)  # returns once this thread has the GIL again
            self._yielding = time.perf_counter() - now > YIELDING_S
        self._new_slice()

    def _drain(self, force: bool) -> None:
        self._new_slice()
        # start polite: the first slice ends with a pause, so a service thread already waiting for the
        # GIL gets it then instead of after a forced switch (5 ms); if nobody waits, the GIL comes straight
        # back and the writer runs on at full speed
        self._yielding = True
        if self._on_room is not None:  # each round, taken or not: a producer that began shedding in a
            self._on_room()  # race with the last take accepts again within one flush interval
        # One round covers what was queued when it began, so under a sustained flood it still ends
        # and a waiting force_flush is answered; the next round starts at once if more is waiting.
        remaining = len(self.queue)
        while True:
            taken = self.queue.take(min(TAKE, remaining), max(self.flush_bytes - self._held, 1))
            remaining -= len(taken)
            if taken and self._on_room is not None:
                self._on_room()
            items = [item for item, _ in taken]
            if items:
                self._held += sum(size for _, size in taken)
                self._process(items)
                self._convert()
            due = time.monotonic() - self._last_write >= self.flush_interval_s
            if self._converted + len(self._batch) >= self.flush_rows or self._held >= self.flush_bytes or (not items and (force or due)):
                self._write()
            if not items:
                if len(self.queue):
                    self.wake.set()
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
                size = record_size(log)
                self._pending_logs[id(log)] = (now, log, size)
                self._pending_log_bytes += size
            except Exception as exc:  # noqa: BLE001 - a bad span is skipped, not fatal
                self._count(f"unreadable span: {type(exc).__name__}")
        if not spans:
            return
        # loaded by `load_for_writing`; looked up once a batch
        from otel_replay.normalize.pipeline import join_logs, normalize_span

        self._privacy_now()
        traces = {s.trace_id for s in spans}
        logs = [log for _, log, _ in self._pending_logs.values() if log.trace_id in traces]
        grouped, unmatched = join_logs(spans, logs)  # normalize_spans, one span at a time (below)
        consumed = {id(x) for x in logs} - {id(x) for x in unmatched}
        for key in consumed:
            entry = self._pending_logs.pop(key, None)
            self._pending_log_bytes -= entry[2] if entry else 0
        self._expire_logs(now)
        now_ns = time.time_ns()
        for span in spans:  # each span from record to rows before the next: what it made dies young
            self._pace()
            try:
                self._add(normalize_span(span, grouped.get(span.span_id, ())), now_ns)
            except Exception as exc:  # noqa: BLE001 - a span the pipeline cannot take is skipped, not its batch
                self._count(f"span not stored: {type(exc).__name__}")
                self._warn(f"otel-replay: span {span.span_id} of trace {span.trace_id} could not be stored "
                           f"({exc!r}); capture continues", key=f"span not stored: {type(exc).__name__}")
                continue
            self.accepted += 1

    def _add(self, item: NormalizedSpan, now_ns: int) -> None:
        """Report a normalized span's problems, redact it and add its rows to the batch."""
        for problem in item.problems:  # "<kind>: from <scope>: ...": the kind is counted, kind and scope warned once
            self._count(problem.split(":")[0])
            self._warn(f"otel-replay: span {item.span.span_id} of trace {item.span.trace_id}: {problem} "
                       f"(said once per cause and instrumentation; the rest are counted)",
                       key=":".join(problem.split(":")[:2]))
        step = item.step
        if step is not None and step.kind == "llm" and not step.has_payload and not item.problems:
            self._warn(
                f"otel-replay: GenAI spans from {item.span.scope_name or 'an instrumentation'} arrive without "
                f"message content (no content attribute or event), so their steps are stored observation-only "
                f"(they can be held, never resampled). To capture content: "
                f"{content_setting_hint(item.span.scope_name)}.", key=f"no content: {item.span.scope_name}"
            )
        if self._privacy is not None:
            known = len(item.problems)
            item = self._privacy(item)
            for problem in item.problems[known:]:  # a rule failed: the span was stored without content
                self._count(problem.split(":")[0])
                self._warn(f"otel-replay: span {item.span.span_id}: {problem}", key=problem.split(":")[0])
        self._builder.add(self._batch, item, now_ns)

    def _privacy_now(self) -> None:
        """Build the `Privacy` this writer was given the settings of (once, on the writer thread)."""
        if self._settings is not None:
            self._privacy, self._settings = self._settings.build(), None

    def _keep(self, record: SpanRecord) -> bool:
        """GenAI spans always; another span (a root, an ancestor) only if its trace had GenAI spans."""
        if not self._markers.isdisjoint(record.attributes):
            self._genai_traces[record.trace_id] = None
            if len(self._genai_traces) > self.budget.recent_traces:
                self._genai_traces.popitem(last=False)
            return True
        return record.trace_id in self._genai_traces

    def remember_genai_traces(self, trace_ids: Iterable[str]) -> None:
        """Keep the other spans of these traces, whose GenAI spans are stored already (a WAL replay)."""
        for trace_id in trace_ids:
            self._genai_traces[trace_id] = None
        while len(self._genai_traces) > self.budget.recent_traces:
            self._genai_traces.popitem(last=False)

    def _expire_logs(self, now: float) -> None:
        while self._pending_logs:
            key, (arrived, _, size) = next(iter(self._pending_logs.items()))
            if (now - arrived < LOG_WAIT_S and len(self._pending_logs) <= MAX_PENDING_LOGS
                    and self._pending_log_bytes <= self.budget.pending_log_bytes):
                break
            self._pending_logs.pop(key)
            self._pending_log_bytes -= size
            self._count("log event without its span")

    def _convert(self) -> None:
        """The rows of the spans just taken, as Arrow: held rows were walked by every garbage collection
        until the write (a step row stays tracked), Arrow holds them in a fraction of the memory. If a
        conversion fails, they stay rows: the write converts them again and reports what fails."""
        from otel_replay.store.writer import ArrowParts  # loaded by `load_for_writing`

        parts = self._parts or ArrowParts()
        try:
            parts.take(self._batch, self._write_pace)  # all of the batch or nothing
        except Exception:  # noqa: BLE001 - see the docstring
            return
        self._parts, self._converted, self._batch = parts, self._converted + len(self._batch), RowBatch()

    def _write(self) -> None:
        """Write the batch; if the store refuses it, drop it, count it and say why once."""
        self._last_write = time.monotonic()
        batch, self._batch = self._batch, RowBatch()
        parts, self._parts = self._parts, None
        spans, self._converted = self._converted + len(batch), 0
        held, self._held = self._held, 0
        try:
            if spans or self._stats_changed():
                self._check_root()
            if spans:
                from otel_replay.store.writer import ArrowParts  # loaded by `load_for_writing`

                parts = parts or ArrowParts()
                parts.take(batch, self._write_pace)
                parts.write(self.root)
                self.written_spans += spans
            self._write_stats()
        except Exception as exc:  # noqa: BLE001 - disk full, read-only, deleted, denied, or anything else
            self._store_failed(exc, spans)
        else:
            self._store_ok()
        finally:
            self.queue.release(held)  # the batch is on disk or given up: its bytes are free

    def _check_root(self) -> None:
        """A local store directory that existed and is gone (deleted, unmounted) is not recreated."""
        local = _local_dir(self.root)
        if local is None:
            return
        if not self._root_seen:
            self._root_seen = True  # the first write creates it
            return
        try:
            mode = os.stat(local).st_mode  # PermissionError says itself
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "the store directory no longer exists (deleted or unmounted?); "
                                    "recreate it to resume capture", str(local)) from None
        if not stat.S_ISDIR(mode):
            raise NotADirectoryError(errno.ENOTDIR, "the store path is not a directory", str(local))

    def _store_failed(self, exc: Exception, spans: int) -> None:
        reason = store_failure_reason(exc)
        self.write_failures += 1
        self.lost_spans += spans
        self.store_error = f"{reason}: {exc}"
        self._count("store not writable")
        self.skipped["spans lost: store not writable"] += spans
        # Payloads of the lost batch were marked as stored: forget them, or later steps would point at nothing.
        self._builder = self._new_builder()
        self._warn(f"otel-replay cannot write to the store at {self.root}: {reason} ({exc}). Captured spans are "
                   f"dropped and counted until the store is writable again; the service is not affected.",
                   key=f"store failure: {reason}")

    def _new_builder(self) -> RowBuilder:
        budget = self.budget
        return RowBuilder(source="capture", max_known_hashes=budget.known_hashes,
                          max_identity_bytes=budget.identity_bytes)

    def _store_ok(self) -> None:
        if self.store_error is not None:
            self.store_error = None
            self._warn(f"otel-replay: the store at {self.root} is writable again; capture resumed "
                       f"({self.lost_spans} spans were dropped while it was not)", key="store resumed")

    def _stats_changed(self) -> bool:
        current = (self.accepted, self.queue.dropped, sum(self.skipped.values()))
        return current[1:] != self._stats_written[1:] or (self._stop and current != self._stats_written)

    def _write_stats(self) -> None:
        """Record the counters when drops or skips changed, and when the writer stops."""
        if not self._stats_changed():
            return
        current = (self.accepted, self.queue.dropped, sum(self.skipped.values()))
        from otel_replay.store.writer import write_stats  # loaded by `load_for_writing`

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
