"""`ReplayProcessor` and `ReplayLogProcessor`: GenAI telemetry into the store, off the hot path.

`on_end` runs on the service's thread. It looks for a few marker attributes, appends the span
to a bounded queue and returns: no serialization, no hashing, no I/O, no lock, no logging.
The writer thread does the rest. Nothing raised in here reaches the service.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from otel_replay.capture.queue import SpanQueue
from otel_replay.capture.sizing import (
    ATTRIBUTE_OVERHEAD,
    IS_STR,
    SPAN_OVERHEAD,
    STR_SIZE,
    events_size,
    record_size,
)
from otel_replay.capture.writer import CaptureWriter
from otel_replay.normalize.privacy import Privacy
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.redact import Redactor
from otel_replay.store.location import StoreLocation

# A span is captured when it carries one of these keys (GenAI semconv, OpenInference, OpenLLMetry,
# Langfuse), or when it is a root span (kept only if its trace had such spans).
MARKERS = frozenset(
    {
        "gen_ai.operation.name",
        "gen_ai.system",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.tool.name",
        "gen_ai.agent.name",
        "openinference.span.kind",
        "llm.request.type",
        "traceloop.span.kind",
        "langfuse.observation.type",
    }
)

logger = logging.getLogger("otel_replay")


def _attribute_dict(span: ReadableSpan) -> dict:
    attrs = span._attributes  # noqa: SLF001 - BoundedAttributes; its _dict avoids Mapping overhead
    if attrs is None:
        return {}
    return getattr(attrs, "_dict", attrs)


_unmarked = MARKERS.isdisjoint


def sdk_layout_ok() -> bool:
    """Whether this SDK's spans keep attributes, events and parent where the hot path reads them.

    The public surfaces cost more than the whole filter: `span.attributes` builds a mappingproxy
    (+0.16 µs), `span.events` copies the events into a tuple (+0.42 µs), `span.parent.is_remote`
    +0.08 µs, against ~1.5 µs for all of `on_end` (SDK 1.45, this project's machines). So the hot
    path reads the SDK's own fields, but only after this check, on a real span, says they are what
    they were; otherwise it reads the public surfaces (and says so once).
    """
    try:
        from opentelemetry.sdk.trace import TracerProvider

        tracer = TracerProvider(shutdown_on_exit=False).get_tracer("otel-replay.layout-check")
        with tracer.start_as_current_span("parent") as parent:
            child = tracer.start_span("child", attributes={"k": "v"})
            child.add_event("e")
            child.end()
        attrs, events, link = child._attributes._dict, child._events._dq, child._parent  # noqa: SLF001
        return (attrs == dict(child.attributes) and [e.name for e in events] == [e.name for e in child.events]
                and link == parent.get_span_context() and link.is_remote is False and link[2] is False)
    except Exception:  # noqa: BLE001 - any difference at all: take the public surfaces
        return False


PRIVATE_LAYOUT = sdk_layout_ok()


def is_marked(span: ReadableSpan) -> bool:
    """Whether a span carries a GenAI marker attribute."""
    return not MARKERS.isdisjoint(_attribute_dict(span))


class ReplayProcessor(SpanProcessor):
    """Captures GenAI spans (and the root span of their trace) into an otel-replay store.

    :param store: store directory or URL (`s3://bucket/prefix`, ...); default `$OTEL_REPLAY_STORE` or
        `./otel-replay-store`.
    :param max_queue_spans: spans waiting for the writer before new ones are dropped (and counted).
    :param max_queue_bytes: the memory capture may hold, all told: the queue admits spans (waiting, or taken
        by the writer and not yet written) up to this less a reserve for writing a batch and for the
        writer's caches, then drops them; see `otel_replay.capture.sizing.MemoryBudget`.
    :param flush_interval_s: the writer writes a segment at least this often while spans arrive.
    :param flush_rows: ... and whenever this many spans are waiting to be written.
    :param redact: a `Redactor` (built-ins plus your rules), True (the built-in detectors: API keys,
        bearer tokens, emails, card numbers; the default) or False. Runs on the writer thread, before
        anything is stored; see `otel_replay.normalize.redact`.
    :param capture_payloads: False stores no payload at all (every step observation-only), or a
        mapping per step kind such as ``{"llm": True, "tool": False}`` (kinds not named: True).
    :param yield_gil: the writer pauses between slices of its work while another thread (the
        service's) waits for the GIL; False where nothing else in the process waits on it, such as
        a receiver worker, so the writer runs flat out.
    """

    def __init__(self, store: str | Path | StoreLocation | None = None, *, max_queue_spans: int = 50_000,
                 max_queue_bytes: int = 256 * 1024 * 1024, flush_interval_s: float = 2.0,
                 flush_rows: int = 20_000, redact: Redactor | bool = True,
                 capture_payloads: bool | Mapping[str, bool] = True, yield_gil: bool = True) -> None:
        if max_queue_spans <= 0 or max_queue_bytes <= 0:
            raise ValueError("max_queue_spans and max_queue_bytes must be positive")
        if flush_interval_s <= 0 or flush_rows <= 0:
            raise ValueError("flush_interval_s and flush_rows must be positive")
        self.store = StoreLocation.of(store)
        self.privacy = Privacy(redact, capture_payloads)  # raises ValueError now, never on the writer
        self._options = (max_queue_spans, max_queue_bytes, flush_interval_s, flush_rows)
        self._yield_gil = yield_gil
        self._shutdown = False
        self.internal_errors = 0
        self.refused_records = 0  # decoded records turned away whole (the sender retries them)
        # `on_end` is one of two closures (see `_hot_paths`); a subclass that defines its own `on_end`
        # keeps it, and reaches the closures through `self._hot` when it calls `super().on_end`
        self._plain = type(self).on_end is ReplayProcessor.on_end
        self._routing = threading.Lock()  # the writer's `_resume` against `shutdown`
        if not PRIVATE_LAYOUT:
            logger.warning("otel-replay: this opentelemetry-sdk keeps span fields where the processor does not "
                           "expect them; it reads the public surfaces instead (on_end about 0.7 µs slower)")
        self._start_writer()
        self._pid = os.getpid()
        if hasattr(os, "register_at_fork"):
            weak_reinit = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (m := weak_reinit()) and m())

    def _start_writer(self) -> None:
        max_spans, max_bytes, interval, rows = self._options
        self._queue = SpanQueue(max_spans, max_bytes)
        self._writer = CaptureWriter(self.store, self._queue, flush_interval_s=interval, flush_rows=rows,
                                     markers=MARKERS, privacy=self.privacy, on_room=self._room_callback(),
                                     yield_gil=self._yield_gil)
        self._accept, self._shed = self._hot_paths(self._queue, self._writer.wake, min(2000, max_spans // 2 or 1))
        self._route(self._on_end_after_shutdown if self._shutdown else self._accept)
        self._writer.start()

    def _room_callback(self) -> Callable[[], None]:
        """`_resume` for the writer, by weak reference: its thread must not keep this processor alive."""
        resume = weakref.WeakMethod(self._resume)
        return lambda: (method := resume()) is not None and method()

    def _after_fork(self) -> None:
        """The child gets its own queue and writer thread; spans of the parent stay with the parent."""
        self._pid = os.getpid()
        self._routing = threading.Lock()  # a thread of the parent may have held it at the fork
        self._start_writer()

    # -- the hot path --------------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        """Queue the span for the writer if it is GenAI (or a root); count it as dropped if the queue is full.

        An instance answers this with its current closure directly (`_route`); this method is what a
        subclass that overrides `on_end` reaches through `super().on_end(span)`.
        """
        self._hot(span)

    def _route(self, path: Callable[[ReadableSpan], None]) -> None:
        """Make `path` what `on_end` runs (`_state` reads it back; `_hot` follows for subclasses)."""
        if self._plain:
            self.on_end = path  # type: ignore[method-assign]
        self._hot = path

    def _state(self) -> Callable[[ReadableSpan], None]:
        return self.on_end if self._plain else self._hot

    def _hot_paths(self, queue: SpanQueue, wake: threading.Event,
                   wake_at: int) -> tuple[Callable[[ReadableSpan], None], Callable[[ReadableSpan], None]]:
        """`on_end` while the queue has room (`accept`) and while it is full (`shed`), as closures.

        Closures read the queue, its bound methods and the limits from cells instead of attributes of
        `self` (about 7% of `accept`). `accept` switches to `shed` when its append fills the queue;
        `shed` only filters and counts the drop, until the writer takes spans (`_resume`). Both filter
        alike, so a drop is counted for exactly the spans `accept` would have queued. `accept` checks
        the count itself too, so a caller that keeps a reference to it cannot overfill the queue.
        """
        length, append, max_items, max_bytes = queue.length, queue.append, queue.max_items, queue.max_bytes
        processor, private = self, PRIVATE_LAYOUT

        def accept(span: ReadableSpan) -> None:
            try:
                if private:
                    try:
                        attrs = span._attributes._dict  # noqa: SLF001 - checked by `sdk_layout_ok`
                    except AttributeError:  # not an SDK span (a ReadableSpan built by hand)
                        attrs = _attribute_dict(span)
                else:
                    attrs = span.attributes or {}
                if _unmarked(attrs):
                    parent = span.parent
                    if parent is not None and not parent.is_remote:
                        return
                queued = length()
                if queued >= max_items:  # full (a race, or a caller that kept this function): drop, shed
                    queue.dropped += 1
                    if processor._hot is not shed:  # noqa: SLF001
                        processor._to_shed()  # noqa: SLF001
                    return
                # Honest for every convention: every string value counts what it occupies (sizing.py).
                size = SPAN_OVERHEAD + ATTRIBUTE_OVERHEAD * len(attrs) + sum(map(STR_SIZE, filter(IS_STR, attrs.values())))
                try:  # content events of older conventions carry payloads
                    events = span._events._dq if private else span.events  # noqa: SLF001 - a deque: truth is a C call
                except AttributeError:
                    events = span.events
                if events:
                    size += events_size(events)
                if queue.bytes_in - queue.bytes_out + size > max_bytes:  # SpanQueue.put, inlined
                    queue.dropped += 1
                    return
                append((span, size))
                queue.bytes_in += size
                queued += 1
                if queued >= wake_at:
                    if queued >= max_items and processor._hot is not shed:  # noqa: SLF001
                        processor._to_shed()  # noqa: SLF001 - full: only count drops until the writer takes some
                    if not wake.is_set():  # once per backlog: Event.set takes a lock and costs ~1 µs
                        wake.set()
            except Exception:  # noqa: BLE001 - never reach the service
                processor.internal_errors += 1

        def shed(span: ReadableSpan) -> None:
            try:
                if private:  # the filter of `accept`, spelled out again: a call would cost a third of this path
                    try:
                        attrs = span._attributes._dict  # noqa: SLF001
                    except AttributeError:
                        attrs = _attribute_dict(span)
                else:
                    attrs = span.attributes or {}
                if _unmarked(attrs):
                    parent = span.parent
                    if parent is not None and not parent.is_remote:
                        return
                queue.dropped += 1
            except Exception:  # noqa: BLE001
                processor.internal_errors += 1

        return accept, shed

    def _to_shed(self) -> None:
        """The queue is full: shed until the writer takes spans (`_resume`). If it took some between
        the caller's check and now, accept again at once, or nothing might switch back. The lock is
        only tried: when the writer holds it, it is resuming already."""
        self._route(self._shed)
        self._writer.revive()  # a full queue may mean the writer thread died
        if len(self._queue) < self._queue.max_items and self._routing.acquire(blocking=False):
            try:
                if not self._shutdown and self._state() is self._shed:
                    self._route(self._accept)
            finally:
                self._routing.release()

    def _resume(self) -> None:
        """The writer took spans: accept again if `on_end` was shedding (on the writer's thread)."""
        with self._routing:
            if not self._shutdown and self._state() is self._shed and len(self._queue) < self._queue.max_items:
                self._route(self._accept)

    def _on_end_after_shutdown(self, span: ReadableSpan) -> None:
        return None

    def enqueue_log(self, record: object, size: int) -> None:
        try:
            if not self._shutdown:
                self._queue.offer(record, size)
        except Exception:  # noqa: BLE001
            self.internal_errors += 1

    def accept_records(self, spans: Sequence[SpanRecord], logs: Sequence[LogEvent] = ()) -> int:
        """Queue already-decoded spans and log events (the OTLP receiver's path), all or none.

        Returns how many were refused: 0, or all of them when the queue has no room for the whole
        batch, so the receiver can answer "retry later" and the sender resends the batch intact.
        """
        count = len(spans) + len(logs)
        if self._shutdown:
            return count
        batch = [(item, record_size(item)) for item in (*logs, *spans)]
        if not self._queue.offer_all(batch):  # logs first, so a span finds its events already waiting
            self.refused_records += count
            return count
        # a request's records at once: the writer starts on them now instead of when 2,000 are waiting
        # (the hot path's threshold, which spares a service's threads a wake-up per span): a receiver
        # that waited would leave its writer idle for the first several requests
        if not self._writer.wake.is_set():
            self._writer.wake.set()
        return 0

    def remember_genai_traces(self, trace_ids: Iterable[str]) -> None:
        """Keep the roots and ancestors of these traces, whose GenAI spans are stored already (for
        `receiver_durable`, which replays a write-ahead log); on the caller's thread, before it queues them."""
        self._writer.remember_genai_traces(trace_ids)

    # -- counters ------------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Spans and log events refused because the queue was full."""
        return self._queue.dropped

    @property
    def stats(self) -> dict[str, object]:
        return {
            "accepted": self._writer.accepted,
            "written_spans": self._writer.written_spans,
            "dropped_queue_full": self._queue.dropped,
            "queued": len(self._queue),
            "queued_bytes": self._queue.queued_bytes,
            "skipped": dict(self._writer.skipped),
            "internal_errors": self.internal_errors,
            "lost_store_unwritable": self._writer.lost_spans,
            "store_error": self._writer.store_error,  # why the store cannot be written now, else None
            "writer_restarts": self._writer.restarts,  # writer threads that died and were replaced
        }

    # -- flush and shutdown --------------------------------------------------------------------
    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Write everything queued before this call.

        False if that took longer than the timeout, or if the store refused a write meanwhile (the
        spans were dropped and counted): True means what was queued before the call is on disk.
        """
        if self._shutdown:
            return not self._writer.unwritten()
        self._writer.revive()
        return self._writer.request_flush().wait(max(timeout_millis, 0) / 1000)

    def shutdown(self, timeout_millis: int = 30_000) -> None:
        """Stop accepting spans, write what was accepted, stop the writer, within the timeout.

        What is still unwritten when the timeout ends is said in one warning (with the count)."""
        if self._shutdown:
            return
        deadline = time.monotonic() + max(timeout_millis, 0) / 1000
        with self._routing:
            self._shutdown = True
            self._route(self._on_end_after_shutdown)  # the hot path then skips even the flag check
        self._writer.stop()
        self._writer.revive()  # a writer thread that died still writes what was accepted
        self._writer.thread.join(max(deadline - time.monotonic(), 0))
        left = self._writer.unwritten()
        if self._writer.thread.is_alive() or left:
            logger.warning("otel-replay: shutdown ended after %d ms with %d accepted spans not written to %s "
                           "(the writer is %s)", timeout_millis, left, self.store,
                           "still writing" if self._writer.thread.is_alive() else f"stopped: {self._writer.died}")
