"""Agent runs in which every model call is traced twice, by two real producers at once.

Each scenario runs the real SDK with two real instrumentations (or an SDK's own tracing plus a
framework span) against a model API served by a local HTTP server on 127.0.0.1, in a fresh
process (the instrumentations patch the SDKs globally and read their settings from the
environment). Two traces per run:

1. `invoke_agent weather-agent`: chat (the model asks for `get_weather`), `execute_tool
   get_weather`, chat (the answer): three steps, two of them model calls.
2. `invoke_agent fan-out`: two calls with different questions, in two threads, held in flight
   together by the server (a barrier), so their spans overlap: two steps.

Scenarios:

- `anthropic-openllmetry`: `opentelemetry-instrumentation-anthropic` (OpenLLMetry) and the
  anthropic SDK's own tracing; their spans are siblings under the agent span. `--sdk-content`
  turns on the SDK's content capture (else its spans are observation-only).
- `openai-openinference`: `opentelemetry-instrumentation-openai-v2` and
  `openinference-instrumentation-openai` on the same `openai` client (one span inside the other).
- `framework-anthropic`: a framework's LLM span (OpenInference attributes,
  `openinference.span.kind=LLM`, written here the way a framework integration writes it) around
  each call of the anthropic SDK, whose own span is its child; the second chat's framework span
  names no model.

Capture into a store (ReplayProcessor), or record the spans as an OTLP/JSON file (the fixtures
in tests/fixtures/duplicate_calls/, imported by tests/test_duplicate_calls.py):

    python -m tests.agents.duplicate_calls SCENARIO --store DIR [--sdk-content]
    python -m tests.agents.duplicate_calls SCENARIO --record FILE [--sdk-content]
    python -m tests.agents.duplicate_calls --record-fixtures   # re-records every fixture
"""

from __future__ import annotations

import argparse
import base64
import contextvars
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SCENARIOS = ("anthropic-openllmetry", "openai-openinference", "framework-anthropic")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "duplicate_calls"
# (scenario, --sdk-content): the files --record-fixtures writes
FIXTURE_RUNS = (("anthropic-openllmetry", False), ("anthropic-openllmetry", True),
                ("openai-openinference", False), ("framework-anthropic", False))

SYSTEM = "You answer weather questions."
QUESTION = "What's the weather in Paris?"
TOOL_RESULT = '{"city": "Paris", "temperature_c": 18, "condition": "partly cloudy"}'
FINAL = "It is currently 18°C and partly cloudy in Paris."
FAN_OUT = ("Summarize report A.", "Summarize report B.")
ANTHROPIC_MODEL, ANTHROPIC_RESPONSE_MODEL = "claude-sonnet-4-5", "claude-sonnet-4-5-20250929"
OPENAI_MODEL, OPENAI_RESPONSE_MODEL = "gpt-4o-mini", "gpt-4o-mini-2024-07-18"
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def answer_to(question: str) -> str:
    """The model's answer to a fan-out question (each call's payload names its question)."""
    return f"Answer to: {question}"


def fixture_name(scenario: str, sdk_content: bool) -> str:
    return f"{scenario}{'_sdk-content' if sdk_content else ''}.otlp.json"


# --- the model API: Anthropic Messages and OpenAI Chat Completions, canned ----------------------

class ModelApi(BaseHTTPRequestHandler):
    """Answers /v1/messages and /v1/chat/completions; fan-out questions wait for each other."""

    barrier = threading.Barrier(len(FAN_OUT), timeout=10)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        text = json.dumps(body.get("messages", []))
        if any(q in text for q in FAN_OUT):
            self.barrier.wait()  # both fan-out calls are in flight before either is answered
        reply = self._anthropic(body) if self.path.endswith("/messages") else self._openai(body)
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        """Quiet: the scenario prints only its summary."""

    @staticmethod
    def _question(messages: list[dict[str, Any]]) -> str:
        content = messages[-1].get("content")
        return content if isinstance(content, str) else ""

    def _anthropic(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        done = any(isinstance(m.get("content"), list) and any(b.get("type") == "tool_result" for b in m["content"])
                   for m in messages)
        question = self._question(messages)
        if question in FAN_OUT:
            content: list[dict[str, Any]] = [{"type": "text", "text": answer_to(question)}]
            stop, usage = "end_turn", (30 + FAN_OUT.index(question), 7)
        elif done:
            content, stop, usage = [{"type": "text", "text": FINAL}], "end_turn", (160, 16)
        else:
            content = [{"type": "tool_use", "id": "toolu_01weather", "name": "get_weather", "input": {"city": "Paris"}}]
            stop, usage = "tool_use", (120, 40)
        return {"id": f"msg_{len(messages)}", "type": "message", "role": "assistant", "model": ANTHROPIC_RESPONSE_MODEL,
                "content": content, "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}

    def _openai(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        question = self._question(messages)
        if question in FAN_OUT:
            message: dict[str, Any] = {"role": "assistant", "content": answer_to(question)}
            finish, usage = "stop", (30 + FAN_OUT.index(question), 7)
        elif any(m.get("role") == "tool" for m in messages):
            message, finish, usage = {"role": "assistant", "content": FINAL}, "stop", (125, 14)
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_weather_01", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
            finish, usage = "tool_calls", (82, 18)
        return {"id": f"chatcmpl-{len(messages)}", "object": "chat.completion", "created": 1764527400,
                "model": OPENAI_RESPONSE_MODEL, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}


@contextmanager
def model_api() -> Iterator[str]:
    """The model API on 127.0.0.1 (a free port); yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), ModelApi)
    thread = threading.Thread(target=server.serve_forever, name="model-api", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


# --- the agent ---------------------------------------------------------------------------------

def _tracer() -> Any:
    from opentelemetry import trace

    return trace.get_tracer("duplicate-calls.agent")


@contextmanager
def _agent(name: str) -> Iterator[None]:
    with _tracer().start_as_current_span(f"invoke_agent {name}", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}):
        yield


def _tool(call_id: str, arguments: str) -> str:
    with _tracer().start_as_current_span("execute_tool get_weather", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
            "gen_ai.tool.call.id": call_id, "gen_ai.tool.call.arguments": arguments}) as span:
        span.set_attribute("gen_ai.tool.call.result", TOOL_RESULT)
    return TOOL_RESULT


def _fan_out(call: Callable[[str], str]) -> None:
    """The fan-out questions at once, each in a thread carrying the agent span's context."""
    with _agent("fan-out"), ThreadPoolExecutor(len(FAN_OUT)) as pool:
        futures = [pool.submit(contextvars.copy_context().run, call, q) for q in FAN_OUT]
        answers = [f.result() for f in futures]
    assert answers == [answer_to(q) for q in FAN_OUT], answers


def run_anthropic(base_url: str, around: Callable[[list[dict[str, Any]], bool], Any] | None = None) -> None:
    """The weather loop and the fan-out on the anthropic SDK; `around` wraps each call (a framework span)."""
    import anthropic

    client = anthropic.Anthropic(api_key="test", base_url=base_url, max_retries=0)
    tools = [{"name": "get_weather", "description": "Get the current weather for a city.", "input_schema": WEATHER_SCHEMA}]

    def create(messages: list[dict[str, Any]], with_model: bool = True, **extra: Any) -> Any:
        with around(messages, with_model) if around else nullcontext() as span:
            reply = client.messages.create(model=ANTHROPIC_MODEL, max_tokens=256, system=SYSTEM, messages=messages, **extra)
            if span is not None:
                span.record(reply)
        return reply

    with _agent("weather-agent"):
        history: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
        first = create(history, tools=tools)
        use = next(b for b in first.content if b.type == "tool_use")
        result = _tool(use.id, json.dumps(use.input))
        history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]}]
        assert create(history, with_model=False, tools=tools).content[0].text == FINAL
    _fan_out(lambda q: create([{"role": "user", "content": q}]).content[0].text)


def run_openai(base_url: str) -> None:
    """The weather loop and the fan-out on the openai SDK."""
    import openai

    client = openai.OpenAI(api_key="test", base_url=f"{base_url}/v1", max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city.",
                                               "parameters": WEATHER_SCHEMA}}]
    with _agent("weather-agent"):
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
        first = client.chat.completions.create(model=OPENAI_MODEL, messages=messages, tools=tools).choices[0].message
        call = first.tool_calls[0]
        messages += [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": _tool(call.id, call.function.arguments)}]
        second = client.chat.completions.create(model=OPENAI_MODEL, messages=messages, tools=tools)
        assert second.choices[0].message.content == FINAL
    _fan_out(lambda q: client.chat.completions.create(
        model=OPENAI_MODEL, messages=[{"role": "user", "content": q}]).choices[0].message.content)


class FrameworkSpan:
    """A framework's LLM span around one SDK call, with OpenInference attributes as frameworks write them."""

    tracer_name = "duplicate-calls.framework"

    def __init__(self, messages: list[dict[str, Any]], with_model: bool) -> None:
        self.messages, self.with_model = messages, with_model

    def __enter__(self) -> FrameworkSpan:
        from opentelemetry import trace

        attributes: dict[str, Any] = {"openinference.span.kind": "LLM", "llm.provider": "anthropic",
                                      "llm.system": "anthropic",
                                      "llm.input_messages.0.message.role": "system",
                                      "llm.input_messages.0.message.content": SYSTEM}
        if self.with_model:
            attributes["llm.model_name"] = ANTHROPIC_MODEL
        for i, message in enumerate(self.messages, start=1):
            attributes[f"llm.input_messages.{i}.message.role"] = message["role"]
            attributes[f"llm.input_messages.{i}.message.content"] = json.dumps(message["content"]) \
                if not isinstance(message["content"], str) else message["content"]
        self._cm = trace.get_tracer(self.tracer_name).start_as_current_span("ChatAnthropic", attributes=attributes)
        self.span = self._cm.__enter__()
        return self

    def record(self, reply: Any) -> None:
        out = "llm.output_messages.0.message"
        self.span.set_attribute(f"{out}.role", "assistant")
        self.span.set_attribute(f"{out}.content", "".join(b.text for b in reply.content if b.type == "text"))
        for i, use in enumerate(b for b in reply.content if b.type == "tool_use"):
            self.span.set_attribute(f"{out}.tool_calls.{i}.tool_call.id", use.id)
            self.span.set_attribute(f"{out}.tool_calls.{i}.tool_call.function.name", use.name)
            self.span.set_attribute(f"{out}.tool_calls.{i}.tool_call.function.arguments", json.dumps(use.input))
        self.span.set_attribute("llm.token_count.prompt", reply.usage.input_tokens)
        self.span.set_attribute("llm.token_count.completion", reply.usage.output_tokens)

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)


# --- wiring: providers, instrumentations, outputs ----------------------------------------------

def _configure(sdk_content: bool) -> None:
    """The environment the instrumentations read at import: set before any of them is imported."""
    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "span_only"
    os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
    os.environ.pop("ANTHROPIC_OPEN_TELEMETRY", None)  # the SDK's own tracing: on (its default)
    if sdk_content:
        os.environ["ANTHROPIC_OPEN_TELEMETRY_TRACES_CONTENT_MODE"] = "content"
    else:
        os.environ.pop("ANTHROPIC_OPEN_TELEMETRY_TRACES_CONTENT_MODE", None)


def run(scenario: str, provider: Any, base_url: str) -> None:
    if scenario == "anthropic-openllmetry":
        from opentelemetry.instrumentation.anthropic import AnthropicInstrumentor

        AnthropicInstrumentor().instrument(tracer_provider=provider)
        run_anthropic(base_url)
    elif scenario == "openai-openinference":
        from openinference.instrumentation.openai import (
            OpenAIInstrumentor as OpenInferenceInstrumentor,
        )
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider)
        OpenInferenceInstrumentor().instrument(tracer_provider=provider)
        run_openai(base_url)
    else:
        run_anthropic(base_url, around=FrameworkSpan)


def _otlp_json(spans: list[Any]) -> dict[str, Any]:
    """An OTLP/JSON ExportTraceServiceRequest with hex ids, as the OTLP/JSON spec wants them."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    def hex_ids(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
                    else hex_ids(v) for k, v in node.items()}
        return [hex_ids(v) for v in node] if isinstance(node, list) else node

    return hex_ids(MessageToDict(encode_spans(spans), use_integers_for_enums=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", nargs="?", choices=SCENARIOS)
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--store", help="capture into this store with ReplayProcessor")
    out.add_argument("--record", help="write the spans to this OTLP/JSON file")
    out.add_argument("--record-fixtures", action="store_true", help="re-record every file in tests/fixtures/duplicate_calls/")
    parser.add_argument("--sdk-content", action="store_true", help="the anthropic SDK's spans capture content too")
    args = parser.parse_args()
    if args.record_fixtures:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        for scenario, sdk_content in FIXTURE_RUNS:
            target = FIXTURES / fixture_name(scenario, sdk_content)
            subprocess.run([sys.executable, "-m", "tests.agents.duplicate_calls", scenario, "--record", str(target),
                            *(["--sdk-content"] if sdk_content else [])], check=True)
            print(f"recorded {target}")
        return
    if args.scenario is None:
        parser.error("a scenario is needed with --store or --record")
    _configure(args.sdk_content)

    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": f"duplicate-calls-{args.scenario}"}))
    exporter = InMemorySpanExporter()
    if args.store:
        from otel_replay import ReplayProcessor

        processor = ReplayProcessor(args.store)
        provider.add_span_processor(processor)
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # the anthropic SDK traces through the global provider
    with model_api() as base_url:
        run(args.scenario, provider, base_url)
    provider.shutdown()
    if args.record:
        spans = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
        Path(args.record).write_text(json.dumps(_otlp_json(spans), indent=1, ensure_ascii=False) + "\n")
        print(json.dumps({"spans": len(spans)}))
    else:
        print(json.dumps(processor.stats))


if __name__ == "__main__":
    main()
