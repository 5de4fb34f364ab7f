"""The byte cap bounds everything capture holds: the queue admits its share of the cap, and writing a
batch and every cache the writer keeps are reserved inside it, each cache within its share however
much traffic passes. (Resident memory under a 60 s 10x overload: test_reliability_capture.py.)"""

from __future__ import annotations

import logging
import time

from otel_replay import ReplayProcessor, Store
from otel_replay.capture.sizing import MESSAGE_MEMO_BYTES, REDACTOR_MEMO_BYTES, MemoryBudget
from otel_replay.normalize.records import LogEvent, SpanRecord
from tests.helpers import chat_attributes, provider_with

MB = 1024 * 1024


def test_the_cap_is_split_between_the_queue_writing_and_the_caches():
    for cap in (64 * MB, 128 * MB, 256 * MB, 4096 * MB):
        budget = MemoryBudget.of(cap)
        assert budget.bounded and budget.queue_bytes + budget.reserved_bytes == cap
        assert budget.write_bytes == 3 * budget.flush_bytes and budget.queue_bytes >= cap // 4
        assert budget.cache_bytes <= REDACTOR_MEMO_BYTES + MESSAGE_MEMO_BYTES + 4 * 8 * MB
    small = MemoryBudget.of(16 * MB)  # the reserve does not fit: the queue keeps a quarter, the bound is lost
    assert not small.bounded and small.queue_bytes == 4 * MB


def test_the_reserve_covers_the_memos_of_normalize_and_redaction():
    from otel_replay.normalize import messages, redact

    # fixed there, reserved here: a change to either must change the budget too
    assert REDACTOR_MEMO_BYTES >= redact._MEMO_MAX_BYTES  # noqa: SLF001
    assert MESSAGE_MEMO_BYTES >= messages._MEMO_MAX_BYTES + messages.SEEN_BYTES  # noqa: SLF001


def test_the_message_memo_counts_its_entries_not_only_their_text():
    """Tiny messages: what each memo entry holds is mostly objects, not text; the bound counts them."""
    import tracemalloc

    from otel_replay.normalize import messages

    many = [{"role": "user", "parts": [{"type": "text", "content": f"ok {i}"}]} for i in range(15_000)]
    messages._MEMO.clear()  # noqa: SLF001
    messages._SHARED.clear()  # noqa: SLF001
    messages._memo_bytes = 0  # noqa: SLF001
    messages.canonical_messages(many)  # seen once: remembered by hash only
    assert len(messages._SEEN) <= messages._SEEN_MAX  # noqa: SLF001
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        messages.canonical_messages(many)
        messages.canonical_messages(many)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0 < len(messages._MEMO) < 15_000  # noqa: SLF001 - emptied when full, by bytes
    assert held <= messages._MEMO_MAX_BYTES  # noqa: SLF001


def test_the_queue_admits_only_its_share_of_the_cap(tmp_path):
    cap = 64 * MB
    processor = ReplayProcessor(tmp_path, max_queue_bytes=cap, flush_interval_s=3600)  # the writer stays idle
    tracer = provider_with(processor).get_tracer("t")
    for i in range(1500):  # 1500 x 32 KB = 48 MB offered, under the cap but over the queue's share
        tracer.start_span("chat m", attributes=chat_attributes(f"{i} " + "q" * 32_768)).end()
    share = MemoryBudget.of(cap).queue_bytes
    assert share - 40_000 < processor.stats["queued_bytes"] <= share  # filled to its share (a span is ~33 KB), no further
    assert processor.dropped > 0 and processor.stats["queued"] + processor.dropped == 1500
    processor.shutdown()


def _records(count: int, start: int) -> tuple[list[SpanRecord], list[LogEvent]]:
    """One GenAI span per trace (a distinct prompt each), and a content log event whose span never comes."""
    now = time.time_ns()
    spans = [SpanRecord(trace_id=f"{i:032x}", span_id=f"{i:016x}", parent_span_id=None, name="chat m",
                        start_ns=now, end_ns=now + 1000, attributes=chat_attributes(f"question {i}"),
                        resource={"service.name": "svc"}) for i in range(start, start + count)]
    logs = [LogEvent(event_name="gen_ai.user.message", trace_id=f"{i + 10**9:032x}", span_id=f"{i + 10**9:016x}",
                     time_ns=now, body={"content": f"{i} " + "l" * 4000}) for i in range(start, start + count)]
    return spans, logs


def test_every_cache_the_writer_keeps_stays_within_its_share(tmp_path):
    cap = 16 * MB  # small shares (512 KB each), so a few thousand records overflow every cache
    processor = ReplayProcessor(tmp_path, max_queue_bytes=cap, flush_interval_s=0.05)
    writer, budget = processor._writer, processor._queue.budget  # noqa: SLF001
    total = 6000
    sent = 0
    deadline = time.monotonic() + 120
    while sent < total and time.monotonic() < deadline:
        spans, logs = _records(200, sent)
        if processor.accept_records(spans, logs) == 0:
            sent += 200
        else:
            time.sleep(0.02)  # the queue is full: retry, as the receiver's sender would
    assert sent == total
    assert processor.force_flush(120_000)
    builder = writer._builder  # noqa: SLF001
    assert 0 < len(writer._genai_traces) <= budget.recent_traces < total  # noqa: SLF001
    assert 0 < len(builder._known) <= budget.known_hashes < total  # noqa: SLF001
    assert builder._identity_bytes <= budget.identity_bytes  # noqa: SLF001
    assert 0 < writer._pending_log_bytes <= budget.pending_log_bytes  # noqa: SLF001
    assert processor.stats["skipped"]["log event without its span"] > 0
    assert processor.stats["written_spans"] == total  # bounded caches lose nothing that was accepted
    processor.shutdown()
    assert Store(tmp_path).sql("select count(*) as n from steps").column("n")[0].as_py() == total


def test_a_problem_on_many_spans_is_said_once_and_counted(tmp_path, caplog):
    processor = ReplayProcessor(tmp_path, flush_interval_s=0.05)
    tracer = provider_with(processor).get_tracer("t")
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        for i in range(50):
            tracer.start_span("chat m", attributes={**chat_attributes(), "gen_ai.input.messages": f"not json {i}"}).end()
        processor.force_flush(30_000)
    said = [r.getMessage() for r in caplog.records if "payload malformed" in r.getMessage()]
    assert len(said) == 1 and "the rest are counted" in said[0]
    assert processor.stats["skipped"]["payload malformed (genai)"] == 50
    processor.shutdown()


def test_the_redactor_keeps_no_more_text_alive_than_its_share():
    """Messages proven clean are remembered (an agent loop resends them): distinct large messages
    must not pile up in that memo beyond the bytes the capture budget reserves for it."""
    from otel_replay.normalize.pipeline import normalize_span
    from otel_replay.normalize.privacy import Privacy

    privacy = Privacy()
    body = "x" * 131_072
    for i in range(400):  # 400 distinct 128 KB messages: 52 MB of text offered
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                      "gen_ai.input.messages": f'[{{"role": "user", "parts": [{{"type": "text", "content": "{i} {body}"}}]}}]',
                      "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "text", "content": "ok"}]}]'}
        item = privacy(normalize_span(SpanRecord(f"{i:032x}", f"{i + 1:016x}", None, "chat", attributes=attributes), ()))
        assert item.step is not None and item.step.redacted == []
    redactor = privacy.redactor
    kept = {id(m): m for m in redactor._clean.values()} | {id(m): m for m, _, _ in redactor._memo.values()}
    text = sum(len(p.get("content", "")) for m in kept.values() for p in m.get("parts", []))
    assert text <= REDACTOR_MEMO_BYTES, (len(kept), text)
