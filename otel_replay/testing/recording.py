"""Recording an agent run for real: the `openai` SDK against a simulated model on 127.0.0.1,
traced by `opentelemetry-instrumentation-openai-v2`, captured by `ReplayProcessor`."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from otel_replay.testing.model import SimulatedModel


def enable_content_capture() -> None:
    """Content capture settings for opentelemetry-instrumentation-openai-v2 (before it is imported)."""
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    os.environ.setdefault("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")


def seeded_ids(seed: str) -> Any:
    """An OpenTelemetry id generator drawing from `random.Random(seed)`: the same recording gets
    the same trace id, so everything seeded by the trace id (rollouts) is reproducible."""
    import random

    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class SeededIds(IdGenerator):
        def __init__(self) -> None:
            self._rng = random.Random(seed)

        def generate_span_id(self) -> int:
            return self._rng.getrandbits(64) or 1

        def generate_trace_id(self) -> int:
            return self._rng.getrandbits(128) or 1

    return SeededIds()


@contextlib.contextmanager
def recording(store: Any, service: str, model: SimulatedModel, ids: str | None = None) -> Iterator[tuple[Any, Any]]:
    """Yields (openai client, tracer); on exit every span is in `store`. With `ids`, span and trace
    ids are drawn from that seed instead of at random."""
    enable_content_capture()
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from otel_replay.capture import ReplayProcessor
    from otel_replay.testing.server import SimulatedModelServer

    provider = TracerProvider(resource=Resource.create({"service.name": service}),
                              **({"id_generator": seeded_ids(ids)} if ids is not None else {}))
    provider.add_span_processor(ReplayProcessor(store))
    instrumentor = OpenAIInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    instrumentor.instrument(tracer_provider=provider)
    try:
        with SimulatedModelServer(model) as server:
            yield openai.OpenAI(base_url=server.base_url, api_key="sim", max_retries=0), provider.get_tracer(service)
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


def run_tool_loop(client: Any, tracer: Any, agent: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  functions: dict[str, Callable[..., str]], max_turns: int = 8, **request: Any) -> tuple[str, str]:
    """The agent loop with real spans: ask the model, run the tools it calls, repeat until it answers.

    Returns (final answer, trace id).
    """
    with tracer.start_as_current_span(f"invoke_agent {agent}", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent}) as root:
        trace_id = format(root.get_span_context().trace_id, "032x")
        for _ in range(max_turns):
            message = client.chat.completions.create(model="sim-gpt", messages=messages, tools=tools,
                                                     **request).choices[0].message
            if not message.tool_calls:
                return str(message.content), trace_id
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                with tracer.start_as_current_span(f"execute_tool {call.function.name}", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.function.name,
                        "gen_ai.tool.call.id": call.id, "gen_ai.tool.call.arguments": call.function.arguments}) as span:
                    result = functions[call.function.name](**json.loads(call.function.arguments))
                    span.set_attribute("gen_ai.tool.call.result", result)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return "", trace_id
