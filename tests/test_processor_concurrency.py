"""Counters stay exact when many service threads call `on_end` at once.

Threads switch every microsecond here (`sys.setswitchinterval`), so a counter updated as a load, an
add and a store would lose updates the way it does under free-threaded Python; every total below is
checked exactly.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

from otel_replay import ReplayProcessor
from tests.helpers import chat_attributes

THREADS = 8


@pytest.fixture
def fast_switching() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def ended_spans(count: int) -> list[ReadableSpan]:
    """Ended GenAI spans of one shape (so one size), made by a provider without the processor."""
    tracer = TracerProvider(shutdown_on_exit=False).get_tracer("t")
    spans = []
    for _ in range(count):
        span = tracer.start_span("chat m", attributes=chat_attributes("q", "a" * 300))
        span.end()
        spans.append(span)
    return spans


def span_size(tmp_path, span: ReadableSpan) -> int:
    """What the queue counts for `span`: read off a processor whose writer never takes it."""
    probe = ReplayProcessor(tmp_path / "probe", flush_interval_s=3600)
    gate = threading.Event()
    drain = probe._writer._drain
    probe._writer._drain = lambda force: (gate.wait(30), drain(force))
    probe.on_end(span)
    ((_, size),) = list(probe._queue.items)
    gate.set()
    probe.shutdown()
    return size


def run_threads(target: Callable[[int], None]) -> None:
    start = threading.Barrier(THREADS)

    def body(index: int) -> None:
        start.wait()
        target(index)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_a_held_writer_counts_every_offer_exactly(tmp_path, fast_switching):
    """The writer takes nothing: each span is queued or counted as dropped, never both, never neither."""
    spans = ended_spans(1_500)
    size = span_size(tmp_path, spans[0])
    processor = ReplayProcessor(tmp_path / "store", max_queue_spans=700, flush_interval_s=3600)
    gate = threading.Event()
    drain = processor._writer._drain
    processor._writer._drain = lambda force: (gate.wait(60), drain(force))

    run_threads(lambda _: [processor.on_end(span) for span in spans])

    queue = processor._queue
    offered = THREADS * len(spans)
    assert len(queue) == 700  # never overfilled, though threads raced for the last places
    assert len(queue) + processor.dropped == offered
    assert queue.bytes_in == sum(size for _, size in queue.items) == 700 * size
    assert processor.internal_errors == 0
    gate.set()
    processor.shutdown()


def test_shedding_while_the_writer_drains_counts_every_offer_exactly(tmp_path, fast_switching):
    """The queue fills and empties over and over: `on_end` goes between accepting and shedding many
    times, and the totals still add up to the spans offered."""
    spans = ended_spans(1_000)
    size = span_size(tmp_path, spans[0])
    processor = ReplayProcessor(tmp_path / "store", max_queue_spans=40, flush_interval_s=0.01)

    def offer(_: int) -> None:
        for span in spans:
            processor.on_end(span)
            processor.on_end(None)  # an internal error, counted from every thread at once

    run_threads(offer)
    assert processor.force_flush(60_000)
    stats = processor.stats
    offered = THREADS * len(spans)
    assert processor.dropped > 0 and stats["accepted"] > 40  # it shed, and it accepted again
    assert stats["accepted"] + processor.dropped == offered
    assert processor._queue.bytes_in == stats["accepted"] * size == processor._queue.bytes_out
    assert processor.internal_errors == offered
    processor.shutdown()


def test_refused_batches_are_counted_exactly(tmp_path, fast_switching):
    processor = ReplayProcessor(tmp_path, max_queue_bytes=1, flush_interval_s=3600)  # no batch fits
    record = SimpleNamespace(attributes={"k": "v"}, events=())

    run_threads(lambda _: [processor.accept_records([record, record]) for _ in range(500)])
    assert processor.refused_records == THREADS * 500 * 2
    processor.shutdown()
