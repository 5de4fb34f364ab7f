"""Service safety: whatever happens to the store, the service's threads never wait and never see an
exception; capture drops and counts, says why once, and resumes when the store comes back.
Memory stays bounded by the byte cap, with byte accounting that is honest for large payloads."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import tracemalloc

import pytest

from otel_replay import ReplayProcessor, Store
from otel_replay.capture.queue import SpanQueue
from tests.harness.faults import KINDS, run_fault_scenario
from tests.harness.overload import run_overload
from tests.helpers import chat_attributes, provider_with

MB = 1024 * 1024


def _end_spans(tracer, count: int, tag: str, pause_every: int = 0) -> float:
    """End `count` GenAI spans on this thread; returns the slowest end() in seconds."""
    slowest = 0.0
    for i in range(count):
        span = tracer.start_span(f"chat {tag}-{i}", attributes=chat_attributes(f"{tag} {i}"))
        started = time.perf_counter()
        span.end()
        slowest = max(slowest, time.perf_counter() - started)
        if pause_every and i % pause_every == pause_every - 1:
            time.sleep(0.06)  # let the writer try (and fail) several times
    return slowest


def _store_warnings(caplog, store) -> tuple[list[str], list[str]]:
    messages = [r.getMessage() for r in caplog.records if r.name == "otel_replay" and str(store) in r.getMessage()]
    return [m for m in messages if "cannot write" in m], [m for m in messages if "capture resumed" in m]


def test_a_store_path_that_is_a_file_costs_counted_drops_and_one_warning(tmp_path, caplog):
    store = tmp_path / "store"
    store.write_text("not a directory\n")
    processor = ReplayProcessor(store, flush_interval_s=0.02)
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        slowest = _end_spans(tracer, 200, "lost", pause_every=50)
        assert processor.force_flush(10_000) is False  # nothing was written: the flush says so
        stats = processor.stats
        assert stats["lost_store_unwritable"] == 200 and stats["internal_errors"] == 0
        assert stats["store_error"].startswith("not a directory")
        failures, _ = _store_warnings(caplog, store)
        assert len(failures) == 1 and "not a directory" in failures[0]  # said once, with the path and why
        assert slowest < 0.5  # no end() waited for the store (generous bound for a noisy machine)
        store.unlink()
        store.mkdir()
        _end_spans(tracer, 5, "kept")
        assert processor.force_flush(10_000) is True
        _, resumed = _store_warnings(caplog, store)
        assert len(resumed) == 1 and "200 spans were dropped" in resumed[0]
    provider.shutdown()
    names = Store(store).sql("select name from spans order by name").column("name").to_pylist()
    assert names == [f"chat kept-{i}" for i in range(5)]
    assert processor.stats["store_error"] is None


def test_a_deleted_store_is_not_recreated_and_capture_resumes_once_it_is(tmp_path, caplog):
    store = tmp_path / "mount" / "store"
    processor = ReplayProcessor(store, flush_interval_s=0.02)
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")
    _end_spans(tracer, 10, "before")
    assert processor.force_flush(10_000) is True
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        shutil.rmtree(store)  # deleted, or an unmounted volume: writing elsewhere would fill the wrong disk
        _end_spans(tracer, 100, "during", pause_every=25)
        assert processor.force_flush(10_000) is False
        assert not store.exists()
        failures, _ = _store_warnings(caplog, store)
        assert len(failures) == 1 and "store directory missing" in failures[0] and "recreate it" in failures[0]
        store.mkdir()
        _end_spans(tracer, 10, "after")
        assert processor.force_flush(10_000) is True
    provider.shutdown()
    names = Store(store).sql("select name from spans").column("name").to_pylist()
    assert sorted(names) == sorted(f"chat after-{i}" for i in range(10))
    assert processor.stats["lost_store_unwritable"] == 100


def test_payloads_of_a_lost_batch_are_stored_again_once_the_store_is_back(tmp_path):
    store = tmp_path / "store"
    store.write_text("not yet a directory\n")
    processor = ReplayProcessor(store, flush_interval_s=60)
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")
    attributes = chat_attributes("the same question", "the same answer")
    with tracer.start_as_current_span("chat lost", attributes=attributes):
        pass
    assert processor.force_flush(10_000) is False
    store.unlink()
    store.mkdir()
    with tracer.start_as_current_span("chat kept", attributes=attributes) as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
    assert processor.force_flush(10_000) is True
    provider.shutdown()
    (step,) = Store(store).trajectory(trace_id).steps
    # the lost batch had marked these messages as stored; they must not point at nothing now
    assert step.inputs and step.inputs[0]["parts"][0]["content"] == "the same question"
    assert step.outputs and step.outputs[0]["parts"][0]["content"] == "the same answer"


def test_byte_accounting_is_honest_for_large_non_ascii_and_event_payloads(tmp_path):
    processor = ReplayProcessor(tmp_path, flush_interval_s=3600)  # the writer stays idle: all stays queued
    tracer = provider_with(processor).get_tracer("t")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(8):
        # OpenInference keeps payloads under indexed keys; CJK text takes 2 bytes a character in memory
        with tracer.start_as_current_span("llm", attributes={
                "openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user",
                "llm.input_messages.0.message.content": f"{i}" + "中" * 60_000}):
            pass
        # older GenAI conventions carry content in span events
        with tracer.start_as_current_span("chat", attributes={"gen_ai.system": "openai"}) as span:
            span.add_event("gen_ai.content.prompt", {"gen_ai.prompt": f"{i}" + "x" * 80_000})
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    estimate = processor.stats["queued_bytes"]
    assert processor.stats["queued"] == 16
    assert held * 0.9 <= estimate <= held * 1.5, (held, estimate)  # never under, not wildly over
    processor.shutdown()


def test_force_flush_ends_under_a_flood_that_never_lets_the_queue_empty(tmp_path):
    processor = ReplayProcessor(tmp_path, max_queue_spans=1_000, flush_interval_s=0.2)
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            with tracer.start_as_current_span("chat flood", attributes=chat_attributes("flood")):
                pass

    thread = threading.Thread(target=flood)
    thread.start()
    try:
        time.sleep(0.5)
        before = processor.stats
        started = time.monotonic()
        assert processor.force_flush(20_000) is True  # covers what was queued when it began
        assert time.monotonic() - started < 15
        assert processor.stats["written_spans"] >= before["written_spans"] + before["queued"]
        assert processor.dropped > 0  # the flood really overflowed the queue meanwhile
    finally:
        stop.set()
        thread.join()
    processor.shutdown()


def test_bytes_the_writer_took_stay_held_until_it_releases_them():
    queue = SpanQueue(max_items=100, max_bytes=4000)
    assert queue.max_bytes == 1000  # a cap this small leaves the queue a quarter of it
    assert queue.offer("a", 600) and not queue.offer("b", 600)  # over the cap: refused and counted
    assert [item for item, _ in queue.take(10)] == ["a"]
    assert queue.queued_bytes == 600 and not queue.offer("c", 600)  # taken, not yet written: still held
    queue.release(600)
    assert queue.queued_bytes == 0 and queue.offer("d", 600)
    assert queue.dropped == 2
    assert [size for _, size in queue.take(10, max_bytes=1)] == [600]  # a byte budget still takes one


def test_disk_full_in_a_running_service(tmp_path):
    """A real full filesystem (a private tmpfs) where user namespaces work, else RLIMIT_FSIZE."""
    result = run_fault_scenario("disk_full", fault_s=0.4)
    _assert_survived(result)


@pytest.mark.slow
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "disk_full"])
def test_every_store_failure_in_a_running_service(kind):
    """Read-only (tmpfs remounted ro, or chmod as an unprivileged user), permission denied (chmod;
    a root test process drops to `nobody` first, since chmod does not deny root), deleted, not a directory."""
    result = run_fault_scenario(kind, fault_s=1.5)
    _assert_survived(result)
    if result["mechanism"] == "chmod":
        assert result["euid"] != 0  # really denied, not skipped because root ignores modes


def _assert_survived(result: dict) -> None:
    context = json.dumps(result, indent=1)
    assert result["exceptions"] == [] and result["internal_errors"] == 0, context
    assert result["max_end_ms"] < 500, context
    assert result["flushed_before"] and not result["flushed_during"] and result["flushed_after"], context
    assert result["during"] > 0 and result["lost"] == result["during"], context  # every one counted
    assert result["dropped_queue_full"] == 0, context
    (warning,) = result["failure_warnings"]
    assert result["store"] in warning and result["store_error"].split(":")[0] in warning, context
    assert len(result["resume_warnings"]) == 1 and result["other_warnings"] == [], context
    assert result["visible"]["during"] == 0 and result["visible"]["after"] == 50, context
    if result["kind"] not in ("deleted", "not_a_directory"):
        assert result["visible"]["before"] == 50, context


@pytest.mark.slow
def test_memory_stays_bounded_under_ten_times_overload_for_a_minute(tmp_path):
    """The cap bounds resident memory: RSS sampled every 50 ms through 60 s of a 10x overload never
    grows more than the cap (64 MB) over its level just before the overload (after a warm-up)."""
    cap = 64 * MB
    result = run_overload(tmp_path / "store", seconds=60, cap_bytes=cap, payload_bytes=131_072, factor=10)
    context = json.dumps(result, indent=1)
    assert result["exceptions"] == [] and result["internal_errors"] == 0, context
    assert result["offered_spans_per_s"] >= 8 * result["writer_spans_per_s"], context  # really overloaded:
    assert result["offered_spans_per_s"] >= 10 * result["accepted_spans_per_s"], context  # both ways
    assert result["dropped"] > result["accepted"] > 0, context
    assert result["dropped"] + result["accepted"] == result["offered"], context
    assert result["written"] == result["accepted"], context  # nothing accepted was lost
    assert result["peak_held_bytes"] <= result["queue_bytes"] <= cap - result["reserved_bytes"], context
    assert result["rss_growth"] <= cap, context  # everything: queue, the batch being written, every cache
    timeline = result["rss_growth_timeline"]
    assert timeline[-1] - timeline[0] <= 32 * MB, context  # and flat over time
    assert result["max_end_ms"] < 2000, context
