"""The capture floor (benchmarks/capture_floor.py) stores what the capture writer stores.

The floor bounds the writer's CPU only if it does the same storing: the same message bodies under
the same content addresses, the same span and step rows (all but the time they were stored), in
segments the store reads. Timings are never asserted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.capture_floor import STAGES, _floor
from benchmarks.spans import SeededText, SyntheticSpans
from otel_replay.capture import ReplayProcessor
from otel_replay.store.catalog import Catalog

STEPS = "SELECT * EXCLUDE (ingested_ns) FROM steps ORDER BY span_id"
SPANS = "SELECT * EXCLUDE (ingested_ns) FROM spans ORDER BY span_id"
MESSAGES = "SELECT hash, kind, role, body FROM messages ORDER BY hash"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Catalog, Catalog, dict[str, int]]:
    spans = SyntheticSpans(SeededText(seed=11, corpus_bytes=1 << 16)).chat_spans(40, 4096, distinct=True)
    root = tmp_path_factory.mktemp("floor")
    spent = _floor(spans, root / "floor", clock=iter(range(0, 10**9, 7)).__next__)
    processor = ReplayProcessor(root / "writer")
    for span in spans:
        processor.on_end(span)
    assert processor.force_flush(60_000)
    processor.shutdown()
    return Catalog(root / "floor"), Catalog(root / "writer"), spent


def test_the_floor_stores_the_writers_messages_and_steps(stores: tuple[Catalog, Catalog, dict[str, int]]) -> None:
    floor, writer, _ = stores
    messages = writer.sql(MESSAGES).to_pylist()
    assert len(messages) >= 40 * 3  # every span's messages are distinct
    assert floor.sql(MESSAGES).to_pylist() == messages
    assert floor.sql(STEPS).to_pylist() == writer.sql(STEPS).to_pylist()
    assert floor.sql(SPANS).to_pylist() == writer.sql(SPANS).to_pylist()


def test_every_stage_is_timed_when_a_clock_is_given(stores: tuple[Catalog, Catalog, dict[str, int]]) -> None:
    *_, spent = stores
    assert set(spent) == set(STAGES)
    assert all(ns > 0 for ns in spent.values()), spent


def test_a_span_holding_a_secret_is_refused(tmp_path: Path) -> None:
    synthetic = SyntheticSpans(SeededText(seed=3, corpus_bytes=1 << 14))
    clean = synthetic.chat_spans(1, 1024, distinct=True)
    synthetic.tracer.start_span("chat gpt-4o", attributes={
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]',
        "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "text", "content": "mail jo@example.com"}]}]',
    }).end()
    spans = clean + synthetic.collector.take()
    with pytest.raises(RuntimeError, match="nothing to redact"):
        _floor(spans, tmp_path / "store")
