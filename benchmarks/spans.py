"""Synthetic GenAI spans for the capture and receiver benchmarks: real SDK spans, seeded text.

Text follows a Zipf-like word distribution so compression sees something like prose; every span
is ended through a real `TracerProvider`.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Tracer

from otel_replay.normalize.content import PAYLOAD_ATTRIBUTES

TURNS = 20  # turns of the agent loop `SyntheticSpans.agent_run` records


class NoopExporter(SpanExporter):
    """The baseline's exporter: accepts every batch and does nothing."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class SpanCollector(SpanProcessor):
    """Keeps the ended spans the provider hands to its processors."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)

    def take(self) -> list[ReadableSpan]:
        spans, self.spans = self.spans, []
        return spans


class SeededText:
    """Seeded text with a Zipf-like word distribution, so zstd sees something like prose."""

    def __init__(self, seed: int, corpus_bytes: int) -> None:
        self.rng = random.Random(seed)
        syllables = [a + b for a in "bcdfghklmnprstvw" for b in "aeiou"] + ["th", "st", "er", "an", "ing"]
        self._words = ["".join(self.rng.choices(syllables, k=self.rng.randint(1, 4))) for _ in range(4000)]
        self._cum = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(self._words))))
        self._corpus = self.words(corpus_bytes)

    def words(self, nbytes: int) -> str:
        """Fresh text of about `nbytes` (slow: for the storage part and shared prompts)."""
        picked = self.rng.choices(self._words, cum_weights=self._cum, k=nbytes // 5 + 2)
        return " ".join(picked)[:nbytes]

    def snippet(self, nbytes: int, tag: str) -> str:
        """Distinct text of about `nbytes`, cut from the corpus (fast: for large span pools)."""
        start = self.rng.randrange(max(len(self._corpus) - nbytes, 1))
        return f"{tag} {self._corpus[start:start + nbytes]}"


class SyntheticSpans:
    """Real SDK spans, ended through a `TracerProvider` whose processors collect them."""

    def __init__(self, text: SeededText, processors: Sequence[SpanProcessor] = ()) -> None:
        self.text = text
        self.collector = SpanCollector()
        self.provider = TracerProvider(resource=Resource.create({"service.name": "bench-agent"}))
        for processor in processors:
            self.provider.add_span_processor(processor)
        self.provider.add_span_processor(self.collector)
        self.tracer: Tracer = self.provider.get_tracer("otel_replay.bench")
        self._system = {"role": "system", "parts": [{"type": "text", "content": text.words(1000)}]}

    def chat_payload(self, nbytes: int, tag: str) -> tuple[str, str]:
        """`gen_ai.input.messages` and `gen_ai.output.messages` of about `nbytes` together."""
        scale = max(nbytes - 1200, 400) / 2800
        call = f"call_{tag}"
        inputs = [
            self._system,
            {"role": "user", "parts": [{"type": "text", "content": self.text.snippet(int(800 * scale), tag)}]},
            {"role": "assistant", "parts": [{"type": "tool_call", "id": call, "name": "search_orders",
                                             "arguments": {"query": self.text.snippet(int(200 * scale), tag)}}]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": call,
                                        "response": self.text.snippet(int(1300 * scale), tag)}]},
        ]
        outputs = [{"role": "assistant", "finish_reason": "stop",
                    "parts": [{"type": "text", "content": self.text.snippet(int(500 * scale), tag)}]}]
        return json.dumps(inputs), json.dumps(outputs)

    def chat_spans(self, count: int, payload_bytes: int, *, distinct: bool,
                   per_trace: int | None = None) -> list[ReadableSpan]:
        """Chat spans under invoke_agent roots (one root for all, or one per `per_trace` spans: many
        agent runs, as a service sends them); `distinct` gives each its own payload. Roots not included."""
        shared = self.chat_payload(payload_bytes, "shared")
        per_trace = per_trace or count
        spans: list[ReadableSpan] = []
        for first in range(0, count, per_trace):
            with self.tracer.start_as_current_span(
                "invoke_agent bench", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "bench"}
            ):
                for i in range(first, min(first + per_trace, count)):
                    inputs, outputs = self.chat_payload(payload_bytes, f"s{i}") if distinct else shared
                    self.tracer.start_span("chat gpt-4o", kind=SpanKind.CLIENT, attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.provider.name": "openai",
                        "gen_ai.request.model": "gpt-4o",
                        "gen_ai.response.model": "gpt-4o-2024-08-06",
                        "gen_ai.usage.input_tokens": payload_bytes // 4,
                        "gen_ai.usage.output_tokens": 120,
                        "gen_ai.response.finish_reasons": ("stop",),
                        "gen_ai.input.messages": inputs,
                        "gen_ai.output.messages": outputs,
                    }).end()
            spans += self.collector.take()[:-1]  # the root ends last
        return spans

    def http_spans(self, count: int) -> list[ReadableSpan]:
        """Plain HTTP client spans with 8 attributes, children of a server span: ignored by Replay."""
        with self.tracer.start_as_current_span("GET /orders", kind=SpanKind.SERVER):
            for i in range(count):
                self.tracer.start_span("GET", kind=SpanKind.CLIENT, attributes={
                    "http.request.method": "GET",
                    "url.full": f"https://inventory.internal/items/{i}?expand=stock",
                    "url.scheme": "https",
                    "server.address": "inventory.internal",
                    "server.port": 443,
                    "http.response.status_code": 200,
                    "network.protocol.version": "1.1",
                    "user_agent.original": "python-httpx/0.28.1",
                }).end()
        return self.collector.take()[:-1]

    def agent_run(self, run: int) -> None:
        """One 20-turn agent loop: each turn a chat span resending the history, then a tool span."""
        text, rng = self.text, self.text.rng
        history: list[dict[str, Any]] = [
            self._system, {"role": "user", "parts": [{"type": "text", "content": text.words(rng.randint(300, 600))}]},
        ]
        with self.tracer.start_as_current_span("invoke_agent support_agent", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support_agent",
            "gen_ai.provider.name": "openai", "gen_ai.conversation.id": f"conv-{run}",
        }):
            for turn in range(TURNS):
                call_id, tool = f"call_{run}_{turn}", rng.choice(["search_orders", "get_invoice", "lookup_customer"])
                arguments = {"query": text.words(rng.randint(150, 350)), "limit": 5}
                assistant = {"role": "assistant", "parts": [
                    {"type": "text", "content": text.words(rng.randint(100, 400))},
                    {"type": "tool_call", "id": call_id, "name": tool, "arguments": arguments},
                ]}
                with self.tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT, attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": "gpt-4o", "gen_ai.response.model": "gpt-4o-2024-08-06",
                    "gen_ai.usage.input_tokens": 250 * (turn + 2), "gen_ai.usage.output_tokens": 90,
                    "gen_ai.response.finish_reasons": ("tool_calls",),
                    "gen_ai.input.messages": json.dumps(history),
                    "gen_ai.output.messages": json.dumps([{**assistant, "finish_reason": "tool_calls"}]),
                }):
                    pass
                result = text.words(rng.randint(300, 1500))
                with self.tracer.start_as_current_span(f"execute_tool {tool}", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.id": call_id, "gen_ai.tool.call.arguments": json.dumps(arguments),
                    "gen_ai.tool.call.result": result,
                }):
                    pass
                history.append(assistant)
                history.append({"role": "tool", "parts": [
                    {"type": "tool_call_response", "id": call_id, "response": result},
                ]})


def payload_bytes(spans: Sequence[ReadableSpan]) -> int:
    """UTF-8 bytes of the payload attributes (messages, tool arguments and results)."""
    total = 0
    for span in spans:
        for key, value in (span.attributes or {}).items():
            if key in PAYLOAD_ATTRIBUTES and isinstance(value, str):
                total += len(value.encode("utf-8"))
    return total
