"""The capture writer thread dies (an exception raised into it from outside): capture goes on, and
`shutdown` writes what was accepted or says what it did not."""

from __future__ import annotations

import ctypes
import logging
import time

from otel_replay import ReplayProcessor, Store
from tests.helpers import chat_attributes, provider_with


def _kill_thread(thread, exc: type[BaseException] = SystemExit) -> None:
    """Raise `exc` inside `thread` (the way a debugger or a faulty library can) and wait for it to die."""
    assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc)) == 1
    thread.join(10)
    assert not thread.is_alive()


def _steps(root) -> int:
    return Store(root).sql("select count(*) n from steps").column("n")[0].as_py()


def _end_spans(tracer, n: int, tag: str) -> None:
    for i in range(n):
        with tracer.start_as_current_span("chat m", attributes=chat_attributes(f"{tag}{i}", f"a{i}")):
            pass


def _dead_writer(tmp_path, **options) -> tuple[ReplayProcessor, object]:
    processor = ReplayProcessor(tmp_path, flush_interval_s=0.05, **options)
    provider = provider_with(processor)
    dead = processor._writer.thread
    # the loop catches everything raised inside its work; an exception that lands while it waits
    # between flushes still ends the thread
    while not dead.is_alive():
        time.sleep(0.01)
    _kill_thread(dead)
    assert processor._writer.died == "SystemExit"
    return processor, provider


def test_shutdown_writes_what_was_accepted_after_the_writer_thread_died(tmp_path, caplog):
    processor, provider = _dead_writer(tmp_path)
    _end_spans(provider.get_tracer("t"), 1000, "q")
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        provider.shutdown()
    assert _steps(tmp_path) == 1000  # before: shutdown returned at once, nothing written
    assert processor.stats["writer_restarts"] == 1
    assert any("writer thread died (SystemExit)" in r.getMessage() for r in caplog.records)


def test_force_flush_revives_a_dead_writer(tmp_path):
    processor, provider = _dead_writer(tmp_path)
    _end_spans(provider.get_tracer("t"), 50, "f")
    assert processor.force_flush(10_000) is True
    assert _steps(tmp_path) == 50
    provider.shutdown()


def test_a_full_queue_revives_a_dead_writer_without_any_flush_call(tmp_path):
    processor, provider = _dead_writer(tmp_path, max_queue_spans=200)
    tracer = provider.get_tracer("t")
    _end_spans(tracer, 400, "s")  # the queue fills; the hot path sees the writer gone and starts one
    deadline = time.monotonic() + 20
    while processor.stats["written_spans"] < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processor.stats["writer_restarts"] == 1 and processor.stats["written_spans"] >= 200
    provider.shutdown()


def test_shutdown_says_what_it_left_unwritten(tmp_path, caplog):
    processor = ReplayProcessor(tmp_path / "store", flush_interval_s=60)
    provider = provider_with(processor)
    _end_spans(provider.get_tracer("t"), 2000, "t")
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        processor.shutdown(timeout_millis=0)  # no time to write anything
    warned = [r.getMessage() for r in caplog.records if "accepted spans not written" in r.getMessage()]
    processor._writer.thread.join(30)
    written = _steps(tmp_path / "store") if (tmp_path / "store").exists() else 0
    assert warned or written == 2000  # either it said so, or it (improbably) wrote all 2000 in 0 ms
    if warned:
        assert "shutdown ended after 0 ms with" in warned[0]
