"""ReplayProcessor's contracts: bounded, never blocking, never raising, nothing accepted lost."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from otel_replay import ReplayProcessor, Store
from otel_replay.cli import main as cli
from tests.helpers import REPO, chat_attributes, provider_with


@pytest.mark.parametrize("yield_gil", [True, False])  # False: a receiver worker's writer, never pausing
def test_shutdown_writes_everything_accepted(tmp_path, yield_gil):
    processor = ReplayProcessor(tmp_path, flush_interval_s=60, yield_gil=yield_gil)  # only shutdown will write
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")
    for i in range(300):
        with tracer.start_as_current_span("chat m", attributes=chat_attributes(f"q{i}", f"a{i}")):
            pass
    provider.shutdown()
    assert processor.stats["accepted"] == 300 and processor.dropped == 0
    assert Store(tmp_path).sql("select count(*) n from steps").column("n")[0].as_py() == 300


def test_force_flush_makes_spans_visible_and_honours_its_timeout(tmp_path):
    processor = ReplayProcessor(tmp_path, flush_interval_s=60)
    tracer = provider_with(processor).get_tracer("t")
    with tracer.start_as_current_span("chat m", attributes=chat_attributes()):
        pass
    assert processor.force_flush(10_000) is True
    assert Store(tmp_path).sql("select count(*) n from steps").column("n")[0].as_py() == 1
    started = time.monotonic()
    processor.force_flush(0)  # must return at once whatever the writer is doing
    assert time.monotonic() - started < 1.0
    processor.shutdown()


def test_ignores_non_genai_spans_and_keeps_the_root_of_genai_traces(tmp_path):
    processor = ReplayProcessor(tmp_path)
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("GET /health"):  # a root with no GenAI below: not kept
        with tracer.start_as_current_span("db query"):
            pass
    with tracer.start_as_current_span("POST /chat"):  # kept: its trace has a model call
        with tracer.start_as_current_span("db query"):  # never kept
            pass
        with tracer.start_as_current_span("chat m", attributes=chat_attributes()):
            pass
    provider.shutdown()
    names = sorted(Store(tmp_path).sql("select name from spans").column("name").to_pylist())
    assert names == ["POST /chat", "chat m"]
    (row,) = Store(tmp_path).list_traces().to_pylist()
    assert row["root_name"] == "POST /chat" and row["llm_steps"] == 1


def test_overload_never_blocks_the_service_and_drops_are_counted_and_shown(tmp_path):
    processor = ReplayProcessor(tmp_path, max_queue_spans=200, flush_interval_s=0.05)
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")
    big = chat_attributes("x" * 20_000)
    slowest = 0.0
    for _ in range(5_000):
        span = tracer.start_span("chat m", attributes=big)
        started = time.perf_counter()
        span.end()  # runs on_end on this thread
        slowest = max(slowest, time.perf_counter() - started)
    provider.shutdown()
    stats = processor.stats
    assert processor.dropped > 0
    assert stats["accepted"] + processor.dropped == 5_000
    assert stats["written_spans"] == stats["accepted"]
    # the writer never held this thread: no single end() waited for a flush (generous bound for noisy CI)
    assert slowest < 0.5
    out = CliRunner().invoke(cli, ["--store", str(tmp_path), "status"])
    assert out.exit_code == 0 and f"dropped (queue full) {processor.dropped}" in out.output
    warn = CliRunner().invoke(cli, ["--store", str(tmp_path), "traces", "--limit", "1"])
    assert f"capture dropped {processor.dropped} spans" in warn.output


def test_byte_cap_bounds_the_queue(tmp_path):
    processor = ReplayProcessor(tmp_path, max_queue_bytes=100_000, flush_interval_s=60)
    tracer = provider_with(processor).get_tracer("t")
    for _ in range(50):
        with tracer.start_as_current_span("chat m", attributes=chat_attributes("y" * 30_000)):
            pass
    assert processor.stats["queued_bytes"] <= 100_000
    assert processor.dropped > 0
    processor.shutdown()


class _Hostile:
    """Not a span at all: whatever on_end is given, nothing may reach the caller."""

    def __getattr__(self, name):
        raise RuntimeError(f"boom on {name}")


def test_nothing_raised_inside_reaches_the_service(tmp_path):
    processor = ReplayProcessor(tmp_path)
    processor.on_end(_Hostile())
    processor.on_end(None)
    assert processor.internal_errors == 2
    processor.shutdown()
    processor.on_end(None)  # after shutdown: ignored, no error
    assert processor.force_flush(100) is True


def test_bad_payloads_are_stored_or_skipped_with_a_reason(tmp_path, caplog):
    processor = ReplayProcessor(tmp_path)
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("chat bad-json", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
            "gen_ai.input.messages": '[{"role": "user", "parts": [', "gen_ai.output.messages": "not json"}):
        pass
    with tracer.start_as_current_span("chat huge", attributes=chat_attributes("z" * 5_000_000)):
        pass
    with tracer.start_as_current_span("chat surrogate", attributes=chat_attributes("bad \ud800 text", "ok \udfff")):
        pass
    with tracer.start_as_current_span("chat wrong-types", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps({"role": 3, "parts": "nope"}),
            "gen_ai.usage.input_tokens": "many"}):
        pass
    provider.shutdown()
    rows = {r["span_id"]: r for r in Store(tmp_path).sql("select * from steps").to_pylist()}
    spans = {r["name"]: r["span_id"] for r in Store(tmp_path).sql("select name, span_id from spans").to_pylist()}
    assert len(rows) == 4  # every span became a step; none was lost
    assert rows[spans["chat bad-json"]]["observation_only"] is True
    assert processor.stats["skipped"].get("payload truncated (genai)") == 1  # bad-json: its input stops mid-list
    assert processor.stats["skipped"].get("unreadable payload (genai)") == 1  # wrong-types
    assert rows[spans["chat huge"]]["has_payload"] is True
    steps = Store(tmp_path).sql("select input_hashes from steps where span_id = ?", [spans["chat surrogate"]])
    assert len(steps.column("input_hashes")[0].as_py()) == 1
    assert rows[spans["chat wrong-types"]]["input_tokens"] is None
    assert rows[spans["chat wrong-types"]]["observation_only"] is True  # parts must be a list


def test_many_threads_produce_at_once(tmp_path):
    processor = ReplayProcessor(tmp_path, flush_interval_s=0.05)
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")

    def produce(k: int) -> None:
        for i in range(250):
            with tracer.start_as_current_span("chat m", attributes=chat_attributes(f"{k}-{i}")):
                pass

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    provider.shutdown()
    assert processor.dropped == 0
    assert Store(tmp_path).sql("select count(*) n from steps").column("n")[0].as_py() == 2000


def test_two_processes_share_one_store(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-m", "tests.agents.burst", str(tmp_path), "400", tag], cwd=REPO)
             for tag in ("a", "b")]
    for p in procs:
        assert p.wait(timeout=120) == 0
    store = Store(tmp_path)
    rows = store.sql("select service_name, count(*) n from traces group by 1 order by 1").to_pylist()
    assert rows == [{"service_name": "burst-a", "n": 400}, {"service_name": "burst-b", "n": 400}]
    assert store.sql("select count(*) n from steps where kind = 'llm'").column("n")[0].as_py() == 800
    segment_names = [p.name for p in (tmp_path / "step_rows").glob("*/*.parquet")]
    assert len(set(segment_names)) == len(segment_names) and not list(tmp_path.glob("*/*/.*.tmp"))


def test_invalid_configuration_fails_at_construction(tmp_path):
    import pytest

    with pytest.raises(ValueError):
        ReplayProcessor(tmp_path, max_queue_spans=0)
    with pytest.raises(ValueError):
        ReplayProcessor(tmp_path, flush_interval_s=0)


def test_a_forked_child_gets_its_own_writer(tmp_path):
    import os

    processor = ReplayProcessor(tmp_path, flush_interval_s=0.05)
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")
    pid = os.fork()
    if pid == 0:  # child: the inherited writer thread is gone; the fork hook must have started a new one
        code = 1
        try:
            with tracer.start_as_current_span("chat child", attributes=chat_attributes("from the child")):
                pass
            code = 0 if processor.force_flush(10_000) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with tracer.start_as_current_span("chat parent", attributes=chat_attributes("from the parent")):
        pass
    provider.shutdown()
    names = sorted(Store(tmp_path).sql("select name from spans").column("name").to_pylist())
    assert names == ["chat child", "chat parent"]


def test_ids_of_the_wrong_shape_name_the_field():
    import pytest

    from otel_replay.normalize.sources.ids import BadId, hex_id

    assert hex_id("AAECAwQFBgcICQoLDA0ODw==", 32, "traceId") == "000102030405060708090a0b0c0d0e0f"  # base64
    for bad in ("xyz", "00" * 16, 12.5, "abc123"):
        with pytest.raises(BadId, match="traceId"):
            hex_id(bad, 32, "traceId")


def test_records_handed_over_at_once_are_worked_on_at_once(tmp_path):
    """The receiver's path (`accept_records`): a request's records wake the writer, which then writes
    them when `flush_rows` are waiting, without waiting for 2,000 queued or the flush interval."""
    from otel_replay.normalize.records import SpanRecord

    processor = ReplayProcessor(tmp_path, flush_interval_s=3600, flush_rows=10)
    now = time.time_ns()
    spans = [SpanRecord(trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", parent_span_id=None, name="chat m",
                        start_ns=now, end_ns=now + 1000, attributes=chat_attributes(f"question {i}"),
                        resource={"service.name": "svc"}) for i in range(10)]
    assert processor.accept_records(spans) == 0
    deadline = time.monotonic() + 30
    while processor.stats["written_spans"] < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert processor.stats["written_spans"] == 10  # no force_flush: the writer was woken by the hand-over
    assert Store(tmp_path).sql("select count(*) as n from steps").to_pylist() == [{"n": 10}]
    processor.shutdown()
