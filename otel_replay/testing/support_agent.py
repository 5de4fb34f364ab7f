"""A small customer-support agent with two tools and a failure whose culprit is known.

The customer asks for a refund on a late order. The model (simulated, see `support_script`)
first looks the order up; with a planted fault (or, rarely, by chance) it copies the order id
wrong, the lookup returns somebody else's on-time order, and the agent politely refuses the
refund. The culprit is step 0, the model's lookup call; the fix is the correct order id.

Runs with the real `openai` SDK over real HTTP, traced by the real
`opentelemetry-instrumentation-openai-v2` and captured by `ReplayProcessor`.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Callable
from typing import Any

from otel_replay.testing.model import ChatRequest, Reply, SimulatedModel, ToolCall
from otel_replay.testing.recording import recording, run_tool_loop

SYSTEM = ("You are a support agent for Parcelwise. Look orders up before answering. Refund the full price "
          "of an order that arrived late; never refund an order that arrived on time.")
QUESTION = "Hi, my order A-1042 arrived five days late. Can I get my money back?"
ORDERS = {
    "A-1042": {"order_id": "A-1042", "customer": "Dana Reyes", "price": 89.5, "delivery": "late", "days_late": 5},
    "A-1024": {"order_id": "A-1024", "customer": "Sam Okafor", "price": 42.0, "delivery": "on time", "days_late": 0},
}
TOOLS = [
    {"type": "function", "function": {"name": "lookup_order", "description": "Fetch an order by id.",
                                      "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                                                     "required": ["order_id"]}}},
    {"type": "function", "function": {"name": "issue_refund", "description": "Refund an amount for an order.",
                                      "parameters": {"type": "object", "properties": {
                                          "order_id": {"type": "string"}, "amount": {"type": "number"}},
                                          "required": ["order_id", "amount"]}}},
]
TYPO_RATE = 0.1  # how often the model copies the id wrong on its own


def lookup_order(order_id: str) -> str:
    order = ORDERS.get(order_id)
    return json.dumps(order if order else {"error": f"no order {order_id}"})


def issue_refund(order_id: str, amount: float) -> str:
    return json.dumps({"order_id": order_id, "refunded": amount, "status": "ok"})


TOOL_FUNCTIONS: dict[str, Callable[..., str]] = {"lookup_order": lookup_order, "issue_refund": issue_refund}


def support_script(request: ChatRequest, rng: random.Random) -> Reply:
    """The simulated model's behaviour (a seeded function of the request)."""
    results = request.tool_results()
    if not results:
        match = re.search(r"[A-Z]-\d{4}", request.user_text())
        order_id = match.group(0) if match else "unknown"
        if "wrong_order_id" in request.faults or rng.random() < TYPO_RATE:
            order_id = order_id[:-2] + order_id[-1] + order_id[-2]  # A-1042 -> A-1024
        return ToolCall("lookup_order", {"order_id": order_id})
    name, content = results[-1]
    data = json.loads(content)
    if name == "lookup_order":
        if "error" in data:
            return "I couldn't find that order. Could you double-check the id?"
        if data["delivery"] == "late":
            return ToolCall("issue_refund", {"order_id": data["order_id"], "amount": data["price"]})
        return (f"I checked order {data['order_id']}: it was delivered on time, so it isn't eligible for a refund. "
                "Is there anything else I can help with?")
    return f"Done: I've refunded ${data['refunded']:.2f} for order {data['order_id']}. Sorry for the delay!"


def support_model(seed: int = 7) -> SimulatedModel:
    return SimulatedModel(support_script, seed=seed)


def refunded(final_output: str, rollout: Any = None) -> float:
    """The verifier: 1.0 when the customer got the refund they were owed."""
    return 1.0 if "refunded $89.50" in final_output else 0.0


def record_support_run(store: str | os.PathLike[str], *, fault: bool = True, seed: int = 7) -> tuple[str, str]:
    """Run the agent once against the simulated model and capture it into `store`.

    Returns (trace id, final answer).
    """
    model = support_model(seed)
    if fault:
        model.plant("wrong_order_id")
    with recording(store, "support-service", model) as (client, tracer):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
        answer, trace_id = run_tool_loop(client, tracer, "support-agent", messages, TOOLS, TOOL_FUNCTIONS,
                                         temperature=0.7)
    return trace_id, answer


def register_policies(base_url: str, registry: Any = None) -> None:
    """The support agent's policies: the model behind `base_url`, and the real tool functions."""
    from otel_replay.replay import policies
    from otel_replay.replay.builtin.openai_policy import openai_policy

    target = registry or policies.registry
    target.register("llm", None, openai_policy(base_url=base_url, api_key="sim", tools=TOOLS))
    for name, fn in TOOL_FUNCTIONS.items():
        target.register("tool", name, lambda arguments, rng, fn=fn: fn(**arguments))
