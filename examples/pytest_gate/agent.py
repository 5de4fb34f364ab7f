"""A small support agent, its replay policies and its verifier: what a team brings to the gate.

The agent answers a refund request with two tools (`lookup_order`, `issue_refund`) through the
real `openai` SDK; in the example the model is otel-replay's simulated one on 127.0.0.1, which
now and then copies the order id wrong. Its spans come from the real OpenTelemetry OpenAI
instrumentation (model calls) and from the agent itself (the agent and its tool calls).
"""

from __future__ import annotations

import json
import random
from typing import Any

from opentelemetry import trace

from otel_replay.replay.builtin.openai_policy import openai_policy
from otel_replay.testing.support_agent import QUESTION, SYSTEM, TOOL_FUNCTIONS, TOOLS

__all__ = ["QUESTION", "answer", "policies", "refunded"]


def answer(client: Any, question: str = QUESTION, max_turns: int = 6) -> str:
    """Run the agent loop: ask the model, run the tools it calls, until it answers."""
    tracer = trace.get_tracer("support-agent")
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    with tracer.start_as_current_span("invoke_agent support-agent", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support-agent"}):
        for _ in range(max_turns):
            message = client.chat.completions.create(model="sim-gpt", messages=messages, tools=TOOLS,
                                                     temperature=0.7).choices[0].message
            if not message.tool_calls:
                return str(message.content)
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                with tracer.start_as_current_span(f"execute_tool {call.function.name}", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.function.name,
                        "gen_ai.tool.call.id": call.id, "gen_ai.tool.call.arguments": call.function.arguments}) as span:
                    result = TOOL_FUNCTIONS[call.function.name](**json.loads(call.function.arguments))
                    span.set_attribute("gen_ai.tool.call.result", result)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


def policies(base_url: str) -> dict[str, Any]:
    """How a replay re-decides each step: the model behind `base_url`, and the real tools."""
    def tool(fn: Any) -> Any:
        def run(arguments: dict[str, Any], rng: random.Random) -> str:
            return fn(**arguments)
        return run

    return {"llm": openai_policy(base_url=base_url, api_key="sim", tools=TOOLS),
            **{f"tool:{name}": tool(fn) for name, fn in TOOL_FUNCTIONS.items()}}


def refunded(final_output: str, rollout: Any = None) -> float:
    """The verifier: 1.0 when the customer got the refund they were owed (order A-1042, $89.50)."""
    return 1.0 if "refunded $89.50" in final_output else 0.0
