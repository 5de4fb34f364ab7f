"""Capture's warnings name what is wrong with a span's content, and the fix for that cause."""

from __future__ import annotations

import json
import logging

from opentelemetry.sdk.trace import SpanLimits, TracerProvider

from otel_replay import ReplayProcessor
from tests.helpers import chat_attributes

OUTPUT = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "a long answer " * 40}],
                      "finish_reason": "stop"}])


def _capture(tmp_path, caplog, spans: list[tuple[str, dict]], limits: SpanLimits | None = None) -> list[str]:
    processor = ReplayProcessor(tmp_path, flush_interval_s=0.05)
    provider = TracerProvider(span_limits=limits) if limits else TracerProvider()
    provider.add_span_processor(processor)
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        for scope, attributes in spans:
            provider.get_tracer(scope).start_span("chat m", attributes=attributes).end()
        provider.shutdown()
    return [r.getMessage() for r in caplog.records if r.name == "otel_replay"]


def test_malformed_json_is_named_as_such_not_as_content_capture_off(tmp_path, caplog):
    said = _capture(tmp_path, caplog, [("opentelemetry.instrumentation.openai_v2",
                                        {**chat_attributes(), "gen_ai.output.messages": OUTPUT.replace('"parts"', "parts")})])
    assert len(said) == 1, said
    assert "payload malformed" in said[0] and "gen_ai.output.messages is not valid JSON" in said[0]
    assert "CAPTURE_MESSAGE_CONTENT" not in said[0] and "without message content" not in said[0]


def test_a_value_cut_by_the_sdks_length_limit_names_the_limit(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "200")  # read by the SDK's SpanLimits, as in a service
    said = _capture(tmp_path, caplog, [("opentelemetry.instrumentation.openai_v2",
                                        {**chat_attributes(), "gen_ai.output.messages": OUTPUT})], SpanLimits())
    assert len(said) == 1, said
    assert "payload truncated" in said[0] and "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT=200" in said[0], said


def test_a_cut_value_without_a_known_limit_still_says_truncated(tmp_path, caplog):
    said = _capture(tmp_path, caplog, [("openinference.instrumentation.openai",
                                        {**chat_attributes(), "gen_ai.output.messages": OUTPUT[:150]})])
    assert len(said) == 1 and "payload truncated" in said[0] and "ends mid-JSON after 150 characters" in said[0], said


def test_content_absent_names_the_setting_of_that_instrumentation(tmp_path, caplog):
    bare = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}
    said = _capture(tmp_path, caplog, [("opentelemetry.instrumentation.openai_v2", bare),
                                       ("opentelemetry.instrumentation.openai_v2", bare),
                                       ("opentelemetry.instrumentation.anthropic", bare)])
    assert len(said) == 2, said  # once per instrumentation scope
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in said[0] and "TRACELOOP_TRACE_CONTENT" in said[1]


def test_each_cause_is_said_once_per_instrumentation(tmp_path, caplog):
    bad = {**chat_attributes(), "gen_ai.output.messages": "not json"}
    said = _capture(tmp_path, caplog, [("a", bad), ("a", bad), ("b", bad)])
    assert len(said) == 2 and "from a:" in said[0] and "from b:" in said[1], said


def test_what_is_counted_in_the_store_holds_no_span_text(tmp_path, caplog):
    from otel_replay import Store

    secret_scope = "acme.sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX"  # anything may be in a scope name
    _capture(tmp_path, caplog, [(secret_scope, {**chat_attributes(), "gen_ai.output.messages": "not json"})])
    reasons = Store(tmp_path).sql("select skip_reasons from capture_stats").column("skip_reasons").to_pylist()
    assert reasons and all("sk-proj" not in r for r in reasons) and any("payload malformed (genai)" in r for r in reasons)
