"""`ReplayProcessor` and `ReplayLogProcessor`: GenAI telemetry into the store, off the hot path.

`on_end` runs on the service's thread. It looks for a few marker attributes, appends the span
to a bounded queue and returns: no serialization, no hashing, no I/O, no logging, and no lock
but the queue's, which only the service's own threads take, for the few steps of an append.
The writer thread does the rest. Nothing raised in here reaches the service.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanContext

from otel_replay.capture.queue import SpanQueue
from otel_replay.capture.sizing import (
    ATTRIBUTE_OVERHEAD,
    IS_STR,
    SPAN_OVERHEAD,
    STR_SIZE,
    events_size,
    record_size,
)
from otel_replay.capture.tally import SharedCount
from otel_replay.capture.writer import CaptureWriter
from otel_replay.normalize.privacy_settings import PrivacySettings
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.store.location import StoreLocation

if TYPE_CHECKING:
    from otel_replay.normalize.redact import Redactor

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


def _attribute_dict(span: ReadableSpan) -> Mapping[str, object]:
    """A span's attributes without a copy: BoundedAttributes' own dict where it has one."""
    attrs = span._attributes  # noqa: SLF001 - BoundedAttributes; its _dict avoids Mapping overhead
    if attrs is None:
        return {}
    inner: Mapping[str, object] | None = getattr(attrs, "_dict", None)
    return attrs if inner is None else inner


_unmarked = MARKERS.isdisjoint


class State(enum.Enum):
    """What `ReplayProcessor.on_end` does with a span that passes the filter."""

    ACCEPTING = "accepting"  # measure it and queue it
    SHEDDING = "shedding"  # the queue is full: count it as dropped, until the writer takes spans
    SHUT_DOWN = "shut down"  # nothing


# module names: the hot path reads a global, not an attribute of the class
ACCEPTING, SHEDDING, SHUT_DOWN = State.ACCEPTING, State.SHEDDING, State.SHUT_DOWN


def sdk_layout_ok() -> bool:
    """Whether this SDK's spans keep attributes, events and parent where the hot path reads them.

    The public surfaces cost more than the rest of `on_end`: `span.attributes` is a mappingproxy over
    BoundedAttributes, a Python-level mapping the filter and the sizing then iterate key by key, and
    `span.events` copies the events into a tuple. Measured with `on_end` timed both ways in one
    process (SDK 1.45, CPython 3.11, 150 alternating rounds of 1000 calls, the spans of `bench
    capture`): a 4 KB GenAI span 1.43 µs with the fields, 3.86 µs with the public surfaces; an
    ignored span 0.41 -> 0.74 µs; a drop 0.24 -> 0.60 µs. So the hot path reads the SDK's own
    fields, but only after this check, on a real span, says they are what they were; otherwise it
    reads the public surfaces (and says so once).
    """
    try:
        from opentelemetry.sdk.trace import TracerProvider

        tracer = TracerProvider(shutdown_on_exit=False).get_tracer("otel-replay.layout-check")
        with tracer.start_as_current_span("parent") as parent:
            child = tracer.start_span("child", attributes={"k": "v"})
            child.add_event("e")
            child.end()
        if not isinstance(child, Span):
            return False
        # the fields `on_end` reads, spelled as it spells them (getattr: their declared types are looser)
        attrs, events, link = getattr(child._attributes, "_dict", None), getattr(child._events, "_dq", ()), child._parent  # noqa: SLF001
        remote = SpanContext(trace_id=1, span_id=1, is_remote=True)  # `is_remote` is at [2] both ways
        return (attrs == dict(child.attributes or {}) and [e.name for e in events] == [e.name for e in child.events]
                and link is not None and link == parent.get_span_context() and link.is_remote is False
                and link[2] is False and remote[2] is True)
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
        # checked now (ValueError in this call), built by the writer thread: the detectors load there
        self.privacy = PrivacySettings(redact, capture_payloads)
        self._options = (max_queue_spans, max_queue_bytes, flush_interval_s, flush_rows)
        self._yield_gil = yield_gil
        self._state = ACCEPTING  # read by every `on_end`; changed only under `_routing`
        self._routing = threading.Lock()  # state changes: shedding, the writer's `_resume`, `shutdown`
        self.internal_errors = SharedCount()  # anything raised inside, caught before it reached the service
        self.refused_records = SharedCount()  # decoded records turned away whole (the sender retries them)
        if not PRIVATE_LAYOUT:
            logger.warning("otel-replay: this opentelemetry-sdk keeps span fields where the processor does not "
                           "expect them; it reads the public surfaces instead (on_end up to ~2.4 µs slower a span)")
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
        self._wake = self._writer.wake
        self._drop_ticks = self._queue.drops.counter  # `on_end` counts a drop with `next()` of it
        queue = self._queue
        wake_at = min(2000, max_spans // 2 or 1)  # queued spans that wake the writer early
        self._admit = (queue, queue.items, queue.append, queue.acquire, queue.release_lock, queue.max_items,
                       queue.max_bytes, wake_at)
        if self._state is not SHUT_DOWN:
            self._state = ACCEPTING
        self._writer.start()

    def _room_callback(self) -> Callable[[], None]:
        """`_resume` for the writer, by weak reference: its thread must not keep this processor alive."""
        resume = weakref.WeakMethod(self._resume)

        def on_room() -> None:
            method = resume()
            if method is not None:
                method()

        return on_room

    def _after_fork(self) -> None:
        """The child gets its own queue and writer thread; spans of the parent stay with the parent."""
        self._pid = os.getpid()
        self._routing = threading.Lock()  # a thread of the parent may have held it at the fork
        self.internal_errors = self.internal_errors.after_fork()
        self.refused_records = self.refused_records.after_fork()
        self._start_writer()

    # -- the hot path --------------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        """Queue the span for the writer if it is GenAI (or a root); count it as dropped if the queue is full.

        One method, one filter, three states (`State`). Accepting: measure the span and queue it; the
        append that fills the queue switches to shedding. Shedding: filter and count the drop, nothing
        more, until the writer takes spans (`_resume`). Shut down: nothing. A subclass may override
        this and call `super().on_end(span)`.
        """
        # What this method costs beside the closures it replaced (one per state, swapped onto the
        # instance) and their lossy `+=` counters. `bench capture --quick`, old and new code run
        # alternately, 3 runs each (CPython 3.11, SDK 1.45, 2 shared cores): 4 KB GenAI span 0.86-0.96
        # -> 1.02-1.03 µs (1.49-1.60x -> 1.80-1.84x BatchSpanProcessor); ignored span 0.26-0.27 ->
        # 0.26-0.27 µs (unchanged); a drop 0.11-0.12 -> 0.17-0.18 µs. Timed in one process (150
        # alternating rounds of 1000 calls): GenAI +21%, of which the queue's lock ~13% and the rest
        # reading state and queue through `self`; a drop +0.06 µs with a per-thread tally, +0.03 µs
        # since drops tick an `itertools.count` (`tally.Ticker`: 0.15 µs in `--quick` on a quiet
        # machine; the same machine, a minute later and busy, read 0.24-0.28). Within the targets (docs/benchmarks/capture.md); the price of one method and of counters
        # and caps that hold without the GIL.
        state = self._state
        if state is SHUT_DOWN:
            return
        try:
            if PRIVATE_LAYOUT:
                try:  # BoundedAttributes' own dict (checked by `sdk_layout_ok`): no mappingproxy
                    attrs: Mapping[str, object] = span._attributes._dict  # type: ignore[union-attr]  # noqa: SLF001 - the SDK types the field as Mapping | None; its spans hold BoundedAttributes
                except AttributeError:  # not an SDK span (a ReadableSpan built by hand)
                    attrs = _attribute_dict(span)
            else:
                attrs = span.attributes or {}
            # A local child without a marker is not kept. The parent's field and its `is_remote` by
            # position (both checked by `sdk_layout_ok`) save ~80 ns of an ignored span's ~270 ns:
            # the `parent` and `is_remote` properties cost 41 and 37 ns more (timeit, CPython 3.11).
            if _unmarked(attrs):
                parent = span._parent if PRIVATE_LAYOUT else span.parent  # noqa: SLF001
                if parent is not None and not (parent[2] if PRIVATE_LAYOUT else parent.is_remote):
                    return
            if state is SHEDDING:
                next(self._drop_ticks)  # atomic (`tally.Ticker`): no lock, no lost update
                return
            # Honest for every convention: every string value counts what it occupies (sizing.py).
            size = SPAN_OVERHEAD + ATTRIBUTE_OVERHEAD * len(attrs) + sum(map(STR_SIZE, filter(IS_STR, attrs.values())))
            try:  # content events of older conventions carry payloads
                events = span._events._dq if PRIVATE_LAYOUT else span.events  # type: ignore[attr-defined]  # noqa: SLF001 - typed Sequence, an SDK span's is a BoundedList: a deque's truth is a C call
            except AttributeError:
                events = span.events
            if events:
                size += events_size(events)
            # SpanQueue.put, inlined (a call costs ~50 ns), with the queue's parts read in one load
            queue, items, append, acquire, release, max_items, max_bytes, wake_at = self._admit
            acquire()  # producers' lock: check, append and count as one step, so none is lost
            try:
                queued = len(items)
                if queued < max_items and queue.bytes_in - queue.bytes_out + size <= max_bytes:  # an `if`: the
                    append((span, size))  # comparisons specialize, which they do not in `room = a < b and ...`
                    queue.bytes_in += size
                    queued += 1
                    room = True
                else:
                    room = False
            finally:
                release()
            if not room:
                next(self._drop_ticks)
                if queued >= max_items:  # full by count, not only by bytes: shed
                    self._begin_shedding()
            elif queued >= wake_at:
                if queued >= max_items:  # this append filled the queue: shed
                    self._begin_shedding()
                if not self._wake.is_set():  # once per backlog: Event.set takes a lock and costs ~1 µs
                    self._wake.set()
        except Exception:  # noqa: BLE001 - never reach the service
            self.internal_errors.add()

    def _begin_shedding(self) -> None:
        """The queue is full: shed until the writer takes spans (`_resume`).

        Rare, so it takes the state lock: a shut-down processor stays shut down. If the writer took
        spans between the caller's check and the switch, its `_resume` found nothing to undo, so the
        room is looked for again here (and the writer's next round resumes in any case).
        """
        with self._routing:
            if self._state is ACCEPTING:
                self._state = SHEDDING
        self._writer.revive()  # a full queue may mean the writer thread died
        if len(self._queue) < self._queue.max_items:
            self._resume()

    def _resume(self) -> None:
        """The writer took spans: accept again if `on_end` was shedding (the writer's thread, mostly)."""
        with self._routing:
            if self._state is SHEDDING and len(self._queue) < self._queue.max_items:
                self._state = ACCEPTING

    def enqueue_log(self, record: object, size: int) -> None:
        """Queue a GenAI content log event (`ReplayLogProcessor`); dropped and counted when full."""
        try:
            if self._state is not SHUT_DOWN:
                self._queue.offer(record, size)
        except Exception:  # noqa: BLE001
            self.internal_errors.add()

    def accept_records(self, spans: Sequence[SpanRecord], logs: Sequence[LogEvent] = ()) -> int:
        """Queue already-decoded spans and log events (the OTLP receiver's path), all or none.

        Returns how many were refused: 0, or all of them when the queue has no room for the whole
        batch, so the receiver can answer "retry later" and the sender resends the batch intact.
        """
        count = len(spans) + len(logs)
        if self._state is SHUT_DOWN:
            return count
        records: list[LogEvent | SpanRecord] = [*logs, *spans]
        batch = [(item, record_size(item)) for item in records]
        if not self._queue.offer_all(batch):  # logs first, so a span finds its events already waiting
            self.refused_records.add(count)
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
            "internal_errors": self.internal_errors.value,
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
        if self._state is SHUT_DOWN:
            return not self._writer.unwritten()
        self._writer.revive()
        return self._writer.request_flush().wait(max(timeout_millis, 0) / 1000)

    def shutdown(self, timeout_millis: int = 30_000) -> None:
        """Stop accepting spans, write what was accepted, stop the writer, within the timeout.

        What is still unwritten when the timeout ends is said in one warning (with the count)."""
        deadline = time.monotonic() + max(timeout_millis, 0) / 1000
        with self._routing:
            if self._state is SHUT_DOWN:
                return
            self._state = SHUT_DOWN
        self._writer.stop()
        self._writer.revive()  # a writer thread that died still writes what was accepted
        self._writer.thread.join(max(deadline - time.monotonic(), 0))
        left = self._writer.unwritten()
        if self._writer.thread.is_alive() or left:
            logger.warning("otel-replay: shutdown ended after %d ms with %d accepted spans not written to %s "
                           "(the writer is %s)", timeout_millis, left, self.store,
                           "still writing" if self._writer.thread.is_alive() else f"stopped: {self._writer.died}")
