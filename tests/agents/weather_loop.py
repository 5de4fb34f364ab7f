"""A tool-calling agent run with the real `openai` SDK and the real OpenTelemetry GenAI
instrumentation (`opentelemetry-instrumentation-openai-v2`), answered by an in-process mock
HTTP transport, captured by ReplayProcessor. Run as a script so the instrumentation's
environment settings apply to a fresh process:

    python -m tests.agents.weather_loop STORE_DIR [--turns N] [--content span_only|event_only|none]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

TOOL_RESULT = '{"city": "Paris", "temperature_c": 18, "condition": "partly cloudy"}'
FINAL = "It is currently 18°C and partly cloudy in Paris."
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def handler(request):  # the model: call the tool first, answer once the tool result is in
    import httpx2

    body = json.loads(request.content)
    done = any(m.get("role") == "tool" for m in body["messages"])
    turn = sum(1 for m in body["messages"] if m.get("role") == "tool")
    message = ({"role": "assistant", "content": FINAL} if done else
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": f"call_{turn}", "type": "function",
                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]})
    return httpx2.Response(200, json={
        "id": f"chatcmpl-{turn}-{int(done)}", "object": "chat.completion", "created": 1764527400,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop" if done else "tool_calls"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
    })


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--content", default="span_only", choices=["span_only", "event_only", "none"])
    args = parser.parse_args()
    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    if args.content != "none":
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = args.content
    else:  # whatever the parent process had set
        os.environ.pop("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", None)

    import httpx2
    import openai
    from opentelemetry import _logs, trace
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from otel_replay import ReplayLogProcessor, ReplayProcessor

    processor = ReplayProcessor(args.store)
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-service"}))
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(ReplayLogProcessor(processor))
    _logs.set_logger_provider(logger_provider)
    OpenAIInstrumentor().instrument(tracer_provider=provider, logger_provider=logger_provider)

    client = openai.OpenAI(api_key="test", max_retries=0,
                           http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
    tracer = trace.get_tracer("weather-agent")
    for _ in range(args.turns):
        with tracer.start_as_current_span("invoke_agent weather-agent", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather-agent"}):
            messages = [{"role": "system", "content": "You answer weather questions."},
                        {"role": "user", "content": "What's the weather in Paris?"}]
            for _step in range(4):
                reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
                choice = reply.choices[0].message
                if not choice.tool_calls:
                    break
                messages.append(choice.model_dump(exclude_none=True))
                for call in choice.tool_calls:
                    with tracer.start_as_current_span(f"execute_tool {call.function.name}", attributes={
                            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.function.name,
                            "gen_ai.tool.call.id": call.id, "gen_ai.tool.call.arguments": call.function.arguments,
                    }) as span:
                        span.set_attribute("gen_ai.tool.call.result", TOOL_RESULT)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT})
    provider.shutdown()
    print(json.dumps(processor.stats))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
