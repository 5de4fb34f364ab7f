"""A full queue: `on_end` only counts drops until the writer takes spans, then accepts again."""

from __future__ import annotations

import os
import threading

from opentelemetry.trace import SpanKind

from otel_replay import ReplayProcessor, Store
from otel_replay.capture.processor import State
from tests.helpers import chat_attributes, provider_with


def gated(processor: ReplayProcessor) -> threading.Event:
    """Hold the writer before it takes anything, until the returned event is set."""
    gate = threading.Event()
    drain = processor._writer._drain

    def held(force: bool) -> None:
        gate.wait(30)
        drain(force)

    processor._writer._drain = held
    return gate


def test_a_full_queue_sheds_until_the_writer_takes_spans(tmp_path):
    processor = ReplayProcessor(tmp_path, max_queue_spans=4, flush_interval_s=60)
    gate = gated(processor)
    tracer = provider_with(processor).get_tracer("t")
    with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
        for i in range(7):  # 4 queued, then 3 dropped
            with tracer.start_as_current_span("chat m", attributes=chat_attributes(f"q{i}")):
                pass
        with tracer.start_as_current_span("GET /x", kind=SpanKind.CLIENT):  # ignored, never a drop
            pass
    # the root ends last, with the queue still full: a root is queued when there is room, so it is a drop
    assert processor.dropped == 4 and len(processor._queue) == 4
    gate.set()
    assert processor.force_flush(10_000)
    with tracer.start_as_current_span("chat m", attributes=chat_attributes("after")):  # room again
        pass
    assert processor.force_flush(10_000)
    assert processor.stats["written_spans"] == 5 and processor.dropped == 4
    processor.shutdown()
    stored = Store(tmp_path).sql("select count(*) as n from steps").column("n")[0].as_py()
    assert stored == 5  # the first four chats and the one after


def test_shedding_keeps_counting_under_many_threads_and_the_writer_catches_up(tmp_path):
    processor = ReplayProcessor(tmp_path, max_queue_spans=50, flush_interval_s=0.05)
    tracer = provider_with(processor).get_tracer("t")

    def produce() -> None:
        for i in range(2_000):
            with tracer.start_as_current_span("chat m", attributes=chat_attributes(f"q{i}", "a" * 2_000)):
                pass

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert processor.force_flush(30_000)
    stats = processor.stats
    assert stats["accepted"] + processor.dropped == 8_000 and stats["written_spans"] == stats["accepted"]
    assert processor.dropped > 0 and stats["accepted"] > 50
    with tracer.start_as_current_span("chat m", attributes=chat_attributes("later")):
        pass
    assert processor.force_flush(10_000) and processor.stats["accepted"] == stats["accepted"] + 1
    processor.shutdown()


class Counting(ReplayProcessor):
    """A subclass with its own on_end keeps it; super().on_end still captures."""

    def __init__(self, *args, **kwargs) -> None:
        self.seen = 0
        super().__init__(*args, **kwargs)

    def on_end(self, span) -> None:
        self.seen += 1
        if span.name != "chat secret":
            super().on_end(span)


def test_a_subclass_with_its_own_on_end_keeps_it(tmp_path):
    processor = Counting(tmp_path, max_queue_spans=2, flush_interval_s=60)
    gate = gated(processor)
    tracer = provider_with(processor).get_tracer("t")
    for name in ("chat m", "chat secret", "chat m", "chat m"):
        with tracer.start_as_current_span(name, attributes=chat_attributes()):
            pass
    assert processor.seen == 4 and processor.dropped == 1  # two queued, the secret never offered
    gate.set()
    processor.shutdown()
    assert sorted(Store(tmp_path).sql("select name from spans").column("name").to_pylist()) == ["chat m", "chat m"]


def test_a_forked_child_of_a_shut_down_processor_stays_shut_down(tmp_path):
    processor = ReplayProcessor(tmp_path, flush_interval_s=0.05)
    tracer = provider_with(processor).get_tracer("t")
    processor.shutdown()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with tracer.start_as_current_span("chat child", attributes=chat_attributes()):
                pass
            code = 0 if len(processor._queue) == 0 and processor.dropped == 0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_content_events_count_toward_the_byte_cap(tmp_path):
    """Semconv 1.30 content sits in span events: their bytes are counted when the span is queued."""
    processor = ReplayProcessor(tmp_path, flush_interval_s=60)
    gate = gated(processor)
    tracer = provider_with(processor).get_tracer("t")
    with tracer.start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat"}) as span:
        span.add_event("gen_ai.user.message", {"content": "x" * 100_000})
    with tracer.start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat"}):
        pass
    (with_event, size_with), (without, size_without) = list(processor._queue.items)
    assert size_with - size_without >= 100_000
    gate.set()
    processor.shutdown()


def test_a_caller_that_keeps_on_end_cannot_overfill_the_queue(tmp_path):
    processor = ReplayProcessor(tmp_path, max_queue_spans=3, flush_interval_s=60)
    gate = gated(processor)
    tracer = provider_with(processor).get_tracer("t")
    kept = processor.on_end  # looked up once, while the queue has room
    with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
        spans = []
        for i in range(6):
            span = tracer.start_span("chat m", attributes=chat_attributes(f"q{i}"))
            span._end_time = span.start_time + 1  # ended, without going through the provider's processors
            spans.append(span)
    for span in spans:
        kept(span)
    assert len(processor._queue) == 3 and processor.dropped == 4  # the root (ended through the provider), two chats
    gate.set()
    processor.shutdown()


def test_shedding_begun_in_a_race_with_the_writer_does_not_stick(tmp_path):
    """The writer took spans between a producer's "full" and its switch to shedding: the switch is
    undone at once, or (when the writer's check came first) by the writer's next round."""
    processor = ReplayProcessor(tmp_path, max_queue_spans=4, flush_interval_s=0.05)
    tracer = provider_with(processor).get_tracer("t")
    processor._begin_shedding()  # the queue is empty: a late "full" verdict
    assert processor._state is State.ACCEPTING
    with processor._routing:  # as if the switch had landed after the writer's last look
        processor._state = State.SHEDDING
    deadline = threading.Event()
    for _ in range(100):  # the writer's next round (every 50 ms here) accepts again
        if processor._state is State.ACCEPTING:
            break
        deadline.wait(0.01)
    assert processor._state is State.ACCEPTING
    with tracer.start_as_current_span("chat m", attributes=chat_attributes()):
        pass
    assert processor.force_flush(10_000) and processor.stats["written_spans"] == 1 and processor.dropped == 0
    processor.shutdown()
    processor._begin_shedding()
    processor._resume()
    assert processor._state is State.SHUT_DOWN  # neither a late "full" nor the writer reopens it


def test_a_span_the_pipeline_cannot_take_is_skipped_alone(tmp_path, monkeypatch):
    # the writer takes normalize_span from here for each batch
    from otel_replay.normalize import pipeline

    real = pipeline.normalize_span

    def picky(span, logs=()):
        if span.name == "chat broken":
            raise RuntimeError("cannot normalize")
        return real(span, logs)

    monkeypatch.setattr(pipeline, "normalize_span", picky)
    processor = ReplayProcessor(tmp_path, flush_interval_s=60)
    tracer = provider_with(processor).get_tracer("t")
    for name in ("chat m", "chat broken", "chat m"):
        with tracer.start_as_current_span(name, attributes=chat_attributes()):
            pass
    processor.shutdown()
    stats = processor.stats
    assert stats["accepted"] == 2 and stats["written_spans"] == 2
    assert stats["skipped"] == {"span not stored: RuntimeError": 1}
