"""The hot path reads the SDK's span fields only where a check on a real span says they are what
they were; with the public surfaces instead, capture keeps and drops exactly the same spans."""

from __future__ import annotations

import pytest

import otel_replay.capture.processor as processor_module
from otel_replay import ReplayProcessor, Store
from tests.helpers import chat_attributes, provider_with


def test_the_installed_sdk_passes_the_layout_check():
    assert processor_module.sdk_layout_ok() is True and processor_module.PRIVATE_LAYOUT is True


def _capture(root) -> list[tuple[str, int]]:
    processor = ReplayProcessor(root, flush_interval_s=60)
    tracer = provider_with(processor).get_tracer("t")
    with tracer.start_as_current_span("POST /chat"):
        with tracer.start_as_current_span("db query"):  # a local non-GenAI child: never kept
            pass
        with tracer.start_as_current_span("chat m", attributes=chat_attributes("q", "a")) as span:
            span.add_event("gen_ai.user.message", {"content": "hello"})
    with tracer.start_as_current_span("GET /health"):
        pass
    processor.shutdown()
    rows = Store(root).sql("select name, len(events) n from spans order by name").to_pylist()
    return [(r["name"], r["n"]) for r in rows]


@pytest.mark.parametrize("private", [True, False])
def test_both_paths_keep_the_same_spans(tmp_path, monkeypatch, private):
    monkeypatch.setattr(processor_module, "PRIVATE_LAYOUT", private)
    kept = _capture(tmp_path / "store")
    assert [name for name, _ in kept] == ["POST /chat", "chat m"]
    assert dict(kept)["chat m"] > 2  # the event travelled with its span
